"""Output folders and atomic writes: a killed run never leaves a half-written file."""

from __future__ import annotations

import datetime
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["UsageError", "fresh_run_dir", "prepare_output_dir", "to_jsonable", "write_json_atomic"]

RESULT_FILES = ("results.json",)


class UsageError(ValueError):
    """Bad input from the user: the message names the problem and the fix; the CLI exits 2."""


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


def _atomic_write(path: Path, write) -> None:
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    data = json.dumps(to_jsonable(obj), indent=2, allow_nan=False).encode()
    _atomic_write(Path(path), lambda f: f.write(data))


def savefig_atomic(fig, path: str | os.PathLike, **kwargs) -> None:
    """``fig.savefig`` to a temporary name in the same folder, then an atomic rename."""
    fmt = Path(path).suffix.lstrip(".") or "png"
    _atomic_write(Path(path), lambda f: fig.savefig(f, format=fmt, **kwargs))


def fresh_run_dir(experiment: str, root: str | os.PathLike = "runs") -> Path:
    """``runs/<experiment>-<UTC time>``, unique even for two runs started in the same second."""
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d-%H%M%S")
    base = Path(root) / f"{experiment}-{stamp}"
    path, i = base, 1
    while path.exists():
        path, i = Path(f"{base}-{i}"), i + 1
    return path


def prepare_output_dir(out: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """Creates ``out``; refuses a folder that already holds results unless ``overwrite``."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file, not a folder: pass a folder path")
    existing = [name for name in RESULT_FILES if (out / name).exists()]
    if existing and not overwrite:
        raise UsageError(
            f"--out {out} already holds {existing[0]}: pass another --out, or --overwrite to "
            "replace it"
        )
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise UsageError(
            f"cannot write to --out {out} ({e.strerror}): pass a writable folder"
        ) from e
    return out
