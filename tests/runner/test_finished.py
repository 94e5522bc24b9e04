"""``cudt.runner.finished``: a finished run read back from another folder than the one its
command ran in, every seed's own draw included."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from cudt.data.text import write_aclimdb
from cudt.data.text.generated import imdb_like_reviews
from cudt.errors import UsageError
from cudt.io import to_jsonable
from cudt.runner.finished import finished_run, run_data
from cudt.runner.output import CHECKPOINTS, CONFIG_FILE, checkpoint_record, open_output_once
from cudt.tasks.text import TextConfig, TextTask
from cudt.tasks.video import VideoConfig, VideoTask
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


def test_a_run_finished_from_another_folder_is_read_where_that_command_ran(
    tiny_bert, tmp_path, monkeypatch
):
    """A batch job started in one folder and resumed from another (its paths spelt relative to
    each): results.json, its provenance's cwd and its paths are the resume's, the checkpoints'
    record the first start's. The paths were read from the record against the resume's cwd,
    where they name nothing: the finished run could not be read back (export_decoder,
    layer_gradients)."""
    ran, later = tmp_path / "ran", tmp_path / "later"
    shutil.copytree(tiny_bert, ran / "bert")
    train, train_ratings = imdb_like_reviews(60, seed=0, stream=0, short=True)
    test, test_ratings = imdb_like_reviews(20, seed=0, stream=1, short=True)
    write_aclimdb(ran / "data", train, test, ratings=(train_ratings, test_ratings))
    later.mkdir()
    out = str(tmp_path / "run")
    common = ["--model", "bert", "--dataset", "aclimdb", "--num-train", "40", "--num-test", "20"]
    common += ["--kinds", "erm", "--steps", "2", "--max-length", "32", "--out", out]
    monkeypatch.chdir(ran)
    assert text_classify.main([*common, "--checkpoint", "bert", "--data-dir", "data/aclImdb"]) == 0
    (tmp_path / "run" / "results.json").unlink()  # as if killed after its last checkpoint
    monkeypatch.chdir(later)  # the same files, spelt from here: the resume evaluates them
    there = ["--checkpoint", "../ran/bert", "--data-dir", "../ran/data/aclImdb"]
    assert text_classify.main([*common, *there]) == 0
    monkeypatch.chdir(tmp_path)
    cfg, data, results = finished_run(tmp_path / "run", TextTask(), "a test")
    assert results["provenance"]["cwd"] == str(later)
    assert (cfg.checkpoint, cfg.data_dir) == ("../ran/bert", "../ran/data/aclImdb")
    assert data.tokens["train"].ids.shape[0] > 0


# -- a flag an earlier cudt accepted where it acted on nothing --------------------------------------

VIDEO = dict(models=("ut",), layers=2, num_videos=3, num_frames=4, seq_len=4)


def _recorded(folder, cfg, fingerprint, **earlier):
    """``folder`` as a run of ``cfg`` leaves it, its records holding ``earlier`` (flags an
    earlier cudt accepted): ``results.json`` and ``checkpoints/config.json`` over a step."""
    (folder / CHECKPOINTS / "ut-2" / "4").mkdir(parents=True)
    record = checkpoint_record(cfg) | fingerprint | earlier
    (folder / CHECKPOINTS / CONFIG_FILE).write_text(json.dumps(to_jsonable(record)))
    config = to_jsonable(dataclasses.asdict(cfg) | earlier)
    results = {"experiment": "video_denoise", "config": config, "runs": []}
    (folder / "results.json").write_text(json.dumps(results))


def test_a_recorded_flag_that_acted_on_nothing_is_read_at_its_default(tmp_path, capsys):
    """A --models ut run recorded with --dust-atoms 16 (accepted before the video task refused
    a DUST flag without dust, ecfe38e) is read back, the flag at its default with a note; a
    command line giving it is still refused."""
    task = VideoTask()
    cfg = VideoConfig(**VIDEO, out=str(tmp_path))
    _recorded(tmp_path, cfg, task.fingerprint(cfg, task.load(cfg)), dust_atoms=16)
    got, _, _ = finished_run(tmp_path, task, "a test")
    assert got == cfg and got.dust_atoms == 20
    assert "records --dust-atoms 16, which acted on nothing" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--dust-atoms applies to --models ...,dust only"):
        VideoConfig(**VIDEO, dust_atoms=16)


def test_a_recorded_setting_this_cudt_no_longer_has_is_named_in_a_note(tmp_path, capsys):
    """A run recorded with a setting since removed (no ADDED entry can say what it did) is read
    without it, saying so as its resume's refusal names it; before, it was dropped without a
    word. A run recorded by this cudt gets no note (a real run: the text task's test above)."""
    task = VideoTask()
    cfg = VideoConfig(**VIDEO, out=str(tmp_path))
    fingerprint = task.fingerprint(cfg, task.load(cfg))
    _recorded(tmp_path, cfg, fingerprint, ut_gate="sigmoid")
    got, _, _ = finished_run(tmp_path, task, "a test")
    assert got == cfg
    err = capsys.readouterr().err
    assert (
        f"note: {tmp_path / 'results.json'} records settings this cudt no longer has (ut_gate "
        "'sigmoid'): read without them"
    ) in err
    (tmp_path / "results.json").unlink()  # its checkpoints resumed: refused, naming it
    with pytest.raises(UsageError, match=r"settings this version no longer has \(ut_gate 'sigm"):
        open_output_once(tmp_path, checkpoint_record(cfg) | fingerprint, cfg, True)


def test_a_resume_ignores_a_recorded_flag_that_acted_on_nothing(tmp_path):
    """Evaluated again (its folder without results.json, rerun), such a run resumes: the flag
    cannot be given (refused) and, left out, was 'a different config'. A flag that acts is
    still compared: the same record under --models dust,ut is another config."""
    cases = [
        (VideoConfig(**VIDEO, out=str(tmp_path / "v")), {"dust_atoms": 16}),
        (TextConfig(model="minilm", out=str(tmp_path / "t")), {"ut_a": 0.5, "ut_skip": True}),
    ]
    for cfg, earlier in cases:
        _recorded(Path(cfg.out), cfg, {}, **earlier)
        (Path(cfg.out) / "results.json").unlink()
        with open_output_once(Path(cfg.out), checkpoint_record(cfg), cfg, True) as out:
            assert out.resuming
    other = VideoConfig(**{**VIDEO, "models": ("dust", "ut")}, out=str(tmp_path / "v"))
    with pytest.raises(UsageError, match="different config.*dust_atoms 16 -> 20"):
        open_output_once(tmp_path / "v", checkpoint_record(other), other, True)


def test_a_knob_of_another_setting_is_read_and_resumed_at_its_default(tmp_path, capsys):
    """A knob's row says where it acts (cudt.knobs), and its flag's needs is that rule: --nupi-kp
    with --dual-optimizer sgd acts on nothing. The video task's K_P is 5, the dual study pins 0
    for its sgd runs (both accepted: 0 is every other task's default), and either resumes the
    other; a K_P an earlier cudt accepted is read back at the default with a note. Before, the
    knob was no idle flag: 'a different config ... nupi_kp 0.0 -> 5.0', and the re-read was
    'not one this cudt runs'."""
    task = VideoTask()
    cfg = VideoConfig(**VIDEO, dual_optimizer="sgd", out=str(tmp_path / "r"))
    _recorded(Path(cfg.out), cfg, {}, nupi_kp=0.0)
    (Path(cfg.out) / "results.json").unlink()
    with open_output_once(Path(cfg.out), checkpoint_record(cfg), cfg, True) as out:
        assert out.resuming
    for recorded, noted in ((0.0, False), (2.0, True)):
        folder = tmp_path / f"kp{recorded:g}"
        folder.mkdir()
        cfg = VideoConfig(**VIDEO, dual_optimizer="sgd", out=str(folder))
        _recorded(folder, cfg, task.fingerprint(cfg, task.load(cfg)), nupi_kp=recorded)
        got, _, _ = finished_run(folder, task, "a test")
        assert got.nupi_kp == (5.0 if noted else 0.0)
        err = capsys.readouterr().err
        assert ("records --nupi-kp 2.0, which acted on nothing" in err) == noted, err
