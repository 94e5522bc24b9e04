"""The general constrained step: contract, formulations, indexed tables, sweeps."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import cudt


def _problem(params, batch, key):
    # min (x-0)^2 s.t. 1 - x <= 0 (KKT: x=1, λ=2); y = 0.5 (eq: y - 0.5 = 0); per-sample x >= a_i
    del key
    x, y = params["x"], params["y"]
    return x**2 + y**2, {
        "budget": cudt.Constraint(1.0 - x, kind="ineq"),
        "balance": cudt.Constraint(y - 0.5, kind="eq"),
        "per_sample": cudt.Constraint(batch["a"] - x, kind="ineq", index=batch["ids"]),
    }


def _batch(ids):
    ids = jnp.asarray(ids, jnp.int32)
    return {"ids": ids, "a": 0.5 * jnp.ones(ids.shape)}


def test_contract_shapes_and_kkt():
    init, step = cudt.make_constrained_step(
        _problem, primal=optax.sgd(0.05), dual=cudt.dual_ascent(0.05), update="alternating"
    )
    params = {"x": jnp.array(0.0), "y": jnp.array(0.0)}
    state = init(params, _batch([0, 1]), num_indexed={"per_sample": 6})
    assert state.multipliers["per_sample"].shape == (6,)
    assert state.multipliers["budget"].shape == ()
    for t in range(1500):
        state, metrics = step(state, _batch([t % 3, 3 + t % 3]), jax.random.key(t))
    np.testing.assert_allclose(state.params["x"], 1.0, atol=2e-2)
    np.testing.assert_allclose(state.multipliers["budget"], 2.0, atol=5e-2)
    # equality multiplier is free-sign: y = 0.5 needs λ = -1
    np.testing.assert_allclose(state.multipliers["balance"], -1.0, atol=5e-2)
    assert float(state.multipliers["balance"]) < 0
    assert np.all(np.asarray(state.multipliers["per_sample"]) >= 0)
    assert set(metrics) >= {"objective", "lagrangian", "constraints", "violation"}


def test_init_does_not_alias_and_requires_num_indexed():
    init, _ = cudt.make_constrained_step(
        _problem, primal=optax.sgd(0.1), dual=cudt.dual_ascent(0.1)
    )
    params = {"x": jnp.array(0.0), "y": jnp.array(0.0)}
    state = init(params, _batch([0]), num_indexed={"per_sample": 3})
    assert state.params["x"] is not params["x"]
    assert state.params["x"].unsafe_buffer_pointer() != params["x"].unsafe_buffer_pointer()
    with pytest.raises(ValueError, match="num_indexed"):
        init(params, _batch([0]))
    # a table size for a constraint that is not indexed was ignored without a word
    with pytest.raises(ValueError, match="'budget' is not indexed .*: drop 'budget' from num_"):
        init(params, _batch([0]), num_indexed={"per_sample": 3, "budget": 3})


def test_init_copies_a_callers_penalty_and_constrained_arrays_the_step_donates():
    # a float32 rho was one buffer in every constraint's penalty: the donating step failed
    # ("Attempt to donate the same buffer twice"); a bool constrained array was the caller's,
    # deleted by the first step
    init, step = cudt.make_constrained_step(
        _problem,
        primal=optax.sgd(0.1),
        dual=cudt.dual_ascent(0.1),
        formulation=cudt.AugmentedLagrangian(penalty=1.0),
    )
    params = {"x": jnp.array(0.0), "y": jnp.array(0.0)}
    rho, on = jnp.asarray(2.0, jnp.float32), jnp.asarray(True)
    state = init(params, _batch([0]), num_indexed={"per_sample": 3}, penalty=rho, constrained=on)
    for t in range(2):
        state, _ = step(state, _batch([t]), jax.random.key(t))
    assert float(rho) == 2.0 and bool(on)
    assert float(state.penalty["budget"]) == 2.0


def test_indexed_rows_outside_batch_bit_identical_with_adam():
    init, step = cudt.make_constrained_step(
        _problem, primal=optax.sgd(0.1), dual=cudt.dual_adam(0.1)
    )
    params = {"x": jnp.array(0.0), "y": jnp.array(0.0)}
    state = init(params, _batch([0, 1]), num_indexed={"per_sample": 8})
    state, _ = step(state, _batch([0, 1]), jax.random.key(0))
    before_mult = np.asarray(state.multipliers["per_sample"]).copy()
    before_dual = [np.asarray(x).copy() for x in jax.tree.leaves(state.dual_state["per_sample"])]
    state, _ = step(state, _batch([2, 5]), jax.random.key(1))
    after = np.asarray(state.multipliers["per_sample"])
    untouched = [0, 1, 3, 4, 6, 7]
    np.testing.assert_array_equal(after[untouched], before_mult[untouched])
    assert np.all(after[[2, 5]] > 0)
    for b, a in zip(before_dual, jax.tree.leaves(state.dual_state["per_sample"]), strict=True):
        a = np.asarray(a)
        if a.ndim and a.shape[0] == 8:
            np.testing.assert_array_equal(a[untouched], b[untouched])
            assert not np.array_equal(a[[2, 5]], b[[2, 5]])


def test_formulations_finite_at_zero_penalty():
    g = jnp.array([-1.0, 0.5])
    lam = jnp.array([0.3, 0.0])
    lag = cudt.Lagrangian().term(g, lam, "ineq", 0.0)
    al = cudt.AugmentedLagrangian(penalty=0.0).term(g, lam, "ineq", jnp.asarray(0.0))
    assert np.isfinite(float(al))
    np.testing.assert_allclose(al, lag, rtol=1e-7)
    al2 = cudt.AugmentedLagrangian(penalty=2.0).term(g, lam, "ineq", jnp.asarray(2.0))
    # active set {g>0 or λ>0} = both entries: + (2/2)(1 + 0.25)
    np.testing.assert_allclose(al2, lag + 1.25, rtol=1e-6)
    qp = cudt.QuadraticPenalty(penalty=2.0).term(g, lam, "ineq", jnp.asarray(2.0))
    np.testing.assert_allclose(qp, 0.25, rtol=1e-6)
    with pytest.raises(ValueError, match="penalty"):
        cudt.AugmentedLagrangian(penalty=-1.0)
    with pytest.raises(ValueError, match="kind"):
        cudt.Constraint(g, kind="leq")


def test_the_penalty_grows_while_the_violation_does_not_shrink_and_stops_at_its_cap():
    """ρ ← min(ρ·growth, penalty_max) when the violation's RMS did not shrink below tolerance ×
    the last one; kept where it did (a constraint that is met at once), per constraint."""

    def problem(params, batch, key):
        stuck = cudt.Constraint(1.0 + 0.0 * params["x"])  # violated by 1 whatever x is
        met = cudt.Constraint(-1.0 + 0.0 * params["x"])  # never violated
        return params["x"] ** 2, {"stuck": stuck, "met": met}

    form = cudt.AugmentedLagrangian(penalty=1.0, growth=2.0, tolerance=0.5, penalty_max=8.0)
    init, step = cudt.make_constrained_step(problem, optax.sgd(0.1), cudt.dual_ascent(1e-3), form)
    state = init({"x": jnp.asarray(1.0)}, None)
    seen = []
    for _ in range(6):
        state, _ = step(state, None, jax.random.key(0))
        seen.append((float(state.penalty["stuck"]), float(state.penalty["met"])))
    # step 1 has no earlier violation to compare; then 2, 4, 8, and the cap holds
    assert [s for s, _ in seen] == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert all(m == 1.0 for _, m in seen)


@pytest.mark.parametrize("update", ["simultaneous", "alternating", "extragradient"])
def test_vmap_over_states(update):
    init, step = cudt.make_constrained_step(
        _problem, primal=optax.sgd(0.05), dual=cudt.dual_ascent(0.05), update=update
    )
    batch = _batch([0, 1])
    states = jax.vmap(lambda x: init({"x": x, "y": jnp.array(0.0)}, batch, {"per_sample": 4}))(
        jnp.array([0.0, 2.0])
    )
    vstep = jax.vmap(step, in_axes=(0, None, None))
    s0 = init({"x": jnp.array(2.0), "y": jnp.array(0.0)}, batch, {"per_sample": 4})
    for t in range(5):
        states, _ = vstep(states, batch, jax.random.key(t))
        s0, _ = step(s0, batch, jax.random.key(t))
    np.testing.assert_allclose(states.params["x"][1], s0.params["x"], rtol=1e-6)
    np.testing.assert_allclose(
        states.multipliers["per_sample"][1], s0.multipliers["per_sample"], rtol=1e-6
    )


def test_dual_radius_and_nupi_in_the_step():
    def problem(p, b, k):
        return jnp.sum(p["w"]), {
            "lo": cudt.Constraint(1.0 - p["w"], kind="ineq"),  # w ≥ 1, pushes λ up
            "eq": cudt.Constraint(jnp.sum(p["w"]) - 10.0, kind="eq"),
        }

    init, step = cudt.make_constrained_step(
        problem, primal=optax.sgd(1e-3), dual=cudt.nupi(1.0, kp=0.5), dual_radius=0.25
    )
    s = init({"w": jnp.zeros(2)}, None)
    for _ in range(5):
        s, _ = step(s, None, jax.random.key(0))
    np.testing.assert_allclose(s.multipliers["lo"], [0.25, 0.25])  # clipped at the radius
    assert float(s.multipliers["eq"]) == -0.25  # free sign, clipped at −R


def test_the_projection_metric_is_the_share_of_the_update_taken_back():
    """metrics["projection"] = ‖P(θ′) − θ′‖ / ‖θ′ − θ‖: 0 while the update stays inside the set,
    the clipped share once it leaves; absent without a projection."""

    def problem(params, batch, key):
        del batch, key
        return -jnp.sum(params["w"]), {"c": cudt.Constraint(jnp.zeros(()), kind="ineq")}

    clip = lambda p: {"w": jnp.clip(p["w"], -1.0, 1.0)}  # noqa: E731
    init, step = cudt.make_constrained_step(
        problem, primal=optax.sgd(0.4), dual=cudt.dual_ascent(0.1), project_params=clip
    )
    state = init({"w": jnp.asarray([0.0, 0.9])}, None)
    state, metrics = step(state, None, jax.random.key(0))
    # θ′ = [0.4, 1.3] -> P = [0.4, 1.0]: 0.3 of an update of norm 0.4·√2
    np.testing.assert_allclose(metrics["projection"], 0.3 / (0.4 * np.sqrt(2)), rtol=1e-5)
    state = init({"w": jnp.asarray([0.0, -0.9])}, None)
    _, inside = step(state, None, jax.random.key(0))
    assert float(inside["projection"]) == 0.0
    plain_init, plain_step = cudt.make_constrained_step(
        problem, optax.sgd(0.4), cudt.dual_ascent(0.1)
    )
    _, m = plain_step(plain_init({"w": jnp.zeros(2)}, None), None, jax.random.key(0))
    assert "projection" not in m


def test_init_projects_the_parameters_it_is_given():
    """The first step, too, is taken in the set: init applies project_params (the text UT's
    Xavier init started with W_f's eigenvalues in [−0.21, 1.19] where the projection keeps
    [−0.95, 0.95], and its first gradient was taken there; found by review)."""

    def problem(params, batch, key):
        del batch, key
        return jnp.sum(params["w"] ** 2), {"c": cudt.Constraint(params["w"][0] - 5.0)}

    clip = lambda p: {"w": jnp.clip(p["w"], -1.0, 1.0)}  # noqa: E731
    init, step = cudt.make_constrained_step(
        problem, primal=optax.sgd(0.1), dual=cudt.dual_ascent(0.1), project_params=clip
    )
    given = {"w": jnp.asarray([3.0, -0.5])}
    state = init(given, None)
    np.testing.assert_array_equal(state.params["w"], [1.0, -0.5])
    np.testing.assert_array_equal(given["w"], [3.0, -0.5])  # the caller's own arrays kept
    _, metrics = step(state, None, jax.random.key(0))
    np.testing.assert_allclose(metrics["objective"], 1.25, rtol=1e-6)  # f at the projected point


def test_the_phase_one_objective_is_the_normalised_violation():
    losses = jnp.asarray([10.0, 8.0, 7.8, 8.0])  # ratios 0.8, 0.975, 1.026 against 0.9
    got = cudt.descent.violation(losses, 0.1)
    np.testing.assert_allclose(got, (0.975 - 0.9) + (8.0 / 7.8 - 0.9), rtol=1e-6)
    assert float(cudt.descent.violation(jnp.asarray([10.0, 8.0, 6.0]), 0.1)) == 0.0
    cfg = cudt.DescentConfig(num_layers=3, epsilon=0.1)
    per_sample = lambda params, batch, key: jnp.broadcast_to(params, (4, 4))  # noqa: E731
    problem = cudt.descent.problem(per_sample, cfg, objective="violation")
    f, _, aux = problem(losses, None, None, cudt.descent.hparams(cfg))
    np.testing.assert_allclose(f, got, rtol=1e-6)
    np.testing.assert_allclose(aux["layer_loss"], losses)
    with pytest.raises(ValueError, match="objective must be one of"):
        cudt.descent.problem(per_sample, cfg, objective="loss_and_more")


def test_the_judged_phase_one_objective_leaves_out_the_steps_the_runner_does_not_judge():
    """At γ_train 0 the UT's state 0 is the clean input (ℓ_0 = 0): the runner's verdict leaves
    layer 1's step out (cudt.metrics.applicable_steps), but the phase-I objective counted it as
    ℓ_1 / 1e-12 ~ 1e10 and drove it (found by review: phase I ended with the judged violation
    worse than its ERM start)."""
    from cudt.metrics import applicable_steps

    rows = [
        [0.0, 0.01, 0.009, 0.008],  # ℓ_0 at the floor: step 1 not judged
        [1.0, 0.5, 1e-4, 0.2],  # ℓ_2 = 1e-4 of the largest loss: at the relative floor
        [1.0, 0.5, 0.6, jnp.nan],  # NaN stays judged
        [10.0, 8.0, 7.8, 8.0],  # every step judged
    ]
    for row in rows:
        got = np.asarray(cudt.descent.judged_steps(jnp.asarray(row, jnp.float32)))
        np.testing.assert_array_equal(got, applicable_steps(np.asarray(row)))
    cfg = cudt.DescentConfig(num_layers=3, epsilon=0.1)
    per_sample = lambda params, batch, key: jnp.broadcast_to(params, (4, 4))  # noqa: E731
    judged = cudt.descent.problem(per_sample, cfg, objective="judged_violation")
    plain = cudt.descent.problem(per_sample, cfg, objective="violation")
    hp = cudt.descent.hparams(cfg)
    floor = jnp.asarray(rows[0])
    f, _, _ = judged(floor, None, None, hp)
    assert float(f) == 0.0  # 0.9 and 0.889 of the judged steps: met
    assert float(plain(floor, None, None, hp)[0]) > 1e9  # the plain objective: unchanged
    near = jnp.asarray([1e-8, 0.01, 0.0095, 0.01])  # ℓ_0 below the floor (1e-5), not 0
    grad = jax.grad(lambda p: judged(p, None, None, hp)[0])(near)
    assert np.all(np.isfinite(grad)) and grad[0] == 0.0  # no pull through the left-out step
    assert jax.grad(lambda p: plain(p, None, None, hp)[0])(near)[0] < -1e9  # the plain one's
    every = jnp.asarray(rows[3])  # where every step is judged, the two are the same
    np.testing.assert_allclose(judged(every, None, None, hp)[0], plain(every, None, None, hp)[0])


def test_erm_reports_its_objective_as_its_lagrangian_under_every_formulation():
    """An ERM run descends the objective alone; its reported Lagrangian says so, also where a
    penalty formulation's terms are not zero (w0 = 3 violates w0 <= 1)."""

    def problem(p, b, k):
        return jnp.sum((p["w"] - 2) ** 2), {"c": cudt.Constraint(p["w"][0] - 1.0)}

    params = {"w": jnp.full(2, 3.0)}
    for formulation in (cudt.AugmentedLagrangian(penalty=5.0), cudt.QuadraticPenalty(penalty=5.0)):
        for update in ("simultaneous", "extragradient"):
            init, step = cudt.make_constrained_step(
                problem, optax.sgd(0.05), cudt.dual_ascent(0.1), formulation, update=update
            )
            _, erm = step(init(params, None, constrained=False), None, jax.random.key(0))
            _, con = step(init(params, None), None, jax.random.key(0))
            assert float(erm["lagrangian"]) == float(erm["objective"]) == 2.0
            assert float(con["lagrangian"]) == 12.0  # 2 + ρ/2 · 2²


def test_a_runs_values_are_checked_as_the_config_checks_them():
    """init's per-run overrides and a constraint's scale: a value the config would refuse is one
    ValueError naming it (a sweep's values, traced under vmap, are the runner's to check)."""
    L = 3

    def layer_losses(p, b, k):
        return jnp.stack([jnp.mean((b - p["w"]) ** 2, -1)] * (L + 1), 1)

    cfg = cudt.DescentConfig(num_layers=L, epsilon=0.1)
    primal = optax.inject_hyperparams(optax.sgd)(learning_rate=0.1)
    init, _ = cudt.make_train_step(layer_losses, primal, cudt.dual_ascent(0.1), cfg)
    params = {"w": jnp.zeros(4)}
    for kwargs, says in (
        (dict(epsilon=1.5), r"epsilon must lie in \[0, 1\)"),
        (dict(epsilon=-0.5), r"epsilon must lie in \[0, 1\)"),
        (dict(epsilon=jnp.array([0.1, 0.2])), "epsilon must be a scalar or 3 values"),
        (dict(resilience=-1.0), "resilience must be > 0"),
        (dict(tail_beta=2.0), r"tail_beta must lie in \(0, 1\]"),
        (dict(lr=-1.0), "lr must be > 0"),
        (dict(dual_lr=0.1), "cannot set the dual's learning_rate"),
    ):
        with pytest.raises(ValueError, match=says):
            init(params, **kwargs)
    runs = jax.vmap(lambda e: init(params, epsilon=e))(jnp.array([0.1, 0.2]))  # a sweep
    assert runs.hparams["epsilon"].shape == (2, L)
    with pytest.raises(ValueError, match="scale must be > 0"):
        cudt.Constraint(jnp.ones(2), scale=-1.0)
    for tree in ({"a": jnp.ones(2)}, [jnp.ones(2)], (jnp.ones(2), jnp.ones(3))):

        def of_a_tree(p, b, k, tree=tree):
            return jnp.sum(p["w"] ** 2), {"c": cudt.Constraint(tree)}

        init_tree, _ = cudt.make_constrained_step(of_a_tree, optax.sgd(0.1), cudt.dual_ascent(1))
        with pytest.raises(TypeError, match="'c': a Constraint's value must be one array .* one"):
            init_tree(params, None)
    # a tree map over constraints may put any leaf in a Constraint (checked where it is used)
    pairs = jax.tree.map(lambda v: (v, -v), cudt.Constraint(jnp.ones(2)))
    assert pairs.value[1].tolist() == [-1.0, -1.0]
    with pytest.raises(TypeError, match=r"params\['w'\] is int32, not floating-point"):
        init({"w": jnp.zeros(4, jnp.int32)})

    def three(p, b, k):  # no hparams argument
        return jnp.sum(p["w"] ** 2), {"c": cudt.Constraint(p["w"][0] - 1.0)}

    init3, _ = cudt.make_constrained_step(three, optax.sgd(0.1), cudt.dual_ascent(0.1))
    with pytest.raises(TypeError, match=r"define problem\(params, batch, key, hparams\)"):
        init3(params, None, hparams={"a": 1.0})


@pytest.mark.parametrize("update", ["simultaneous", "alternating", "extragradient", "optimistic"])
def test_optax_apply_if_finite_skips_a_non_finite_step_of_both_players(update):
    """A NaN loss would write NaN into the parameters and the multipliers; with both optimisers
    wrapped in optax.apply_if_finite the step leaves them as they were (the metrics still show
    the NaN) and the next finite step goes on."""

    def problem(params, batch, key):
        del key
        x = params["x"] * batch  # batch: a scale, NaN for a broken batch
        return jnp.sum(x**2), {"budget": cudt.Constraint(1.0 - jnp.sum(x), kind="ineq")}

    guard = lambda opt: optax.apply_if_finite(opt, max_consecutive_errors=3)  # noqa: E731
    init, step = cudt.make_constrained_step(
        problem, guard(optax.sgd(0.05)), guard(cudt.dual_ascent(0.5)), update=update
    )
    state = init({"x": jnp.zeros(2)}, jnp.float32(1.0))
    for _ in range(3):
        state, _ = step(state, jnp.float32(1.0), jax.random.key(0))
    before = jax.tree.map(np.asarray, (state.params, state.multipliers))
    assert float(before[1]["budget"]) > 0  # the dual moved: a skipped step would show
    state, metrics = step(state, jnp.float32(jnp.nan), jax.random.key(0))
    assert np.isnan(float(metrics["lagrangian"]))
    after = jax.tree.map(np.asarray, (state.params, state.multipliers))
    jax.tree.map(np.testing.assert_array_equal, after, before)
    state, metrics = step(state, jnp.float32(1.0), jax.random.key(0))
    assert np.isfinite(float(metrics["lagrangian"]))
    assert not np.array_equal(np.asarray(state.params["x"]), before[0]["x"])


def _resilient_fit(formulation, mode, alpha, steps=3000):
    """min (w − 3)² s.t. w − 1 ≤ u, cost (α/2)u²: the resilient optimum is w* = (6 + α)/(2 + α)
    (and with the relaxation unrelaxed, a penalty ρ = 10 would pull w to (6 + α + ρ)/(2 + α + ρ))."""

    def problem(w, batch, key):
        del batch, key
        c = cudt.Constraint(w[0] - 1.0, resilience=alpha, resilience_mode=mode)
        return (w[0] - 3.0) ** 2, {"c": c}

    init, step = cudt.make_constrained_step(
        problem,
        optax.sgd(0.02),
        cudt.dual_ascent(0.05),
        formulation=formulation,
        slack_optimizer=optax.sgd(0.05),
    )
    state = init(jnp.zeros(1), None)
    for _ in range(steps):
        state, _ = step(state, None, jax.random.key(0))
    return float(state.params[0])


@pytest.mark.parametrize(
    "formulation", [cudt.AugmentedLagrangian(penalty=10.0), cudt.QuadraticPenalty(penalty=10.0)]
)
def test_decay_resilience_under_a_penalty_solves_the_resilient_problem_as_slacks_do(formulation):
    # the decay form puts the slack in: the augmented Lagrangian's penalty at g − λ/α (its
    # fixed point is the resilient optimum, (6 + α)/(2 + α)); the quadratic penalty's ρ becomes
    # ρ/(1 + ρ/α), the explicit slack minimised out (its optimum (6 + ρ_α)/(2 + ρ_α))
    alpha, rho = 1.0, 10.0
    decay = _resilient_fit(formulation, "decay", alpha)
    slack = _resilient_fit(formulation, "slack", alpha)
    rho_alpha = rho / (1 + rho / alpha)
    want = (
        (6 + alpha) / (2 + alpha)
        if formulation.uses_multipliers
        else (6 + rho_alpha) / (2 + rho_alpha)
    )
    np.testing.assert_allclose([decay, slack], [want, want], atol=3e-3)
    hard = _resilient_fit(formulation, "decay", None)  # and the hard constraint is still hard
    assert hard < decay - 0.5


def test_explicit_slacks_measure_the_violation_of_the_relaxed_constraint_as_decay_does():
    """min x² s.t. 1 − x ≤ u, cost (α/2)u², α = 2: the optimum x = u = 0.5, λ = 1. There the
    relaxed constraint holds with equality, in either form; the slack form measured g, not
    g − u (0.5 at the optimum), so an augmented Lagrangian's growth rule raised ρ 70x; the plain
    Lagrangian's decay form measured g too (0.5 where the augmented one measured 0)."""
    out = {}
    augmented = cudt.AugmentedLagrangian(penalty=0.1, growth=1.01, tolerance=1.0, penalty_max=1e6)
    for form in (augmented, cudt.Lagrangian()):
        for mode in ("decay", "slack"):

            def problem(p, batch, key, mode=mode):
                del batch, key
                c = cudt.Constraint(1.0 - p["x"], resilience=2.0, resilience_mode=mode)
                return p["x"] ** 2, {"c": c}

            init, step = cudt.make_constrained_step(
                problem,
                optax.sgd(0.01),
                cudt.dual_ascent(0.01),
                form,
                slack_optimizer=optax.sgd(0.05),
            )
            state = init({"x": jnp.array(0.0)}, None)
            for _ in range(3000):
                state, metrics = step(state, None, jax.random.key(0))
            out[type(form).__name__, mode] = state, metrics
    for key, (state, metrics) in out.items():
        np.testing.assert_allclose(float(state.params["x"]), 0.5, atol=1e-3, err_msg=str(key))
        np.testing.assert_allclose(float(state.multipliers["c"]), 1.0, atol=1e-2, err_msg=str(key))
        assert float(metrics["violation"]["c"]) < 1e-3, key
    decay, slack = (
        float(out["AugmentedLagrangian", m][0].penalty["c"]) for m in ("decay", "slack")
    )
    assert slack < 1.1 * decay, (slack, decay)  # ρ grows where the relaxed constraint is missed


@pytest.mark.parametrize("scale, x", [(None, 5.0 / 3.0), (2.0, 1.8)])
def test_a_quadratic_penalty_measures_the_relaxed_violation_in_either_resilience_form(scale, x):
    """min (x − 2)² s.t. x − 1 ≤ u, cost (α/2)u², α = ρ = 2 (both over the scale s): under the
    quadratic penalty both forms settle at the same x (5/3; 1.8 at s = 2), the slack at
    u = max(g, 0)·ρ/(α + ρ) = g/2 (minimised out in the decay form), where the relaxed
    constraint is violated by (g − u)/s. The decay form measured g/s, twice the slack form's
    reading of the same point; a hard run (α = inf) measures g/s."""
    g = x - 1.0
    s = 1.0 if scale is None else scale
    got = {}
    for mode, alpha in (("decay", 2.0), ("slack", 2.0), ("decay", jnp.inf)):

        def problem(p, batch, key, mode=mode, alpha=alpha):
            del batch, key
            c = cudt.Constraint(p - 1.0, resilience=alpha, resilience_mode=mode, scale=scale)
            return (p - 2.0) ** 2, {"c": c}

        init, step = cudt.make_constrained_step(
            problem, optax.sgd(0.05), cudt.dual_ascent(0.05), cudt.QuadraticPenalty(penalty=2.0)
        )
        state = init(jnp.asarray(x), None)
        if mode == "slack":
            state = state.replace(slacks={"c": jnp.asarray(g / 2.0)})
        _, metrics = step(state, None, jax.random.key(0))
        got[mode, float(alpha)] = float(metrics["violation"]["c"])
    np.testing.assert_allclose(got["decay", 2.0], g / 2.0 / s, rtol=1e-5)
    np.testing.assert_allclose(got["slack", 2.0], got["decay", 2.0], rtol=1e-5)
    np.testing.assert_allclose(got["decay", float("inf")], g / s, rtol=1e-5)


def test_a_scaled_bfloat16_constraint_keeps_float32_multipliers_and_one_program():
    def problem(w, batch, key):
        del batch, key
        return jnp.sum(w**2), {"c": cudt.Constraint((w[0] - 1.0).astype(jnp.bfloat16), scale=2.0)}

    init, step = cudt.make_constrained_step(problem, optax.sgd(0.1), cudt.dual_ascent(0.1))
    state = init(jnp.zeros(2), None)
    for t in range(3):
        state, _ = step(state, None, jax.random.key(t))
        assert state.multipliers["c"].dtype == jnp.float32
    assert step._cache_size() == 1


@pytest.mark.parametrize(
    "dual", [cudt.dual_ascent(0.005), cudt.dual_adam(0.0025), cudt.nupi(0.005, kp=1.0)]
)
def test_bfloat16_constraints_multipliers_do_not_stall(dual):
    """A bf16 constraint's multipliers were bf16: past 1 their spacing is 2^-7, so dual steps
    of 0.0025 rounded away and λ stayed at 1.0 (found by review). They are float32 now, the
    dual's step taken in float32, and λ grows as a float32 constraint's does."""

    def run(dtype):
        def problem(w, batch, key):
            del batch, key
            return jnp.sum(w**2), {"c": cudt.Constraint((0.5 - 0.0 * w[0]).astype(dtype))}

        init, step = cudt.make_constrained_step(problem, optax.sgd(0.01), dual)
        state = init(jnp.zeros(2), None)
        state, _ = jax.lax.scan(lambda s, k: (step(s, None, k)[0], None), state,
                                jax.random.split(jax.random.key(0), 1000))  # fmt: skip
        return state.multipliers["c"]

    lam16, lam32 = run(jnp.bfloat16), run(jnp.float32)
    assert lam16.dtype == jnp.float32
    assert float(lam32) > 2.4  # 1000 steps of about +0.0025
    np.testing.assert_allclose(float(lam16), float(lam32), rtol=1e-5)


def test_a_per_run_resilience_keeps_the_multipliers_dtype_through_a_scan():
    """α as a per-run value (a float32 array, as sweeps carry it), on a bf16 constraint: the
    multipliers keep their dtype through a scan over steps (when they were bf16, λ/α came
    back float32 and the scan refused its carry)."""

    def problem(p, batch, key, hp):
        del batch, key
        g = (1.0 - p["x"]).astype(jnp.bfloat16)
        return jnp.sum(p["x"] ** 2), {"c": cudt.Constraint(g, resilience=hp["alpha"])}

    init, step = cudt.make_constrained_step(problem, optax.sgd(0.05), cudt.dual_ascent(0.05))
    state = init({"x": jnp.zeros(2)}, None, hparams={"alpha": jnp.float32(5.0)})

    def body(s, key):
        return step(s, None, key)[0], None

    before = state.multipliers["c"].dtype
    state, _ = jax.lax.scan(body, state, jax.random.split(jax.random.key(0), 3))
    assert state.multipliers["c"].dtype == before == jnp.float32
    assert float(jnp.max(state.multipliers["c"])) > 0  # it moved


@pytest.mark.parametrize("formulation", ["lagrangian", "augmented"])
def test_float64_constraints_keep_the_states_dtypes_through_a_scan(formulation):
    """Under x64, float64 values made the measured violation (and the augmented penalty)
    float64 where the state holds float32: a scan over steps refused its carry (found by
    review)."""
    form = {"lagrangian": cudt.Lagrangian(), "augmented": cudt.AugmentedLagrangian(penalty=1.0)}

    def problem(x, batch, key):
        del batch, key
        return jnp.sum(x**2), {"c": cudt.Constraint(1.0 - x)}

    with jax.enable_x64(True):
        init, step = cudt.make_constrained_step(
            problem, optax.sgd(0.05), cudt.dual_ascent(0.05), formulation=form[formulation]
        )
        state = init(jnp.zeros(1, jnp.float64), None)

        def body(s, key):
            return step(s, None, key)[0], None

        out, _ = jax.lax.scan(body, state, jax.random.split(jax.random.key(0), 5))
        assert out.params.dtype == jnp.float64
        assert jax.tree.map(lambda a: a.dtype, out) == jax.tree.map(lambda a: a.dtype, state)
        assert float(out.multipliers["c"][0]) > 0  # it moved


def test_an_index_outside_the_table_reads_nan_and_writes_nothing_negative_ones_too():
    """Under jit the ids are traced: an id outside [0, N) reads NaN (the step's Lagrangian is
    NaN: a diverged run) and its row is dropped. A negative id wrapped to row N − 1, which was
    read and updated without a word."""

    def problem(p, ids, key):
        del key
        return 0.5 * p["w"] ** 2, {
            "c": cudt.Constraint(1.0 - p["w"] * jnp.ones(ids.shape), index=ids)
        }

    init, step = cudt.make_constrained_step(
        problem, optax.sgd(0.1), cudt.dual_ascent(0.5), donate=False
    )
    state = init({"w": jnp.array(0.0)}, jnp.array([0, 1]), num_indexed={"c": 4})
    for ids in ([-1, 0], [4, 0]):
        after, metrics = step(state, jnp.array(ids), jax.random.key(0))
        assert np.isnan(float(metrics["lagrangian"])), ids
        np.testing.assert_array_equal(after.multipliers["c"], [0.5, 0.0, 0.0, 0.0])


def test_the_optimistic_step_evaluates_a_projected_point():
    # x ≤ 1 by projection; the previous update (+1 a step, from the objective's pull to 5)
    # would extrapolate past it: the problem must only ever see x ≤ 1
    seen = []

    def problem(p, batch, key):
        del batch, key
        jax.debug.callback(lambda x: seen.append(float(x)), p["x"])
        return (p["x"] - 5.0) ** 2, {"g": cudt.Constraint(-p["x"] - 10.0)}

    init, step = cudt.make_constrained_step(
        problem,
        optax.sgd(0.25),
        cudt.dual_ascent(0.1),
        update="optimistic",
        project_params=lambda p: {"x": jnp.minimum(p["x"], 1.0)},
    )
    state = init({"x": jnp.array(0.0)}, None)
    for t in range(4):
        state, _ = step(state, None, jax.random.key(t))
    jax.effects_barrier()
    assert len(seen) >= 4 and max(seen) <= 1.0


def test_the_violation_metric_is_what_the_step_measured_also_for_erm_and_in_warmup():
    """metrics["violation"] is the RMS of h at the step's evaluation: an ERM run (x = 0 breaks
    x >= 1 by 1) and a warm-up step report it; they once reported the state's last active
    value, inf before any."""

    def problem(p, batch, key):
        return p**2, {"lo": cudt.Constraint(1 - p)}

    init, step = cudt.make_constrained_step(problem, optax.sgd(0.0), cudt.dual_ascent(0.1))
    state, metrics = step(init(jnp.array(0.0), None, constrained=False), None, jax.random.key(0))
    assert float(metrics["violation"]["lo"]) == 1.0
    init, step = cudt.make_constrained_step(
        problem, optax.sgd(0.0), cudt.dual_ascent(0.1), warmup_steps=2
    )
    state, metrics = step(init(jnp.array(0.0), None), None, jax.random.key(0))
    assert float(metrics["violation"]["lo"]) == 1.0 and float(state.multipliers["lo"]) == 0.0


@pytest.mark.parametrize("update", cudt.constrained.UPDATES)
def test_an_integer_constraint_trains_as_its_float_value_does(update):
    # a count (int32, constant in the parameters) failed inside the step's VJP: "grad requires
    # real- or complex-valued inputs ... but got int32"; the drop-in Lagrangian took it
    def problem(cast):
        def f(p, batch, key):
            count = jnp.sum(batch > 0) - 1
            return jnp.sum(p**2), {
                "count": cudt.Constraint(count.astype(jnp.float32) if cast else count),
                "x": cudt.Constraint(1.0 - p[0]),
            }

        return f

    states = []
    for cast in (False, True):
        init, step = cudt.make_constrained_step(
            problem(cast),
            optax.sgd(0.1),
            cudt.dual_ascent(0.1),
            cudt.AugmentedLagrangian(penalty=1.0),
            update,
        )
        state = init(jnp.zeros(2), jnp.ones(3))
        for t in range(3):
            state, _ = step(state, jnp.ones(3), jax.random.key(t))
        states.append(state)
    np.testing.assert_allclose(states[0].multipliers["count"], 0.6, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(states[0]), jax.tree.leaves(states[1]), strict=True):
        np.testing.assert_array_equal(a, b)


def test_an_injected_rate_given_as_an_array_survives_the_donating_step():
    # optax keeps such a rate as the caller's own array: two constraints' dual states shared it
    # ("Attempt to donate the same buffer twice"), and a second init read the primal rate the
    # first step had donated ("Buffer has been deleted or donated")
    rate = jnp.asarray(0.1, jnp.float32)
    init, step = cudt.make_constrained_step(
        _problem,
        optax.inject_hyperparams(optax.adam)(learning_rate=rate),
        optax.inject_hyperparams(cudt.dual_ascent)(learning_rate=rate),
    )
    params = {"x": jnp.array(0.0), "y": jnp.array(0.0)}
    for _ in range(2):
        state = init(params, _batch([0]), num_indexed={"per_sample": 3})
        state, _ = step(state, _batch([0]), jax.random.key(0))
    np.testing.assert_allclose(state.multipliers["budget"], 0.1)
    assert float(rate) == np.float32(0.1)
    # the explicit slacks' optimiser alike: two slack constraints shared its rate
    slack = cudt.Constraint(jnp.ones(()), resilience=1.0, resilience_mode="slack")
    init, step = cudt.make_constrained_step(
        lambda p, b, k: (jnp.sum(p**2), {"a": slack, "b": slack}),
        optax.sgd(0.1),
        cudt.dual_ascent(0.1),
        slack_optimizer=optax.inject_hyperparams(optax.sgd)(learning_rate=rate),
    )
    state = init(jnp.zeros(2), None)
    for _ in range(2):
        state, _ = step(state, None, jax.random.key(0))
    np.testing.assert_allclose(state.slacks["a"], 0.01, rtol=1e-6)  # 0.1 · λ_1 = 0.1 · 0.1
