"""``cudt.runner.finished``: a finished run read back from another folder than the one its
command ran in, every seed's own draw included."""

from __future__ import annotations

import shutil

import numpy as np

from cudt.data.text import write_aclimdb
from cudt.data.text.generated import imdb_like_reviews
from cudt.runner.finished import finished_run, run_data
from cudt.tasks.text import TextTask
from experiments import text_classify


def test_relative_paths_are_read_where_the_run_ran_for_every_seed(tiny_bert, tmp_path, monkeypatch):
    ran = tmp_path / "ran"
    shutil.copytree(tiny_bert, ran / "bert")
    train, train_ratings = imdb_like_reviews(60, seed=0, stream=0, short=True)
    test, test_ratings = imdb_like_reviews(20, seed=0, stream=1, short=True)
    write_aclimdb(ran / "data", train, test, ratings=(train_ratings, test_ratings))
    monkeypatch.chdir(ran)
    argv = [
        "--model", "bert", "--checkpoint", "bert", "--dataset", "aclimdb",
        "--data-dir", "data/aclImdb", "--num-train", "40", "--num-test", "20", "--seeds", "2",
        "--kinds", "erm", "--steps", "2", "--max-length", "32", "--out", str(tmp_path / "run"),
    ]  # fmt: skip
    assert text_classify.main(argv) == 0
    monkeypatch.chdir(tmp_path)  # another folder: data/aclImdb and bert are not here
    task = TextTask()
    cfg, data, results = finished_run(tmp_path / "run", task, "a test")
    data_of = run_data(task, cfg, data, tmp_path / "run")
    draws = {r["seed"]: data_of(r) for r in results["runs"]}
    assert sorted(draws) == [0, 1]
    ids = [draws[s].tokens["train"].ids for s in (0, 1)]
    assert ids[0].shape != ids[1].shape or not np.array_equal(*ids)  # each seed's own draw
