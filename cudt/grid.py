"""What the paper-table jobs share (:mod:`cudt.table3`, video; :mod:`cudt.table4`, text).

A table job is a grid of sub-runs, each ONE :func:`cudt.runner.run` call (γ_train × sweep point
× seed as one vmapped program), in its own folder under ``--out``. Shared here: the checks of
the grid flags, the reuse/refusal rule of a sub-run folder, the training loop over sub-runs, the
row of the best run of each setting, the CSV writer and the figure helpers.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from cudt.errors import UsageError
from cudt.experiment import CHECKPOINTS, CONFIG_FILE
from cudt.io import _atomic_write, savefig_atomic, to_jsonable

__all__ = [
    "SubRun",
    "best_of_setting",
    "check_grid_flags",
    "check_subrun",
    "csv_text",
    "draw_line",
    "figure_note",
    "fmt",
    "grid_axes",
    "peak",
    "save_figure",
    "train_subruns",
    "unique",
    "write_text",
]

KIND = {False: "ERM", True: "constrained"}


# --------------------------------------------------------------------------------------------------
# Flags
# --------------------------------------------------------------------------------------------------


def finite(values) -> bool:
    return all(isinstance(v, int) or math.isfinite(v) for v in values)


def unique(values) -> tuple:
    """The values in the order given, each once (a repeated value would be a second sub-run)."""
    return tuple(dict.fromkeys(values))


def fmt(values) -> str:
    return ",".join(f"{v:g}" for v in values)


def check_grid_flags(opts, need: Callable[[bool, str], None], counts: Sequence[str]) -> None:
    """The checks every table config shares: γ_train levels, the headline γ, test γ, the
    tolerance, the positive counts named in ``counts``, and no ``--sweep gamma_train`` (the
    levels are ``--gamma-trains``). ``need(ok, message)`` raises the one-line error."""
    gammas = opts.gamma_trains
    need(
        finite(gammas) and all(g >= 0 for g in gammas),
        "--gamma-trains must all be finite numbers >= 0, got " + ",".join(f"{g:g}" for g in gammas),
    )
    need(
        math.isfinite(opts.headline_gamma) and opts.headline_gamma >= 0,
        f"--headline-gamma must be a finite number >= 0, got {opts.headline_gamma:g}",
    )
    need(
        opts.headline_gamma in gammas,
        f"--headline-gamma {opts.headline_gamma:g} is not among --gamma-trains "
        f"({','.join(f'{g:g}' for g in gammas)}): pass one of them",
    )
    if opts.test_gammas is not None:
        need(
            finite(opts.test_gammas) and all(g >= 0 for g in opts.test_gammas),
            "--test-gammas must all be finite numbers >= 0, got "
            + ",".join(f"{g:g}" for g in opts.test_gammas),
        )
    if opts.tolerance is not None:
        need(
            math.isfinite(opts.tolerance) and opts.tolerance >= 0,
            f"--tolerance must be a finite number >= 0, got {opts.tolerance:g}",
        )
    for name in counts:
        value = getattr(opts, name)
        need(
            value is None or value >= 1,
            f"--{name.replace('_', '-')} must be >= 1, got {value}",
        )
    for item in opts.sweep:
        name = item.partition("=")[0].strip().replace("-", "_")
        need(
            name != "gamma_train",
            "--sweep gamma_train: the training levels are --gamma-trains (every sub-run "
            "sweeps them): pass --gamma-trains " + item.partition("=")[2],
        )


# --------------------------------------------------------------------------------------------------
# Sub-runs: reuse, refusal, training
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class SubRun:
    """One runner call of a table: its config (a task's RunConfig) and folder.

    ``key`` is what the table calls it (``(dataset, L)`` for video, ``(dataset, model, L)`` for
    text); ``resolved``: config fields whose default the task resolves into results.json (the
    text task writes its default ``lr`` there), as resolved now; ``finished`` is set by
    :func:`check_subrun` when its results can be reused."""

    name: str
    key: tuple
    cfg: Any
    out: Path
    resolved: dict[str, Any] = dataclasses.field(default_factory=dict)
    finished: bool = False


def _differences(saved: dict, want: dict[str, Any]) -> list[str]:
    want = to_jsonable(want)
    return [
        f"{k}: {saved.get(k)!r} there, {v!r} now"
        for k, v in want.items()
        if saved.get(k) != v  # a field missing there reads None, as the runner's resume rule
    ]


def _refuse(sub: SubRun, what: str, diff: list[str]) -> UsageError:
    shown = "; ".join(diff[:3]) + (f"; and {len(diff) - 3} more" if len(diff) > 3 else "")
    return UsageError(
        f"{sub.out} holds {what} of another config ({shown}): rerun with the flags that made "
        "it, pass another --out, or --overwrite to retrain"
    )


def check_subrun(sub: SubRun, overwrite: bool) -> None:
    """Sets ``sub.finished`` (results.json of the same config: reused); refuses a folder holding
    results or checkpoints of another config unless ``overwrite``."""
    if overwrite:
        return
    results = sub.out / "results.json"
    if results.exists():
        try:
            saved = json.loads(results.read_text())["config"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise UsageError(
                f"{results} is unreadable ({e}): delete {sub.out}, or pass --overwrite"
            ) from e
        diff = _differences(saved, sub.cfg.fingerprint() | sub.resolved)
        if diff:
            raise _refuse(sub, "results", diff)
        sub.finished = True
        return
    saved_config = sub.out / CHECKPOINTS / CONFIG_FILE
    if saved_config.exists():  # the runner resumes these; a foreign one is refused up front
        try:
            saved = json.loads(saved_config.read_text())
        except (OSError, ValueError) as e:
            raise UsageError(
                f"{saved_config} is unreadable ({e}): delete {sub.out}, or pass --overwrite"
            ) from e
        diff = _differences(saved, sub.cfg.fingerprint())  # the runner's own record
        if diff:
            raise _refuse(sub, "checkpoints", diff)


def train_subruns(subs: list[SubRun], make_task: Callable[[], Any]) -> dict[tuple, dict]:
    """Trains every unfinished sub-run with the shared runner (a finished one is reused);
    returns ``{sub.key: its results.json}``."""
    from cudt.runner import run

    results = {}
    for k, sub in enumerate(subs, start=1):
        if sub.finished:
            print(f"[{k}/{len(subs)}] {sub.name}: reusing {sub.out / 'results.json'}")
        else:
            print(f"[{k}/{len(subs)}] {sub.name}: training")
            run(make_task(), sub.cfg, sub.out)
        results[sub.key] = json.loads((sub.out / "results.json").read_text())
    return results


# --------------------------------------------------------------------------------------------------
# Best runs, CSV
# --------------------------------------------------------------------------------------------------


def num(value) -> float:
    return math.nan if value is None else float(value)


def peak(values) -> float:
    """The largest multiplier over training (None, a non-finite one in JSON, reads inf)."""
    vals = [math.inf if v is None else float(v) for v in values]
    return max(vals) if vals else 0.0


def best_of_setting(
    runs: list[dict], constrained: bool, *, score: str, higher: bool
) -> tuple[dict | None, dict[str, Any]]:
    """The run shown for one setting (model, L, kind, γ_train) and its status fields.

    The shown run is the runner's ``best`` mark (the best ``score`` among non-diverged runs that
    are feasible, for constrained ones); where no constrained run is feasible, the best of the
    infeasible ones, flagged (``status`` ``infeasible``); None where every run diverged."""
    best = [r for r in runs if r.get("best")]
    shown = best
    if not best and constrained:  # infeasible: still show its best number, flagged
        alive = [r for r in runs if not r.get("diverged") and math.isfinite(num(r.get(score)))]
        shown = sorted(alive, key=lambda r: r[score], reverse=higher)[:1]
    infeasible = sum(
        (not r.get("diverged")) and constrained and not r.get("feasible") for r in runs
    )
    status = {
        "status": "ok" if best else ("infeasible" if infeasible else "diverged"),
        "runs": len(runs),
        "diverged_runs": sum(bool(r.get("diverged")) for r in runs),
        "infeasible_runs": infeasible,
    }
    return (shown[0] if shown else None), status


def csv_text(rows: Iterable[dict], columns: Sequence[str]) -> str:
    """Long-format CSV of ``rows`` (one best run each): floats to 6 significant digits."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        cells = {}
        for k in columns:
            v = row.get(k)
            if v is None:
                cells[k] = ""
            elif isinstance(v, float):
                cells[k] = "inf" if math.isinf(v) else f"{v:.6g}"
            else:
                cells[k] = v
        writer.writerow(cells)
    return buf.getvalue()


def write_text(path: Path, text: str) -> None:
    data = text.encode()
    _atomic_write(path, lambda f: f.write(data))


# --------------------------------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------------------------------


def draw_line(ax, style: dict, row: dict, x, y, *, has_value: bool, ms: float = 4) -> None:
    """One best run as a line in the project's convention (:mod:`cudt.plots`): an infeasible
    one dashed and named so, one without numbers (diverged) only named in the legend."""
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
        label=style["label"] + ("" if ok else f" ({row['status']})"),
    )


def grid_axes(nrows: int, ncols: int, w: float, h: float, min_width: float = 7.5):
    """A figure of ``nrows × ncols`` panels of ``w × h`` inches (room for a title and a note)."""
    import matplotlib.pyplot as plt

    width = max(w * ncols, min_width)
    fig, axes = plt.subplots(nrows, ncols, figsize=(width, h * nrows + 0.6), squeeze=False)
    return fig, axes


def save_figure(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    # room for the title above the panels and the note under them
    h = fig.get_figheight()
    fig.tight_layout(rect=(0, 0.3 / h, 1, 1 - 0.3 / h))
    savefig_atomic(fig, path, dpi=100)
    plt.close(fig)


def figure_note(fig, text: str) -> None:
    """A grey line under the panels (how the runs shown were chosen)."""
    fig.text(0.5, 0.005, text, ha="center", va="bottom", fontsize=8, color="0.35")
