"""cudt.runner.cli's helpers for recorded command lines."""

from cudt.runner.cli import without_flag


def test_without_flag_drops_the_flag_and_its_value_in_both_spellings():
    argv = ["--seeds", "3", "--out", "runs/a", "--models", "ut", "--out=runs/b", "--outer", "x"]
    assert without_flag(argv, "--out") == ["--seeds", "3", "--models", "ut", "--outer", "x"]
    assert without_flag(argv, "--profile") == argv  # absent: unchanged
    assert without_flag(["--out"], "--out") == []  # a trailing flag without its value
