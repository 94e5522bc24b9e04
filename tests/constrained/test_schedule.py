"""Constraint schedules: a Schedule is optax's schedule as state, the step hands the problem its
value at each step, lanes with other schedules share one program and equal each run alone, and a
checkpoint round-trips it."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import bad_flags_test, toy, toy_main

import cudt
from cudt.checkpoint import GroupCheckpointer
from cudt.constrained import constant_schedule, describe_schedule, values_at
from cudt.optim import dual_optimizer, primal_optimizer

L, B, D, N = 3, 8, 4, 40
COUNTS = np.arange(0, 260)


def _layer_losses(params, batch, key):
    pred = jnp.einsum("bd,ld->bl", batch["x"], params["w"])  # [B, L+1]
    return (pred - batch["y"][:, None]) ** 2


_rng = np.random.default_rng(0)
X = _rng.normal(size=(N, D)).astype(np.float32)
Y = _rng.normal(size=(N,)).astype(np.float32)
PARAMS = {"w": _rng.normal(size=(L + 1, D)).astype(np.float32)}


def _batch(t):
    index = jax.random.choice(jax.random.key(100 + t), N, (B,), replace=False)
    return {"x": X[index], "y": Y[index]}


def test_linear_and_cosine_are_optax_schedules():
    """At every count (before, during and after the transition) the values are optax's."""
    pairs = [
        (
            cudt.schedule("linear", 0.3, 0.1, 200, begin=20),
            optax.linear_schedule(0.3, 0.1, 200, 20),
        ),
        (cudt.schedule("linear", 0.0, 0.1, 200), optax.linear_schedule(0.0, 0.1, 200)),
        (cudt.schedule("cosine", 0.4, 0.1, 150), optax.cosine_decay_schedule(0.4, 150, alpha=0.25)),
        (
            cudt.schedule("step", 0.05, 0.2, 100, begin=30),
            optax.piecewise_constant_schedule(0.05, {130: 4.0}),
        ),
    ]
    for ours, theirs in pairs:
        got = jax.vmap(ours)(COUNTS)
        want = np.array([theirs(int(c)) for c in COUNTS], np.float32)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_a_cosine_may_start_at_zero_and_ends_hold():
    s = cudt.schedule("cosine", 0.0, 0.1, 100, begin=10)
    assert float(s(0)) == 0.0 and float(s(10)) == 0.0
    assert float(s(60)) == pytest.approx(0.05, rel=1e-6)
    assert float(s(110)) == pytest.approx(0.1) and float(s(10_000)) == pytest.approx(0.1)
    assert np.all(np.diff(np.asarray(jax.vmap(s)(COUNTS))) >= 0)  # never overshoots
    assert describe_schedule(s) == "cosine:0→0.1@100+10"


@pytest.mark.parametrize(
    "args, match",
    [
        (("exp", 0.0, 0.1, 10), "shape must be one of linear, cosine, step"),
        (("linear", 0.0, 0.1, 0), "steps must be an integer >= 1"),
        (("linear", 0.0, 0.1, 2.5), "steps must be an integer >= 1"),
        (("linear", 0.0, np.inf, 10), "must be finite"),
        # found by review: a TypeError from a comparison, True taken as 1, numpy's own words
        (("linear", 0.0, 0.1, "10"), "steps must be an integer >= 1, got '10'"),
        (("linear", 0.0, 0.1, True), "steps must be an integer >= 1, got True"),
        (("linear", [0.0, 0.1], [0.1, 0.2, 0.3], 10), r"broadcast to one shape, got \(2,\)"),
    ],
)
def test_bad_schedules_say_what_to_fix(args, match):
    with pytest.raises(ValueError, match=match):
        cudt.schedule(*args)
    with pytest.raises(ValueError, match="begin must be an integer >= 0"):
        cudt.schedule("linear", 0.0, 0.1, 10, begin=-1)


def test_a_schedule_must_reach_epsilon_on_a_step_the_run_trains():
    """A run of 4 steps trains steps 0..3: a schedule reaching ε at step 4 never trains at it
    (step:0@4 trained at 0 throughout), so it is refused; at step 3, the last, it is kept."""
    from cudt.runner.hparams import parse_epsilon_schedule

    with pytest.raises(ValueError, match="steps end at step 3"):
        parse_epsilon_schedule("step:0@4", 4)
    assert parse_epsilon_schedule("step:0@3", 4) == ("step", 0.0, 3, 0)


def _init_step(update="alternating"):
    cfg = cudt.DescentConfig(num_layers=L, epsilon=0.1, dual_scale="relative")
    return cudt.make_train_step(
        _layer_losses, primal_optimizer(1e-2), dual_optimizer("nupi", 0.1), cfg,
        update=update, jit=False,
    )  # fmt: skip


def test_the_descent_constraint_uses_the_schedules_value_at_each_step():
    """The constraint the step reports is ℓ_l − (1 − ε_t)·ℓ_{l−1} with ε_t the schedule's value
    at the state's step, not its start or end."""
    init, step = _init_step()
    eps = cudt.schedule("linear", 0.0, 0.3, 6)
    state = init(PARAMS, epsilon=eps)
    step = jax.jit(step)
    for t in range(8):
        eps_t = float(eps(int(state.step)))
        state, m = step(state, _batch(t), jax.random.key(t))
        ell = np.asarray(m["layer_loss"], np.float64)
        want = ell[1:] - (1.0 - eps_t) * ell[:-1]
        np.testing.assert_allclose(m["constraint"][1:], want, rtol=1e-5, atol=1e-6)
    assert int(state.step) == 8


@pytest.mark.parametrize("update", cudt.constrained.UPDATES)
def test_every_update_scheme_hands_any_problem_the_value_of_its_step(update):
    """Any problem, any pytree of hparams: a Schedule leaf arrives as its value at the state's
    step (each gradient of extragradient at the same step), other leaves as they are."""

    def problem(params, batch, key, hp):
        f = jnp.sum((params["w"] - batch) ** 2)
        aux = {"bound": hp["bound"], "other": hp["other"]}
        return f, {"c": cudt.Constraint(jnp.sum(params["w"]) - hp["bound"])}, aux

    bound = cudt.schedule("cosine", 2.0, 0.5, 5, begin=1)
    init, step = cudt.make_constrained_step(
        problem, optax.sgd(0.1), cudt.dual_ascent(0.1), has_aux=True, update=update
    )
    state = init({"w": jnp.ones(3)}, jnp.zeros(3), hparams={"bound": bound, "other": 7.0})
    for t in range(8):
        want = float(bound(t))
        state, m = step(state, jnp.zeros(3), jax.random.key(0))
        assert float(m["aux"]["bound"]) == pytest.approx(want, rel=1e-6)
        assert float(m["aux"]["other"]) == 7.0


def test_lanes_with_other_schedules_share_one_program_and_equal_each_run_alone():
    """A constant ε (as a plain value alone, as a constant schedule in the lanes), a linear and a
    cosine warm-up, and a step: one vmapped program, each lane equal to its run alone; the
    constant lane is the run with a plain ε."""
    init, step = _init_step()
    scheds = [
        constant_schedule(0.2),
        cudt.schedule("linear", 0.0, 0.2, 5),
        cudt.schedule("cosine", 0.0, 0.2, 5, begin=2),
        cudt.schedule("step", 0.05, 0.2, 4),
    ]
    stacked = jax.tree.map(lambda *x: jnp.stack(x), *scheds)
    lanes = jax.vmap(lambda e: init(PARAMS, epsilon=e))(stacked)
    vstep = jax.jit(jax.vmap(step, in_axes=(0, None, None)))
    one = jax.jit(step)
    alone = [init(PARAMS, epsilon=0.2)] + [init(PARAMS, epsilon=s) for s in scheds[1:]]
    for t in range(10):
        lanes, _ = vstep(lanes, _batch(t), jax.random.key(t))
        alone = [one(s, _batch(t), jax.random.key(t))[0] for s in alone]
    lam = cudt.descent.multipliers(lanes)
    for r, s in enumerate(alone):
        np.testing.assert_allclose(lanes.params["w"][r], s.params["w"], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(lam[r], cudt.descent.multipliers(s), rtol=1e-5, atol=1e-6)
    # the schedules changed the runs: a warm-up from 0 asks less early, so its duals differ
    assert not np.allclose(lam[0], lam[1])
    assert vstep._cache_size() == 1


def test_a_checkpoint_holds_the_schedule(tmp_path):
    init, step = _init_step()
    state = init(PARAMS, epsilon=cudt.schedule("cosine", 0.0, 0.2, 7, begin=1))
    step = jax.jit(step)
    for t in range(3):
        state, _ = step(state, _batch(t), jax.random.key(t))
    with GroupCheckpointer(tmp_path / "ck", asynchronous=False) as ck:
        ck.save(3, state, {})
        back, _ = ck.restore(jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state))
    assert isinstance(back.hparams["epsilon"], cudt.Schedule)
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(back), strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(
        values_at(back.hparams, back.step)["epsilon"], values_at(state.hparams, 3)["epsilon"]
    )


# -- the runner: --epsilon-schedule and --sweep epsilon_schedule=... ---------------------------


def _lanes(out: Path) -> dict:
    with GroupCheckpointer(out / "checkpoints" / "toy-2") as ck:
        states, _ = ck.restore(None)
    return states


def test_the_runner_sweeps_schedules_as_lanes_and_a_constant_lane_is_the_plain_run(tmp_path):
    """``--sweep epsilon_schedule=constant,linear:0@8``: one group, the schedule in results.json,
    the constant lane trained like a command without schedules (to float rounding: another
    compiled program), and the warm-up lane's ε
    at each logged step the schedule's (its constraint curve is ℓ_l − (1 − ε_t) ℓ_{l−1})."""
    argv = ["--seeds", "1", "--kinds", "constrained", "--epsilon", "0.3"]
    swept = toy([*argv, "--sweep", "epsilon_schedule=constant,linear:0@8"], tmp_path / "s")
    plain = toy(argv, tmp_path / "p")
    runs = {r["hparams"]["epsilon_schedule"]: r for r in swept["runs"]}
    assert set(runs) == {"constant", "linear:0@8"}
    assert len({r["group"] for r in swept["runs"]}) == 1  # one program
    (alone,) = plain["runs"]
    assert alone["hparams"]["epsilon_schedule"] == "constant"
    for key in ("layer_loss_val", "max_multipliers", "val_objective"):
        np.testing.assert_allclose(runs["constant"][key], alone[key], rtol=1e-6, atol=1e-8)
    warm = runs["linear:0@8"]["curves"]
    steps = np.asarray(warm["step"])
    ell, g = np.asarray(warm["layer_loss"]), np.asarray(warm["constraint"])
    eps_t = np.minimum((steps - 1) / 8.0, 1.0) * 0.3  # the step's ε (a logged step is after it)
    for t in (0, len(steps) // 3, -1):
        want = ell[t, 1:] - (1.0 - eps_t[t]) * ell[t, :-1]
        np.testing.assert_allclose(g[t, 1:], want, rtol=1e-3, atol=1e-6)
    assert not np.allclose(
        runs["constant"]["max_multipliers"], runs["linear:0@8"]["max_multipliers"]
    )


test_bad_schedules_give_one_line_and_write_nothing = bad_flags_test(
    toy_main,
    [
        (["--epsilon-schedule", "exp:0@10"], "--epsilon-schedule must be constant or SHAPE:START"),
        (["--epsilon-schedule", "linear:1.5@10"], "START must lie in [0, 1)"),
        (["--epsilon-schedule", "linear:0@10000"], "steps end at step"),
        (["--sweep", "epsilon_schedule=constant,cosine:0@0"], "needs STEPS >= 1"),
    ],
)
