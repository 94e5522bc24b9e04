"""The video grid's rows and Markdown: the chosen point of each setting, the CSV columns, the
headline table (constrained vs ERM at the headline γ_train) and each cell against the paper.
"""

from __future__ import annotations

from typing import Any

from cudt.tasks.video import CONTROL
from experiments.paper import rows as table_rows
from experiments.paper.rows import fmt
from experiments.paper.video_table.config import DATASETS, NAMES, PAPER_TABLE3, PAPER_VIT_LAYERS


def best_rows(results: dict[tuple[str, int], dict]) -> list[dict]:
    """One row per (dataset, model, L, kind, γ_train): the point the runner's rule chooses by
    validation RMSE (:func:`table_rows.setting_rows`), or where none is eligible the best of
    the others, flagged by its status (``infeasible``, ``not monotone``), or only the status
    (``diverged``: every run diverged; ``seed diverged``: at every setting a seed did;
    ``no finite score``: none diverged, none has a finite validation RMSE)."""

    def fields(b: dict, i: int) -> dict[str, Any]:
        rmse = [table_rows.num(v) for v in b["rmse"]]
        return {
            "mean_rmse": table_rows.num(b["mean_rmse"]),  # None: not finite
            "rmse_at_gamma_train": rmse[i],
            "val_objective": table_rows.num(b["val_objective"]),
            "rmse": rmse,  # for Figure 2 (not in the CSV)
        }

    rows = []
    for (dataset, depth), res in results.items():  # a ViT's depth is its checkpoint's
        sub_run = f"{dataset}-vit" if depth == "vit" else f"{dataset}-L{depth}"
        rows += table_rows.setting_rows(
            res, dataset, sub_run, score="val_objective", higher=False, fields=fields
        )
    return table_rows.sort_rows(rows, sorted(DATASETS), ("dust", CONTROL, "ut", "vit"))  # by name


CSV_COLUMNS = (
    *table_rows.SETTING_COLUMNS,
    "mean_rmse",
    "rmse_at_gamma_train",
    "feasible",
    "peak_lambda",
    "val_objective",
    "seed",
    *table_rows.RUN_COLUMNS,
)


def depths_of(rows, model: str, layers) -> list[int]:
    """The depths of ``model``'s rows: ``layers`` for the unrolled models, the ViT's own."""
    if model != "vit":
        return list(layers)
    return sorted({r["layers"] for r in rows if r["model"] == "vit"})


def _row_models(models) -> list[str]:
    """dust, ut, then the control rows."""
    names = [m for m in models if m != CONTROL]
    return names + ([CONTROL] if "dust" in names else [])


def _table_rows(rows, models, layers) -> list[tuple[str, str, int]]:
    """(label, model, L) of the table's lines: dust, ut, the ViT at its own depth, the control."""
    return [(f"{m}-{L}", m, L) for m in _row_models(models) for L in depths_of(rows, m, layers)]


def gamma_table_lines(rows, datasets, models, layers, gammas, *, label_gamma: bool) -> list[str]:
    """Mean RMSE of constrained and ERM per dataset, the lower bold."""
    return table_rows.table_lines(
        rows,
        NAMES,
        datasets,
        _table_rows(rows, models, layers),
        gammas,
        metric="mean_rmse",
        higher=False,
        label_gamma=label_gamma,
    )


def _wins(rows, datasets, models, layers, gamma):
    """(constrained lower, cells with both numbers) per L, over the table's cells (models ×
    datasets; the ViT at its own depth), less the control's."""
    idx = table_rows.index_rows(rows)
    out = {}
    for _, m, L in _table_rows(rows, models, layers):
        if m == CONTROL:
            continue
        wins, both = out.get(L, (0, 0))
        for d in datasets:
            c, e = idx.get((d, m, L, "constrained", gamma)), idx.get((d, m, L, "ERM", gamma))
            won = table_rows.better(c, e, "mean_rmse", higher=False)
            if won is not None:  # both there, with finite numbers
                both += 1
                wins += won == "C"
        out[L] = (wins, both)
    return out


def headline_markdown(rows, datasets, models, layers, gamma, test_gammas) -> str:
    """The headline table at γ_train = ``gamma`` (Markdown), with its legend and counts."""
    lines = [
        f"### Table 3: mean test RMSE (0-255) over test γ ∈ {{{fmt(test_gammas)}}}, "
        f"γ_train = {gamma:g}",
        "",
        *gamma_table_lines(rows, datasets, models, layers, [gamma], label_gamma=False),
        "",
        table_rows.selection_legend("validation RMSE", rows, "lower")
        + "; `infeasible`: no constrained run met its constraints on validation data; "
        "`diverged`: every run diverged"
        + table_rows.status_legend(rows)
        + f"; {CONTROL}: ERM DUST with one dictionary per layer (the constrained model's "
        "architecture), the control; " + table_rows.NOT_APPLICABLE_LEGEND + ".",
    ]
    wins = _wins(rows, datasets, models, layers, gamma)
    total_w, total_b = sum(w for w, _ in wins.values()), sum(b for _, b in wins.values())
    per_l = ", ".join(f"L={L}: {w}/{b}" for L, (w, b) in wins.items())
    lines.append(
        f"\nConstrained lower than ERM{table_rows.count_rule(rows)} in {total_w} of {total_b} "
        f"model×dataset cells with both numbers ({per_l})."
    )
    return "\n".join(lines)


def paper_direction_markdown(rows, datasets, models, layers, gamma) -> str:
    """Per cell: which of constrained (C) / ERM (E) is lower here and in the paper's table
    (:func:`experiments.paper.job.direction_markdown`); a cell without a feasible constrained run
    reads ``infeasible (C)``."""
    lines = [line for line in _table_rows(rows, models, layers) if line[1] != CONTROL]
    return table_rows.direction_markdown(
        rows,
        NAMES,
        datasets,
        lines,
        gamma,
        _paper_pair,
        metric="mean_rmse",
        higher=False,
        signed=False,
    )


def _paper_pair(model: str, L: int, gamma: float, dataset: str) -> tuple[float, float] | None:
    """The paper's (constrained, ERM) cell; its ViT is ViT-Base (12 blocks), whatever ours is."""
    return PAPER_TABLE3.get((model, PAPER_VIT_LAYERS if model == "vit" else L, gamma, dataset))
