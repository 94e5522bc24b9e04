"""Saddle points with a known KKT point (x, λ) = (0, 0) where simultaneous GDA diverges.

min 0.05·x² s.t. x = 0, steps η = 0.5: simultaneous GDA's iteration matrix has
|eig|² = 1 − ηε + η² > 1 (spirals out); alternating has det = 1 − ηε < 1; extragradient from the
past and the augmented Lagrangian (ρ = 1 adds curvature in x) converge.
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
        ("simultaneous", cudt.AugmentedLagrangian(penalty=1.0)),
    ],
)
def test_remedies_converge_to_kkt(update, formulation):
    x, lam = _run(_problem, update, formulation)
    assert abs(x) < 1e-2 and abs(lam) < 1e-2


@pytest.mark.parametrize("update", ["alternating", "extragradient"])
def test_inequality_kkt(update):
    x, lam = _run(_ineq_problem, update, cudt.Lagrangian(), steps=600, lr=0.2)
    np.testing.assert_allclose([x, lam], [0.0, 1.0], atol=2e-2)
