"""A Flax NNX MLP whose positive rate (smoothed) may differ between two groups by ≤ 0.05 (up to
the duals' oscillation: 1e-4 over), in NNX's own loop; `# +` lines add the constraint."""

import jax
import jax.numpy as jnp
import optax
from flax import nnx

import cudt


class MLP(nnx.Module):
    def __init__(self, rngs):
        self.hidden, self.out = nnx.Linear(5, 16, rngs=rngs), nnx.Linear(16, 1, rngs=rngs)

    def __call__(self, x):
        return self.out(jax.nn.relu(self.hidden(x)))[:, 0]


def data(n=512):
    kx, kg = jax.random.split(jax.random.key(0))
    x, group = jax.random.normal(kx, (n, 5)), jax.random.bernoulli(kg, 0.5, (n,))
    y = (x @ jnp.array([2.0, -1.0, 0.5, 0.0, 1.0]) + 3.0 * group > 0).astype(jnp.float32)
    return x, y, group


def problem(model, batch, key):
    x, y, group = batch
    logits = model(x)
    loss = jnp.mean(optax.sigmoid_binary_cross_entropy(logits, y))
    rate = jax.nn.sigmoid(logits)
    gap = jnp.sum(rate * group) / jnp.sum(group) - jnp.sum(rate * ~group) / jnp.sum(~group)
    return loss, {"fair": cudt.Constraint(jnp.abs(gap) - 0.05)}  # |gap| ≤ 0.05


primal, dual = optax.adam(1e-2), cudt.dual_ascent(5.0)


def main(steps=600):
    model, batch = MLP(nnx.Rngs(0)), data()
    optimizer = nnx.Optimizer(model, primal, wrt=nnx.Param)
    lag = cudt.lagrangian(problem, dual)  # +
    dual_state = lag.dual.init(multipliers := lag.init(model, batch))  # +

    @nnx.jit
    def train_step(model, optimizer, multipliers, dual_state, batch):
        grad_fn = nnx.value_and_grad(lag.loss, argnums=(0, 1), has_aux=True)  # + (was loss)
        (_, aux), (grads, dual_grads) = grad_fn(model, multipliers, batch)  # + (was loss, grads)
        optimizer.update(model, grads)
        updates, dual_state = lag.dual.update(dual_grads, dual_state, multipliers)  # +
        return aux, optax.apply_updates(multipliers, updates), dual_state  # +

    for _ in range(steps):
        aux, multipliers, dual_state = train_step(model, optimizer, multipliers, dual_state, batch)
    print(jax.tree.map(float, {"loss": aux["objective"], **aux["constraints"], "λ": multipliers}))
    return model, multipliers


if __name__ == "__main__":
    main()
