"""Checkpoints of a group of runs with orbax: atomic, keep the last k, pin what must survive.

A checkpoint holds everything a run's future depends on: the stacked train states (parameters,
multipliers, slacks, both optimizer states, epsilon, the step — which is also the data position,
since batches are drawn from ``fold_in(key, step)``) and the loop's own bookkeeping (which runs
are frozen after diverging, where they diverged, the metric history so far). Restoring it and
training on gives the same result, bit for bit on CPU, as never stopping.

Layout, one orbax ``CheckpointManager`` per group of runs::

    <dir>/<step>/state   stacked ConstrainedState pytree (orbax StandardSave)
    <dir>/<step>/loop    JSON: frozen runs, divergence records, history, pinned steps

Saves are atomic (orbax writes a temporary folder and renames it when complete), so a run killed
in the middle of a save leaves the previous checkpoint as the latest one; the resumed run removes
the partial folder (:meth:`GroupCheckpointer.discard_interrupted_saves`) and says so. A
checkpoint restores onto any device mesh or process count: every leaf of the restore target
names its sharding (the default device where it names none), and orbax reshards on load.
``pin(step)`` keeps a checkpoint beyond the last-k window: the last good checkpoint before a run
diverged is pinned so it is never deleted by later saves.

An asynchronous save writes while training goes on, so it holds the saved arrays until it is
committed; the next step, which donates its input state, then cannot reuse their buffers and
allocates a second state. On a GPU that second state is in device memory and the saved one in
host memory; on the CPU both are in host memory, so an asynchronous save of a large CPU state
costs a whole extra state of RAM (six SmolLM2 lanes with Adam: 9.7 GB). The default therefore
saves a CPU state larger than a quarter of the available memory synchronously (it returns once
the checkpoint is committed); smaller states and accelerator states are saved asynchronously.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import gc
import inspect
import json
import logging
import os
import re
import shutil
import sys
import time
import traceback
import types
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from cudt.errors import CheckpointError, UsageError
from cudt.io import available_memory, remove_created, topmost_missing

__all__ = [
    "GroupCheckpointer",
    "PinnedOrLatest",
    "available_memory",
    "host_bytes",
    "save_blocks",
    "unreadable_loop",
]


def host_bytes(states: Any) -> int:
    """Bytes of ``states``' arrays that live in host memory (numpy arrays, CPU jax arrays)."""
    total = 0
    for leaf in jax.tree.leaves(states):
        if isinstance(leaf, jax.Array):
            if all(d.platform == "cpu" for d in leaf.devices()):
                total += leaf.nbytes
        elif isinstance(leaf, np.ndarray):
            total += leaf.nbytes
    return total


def save_blocks(states: Any, available: int | None = None) -> bool:
    """Whether the default saves ``states`` synchronously: their host-memory part is larger than
    a quarter of ``available`` (default: :func:`available_memory` now)."""
    available = available_memory() if available is None else available
    return available is not None and host_bytes(states) > available // 4


@dataclasses.dataclass
class PinnedOrLatest:
    """orbax preservation policy: keep the latest ``n`` checkpoints and every pinned step."""

    n: int
    pinned: set[int] = dataclasses.field(default_factory=set)

    def should_preserve(self, checkpoints: Sequence[Any], *, context: Any) -> Sequence[bool]:
        del context
        latest = {c.step for c in checkpoints[-self.n :]} if self.n > 0 else set()
        return [c.step in latest or c.step in self.pinned for c in checkpoints]


# A checkpoint problem's fix in the library's words, and in the command line's (the runner's
# --out, --overwrite, --resume): CheckpointError.cli, which run_cli prints.
_FIXES = {
    "writable": ("use a writable folder", "pass a writable --out"),
    "fresh": ("start without resuming", "start without --resume"),
    "elsewhere": (
        "use another folder, or delete this one to start again",
        "pass another --out, or --overwrite to discard it",
    ),
    "earlier": (
        "delete that folder to resume from an earlier step, or the whole checkpoint folder to "
        "start again",
        "delete that folder to resume from an earlier step, or pass --overwrite to start again",
    ),
    "disk": (
        "free disk space or use a writable folder",
        "free disk space or pass a writable --out",
    ),
}


def _error(problem: str, fix: str) -> CheckpointError:
    library, cli = _FIXES[fix]
    return CheckpointError(f"{problem}: {library}", cli=f"{problem}: {cli}")


def unreadable_loop(where: str | os.PathLike, why: str | None = None) -> CheckpointError:
    """The error of a checkpoint ``where`` (its step's folder) whose loop record cannot be
    read, or (``why``) reads as JSON that is not a record of this group's runs."""
    return _error(
        f"checkpoint {where} is corrupt (its loop record cannot be read"
        + (f": {why})" if why else ")"),
        "earlier",
    )


class GroupCheckpointer:
    """Saves and restores the stacked states of one group of runs (e.g. the seeds of a model).

    Args:
      directory: the group's checkpoint folder (created on the first save).
      keep: how many of the latest checkpoints to keep (pinned ones are kept too).
      asynchronous: True: write in a background thread while training goes on (``wait()``
        blocks until every save has been committed); False: every ``save`` returns once its
        checkpoint is committed; None (default): asynchronous, except for a state in host memory
        (CPU arrays) larger than a quarter of the memory available at the save
        (:func:`save_blocks`), whose asynchronous save would cost a second copy of it.
    """

    def __init__(
        self, directory: str | os.PathLike, *, keep: int = 2, asynchronous: bool | None = None
    ):
        if keep < 1:
            raise CheckpointError(f"keep must be >= 1 checkpoint, got {keep}: pass keep >= 1")
        self.directory = Path(directory).absolute()
        self._created = topmost_missing(self.directory)  # undone if it is only restored from
        self._policy = PinnedOrLatest(keep)
        self._failed = False
        self._closed = False
        self._asynchronous = asynchronous
        options = ocp.CheckpointManagerOptions(
            preservation_policy=self._policy,
            create=True,
            enable_async_checkpointing=asynchronous is not False,
        )
        try:
            with _absl_errors_only():  # a step folder without its metadata: one warning each
                self._manager = ocp.CheckpointManager(self.directory, options=options)
        except (OSError, ValueError) as e:
            raise _error(
                f"cannot open checkpoint folder {self.directory} ({_os_reason(e)})", "writable"
            ) from e
        _QUIET.open_checkpointers += 1
        _quiet_unraisable_hook()
        try:
            self._load_pins()
        except BaseException:
            self.close()
            raise

    def _load_pins(self) -> None:
        latest = self.latest_step()
        if latest is not None:
            # Pins live in the checkpoints themselves, so a resumed process keeps honouring them.
            pinned = self._read_loop(latest).get("pinned", [])
            if not isinstance(pinned, list) or not all(type(p) is int for p in pinned):
                raise unreadable_loop(self.step_dir(latest), f"pinned is {pinned!r}, not steps")
            self._policy.pinned |= set(pinned)

    # -- queries ---------------------------------------------------------------------------------

    def all_steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def step_dir(self, step: int) -> Path:
        return self.directory / str(step)

    def interrupted_saves(self) -> list[int]:
        """The steps whose save was killed before orbax committed it: their temporary folders
        (``<step>.orbax-checkpoint-tmp``) are still here, and the step is not a checkpoint."""
        return sorted(
            int(tmp.name.split(".", 1)[0])
            for tmp in self.directory.glob("*.orbax-checkpoint-tmp*")
            if tmp.name.split(".", 1)[0].isdigit()
        )

    def discard_interrupted_saves(self) -> list[int]:
        """Removes the folders of :meth:`interrupted_saves` (process 0 of a multi-host job;
        before this job saves anything) and returns their steps. orbax would remove such a
        folder itself when it saves that step again, with a warning on stderr for each."""
        steps = self.interrupted_saves()
        if steps and jax.process_index() == 0:
            _remove_tmp_folders(self.directory)
        return steps

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
            json.dumps(loop)
        except (TypeError, ValueError) as e:  # before orbax starts writing anything
            raise UsageError(
                f"the loop record of a checkpoint must be JSON ({e}): pass numbers, strings, "
                "lists and dicts, e.g. float(x) or x.tolist() for an array"
            ) from e
        try:
            self._manager.save(
                int(step),
                args=ocp.args.Composite(
                    state=ocp.args.StandardSave(states), loop=ocp.args.JsonSave(loop)
                ),
                force=True,
            )
        except Exception as e:  # a failed background save surfaces here, or in wait()
            self._write_failed(e)
        if self._asynchronous is None and save_blocks(states):
            self.wait()  # release the arrays before the next step donates them

    def restore(self, abstract_states: Any, step: int | None = None) -> tuple[Any, dict]:
        """``(states, loop)`` of ``step`` (default: the latest) into the structure of
        ``abstract_states`` (a pytree of arrays or ``jax.ShapeDtypeStruct``; None restores the
        raw nested dict of arrays, for inspection)."""
        step = self.latest_step() if step is None else step
        if step is None:
            remove_created(self.directory, self._created)  # a mistyped folder: not left behind
            raise _error(f"no checkpoint in {self.directory}: nothing to resume from", "fresh")
        if step not in self.all_steps():
            raise CheckpointError(
                f"no checkpoint of step {step} in {self.directory} (its steps: "
                f"{self.all_steps() or 'none'}): pass one of them, or None for the latest"
            )
        target = None if abstract_states is None else jax.tree.map(_restore_target, abstract_states)
        where = self.step_dir(step)
        saved = None
        if target is not None:
            # Compare the saved array shapes with this model's before reading any array, so a
            # checkpoint of another model is named as such, not as a corrupt file.
            saved = self._saved_arrays(step)
            runs = None if saved is None else _other_run_count(saved, _leaf_specs(target))
            if runs is not None:  # the same model and optimiser, stacked for another group
                raise _error(
                    f"checkpoint {where} holds {runs[0]} runs (the leading axis of each of its "
                    f"arrays), and the states to restore {runs[1]}: restore it into states of "
                    f"{runs[0]} runs (its sweep points and seeds)",
                    "elsewhere",
                )
            mismatch = None if saved is None else _first_mismatch(saved, _leaf_specs(target))
            if mismatch is not None:
                raise _error(
                    f"checkpoint {where} was written by a different model or optimiser ({mismatch})",
                    "elsewhere",
                )
        _QUIET.restoring += 1  # a failed read's tasks may be collected before the except
        try:
            restored = self._manager.restore(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(target), loop=ocp.args.JsonRestore()
                ),
            )
        except Exception as e:  # orbax raises many types for unreadable or mismatched files
            _QUIET.failed = True
            _close_orbax_stragglers()
            renamed = None if saved is None else _first_renamed(saved, _leaf_specs(target))
            if renamed is not None:  # the same arrays under other names: an older layout
                raise _error(
                    f"checkpoint {where} was written by another version of cudt ({renamed})",
                    "elsewhere",
                ) from e
            raise _error(
                f"checkpoint {where} is corrupt (its arrays cannot be read)", "earlier"
            ) from e
        finally:
            _QUIET.restoring -= 1
        states = restored.state
        if target is not None:
            mismatch = _first_mismatch(_leaf_specs(states), _leaf_specs(target))
            if mismatch is not None:
                raise _error(
                    f"checkpoint {where} was written by a different model or optimiser ({mismatch})",
                    "elsewhere",
                )
        if not isinstance(restored.loop, dict):
            raise unreadable_loop(where, f"{type(restored.loop).__name__}, not a JSON object")
        return states, dict(restored.loop)

    def _saved_arrays(self, step: int) -> dict[tuple[str, ...], tuple] | None:
        """``{path: (shape, dtype)}`` of the arrays saved at ``step`` (None when unreadable)."""
        try:
            with _absl_errors_only():  # orbax warns about optional metadata files
                meta = ocp.StandardCheckpointer().metadata(self.step_dir(step) / "state")
            tree = getattr(meta, "item_metadata", meta)
            return None if tree is None else _leaf_specs(tree)
        except Exception:  # unreadable metadata: the full restore names the checkpoint corrupt
            return None

    def _read_loop(self, step: int) -> dict:
        try:
            restored = self._manager.restore(
                step, args=ocp.args.Composite(loop=ocp.args.JsonRestore())
            )
            return dict(restored.loop)
        except Exception as e:
            _QUIET.failed = True
            raise unreadable_loop(self.step_dir(step)) from e

    def wait(self) -> None:
        """Blocks until every pending asynchronous save is committed."""
        try:
            self._manager.wait_until_finished()
        except Exception as e:
            self._write_failed(e)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._manager.close()
        except Exception as e:
            if not self._failed:  # else already reported by save() or wait()
                self._write_failed(e)
        finally:
            _QUIET.open_checkpointers -= 1
            if self._failed:
                self._remove_partial_saves()

    def _remove_partial_saves(self) -> None:
        """Deletes orbax's temporary folders of failed saves (complete saves are renamed).

        orbax reports a failed save while tensorstore may still be finishing its other writes,
        and such a write can create its folder again inside the one just deleted (seen once in
        a full test run on a loaded machine). So this deletes until none has come back for
        ``_SETTLE_S`` (at most ``_SETTLE_MAX_S``), and once more when the process exits."""
        deadline = time.monotonic() + _SETTLE_MAX_S
        last_seen = time.monotonic()
        while True:
            found = _remove_tmp_folders(self.directory)
            now = time.monotonic()
            if found:
                last_seen = now
            if now - last_seen >= _SETTLE_S or now >= deadline:
                break
            time.sleep(0.02)
        if self.directory not in _SWEEP_AT_EXIT:
            if not _SWEEP_AT_EXIT:
                atexit.register(_sweep_partial_saves)
            _SWEEP_AT_EXIT.add(self.directory)

    def _write_failed(self, error: Exception) -> None:
        """Removes the half-written checkpoint (orbax's temporary folder) and raises a
        :class:`CheckpointError` naming the cause (a full disk, a file size limit, ...)."""
        self._failed = True
        _QUIET.failed = True
        try:  # let orbax's other writer threads of the failed save finish first
            self._manager.wait_until_finished()
        except Exception:
            pass  # the same failure, reported below
        self._remove_partial_saves()
        _ignore_unawaited_writes()
        raise _error(
            f"cannot write checkpoints in {self.directory} ({_os_reason(error)})", "disk"
        ) from error

    def __enter__(self) -> GroupCheckpointer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@contextlib.contextmanager
def _absl_errors_only() -> Iterator[None]:
    """absl's (orbax's) log records below ERROR dropped inside the block: orbax warns on stderr
    of every step folder it lists without its metadata (``Metadata file does not exist``, a
    step half deleted, as a killed job leaves it), which this module reports in its own words
    (a corrupt checkpoint, one line) where it matters."""
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _restore_target(leaf: Any) -> Any:
    """A leaf of a restore target: its shape, dtype and sharding (one without a sharding, such
    as ``jax.eval_shape``'s, lands on the default device, where a new array would). Every leaf
    names where it goes, so orbax reads a checkpoint saved on any other device count or mesh
    into it (resharding on load) instead of asking for the saved topology."""
    target = ocp.utils.to_shape_dtype_struct(leaf)
    if isinstance(target, jax.ShapeDtypeStruct) and target.sharding is None:
        device = jax.local_devices()[0]
        target = jax.ShapeDtypeStruct(
            target.shape, target.dtype, sharding=jax.sharding.SingleDeviceSharding(device)
        )
    return target


def _os_reason(error: BaseException) -> str:
    """The operating-system cause of a failed write, in words (``No space left on device``)."""
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    code = re.search(r"os_error_code='?(\d+)", str(error))  # tensorstore's formatting
    if code:
        return os.strerror(int(code.group(1)))
    return type(error).__name__


class _QuietOrbaxErrors(logging.Filter):
    """Keeps orbax's own reports of a failed save or restore off stderr.

    When a write fails (a full disk) or a checkpoint cannot be read, orbax logs the error with
    tracebacks from its writer threads and again from ``wait_until_finished`` (absl logger),
    asyncio logs the other writes of that save as "exception was never retrieved", and the
    coroutines left unfinished report "Exception ignored in ..." when collected. The same
    failure is raised in the main thread and reported by :class:`GroupCheckpointer` as one
    :class:`CheckpointError` line naming the cause and the fix, so those reports are dropped:
    orbax ERROR records while a checkpointer is open, and, while a restore runs or once a
    checkpointer has failed, asyncio ERROR records and unraisable errors that come from orbax or tensorstore. Other
    records still print.
    """

    open_checkpointers = 0
    failed = False  # sticky: stragglers of a failed save report even after it is closed
    # Restores in progress: orbax's reads of a corrupt file fail as asyncio tasks, which the
    # garbage collector may report ("Task exception was never retrieved") inside orbax's own
    # restore, before the failure reaches the except that sets ``failed`` (seen once in a
    # loaded test run).
    restoring = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR:
            return True
        if record.name == "asyncio":
            text = _record_text(record).lower()
            from_orbax = any(word in text for word in ("orbax", "tensorstore", "ocdbt", "zarr"))
            return not ((self.failed or self.restoring > 0) and from_orbax)
        from_orbax = "orbax" in record.pathname
        return not (from_orbax and (self.open_checkpointers > 0 or self.failed))


def _record_text(record: logging.LogRecord) -> str:
    """A log record's message and the traceback it carries, as text."""
    text = record.getMessage()
    if record.exc_info and record.exc_info[0] is not None:
        text += "".join(traceback.format_exception(*record.exc_info))
    return text


_QUIET = _QuietOrbaxErrors()


def install_log_filters() -> None:
    """Adds the filter above to the absl and asyncio loggers (idempotent). A process-wide
    setting, so entry points call it (:func:`cudt.runner.cli.configure_process`), not ``import``."""
    for name in ("absl", "asyncio"):
        logger = logging.getLogger(name)
        if _QUIET not in logger.filters:
            logger.addFilter(_QUIET)


_READ_COROUTINE = re.compile(r"read|deserial|restore|load")


_SETTLE_S = 0.2  # a failed save's folders are gone once none came back for this long
_SETTLE_MAX_S = 5.0
_SWEEP_AT_EXIT: set[Path] = set()  # folders of failed saves, swept again when the process exits


def _remove_tmp_folders(directory: Path) -> list[Path]:
    """Deletes orbax's temporary folders in ``directory``; returns those it found."""
    found = list(directory.glob("*.orbax-checkpoint-tmp*"))
    for tmp in found:
        shutil.rmtree(tmp, ignore_errors=True)
    return found


def _sweep_partial_saves() -> None:
    for directory in _SWEEP_AT_EXIT:
        _remove_tmp_folders(directory)


def _close_orbax_stragglers() -> int:
    """Closes orbax's coroutines that a failed restore created but never started; returns how
    many. orbax runs a read as ``run_until_complete`` on a fresh event loop and closes the loop
    when the read fails, so the per-array reads still queued (``asyncio.gather`` of
    ``_read_array_index_and_device_put``) are dropped unstarted, and each prints "RuntimeWarning:
    coroutine ... was never awaited" whenever the garbage collector gets to it (after the clear
    error line, or not at all: it depends on which reads had started). Closing them here is
    exact and changes no warning filter of the process. Only reads are touched: an unstarted
    write of another checkpointer's save may still be queued on a live loop."""
    closed = 0
    for obj in gc.get_objects():
        if (
            type(obj) is types.CoroutineType  # not isinstance: it reads proxies' __class__
            and "orbax" in obj.cr_code.co_filename
            and _READ_COROUTINE.search(obj.cr_code.co_name)
            and inspect.getcoroutinestate(obj) == inspect.CORO_CREATED
        ):
            obj.close()
            closed += 1
    return closed


#: what Python says of a write coroutine of a failed orbax save when it is collected unstarted
#: (``async_serialize_from_host.<locals>.write_fragment``, say)
_UNAWAITED_WRITE = r"coroutine '(?:[^']*\.)?[^'.]*(?:serializ|write|save)[^'.]*' was never awaited"


def _ignore_unawaited_writes() -> None:
    """After a failed save: drops the "RuntimeWarning: coroutine ... was never awaited" of its
    write coroutines that never started, which the garbage collector reports whenever it gets
    to them (at exit, after the one error line, in a loaded test run). Unlike a failed read's
    (:func:`_close_orbax_stragglers`), they cannot be closed: an unstarted write of another
    checkpointer's save may be queued beside them. A warning filter on their message alone,
    set once a save has failed; other warnings still print."""
    warnings.filterwarnings("ignore", message=_UNAWAITED_WRITE, category=RuntimeWarning)


def _quiet_unraisable_hook() -> None:
    """Installs (once) an unraisable hook that drops what a failed orbax save or restore leaves
    behind: tensorstore completing the other writes of a failed save calls back into orbax's
    event loop, already closed (``RuntimeError('Event loop is closed')``, from a writer thread,
    while training goes on), and the unfinished read or write coroutines of a failed save or
    restore raise when collected. Other unraisable errors still print."""
    previous = sys.unraisablehook
    if getattr(previous, "_cudt_quiet_orbax", False):
        return

    def hook(unraisable):
        exc, obj = unraisable.exc_value, unraisable.object
        if isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed":
            return
        code = getattr(obj, "cr_code", None)
        if _QUIET.failed and code is not None and "orbax" in code.co_filename:
            return
        previous(unraisable)

    hook._cudt_quiet_orbax = True
    sys.unraisablehook = hook


def _path_names(path) -> tuple[str, ...]:
    """A tree path as plain names, the same for a dataclass field, a dict key or a list index."""
    names = []
    for entry in path:
        for attr in ("key", "name", "idx"):
            if hasattr(entry, attr):
                names.append(str(getattr(entry, attr)))
                break
        else:
            names.append(str(entry))
    return tuple(names)


def _leaf_specs(tree: Any) -> dict[tuple[str, ...], tuple]:
    """``{path: (shape, dtype)}`` of every array leaf of ``tree``."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {
        _path_names(path): (tuple(leaf.shape), np.dtype(leaf.dtype))
        for path, leaf in leaves
        if hasattr(leaf, "shape")
    }


def _first_renamed(saved: dict, expected: dict) -> str | None:
    """The first array ``saved`` names otherwise than ``expected``, in words (None when the two
    name the same arrays): e.g. nuPI's gains, ``kp`` / ``ema_nu`` before they took the knobs'
    names ``nupi_kp`` / ``nupi_ema`` (:mod:`cudt.knobs`)."""
    old, new = sorted(set(saved) - set(expected)), sorted(set(expected) - set(saved))
    if not old or not new:
        return None
    return f"it names {'/'.join(old[0])} where this version has {'/'.join(new[0])}"


def _other_run_count(saved: dict, expected: dict) -> tuple[int, int] | None:
    """``(saved runs, expected runs)`` where two ``{path: (shape, dtype)}`` maps of a group's
    states (two arrays or more) differ only in the leading axis all their arrays share: the
    same model and optimiser, stacked for another number of runs; None otherwise."""
    if set(saved) != set(expected) or len(saved) < 2:
        return None
    leads = []
    for specs in (saved, expected):
        if any(len(shape) == 0 for shape, _ in specs.values()):
            return None
        leads.append({shape[0] for shape, _ in specs.values()})
    if any(len(lead) != 1 for lead in leads) or leads[0] == leads[1]:
        return None
    rest = all(
        saved[p][0][1:] == expected[p][0][1:] and saved[p][1] == expected[p][1] for p in saved
    )
    return (leads[0].pop(), leads[1].pop()) if rest else None


def _first_mismatch(saved: dict, expected: dict) -> str | None:
    """The first difference between two ``{path: (shape, dtype)}`` maps, in words (or None)."""

    def spec(s):
        return f"{s[1]}{list(s[0])}"

    def order(path):  # parameters first: they name the model
        return (path[:1] != ("params",), path)

    if set(saved) != set(expected) and sorted(map(spec, saved.values())) == sorted(
        map(spec, expected.values())
    ):
        return None  # the same arrays under other path names: let the restore itself decide

    def differences(params_only: bool):
        def keep(path):
            return (path[:1] == ("params",)) == params_only

        for path in sorted(set(saved) & set(expected), key=order):
            if keep(path) and saved[path] != expected[path]:
                yield f"{'/'.join(path)} is {spec(saved[path])}, expected {spec(expected[path])}"
        for path in sorted(set(expected) - set(saved), key=order):
            if keep(path):
                yield f"it lacks {'/'.join(path)}, expected {spec(expected[path])}"
        for path in sorted(set(saved) - set(expected), key=order):
            if keep(path):
                yield f"it holds {'/'.join(path)} {spec(saved[path])}, which this model lacks"

    # the parameters name the model; then the rest (run counts, optimizer states)
    return next(differences(True), None) or next(differences(False), None)
