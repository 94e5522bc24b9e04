"""cudt.runner.cli's helpers for recorded command lines."""

from cudt.runner.cli import without_flag


def test_without_flag_drops_the_flag_and_its_value_in_both_spellings():
    argv = ["--seeds", "3", "--out", "runs/a", "--models", "ut", "--out=runs/b", "--outer", "x"]
    assert without_flag(argv, "--out") == ["--seeds", "3", "--models", "ut", "--outer", "x"]
    assert without_flag(argv, "--profile") == argv  # absent: unchanged
    assert without_flag(["--out"], "--out") == []  # a trailing flag without its value


def test_a_tuned_hyperparameter_the_command_line_sets_is_pinned_even_at_its_default():
    """The video task tunes its dual rate over 0.03 and 0.1 unless --dual-lr is set: set on the
    command line to its default 0.03 it is the user's choice too, for every model (a model's own
    value, --model-hparams, gives way as to any other value); left out, it is tuned; swept,
    the sweep decides; a value the task would not tune is untouched."""
    from cudt.runner.cli import config_from_args
    from cudt.runner.sweep import expand_runs
    from cudt.tasks.video import VideoConfig

    def dual_rates(*argv):
        cfg, _ = config_from_args(VideoConfig, ["--seeds", "1", *argv], "")
        specs = expand_runs(cfg, ["dust", "ut"], lambda model: 1e-3)
        return cfg, {(s.model, dict(s.hparams)["dual_lr"]) for s in specs if s.constrained}

    _, tuned = dual_rates()
    assert {r for m, r in tuned if m == "ut"} == {0.03, 0.1}
    cfg, pinned = dual_rates("--dual-lr", "0.03", "--model-hparams", "dust:dual_lr=100,epsilon=0.2")
    assert pinned == {("dust", 0.03), ("ut", 0.03)}
    assert cfg.tune_dual_lr == () and cfg.model_hparams == ("dust:epsilon=0.2",)
    assert cfg.tune_epsilon == VideoConfig().tune_epsilon  # --epsilon not named: still tuned
    _, swept = dual_rates("--dual-lr", "0.03", "--sweep", "dual_lr=0.03,1")
    assert {r for m, r in swept if m == "ut"} == {0.03, 1.0}


def test_a_flag_given_twice_takes_its_last_value_and_a_repeated_flag_adds_up():
    """docs/runner.md: a script overrides a base command line by appending a flag; the flags
    documented as repeatable (--sweep, --model-hparams) add their values instead."""
    from cudt.runner.cli import config_from_args
    from cudt.tasks.video import VideoConfig

    cfg, _ = config_from_args(VideoConfig, ["--steps", "5", "--dual-lr", "1", "--steps", "6"], "")
    assert (cfg.steps, cfg.dual_lr) == (6, 1.0)
    cfg, _ = config_from_args(VideoConfig, ["--sweep", "epsilon=0.1", "--sweep", "lr=1e-3"], "")
    assert cfg.sweep == ("epsilon=0.1", "lr=1e-3")
