"""What a run reports: the summary table and the intervals over seeds.

:func:`cudt.runner.record.summarise` evaluates a trained group and turns each run into its
``results.json`` record; :func:`seed_intervals` gives each setting's Student-t intervals over
seeds; :mod:`cudt.runner.choice` picks the best run and the sweep point chosen on validation;
:func:`summary_table` is the fixed-width table every experiment prints, with their lines.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from cudt.runner.choice import (
    NO_FINITE_INTERVAL,
    chosen_lines,
    comparison_lines,
    draw_text,
    finite_interval,
    one_draw,
    over_seeds,
)
from cudt.runner.hparams import CONSTRAINT_ONLY
from cudt.runner.record import KINDS, RUNNER_METRICS, run_metric
from cudt.stats import level_mark

__all__ = [
    "Column",
    "format_table",
    "interval_lines",
    "seed_intervals",
    "status_cell",
    "summary_table",
]


def _setting_key(run: dict, keep=lambda name: True) -> tuple:
    hp = tuple(sorted((k, v) for k, v in run["hparams"].items() if keep(k)))
    return (run["model"], run["layers"], hp)


def seed_intervals(
    runs: list[dict], level: float = 0.95, *, data_draw: int | None = None
) -> list[dict]:
    """One entry per model × kind × sweep point with at least two seeds (diverged runs left
    out, their seeds in ``diverged_seeds``): the mean and Student-t interval over seeds of
    every reported metric, and for a constrained setting, of constrained − ERM paired by seed
    (the ERM runs of the same model, L and non-constraint hyperparameters). ``data_draw``: the
    one draw of the data every run read (``--data-seed``; None where each seed drew its own),
    recorded (``data_draw``)."""
    groups: dict[tuple, list[dict]] = {}
    diverged: dict[tuple, list[int]] = {}  # left out, and named on the setting's line
    for r in runs:
        key = (r["constrained"], *_setting_key(r))
        if r.get("diverged"):
            diverged.setdefault(key, []).append(int(r["seed"]))
        else:
            groups.setdefault(key, []).append(r)
    erm_by: dict[tuple, dict[int, dict]] = {}
    for r in runs:
        if not r["constrained"] and not r.get("diverged"):
            key = _setting_key(r, lambda k: k not in CONSTRAINT_ONLY)
            erm_by.setdefault(key, {})[int(r["seed"])] = r
    out = []
    for (constrained, model, layers, hp), rs in groups.items():
        left_out = sorted(diverged.get((constrained, model, layers, hp), []))
        seeds = sorted({int(r["seed"]) for r in rs})
        if len(seeds) < 2 or len(seeds) != len(rs):
            continue
        rs = sorted(rs, key=lambda r: int(r["seed"]))
        names = list(dict.fromkeys(rs[0].get("interval_metrics", []) + list(RUNNER_METRICS)))

        def values(items, name):
            return [run_metric(r, name) for r in items]

        # each over the seeds where it is finite, which it then names (as compare_chosen's)
        metrics = {}
        for name in names:
            iv, _ = finite_interval(seeds, values(rs, name), level=level)
            if iv is not None:
                metrics[name] = iv
        minus_erm = {}
        partners = erm_by.get(_setting_key(rs[0], lambda k: k not in CONSTRAINT_ONLY), {})
        # paired over the seeds both kinds trained without diverging; the others are named
        paired = [r for r in rs if int(r["seed"]) in partners]
        if constrained and len(paired) >= 2:
            erm = [partners[int(r["seed"])] for r in paired]
            on = [int(r["seed"]) for r in paired]
            for name in names:
                iv, _ = finite_interval(on, values(paired, name), values(erm, name), level)
                if iv is not None:
                    minus_erm[name] = iv
        out.append(
            {
                "model": model,
                "layers": layers,
                "kind": KINDS[constrained],
                "constrained": constrained,
                "gamma_train": rs[0].get("gamma_train"),
                "hparams": dict(hp),
                "seeds": seeds,
                **one_draw(seeds, data_draw),
                **({"diverged_seeds": left_out} if left_out else {}),
                "method": "t",
                "level": level,
                "metrics": metrics,
                "constrained_minus_erm": minus_erm,
                # the seeds the difference is over, where ERM has fewer
                **(
                    {"paired_seeds": [int(r["seed"]) for r in paired]}
                    if minus_erm and paired != rs
                    else {}
                ),
            }
        )
    return out


def _value(v) -> str:
    """A swept value as the lines print it: a number in ``g`` form, anything else (an ε
    schedule's ``linear:0@1``, a reference) as it is spelled."""
    return f"{v:g}" if isinstance(v, int | float) and not isinstance(v, bool) else str(v)


def interval_lines(intervals: list[dict], swept: Sequence[str] = ()) -> list[str]:
    """The summary's lines: one per model × kind (× sweep point), ``name mean [low, high]``; a
    constrained − ERM difference whose interval spans 0 is marked ``level``, as the chosen
    runs' comparison lines mark theirs (:func:`cudt.runner.choice.comparison_lines`)."""

    def cell(name, iv, difference=False):
        if iv["low"] is None:
            return f"{name} {iv['mean']:.4g}" + over_seeds(iv)
        text = f"{name} {iv['mean']:.4g} [{iv['low']:.4g}, {iv['high']:.4g}]"
        level = level_mark(iv) if difference else ""
        return text + level + over_seeds(iv)  # not finite at the others

    lines = []
    for e in intervals:
        point = " ".join(
            f"{n}={_value(e['hparams'][n])}" for n in swept if e["hparams"].get(n) is not None
        )
        head = f"{e['model']}-{e['layers']} {e['kind']}" + (f" {point}" if point else "")
        pct = f"{100 * e['level']:g}%"
        gone = e.get("diverged_seeds") or []  # results.json before the record: not said
        left_out = (
            f" ({'seed' if len(gone) == 1 else 'seeds'} {','.join(map(str, gone))} diverged: "
            "left out)"
            if gone
            else ""
        )
        line = (
            f"{head}: mean [{pct} Student-t interval] over {len(e['seeds'])} seeds"
            f"{draw_text(e)}{left_out}: "
            + ("; ".join(cell(n, iv) for n, iv in e["metrics"].items()) or NO_FINITE_INTERVAL)
        )
        if e["constrained_minus_erm"]:
            over = e.get("paired_seeds")
            line += (
                " | constrained − ERM, paired by seed"
                + (
                    f" (seeds {', '.join(map(str, over))}: no ERM run at the others, diverged "
                    "or not trained)"
                    if over
                    else ""
                )
                + ": "
                + "; ".join(cell(n, iv, True) for n, iv in e["constrained_minus_erm"].items())
            )
        lines.append(line)
    return lines


@dataclasses.dataclass(frozen=True)
class Column:
    header: str
    width: int
    cell: Callable[[dict], str]


def format_table(runs: Iterable[dict], columns: Sequence[Column]) -> str:
    """A fixed-width text table, one row per run."""
    head = " ".join(f"{c.header:>{c.width}}" for c in columns)
    lines = [head, "-" * len(head)]
    for run in runs:
        lines.append(" ".join(f"{c.cell(run):>{c.width}}" for c in columns))
    return "\n".join(lines)


def status_cell(run: dict) -> str:
    """``DIVERGED`` / ``yes`` / ``NO`` (feasibility), ``relaxed`` for a resilient run that
    misses the hard constraints but meets its relaxed ones, ``*`` for the best run of its
    group."""
    if run.get("diverged"):
        return "DIVERGED"
    verdict = "yes" if run.get("feasible") else "relaxed" if run.get("feasible_relaxed") else "NO"
    return verdict + ("*" if run.get("best") else " ")


def _ratio(x, pct: bool = False) -> str:
    if x is None or not np.isfinite(x):
        return "n/a"  # every ratio excluded (all denominators at the floor)
    return f"{100 * x:.1f}%" if pct else f"{x:.3f}"


def _erm_epsilon_note(runs: list[dict]) -> list[str]:
    """Per model × L whose constrained runs' ε are not the one its ERM's feasibility is judged
    at (a sweep of ε, or another ε than the model's), the line that says so; none for
    results.json before ``judged_epsilon``."""
    by: dict[tuple, tuple[set, set]] = {}
    for r in runs:
        sets = by.setdefault((r["model"], r["layers"]), (set(), set()))
        if r.get("judged_epsilon") is not None:
            sets[bool(r["constrained"])].add(r["judged_epsilon"])

    def text(values):
        return ", ".join(f"{e:g}" for e in sorted(values))

    return [
        f"{model}-{layers} ERM's feasible: its descent constraints at ε {text(erm)} (the "
        f"model's; its constrained runs' ε: {text(lanes)}); the chosen comparison counts ERM at "
        "the chosen point's constraints"
        for (model, layers), (erm, lanes) in by.items()
        if erm and lanes and erm != lanes
    ]


def summary_table(
    task, runs: list[dict], swept: list[str], intervals=None, chosen=None, comparisons=None
) -> str:
    width = max([5] + [len(r["model"]) for r in runs])
    columns = [
        Column("model", width, lambda r: r["model"]),
        Column("L", 2, lambda r: str(r["layers"])),
        Column("kind", 11, lambda r: KINDS[r["constrained"]]),
        Column("seed", 4, lambda r: str(r["seed"])),
    ]
    for name in swept:
        columns.append(
            Column(
                name,
                max(8, len(name)),
                lambda r, n=name: (
                    "-"
                    if r["hparams"][n] is None
                    else f"{r['hparams'][n]:.3g}"
                    if isinstance(r["hparams"][n], float)
                    else str(r["hparams"][n])
                ),
            )
        )
    columns += task.metric_columns()
    columns += [
        Column("descent", 8, lambda r: _ratio(r["descent_rate"], pct=True)),
        Column("mean r", 7, lambda r: _ratio(r["mean_ratio"])),
        Column("med r", 7, lambda r: _ratio(r["median_ratio"])),
    ]
    columns += task.after_columns()
    if any(r.get("not_applicable") for r in runs):
        columns.append(
            Column(
                "n/a at l",
                8,
                lambda r: ",".join(map(str, r.get("not_applicable") or [])) or "-",
            )
        )
    resilient = any(r.get("relaxation") is not None for r in runs)
    if resilient:
        columns.append(
            Column(
                "relax u",
                8,
                lambda r: "-" if r.get("relaxation") is None else f"{max(r['relaxation']):.3g}",
            )
        )
    columns += [
        Column("feasible", 9, status_cell),
        Column("max λ", 8, lambda r: f"{max(r['multipliers']):.3g}"),
        Column("peak λ", 8, lambda r: f"{max(r['max_multipliers']):.3g}"),
    ]
    table = format_table(runs, columns)
    notes = []
    if any(r.get("not_applicable") for r in runs):
        notes.append(
            "n/a at l: the descent constraint of layer l asks ℓ_l ≤ (1 − ε)·ℓ_{l−1} with the "
            "mean validation ℓ_{l−1} at the floor (infeasible by construction): not applicable, "
            "left out of the feasibility and monotone verdicts"
        )
    # rounded: ε + margin − ε is the margin only to float precision (0.05 + 0.02 − 0.05 is
    # 0.020000000000000004, 0.1 + 0.02 − 0.1 is 0.01999999999999999): one margin, said once
    margins = sorted(
        {
            round(r["trained_epsilon"] - r["hparams"]["epsilon"], 12)
            for r in runs
            if r.get("trained_epsilon") is not None
        }
    )
    if margins:
        notes.append(
            f"--epsilon-margin {', '.join(f'{m:.3g}' for m in margins)}: the constrained runs "
            "trained at epsilon + margin; epsilon, feasible and the choices are at epsilon"
        )
    notes += _erm_epsilon_note(runs)
    if resilient:
        notes.append(
            "relax u: a resilient run's largest relaxation λ/α at the end of training, in units "
            "of ℓ_(l−1) (-: hard); feasible 'relaxed': it misses the hard constraints on "
            "validation but meets them with ε relaxed by its own λ/α (the resilient problem), "
            "within the same tolerance"
        )
    for r in runs:
        if r.get("ratios_excluded"):
            # a record from before ratios_non_finite counted the floor's alone
            non_finite = r.get("ratios_non_finite") or 0
            below = r["ratios_excluded"] - non_finite
            why = [f"denominator ℓ_(l−1) below {r['ratio_floor']:.3g}"] if below else []
            why += [f"{non_finite} with a non-finite loss"] if non_finite else []
            notes.append(
                f"{r['label']}: per-sample ratios excluded: {r['ratios_excluded']} of "
                f"{r['ratios_total']} ({'; '.join(why)}); descent and mean/median r are over "
                "the rest"
            )
    notes += interval_lines(intervals or [], swept)
    notes += chosen_lines(chosen or [], swept)
    notes += comparison_lines(comparisons or [], swept)
    footer = task.table_footer(runs)
    return "\n".join([table, *notes] + ([footer] if footer else []))
