"""One job per output folder: a lock on ``--out``, taken before anything is written there.

The lock is ``<out>/cudt.lock``: the holder keeps an exclusive ``fcntl.flock`` on it, which the
kernel releases when the process dies however it dies (SIGKILL included), and writes a one-line
JSON record in it (PID, host, UTC start, a job token, a heartbeat count). A second job on the
folder finds the flock taken and is refused with the holder named (:class:`OutputInUse`): it
creates and changes nothing, since the folder and the lock file are already there. A job that
ends removes the file (while it still holds the lock); a killed one leaves it, and the next job
takes it over, saying whose it was.

Where ``flock`` is not shared between hosts (NFS mounted ``nolock`` or ``local_lock=flock``,
Lustre ``-o localflock``, BeeGFS without global file locks), a holder on another host is invisible
to it, so the record is the fallback: the holder rewrites it every :data:`HEARTBEAT_S` seconds,
and a job that gets the flock on a file naming a process of another host watches the record for
:data:`STALE_AFTER_S` seconds: if it changes, that job is alive and this one is refused; if not,
its lock is taken over. On the same host the flock is the kernel's own and is trusted; where
``flock`` fails outright (ENOLCK), a holder on the same host is alive when its PID is.

A multi-host job: process 0 holds the lock; the other processes check that the record they read
names process 0's job token (:func:`check_job_token`), that is, that ``--out`` is one folder on a
file system every process shares.
"""

from __future__ import annotations

import dataclasses
import datetime
import errno
import fcntl
import functools
import json
import os
import secrets
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from cudt.errors import UsageError
from cudt.io import check_not_a_file, check_writable, remove_created, topmost_missing

__all__ = [
    "HEARTBEAT_S",
    "LOCK_FILE",
    "STALE_AFTER_S",
    "Holder",
    "OutputInUse",
    "OutputLock",
    "check_free",
    "check_job_token",
    "lock_output",
]

LOCK_FILE = "cudt.lock"
HEARTBEAT_S = 5.0  # the holder rewrites its record this often
STALE_AFTER_S = 12.5  # a record of another host unchanged this long: its job no longer runs
_RETRIES = 5  # a taken flock is tried again for a moment (a reader's brief shared lock)
_UNSUPPORTED = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}


@dataclasses.dataclass(frozen=True)
class Holder:
    """Who holds (or held) a lock, as its record says."""

    pid: int | None
    host: str | None
    started: str | None  # ISO UTC
    job: int | None = None  # the job's token (multi-host: process 0's, checked by the others)
    boot: str | None = None  # the holder's kernel boot id (None: a record from before it)

    @classmethod
    def parse(cls, text: str) -> Holder | None:
        try:
            raw = json.loads(text)
            return cls(
                int(raw["pid"]),
                str(raw["host"]),
                raw.get("started"),
                raw.get("job"),
                raw.get("boot"),
            )
        except (ValueError, TypeError, KeyError):
            return None

    def describe(self) -> str:
        when = self.started
        try:
            t = datetime.datetime.fromisoformat(self.started or "")
            when = t.astimezone(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        except ValueError:
            pass
        return f"PID {self.pid} on host {self.host}, started {when or 'at an unknown time'}"

    @property
    def local(self) -> bool:
        """This machine's: its host name and, where both record one, its kernel's boot id
        (containers given one fixed host name on several machines are told apart by it)."""
        boot = _boot_id()
        return self.host == socket.gethostname() and (
            self.boot is None or boot is None or self.boot == boot
        )

    def alive(self) -> bool:
        """Whether this host runs a process with this PID (meaningful only when ``local``)."""
        if self.pid is None:
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # someone else's process: it exists
            return True
        return True


class OutputInUse(UsageError):
    """``--out`` is locked by another job (its holder named)."""


@functools.cache
def _boot_id() -> str | None:
    """This kernel's boot id (Linux), shared by the containers on one machine, not by two."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def _record(token: int, beat: int, started: str) -> bytes:
    return (
        json.dumps(
            {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "boot": _boot_id(),
                "started": started,
                "job": token,
                "beat": beat,
            },
            separators=(",", ":"),
        )
        + "\n"
    ).encode()


def _read(path: Path) -> str | None:
    """The record at ``path`` as text, read through a fresh open (on NFS, close-to-open
    consistency makes that the holder's last flushed record); None when there is no file."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return None


def _in_use(
    out: Path, holder: Holder | None, why: str = "", *, reader: bool = False, what: str = "--out"
):
    who = holder.describe() if holder is not None else f"not yet named in {out / LOCK_FILE}"
    if reader:  # combine, the pages' writer: they read a folder, and a job is writing it
        return OutputInUse(
            f"{out} is being written by a job still running ({who}{why}): wait for it to finish"
        )
    return OutputInUse(
        f"{what} {out} is in use by another job ({who}{why}): wait for it to finish (or stop "
        f"it), or pass another {what}"
    )


def _judge(out: Path, text: str | None, flock_works: bool) -> tuple[Holder | None, str]:
    """Whose the free lock file's record is, once the flock was had (or could not be tried):
    ``(holder, how)`` where ``holder`` is a live job that holds ``out`` (refuse), or None and
    ``how`` says why the record is stale ("" when there is nothing to take over)."""
    holder = Holder.parse(text) if text else None
    if holder is None:
        return None, ""
    if holder.local:
        if holder.pid == os.getpid():
            return None, "left by this process"
        if flock_works or not holder.alive():
            return None, "which is no longer running"
        return holder, ""
    # another host: its flock may not reach us; its heartbeat says whether it still runs
    deadline = time.monotonic() + STALE_AFTER_S
    while time.monotonic() < deadline:
        time.sleep(min(0.5, STALE_AFTER_S / 10))
        now = _read(out / LOCK_FILE)
        if now is None:
            return None, ""  # its job ended meanwhile, removing it
        if now != text:
            return holder, (
                "; its lock is not seen by flock here, but its record is refreshed: "
                "docs/runner.md lists the file systems whose locks every host sees"
            )
    return None, f"from another host: its record was not refreshed for {STALE_AFTER_S:g} s"


def _try_flock(fd: int, how: int) -> bool | None:
    """True: had; False: held by another; None: this file system has no working flock."""
    for attempt in range(_RETRIES):
        try:
            fcntl.flock(fd, how | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if attempt + 1 < _RETRIES:
                time.sleep(0.02)
        except OSError as e:
            if e.errno in _UNSUPPORTED:
                return None
            raise
    return False


class OutputLock:
    """The lock this process holds on an output folder (see the module docstring); release it
    with :meth:`release`, or use it as a context manager."""

    def __init__(self, out: Path, fd: int, created: Path | None, token: int):
        self.out, self.path = out, out / LOCK_FILE
        self.token = token
        self._fd, self._created = fd, created
        self._started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        self._beat = 0
        self._stop = threading.Event()
        self._write()
        self._thread = threading.Thread(target=self._heartbeat, name="cudt-lock", daemon=True)
        self._thread.start()

    def _write(self) -> None:
        data = _record(self.token, self._beat, self._started)
        os.pwrite(self._fd, data, 0)
        os.ftruncate(self._fd, len(data))
        os.fsync(self._fd)

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            self._beat += 1
            try:
                self._write()
            except OSError:  # a full disk: the flock still holds; the next beat tries again
                pass

    def release(self, *, discard: bool = False) -> None:
        """Ends the lock and removes the lock file. ``discard``: the job wrote nothing it keeps
        (refused while opening the folder), so a folder the lock created is removed too."""
        if self._fd < 0:
            return
        self._stop.set()
        self._thread.join()
        try:
            if _same_file(self._fd, self.path):  # never another job's fresh lock file
                self.path.unlink()
        except OSError:
            pass
        os.close(self._fd)
        self._fd = -1
        if discard:  # what it created and nobody has used since
            remove_created(self.out, self._created)

    def __enter__(self) -> OutputLock:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def _same_file(fd: int, path: Path) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def lock_output(out: str | os.PathLike, *, say=None, what: str = "--out") -> OutputLock:
    """Takes the lock on ``out`` (creating the folder if needed) or raises :class:`OutputInUse`
    naming its holder, having created and changed nothing. A stale lock (its process gone) is
    taken over with one line through ``say`` (default: stderr). ``what``: the folder's name in
    the messages, the flag or argument that gave it (``--out``; ``DIR`` of the held-out data's
    writer)."""
    out = Path(out)
    say = say or (lambda line: print(line, file=sys.stderr))
    check_not_a_file(out)
    created = None
    while True:
        if not out.is_dir():
            created = created or topmost_missing(out)
            check_writable(out)  # creates it, or the one-line error
        try:
            fd = os.open(out / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        except FileNotFoundError:  # the folder went away under us: make it again
            continue
        except OSError as e:
            raise UsageError(
                f"cannot write to {what} {out} ({e.strerror or e}): pass a writable folder"
            ) from e
        had = _try_flock(fd, fcntl.LOCK_EX)
        if had is False:
            text = _read(out / LOCK_FILE)
            os.close(fd)
            raise _in_use(out, Holder.parse(text) if text else None, what=what)
        if not _same_file(fd, out / LOCK_FILE):
            os.close(fd)  # its holder removed it between our open and flock: start again
            continue
        text = os.pread(fd, 4096, 0).decode("utf-8", "replace")
        holder, how = _judge(out, text, flock_works=had is True)
        if holder is not None:
            os.close(fd)
            raise _in_use(out, holder, how, what=what)
        if not _same_file(fd, out / LOCK_FILE):
            os.close(fd)  # its job ended while we watched it, removing the file: start again
            continue
        try:
            lock = OutputLock(out, fd, created, secrets.randbits(31))
        except OSError as e:  # no room even for the record: leave nothing behind
            (out / LOCK_FILE).unlink(missing_ok=True)
            os.close(fd)
            remove_created(out, created)
            raise UsageError(
                f"cannot write to {what} {out} ({e.strerror or e}): free disk space or pass a "
                f"writable {what}"
            ) from e
        if how:
            old = Holder.parse(text)
            say(f"warning: {what} {out}: took over the lock of {old.describe()}, {how}")
        return lock


def check_free(folder: str | os.PathLike, *, reader: bool = False) -> None:
    """Raises :class:`OutputInUse` when a job holds ``folder``'s lock (a run in progress);
    reads only: no file is created or changed. ``reader``: the message of a command that only
    reads the folder (combine, the pages' writer), not of a second job on it."""
    folder = Path(folder)
    path = folder / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return  # no lock file (or none readable): no job holds the folder
    try:
        had = _try_flock(fd, fcntl.LOCK_SH)
        text = _read(path)
        if had is False:
            raise _in_use(folder, Holder.parse(text) if text else None, reader=reader)
        if had:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
    holder, how = _judge(folder, text, flock_works=had is True)
    if holder is not None:
        raise _in_use(folder, holder, how, reader=reader)


def check_job_token(out: str | os.PathLike, token: int) -> str | None:
    """For a process other than 0 of a multi-host job: None when ``out``'s lock record names
    process 0's ``token``, else what this process sees there instead."""
    text = _read(Path(out) / LOCK_FILE)
    holder = Holder.parse(text) if text else None
    if holder is not None and holder.job == token:
        return None
    if holder is None:
        return f"no lock file in {out}"
    return f"the lock of another job ({holder.describe()})"
