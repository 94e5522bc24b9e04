"""cudt.make_train_step (the descent problem through the one constrained step) equals the paper's
Algorithm 1 written out by hand: one ``value_and_grad`` of the Lagrangian
``mean ℓ_L + Σ λ_l (g_l − u_l) [+ (α/2)‖u‖²]`` in (θ, λ, u), simultaneous updates with optax, the
resilient decay ``g − λ/α`` or explicit slacks, a warm-up and an ERM lane masked by ``where``.
This is the arithmetic of the hand-fused step cudt had before it had one engine."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import cudt
from cudt.optim import dual_optimizer, primal_optimizer

L, B, D = 3, 8, 4


def _layer_losses(params, batch, key):
    x, y = batch
    pred = jnp.einsum("bd,ld->bl", x, params["w"])  # [B, L+1]
    noise = 0.01 * jax.random.normal(key, pred.shape) ** 2  # the step's key reaches the loss
    return (pred - y[:, None]) ** 2 + noise


def _batches(n):
    rng = np.random.default_rng(0)
    return [
        (
            jnp.asarray(rng.normal(size=(B, D)), jnp.float32),
            jnp.asarray(rng.normal(size=(B,)), jnp.float32),
        )
        for _ in range(n)
    ]


def _reference_step(cfg, primal, dual, alpha, constrained, slack_lr):
    """The paper's step on ``[L+1]`` vectors (index 0 the reference constraint), by hand."""
    slack_tx = optax.chain(optax.sgd(slack_lr), cudt.project_nonnegative())
    decay = cfg.resilience_mode == "decay"
    dual_tx = optax.chain(cudt.resilience_decay(alpha), dual) if decay else dual

    def init(params):
        z = jnp.zeros((L + 1,), jnp.float32)
        return dict(
            step=0, params=params, opt=primal.init(params), lam=z, dual=dual_tx.init(z), u=z,
            slack=slack_tx.init(z),
        )  # fmt: skip

    def lagrangian(params, lam, u, batch, key, eps, ref):
        losses = _layer_losses(params, batch, key)
        mean = jnp.mean(losses, axis=0)
        g = cudt.constraint_values(mean, eps, ref, jnp.isfinite(ref) if ref is not None else None)
        value = mean[-1] + jnp.sum(lam * (g - u))
        if not decay:
            value = value + 0.5 * alpha * jnp.sum(u**2)
        return value, (mean, g)

    def step(s, batch, key, eps, ref):
        key = jax.random.fold_in(key, s["step"])
        (_, (mean, g)), (gp, gl, gu) = jax.value_and_grad(lagrangian, (0, 1, 2), has_aux=True)(
            s["params"], s["lam"], s["u"], batch, key, eps, ref
        )
        upd, opt = primal.update(gp, s["opt"], s["params"])
        params = optax.apply_updates(s["params"], upd)
        active = constrained and s["step"] >= cfg.warmup_steps
        lam, dual_state, u, slack = s["lam"], s["dual"], s["u"], s["slack"]
        if active:
            du, dual_state = dual_tx.update(gl, s["dual"], s["lam"])
            lam = s["lam"] + du
            if not decay:
                su, slack = slack_tx.update(gu, s["slack"], s["u"])
                u = s["u"] + su
        return dict(
            step=s["step"] + 1, params=params, opt=opt, lam=lam, dual=dual_state, u=u, slack=slack
        ), mean

    return init, step


CASES = {
    "sgd": dict(dual="sgd", resilience=None, mode="decay"),
    "adam, decay": dict(dual="adam", resilience=2.0, mode="decay"),
    "sgd, slacks": dict(dual="sgd", resilience=2.0, mode="slack"),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("constrained", [True, False])
def test_make_train_step_is_the_papers_step(case, constrained):
    c = CASES[case]
    eps, ref = 0.1, 0.8
    cfg = cudt.DescentConfig(
        num_layers=L, epsilon=eps, reference=ref, resilience=c["resilience"],
        resilience_mode=c["mode"], slack_lr=0.05, warmup_steps=2, constrained=constrained,
    )  # fmt: skip
    make_primal = lambda: primal_optimizer(1e-2)  # noqa: E731
    make_dual = lambda: dual_optimizer(c["dual"], 0.5)  # noqa: E731
    init, step = cudt.make_train_step(_layer_losses, make_primal(), make_dual(), cfg)
    alpha = jnp.inf if c["resilience"] is None else c["resilience"]
    r_init, r_step = _reference_step(cfg, make_primal(), make_dual(), alpha, constrained, 0.05)
    params = {"w": jnp.asarray(np.random.default_rng(1).normal(size=(L + 1, D)), jnp.float32)}
    state, ref_state = init(params), r_init(params)
    eps_v = jnp.full((L,), eps, jnp.float32)
    for t, batch in enumerate(_batches(10)):
        state, metrics = step(state, batch, jax.random.key(t))
        ref_state, mean = r_step(ref_state, batch, jax.random.key(t), eps_v, jnp.float32(ref))
        np.testing.assert_allclose(metrics["layer_loss"], mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(state.params["w"], ref_state["params"]["w"], rtol=1e-5, atol=1e-6)
    lam = cudt.descent.multipliers(state)
    np.testing.assert_allclose(lam, ref_state["lam"], rtol=1e-5, atol=1e-6)
    if c["mode"] == "slack":
        np.testing.assert_allclose(cudt.descent.slacks(state), ref_state["u"], rtol=1e-5, atol=1e-6)
    if constrained:
        assert float(jnp.max(lam)) > 0  # the constraints were active
    else:
        assert float(jnp.max(jnp.abs(lam))) == 0.0  # ERM: exactly zero, never updated
