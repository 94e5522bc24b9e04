"""The text grid's rows and Markdown: the chosen point of each setting, the CSV columns, the
headline table (constrained vs ERM at the headline γ_train), each cell against the paper, and the
per-sample ratio histograms each sub-run records for Figure 12.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from cudt.io import atomic_write
from cudt.tasks.text import TextTask
from experiments.paper import rows as table_rows
from experiments.paper.rows import fmt
from experiments.paper.text_table.config import (
    DATASETS,
    MODEL_NAMES,
    NAMES,
    PAPER_LAYERS,
    PAPER_TABLE4,
    STAND_IN,
    TABLE_MODELS,
)

RATIOS_FILE = "ratio_histograms.npz"


#: Bins 0.025 wide, 0.0025 within [0.8, 1.2] (a classifier's ratios sit within a few percent
#: of 1: on 0.025 bins each UT-3 panel of Fig. 12 was one bar); one more count: r > 2.5.
RATIO_EDGES = np.unique(
    np.round(
        np.concatenate(
            [np.linspace(0.0, 0.8, 33), np.linspace(0.8, 1.2, 161), np.linspace(1.2, 2.5, 53)]
        ),
        6,
    )
)


def ratio_histograms(runs: list[dict], ratios: list) -> tuple[np.ndarray, list[str]]:
    """``counts [R, L, B+1]``: per run and layer, how many test samples have their ratio
    ``ℓ_l / ℓ_{l-1}`` (at the run's γ_train) in each bin of :data:`RATIO_EDGES`, the last count
    those ``> 2.5``; a diverged run (no ratios) counts nothing, an excluded ratio (NaN in
    ``ratios``' ``[N, L]``) neither. And the runs' labels."""
    width = max((int(r["layers"]) for r in runs), default=1)
    bins = len(RATIO_EDGES) - 1
    counts = np.zeros((len(runs), width, bins + 1), np.int64)
    for i, (_, r) in enumerate(zip(runs, ratios, strict=True)):
        if r is None:
            continue
        per_layer = np.asarray(r, np.float64)  # [N, L]
        for layer in range(per_layer.shape[1]):
            v = per_layer[:, layer][np.isfinite(per_layer[:, layer])]
            counts[i, layer, :bins] = np.histogram(v, bins=RATIO_EDGES)[0]
            counts[i, layer, bins] = int(np.sum(v > RATIO_EDGES[-1]))
    return counts, [r["label"] for r in runs]


class RatioRecordingTextTask(TextTask):
    """The text task, also writing every run's per-sample ratio histograms (:func:`ratio_
    histograms`) to ``ratio_histograms.npz`` beside its figures, before ``results.json`` (with
    or without ``--no-figures``: the table's Figure 12 is drawn from it)."""

    def outputs(self, cfg, runs, ratios, out, gammas):
        paths = super().outputs(cfg, runs, ratios, out, gammas)
        counts, labels = ratio_histograms(runs, ratios)

        def write(f):
            np.savez(f, edges=RATIO_EDGES, counts=counts, labels=np.asarray(labels, dtype=str))

        atomic_write(Path(out) / RATIOS_FILE, write)
        return paths  # not in results.json's files: rewritten by the run that replaces it


def read_ratio_histograms(folder: Path) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """``(edges [B+1], {run label: counts [L, B+1]})`` of a sub-run: the bins it was counted
    in (a sub-run from before the finer bins keeps its own), and no labels if it has no
    histograms (trained by ``experiments.text_classify``, say)."""
    path = Path(folder) / RATIOS_FILE
    if not path.is_file():
        return RATIO_EDGES, {}
    with np.load(path, allow_pickle=False) as z:
        counts = {str(label): c for label, c in zip(z["labels"], z["counts"], strict=True)}
        return np.asarray(z["edges"], np.float64), counts


def best_rows(results: dict[tuple, dict]) -> list[dict]:
    """One row per (dataset, model, L, kind, γ_train): the point the runner's rule chooses by
    validation accuracy AUC (:func:`table_rows.setting_rows`), or where none is eligible the
    best of the others, flagged by its status (``infeasible``, ``not monotone``), or only the
    status (``diverged``: every run diverged; ``seed diverged``: at every setting a seed did;
    ``no finite score``: none diverged, none has a finite validation AUC)."""

    def fields(b: dict, i: int) -> dict[str, Any]:
        accuracy = [table_rows.num(v) for v in b["accuracy"]]
        return {
            "auc": float(b["auc"]),
            "acc_at_gamma_train": accuracy[i],
            "acc_at_max_gamma": accuracy[-1],
            "val_auc": float(b["val_auc"]),
            "val_accuracy": float(b["val_accuracy"]),
            "loss_decreases_val": bool(b["loss_decreases_val"]),  # the verdict
            "loss_decreases": bool(b["loss_decreases"]),  # the test split's: reported only
            "descent_rate": table_rows.num(b["descent_rate"]),
            "mean_ratio": table_rows.num(b["mean_ratio"]),  # None: every ratio excluded
            "median_ratio": table_rows.num(b["median_ratio"]),
            "accuracy": accuracy,  # for Figure 4 (not in the CSV)
        }

    rows = []
    for (dataset, _, _), res in results.items():
        sub_run = Path(res["config"]["out"]).name
        found = table_rows.setting_rows(
            res, dataset, sub_run, score="val_auc", higher=True, fields=fields
        )
        for row in found:  # the figures' chance levels (not in the CSV)
            row["num_classes"] = res["config"].get("num_classes")
        rows += found
    return table_rows.sort_rows(rows, DATASETS, TABLE_MODELS)


CSV_COLUMNS = (
    *table_rows.SETTING_COLUMNS,
    "auc",
    "acc_at_gamma_train",
    "acc_at_max_gamma",
    "val_auc",
    "val_accuracy",
    "feasible",
    "loss_decreases_val",
    "loss_decreases",
    "descent_rate",
    "mean_ratio",
    "median_ratio",
    "peak_lambda",
    "seed",
    *table_rows.RUN_COLUMNS,
)


def row_models(rows) -> list[tuple[str, int]]:
    """(model, L) of the table's rows, in the paper's order (UT by depth, then the encoders)."""
    order = {m: i for i, m in enumerate(TABLE_MODELS)}
    return sorted({(r["model"], r["layers"]) for r in rows}, key=lambda k: (order[k[0]], k[1]))


def model_label(model: str, layers: int) -> str:
    return f"{MODEL_NAMES.get(model, model)}-{layers}"


def _table(rows, datasets) -> tuple:
    """What :mod:`table_rows` draws a table from: the rows, the dataset names, the datasets and
    the row models (label, model, L)."""
    return rows, NAMES, datasets, [(model_label(m, L), m, L) for m, L in row_models(rows)]


def gamma_table_lines(rows, datasets, gammas, *, label_gamma: bool) -> list[str]:
    """Accuracy AUC of constrained and ERM per dataset, the higher bold (both when equal to 3
    decimals)."""
    return table_rows.table_lines(
        *_table(rows, datasets),
        gammas,
        metric="auc",
        higher=True,
        label_gamma=label_gamma,
    )


def headline_markdown(rows, datasets, gamma, test_gammas) -> str:
    """The headline table at γ_train = ``gamma`` (Markdown), with its legend and counts."""
    idx = table_rows.index_rows(rows)
    lines = [
        f"### Table 4: test accuracy AUC over test γ ∈ {{{fmt(test_gammas)}}}, γ_train = {gamma:g}",
        "",
        *gamma_table_lines(rows, datasets, [gamma], label_gamma=False),
        "",
        table_rows.selection_legend("validation accuracy AUC", rows, "higher")
        + "; `infeasible`: no constrained run met its constraints on validation data (the best "
        "infeasible one's AUC in brackets); `diverged`: every run diverged"
        + table_rows.status_legend(rows)
        + ". L of an encoder: its "
        "constrained states "
        "(one per sub-layer: DistilBERT 12, RoBERTa 24, MiniLM 12); "
        + table_rows.NOT_APPLICABLE_LEGEND
        + ".",
    ]
    wins = both = 0
    for model, L in row_models(rows):
        for d in datasets:
            c, e = (
                idx.get((d, model, L, "constrained", gamma)),
                idx.get((d, model, L, "ERM", gamma)),
            )
            if table_rows.both_ok(c, e):
                both += 1
                wins += table_rows.better(c, e, "auc", higher=True) == "C"
    lines.append(
        f"\nConstrained higher than ERM{table_rows.count_rule(rows)} in {wins} of {both} "
        "model×dataset cells with both numbers."
    )
    return "\n".join(lines)


def paper_direction_markdown(rows, datasets, gamma) -> str:
    """Per cell: which of constrained (C) / ERM (E) has the higher AUC here and in the paper's
    table, with constrained minus ERM (:func:`experiments.paper.job.direction_markdown`); MiniLM
    against the paper's DistilBERT-12, the encoder it stands in for. A cell without a feasible
    constrained run reads ``infeasible: C``."""
    return table_rows.direction_markdown(
        *_table(rows, datasets),
        gamma,
        _paper_pair,
        metric="auc",
        higher=True,
        signed=True,
        legend=" MiniLM rows are compared with the paper's DistilBERT-12.",
    )


def _paper_pair(model: str, L: int, gamma: float, dataset: str) -> tuple[float, float] | None:
    """The paper's (constrained, ERM) cell of ``model`` (a stand-in: of the model it stands in
    for, at that model's L)."""
    ref = STAND_IN.get(model, model)
    paper_l = L if ref == "ut" else PAPER_LAYERS.get(ref)
    return PAPER_TABLE4.get((ref, paper_l, gamma, dataset))
