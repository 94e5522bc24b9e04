"""experiments.dual_study: the grid of runner calls, what each trains, the report, reuse, errors."""

from __future__ import annotations

import csv
import json
import math
import shutil
from types import SimpleNamespace

import pytest
from helpers import assert_one_line_error, finished_job
from PIL import Image

from cudt.runner.output import checkpoint_record
from experiments import dual_study
from experiments.paper import job
from experiments.paper.dual_study import SETTINGS, Combo, StudyConfig, combos
from experiments.paper.dual_study.report import best, run_rows, summarise

TINY = [
    "--scale",
    "tiny",
    "--settings",
    "video",
    "--seeds",
    "1",
    "--steps",
    "12",
    "--formulations",
    "lagrangian",
    "--dual-optimizers",
    "nupi",
    "--updates",
    "alternating",
    "--dual-lr-factors",
    "0.1,10",
]


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    return finished_job(dual_study.main, TINY, tmp_path_factory.mktemp("study") / "s")


@pytest.mark.slow
def test_each_call_trains_its_kind_combination_and_step_sizes(study):
    erm = json.loads((study / "video" / "erm" / "results.json").read_text())
    assert [r["constrained"] for r in erm["runs"]] == [False]
    combo = json.loads(
        (study / "video" / "lagrangian-nupi-alternating" / "results.json").read_text()
    )
    assert [r["constrained"] for r in combo["runs"]] == [True, True]
    cfg = combo["config"]
    assert (cfg["dual_optimizer"], cfg["update"], cfg["lr_schedule"]) == (
        "nupi",
        "alternating",
        "constant",
    )
    assert cfg["nupi_kp"] == 5.0
    base = SETTINGS["video"].dual_lr["nupi"]
    assert sorted(r["hparams"]["dual_lr"] for r in combo["runs"]) == [0.1 * base, 10 * base]
    # the step size changed the runs: the multipliers of x10 are far larger than those of x0.1
    peaks = {r["hparams"]["dual_lr"]: max(r["max_multipliers"]) for r in combo["runs"]}
    assert peaks[10 * base] > 10 * peaks[0.1 * base]


@pytest.mark.slow
def test_report_table_csv_and_figures(study):
    md = (study / "study.md").read_text()
    assert "| lagrangian · nupi · alternating | " in md
    assert "×0.1 | ×10 |" in md
    rows = list(csv.DictReader((study / "study.csv").open()))
    assert len(rows) == 2
    assert {float(r["factor"]) for r in rows} == {0.1, 10.0}
    for r in rows:
        assert r["setting"] == "video" and r["swept"] == "dual_lr"
        ok = r["feasible"] == "1" and r["monotone"] == "1" and r["diverged"] == "0"
        assert r["ok"] == ("1" if ok else "0")
        # the ID change is against the ERM run of the same seed
        change = 100 * (float(r["id"]) / float(r["erm_id"]) - 1)
        assert math.isclose(
            float(r["id_change_pct"]), change, rel_tol=1e-3, abs_tol=2e-3
        )  # CSV: 6 digits
    for name in ("success", "by_step_size", "multipliers"):
        with Image.open(study / f"{name}.png") as im:
            assert im.format == "PNG" and im.size[0] > 300 and im.size[1] > 200


@pytest.mark.slow
def test_rerun_reuses_every_call_and_rewrites_the_same_report(study, capsys):
    before = (study / "study.csv").read_text()
    assert dual_study.main([*TINY, "--out", str(study)]) == 0
    printed = capsys.readouterr().out
    assert "0 to train" in printed and printed.count("reusing") == 2
    assert (study / "study.csv").read_text() == before


def test_an_interrupted_overwrite_resumes_keeping_the_calls_retrained_since(
    study, tmp_path, capsys, monkeypatch
):
    out = tmp_path / "s"
    shutil.copytree(study, out)
    # without figures: the resume below draws them, an overwrite of the same flags all the same
    argv = [*TINY, "--overwrite", "--no-figures", "--out", str(out)]
    real, calls = job.run, []

    def interrupted(task, cfg, folder):  # Ctrl-C as the second call starts
        calls.append(folder)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(task, cfg, folder)

    monkeypatch.setattr(job, "run", interrupted)
    assert dual_study.main(argv) == 130
    # resumed in a copy made as `cp -r` makes one: every file's time is the copy's (the calls
    # not yet retrained read as retrained since when file times told it)
    interrupted_out, out = out, tmp_path / "copy"
    shutil.copytree(interrupted_out, out, copy_function=shutil.copy)
    argv = [*TINY, "--overwrite", "--out", str(out)]
    record = json.loads((out / "job.json").read_text())
    assert record["overwriting"]["flags"]["overwrite"] is True
    erm = out / "video" / "erm" / "results.json"
    retrained = erm.read_text()
    old = (out / "video" / "lagrangian-nupi-alternating" / "results.json").read_text()
    monkeypatch.setattr(job, "run", real)
    # without --overwrite, the call not yet retrained would be reused with its old results
    files = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    without = [a for a in argv if a != "--overwrite"]
    assert_one_line_error(dual_study.main, without, capsys, "interrupted", "--overwrite")
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == files
    capsys.readouterr()
    assert dual_study.main(argv) == 0  # the same command: the ERM call retrained is kept
    printed = capsys.readouterr().out
    assert "1 finished, reused; 1 to train" in printed and printed.count("reusing") == 1
    assert erm.read_text() == retrained
    assert (out / "video" / "lagrangian-nupi-alternating" / "results.json").read_text() != old
    # done: the calls this job has, which experiments.pages reads (not an earlier grid's)
    calls = ["video/erm", "video/lagrangian-nupi-alternating"]
    assert json.loads((out / "job.json").read_text()) == {"job": "dual study", "subruns": calls}
    assert dual_study.main(argv) == 0  # a new --overwrite retrains every call
    assert "0 finished, reused; 2 to train" in capsys.readouterr().out


@pytest.mark.slow
def test_other_flags_on_the_same_folder_are_refused_before_training(study, capsys):
    argv = [*TINY, "--nupi-kp", "1", "--out", study]
    assert_one_line_error(dual_study.main, argv, capsys, "nupi_kp", "--overwrite")


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--settings", "vidoe"], ["--settings", "vidoe", "video"]),
        (["--dual-lr-factors", "0,1"], ["--dual-lr-factors", "> 0"]),
        (["--dual-optimizers", "rmsprop"], ["--dual-optimizers", "nupi"]),
        (["--nupi-ema", "1"], ["--nupi-ema", "[0, 1)"]),
        # read by the nupi runs only: with none they changed nothing (found by the paper-jobs
        # review)
        (["--dual-optimizers", "sgd", "--nupi-kp", "10"], ["--nupi-kp", "add nupi", "sgd"]),
        (["--formulations", "penalty", "--nupi-ema", "0.5"], ["--nupi-ema", "penalty train"]),
    ],
)
def test_bad_flags_are_one_line_and_write_nothing(tmp_path, capsys, argv, words):
    out = tmp_path / "s"
    assert_one_line_error(dual_study.main, [*TINY, *argv, "--out", out], capsys, *words, out=out)


def test_the_penalty_formulation_is_one_combination_sweeping_rho():
    opts = StudyConfig(
        formulations=("lagrangian", "penalty"),
        dual_optimizers=("sgd", "adam"),
        updates=("alternating", "simultaneous"),
    )
    got = combos(opts)
    assert len(got) == 5 and got[-1] == Combo("penalty", "-", "alternating")
    assert got[-1].swept == "penalty" and got[0].swept == "dual_lr"


def _run(seed, dual_lr, *, feasible, decreases, diverged=False, rmse=(1.0, 2.0, 3.0), val=0.01):
    return {
        "constrained": True,
        "seed": seed,
        "hparams": {"dual_lr": dual_lr},
        "test_gamma": [0.0, 0.5, 1.0],
        "gamma_train": 0.5,
        "rmse": list(rmse),
        "feasible": feasible,
        "loss_decreases_val": decreases,
        "loss_decreases": True,  # the test split's: reported only
        "val_objective": val,
        "diverged": diverged,
        "descent_rate": 0.9,
        "mean_ratio": 0.7,
        "median_ratio": 0.6,
        "max_multipliers": [0.0, 3.0],
        "multipliers": [0.0, 1.0],
    }


def test_success_needs_feasible_monotone_and_finite_and_the_best_has_most():
    setting = SETTINGS["video"]
    erm = {
        "runs": [
            {**_run(s, None, feasible=True, decreases=True), "constrained": False} for s in (0, 1)
        ]
    }
    plain, pi = (
        Combo("lagrangian", "sgd", "simultaneous"),
        Combo("lagrangian", "nupi", "simultaneous"),
    )
    rows = run_rows(
        setting,
        plain,
        {
            "runs": [
                _run(0, 100.0, feasible=True, decreases=False),
                _run(1, 100.0, feasible=False, decreases=True),
                _run(0, 1000.0, feasible=True, decreases=True, diverged=True),
                _run(1, 1000.0, feasible=True, decreases=True, rmse=(1.0, 2.2, 3.0)),
            ]
        },
        erm,
    )
    rows += run_rows(
        setting,
        pi,
        {
            "runs": [
                _run(s, v, feasible=True, decreases=True) for s in (0, 1) for v in (100.0, 1000.0)
            ]
        },
        erm,
    )
    assert [r["ok"] for r in rows[:4]] == [False, False, False, True]
    assert rows[3]["factor"] == 1.0 and rows[0]["factor"] == 0.1
    assert math.isclose(rows[3]["id_change_pct"], 10.0, rel_tol=1e-9)  # RMSE 2.2 vs ERM 2.0
    summaries = summarise(rows)
    s_plain = next(s for s in summaries if s["combo"] == plain)
    assert (s_plain["ok"], s_plain["failed"], s_plain["diverged"]) == (1, 2, 1)
    assert s_plain["baseline"] and s_plain["by_factor"] == {0.1: (0, 2), 1.0: (1, 2)}
    assert best(summaries)["combo"] == pi


def test_a_diverged_erm_seed_is_no_reference_and_the_id_change_says_how_many_it_is_over():
    """A diverged ERM run is scored at its last finite state: its seed's ID change went into
    the mean as if it were a reference (found by review)."""
    from experiments.paper.dual_study.report import _setting_markdown

    setting, combo = SETTINGS["video"], Combo("lagrangian", "sgd", "simultaneous")
    erm = [{**_run(s, None, feasible=True, decreases=True), "constrained": False} for s in (0, 1)]
    erm.append({**_run(2, None, feasible=True, decreases=True), "constrained": False})
    erm[2] |= {"diverged": True, "rmse": [1.0, 9.0, 3.0]}
    runs = [_run(s, 100.0, feasible=True, decreases=True, rmse=(1.0, 2.2, 3.0)) for s in (0, 1, 2)]
    rows = run_rows(setting, combo, {"runs": runs}, {"runs": erm})
    assert [math.isfinite(r["id_change_pct"]) for r in rows] == [True, True, False]
    (summary,) = summarise(rows)
    assert math.isclose(summary["id_change_pct"], 10.0) and summary["id_change_runs"] == 2
    erm_rows = [{"id": 2.0, "ood": 3.0, "descent_rate": 0.9, "diverged": False}] * 2
    erm_rows.append({"id": 9.0, "ood": 3.0, "descent_rate": 0.9, "diverged": True})
    md = "\n".join(_setting_markdown(setting, [summary], erm_rows, [0.1]))
    assert "| +10.0% (2 of 3 runs) |" in md
    assert "ERM reference (2 seeds; 1 diverged, left out): ID RMSE 2," in md


def test_a_run_whose_metric_is_not_finite_is_left_out_not_a_crash():
    """A diverged run is scored at its last finite state, whose test RMSE can be inf (null in
    results.json): the report stopped on float(None), after every call had trained (found by
    the paper-jobs review). Its numbers are NaN, left out of the means, as a diverged seed's."""
    from experiments.paper.dual_study.report import _setting_markdown, collect

    setting, combo = SETTINGS["video"], Combo("lagrangian", "sgd", "simultaneous")
    erm = [{**_run(s, None, feasible=True, decreases=True), "constrained": False} for s in (0, 1)]
    erm[1] |= {"diverged": True, "rmse": [None, None, None], "descent_rate": None}
    runs = [_run(s, 100.0, feasible=True, decreases=True, rmse=(1.0, 2.2, 3.0)) for s in (0, 1)]
    runs[0] |= {"diverged": True, "rmse": [1.0, None, None]}
    rows = run_rows(setting, combo, {"runs": runs}, {"runs": erm})
    assert math.isnan(rows[0]["id"]) and math.isnan(rows[0]["ood"])
    assert math.isnan(rows[1]["id_change_pct"])  # seed 1's ERM run diverged: no reference
    (summary,) = summarise(rows)
    assert math.isclose(summary["ood"], 3.0)  # the live run's alone
    # the ERM reference of the report, and its descent share, with no live ERM run
    sub = SimpleNamespace(key=("video", None))
    _, _, erm_rows = collect([sub], {sub.key: {"runs": [erm[1]]}})
    md = "\n".join(_setting_markdown(setting, [summary], erm_rows["video"], [0.1]))
    assert "ERM reference (0 seeds; 1 diverged, left out): ID RMSE n/a" in md
    assert "per-sample descent n/a." in md and "nan" not in md


def test_a_finished_text_call_is_reused_though_its_task_resolved_lr_and_length(tmp_path):
    # The text task writes the learning rate and token length it resolved (its defaults are
    # None) into results.json's config; the study compares against those, not against None.
    from cudt.tasks.text import TextTask, max_length_of
    from experiments.paper.dual_study import plan
    from experiments.paper.job import check_subrun

    opts = StudyConfig(settings=("text",), formulations=("lagrangian",), dual_optimizers=("nupi",), updates=("alternating",), scale="tiny", out=str(tmp_path))  # fmt: skip
    for sub in plan(opts, tmp_path):
        cfg = sub.cfg
        assert cfg.lr is None and sub.resolved["max_length"] == max_length_of(cfg)
        written = cfg.fingerprint(evaluation=True) | {
            "lr": TextTask().default_lr(cfg, cfg.model),
            "max_length": max_length_of(cfg),
        }
        sub.out.mkdir(parents=True)
        (sub.out / "results.json").write_text(json.dumps({"config": written}))
        check_subrun(sub, overwrite=False)
        assert sub.finished


def test_calls_from_before_a_field_was_added_are_reused_and_resumed(tmp_path):
    # A field a later cudt added (ADDED: the value earlier versions had) is missing from the
    # records of a call trained before it; the runner resumes such checkpoints, so the job
    # reuses or resumes the call too (it refused both: "epsilon_margin: None there, 0.0 now").
    from experiments.paper.dual_study import plan
    from experiments.paper.job import check_subrun

    opts = StudyConfig(settings=("video",), scale="tiny", out=str(tmp_path))
    finished, interrupted = plan(opts, tmp_path)[:2]
    for sub in (finished, interrupted):
        assert set(type(sub.cfg).ADDED) <= set(sub.cfg.fingerprint())
        sub.out.mkdir(parents=True)
    added = type(finished.cfg).ADDED
    written = finished.cfg.fingerprint(evaluation=True)
    written = {k: v for k, v in written.items() if k not in added}
    (finished.out / "results.json").write_text(json.dumps({"config": written}, default=str))
    check_subrun(finished, overwrite=False)
    assert finished.finished
    record = checkpoint_record(interrupted.cfg)
    record = {k: v for k, v in record.items() if k not in added}
    (interrupted.out / "checkpoints").mkdir()
    (interrupted.out / "checkpoints" / "config.json").write_text(json.dumps(record, default=str))
    check_subrun(interrupted, overwrite=False)  # not refused: the runner resumes them
    assert not interrupted.finished


def test_combinations_that_share_a_program_are_one_call(tmp_path):
    from experiments.paper.dual_study import plan

    opts = StudyConfig(settings=("video",), scale="tiny", out=str(tmp_path))
    subs = plan(opts, tmp_path)
    # ERM, then per update: {lagrangian, augmented} x {sgd, nupi}, {lagrangian, augmented} x
    # adam; and the penalty: 8 calls for the 19 combinations of one setting
    assert len(subs) == 8
    covered = [c for sub in subs[1:] for c in sub.key[1].combos]
    assert sorted(covered, key=str) == sorted(combos(opts), key=str)
    merged = next(
        s for s in subs[1:] if s.key[1].slug == "lagrangian+augmented-sgd+nupi-simultaneous"
    )
    cfg = merged.cfg
    assert (cfg.formulation, cfg.dual_optimizer, cfg.update) == (
        "augmented",
        "nupi",
        "simultaneous",
    )
    assert f"penalty=0,{SETTINGS['video'].augmented_penalty:g}" in cfg.sweep
    assert "nupi_kp=0,5" in cfg.sweep
    call = merged.key[1]
    assert call.combo_of({"penalty": 0.0, "nupi_kp": 0.0}) == Combo(
        "lagrangian", "sgd", "simultaneous"
    )
    assert call.combo_of({"penalty": 1e3, "nupi_kp": 5.0}) == Combo(
        "augmented", "nupi", "simultaneous"
    )
    # text's lanes are large (a pretrained encoder each): one call per combination, as before
    text = plan(StudyConfig(settings=("text",), scale="tiny", out=str(tmp_path)), tmp_path)
    assert len(text) == 20 and all(len(s.key[1].combos) == 1 for s in text[1:])
    # K_P = 0 asked for: nuPI is SGD, nothing to merge (two calls, as before)
    opts0 = StudyConfig(settings=("video",), dual_optimizers=("sgd", "nupi"), updates=("alternating",), formulations=("lagrangian",), nupi_kp=0.0, scale="tiny", out=str(tmp_path))  # fmt: skip
    assert [s.key[1].slug for s in plan(opts0, tmp_path)[1:]] == [
        "lagrangian-sgd-alternating",
        "lagrangian-nupi-alternating",
    ]


@pytest.mark.slow
def test_a_merged_calls_lanes_train_like_the_combinations_alone(tmp_path):
    # the Lagrangian is the augmented Lagrangian at rho = 0 and SGD is nuPI at K_P = 0: the
    # lane (rho = 0, K_P = 0) of a merged program trains like plain Lagrangian SGD
    import contextlib
    import io

    import numpy as np
    from helpers import toy

    base = ["--steps", "6", "--chunk-steps", "6", "--num-examples", "16", "--seeds", "1",
            "--eval-batch-size", "16", "--kinds", "constrained", "--dual-lr", "2"]  # fmt: skip
    with contextlib.redirect_stdout(io.StringIO()):
        merged = toy([*base, "--formulation", "augmented", "--dual-optimizer", "nupi",
                      "--sweep", "penalty=0,3", "--sweep", "nupi_kp=0,1"], tmp_path / "m")  # fmt: skip
        alone = toy(
            [*base, "--formulation", "lagrangian", "--dual-optimizer", "sgd"], tmp_path / "a"
        )
    lane = next(
        r for r in merged["runs"] if r["hparams"]["penalty"] == 0 and r["hparams"]["nupi_kp"] == 0
    )
    (ref,) = alone["runs"]
    assert max(ref["max_multipliers"]) > 0  # the multipliers moved
    for key in ("multipliers", "max_multipliers", "layer_loss_val", "layer_loss"):
        np.testing.assert_allclose(np.array(lane[key]), np.array(ref[key]), rtol=1e-5, atol=1e-7)
    others = [r for r in merged["runs"] if r is not lane]
    assert all(r["multipliers"] != ref["multipliers"] for r in others)


def test_epsilon_schedules_are_lanes_of_each_call_and_the_report_says_how_soon(tmp_path):
    """``--epsilon-schedules constant,linear:0@6``: each combination twice, in the one call of
    its program (a sweep of the runner), each run's row named by its schedule, and the report's
    columns of how soon the training batches meet the final ε."""
    out = tmp_path / "s"
    argv = [*TINY, "--dual-lr-factors", "1", "--epsilon-schedules", "constant,linear:0@6"]
    assert dual_study.main([*argv, "--no-figures", "--out", str(out)]) == 0
    assert not list(out.rglob("*.png"))
    combo = json.loads((out / "video" / "lagrangian-nupi-alternating" / "results.json").read_text())
    assert "epsilon_schedule=constant,linear:0@6" in combo["config"]["sweep"]
    assert sorted(r["hparams"]["epsilon_schedule"] for r in combo["runs"]) == [
        "constant",
        "linear:0@6",
    ]
    rows = list(csv.DictReader((out / "study.csv").open()))
    assert sorted(r["schedule"] for r in rows) == ["constant", "linear:0@6"]
    md = (out / "study.md").read_text()
    assert "lagrangian · nupi · alternating · ε linear:0@6" in md
    assert "feasible (train) from step, median" in md


def test_feasible_from_is_the_first_step_of_the_last_feasible_stretch():
    from experiments.paper.dual_study.report import feasible_from

    ok, bad = [1.0, 0.8, 0.6], [1.0, 1.0, 1.0]  # ε = 0.1: 0.8 ≤ 0.9·1, 0.6 ≤ 0.9·0.8
    run = {"hparams": {"epsilon": 0.1}, "curves": {"step": [10, 20, 30, 40], "layer_loss": [ok, bad, ok, ok]}}  # fmt: skip
    assert feasible_from(run, 0.01) == 30.0
    run["curves"]["layer_loss"][-1] = bad
    assert math.isnan(feasible_from(run, 0.01))
    assert feasible_from(run, 0.2) == 10.0  # within 20 %: every step


def test_every_combination_of_the_default_grid_has_its_own_colour():
    """The step-size figure: the default's combinations (19) each in a colour of their own
    (matplotlib's 10-colour cycle repeated 8, so legend entries could not be told apart)."""
    import types

    import matplotlib.pyplot as plt
    from matplotlib.colors import to_hex

    from experiments.paper.dual_study import StudyConfig, combos
    from experiments.paper.dual_study.figures import _by_factor

    grid = combos(StudyConfig())
    summaries = [
        {"by_factor": {1.0: (1, 2), 10.0: (2, 2)}, "baseline": i == 0,
         "combo": types.SimpleNamespace(label=f"combo {i}")}
        for i in range(len(grid))
    ]  # fmt: skip
    fig, ax = plt.subplots()
    _by_factor(ax, summaries, "t")
    colours = [to_hex(line.get_color()) for line in ax.lines]
    plt.close(fig)
    assert len(grid) > 10 and len(set(colours)) == len(grid), colours


def test_the_penalty_call_passes_no_dual_rate_and_an_earlier_one_that_did_is_reused(tmp_path):
    # --formulation penalty has no multipliers: --dual-lr and --dual-optimizer there act on
    # nothing and are refused (cudt.knobs: Knob.acts, DUAL_FLAGS), so the penalty's call takes
    # the task's (the rate recorded None); a call an earlier study trained with the pinned rate
    # (1000) and dual optimiser (sgd, the video's nupi pinned away) is still reused, and
    # resumed. (plan() passed sgd there, refused since: a ValueError.)
    from experiments.paper.dual_study import plan
    from experiments.paper.job import check_subrun

    opts = StudyConfig(settings=("video",), formulations=("penalty",), scale="tiny")
    (penalty,) = plan(opts, tmp_path)[1:]
    assert penalty.cfg.formulation == "penalty"
    assert penalty.cfg.dual_lr == type(penalty.cfg)().dual_lr
    assert penalty.cfg.dual_optimizer == type(penalty.cfg)().dual_optimizer != "sgd"
    earlier = {"dual_lr": SETTINGS["video"].dual_lr["sgd"], "dual_optimizer": "sgd"}
    penalty.out.mkdir(parents=True)
    written = penalty.cfg.fingerprint(evaluation=True) | earlier
    (penalty.out / "results.json").write_text(json.dumps({"config": written}, default=str))
    check_subrun(penalty, overwrite=False)
    assert penalty.finished
    (penalty.out / "results.json").unlink()
    (penalty.out / "checkpoints").mkdir()
    record = checkpoint_record(penalty.cfg) | earlier
    (penalty.out / "checkpoints" / "config.json").write_text(json.dumps(record, default=str))
    penalty.finished = False
    check_subrun(penalty, overwrite=False)  # not refused: the runner resumes them
    assert not penalty.finished
