"""The drop-in Lagrangian (cudt.lagrangian) in each example's own loop equals
make_constrained_step (simultaneous, same optimisers, same problem) to 1e-6; bad input is one
clear ValueError."""

import importlib.util
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import cudt

STEPS = 100  # enough for the norm bound to become active (λ > 0); the gap needs 300
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def assert_close(a, b, what):
    """Every leaf within 1e-6 (relative to the leaf's largest magnitude where that is > 1)."""
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        err = float(np.max(np.abs(x - y)) / max(1.0, np.max(np.abs(y))))
        assert err <= 1e-6, f"{what}: max |drop-in - step| / max(1, |step|) = {err}"
        print(f"{what}: max |drop-in - step| / max(1, |step|) = {err:.1e}")


def run_step(problem, params, batches, primal, dual, formulation=None, num_indexed=None):
    init, step = cudt.make_constrained_step(problem, primal, dual, formulation, jit=True)
    state = init(params, batches[0], num_indexed=num_indexed)
    for b in batches:
        state, _ = step(state, b, jax.random.key(0))
    return state


def test_nnx_example_equals_the_step():
    ex = load("nnx_fairness")
    model, mult = ex.main(steps=300)
    graphdef, params = nnx.split(ex.MLP(nnx.Rngs(0)))
    state = run_step(
        lambda p, b, k: ex.problem(nnx.merge(graphdef, p), b, k),
        params,
        [ex.data()] * 300,
        ex.primal,
        ex.dual,
    )
    assert float(state.multipliers["fair"]) > 0  # the constraint is active: λ moved
    assert_close(nnx.state(model, nnx.Param), state.params, "nnx params")
    assert_close(mult, state.multipliers, "nnx multipliers")


def test_jax_example_equals_the_step():
    ex = load("jax_norm_bound")
    params, mult = ex.main(steps=STEPS)
    state = run_step(
        ex.problem,
        ex.init_params(jax.random.key(0)),
        [ex.data()] * STEPS,
        ex.optimizer,
        ex.dual,
        ex.formulation,
    )
    assert float(state.multipliers["norm"]) > 0
    assert_close(params, state.params, "norm-bound params")
    assert_close(mult, state.multipliers, "norm-bound multipliers")


def test_optax_per_example_equals_the_step():
    ex = load("optax_per_example")
    w, mult = ex.main(epochs=2, batch_size=32)
    x, y = ex.data()
    batches = [
        (x[ids], y[ids], ids)
        for epoch in range(2)
        for ids in jax.random.permutation(jax.random.key(epoch), len(x)).reshape(-1, 32)
    ]
    state = run_step(
        ex.problem, jnp.zeros(8), batches, ex.optimizer, ex.dual, None, {"fit": len(x)}
    )
    assert int((state.multipliers["fit"] > 0).sum()) > 10
    assert_close(w, state.params, "per-example params")
    assert_close(mult, state.multipliers, "per-example multipliers")


def _toy(params, batch, key):
    x, ids = batch
    v = x @ params
    return jnp.sum(params**2), {
        "row": cudt.Constraint(1.0 - v, index=ids, resilience=4.0, scale=2.0),
        "eq": cudt.Constraint(jnp.mean(v) - 0.5, kind="eq"),
    }


@pytest.mark.parametrize(
    "dual, formulation",
    [
        (cudt.dual_adam(0.1), cudt.Lagrangian()),
        (cudt.nupi(0.1, kp=2.0), cudt.AugmentedLagrangian(penalty=0.5)),
        (cudt.dual_ascent(0.1), cudt.QuadraticPenalty(penalty=2.0)),
    ],
)
def test_stateful_duals_indexed_rows_resilience_scale_and_equality(dual, formulation):
    """Adam's and nuPI's state move only at the batch's rows, as in the step; resilience,
    scale, a free-sign equality and every formulation agree too."""
    x = jax.random.normal(jax.random.key(0), (12, 3))
    batches = [(x[ids], ids) for ids in (jnp.arange(4), jnp.arange(4, 8), jnp.arange(2, 6))] * 2
    lag = cudt.lagrangian(_toy, dual, formulation, num_indexed={"row": 12}, dual_radius=5.0)
    params, opt = jnp.ones(3), optax.sgd(0.05)
    mult = lag.init(params, batches[0])
    opt_state, dual_state = opt.init(params), lag.dual.init(mult)
    for b in batches:
        (_, _), (g, dg) = jax.value_and_grad(lag.loss, (0, 1), True)(params, mult, b)
        upd, opt_state = opt.update(g, opt_state, params)
        params = optax.apply_updates(params, upd)
        upd, dual_state = lag.dual.update(dg, dual_state, mult, index=b[1])
        mult = optax.apply_updates(mult, upd)
    init, step = cudt.make_constrained_step(_toy, opt, dual, formulation, dual_radius=5.0)
    state = init(jnp.ones(3), batches[0], num_indexed={"row": 12})
    for b in batches:
        state, _ = step(state, b, jax.random.key(0))
    assert isinstance(mult["eq"], cudt.FreeSign)
    mult = {"row": mult["row"], "eq": mult["eq"].value}
    if formulation.uses_multipliers:
        assert np.all(np.asarray(mult["row"][8:]) == 0)  # rows never in a batch never moved
        assert float(jnp.abs(mult["row"][:8]).max()) > 0
    assert_close(params, state.params, "toy params")
    assert_close(mult, state.multipliers, "toy multipliers")
    assert_close(dual_state, state.dual_state, "toy dual states")


def test_bad_input_is_one_clear_value_error():
    params, batch = jnp.ones(3), (jnp.ones((4, 3)), jnp.arange(4))
    with pytest.raises(ValueError, match="unknown formulation"):
        cudt.lagrangian(_toy, cudt.dual_ascent(0.1), formulation="lagrangian")
    with pytest.raises(ValueError, match="growth"):
        cudt.lagrangian(_toy, cudt.dual_ascent(0.1), cudt.AugmentedLagrangian(growth=2.0))
    with pytest.raises(ValueError, match="optax GradientTransformation"):
        cudt.lagrangian(_toy, optax.sgd)
    # a plain optax optimiser minimises: it would lower the multipliers of violated constraints
    with pytest.raises(ValueError, match=r"plain optax optimiser.*cudt\.as_dual"):
        cudt.lagrangian(_toy, optax.sgd(0.1))
    # a transformation after the projection could push the multipliers below 0 (found by
    # review: optax.scale(2.0) after it took λ = 0.3 to −0.3 on a satisfied constraint)
    with pytest.raises(ValueError, match=r"goes on after cudt\.project_nonnegative\(\)"):
        cudt.lagrangian(_toy, optax.chain(cudt.dual_ascent(0.5), optax.scale(2.0)))
    # the step takes the same checks, and names the argument
    for kwargs, says in (
        (dict(dual=optax.adam(0.1)), "plain optax optimiser"),
        (dict(dual=optax.chain(cudt.dual_adam(0.1), optax.scale(2.0))), "goes on after"),
        (dict(dual="ascent"), "dual must be an optax GradientTransformation, got str"),
        (dict(primal="adam"), "primal must be an optax GradientTransformation, got str"),
        (dict(formulation="lagrangian"), "unknown formulation 'lagrangian'"),
    ):
        args = dict(primal=optax.sgd(0.1), dual=cudt.dual_ascent(0.1)) | kwargs
        with pytest.raises(ValueError, match=says):
            cudt.make_constrained_step(_toy, **args)
    cudt.make_constrained_step(_toy, optax.sgd(0.1), cudt.as_dual(optax.adam(0.1)))  # wrapped
    with pytest.raises(ValueError, match=r"pass num_indexed=\{'row': N\}"):
        cudt.lagrangian(_toy, cudt.dual_ascent(0.1)).init(params, batch)
    lag = cudt.lagrangian(_toy, cudt.dual_ascent(0.1), num_indexed={"row": 4})
    with pytest.raises(ValueError, match=r"multipliers are for \['row'\]"):
        lag.loss(params, {"row": jnp.zeros(4)}, batch)  # a constraint without multipliers
    mult = lag.init(params, batch)

    # ids outside the table: refused when concrete, NaN under jit, as the step and the dual
    # update read them (numpy indexing wrapped -1 into the loss, which the update then skipped)
    def outside(p, b, k):
        return p**2, {"fit": cudt.Constraint(1 - p * b, index=jnp.array([-1]))}

    out = cudt.lagrangian(outside, cudt.dual_ascent(0.1), num_indexed={"fit": 3})
    table = {"fit": jnp.array([0.0, 0.0, 5.0])}
    with pytest.raises(ValueError, match=r"index ids must lie in \[0, 3\)"):
        out.loss(jnp.array(0.0), table, jnp.ones(1))
    assert jnp.isnan(jax.jit(out.loss)(jnp.array(0.0), table, jnp.ones(1))[0])
    with pytest.raises(ValueError, match="pass the batch's ids"):
        lag.dual.update(mult, lag.dual.init(mult), mult)
    with pytest.raises(ValueError, match=r"no gradient for constraints \['eq', 'row'\]"):
        lag.dual.update({}, lag.dual.init(mult), mult, index=jnp.arange(4))  # was a KeyError
    slack = lambda p, b, k: (
        jnp.sum(p),
        {"s": cudt.Constraint(p, resilience=1.0, resilience_mode="slack")},
    )
    with pytest.raises(ValueError, match="resilience_mode='decay'"):
        cudt.lagrangian(slack, cudt.dual_ascent(0.1)).init(params, batch)
    with pytest.raises(ValueError, match="unknown formulation") as refused:
        cudt.lagrangian(_toy, cudt.dual_ascent(0.1), formulation=object())
    assert "\n" not in str(refused.value)


def test_the_dual_updates_index_given_as_a_list_is_named_as_constraints_is():
    """``lag.dual.update(..., index=[0, 1, 2, 3])`` failed in the gather ("Using a non-tuple
    sequence for multidimensional indexing"; a tuple: "Too many indices"): one line naming the
    constraint and the fix, as ``Constraint(index=[...])`` gives; an array of ids updates."""
    params, batch = jnp.zeros(3), (jnp.ones((4, 3)), jnp.arange(4))  # every row violated
    lag = cudt.lagrangian(_toy, cudt.dual_ascent(0.1), num_indexed={"row": 4})
    mult = lag.init(params, batch)
    (_, _), (_, dg) = jax.value_and_grad(lag.loss, (0, 1), True)(params, mult, batch)
    state = lag.dual.init(mult)
    for index, says in (
        ([0, 1, 2, 3], "got a list: pass index=jnp.asarray(ids)"),
        ((0, 1, 2, 3), "got a tuple: pass index=jnp.asarray(ids)"),
        ({"row": [0, 1, 2, 3]}, "got a list: pass index=jnp.asarray(ids)"),
        (jnp.arange(4.0), "must hold integer row ids, got dtype float32"),
    ):
        with pytest.raises(ValueError, match=re.escape(says)) as refused:
            lag.dual.update(dg, state, mult, index=index)
        assert "constraint 'row'" in str(refused.value) and "\n" not in str(refused.value)
    upd, _ = lag.dual.update(dg, state, mult, index=np.arange(4))  # numpy's ids too
    assert float(jnp.abs(upd["row"]).max()) > 0
