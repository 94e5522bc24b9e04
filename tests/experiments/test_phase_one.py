"""``python -m experiments.phase_one``: phase I of the video task's models, judged on
validation by the runner's rule, test reported; reuse, refusal and bad input."""

from __future__ import annotations

import json
import shutil

import jax
import numpy as np
import pytest
from helpers import assert_one_line_error, finished_job

from cudt.io import to_jsonable
from cudt.metrics import feasibility
from cudt.runner.finished import finished_run, trained_params
from cudt.runner.run import data_draws, data_record
from experiments import phase_one, video_denoise, video_table
from experiments.paper.phase1 import split_means

# seconds: DUST, L = 3, the smallest synthetic draw the task accepts, at a rate where its ERM
# point (one dictionary per layer, as constrained) misses the descent constraints by far
TINY = [
    "--models", "dust", "--layers", "3", "--num-videos", "3", "--num-frames", "8",
    "--seq-len", "4", "--batch-size", "16", "--dust-atoms", "16", "--steps", "40",
    "--seeds", "1", "--seed", "3", "--lr", "0.01",
]  # fmt: skip


def test_judge_is_the_runners_rule():
    # ε 0.05, tolerance 0.025: layer 1 misses by 1 % of ℓ_0 (within), layer 2 by
    # (0.95 − 0.95 · 0.96) / 0.96 = 3.96 % of ℓ_1 (beyond); the losses still fall
    verdict = phase_one.judge([1.0, 0.96, 0.95], 0.05, 0.025)
    assert verdict["max_relative_violation"] == pytest.approx(0.038 / 0.96)
    assert not verdict["feasible"] and verdict["monotone"]
    assert verdict["ratio"] == pytest.approx([0.96, 0.95 / 0.96])
    assert verdict["violation"] == pytest.approx(0.01 + 0.95 / 0.96 - 0.95, rel=1e-5)
    assert phase_one.judge([1.0, 0.96, 0.95], 0.05, 0.05)["feasible"]  # within 5 %
    rising = phase_one.judge([1.0, 0.9, 0.91], 0.0, 0.025)  # r = 1.011: within, not monotone
    assert rising["feasible"] and not rising["monotone"]


def test_judge_reports_the_violation_of_the_steps_the_runner_judges():
    """At γ_train 0 the clean input's ℓ_0 = 0: the verdict leaves step 1 out, and the reported
    violation counted it as 0.01 / 1e-12 = 1e10 next to "feasible" (found by review)."""
    verdict = phase_one.judge([0.0, 0.01, 0.009, 0.008], 0.05, 0.025)
    assert verdict["feasible"] and verdict["violation"] == 0.0
    assert verdict["max_relative_violation"] == pytest.approx(0.009 / 0.01 - 0.95)
    missed = phase_one.judge([0.0, 0.01, 0.0099, 0.008], 0.05, 0.025)  # step 2: r = 0.99
    assert missed["violation"] == pytest.approx(0.99 - 0.95, rel=1e-6)


def test_phase_one_lowers_the_erm_points_violation(tmp_path, capsys, monkeypatch):
    out = tmp_path / "p1"
    assert phase_one.main([*TINY, "--out", str(out)]) == 0
    result = json.loads((out / "phase1.json").read_text())
    md = (out / "phase1.md").read_text()
    rows = {r["start"]: r for r in result["rows"]}
    assert [(r["model"], r["seed"], r["start"]) for r in result["rows"]] == [
        ("dust", 3, "init"),
        ("dust", 3, "erm"),
    ]
    # the constrained runs' setting: ε of --tune-epsilon, the learning rate, γ_train
    assert (rows["erm"]["epsilon"], rows["erm"]["lr"], rows["erm"]["gamma_train"]) == (
        0.05,
        0.01,
        0.15,
    )
    erm, start = rows["erm"], rows["erm"][phase_one.ERM_POINT]
    # the ERM point misses its constraints here; phase I from it lowers the violation left on
    # validation (and on test) by far
    assert start["val"]["violation"] > 1 and not start["val"]["feasible"]
    assert erm["val"]["violation"] < 0.5 * start["val"]["violation"]
    assert erm["test"]["violation"] < 0.5 * start["test"]["violation"]
    for row in (rows["init"], erm, start):
        for split in ("val", "test"):
            v = row[split]
            assert len(v["layer_loss"]) == 4 and len(v["ratio"]) == 3
            assert np.all(np.isfinite(v["layer_loss"]))
            # the verdict is the runner's at the video task's tolerance
            want = feasibility(np.asarray(v["layer_loss"]), 0.05, None, 0.025)
            assert v["feasible"] == want.feasible and result["tolerance"] == 0.025
    assert md.count("| dust | 0.05 | 0.01 | 0.15 | 3 |") == 2
    assert f"{erm['val']['violation']:.4f}" in md and f"{start['val']['violation']:.4f}" in md
    # the same command again: the result is reused, nothing recomputed or rewritten
    before = (out / "phase1.json").read_bytes()
    capsys.readouterr()
    assert phase_one.main([*TINY, "--out", str(out)]) == 0
    assert "reusing" in capsys.readouterr().out
    assert (out / "phase1.json").read_bytes() == before
    # other flags into the same folder: refused in one line, nothing overwritten
    assert phase_one.main([*TINY, "--epsilon", "0.2", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "--overwrite" in err
    assert (out / "phase1.json").read_bytes() == before
    # --resume where nothing is saved: refused (it computed phase I anyway)
    assert phase_one.main([*TINY, "--resume", "--out", str(tmp_path / "none")]) == 2
    assert "holds no phase I result of these flags to reuse" in capsys.readouterr().err
    assert not (tmp_path / "none").exists()
    assert phase_one.main([*TINY, "--resume", "--out", str(out)]) == 0  # the saved one: reused
    assert "reusing" in capsys.readouterr().out
    # a result from before a config field was added (RunConfig.ADDED, kept at the earlier
    # behaviour's value) is reused, as the runner resumes such checkpoints (it was refused)
    older = tmp_path / "older"
    shutil.copytree(out, older)
    saved = json.loads(before)
    saved["spec"]["config"] = {
        k: v for k, v in saved["spec"]["config"].items() if k not in phase_one.VideoConfig.ADDED
    }
    (older / "phase1.json").write_text(json.dumps(saved))
    assert phase_one.main([*TINY, "--out", str(older)]) == 0
    assert "reusing" in capsys.readouterr().out
    # a table job there is refused, as in another job's folder (phase_one wrote no job.json)
    assert video_table.main(["--out", str(out)]) == 2
    assert f"--out {out} holds a phase_one, not a video table" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["job.json", "phase1.json", "phase1.md"]
    # an experiment's run folder (its results.json): refused, not written into
    run_folder = tmp_path / "a-run"
    run_folder.mkdir()
    (run_folder / "results.json").write_text("{}")
    assert phase_one.main([*TINY, "--out", str(run_folder)]) == 2
    err = capsys.readouterr().err
    assert "holds a run of an experiment (results.json), not a phase_one" in err, err
    assert sorted(p.name for p in run_folder.iterdir()) == ["results.json"]
    # the same, where the other job finished between this one's check and its lock (while it
    # read its data): checked again under the lock, refused, the other's result kept
    late = tmp_path / "late"
    take = phase_one.lock_output

    def finished_meanwhile(folder):
        late.mkdir(exist_ok=True)
        (late / "phase1.json").write_bytes(before)
        return take(folder)

    monkeypatch.setattr(phase_one, "lock_output", finished_meanwhile)
    assert phase_one.main([*TINY, "--epsilon", "0.2", "--out", str(late)]) == 2
    assert "holds phase I of other flags" in capsys.readouterr().err
    assert (late / "phase1.json").read_bytes() == before


def test_the_table_names_the_command_as_a_shell_reruns_it():
    """phase1.md's command line joined the recorded argv with spaces: a --data-dir with a space
    in it read as two arguments, under the script's path where ``python -m`` was typed (found
    by helper V's walk)."""
    from types import SimpleNamespace

    argv = ["/src/experiments/phase_one.py", "--dataset", "avenue", "--data-dir", "/d/my data"]
    result = {"provenance": {"argv": argv}, "steps": 10, "wall_seconds": 1.0, "rows": []}
    md = phase_one.markdown(
        result | {"tolerance": 0.025}, SimpleNamespace(dataset="avenue", layers=3)
    )
    line = "`python -m experiments.phase_one --dataset avenue --data-dir '/d/my data'` at commit"
    assert line in md


def test_the_tables_tell_settings_apart_that_differ_in_lr_or_gamma_train():
    """A sweep over γ_train (or the learning rate) gives settings that differ in it alone: each
    is a row of its own, and a summary row counts its own seeds (they were pooled: "1 of 2")."""
    from types import SimpleNamespace

    def row(gamma_train, feasible):
        split = {"violation": 0.0, "max_relative_violation": 0.0, "feasible": feasible}
        split |= {"monotone": True, "ratio": [0.5]}
        setting = {"model": "dust", "epsilon": 0.05, "lr": 0.01, "gamma_train": gamma_train}
        return setting | {"seed": 0, "start": "init", "val": split, "test": split}

    result = {"provenance": {}, "steps": 10, "wall_seconds": 1.0, "tolerance": 0.025}
    result["rows"] = [row(0.0, True), row(1.0, False)]
    md = phase_one.markdown(result, SimpleNamespace(dataset="synthetic", layers=1))
    assert "| dust | 0.05 | 0.01 | 0 | 0 | init |" in md
    assert "| dust | 0.05 | 0.01 | 1 | 0 | init |" in md
    assert "| dust | 0.05 | 0.01 | 0 | init | 1 of 1 | 1 of 1 | 1 of 1 |" in md
    assert "| dust | 0.05 | 0.01 | 1 | init | 0 of 1 | 0 of 1 | 1 of 1 |" in md


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--layers", "0"], "--layers"),
        (["--kinds", "erm"], "no constrained runs"),
        (["--dataset", "ucsd", "--data-dir", "{tmp}/absent"], "absent"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, flags, says):
    out = tmp_path / "out"
    flags = [f.replace("{tmp}", str(tmp_path)) for f in flags]
    base = TINY
    if "--data-dir" in flags:  # a real dataset: without the synthetic clips' sizes (refused)
        i = TINY.index("--num-videos")
        base = TINY[:i] + TINY[i + 4 :]  # --num-videos 3 --num-frames 8 left out
    assert phase_one.main([*base, *flags, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and says in err
    assert not out.exists()


def test_the_ut_studys_phase_one_judges_the_constraints_the_runner_judges():
    """At γ_train 0 the UT's state 0 is the clean input (ℓ_0 = 0): the runner leaves layer 1's
    constraint out of its verdicts, and the study's phase-I table counted it, so no point was
    ever feasible (found by review)."""
    from experiments.paper.phase1 import judged_violation

    means = np.array([[0.0, 0.5, 0.4], [1.0, 0.5, 0.6]])
    viol, rel = judged_violation(means, 0.1)
    np.testing.assert_allclose(viol, [0.0, 0.3])  # 0.4 / 0.5 = 0.8 met; 0.6 / 0.5 = 1.2 not
    np.testing.assert_allclose(rel, [-0.1, 0.3])
    for row in means:  # the runner's verdict on the same numbers
        verdict = feasibility(row, np.full(2, 0.1), None, 0.0)
        assert list(verdict.applicable[1:]) == [row[0] > 0, True]
    assert judged_violation(np.array([[0.0, 0.0, 0.0]]), 0.1)[1] == [None]  # none judged


def test_split_means_are_the_runners_validation_losses(tmp_path):
    """Phase I's points are judged with the runner's evaluation noise: the split means of a
    finished run's parameters are its recorded ``layer_loss_val``, whatever the cut into eval
    batches. They passed ``(idx,)`` where the runner passes the index array, so the video models'
    ``index[0]`` keyed every row by its batch's first example (ℓ_0 0.00062009 at eval batch 2,
    0.00062049 at 200, the runner's 0.00062315: found by review)."""
    argv = [
        "--models", "ut", "--layers", "2", "--steps", "4", "--chunk-steps", "2", "--seeds",
        "1", "--batch-size", "4", "--num-videos", "3", "--num-frames", "4", "--seq-len", "4",
    ]  # fmt: skip
    run = finished_job(video_denoise.main, argv, tmp_path / "run")
    task = phase_one.VideoTask()
    cfg, _, results = finished_run(run, task, "a test")
    for record in results["runs"]:
        params = trained_params(run, results, [record["label"]], cfg.steps)[record["label"]]
        draw_cfg = data_draws(cfg)[record["seed"]]
        data = task.load(draw_cfg)
        model = task.build(draw_cfg, data, "ut", task.structure(cfg, "ut", record["constrained"]))
        gamma = float(record["hparams"]["gamma_train"])
        key = phase_one._eval_keys(task, cfg, draw_cfg, gamma)["val"]
        val = task.split_examples(data, "val", model)
        stacked = jax.tree.map(lambda x: x[None], params)
        for eval_batch in (2, 5, len(val)):
            got = split_means(model, eval_batch)(stacked, val, gamma, key)[0]
            np.testing.assert_allclose(got, record["layer_loss_val"], rtol=1e-5)


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--lr-schedule", "cosine"], "--lr-schedule has no effect in phase I"),
        (["--epsilon-margin", "0.3"], "--epsilon-margin has no effect in phase I"),
        (["--reference", "0.0001"], "--reference has no effect in phase I"),
        (["--resilience", "1"], "--resilience has no effect in phase I"),
        (["--dual-optimizer", "adam"], "--dual-optimizer has no effect in phase I"),
        (["--sweep", "dual_lr=0.01,0.1"], "--sweep dual-lr has no effect in phase I"),
        # refused as unused before its value is read (its bad value was the error: review)
        (["--dual-lr", "-1"], "--dual-lr has no effect in phase I"),
        (["--update", "sideways"], "--update has no effect in phase I"),
        (["--chunk-steps=abc"], "--chunk-steps has no effect in phase I"),
        # a name the task's flags refuse, given per model instead (found by review)
        (["--model-hparams", "dust:dual_lr=10"], "--model-hparams dust:dual_lr has no effect"),
        (["--model-hparams", "dust:epsilon=0.05,resilience=10"], "dust:resilience has no"),
    ],
)
def test_a_flag_that_would_not_act_is_refused(tmp_path, capsys, flags, says):
    """Phase I trains as ERM at a constant rate with no multipliers and no reference: these
    flags changed nothing and it exited 0 (identical rows with --lr-schedule cosine, or
    --epsilon-margin 0.3 --reference 1e-4: found by review). Refused in one line, nothing
    written; the flags that act still run (the test above)."""
    out = tmp_path / "out"
    assert_one_line_error(phase_one.main, [*TINY, *flags, "--out", str(out)], capsys, says, out=out)


def test_help_lists_the_flags_that_act_and_no_other(capsys):
    """--help listed every flag of the video task, --chunk-steps and --dual-lr among them, each
    refused as having no effect in phase I: it now lists the ones phase I reads."""
    import re

    assert phase_one.main(["--help"]) == 0
    listed = set(re.findall(r"^  (--[a-z-]+)", capsys.readouterr().out, re.M))
    assert listed == {"--" + name.replace("_", "-") for name in phase_one._acting()}
    assert {"--layers", "--steps", "--epsilon", "--dataset", "--out"} <= listed
    assert not listed & {"--chunk-steps", "--dual-lr", "--constraint", "--select", "--update"}


def test_a_saved_result_is_checked_by_what_its_data_holds_not_where_it_lies(tmp_path):
    """A phase1.json is reused where --data-dir names a copy of its frames (refused as "other
    flags", data_dir's path), and refused where other frames lie at the same path (reused in
    silence: phase1.json recorded no digest), as a run's resume decides; one from before the
    record keeps the path comparison."""
    from cudt.data.video import archives, synthetic_videos
    from cudt.errors import UsageError

    def frames(root, seed):
        videos = list(synthetic_videos(3, 8, size=32, seed=seed))
        return archives.write_ucsd(root, {"train": videos[:2], "test": videos[2:]})

    top, copy = frames(tmp_path / "a", 3), frames(tmp_path / "b", 3)

    def finished(data_dir, saved=None):
        cfg = phase_one.VideoConfig(
            dataset="ucsd", data_dir=str(data_dir), models=("ut",), out=str(tmp_path / "p")
        )
        draws = data_draws(cfg)
        data = {d: phase_one.VideoTask().load(c) for d, c in draws.items()}
        record = to_jsonable(data_record(phase_one.VideoTask(), draws, data))
        if saved is not None:
            (tmp_path / "p").mkdir(exist_ok=True)
            (tmp_path / "p" / "phase1.json").write_text(json.dumps({"spec": saved}))
        return phase_one._finished(tmp_path / "p", cfg, record), cfg, record

    _, cfg, record = finished(top)
    spec = phase_one._spec(cfg, record)
    assert finished(copy, spec)[0] == {"spec": spec}  # the same frames elsewhere: reused
    frames(tmp_path / "b", 4)  # other frames at the copy's path
    with pytest.raises(UsageError, match=r"phase I of other files than the flags name now \("):
        finished(copy, spec)
    older = {k: v for k, v in spec.items() if k != "data"}  # no digests: the path decides
    assert finished(top, older)[0] == {"spec": older}
    with pytest.raises(UsageError, match=r"phase I of other flags \(data_dir: "):
        finished(top.parent.parent / "b" / top.name, older)
