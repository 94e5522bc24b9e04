"""Checkpoints of a group of runs with orbax: atomic, keep the last k, pin what must survive.

A checkpoint holds everything a run's future depends on: the stacked train states (parameters,
multipliers, slacks, both optimizer states, epsilon, the step — which is also the data position,
since batches are drawn from ``fold_in(key, step)``) and the loop's own bookkeeping (which runs
are frozen after diverging, where they diverged, the metric history so far). Restoring it and
training on gives the same result, bit for bit on CPU, as never stopping.

Layout, one orbax ``CheckpointManager`` per group of runs::

    <dir>/<step>/state   stacked TrainState pytree (orbax StandardSave)
    <dir>/<step>/loop    JSON: frozen runs, divergence records, history, pinned steps

Saves are atomic (orbax writes a temporary folder and renames it when complete), so a run killed
in the middle of a save leaves the previous checkpoint as the latest one. ``pin(step)`` keeps a
checkpoint beyond the last-k window: the last good checkpoint before a run diverged is pinned so
it is never deleted by later saves.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

from cudt.errors import CheckpointError

__all__ = ["GroupCheckpointer", "PinnedOrLatest"]


@dataclasses.dataclass
class PinnedOrLatest:
    """orbax preservation policy: keep the latest ``n`` checkpoints and every pinned step."""

    n: int
    pinned: set[int] = dataclasses.field(default_factory=set)

    def should_preserve(self, checkpoints: Sequence[Any], *, context: Any) -> Sequence[bool]:
        del context
        latest = {c.step for c in checkpoints[-self.n :]} if self.n > 0 else set()
        return [c.step in latest or c.step in self.pinned for c in checkpoints]


class GroupCheckpointer:
    """Saves and restores the stacked states of one group of runs (e.g. the seeds of a model).

    Args:
      directory: the group's checkpoint folder (created on the first save).
      keep: how many of the latest checkpoints to keep (pinned ones are kept too).
      asynchronous: write in a background thread while training goes on; ``wait()`` blocks
        until every save has been committed.
    """

    def __init__(self, directory: str | os.PathLike, *, keep: int = 2, asynchronous: bool = True):
        if keep < 1:
            raise CheckpointError(f"keep must be >= 1 checkpoint, got {keep}: pass keep >= 1")
        self.directory = Path(directory).absolute()
        self._policy = PinnedOrLatest(keep)
        options = ocp.CheckpointManagerOptions(
            preservation_policy=self._policy,
            create=True,
            enable_async_checkpointing=asynchronous,
        )
        try:
            self._manager = ocp.CheckpointManager(self.directory, options=options)
        except (OSError, ValueError) as e:
            raise CheckpointError(
                f"cannot open checkpoint folder {self.directory} ({e}): pass a writable --out"
            ) from e
        latest = self.latest_step()
        if latest is not None:
            # Pins live in the checkpoints themselves, so a resumed process keeps honouring them.
            self._policy.pinned |= set(self._read_loop(latest).get("pinned", []))

    # -- queries ---------------------------------------------------------------------------------

    def all_steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def step_dir(self, step: int) -> Path:
        return self.directory / str(step)

    @property
    def pinned(self) -> set[int]:
        return set(self._policy.pinned)

    # -- save / restore --------------------------------------------------------------------------

    def pin(self, step: int) -> None:
        """Keep checkpoint ``step`` forever (recorded in every later checkpoint)."""
        self._policy.pinned.add(int(step))

    def save(self, step: int, states: Any, loop: dict[str, Any]) -> None:
        """Atomically saves ``states`` (a pytree of arrays) and ``loop`` (JSON) at ``step``."""
        loop = dict(loop, pinned=sorted(self._policy.pinned))
        try:
            self._manager.save(
                int(step),
                args=ocp.args.Composite(
                    state=ocp.args.StandardSave(states), loop=ocp.args.JsonSave(loop)
                ),
                force=True,
            )
        except OSError as e:
            raise CheckpointError(
                f"cannot write checkpoint {self.step_dir(step)} ({e.strerror or e}): free disk "
                "space or pass another --out"
            ) from e

    def restore(self, abstract_states: Any, step: int | None = None) -> tuple[Any, dict]:
        """``(states, loop)`` of ``step`` (default: the latest) into the structure of
        ``abstract_states`` (a pytree of arrays or ``jax.ShapeDtypeStruct``; None restores the
        raw nested dict of arrays, for inspection)."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise CheckpointError(f"no checkpoint in {self.directory}: nothing to resume from")
        target = (
            None
            if abstract_states is None
            else jax.tree.map(ocp.utils.to_shape_dtype_struct, abstract_states)
        )
        try:
            restored = self._manager.restore(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(target), loop=ocp.args.JsonRestore()
                ),
            )
        except Exception as e:  # orbax raises many types for unreadable or mismatched files
            first_line = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
            raise CheckpointError(
                f"cannot restore checkpoint {self.step_dir(step)} ({type(e).__name__}: "
                f"{first_line}): it is corrupt or from a different model; delete that folder to "
                "resume from an earlier step, or pass --overwrite to start again"
            ) from e
        states = restored.state
        mismatch = None if target is None else _first_mismatch(states, target)
        if mismatch is not None:
            raise CheckpointError(
                f"checkpoint {self.step_dir(step)} does not fit this model ({mismatch}): it was "
                "written by a different model or config; pass another --out, or --overwrite"
            )
        return states, dict(restored.loop)

    def _read_loop(self, step: int) -> dict:
        try:
            restored = self._manager.restore(
                step, args=ocp.args.Composite(loop=ocp.args.JsonRestore())
            )
            return dict(restored.loop)
        except Exception as e:
            raise CheckpointError(
                f"cannot read checkpoint {self.step_dir(step)} ({type(e).__name__}): it is "
                "corrupt; delete that folder to resume from an earlier step, or pass --overwrite"
            ) from e

    def wait(self) -> None:
        """Blocks until every pending asynchronous save is committed."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.close()

    def __enter__(self) -> GroupCheckpointer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _first_mismatch(restored: Any, target: Any) -> str | None:
    paths_r = jax.tree_util.tree_flatten_with_path(restored)[0]
    paths_t = jax.tree_util.tree_flatten_with_path(target)[0]
    if len(paths_r) != len(paths_t):
        return f"{len(paths_r)} arrays, expected {len(paths_t)}"
    for (path, a), (_, t) in zip(paths_r, paths_t, strict=True):
        if tuple(a.shape) != tuple(t.shape) or a.dtype != t.dtype:
            name = jax.tree_util.keystr(path)
            return f"{name} is {a.dtype}{list(a.shape)}, expected {t.dtype}{list(t.shape)}"
    return None
