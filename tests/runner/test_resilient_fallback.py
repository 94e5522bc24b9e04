"""The resilient fallback (issue 47): a resilient run's verdict on the relaxed problem its slacks
solved, stored beside the hard one, and the runner's choice of a resilient lane only where no
hard lane is eligible. One real toy run with a hard and a resilient lane (2 seeds) through the
runner; the choice is then re-read from its records with one verdict changed at a time."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import shutil
import types

import numpy as np
import pytest
from helpers import ToyTask, combine_toy_folders, toy

from cudt.runner.choice import choose_points, chosen_lines, compare_chosen, comparison_lines
from cudt.runner.combine import combine
from cudt.runner.record import relaxation

ALPHA = 0.5
NEW_KEYS = ("relaxation", "feasible_relaxed")


@pytest.fixture(scope="module")
def fallback_run(tmp_path_factory):
    """Hard and resilient (α = 0.5) lanes at dual rate 0.1, ERM at two rates, 2 seeds: the hard lane
    misses its constraints at both seeds and the resilient one meets its relaxed ones."""
    out = tmp_path_factory.mktemp("toy") / "fallback"
    argv = ["--dual-lr", "0.1", "--sweep", f"resilience=none,{ALPHA}", "--tune-lr", "1,2"]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        results = toy(argv, out)
    return out, results, printed.getvalue()


def _lanes(runs):
    hard = [r for r in runs if r["constrained"] and r["hparams"]["resilience"] is None]
    res = [r for r in runs if r["constrained"] and r["hparams"]["resilience"] == ALPHA]
    return hard, res


def test_a_resilient_runs_relaxed_verdict_is_its_constraints_against_its_own_slack(fallback_run):
    """``relaxation`` is λ/α (relative dual steps: already in units of ℓ_(l−1)), and
    ``feasible_relaxed`` is g_l ≤ (u_l + tolerance)·ℓ_(l−1) on the stored validation losses,
    recomputed here by hand; ``feasible`` stays the hard verdict; hard and ERM runs have none."""
    _, results, _ = fallback_run
    tol, eps = results["config"]["tolerance"], results["config"]["epsilon"]
    hard, res = _lanes(results["runs"])
    assert len(hard) == len(res) == 2
    for r in results["runs"]:
        if r not in res:
            assert r["relaxation"] is None and r["feasible_relaxed"] is None
    for r in res:
        u = np.asarray(r["multipliers"]) / ALPHA
        np.testing.assert_allclose(r["relaxation"], u, rtol=1e-12)
        m = np.asarray(r["layer_loss_val"])
        rel = (m[1:] - (1 - eps) * m[:-1]) / m[:-1]
        np.testing.assert_allclose(rel, r["relative_violation_val"][1:], atol=1e-6)
        assert r["feasible"] == bool(np.all(rel <= tol))
        assert r["feasible_relaxed"] == bool(np.all(rel <= tol + u[1:]))
    # the run has teeth: the relaxation is what makes the resilient lane feasible
    assert all(r["feasible_relaxed"] and not r["feasible"] for r in res)
    assert max(max(r["relaxation"]) for r in res) > 0.01
    assert not any(r["feasible"] for r in hard)


def test_the_relaxation_in_absolute_units_is_divided_by_the_validation_loss():
    """``--dual-scale absolute``: λ/α is in the loss's units; the verdict's units are
    ℓ_(l−1) (and |C| for the reference); a tail constraint's slack is a ratio already."""
    lam, val, ref = [0.2, 0.04, 0.01], [2.0, 0.5, 0.25], 4.0
    cfg = types.SimpleNamespace(dual_scale="absolute", constraint="mean")
    np.testing.assert_allclose(
        relaxation(cfg, 2.0, lam, val, ref), [0.1 / 4.0, 0.02 / 2.0, 0.005 / 0.5]
    )
    np.testing.assert_allclose(relaxation(cfg, 2.0, lam, val), [0.1, 0.02 / 2.0, 0.005 / 0.5])
    cfg.constraint = "tail"
    np.testing.assert_allclose(relaxation(cfg, 2.0, lam, val, ref), [0.025, 0.02, 0.005])
    cfg.dual_scale = "relative"
    np.testing.assert_allclose(relaxation(cfg, 2.0, lam, val, ref), [0.1, 0.02, 0.005])


def _pick(runs):
    (pick,) = choose_points(runs, "val_objective", higher_is_better=False)
    return pick


def test_the_runner_chose_the_resilient_lane_and_said_so(fallback_run):
    _, results, printed = fallback_run
    hard, res = _lanes(results["runs"])
    picks = {c["kind"]: c for c in results["chosen_points"]}
    pick = picks["constrained"]
    assert pick["resilient"] and pick["eligible"] == 0 and pick["points"] == 2
    assert pick["resilient_points"] == 1 and pick["resilient_eligible"] == 1
    assert pick["hparams"]["resilience"] == ALPHA and pick["seeds"] == [0, 1]
    assert pick["mean"] == pytest.approx(np.mean([r["val_objective"] for r in res]))
    want = np.max([r["relaxation"] for r in res], axis=0)
    np.testing.assert_allclose(pick["relaxation"], want)
    u = ", ".join(f"{x:.3g}" for x in want[1:])
    assert (
        "toy-2 constrained: no hard point eligible (0 of 2: every seed feasible and monotone on "
        "validation, then the lowest mean val_objective); chosen resilient point on validation: "
        f"lr=0.03 resilience={ALPHA:g} (relaxation per layer λ/α of ℓ_(l−1), largest over "
        f"seeds: {u}"
    ) in printed
    # a relaxation as large as ε leaves that layer only monotone: the line says so
    reach = [str(i) for i, x in enumerate(want[1:], 1) if x >= results["config"]["epsilon"]]
    assert (f"at layer {','.join(reach)} it reaches ε = 0.3" in printed) == bool(reach)
    assert "1 of 1 resilient points eligible" in printed
    assert not picks["ERM"]["resilient"]  # ERM has no constraints to relax
    # the lanes: the chosen one drawn as chosen; the paired comparison labelled resilient
    assert all(r["chosen"] for r in res) and not any(r["chosen"] for r in hard)
    (comparison,) = results["chosen_comparison"]
    assert comparison["resilient"] and comparison["feasible_relaxed"] == 2
    assert comparison["feasible"] == 0
    assert f"chosen constrained, resilient (lr=0.03 resilience={ALPHA:g})" in printed
    assert "constrained feasible at 0 of 2 (relaxed: 2 of 2)" in printed
    # the table: the relaxed verdict and the largest relaxation on the resilient rows only
    rows = [line for line in printed.splitlines() if line.startswith("  toy  2 constrained")]
    relaxed = [line for line in rows if line.split()[-3].startswith("relaxed")]
    assert len(rows) == 4 and len(relaxed) == 2
    for r, line in zip(sorted(res, key=lambda r: r["seed"]), relaxed, strict=True):
        assert (
            line.split()[3] == str(r["seed"]) and line.split()[-4] == f"{max(r['relaxation']):.3g}"
        )


def test_a_hard_eligible_lane_always_wins(fallback_run):
    _, results, _ = fallback_run
    runs = copy.deepcopy(results["runs"])
    hard, res = _lanes(runs)
    for r in hard:  # eligible, and worse on validation than the resilient lane
        r.update(feasible=True, loss_decreases_val=True, val_objective=10.0 + r["seed"])
    pick = _pick(runs)
    assert not pick["resilient"] and pick["hparams"]["resilience"] is None
    assert pick["eligible"] == 1 and pick["relaxation"] is None
    assert pick["mean"] == pytest.approx(10.5)
    (line,) = chosen_lines([pick], ["resilience"])
    assert "chosen on validation: resilience=none (val_objective 10.5" in line
    # a resilient lane that meets the hard constraints is a hard point like any other
    for r in hard:
        r["feasible"] = False
    for r in res:
        r["feasible"] = True
    pick = _pick(runs)
    assert not pick["resilient"] and pick["hparams"]["resilience"] == ALPHA


def test_no_point_when_neither_a_hard_nor_a_resilient_lane_is_eligible(fallback_run):
    _, results, _ = fallback_run
    for seed, key in ((1, "feasible_relaxed"), (0, "loss_decreases_val")):
        runs = copy.deepcopy(results["runs"])
        _, res = _lanes(runs)
        next(r for r in res if r["seed"] == seed)[key] = False  # one seed is enough
        pick = _pick(runs)
        assert pick["hparams"] is None and not pick["resilient"]
        assert pick["resilient_points"] == 1 and pick["resilient_eligible"] == 0
        (line,) = chosen_lines([pick], ["resilience"])
        assert "no sweep point chosen: none of 2 is eligible" in line
        assert "nor any of its 1 resilient points on its relaxed constraints" in line
    # without resilient lanes the hint names the flag
    hard, _ = _lanes(results["runs"])
    erm = [r for r in results["runs"] if not r["constrained"]]
    other = [dict(r, hparams=dict(r["hparams"], dual_lr=0.4)) for r in hard]
    (line,) = chosen_lines([_pick(erm + hard + other)], ["dual_lr"])
    assert "resilient constraints (--sweep resilience=none,ALPHA: chosen only where" in line


def test_results_without_the_new_keys_still_load_and_report(fallback_run, tmp_path):
    """results.json written before the fallback (no relaxed verdicts, no ``resilient``):
    combine reads it and chooses no resilient lane (nothing says one met a relaxed problem);
    stored chosen points and comparisons print as before."""
    out, results, _ = fallback_run
    old = tmp_path / "old"
    shutil.copytree(out, old, ignore=shutil.ignore_patterns("checkpoints", "tensorboard"))
    stored = json.loads((old / "results.json").read_text())
    for r in stored["runs"]:
        for k in NEW_KEYS:
            del r[k]
    chosen = [
        {k: v for k, v in c.items() if k not in ("resilient", "relaxation", "resilient_points")}
        for c in stored["chosen_points"]
    ]
    comparisons = [
        {k: v for k, v in c.items() if k not in ("resilient", "feasible_relaxed")}
        for c in stored["chosen_comparison"]
    ]
    (old / "results.json").write_text(json.dumps(stored))
    text = combine(ToyTask(), [old])
    assert "relax u" not in text and "chosen resilient point" not in text
    assert "toy-2 constrained: no sweep point chosen: none of 2 is eligible" in text
    lines = chosen_lines(chosen, ["resilience"])
    # the stored choice, read as a file of that time would: a plain chosen point
    assert any("chosen on validation: resilience=0.5 (" in line for line in lines)
    (line,) = comparison_lines(comparisons, ["resilience"])
    assert "chosen constrained (resilience=0.5)" in line and "relaxed:" not in line
    # and a comparison recomputed from old runs with the stored choice still pairs by seed
    (again,) = compare_chosen(stored["runs"], chosen)
    assert not again["resilient"] and again["feasible_relaxed"] == 0 and again["seeds"] == [0, 1]


def test_per_folder_choices_say_resilient_and_name_each_folders_seed(tmp_path):
    """``combine --per-folder`` over folders whose hard lane misses and whose resilient lane
    meets its relaxed constraints: the comparison says the constrained side is the resilient
    fallback (in how many folders), as one job's summary does, and a metric missing in one
    folder names the folders' seeds it was measured over, not internal pair numbers."""

    def record(constrained, hp, val, feasible=True, relaxed=None):
        return {
            "model": "m", "layers": 2, "gamma_train": 0.0, "constrained": constrained,
            "seed": 5, "label": f"m {constrained} {hp}", "hparams": dict(hp, gamma_train=0.0),
            "val_objective": val, "descent_rate": 0.5, "feasible": feasible,
            "feasible_relaxed": relaxed, "relaxation": None if relaxed is None else [0, 0.1],
            "loss_decreases_val": True, "loss_decreases": True, "diverged": False,
        }  # fmt: skip

    by_folder = []
    for f in range(3):
        runs = [
            record(True, {"dual_lr": 0.1, "resilience": None}, 0.1, False),
            record(True, {"dual_lr": 0.1, "resilience": 0.5}, 0.2 + 0.01 * f, False, True),
            record(False, {"dual_lr": None, "resilience": None}, 0.3 + 0.03 * f),
        ]
        runs[2]["descent_rate"] = None if f == 1 else 0.5 + 0.1 * f  # not finite in folder 1
        by_folder.append(runs)
    config = {"seed": 5, "sweeps": {"resilience": [None, 0.5]}}
    text = combine_toy_folders(tmp_path, by_folder, config)
    (line,) = [x for x in text.splitlines() if x.startswith("m-2: chosen")]
    assert "chosen constrained, resilient in 3 of 3 folders" in line, line
    assert "(relaxed: 3 of 3)" in line, line
    assert "(over seeds data0:5, data2:5)" in line, line
