"""The held-out data sets' writer (``experiments.held_out_data``): refused with one line before
anything is written (docs/errors.md: "Held-out data sets"). Its data sets are tested in
tests/experiments/test_held_out_data.py; the helpers here are in refusals.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from helpers import ROOT, LockHolder, exit_status
from refusals import check, over_cases, tree


def _existing_avenue(root: Path) -> list:
    (root / "Avenue Dataset" / "training_videos").mkdir(parents=True)
    (root / "Avenue Dataset" / "training_videos" / "01.avi").write_bytes(b"my own video")
    return ["plaza", root]


def _file_as_folder(root: Path) -> list:
    (root / "notes.txt").write_text("my notes")
    return ["forum", root / "notes.txt"]


HELD_OUT_CASES = [
    # (case, build(root) -> argv, problem, fix)
    (
        "held-out data set already written",
        _existing_avenue,
        "Avenue Dataset' already exists",
        "pass another folder or remove it",
    ),
    (
        "held-out data folder is a file",
        _file_as_folder,
        "notes.txt' is a file, not a folder",
        "pass a folder to write the data in",
    ),
    (
        "held-out videos of an odd width",
        lambda root: ["plaza", root / "new", "--width", "321"],
        "must be even and at least 32",
        "pass e.g. --width 320 --height 180",
    ),
    (
        "held-out videos too large to hold",
        lambda root: ["plaza", root / "new", "--width", "100000", "--height", "100000"],
        "must be at most 4096, got 100000x100000",
        "pass e.g. --width 320 --height 180",
    ),
    (
        # one video is made whole before it is written: 100,000,000 frames (126 TiB) ran out of
        # memory with a traceback (or were killed), whatever the machine
        "held-out video too long to hold",
        lambda root: ["plaza", root / "new", "--frames", "100000000"],
        "--frames 100000000 at 320x180 needs about 125.7 TiB of memory",
        "pass fewer --frames or a smaller --width and --height",
    ),
    (
        "held-out videos with no test video",
        lambda root: ["plaza", root / "new", "--test-videos", "0"],
        "--test-videos must be >= 1",
        "got 0",
    ),
    (
        "held-out reviews too few",
        lambda root: ["forum", root / "new", "--train", "1"],
        "--train and --test must be >= 2",
        "got 1 and 400",
    ),
    (
        "held-out data folder empty",  # DIR '' (an unset shell variable): it wrote into "."
        lambda root: ["plaza", ""],
        "argument dir: needs a path",
        "pass the folder to write the data set in",
    ),
    (
        "held-out videos in an unknown layout",
        lambda root: ["plaza", root / "new", "--layout", "ucsd"],
        "argument --layout: invalid choice: 'ucsd'",
        "(choose from",
    ),
]


@over_cases(HELD_OUT_CASES)
def test_held_out_data(case, build, problem, fix, tmp_path, capsys, monkeypatch):
    from experiments.held_out_data import main

    root = tmp_path / "data"
    root.mkdir()
    monkeypatch.chdir(root)  # what a relative (or empty) DIR would write lands here
    argv = build(root)
    before = tree(root)
    capsys.readouterr()
    status = exit_status(main, argv)
    captured = capsys.readouterr()
    check(case, status, captured.err, problem, fix)
    assert captured.out == "" and tree(root) == before  # nothing written, nothing created


def test_a_write_that_fails_leaves_no_folder_it_made(tmp_path, monkeypatch):
    """The folders the call created are removed when writing fails (it left an empty one
    behind, found by an audit: frames too large to hold in memory, before the size bound)."""
    import pytest

    from experiments import held_out_data

    def out_of_memory(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(held_out_data, "write_plaza", out_of_memory)
    existing = tmp_path / "mine"
    existing.mkdir()
    with pytest.raises(MemoryError):
        held_out_data.main(["plaza", str(existing / "new" / "data")])
    assert list(existing.iterdir()) == []  # "new" and "new/data" are gone; "mine" is kept
    with pytest.raises(MemoryError):
        held_out_data.main(["plaza", str(existing)])
    assert existing.is_dir() and list(existing.iterdir()) == []  # the user's own folder stays


def test_held_out_data_on_a_full_disk(tmp_path):
    """A write that fails on the disk (a file size limit, as a full disk fails it: the .avi
    encoder's own error included) is one line naming the folder and the fix, exit 2, and the
    folders the call made are gone: the user's folder holds what it held. 200 bytes: room
    for the folder's lock record (about 135 bytes and the host name, at most 64), not for the
    data (a video; dozens of the default forum's 2,400 reviews are longer)."""
    limited = (
        "import os, resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
        "resource.setrlimit(resource.RLIMIT_FSIZE, (200, 200)); "
        "os.execv(sys.executable, [sys.executable, '-m', 'experiments.held_out_data', "
        "*sys.argv[1:]])"
    )
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("my notes")
    before = tree(mine)
    for kind in ("plaza", "forum"):
        argv = [kind, str(mine / "new"), *(["--frames", "8"] if kind == "plaza" else [])]
        proc = subprocess.run(
            [sys.executable, "-c", limited, *argv],
            cwd=ROOT,
            env=dict(os.environ, JAX_PLATFORMS="cpu"),
            capture_output=True,
            text=True,
            timeout=300,
        )
        check(
            "held-out data set on a full disk",
            proc.returncode,
            proc.stderr,
            f"cannot write the data set under '{mine / 'new'}' (File too large)",
            "free disk space or pass another folder",
        )
        assert tree(mine) == before


def test_held_out_data_in_a_folder_another_writer_holds(tmp_path, capsys):
    """A second writer on a folder is refused, naming the first, having written nothing: it
    takes the runner's --out lock. Without it both wrote, and the one that lost the rename
    said 'Directory not empty: free disk space' and removed the folder it had made, with the
    first one's finished data set in it."""
    from experiments.held_out_data import main

    root = tmp_path / "data"
    root.mkdir()
    (root / "notes.txt").write_text("my notes")
    other = LockHolder()  # another held_out_data call (or a run) writing in the folder
    try:
        other.hold(root)
        before = {k: v for k, v in tree(root).items() if k != "cudt.lock"}
        capsys.readouterr()
        status = exit_status(main, ["forum", str(root), "--train", "4", "--test", "4"])
        check(
            "held-out data folder in use by another writer",
            status,
            capsys.readouterr().err,
            f"DIR {root} is in use by another job (PID {other.pid} on host ",
            "wait for it to finish (or stop it), or pass another DIR",
        )
        assert {k: v for k, v in tree(root).items() if k != "cudt.lock"} == before
    finally:
        other.close()
    assert exit_status(main, ["forum", str(root), "--train", "4", "--test", "4"]) == 0
    assert sorted(p.name for p in root.iterdir()) == ["aclImdb", "notes.txt"]  # lock released
