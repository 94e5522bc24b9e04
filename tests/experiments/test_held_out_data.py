"""``python -m experiments.held_out_data plaza|forum DIR`` (experiments/held_out_data.py): each data
set is written whole under DIR, readable with the flags the command prints, with no staging
folder left behind. Its refusals are in tests/bad_inputs/test_held_out_writer.py
(docs/errors.md)."""

from __future__ import annotations

import shlex

from cudt.data.text import load_text_data
from cudt.data.video import load_videos
from experiments.held_out_data import main


def _printed_flags(out: str) -> tuple[str, str]:
    """``(dataset, data_dir)`` from the line the command prints."""
    flags = shlex.split(out.strip().split("; read it with ", 1)[1])
    return flags[flags.index("--dataset") + 1], flags[flags.index("--data-dir") + 1]


def test_both_data_sets_are_written_and_read_back_with_the_printed_flags(tmp_path, capsys):
    argv = ["plaza", str(tmp_path), "--layout", "shanghaitech", "--train-videos", "2"]
    argv += ["--test-videos", "1", "--frames", "4", "--width", "64", "--height", "48"]
    assert main(argv) == 0
    dataset, data_dir = _printed_flags(capsys.readouterr().out)
    assert dataset == "shanghaitech" and data_dir == str(tmp_path / "shanghaitech")
    videos = load_videos(data_dir, dataset=dataset, size=32)
    assert [v.shape for v in videos["train"] + videos["test"]] == [(4, 32, 32)] * 3

    # a folder whose name holds a quote: the printed command is still one shell line (it was
    # wrapped in bare '...', found by review)
    quoted = tmp_path / "it's data"
    assert main(["forum", str(quoted), "--train", "10", "--test", "6", "--seed", "2"]) == 0
    dataset, data_dir = _printed_flags(capsys.readouterr().out)
    assert dataset == "aclimdb" and data_dir == str(quoted / "aclImdb")
    data = load_text_data(dataset, data_dir, num_train=None, num_test=None, val_fraction=0.2)
    assert (len(data.train), len(data.val), len(data.test)) == (8, 2, 6)
    # the two data sets side by side, nothing else (the staging folders are gone)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["it's data", "shanghaitech"]
    assert [p.name for p in quoted.iterdir()] == ["aclImdb"]
