"""The held-out data sets on disk: ``python -m experiments.held_out_data plaza|forum DIR``.

Two generators written for held-out checks and never used to choose anything (issue 47): the
plaza videos (:mod:`cudt.data.video.plaza`) in the CUHK Avenue or ShanghaiTech layout, and the
forum reviews (:mod:`cudt.data.text.forum`) in the aclImdb layout. The command writes one of
them under ``DIR`` and prints the flags that read it back::

    python -m experiments.held_out_data plaza DIR --layout avenue --train-videos 9 --test-videos 3
    python -m experiments.held_out_data forum DIR --train 2000 --test 400

Bad input is one line ``error: <problem>: <fix>`` and exit status 2, with nothing written; the
data set is written into a temporary folder inside ``DIR`` and renamed into place when complete,
so an existing data set is never overwritten and an interrupted write leaves none behind. A
call holds ``DIR``'s lock while it writes (the runner's ``--out`` lock, ``cudt.runner.lock``): a
second call on the folder, or a run whose ``--out`` it is, is refused naming the first.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from cudt.data.text.forum import write_forum
from cudt.data.video.archives import AVENUE, SHANGHAITECH
from cudt.data.video.plaza import LAYOUTS, write_plaza
from cudt.errors import UsageError
from cudt.io import available_memory, remove_created, topmost_missing
from cudt.runner.cli import OneLineParser, exit_process, run_cli
from cudt.runner.lock import lock_output

__all__ = ["main"]

_FOLDERS = {"avenue": AVENUE, "shanghaitech": SHANGHAITECH, "forum": "aclImdb"}


def _folder(text: str) -> Path:
    """DIR: a path (an empty one, a shell variable that was unset, would write into the
    working folder)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("needs a path: pass the folder to write the data set in")
    return Path(text)


def _parser() -> OneLineParser:
    parser = OneLineParser(
        prog="python -m experiments.held_out_data",
        description="Write a held-out data set (never used to choose anything) under DIR: the "
        "plaza videos in the CUHK Avenue or ShanghaiTech layout, or the forum reviews in the "
        "aclImdb layout.",
    )
    sets = parser.add_subparsers(dest="kind", required=True, metavar="{plaza,forum}")
    plaza = sets.add_parser("plaza", help="videos of a camera over a plaza (.avi, JPEG frames)")
    plaza.add_argument("dir", type=_folder, help="the folder to write the data set in")
    plaza.add_argument("--layout", choices=LAYOUTS, default="avenue", help="archive layout")
    plaza.add_argument("--train-videos", type=int, default=9, help="training videos")
    plaza.add_argument("--test-videos", type=int, default=3, help="test videos")
    plaza.add_argument("--frames", type=int, default=48, help="frames per video")
    plaza.add_argument("--width", type=int, default=320, help="frame width (even)")
    plaza.add_argument("--height", type=int, default=180, help="frame height (even)")
    plaza.add_argument("--fps", type=int, default=15, help="frames per second")
    plaza.add_argument("--seed", type=int, default=0, help="the data seed")
    forum = sets.add_parser("forum", help="short informal product reviews (aclImdb layout)")
    forum.add_argument("dir", type=_folder, help="the folder to write the data set in")
    forum.add_argument("--train", type=int, default=2000, help="training reviews")
    forum.add_argument("--test", type=int, default=400, help="test reviews")
    forum.add_argument("--seed", type=int, default=0, help="the data seed")
    return parser


# Host memory that making and writing one plaza video takes, per pixel of its frames: the float32
# frames, and their 8-bit conversion's float64 steps (measured: 21-23 bytes at 320x180)
_PLAZA_BYTES_PER_PIXEL = 24
_UNITS = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20))


def _check_video_fits(ns) -> None:
    """One plaza video is made whole before it is written (write_plaza: one at a time): a
    request whose single video would not fit in the memory available now is refused."""
    need = _PLAZA_BYTES_PER_PIXEL * ns.frames * ns.width * ns.height
    available = available_memory()
    if available is None or need <= available:
        return
    shown = next(f"{need / b:,.1f} {u}" for u, b in _UNITS if need >= b or u == "MiB")
    raise UsageError(
        f"--frames {ns.frames} at {ns.width}x{ns.height} needs about {shown} of memory (each "
        "video is made whole before it is written), more than is available: pass fewer --frames "
        "or a smaller --width and --height"
    )


def _check(ns) -> None:
    """Every refusal before anything is written."""
    if ns.seed < 0:
        raise UsageError(f"--seed must be >= 0, got {ns.seed}")
    if ns.kind == "plaza":
        for flag, value, least in (
            ("--train-videos", ns.train_videos, 1),
            ("--test-videos", ns.test_videos, 1),
            ("--frames", ns.frames, 1),
            ("--fps", ns.fps, 1),
        ):
            if value < least:
                raise UsageError(f"{flag} must be >= {least}, got {value}")
        if ns.width < 32 or ns.height < 32 or ns.width % 2 or ns.height % 2:
            raise UsageError(
                f"--width and --height must be even and at least 32 (the .avi encoder's yuv420p "
                f"halves them), got {ns.width}x{ns.height}: pass e.g. --width 320 --height 180"
            )
        if max(ns.width, ns.height) > 4096:  # every frame is held in memory while it is made
            raise UsageError(
                f"--width and --height must be at most 4096, got {ns.width}x{ns.height}: pass "
                "e.g. --width 320 --height 180"
            )
        if ns.fps > 120:
            raise UsageError(f"--fps must be <= 120, got {ns.fps}")
        _check_video_fits(ns)
    elif ns.train < 2 or ns.test < 2:
        raise UsageError(
            f"--train and --test must be >= 2 (a review of each label), got {ns.train} and "
            f"{ns.test}"
        )
    root = ns.dir.expanduser()
    if root.exists() and not root.is_dir():
        raise UsageError(f"'{root}' is a file, not a folder: pass a folder to write the data in")
    _check_target(ns)


def _check_target(ns) -> None:
    """The data set's folder is not there yet: a data set is never overwritten."""
    target = ns.dir.expanduser() / _FOLDERS[ns.layout if ns.kind == "plaza" else "forum"]
    if target.exists() or target.is_symlink():
        raise UsageError(
            f"'{target}' already exists: pass another folder or remove it (a data set is never "
            "overwritten)"
        )


def _write(ns) -> None:
    """Checks ``ns``, then writes its data set under DIR holding DIR's lock (the runner's
    ``--out`` lock, :func:`cudt.runner.lock.lock_output`): a second writer on the folder is
    refused naming the first, having written nothing, and a failed write leaves nothing behind
    (nor removes what another writer made there)."""
    _check(ns)
    root = ns.dir.expanduser()
    created = topmost_missing(root)  # removed again if the writing fails: nothing left behind
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(
            f"cannot write to '{root}' ({e.strerror or e}): pass a writable folder"
        ) from e
    try:
        with lock_output(root, what="DIR"):
            _check_target(ns)  # again under the lock: another writer may have finished since
            _write_locked(ns, root)
    except BaseException:  # refused or failed: the folders it made, while empty
        remove_created(root, created)
        raise


def _write_locked(ns, root: Path) -> None:
    try:
        staging = Path(tempfile.mkdtemp(prefix=".held-out-", suffix=".tmp", dir=root))
    except OSError as e:
        raise UsageError(
            f"cannot write to '{root}' ({e.strerror or e}): pass a writable folder"
        ) from e
    try:
        if ns.kind == "plaza":
            made = write_plaza(
                staging,
                layout=ns.layout,
                train_videos=ns.train_videos,
                test_videos=ns.test_videos,
                num_frames=ns.frames,
                seed=ns.seed,
                height=ns.height,
                width=ns.width,
                fps=ns.fps,
            )
            what = (
                f"{ns.train_videos} training and {ns.test_videos} test videos of {ns.frames} "
                f"frames ({ns.width}x{ns.height}, {ns.fps} fps) in the {ns.layout} layout"
            )
            flags = f"--dataset {ns.layout}"
        else:
            made = write_forum(staging, train=ns.train, test=ns.test, seed=ns.seed)
            what = f"{ns.train} training and {ns.test} test forum reviews in the aclImdb layout"
            flags = "--dataset aclimdb"
        target = root / made.name
        made.rename(target)
    except BaseException as e:
        if isinstance(e, OSError):  # a full disk, a file size limit (the .avi encoder's too)
            raise UsageError(
                f"cannot write the data set under '{root}' ({e.strerror or e}): free disk space "
                "or pass another folder"
            ) from e
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print(f"wrote {what} to {target}; read it with {flags} --data-dir {shlex.quote(str(target))}")


def main(argv: Sequence[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
    return run_cli(lambda: _write(ns))


if __name__ == "__main__":
    exit_process(main())
