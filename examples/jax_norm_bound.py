"""A plain-JAX two-layer network (parameters in a dict, optax, jax.jit) whose first weight
matrix has squared Frobenius norm ≤ 1; the lines marked `# +` add the constraint."""

import jax
import jax.numpy as jnp
import optax

import cudt


def init_params(key, d=4, h=32):
    k1, k2 = jax.random.split(key)
    w1, w2 = jax.random.normal(k1, (d, h)) / h, jax.random.normal(k2, (h,)) / h**0.5
    return {"w1": w1, "b1": jnp.zeros(h), "w2": w2, "b2": jnp.zeros(())}


def data(n=256, d=4):
    x = jax.random.normal(jax.random.key(1), (n, d))
    return x, jnp.sin(3 * x[:, 0]) + x[:, 1] ** 2


def problem(params, batch, key):
    x, y = batch
    pred = jnp.tanh(x @ params["w1"] + params["b1"]) @ params["w2"] + params["b2"]
    norm = jnp.sum(params["w1"] ** 2) - 1.0  # ‖W1‖² ≤ 1
    return jnp.mean((pred - y) ** 2), {"norm": cudt.Constraint(norm)}


optimizer = optax.adam(1e-2)
dual = cudt.nupi(0.05, kp=1.0)
formulation = cudt.AugmentedLagrangian(penalty=1.0)


def main(steps=500):
    params, batch = init_params(jax.random.key(0)), data()
    opt_state = optimizer.init(params)
    lag = cudt.lagrangian(problem, dual, formulation)  # +
    dual_state = lag.dual.init(multipliers := lag.init(params, batch))  # +

    @jax.jit
    def train_step(params, opt_state, multipliers, dual_state, batch):
        grad_fn = jax.value_and_grad(lag.loss, argnums=(0, 1), has_aux=True)  # + (was loss)
        (_, aux), (grads, dual_grads) = grad_fn(params, multipliers, batch)  # + (was loss, grads)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        updates, dual_state = lag.dual.update(dual_grads, dual_state, multipliers)  # +
        multipliers = optax.apply_updates(multipliers, updates)  # +
        return params, opt_state, multipliers, dual_state, aux  # + (was params, opt_state, loss)

    for _ in range(steps):
        params, opt_state, multipliers, dual_state, aux = train_step(
            params, opt_state, multipliers, dual_state, batch
        )
    print(jax.tree.map(float, {"mse": aux["objective"], **aux["constraints"], "λ": multipliers}))
    return params, multipliers


if __name__ == "__main__":
    main()
