"""Saddle points with a known KKT point (x, λ) = (0, 0) where simultaneous GDA diverges.

min 0.05·x² s.t. x = 0, steps η = 0.5: simultaneous GDA's iteration matrix has
|eig|² = 1 − ηε + η² > 1 (spirals out); alternating has det = 1 − ηε < 1; extragradient,
optimistic (extrapolation from the past) and the augmented Lagrangian (ρ = 1 adds curvature in x)
converge.

And where the two extrapolation schemes part: min x² s.t. x ≥ 1 (KKT x = 1, λ = 2), primal SGD
0.2, dual ascent 5.0. Linearised at the KKT point, classic extragradient (two gradients a step)
contracts by 0.6 per step; optimistic (one gradient a step) has a root of modulus 1.83 and
does not converge: the multiplier and its extrapolation held at λ ≥ 0 turn its spiral into a
cycle (x repeats 2.5, 3.06, 6.39, far from 1). Each converges inside its own stability region.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import cudt


def _problem(params, batch, key):
    del batch, key
    return 0.05 * params["x"] ** 2, {"h": cudt.Constraint(params["x"], kind="eq")}


def _ineq_problem(params, batch, key):
    # min 0.05·x² + x s.t. -x <= 0; KKT: x = 0, λ = 1 (the objective pushes x below 0)
    del batch, key
    x = params["x"]
    return 0.05 * x**2 + x, {"g": cudt.Constraint(-x, kind="ineq")}


def _run(problem, update, formulation, steps=300, lr=0.5):
    init, step = cudt.make_constrained_step(
        problem,
        primal=optax.sgd(lr),
        dual=cudt.dual_ascent(lr),
        formulation=formulation,
        update=update,
    )
    state = init({"x": jnp.array(1.0)}, None)
    for t in range(steps):
        state, _ = step(state, None, jax.random.key(t))
    name = next(iter(state.multipliers))
    return float(state.params["x"]), float(state.multipliers[name])


def test_simultaneous_gda_diverges():
    x, lam = _run(_problem, "simultaneous", cudt.Lagrangian(), steps=100)
    assert abs(x) + abs(lam) > 1e3


@pytest.mark.parametrize(
    "update,formulation",
    [
        ("alternating", cudt.Lagrangian()),
        ("extragradient", cudt.Lagrangian()),
        ("optimistic", cudt.Lagrangian()),
        ("simultaneous", cudt.AugmentedLagrangian(penalty=1.0)),
    ],
)
def test_remedies_converge_to_kkt(update, formulation):
    x, lam = _run(_problem, update, formulation)
    assert abs(x) < 1e-2 and abs(lam) < 1e-2


@pytest.mark.parametrize("update", ["alternating", "extragradient", "optimistic"])
def test_inequality_kkt(update):
    x, lam = _run(_ineq_problem, update, cudt.Lagrangian(), steps=600, lr=0.2)
    np.testing.assert_allclose([x, lam], [0.0, 1.0], atol=2e-2)


def _bound_problem(params, batch, key):
    del batch, key
    return params["x"] ** 2, {"g": cudt.Constraint(1.0 - params["x"])}


def _run_bound(update, primal_lr, dual_lr, steps):
    init, step = cudt.make_constrained_step(
        _bound_problem, optax.sgd(primal_lr), cudt.dual_ascent(dual_lr), update=update
    )
    state = init({"x": jnp.array(0.0)}, None)
    xs = []
    for t in range(steps):
        state, _ = step(state, None, jax.random.key(t))
        xs.append(float(state.params["x"]))
    return np.asarray(xs), float(state.multipliers["g"])


def test_extragradient_takes_two_gradients_and_converges_where_optimistic_diverges():
    x, lam = _run_bound("extragradient", 0.2, 5.0, steps=60)
    np.testing.assert_allclose([x[-1], lam], [1.0, 2.0], atol=1e-4)
    x, _ = _run_bound("optimistic", 0.2, 5.0, steps=300)
    assert not np.all(np.isfinite(x)) or np.max(np.abs(x[-10:] - 1)) > 1  # far from x* = 1
    # inside its own (smaller) stability region, optimistic converges too
    x, lam = _run_bound("optimistic", 0.1, 1.0, steps=300)
    np.testing.assert_allclose([x[-1], lam], [1.0, 2.0], atol=1e-3)
