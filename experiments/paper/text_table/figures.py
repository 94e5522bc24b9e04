"""The text grid's figures: the paper's Figure 1 (loss per layer), 4 (accuracy vs test γ) and
12 (histograms of the per-sample ratios).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from experiments.paper import figures as figs
from experiments.paper import rows as table_rows
from experiments.paper.figures import grid_axes, save_figure
from experiments.paper.text_table.config import NAMES, Table4Config
from experiments.paper.text_table.report import (
    RATIO_EDGES,
    model_label,
    read_ratio_histograms,
    row_models,
)

STYLE = figs.STYLE


def _note(rows) -> str:
    return table_rows.line_note(rows, "validation AUC")


def _panels(rows, opts):
    """The figures' panels: datasets × the table's (model, L), and each panel's two runs."""
    idx, g = table_rows.index_rows(rows), opts.headline_gamma
    cols = row_models(rows)

    def series(d, model, L):
        found = [(k, idx.get((d, model, L, k, g))) for k in ("ERM", "constrained")]
        return [(k, r) for k, r in found if r is not None]

    return cols, series


def _chance_line(ax, rows, d: str, level, text: str) -> None:
    """A grey dotted line at chance, ``level(K)`` for the dataset's K classes (as its sub-runs
    recorded them; none for rows from before they did): a UT at chance drew differences of
    5e-4 nats across the whole panel, read as descent or its lack."""
    classes = {r.get("num_classes") for r in rows if r["dataset"] == d} - {None}
    if len(classes) == 1:
        k = classes.pop()
        ax.axhline(level(k), color="0.45", ls=":", lw=1.0, zorder=1, label=text.format(k=k))


def _finish_panel(ax, d: str, model: str, L: int, j: int, xlabel: str, ylabel: str, **legend):
    """A panel's title (dataset · model), axis labels (y on the first column only), grid and
    legend (``legend``: its keywords)."""
    ax.set_title(f"{NAMES[d]} · {model_label(model, L)}", fontsize=9)
    ax.set_xlabel(xlabel)
    if j == 0:
        ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend(**legend)


def plot_fig1(rows, opts, path: Path) -> None:
    """Mean test cross-entropy per state at the headline γ_train (the paper's Figure 1)."""
    from matplotlib.ticker import MaxNLocator

    cols, series = _panels(rows, opts)
    fig, axes = grid_axes(len(opts.datasets), len(cols), w=3.8, h=2.8)
    for i, d in enumerate(opts.datasets):
        for j, (model, L) in enumerate(cols):
            ax = axes[i, j]
            for key, row in series(d, model, L):
                loss = row.get("layer_loss")
                x = None if loss is None else np.arange(len(loss))
                figs.draw_line(ax, STYLE[key], row, x, loss, has_value="auc" in row, ms=3)
            _chance_line(ax, rows, d, np.log, "chance, ln {k}")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            xlabel, ylabel = "state l (0: the perturbed embeddings)", "mean test cross-entropy ℓ_l"
            _finish_panel(ax, d, model, L, j, xlabel, ylabel, fontsize=7)
    g = opts.headline_gamma
    fig.suptitle(f"Fig. 1: mean test loss per layer, γ_train = test γ = {g:g}", fontsize=11)
    figs.figure_note(fig, _note(rows))
    save_figure(fig, path)


def _gamma_grid(rows) -> tuple[float, float] | None:
    """The ends of the runs' test γ grid (its width is the AUC of accuracy 1), or None."""
    grids = [r["test_gamma"] for r in rows if r.get("test_gamma")]
    return (min(map(min, grids)), max(map(max, grids))) if grids else None


def plot_fig4(rows, opts, path: Path) -> None:
    """Test accuracy vs test γ at the headline γ_train (the paper's Figure 4)."""
    cols, series = _panels(rows, opts)
    g = opts.headline_gamma
    fig, axes = grid_axes(len(opts.datasets), len(cols), w=3.8, h=2.9)
    for i, d in enumerate(opts.datasets):
        for j, (model, L) in enumerate(cols):
            ax = axes[i, j]
            for key, row in series(d, model, L):
                style = STYLE[key]
                if "auc" in row:
                    style = style | {"label": f"{style['label']} (AUC {row['auc']:.3f})"}
                x, y = row.get("test_gamma"), row.get("accuracy")
                figs.draw_line(ax, style, row, x, y, has_value="auc" in row)
            _chance_line(ax, rows, d, lambda k: 1 / k, "chance, 1/{k}")
            figs.mark_train_gamma(ax, g, label_y=0.9)
            _finish_panel(ax, d, model, L, j, "test γ", "test accuracy", fontsize=7, loc="best")
    fig.suptitle(
        f"Fig. 4: test accuracy vs embedding perturbation, γ_train = {g:g} (dotted; shaded: OOD)",
        fontsize=11,
    )
    # the paper's AUC is the plain area over the γ grid: chance is not 0.5 (figures audit)
    grid = _gamma_grid(rows)
    area = "" if grid is None else f"; AUC: area over γ ∈ [{grid[0]:g}, {grid[1]:g}]"
    figs.figure_note(fig, _note(rows) + area)
    save_figure(fig, path)


def _occupied(edges: np.ndarray, counts: np.ndarray) -> list[float]:
    """The left edge of the bin holding the 0.5 % quantile, the right of the 99.5 %'s."""
    cum = np.cumsum(counts) / max(counts.sum(), 1)
    first = int(np.searchsorted(cum, 0.005))
    last = min(int(np.searchsorted(cum, 0.995)), counts.size - 1)
    return [float(edges[first]), float(edges[last + 1])]


def binned_median(edges: np.ndarray, counts: np.ndarray) -> tuple[float, float]:
    """The bounds of the bins that hold the median of the counted ratios, ``counts [B+1]`` in
    the bins of ``edges`` (the last count: past ``edges[-1]``, its bound infinite): the bin of
    the middle ratio, or from the lower's left edge to the upper's right where the two middle
    ones of an even count lie in two bins."""
    n = int(counts.sum())
    cum = np.cumsum(counts)
    lo, hi = (int(np.searchsorted(cum, k + 1)) for k in ((n - 1) // 2, n // 2))
    return float(edges[lo]), float(edges[hi + 1]) if hi + 1 < edges.size else float("inf")


def ratio_stats_text(row: dict, edges: np.ndarray, by_label: dict[str, np.ndarray]):
    """What Fig. 12 draws of a row, and its legend's numbers of that: ``(counts [B+1], text)``,
    the histogram counts of every layer summed over the row's runs found in ``by_label`` (one
    run; or one a seed, pooled), and "mean m, median …, r% < 1" of those ratios; None where
    no ratio was counted. One run: its own numbers. Several: the pooled ratios' mean and share
    below 1 (each seed's weighted by its count of ratios: the mean of the seeds' values was
    not the pooled one where the counts differ) and, as the ratios themselves are not kept,
    the bin(s) of the pooled histogram that hold the pooled median (the mean of the seeds'
    medians, which the row holds, is no median of the ratios drawn)."""
    labels = row.get("labels", [row["label"]])
    seeds = row.get("seeds") or [None] * len(labels)
    found = []  # (seed, counts [B+1] over every layer) of each run that counted ratios
    for seed, label in zip(seeds, labels, strict=True):
        counts = by_label[label].sum(axis=0) if label in by_label else None
        if counts is not None and counts.sum() > 0:
            found.append((seed, counts))
    if not found:
        return None
    total = sum(c for _, c in found)
    if len(found) == 1:
        stats = row if found[0][0] is None else row["per_seed"][found[0][0]]
        mean, rate = stats["mean_ratio"], stats["descent_rate"]
        median = f"median {stats['median_ratio']:.3f}"
    else:
        n = total.sum()
        mean = sum(c.sum() * row["per_seed"][s]["mean_ratio"] for s, c in found) / n
        rate = sum(c.sum() * row["per_seed"][s]["descent_rate"] for s, c in found) / n
        lo, hi = binned_median(edges, total)
        closed = "]" if hi == edges[-1] else ")"
        median = f"median > {lo:g}" if hi == np.inf else f"median in [{lo:.4g}, {hi:.4g}{closed}"
    over = total[-1] / total.sum()
    text = f"mean {mean:.3f}, {median}, {100 * rate:.0f}% < 1"
    return total, text + (f", {100 * over:.0f}% > {edges[-1]:g}" if over >= 0.005 else "")


def plot_fig12(rows, opts, out: Path, path: Path) -> None:
    """Histograms of the per-sample ratios ℓ_l / ℓ_{l-1} over every layer and test sample at
    the headline γ_train, best ERM vs best constrained run (the paper's Figure 12)."""
    cols, series = _panels(rows, opts)
    g = opts.headline_gamma
    hists: dict[str, tuple[np.ndarray, dict[str, np.ndarray]]] = {}
    fig, axes = grid_axes(len(opts.datasets), len(cols), w=3.8, h=2.8)
    for i, d in enumerate(opts.datasets):
        for j, (model, L) in enumerate(cols):
            ax = axes[i, j]
            drawn, spans = 0, [1.0]
            for key, row in series(d, model, L):
                if "label" not in row:
                    continue
                if row["sub_run"] not in hists:
                    hists[row["sub_run"]] = read_ratio_histograms(out / row["sub_run"])
                # a mean over seeds: the ratios of every seed's run, pooled
                edges, by_label = hists[row["sub_run"]]
                drawn_stats = ratio_stats_text(row, edges, by_label)
                if drawn_stats is None:
                    continue
                total, text = drawn_stats  # [B+1] over every layer (and seed)
                s = STYLE[key]
                flagged = "" if row["status"] == "ok" else f" ({row['status']})"
                flagged += " (resilient)" if row.get("resilient") else ""
                ax.stairs(
                    total[:-1] / (total.sum() * np.diff(edges)),
                    edges,
                    fill=True,
                    color=s["color"],
                    alpha=0.45,
                    label=f"{s['label']}{flagged}: {text}",
                )
                spans += _occupied(edges, total[:-1])
                if key == "constrained" and row.get("epsilon") is not None:
                    ax.axvline(1 - row["epsilon"], color=s["color"], lw=0.9, ls="--")
                    spans.append(1 - row["epsilon"])
                drawn += 1
            ax.axvline(1.0, color="k", lw=0.8, ls=":")
            if not drawn:
                ax.text(
                    0.5,
                    0.5,
                    "no ratio histograms recorded",
                    transform=ax.transAxes,
                    ha="center",
                    fontsize=8,
                    color="0.4",
                )
            # the occupied bins (0.5-99.5 % of each histogram), 1 and 1 − ε, with a margin
            lo, hi = min(spans), max(spans)
            pad = max(0.05 * (hi - lo), 0.01)
            ax.set_xlim(max(RATIO_EDGES[0], lo - pad), min(RATIO_EDGES[-1], hi + pad))
            _finish_panel(
                ax, d, model, L, j, "ℓ_l / ℓ_(l-1)", "density", fontsize=6, loc="upper right"
            )
    fig.suptitle(
        f"Fig. 12: per-sample layer ratios on the test set at γ_train = {g:g} (dotted: 1; "
        "dashed: 1 − ε)",
        fontsize=11,
    )
    figs.figure_note(
        fig,
        "every layer and test sample of "
        + (
            "the seeds' runs pooled (the median: the bin of the pooled histogram holding it)"
            if table_rows.several_seeds(rows)
            else table_rows.shown_runs(rows, "validation accuracy AUC")
        )
        + "; paper, constrained RoBERTa on IMDb: mean 0.87, median 0.82, 70.8% < 1",
    )
    save_figure(fig, path)


def figures(rows: list[dict], opts: Table4Config, out: Path) -> dict[str, Path]:
    """Figures 1, 4 and 12 (the last from the sub-runs' ratio histograms under ``out``)."""
    paths = {
        "fig1": out / "fig1_layer_loss.png",
        "fig4": out / "fig4_accuracy_vs_gamma.png",
        "fig12": out / "fig12_ratio_hist.png",
    }
    plot_fig1(rows, opts, paths["fig1"])
    plot_fig4(rows, opts, paths["fig4"])
    plot_fig12(rows, opts, out, paths["fig12"])
    return paths
