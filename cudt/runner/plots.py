"""Figures written as PNG (atomically): per-layer loss, metric vs test γ, per-sample ratios.

All take the experiment's ``runs`` list (the dicts written to results.json), group them by model
and show ERM and constrained side by side. Infeasible constrained runs are dashed, under their own
legend entry ("constrained, infeasible"), diverged runs are left out of the curves and named in
the legend, so a broken run is never mistaken for a good one. The
lanes the runner did not choose on validation (``chosen: False``, :func:`cudt.runner.choice.
mark_chosen`) are drawn thin and faint, so the chosen setting stands out among tuned lanes; the
ratio histograms, which pool runs, leave them out (:func:`pooled_ratios`).
"""

from __future__ import annotations

import re
import textwrap
from collections import defaultdict
from pathlib import Path

import numpy as np
from matplotlib import ticker

from cudt.io import savefig_atomic
from cudt.runner.record import KINDS, at_gamma_train
from cudt.runner.sweep import label_suffix

__all__ = [
    "gamma_train_text",
    "log_y_axis",
    "panel_names",
    "plot_layer_losses",
    "plot_losses_and_metric",
    "plot_metric_vs_gamma",
    "plot_ratio_histograms",
    "pooled_ratios",
    "wrap_text",
]

COLORS = {False: "tab:blue", True: "tab:red"}


def wrap_text(text: str, chars: int) -> str:
    """``text`` in lines of at most ``chars`` characters, for a figure's title or note: never
    broken inside ``a = b``, ``a > b``, ``a < b``, nor inside a parenthesis of at most half a
    line (a longer one breaks as prose). The figures' one rule (the runner's titles, the
    training curves' panel titles, the paper figures' notes)."""
    # textwrap breaks at ASCII white space only: join what must stay together with NBSP
    text = re.sub(
        r"\([^()]*\)",
        lambda m: m.group(0) if len(m.group(0)) > chars // 2 else m.group(0).replace(" ", "\u00a0"),
        text,
    )
    for op in ("=", ">", "<"):
        text = text.replace(f" {op} ", f"\u00a0{op}\u00a0")
    return textwrap.fill(text, chars)


def _suptitle(fig, title: str) -> None:
    """The figure's title, wrapped to its width (a one-panel figure is 5 inches: a long title
    on one line ran off both edges): :func:`wrap_text`."""
    fig.suptitle(wrap_text(title, max(20, int(fig.get_figwidth() * 10))))  # ~10 chars/in at 12 pt


def _gamma_trains(runs) -> list[float]:
    return sorted({float(r["gamma_train"]) for r in runs if r.get("gamma_train") is not None})


def panel_names(runs) -> list[str]:
    """Each run's panel: its model and depth (a control run, ``run["panel"]``, joins its
    model's), and its γ_train where ``runs`` train at several (a sweep of ``gamma_train``):
    runs at two noise levels in one panel, under one γ_train in the title, read as one
    setting."""
    several = len(_gamma_trains(runs)) > 1
    return [
        f"{run.get('panel', run['model'])}-{run['layers']}"
        + (f", γ_train {float(run['gamma_train']):g}" if several else "")
        for run in runs
    ]


def gamma_train_text(runs, default: float) -> str:
    """``γ_train = x`` for a figure's title: the runs' one γ_train, or, where they train at
    several, that each panel names its own."""
    values = _gamma_trains(runs)
    if len(values) > 1:
        return "each panel's γ_train"
    return f"γ_train = {values[0] if values else default:g}"


def _by_model(runs):
    """Panels by :func:`panel_names`, in order."""
    groups = defaultdict(list)
    for name, run in zip(panel_names(runs), runs, strict=True):
        groups[name].append(run)
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
        marker="s" if run.get("variant") else "o",  # a control, told apart where it overlaps
        ms=2 if faint else 3,
        lw=0.8 if faint else 1.5,
        color=_color(run),
        alpha=0.3 if faint else 0.85,
        label=label,
        # constrained on top: where it equals a control (multipliers at 0) it stays visible
        zorder=2.5 if run.get("constrained") else 2,
    )


def _axes(n):
    # pyplot here, not at import: ~0.4 s of CPU that a process drawing nothing (a refusal, a
    # --help, a process killed while it trains) need not pay
    import matplotlib.pyplot as plt

    # constrained layout: laid out while the figure is drawn for saving, where tight_layout()
    # draws it once more beforehand (half of a figure's time)
    fig, axes = plt.subplots(1, n, figsize=(5.0 * n, 3.8), squeeze=False, layout="constrained")
    return fig, axes[0]


def _close(fig) -> None:
    import matplotlib.pyplot as plt

    plt.close(fig)


def _legend_below(ax) -> None:
    """The panel's legend under its axes, where it can hide no data (inside, matplotlib's
    best place still covered curves and histogram peaks: figures audit); two columns where
    the labels are short enough for two to fit a 5-inch panel's width (two of the ratio
    histogram's side by side were wider than its figure, which collapsed its axes)."""
    labels = ax.get_legend_handles_labels()[1]
    ncols = 2 if max(map(len, labels), default=0) <= 36 else 1
    # its gap to the axes in points (in units of its 8-pt font), under the tick labels and the
    # x label: a fraction of the axes' height shrank with the axes a long legend squeezed
    ax.legend(
        fontsize=8,
        loc="upper center",
        bbox_to_anchor=(0.5, 0.0),
        borderaxespad=4.8,
        ncols=ncols,
        frameon=False,
    )


def _diverged(run) -> str:
    """A diverged run's legend entry: its kind, seed and, where its label has them, the swept
    values after the seed (two ε lanes of one seed that both diverged read apart)."""
    lane = label_suffix(str(run.get("label", "")))
    return f"{_kind(run)} seed {run['seed']}{' ' + lane if lane else ''}: diverged"


def _per_model(runs, path: str | Path, title: str, draw, finish) -> None:
    """One panel per model (:func:`panel_names`): ``draw(ax, run, seen)`` each run's curve, in
    order, but a diverged run's, which is named in the legend (gray, no curve); then
    ``finish(ax, group)`` (axes, labels, grid), the panel's name as the title and the legend;
    the figure saved to ``path``."""
    groups = _by_model(runs)
    fig, axes = _axes(len(groups))
    for ax, (name, group) in zip(axes, groups.items(), strict=True):
        seen = set()
        for run in group:
            if run.get("diverged"):
                ax.plot([], [], color="gray", label=_diverged(run))
            else:
                draw(ax, run, seen)
        finish(ax, group)
        ax.set_title(name)
        _legend_below(ax)
    _suptitle(fig, title)
    savefig_atomic(fig, path, dpi=110, bbox_inches="tight")  # the legends below, the labels
    _close(fig)


def plot_layer_losses(
    runs,
    path: str | Path,
    *,
    gamma_index: int | None = None,
    title: str = "",
    xlabel: str = "layer l",
) -> None:
    """Mean test loss at every layer (the paper's Figures 1 and 7), log scale, at test γ index
    ``gamma_index`` (None: each run's own γ_train). A run whose record has ``first_state``
    (its problem starts at that state) is drawn from there, so the axis is the model's own.
    ``xlabel`` names the axis as the task does (what state 0 is)."""

    def draw(ax, run, seen):
        if gamma_index is None:
            losses = np.asarray(at_gamma_train(run, "layer_loss"), float)
        else:
            losses = np.asarray(run["layer_loss"][gamma_index], float)
        first = run.get("first_state", 0)  # a problem that starts past state 0 (the LLM's)
        ax.plot(first + np.arange(losses.size), losses, _style(run), **_line(run, seen))

    def finish(ax, group):
        log_y_axis(ax)
        ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))  # layers are whole
        ax.set_xlabel(xlabel)
        ax.set_ylabel("mean test loss ℓ_l")
        ax.grid(True, which="both", alpha=0.3)

    _per_model(runs, path, title, draw, finish)


class _PlainLogFormatter(ticker.LogFormatter):
    """A log axis's labels as plain numbers (3 significant digits), on the ticks matplotlib's
    own log formatter labels: a loss axis spanning less than a decade read ``6.82×10⁻¹``."""

    def __call__(self, x, pos=None):
        if not super().__call__(x, pos):
            return ""
        if 1e-6 <= abs(x) < 1e6:  # positional: 0.00009 beside 0.0001, not 9e-05
            return np.format_float_positional(x, precision=3, fractional=False, trim="-")
        return f"{x:.3g}"


# mantissas of a log axis's minor ticks finer than matplotlib's 2..9, tried in turn where fewer
# than 3 of the 1..9×10^k ticks are in view: halves, then steps of 0.1, 0.2 and 0.5
_FINE_SUBS = (
    np.array([1.5, 2, 2.5, 3, 3.5, 4, 4.5, 5, 6, 7, 8, 9]),
    np.concatenate([np.arange(11, 20) / 10, np.arange(10, 25) / 5, np.arange(10, 20) / 2]),
)


class _LogMinorLocator(ticker.LogLocator):
    """matplotlib's minor log ticks (2..9×10^k, or its linear fallback where at most one of
    them is in view), or where those and the decades put fewer than 3 ticks in view (a loss
    axis from 0.0865 to 0.173 showed 0.09 and 0.1 alone), the first of :data:`_FINE_SUBS`
    that puts 3 in view."""

    def __init__(self):
        super().__init__(base=10.0, subs="auto")

    def tick_values(self, vmin, vmax):
        locs = super().tick_values(vmin, vmax)
        lo, hi = sorted((vmin, vmax))
        if not (np.isfinite(lo) and np.isfinite(hi) and lo > 0):
            return locs
        decades = 10.0 ** np.arange(np.floor(np.log10(lo)) - 1, np.ceil(np.log10(hi)) + 1)

        def shown(ticks) -> int:  # with the decades (the major ticks)
            ticks = np.unique(np.concatenate([ticks, decades]))
            return int(np.sum((ticks >= lo) & (ticks <= hi)))

        if shown(locs) >= 3:
            return locs
        for subs in _FINE_SUBS:
            ticks = np.outer(decades, subs).ravel()
            if shown(ticks) >= 3:
                return self.raise_if_exceeds(ticks)
        return locs


def log_y_axis(ax) -> None:
    """A log y axis labelled in plain numbers (0.0003, 0.682: not 6.82×10⁻¹), every tick
    labelled where it spans under a decade (matplotlib's own labels skip 0.0005 there), with
    finer ticks where under three of 1..9×10^k are in view (:class:`_LogMinorLocator`)."""
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(_PlainLogFormatter())
    ax.yaxis.set_minor_locator(_LogMinorLocator())
    ax.yaxis.set_minor_formatter(_PlainLogFormatter(labelOnlyBase=False, minor_thresholds=(2, 1)))


def _ratio_bins(ratios: list[np.ndarray]) -> np.ndarray:
    """Bins over the panel's ratios (their 0.5-99.5 % range, always holding 1, 5 % margin):
    ratios within a few percent of 1 (a classifier's) were one bar on a fixed [0, 2] axis.
    About 2√n of them, 10 to 60: 60 bins over 32 ratios drew spikes."""
    pooled = np.concatenate(ratios) if ratios else np.ones(1)
    lo, hi = np.quantile(pooled, [0.005, 0.995]) if pooled.size else (1.0, 1.0)
    lo, hi = min(float(lo), 1.0), max(float(hi), 1.0)
    pad = 0.05 * (hi - lo) or 0.05
    count = int(np.clip(2 * np.sqrt(max(r.size for r in ratios) if ratios else 1), 10, 60))
    return np.linspace(max(lo - pad, 0.0), hi + pad, count + 1)


def _outside(r: np.ndarray, bins: np.ndarray) -> str:
    """The share of ratios past the bins, drawn in the edge bins, for the legend."""
    share = np.mean((r < bins[0]) | (r > bins[-1]))
    return f", {100 * share:.1f}% in the edge bins" if share > 0 else ""


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

    def finish(ax, group):
        # the panel's own γ_train (several where a sweep trains at several), else the given one
        lines = _gamma_trains(group) or ([] if gamma_train is None else [gamma_train])
        for i, g in enumerate(lines):
            ax.axvline(g, color="k", lw=0.8, ls=":", label=None if i else "γ_train")
        ax.set_xlabel("test γ")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)

    _per_model(runs, path, title, draw, finish)


def plot_losses_and_metric(
    runs,
    out: Path,
    gamma_train: float,
    *,
    loss: str,
    xlabel: str,
    key: str,
    ylabel: str,
    title: str,
) -> list[Path]:
    """Every task's first two figures, in ``out``: ``layer_loss.png`` (:func:`plot_layer_losses`
    at each run's γ_train, titled "mean test ``loss`` at γ_train …") and ``{key}_vs_gamma.png``
    (:func:`plot_metric_vs_gamma`, titled ``title``). Returns their paths."""
    paths = [out / "layer_loss.png", out / f"{key}_vs_gamma.png"]
    at = gamma_train_text(runs, gamma_train)
    plot_layer_losses(runs, paths[0], title=f"mean test {loss} at {at}", xlabel=xlabel)
    plot_metric_vs_gamma(
        runs, paths[1], key=key, ylabel=ylabel, gamma_train=gamma_train, title=title
    )
    return paths


def pooled_ratios(runs, ratios) -> tuple[dict[tuple[str, bool], np.ndarray], dict]:
    """What :func:`plot_ratio_histograms` draws of ``runs`` and their per-sample ``ratios``
    (each an array, NaN where excluded, or None: diverged): the kept ratios pooled per panel
    (:func:`panel_names`, never over γ_train) and kind, and each pool's legend name. A lane
    the runner did not choose on validation (``chosen: False``) is left out, so where it chose
    a point the histogram is that point's, over its seeds ("constrained, chosen point, 3 seeds
    pooled"); where it chose none (no mark), every lane is pooled, and the name counts them."""
    pools: dict[tuple[str, bool], list] = {}
    for name, run, r in zip(panel_names(runs), runs, ratios, strict=True):
        if r is not None and run.get("chosen") is not False:
            pools.setdefault((name, bool(run["constrained"])), []).append((run, np.asarray(r)))
    by_run, names = {}, {}
    for key, pool in pools.items():
        by_run[key] = np.concatenate([r[np.isfinite(r)] for _, r in pool])
        lanes = len({repr(sorted(run.get("hparams", {}).items())) for run, _ in pool})
        seeds = len({run.get("seed") for run, _ in pool})
        chosen = any(run.get("chosen") for run, _ in pool)
        if chosen:
            parts = ["chosen point"] + ([f"{seeds} seeds pooled"] if seeds > 1 else [])
        else:
            counted = [f"{lanes} lanes"] * (lanes > 1) + [f"{seeds} seeds"] * (seeds > 1)
            parts = [" × ".join(counted) + " pooled"] if counted else []
        names[key] = ", ".join([KINDS[key[1]], *parts])
    return by_run, names


def plot_ratio_histograms(
    ratios_by_run: dict[tuple[str, bool], np.ndarray],
    path: str | Path,
    *,
    title: str = "",
    names: dict[tuple[str, bool], str] | None = None,
) -> None:
    """Histograms of per-sample ratios ℓ_l/ℓ_{l−1} (the paper's Figure 12), ERM vs constrained.

    ``ratios_by_run`` maps (model name, constrained) to a flat array of ratios; empty (every
    run diverged): one panel that says so. ``names``: each one's legend entry (by default
    its kind; :func:`pooled_ratios` names what was pooled).
    """
    names = names or {}
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
                label=f"{names.get((model, constrained), KINDS[constrained])} "
                f"(median {np.median(r):.3f}, "
                f"{100 * np.mean(r < 1):.1f}% < 1{_outside(r, bins)})",
            )
        ax.axvline(1.0, color="k", lw=0.8, ls=":")
        ax.set_xlabel("ℓ_l / ℓ_(l−1)")
        ax.set_ylabel("density")
        ax.set_title(model)
        _legend_below(ax)
    _suptitle(fig, title)
    savefig_atomic(fig, path, dpi=110, bbox_inches="tight")  # the legends below, the labels
    _close(fig)
