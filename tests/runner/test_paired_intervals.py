"""Constrained − ERM intervals where a seed is missing or not finite on one side: paired over the
seeds both sides have, and the line says which (``cudt.runner.choice.compare_chosen`` and
``cudt.runner.report.seed_intervals``, over run records in results.json's form)."""

from __future__ import annotations

import numpy as np
from scipy import stats

from cudt.runner.choice import compare_chosen, comparison_lines
from cudt.runner.report import interval_lines, seed_intervals

SEEDS = (0, 1, 2, 3)
RNG = np.random.default_rng(1)
CON, ERM = RNG.normal(size=4), RNG.normal(size=4)


def _run(constrained: bool, seed: int, acc: float) -> dict:
    hparams = {"lr": 1e-3, "epsilon": 0.1 if constrained else None}
    return {
        "label": f"m-2 {'constrained' if constrained else 'ERM'} seed {seed}",
        "model": "m",
        "layers": 2,
        "gamma_train": 0.0,
        "constrained": constrained,
        "seed": seed,
        "hparams": hparams,
        "interval_metrics": ["acc"],
        "acc": acc,
        "diverged": False,
        "feasible": True,
        "loss_decreases": True,
    }


def _runs() -> list[dict]:
    return [_run(True, s, CON[s]) for s in SEEDS] + [_run(False, s, ERM[s]) for s in SEEDS]


def _chosen(runs) -> list[dict]:
    where = {"model": "m", "layers": 2, "gamma_train": 0.0}
    con = next(r for r in runs if r["constrained"])["hparams"]
    erm = next(r for r in runs if not r["constrained"])["hparams"]
    return [
        {**where, "kind": "constrained", "hparams": con},
        {**where, "kind": "ERM", "hparams": erm},
    ]


def _t(diff: np.ndarray) -> tuple[float, float]:
    return stats.t.interval(0.95, len(diff) - 1, loc=diff.mean(), scale=stats.sem(diff))


def test_a_constrained_seed_that_is_not_finite_leaves_the_others_paired_and_named():
    runs = _runs()
    next(r for r in runs if r["constrained"] and r["seed"] == 3)["acc"] = float("nan")
    (c,) = compare_chosen(runs, _chosen(runs))
    iv = c["constrained_minus_erm"]["acc"]
    assert iv["seeds"] == [0, 1, 2]
    assert np.allclose([iv["low"], iv["high"]], _t(CON[:3] - ERM[:3]))
    (line,) = comparison_lines([c])
    assert "paired t over 4 seeds: acc" in line and "(over seeds 0, 1, 2)" in line, line
    # the monotone counts read test losses (loss_decreases), and say so, ERM's as well
    assert "monotone (test) at 4 of 4; ERM monotone (test) at 4 of 4" in line, line
    # before: every metric dropped, and the line said "no interval with one seed"
    assert "one seed" not in line


def test_a_diverged_seed_with_finite_numbers_is_left_out_of_the_chosen_comparison():
    """A diverged run is evaluated at its last finite state, so its numbers are finite; the
    comparison of chosen points (combine --point: not filtered by eligibility) left it in."""
    for constrained in (True, False):
        runs = _runs()
        next(r for r in runs if r["constrained"] is constrained and r["seed"] == 3)["diverged"] = (
            True
        )
        (c,) = compare_chosen(runs, _chosen(runs))
        iv = c["constrained_minus_erm"]["acc"]
        assert iv["seeds"] == [0, 1, 2] and iv["n"] == 3
        assert np.allclose([iv["low"], iv["high"]], _t(CON[:3] - ERM[:3]))


def test_one_finite_seed_of_several_says_so_not_one_seed():
    runs = _runs()
    for r in runs:
        if r["constrained"] and r["seed"] > 0:
            r["acc"] = float("nan")
    (line,) = comparison_lines(compare_chosen(runs, _chosen(runs)))
    assert "no interval: no metric is finite at two of its seeds" in line, line


def test_a_per_gamma_metric_read_back_as_null_is_left_out_not_a_crash():
    """results.json writes NaN as null, inside a per-γ list too (a diverged ERM run's
    ``acc`` at γ_train): ``acc@γtr`` reads it as NaN, as a scalar's null is read, and the
    chosen comparison pairs the other seeds (it raised TypeError: float() of None)."""
    runs = _runs()
    for r in runs:  # γ_train 0, the first of the test γs
        r |= {"test_gamma": [0.0, 1.0], "acc": [r["acc"], 0.5], "interval_metrics": ["acc@γtr"]}
    erm = next(r for r in runs if not r["constrained"] and r["seed"] == 3)
    erm |= {"diverged": True, "acc": [None, 0.5]}
    (c,) = compare_chosen(runs, _chosen(runs))
    iv = c["constrained_minus_erm"]["acc@γtr"]
    assert iv["seeds"] == [0, 1, 2]
    assert np.allclose([iv["low"], iv["high"]], _t(CON[:3] - ERM[:3]))


def test_an_erm_seed_that_diverged_leaves_the_difference_over_the_others_named():
    runs = _runs()
    next(r for r in runs if not r["constrained"] and r["seed"] == 3)["diverged"] = True
    (con,) = [e for e in seed_intervals(runs) if e["constrained"]]
    assert con["paired_seeds"] == [0, 1, 2] and con["seeds"] == list(SEEDS)
    low, high = _t(CON[:3] - ERM[:3])
    iv = con["constrained_minus_erm"]["acc"]
    assert np.isclose(iv["low"], low) and np.isclose(iv["high"], high)
    line = next(x for x in interval_lines([con]))
    assert "paired by seed (seeds 0, 1, 2: no ERM run at the others" in line, line
    # every seed on both sides: the line as before, no seeds named
    (whole,) = [e for e in seed_intervals(_runs()) if e["constrained"]]
    assert "paired_seeds" not in whole
    assert "constrained − ERM, paired by seed: acc" in interval_lines([whole])[0]


def test_a_constrained_seed_that_diverged_is_named_on_its_line_not_dropped_in_silence():
    """A setting's interval over the seeds that did not diverge says which seed it left out: it
    read "over 3 seeds: acc ..." of a four-seed job, the interval of the survivors alone."""
    runs = _runs()
    next(r for r in runs if r["constrained"] and r["seed"] == 2)["diverged"] = True
    (con,) = [e for e in seed_intervals(runs) if e["constrained"]]
    assert con["seeds"] == [0, 1, 3] and con["diverged_seeds"] == [2]
    assert np.isclose(con["metrics"]["acc"]["low"], _t(CON[[0, 1, 3]])[0])
    line = interval_lines([con])[0]
    assert "over 3 seeds (seed 2 diverged: left out): acc" in line, line
    (erm,) = [e for e in seed_intervals(runs) if not e["constrained"]]
    assert "diverged_seeds" not in erm
    assert "over 4 seeds: acc" in interval_lines([erm])[0]


def test_a_metric_not_finite_at_one_seed_keeps_its_interval_over_the_others_named():
    """A setting's interval line, as the chosen comparison's: a metric not finite at one
    surviving seed is the interval over the others, which the line names (it vanished from
    the line in silence, the paired difference with it, where compare_chosen named them)."""
    runs = _runs()
    next(r for r in runs if r["constrained"] and r["seed"] == 3)["acc"] = float("nan")
    (con,) = [e for e in seed_intervals(runs) if e["constrained"]]
    iv, diff = con["metrics"]["acc"], con["constrained_minus_erm"]["acc"]
    assert iv["seeds"] == diff["seeds"] == [0, 1, 2] and iv["n"] == 3
    assert np.allclose([iv["low"], iv["high"]], _t(CON[:3]))
    assert np.allclose([diff["low"], diff["high"]], _t(CON[:3] - ERM[:3]))
    line = interval_lines([con])[0]
    assert "over 4 seeds: acc 0.4992 [-0.1946, 1.193] (over seeds 0, 1, 2)" in line, line
    assert "paired by seed: acc 0.2276 [-1.573, 2.028] level (over seeds 0, 1, 2)" in line, line
    # the chosen comparison says it the same way
    (compared,) = comparison_lines(compare_chosen(runs, _chosen(runs)))
    assert "level (over seeds 0, 1, 2)" in compared
    # finite at one seed alone: no interval, and the line says so as the comparison's does
    for r in runs:
        if r["constrained"] and r["seed"] > 0:
            r["acc"] = float("nan")
    (con,) = [e for e in seed_intervals(runs) if e["constrained"]]
    assert con["metrics"] == {} and con["constrained_minus_erm"] == {}
    assert interval_lines([con])[0].endswith(
        "over 4 seeds: no interval: no metric is finite at two of its seeds"
    )
    # every seed finite: no seeds named
    (whole,) = [e for e in seed_intervals(_runs()) if e["constrained"]]
    assert "seeds" not in whole["metrics"]["acc"]
    assert "(over seeds" not in interval_lines([whole])[0]


def test_a_difference_whose_interval_spans_zero_is_marked_level():
    """The per-point interval lines mark a constrained − ERM interval that spans 0 ``level``,
    as the chosen runs' comparison lines do; one that excludes 0 is not marked."""
    runs = _runs()
    (con,) = [e for e in seed_intervals(runs) if e["constrained"]]
    iv = con["constrained_minus_erm"]["acc"]
    spans = iv["low"] <= 0 <= iv["high"]
    paired = interval_lines([con])[0].split("paired by seed: ")[1]
    assert paired.endswith(" level") == spans, paired
    for r in runs:  # constrained ahead by 5 at every seed, give or take a little
        if r["constrained"]:
            r["acc"] = (
                5.0
                + 0.01 * r["seed"]
                + next(
                    x["acc"]
                    for x in _runs()
                    if x["label"] == r["label"].replace("constrained", "ERM")
                )
            )
    (con,) = [e for e in seed_intervals(runs) if e["constrained"]]
    paired = interval_lines([con])[0].split("paired by seed: ")[1]
    assert paired.startswith("acc 5.0") and not paired.endswith("level"), paired
    for r in runs:  # and level where the sign flips from seed to seed
        if r["constrained"]:
            r["acc"] += -10.0 if r["seed"] % 2 else 0.0
    (con,) = [e for e in seed_intervals(runs) if e["constrained"]]
    assert interval_lines([con])[0].endswith(" level")


def test_interval_lines_name_every_swept_value_text_ones_too():
    """Two ε schedules of one sweep: each line names its own (a text value was left out of the
    line's name, so the two lines read the same, found by review)."""
    runs = _runs()
    lanes = []
    for schedule in ("constant", "linear:0@1"):
        for r in runs:
            lane = {**r, "hparams": {**r["hparams"], "epsilon_schedule": schedule}}
            lane["label"] += f" sched={schedule}"
            lanes.append(lane)
    lines = interval_lines(seed_intervals(lanes), ["epsilon", "epsilon_schedule"])
    heads = [line.split(": mean")[0] for line in lines]
    assert len(set(heads)) == len(heads) == 4, heads
    assert "m-2 constrained epsilon=0.1 epsilon_schedule=linear:0@1" in heads, heads
    assert "m-2 ERM epsilon_schedule=constant" in heads, heads


def test_erm_is_judged_at_the_chosen_points_own_constraints_in_the_comparison():
    """An ERM run's ``feasible`` is judged at the model's ε; the comparison judges it at the
    chosen constrained point's ε and its seed's reference bound (a sweep of ε chose 0.02 where
    the model's ε 0.1 read every ERM run infeasible)."""
    runs = _runs()
    for r in runs:
        if r["constrained"]:
            r["hparams"]["epsilon"] = 0.02
            # seed 3's bound is below ERM's first state's loss: it misses that constraint
            r["reference_bound"] = 0.9 if r["seed"] == 3 else 2.0
        else:
            r["layer_loss_val"] = [1.0, 0.97, 0.95]  # ratios 0.97, 0.979: inside ε 0.02 only
            r["feasible"] = False  # as judged at ε 0.1
    (c,) = compare_chosen(runs, _chosen(runs), tolerance=0.01)
    assert c["erm_feasible"] == 3
    # a diverged ERM run (results.json writes its NaN losses as null) meets nothing
    erm0 = next(r for r in runs if not r["constrained"] and r["seed"] == 0)
    erm0 |= {"diverged": True, "layer_loss_val": [1.0, None, None]}
    (c,) = compare_chosen(runs, _chosen(runs), tolerance=0.01)
    assert c["erm_feasible"] == 2
    erm0 |= {"diverged": False, "layer_loss_val": [1.0, 0.97, 0.95]}
    (c,) = compare_chosen(runs, _chosen(runs), tolerance=0.01)
    (line,) = comparison_lines([c])
    assert "constrained feasible at 4 of 4, ERM at 3 of 4 (the same constraints)" in line, line
    # at ε 0.1 the same ERM runs miss the first descent constraint (0.97 > 0.9 + 1 %)
    for r in runs:
        if r["constrained"]:
            r["hparams"]["epsilon"] = 0.1
    (c,) = compare_chosen(runs, _chosen(runs), tolerance=0.01)
    assert c["erm_feasible"] == 0
    # a comparison stored before the count (results.json re-rendered by the pages): as it was
    (c,) = compare_chosen(runs, _chosen(runs))
    assert c["erm_feasible"] is None
    (line,) = comparison_lines([c])
    assert "ERM at" not in line and "constrained feasible at 4 of 4, monotone" in line, line


def test_the_erm_epsilon_note_is_per_model_where_two_models_swap_their_epsilons():
    """ERM's feasible column is judged at the model's ε: a note names it per model × L wherever
    that model's constrained runs trained other ε. Pooled over models, ε {0.02, 0.05} on both
    sides hid it (found by review: the text task's UT at 0.02 beside an encoder at 0.05)."""
    from cudt.runner.report import _erm_epsilon_note

    def run(model, constrained, eps):
        return {"model": model, "layers": 3, "constrained": constrained, "judged_epsilon": eps}

    runs = [run("ut", False, 0.02), run("ut", True, 0.02), run("ut", True, 0.05)]
    runs += [run("bert", False, 0.05), run("bert", True, 0.02), run("bert", True, 0.05)]
    notes = _erm_epsilon_note(runs)
    assert [n.split(" ERM's")[0] for n in notes] == ["ut-3", "bert-3"]
    assert "at ε 0.02 (the model's; its constrained runs' ε: 0.02, 0.05)" in notes[0]
    assert _erm_epsilon_note([r for r in runs if r["judged_epsilon"] == 0.05]) == []
    assert _erm_epsilon_note([{**r, "judged_epsilon": None} for r in runs]) == []


def test_a_seed_trained_by_one_side_only_is_named_as_left_out():
    """Folders of one kind joined by combine: constrained at seeds 0-3, ERM at 0-2. The
    interval pairs seeds 0-2 and the line names seed 3 as left out (it said only "over 3")."""
    runs = [r for r in _runs() if r["constrained"] or r["seed"] < 3]
    (c,) = compare_chosen(runs, _chosen(runs))
    assert c["seeds"] == [0, 1, 2] and c["unpaired"] == [3]
    (line,) = comparison_lines([c])
    assert "paired t over 3 seeds (seed 3 left out: one side only): acc" in line, line
    (every,) = comparison_lines(compare_chosen(_runs(), _chosen(_runs())))
    assert "left out" not in every


def test_the_chosen_comparison_over_seeds_on_one_draw_says_so():
    """Seeds on one draw of the data (--data-seed): the paired comparison over them measures the
    initialisation and the batch order, and its line says so, as the interval lines do."""
    runs = _runs()
    (c,) = compare_chosen(runs, _chosen(runs), data_draw=0)
    assert c["data_draw"] == 0
    (line,) = comparison_lines([c])
    assert "paired t over 4 seeds on one data draw (data seed 0): acc" in line, line
    (own,) = comparison_lines(compare_chosen(runs, _chosen(runs)))
    assert "paired t over 4 seeds: acc" in own, own
