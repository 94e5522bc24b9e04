"""cudt.runner.cli's helpers: recorded command lines, and how an entry point's process ends."""

import os
import re
import subprocess
import sys
import textwrap

import pytest
from helpers import ROOT

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


def test_an_interrupt_while_jax_compiles_exits_130_not_a_segfault(tmp_path):
    """Ctrl-C during a program's compilation: run_cli prints one line and exit_process ends the
    process with 130. The interpreter's own shutdown, with XLA still compiling on its threads,
    crashed instead (a segfault, 139: seen on Ctrl-C during a run's first step)."""
    script = tmp_path / "interrupted.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, signal, sys, threading
            import jax, jax.numpy as jnp
            from cudt.runner.cli import exit_process, run_cli

            # Ctrl-C as in a terminal: a job started in the background (nohup ... &, as CI
            # may be) inherits SIGINT ignored, and Python then leaves it so
            signal.signal(signal.SIGINT, signal.default_int_handler)

            def main():
                def f(x):
                    for i in range(1500):  # seconds of compilation on any CPU
                        x = jnp.sin(x @ x.T + i)
                    return x
                lowered = jax.jit(f).lower(jnp.ones((8, 8)))  # traced: the interrupt comes
                interrupt = lambda: os.kill(os.getpid(), signal.SIGINT)  # noqa: E731
                threading.Timer(0.2, interrupt).start()
                lowered.compile()  # while XLA compiles

            exit_process(run_cli(main))
            """
        )
    )
    # this checkout's cudt, compiling as a user's process does: without the suite's cache and
    # quick-compile settings (tests/conftest.py), under which the program compiles at once
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_ENABLE_COMPILATION_CACHE="false")
    for name in ("JAX_COMPILATION_CACHE_DIR", "JAX_DISABLE_MOST_OPTIMIZATIONS", "XLA_FLAGS"):
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300
    )
    assert (done.returncode, done.stderr.strip().splitlines()[-1:]) == (130, ["interrupted"])


# every entry point: python -m experiments.X, python -m benchmarks SUBCOMMAND [SECTION]
ENTRY_POINTS = [
    *(
        (f"experiments.{p.stem}", [])
        for p in sorted((ROOT / "experiments").glob("*.py"))
        if p.stem != "__init__"
    ),
    *(("benchmarks.__main__", s) for s in (["step"], ["sweep"], ["llm"], ["gpu"])),
    *(("benchmarks.__main__", ["memory", s]) for s in ("lm-loss", "llm")),
]


@pytest.mark.parametrize(
    "module, args",
    ENTRY_POINTS,
    ids=[" ".join([m.removesuffix(".__main__"), *a]) for m, a in ENTRY_POINTS],
)
def test_every_flag_of_every_entry_point_shows_its_default(module, args, monkeypatch, capsys):
    """``--lr`` said "(default: the task's)", ``layer_gradients --examples`` (256), ``descent_gap
    --active``, ``pages --pages`` and four benchmark flags gave no default: every flag of every
    entry point's ``--help`` whose default is a value (or a rule in words: ``shown_default``)
    says it, through the one formatter of :class:`OneLineParser`."""
    import argparse
    import importlib

    from cudt.runner.cli import OneLineParser

    shown = []
    format_help = argparse.ArgumentParser.format_help

    def record(parser):
        shown.append(parser)
        return format_help(parser)

    monkeypatch.setattr(argparse.ArgumentParser, "format_help", record)
    main = importlib.import_module(module).main
    try:
        assert main([*args, "--help"]) == 0
    except SystemExit as e:
        assert e.code in (0, None)
    out = capsys.readouterr().out
    assert len(shown) == 1, module  # the --help printed is this parser's
    (parser,) = shown
    assert isinstance(parser, OneLineParser), type(parser)
    formatter = parser._get_formatter()
    missing = []
    for action in parser._actions:
        if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
            continue
        has_one = getattr(action, "shown_default", None) is not None or (
            action.default not in (None, argparse.SUPPRESS)
            and (action.nargs != 0 or isinstance(action, argparse.BooleanOptionalAction))
        )
        if has_one and "default" not in formatter._expand_help(action):
            missing.append(action.option_strings[0])
    assert not missing, f"{module} {' '.join(args)}: no default in the help of {missing}"
    flat = " ".join(out.split())
    if module == "experiments.layer_gradients":
        assert "validation examples (the first N) (default: 256)" in flat
    if module == "experiments.video_denoise":
        assert "primal Adam learning rate (default: 1e-3, 1e-4 for the ViT" in flat


@pytest.mark.parametrize(
    "task, cases",
    [
        ("video", [({}, "vit"), ({}, "ut")]),
        ("text", [({}, "ut"), ({}, "minilm"), ({}, "bert")]),
        (
            "llm",
            [
                ({}, "llm"),
                ({"checkpoint": "x"}, "llm"),
                ({"checkpoint": "x", "lora_rank": 8}, "llm"),
            ],
        ),
    ],
)
def test_the_helps_words_for_the_lr_default_name_each_rate_the_task_uses(task, cases):
    """``--lr``'s help gives the task's default rates in words (``shared(..., default_text)``);
    the rates themselves are ``Task.default_lr``: every rate it returns is in those words, so
    the two cannot drift apart unseen."""
    import dataclasses

    from cudt.tasks.llm import LLMTask
    from cudt.tasks.text import TextTask
    from cudt.tasks.video import VideoTask

    task = {"video": VideoTask, "text": TextTask, "llm": LLMTask}[task]()
    (field,) = (f for f in dataclasses.fields(task.config_cls) if f.name == "lr")
    words = field.metadata["default_text"]
    rates = {float(r) for r in re.findall(r"\d+(?:\.\d+)?e-\d+", words)}
    for overrides, name in cases:
        cfg = dataclasses.replace(task.config_cls(), **overrides)
        assert task.default_lr(cfg, name) in rates, (name, overrides, words)


def _numbers(words: str) -> set[float]:
    return {float(n) for n in re.findall(r"\d+(?:\.\d+)?", words)}


def test_the_helps_words_for_the_test_gammas_default_name_each_tasks_grid():
    """``--test-gammas``' help gives each task's default grid in words (``shared(...,
    default_text)``, a table's ``test_gammas_flag``); the grids themselves are the tasks'
    ``test_gamma_grid`` and the tables' scales: every level (for the video task, every factor
    of γ_train, and the range at γ_train 0) is in those words, so they cannot drift apart
    unseen, as --lr's words and ``default_lr`` cannot."""
    import dataclasses

    from cudt.tasks import accuracy, video
    from cudt.tasks.llm_config import LLMConfig
    from cudt.tasks.text import TextConfig
    from experiments.paper.text_table.config import Table4Config
    from experiments.paper.video_table.config import SCALES, Table3Config

    def words(config_cls) -> str:
        (field,) = (f for f in dataclasses.fields(config_cls) if f.name == "test_gammas")
        return field.metadata["default_text"] or field.metadata["help"]

    for config_cls in (TextConfig, LLMConfig):
        assert set(accuracy.test_gamma_grid(0.0)) <= _numbers(words(config_cls)), config_cls
    said = _numbers(words(video.VideoConfig))
    factors = {g / 0.5 for g in video.test_gamma_grid(0.5)}
    assert factors <= said
    at_zero = video.test_gamma_grid(0.0)
    assert f"{min(at_zero):g} to {max(at_zero):g} at 0" in words(video.VideoConfig)
    table = words(Table3Config)
    assert factors | set(SCALES["tiny"]["test_gammas"]) <= _numbers(table)
    assert set(accuracy.test_gamma_grid(0.0)) <= _numbers(words(Table4Config))


def test_the_commands_a_run_prints_quote_an_out_with_a_space(tmp_path, capsys):
    """The resume hint and the tensorboard line are commands to paste: an --out with a space
    in it was printed bare, and the pasted line read two arguments (found by helper V's walk)."""
    import shlex

    from helpers import toy

    out = tmp_path / "my runs" / "toy a"
    toy(["--seeds", "1", "--steps", "4", "--chunk-steps", "4"], out)
    printed = capsys.readouterr().out
    resume = re.search(r"rerun with (--out .*) to resume\)", printed).group(1)
    assert shlex.split(resume) == ["--out", str(out)]
    logdir = re.search(r"training curves: (tensorboard .*)", printed).group(1)
    assert shlex.split(logdir) == ["tensorboard", "--logdir", str(out / "tensorboard")]


def test_an_entry_point_whose_reader_leaves_ends_quietly():
    """``python -m experiments.combine … | head``: once head has its lines, the entry point's
    next print finds the pipe closed; it ends with 141 (SIGPIPE's status), not a traceback."""
    code = textwrap.dedent("""
        from cudt.runner.cli import exit_process, run_cli
        def main():
            for i in range(200_000):
                print("line", i)
        exit_process(run_cli(main))
    """)
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline() == "line 0\n"
    proc.stdout.close()
    err = proc.stderr.read()
    assert (proc.wait(timeout=60), err) == (141, "")
