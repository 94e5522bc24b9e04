"""The descent problem through the general step equals cudt.make_train_step, step for step."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import cudt

L, B, D = 3, 8, 4


def _layer_losses(params, batch, key):
    del key
    x, y = batch
    pred = jnp.einsum("bd,ld->bl", x, params["w"])  # [B, L+1]
    return (pred - y[:, None]) ** 2  # [B, L+1]


def _batches(n):
    rng = np.random.default_rng(0)
    return [
        (
            jnp.asarray(rng.normal(size=(B, D)), jnp.float32),
            jnp.asarray(rng.normal(size=(B,)), jnp.float32),
        )
        for _ in range(n)
    ]


@pytest.mark.parametrize("dual", ["ascent", "adam"])
def test_general_step_equals_make_train_step(dual):
    eps = 0.1
    make_dual = {"ascent": cudt.dual_ascent, "adam": cudt.dual_adam}[dual]
    cfg = cudt.DescentConfig(num_layers=L, epsilon=eps)
    init_t, step_t = cudt.make_train_step(_layer_losses, optax.adam(1e-2), make_dual(0.5), cfg)

    def problem(params, batch, key):
        mean = jnp.mean(_layer_losses(params, batch, key), axis=0)  # [L+1]
        g = mean[1:] - (1.0 - eps) * mean[:-1]  # [L]
        return mean[-1], {"descent": cudt.Constraint(g, kind="ineq")}

    init_g, step_g = cudt.make_constrained_step(
        problem, primal=optax.adam(1e-2), dual=make_dual(0.5)
    )
    params = {"w": jnp.asarray(np.random.default_rng(1).normal(size=(L + 1, D)), jnp.float32)}
    batches = _batches(10)
    st, sg = init_t(params), init_g(params, batches[0])
    for t, batch in enumerate(batches):
        st, _ = step_t(st, batch, jax.random.key(t))
        sg, _ = step_g(sg, batch, jax.random.key(t))
    np.testing.assert_allclose(sg.params["w"], st.params["w"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(sg.multipliers["descent"], st.multipliers[1:], rtol=1e-5, atol=1e-6)
    assert float(jnp.max(st.multipliers[1:])) > 0  # the constraints were active
