"""The vmapped multi-run loop, the descent/feasibility metrics and atomic outputs."""

import json
import os
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import cudt
from cudt.io import UsageError, write_json_atomic
from cudt.loop import map_runs, sample_indices, train_group
from cudt.metrics import (
    descent_stats,
    exact_match,
    feasibility,
    rmse_255,
    rouge_l,
    text_tokens,
    trapezoid_auc,
)
from cudt.runner.choice import select_best
from cudt.runner.output import OPENED, open_output

L = 2


def layer_losses(params, batch, key):
    x, y = batch[:, 0], batch[:, 1]
    s1 = x * params["w"][0]
    s2 = s1 * params["w"][1]
    states = jnp.stack([x, s1, s2], axis=1)
    return (states - y[:, None]) ** 2


def toy_data(n=64):
    x = np.random.default_rng(0).normal(size=n).astype(np.float32)
    return jnp.asarray(np.stack([x, 0.3 * x], axis=1))


def make_group(ws, lr=0.05):
    cfg = cudt.DescentConfig(num_layers=L, epsilon=0.2)
    init, step = cudt.make_train_step(
        layer_losses, optax.sgd(lr), cudt.dual_ascent(0.5), cfg, jit=False
    )
    states = jax.vmap(lambda w: init({"w": w}))(jnp.asarray(ws, jnp.float32))
    keys = jnp.stack([jax.random.key(i) for i in range(len(ws))])
    return step, states, keys


@pytest.mark.parametrize("run_axis", ["vmap", "map"])
def test_chunked_vmapped_loop_equals_stepping_by_hand(run_axis):
    data = toy_data()
    step, states, keys = make_group([[1.0, 0.9], [0.8, 0.7]])

    def make_batch(key, s):
        return data[sample_indices(key, s, data.shape[0], 8)]

    result = train_group(step, states, keys, make_batch, 7, chunk_steps=3, run_axis=run_axis)
    assert [int(h["step"]) for h in result.history] == [3, 6, 7]
    # by hand, one run at a time, one jitted step per call
    _, states2, _ = make_group([[1.0, 0.9], [0.8, 0.7]])
    jstep = jax.jit(step)
    for r in range(2):
        s = jax.tree.map(lambda a, r=r: a[r], states2)
        for _ in range(7):
            s, _ = jstep(s, make_batch(keys[r], s.step), keys[r])
        # scan + vmap vs one jitted step at a time: two compiled programs, equal up to float32
        # rounding at the scale of w and λ (~1); a wrong batch, key or chunk moves them >1e-3.
        np.testing.assert_allclose(
            result.states.params["w"][r], s.params["w"], rtol=1e-5, atol=1e-5
        )
        np.testing.assert_allclose(
            cudt.descent.multipliers(result.states)[r],
            cudt.descent.multipliers(s),
            rtol=1e-5,
            atol=1e-5,
        )
    assert not result.diverged.any()


@pytest.mark.slow
def test_a_group_on_cpu_equals_its_runs_trained_alone_bit_for_bit():
    """On CPU a group's program takes each run's chunk of steps in turn (map_runs outside the
    scan): a sweep's run r is the run trained on its own, to the last bit, metrics included."""
    if jax.default_backend() != "cpu":
        pytest.skip("the looped program is the CPU default; accelerators vmap")
    data = toy_data()
    ws = [[1.0, 0.9], [0.8, 0.7], [1.1, 0.5]]

    def make_batch(key, s):
        return data[sample_indices(key, s, data.shape[0], 8)]

    step, states, keys = make_group(ws)
    group = train_group(step, states, keys, make_batch, 7, chunk_steps=3)
    for r in range(len(ws)):
        step, states, keys = make_group(ws[r : r + 1])
        keys = keys.at[0].set(jax.random.key(r))
        alone = train_group(step, states, keys, make_batch, 7, chunk_steps=3)
        np.testing.assert_array_equal(group.states.params["w"][r], alone.states.params["w"][0])
        np.testing.assert_array_equal(
            cudt.descent.multipliers(group.states)[r], cudt.descent.multipliers(alone.states)[0]
        )
        assert len(group.curves) == len(alone.curves) > 0
        for h_group, h_alone in zip(group.curves, alone.curves, strict=True):
            for name in ("objective", "multipliers"):
                np.testing.assert_array_equal(h_group[name][r], h_alone[name][0])


def _straight_and_resumed(folder, ws):
    """The group of ``ws`` trained 6 steps straight, and trained 4 steps with checkpoints then
    resumed to 6: ``(straight, resumed, the resume's fresh states, the saved steps)``."""
    from cudt.checkpoint import GroupCheckpointer

    data = toy_data()

    def make_batch(key, s):
        return data[sample_indices(key, s, data.shape[0], 8)]

    step, states, keys = make_group(ws)
    straight = train_group(step, states, keys, make_batch, 6, chunk_steps=2)
    with GroupCheckpointer(folder) as ck:
        step, states, keys = make_group(ws)
        train_group(step, states, keys, make_batch, 4, chunk_steps=2, checkpointer=ck)
    with GroupCheckpointer(folder) as ck:
        step, fresh, keys = make_group(ws)
        resumed = train_group(step, fresh, keys, make_batch, 6, chunk_steps=2, checkpointer=ck)
        saved = ck.all_steps()
    return straight, resumed, fresh, saved


def test_a_resume_frees_the_fresh_states_before_restoring_and_continues_bitwise(tmp_path):
    """A resumed group restores into the structure of the states it is handed and deletes their
    arrays first (they are consumed, like the first chunk's donated input): a resume holds one
    state, not two. It then ends where the uninterrupted run ends, to the bit."""
    straight, resumed, fresh, _ = _straight_and_resumed(tmp_path / "ck", [[1.0, 0.9], [0.8, 0.7]])
    assert resumed.resumed_from == 4
    assert all(leaf.is_deleted() for leaf in jax.tree.leaves(fresh))
    for a, b in zip(jax.tree.leaves(straight.states), jax.tree.leaves(resumed.states), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    "edit, why",
    [
        (lambda loop: {}, "no list 'frozen'"),
        (lambda loop: loop | {"frozen": loop["frozen"] * 2}, "'frozen' is not 2 true/false"),
        (
            lambda loop: loop | {"divergences": [None] * 3, "frozen": [False] * 3},
            "'frozen' is not 2 true/false",
        ),
        (
            lambda loop: loop | {"history": [h | {"objective": [1.0]} for h in loop["history"]]},
            "'history' objective is not numbers, one row per run",
        ),
    ],
    ids=["empty", "frozen of 4 runs", "3 runs", "history of 1 run"],
)
def test_a_loop_record_of_other_runs_is_a_corrupt_checkpoint_before_training(tmp_path, edit, why):
    """A checkpoint's loop record that is JSON but no record of this group's runs (``{}``, one
    of another number of runs) failed mid-resume (a KeyError, an IndexError after training):
    refused as a corrupt checkpoint before the first step, the folder left as it was."""
    from cudt.checkpoint import GroupCheckpointer
    from cudt.errors import CheckpointError

    folder = tmp_path / "ck"
    _straight_and_resumed(folder, [[1.0, 0.9], [0.8, 0.7]])  # checkpoints at 2, 4 and 6
    record = folder / "6" / "loop" / "metadata"
    record.write_text(json.dumps(edit(json.loads(record.read_text()))))
    before = sorted((p, p.read_bytes() if p.is_file() else b"") for p in folder.rglob("*"))
    data = toy_data()
    step, states, keys = make_group([[1.0, 0.9], [0.8, 0.7]])
    with GroupCheckpointer(folder) as ck, pytest.raises(CheckpointError) as caught:
        train_group(
            step,
            states,
            keys,
            lambda key, s: data[sample_indices(key, s, data.shape[0], 8)],
            8,
            chunk_steps=2,
            checkpointer=ck,
        )
    assert f"6 is corrupt (its loop record cannot be read: {why}" in str(caught.value)
    assert sorted((p, p.read_bytes() if p.is_file() else b"") for p in folder.rglob("*")) == before


def test_map_runs_modes_agree_and_one_run_calls_the_function_itself():
    def fn(w, x):
        return {"y": jnp.tanh(w @ x), "s": jnp.sum(w)}

    w = jax.random.normal(jax.random.key(0), (3, 4, 5))
    x = jax.random.normal(jax.random.key(1), (3, 5))
    want = [fn(w[r], x[r]) for r in range(3)]
    for how in ("auto", "vmap", "map"):
        got = jax.jit(lambda w, x, how=how: map_runs(fn, w, x, how=how))(w, x)
        for r in range(3):
            np.testing.assert_allclose(got["y"][r], want[r]["y"], rtol=1e-6, atol=1e-6)
            np.testing.assert_allclose(got["s"][r], want[r]["s"], rtol=1e-5, atol=1e-6)
    # R = 1: no vmap, no loop (fn sees plain tracers, not vmap's); the leading axis comes back
    seen = []

    def spy(w, x):
        seen.append(type(w).__name__)
        return fn(w, x)

    jaxpr = str(jax.make_jaxpr(lambda w, x: map_runs(spy, w, x))(w[:1], x[:1]))
    assert "while" not in jaxpr and "scan" not in jaxpr
    assert seen and "BatchTracer" not in seen, seen
    assert jax.eval_shape(lambda w, x: map_runs(fn, w, x), w[:1], x[:1])["s"].shape == (1,)
    with pytest.raises(ValueError, match="how must be one of"):
        map_runs(fn, w, x, how="pmap")


def test_a_diverging_run_is_frozen_and_reported_and_others_finish():
    data = toy_data()
    # run 1 starts with weights so large that its layer-2 loss overflows to inf at once
    step, states, keys = make_group([[1.0, 0.9], [1e20, 1e20]])

    def make_batch(key, s):
        return data[sample_indices(key, s, data.shape[0], 8)]

    result = train_group(step, states, keys, make_batch, 6, chunk_steps=2)
    assert result.diverged.tolist() == [False, True]
    assert result.diverged_at[0] is None
    assert result.diverged_at[1]["quantity"] in ("objective", "lagrangian", "multipliers")
    assert result.diverged_at[1]["step"] >= 1
    # the diverged run keeps its last finite state; the healthy one trained all steps
    assert np.all(np.isfinite(np.asarray(result.states.params["w"][1])))
    assert int(result.states.step[0]) == 6


def _a_run_with_a_non_finite_gradient():
    """``(step, states, keys, make_batch, ws)``: two runs, run 1's extra weight v < 0 adds 0
    to every loss (jnp.where picks 0) but the unpicked branch's sqrt(v) sends NaN into the
    gradient."""
    data = toy_data()

    def losses(params, batch, key):
        v = params["v"]
        nan_gradient = jnp.where(v < 0, 0.0, 0.0 * jnp.sqrt(v))
        return layer_losses(params, batch, key) + nan_gradient

    cfg = cudt.DescentConfig(num_layers=L, epsilon=0.2)
    init, step = cudt.make_train_step(
        losses, optax.sgd(0.05), cudt.dual_ascent(0.5), cfg, jit=False
    )
    ws = jnp.asarray([[1.0, 0.9], [1.0, 0.9]], jnp.float32)
    vs = jnp.asarray([1.0, -1.0], jnp.float32)
    states = jax.vmap(lambda w, v: init({"w": w, "v": v}))(ws, vs)
    keys = jnp.stack([jax.random.key(i) for i in range(2)])

    def make_batch(key, s):
        return data[sample_indices(key, s, data.shape[0], 8)]

    return step, states, keys, make_batch, ws


def test_a_finite_loss_with_a_non_finite_gradient_freezes_the_run_before_its_update():
    """Run 1's loss is finite, its gradient NaN: the run must keep its initial, finite
    parameters (it used to store the NaN update and freeze one step late)."""
    step, states, keys, make_batch, ws = _a_run_with_a_non_finite_gradient()
    result = train_group(step, states, keys, make_batch, 4, chunk_steps=2)
    assert result.diverged.tolist() == [False, True]
    assert result.diverged_at[1]["quantity"] == "grad_norm"
    assert result.diverged_at[1]["step"] == 1
    np.testing.assert_array_equal(result.states.params["w"][1], ws[1])  # its start, exactly
    assert int(result.states.step[1]) == 0 and int(result.states.step[0]) == 4


def test_a_frozen_run_records_no_metrics_for_the_steps_it_does_not_take():
    """A run frozen at step 1 by its gradient alone (its loss finite) recomputes its frozen
    step in its lane: those finite values were its curves and history for steps 2 to 6, flat,
    as if it trained on (and the plot showed no divergence). They are NaN; step 1's own
    metrics and the healthy run's are what they were."""
    step, states, keys, make_batch, _ = _a_run_with_a_non_finite_gradient()
    result = train_group(step, states, keys, make_batch, 6, chunk_steps=2, curve_every=1)
    objective = np.asarray([c["objective"] for c in result.curves])  # [steps, runs]
    assert [int(c["step"]) for c in result.curves] == [1, 2, 3, 4, 5, 6]
    assert np.isfinite(objective[0, 1]) and np.isnan(objective[1:, 1]).all()
    assert np.isfinite(objective[:, 0]).all()
    for c in result.curves[1:]:
        assert np.isnan(c["multipliers"][1]).all() and np.isnan(c["constraint"][1]).all()
    history = [float(h["objective"][1]) for h in result.history]  # steps 2, 4, 6
    assert history[0] == objective[0, 1] and np.isnan(history[1:]).all()


def test_test_losses_are_judged_monotone_as_validation_is():
    """A state at the loss floor (ℓ_0 = 0: the video at γ_train = 0) cannot be undercut: the
    step from it is left out of the test verdict as of the validation one (the record's test
    verdict counted it, so every such run read "not monotone" beside "n/a at l = 1")."""
    from cudt.metrics import applicable_steps as _applicable
    from cudt.runner.record import decreases

    means = [0.0, 1.0e-4, 0.9e-4, 0.8e-4]
    verdict = feasibility(means, 0.05, None, 0.01)
    assert _applicable(means).tolist() == verdict.applicable[1:] == [False, True, True]
    assert decreases(means, _applicable(means)) and not decreases(means)
    assert not decreases([0.0, 1e-4, 1.1e-4], _applicable([0.0, 1e-4, 1.1e-4]))  # a real rise
    assert not decreases([1.0, float("nan"), 0.5], _applicable([1.0, float("nan"), 0.5]))


def test_descent_stats_by_hand():
    losses = np.array([[4.0, 2.0, 3.0], [1.0, 0.5, 0.25]])
    s = descent_stats(losses)
    ratios = np.array([0.5, 1.5, 0.5, 0.5])
    assert s.descent_rate == pytest.approx(0.75)
    assert s.mean_ratio == pytest.approx(ratios.mean())
    assert s.median_ratio == pytest.approx(np.median(ratios))


def test_feasibility_verdict():
    ok = feasibility(np.array([1.0, 0.89, 0.8]), 0.1, tolerance=0.0)
    assert ok.feasible
    bad = feasibility(np.array([1.0, 0.95, 0.8]), 0.1, tolerance=0.01)
    assert not bad.feasible
    assert bad.constraint[1] == pytest.approx(0.95 - 0.9)
    # within tolerance: 0.905 violates by 0.005 = 0.5% of ℓ_0
    assert feasibility(np.array([1.0, 0.905, 0.8]), 0.1, tolerance=0.01).feasible
    assert not feasibility(np.array([1.0, 0.5, 0.4]), 0.1, reference=0.5).feasible
    assert not feasibility(np.array([1.0, np.nan, 0.4]), 0.1).feasible


def test_rmse_and_auc():
    assert rmse_255(1.0 / 255**2) == pytest.approx(1.0)
    assert trapezoid_auc([0, 1, 2], [1, 1, 0]) == pytest.approx(1.5)


def test_atomic_json_and_output_folder(tmp_path):
    out = open_output(tmp_path / "run", {"lr": 1}).path
    write_json_atomic(
        out / "results.json", {"a": np.float32(1.5), "b": np.arange(3), "c": float("nan")}
    )
    assert json.loads((out / "results.json").read_text()) == {"a": 1.5, "b": [0, 1, 2], "c": None}
    assert sorted(p.name for p in out.iterdir()) == ["checkpoints", "results.json"]  # no temporary
    with pytest.raises(UsageError, match="already holds results.json.*--overwrite"):
        open_output(out, {"lr": 1})
    assert open_output(out, {"lr": 1}, overwrite=True).path == out


def test_overwrite_removes_the_files_the_finished_run_names_and_nothing_else(tmp_path):
    """--overwrite over a finished run removes the plots and tables its results.json names
    (``"files"``), so a rerun that writes fewer (``--completions 0``) leaves none of the old
    run's beside its own; files it does not name, or that lie outside the folder, are kept."""
    out = open_output(tmp_path / "run", {"lr": 1}).path
    for name in ("a.png", "completions.md", "notes.txt", "sub/b.png"):
        (out / name).parent.mkdir(exist_ok=True)
        (out / name).write_text("old")
    for name in ("outside.png", "x.png"):
        (tmp_path / name).write_text("kept")
    names = ["a.png", "completions.md", "sub/b.png", "../outside.png", str(tmp_path / "x.png")]
    write_json_atomic(out / "results.json", {"runs": [], "files": names})
    open_output(out, {"lr": 2}, overwrite=True)
    left = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert left == ["checkpoints/config.json", "notes.txt"]
    assert all((tmp_path / n).read_text() == "kept" for n in ("outside.png", "x.png"))
    # a results.json from before the list (or unreadable): the plots stay, as before
    (out / "a.png").write_text("old")
    (out / "results.json").write_text("{not json")
    open_output(out, {"lr": 3}, overwrite=True)
    assert (out / "a.png").exists() and not (out / "results.json").exists()


def test_resume_takes_a_path_spelt_another_way_and_a_list_in_another_order(tmp_path, monkeypatch):
    """A resume that names the same folder another way (relative, absolute, a trailing slash,
    a link) or an unordered list in another order is the same config, in the flag and in the
    records derived from it; another folder, a longer name holding the old one, or fields not
    marked as paths are still differences."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "data")
    shutil.copytree(tmp_path / "data", tmp_path / "copy")
    marks = {"paths": ("data_dir",), "canonical": {"targets": sorted}}

    def record(path, targets=("q", "v")):
        return {"data_dir": path, "source": f"ucsd:{path} (2 videos)", "targets": list(targets)}

    out = tmp_path / "run"
    open_output(out, record("data"))
    (out / "checkpoints" / "g" / "4").mkdir(parents=True)
    for path in ("./data/", str(tmp_path / "data"), "alias", "data/../data"):
        assert open_output(out, record(path, ("v", "q")), **marks).resuming, path
    with pytest.raises(UsageError, match="data_dir 'data' -> 'copy'; source"):
        open_output(out, record("copy"), **marks)
    with pytest.raises(UsageError, match="targets \\['q', 'v'\\] -> \\['q'\\]"):
        open_output(out, record("data", ("q",)), **marks)
    with pytest.raises(UsageError, match="data_dir 'data' -> './data/'"):
        open_output(out, record("./data/"))  # not marked as a path: compared as spelt
    # the old spelling is replaced where it stands whole, not inside a longer name
    write_json_atomic(out / "checkpoints" / "config.json", record("data") | {"x": "data2"})
    with pytest.raises(UsageError, match="x 'data2' -> './data2'\\)"):
        open_output(out, record("./data") | {"x": "./data2"}, **marks)
    assert open_output(out, record("./data") | {"x": "data2"}, **marks).resuming


def test_resume_compares_a_digest_both_configs_record_and_skips_the_ignored_fields(tmp_path):
    """Checkpoints written before a ``*_digest`` field existed resume; two digests that differ
    are refused; a field in ``ignore`` (the evaluation-only flags) may differ."""
    out = tmp_path / "run"
    open_output(out, {"lr": 1, "completions": 0})  # checkpoints/config.json without a digest
    (out / "checkpoints" / "g" / "4").mkdir(parents=True)
    new = {"lr": 1, "completions": 2, "train_digest": "ab"}
    assert open_output(out, new, ignore=("completions",)).resuming
    with pytest.raises(UsageError, match="different config \\(completions 0 -> 2\\)"):
        open_output(out, new)
    write_json_atomic(out / "checkpoints" / "config.json", {"lr": 1, "train_digest": "cd"})
    with pytest.raises(UsageError, match="train_digest 'cd' -> 'ab'"):
        open_output(out, new, ignore=("completions",))


def test_nested_digests_follow_the_same_rule_and_are_named_where_they_differ(tmp_path):
    """A fingerprint per data draw (``data_per_seed``) is compared field by field: a digest only
    one side records is no difference, two that differ are named by their path."""
    out = tmp_path / "run"
    open_output(out, {"lr": 1, "data_per_seed": {"0": {"rows": 3}, "1": {"rows": 3}}})
    (out / "checkpoints" / "g" / "4").mkdir(parents=True)
    new = {"lr": 1, "data_per_seed": {s: {"rows": 3, "train_digest": s} for s in ("0", "1")}}
    assert open_output(out, new).resuming  # checkpoints from before the digest
    write_json_atomic(out / "checkpoints" / "config.json", {**new, "data_per_seed": {
        "0": {"rows": 3, "train_digest": "0"}, "1": {"rows": 3, "train_digest": "x"}}})  # fmt: skip
    with pytest.raises(
        UsageError, match=r"other files .*data_per_seed\.1\.train_digest 'x' -> '1'"
    ):
        open_output(out, new)
    # a flag that changed changes the digest too: the flag is named, not the files blamed
    write_json_atomic(out / "checkpoints" / "config.json", {**new, "lr": 2, "data_per_seed": {
        "0": {"rows": 3, "train_digest": "0"}, "1": {"rows": 3, "train_digest": "x"}}})  # fmt: skip
    with pytest.raises(
        UsageError, match=r"different config \(lr 2 -> 1; data_per_seed\.1\.train_digest"
    ):
        open_output(out, new, flags=["lr"])
    # what the task derives from the files (not a flag) changes with them: the files named
    write_json_atomic(out / "checkpoints" / "config.json", {**new, "data_per_seed": {
        "0": {"rows": 3, "train_digest": "0"}, "1": {"rows": 4, "train_digest": "x"}}})  # fmt: skip
    with pytest.raises(UsageError, match=r"other files .*data_per_seed\.1\.rows 4 -> 3"):
        open_output(out, new, flags=["lr"])
    # an evaluation-only field (``ignore``) of a draw's record is ignored there as at the top:
    # more test items, the same training tokens, resume (each seed drawing its own data)
    draws = {s: {"train_digest": s, "source": f"test {n}"} for s, n in (("0", 8), ("1", 8))}
    write_json_atomic(out / "checkpoints" / "config.json", {"lr": 1, "data_per_seed": draws})
    more = {"lr": 1, "data_per_seed": {s: {**d, "source": "test 16"} for s, d in draws.items()}}
    assert open_output(out, more, ignore=["source"], flags=["lr"]).resuming
    # where an evaluation-only flag moved the training examples (a split that deals its test
    # items first), the flag is named, not files nobody changed
    saved = {"lr": 1, "train_digest": "a", "evaluation_flags": {"num_test": 8}}
    write_json_atomic(out / "checkpoints" / "config.json", saved)
    now = {"lr": 1, "train_digest": "b", "evaluation_flags": {"num_test": 16}}
    with pytest.raises(UsageError, match=r"trained on other examples .*--num-test 8 -> 16 chang"):
        open_output(out, now, ignore=["num_test"], flags=["lr", "num_test"])
    # the record itself is never a difference
    write_json_atomic(out / "checkpoints" / "config.json", {**saved, "train_digest": "b"})
    assert open_output(out, now, ignore=["num_test"], flags=["lr", "num_test"]).resuming


def test_a_config_without_a_saved_step_is_replaced_not_refused(tmp_path):
    """A job stopped before its first checkpoint left only checkpoints/config.json: the next
    job, with other flags, starts afresh there (nothing to resume or protect); --resume says
    there is nothing to resume."""
    out = tmp_path / "run"
    open_output(out, {"layers": 3})
    (out / "checkpoints" / "g").mkdir()  # a group's checkpointer opened, nothing saved yet
    for layers in (2, 3):
        with pytest.raises(UsageError, match="holds no checkpoint to resume from"):
            open_output(out, {"layers": layers}, resume=True)
    fresh = open_output(out, {"layers": 2})
    assert not fresh.resuming
    saved = json.loads((out / "checkpoints" / "config.json").read_text())
    assert {k: v for k, v in saved.items() if k != OPENED} == {"layers": 2}
    (out / "checkpoints" / "g" / "4").mkdir(parents=True)  # a saved step: now it is protected
    with pytest.raises(UsageError, match="different config \\(layers 2 -> 3\\)"):
        open_output(out, {"layers": 3})


def test_checkpoints_from_before_an_added_field_resume_while_the_run_keeps_its_old_behaviour(
    tmp_path,
):
    """A field a later version added (``RunConfig.ADDED``: ``--epsilon-schedule``,
    ``--multipliers``, ``--previous-loss``, ``--epsilon-margin``) is no difference against a
    saved config without it while the run keeps the earlier behaviour (the field's default);
    another value is refused, naming the field."""
    import dataclasses

    from cudt.runner.config import RunConfig

    out = tmp_path / "run"
    open_output(out, {"lr": 1})  # written before the fields existed
    (out / "checkpoints" / "g" / "4").mkdir(parents=True)
    added = RunConfig.ADDED
    assert added == {
        "epsilon_schedule": "constant",
        "multipliers": "table",
        "previous_loss": "differentiable",
        "epsilon_margin": 0.0,
    }
    defaults = {f.name: f.default for f in dataclasses.fields(RunConfig)}
    assert all(defaults[name] == value for name, value in added.items())
    same = {"lr": 1} | added
    assert open_output(out, same, added=added).resuming
    with pytest.raises(
        UsageError, match="different config \\(epsilon_schedule None -> 'linear:0@5'\\)"
    ):
        open_output(out, same | {"epsilon_schedule": "linear:0@5"}, added=added)
    with pytest.raises(
        UsageError, match="different config \\(previous_loss None -> 'stop_gradient'\\)"
    ):
        open_output(out, same | {"previous_loss": "stop_gradient"}, added=added)
    with pytest.raises(UsageError, match="different config \\(epsilon_margin None"):
        open_output(out, same)  # without the table, a new field is a difference


def test_video_checkpoints_from_before_dust_spread_resume_with_free_dictionaries(tmp_path):
    """The video task adds ``--dust-spread`` to the runner's table: a folder saved before it
    resumes with the flag unset (free per-layer dictionaries, as then), not with a spread."""
    from cudt.runner.config import RunConfig
    from cudt.tasks.video import VideoConfig

    out = tmp_path / "run"
    open_output(out, {"lr": 1} | RunConfig.ADDED)
    (out / "checkpoints" / "g" / "4").mkdir(parents=True)
    added = VideoConfig.ADDED
    assert added == RunConfig.ADDED | {"dust_spread": None}
    assert open_output(out, {"lr": 1} | added, added=added).resuming
    with pytest.raises(UsageError, match="different config \\(dust_spread None -> 0.1\\)"):
        open_output(out, {"lr": 1} | added | {"dust_spread": 0.1}, added=added)


def test_checkpoints_of_an_earlier_state_layout_are_refused_in_one_line(tmp_path):
    """A folder of checkpoints written before the one engine (its saved config has no
    state_layout: layout 1) is named as such, not restored into the wrong pytree; nothing in it
    is touched."""
    from cudt.runner.config import RunConfig
    from cudt.runner.output import checkpoint_record

    config = checkpoint_record(RunConfig())
    assert config["state_layout"] >= 2
    out = tmp_path / "old"
    (out / "checkpoints" / "40").mkdir(parents=True)
    old = {k: v for k, v in config.items() if k != "state_layout"}
    write_json_atomic(out / "checkpoints" / "config.json", old)
    before = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
    for resume in (False, True):
        with pytest.raises(UsageError, match=r"earlier cudt.*another layout.*--overwrite") as e:
            open_output(out, config, resume=resume)
        assert "\n" not in str(e.value)
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == before
    assert open_output(out, config, overwrite=True).path == out  # --overwrite starts again


def test_failedatomic_write_leaves_old_file(tmp_path):
    path = tmp_path / "results.json"
    write_json_atomic(path, {"v": 1})
    with pytest.raises(TypeError):
        write_json_atomic(path, {"v": object()})
    assert json.loads(path.read_text()) == {"v": 1}
    assert os.listdir(tmp_path) == ["results.json"]


def _run(name, constrained, score, feasible=True, diverged=False, model="dust", layers=3):
    run = {"name": name, "model": model, "layers": layers, "constrained": constrained}
    run.update(feasible=feasible, diverged=diverged)
    if score is not None:
        run["rmse"] = score
    return run


def _best(runs):
    return sorted(r["name"] for r in runs if r["best"])


def test_select_best_never_picks_an_infeasible_or_broken_run():
    nan = float("nan")
    runs = [
        # constrained DUST-3: the lowest RMSE is infeasible; the best feasible one must win.
        _run("c-infeasible", True, 1.0, feasible=False),
        _run("c-feasible-worse", True, 3.0),
        _run("c-feasible-best", True, 2.0),
        # constrained DUST-3 is one setting; DUST-5 another, all infeasible: no best at all.
        _run("c5-infeasible-a", True, 1.0, feasible=False, layers=5),
        _run("c5-infeasible-b", True, 2.0, feasible=False, layers=5),
        # ERM DUST-3: NaN score first (a bare min() would return it), a diverged run with the
        # lowest score, an ERM run whose (reported, not required) verdict is infeasible.
        _run("e-nan", False, nan),
        _run("e-diverged", False, 0.5, diverged=True),
        _run("e-infeasible-best", False, 1.5, feasible=False),
        _run("e-feasible", False, 2.5),
        _run("e-missing-score", False, None),
        {**_run("e-null-score", False, None), "rmse": None},  # NaN as results.json writes it
        # UT-3 constrained: only a diverged (feasible-looking) run and a NaN one: no best.
        _run("u-diverged", True, 0.1, diverged=True, model="ut"),
        _run("u-nan", True, nan, model="ut"),
    ]
    runs[1]["best"] = True  # a stale mark from an earlier call is cleared
    select_best(runs, "rmse", higher_is_better=False)
    assert _best(runs) == ["c-feasible-best", "e-infeasible-best"]
    assert all(isinstance(r["best"], bool) for r in runs)


def test_select_best_higher_is_better():
    runs = [
        _run("c-nan", True, float("nan")),
        _run("c-infeasible", True, 0.99, feasible=False),
        _run("c-diverged", True, 0.98, diverged=True),
        _run("c-low", True, 0.6),
        _run("c-high", True, 0.8),
        _run("e-low", False, 0.7),
        _run("e-high", False, 0.9, feasible=False),
    ]
    select_best(runs, "rmse", higher_is_better=True)
    assert _best(runs) == ["c-high", "e-high"]


def _lcs_brute_force(a: list[str], b: list[str]) -> int:
    """The longest common subsequence by trying every subsequence of the shorter list."""
    import itertools

    short, long_ = (a, b) if len(a) <= len(b) else (b, a)
    for k in range(len(short), 0, -1):
        for sub in itertools.combinations(short, k):
            it = iter(long_)
            if all(w in it for w in sub):  # a subsequence of long_ too
                return k
    return 0


def test_rouge_l_is_the_lcs_f1_over_words():
    assert rouge_l("The cat sat on the mat.", "the cat is on the mat") == pytest.approx(5 / 6)
    assert rouge_l("a b c", "c b a") == pytest.approx(1 / 3)
    assert rouge_l("", "anything") == 0.0 and rouge_l("x y", "z") == 0.0
    assert rouge_l("Paris!", "paris") == 1.0
    rng = np.random.default_rng(0)
    for _ in range(30):
        a = list(rng.choice(list("abcd"), rng.integers(1, 8)))
        b = list(rng.choice(list("abcd"), rng.integers(1, 8)))
        lcs = _lcs_brute_force(a, b)
        want = 0.0 if lcs == 0 else 2 * lcs / (len(a) + len(b))  # F1 of P = lcs/|a|, R = lcs/|b|
        assert rouge_l(" ".join(a), " ".join(b)) == pytest.approx(want)


def test_exact_match_ignores_case_and_punctuation_only():
    assert text_tokens("The capital: Paris.") == ["the", "capital", "paris"]
    assert exact_match("The capital of France is Paris.", "the capital of france is paris")
    assert not exact_match("Paris is the capital", "The capital is Paris")


def test_a_group_whose_first_run_diverged_resumes_at_the_checkpoints_step(tmp_path):
    """A diverged run is frozen with its whole state, its step too: the group's step on resume
    is the checkpoint's, not run 0's, so the healthy run ends where the uninterrupted one does
    and no step is trained or saved twice."""
    ws = [[1e20, 1e20], [1.0, 0.9]]  # run 0 overflows at once
    straight, resumed, _, saved = _straight_and_resumed(tmp_path / "ck", ws)
    assert saved == [4, 6]
    assert resumed.resumed_from == 4 and resumed.diverged.tolist() == [True, False]
    assert [int(h["step"]) for h in resumed.history] == [2, 4, 6]
    assert np.asarray(resumed.states.step).tolist() == np.asarray(straight.states.step).tolist()
    for a, b in zip(jax.tree.leaves(straight.states), jax.tree.leaves(resumed.states), strict=True):
        np.testing.assert_array_equal(a, b)


def test_default_folders_claimed_in_the_same_second_are_two(tmp_path, monkeypatch):
    """Two jobs without --out that choose their folder in the same second: each claims its own
    (created atomically), where a name merely checked to be free would be shared."""
    import datetime

    from cudt import io

    class Frozen(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=tz)

    monkeypatch.setattr(io.datetime, "datetime", Frozen)
    free = io.fresh_run_dir("toy", tmp_path)
    assert io.fresh_run_dir("toy", tmp_path) == free and not free.exists()  # only checked
    first = io.fresh_run_dir("toy", tmp_path, claim=True)
    second = io.fresh_run_dir("toy", tmp_path, claim=True)
    assert (
        first == tmp_path / "toy-20260102-030405" and second == tmp_path / "toy-20260102-030405-1"
    )
    assert first.is_dir() and second.is_dir()
    # a job's --out (experiments' paper jobs, phase_one): the default claimed the same way, and
    # removed, runs/ with it, when the job is refused before it writes; a given --out untouched
    monkeypatch.chdir(tmp_path)
    with io.claimed_run_dir(None, "job") as a, io.claimed_run_dir(None, "job") as b:
        assert a != b and a.is_dir() and b.is_dir()
        assert a.parent == b.parent == Path("runs")
    with pytest.raises(ValueError), io.claimed_run_dir(None, "refused") as c:
        raise ValueError("refused before writing")
    assert not c.exists() and sorted(p.name for p in Path("runs").iterdir()) == [a.name, b.name]
    for p in (a, b):
        p.rmdir()
    Path("runs").rmdir()
    with pytest.raises(ValueError), io.claimed_run_dir(None, "refused"):
        raise ValueError("refused before writing")
    assert not Path("runs").exists()  # made for this job, and gone with it
    given = tmp_path / "given"
    given.mkdir()
    with pytest.raises(ValueError), io.claimed_run_dir(given, "job") as out:
        assert out == given
        raise ValueError("refused")
    assert given.is_dir()
    # an empty --out (an unset shell variable) is refused: it claimed a fresh runs/... folder
    with pytest.raises(io.UsageError, match="--out needs a path"), io.claimed_run_dir("", "job"):
        pass
    assert not Path("runs").exists()


def test_a_flag_whose_order_means_nothing_resumes_in_another_order():
    """``flag(unordered=True)`` (``--lora-targets``) compares its values sorted on a resume
    (``open_output``'s ``canonical``), so ``v,q`` resumes a run of ``q,v``."""
    import dataclasses

    from cudt.tasks.llm_config import LLMConfig

    (targets,) = [f for f in dataclasses.fields(LLMConfig) if f.name == "lora_targets"]
    same = targets.metadata["canonical"]
    assert same(["v", "q"]) == same(["q", "v"]) and same(["q"]) != same(["q", "v"])


def test_a_group_that_is_not_stacked_states_and_their_keys_is_named():
    # one run's state (init alone) failed with "IndexError: tuple index out of range"; three
    # states with two keys with "scan got values with different leading axis sizes: 3, ..., 2"
    data = toy_data()
    step, states, keys = make_group([[1.0, 0.9], [0.8, 0.7], [0.9, 0.9]])

    def make_batch(key, s):
        return data[sample_indices(key, s, data.shape[0], 8)]

    one = jax.tree.map(lambda x: x[0], states)
    for group, ks, got in ((one, keys[:1], r"\(\)"), (states, keys[:2], r"\(3,\)")):
        with pytest.raises(
            ValueError, match=rf"stacked on a leading axis .*states.step has shape {got}"
        ):
            train_group(step, group, ks, make_batch, 2, chunk_steps=2)
