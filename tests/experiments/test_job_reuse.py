"""A paper job's reuse of a finished sub-run (experiments.paper.job): its config decides, and so
does its data, checked as the runner checks a resume (cudt.runner.run.check_reused)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import ClassVar

import pytest
from helpers import ToyConfig, ToyTask

from cudt.errors import UsageError
from cudt.io import digest
from cudt.runner.config import flag
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
    trained on) and whose results.json is from before it recorded the data too cannot be
    checked: it is refused, naming the folder and the fix, not reused unchecked over files
    that may have changed."""
    file = tmp_path / "scale.txt"
    file.write_text("1.0")
    task = FileToy(file)
    out = tmp_path / "sub"
    cfg = ToyConfig(out=str(out), seeds=1, kinds="erm", steps=4, test_gammas=(0.0,))
    first = SubRun("toy", ("toy",), cfg, out)
    check_subrun(first, overwrite=False)
    train_subruns([first], lambda s: task)
    (out / "checkpoints" / "config.json").unlink()
    results = json.loads((out / "results.json").read_text())
    del results["data_record"]  # an earlier cudt's: the config alone
    (out / "results.json").write_text(json.dumps(results))
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


def test_a_finished_subrun_whose_checkpoints_were_deleted_is_checked_by_its_results(tmp_path):
    """A finished sub-run whose checkpoints/ was deleted to save disk is checked by what its
    results.json records of its data (refused for want of checkpoints/config.json): reused
    over the same files, refused over other files behind the same flags."""
    file = tmp_path / "scale.txt"
    file.write_text("1.0")
    task = FileToy(file)
    out = tmp_path / "sub"
    cfg = ToyConfig(out=str(out), seeds=1, kinds="erm", steps=4, test_gammas=(0.0,))

    def sub() -> SubRun:
        planned = SubRun("toy", ("toy",), cfg, out)
        check_subrun(planned, overwrite=False)
        assert planned.finished or not (out / "results.json").exists()
        return planned

    trained = train_subruns([sub()], lambda s: task)[("toy",)]
    shutil.rmtree(out / "checkpoints")
    assert train_subruns([sub()], lambda s: task)[("toy",)]["runs"] == trained["runs"]
    file.write_text("3.0")  # the same flags, other data
    with pytest.raises(UsageError) as refused:
        train_subruns([sub()], lambda s: task)
    assert str(refused.value).startswith(
        f"the finished sub-run {out} holds results trained on other files than its flags name "
        "now (train_digest "
    ), refused.value


@dataclasses.dataclass(frozen=True)
class PathToyConfig(ToyConfig):
    """The toy's config naming the file it reads (a path flag, as --data-dir), which and the
    fingerprint's line of it (``data_file``) the digest of what it holds describes."""

    DESCRIBED_BY: ClassVar[dict[str, tuple[str, ...]]] = {
        **ToyConfig.DESCRIBED_BY,
        "scale_file": ("train_digest",),
        "data_file": ("train_digest",),
    }
    scale_file: str = flag("scale.txt", "the file whose number scales the examples", path=True)


class PathToy(FileToy):
    """:class:`FileToy` reading its config's ``--scale-file``."""

    def __init__(self):
        pass

    def load(self, cfg):
        self.file = Path(cfg.scale_file)
        return super().load(cfg)


def test_a_subrun_whose_files_moved_is_reused_and_resumed_as_the_runner_resumes(tmp_path):
    """A job rerun with a sub-run's path flag naming a copy of its files elsewhere reuses the
    finished sub-run, and resumes one interrupted, as the runner's resume does (the digests
    decide, DESCRIBED_BY); other files there are refused before anything trains, and so are
    other flags."""
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "scale.txt").write_text("1.0")
    task = PathToy()

    def sub(folder: str, name: str = "sub", **flags) -> SubRun:
        out = tmp_path / name
        cfg = PathToyConfig(**{
            "out": str(out), "seeds": 1, "kinds": "erm", "steps": 4, "test_gammas": (0.0,),
            "scale_file": str(tmp_path / folder / "scale.txt"), **flags,
        })  # fmt: skip
        planned = SubRun("toy", ("toy",), cfg, out)
        check_subrun(planned, overwrite=False)
        return planned

    trained = train_subruns([sub("a")], lambda s: task)[("toy",)]
    moved = sub("b")
    assert moved.finished
    assert train_subruns([moved], lambda s: task)[("toy",)]["runs"] == trained["runs"]
    (tmp_path / "b" / "scale.txt").write_text("3.0")  # other data there
    with pytest.raises(UsageError, match=r"different config \(scale_file .* train_digest"):
        train_subruns([sub("b")], lambda s: task)
    with pytest.raises(UsageError, match=r"results of another config \(steps: 4 there, 6 now"):
        sub("a", steps=6)
    (tmp_path / "b" / "scale.txt").write_text("1.0")
    shutil.copytree(tmp_path / "sub", tmp_path / "cut")  # a sub-run interrupted: checkpoints
    (tmp_path / "cut" / "results.json").unlink()
    config = tmp_path / "cut" / "checkpoints" / "config.json"
    config.write_text(json.dumps(json.loads(config.read_text()) | {"out": str(tmp_path / "cut")}))
    resumed = sub("b", "cut")
    assert not resumed.finished
    assert train_subruns([resumed], lambda s: task)[("toy",)]["runs"] == trained["runs"]


def test_a_subruns_check_is_its_own_not_an_earlier_ones(tmp_path):
    """The differences of a sub-run's record leave the sub-run as it was (its path flags that
    moved are returned, check_subrun assigns them), and a check keeps nothing of an earlier
    one: after a check that found the finished sub-run at a copy of its files, an --overwrite
    check left it finished and moved, and train_subruns reused it instead of retraining."""
    from experiments.paper.job import _differences_but_moved

    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "scale.txt").write_text("1.0")
    task = PathToy()

    def sub(folder: str, overwrite: bool = False) -> SubRun:
        cfg = PathToyConfig(**{
            "out": str(tmp_path / "sub"), "seeds": 1, "kinds": "erm", "steps": 4,
            "test_gammas": (0.0,), "scale_file": str(tmp_path / folder / "scale.txt"),
            "overwrite": overwrite,
        })  # fmt: skip
        return SubRun("toy", ("toy",), cfg, tmp_path / "sub")

    first = sub("a")
    check_subrun(first, overwrite=False)
    trained = train_subruns([first], lambda s: task)[("toy",)]["runs"]
    moved = sub("b")
    saved = json.loads((moved.out / "results.json").read_text())["config"]
    want = moved.cfg.fingerprint(evaluation=True)
    assert _differences_but_moved(type(moved.cfg), saved, want) == ([], ("scale_file",))
    assert moved.moved == () and not moved.finished  # untouched
    check_subrun(moved, overwrite=False)
    assert moved.finished and moved.moved == ("scale_file",)
    moved.cfg = dataclasses.replace(moved.cfg, overwrite=True)
    check_subrun(moved, overwrite=True)  # retrained: nothing of the check before
    assert not moved.finished and moved.moved == ()
    (tmp_path / "b" / "scale.txt").write_text("3.0")  # retrained, on these
    retrained = train_subruns([moved], lambda s: task)[("toy",)]["runs"]
    assert [r["final_loss"] for r in retrained] != [r["final_loss"] for r in trained]
