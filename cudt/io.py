"""Output folders and atomic writes: a killed run never leaves a half-written file."""

from __future__ import annotations

import contextlib
import datetime
import errno
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from cudt.errors import UsageError

__all__ = [
    "UsageError",
    "atomic_output",
    "available_memory",
    "check_creatable",
    "check_fresh_output",
    "check_not_a_file",
    "check_writable",
    "claimed_run_dir",
    "contains",
    "digest",
    "fresh_run_dir",
    "given_out",
    "json_digest",
    "remove_created",
    "save_safetensors",
    "savefig_atomic",
    "to_jsonable",
    "topmost_missing",
    "write_json_atomic",
]

RESULT_FILES = ("results.json",)


def digest(arrays) -> str:
    """A short digest of arrays' bytes, in order: what a checkpoint was trained on or over
    (training examples, frozen pretrained weights), whatever flags or paths produced it; a
    resume over other contents is refused by it (``*_digest`` in a task's fingerprint)."""
    h = hashlib.sha256()
    for a in arrays:  # their bytes read in place: a copy of a large training set costs its size
        h.update(np.ascontiguousarray(a).reshape(-1).view(np.uint8))
    return h.hexdigest()[:16]


def json_digest(value: Any) -> str:
    """:func:`digest` of a JSON value (keys sorted): a model's settings as parsed from its
    files (its config.json: another activation or layer-norm eps over the same weights is
    another model), so that neither the files' key order nor keys the loader ignores count."""
    text = json.dumps(value, sort_keys=True)
    return digest([np.frombuffer(text.encode(), np.uint8)])


def to_jsonable(obj: Any) -> Any:
    """numpy/jax scalars and arrays to plain Python (NaN/inf become None: strict JSON)."""
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if hasattr(obj, "__array__") and not isinstance(obj, (str, bytes)):
        arr = np.asarray(obj)
        if arr.ndim == 0:
            return to_jsonable(arr.item())
        return [to_jsonable(v) for v in arr.tolist()]
    if isinstance(obj, float) and not np.isfinite(obj):
        return None
    if isinstance(obj, (np.bool_,)):
        return bool(obj)
    return obj


def _file_mode(path: Path) -> int:
    """The mode a plain ``open(path, "w")`` would give: the old file's, else 0666 - umask."""
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        return 0o666 & ~_umask()


def atomic_write(path: Path, write, *, flag: str = "--out") -> None:
    """Writes through ``write(file)`` to a temporary name beside ``path``, then renames it.

    A failure (a full disk, a kill) leaves the old ``path`` untouched and no temporary behind;
    an ``OSError`` becomes a :class:`UsageError` naming the file and the fix (free disk space
    or pass another ``flag``, the option that chose the folder).
    """
    path = Path(path)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _file_mode(path))  # mkstemp makes 0600; give the usual permissions
        os.replace(tmp, path)
    except BaseException as e:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise UsageError(
                f"cannot write {path} ({e.strerror or e}): free disk space or pass a writable {flag}"
            ) from e
        raise


def check_fresh_output(
    path: str | os.PathLike, *, overwrite: bool = False, flag: str, replace: str = ""
) -> Path:
    """``path`` as an output to create: refused (one line naming ``flag``) when it holds
    something already (a file, or a folder that is not empty) unless ``overwrite`` (the fix
    names ``replace``, the way to ask for that), when its folder is a file, or when it is the
    working folder (written by renaming a new folder over it)."""
    path = Path(path).expanduser()
    parent = next((p for p in path.parents if p.exists()), None)
    if parent is not None and not parent.is_dir():
        raise UsageError(f"{flag} {path}: {parent} is a file, not a folder: pass another path")
    taken = path.is_file() or (path.is_dir() and any(path.iterdir()))
    if taken and path.is_dir():  # never replaced: refused before ``replace`` is offered
        _check_replaceable(path, flag)
    if taken and not overwrite:
        what = "is a file already" if path.is_file() else "already exists and is not empty"
        raise UsageError(
            f"{flag} {path} {what}: pass another path"
            + (f", or {replace} to replace it" if replace else ", or delete it first")
        )
    if not taken and path.is_dir() and contains(path, Path.cwd()):  # an empty working folder
        raise UsageError(
            f"{flag} {path} is the working folder {Path.cwd()}: the output is renamed into "
            f"place, replacing that folder; pass a new folder inside it, such as {path / 'models'}"
        )
    return path


def check_creatable(path: str | os.PathLike, flag: str) -> None:
    """That ``path`` can be created: a folder made and removed again in its nearest existing
    folder (nothing is left), so a read-only or full target is refused before any work."""
    parent = next((p for p in Path(path).expanduser().absolute().parents if p.exists()), None)
    if parent is None or not parent.is_dir():
        return  # check_fresh_output names a parent that is a file
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".write-test.", dir=parent))
    except OSError as e:
        raise UsageError(
            f"cannot write {flag} {path} in {parent} ({e.strerror or e}): pass a writable path"
        ) from e


def contains(folder: str | os.PathLike, path: str | os.PathLike) -> bool:
    """Whether ``path`` is ``folder`` or lies inside it (both resolved: links, ``..``, ``~``)."""
    folder, path = Path(folder).expanduser().resolve(), Path(path).expanduser().resolve()
    return folder == path or folder in path.parents


# What replacing a folder must never delete: an experiment's run (its results, its lock), found
# this many levels down at most (an export folder is shallow; a run inside one is a mistake).
_RUN_FILES, _RUN_DEPTH = (*RESULT_FILES, "cudt.lock"), 3


def _check_replaceable(path: Path, flag: str) -> None:
    """A folder to replace is refused when it holds the working folder or an experiment's run
    (e.g. ``--export`` pointed at the run's own ``--out`` or a folder above it)."""
    if contains(path, Path.cwd()):
        raise UsageError(
            f"{flag} {path} holds the working folder {Path.cwd()}: replacing it would delete "
            "that; pass another path"
        )
    for depth in range(_RUN_DEPTH):
        for name in _RUN_FILES:
            found = next(path.glob("/".join(["*"] * depth + [name])), None)
            if found is not None:
                raise UsageError(
                    f"{flag} {path} holds an experiment's run ({found}): replacing it would "
                    "delete the run; pass another path"
                )


def atomic_output(
    path: str | os.PathLike,
    write: Callable[[Path], object],
    *,
    overwrite: bool = False,
    flag: str = "the output",
    replace: str = "",
) -> Path:
    """Creates the file or folder ``path`` through ``write(tmp)`` at a temporary name beside
    it, then renames it into place, so a failure (a full disk, a kill, a bad input found
    late) leaves the old ``path`` as it was, or nothing, never half of it.

    ``path`` must be free (:func:`check_fresh_output`): with ``overwrite``, what it holds is
    replaced (a folder after the new one is complete). An ``OSError`` becomes a
    :class:`UsageError` naming ``path``."""
    path = check_fresh_output(path, overwrite=overwrite, flag=flag, replace=replace)
    missing = [p for p in path.parents if not p.exists()]  # created here, removed on failure
    stage, created = None, (missing[-1] if missing else None)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
        target = stage / path.name
        write(target)
        # the usual permissions: writers that go through mkstemp (safetensors does) and mkdtemp
        # make their files 0600 and folders 0700
        for item in (target, *(target.rglob("*") if target.is_dir() else ())):
            if not item.is_symlink():
                item.chmod((0o777 if item.is_dir() else 0o666) & ~_umask())
        if target.is_dir():
            if path.exists():  # empty, or replaced (overwrite): set aside, then removed
                aside = stage / ".replaced"
                path.rename(aside)
                try:
                    target.rename(path)
                except BaseException:
                    aside.rename(path)
                    raise
            else:
                target.rename(path)
        else:
            os.replace(target, path)
    except BaseException as e:
        if stage is not None:  # before its parents go
            shutil.rmtree(stage, ignore_errors=True)
        remove_created(path.parent, created)  # leave no empty folders behind
        if isinstance(e, OSError):
            raise UsageError(
                f"cannot write {path} ({e.strerror or e}): free disk space or pass a writable path"
            ) from e
        raise
    finally:
        if stage is not None:
            shutil.rmtree(stage, ignore_errors=True)
    return path


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def save_safetensors(tensors: dict, path: str | os.PathLike, metadata=None) -> None:
    """``safetensors.numpy.save_file``, its I/O failures (a full disk: a ``SafetensorError``,
    not an ``OSError``) raised as the ``OSError`` they are, which :func:`atomic_output` and
    the experiments turn into one line naming the path."""
    import safetensors.numpy
    from safetensors import SafetensorError

    try:
        safetensors.numpy.save_file(tensors, str(path), metadata=metadata)
    except SafetensorError as e:
        raise OSError(errno.EIO, str(e), str(path)) from e


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    data = json.dumps(to_jsonable(obj), indent=2, allow_nan=False).encode()
    atomic_write(Path(path), lambda f: f.write(data))


def savefig_atomic(fig, path: str | os.PathLike, **kwargs) -> None:
    """``fig.savefig`` to a temporary name in the same folder, then an atomic rename."""
    fmt = Path(path).suffix.lstrip(".") or "png"
    atomic_write(Path(path), lambda f: fig.savefig(f, format=fmt, **kwargs))


def fresh_run_dir(
    experiment: str, root: str | os.PathLike = "runs", *, claim: bool = False
) -> Path:
    """``runs/<experiment>-<UTC time>`` (``-1``, ``-2``, ... after it when taken). ``claim``:
    the folder is created here, atomically, so two jobs choosing in the same second get two
    folders; otherwise the name is only free when chosen (a job that creates it later may find
    another job's there)."""
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d-%H%M%S")
    base = Path(root) / f"{experiment}-{stamp}"
    path, i = base, 1
    while True:
        if claim:
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                path.mkdir()
                return path
            except FileExistsError:
                pass
        elif not path.exists():
            return path
        path, i = Path(f"{base}-{i}"), i + 1


@contextlib.contextmanager
def claimed_run_dir(given: str | os.PathLike | None, experiment: str) -> Iterator[Path]:
    """A job's ``--out``: ``given``, or a fresh ``runs/<experiment>-<UTC time>`` created here
    atomically (:func:`fresh_run_dir` with ``claim``), so two jobs started in the same second
    get two folders. If the ``with`` block fails, the claimed folder is removed while it is
    still empty (a refusal leaves nothing behind); ``given`` is never touched, and an empty
    one is refused (it is not "no --out": a fresh folder would be written unasked)."""
    if given is not None:
        yield given_out(given)
        return
    created = topmost_missing("runs")  # "runs/" too, when this job made it
    path = fresh_run_dir(experiment, claim=True)
    try:
        yield path
    except BaseException:
        remove_created(path, created or path)
        raise


def given_out(given: str | os.PathLike) -> Path:
    """A given ``--out`` as a path; an empty one (``--out ''``, a shell variable that was
    unset) is refused rather than read as the working folder or as no ``--out``."""
    if not str(given).strip():
        raise UsageError(
            "--out needs a path: pass --out DIR, or leave it out for a fresh "
            "runs/<experiment>-<time>"
        )
    return Path(given)


def check_not_a_file(out: str | os.PathLike) -> None:
    """The one-line error for an ``--out`` that is a file."""
    if Path(out).exists() and not Path(out).is_dir():
        raise UsageError(f"--out {out} is a file, not a folder: pass a folder path")


def topmost_missing(path: str | os.PathLike) -> Path | None:
    """The outermost folder that creating ``path`` would create (None when it exists)."""
    missing = None
    for p in (Path(path), *Path(path).parents):
        if p.exists():
            break
        missing = p
    return missing


def remove_created(folder: str | os.PathLike, created: str | os.PathLike | None) -> None:
    """Undoes creating ``folder`` (whose outermost new folder was ``created``, from
    :func:`topmost_missing`) without touching what anyone else put there since: the empty
    folders under ``folder``, then ``folder`` and its parents up to ``created``, each only while
    it is empty. (A ``shutil.rmtree(created)`` would remove a sibling that another job made in
    the meantime, say ``runs/new/a`` beside this job's ``runs/new/b``.)"""
    if created is None:
        return
    folder, created = Path(folder), Path(created)
    if folder != created and created not in folder.parents:
        return
    for root, _, _ in os.walk(folder, topdown=False):
        with contextlib.suppress(OSError):
            os.rmdir(root)
    for p in (folder, *folder.parents):
        try:
            p.rmdir()
        except FileNotFoundError:
            pass
        except OSError:
            return  # not empty: someone's, or left for them
        if p == created:
            return


def check_writable(out: str | os.PathLike) -> Path:
    """Creates ``out`` if needed and proves a file can be written there (a clear error if not)."""
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise UsageError(
            f"cannot write to --out {out} ({e.strerror or e}): pass a writable folder"
        ) from e
    return out


def available_memory() -> int | None:
    """The host memory available to new allocations, in bytes (Linux's MemAvailable), or None
    where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
