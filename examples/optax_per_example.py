"""A plain optax loop over minibatches: small weights (min ‖w‖²), every example's squared error ≤ 0.1,
a multiplier each; `# +` lines add the constraints. Feasible, not the optimum (‖w‖² 13.7, QP 12.8):
the first epochs' large errors raise multipliers that one update an epoch lowers slowly."""

import jax
import jax.numpy as jnp
import optax

import cudt


def data(n=128, d=8):
    kx, kw, ke = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(kx, (n, d))
    y = x @ jax.random.normal(kw, (d,)) + 0.1 * jax.random.normal(ke, (n,))
    return x, y


def problem(w, batch, key):
    x, y, ids = batch
    err = (x @ w - y) ** 2
    per_example = cudt.Constraint(err - 0.1, index=ids)  # + (a table of n multipliers)
    return jnp.sum(w**2), {"fit": per_example}  # + (was: return jnp.mean(err))


optimizer = optax.adam(3e-2)
dual = cudt.dual_ascent(0.5)


def main(epochs=100, batch_size=32):
    (x, y), w = data(), jnp.zeros(8)
    opt_state = optimizer.init(w)
    lag = cudt.lagrangian(problem, dual, num_indexed={"fit": len(x)})  # +
    dual_state = lag.dual.init(mult := lag.init(w, (x[:1], y[:1], jnp.arange(1))))  # +

    @jax.jit
    def train_step(w, opt_state, mult, dual_state, batch):
        (_, aux), (g, dual_g) = jax.value_and_grad(lag.loss, (0, 1), True)(w, mult, batch)  # +
        updates, opt_state = optimizer.update(g, opt_state, w)
        w = optax.apply_updates(w, updates)
        updates, dual_state = lag.dual.update(dual_g, dual_state, mult, index=batch[2])  # +
        return w, opt_state, optax.apply_updates(mult, updates), dual_state, aux  # +

    for epoch in range(epochs):
        for ids in jax.random.permutation(jax.random.key(epoch), len(x)).reshape(-1, batch_size):
            batch = (x[ids], y[ids], ids)
            w, opt_state, mult, dual_state, aux = train_step(w, opt_state, mult, dual_state, batch)
    err = (x @ w - y) ** 2
    print(
        {
            "‖w‖²": float(w @ w),
            "max error": float(err.max()),
            "λ > 0": int((mult["fit"] > 0).sum()),
        }
    )
    return w, mult


if __name__ == "__main__":
    main()
