"""--model-hparams: a model's own per-run hyperparameters (the paper's per-model Table 1)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import assert_one_line_error, toy, toy_main

from cudt.runner.cli import config_from_args
from cudt.runner.sweep import canonical_model_hparams, model_defaults, parse_model_hparams
from cudt.tasks.video import VideoConfig, VideoTask


def _specs(argv):
    cfg, _ = config_from_args(VideoConfig, ["--models", "ut,dust", *argv], "video")
    return {(s.model, s.constrained, s.point): s.hp for s in VideoTask().run_specs(cfg)}


def test_the_video_default_tunes_the_dual_rate_and_erms_learning_rate_as_lanes():
    """No per-model table: the same relative dual rates for both models, trained as lanes of the
    constrained runs at ε 0.05, and the learning rate as as many lanes of ERM's."""
    specs = _specs([])
    for model in ("ut", "dust"):
        con = [specs[model, True, p] for p in (0, 1)]
        erm = [specs[model, False, p] for p in (0, 1)]
        assert [h["dual_lr"] for h in con] == [0.03, 0.1] and {h["epsilon"] for h in con} == {0.05}
        assert [h["lr"] for h in erm] == [1e-3, 2e-3] and {h["lr"] for h in con} == {1e-3}
        assert (model, True, 2) not in specs and (model, False, 2) not in specs


TABLE = ["--model-hparams", "ut:epsilon=0.1,dual_lr=3", "--model-hparams", "dust:epsilon=0.05"]


def test_a_models_own_value_wins_over_the_default_and_a_flag_the_user_sets_wins_over_it():
    specs = _specs(TABLE)  # the table's values are not tuned; the rest still is
    assert (specs["ut", True, 0]["epsilon"], specs["ut", True, 0]["dual_lr"]) == (0.1, 3.0)
    assert (specs["dust", True, 0]["epsilon"], specs["dust", True, 0]["dual_lr"]) == (0.05, 0.03)
    assert ("ut", True, 1) not in specs and specs["ut", False, 1]["lr"] == 2e-3
    assert [specs["dust", True, p]["dual_lr"] for p in (0, 1)] == [0.03, 0.1]  # still tuned
    specs = _specs([*TABLE, "--epsilon", "0.2"])
    assert specs["ut", True, 0]["epsilon"] == specs["dust", True, 0]["epsilon"] == 0.2
    assert specs["ut", True, 0]["dual_lr"] == 3.0  # not given: still the UT's own
    specs = _specs([*TABLE, "--sweep", "dual_lr=20,40"])
    for model in ("ut", "dust"):
        assert [specs[model, True, p]["dual_lr"] for p in (0, 1)] == [20.0, 40.0]
    assert specs["ut", True, 0]["epsilon"] == 0.1 and specs["dust", True, 0]["epsilon"] == 0.05
    specs = _specs(["--model-hparams", "dust:epsilon=0.3,lr=0.01"])
    assert specs["dust", True, 0]["epsilon"] == 0.3 and specs["dust", False, 0]["lr"] == 0.01
    assert [specs["ut", True, p]["dual_lr"] for p in (0, 1)] == [0.03, 0.1]


def test_erm_runs_are_judged_by_their_models_epsilon(tmp_path):
    cfg, _ = config_from_args(VideoConfig, TABLE, "video")
    assert model_defaults(cfg, "ut") == {"epsilon": 0.1, "dual_lr": 3.0}
    assert model_defaults(cfg, "dust") == {"epsilon": 0.05}
    # and the verdicts use it: an ERM run's relative violations on validation are
    # (ℓ_l − (1 − ε) ℓ_(l−1)) / ℓ_(l−1) at the model's ε, not the flag's (the toy's 0.3)
    res = toy(["--seeds", "1", "--model-hparams", "toy:epsilon=0.05"], tmp_path / "o")
    (erm,) = [r for r in res["runs"] if not r["constrained"]]
    m = np.asarray(erm["layer_loss_val"], np.float64)
    want = (m[1:] - 0.95 * m[:-1]) / m[:-1]
    np.testing.assert_allclose(erm["relative_violation_val"][1:], want, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--model-hparams", "epsilon=0.05"], "must be MODEL:NAME=V"),
        (["--model-hparams", "ut:epsilon"], "ut: 'epsilon' must be NAME=VALUE"),
        (["--model-hparams", "ut:depth=3"], "depth is not a per-run hyperparameter"),
        (["--model-hparams", "ut:epsilon=2"], "--model-hparams ut: epsilon"),
        (["--model-hparams", "ut:lr=1", "--model-hparams", "ut:lr=2"], "ut is given twice"),
        # the later value won, the earlier was lost without a word
        (["--model-hparams", "ut:epsilon=0.05,epsilon=0.1"], "ut: epsilon is given twice"),
    ],
)
def test_bad_model_hparams_fail_with_one_line(argv, words, capsys):
    assert_one_line_error(lambda a: config_from_args(VideoConfig, a, "video"), argv, capsys, words)


def test_a_model_the_run_does_not_train_is_refused():
    cfg, _ = config_from_args(VideoConfig, ["--models", "dust", "--model-hparams", "vit:lr=1"], "v")
    with pytest.raises(ValueError, match="names vit, which this run does not train") as e:
        VideoTask().run_specs(cfg)
    assert str(e.value).endswith("drop it, or train it: --models dust,vit")


def test_a_model_a_task_without_model_flags_lacks_is_refused_without_offering_one(capsys):
    """The toy task (a task of one's own) trains its one model: no flag adds another, so the
    refusal offers none."""
    message = assert_one_line_error(
        toy_main, ["--model-hparams", "other:lr=1"], capsys, "names other"
    )
    assert message.endswith("which this run does not train (models: toy): drop it")


def test_a_models_own_learning_rate_wins_over_a_task_default_that_is_not_none():
    """The toy task's learning rate defaults to 3e-2 (the video's to None): a model's own lr
    replaces it, as it replaces any default, for both kinds; --lr set wins over it."""
    from helpers import ToyConfig, ToyTask

    def lrs(*argv):
        cfg, _ = config_from_args(ToyConfig, ["--seeds", "1", "--tune-lr", "1", *argv], "toy")
        return {s.constrained: s.hp["lr"] for s in ToyTask().run_specs(cfg)}

    assert lrs() == {False: 3e-2, True: 3e-2}
    assert lrs("--model-hparams", "toy:lr=0.001") == {False: 1e-3, True: 1e-3}
    assert lrs("--model-hparams", "toy:lr=0.001", "--lr", "0.2") == {False: 0.2, True: 0.2}


def test_the_penalty_formulation_tunes_no_dual_rate():
    """The quadratic penalty has no multipliers: the video default's dual-rate lanes (0.03, 0.1)
    would train one problem twice under two labels; ε is still the constrained runs' grid. The
    dual rate acts on nothing there: recorded None (cudt.knobs: Knob.acts)."""
    specs = _specs(["--formulation", "penalty", "--penalty", "10"])
    for model in ("ut", "dust"):
        assert (model, True, 0) in specs and (model, True, 1) not in specs
    assert specs["ut", True, 0]["dual_lr"] is None


def test_model_hparams_spelt_another_way_resume_and_another_value_does_not(tmp_path, capsys):
    """A resume compares the values --model-hparams gives, not their spelling (docs/runner.md):
    ``5e-2`` or ``0.05``, a dash or an underscore, a space, another order of the names resume
    the checkpoints of the raw spelling a run saved (checkpoints/config.json still records the
    flag as given, as before); another value is refused."""
    out = tmp_path / "o"
    first = toy(["--seeds", "1", "--model-hparams", "toy:epsilon=0.05,dual_lr=0.5"], out)
    saved = json.loads((out / "checkpoints" / "config.json").read_text())
    assert saved["model_hparams"] == ["toy:epsilon=0.05,dual_lr=0.5"]  # as given, as before
    (out / "results.json").unlink()
    capsys.readouterr()
    argv = ["--seeds", "1", "--resume", "--model-hparams", "toy: dual-lr=5e-1, epsilon=5e-2"]
    again = toy(argv, out)
    assert ": resumed from the checkpoint at step" in capsys.readouterr().err
    assert [r["final_loss"] for r in again["runs"]] == [r["final_loss"] for r in first["runs"]]
    (out / "results.json").unlink()
    argv = ["--seeds", "1", "--model-hparams", "toy:epsilon=0.06,dual_lr=0.5", "--out", out]
    assert_one_line_error(toy_main, argv, capsys, "different config (model_hparams")


def test_the_values_a_resume_compares_are_the_parsed_model_hparams():
    """What a resume compares (canonical_model_hparams, which checks nothing) is what
    parse_model_hparams trains, model by model and value by value."""
    items = ("ut:epsilon=5e-2, dual-lr=100,reference=CHANCE+0.10", "dust:resilience=None")
    cfg, _ = config_from_args(VideoConfig, [a for i in items for a in ("--model-hparams", i)], "")
    assert canonical_model_hparams(cfg.model_hparams) == parse_model_hparams(cfg)
    assert canonical_model_hparams(items)["ut"] == {
        "epsilon": 0.05,
        "dual_lr": 100.0,
        "reference": "chance+0.1",
    }


def test_a_tuned_grid_that_no_model_trains_is_refused(tmp_path, capsys):
    """The text UT trains its own ε 0.02 (the task's --model-hparams), which is not tuned: a
    user's --tune-epsilon 0.02,0.1 trained one constrained lane, at 0.02, with no choice made
    and no line saying so (exit 0; --tune-epsilon 0.1 alone trained 0.02). Refused before
    --out; a grid of the model's own value, or --model-hparams ut:, trains as asked."""
    from cudt.tasks.text import TextConfig, TextTask
    from experiments import text_classify

    out = tmp_path / "out"
    for grid in ("0.02,0.1", "0.1"):
        argv = ["--model", "ut", "--tune-epsilon", grid, "--out", out]
        assert_one_line_error(
            text_classify.main, argv, capsys, "--tune-epsilon tunes no model", "ut:", out=out
        )

    def epsilons(*argv):
        cfg, _ = config_from_args(TextConfig, ["--seeds", "1", *argv], "text")
        return [s.hp["epsilon"] for s in TextTask().run_specs(cfg) if s.constrained]

    assert epsilons("--model", "ut", "--tune-epsilon", "0.02") == [0.02]
    assert epsilons("--model", "ut", "--tune-epsilon", "0.02,0.1", "--model-hparams", "ut:") == [
        0.02,
        0.1,
    ]
    assert epsilons("--model", "minilm", "--tune-epsilon", "0.02,0.1") == [0.02, 0.1]
    # what a setting with no eligible point is told to pass (cudt.runner.choice) trains as asked
    # over the model's own value (it named --tune-epsilon, refused above for the text UT)
    from cudt.runner.choice import _SMALLER

    sweep = _SMALLER.split(", chosen")[0].split()
    assert sweep == ["--sweep", "epsilon=0.01,0.02"]
    assert epsilons("--model", "ut", *sweep) == [0.01, 0.02]
    cfg, _ = config_from_args(
        TextConfig, ["--model", "ut", "--tune-lr", "1,2", "--model-hparams", "ut:lr=0.01"], "text"
    )
    with pytest.raises(ValueError, match="--tune-lr tunes no model: ut trains its own lr"):
        TextTask().run_specs(cfg)
