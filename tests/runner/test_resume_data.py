"""What a resume compares of the data: its digests decide, not where it lies. The text task's
data line (``data_source``) names the TFDS folder, a user's home expanded in it, and the file
format it was prepared in: the same data elsewhere or in another format resumes, and is read
back by the commands that work on a finished run; other data is refused by its digest."""

from __future__ import annotations

import shutil

import pytest

from cudt.data.text.nli import tfds_builder, tiny_splits
from cudt.errors import UsageError
from cudt.io import to_jsonable
from cudt.runner.finished import _check_trained_on
from cudt.runner.output import checkpoint_record, open_output_once
from cudt.tasks.text import TextConfig, TextTask


def _prepare(data_dir, fmt: str, num_train: int = 40) -> None:
    """A tiny IMDb prepared as TFDS prepares it, in the file format ``fmt``."""
    builder = tfds_builder("imdb", tiny_splits("imdb", num_train, 20))
    builder(data_dir=str(data_dir), file_format=fmt).download_and_prepare()


def test_the_same_text_data_elsewhere_or_in_another_format_resumes(
    tiny_bert, tmp_path, monkeypatch
):
    cfg = TextConfig(
        dataset="imdb", model="bert", checkpoint=str(tiny_bert), num_train=40, num_test=20,
        max_length=16, seeds=1,
    )  # fmt: skip
    task, out = TextTask(), tmp_path / "run"

    def fingerprint(home):  # --data-dir not given: $TFDS_DATA_DIR, as under a user's home
        monkeypatch.setenv("TFDS_DATA_DIR", str(home / "tensorflow_datasets"))
        return task.fingerprint(cfg, task.load(cfg))

    def resumes(record) -> bool:
        with open_output_once(out, checkpoint_record(cfg) | record, cfg, True) as opened:
            return opened.resuming

    _prepare(tmp_path / "a" / "tensorflow_datasets", "array_record")
    trained = fingerprint(tmp_path / "a")
    assert not resumes(trained)  # the run starts: its record written
    (out / "checkpoints" / "bert-2" / "4").mkdir(parents=True)  # a step saved
    shutil.copytree(tmp_path / "a", tmp_path / "b")  # the same files under another home
    _prepare(tmp_path / "c" / "tensorflow_datasets", "parquet")  # and prepared as parquet
    for home in ("b", "c"):
        now = fingerprint(tmp_path / home)
        assert now["data_source"] != trained["data_source"]  # the line names where it lies
        assert now["train_digest"] == trained["train_digest"]
        assert resumes(now)
        _check_trained_on(
            cfg, to_jsonable(task.fingerprint(cfg, task.load(cfg))), trained, out
        )  # read back: not refused
    _prepare(tmp_path / "d" / "tensorflow_datasets", "array_record", num_train=48)
    other = fingerprint(tmp_path / "d")  # other reviews: 40 of 48
    with pytest.raises(UsageError, match=r"trained on other files .*\(train_digest"):
        resumes(other)
    with pytest.raises(UsageError, match=r"trained on other data .*train_digest"):
        _check_trained_on(cfg, to_jsonable(task.fingerprint(cfg, task.load(cfg))), trained, out)
