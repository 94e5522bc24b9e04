"""Where a result came from: the ``provenance`` record of every ``results.json``.

:func:`provenance` reads the commit of the cudt source tree (and whether its tracked files
differ from it), the command line, the UTC start time, the library versions and the machine.
It never fails a run: whatever cannot be read (no git, not a checkout, no /proc/cpuinfo) is
``None``. Results pages (``python -m experiments.pages``) print it in each block's header.
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["cpu_model", "git_state", "provenance"]


def _git(root: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(root), *args],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def git_state(root: str | os.PathLike | None = None) -> dict[str, Any]:
    """``{"commit": full hash or None, "dirty": bool or None}`` of the git checkout holding
    ``root`` (default: the cudt package); dirty means a tracked file differs from the commit."""
    if root is None:
        import cudt

        root = Path(cudt.__file__).resolve().parent
    head = _git(Path(root), "rev-parse", "HEAD")
    if head is None:
        return {"commit": None, "dirty": None}
    status = _git(Path(root), "status", "--porcelain", "--untracked-files=no")
    return {"commit": head.strip(), "dirty": None if status is None else bool(status.strip())}


def cpu_model(cpuinfo: str | os.PathLike = "/proc/cpuinfo") -> str | None:
    """The first ``model name`` of ``/proc/cpuinfo`` (else ``platform.processor()``, else None)."""
    try:
        for line in Path(cpuinfo).read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or None


def _versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in ("jax", "jaxlib"):
        try:
            out[name] = __import__(name).__version__
        except Exception:  # noqa: BLE001 - provenance never fails a run
            out[name] = None
    return out


def _backend() -> dict[str, Any]:
    try:
        import jax

        return {
            "backend": jax.default_backend(),
            "device_kinds": sorted({d.device_kind for d in jax.devices()}),
            "device_count": jax.device_count(),
        }
    except Exception:  # noqa: BLE001 - provenance never fails a run
        return {"backend": None, "device_kinds": None, "device_count": None}


def provenance(started: datetime.datetime | None = None) -> dict[str, Any]:
    """The record: ``commit``, ``dirty``, ``argv``, ``cwd``, ``started_utc``, ``python``, ``jax``,
    ``jaxlib``, ``platform``, ``cpu``, ``cores``, ``backend``, ``device_kinds``,
    ``device_count``. ``started`` defaults to now."""
    started = started or datetime.datetime.now(datetime.UTC)
    try:
        plat = platform.platform()
    except Exception:  # noqa: BLE001
        plat = None
    try:
        cwd = os.getcwd()
    except OSError:  # the working folder was removed
        cwd = None
    return {
        **git_state(),
        "argv": list(sys.argv),
        "cwd": cwd,  # what the command's relative paths are relative to
        "started_utc": started.astimezone(datetime.UTC).isoformat(timespec="seconds"),
        **_versions(),
        "platform": plat,
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        **_backend(),
    }
