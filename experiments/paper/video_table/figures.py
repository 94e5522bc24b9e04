"""The video grid's figures: the paper's Figure 2 (RMSE vs test γ), 3 (depth) and 7 (loss per
layer).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cudt.runner.plots import log_y_axis
from cudt.tasks.video import CONTROL
from experiments.paper import figures as figs
from experiments.paper import rows as table_rows
from experiments.paper.figures import grid_axes, save_figure
from experiments.paper.video_table.config import NAMES, UNROLLED, Table3Config
from experiments.paper.video_table.report import depths_of

STYLE = figs.STYLE | {
    CONTROL: {"color": "tab:green", "marker": "^", "label": "control: ERM, per-layer dict."},
}


def _series(idx, d, m, L, g):
    """(style key, row) of the lines of one panel: ERM, constrained, and DUST's control."""
    out = [
        ("ERM", idx.get((d, m, L, "ERM", g))),
        ("constrained", idx.get((d, m, L, "constrained", g))),
    ]
    if m == "dust":
        out.append((CONTROL, idx.get((d, CONTROL, L, "ERM", g))))
    return [(k, r) for k, r in out if r is not None]


def _draw(ax, key, row, x, y, ms=4) -> None:
    """One best run as a line (:func:`experiments.paper.job.draw_line`)."""
    figs.draw_line(ax, STYLE[key], row, x, y, has_value="mean_rmse" in row, ms=ms)


def _legend_note(fig, rows) -> None:
    figs.figure_note(fig, table_rows.line_note(rows, "validation RMSE"))


def plot_fig2(rows, opts, path: Path) -> None:
    """RMSE vs test γ of the best runs at the headline γ_train, L = 3 (or the shallowest)."""
    idx, g = table_rows.index_rows(rows), opts.headline_gamma
    shallow = 3 if 3 in opts.layers else min(opts.layers)
    models = [m for m in opts.models if m != CONTROL]
    fig, axes = grid_axes(len(opts.datasets), len(models), w=4.4, h=3.1)
    for i, d in enumerate(opts.datasets):
        for j, m in enumerate(models):
            ax = axes[i, j]
            L = (depths_of(rows, m, opts.layers) or [0])[0] if m == "vit" else shallow
            for key, row in _series(idx, d, m, L, g):
                _draw(ax, key, row, row.get("test_gamma"), row.get("rmse"))
            figs.mark_train_gamma(ax, g, label_y=0.04)
            ax.set_title(f"{NAMES[d]} · {m.upper()}-{L}", fontsize=10)
            ax.set_xlabel("test γ")
            ax.set_ylabel("RMSE (0-255)")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7, loc="upper left")
    fig.suptitle(
        f"Fig. 2: test RMSE vs test γ, γ_train = {g:g} (dotted line; shaded: OOD)", fontsize=11
    )
    _legend_note(fig, rows)
    save_figure(fig, path)


def plot_fig3(rows, opts, path: Path) -> None:
    """Mean RMSE over the test γ grid vs depth L, per dataset and model, at the headline γ."""
    idx, g = table_rows.index_rows(rows), opts.headline_gamma
    models = [m for m in opts.models if m in UNROLLED]  # the ViT's depth is not varied
    layers = sorted(opts.layers)
    fig, axes = grid_axes(len(opts.datasets), len(models), w=4.2, h=3.0)
    for i, d in enumerate(opts.datasets):
        for j, m in enumerate(models):
            ax = axes[i, j]
            keys = ["ERM", "constrained"] + ([CONTROL] if m == "dust" else [])
            for key in keys:
                model, kind = (CONTROL, "ERM") if key == CONTROL else (m, key)
                found = {L: idx.get((d, model, L, kind, g)) for L in layers}
                found = {L: r for L, r in found.items() if r is not None}
                s = STYLE[key]
                shown = {L: r for L, r in found.items() if "mean_rmse" in r}
                # feasible points joined by a solid line, infeasible ones as hollow markers
                ok = [L for L, r in shown.items() if r["status"] == "ok"]
                bad = [L for L, r in shown.items() if r["status"] != "ok"]
                lost = [f"L={L} {r['status']}" for L, r in found.items() if L not in shown]
                lost += [f"L={L} resilient" for L in ok if shown[L].get("resilient")]
                label = s["label"] + (f" ({', '.join(lost)})" if lost else "")
                if not ok and not lost:
                    label = None  # only infeasible points: named by their own entry
                if ok:
                    ax.plot(
                        ok,
                        [shown[L]["mean_rmse"] for L in ok],
                        color=s["color"],
                        marker=s["marker"],
                        ms=6,
                        label=label,
                    )
                elif label is not None:  # nothing to draw: named, gray, as Fig. 2 does
                    ax.plot([], [], color="0.5", ls=":", label=label)
                for status in dict.fromkeys(shown[L]["status"] for L in bad):
                    these = [L for L in bad if shown[L]["status"] == status]
                    ax.plot(
                        these,
                        [shown[L]["mean_rmse"] for L in these],
                        ls="none",
                        marker=s["marker"],
                        ms=7,
                        mfc="none",
                        mec=s["color"],
                        label=f"{s['label']} ({status})",
                    )
            ax.set_xticks(layers)
            ax.set_title(f"{NAMES[d]} · {m.upper()}", fontsize=10)
            ax.set_xlabel("layers L")
            ax.set_ylabel("mean RMSE over test γ (0-255)")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
    fig.suptitle(f"Fig. 3: mean test RMSE vs depth, γ_train = {g:g}", fontsize=11)
    figs.figure_note(
        fig,
        f"{table_rows.shown_runs(rows, 'validation RMSE')}; hollow: no eligible constrained "
        "run (the best of the others shown, named by its status)",
    )
    save_figure(fig, path)


def plot_fig7(rows, opts, path: Path) -> None:
    """Mean test loss per layer at the headline γ_train, one panel per (dataset, model) × L."""
    idx, g = table_rows.index_rows(rows), opts.headline_gamma
    models = [m for m in opts.models if m in UNROLLED]
    layers = sorted(opts.layers)
    pairs = [(d, m) for d in opts.datasets for m in models]
    fig, axes = grid_axes(len(pairs), len(layers), w=3.7, h=2.6)
    for i, (d, m) in enumerate(pairs):
        for j, L in enumerate(layers):
            ax = axes[i, j]
            for key, row in _series(idx, d, m, L, g):
                loss = row.get("layer_loss")
                x = None if loss is None else np.arange(len(loss))
                _draw(ax, key, row, x, loss, ms=3)
            log_y_axis(ax)
            ax.set_xticks(range(L + 1))
            ax.set_title(f"{NAMES[d]} · {m.upper()}-{L}", fontsize=9)
            ax.grid(True, which="both", alpha=0.3)
            if j == 0:
                ax.set_ylabel("mean test loss ℓ_l")
            if i == len(pairs) - 1:
                ax.set_xlabel("layer l (0: the noisy input)")
            ax.legend(fontsize=6)
    fig.suptitle(f"Fig. 7: mean test loss per layer at γ_train = {g:g}, log scale", fontsize=11)
    _legend_note(fig, rows)
    save_figure(fig, path)


def figures(rows: list[dict], opts: Table3Config, out: Path) -> dict[str, Path]:
    """Figure 2, and with an unrolled model the depth study (3) and per-layer losses (7)."""
    paths = {"fig2": out / "fig2_rmse_vs_gamma.png"}
    plot_fig2(rows, opts, paths["fig2"])
    if any(m in UNROLLED for m in opts.models):
        paths["fig3"] = out / "fig3_depth.png"
        paths["fig7"] = out / "fig7_layer_loss.png"
        plot_fig3(rows, opts, paths["fig3"])
        plot_fig7(rows, opts, paths["fig7"])
    return paths
