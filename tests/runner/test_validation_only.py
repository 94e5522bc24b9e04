"""No test-split number reaches a selection or a verdict (issue 32 item 2): the runner's best run,
feasibility and monotone verdicts, a table's shown run, the dual study's successes and its best
combination. Each test perturbs only test-split numbers (nothing may change) and then only
validation numbers (the choice must be able to change)."""

from __future__ import annotations

import contextlib
import copy
import io
import random

import numpy as np
import pytest
from helpers import ToyTask, toy

from cudt.runner.choice import choose_points, chosen_lines, select_best
from experiments.paper.dual_study import SETTINGS, Combo
from experiments.paper.dual_study.report import best, run_rows, summarise
from experiments.paper.rows import setting_rows

# Every key of a run record computed from the test split (cudt.runner.record.summarise and the
# tasks' run_metrics): what a selection must never read.
TEST_KEYS = (
    "rmse",
    "mean_rmse",
    "accuracy",
    "auc",
    "layer_accuracy",
    "layer_loss",
    "loss_decreases",
    "descent_rate",
    "mean_ratio",
    "median_ratio",
)


def _perturb_test(runs: list[dict], seed: int) -> list[dict]:
    rng = random.Random(seed)
    out = copy.deepcopy(runs)
    for r in out:
        for k in TEST_KEYS:
            if k not in r:
                continue
            if isinstance(r[k], bool):
                r[k] = rng.random() < 0.5
            elif isinstance(r[k], list):
                r[k] = [
                    [rng.uniform(0, 100) for _ in v] if isinstance(v, list) else rng.uniform(0, 100)
                    for v in r[k]
                ]
            else:
                r[k] = rng.uniform(0, 100)
    return out


def _run(seed, *, constrained=True, val=0.1, feasible=True, val_down=True, **hp):
    return {
        "model": "m",
        "layers": 2,
        "constrained": constrained,
        "seed": seed,
        "label": f"m {constrained} {seed} {hp}",
        "gamma_train": 0.5,
        "test_gamma": [0.0, 0.5, 1.0],
        "hparams": {"dual_lr": 1.0, **hp},
        "rmse": [1.0, 2.0, 3.0],
        "mean_rmse": 2.0,
        "layer_loss": [[1.0, 0.5, 0.2]] * 3,
        "loss_decreases": True,
        "loss_decreases_val": val_down,
        "descent_rate": 0.9,
        "mean_ratio": 0.7,
        "median_ratio": 0.6,
        "feasible": feasible,
        "diverged": False,
        "val_objective": val,
        "max_multipliers": [0.0, 1.0, 1.0],
        "multipliers": [0.0, 1.0, 1.0],
    }


def _grid() -> list[dict]:
    runs = [_run(s, constrained=False, val=0.2 + 0.01 * s) for s in range(3)]
    runs += [
        _run(s, val=0.1 + 0.01 * s + 0.001 * i, feasible=(s + i) % 2 == 0, dual_lr=lr)
        for s in range(3)
        for i, lr in enumerate((1.0, 10.0))
    ]
    return runs


def _best_labels(runs):
    select_best(runs, "val_objective", higher_is_better=False)
    return [r["label"] for r in runs if r["best"]]


def test_the_runners_best_run_reads_no_test_number():
    before = _best_labels(_grid())
    for seed in range(5):
        assert _best_labels(_perturb_test(_grid(), seed)) == before
    moved = _grid()
    moved[-2]["val_objective"] = 1e-6  # a feasible constrained run's validation loss
    assert moved[-2]["feasible"]
    assert _best_labels(moved) != before


def _points(vals=(0.30, 0.10, 0.20), infeasible=()):
    """ERM, then three dual rates x 3 seeds; point i's validation objective vals[i] + seed/1000;
    (rate index, seed) in ``infeasible`` misses its constraints."""
    runs = [_run(s, constrained=False, val=0.5) for s in range(3)]
    for i, lr in enumerate((1.0, 10.0, 100.0)):
        runs += [
            _run(s, val=vals[i] + s / 1000, feasible=(i, s) not in infeasible, dual_lr=lr)
            for s in range(3)
        ]
    return runs


def _chosen(runs, higher=False):
    (pick,) = choose_points(runs, "val_objective", higher_is_better=higher)
    return pick["hparams"] and pick["hparams"]["dual_lr"], pick


def test_the_runners_chosen_sweep_point_needs_every_seed_and_reads_no_test_number():
    rate, pick = _chosen(_points())
    assert rate == 10.0 and pick["seeds"] == [0, 1, 2] and pick["eligible"] == 3
    assert pick["mean"] == pytest.approx(0.101)
    for seed in range(5):
        assert _chosen(_perturb_test(_points(), seed))[0] == 10.0
    # one seed that misses its constraints rules the point out, however good the others
    assert _chosen(_points(infeasible={(1, 2)}))[0] == 100.0
    # so does one seed whose validation losses do not descend
    runs = _points()
    runs[3 + 3 + 1]["loss_decreases_val"] = False
    assert _chosen(runs)[0] == 100.0
    assert _chosen(_points(), higher=True)[0] == 1.0
    # none eligible: no point, and the summary line says why
    rate, pick = _chosen(_points(infeasible={(0, 0), (1, 1), (2, 2)}))
    assert rate is None and pick["eligible"] == 0 and pick["points"] == 3
    (line,) = chosen_lines([pick], ["dual_lr"])
    assert "no sweep point chosen: none of 3 is eligible" in line
    assert "try smaller epsilons (--sweep epsilon=" in line  # and what to pass
    (line,) = chosen_lines([_chosen(_points())[1]], ["dual_lr"])
    assert "chosen on validation: dual_lr=10 (val_objective 0.101 over seeds 0,1,2" in line
    # a swept value of None (e.g. resilience off) is named, not dropped
    hard = dict(_chosen(_points())[1], hparams={"dual_lr": 10.0, "resilience": None})
    (line,) = chosen_lines([hard], ["resilience", "dual_lr"])
    assert "chosen on validation: resilience=none dual_lr=10 (" in line
    # one point: nothing to choose
    assert choose_points(_points()[:6], "val_objective", higher_is_better=False) == []


def _shown(runs):
    select_best(runs, "val_objective", higher_is_better=False)
    rows = setting_rows(
        {"runs": runs}, "d", "sub", score="val_objective", higher=False, fields=lambda b, i: {}
    )
    return [(r["kind"], r["status"], r.get("label")) for r in rows]


def test_a_tables_shown_run_reads_no_test_number():
    # including the fallback: no feasible constrained run, the best infeasible one is shown
    infeasible = [dict(r, feasible=False) for r in _grid()]
    for runs in (_grid(), infeasible):
        before = _shown(copy.deepcopy(runs))
        for seed in range(5):
            assert _shown(_perturb_test(runs, seed)) == before
        moved = copy.deepcopy(runs)  # the other point's validation losses, at every seed
        for r in moved:
            if r["constrained"] and r["hparams"].get("dual_lr") == 10.0:
                r["val_objective"] = 1e-6
        assert _shown(moved) != before


def _study(pi_val=0.01, pi_down=True, test_seed=None):
    setting = SETTINGS["video"]
    erm = {"runs": [_run(s, constrained=False) for s in (0, 1)]}
    plain, pi = (
        Combo("lagrangian", "sgd", "simultaneous"),
        Combo("lagrangian", "nupi", "simultaneous"),
    )
    results = {
        plain: [_run(s, val=0.02, dual_lr=v) for s in (0, 1) for v in (100.0, 1000.0)],
        pi: [
            _run(s, val=pi_val, val_down=pi_down, dual_lr=v)
            for s in (0, 1)
            for v in (100.0, 1000.0)
        ],
    }
    rows = []
    for combo, runs in results.items():
        if test_seed is not None:
            runs = _perturb_test(runs, test_seed)
        rows += run_rows(setting, combo, {"runs": runs}, erm)
    summaries = summarise(rows)
    return [r["ok"] for r in rows], best(summaries)["combo"]


def test_the_dual_studys_successes_and_best_read_no_test_number():
    oks, chosen = _study()
    assert all(oks) and chosen == Combo("lagrangian", "nupi", "simultaneous")  # tie: val loss
    for seed in range(5):
        assert _study(test_seed=seed) == (oks, chosen)
    # validation decides: a higher validation loss loses the tie, a non-monotone one fails
    assert _study(pi_val=0.03)[1] == Combo("lagrangian", "sgd", "simultaneous")
    assert _study(pi_down=False)[0] == [True] * 4 + [False] * 4


class ScaledTestToy(ToyTask):
    """The toy task with its test split scaled: every test number changes, validation's not."""

    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def load(self, cfg):
        data = super().load(cfg)
        return data | {"test": (data["test"] * self.scale).astype(np.float32)}


@pytest.mark.slow
def test_the_runners_verdicts_do_not_move_with_the_test_split(tmp_path):
    argv = ["--steps", "6", "--chunk-steps", "6", "--num-examples", "16", "--seeds", "1",
            "--eval-batch-size", "16", "--gamma-train", "0.3", "--sweep", "epsilon=0.05,0.4"]  # fmt: skip
    with contextlib.redirect_stdout(io.StringIO()):
        a = toy(argv, tmp_path / "a", ScaledTestToy(1.0))
        b = toy(argv, tmp_path / "b", ScaledTestToy(30.0))
    verdicts = ("feasible", "loss_decreases_val", "best", "not_applicable", "val_objective")
    for ra, rb in zip(a["runs"], b["runs"], strict=True):
        assert ra["label"] == rb["label"]
        assert {k: ra[k] for k in verdicts} == {k: rb[k] for k in verdicts}
        assert ra["layer_loss_val"] == rb["layer_loss_val"]
        assert ra["layer_loss"] != rb["layer_loss"]  # the test numbers did change


def test_the_text_summarys_monotone_column_is_the_validation_verdict():
    """The accuracy tasks' summary shows the monotone verdict of validation data: flipping the
    test split's check changes nothing, flipping the validation verdict changes the column."""
    from cudt.tasks.accuracy import AccuracyReports

    (column,) = AccuracyReports.after_columns(None)
    run = _run(0, val_down=True)
    shown = column.cell(run)
    assert shown == column.cell(run | {"loss_decreases": not run["loss_decreases"]})
    assert column.cell(run | {"loss_decreases_val": False}) != shown


def test_a_point_a_seed_short_is_no_rival_for_one_trained_at_every_seed():
    """Folders of other grids joined by ``combine`` can leave a point without some seeds: its
    mean over fewer seeds (here one good seed) does not beat a point eligible at all three."""
    runs = [_run(s, constrained=False, val=0.3) for s in range(3)]
    runs += [_run(s, val=0.20, epsilon=0.05) for s in range(3)]
    runs += [_run(0, val=0.10, epsilon=0.1)]  # better, at seed 0 alone
    (entry,) = choose_points(runs, "val_objective", higher_is_better=False)
    assert entry["hparams"]["epsilon"] == 0.05 and entry["seeds"] == [0, 1, 2]
    assert (entry["points"], entry["eligible"]) == (2, 1)
    (full,) = choose_points(  # at every seed it competes, and wins
        [*runs, _run(1, val=0.10, epsilon=0.1), _run(2, val=0.10, epsilon=0.1)],
        "val_objective",
        higher_is_better=False,
    )
    assert full["hparams"]["epsilon"] == 0.1 and full["eligible"] == 2


def _no_point_line(runs, constrained):
    (entry,) = choose_points(runs, "val_objective", higher_is_better=False, constrained=constrained)
    assert entry["hparams"] is None
    (line,) = chosen_lines([entry], ["lr", "dual_lr"])
    return line


def test_no_point_chosen_says_each_actual_reason_not_every_point_diverged():
    """ERM: one point a seed short (folders of other grids joined), another with a seed whose
    score is NaN, none diverged: the line said "every point diverged" (and to lower the
    learning rate). Constrained: a point a seed short was put down to its constraints."""
    erm = [_run(0, constrained=False, val=0.2, lr=0.1), _run(1, constrained=False, val=0.2, lr=0.1)]
    erm += [_run(0, constrained=False, val=0.1, lr=0.3)]  # seed 0 alone
    erm[1]["val_objective"] = float("nan")
    line = _no_point_line(erm, constrained=False)
    assert "diverged:" not in line and "every point diverged" not in line, line
    assert "1 lacks a run at a seed other points trained (missing: 1)" in line, line
    assert "1 has a seed with no finite val_objective" in line, line
    # every point diverged: that, and the learning rate
    gone = [
        dict(_run(s, constrained=False, lr=lr), diverged=True) for s in (0, 1) for lr in (0.1, 0.3)
    ]
    line = _no_point_line(gone, constrained=False)
    assert line.endswith(
        ": 2 have a seed that diverged: try a smaller learning rate (--tune-lr 0.25,0.5)"
    ), line
    # constrained: one point a seed short, the other infeasible at a seed
    con = [_run(0, dual_lr=1.0), _run(1, dual_lr=1.0, feasible=False), _run(0, dual_lr=10.0)]
    line = _no_point_line(con, constrained=True)
    assert "1 lacks a run at a seed other points trained (missing: 1)" in line, line
    assert "1 has a seed infeasible or not monotone on validation: try smaller epsilons" in line
