"""The UT study's report: one row per variant × resilience, the phase-I table, and the choice.

Verdicts read the validation split only (the runner's ``relative_violation_val`` and validation
losses): ``feasible 0 %`` is every applicable constraint met exactly, ``feasible tol`` within
the runner's tolerance, ``monotone`` every validation mean loss below the one before. Test RMSE
(at γ_train: ID; ``mean RMSE (all γ)``: the mean over the whole test γ grid, the levels at and
below γ_train included, so not an out-of-distribution number, which the dual study's OOD is: the
levels above γ_train only) is reported beside the ERM run of the same variant and seed, and
chooses nothing.

:func:`choose` picks the UT architecture under the hard constraints the video task trains every
model with: :data:`experiments.paper.ut_study.FAITHFUL` when its constrained runs are feasible
(within tolerance) and monotone on validation at every seed; otherwise the variant closest to it
(fewest of tying, clip and residual changed) whose runs are, ties broken by the lower mean
validation objective. The resilient cells are reported beside it. No test number enters it.

:func:`choose_setting` then picks the chosen UT's constraint settings (ε, dual rate) from the
settings stage: feasible and monotone on validation at every seed, the lowest mean validation
mean RMSE over the test γ grid. No test number enters it either.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from cudt.runner.choice import choose_points
from cudt.runner.record import at_gamma_train
from cudt.stats import level_mark, t_interval
from experiments.paper.rows import csv_text, num, peak, write_text

__all__ = ["CSV_COLUMNS", "choose", "choose_setting", "rows_of", "write_report"]

CSV_COLUMNS = (
    "variant",
    "tying",
    "clip",
    "residual",
    "resilience",
    "seed",
    "kind",
    "feasible_exact",
    "feasible_tol",
    "monotone_val",
    "max_rel_violation_val",
    "val_objective",
    "id_rmse",
    "mean_rmse",
    "id_vs_erm_pct",
    "mean_rmse_vs_erm",
    "projection_removed",
    "lambda_end",
    "lambda_peak",
    "diverged",
)


def _applicable_rel(run: dict) -> np.ndarray:
    """The applicable descent constraints' relative violations on validation (index 0 of the
    runner's ``[L+1]`` lists is the reference)."""
    rel = np.asarray(run["relative_violation_val"], np.float64)[1:]
    return rel[np.asarray(run["constraint_applicable_val"], bool)[1:]]


def _id_rmse(run: dict) -> float:
    return num(at_gamma_train(run, "rmse"))


def _finite_mean(values) -> float:
    """The mean of a curve's finite entries (``None`` is NaN); NaN for none."""
    x = np.asarray([num(v) for v in values or ()], np.float64)
    x = x[np.isfinite(x)]
    return float(x.mean()) if x.size else math.nan


def _run_row(variant, run: dict, erm: dict | None) -> dict[str, Any]:
    rel = _applicable_rel(run)
    finite = bool(np.all(np.isfinite(rel))) and not run["diverged"]
    proj = run["curves"].get("projection")
    alpha = run["hparams"].get("resilience")
    row = {
        "variant": variant.slug,
        "label": variant.label,
        "tying": variant.tying,
        "clip": variant.clip,
        "residual": variant.residual,
        "resilience": "-" if not run["constrained"] else ("off" if alpha is None else f"{alpha:g}"),
        "seed": run["seed"],
        "kind": "constrained" if run["constrained"] else "ERM",
        "feasible_exact": finite and bool(np.all(rel <= 0.0)),
        "feasible_tol": finite and bool(run["feasible"]),
        "monotone_val": finite and bool(run["loss_decreases_val"]),
        "max_rel_violation_val": float(np.max(rel)) if rel.size else math.nan,
        "val_objective": num(run["val_objective"]),
        "id_rmse": _id_rmse(run),
        "mean_rmse": num(run["mean_rmse"]),  # over the whole test γ grid, not OOD alone
        # a diverged run's curve holds null (NaN in results.json) from the step it diverged
        "projection_removed": _finite_mean(proj),
        "lambda_end": peak(run["multipliers"]),
        "lambda_peak": peak(run["max_multipliers"]),
        "diverged": bool(run["diverged"]),
    }
    # against its seed's ERM run, when both trained: a diverged run is scored at its last
    # finite state, numbers that are no comparison (the study's cells leave that seed out)
    if erm is not None and not run["diverged"] and not erm.get("diverged"):
        row["id_vs_erm_pct"] = 100.0 * (row["id_rmse"] / _id_rmse(erm) - 1.0)
        row["mean_rmse_vs_erm"] = row["mean_rmse"] - num(erm["mean_rmse"])
    else:
        row["id_vs_erm_pct"] = row["mean_rmse_vs_erm"] = math.nan
    return row


def rows_of(subs, results: dict) -> list[dict]:
    """A row per run of every variant (constrained runs beside their seed's ERM run)."""
    rows = []
    for sub in subs:
        (variant,) = sub.key
        runs = results[sub.key]["runs"]
        erm = {r["seed"]: r for r in runs if not r["constrained"]}
        for run in runs:
            rows.append(
                _run_row(variant, run, None if not run["constrained"] else erm.get(run["seed"]))
            )
    return rows


def _cells(rows: list[dict]) -> dict[tuple, list[dict]]:
    cells: dict[tuple, list[dict]] = {}
    for r in rows:
        cells.setdefault((r["variant"], r["kind"], r["resilience"]), []).append(r)
    return cells


def _distance(row: dict, faithful) -> int:
    return (
        int(row["tying"] != faithful.tying)
        + int(row["clip"] != faithful.clip)
        + int(row["residual"] != faithful.residual)
    )


def choose(rows: list[dict], faithful, resilience: str = "off") -> dict[str, Any] | None:
    """The chosen UT architecture (module doc): validation verdicts and objectives only.

    Among the constrained cells trained with ``resilience`` (``"off"``: the hard constraints the
    video task trains every model with), those feasible within tolerance and monotone on
    validation at every seed; of these the architecture closest to ``faithful`` (fewest of
    tying, clip, residual changed), ties broken by the lower mean validation objective.
    Returns ``{"variant", "resilience", "label", "why"}`` or None when no cell qualifies."""
    good = []
    for (variant, kind, res), cell in _cells(rows).items():
        if kind != "constrained" or res != resilience:
            continue
        if all(r["feasible_tol"] and r["monotone_val"] for r in cell):
            first = cell[0]
            val_obj = float(np.mean([r["val_objective"] for r in cell]))
            good.append((_distance(first, faithful), val_obj, variant, res, first))
    if not good:
        return None
    dist, val_obj, variant, res, first = min(good, key=lambda g: (g[0], g[1]))
    why = (
        "the faithful UT"
        if dist == 0
        else f"the faithful UT is not feasible and monotone at every seed; this is the closest "
        f"that is ({dist} change{'s' if dist > 1 else ''}; mean validation objective {val_obj:.4g})"
    )
    return {"variant": variant, "resilience": res, "label": first["label"], "why": why}


def _setting_cells(runs: list[dict]) -> dict[tuple[float, float], list[dict]]:
    """The settings stage's constrained runs by (ε, dual rate), each list ordered by seed."""
    cells: dict[tuple[float, float], list[dict]] = {}
    for r in sorted(runs, key=lambda r: r["seed"]):
        if r["constrained"]:
            cells.setdefault((r["hparams"]["epsilon"], r["hparams"]["dual_lr"]), []).append(r)
    return cells


def choose_setting(runs: list[dict]) -> dict[str, Any] | None:
    """The chosen UT's constraint settings from the settings stage's runs (validation only):
    the runner's :func:`cudt.runner.choice.choose_points` with the stage's score, the
    validation mean RMSE over the test γ grid: among the (ε, dual rate) points whose
    constrained runs are feasible (within tolerance) and monotone on validation at every seed,
    the lowest mean ``val_mean_rmse``; ties by sweep order (ε, then rate, as given). Returns
    ``{"epsilon", "dual_lr", "val_mean_rmse"}`` or None when no point qualifies."""
    picks = choose_points(runs, "val_mean_rmse", higher_is_better=False, min_points=1)
    if len(picks) != 1 or picks[0]["hparams"] is None:
        return None
    pick = picks[0]
    return {
        "epsilon": pick["hparams"]["epsilon"],
        "dual_lr": pick["hparams"]["dual_lr"],
        "val_mean_rmse": pick["mean"],
    }


def _paired(cell: list[dict], erm: dict, difference) -> list[float]:
    """``difference(run, ERM run)`` per run of ``cell`` whose seed has an ERM run; NaN where
    either diverged (scored at its last finite state: no comparison), which :func:`_versus`
    leaves out and counts."""
    return [
        math.nan
        if r["diverged"] or erm[r["seed"]].get("diverged")
        else difference(r, erm[r["seed"]])
        for r in cell
        if r["seed"] in erm
    ]


def _settings_section(sub, runs: list[dict]) -> list[str]:
    cfg = sub.cfg
    erm = {r["seed"]: r for r in runs if not r["constrained"]}
    lines = [
        "## The chosen UT's constraint settings (validation only)",
        "",
        f"`{sub.name}`: ERM and hard constrained runs over ε × dual rate × {cfg.seeds} seeds as "
        f"one program ({cfg.steps} steps, dual {cfg.dual_optimizer}, {cfg.update}); validation "
        "videos scored over the test γ grid (`--select val-mean-rmse`). Chosen: feasible and "
        "monotone on validation at every seed, then the lowest mean validation mean RMSE. Test "
        "RMSE is reported beside the ERM run of the same seed (mean over seeds, 95 % paired t "
        "interval, 'level' where it spans 0) and chooses nothing.",
        "",
        "| ε | dual rate | feasible tol | monotone | val mean RMSE | val vs ERM | ID vs ERM | "
        "mean RMSE (all γ) | mean RMSE vs ERM | λ peak |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (eps, rate), cell in sorted(_setting_cells(runs).items()):
        val_vs = _versus(
            _paired(cell, erm, lambda r, e: r["val_mean_rmse"] - e["val_mean_rmse"]), 3
        )
        id_vs = _versus(
            _paired(cell, erm, lambda r, e: 100 * (_id_rmse(r) / _id_rmse(e) - 1)), 1, " %"
        )
        mean_vs = _versus(_paired(cell, erm, lambda r, e: r["mean_rmse"] - e["mean_rmse"]), 3)
        lines.append(
            f"| {eps:g} | {rate:g} | {sum(r['feasible'] for r in cell)}/{len(cell)} | "
            f"{sum(r['loss_decreases_val'] for r in cell)}/{len(cell)} | "
            f"{_mean(cell, 'val_mean_rmse'):.3f}{_over(cell)} | {val_vs} | "
            f"{id_vs} | {_mean(cell, 'mean_rmse'):.3f}{_over(cell)} | {mean_vs} | "
            f"{max(max(r['max_multipliers']) for r in cell):.3g} |"
        )
    pick = choose_setting(runs)
    if pick is None:
        return [*lines, "", "No setting is feasible and monotone on validation at every seed."]
    lines += [
        "",
        f"**Chosen: ε = {pick['epsilon']:g}, dual rate {pick['dual_lr']:g}** (mean validation "
        f"mean RMSE {pick['val_mean_rmse']:.3f}; ERM's "
        f"{_mean(list(erm.values()), 'val_mean_rmse'):.3f}{_over(list(erm.values()))}). Its "
        "runs against ERM, per "
        "seed (test data, reported only):",
        "",
        "| seed | ID RMSE | ERM | ID vs ERM | mean RMSE (all γ) | ERM | mean RMSE vs ERM |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in _setting_cells(runs)[pick["epsilon"], pick["dual_lr"]]:
        e = erm.get(r["seed"])
        if e is None:
            continue
        if r["diverged"] or e.get("diverged"):  # scored at a last finite state: no comparison
            who = "diverged" if r["diverged"] else "ERM diverged"
            lines.append(f"| {r['seed']} | {who} | | | | | |")
            continue
        lines.append(
            f"| {r['seed']} | {_id_rmse(r):.3f} | {_id_rmse(e):.3f} | "
            f"{100 * (_id_rmse(r) / _id_rmse(e) - 1):+.1f} % | {r['mean_rmse']:.3f} | "
            f"{e['mean_rmse']:.3f} | {r['mean_rmse'] - e['mean_rmse']:+.3f} |"
        )
    return lines


def _versus(differences, digits: int, unit: str = "") -> str:
    """A "vs ERM" cell: the mean over seeds of the per-seed differences (each constrained run
    against the ERM run of its seed) with their 95 % paired t interval, ``level`` where it spans
    0; the mean alone from one finite seed; ``nan`` from none. A seed whose difference is not
    finite (a diverged run) is left out and the cell says over how many it is."""
    vals = [float(v) for v in differences if np.isfinite(v)]
    if not vals:
        return "nan"
    over = f" ({len(vals)} of {len(differences)} seeds)" if len(vals) < len(differences) else ""

    def num(x):
        return f"{x:+.{digits}f}{unit}"

    if len(vals) < 2:
        return num(float(np.mean(vals))) + over
    iv = t_interval(vals)
    return f"{num(iv.mean)} [{num(iv.low)}, {num(iv.high)}]" + level_mark(iv) + over


def _mean(cell, key) -> float:
    """The mean of ``key`` over the runs of ``cell`` that did not diverge (a diverged run is
    scored at its last finite state: no number to average with the others)."""
    vals = [r[key] for r in cell if not r.get("diverged") and np.isfinite(r[key])]
    return float(np.mean(vals)) if vals else math.nan


def _over(cell) -> str:
    """`` (k of n)`` where ``k`` of the ``n`` runs of ``cell`` did not diverge; else ``""``."""
    kept = sum(not r.get("diverged") for r in cell)
    return f" ({kept} of {len(cell)})" if kept < len(cell) else ""


def _count(cell, key) -> str:
    return f"{sum(bool(r[key]) for r in cell)}/{len(cell)}"


def _table(rows: list[dict]) -> list[str]:
    head = (
        "| variant | resilience | feasible 0 % | feasible tol | monotone | max rel. viol. | "
        "ID RMSE | ID vs ERM | mean RMSE (all γ) | mean RMSE vs ERM | proj. removed | λ end | "
        "λ peak |"
    )
    out = [head, "|" + "---|" * 13]
    for (_, kind, res), cell in _cells(rows).items():
        first = cell[0]
        name = first["label"] + ("" if kind == "constrained" else " (ERM)")

        def vs(key: str, digits: int, unit: str = "", cell=cell, kind=kind) -> str:
            return "" if kind != "constrained" else _versus([r[key] for r in cell], digits, unit)

        out.append(
            f"| {name} | {res} | {_count(cell, 'feasible_exact')} | {_count(cell, 'feasible_tol')} | "
            f"{_count(cell, 'monotone_val')} | {_mean(cell, 'max_rel_violation_val'):+.3f} | "
            f"{_mean(cell, 'id_rmse'):.3f}{_over(cell)} | {vs('id_vs_erm_pct', 1, ' %')} | "
            f"{_mean(cell, 'mean_rmse'):.3f}{_over(cell)} | {vs('mean_rmse_vs_erm', 3)} | "
            f"{_mean(cell, 'projection_removed'):.2f} | {_mean(cell, 'lambda_end'):.3g} | "
            f"{_mean(cell, 'lambda_peak'):.3g} |"
        )
    return out


def _per_seed(rows: list[dict]) -> list[str]:
    out = [
        "| variant | resilience | seed | feasible tol | monotone | ID vs ERM | mean RMSE vs ERM |"
    ]
    out.append("|" + "---|" * 7)
    for r in rows:
        if r["kind"] != "constrained":
            continue
        versus = (
            f"{r['id_vs_erm_pct']:+.1f} % | {r['mean_rmse_vs_erm']:+.3f}"
            if np.isfinite(r["mean_rmse_vs_erm"])
            else ("diverged | diverged" if r["diverged"] else "ERM diverged | ERM diverged")
        )
        out.append(
            f"| {r['label']} | {r['resilience']} | {r['seed']} | {'yes' if r['feasible_tol'] else 'NO'} | "
            f"{'yes' if r['monotone_val'] else 'NO'} | {versus} |"
        )
    return out


def _phase1_table(subs, phase1: dict) -> list[str]:
    out = [
        "| variant | from the DCT start: violation (max rel.) | from the ERM solution | "
        "feasible point found |",
        "|---|---|---|---|",
    ]
    for sub in subs:
        (variant,) = sub.key
        p = phase1[sub.key]
        cells = []
        for start in ("init", "erm"):
            v, m = p[start]["violation"], p[start]["max_relative_violation"]
            cells.append(
                ", ".join(
                    f"{a:.3f} ({'none judged' if b is None else f'{b:+.3f}'})"
                    for a, b in zip(v, m, strict=True)
                )
            )
        found = sum(
            any(p[s]["feasible"][i] for s in ("init", "erm"))
            for i in range(len(p["init"]["feasible"]))
        )
        out.append(
            f"| {variant.label} | {cells[0]} | {cells[1]} | {found}/{len(p['init']['feasible'])} seeds |"
        )
    return out


def write_report(
    opts, subs, results: dict, phase1: dict, out: Path, wall: float, settings=None
) -> dict[str, Any]:
    """study.md and study.csv under ``out``; returns ``{"rows", "choice", "setting",
    "markdown", "paths"}``. ``settings``: ``(sub, its results.json)`` of the settings stage."""
    from experiments.paper.ut_study import FAITHFUL

    rows = rows_of(subs, results)
    trained = sum(float(results[s.key].get("wall_seconds", 0.0)) for s in subs) + sum(
        float(p.get("seconds", 0.0)) for p in phase1.values()
    )
    if settings:
        trained += float(settings[1].get("wall_seconds", 0.0))
    resilient = "off" if opts.resilience is None else f"{opts.resilience:g}"
    choice = choose(rows, FAITHFUL, "off")
    first = subs[0].cfg
    parts = [
        "# UT study: which unrolled transformer meets the descent constraints",
        "",
        f"{len(subs)} runner calls (one per variant: ERM, hard and resilient constrained runs × "
        f"{opts.seeds} seeds as one program), --scale {opts.scale}: L = {first.layers}, "
        f"{first.steps} steps, γ_train = {first.gamma_train}, {first.ut_attention} attention, "
        f"ε = {first.epsilon}, dual "
        f"{first.dual_optimizer} at {first.dual_lr:g} ({first.update}), resilience α = "
        f"{resilient}. Verdicts on validation data; RMSE on test data (reported only); "
        "'vs ERM': against the ERM run of the same variant and seed: the mean over seeds and "
        "its 95 % paired t interval over them, 'level' where it spans 0. ID: RMSE at γ_train; "
        "mean RMSE (all γ): the mean over the whole test γ grid (not OOD alone).",
        "",
        *_table(rows),
        "",
        "Per seed:",
        "",
        *_per_seed(rows),
        "",
        "## Phase I: does a feasible point exist?",
        "",
        "The constraints' total normalised violation Σ_l max(0, ℓ_l/ℓ_{l−1} − (1 − ε)) minimised "
        "alone (validation, per seed; max rel. ≤ 0: every constraint met):",
        "",
        *_phase1_table(subs, phase1),
        "",
        "## The choice (validation only)",
        "",
        (
            f"**{choice['label']}** (hard constraints, the video task's dynamics): {choice['why']}."
            if choice
            else "No variant is feasible and monotone on validation at every seed."
        ),
        "",
        *(_settings_section(settings[0], settings[1]["runs"]) + [""] if settings else []),
        f"Wall time of the job that wrote this: {wall:.0f} s; of the runs it reports (runner "
        f"calls and phase I, whenever they were trained): {trained:.0f} s.",
    ]
    markdown = "\n".join(parts) + "\n"
    paths = {"md": out / "study.md", "csv": out / "study.csv"}
    csv_rows = [
        {k: (int(v) if isinstance(v, bool) else v) for k, v in r.items() if k in CSV_COLUMNS}
        for r in rows
    ]
    write_text(paths["csv"], csv_text(csv_rows, CSV_COLUMNS))
    write_text(paths["md"], markdown)
    setting = choose_setting(settings[1]["runs"]) if settings else None
    return {
        "rows": rows,
        "choice": choice,
        "setting": setting,
        "markdown": markdown,
        "paths": paths,
    }
