"""The video experiment end to end on tiny configs: results, plots, divergence, resume, refusals."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from helpers import ROOT, RUNNER_KEYS, help_text, job_results
from PIL import Image

from cudt.checkpoint import GroupCheckpointer
from cudt.tasks.video import VideoTask
from experiments import video_denoise

TINY = [
    "--no-figures",  # only diverging_run's are read (test_plots_are_real_pngs): it draws them
    "--layers",
    "3",
    "--num-videos",
    "3",
    "--num-frames",
    "8",
    "--seq-len",
    "4",
    "--batch-size",
    "16",
    "--dust-atoms",
    "16",
    # one setting per kind and one draw of the data for all seeds: the tests below read the
    # groups and checkpoint folders of that plan (tuned lanes and per-seed draws: test_runner)
    *("--tune-epsilon", "0.1", "--tune-dual-lr", "0.03", "--tune-lr", "1", "--data-seed", "0"),
    "--eval-batch-size",
    "128",  # last: TINY[:-2] drops it
]
RUN_KEYS = RUNNER_KEYS | {"rmse"}  # and the task's metrics


def _ut(argv: list[str]) -> list[str]:
    """``argv`` less the DUST dictionary's size: a run of ``--models ut`` refuses a DUST flag."""
    i = argv.index("--dust-atoms")
    return argv[:i] + argv[i + 2 :]


def _params(states: dict):
    """The model parameters of a restored group state (a ``cudt.ConstrainedState``)."""
    return states["params"]


@pytest.fixture(scope="module")
def diverging_run(tmp_path_factory):
    """UT and DUST, ERM and constrained, 2 seeds; seed 1 of constrained UT is poisoned at 12."""
    out = tmp_path_factory.mktemp("vd") / "run"
    argv = TINY + [
        "--figures",
        "--models",
        "dust,ut",
        "--steps",
        "20",
        "--chunk-steps",
        "5",
        "--seeds",
        "2",
        "--keep-checkpoints",
        "1",
        "--inject-nan",
        "ut,constrained,1,12",
    ]
    return out, job_results(video_denoise.main, argv, out)


@pytest.mark.slow
def test_results_json_has_every_run_and_key(diverging_run):
    out, results = diverging_run
    runs = results["runs"]
    assert {(r["model"], r["constrained"], r["seed"]) for r in runs} == {
        (m, c, s) for m in ("dust", "ut") for c in (False, True) for s in (0, 1)
    } | {("dust-pl", False, s) for s in (0, 1)}  # the control: ERM, per-layer dictionaries
    # the control has the constrained DUST's architecture, the plain ERM DUST does not
    shapes = {}
    for group in ("dust-3-ERM", "dust-3-constrained", "dust-pl-3-ERM"):
        with GroupCheckpointer(out / "checkpoints" / group) as ckpt:
            states, _ = ckpt.restore(None)
        shapes[group] = [np.shape(x) for x in jax.tree.leaves(_params(states))]
    assert shapes["dust-pl-3-ERM"] == shapes["dust-3-constrained"] != shapes["dust-3-ERM"]
    for run in runs:
        assert RUN_KEYS <= set(run)
        assert run["layers"] == 3 and len(run["multipliers"]) == 4
        assert len(run["rmse"]) == len(run["test_gamma"]) == len(run["layer_loss"])
        assert all(len(ll) == 4 for ll in run["layer_loss"])
        assert run["gamma_train"] in run["test_gamma"]
        assert max(run["test_gamma"]) > run["gamma_train"]  # OOD points are evaluated
        if not run["constrained"]:
            assert run["multipliers"] == [0.0, 0.0, 0.0, 0.0]
    # Zero noise is the easiest test point: RMSE grows with γ for a healthy run.
    healthy = next(r for r in runs if r["model"] == "dust" and not r["constrained"])
    assert healthy["rmse"][0] < healthy["rmse"][-1]
    assert results["config"]["steps"] == 20
    # the summary's footer prints every run's RMSE per test γ and its per-state losses (×1e-4)
    from cudt.tasks.video import VideoTask

    footer = VideoTask().table_footer(runs).splitlines()
    gammas = " ".join(f"{g:g}" for g in runs[0]["test_gamma"])
    assert footer[0] == f"test RMSE at gamma = {gammas}:"
    assert footer[1] == f"{runs[0]['label']}: " + " ".join(f"{v:.3f}" for v in runs[0]["rmse"])
    at_train = healthy["layer_loss"][healthy["test_gamma"].index(healthy["gamma_train"])]
    line = next(x for x in footer[len(runs) + 2 :] if x.startswith(healthy["label"] + ":"))
    assert [float(v) for v in line.split(": ")[1].split()] == pytest.approx(
        [1e4 * v for v in at_train], abs=0.051
    )


@pytest.mark.slow
def test_plots_are_real_pngs(diverging_run):
    out, _ = diverging_run
    for name in ("layer_loss.png", "rmse_vs_gamma.png"):
        with Image.open(out / name) as im:
            assert im.format == "PNG" and im.size[0] > 400 and im.size[1] > 200
            # not a blank canvas: many distinct colours were drawn
            assert len(im.convert("RGB").getcolors(maxcolors=1_000_000)) > 50


@pytest.mark.slow
def test_injected_nan_stops_one_run_keeps_its_checkpoint_others_finish(diverging_run):
    out, results = diverging_run
    bad = [r for r in results["runs"] if r["diverged"]]
    assert [(r["model"], r["constrained"], r["seed"]) for r in bad] == [("ut", True, 1)]
    assert bad[0]["diverged_at"]["step"] == 12
    assert bad[0]["diverged_at"]["last_good_checkpoint"] == 10
    assert bad[0]["feasible"] is False and bad[0]["best"] is False
    # keep=1, yet the last good checkpoint before step 12 survived the later saves
    # ERM and constrained UT share one program (and one checkpoint folder): same structure
    group = out / "checkpoints" / "ut-3"
    assert sorted(int(p.name) for p in group.iterdir() if p.name.isdigit()) == [10, 20]
    ckpt = GroupCheckpointer(group, keep=1)
    states, _ = ckpt.restore(None, step=10)
    ckpt.close()
    assert np.all(np.isfinite(_params(states)["params"]["ffn"]))
    # the diverged run's sibling seed and every other group trained all 20 steps
    for run in results["runs"]:
        if not run["diverged"]:
            assert run["train_steps"][-1] == 20 and np.isfinite(run["train_objective"][-1])


@pytest.mark.slow
def test_finished_output_is_never_overwritten(diverging_run, capsys):
    out, _ = diverging_run
    before = (out / "results.json").read_bytes()
    argv = _ut(TINY) + ["--models", "ut", "--steps", "20", "--out", str(out)]
    assert video_denoise.main(argv) == 2
    assert "already holds results.json" in capsys.readouterr().err
    assert (out / "results.json").read_bytes() == before


def test_help_lists_every_config_field(capsys):
    text = " ".join(help_text(video_denoise.main, video_denoise.Config, capsys).split())
    # the task's own defaults, not the shared empty ones, whose words the help keeps
    assert "empty (the shared default): --dual-lr (default: 0.03,0.1)" in text
    assert "(default: alternating)" in text and "(default: ,)" not in text
    # an on/off flag says which spelling is the default, the task's own where it sets one
    assert "is then reachable (default: --ut-skip)" in text
    assert "already in --out (default: --no-overwrite)" in text


STEPS = 40  # a checkpoint every 5: the kill lands after the first, the resume saves 7 more


def _argv(out: Path, *extra: str) -> list[str]:
    return [
        *_ut(TINY),
        "--models",
        "ut",
        "--seeds",
        "2",
        "--steps",
        str(STEPS),
        "--chunk-steps",
        "5",
        "--warmup-steps",
        "0",  # the constraints act from the first step: live slacks within STEPS
        # explicit slacks, so the resumed state's slacks are compared while they are non-zero,
        # with the default dual dynamics (nuPI, alternating updates): one engine takes both
        "--resilience",
        "2.0",
        "--resilience-mode",
        "slack",
        "--out",
        str(out),
        *extra,
    ]


def _cli(out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "experiments.video_denoise", *_argv(out, *extra)]


def _final_arrays(out: Path) -> dict[str, dict]:
    arrays = {}
    for group in ("ut-3",):
        ckpt = GroupCheckpointer(out / "checkpoints" / group)
        assert ckpt.latest_step() == STEPS
        states, _ = ckpt.restore(None)
        ckpt.close()
        arrays[group] = states
    return arrays


@pytest.mark.slow  # three runs of STEPS steps (without XLA's optimisation passes: 54.7 s of
# CPU against 72.6 s with them, measured side by side on 2026-11-29). The run killed is a
# subprocess (SIGKILL); the uninterrupted run and the resume are this process's, as any
# in-process run (the checkpoints on disk are all a resume reads): two processes fewer to start
# (this test alone: 37.9 and 38.9 s of CPU against 43.2 and 42.9 s, measured on 2026-12-05)
def test_sigkill_then_resume_is_bitwise_the_uninterrupted_run(tmp_path, capsys):
    # the run killed trains on this process's platform, as the two runs it is compared with
    env = dict(os.environ, JAX_PLATFORMS=jax.default_backend())
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    assert video_denoise.main(_argv(straight)) == 0

    proc = subprocess.Popen(
        _cli(killed), cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    group = killed / "checkpoints" / "ut-3"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if group.is_dir() and any(p.name.isdigit() for p in group.iterdir()):
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the run finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    saved = sorted(int(p.name) for p in group.iterdir() if p.name.isdigit())
    assert saved and max(saved) < STEPS and not (killed / "results.json").exists()

    capsys.readouterr()
    assert video_denoise.main(_argv(killed)) == 0
    assert "resumed from the checkpoint at step" in capsys.readouterr().err

    a, b = _final_arrays(straight), _final_arrays(killed)
    for group_name in a:
        for name in (
            "params",
            "multipliers",
            "opt_state",
            "dual_state",
            "slacks",
            "slack_state",
            "step",
        ):
            left = np.concatenate([np.ravel(x) for x in _leaves(a[group_name][name])] or [[]])
            right = np.concatenate([np.ravel(x) for x in _leaves(b[group_name][name])] or [[]])
            assert left.tobytes() == right.tobytes(), (group_name, name)
    ra = json.loads((straight / "results.json").read_text())["runs"]
    rb = json.loads((killed / "results.json").read_text())["runs"]
    assert [r["rmse"] for r in ra] == [r["rmse"] for r in rb]
    assert [r["train_objective"] for r in ra] == [r["train_objective"] for r in rb]
    assert [r["max_multipliers"] for r in ra] == [r["max_multipliers"] for r in rb]
    assert [r["curves"] for r in ra] == [r["curves"] for r in rb]
    slacks = [u for r in ra if r["constrained"] for u in r["curves"]["slacks"]]
    assert max(max(u) for u in slacks) > 0  # the slacks were live when compared


def _leaves(tree):
    import jax

    return [np.asarray(x) for x in jax.tree.leaves(tree)]


@pytest.fixture(scope="module")
def ut_runs(tmp_path_factory):
    """UT, 3 steps at --lr 0.5, evaluated in batches of 128 (one batch) and of 7 (the last one
    padded): the same trained parameters, so every number must agree. The second evaluation
    is the first run's finished checkpoints evaluated again (--eval-batch-size changes no
    checkpoint), not the same 3 steps trained a second time."""
    argv = _ut(TINY[:-2]) + ["--models", "ut", "--steps", "3", "--chunk-steps", "1", "--seeds", "1",
                        "--lr", "0.5", "--warmup-steps", "0", "--test-gammas", "0,0.5",
                        "--keep-checkpoints", "3"]  # fmt: skip
    root = tmp_path_factory.mktemp("ut")
    results = {}
    for size in (128, 7):
        out = root / str(size)
        if size == 7:  # the trained run, less its results: evaluated again, in batches of 7
            shutil.copytree(root / "128" / "checkpoints", out / "checkpoints")
        assert video_denoise.main([*argv, "--eval-batch-size", str(size), "--out", str(out)]) == 0
        results[size] = json.loads((out / "results.json").read_text())
    return root, results


@pytest.mark.slow
def test_the_ut_projection_is_applied_after_every_step(ut_runs):
    """ut_project after each primal step: the symmetric part of every W̃_f ends with eigenvalues
    in [0, 0.95] (the default UT's skip: W_f = I − sym(W̃_f) in [0.05, 1]). The large learning
    rate pushes them far outside, so a runner that dropped ``project_params`` or its lower
    bound fails here."""
    root, _ = ut_runs
    with GroupCheckpointer(root / "128" / "checkpoints" / "ut-3") as ckpt:
        assert ckpt.all_steps() == [1, 2, 3]  # a chunk of one step: every step's parameters
        saved = [ckpt.restore(None, step)[0] for step in (1, 2, 3)]
    for step, states in enumerate(saved, start=1):
        ffn = np.asarray(_params(states)["params"]["ffn"], np.float64)  # [runs, ..., D, D]
        assert np.all(np.isfinite(ffn))
        sym = (ffn + np.swapaxes(ffn, -1, -2)) / 2
        eigenvalues = np.linalg.eigvalsh(sym)
        assert eigenvalues.max() <= 0.95 + 1e-4, (step, eigenvalues.max())
        assert eigenvalues.min() >= -1e-4, (step, eigenvalues.min())


@pytest.mark.slow
def test_evaluation_does_not_depend_on_the_eval_batch_size(ut_runs):
    """Padding rows that leaked into a mean, or noise drawn per batch position instead of per
    example, would move these numbers between batch sizes 128 and 7."""
    _, results = ut_runs
    assert results[7]["config"]["eval_batch_size"] == 7
    for a, b in zip(results[128]["runs"], results[7]["runs"], strict=True):
        assert np.all(np.isfinite(a["rmse"]))
        for key in ("rmse", "layer_loss", "val_objective", "descent_rate", "mean_ratio"):
            np.testing.assert_allclose(b[key], a[key], rtol=2e-5, atol=1e-7, err_msg=key)


@pytest.mark.slow
def test_select_val_mean_rmse_scores_validation_over_the_test_grid(tmp_path, ut_runs):
    """--select val-mean-rmse: validation videos are scored at every test γ (the OOD γ too),
    each run's score is the mean of those RMSEs, and the best mark is its minimum among the
    eligible runs; without the flag (``ut_runs``, tested at γ = 0, γ_train and 0.5), validation is
    scored at γ_train only."""
    argv = _ut(TINY[:-2]) + ["--models", "ut", "--steps", "4", "--chunk-steps", "4", "--seeds", "2",
                        "--warmup-steps", "0", "--eval-batch-size", "128",
                        "--test-gammas", "0,0.5,1", "--gamma-train", "0.5",
                        "--kinds", "erm"]  # fmt: skip
    out = tmp_path / "mean"
    assert video_denoise.main([*argv, "--select", "val-mean-rmse", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["val_gamma"] == results["config"]["test_gamma"] == [0.0, 0.5, 1.0]
    runs = results["runs"]
    for run in runs:
        by_gamma = np.asarray(run["val_rmse_by_gamma"])
        assert by_gamma.shape == (3,) and np.all(np.diff(by_gamma) > 0)  # more noise, more error
        assert run["val_mean_rmse"] == pytest.approx(by_gamma.mean())
        # validation at γ_train is the same data the objective reads: RMSE = 255·sqrt(loss)
        assert by_gamma[1] == pytest.approx(255 * np.sqrt(run["val_objective"]), rel=1e-4)
    best = [r for r in runs if r["best"]]
    assert len(best) == 1 and best[0]["val_mean_rmse"] == min(r["val_mean_rmse"] for r in runs)

    _, without = ut_runs
    results = without[128]
    assert results["config"]["select"] == "val-objective"
    gamma_train = results["config"]["gamma_train"]
    assert results["config"]["test_gamma"] == [0.0, gamma_train, 0.5]  # γ_train joins the grid
    assert results["config"]["val_gamma"] == [gamma_train]
    assert all("val_mean_rmse" not in r for r in results["runs"])


def test_select_val_mean_rmse_over_a_grid_of_gamma_train_alone_scores_validation():
    """``--test-gammas`` naming γ_train alone: the grid's mean RMSE is the RMSE at γ_train (the
    table's meanRMSE is). Validation had no val_mean_rmse there, so no point was ever chosen,
    each setting named as "a seed with no finite val_mean_rmse ... check that seed's validation
    data" (found by helper V's walk)."""
    task = VideoTask()
    cfg = video_denoise.Config(select="val-mean-rmse", test_gammas=(0.15,))
    grid = task.test_gamma_grid(cfg, cfg.gamma_train)
    val_gammas = task.val_gammas(cfg, [cfg.gamma_train], grid)
    assert grid == val_gammas == [0.15]
    losses = np.full((1, 5, cfg.layers + 1), 4e-4)  # [Gv, N, L+1]: RMSE 255 · 0.02 = 5.1
    metrics = task.val_metrics(cfg, {"losses": losses}, val_gammas, cfg.gamma_train)
    assert metrics["val_rmse_by_gamma"] == pytest.approx([5.1])
    assert metrics["val_mean_rmse"] == pytest.approx(5.1)
    assert task.selection_for(cfg) == ("val_mean_rmse", False)
    # the default selection scores nothing more on validation
    assert task.val_metrics(video_denoise.Config(), {"losses": losses}, [0.15], 0.15) == {}


def test_the_default_gamma_grid_holds_gamma_train_exactly():
    """The runner finds γ_train's column by value: a γ_train with more than 6 decimals must not
    be rounded away (it was, and the run failed after training with a bare ValueError)."""
    from cudt.tasks.video import test_gamma_grid as grid

    odd = grid(0.1234567)
    assert odd.index(0.1234567) == 2 and odd[1] == 0.061728
    assert grid(0.15) == [0.0, 0.075, 0.15, 0.225, 0.3, 0.45, 0.6]
