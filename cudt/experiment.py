"""What every experiment shares: its output folder, training groups of runs, verdicts, tables.

An experiment trains *groups* of runs — one group per (model, ERM or constrained), the seeds of a
group stacked and trained together in one vmapped program (:func:`cudt.loop.train_group`) — then
evaluates them and writes ``results.json`` and plots into its output folder::

    <out>/checkpoints/config.json        the config the checkpoints belong to
    <out>/checkpoints/<group>/<step>/    orbax checkpoints of each group (last k, pinned)
    <out>/tensorboard/<run>/             training curves (TensorBoard event files)
    <out>/*.png                          plots (atomic)
    <out>/results.json                   written last (atomic): its presence means "complete"

Rules that keep a user's work safe: a folder holding ``results.json`` is never overwritten without
``--overwrite``; a folder holding checkpoints of the *same* config is resumed; one holding
checkpoints of a different config is refused with the differences named.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from cudt.checkpoint import GroupCheckpointer
from cudt.errors import CudtError, UsageError
from cudt.io import RESULT_FILES, check_writable, to_jsonable, write_json_atomic
from cudt.loop import Divergence, LoopResult, train_group

__all__ = [
    "Column",
    "OutputDir",
    "format_table",
    "open_output",
    "run_group",
    "select_best",
]

CHECKPOINTS = "checkpoints"
CONFIG_FILE = "config.json"


@dataclasses.dataclass(frozen=True)
class OutputDir:
    path: Path
    resuming: bool  # the folder holds checkpoints of this same config

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS

    def group_dir(self, slug: str) -> Path:
        return self.checkpoints / slug


def _differences(old: dict, new: dict) -> list[str]:
    keys = sorted(set(old) | set(new))
    return [f"{k} {old.get(k)!r} -> {new.get(k)!r}" for k in keys if old.get(k) != new.get(k)]


def _topmost_missing(path: Path) -> Path | None:
    """The outermost folder that creating ``path`` would create (None when it exists)."""
    missing = None
    for p in (path, *path.parents):
        if p.exists():
            break
        missing = p
    return missing


def _holds_checkpoints(folder: Path) -> bool:
    """Whether ``folder`` holds a group folder with a saved step (``<group>/<step>/``)."""
    if not folder.is_dir():
        return False
    return any(
        group.is_dir() and any(step.name.isdigit() for step in group.iterdir())
        for group in folder.iterdir()
    )


def open_output(
    out: str | Path,
    config: dict[str, Any],
    *,
    overwrite: bool = False,
    resume: bool = False,
) -> OutputDir:
    """Checks and prepares the output folder of a run of ``config`` (a JSON-able dict).

    * holds ``results.json``: refused unless ``overwrite`` (then its outputs are removed);
    * holds checkpoints of the same config: resumed (``resuming=True``);
    * holds checkpoints of another config, or checkpoints without the config they belong to:
      refused (the differing fields are named) unless ``overwrite``;
    * ``resume=True`` and nothing to resume: refused.
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file, not a folder: pass a folder path")
    config = to_jsonable(config)
    saved_config = out / CHECKPOINTS / CONFIG_FILE
    finished = [name for name in RESULT_FILES if (out / name).exists()]
    if finished and not overwrite:
        raise UsageError(
            f"--out {out} already holds {finished[0]} of a finished run: pass another --out, or "
            "--overwrite to replace it"
        )
    resuming = False
    if saved_config.exists() and not overwrite:
        try:
            old = json.loads(saved_config.read_text())
            if not isinstance(old, dict):
                raise ValueError(f"a JSON {type(old).__name__}, not an object")
        except (OSError, ValueError) as e:  # json.JSONDecodeError is a ValueError
            raise UsageError(
                f"{saved_config} is unreadable ({e}): pass another --out, or --overwrite to start "
                "again"
            ) from e
        diff = _differences(old, config)
        if diff:
            raise UsageError(
                f"--out {out} holds checkpoints of a different config ({'; '.join(diff[:4])}"
                f"{f'; and {len(diff) - 4} more' if len(diff) > 4 else ''}): "
                "pass another --out, rerun with the same flags to resume, or --overwrite to "
                "discard them"
            )
        resuming = True
    elif not overwrite and _holds_checkpoints(out / CHECKPOINTS):
        raise UsageError(
            f"--out {out} holds checkpoints but no {CHECKPOINTS}/{CONFIG_FILE} saying which config "
            "they belong to: pass another --out, or --overwrite to discard them"
        )
    if resume and not resuming:
        raise UsageError(
            f"--resume: {out} holds no checkpoint to resume from: drop --resume to start a new run"
        )
    created = _topmost_missing(out)
    try:
        check_writable(out)
        if overwrite:
            for name in RESULT_FILES:
                (out / name).unlink(missing_ok=True)
            shutil.rmtree(out / CHECKPOINTS, ignore_errors=True)
            shutil.rmtree(out / "tensorboard", ignore_errors=True)
        if not resuming:
            (out / CHECKPOINTS).mkdir(parents=True, exist_ok=True)
            write_json_atomic(saved_config, config)
    except (CudtError, OSError) as e:
        if created is not None:  # a full disk, say: leave no empty folders behind
            shutil.rmtree(created, ignore_errors=True)
        if isinstance(e, OSError):
            raise UsageError(
                f"cannot write to --out {out} ({e.strerror or e}): free disk space or pass a "
                "writable --out"
            ) from e
        raise
    return OutputDir(out, resuming)


def run_group(
    step_fn: Callable,
    states: Any,
    keys: Any,
    make_batch: Callable,
    *,
    name: str,
    labels: Sequence[str],
    num_steps: int,
    chunk_steps: int,
    checkpoint_dir: Path | None,
    checkpoint_every: int | None = None,
    keep_checkpoints: int = 2,
    fault: tuple[Any, int] | None = None,
    log: Callable[[str], None] | None = None,
    **loop_kwargs: Any,
) -> LoopResult:
    """:func:`cudt.loop.train_group` with a progress bar, checkpoints and divergence messages.

    ``labels[r]`` names run ``r`` in messages (e.g. ``"dust-3 constrained seed 1"``);
    ``loop_kwargs`` (``data``, ``extras``, ``shardings``, ``curve_every``) go to the loop.
    """
    log = log or (lambda msg: tqdm.write(msg, file=sys.stderr))

    def report(d: Divergence) -> None:
        where = (
            f"its last good checkpoint, step {d.last_good_checkpoint}, is kept in "
            f"{checkpoint_dir / str(d.last_good_checkpoint)}"
            if d.last_good_checkpoint is not None and checkpoint_dir is not None
            else "no checkpoint was written before it"
        )
        log(
            f"DIVERGED: {labels[d.run]} at step {d.step}: {d.quantity} is non-finite; {where}; "
            "the other runs go on"
        )

    checkpointer = None
    if checkpoint_dir is not None:
        checkpointer = GroupCheckpointer(checkpoint_dir, keep=keep_checkpoints)
    try:
        with tqdm(
            total=num_steps, desc=name, unit="step", leave=True, mininterval=1.0, dynamic_ncols=True
        ) as bar:
            result = train_group(
                step_fn,
                states,
                keys,
                make_batch,
                num_steps,
                chunk_steps=chunk_steps,
                progress=bar,
                checkpointer=checkpointer,
                checkpoint_every=checkpoint_every,
                on_divergence=report,
                fault=fault,
                **loop_kwargs,
            )
    finally:
        if checkpointer is not None:
            checkpointer.close()
    if result.resumed_from is not None:
        log(f"{name}: resumed from the checkpoint at step {result.resumed_from}")
    return result


def select_best(runs: list[dict], score: str, *, higher_is_better: bool) -> None:
    """Marks ``best: True`` on the best run of each setting: (model, layers, constrained,
    gamma_train), across sweep points and seeds.

    A diverged run is never eligible, nor is an infeasible constrained run: a broken run is never
    silently picked as "best". (ERM runs have no constraints to satisfy: their feasibility verdict
    is reported, not required.) A group with no eligible run has no best.
    """
    groups: dict[tuple, list[dict]] = {}
    for run in runs:
        run["best"] = False
        setting = (run["model"], run["layers"], run["constrained"], run.get("gamma_train"))
        groups.setdefault(setting, []).append(run)
    for group in groups.values():
        eligible = [
            r
            for r in group
            if not r.get("diverged")
            and (r.get("feasible") or not r["constrained"])
            and np.isfinite(r.get(score, np.nan))
        ]
        if eligible:
            pick = (max if higher_is_better else min)(eligible, key=lambda r: r[score])
            pick["best"] = True


@dataclasses.dataclass(frozen=True)
class Column:
    header: str
    width: int
    cell: Callable[[dict], str]


def format_table(runs: Iterable[dict], columns: Sequence[Column]) -> str:
    """A fixed-width text table, one row per run."""
    head = " ".join(f"{c.header:>{c.width}}" for c in columns)
    lines = [head, "-" * len(head)]
    for run in runs:
        lines.append(" ".join(f"{c.cell(run):>{c.width}}" for c in columns))
    return "\n".join(lines)


def status_cell(run: dict) -> str:
    """``DIVERGED`` / ``yes`` / ``NO`` (feasibility), ``*`` for the best run of its group."""
    if run.get("diverged"):
        return "DIVERGED"
    return ("yes" if run.get("feasible") else "NO") + ("*" if run.get("best") else " ")
