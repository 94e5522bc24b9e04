"""Output folders and atomic writes: a killed run never leaves a half-written file."""

from __future__ import annotations

import datetime
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from cudt.errors import UsageError

__all__ = [
    "UsageError",
    "check_not_a_file",
    "check_writable",
    "fresh_run_dir",
    "savefig_atomic",
    "to_jsonable",
    "topmost_missing",
    "write_json_atomic",
]

RESULT_FILES = ("results.json",)


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
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def atomic_write(path: Path, write) -> None:
    """Writes through ``write(file)`` to a temporary name beside ``path``, then renames it.

    A failure (a full disk, a kill) leaves the old ``path`` untouched and no temporary behind;
    an ``OSError`` becomes a :class:`UsageError` naming the file and the fix.
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
                f"cannot write {path} ({e.strerror or e}): free disk space or pass a writable --out"
            ) from e
        raise


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    data = json.dumps(to_jsonable(obj), indent=2, allow_nan=False).encode()
    atomic_write(Path(path), lambda f: f.write(data))


def savefig_atomic(fig, path: str | os.PathLike, **kwargs) -> None:
    """``fig.savefig`` to a temporary name in the same folder, then an atomic rename."""
    fmt = Path(path).suffix.lstrip(".") or "png"
    atomic_write(Path(path), lambda f: fig.savefig(f, format=fmt, **kwargs))


def fresh_run_dir(experiment: str, root: str | os.PathLike = "runs") -> Path:
    """``runs/<experiment>-<UTC time>``, unique even for two runs started in the same second."""
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d-%H%M%S")
    base = Path(root) / f"{experiment}-{stamp}"
    path, i = base, 1
    while path.exists():
        path, i = Path(f"{base}-{i}"), i + 1
    return path


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
