"""The shared runner on a task written in this file: a new task needs no runner code.

``ToyTask`` denoises vectors with L residual tanh layers (a few lines of model). Through
``cudt.runner.run`` it gets flags and checks, sweeps, ERM and constrained runs in one program,
the device mesh, checkpoints, results, tables, plots and training curves. The tests check the
promises the runner makes: a sweep member trains like that member alone, 4 devices give the
1-device results, ERM lanes are ERM, the best run is a feasible one, and the step never deletes
the caller's arrays.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import (
    ROOT,
    ToyConfig,
    ToyTask,
    assert_one_line_error,
    forced_devices_env,
    job_results,
    toy,
    toy_main,
)

import cudt
from cudt.checkpoint import GroupCheckpointer
from cudt.metrics import feasibility
from cudt.runner.choice import choose_points
from cudt.runner.config import SWEEPABLE
from cudt.runner.run import run


@pytest.mark.slow
def test_evaluation_compiles_once_per_group(tmp_path):
    """Validation and test splits, every γ, every batch (the last one padded): one program."""
    task = ToyTask()
    results = toy(["--num-examples", "80", "--seeds", "1"], tmp_path / "o", task)
    assert len(results["runs"][0]["test_gamma"]) == 3
    # one abstract trace before --out is opened (cudt.runner.model_check), one compilation
    assert task.eval_traces == 2


def _results_but_timing(results: dict) -> dict:
    """results.json without what differs between any two runs of one command (the timings,
    the provenance, ``--out``), what says whether figures were drawn (the flag, the files)."""
    drop = {"wall_seconds", "train_seconds", "eval_seconds", "provenance", "files"}
    config = {k: v for k, v in results["config"].items() if k not in ("out", "figures")}
    return {k: v for k, v in results.items() if k not in drop} | {"config": config}


def test_no_figures_draws_no_png_and_writes_the_same_results(tmp_path, capsys):
    """``--no-figures`` (a batch job) writes no PNG and the results.json the run that draws
    them writes; the same command without it, on a copy of the folder without its results.json,
    draws them later and trains nothing (the flag's help says so)."""
    argv = ["--seeds", "1", "--steps", "8"]
    drawn = job_results(toy_main, argv, tmp_path / "drawn")
    bare = job_results(toy_main, [*argv, "--no-figures"], tmp_path / "bare")
    assert sorted(p.name for p in (tmp_path / "drawn").glob("*.png")) == drawn["files"] != []
    assert not list((tmp_path / "bare").rglob("*.png")) and bare["files"] == []
    assert bare["config"]["figures"] is False and drawn["config"]["figures"] is True
    assert json.dumps(_results_but_timing(bare)) == json.dumps(_results_but_timing(drawn))
    later = tmp_path / "later"
    shutil.copytree(tmp_path / "bare", later)
    (later / "results.json").unlink()
    capsys.readouterr()
    again = job_results(toy_main, argv, later)
    assert "toy-2: resumed from the checkpoint at step 8" in capsys.readouterr().err
    assert sorted(p.name for p in later.glob("*.png")) == again["files"] == drawn["files"]
    assert json.dumps(_results_but_timing(again)) == json.dumps(_results_but_timing(drawn))


def test_no_figures_still_writes_the_tasks_other_files(tmp_path):
    """What a task writes that is no figure (``Task.outputs``: the LLM's completions.md, the
    text table's ratio histograms) is written and listed under ``--no-figures`` too; its
    ``figures`` are not called."""

    class Notes(ToyTask):
        def figures(self, cfg, runs, ratios, out, gammas):
            raise AssertionError("figures drawn under --no-figures")

        def outputs(self, cfg, runs, ratios, out, gammas):
            (out / "notes.md").write_text(f"{len(runs)} runs, {len(ratios)} ratios\n")
            return [out / "notes.md"]

    results = toy(["--seeds", "1", "--steps", "4"], tmp_path / "o", Notes())
    assert results["files"] == ["notes.md"]
    assert (tmp_path / "o" / "notes.md").read_text() == "2 runs, 2 ratios\n"


def test_figures_get_each_runs_test_ratios_by_sample_and_layer(tmp_path):
    """``Task.figures`` gets every run's test ratios as ``[N, L]`` (NaN where excluded): a
    figure per layer needs the layer (the text table's histograms once reshaped a flat list of
    the kept ratios, which an excluded ratio broke)."""
    seen = []

    class Recording(ToyTask):
        def figures(self, cfg, runs, ratios, out, gammas):
            seen.extend(ratios)
            return []

    argv = ["--num-examples", "40", "--seeds", "1", "--layers", "3", "--figures"]
    toy(argv, tmp_path / "o", Recording())
    assert len(seen) == 2  # ERM and constrained
    assert all(np.asarray(r).shape == (40, 3) for r in seen)


def final_params(out: Path, group: str) -> dict:
    with GroupCheckpointer(out / "checkpoints" / group) as ckpt:
        states, _ = ckpt.restore(None)
    return states


def run_states(out: Path, results: dict) -> dict[str, tuple]:
    """``{label: (w, multipliers)}`` of every run, from its group's last checkpoint (a group's
    runs are its lanes, in results.json's order)."""
    lanes: dict[str, list[dict]] = {}
    for r in results["runs"]:
        lanes.setdefault(r["group"], []).append(r)
    found = {}
    for group, rs in lanes.items():
        states = final_params(out, group.replace(" ", "-"))
        for k, r in enumerate(rs):
            mult = {n: states["multipliers"][n][k] for n in ("reference", "descent")}
            found[r["label"]] = (states["params"]["w"][k], mult)
    return found


SWEEP_STEPS = ["--steps", "24"]


@pytest.fixture(scope="module")
def sweep_run(tmp_path_factory):
    """The sweep's output folder and results.json; what it printed is in ``printed.txt``.

    24 steps, ε 0.05 and 0.4: at ε 0.05 every run ends feasible and monotone on validation
    (largest relative violation −0.05 over both seeds and rates), at 0.4 none is feasible
    (+0.15 to +0.36 at some layer), so the choice has eligible and ineligible points to tell
    apart (12 steps met no constraint: the choice then had nothing to choose)."""
    out = tmp_path_factory.mktemp("toy") / "sweep"
    argv = [*SWEEP_STEPS, "--sweep", "epsilon=0.05,0.4", "--sweep", "lr=0.03,0.01"]
    argv += ["--gamma-train", "0.3", "--figures"]  # test_outputs_curves_and_table reads them
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        results = toy(argv, out)
    (out.parent / "printed.txt").write_text(printed.getvalue())
    return out, results


@pytest.mark.slow
def test_sweep_runs_every_point_and_seed_in_one_program(sweep_run, capsys):
    out, results = sweep_run
    runs = results["runs"]
    # ERM is swept only over lr (2 points), constrained over epsilon x lr (4): x 2 seeds
    assert sum(not r["constrained"] for r in runs) == 4
    assert sum(r["constrained"] for r in runs) == 8
    groups = sorted(p.name for p in (out / "checkpoints").iterdir() if p.is_dir())
    # ERM and constrained runs: one program, one checkpoint folder per seed's draw of the data
    assert groups == ["toy-2-data-0", "toy-2-data-1"]
    for r in runs:
        assert set(r["hparams"]) == set(SWEEPABLE)
        if r["constrained"]:
            assert r["hparams"]["epsilon"] in (0.05, 0.4) and r["hparams"]["dual_lr"] == 0.2
        else:
            assert r["hparams"]["epsilon"] is None and r["hparams"]["reference"] is None
            assert r["max_multipliers"] == [0.0] * 3
    points = {(r["hparams"]["epsilon"], r["hparams"]["lr"]) for r in runs if r["constrained"]}
    assert points == {(e, lr) for e in (0.05, 0.4) for lr in (0.03, 0.01)}
    assert results["config"]["sweeps"] == {"epsilon": [0.05, 0.4], "lr": [0.03, 0.01]}


def test_constrained_lanes_are_not_erm(sweep_run):
    """A wiring bug that trained every lane as ERM would pass the other tests."""
    _, results = sweep_run
    constrained = [r for r in results["runs"] if r["constrained"]]
    assert all(max(r["max_multipliers"]) > 0 for r in constrained)
    erm = {(r["seed"], r["hparams"]["lr"]): r for r in results["runs"] if not r["constrained"]}
    for r in constrained:
        twin = erm[(r["seed"], r["hparams"]["lr"])]  # same init, same batches, same noise
        assert abs(r["val_objective"] - twin["val_objective"]) > 1e-6


@pytest.mark.slow
def test_a_sweep_member_trains_like_that_member_alone(sweep_run, tmp_path):
    out, results = sweep_run
    argv = [*SWEEP_STEPS, "--epsilon", "0.4", "--lr", "0.01", "--gamma-train", "0.3"]
    alone = toy(argv, tmp_path / "a")
    swept, single = run_states(out, results), run_states(tmp_path / "a", alone)
    # alone: ERM and constrained of seeds 0 and 1; the sweep holds the same runs
    index = {
        (r["constrained"], r["seed"], r["hparams"]["epsilon"], r["hparams"]["lr"]): r
        for r in results["runs"]
    }
    for r in alone["runs"]:
        twin = index[(r["constrained"], r["seed"], r["hparams"]["epsilon"], r["hparams"]["lr"])]
        (w_sweep, m_sweep), (w_alone, m_alone) = swept[twin["label"]], single[r["label"]]
        assert np.max(np.abs(w_alone)) > 0.06  # it trained
        np.testing.assert_allclose(w_sweep, w_alone, rtol=1e-4, atol=1e-5)
        for name in ("reference", "descent"):  # the restored state's multiplier dict
            np.testing.assert_allclose(m_sweep[name], m_alone[name], rtol=1e-4, atol=1e-5)
        assert twin["feasible"] == r["feasible"]


def test_best_run_per_setting_is_feasible(sweep_run):
    _, results = sweep_run
    for constrained in (False, True):
        runs = [r for r in results["runs"] if r["constrained"] == constrained]
        best = [r for r in runs if r["best"]]
        eligible = [r for r in runs if r["feasible"] or not constrained]
        assert 0 < len(eligible) < len(runs) or not constrained  # a choice to make
        assert len(best) == 1
        assert best[0]["val_objective"] == min(r["val_objective"] for r in eligible)


def test_the_sweep_point_is_chosen_over_every_seed_and_printed(sweep_run):
    """results.json's chosen_points and the printed line agree with the runs: the chosen point
    is the best mean validation objective among points feasible and monotone at both seeds."""
    out, results = sweep_run
    cells: dict = {}
    for r in results["runs"]:
        if r["constrained"]:
            cells.setdefault((r["hparams"]["epsilon"], r["hparams"]["lr"]), []).append(r)
    ok = {
        k: np.mean([r["val_objective"] for r in rs])
        for k, rs in cells.items()
        if all(r["feasible"] and r["loss_decreases_val"] for r in rs)
    }
    assert 0 < len(ok) < len(cells), ok  # the fixture's setting: some points eligible, not all
    (pick,) = [c for c in results["chosen_points"] if c["kind"] == "constrained"]
    assert pick["points"] == 4 and pick["eligible"] == len(ok)
    printed = (out.parent / "printed.txt").read_text()
    best = min(ok, key=ok.get)
    assert (pick["hparams"]["epsilon"], pick["hparams"]["lr"]) == best
    assert f"toy-2 constrained: chosen on validation: epsilon={best[0]:g} lr={best[1]:g}" in printed
    # the same records with every run eligible: the best mean validation objective wins
    runs = [dict(r, feasible=True, loss_decreases_val=True) for r in results["runs"]]
    (pick,) = choose_points(runs, "val_objective", higher_is_better=False)
    means = {k: np.mean([r["val_objective"] for r in rs]) for k, rs in cells.items()}
    best = min(means, key=means.get)
    assert (pick["hparams"]["epsilon"], pick["hparams"]["lr"]) == best and pick["eligible"] == 4
    assert pick["mean"] == pytest.approx(means[best]) and pick["seeds"] == [0, 1]


def test_outputs_curves_and_table(sweep_run):
    out, results = sweep_run
    run0 = results["runs"][0]
    assert run0["curves"]["step"][-1] == 24 and len(run0["curves"]["multipliers"][0]) == 3
    assert (out / "training_curves.png").stat().st_size > 10_000
    logs = sorted(p.name for p in (out / "tensorboard").iterdir())
    assert len(logs) == len(results["runs"])
    assert all(any((out / "tensorboard" / d).iterdir()) for d in logs)
    assert results["devices"] >= 1 and results["processes"] == 1

    # The printed summary table: a header, a rule, then one row per run of results.json, in
    # its order, each cell the run's own value (swept fields after the seed, task columns next).
    lines = (out.parent / "printed.txt").read_text().splitlines()
    top = next(
        i for i, line in enumerate(lines) if line.split()[:4] == ["model", "L", "kind", "seed"]
    )
    header = lines[top].split()
    assert header == [
        "model", "L", "kind", "seed", "epsilon", "lr", "final", "descent", "mean", "r",
        "med", "r", "feasible", "max", "λ", "peak", "λ",
    ]  # fmt: skip
    assert set(lines[top + 1]) == {"-"} and len(lines[top + 1]) == len(lines[top])
    runs = results["runs"]
    rows = [line.split() for line in lines[top + 2 : top + 2 + len(runs)]]
    for row, r in zip(rows, runs, strict=True):
        assert len(row) == 13, row
        model, layers, kind, seed, eps, lr, final, descent, mean_r, med_r, status = row[:11]
        assert (model, layers, seed) == ("toy", "2", str(r["seed"]))
        assert kind == ("constrained" if r["constrained"] else "ERM")
        assert eps == ("-" if not r["constrained"] else f"{r['hparams']['epsilon']:.3g}")
        assert float(lr) == pytest.approx(r["hparams"]["lr"], rel=1e-3)
        assert float(final) == pytest.approx(r["final_loss"][0], abs=1e-4)
        assert float(descent.rstrip("%")) == pytest.approx(100 * r["descent_rate"], abs=0.05)
        assert float(mean_r) == pytest.approx(r["mean_ratio"], abs=1e-3)
        assert float(med_r) == pytest.approx(r["median_ratio"], abs=1e-3)
        assert status == ("yes" if r["feasible"] else "NO") + ("*" if r["best"] else "")
        assert float(row[11]) == pytest.approx(max(r["multipliers"]), rel=1e-2, abs=1e-6)
        assert float(row[12]) == pytest.approx(max(r["max_multipliers"]), rel=1e-2, abs=1e-6)
    assert sum(row[2] == "ERM" for row in rows) == 4
    assert sum(row[10].endswith("*") for row in rows) >= 1  # the best ERM run at least
    assert len(lines) > top + 2 + len(runs) and lines[top + 2 + len(runs)].split()[0] != "toy"
    # 2 seeds: one interval line per model x kind x sweep point (ERM: 2 lr, constrained: 2 x 2)
    intervals = [line for line in lines if "Student-t interval] over 2 seeds" in line]
    assert len(intervals) == 6 == len(results["intervals"])
    assert sum(line.startswith("toy-2 constrained epsilon=") for line in intervals) == 4


def test_sweep_flag_errors(tmp_path, capsys):
    for argv, words in [
        (["--sweep", "epsilon"], "must be NAME=V1,V2"),
        (["--sweep", "lr=0.1", "--sweep", "lr=0.2"], "--sweep lr is given twice"),
        (["--sweep", "lr=0.1,-1"], "--sweep lr must all be finite numbers > 0, got -1.0"),
        (["--sweep", "gamma_train=inf"], "values must be finite numbers"),
        # a repeat or an empty value would train fewer lanes than the values given
        (["--sweep", "epsilon=0.2,0.2"], "--sweep epsilon=0.2,0.2 repeats 0.2: list each"),
        (["--sweep", "epsilon=0.2, 2e-1"], "epsilon=0.2,2e-1 repeats 0.2 (as 2e-1): list"),
        (["--sweep", "reference=chance,chance+0"], "repeats chance (as chance+0)"),
        (["--sweep", "resilience=none,2,None"], "repeats none (as None)"),
        (["--sweep", "epsilon=0.2,,0.4"], "epsilon=0.2,,0.4 has an empty value: drop the"),
        (["--sweep", "epsilon=0.2,0.4,"], "epsilon=0.2,0.4, has an empty value"),
    ]:
        assert_one_line_error(toy_main, [*argv, "--out", tmp_path / "o"], capsys, words)
    assert not (tmp_path / "o").exists()


def test_a_sweep_spelt_another_way_resumes_and_another_lane_order_does_not(tmp_path, capsys):
    """A resume compares the lanes ``--sweep`` names, not its spelling (docs/runner.md): a
    dash or an underscore, ``1e-3`` or ``0.001``, a space after a comma resume the checkpoints
    of the raw spelling an earlier run saved (its checkpoints/config.json, which still records
    the flags as given); values in another order put other values in the saved lanes:
    refused, as is another value."""
    out = tmp_path / "o"
    first = toy(["--sweep", "dual-lr=0.001", "--sweep", "epsilon=0.2,0.4"], out)
    saved = json.loads((out / "checkpoints" / "config.json").read_text())
    assert saved["sweep"] == ["dual-lr=0.001", "epsilon=0.2,0.4"]  # as given, as before
    (out / "results.json").unlink()
    capsys.readouterr()
    again = toy(["--resume", "--sweep", "dual_lr=1e-3", "--sweep", "epsilon=0.2, 4e-1"], out)
    assert capsys.readouterr().err.count(": resumed from the checkpoint at step 12") == 2
    assert [r["label"] for r in again["runs"]] == [r["label"] for r in first["runs"]]
    assert [r["final_loss"] for r in again["runs"]] == [r["final_loss"] for r in first["runs"]]
    (out / "results.json").unlink()
    for sweep, words in [
        ("epsilon=0.4,0.2", "'epsilon=0.2,0.4'] -> ['dual_lr=0.001', 'epsilon=0.4,0.2']"),
        ("epsilon=0.2,0.3", "different config (sweep"),
    ]:
        argv = ["--sweep", "dual_lr=0.001", "--sweep", sweep, "--out", out]
        assert_one_line_error(toy_main, argv, capsys, words)


def test_a_reference_spelt_another_way_is_the_same_config(tmp_path, capsys):
    """``--reference .5`` names the bound ``0.5`` names (and ``CHANCE`` the one ``chance``
    does): a rerun spelling it another way was refused as another config, naming
    ``reference '0.5' -> '.5'``; another bound still is."""
    out = tmp_path / "o"
    first = toy(["--reference", "0.5"], out)
    for reference in (".5", "5e-1"):
        (out / "results.json").unlink()
        capsys.readouterr()
        again = toy(["--resume", "--reference", reference], out)
        assert ": resumed from the checkpoint at step" in capsys.readouterr().err
        assert [r["final_loss"] for r in again["runs"]] == [r["final_loss"] for r in first["runs"]]
    (out / "results.json").unlink()
    argv = ["--reference", "0.6", "--out", out]
    assert_one_line_error(toy_main, argv, capsys, "different config (reference '0.5' -> '0.6')")


@dataclasses.dataclass(frozen=True)
class _TaskLrConfig(ToyTask.config_cls):
    lr: float | None = None  # the task's: _TaskLrToy.default_lr


class _TaskLrToy(ToyTask):
    config_cls = _TaskLrConfig

    def default_lr(self, cfg, name):
        return 3e-2


def test_a_learning_rate_given_at_the_tasks_default_is_the_same_config(tmp_path, capsys):
    """``--lr`` at the value the task's default resolves to trains the default's runs: a resume
    either way round resumes the other's checkpoints (it was refused as another config,
    ``lr 0.03 -> None``); another rate still is refused."""
    for k, (given, then) in enumerate([(["--lr", "0.03"], []), ([], ["--lr", "3e-2"])]):
        out = tmp_path / str(k)
        first = toy(given, out, _TaskLrToy())
        (out / "results.json").unlink()
        capsys.readouterr()
        again = toy(then, out, _TaskLrToy())
        assert ": resumed from the checkpoint at step" in capsys.readouterr().err
        assert [r["final_loss"] for r in again["runs"]] == [r["final_loss"] for r in first["runs"]]
    (out / "results.json").unlink()
    argv = ["--lr", "0.02", "--out", out]
    assert_one_line_error(
        lambda a: toy_main(a, _TaskLrToy()), argv, capsys, "different config (lr None -> 0.02)"
    )


def test_the_lanes_a_resume_compares_are_the_parsed_sweeps():
    """What a resume compares (canonical_sweeps, which checks nothing: a saved config is read
    as it stands) is what parse_sweeps trains, name by name and value by value."""
    from cudt.runner.sweep import canonical_sweeps, parse_sweeps

    sweep = ("dual-lr=1e-3", "epsilon=0.2, 0.4", "reference=CHANCE+0.10,none,5e-1")
    sweep += ("resilience=None,2", "epsilon_schedule=constant, LINEAR:0@4")
    cfg = ToyTask().config_cls(sweep=sweep)
    assert canonical_sweeps(cfg.sweep) == tuple(parse_sweeps(cfg).items())
    assert dict(canonical_sweeps(cfg.sweep))["reference"] == ("chance+0.1", "none", "0.5")


def test_a_run_saved_with_a_repeated_sweep_value_is_read_back_and_resumes(tmp_path, capsys):
    """An earlier cudt trained ``epsilon=0.2,0.2,,2e-1,0.4`` as two lanes (a repeat and an empty
    item dropped), which parse_sweeps refuses now: its finished run is read back
    (finished_run) and its checkpoints resume with the two values given once."""
    from cudt.runner.finished import finished_run
    from cudt.runner.sweep import parse_sweeps

    out = tmp_path / "o"
    first = toy(["--sweep", "epsilon=0.2,0.4"], out)
    for name in ("results.json", "checkpoints/config.json"):
        record = json.loads((out / name).read_text())
        (record["config"] if name == "results.json" else record)["sweep"] = [
            "epsilon=0.2,0.2,,2e-1,0.4"
        ]
        (out / name).write_text(json.dumps(record))
    cfg, _, _ = finished_run(out, ToyTask(), "a test")
    assert parse_sweeps(cfg) == {"epsilon": (0.2, 0.4)}
    (out / "results.json").unlink()
    again = toy(["--resume", "--sweep", "epsilon=0.2,0.4"], out)
    assert ": resumed from the checkpoint at step 12" in capsys.readouterr().err
    assert [r["final_loss"] for r in again["runs"]] == [r["final_loss"] for r in first["runs"]]


FOUR_DEVICES = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, {tests!r})
    import jax
    from helpers import ToyTask, forced_devices_env, toy
    assert jax.device_count() == 4, jax.devices()
    one = toy(["--devices", "1", "--seeds", "2", "--sweep", "epsilon=0.2,0.4"], {out!r} + "/one")
    four = toy(["--seeds", "2", "--sweep", "epsilon=0.2,0.4"], {out!r} + "/four")
    # FSDP: 2 runs (ERM, constrained) x 2-way data axis; every leaf split (no size floor)
    import numpy as np
    import cudt.runner.mesh as mesh
    mesh.FSDP_MIN_ELEMENTS = 0
    sh = mesh.make_shardings(2, 8, fsdp=True)
    placed = sh.put_states({{"w": np.zeros((2, 3, 8, 4), np.float32), "b": np.zeros((2,))}})
    specs = [tuple(placed["w"].sharding.spec), tuple(placed["b"].sharding.spec)]
    single = toy(["--devices", "1", "--seeds", "1"], {out!r} + "/single")
    fsdp = toy(["--seeds", "1", "--fsdp"], {out!r} + "/fsdp")
    print(json.dumps({{"one": one, "four": four, "single": single, "fsdp": fsdp,
                       "specs": specs, "mesh": dict(sh.mesh.shape)}}))
    """
)


@pytest.mark.slow
def test_four_cpu_devices_give_the_one_device_results(tmp_path):
    env = forced_devices_env(4)
    code = FOUR_DEVICES.format(tests=str(ROOT / "tests"), out=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    both = json.loads(proc.stdout.strip().splitlines()[-1])
    one, four = both["one"], both["four"]
    assert one["devices"] == 1 and four["devices"] == 4
    for a, b in zip(one["runs"], four["runs"], strict=True):
        assert (a["label"], a["hparams"]) == (b["label"], b["hparams"])
        np.testing.assert_allclose(a["final_loss"], b["final_loss"], rtol=1e-4)
        np.testing.assert_allclose(a["multipliers"], b["multipliers"], rtol=1e-4, atol=1e-5)
        assert a["feasible"] == b["feasible"]
    # where the lanes went, a line a group on more than one device (none with --devices 1)
    placed = [line for line in proc.stdout.splitlines() if line.startswith("placement:")]
    # (each seed's draw a group of 3 runs: 4 devices split no 3 lanes, so each run's batch)
    assert placed == [
        *(f"placement: toy-2 data {k} (3 runs): 4 devices (mesh run 1 × data 4)" for k in (0, 1)),
        "placement: toy-2 (2 runs): 4 devices (mesh run 2 × data 2, FSDP)",
    ]
    # --fsdp: the states split over (run, data); the same runs as on one device
    assert both["mesh"] == {"run": 2, "data": 2}
    assert both["specs"] == [["run", None, "data"], ["run"]]
    single, fsdp = both["single"], both["fsdp"]
    assert single["devices"] == 1 and fsdp["devices"] == 4
    for a, b in zip(single["runs"], fsdp["runs"], strict=True):
        assert a["label"] == b["label"]
        np.testing.assert_allclose(a["final_loss"], b["final_loss"], rtol=1e-4)
        np.testing.assert_allclose(a["multipliers"], b["multipliers"], rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------------------------
# The importable step: per-run values in the state, never deleting the caller's arrays
# --------------------------------------------------------------------------------------------


def _losses(params, batch, key):
    del key
    states = [batch]
    for layer in range(params["w"].shape[0]):
        states.append(states[-1] * params["w"][layer])
    return (jnp.stack(states, 1) - 0.5 * batch[:, None]) ** 2


def test_two_states_from_one_params_then_the_params_still_work():
    params = {"w": jnp.asarray([1.1, 0.9, 0.7], jnp.float32)}
    batch = jnp.linspace(-1.0, 1.0, 16)
    cfg = cudt.DescentConfig(num_layers=3, epsilon=0.1)
    init_c, step_c = cudt.make_train_step(_losses, optax.adam(1e-2), cudt.dual_ascent(0.1), cfg)
    erm = dataclasses.replace(cfg, constrained=False)
    init_e, step_e = cudt.make_train_step(_losses, optax.adam(1e-2), cudt.dual_ascent(0.1), erm)
    s1 = init_c(params)
    s1, _ = step_c(s1, batch, jax.random.key(0))  # donates s1's buffers
    s2 = init_e(params)  # the caller's params are alive
    s2, _ = step_e(s2, batch, jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(params["w"]), np.float32([1.1, 0.9, 0.7]))
    assert float(jnp.sum(params["w"])) == pytest.approx(2.7)
    assert not np.allclose(np.asarray(s1.params["w"]), np.asarray(params["w"]))


def test_erm_flag_in_the_state_is_erm():
    """ERM and constrained as lanes of ONE vmapped step: the ERM lane equals a pure ERM run."""
    params = {"w": jnp.asarray([1.1, 0.95, 0.7], jnp.float32)}
    batch = jnp.linspace(-1.0, 1.0, 16)
    cfg = cudt.DescentConfig(num_layers=3, epsilon=0.2)
    tx = optax.inject_hyperparams(optax.adam)(learning_rate=1e-2)
    init, step = cudt.make_train_step(_losses, tx, cudt.dual_adam(0.1), cfg, jit=False)
    states = jax.vmap(lambda c, lr: init(params, constrained=c, lr=lr))(
        jnp.asarray([False, True]), jnp.asarray([1e-2, 1e-2])
    )
    erm_cfg = dataclasses.replace(cfg, constrained=False)
    init_e, step_e = cudt.make_train_step(_losses, optax.adam(1e-2), cudt.dual_adam(0.1), erm_cfg)
    alone = init_e(params)
    vstep = jax.jit(jax.vmap(step, in_axes=(0, None, None)))
    for i in range(5):
        states, _ = vstep(states, batch, jax.random.key(i))
        alone, _ = step_e(alone, batch, jax.random.key(i))
    np.testing.assert_allclose(states.params["w"][0], alone.params["w"], rtol=1e-5)
    lam = cudt.descent.multipliers(states)
    assert np.all(np.asarray(lam[0]) == 0)
    assert float(jnp.max(lam[1])) > 0
    assert not np.allclose(states.params["w"][0], states.params["w"][1], atol=1e-5)


def test_learning_rate_needs_an_injected_optimizer():
    cfg = cudt.DescentConfig(num_layers=3)
    init, _ = cudt.make_train_step(_losses, optax.adam(1e-2), cudt.dual_ascent(0.1), cfg)
    with pytest.raises(ValueError, match="optax.inject_hyperparams"):
        init({"w": jnp.ones(3)}, lr=1e-3)


TWO_PROCESSES = textwrap.dedent(
    """
    import json, sys
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    sys.path.insert(0, {tests!r})
    from helpers import ToyTask
    from cudt.runner.cli import task_main
    statuses = []
    for k, (out, *extra) in enumerate(json.loads(sys.argv[1])):
        if k:
            print({mark!r}, file=sys.stderr, flush=True)
        argv = ["--seeds", "2", "--data-seed", "0", "--sweep", "epsilon=0.2,0.4",
                "--distributed", "--out", out, *extra]
        statuses.append(task_main(ToyTask(), argv, "toy", "toy"))
    print(json.dumps(statuses))
    sys.exit(statuses[-1])
    """
)
JOB_MARK = "--- the next job of this process ---"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _two_processes(
    out: Path,
    out1: Path | None = None,
    extra: tuple[str, ...] = (),
    timeout: float = 600,
    then: tuple[tuple[Path, tuple[str, ...]], ...] = (),
) -> list[subprocess.CompletedProcess]:
    """One job of two processes with 2 CPU devices each, launched as a cluster scheduler
    would: the same command, told the coordinator, the process count and its own id
    (``out1``: process 1's --out, when it is not ``out``; ``extra``: flags after the job's
    own, which a flag given twice overrides). ``then``: ``(out, extra)`` of more jobs the same
    two processes run after it, one after the other (a process's start, its imports and the
    job's connection are seconds each); :func:`_jobs` splits what they returned and printed.
    A process still running after ``timeout`` seconds is killed, and its return code is the
    kill's (else the last job's status)."""
    code = TWO_PROCESSES.format(tests=str(ROOT / "tests"), mark=JOB_MARK)
    port = _free_port()
    procs = []
    for pid in (0, 1):
        folder = out if pid == 0 or out1 is None else out1
        jobs = [[str(folder), *extra], *([str(o), *e] for o, e in then)]
        env = forced_devices_env(
            2,
            JAX_COORDINATOR_ADDRESS=f"localhost:{port}",
            JAX_NUM_PROCESSES="2",
            JAX_PROCESS_ID=str(pid),
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", code, json.dumps(jobs)],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    done = []
    for p in procs:
        try:
            stdout, stderr = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            stdout, stderr = p.communicate()
        done.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    return done


def _jobs(p: subprocess.CompletedProcess) -> list[tuple[int, str]]:
    """``(status, stderr)`` of each job a process of :func:`_two_processes` ran, in order."""
    statuses = json.loads(p.stdout.strip().splitlines()[-1])
    parts = p.stderr.split(JOB_MARK + "\n")
    assert len(parts) == len(statuses), p.stderr[-3000:]
    return list(zip(statuses, parts, strict=True))


@pytest.mark.slow
def test_a_two_process_job_gives_the_one_process_results_and_resumes(tmp_path, capsys):
    first = _two_processes(tmp_path / "job")
    for p in first:
        assert p.returncode == 0, p.stderr[-3000:]
    job = json.loads((tmp_path / "job" / "results.json").read_text())
    assert job["processes"] == 2 and job["devices"] == 4
    assert "wrote" in first[0].stdout and "wrote" not in first[1].stdout  # process 0 writes
    single = toy(
        ["--seeds", "2", "--data-seed", "0", "--sweep", "epsilon=0.2,0.4"], tmp_path / "single"
    )
    for a, b in zip(single["runs"], job["runs"], strict=True):
        assert a["label"] == b["label"]
        np.testing.assert_allclose(a["final_loss"], b["final_loss"], rtol=1e-4)
        np.testing.assert_allclose(a["multipliers"], b["multipliers"], rtol=1e-4, atol=1e-5)
    # the job's checkpoints, cut back to step 8, resume in ONE process on one device: the state
    # is resharded on load, and the results are the job's to float rounding
    alone = tmp_path / "alone"
    shutil.copytree(tmp_path / "job", alone)
    (alone / "results.json").unlink()
    shutil.rmtree(alone / "checkpoints" / "toy-2" / "12")
    capsys.readouterr()
    resumed_alone = toy(["--seeds", "2", "--data-seed", "0", "--sweep", "epsilon=0.2,0.4"], alone)
    assert resumed_alone["processes"] == 1 and resumed_alone["devices"] == 1
    assert (
        "toy-2: resumed from the checkpoint at step 8; saved on 4 devices in 2 processes (mesh "
        "run 2 × data 2), resharded onto 1 device: results agree with an uninterrupted run to "
        "float rounding (docs/runner.md)"
    ) in capsys.readouterr().err
    for a, b in zip(job["runs"], resumed_alone["runs"], strict=True):
        assert a["label"] == b["label"]
        for key in ("final_loss", "multipliers", "max_multipliers"):
            np.testing.assert_allclose(b[key], a[key], rtol=1e-4, atol=1e-6, err_msg=key)
        for name, curve in a["curves"].items():
            np.testing.assert_allclose(b["curves"][name], curve, rtol=1e-4, atol=1e-6)
    # the job's orbax checkpoints resume in a new job: results gone, training done
    (tmp_path / "job" / "results.json").unlink()
    again = _two_processes(tmp_path / "job")
    for p in again:
        assert p.returncode == 0, p.stderr[-3000:]
    assert "resumed from the checkpoint at step 12" in again[0].stderr
    resumed = json.loads((tmp_path / "job" / "results.json").read_text())
    assert [r["final_loss"] for r in resumed["runs"]] == [r["final_loss"] for r in job["runs"]]


@pytest.mark.slow
def test_a_two_process_job_whose_mesh_is_smaller_than_the_job_holds_every_process(tmp_path):
    """6 runs with batches of 9 on the job's 4 devices fill a run 2 × data 1 mesh: one device of
    each process (it took process 0's two, and the job waited forever at step 0). A mesh that
    cannot hold both processes (3 runs: 1 device), and --devices below the job's 4, are refused
    in one line by both processes, before --out is created."""
    refusals = [
        (
            ("--batch-size", "9", "--seeds", "1"),
            "error: a group of 3 runs with batches of 9 fills a mesh of 1 of the job's 4 devices "
            "(run 1 × data 1: each divides the device count and its runs or batch), and a job "
            "of 2 processes needs devices of every process in it: pass a --batch-size that 4 "
            "divides",
        ),
        (
            ("--devices", "2"),
            "error: --devices 2 in a job of 2 processes: every process trains on its own "
            "devices (the job's 4), and a process left out of the mesh would wait forever: drop "
            "--devices, or launch fewer processes or devices",
        ),
    ]
    # the refused jobs in the job's own two processes, after it: a fresh pair for each cost
    # seconds of start and imports (what the refusals check is the same)
    then = tuple((tmp_path / "refused", extra) for extra, _ in refusals)
    job = _two_processes(tmp_path / "job", extra=("--batch-size", "9"), timeout=300, then=then)
    for p in job:
        assert p.returncode == 2, p.stderr[-3000:]
        (status, stderr), *refused = _jobs(p)
        assert status == 0, stderr[-3000:]
        for (status, stderr), (_, message) in zip(refused, refusals, strict=True):
            assert status == 2, stderr[-3000:]
            assert stderr.strip() == message
    assert not (tmp_path / "refused").exists()
    results = json.loads((tmp_path / "job" / "results.json").read_text())
    assert results["processes"] == 2 and results["devices"] == 2
    single = toy(
        ["--seeds", "2", "--data-seed", "0", "--sweep", "epsilon=0.2,0.4", "--batch-size", "9"],
        tmp_path / "single",
    )
    for a, b in zip(single["runs"], results["runs"], strict=True):
        assert a["label"] == b["label"]
        np.testing.assert_allclose(a["final_loss"], b["final_loss"], rtol=1e-4)
        np.testing.assert_allclose(a["multipliers"], b["multipliers"], rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_a_two_process_job_whose_processes_see_two_folders_stops(tmp_path):
    """--out not shared by the job's processes (here: each is given its own folder): process 1
    does not find the lock process 0 took, and both stop before training, in one line."""
    done = _two_processes(tmp_path / "zero", tmp_path / "one")
    for p in done:
        assert p.returncode == 2, p.stderr[-3000:]
        lines = [s for s in p.stderr.splitlines() if s.startswith("error: ")]
        assert len(lines) == 1 and "is not one folder for every process of this job" in lines[0]
        assert lines[0].endswith("put --out on a file system every process shares")
    assert f"it sees no lock file in {tmp_path / 'one'}" in done[1].stderr
    assert not (tmp_path / "zero" / "cudt.lock").exists()  # released by process 0
    assert not (tmp_path / "one").exists()  # process 1 writes nothing


@pytest.mark.slow
def test_every_sweepable_field_is_a_per_run_value(tmp_path):
    argv = [
        "--seeds",
        "1",
        "--sweep",
        "gamma_train=0.1,0.3",
        "--sweep",
        "reference=none,0.001",
        "--sweep",
        "resilience=none,0.5",
        "--sweep",
        "dual_lr=0.1,0.4",
    ]
    results = toy(argv, tmp_path / "o")
    runs = results["runs"]
    assert sum(not r["constrained"] for r in runs) == 2  # ERM: gamma_train only
    assert sum(r["constrained"] for r in runs) == 16
    assert {0.1, 0.3} <= set(runs[0]["test_gamma"])
    by_hp = {tuple(sorted(r["hparams"].items())): r for r in runs if r["constrained"]}
    assert len(by_hp) == 16
    for r in runs:
        hp = r["hparams"]
        assert r["gamma_train"] == hp["gamma_train"]
        if not r["constrained"]:
            continue
        # the reference constraint E l_0 <= C exists only where it was asked for
        lam0 = r["max_multipliers"][0]
        assert (lam0 > 0) == (hp["reference"] is not None), (hp, lam0)
    # the noise level reaches the loss: layer 0's loss is the noise energy gamma^2
    for r in runs:
        gi = r["test_gamma"].index(r["gamma_train"])
        assert r["layer_loss"][gi][0] == pytest.approx(r["gamma_train"] ** 2, rel=0.25)

    # resilience weakens the multipliers: with alpha = 0.5 the dual decays by lambda/alpha
    def peak(alpha):
        return np.mean(
            [
                max(r["max_multipliers"])
                for r in runs
                if r["constrained"] and r["hparams"]["resilience"] == alpha
            ]
        )

    assert peak(0.5) < peak(None)


@pytest.fixture(scope="module")
def tuned_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("toy") / "tuned"
    argv = ["--tune-epsilon", "0.05,0.1", "--tune-lr", "1,2", "--gamma-train", "0.3"]
    argv += ["--steps", "24"]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        results = toy(argv, out)
    return results, printed.getvalue()


def test_tuned_lanes_choose_each_kind_on_validation_and_compare_the_choices(tuned_run):
    """--tune-epsilon gives the constrained runs lanes over ε, --tune-lr ERM as many over its
    learning rate; each kind's point is chosen on validation over both seeds, and the headline
    is chosen constrained − chosen ERM, a paired t interval over the seeds (each on its own
    draw of the data), recomputed here from the runs."""
    results, printed = tuned_run
    runs = results["runs"]
    con = {(r["hparams"]["epsilon"], r["hparams"]["lr"]) for r in runs if r["constrained"]}
    erm = {(r["hparams"]["epsilon"], r["hparams"]["lr"]) for r in runs if not r["constrained"]}
    assert con == {(0.05, 3e-2), (0.1, 3e-2)} and erm == {(None, 3e-2), (None, 6e-2)}
    picks = {c["kind"]: c for c in results["chosen_points"]}
    for kind, constrained in (("ERM", False), ("constrained", True)):
        # recomputed by hand: per point, the mean validation objective over both seeds, among
        # the points no seed of which diverged and, constrained, every seed feasible and
        # monotone on validation (ERM has no constraints to meet)
        cells: dict = {}
        for r in runs:
            if r["constrained"] == constrained:
                key = (r["hparams"]["epsilon"], r["hparams"]["lr"])
                cells.setdefault(key, []).append(r)
        ok = {
            k: np.mean([r["val_objective"] for r in rs])
            for k, rs in cells.items()
            if all(
                not r["diverged"] and (not constrained or r["feasible"] and r["loss_decreases_val"])
                for r in rs
            )
        }
        assert ok, kind
        best = min(ok, key=ok.get)
        assert (picks[kind]["hparams"]["epsilon"], picks[kind]["hparams"]["lr"]) == best
    (comparison,) = results["chosen_comparison"]
    assert comparison["seeds"] == [0, 1]

    def chosen(kind, constrained):
        hp = picks[kind]["hparams"]
        return sorted(
            (r for r in runs if r["constrained"] == constrained and r["hparams"] == hp),
            key=lambda r: r["seed"],
        )

    a, b = chosen("constrained", True), chosen("ERM", False)
    diff = np.array([x["val_objective"] - y["val_objective"] for x, y in zip(a, b, strict=True)])
    half = 12.706 * diff.std(ddof=1) / np.sqrt(2)  # t_{1, 0.975}
    iv = comparison["constrained_minus_erm"]["val_objective"]
    np.testing.assert_allclose(
        [iv["mean"], iv["low"], iv["high"]],
        [diff.mean(), diff.mean() - half, diff.mean() + half],
        rtol=1e-3,
    )
    assert comparison["feasible"] == sum(r["feasible"] for r in a)
    # each run says whether its lane is the chosen one (figures draw the others faint)
    for kind, constrained in (("ERM", False), ("constrained", True)):
        for r in runs:
            if r["constrained"] == constrained:
                assert r["chosen"] == (r["hparams"] == picks[kind]["hparams"]), r["label"]
    assert "chosen constrained (epsilon=" in printed and "− chosen ERM (lr=" in printed
    assert f"constrained feasible at {comparison['feasible']} of 2" in printed
    # ERM judged at the chosen point's ε, not at the model's (its runs' own "feasible")
    eps = picks["constrained"]["hparams"]["epsilon"]
    erm = [r for r in runs if not r["constrained"] and r["hparams"] == picks["ERM"]["hparams"]]
    tol = results["config"]["tolerance"]
    met = [feasibility(r["layer_loss_val"], eps, None, tol).feasible for r in erm]
    assert comparison["erm_feasible"] == sum(met)
    assert f"ERM at {sum(met)} of 2 (the same constraints)" in printed


def test_erm_at_one_point_is_compared_with_the_chosen_constrained_point(tmp_path):
    """ERM not tuned (one point) still has its comparison with the chosen constrained point:
    "− ERM (its one point)", not "chosen", and ERM judged at the chosen ε."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        argv = ["--tune-epsilon", "0.05,0.1", "--gamma-train", "0.3", "--steps", "24"]
        results = toy(argv, tmp_path / "out")
    (comparison,) = results["chosen_comparison"]
    assert comparison["erm_chosen"] is False and comparison["seeds"] == [0, 1]
    assert comparison["erm_feasible"] is not None
    assert "− ERM (its one point), paired t over 2 seeds" in printed.getvalue()
    # the run table's ERM column is judged at the model's ε, and the notes say so
    runs = results["runs"]
    assert {r["judged_epsilon"] for r in runs if r["constrained"]} == {0.05, 0.1}
    (erm_eps,) = {r["judged_epsilon"] for r in runs if not r["constrained"]}
    assert (
        f"ERM's feasible: its descent constraints at ε {erm_eps:g} (the model's; its "
        "constrained runs' ε: 0.05, 0.1)" in printed.getvalue()
    )


def test_a_value_the_user_sets_is_not_tuned(tmp_path):
    results = toy(["--tune-epsilon", "0.2,0.4", "--epsilon", "0.25", "--seeds", "1"], tmp_path)
    assert {r["hparams"]["epsilon"] for r in results["runs"] if r["constrained"]} == {0.25}
    assert "chosen_comparison" not in results


def test_dual_rates_are_tuned_as_lanes_crossed_with_epsilon_unless_set(tmp_path):
    """--tune-dual-lr crosses the constrained lanes with dual rates (the ERM lanes are
    untouched: no dual), the chosen point names both, and a --dual-lr the user sets wins."""
    argv = ["--tune-epsilon", "0.2,0.4", "--tune-dual-lr", "0.1,0.4", "--tune-lr", "1,2"]
    results = toy([*argv, "--seeds", "2", "--steps", "16"], tmp_path / "t")
    runs = results["runs"]
    con = {(r["hparams"]["epsilon"], r["hparams"]["dual_lr"]) for r in runs if r["constrained"]}
    assert con == {(0.2, 0.1), (0.2, 0.4), (0.4, 0.1), (0.4, 0.4)}
    assert {r["hparams"]["dual_lr"] for r in runs if not r["constrained"]} == {None}
    assert len([r for r in runs if not r["constrained"]]) == 4  # 2 lr lanes x 2 seeds
    picks = {c["kind"]: c["hparams"] for c in results["chosen_points"]}
    # by hand: the (ε, dual rate, lr) cells whose every seed is feasible and monotone on
    # validation, the lowest mean validation objective among them
    cells: dict[tuple, list[dict]] = {}
    for r in runs:
        if r["constrained"]:
            h = r["hparams"]
            cells.setdefault((h["epsilon"], h["dual_lr"], h["lr"]), []).append(r)
    ok = {
        k: np.mean([r["val_objective"] for r in rs])
        for k, rs in cells.items()
        if all(r["feasible"] and r["loss_decreases_val"] and not r["diverged"] for r in rs)
    }
    assert ok, "the toy's setting must leave some cell eligible, or the choice is not checked"
    best = min(ok, key=ok.get)
    chosen = picks["constrained"]
    assert (chosen["epsilon"], chosen["dual_lr"], chosen["lr"]) == best
    alone = toy([*argv, "--dual-lr", "0.3", "--seeds", "1", "--steps", "16"], tmp_path / "u")
    assert {r["hparams"]["dual_lr"] for r in alone["runs"] if r["constrained"]} == {0.3}


def test_a_default_warmup_as_long_as_the_run_is_said_before_training(tmp_path, capsys):
    """The task's default warm-up is one epoch; where that covers every step the constrained
    runs never see a multiplier, and the runner says so (an explicit --warmup-steps that long is
    refused with the config)."""
    import dataclasses

    from helpers import ToyConfig

    from cudt.runner.run import run

    cfg = ToyConfig(num_examples=200, seeds=1, out=str(tmp_path / "o"))  # 25 steps an epoch
    run(ToyTask(), dataclasses.replace(cfg, warmup_steps=None))
    out = capsys.readouterr()
    assert "the warm-up, one epoch of 25 steps, covers all 12 --steps" in out.out + out.err
    run(
        ToyTask(),
        dataclasses.replace(cfg, warmup_steps=None, num_examples=80, out=str(tmp_path / "p")),
    )
    out = capsys.readouterr()
    assert "covers all" not in out.out + out.err  # 10 steps an epoch


def test_a_warning_of_every_seeds_groups_is_said_once(tmp_path, capsys):
    """Each seed draws its own data, so each has its groups; the warm-up's warning, the same
    for each, was printed once per seed (twice per model with --seeds 2)."""
    from helpers import ToyConfig

    from cudt.runner.run import run

    cfg = ToyConfig(num_examples=200, seeds=2, warmup_steps=None, out=str(tmp_path / "o"))
    run(ToyTask(), cfg)
    err = capsys.readouterr().err
    assert err.count("covers all 12 --steps") == 1, err


def test_a_resume_may_keep_another_number_of_checkpoints(tmp_path, capsys):
    """--keep-checkpoints changes which checkpoints stay, not what a run computes: a resume
    with another value was refused as a changed config (keep_checkpoints 2 -> 3), also for
    checkpoints whose config.json records it (every one written before it was ignored)."""
    argv = ["--num-examples", "40", "--seeds", "1", "--steps", "4", "--chunk-steps", "2"]
    out = tmp_path / "o"
    first = toy([*argv, "--keep-checkpoints", "1"], out)
    (out / "results.json").unlink()
    saved = out / "checkpoints" / "config.json"
    saved.write_text(json.dumps(json.loads(saved.read_text()) | {"keep_checkpoints": 1}))
    capsys.readouterr()
    again = toy([*argv, "--keep-checkpoints", "3", "--resume"], out)
    assert "toy-2: resumed from the checkpoint at step 4" in capsys.readouterr().err
    assert again["runs"] == first["runs"]  # the same runs, nothing trained again


def test_inject_nans_kind_is_read_in_any_case_as_kinds_spells_it(tmp_path, capsys):
    """--inject-nan's KIND was ERM or constrained exactly, while --kinds spells it erm: the
    fault of toy,erm,0,2 was refused as malformed. Any case is read now, as the same fault (the
    ERM run diverges, the constrained one does not); a kind of neither names the ones it reads."""
    from helpers import ToyConfig

    from cudt.runner.cli import config_from_args

    argv = ["--seeds", "1", "--steps", "4"]
    spelt = [config_from_args(ToyConfig, [*argv, "--inject-nan", f"toy,{k},0,2"], "", "t")[0]
             for k in ("ERM", "erm", "Erm")]  # fmt: skip
    assert {c.inject_nan for c in spelt} == {("toy", "ERM", "0", "2")}
    results = toy([*argv, "--inject-nan", "toy,erm,0,2"], tmp_path / "r")
    assert {r["constrained"]: r["diverged"] for r in results["runs"]} == {False: True, True: False}
    bad = [*argv, "--inject-nan", "toy,both,0,2", "--out", str(tmp_path / "b")]
    says = "with KIND erm or constrained (any case; e.g. ut,constrained,0,30), got 'toy,both,0,2'"
    assert_one_line_error(toy_main, bad, capsys, says, out=tmp_path / "b")


def test_the_resume_hint_names_the_commands_out_not_a_callers(tmp_path, capsys):
    """A paper job's sub-run (``run(task, cfg, out_dir)``) is resumed by rerunning the job: its
    ``--out`` of the sub-folder alone would not resume the job. The command's own ``--out``
    gets the hint."""
    toy_main(["--steps", "4", "--seeds", "1", "--out", str(tmp_path / "cli")])
    assert "(if interrupted, rerun with --out" in capsys.readouterr().out
    run(ToyTask(), ToyConfig(steps=4, seeds=1), tmp_path / "sub")
    out = capsys.readouterr().out
    assert f"output: {tmp_path / 'sub'}\n" in out and "rerun with --out" not in out
