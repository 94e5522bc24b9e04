"""cudt.make_descent_step: mean equals make_train_step, indexed moves only the batch's rows, tail
is the CVaR of the per-sample ratios (against numpy)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cudt
from cudt.descent_step import tail_values
from cudt.optim import dual_optimizer, primal_optimizer

L, B, D, N = 3, 8, 4, 40


def _layer_losses(params, batch, key):
    pred = jnp.einsum("bd,ld->bl", batch["x"], params["w"])  # [B, L+1]
    noise = 0.01 * jax.random.normal(key, pred.shape) ** 2  # the step's key reaches the loss
    return (pred - batch["y"][:, None]) ** 2 + noise


# numpy, not jax arrays: nothing at import time may start JAX's backend (an earlier start
# changes what jax.distributed.initialize says in test_bad_inputs' docs/errors.md check)
_rng = np.random.default_rng(0)
X = _rng.normal(size=(N, D)).astype(np.float32)
Y = _rng.normal(size=(N,)).astype(np.float32)
PARAMS = {"w": _rng.normal(size=(L + 1, D)).astype(np.float32)}


def _batch(t, size=B):
    index = jax.random.choice(jax.random.key(100 + t), N, (size,), replace=False)
    return {"x": X[index], "y": Y[index], "index": index}


@pytest.mark.parametrize("dual", ["adam", "sgd"])
def test_mean_equals_make_train_step_lane_by_lane(dual):
    """Three lanes of one vmapped program (reference on, different ε/lr/dual lr, resilience,
    an ERM lane) with a warm-up: the general path gives make_train_step's params, multipliers
    and metrics."""
    cfg = cudt.DescentConfig(num_layers=L, epsilon=0.1, warmup_steps=2)
    init_t, step_t = cudt.make_train_step(
        _layer_losses, primal_optimizer(1e-2), dual_optimizer(dual, 0.5), cfg, jit=False
    )
    init_g, step_g = cudt.make_descent_step(
        _layer_losses, primal_optimizer(1e-2), dual_optimizer(dual, 0.5), cfg, jit=False
    )
    hp = {
        "epsilon": jnp.asarray([0.1, 0.2, 0.1]),
        "reference": jnp.asarray([0.5, np.nan, 0.2]),
        "resilience": jnp.asarray([np.inf, np.inf, 1.0]),
        "constrained": jnp.asarray([True, True, False]),
        "lr": jnp.asarray([1e-2, 3e-2, 1e-2]),
        "dual_lr": jnp.asarray([0.5, 0.2, 0.5]),
    }
    a = jax.vmap(lambda h: init_t(PARAMS, **h))(hp)
    b = jax.vmap(lambda h: init_g(PARAMS, **h))(hp)
    vt = jax.jit(jax.vmap(step_t, in_axes=(0, None, None)))
    vg = jax.jit(jax.vmap(step_g, in_axes=(0, None, None)))
    for t in range(10):
        a, ma = vt(a, _batch(t), jax.random.key(t))
        b, mb = vg(b, _batch(t), jax.random.key(t))
    np.testing.assert_allclose(b.params["w"], a.params["w"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b.multipliers, a.multipliers, rtol=1e-5, atol=1e-6)
    for name in ("objective", "lagrangian", "layer_loss", "constraint", "multipliers"):
        np.testing.assert_allclose(mb[name], ma[name], rtol=1e-5, atol=1e-5, err_msg=name)
    assert float(jnp.max(a.multipliers[0, 1:])) > 0 and float(a.multipliers[0, 0]) > 0
    assert np.all(np.asarray(b.multipliers[2]) == 0)  # the ERM lane


@pytest.mark.parametrize("update", ["simultaneous", "alternating"])
def test_indexed_moves_only_the_batch_rows(update):
    cfg = cudt.DescentConfig(num_layers=L, epsilon=0.3)
    init, step = cudt.make_descent_step(
        _layer_losses,
        primal_optimizer(1e-2),
        dual_optimizer("adam", 0.5),
        cfg,
        constraint="indexed",
        update=update,
        num_examples=N,
        example_ids=lambda batch: batch["index"],
    )
    state = init(PARAMS)
    assert state.inner.multipliers["descent"].shape == (N, L)
    for t in range(3):  # rows written by earlier steps must stay as they are too
        before = jax.tree.map(np.array, state.inner)
        batch = _batch(t)
        state, metrics = step(state, batch, jax.random.key(t))
        rows = np.asarray(batch["index"])
        other = np.setdiff1d(np.arange(N), rows)
        table = np.asarray(state.inner.multipliers["descent"])
        moments = [
            np.asarray(x)
            for x in jax.tree.leaves(state.inner.dual_state["descent"])
            if np.ndim(x) == 2
        ]
        old_moments = [x for x in jax.tree.leaves(before.dual_state["descent"]) if np.ndim(x) == 2]
        assert len(moments) == 2  # Adam's mu and nu, shaped like the table
        assert table[other].tobytes() == before.multipliers["descent"][other].tobytes()
        for new, old in zip(moments, old_moments, strict=True):
            assert new[other].tobytes() == old[other].tobytes()
            assert not np.array_equal(new[rows], old[rows])
        assert not np.array_equal(table[rows], before.multipliers["descent"][rows])
    # the summary: each layer's mean and max over the table
    np.testing.assert_allclose(state.multipliers[1:], table.mean(0), rtol=1e-6)
    np.testing.assert_allclose(state.multipliers_max[1:], table.max(0), rtol=1e-6)
    np.testing.assert_allclose(metrics["multipliers"], state.multipliers, rtol=1e-6)


def _cvar_numpy(losses, eps, beta):
    ratios = losses[:, 1:] / losses[:, :-1]
    k = max(1, int(np.ceil(beta * losses.shape[0])))
    return np.sort(ratios, axis=0)[::-1][:k].mean(0) - (1 - eps)


@pytest.mark.parametrize("beta", [0.25, 0.5, 1.0])
def test_tail_constraint_is_the_cvar_of_the_ratios(beta):
    losses = np.asarray(_layer_losses(PARAMS, _batch(0), jax.random.key(0)), np.float64)
    got = np.asarray(tail_values(jnp.asarray(losses, jnp.float32), 0.1, beta))
    np.testing.assert_allclose(got, _cvar_numpy(losses, 0.1, beta), rtol=1e-5)
    mean_form = losses[:, 1:].mean(0) / losses[:, :-1].mean(0) - 0.9
    assert not np.allclose(got, mean_form, rtol=1e-3)  # not the ratio of the means

    # the step reports it, and its multipliers ascend on it
    cfg = cudt.DescentConfig(num_layers=L, epsilon=0.1)
    init, step = cudt.make_descent_step(
        _layer_losses,
        primal_optimizer(1e-2),
        dual_optimizer("sgd", 0.5),
        cfg,
        constraint="tail",
        tail_beta=0.5,
    )
    state = init(PARAMS, tail_beta=beta)
    state, metrics = step(state, _batch(0), jax.random.key(0))
    key = jax.random.fold_in(jax.random.key(0), 0)
    seen = np.asarray(_layer_losses(PARAMS, _batch(0), key), np.float64)
    np.testing.assert_allclose(metrics["constraint"][1:], _cvar_numpy(seen, 0.1, beta), rtol=1e-5)
    np.testing.assert_allclose(
        state.multipliers[1:], np.maximum(0, 0.5 * _cvar_numpy(seen, 0.1, beta)), rtol=1e-5
    )


def test_tail_lowers_the_worst_ratios_that_mean_leaves():
    """A residual tanh denoiser (3 layers) on one batch of 32, 200 steps, ε = 0.3: under the
    tail constraint (β = 0.25) every layer's worst per-sample ratio ℓ_l/ℓ_{l−1} and the CVaR of
    the ratios are below what the mean constraint leaves (a layer there even makes some samples
    20× worse while its mean descends)."""
    layers, dim, size = 3, 6, 32
    rng = np.random.default_rng(0)
    clean = jnp.asarray(rng.normal(size=(size, 2)) @ rng.normal(size=(2, dim)), jnp.float32)
    noisy = clean + 0.5 * jnp.asarray(rng.normal(size=(size, dim)), jnp.float32)

    def losses_of(params, batch, key):
        out = [batch[1]]
        for layer in range(layers):
            out.append(out[-1] - jnp.tanh(out[-1] @ params["w"][layer]))
        return jnp.mean((jnp.stack(out, 1) - batch[0][:, None]) ** 2, -1)

    params = {"w": 0.05 * jax.random.normal(jax.random.key(1), (layers, dim, dim))}

    def run(constraint):
        init, step = cudt.make_descent_step(
            losses_of,
            primal_optimizer(3e-2),
            dual_optimizer("sgd", 1.0),
            cudt.DescentConfig(num_layers=layers, epsilon=0.3),
            constraint=constraint,
            tail_beta=0.25,
        )
        state = init(params)
        for t in range(200):
            state, _ = step(state, (clean, noisy), jax.random.key(t))
        losses = np.asarray(losses_of(state.params, (clean, noisy), None))
        ratios = losses[:, 1:] / losses[:, :-1]
        return ratios.max(0), np.sort(ratios, 0)[::-1][:8].mean(0)

    (worst_mean, cvar_mean), (worst_tail, cvar_tail) = run("mean"), run("tail")
    assert np.all(worst_tail < worst_mean), (worst_tail, worst_mean)
    assert np.all(cvar_tail < cvar_mean), (cvar_tail, cvar_mean)
    assert np.all(cvar_tail < 0.7 + 0.1)  # near the bound 1 − ε
