"""Training curves per run: TensorBoard event files and one PNG of multipliers and constraints.

The final numbers in results.json say whether a run ended feasible, not how it got there: a
multiplier that never settles, a constraint that only crosses zero in the last steps or a run
that diverged half-way all look alike at the end. These writers take the per-step curves the
training loop already copied to the host (plain lists or numpy, no jax here) and make them
visible: ``write_tensorboard`` for interactive browsing, ``plot_training_curves`` for a figure
that sits next to the other PNGs of a run folder. Non-finite values are kept as NaN (``None``
from JSON is read as NaN), so a diverged run's curve visibly stops where it broke.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np

from cudt.io import savefig_atomic
from cudt.runner.sweep import label_suffix

__all__ = ["plot_training_curves", "write_tensorboard"]

_VECTORS = ("objective", "lagrangian")
_MATRICES = ("layer_loss", "constraint", "multipliers")
_OPTIONAL_MATRICES = ("slacks",)
_LINESTYLES = ("-", "--", "-.", ":", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 3)))
_EVENT_PREFIX = "events.out.tfevents."


# ----------------------------------------------------------------------------- validation


def _floats(values, what: str) -> np.ndarray:
    """``values`` as a float array, ``None`` read as NaN; a clear ValueError if ragged."""
    try:
        rows = list(values)
    except TypeError:
        raise ValueError(f"{what} must be a list, got {type(values).__name__}") from None
    try:
        if rows and isinstance(rows[0], (list, tuple, np.ndarray)):
            widths = {len(r) for r in rows}
            if len(widths) > 1:
                raise ValueError(
                    f"{what} is ragged: its rows have lengths {sorted(widths)}, expected one"
                )
            rows = [[np.nan if v is None else v for v in r] for r in rows]
        else:
            rows = [np.nan if v is None else v for v in rows]
        arr = np.asarray(rows, dtype=float)
    except (TypeError, ValueError) as e:
        if "ragged" in str(e):
            raise
        raise ValueError(f"{what} must hold only numbers or None ({e})") from None
    return arr


def _checked(run, i: int) -> dict:
    """The run's curves as arrays: steps [K] int, vectors [K], matrices [K, L+1]."""
    if not isinstance(run, dict):
        raise ValueError(f"runs[{i}] must be a dict, got {type(run).__name__}")
    missing = [k for k in ("label", "group", "constrained", "curves") if k not in run]
    if missing:
        raise ValueError(f"runs[{i}] lacks {missing}")
    name = f"run {run['label']!r}"
    curves = run["curves"]
    if not isinstance(curves, dict):
        raise ValueError(f"{name}: 'curves' must be a dict, got {type(curves).__name__}")
    missing = [k for k in ("step", *_VECTORS, *_MATRICES) if k not in curves]
    if missing:
        raise ValueError(f"{name}: curves lack {missing}")

    steps = _floats(curves["step"], f"{name}: curves['step']")
    if steps.ndim != 1:
        raise ValueError(f"{name}: curves['step'] must be a flat list, got shape {steps.shape}")
    if not np.all(np.isfinite(steps)) or np.any(steps != np.round(steps)):
        raise ValueError(f"{name}: curves['step'] must hold whole numbers")
    k = steps.size
    out = {"step": steps.astype(np.int64)}

    for key in _VECTORS:
        arr = _floats(curves[key], f"{name}: curves[{key!r}]")
        if arr.shape != (k,):
            raise ValueError(
                f"{name}: curves[{key!r}] has shape {arr.shape}, expected ({k},) (one per step)"
            )
        out[key] = arr

    width = None
    for key in (*_MATRICES, *_OPTIONAL_MATRICES):
        if key not in curves or curves[key] is None:
            continue
        arr = _floats(curves[key], f"{name}: curves[{key!r}]")
        if k == 0 and arr.size == 0:
            arr = arr.reshape(0, width or 0)
        if arr.ndim != 2 or arr.shape[0] != k:
            raise ValueError(
                f"{name}: curves[{key!r}] has shape {arr.shape}, expected ({k}, L+1): "
                "one row per step, one column per layer"
            )
        if width is None and k:
            width = arr.shape[1]
        elif k and arr.shape[1] != width:
            raise ValueError(
                f"{name}: curves[{key!r}] has {arr.shape[1]} columns but "
                f"{_MATRICES[0]!r} has {width}: every per-layer curve needs L+1 columns"
            )
        out[key] = arr
    return out


# ----------------------------------------------------------------------------- TensorBoard


def _safe_names(labels) -> list[str]:
    """One path-safe, distinct (also case-insensitively) folder name per label."""
    names, taken = [], set()
    for label in labels:
        base = re.sub(r"[^A-Za-z0-9._=+-]+", "_", str(label)).strip("._")[:100] or "run"
        name, n = base, 2
        while name.casefold() in taken:
            name, n = f"{base}-{n}", n + 1
        taken.add(name.casefold())
        names.append(name)
    return names


def _summary_writer():
    """tensorboardX's ``SummaryWriter``, imported without PyTorch where torch is installed but
    not loaded: tensorboardX's writer imports torch at import time only to accept torch tensors
    (``numpy_compatible``), which cudt never passes, and that import costs 2.5-5 s of every
    run's start (measured: ``python -X importtime -c "import tensorboardX"``, 2.9 s of which
    torch 2.6 s, on this project's 2-core machine). For the length of the import ``import torch``
    raises ImportError, tensorboardX's own fallback for a machine without torch; a process that
    already loaded torch keeps it, and torch imports normally afterwards."""
    if "tensorboardX" not in sys.modules and "torch" not in sys.modules:
        sys.modules["torch"] = None  # type: ignore[assignment]  # ImportError on import
        try:
            import tensorboardX  # noqa: F401
        finally:
            del sys.modules["torch"]
    from tensorboardX import SummaryWriter

    return SummaryWriter


def _write_events(curves: dict, run_dir: Path, tmp_root: Path) -> None:
    SummaryWriter = _summary_writer()  # noqa: N806

    tmp = Path(tempfile.mkdtemp(prefix=f".{run_dir.name}.", suffix=".tmp", dir=tmp_root))
    # tensorboardX logs a warning for every non-finite scalar; NaN is expected here (a diverged
    # run), and thousands of identical lines would bury the run's real messages.
    nan_logger = logging.getLogger("tensorboardX.x2num")
    old_level = nan_logger.level
    nan_logger.setLevel(logging.ERROR)
    try:
        writer = SummaryWriter(logdir=str(tmp), max_queue=1000, flush_secs=3600)
        try:
            width = curves["layer_loss"].shape[1]
            for j, step in enumerate(curves["step"].tolist()):
                writer.add_scalar("train/objective", curves["objective"][j], step)
                writer.add_scalar("train/lagrangian", curves["lagrangian"][j], step)
                for li in range(width):
                    writer.add_scalar(f"layer_loss/l{li}", curves["layer_loss"][j, li], step)
                    writer.add_scalar(f"constraint/g{li}", curves["constraint"][j, li], step)
                    writer.add_scalar(f"multiplier/lambda{li}", curves["multipliers"][j, li], step)
                    if "slacks" in curves:
                        writer.add_scalar(f"slack/u{li}", curves["slacks"][j, li], step)
        finally:
            writer.close()
        # Replace the run's previous event files, so a rewrite never shows a curve twice.
        run_dir.mkdir(parents=True, exist_ok=True)
        for old in run_dir.glob(_EVENT_PREFIX + "*"):
            old.unlink()
        for new in tmp.glob(_EVENT_PREFIX + "*"):
            os.replace(new, run_dir / new.name)
    finally:
        nan_logger.setLevel(old_level)
        shutil.rmtree(tmp, ignore_errors=True)


def write_tensorboard(runs: list[dict], folder: str | os.PathLike) -> list[Path]:
    """One TensorBoard event-file folder per run under ``folder/<run label made path-safe>/``.

    Scalars at ``global_step`` = each training step of the run's curves: ``train/objective``,
    ``train/lagrangian``, ``layer_loss/l{l}``, ``constraint/g{l}``, ``multiplier/lambda{l}``
    and, if the run has slacks, ``slack/u{l}`` for l = 0..L (index 0 is the reference
    constraint). Non-finite values are written as they are (TensorBoard shows NaN). Labels
    that clash once made safe get ``-2``, ``-3``… so two runs never share a folder; rewriting
    a folder replaces its earlier event files. Returns the run folders, in the order of ``runs``.
    Raises ValueError, before writing anything, if a run's curves are missing or ragged.
    """
    checked = [_checked(run, i) for i, run in enumerate(runs)]
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    dirs = [folder / name for name in _safe_names(run["label"] for run in runs)]
    for curves, run_dir in zip(checked, dirs, strict=True):
        _write_events(curves, run_dir, folder)
    return dirs


# ----------------------------------------------------------------------------- figure


def _diverged_at(curves: dict):
    """The first step with a non-finite value in any curve, or None."""
    bad = ~np.isfinite(curves["objective"]) | ~np.isfinite(curves["lagrangian"])
    for key in _MATRICES:
        bad |= ~np.all(np.isfinite(curves[key]), axis=1)
    idx = np.flatnonzero(bad)
    return int(curves["step"][idx[0]]) if idx.size else None


def _isolated(finite: np.ndarray) -> np.ndarray:
    """The finite points whose neighbours are not (a line through them draws nothing)."""
    before = np.concatenate([[False], finite[:-1]])
    after = np.concatenate([finite[1:], [False]])
    return finite & ~before & ~after


def _draw(ax, steps, values, ls, color, stop) -> None:
    """One curve; where the run diverged, an x on its last finite point."""
    # a marker where a point has no finite neighbour (one logged step): a line alone drew nothing
    lone = _isolated(np.isfinite(values))
    ax.plot(steps, values, ls=ls, color=color, lw=1.3, alpha=0.9)
    if lone.any():
        ax.plot(steps[lone], values[lone], ".", color=color, ms=6)
    if stop is not None:
        finite = np.flatnonzero(np.isfinite(values) & (steps < stop))
        if finite.size:
            j = finite[-1]
            ax.plot(steps[j], values[j], "x", color=color, ms=7, mew=1.8)


def _has_reference(run) -> bool:
    """Whether the run's constraint 0 is a reference bound (``ℓ_0 ≤ C``); without one (ERM,
    ``--reference none``) column 0 is recorded as 0 and is no constraint: not drawn."""
    return bool(run["constrained"]) and run.get("hparams", {}).get("reference") is not None


def _panel_title(name: str, what: str, ylabel: str) -> str:
    """A panel's title: a sweep point's long name on two lines or more, not into the next
    panel's title."""
    from cudt.runner.plots import wrap_text

    return wrap_text(f"{name}: {what} {ylabel}", 48)


def _row(fig, ax_lam, ax_g, name: str, group: list) -> None:
    """One run group: λ_l (left) and g_l (right), colour by l, linestyle by run."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import BoundaryNorm
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    width = max(1, max(curves["constraint"].shape[1] for _, curves in group))
    cmap = plt.get_cmap("viridis", width) if width > 2 else None
    norm = BoundaryNorm(np.arange(width + 1) - 0.5, max(width, 2))
    if cmap is None:  # viridis with one or two entries is too pale at the top
        from matplotlib.colors import ListedColormap

        cmap = ListedColormap(["tab:purple", "tab:orange"][:width] or ["tab:purple"])
        norm = BoundaryNorm(np.arange(width + 1) - 0.5, width)
    # Constrained runs, the ones with multipliers, take the plainest linestyles.
    order = sorted(range(len(group)), key=lambda r: not group[r][0]["constrained"])
    styles = {r: _LINESTYLES[i % len(_LINESTYLES)] for i, r in enumerate(order)}

    handles = []
    for r, (run, curves) in enumerate(group):
        stop = _diverged_at(curves)
        steps = curves["step"]
        for li in range(0 if _has_reference(run) else 1, curves["constraint"].shape[1]):
            color = cmap(norm(li))
            _draw(ax_g, steps, curves["constraint"][:, li], styles[r], color, stop)
            if run["constrained"]:
                _draw(ax_lam, steps, curves["multipliers"][:, li], styles[r], color, stop)
        label = str(run["label"])
        if not run["constrained"]:
            label += " (ERM: λ ≡ 0, not drawn)"
        if stop is not None:
            label += f": non-finite from step {stop} (x = last finite)"
        handles.append(Line2D([], [], color="black", ls=styles[r], lw=1.3, label=label))

    ax_g.axhline(0.0, color="black", lw=0.9, ls="--", zorder=0)
    for ax, ylabel, what in ((ax_lam, "λ_l", "multipliers"), (ax_g, "g_l", "constraints")):
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole
        ax.set_ylabel(ylabel)
        ax.set_title(_panel_title(name, what, ylabel), fontsize=10)
        ax.grid(True, alpha=0.3)
    if not any(run["constrained"] for run, _ in group):
        ax_lam.text(
            0.5, 0.5, "ERM only: λ ≡ 0", ha="center", va="center", transform=ax_lam.transAxes
        )
    bar = fig.colorbar(plt.cm.ScalarMappable(norm=norm, cmap=cmap), ax=ax_g, pad=0.01, aspect=15)
    reference = any(_has_reference(run) for run, _ in group)
    bar.set_label("constraint l (0 = reference)" if reference else "constraint l (no reference)")
    bar.set_ticks(range(width) if width <= 13 else np.linspace(0, width - 1, 7).round())
    # The runs' legend goes right of the colour bar, outside the data.
    bar.ax.legend(
        handles=handles,
        loc="upper left",
        bbox_to_anchor=(3.4, 1.0),
        fontsize=8,
        frameon=False,
        title=name,
        title_fontsize=9,
        alignment="left",
    )


def _point_name(group: list) -> str:
    """What a sweep point's runs share in their labels after ``seed N`` (``eps=0.02 dlr=10``),
    after their kind (every run of a row is of one kind: :func:`_rows`)."""
    run = group[0][0]
    kind = "constrained" if run["constrained"] else "ERM"
    point = label_suffix(str(run["label"]))
    # no swept values: one setting of its kind (ERM untuned beside a constrained sweep)
    return f"{kind} {point}" if point else kind


def _rows(groups: dict[str, list]) -> dict[str, list]:
    """The figure's rows: one per run group, or, for a group with more runs than linestyles
    over two or more sweep points or kinds, one per point and kind, so a legend names one
    setting's runs and an ERM run never shares a linestyle with a constrained one (ERM's tuned
    lanes number their points as the constrained lanes do: the same ``sweep_point`` is another
    setting there)."""
    rows = {}
    for name, group in groups.items():
        if len(group) <= len(_LINESTYLES):
            rows[name] = group
            continue
        points = defaultdict(list)
        for run, curves in group:
            key = (not run["constrained"], int(run.get("sweep_point", 0)))  # constrained first
            points[key].append((run, curves))
        if len(points) == 1:  # many seeds of one point and kind: one row
            rows[name] = group
            continue
        for key in sorted(points):
            rows[f"{name} {_point_name(points[key])}"] = points[key]
    return rows


def plot_training_curves(runs: list[dict], path: str | os.PathLike, *, title: str = "") -> None:
    """One PNG: a row per run group (per sweep point when a group has more runs than the six
    linestyles), multipliers λ_l (left) and constraints g_l (right) by step.

    One line per constraint l, coloured by l (the colour bar); the runs of a group share the
    axes and are told apart by linestyle, named in the row's legend by their label (with the
    step where a diverged run stopped being finite; an x marks its last finite point). ERM runs
    have λ ≡ 0 and are left out of the λ panel, but their g_l are drawn: they show whether ERM
    would satisfy the constraints. The dashed black line is g = 0 (feasible below).
    Raises ValueError if there is nothing to plot or a run's curves are missing or ragged.
    """
    import matplotlib.pyplot as plt

    if not runs:
        raise ValueError("plot_training_curves needs at least one run")
    checked = [_checked(run, i) for i, run in enumerate(runs)]
    groups = defaultdict(list)
    for run, curves in zip(runs, checked, strict=True):
        groups[str(run["group"])].append((run, curves))
    groups = _rows(dict(sorted(groups.items())))
    # A row is as tall as its legend needs (a line of 8-pt text is about 0.17 in), so a long
    # legend never squeezes the panels to nothing.
    heights = [max(3.6, 0.17 * (len(group) + 3)) for group in groups.values()]

    height = sum(heights)
    fig, axes = plt.subplots(
        len(groups), 2, figsize=(13.0, height), squeeze=False, height_ratios=heights
    )
    # margins in inches, set once: matplotlib's constrained layout measured every text in the
    # figure on each of its passes, 40 % of the figure's time, for the same picture (the
    # legends right of the colour bars are outside the axes; bbox_inches="tight" keeps them).
    # Room for the panel titles' lines (a sweep point's long name wraps, :func:`_row`).
    lines = max(_panel_title(name, "multipliers", "λ_l").count("\n") + 1 for name in groups)
    gap = 0.75 + 0.2 * lines  # between rows: a row's x label and the next row's panel titles
    fig.subplots_adjust(
        top=1 - ((0.6 if title else 0.3) + 0.2 * lines) / height,
        bottom=0.5 / height,
        hspace=gap / (height / len(heights) - gap),
        wspace=0.3,
    )
    try:
        for (name, group), (ax_lam, ax_g) in zip(groups.items(), axes, strict=True):
            _row(fig, ax_lam, ax_g, name, group)
        if title:
            fig.suptitle(title, y=1 - 0.2 / height)  # in inches from the top, as the margins
        savefig_atomic(fig, path, dpi=110, bbox_inches="tight")
    finally:
        plt.close(fig)
