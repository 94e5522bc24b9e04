"""cudt.nupi against Cooper's nuPI on the same sequence of constraint values."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import cudt

torch = pytest.importorskip("torch")
nupi_mod = pytest.importorskip("cooper.optim.torch_optimizers.nupi_optimizer")

ERRORS = np.array(
    [[0.5, -0.2, 0.1], [0.3, -0.4, 0.2], [-0.1, 0.6, 0.0], [0.2, 0.1, -0.3], [0.4, -0.5, 0.7]],
    np.float32,
)


def _cooper(init, kp, ki, nu, lr):
    lam = torch.zeros(3, requires_grad=True)
    opt = nupi_mod.nuPI([lam], lr=lr, Kp=kp, Ki=ki, ema_nu=nu, init_type=init, maximize=True)
    out = []
    for e in ERRORS:
        lam.grad = torch.tensor(e)
        opt.step()
        with torch.no_grad():
            lam.clamp_(min=0.0)  # Cooper projects inequality multipliers after the step
        out.append(lam.detach().numpy().copy())
    return np.stack(out)


def _ours(init, kp, ki, nu, lr):
    tx = cudt.nupi(lr, kp=kp, ki=ki, ema_nu=nu, init=init)
    lam = jnp.zeros(3)
    state = tx.init(lam)
    out = []
    for e in ERRORS:
        u, state = tx.update(jnp.asarray(e), state, lam)
        lam = optax.apply_updates(lam, u)
        out.append(np.asarray(lam))
    return np.stack(out)


@pytest.mark.parametrize("kp,nu", [(0.0, 0.0), (2.0, 0.0), (2.0, 0.5)])
def test_zeros_init_matches_cooper(kp, nu):
    ref = _cooper(nupi_mod.nuPIInitType.ZEROS, kp, 1.0, nu, 0.1)
    np.testing.assert_allclose(_ours("zeros", kp, 1.0, nu, 0.1), ref, rtol=1e-5, atol=1e-6)


def test_sgd_init_first_step_matches_cooper_then_follows_the_recurrence():
    # Cooper's SGD init sets ξ_0 = 0 after its first (plain SGD) step, unlike its docstring's
    # ξ_0 = e_0; we follow the recurrence (ξ_{-1} = e_0, so ξ_0 = e_0).
    ref = _cooper(nupi_mod.nuPIInitType.SGD, 2.0, 1.0, 0.0, 0.1)
    ours = _ours("sgd", 2.0, 1.0, 0.0, 0.1)
    np.testing.assert_allclose(ours[0], ref[0], rtol=1e-6)
    np.testing.assert_allclose(ours[0], np.maximum(0.1 * ERRORS[0], 0), rtol=1e-6)
    assert not np.allclose(ours[1], ref[1])  # the documented difference shows at step 2
    # by hand: λ_2 = [λ_1 + η(K_I e_1 + K_P(e_1 − e_0))]₊
    want = np.maximum(ours[0] + 0.1 * (ERRORS[1] + 2.0 * (ERRORS[1] - ERRORS[0])), 0)
    np.testing.assert_allclose(ours[1], want, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("init,nu", [("sgd", 0.0), ("zeros", 0.3)])
def test_kp_zero_is_dual_ascent_at_rate_lr_times_ki(init, nu):
    """K_P = 0 leaves the integral term: projected dual ascent at rate η·K_I (the docstring),
    against cudt.dual_ascent and the closed form λ_t = [λ_{t−1} + η·K_I·e_t]₊, whatever the
    init and the EMA (they feed only the proportional term)."""
    ascent = cudt.dual_ascent(0.1 * 2.5)
    lam, state, want = jnp.zeros(3), None, []
    state = ascent.init(lam)
    for e in ERRORS:
        u, state = ascent.update(jnp.asarray(e), state, lam)
        lam = optax.apply_updates(lam, u)
        want.append(np.asarray(lam))
    by_hand, closed = np.zeros(3, np.float32), []
    for e in ERRORS:
        by_hand = np.maximum(by_hand + 0.25 * e, 0)
        closed.append(by_hand)
    ours = _ours(init, 0.0, 2.5, nu, 0.1)
    np.testing.assert_allclose(ours, np.stack(want), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(ours, np.stack(closed), rtol=1e-6, atol=1e-7)


def test_sgd_init_starts_each_row_of_an_indexed_table_when_a_batch_first_holds_it():
    # every row violated by 1; rows 2, 3 first seen in the second batch start as rows 0, 1 did
    def problem(w, ids, key):
        del key
        return jnp.sum(w**2), {"c": cudt.Constraint(jnp.ones(ids.shape[0]), index=ids)}

    init, step = cudt.make_constrained_step(problem, optax.sgd(0.1), cudt.nupi(1.0, kp=1.0))
    state = init(jnp.zeros(2), jnp.arange(2), num_indexed={"c": 4})
    state, _ = step(state, jnp.array([0, 1]), jax.random.key(0))
    state, _ = step(state, jnp.array([2, 3]), jax.random.key(1))
    np.testing.assert_array_equal(state.multipliers["c"], [1.0, 1.0, 1.0, 1.0])
