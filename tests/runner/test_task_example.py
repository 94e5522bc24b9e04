"""The example task of docs/design.md ("A task, from scratch"), run as the page writes it.

The example's code lives in the page only: these tests take its one ``python`` block from
docs/design.md, execute it, and run the task through the real runner (``task_main``) on a tiny
config, so the page cannot drift from a task that works.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from cudt.runner import Task
from cudt.runner.cli import task_main

DESIGN = Path(__file__).resolve().parents[2] / "docs" / "design.md"
SECTION = "## A task, from scratch"


def section() -> str:
    text = DESIGN.read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    return text[start:] if end < 0 else text[start:end]


def example_namespace() -> dict:
    (code,) = re.findall(r"```python\n(.*?)```", section(), flags=re.S)
    namespace = {"__name__": "design_example"}  # not __main__: the block's CLI does not run
    exec(compile(code, str(DESIGN), "exec", dont_inherit=True), namespace)
    return namespace


def test_the_example_is_short():
    assert len(section().splitlines()) <= 250


def test_the_example_trains_and_reports_through_the_runner(tmp_path):
    task = example_namespace()["SineTask"]()
    out = tmp_path / "sine"
    argv = ["--seeds", "1", "--steps", "60", "--examples", "64", "--chunk-steps", "30"]
    assert task_main(task, [*argv, "--out", str(out)], "sine", "sine") == 0
    results = json.loads((out / "results.json").read_text())
    assert results["experiment"] == "sine" and results["config"]["activation"] == "tanh"
    runs = {r["constrained"]: r for r in results["runs"]}
    assert sorted(runs) == [False, True]
    var_y = 0.5 - math.sin(6.0) / 12.0  # E sin^2(3x), x ~ U(-1, 1): the MSE of predicting 0
    for run in runs.values():
        assert run["test_gamma"] == [0.0, 0.1, 0.2] and len(run["mse"]) == 3
        assert run["mse"][0] < var_y / 2, run["mse"]  # the MLP learned the sine
        assert len(run["layer_loss"][0]) == 4  # states 0..L of the default L = 3
    # the constrained run's last state predicts better than its first, at gamma_train
    at_train = runs[True]["layer_loss"][runs[True]["test_gamma"].index(0.1)]
    assert at_train[-1] < at_train[0]
    # the task's fingerprint is part of what its checkpoints were trained on
    saved = json.loads((out / "checkpoints" / "config.json").read_text())
    assert "y = sin(3x)" in json.dumps(saved)


def test_a_task_without_fingerprint_cannot_be_made():
    # every other required hook of the example, and no fingerprint: refused at instantiation,
    # before a run could resume over checkpoints trained on other data
    example = example_namespace()["SineTask"]
    hooks = ("load", "split_examples", "model_names", "build", "test_gamma_grid")
    forgetful = type("Forgetful", (Task,), {h: getattr(example, h) for h in hooks})
    with pytest.raises(TypeError, match="fingerprint"):
        forgetful()


def _broken(example, fault: str):
    """The example task with one thing its model gives the runner wrong (``fault``)."""

    class Broken(example):
        def load(self, cfg):
            data = super().load(cfg)
            if fault == "empty val":
                data["val"] = {k: v[:0] for k, v in data["val"].items()}
            return data

        def build(self, cfg, data, name, structure):
            model = super().build(cfg, data, name, structure)
            losses, outputs = model.layer_losses, model.eval_outputs
            if fault == "[L+1, B]":
                losses = lambda p, b, k: model.layer_losses(p, b, k).T  # noqa: E731
            if fault == "[B, L]":
                losses = lambda p, b, k: model.layer_losses(p, b, k)[:, 1:]  # noqa: E731
            if fault == "no losses":
                outputs = lambda *a: {"loss": model.eval_outputs(*a)["losses"]}  # noqa: E731
            if fault in ("a None output", "a scalar output"):
                extra = None if fault == "a None output" else 1.0
                outputs = lambda *a: {**model.eval_outputs(*a), "extra": extra}  # noqa: E731
            return dataclasses.replace(model, layer_losses=losses, eval_outputs=outputs)

    return Broken()


@pytest.mark.parametrize(
    ("fault", "words"),
    [
        ("[L+1, B]", "layer_losses has shape (4, 16), not [B, L+1] = [16, 4]"),
        ("[B, L]", "layer_losses has shape (16, 3), not [B, L+1] = [16, 4]"),
        ("no losses", "eval_outputs returns ['loss'], without 'losses'"),
        ("a None output", "eval_outputs' 'extra' is NoneType, not an array [B, S]"),
        ("a scalar output", "eval_outputs' 'extra' has shape (), not an array [B, S]"),
        ("empty val", "the val split has no examples"),
    ],
)
def test_a_model_the_runner_cannot_read_is_refused_before_anything_is_written(
    tmp_path, capsys, fault, words
):
    # found only by training (a traceback, --out written) or after it (the training lost)
    task = _broken(example_namespace()["SineTask"], fault)
    out = tmp_path / "sine"
    argv = ["--seeds", "1", "--steps", "4", "--batch-size", "16", "--out", str(out)]
    assert task_main(task, argv, "sine", "sine") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: sine model 'mlp': ") and words in err, err
    assert len(err.splitlines()) == 1 and not out.exists()


def test_a_task_whose_fingerprint_names_no_data_is_not_resumed_over_other_examples(
    tmp_path, capsys
):
    # a user's task reading its examples from a file at one path, whose fingerprint forgets
    # them ({}): the runner's digest of the training examples refuses a resume over other ones
    example = example_namespace()["SineTask"]
    source = tmp_path / "data.npz"

    class FromFile(example):
        def load(self, cfg):
            with np.load(source) as f:
                return {s: {"x": f[s], "y": np.sin(3.0 * f[s])} for s in ("train", "val", "test")}

        def fingerprint(self, cfg, data):
            return {}

    def write(seed):
        rng = np.random.default_rng(seed)
        np.savez(source, **{s: rng.uniform(-1, 1, (32, 1)).astype(np.float32) for s in "abc"})
        with np.load(source) as f:  # as train, val, test
            np.savez(source, train=f["a"], val=f["b"], test=f["c"])

    out = tmp_path / "run"
    argv = ["--seeds", "1", "--steps", "4", "--chunk-steps", "2", "--out", str(out)]
    write(0)
    assert task_main(FromFile(), argv, "sine", "sine") == 0
    (out / "results.json").unlink()  # the same command would resume its checkpoints
    write(1)  # other examples at the same path, behind the same flags
    capsys.readouterr()
    assert task_main(FromFile(), argv, "sine", "sine") == 2
    err = capsys.readouterr().err
    assert "trained on other files" in err and "examples_digest" in err, err
    assert not (out / "results.json").exists()
    write(0)  # the examples it was trained on: resumed
    assert task_main(FromFile(), argv, "sine", "sine") == 0
    assert "resumed from the checkpoint at step 4" in capsys.readouterr().err
    saved = json.loads((out / "checkpoints" / "config.json").read_text())
    assert len(saved["examples_digest"]) == 16


def test_a_task_of_your_own_is_combined_in_python_as_the_refusal_says(tmp_path, capsys):
    # experiments.combine knows cudt's tasks only: its refusal names what to call instead
    from cudt.runner.combine import combine
    from experiments.combine import main as combine_main

    task = example_namespace()["SineTask"]()
    folders = [str(tmp_path / "s0"), str(tmp_path / "s1")]
    tiny = ["--steps", "4", "--chunk-steps", "2", "--examples", "32", "--seeds", "1"]
    for seed, out in enumerate(folders):
        assert task_main(task, [*tiny, "--seed", str(seed), "--out", out], "sine", "sine") == 0
    capsys.readouterr()
    assert combine_main(folders) == 2
    err = capsys.readouterr().err.strip()
    assert "unknown experiment 'sine'" in err and "cudt.runner.combine.combine(" in err, err
    report = combine(task, folders)
    assert "mlp-3 constrained: mean [95% Student-t interval] over 2 seeds" in report


def test_a_test_example_with_a_nan_is_named_as_such_under_the_table(tmp_path, capsys):
    # a bad value in the user's test data: its ratios were said to be "below the floor", and
    # the floor itself fell to 1e-12 (every state's mean was NaN)
    example = example_namespace()["SineTask"]

    class OneBadValue(example):
        def load(self, cfg):
            data = super().load(cfg)
            data["test"]["x"][5] = np.nan
            return data

    out = tmp_path / "sine"
    argv = ["--seeds", "1", "--steps", "4", "--examples", "32", "--out", str(out)]
    assert task_main(OneBadValue(), argv, "sine", "sine") == 0
    text = capsys.readouterr().out
    # at 4 steps some early states' losses are near 0 too: below the floor, named apart
    assert "; 3 with a non-finite loss); descent and mean/median r are over the rest" in text
    for run in json.loads((out / "results.json").read_text())["runs"]:
        assert run["ratios_non_finite"] == 3 and run["ratio_floor"] > 1e-6


def test_a_task_without_its_config_class_is_named_in_one_line(tmp_path, capsys):
    # config_cls left at the base class's None: a TypeError from typing.get_type_hints
    example = example_namespace()["SineTask"]
    forgetful = type("NoConfig", (example,), {"config_cls": None})()
    assert task_main(forgetful, ["--out", str(tmp_path / "run")], "sine", "sine") == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "error: NoConfig.config_cls is None, not a subclass of cudt.runner.RunConfig: set "
        "config_cls to the task's config class (docs/design.md)"
    )
    assert not (tmp_path / "run").exists()


def test_the_example_reads_test_gammas_and_a_grid_that_does_not_is_refused(tmp_path, capsys):
    # the example's grid once ignored --test-gammas (accepted, evaluated at 0, γ, 2γ all the
    # same); a grid without γ_train failed after training (0.3 is not in list)
    example = example_namespace()["SineTask"]
    tiny = ["--seeds", "1", "--steps", "4", "--examples", "32", "--test-gammas", "0,0.5"]
    out = tmp_path / "sine"
    assert task_main(example(), [*tiny, "--out", str(out)], "sine", "sine") == 0
    (run, *_) = json.loads((out / "results.json").read_text())["runs"]
    assert run["test_gamma"] == [0.0, 0.1, 0.5]
    capsys.readouterr()
    fixed = type("Fixed", (example,), {"test_gamma_grid": lambda self, cfg, g: [0.0, 1.0]})
    for argv, missing in (([], "0.1"), (["--test-gammas", "0,0.5"], "0.1, 0.5")):
        out = tmp_path / f"fixed{len(argv)}"
        assert task_main(fixed(), [*tiny[:6], *argv, "--out", str(out)], "sine", "sine") == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(
            f"error: sine's test_gamma_grid(cfg, 0.1) is [0.0, 1.0], without {missing}: "
        ), err
        assert not out.exists()


def test_seeds_of_a_task_whose_fingerprint_is_empty_resume_a_record_without_examples_digest(
    tmp_path, capsys
):
    # fingerprint() {} (the config alone draws the data), each seed its own draw: a record
    # from before examples_digest holds {} per draw, which resumes as a digest one side lacks
    # does (before: refused, "data_per_seed.0 {} -> None; data_per_seed.1 {} -> None")
    example = example_namespace()["SineTask"]

    class NoData(example):
        def fingerprint(self, cfg, data):
            return {}

    out = tmp_path / "run"
    argv = ["--seeds", "2", "--steps", "4", "--chunk-steps", "2", "--examples", "32"]
    argv += ["--no-figures", "--out", str(out)]
    assert task_main(NoData(), argv, "sine", "sine") == 0
    (out / "results.json").unlink()  # the same command would resume its checkpoints
    path = out / "checkpoints" / "config.json"
    saved = json.loads(path.read_text())
    assert sorted(saved["data_per_seed"]) == ["0", "1"]
    saved["data_per_seed"] = {seed: {} for seed in saved["data_per_seed"]}  # the earlier record
    path.write_text(json.dumps(saved))
    capsys.readouterr()
    assert task_main(NoData(), argv, "sine", "sine") == 0, capsys.readouterr().err
    assert "resumed from the checkpoint at step 4" in capsys.readouterr().err
