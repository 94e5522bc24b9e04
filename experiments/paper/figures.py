"""What the table jobs' figures share: the ERM / constrained / control line styles, a best
run drawn as a line (hollow markers when infeasible), the panel grid, the γ_train marker, notes
and the atomic PNG write.
"""

from __future__ import annotations

from pathlib import Path

from cudt.io import savefig_atomic

STYLE = {
    "ERM": {"color": "tab:blue", "marker": "o", "label": "ERM"},
    # on top: where it equals the control (its multipliers at 0) the constrained line showed
    # in the legend only
    "constrained": {"color": "tab:red", "marker": "s", "label": "constrained", "zorder": 2.5},
}


def draw_line(ax, style: dict, row: dict, x, y, *, has_value: bool, ms: float = 4) -> None:
    """One best run as a line in the project's convention (:mod:`cudt.runner.plots`): an infeasible
    one dashed and named so, one without numbers (diverged) only named in the legend; a point
    the runner chose by its resilient fallback named so."""
    if row["status"] == "diverged" or not has_value:
        ax.plot([], [], color="0.5", ls=":", label=f"{style['label']}: {row['status']}")
        return
    ok = row["status"] == "ok"
    ax.plot(
        x,
        y,
        color=style["color"],
        ls="-" if ok else "--",
        marker=style["marker"],
        ms=ms,
        alpha=1.0 if ok else 0.8,
        label=style["label"]
        + ("" if ok else f" ({row['status']})")
        + (" (resilient)" if row.get("resilient") else ""),
        zorder=style.get("zorder", 2),
    )


def grid_axes(nrows: int, ncols: int, w: float, h: float, min_width: float = 7.5):
    """A figure of ``nrows × ncols`` panels of ``w × h`` inches (room for a title and a note)."""
    import matplotlib.pyplot as plt

    width = max(w * ncols, min_width)
    fig, axes = plt.subplots(nrows, ncols, figsize=(width, h * nrows + 0.6), squeeze=False)
    return fig, axes


def save_figure(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    # room for the note under the panels (tight_layout makes the title's own: a rect under
    # it too left a blank band between the title and the panels)
    h = fig.get_figheight()
    fig.tight_layout(rect=(0, 0.3 / h, 1, 1))
    clear_of_title(fig)
    savefig_atomic(fig, path, dpi=100)
    plt.close(fig)


def clear_of_title(fig, pad_px: float = 4.0) -> None:
    """Lowers the panels until the figure's title sits above them all: tight_layout leaves a
    tall figure's top panel titles inside the title (Fig. 7's 6 rows of 2.6 in: 2 px into it,
    matplotlib 3.11), a shorter one clear (then nothing moves)."""
    title = getattr(fig, "_suptitle", None)  # Figure.suptitle's artist (None: no title)
    shown = [ax for ax in fig.axes if ax.get_visible()]
    if title is None or not shown:
        return
    renderer = fig.canvas.get_renderer()
    top = max(ax.get_tightbbox(renderer).y1 for ax in shown)
    overlap = top + pad_px - title.get_window_extent(renderer).y0
    if overlap > 0:
        fig.subplots_adjust(top=fig.subplotpars.top - overlap / (fig.get_figheight() * fig.dpi))


def figure_note(fig, text: str) -> None:
    """A grey line under the panels (how the runs shown were chosen), wrapped to the figure's
    width (about 16 characters an inch at 8 pt; two lines fit the room save_figure leaves)."""
    from cudt.runner.plots import wrap_text

    text = wrap_text(text, max(40, int(fig.get_figwidth() * 16)))
    fig.text(0.5, 0.005, text, ha="center", va="bottom", fontsize=8, color="0.35")


def mark_train_gamma(ax, gamma: float, *, label_y: float) -> None:
    """The training level ``gamma`` as a dotted line, the test levels beyond it shaded and
    named OOD (the label at height ``label_y`` in axes units)."""
    ax.axvline(gamma, color="k", lw=0.8, ls=":")
    lo, hi = ax.get_xlim()
    ax.axvspan(gamma, hi, color="0.94", zorder=0)
    ax.set_xlim(lo, hi)
    ax.text(0.98, label_y, "OOD", transform=ax.transAxes, ha="right", fontsize=8, color="0.4")
