"""The text experiment end to end on tiny configs: results, plots, states, noise, head, refusals.

The pretrained model is a random 2-block BERT (hidden size 32) written here in the Hugging Face
layout, with the real all-MiniLM-L6-v2 ``tokenizer.json`` so it can read the generated reviews.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import (
    FFN,
    HEADS,
    LAYERS,
    MAX_POS,
    RUNNER_KEYS,
    TINY_TEXT,
    D,
    assert_one_line_error,
    bad_flags_test,
    help_text,
    job_results,
    write_tiny_bert,
    write_tiny_folder,
)
from PIL import Image

from cudt.data.text import length_batches
from cudt.errors import UsageError
from cudt.metrics import trapezoid_auc
from cudt.models.classifier import (
    TextClassifier,
    build_text_model,
    cross_entropy,
    make_layer_losses,
)
from cudt.models.encoders import minilm_path
from cudt.runner.hparams import resolve_reference
from experiments import text_classify

TINY = [*TINY_TEXT, "--gamma-train", "1", "--eval-batch-size", "32"]
RUN_KEYS = RUNNER_KEYS | {"accuracy", "auc"}  # and the task's metrics


@pytest.fixture(scope="module")
def bert_run(tiny_bert, tmp_path_factory):
    """Tiny BERT, one state per sub-layer, ERM and constrained, 2 seeds vmapped, 4 steps."""
    out = tmp_path_factory.mktemp("tc") / "run"
    argv = TINY + [
        "--model",
        "bert",
        "--checkpoint",
        str(tiny_bert),
        "--granularity",
        "sublayer",
        "--steps",
        "4",
        "--chunk-steps",
        "2",
        "--checkpoint-every",
        "4",
        "--seeds",
        "2",
    ]
    return out, job_results(text_classify.main, argv, out)


def _batch(model: TextClassifier, texts, max_length=12) -> dict:
    ids, mask = model.encoder.tokenize(texts, max_length)
    return {
        "ids": jnp.asarray(ids),
        "mask": jnp.asarray(mask, jnp.float32),
        "labels": jnp.arange(len(texts), dtype=jnp.int32) % 2,
    }


@pytest.mark.slow
def test_results_json_has_every_run_and_key(bert_run):
    _, results = bert_run
    runs = results["runs"]
    assert {(r["constrained"], r["seed"]) for r in runs} == {
        (c, s) for c in (False, True) for s in (0, 1)
    }
    states = 2 * LAYERS + 1  # sub-layer granularity: attention and MLP output of every block
    for run in runs:
        assert RUN_KEYS <= set(run) and "rmse" not in run
        assert run["model"] == "bert" and run["layers"] == 2 * LAYERS and run["blocks"] == LAYERS
        assert run["granularity"] == "sublayer" and len(run["multipliers"]) == states
        assert run["test_gamma"] == [0.0, 1.0, 2.0]  # γ_train joins the explicit grid
        assert len(run["accuracy"]) == len(run["layer_loss"]) == len(run["test_gamma"])
        assert all(len(ll) == states for ll in run["layer_loss"])
        assert 0 < run["descent_rate"] <= 1 and run["mean_ratio"] > 0
        if not run["constrained"]:
            assert run["multipliers"] == [0.0] * states
    assert results["config"]["steps"] == 4 and results["paper_descent"]["descent_rate"] == 0.708
    # Seeds share the pretrained body but not the head init, batches and noise.
    erm = [r for r in runs if not r["constrained"]]
    assert erm[0]["layer_loss"] != erm[1]["layer_loss"]


@pytest.mark.slow
def test_accuracy_and_auc_are_consistent(bert_run):
    _, results = bert_run
    n_test = 20
    for run in results["runs"]:
        acc = np.asarray(run["accuracy"])
        assert np.all((acc >= 0) & (acc <= 1))
        # accuracy is that of the last state, counted over the test examples
        np.testing.assert_allclose(acc, [la[-1] for la in run["layer_accuracy"]])
        np.testing.assert_allclose(acc * n_test, np.round(acc * n_test), atol=1e-9)
        assert run["auc"] == pytest.approx(trapezoid_auc(run["test_gamma"], acc))
        assert run["auc"] == pytest.approx(0.5 * (acc[0] + acc[1]) + 0.5 * (acc[1] + acc[2]))


@pytest.mark.slow
def test_best_run_is_chosen_by_validation_auc(bert_run):
    """--select val-auc (the default, the paper's B.3): validation data is scored over the test
    γ grid, its AUC is each run's score, and the best mark of each kind is its maximum."""
    _, results = bert_run
    assert results["config"]["select"] == "val-auc"
    assert results["config"]["val_gamma"] == results["config"]["test_gamma"] == [0.0, 1.0, 2.0]
    n_val = 4  # TINY: a pool of 40, 10 % held out
    for run in results["runs"]:
        acc = np.asarray(run["val_accuracy_by_gamma"])
        np.testing.assert_allclose(acc * n_val, np.round(acc * n_val), atol=1e-9)
        assert run["val_auc"] == pytest.approx(trapezoid_auc(run["test_gamma"], acc))
        # the accuracy at γ_train is the validation accuracy the feasibility check also reads
        assert run["val_accuracy"] == pytest.approx(acc[run["test_gamma"].index(1.0)])
    for constrained in (False, True):
        runs = [r for r in results["runs"] if r["constrained"] == constrained]
        eligible = [r for r in runs if not r["diverged"] and (r["feasible"] or not constrained)]
        best = [r for r in runs if r.get("best")]
        assert len(best) == (1 if eligible else 0)  # an infeasible constrained run: never best
        if eligible:
            assert best[0]["val_auc"] == max(r["val_auc"] for r in eligible)


@pytest.mark.slow
def test_select_val_accuracy_scores_validation_at_gamma_train_only(tiny_bert, tmp_path):
    out = tmp_path / "run"
    argv = TINY + ["--model", "bert", "--checkpoint", str(tiny_bert), "--steps", "2"]
    argv += ["--seeds", "2", "--select", "val-accuracy", "--out", str(out)]
    assert text_classify.main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["val_gamma"] == [1.0]
    assert all("val_auc" not in r for r in results["runs"])
    erm = [r for r in results["runs"] if not r["constrained"]]  # never infeasible
    best = [r for r in erm if r.get("best")]
    assert len(best) == 1 and best[0]["val_accuracy"] == max(r["val_accuracy"] for r in erm)


@pytest.mark.slow
def test_plots_are_real_pngs(bert_run):
    out, _ = bert_run
    for name in ("layer_loss.png", "accuracy_vs_gamma.png", "ratio_hist.png"):
        with Image.open(out / name) as im:
            assert im.format == "PNG" and im.size[0] > 400 and im.size[1] > 200
            assert len(im.convert("RGB").getcolors(maxcolors=1_000_000)) > 50


@pytest.mark.slow
def test_finished_output_is_refused_and_kept(bert_run, tiny_bert, capsys):
    out, _ = bert_run
    before = (out / "results.json").read_bytes()
    argv = TINY + ["--model", "bert", "--checkpoint", str(tiny_bert), "--out", str(out)]
    assert text_classify.main(argv) == 2
    assert "already holds results.json" in capsys.readouterr().err
    assert (out / "results.json").read_bytes() == before


@pytest.mark.slow
def test_resuming_over_other_pretrained_weights_at_the_same_path_is_refused(
    bert_run, tmp_path, capsys
):
    """The frozen parts are read from the encoder folder again on resume: its weights replaced
    at the same path (another random BERT), the checkpoints are refused, not resumed over them.
    (The noise unit, γ times the table's std, would tell them apart too: it is set aside.)"""
    finished, _ = bert_run
    out, bert = tmp_path / "run", tmp_path / "bert"
    shutil.copytree(finished, out)
    (out / "results.json").unlink()  # as if killed after its last checkpoint
    write_tiny_bert(bert, seed=1)
    saved = out / "checkpoints" / "config.json"
    config = json.loads(saved.read_text())
    unit = build_text_model("bert", num_classes=2, checkpoint=str(bert)).noise_unit
    for record in config["data_per_seed"].values():  # the same path and noise unit
        record |= {"encoder_folder": str(bert), "noise_unit": unit}
    config["checkpoint"] = str(bert)
    saved.write_text(json.dumps(config))
    argv = [
        *TINY, "--model", "bert", "--checkpoint", str(bert), "--granularity", "sublayer",
        "--steps", "4", "--chunk-steps", "2", "--checkpoint-every", "4", "--seeds", "2",
    ]  # fmt: skip
    assert text_classify.main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert (
        "trained on other files than its flags name now (data_per_seed.0.encoder_digest" in err
    ), err
    assert not (out / "results.json").exists()


@pytest.mark.slow
def test_sublayer_granularity_gives_2l_plus_1_states(tiny_bert):
    # (the encoder's interleaving is tested in test_encoders.py; the run above goes end to end)
    sub = build_text_model("bert", num_classes=2, checkpoint=tiny_bert, granularity="sublayer")
    assert (sub.blocks, sub.num_layers) == (LAYERS, 2 * LAYERS)
    # the UT: after each layer's attention step Z, then its output Y
    block = build_text_model("ut", num_classes=2, checkpoint=tiny_bert, layers=3)
    ut = build_text_model(
        "ut", num_classes=2, checkpoint=tiny_bert, layers=3, granularity="sublayer"
    )
    assert (block.num_layers, ut.num_layers, ut.blocks) == (3, 6, 3)
    batch = _batch(ut, ["a fine film", "not good at all", "meh"])
    params = jax.jit(ut.init)(jax.random.key(0))
    noise = jnp.zeros(batch["ids"].shape + (D,))
    states = jax.jit(ut.states)(params, batch, noise)
    assert states.shape[0] == 7
    np.testing.assert_allclose(states[::2], jax.jit(block.states)(params, batch, noise), atol=1e-5)
    losses = jax.jit(make_layer_losses(ut, 0.5))(params, batch, jax.random.key(1))
    assert losses.shape == (3, 7) and bool(jnp.all(jnp.isfinite(losses)))
    # the UT's projection finds its parameters inside the classifier's
    assert jax.tree.structure(ut.project()(params)) == jax.tree.structure(params)
    assert sub.project() is None


def test_embedding_noise_scale_is_gamma_times_table_std(tiny_bert):
    model = build_text_model("ut", num_classes=2, checkpoint=tiny_bert, layers=1)
    table = np.asarray(model.table, np.float64)
    assert model.noise_unit == pytest.approx(table.std(), rel=1e-6)
    batch = _batch(model, ["the acting was superb but the plot was a mess"] * 64, 16)
    gamma = 0.7
    noise = np.asarray(model.noise(jax.random.key(3), batch, gamma))
    real = np.asarray(batch["mask"]) > 0
    assert noise[real].std() == pytest.approx(gamma * table.std(), rel=0.02)
    assert np.all(noise[~real] == 0)  # padding is not perturbed
    # The noise is what the first state sees: x̃ = E[ids] + noise, before any block (UT) ...
    params = jax.jit(model.init)(jax.random.key(0))
    x0 = np.asarray(jax.jit(model.states)(params, batch, jnp.asarray(noise))[0])
    np.testing.assert_allclose(x0, table[np.asarray(batch["ids"])] + noise, atol=1e-5)
    # ... and the encoder gets it as its embedding_noise (added to the word embeddings).
    bert = build_text_model("bert", num_classes=2, checkpoint=tiny_bert)
    bparams = jax.jit(bert.init)(jax.random.key(0))
    ours = bert.states(bparams, batch, jnp.asarray(noise))
    ref = bert.encoder.apply(
        bert.encoder.params, batch["ids"], batch["mask"], embedding_noise=noise
    )
    np.testing.assert_allclose(np.asarray(ours), np.asarray(ref), atol=1e-5)
    # --noise-scale replaces the table std
    fixed = build_text_model("bert", num_classes=2, checkpoint=tiny_bert, noise_scale=0.25)
    assert fixed.noise_unit == 0.25
    assert np.asarray(fixed.noise(jax.random.key(3), batch, 2.0))[real].std() == pytest.approx(
        0.5, rel=0.02
    )


@pytest.mark.parametrize("name", ["bert", "ut"])
def test_training_the_vocabulary_rows_only_is_training_the_whole_table(tiny_bert, name):
    """``trained_ids`` (the task passes the training split's ids) trains those rows only: a row
    no batch reads gets a zero gradient, so Adam leaves it alone (and the norm projection then
    too), and the model with every row trained takes the same steps."""
    whole = build_text_model(name, num_classes=2, checkpoint=tiny_bert, train_embeddings=True)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 400, size=(4, 6)).astype(np.int32)
    batch = {"ids": jnp.asarray(ids), "mask": jnp.ones((4, 6)), "labels": jnp.array([0, 1, 1, 0])}
    seen = np.unique(ids)
    part = dataclasses.replace(whole, trained_ids=seen)
    noise = whole.noise(jax.random.key(1), batch, 0.5)

    def steps(model):
        opt = optax.adam(1e-2)
        loss = lambda p: cross_entropy(model.logits(p, batch, noise), batch["labels"]).mean()

        @jax.jit
        def step(params, state):
            grads = jax.grad(loss)(params)
            updates, state = opt.update(grads, state)
            return optax.apply_updates(params, updates), state, grads

        params = model.init(jax.random.key(0))
        state = opt.init(params)
        for _ in range(3):
            params, state, grads = step(params, state)
        return params, grads, jax.jit(loss)(params)

    (pw, gw, lw), (pp, _, lp) = steps(whole), steps(part)
    table = np.asarray(whole.table)
    unseen = np.setdiff1d(np.arange(table.shape[0]), seen)
    assert np.all(np.asarray(whole.word_table(gw))[unseen] == 0)
    np.testing.assert_array_equal(np.asarray(whole.word_table(pw))[unseen], table[unseen])
    assert part.word_table(pp).shape == (seen.size, table.shape[1])
    assert not np.allclose(np.asarray(part.word_table(pp)), table[seen])  # the rows did train
    np.testing.assert_allclose(
        np.asarray(part.word_table(pp)), np.asarray(whole.word_table(pw))[seen], atol=1e-6
    )
    whole_table = np.asarray(whole.word_table(pw))
    np.testing.assert_allclose(np.asarray(part.full_table(pp)), whole_table, atol=1e-6)
    np.testing.assert_allclose(float(lp), float(lw), rtol=1e-6)


@pytest.mark.parametrize("name", ["bert", "ut"])
def test_trained_word_rows_are_held_to_their_pretrained_norms(tiny_bert, name):
    """With train_embeddings the table is a parameter; after a step the projection scales any
    row that grew back to its pretrained norm (the noise's scale is fixed from that table),
    leaves the others bit-exact, and keeps the UT's own projection."""
    model = build_text_model(name, num_classes=2, checkpoint=tiny_bert, train_embeddings=True)
    params = jax.jit(model.init)(jax.random.key(0))
    table = np.asarray(model.table)
    np.testing.assert_array_equal(np.asarray(model.word_table(params)), table)
    grown = table.copy()
    grown[:5] *= 3.0  # five rows grow, the rest shrink or stay
    grown[5:10] *= 0.5
    project = model.project()
    out = jax.jit(project)(model.with_word_table(params, jnp.asarray(grown)))
    got = np.asarray(model.word_table(out))
    norms = np.linalg.norm(table, axis=1)
    np.testing.assert_allclose(np.linalg.norm(got[:5], axis=1), norms[:5], rtol=1e-5)
    np.testing.assert_allclose(got[:5] / norms[:5, None], table[:5] / norms[:5, None], atol=1e-6)
    np.testing.assert_array_equal(got[5:], grown[5:])
    assert jax.tree.structure(out) == jax.tree.structure(params)
    if name == "ut":  # the UT's eigenvalue clip still runs on its feed-forward matrix
        ffn = dict(params["body"]["ut"], ffn=10.0 * params["body"]["ut"]["ffn"])
        wide = dict(params, body=dict(params["body"], ut=ffn))
        clipped = np.asarray(jax.jit(project)(wide)["body"]["ut"]["ffn"])
        sym = 0.5 * (clipped + clipped.T)
        assert np.abs(np.linalg.eigvalsh(sym)).max() <= 0.95 * (1 + 1e-4)
    frozen = build_text_model(name, num_classes=2, checkpoint=tiny_bert)
    assert (frozen.project() is None) == (name == "bert")


@pytest.mark.parametrize("name", ["bert", "ut"])
def test_one_head_is_shared_by_every_state(tiny_bert, name):
    model = build_text_model(name, num_classes=3, checkpoint=tiny_bert)
    params = jax.jit(model.init)(jax.random.key(0))
    # exactly one readout: no other [D, C] matrix anywhere in the params
    assert set(params["head"]) == {"kernel", "bias"}
    assert params["head"]["kernel"].shape == (D, 3)
    assert [x.shape for x in jax.tree.leaves(params["body"])].count((D, 3)) == 0
    batch = _batch(model, ["good", "a terrible waste of time", "it is set in Lisbon"])
    noise = jnp.zeros(batch["ids"].shape + (D,))

    @jax.jit
    def pooled_and_logits(params, batch):  # [S, B, D], [S, B, C]
        pooled = model.pool(model.states(params, batch, noise), batch["mask"])
        return pooled, model.logits(params, batch, noise)

    pooled, logits = pooled_and_logits(params, batch)
    w, b = params["head"]["kernel"], params["head"]["bias"]
    assert not model.head_norm  # the paper's readout: linear in the pooled state
    for state in range(model.num_layers + 1):
        np.testing.assert_allclose(logits[state], pooled[state] @ w + b, rtol=1e-4, atol=1e-5)

    def state_losses(head, batch):  # [S]
        p = dict(params, head=head)
        return cross_entropy(model.logits(p, batch, noise), batch["labels"]).sum(axis=1)

    # the loss of every state reaches the one head: its gradients land on the same leaves
    jac = jax.jit(jax.jacrev(state_losses))(params["head"], batch)
    assert jac["kernel"].shape == (model.num_layers + 1, D, 3)
    assert np.all(np.abs(np.asarray(jac["kernel"])).max(axis=(1, 2)) > 0)


@pytest.mark.parametrize("tying", ["all", "none"])
def test_ut_reads_word_order_only_with_positions(tiny_bert, tying):
    # Without positions the UT is a bag-of-tokens reader: attention is equivariant and the mean
    # is invariant under a permutation of the tokens. --ut-positions must break that.
    texts = ["this was not bad at all, great", "a terrible waste of time"]
    perm = np.array([0, 5, 3, 1, 4, 2, 6, 7, 8, 9, 10, 11])  # moves real tokens of both texts
    outputs = {}
    for positions in (False, True):
        model = build_text_model(
            "ut", num_classes=2, checkpoint=tiny_bert, ut_tying=tying, positions=positions
        )
        assert model.positions == positions
        params = jax.jit(model.init)(jax.random.key(0))
        batch = _batch(model, texts)
        assert np.asarray(batch["mask"])[:, :6].all()  # the permuted slots hold real tokens
        shuffled = dict(batch, ids=batch["ids"][:, perm], mask=batch["mask"][:, perm])
        noise = jnp.zeros(batch["ids"].shape + (D,))
        run = jax.jit(model.logits)
        outputs[positions] = tuple(np.asarray(run(params, b, noise)) for b in (batch, shuffled))
        states = jax.jit(model.states)(params, batch, noise)
        words = model.embed(params, batch["ids"])
        expected = words + (model.encoder.position_embeddings(batch["ids"]) if positions else 0)
        np.testing.assert_allclose(states[0], expected, atol=1e-6)  # state 0: the input
    plain, shuffled = outputs[False]
    np.testing.assert_allclose(plain, shuffled, rtol=1e-4, atol=1e-6)
    ordered, reordered = outputs[True]
    # every state after the input reads the order; state 0's mean does not change
    for state in range(1, ordered.shape[0]):
        assert np.abs(ordered[state] - reordered[state]).max() > 1e-4
    assert np.abs(ordered - plain).max() > 1e-4  # positions change the input itself
    with pytest.raises(UsageError, match="positions apply to --model ut only"):
        build_text_model("bert", num_classes=2, checkpoint=tiny_bert, positions=True)


@pytest.mark.parametrize(
    "field, other",
    [("ut_positions", True), ("head_norm", True), ("ut_tying", "attention"), ("ut_skip", True)],
)
def test_checkpoints_from_before_a_text_flag_resume_at_its_old_behaviour(tmp_path, field, other):
    from cudt.runner.output import open_output
    from cudt.tasks.text import TextConfig

    out = tmp_path / "run"
    open_output(out, {"lr": 1})  # written before the flag existed
    (out / "checkpoints" / "g" / "4").mkdir(parents=True)
    added = TextConfig.ADDED
    # the recorded old behaviour is the flag's default, so a default run resumes
    assert added[field] == getattr(TextConfig(), field)
    assert open_output(out, {"lr": 1} | added, added=added).resuming
    with pytest.raises(UsageError, match=re.escape(f"{field} None -> {other!r}")):
        open_output(out, {"lr": 1} | added | {field: other}, added=added)


def test_pooling_and_reference_defaults(tiny_bert):
    # the paper's: [CLS] for pretrained encoders, token mean for the UT; MiniLM: its own (mean)
    assert build_text_model("bert", num_classes=2, checkpoint=tiny_bert).pooling == "first"
    assert build_text_model("ut", num_classes=2, checkpoint=tiny_bert).pooling == "mean"
    assert build_text_model("minilm", num_classes=2).pooling == "mean"
    model = build_text_model("bert", num_classes=2, checkpoint=tiny_bert, pooling="mean")
    batch = _batch(model, ["good", "a terrible waste of time"])
    states = jax.random.normal(jax.random.key(0), (3,) + batch["ids"].shape + (D,))
    m = np.asarray(batch["mask"])[None, :, :, None]
    expected = (np.asarray(states) * m).sum(2) / m.sum(2)  # padding left out of the mean
    np.testing.assert_allclose(model.pool(states, batch["mask"]), expected, atol=1e-5)
    ln2, ln3 = np.log(2), np.log(3)
    assert resolve_reference("chance", ln3) == pytest.approx(np.log(3))
    assert resolve_reference("none", ln2) is None and resolve_reference("0.5", ln2) == 0.5
    # chance+X: the chance level plus a margin (the paper's C = 1.0 on IMDb is ln 2 + 0.31)
    assert resolve_reference("chance+0.3", ln2) == pytest.approx(np.log(2) + 0.3)
    assert resolve_reference("Chance+0", ln3) == pytest.approx(np.log(3))
    with pytest.raises(UsageError, match="has no chance level"):
        resolve_reference("chance", None)
    with pytest.raises(UsageError, match="--reference must be chance"):
        resolve_reference("chanse", ln2)


def test_build_text_model_refusals(tiny_bert):
    with pytest.raises(UsageError, match="--model roberta needs --checkpoint FOLDER"):
        build_text_model("roberta", num_classes=2)
    with pytest.raises(UsageError, match="--layers 3 applies to --model ut only"):
        build_text_model("bert", num_classes=2, checkpoint=tiny_bert, layers=3)
    with pytest.raises(UsageError, match="unknown pooling 'max'"):
        build_text_model("bert", num_classes=2, checkpoint=tiny_bert, pooling="max")
    with pytest.raises(UsageError, match="unknown granularity"):
        build_text_model("bert", num_classes=2, checkpoint=tiny_bert, granularity="layer")


def test_ut_flags_act_for_the_ut_alone():
    """A UT flag at its default passes for every model; another value, for the UT alone."""
    from cudt.tasks.text import TextConfig

    assert TextConfig(model="minilm", ut_b=0.5).ut_b == 0.5
    assert TextConfig(model="ut", ut_a=2.0, ut_b=0.3, ut_tying="none", ut_skip=True).ut_b == 0.3
    for field, value in (("ut_a", 2.0), ("ut_b", 0.3), ("ut_tying", "none"), ("ut_skip", True)):
        flag = "--" + field.replace("_", "-")
        with pytest.raises(ValueError, match=f"^{flag} applies to --model ut only \\(minilm"):
            TextConfig(model="minilm", **{field: value})


def test_help_lists_every_flag(capsys):
    out = help_text(text_classify.main, text_classify.Config, capsys)
    for flag in ("--model", "--checkpoint", "--dataset", "--data-dir", "--layers", "--granularity",
                 "--gamma-train", "--seeds", "--steps", "--out"):  # fmt: skip
        assert flag in out


test_bad_flags_exit_2_with_one_line = bad_flags_test(
    text_classify.main,
    [
        (["--model", "gpt2"], "--model must be one of minilm, bert, distilbert, roberta, ut"),
        (["--model", "bert"], "--model bert needs --checkpoint"),
        (["--model", "roberta"], "--model roberta needs --checkpoint"),
        (["--dataset", "sst2"], "--dataset must be one of synthetic, imdb, mnli, aclimdb"),
        (["--granularity", "layer"], "--granularity must be one of block, sublayer"),
        (["--layers", "3"], "--layers applies to --model ut only"),
        (["--ut-positions"], "--ut-positions applies to --model ut only"),
        # the UT's flags set for a model without UT layers would not act (the folder is never
        # read: the refusal comes first)
        *(
            (
                ["--model", "bert", "--checkpoint", "/no/bert", *flag],
                f"{flag[0]} applies to --model ut only (bert has no UT layers): drop it",
            )
            for flag in (["--ut-a", "2"], ["--ut-b", "0.3"], ["--ut-tying", "none"], ["--ut-skip"])
        ),
        (["--model", "ut", "--layers", "0"], "--layers must be >= 1"),
        (["--gamma-train", "-1"], "--gamma-train must be a finite number >= 0"),
        # every float flag is checked by the shared config: inf and nan are refused
        (["--gamma-train", "inf"], "--gamma-train must be a finite number >= 0, got inf"),
        (["--lr", "inf"], "--lr must be a finite number > 0, got inf"),
        (["--dual-lr", "nan"], "--dual-lr must be a finite number > 0, got nan"),
        (["--noise-scale", "inf"], "--noise-scale must be a finite number > 0, got inf"),
        (["--sweep", "epsilon=0.1,1.2"], "--sweep epsilon must all lie in [0, 1), got 1.2"),
        (["--sweep", "depth=3,5"], "--sweep depth is not sweepable"),
        (["--epsilon", "1.5"], "--epsilon must lie in [0, 1)"),
        (["--dataset", "aclimdb"], "--dataset aclimdb needs --data-dir"),
        (["--data-dir", "/data/aclImdb"], "--data-dir /data/aclImdb is read only by a real"),
        (
            ["--dataset", "aclimdb", "--data-dir", "/d", "--download"],
            "--download prepares the TFDS data sets imdb and mnli, not --dataset aclimdb",
        ),
        (["--reference", "low"], "--reference must be chance, chance+X (X >= 0), none or a"),
        (["--reference", "chance+-1"], "--reference must be chance, chance+X (X >= 0), none or"),
        (
            ["--sweep", "reference=chance+x"],
            "--sweep reference: 'chance+x' is not chance, chance+X",
        ),
        (["--pooling", "max"], "--pooling must be one of first, mean, got 'max'"),
        (["--select", "test-auc"], "--select must be one of val-auc, val-accuracy"),
        (["--test-gammas", "0.5"], "--select val-auc needs at least two test gammas"),
    ],
)


def test_bad_checkpoints_and_data_fail_before_touching_out(tiny_bert, tmp_path, capsys):
    out = tmp_path / "out"
    cases = [
        (["--model", "bert", "--checkpoint", str(tmp_path / "nope")], "does not exist"),
        (["--model", "roberta", "--checkpoint", str(tiny_bert)], "holds a bert model"),
        (["--dataset", "imdb", "--data-dir", str(tmp_path)], "no prepared imdb_reviews"),
        (["--model", "bert", "--checkpoint", str(tiny_bert), "--max-length", "100"], "positions"),
    ]
    for argv, words in cases:
        assert_one_line_error(
            text_classify.main, [*TINY, *argv, "--out", out], capsys, words, out=out
        )


def test_a_max_length_that_leaves_a_pairs_text_no_token_is_refused(tiny_bert, tmp_path, capsys):
    """RoBERTa's sentence-pair template takes 4 special tokens (``<s> a </s></s> b </s>``): at
    --max-length 4 every input was the template alone and at 5 one text of the two, the same
    for every label, and the run trained on them with nothing said (the data line: "4 tokens
    (100% of train texts fill or exceed them)"). Refused before --out, naming the length that
    holds a token of each text; BERT's 3-token template likewise."""
    from tokenizers import Tokenizer, processors

    from cudt.data.text.nli import tfds_builder, tiny_splits
    from cudt.tasks.text import TextConfig, TextTask

    vocab = json.loads((minilm_path() / "config.json").read_text())["vocab_size"]
    roberta = write_tiny_folder(tmp_path / "roberta", "roberta", vocab=vocab)
    tok = Tokenizer.from_file(str(minilm_path() / "tokenizer.json"))
    tok.post_processor = processors.RobertaProcessing(("[SEP]", 102), ("[CLS]", 101))
    tok.save(str(roberta / "tokenizer.json"))
    data = tmp_path / "tfds"
    builder = tfds_builder("mnli", tiny_splits("mnli", 40, 20))
    builder(data_dir=str(data), file_format="array_record").download_and_prepare()
    mnli = ["--dataset", "mnli", "--data-dir", str(data)]
    out = tmp_path / "out"
    for model, length, words in (
        (["--model", "roberta", "--checkpoint", str(roberta)], "4", "leaves 0 of its tokens"),
        (["--model", "roberta", "--checkpoint", str(roberta)], "5", "special tokens take 4): pa"),
        (["--model", "bert", "--checkpoint", str(tiny_bert)], "4", "pass --max-length 5 or mo"),
    ):
        argv = [*TINY, *model, *mnli, "--max-length", length, "--out", out]
        assert_one_line_error(text_classify.main, argv, capsys, words, out=out)
    cfg = TextConfig(
        model="roberta", checkpoint=str(roberta), dataset="mnli", data_dir=str(data),
        num_train=40, num_test=20, max_length=6,
    )  # fmt: skip
    ids = TextTask().load(cfg).tokens["train"].ids  # a token of each text: [0 a 2 2 b 2]
    assert ids.shape[1] == 6 and np.all(ids[:, [1, 4]] != 102) and np.all(ids[:, 2:4] == 102)


def test_the_uts_length_cap_is_its_tokenizers_and_the_help_and_error_say_so(tmp_path, capsys):
    """--model ut without --ut-positions reads no position, yet its --max-length is capped at
    the encoder's positions (it tokenizes as that encoder does): the refusal said only
    "exceeds the 512 positions of <MiniLM>: pass a smaller --max-length", as if the UT read
    them; it now says why, and the number to pass, as the help does."""
    out = tmp_path / "out"
    argv = [*TINY, "--model", "ut", "--max-length", "513", "--out", out]
    words = "whose tokenizer --model ut reads (with or without --ut-positions: it tokenizes "
    assert_one_line_error(text_classify.main, argv, capsys, words, out=out)
    with pytest.raises(SystemExit):
        text_classify.main(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "at most the encoder's positions (MiniLM's 512; --model ut's too," in help_text


def test_a_tokenizer_past_the_checkpoints_vocabulary_is_refused(tmp_path, capsys):
    """A folder whose tokenizer.json is another model's (MiniLM's 30,522 word pieces over a
    100-row table): its ids past the table were gathered under jit as NaN, and the run trained
    to DIVERGED rows and exit 0. Refused before --out, naming the tokenizer."""
    folder = write_tiny_folder(tmp_path / "bert", vocab=100)
    shutil.copy(minilm_path() / "tokenizer.json", folder / "tokenizer.json")
    out = tmp_path / "out"
    for model in ("bert", "ut"):
        argv = [*TINY, "--model", model, "--checkpoint", str(folder), "--out", out]
        assert_one_line_error(
            text_classify.main, argv, capsys, "tokenizer.json", "past the 100 rows", out=out
        )


def test_length_batches_cover_every_example_once():
    lengths = np.array([3, 17, 5, 64, 9, 33, 1, 12, 40, 16, 2])
    seen = []
    for index, count, length in length_batches(lengths, 4, 64):
        assert index.size == 4 and length % 16 == 0 and length <= 64
        assert lengths[index[:count]].max() <= length
        seen += index[:count].tolist()
    assert sorted(seen) == list(range(lengths.size))


def _hf_sublayer_states(model_type: str, folder: Path):
    """A tiny random HF DistilBERT / RoBERTa saved to ``folder``, and a function returning its
    states per sub-layer ``[2L+1, B, T, D]`` read with forward hooks: the embedding output,
    then after each block the attention sub-layer's output (after its LayerNorm) and the block's."""
    import torch
    import transformers as tr

    torch.manual_seed(0)
    if model_type == "distilbert":
        cfg = tr.DistilBertConfig(
            vocab_size=100, dim=D, n_layers=LAYERS, n_heads=HEADS, hidden_dim=FFN,
            max_position_embeddings=MAX_POS,
        )  # fmt: skip
        hf = tr.DistilBertModel(cfg)
        attn_outputs = [blk.sa_layer_norm for blk in hf.transformer.layer]
    else:
        cfg = tr.RobertaConfig(
            vocab_size=100, hidden_size=D, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
            intermediate_size=FFN, max_position_embeddings=MAX_POS,
        )  # fmt: skip
        hf = tr.RobertaModel(cfg)
        attn_outputs = [blk.attention.output for blk in hf.encoder.layer]
    with torch.no_grad():  # away from init: LayerNorm gains and biases not 1 and 0
        for p in hf.parameters():
            p.add_(0.1 * torch.randn_like(p))
    hf.eval()
    hf.save_pretrained(folder, safe_serialization=True)

    def states(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        seen = []
        hooks = [
            m.register_forward_hook(lambda _m, _i, out: seen.append(out)) for m in attn_outputs
        ]
        with torch.no_grad():
            out = hf(
                input_ids=torch.from_numpy(ids.astype(np.int64)),
                attention_mask=torch.from_numpy(mask.astype(np.int64)),
                output_hidden_states=True,
            )
        for h in hooks:
            h.remove()
        blocks = [h.numpy() for h in out.hidden_states]
        subs = [blocks[0]]
        for attn, block in zip(seen, blocks[1:], strict=True):
            subs += [(attn[0] if isinstance(attn, tuple) else attn).numpy(), block]
        return np.stack(subs)

    return states


@pytest.mark.parametrize("model_type", ["distilbert", "roberta"])
def test_sublayer_states_match_hf_distilbert_and_roberta(model_type, tmp_path):
    # --granularity sublayer for the paper's DistilBERT (L = 12) and RoBERTa (L = 24): every
    # attention and MLP sub-layer is a state, equal to the reference model's own.
    hf_states = _hf_sublayer_states(model_type, tmp_path)
    model = build_text_model(model_type, num_classes=2, checkpoint=tmp_path, granularity="sublayer")
    assert (model.blocks, model.num_layers) == (LAYERS, 2 * LAYERS)
    rng = np.random.default_rng(0)
    pad = model.encoder.config.pad_token_id
    ids = rng.integers(3, 100, size=(3, 12)).astype(np.int32)
    mask = np.ones((3, 12), np.int32)
    mask[1, 8:], mask[2, 5:] = 0, 0
    ids[mask == 0] = pad
    batch = {
        "ids": jnp.asarray(ids),
        "mask": jnp.asarray(mask, jnp.float32),
        "labels": jnp.asarray([0, 1, 0], jnp.int32),
    }
    params = jax.jit(model.init)(jax.random.key(0))
    noise = jnp.zeros(ids.shape + (D,))
    ours = np.asarray(jax.jit(model.states)(params, batch, noise))  # [2L+1, B, T, D]
    ref = hf_states(ids, mask)
    assert ours.shape == ref.shape == (2 * LAYERS + 1, 3, 12, D)
    real = mask.astype(bool)  # padded query rows are not read by the head
    np.testing.assert_allclose(ours[:, real], ref[:, real], atol=1e-4)
    losses = jax.jit(make_layer_losses(model, 1.0))(params, batch, jax.random.key(1))
    assert losses.shape == (3, 2 * LAYERS + 1) and bool(jnp.all(jnp.isfinite(losses)))


def test_max_length_defaults_by_dataset_and_the_normalised_head(tiny_bert):
    from cudt.tasks.text import TextConfig, max_length_of

    # long reviews need more than 64 tokens: their opening is the plot, not the verdict
    assert max_length_of(TextConfig()) == 64
    assert max_length_of(TextConfig(dataset="aclimdb", data_dir="x")) == 256
    assert max_length_of(TextConfig(dataset="imdb")) == 256
    assert max_length_of(TextConfig(dataset="mnli")) == 128
    assert max_length_of(TextConfig(dataset="imdb", max_length=32)) == 32
    ut = build_text_model("ut", num_classes=2, checkpoint=tiny_bert, head_norm=True)
    assert not build_text_model("ut", num_classes=2, checkpoint=tiny_bert).head_norm
    params = jax.jit(ut.init)(jax.random.key(0))
    pooled = jax.random.normal(jax.random.key(1), (3, 2, D))
    # the normalised readout does not depend on the scale of the state it reads
    np.testing.assert_allclose(
        ut.head(params, 1e-3 * pooled), ut.head(params, pooled), rtol=1e-4, atol=1e-5
    )
