"""Degenerate ratios and constraints (issue 32): a ratio whose denominator is at the floor is
excluded and counted, a descent constraint after a state at the floor is not applicable, a job
that trains one says so before training; intervals over seeds in the runner's summary."""

from __future__ import annotations

import contextlib
import io
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import ToyTask, toy

from cudt.metrics import RELATIVE_FLOOR, descent_stats, feasibility, loss_floor
from cudt.models import DUST


def test_a_ratio_with_a_degenerate_denominator_is_excluded_and_counted():
    # state 0 of half the samples is (almost) exactly the target: ℓ_0 = 1e-9. Floored at 1e-12
    # the old mean ratio was ~1e8; now those ratios are left out and counted.
    losses = np.array([[1e-9, 0.5, 0.25]] * 4 + [[1.0, 0.5, 0.25]] * 4)
    s = descent_stats(losses)
    assert s.floor == pytest.approx(RELATIVE_FLOOR * losses.mean(0).max())
    assert (s.excluded, s.total) == (4, 16)
    assert s.excluded_text().startswith("excluded: 4 of 16")
    # the rest: 4 x (0.5/1) and 8 x (0.25/0.5)
    assert s.mean_ratio == pytest.approx(0.5)
    assert s.median_ratio == pytest.approx(0.5)
    assert s.descent_rate == pytest.approx(1.0)
    assert np.isnan(s.ratios[:4, 0]).all() and s.kept.size == 12
    # every denominator degenerate: no statistic, not a huge one
    empty = descent_stats(np.zeros((3, 3)))
    assert empty.excluded == 6 and math.isnan(empty.mean_ratio)


def test_a_step_with_a_non_finite_loss_is_left_out_of_every_statistic_and_named():
    """A NaN loss (a sample poisoned by a bad label) on either side of a step: out of the
    descent rate, the ratios and the histogram alike, and not called "below the floor" (the
    rate counted it as no descent while the mean and median ratios turned NaN)."""
    losses = np.array([[1.0, 0.5, 0.5], [1.0, np.nan, 0.2], [2.0, 1.0, 0.5]])
    s = descent_stats(losses)
    assert (s.excluded, s.non_finite, s.total) == (0, 2, 6)
    assert s.descent_rate == pytest.approx(3 / 4)
    assert s.mean_ratio == pytest.approx((0.5 + 1.0 + 0.5 + 0.5) / 4)
    assert s.median_ratio == pytest.approx(0.5) and s.kept.size == 4
    assert s.excluded_text() == "excluded: 2 of 6 (2 with a non-finite loss)"


def test_the_floor_follows_the_data_scale():
    losses = np.array([[1e-6, 2e-3, 1e-3], [1.5e-6, 2e-3, 1e-3]])
    # scaled up or down together, the same ratios are kept
    for scale in (1e-6, 1.0, 1e6):
        s = descent_stats(losses * scale)
        assert s.excluded == 2  # ℓ_0 is below 0.1% of the largest mean loss at any scale
        assert s.mean_ratio == pytest.approx(0.5)
    assert loss_floor([0.0, 4.0, 2.0]) == pytest.approx(4.0 * RELATIVE_FLOOR)
    assert loss_floor([0.0, 4.0], scale=10.0) == pytest.approx(10.0 * RELATIVE_FLOOR)


def test_a_constraint_after_a_state_at_the_floor_is_not_applicable():
    # ℓ_1 ≤ 0.9·0 cannot hold: not judged; layer 2 is judged as usual
    ok = feasibility(np.array([0.0, 0.4, 0.3]), 0.1, tolerance=0.0)
    assert ok.feasible and ok.applicable == [True, False, True] and ok.not_applicable == [1]
    bad = feasibility(np.array([0.0, 0.4, 0.39]), 0.1, tolerance=0.0)
    assert not bad.feasible and bad.not_applicable == [1]
    # with a previous loss above the floor the same violation counts
    assert not feasibility(np.array([0.1, 0.4, 0.3]), 0.1, tolerance=0.0).feasible


@pytest.mark.parametrize("code, zero_at_clean", [("dual", True), ("zero", False)])
def test_dust_state_zero_of_each_initial_code(code, zero_at_clean):
    model = DUST(num_layers=2, patch_dim=16, atoms_per_dim=5, initial_code=code, linalg="lapack")
    x = jax.random.uniform(jax.random.key(0), (3, 4, 16))
    params = model.init(jax.random.key(1), x)
    _, states = model.apply(params, x)  # the clean input itself: γ_train = 0
    loss0 = float(jnp.mean((states[0] - x) ** 2))
    if zero_at_clean:
        assert loss0 < 1e-8
    else:  # the paper's blank start: ℓ_0 is the signal's energy, layer 1 can descend from it
        assert np.all(np.asarray(states[0]) == 0.0)
        assert loss0 == pytest.approx(float(jnp.mean(x**2)))
        assert float(jnp.mean((states[1] - x) ** 2)) < 0.9 * loss0


class InertToy(ToyTask):
    """The toy task, whose state 0 is the input: at γ_train = 0 its ℓ_0 is exactly 0."""

    def inert_states(self, cfg, model, gamma_train):
        return {0: "state 0 is the input"} if gamma_train == 0 else {}


TINY = ["--steps", "4", "--chunk-steps", "4", "--num-examples", "16", "--eval-batch-size", "16"]


@pytest.mark.slow
def test_a_job_at_gamma_zero_warns_before_training_and_reports_na(tmp_path):
    printed, warned = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(warned):
        results = toy([*TINY, "--gamma-train", "0", "--seeds", "1"], tmp_path / "g0", InertToy())
    text = printed.getvalue()
    warning = [line for line in warned.getvalue().splitlines() if line.startswith("warning:")]
    assert len(warning) == 1 and "toy-2 constrained at γ_train = 0" in warning[0]
    assert "warning:" not in text  # on stderr, seen when stdout goes to a log
    for run in results["runs"]:
        assert run["not_applicable"] == [1]
        assert run["constraint_applicable_val"] == [True, False, True]
        n = 16 * 2
        assert (run["ratios_excluded"], run["ratios_total"]) == (16, n)
        # 16 ratios kept: a finite mean (an infinite one, l_1 / l_0 with l_0 = 0, is written
        # as null by the JSON writer)
        assert run["mean_ratio"] is not None and run["mean_ratio"] < 1e3
    assert "n/a at l" in text and "excluded: 16 of 32" in text


@pytest.mark.slow
def test_two_seeds_give_intervals_in_the_summary_and_results(tmp_path):
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        results = toy([*TINY, "--gamma-train", "0.3", "--seeds", "2"], tmp_path / "s2")
    intervals = results["intervals"]
    assert [(e["kind"], e["seeds"]) for e in intervals] == [
        ("ERM", [0, 1]),
        ("constrained", [0, 1]),
    ]
    runs = results["runs"]
    con = sorted((r for r in runs if r["constrained"]), key=lambda r: r["seed"])
    erm = sorted((r for r in runs if not r["constrained"]), key=lambda r: r["seed"])
    gi = con[0]["test_gamma"].index(0.3)
    c = intervals[1]
    assert c["method"] == "t" and c["level"] == 0.95
    vals = [r["final_loss"][gi] for r in con]
    got = c["metrics"]["final_loss@γtr"]
    assert got["mean"] == pytest.approx(np.mean(vals))
    # Student-t with 1 degree of freedom: half-width 12.706 · s / √2
    half = 12.7062047 * np.std(vals, ddof=1) / math.sqrt(2)
    assert (got["low"], got["high"]) == pytest.approx((np.mean(vals) - half, np.mean(vals) + half))
    diff = [a["val_objective"] - b["val_objective"] for a, b in zip(con, erm, strict=True)]
    assert c["constrained_minus_erm"]["val_objective"]["mean"] == pytest.approx(np.mean(diff))
    assert intervals[0]["constrained_minus_erm"] == {}
    lines = [line for line in printed.getvalue().splitlines() if "Student-t" in line]
    assert len(lines) == 2 and lines[1].startswith("toy-2 constrained: mean [95% Student-t")
    assert "constrained − ERM, paired by seed: " in lines[1]
    # one seed: no interval lines, no key
    one = toy([*TINY, "--gamma-train", "0.3", "--seeds", "1"], tmp_path / "s1")
    assert "intervals" not in one


def test_a_tables_cell_says_which_constraints_were_not_applicable():
    from experiments.paper.rows import csv_text, setting_rows, table_lines

    def run(constrained, na):
        return {
            "model": "ut", "layers": 3, "constrained": constrained, "seed": 0, "label": "x",
            "gamma_train": 0.0, "test_gamma": [0.0, 0.1], "hparams": {}, "best": True,
            "feasible": True, "loss_decreases_val": True, "diverged": False,
            "val_objective": 0.1, "mean_rmse": 2.0,
            "max_multipliers": [0.0, 1.0], "not_applicable": na, "layer_loss": [[0.0, 1.0]] * 2,
        }  # fmt: skip

    res = {"runs": [run(True, [1]), run(False, [])]}
    rows = setting_rows(
        res, "d", "sub", score="val_objective", higher=False,
        fields=lambda b, i: {"mean_rmse": b["mean_rmse"]},
    )  # fmt: skip
    assert [r["not_applicable"] for r in rows] == ["1", ""]
    (line,) = table_lines(rows, {"d": "D"}, ["d"], [("ut-3", "ut", 3)], [0.0], metric="mean_rmse", higher=False, label_gamma=False)[2:]  # fmt: skip
    assert "2.000 n/a:1" in line and line.count("n/a") == 1
    assert "not_applicable" in csv_text(rows, ["model", "kind", "not_applicable"]).splitlines()[0]


def test_a_sample_with_non_finite_losses_leaves_the_floor_on_the_others_scale():
    # its NaN made every state's mean NaN, and the floor fell to 1e-12: the 1e-9 denominator
    # below was kept, a ratio of 5e8 owning the mean
    losses = np.array([[1.0, 0.5], [1e-9, 0.5], [np.nan, np.nan], [1.0, 0.5]])
    s = descent_stats(losses)
    assert s.floor == pytest.approx(RELATIVE_FLOOR * 0.6666666666666666)
    assert (s.excluded, s.non_finite, s.total) == (1, 1, 4)
    assert s.mean_ratio == pytest.approx(0.5)
