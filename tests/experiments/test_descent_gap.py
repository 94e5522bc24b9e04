"""``python -m experiments.descent_gap``: per-layer ratios on training batches, validation and
test, read from a real tiny video run's results.json (DUST, ERM and constrained)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import assert_one_line_error, job_results

from experiments import descent_gap, video_denoise

TINY = [
    *("--models", "dust", "--layers", "3", "--num-videos", "3", "--num-frames", "8"),
    *("--seq-len", "4", "--batch-size", "16", "--dust-atoms", "16", "--steps", "20"),
    *("--chunk-steps", "20", "--warmup-steps", "5", "--eval-batch-size", "128"),
    *("--tune-epsilon", "0.1", "--tune-dual-lr", "0.03", "--tune-lr", "1", "--seeds", "1"),
    "--no-dust-control",
    "--no-figures",  # the job reads the checkpoints
]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gap") / "run"
    return out, job_results(video_denoise.main, TINY, out)


def test_ratios_are_the_runs_layer_losses_and_classes_follow_the_multipliers(run):
    _, results = run
    rows = descent_gap.layer_rows(results, {"dust"}, last=3)
    assert len(rows) == 2 * 3  # ERM and constrained, 3 layers each
    for r in results["runs"]:
        mine = [row for row in rows if row["label"] == r["label"]]
        test = np.asarray(r["layer_loss"][r["test_gamma"].index(r["gamma_train"])])
        val = np.asarray(r["layer_loss_val"])
        train = np.asarray(r["curves"]["layer_loss"])[-3:].mean(0)
        for row in mine:
            k = row["layer"]
            assert row["ratio"]["test"] == pytest.approx(test[k] / test[k - 1])
            assert row["ratio"]["val"] == pytest.approx(val[k] / val[k - 1])
            assert row["ratio"]["train"] == pytest.approx(train[k] / train[k - 1])
            assert row["test_rises"] == bool(test[k] >= test[k - 1])
        assert [row["epsilon"] for row in mine] == [0.1 if r["constrained"] else None] * 3
    summary = descent_gap.summarise(rows, active=0.0)
    erm = summary["dust", "ERM"]
    assert erm["layers"] == 3 and erm["train_slack"] is None
    constrained = {k: v for k, v in summary.items() if k[1] != "ERM"}
    assert sum(v["layers"] for v in constrained.values()) == 3
    lam = [row["multiplier"] for row in rows if row["epsilon"] is not None]
    assert constrained.get(("dust", "active"), {"layers": 0})["layers"] == sum(m > 0 for m in lam)
    everything = descent_gap.summarise(rows, active=float("inf"))
    assert everything["dust", "inactive"]["layers"] == 3
    slack = [row["ratio"]["train"] - 0.9 for row in rows if row["epsilon"] is not None]
    assert everything["dust", "inactive"]["train_slack"][0] == pytest.approx(np.mean(slack))


def test_layers_whose_constraint_is_not_applicable_are_left_out_of_the_summary(run):
    """A constraint the runner does not judge (its earlier state's validation loss at the
    floor: ℓ_0 = 0 at γ_train = 0) divides by zero: listed, never in a class's mean."""
    _, results = run
    results = json.loads(json.dumps(results))  # the fixture's stays as it was
    for r in results["runs"]:
        r["layer_loss_val"][0] = 0.0
        r["constraint_applicable_val"][1] = False
    rows = descent_gap.layer_rows(results, {"dust"}, last=3)
    assert [row["applicable"] for row in rows] == [False, True, True] * 2
    summary = descent_gap.summarise(rows, active=0.0)
    assert sum(v["layers"] for v in summary.values()) == 4
    for s in summary.values():
        assert all(np.isfinite(s["val_to_test"])), s


def test_cli_prints_each_class_and_refuses_a_folder_without_results(run, tmp_path, capsys):
    out, _ = run
    assert descent_gap.main([str(out), "--layers"]) == 0
    text = capsys.readouterr().out
    assert "dust-3 constrained seed 0" in text and "layer 3:" in text
    assert "dust    ERM" in text
    assert descent_gap.main([str(tmp_path)]) == 2
    assert "no results.json" in capsys.readouterr().err
    assert descent_gap.main([str(out), "--models", "dust,vit"]) == 2
    assert "no run of model vit in" in capsys.readouterr().err


def test_bad_flags_and_folders_are_one_line_before_anything_is_read(run, tmp_path, capsys):
    """Each refused in one line, exit 2: a count of points below 1 (it averaged every point),
    a threshold that is not a number >= 0, a folder named twice (its runs counted twice), runs
    of two experiments pooled, a missing folder argument (argparse's usage block before)."""
    out, results = run
    other = tmp_path / "other"
    other.mkdir()
    (other / "results.json").write_text(json.dumps(dict(results, experiment="llm_sft")))
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "results.json").write_text(json.dumps(results))
    for argv, words in (
        ([str(out), "--last", "0"], "--last must be a whole number >= 1, got 0"),
        ([str(out), "--active", "nan"], "--active must be a finite number >= 0, got nan"),
        ([str(out), "--active", "abc"], "argument --active: invalid float value: 'abc'"),
        ([str(out), str(out)], f"{out} is named twice"),
        ([str(out), str(other)], "runs of different experiments (llm_sft, video_denoise)"),
        # a copy of the folder: the same runs on the same data (counted twice before review)
        ([str(out), str(copy)], f"seed 0 lr=0.001 is in both {out} and {copy} (the same data)"),
        ([], "the following arguments are required: folders"),
    ):
        assert_one_line_error(descent_gap.main, argv, capsys, words)


def test_a_run_two_folders_hold_under_other_labels_is_refused_not_counted_twice(
    run, tmp_path, capsys
):
    """A later ``--sweep epsilon=0.1,0.3`` command's folder labels its runs ``... eps=0.1``:
    its lane at the ε another folder trained is that folder's run again (the same seed and
    settings) under another label, refused; its lane at another ε is another run, pooled."""
    out, results = run

    def swept(name, epsilon):
        folder = tmp_path / name
        folder.mkdir()
        runs = [
            dict(
                r,
                label=f"{r['label']} eps={epsilon:g}",
                hparams={**r["hparams"], "epsilon": epsilon},
            )
            for r in results["runs"]
            if r["constrained"]
        ]
        (folder / "results.json").write_text(json.dumps(dict(results, runs=runs)))
        return folder

    again, other = swept("again", 0.1), swept("other", 0.3)
    # before: the ERM/constrained layers of seed 0 pooled twice ("dust ERM 6" of 3 layers)
    label = next(r["label"] for r in results["runs"] if r["constrained"])
    assert_one_line_error(
        descent_gap.main,
        [str(out), str(again)],
        capsys,
        f"{label} eps=0.1 in {again} is {label} in {out} (the same seed and settings",
    )
    assert descent_gap.main([str(out), str(other), "--active", "1e9"]) == 0
    assert "dust    inactive      6" in capsys.readouterr().out


def test_a_seed_run_with_and_without_data_seed_of_its_own_draw_is_one_run(run, tmp_path, capsys):
    """Seed 0 without --data-seed reads its own draw, 0: the same run as seed 0 with
    ``--data-seed 0`` (refused, as combine refuses it, not pooled twice); with
    ``--data-seed 3`` it read other data, another run (pooled)."""
    out, results = run
    assert results["config"]["data_seed"] is None and results["config"]["seed"] == 0

    def drawn(data_seed):
        folder = tmp_path / f"data{data_seed}"
        folder.mkdir()
        config = dict(results["config"], data_seed=data_seed, data_per_seed=False)
        (folder / "results.json").write_text(json.dumps(dict(results, config=config)))
        return folder

    same, other = drawn(0), drawn(3)
    label = results["runs"][0]["label"]
    # before: the key held the recorded data_seed (None vs 0), and "dust ERM 6" printed
    assert_one_line_error(
        descent_gap.main, [str(out), str(same)], capsys, f"{label} is in both {out} and {same}"
    )
    assert descent_gap.main([str(out), str(other)]) == 0
    assert "dust    ERM           6" in capsys.readouterr().out


def test_training_slack_is_against_the_epsilon_the_run_trained_at():
    """A run of ``--epsilon-margin m`` trains its constraints at ε + m and is judged at ε: its
    training batches held at their bound, r = 1 − (ε + m), read as slack −m ("0: the constraint
    holds with equality"; found by the paper-jobs review). Training batches are measured
    against the trained bound, validation against the judged one."""
    eps, margin = 0.05, 0.1
    train = [1.0, 1 - eps - margin, (1 - eps - margin) ** 2]  # at the trained bound
    val = [1.0, 1 - eps, (1 - eps) ** 2]  # at the judged bound
    run = {
        "label": "m-2 constrained seed 0",
        "model": "m",
        "seed": 0,
        "constrained": True,
        "diverged": False,
        "hparams": {"epsilon": eps},
        "trained_epsilon": eps + margin,
        "gamma_train": 0.5,
        "test_gamma": [0.0, 0.5],
        "layer_loss": [val, val],
        "layer_loss_val": val,
        "constraint_applicable_val": [True, True, True],
        "curves": {"layer_loss": [train, train], "multipliers": [[0.0] * 3] * 2},
    }
    # None: a run without a margin, trained at ε, whose batches then sit m inside its bound
    for trained, want in ((eps + margin, 0.0), (None, -margin)):
        rows = descent_gap.layer_rows({"runs": [dict(run, trained_epsilon=trained)]}, last=2)
        s = descent_gap.summarise(rows, active=1.0)["m", "inactive"]
        assert s["train_slack"][0] == pytest.approx(want)
        assert s["val_slack"][0] == pytest.approx(0.0)


def test_folders_of_other_settings_hold_other_runs_and_a_free_difference_does_not(
    run, tmp_path, capsys
):
    """Two folders whose runs share seed, model and hyperparameters but not ``--steps`` trained
    other runs: pooled (before: refused as "the same seed and settings", the key held only
    the hyperparameters). A folder that differs only in how it ran (``--chunk-steps``, its
    ``--out``) or its tune grid holds the same runs: still refused."""
    out, results = run

    def copy(name, **changes):
        folder = tmp_path / name
        folder.mkdir()
        config = dict(results["config"], **changes)
        (folder / "results.json").write_text(json.dumps(dict(results, config=config)))
        return folder

    longer = copy("longer", steps=results["config"]["steps"] + 10)
    assert descent_gap.main([str(out), str(longer)]) == 0
    assert "dust    ERM           6" in capsys.readouterr().out
    same = copy("same", chunk_steps=5, out="elsewhere", tune_epsilon=[0.1, 0.3], models=["dust"])
    label = results["runs"][0]["label"]
    assert_one_line_error(
        descent_gap.main, [str(out), str(same)], capsys, f"{label} is in both {out} and {same}"
    )
