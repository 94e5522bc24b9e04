"""``python -m experiments.layer_gradients``: the gradients of consecutive states' losses of a
finished run, read from its checkpoints, and what ρ = ⟨g_(l−1), g_l⟩ / ‖g_l‖² says."""

from __future__ import annotations

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import finished_job

from cudt.runner.finished import finished_run, trained_params
from experiments import layer_gradients, llm_sft, video_denoise

TINY = [
    "--models", "ut", "--layers", "2", "--steps", "4", "--chunk-steps", "2", "--seeds", "1",
    "--batch-size", "4", "--num-videos", "3", "--num-frames", "4", "--seq-len", "4",
    "--no-figures",  # the job reads the checkpoints
]  # fmt: skip


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return finished_job(video_denoise.main, TINY, tmp_path_factory.mktemp("lg") / "run")


def test_every_run_and_layer_is_printed(run, capsys):
    assert layer_gradients.main([str(run), "--examples", "16"]) == 0
    out = capsys.readouterr().out
    labels = [r["label"] for r in json.loads((run / "results.json").read_text())["runs"]]
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith("| ut-")]
    assert [(r[0][2:], int(r[1])) for r in rows] == [(k, n) for k in labels for n in (1, 2)]
    for r in rows:
        if r[1] == "1":  # state 0 is the noisy input: no parameter moves its loss
            assert r[4] == "n/a" and r[5] == "+0.000 |"  # and it gives nothing back
        else:
            assert -1 <= float(r[4]) <= 1 and float(r[3]) > 0
    assert "On 16 validation examples" in out


def test_rho_is_what_a_step_on_one_states_loss_does_to_the_state_before(run):
    rows = layer_gradients.layer_gradients(run, None, 16)
    row = next(r for r in rows if r["layer"] == 2)
    task = layer_gradients.TASKS["video_denoise"]()
    cfg, data, results = finished_run(run, task, "a test")
    record = next(r for r in results["runs"] if r["label"] == row["label"])
    params = trained_params(run, results, [row["label"]], cfg.steps)[row["label"]]
    model = task.build(cfg, data, "ut", task.structure(cfg, "ut", record["constrained"]))
    gamma = float(record["hparams"]["gamma_train"])
    batch, key = layer_gradients._val_batch(task, cfg, data, model, gamma, 16)

    def means(p):
        out = model.eval_outputs(
            p, model.frozen, batch.examples, jnp.asarray(batch.index), jnp.float32(gamma), key
        )
        return out["losses"][: batch.count].mean(0)

    # the runner's inputs: on the whole validation split, its recorded layer_loss_val
    whole = layer_gradients.layer_gradients(run, [row["label"]], 10_000)
    np.testing.assert_allclose(
        [row["loss_before"] for row in whole[:1]] + [r["loss"] for r in whole],
        record["layer_loss_val"],
        rtol=1e-5,
    )
    g2 = jax.grad(lambda p: means(p)[2])(params)
    norm2 = sum(float(jnp.vdot(x, x)) for x in jax.tree.leaves(g2))
    assert np.sqrt(norm2) == pytest.approx(row["grad_norm"], rel=1e-3)
    # a step of ±η along g_2 moves ℓ_2 by ∓η‖g_2‖² and ℓ_1 by ∓η ρ ‖g_2‖² (central differences)
    eta = 0.01 * row["loss"] / norm2
    ahead, back = (
        np.asarray(means(jax.tree.map(lambda p, g, s=s: p + s * eta * g, params, g2)), np.float64)
        for s in (-1.0, 1.0)
    )
    change = (ahead - back) / 2
    assert change[2] == pytest.approx(-eta * norm2, rel=0.05)
    assert change[1] == pytest.approx(-eta * row["rho"] * norm2, rel=0.05)


def test_an_llm_sft_run_is_read_on_its_own_validation_losses(tmp_path, capsys):
    """The decoder's response readout indexes the batch's loss mask with traced positions: a
    batch closed over by the jitted gradient (numpy inside the trace) failed on every llm_sft
    run with a TracerArrayConversionError. On the whole validation split the losses are the
    recorded layer_loss_val."""
    argv = [
        "--num-train", "8", "--num-val", "4", "--num-test", "2", "--steps", "2",
        "--layers", "2", "--hidden", "8", "--heads", "1", "--kv-heads", "1", "--no-figures",
    ]  # fmt: skip
    run = finished_job(llm_sft.main, argv, tmp_path / "run")
    results = json.loads((run / "results.json").read_text())
    capsys.readouterr()
    assert layer_gradients.main([str(run)]) == 0
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines()]
    assert [(r[0][2:], int(r[1])) for r in rows if r[0].startswith("| llm-")] == [
        (record["label"], n) for record in results["runs"] for n in (1, 2)
    ]
    for record in results["runs"]:
        found = layer_gradients.layer_gradients(run, [record["label"]], 10_000)
        assert all(r["examples"] == 4 and r["grad_norm"] > 0 for r in found)
        np.testing.assert_allclose(
            [found[0]["loss_before"]] + [r["loss"] for r in found],
            record["layer_loss_val"],
            rtol=1e-5,
        )


def test_bad_input_is_one_line(run, tmp_path, capsys):
    assert layer_gradients.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "results.json" in err[0]
    assert layer_gradients.main([str(run), "--run", "ut-9 ERM seed 0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has no run 'ut-9 ERM seed 0': pass one of 'ut-2 ERM" in err[0]
    diverged = tmp_path / "diverged"
    shutil.copytree(run, diverged)
    results = json.loads((diverged / "results.json").read_text())
    for record in results["runs"]:
        record["diverged"] = True
    (diverged / "results.json").write_text(json.dumps(results))
    assert layer_gradients.main([str(diverged)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "every run diverged: name one with --run LABEL" in err[0]
    assert layer_gradients.main([str(run), "--examples", "0"]) == 2
    assert capsys.readouterr().err.strip() == "error: --examples must be >= 1, got 0"
