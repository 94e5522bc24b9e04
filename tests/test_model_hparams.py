"""--model-hparams: a model's own per-run hyperparameters (the paper's per-model Table 1)."""

from __future__ import annotations

import pytest

from cudt.runner.cli import config_from_args
from cudt.runner.sweep import model_defaults
from cudt.tasks.video import VideoConfig, VideoTask


def _specs(argv):
    cfg, _ = config_from_args(VideoConfig, ["--models", "ut,dust", *argv], "video")
    return {(s.model, s.constrained, s.point): s.hp for s in VideoTask().run_specs(cfg)}


def test_the_video_default_gives_each_model_its_own_constraint_settings():
    specs = _specs([])
    assert (specs["ut", True, 0]["epsilon"], specs["ut", True, 0]["dual_lr"]) == (0.1, 3.0)
    assert (specs["dust", True, 0]["epsilon"], specs["dust", True, 0]["dual_lr"]) == (0.05, 100.0)
    # ERM runs have no constraint hyperparameters; their lr is the model's default either way
    assert specs["ut", False, 0]["epsilon"] is None
    assert specs["ut", False, 0]["lr"] == specs["ut", True, 0]["lr"]


def test_a_flag_the_user_sets_or_sweeps_wins_over_the_models_own_value():
    specs = _specs(["--epsilon", "0.2"])
    assert specs["ut", True, 0]["epsilon"] == specs["dust", True, 0]["epsilon"] == 0.2
    assert specs["ut", True, 0]["dual_lr"] == 3.0  # not given: still the UT's own
    specs = _specs(["--sweep", "dual_lr=20,40"])
    for model in ("ut", "dust"):
        assert [specs[model, True, p]["dual_lr"] for p in (0, 1)] == [20.0, 40.0]
    assert specs["ut", True, 0]["epsilon"] == 0.1 and specs["dust", True, 0]["epsilon"] == 0.05
    specs = _specs(["--model-hparams", "ut:"])  # an empty entry: the flags' defaults
    assert (specs["ut", True, 0]["epsilon"], specs["ut", True, 0]["dual_lr"]) == (0.1, 1000.0)
    assert specs["dust", True, 0]["epsilon"] == 0.1  # the table replaced: DUST's entry is gone
    specs = _specs(["--model-hparams", "dust:epsilon=0.3,lr=0.01"])  # replaces the default table
    assert specs["dust", True, 0]["epsilon"] == 0.3 and specs["dust", False, 0]["lr"] == 0.01
    assert specs["ut", True, 0]["epsilon"] == 0.1


def test_erm_runs_are_judged_by_their_models_epsilon():
    cfg, _ = config_from_args(VideoConfig, [], "video")
    assert model_defaults(cfg, "ut") == {"epsilon": 0.1, "dual_lr": 3.0}
    assert model_defaults(cfg, "dust") == {"epsilon": 0.05, "dual_lr": 100.0}


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--model-hparams", "epsilon=0.05"], "must be MODEL:NAME=V"),
        (["--model-hparams", "ut:epsilon"], "ut: 'epsilon' must be NAME=VALUE"),
        (["--model-hparams", "ut:depth=3"], "depth is not a per-run hyperparameter"),
        (["--model-hparams", "ut:epsilon=2"], "--model-hparams ut: epsilon"),
        (["--model-hparams", "ut:lr=1", "--model-hparams", "ut:lr=2"], "ut is given twice"),
    ],
)
def test_bad_model_hparams_fail_with_one_line(argv, words, capsys):
    with pytest.raises(SystemExit) as e:
        config_from_args(VideoConfig, argv, "video")
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err, err


def test_a_model_the_run_does_not_train_is_refused():
    cfg, _ = config_from_args(VideoConfig, ["--models", "dust", "--model-hparams", "vit:lr=1"], "v")
    with pytest.raises(ValueError, match="names vit, which this run does not train"):
        VideoTask().run_specs(cfg)
