"""The held-out data sets' writer (``experiments.held_out_data``): refused with one line before
anything is written (docs/errors.md: "Held-out data sets"). Its data sets are tested in
tests/experiments/test_held_out_data.py; the helpers here are in refusals.py."""

from __future__ import annotations

from pathlib import Path

from helpers import exit_status
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
        "held-out videos in an unknown layout",
        lambda root: ["plaza", root / "new", "--layout", "ucsd"],
        "argument --layout: invalid choice: 'ucsd'",
        "(choose from",
    ),
]


@over_cases(HELD_OUT_CASES)
def test_held_out_data(case, build, problem, fix, tmp_path, capsys):
    from experiments.held_out_data import main

    root = tmp_path / "data"
    root.mkdir()
    argv = build(root)
    before = tree(root)
    capsys.readouterr()
    status = exit_status(main, argv)
    captured = capsys.readouterr()
    check(case, status, captured.err, problem, fix)
    assert captured.out == "" and tree(root) == before  # nothing written, nothing created
