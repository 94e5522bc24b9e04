"""A paper job's reuse of a finished sub-run (experiments.paper.job): its config decides, and so
does its data, checked as the runner checks a resume (cudt.runner.run.check_reused)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import ToyConfig, ToyTask

from cudt.errors import UsageError
from cudt.io import digest
from experiments.paper.job import SubRun, check_subrun, train_subruns


class FileToy(ToyTask):
    """The toy task reading a file: its training examples scaled by the number it holds."""

    def __init__(self, file: Path):
        self.file = file

    def load(self, cfg):
        scale = float(self.file.read_text())
        return {k: v * scale for k, v in super().load(cfg).items()}

    def fingerprint(self, cfg, data):
        return {"data_file": str(self.file), "train_digest": digest(data["train"])}


def test_a_finished_subrun_over_other_files_is_refused_not_reused(tmp_path, capsys):
    """A finished sub-run whose config matches is reused; once the file behind the same flags
    holds other data it is refused, as a resume of its checkpoints is (a table mixed results
    of the old and the new data), and nothing trains."""
    file = tmp_path / "scale.txt"
    file.write_text("1.0")
    task = FileToy(file)

    def sub() -> SubRun:
        out = tmp_path / "sub"
        cfg = ToyConfig(out=str(out), seeds=1, kinds="erm", steps=4, test_gammas=(0.0,))
        planned = SubRun("toy", ("toy",), cfg, out)
        check_subrun(planned, overwrite=False)
        return planned

    first = sub()
    assert not first.finished
    trained = train_subruns([first], lambda s: task)[("toy",)]
    again = sub()
    assert again.finished
    assert train_subruns([again], lambda s: task)[("toy",)]["runs"] == trained["runs"]
    assert "reusing" in capsys.readouterr().out
    file.write_text("3.0")  # the same flags, other data
    later = sub()
    assert later.finished  # by its config
    with pytest.raises(UsageError) as refused:
        train_subruns([later], lambda s: task)
    message = str(refused.value)
    assert message.startswith(f"the finished sub-run {later.out} holds checkpoints"), message
    assert "trained on other files than its flags name now (train_digest" in message
    assert "restore the files they were trained on" in message and "--overwrite" in message
    assert "reusing" not in capsys.readouterr().out
    file.write_text("1.0")  # restored: reused again
    assert train_subruns([sub()], lambda s: task)[("toy",)]["runs"] == trained["runs"]


def test_a_finished_subrun_without_its_checkpoints_record_is_refused(tmp_path, capsys):
    """A finished sub-run whose checkpoints/config.json is gone (the record of the data it was
    trained on; results.json holds the config alone) cannot be checked: it is refused, naming
    the folder and the fix, not reused unchecked over files that may have changed."""
    file = tmp_path / "scale.txt"
    file.write_text("1.0")
    task = FileToy(file)
    out = tmp_path / "sub"
    cfg = ToyConfig(out=str(out), seeds=1, kinds="erm", steps=4, test_gammas=(0.0,))
    first = SubRun("toy", ("toy",), cfg, out)
    check_subrun(first, overwrite=False)
    train_subruns([first], lambda s: task)
    (out / "checkpoints" / "config.json").unlink()
    file.write_text("3.0")  # other data behind the same flags, nothing left to tell
    later = SubRun("toy", ("toy",), cfg, out)
    check_subrun(later, overwrite=False)
    assert later.finished  # by its config
    capsys.readouterr()
    with pytest.raises(UsageError) as refused:
        train_subruns([later], lambda s: task)
    assert str(refused.value) == (
        f"the finished sub-run {out} has no checkpoints/config.json, the record of the data it "
        "was trained on, so its results cannot be checked against the files its flags name "
        f"now: restore that file, or delete {out} to train it again"
    )
    assert "reusing" not in capsys.readouterr().out
