"""Figures written as PNG (atomically): per-layer loss, metric vs test γ, per-sample ratios.

All take the experiment's ``runs`` list (the dicts written to results.json), group them by model
and show ERM and constrained side by side. Infeasible constrained runs are dashed, under their own
legend entry ("constrained, infeasible"), diverged runs are left out of the curves and named in
the legend, so a broken run is never mistaken for a good one. The
lanes the runner did not choose on validation (``chosen: False``, :func:`cudt.runner.choice.
mark_chosen`) are drawn thin and faint, so the chosen setting stands out among tuned lanes.
"""

from __future__ import annotations

import textwrap
from collections import defaultdict
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from matplotlib import ticker

from cudt.io import savefig_atomic
from cudt.runner.record import KINDS, at_gamma_train

__all__ = ["plot_layer_losses", "plot_metric_vs_gamma", "plot_ratio_histograms"]

COLORS = {False: "tab:blue", True: "tab:red"}


def _suptitle(fig, title: str) -> None:
    """The figure's title, wrapped to its width (a one-panel figure is 5 inches: a long title
    on one line ran off both edges)."""
    chars = max(20, int(fig.get_figwidth() * 10))  # about 10 characters an inch at 12 pt
    fig.suptitle(textwrap.fill(title, chars))


def _by_model(runs):
    """Panels by model and depth; a control run (``run["panel"]``) joins its model's panel."""
    groups = defaultdict(list)
    for run in runs:
        groups[f"{run.get('panel', run['model'])}-{run['layers']}"].append(run)
    return dict(sorted(groups.items()))


def _kind(run) -> str:
    """The legend entry of a run: ERM, constrained, or its variant (e.g. a control)."""
    return run.get("variant") or KINDS[run["constrained"]]


def _infeasible(run) -> bool:
    """A constrained run that missed its constraints on validation: drawn dashed."""
    return run.get("feasible") is False and bool(run.get("constrained"))


def _color(run) -> str:
    return "tab:green" if run.get("variant") else COLORS[run["constrained"]]


def _style(run):
    return "--" if _infeasible(run) else "-"


def _line(run, seen: set) -> dict:
    """Line keywords of a run: its kind's colour, full strength and a legend entry once per
    kind; an infeasible constrained run under "<kind>, infeasible" (its dashes explained); a
    lane not chosen on validation thin and faint, under "<kind>, lanes not chosen"."""
    faint = run.get("chosen") is False
    kind = f"{_kind(run)}, infeasible" if _infeasible(run) else _kind(run)
    kind = f"{kind}, lanes not chosen" if faint else kind
    label = kind if kind not in seen else None
    seen.add(kind)
    return dict(
        marker="o",
        ms=2 if faint else 3,
        lw=0.8 if faint else 1.5,
        color=_color(run),
        alpha=0.3 if faint else 0.85,
        label=label,
    )


def _axes(n):
    # constrained layout: laid out while the figure is drawn for saving, where tight_layout()
    # draws it once more beforehand (half of a figure's time)
    fig, axes = plt.subplots(1, n, figsize=(5.0 * n, 3.8), squeeze=False, layout="constrained")
    return fig, axes[0]


def _per_model(runs, path: str | Path, title: str, draw, finish) -> None:
    """One panel per model: ``draw(ax, run, seen)`` each run's curve, in order, but a diverged
    run's, which is named in the legend (gray, no curve); then ``finish(ax)`` (axes, labels,
    grid), the model's name as the title and the legend; the figure saved to ``path``."""
    groups = _by_model(runs)
    fig, axes = _axes(len(groups))
    for ax, (name, group) in zip(axes, groups.items(), strict=True):
        seen = set()
        for run in group:
            if run.get("diverged"):
                ax.plot([], [], color="gray", label=f"{_kind(run)} seed {run['seed']}: diverged")
            else:
                draw(ax, run, seen)
        finish(ax)
        ax.set_title(name)
        ax.legend(fontsize=8)
    _suptitle(fig, title)
    savefig_atomic(fig, path, dpi=110)
    plt.close(fig)


def plot_layer_losses(
    runs, path: str | Path, *, gamma_index: int | None = None, title: str = ""
) -> None:
    """Mean test loss at every layer (the paper's Figures 1 and 7), log scale, at test γ index
    ``gamma_index`` (None: each run's own γ_train). A run whose record has ``first_state``
    (its problem starts at that state) is drawn from there, so the axis is the model's own."""

    def draw(ax, run, seen):
        if gamma_index is None:
            losses = np.asarray(at_gamma_train(run, "layer_loss"), float)
        else:
            losses = np.asarray(run["layer_loss"][gamma_index], float)
        first = run.get("first_state", 0)  # a problem that starts past state 0 (the LLM's)
        ax.plot(first + np.arange(losses.size), losses, _style(run), **_line(run, seen))

    def finish(ax):
        ax.set_yscale("log")
        # plain numbers where matplotlib labels a tick (0.0003, 0.682: not 6.82×10⁻¹)
        ax.yaxis.set_major_formatter(_PlainLogFormatter())
        ax.yaxis.set_minor_formatter(_PlainLogFormatter(labelOnlyBase=False))
        ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))  # layers are whole
        ax.set_xlabel("layer l")
        ax.set_ylabel("mean test loss ℓ_l")
        ax.grid(True, which="both", alpha=0.3)

    _per_model(runs, path, title, draw, finish)


class _PlainLogFormatter(ticker.LogFormatter):
    """A log axis's labels as plain numbers (3 significant digits), on the ticks matplotlib's
    own log formatter labels: a loss axis spanning less than a decade read ``6.82×10⁻¹``."""

    def __call__(self, x, pos=None):
        return f"{x:.3g}" if super().__call__(x, pos) else ""


def _ratio_bins(ratios: list[np.ndarray]) -> np.ndarray:
    """60 bins over the panel's ratios (their 0.5-99.5 % range, always holding 1, 5 % margin):
    ratios within a few percent of 1 (a classifier's) were one bar on a fixed [0, 2] axis."""
    pooled = np.concatenate(ratios) if ratios else np.ones(1)
    lo, hi = np.quantile(pooled, [0.005, 0.995]) if pooled.size else (1.0, 1.0)
    lo, hi = min(float(lo), 1.0), max(float(hi), 1.0)
    pad = 0.05 * (hi - lo) or 0.05
    return np.linspace(max(lo - pad, 0.0), hi + pad, 60)


def plot_metric_vs_gamma(
    runs,
    path: str | Path,
    *,
    key: str,
    ylabel: str,
    gamma_train: float | None = None,
    title: str = "",
) -> None:
    """``key`` (a list over test γ) against test γ; γ > γ_train is out of distribution."""

    def draw(ax, run, seen):
        ax.plot(run["test_gamma"], run[key], _style(run), **_line(run, seen))

    def finish(ax):
        if gamma_train is not None:
            ax.axvline(gamma_train, color="k", lw=0.8, ls=":", label="γ_train")
        ax.set_xlabel("test γ")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)

    _per_model(runs, path, title, draw, finish)


def plot_ratio_histograms(
    ratios_by_run: dict[tuple[str, bool], np.ndarray], path: str | Path, *, title: str = ""
) -> None:
    """Histograms of per-sample ratios ℓ_l/ℓ_{l−1} (the paper's Figure 12), ERM vs constrained.

    ``ratios_by_run`` maps (model name, constrained) to a flat array of ratios; empty (every
    run diverged): one panel that says so.
    """
    models = sorted({m for m, _ in ratios_by_run})
    fig, axes = _axes(max(len(models), 1))
    if not models:  # every run diverged: the figure says so rather than failing the job
        axes[0].text(0.5, 0.5, "no run kept its ratios (every run diverged)", ha="center")
        axes[0].set_axis_off()
    for ax, model in zip(axes, models, strict=False):
        kept = {}
        for constrained in (False, True):
            r = ratios_by_run.get((model, constrained))
            if r is not None and np.isfinite(r).any():
                kept[constrained] = r[np.isfinite(r)]
        bins = _ratio_bins(list(kept.values()))
        for constrained, r in kept.items():
            ax.hist(
                np.clip(r, bins[0], bins[-1]),
                bins=bins,
                alpha=0.55,
                density=True,
                color=COLORS[constrained],
                label=f"{KINDS[constrained]} (median {np.median(r):.2f}, "
                f"{100 * np.mean(r < 1):.1f}% < 1)",
            )
        ax.axvline(1.0, color="k", lw=0.8, ls=":")
        ax.set_xlabel("ℓ_l / ℓ_{l-1}")
        ax.set_ylabel("density")
        ax.set_title(model)
        ax.legend(fontsize=8)
    _suptitle(fig, title)
    savefig_atomic(fig, path, dpi=110)
    plt.close(fig)
