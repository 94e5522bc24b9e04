"""The dual study's report: one row per run, one summary per (setting, combination), the
Markdown (``study.md``), the CSV (``study.csv``) and three figures.

A run **succeeds** when it did not diverge, is feasible on validation data (the runner's
verdict, within the task's tolerance) and its mean validation loss at γ_train decreases at every
layer (the runner's ``loss_decreases_val``; a step from a state at the loss floor is not
judged). The combination with the most successes is the best; ties go to the lower mean
validation loss at γ_train (``val_objective``). The test split only reports: the ID change is
the run's in-distribution test metric against the setting's ERM run of the same seed (RMSE at
γ_train for video, accuracy at γ_train for text), in percent, positive = worse; the OOD metric
is the mean of that metric over the test levels above γ_train. No test number reaches a
success, a verdict or a choice (tests/runner/test_validation_only.py).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cudt.metrics import feasibility
from experiments.paper.dual_study.settings import SETTINGS
from experiments.paper.rows import csv_text, fmt, num, peak, write_text

__all__ = ["baseline", "best", "collect", "run_rows", "summarise", "write_report"]


def baseline(setting: str) -> tuple[str, str, str]:
    """Plain projected ascent of a setting, what the issue compares every dynamic with: the
    Lagrangian, the setting's own dual optimiser (SGD for video, Adam for text), simultaneous."""
    return ("lagrangian", SETTINGS[setting].plain, "simultaneous")


CSV_COLUMNS = (
    "setting",
    "formulation",
    "dual_optimizer",
    "update",
    "schedule",
    "swept",
    "factor",
    "value",
    "seed",
    "ok",
    "feasible",
    "monotone",
    "diverged",
    "val_objective",
    "descent_rate",
    "mean_ratio",
    "median_ratio",
    "id_metric",
    "id",
    "erm_id",
    "id_change_pct",
    "ood",
    "erm_ood",
    "peak_lambda",
    "final_lambda",
    "feasible_from",
)


def _metric(run: dict, name: str) -> tuple[float, float]:
    """(ID at γ_train, OOD: mean over the test γ above it; NaN if there are none). A value not
    finite (null in results.json: a diverged run scored at its last finite state, say) is NaN,
    which the summaries leave out."""
    values = [num(v) for v in run[name]]
    gammas = run["test_gamma"]
    gi = gammas.index(run["gamma_train"])
    above = [v for g, v in zip(gammas, values, strict=True) if g > run["gamma_train"]]
    return values[gi], float(np.mean(above)) if above else math.nan


def _change_pct(value: float, erm: float, higher_is_better: bool) -> float:
    if not (math.isfinite(value) and math.isfinite(erm)) or erm == 0:
        return math.nan
    return 100 * ((1 - value / erm) if higher_is_better else (value / erm - 1))


def feasible_from(run: dict, tolerance: float | None) -> float:
    """The first logged training step from which the run's training batches meet its descent
    constraints at its own (final) ε within ``tolerance``, at every later logged step too
    (:func:`cudt.metrics.feasibility` of each logged step's mean layer losses); NaN if the last
    one does not (or without a ``tolerance``). Training batches, not validation: how soon, not
    whether (the verdict)."""
    if tolerance is None:
        return math.nan
    curves = run.get("curves") or {}
    steps, losses = curves.get("step") or [], curves.get("layer_loss") or []
    epsilon = run["hparams"]["epsilon"]
    ok = [
        feasibility(np.asarray(ell, np.float64), epsilon, None, tolerance).feasible
        for ell in losses
    ]
    first = math.nan
    for step, good in zip(reversed(steps), reversed(ok), strict=True):
        if not good:
            break
        first = float(step)
    return first


def run_rows(setting, combo, results: dict, erm: dict) -> list[dict]:
    """One row per constrained run of a combination's results, with its ERM reference."""
    metric = setting.id_metric
    higher = metric == "accuracy"
    # a diverged ERM run is scored at its last finite state: no reference (its seed's ID
    # change is left out, and the cell says so)
    erm_by_seed = {
        r["seed"]: r for r in erm["runs"] if not r["constrained"] and not r.get("diverged")
    }
    tolerance = results.get("config", {}).get("tolerance")
    rows = []
    for run in results["runs"]:
        if not run["constrained"]:
            continue
        value = run["hparams"][combo.swept]
        base = setting.base_rate(combo)
        id_, ood = _metric(run, metric)
        ref = erm_by_seed.get(run["seed"])
        erm_id, erm_ood = _metric(ref, metric) if ref else (math.nan, math.nan)
        diverged = bool(run.get("diverged"))
        feasible = bool(run.get("feasible")) and not diverged
        monotone = bool(run.get("loss_decreases_val")) and not diverged  # validation only
        rows.append(
            {
                "setting": setting.name,
                "combo": combo,
                "formulation": combo.formulation,
                "dual_optimizer": combo.dual_optimizer,
                "update": combo.update,
                "schedule": combo.schedule,
                "swept": combo.swept,
                "factor": float(f"{value / base:.4g}"),
                "value": value,
                "seed": run["seed"],
                "ok": feasible and monotone,
                "feasible": feasible,
                "monotone": monotone,
                "diverged": diverged,
                "val_objective": num(run.get("val_objective")),
                "descent_rate": run["descent_rate"],
                "mean_ratio": run["mean_ratio"],
                "median_ratio": run["median_ratio"],
                "id_metric": metric,
                "id": id_,
                "erm_id": erm_id,
                "id_change_pct": _change_pct(id_, erm_id, higher),
                "ood": ood,
                "erm_ood": erm_ood,
                "peak_lambda": peak(run.get("max_multipliers") or []),
                "final_lambda": peak(run.get("multipliers") or []),
                "feasible_from": feasible_from(run, tolerance),
                "curves": run.get("curves"),
            }
        )
    return rows


def _median(values) -> float:
    vals = [v for v in values if math.isfinite(v)]
    return float(statistics.median(vals)) if vals else math.nan


def _mean(values) -> float:
    vals = [v for v in values if isinstance(v, int | float) and math.isfinite(v)]
    return float(np.mean(vals)) if vals else math.nan


def summarise(rows: list[dict]) -> list[dict]:
    """One summary per (setting, combination), in the order of ``rows``."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["setting"], r["combo"]), []).append(r)
    out = []
    for (setting, combo), rs in groups.items():
        factors = sorted({r["factor"] for r in rs})
        by_factor = {f: [r for r in rs if r["factor"] == f] for f in factors}
        out.append(
            {
                "setting": setting,
                "combo": combo,
                "runs": len(rs),
                "ok": sum(r["ok"] for r in rs),
                "failed": sum((not r["feasible"]) or r["diverged"] for r in rs),
                "diverged": sum(r["diverged"] for r in rs),
                "by_factor": {f: (sum(r["ok"] for r in g), len(g)) for f, g in by_factor.items()},
                "descent_rate": _mean(r["descent_rate"] for r in rs if not r["diverged"]),
                "mean_ratio": _mean(r["mean_ratio"] for r in rs if not r["diverged"]),
                "id_change_pct": _mean(r["id_change_pct"] for r in rs if not r["diverged"]),
                "id_change_runs": sum(
                    math.isfinite(r["id_change_pct"]) and not r["diverged"] for r in rs
                ),
                "ood": _mean(r["ood"] for r in rs if not r["diverged"]),
                "val_objective": _mean(r["val_objective"] for r in rs if not r["diverged"]),
                "peak_lambda": statistics.median([r["peak_lambda"] for r in rs]),
                "feasible_from": _median(r["feasible_from"] for r in rs if not r["diverged"]),
                "feasible_by_end": sum(math.isfinite(r["feasible_from"]) for r in rs),
                "baseline": (combo.formulation, combo.dual_optimizer, combo.update)
                == baseline(setting),
            }
        )
    return out


def best(summaries: Sequence[dict]) -> dict | None:
    """The combination with the most successful runs; ties: the lower mean validation loss at
    γ_train (validation only: no test number decides)."""
    if not summaries:
        return None

    def val(s):
        v = s.get("val_objective", math.nan)
        return v if math.isfinite(v) else math.inf

    return min(summaries, key=lambda s: (-s["ok"] / s["runs"], val(s)))


def _pct(x: float) -> str:
    return "n/a" if not math.isfinite(x) else f"{x:+.1f}%"


def _share(x: float) -> str:
    return "n/a" if not math.isfinite(x) else f"{100 * x:.1f}%"


def _num(x: float, digits: int = 3) -> str:
    return "n/a" if not math.isfinite(x) else f"{x:.{digits}g}"


def _setting_markdown(setting, summaries: list[dict], erm_rows: list[dict], factors) -> list[str]:
    higher = setting.id_metric == "accuracy"
    metric = "accuracy" if higher else "RMSE"
    lines = [f"## {setting.title}", ""]
    if erm_rows:
        live = [r for r in erm_rows if not r.get("diverged")]  # diverged: left out, counted
        gone = len(erm_rows) - len(live)
        lines += [
            f"ERM reference ({len(live)} seeds"
            + (f"; {gone} diverged, left out" if gone else "")
            + f"): ID {metric} {_num(_mean(r['id'] for r in live), 4)}, "
            f"OOD {metric} {_num(_mean(r['ood'] for r in live), 4)}, per-sample descent "
            f"{_share(_mean(r['descent_rate'] for r in live))}.",
            "",
        ]
    head = (
        "| combination (formulation · dual · update) | succeeded | infeasible or diverged | "
        + " | ".join(f"×{f:g}" for f in factors)
        + f" | descent | mean r | ID change | OOD {metric} | median peak λ |"
    )
    scheduled = any(s["combo"].schedule != "constant" for s in summaries)
    if scheduled:  # how soon the training batches meet the final ε (issue 51: ε schedules)
        head += " feasible (train) from step, median | feasible (train) at the end |"
    lines += [head, "|" + "---|" * (head.count("|") - 1)]
    ordered = sorted(summaries, key=lambda s: -s["ok"] / s["runs"])
    for s in ordered:
        cells = [
            s["combo"].label + (" (plain projected ascent)" if s["baseline"] else ""),
            f"{s['ok']}/{s['runs']}",
            f"{s['failed']}/{s['runs']}"
            + (f" ({s['diverged']} diverged)" if s["diverged"] else ""),
            *(
                f"{s['by_factor'][f][0]}/{s['by_factor'][f][1]}" if f in s["by_factor"] else "-"
                for f in factors
            ),
            _share(s["descent_rate"]),
            _num(s["mean_ratio"]),
            _pct(s["id_change_pct"])
            + (
                f" ({s['id_change_runs']} of {s['runs']} runs)"
                if s["id_change_runs"] < s["runs"]
                else ""
            ),
            _num(s["ood"], 4),
            _num(s["peak_lambda"]),
        ]
        if scheduled:
            cells += [_num(s["feasible_from"], 4), f"{s['feasible_by_end']}/{s['runs']}"]
        lines.append("| " + " | ".join(cells) + " |")
    b = best(summaries)
    base = next((s for s in summaries if s["baseline"]), None)
    lines.append("")
    if b is not None and b["ok"] == 0:
        lines += [
            f"No combination studied kept a run feasible and monotone ({sum(s['runs'] for s in summaries)} "
            "runs).",
            "",
        ]
    elif b is not None:
        lines.append(
            f"Most successful: **{b['combo'].label}**, {b['ok']}/{b['runs']} runs feasible and "
            f"monotone, {b['failed']}/{b['runs']} infeasible or diverged"
            + (
                f"; plain projected ascent: {base['ok']}/{base['runs']} and "
                f"{base['failed']}/{base['runs']}."
                if base is not None
                else "."
            )
        )
        lines.append("")
    return lines


def headline(opts, summaries: list[dict]) -> str:
    out = []
    for name in opts.settings:
        mine = [s for s in summaries if s["setting"] == name]
        b = best(mine)
        base = next((s for s in mine if s["baseline"]), None)
        if b is None:
            continue
        line = (
            f"{name}: best {b['combo'].label}: {b['ok']}/{b['runs']} feasible and monotone"
            if b["ok"]
            else f"{name}: no combination kept a run feasible and monotone"
        )
        if base is not None:
            line += f"; plain projected ascent {base['ok']}/{base['runs']}"
        out.append(line)
    return "\n".join(out)


def collect(subs, results: dict) -> tuple[list[dict], list[dict], dict[str, list[dict]]]:
    """``{sub.key: results.json}`` → (a row per constrained run, a summary per combination,
    ``{setting: its ERM runs' ID, OOD and descent rate}``)."""
    rows: list[dict] = []
    erm: dict[str, list[dict]] = {}
    for sub in subs:
        name, combo = sub.key
        setting = SETTINGS[name]
        if sub.key[1] is None:
            erm[name] = [
                dict(zip(("id", "ood"), _metric(r, setting.id_metric), strict=True))
                | {"descent_rate": r["descent_rate"], "diverged": bool(r.get("diverged"))}
                for r in results[sub.key]["runs"]
                if not r["constrained"]
            ]
            continue
        call = combo
        for c in call.combos:  # a call trains its combinations as sweep points
            mine = [r for r in results[sub.key]["runs"] if call.combo_of(r["hparams"]) == c]
            rows += run_rows(
                setting,
                c,
                {"runs": mine, "config": results[sub.key]["config"]},
                results[(name, None)],
            )
    return rows, summarise(rows), erm


def write_report(
    opts, subs, rows, summaries, erm, figure_paths: dict[str, Path], out: Path, wall: float
) -> dict[str, Any]:
    """study.md and study.csv; returns ``{"rows", "summary", "markdown", "headline", "paths"}``."""
    factors = sorted({r["factor"] for r in rows})
    first = subs[0].cfg
    note = (
        f"{len(subs)} runner calls (combinations that share a program are one call), "
        f"{len(rows)} constrained runs: dual step sizes "
        f"×{fmt(opts.dual_lr_factors)} of each setting's base rate (a {max(opts.dual_lr_factors) / min(opts.dual_lr_factors):g}x range), "
        f"{opts.seeds} seeds, primal schedule {opts.lr_schedule}, nuPI K_P = {opts.nupi_kp:g}, "
        f"ν = {opts.nupi_ema:g}, --scale {opts.scale} ({first.steps} steps in the first setting). "
        "Succeeded = not diverged, feasible on validation data and monotone mean validation "
        "loss; ties between combinations go to the lower mean validation loss. Test numbers "
        "(ID change, OOD) are reported only."
    )
    bases = "; ".join(
        f"{n}: dual lr sgd/nupi {SETTINGS[n].dual_lr['sgd']:g}, adam {SETTINGS[n].dual_lr['adam']:g}, "
        f"augmented ρ {SETTINGS[n].augmented_penalty:g}, penalty ρ {SETTINGS[n].penalty:g}"
        for n in opts.settings
    )
    parts = ["# Dual-dynamics study", "", note, "", f"Base rates (×1): {bases}.", ""]
    for name in opts.settings:
        mine = [s for s in summaries if s["setting"] == name]
        parts += _setting_markdown(SETTINGS[name], mine, erm.get(name, []), factors)
    paths = {"csv": out / "study.csv", "md": out / "study.md"} | figure_paths
    if opts.figures:  # none drawn under --no-figures: no heading for them
        parts += ["## Figures", ""] + [
            f"![{k}]({p.name})" for k, p in paths.items() if p.suffix == ".png"
        ]
    parts += ["", f"Wall time of the job that wrote this: {wall:.0f} s."]
    markdown = "\n".join(parts) + "\n"
    csv_rows = [
        {k: (v if not isinstance(v, bool) else int(v)) for k, v in r.items() if k in CSV_COLUMNS}
        for r in rows
    ]
    write_text(paths["csv"], csv_text(csv_rows, CSV_COLUMNS))
    write_text(paths["md"], markdown)
    return {
        "rows": rows,
        "summary": summaries,
        "markdown": markdown,
        "headline": headline(opts, summaries),
        "paths": paths,
    }
