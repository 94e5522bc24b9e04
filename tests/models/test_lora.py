"""LoRA adapters on the decoder (:mod:`cudt.models.llama.lora`) and through the LLM task
(``--lora-rank``): the adapted forward, the task's constrained step, checkpoints and resume,
the merged export and PEFT's adapter folder.

Real code paths on a tiny Hugging Face Llama folder (:func:`write_decoder_folder`, a word
tokenizer of the generated instructions); the PEFT check loads that folder with transformers
and the exported adapter with ``peft.PeftModel.from_pretrained``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import TINY_DECODER

from cudt.checkpoint import GroupCheckpointer
from cudt.data.alpaca import build_word_tokenizer, write_alpaca
from cudt.data.instructions import generated_instructions
from cudt.models.llama import (
    Decoder,
    DecoderConfig,
    LoraSpec,
    adapted,
    init_adapters,
    load_decoder,
    merged,
    write_decoder_folder,
)
from cudt.models.llama.lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS, TARGETS
from cudt.runner.groups import make_group_step
from cudt.runner.task import RunBatch
from cudt.tasks.llm import LLMTask
from cudt.tasks.llm_config import LLMConfig
from cudt.tasks.llm_export import ADAPTER_FOLDER, lora_spec
from experiments import llm_sft

RECORDS = generated_instructions(80, seed=0)
WORDS = build_word_tokenizer(RECORDS)


def tiny_config(**kw) -> DecoderConfig:
    return DecoderConfig(
        vocab_size=WORDS.get_vocab_size(),
        **TINY_DECODER,
        initializer_range=0.2,
        **kw,
    )


def random_adapters(config: DecoderConfig, spec: LoraSpec, seed: int = 1):
    """Adapters with B drawn too (B = 0 would hide every mistake in the B path)."""
    adapters = init_adapters(config, spec, jax.random.key(seed))
    return jax.tree.map(
        lambda x: (
            x if x.shape[-1] == spec.rank else 0.3 * jax.random.normal(jax.random.key(9), x.shape)
        ),
        adapters,
    )


IDS = np.array([[5, 9, 13, 2, 7, 11], [3, 4, 8, 1, 1, 1]])
MASK = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])


def test_zero_b_is_the_base_model_exactly():
    """PEFT's initialisation (B = 0): the adapted decoder's states and greedy tokens are the
    base's, bit for bit; with qkv biases (Qwen2) too."""
    config = tiny_config(model_type="qwen2")
    params = config.init_params(jax.random.key(0))
    spec = LoraSpec(rank=4, alpha=8)
    adapters = init_adapters(config, spec, jax.random.key(1))
    assert set(adapters) == set(TARGETS)
    assert adapters["q"]["a"].shape == (2, 16, 4) and adapters["down"]["b"].shape == (2, 4, 16)
    bound = 1 / np.sqrt(16)
    assert 0 < np.abs(adapters["q"]["a"]).max() <= bound  # PEFT's Kaiming-uniform bound
    dec = Decoder(config, params)
    ours = adapted(params, adapters, spec.scale)
    np.testing.assert_array_equal(dec.apply(ours, IDS, MASK), dec.apply(params, IDS, MASK))
    np.testing.assert_array_equal(
        dec.generate(ours, IDS, MASK, 4), dec.generate(params, IDS, MASK, 4)
    )


def test_the_adapted_forward_is_the_merged_model_and_moves_only_the_targets():
    """x W + s·(x A) B without a merged matrix equals the merged W + s·A B; the targets not
    adapted keep their kernels."""
    config = tiny_config()
    params = config.init_params(jax.random.key(0))
    spec = LoraSpec(rank=3, alpha=6, targets=("q", "v", "down"))
    adapters = random_adapters(config, spec)
    dec = Decoder(config, params)
    a = dec.apply(adapted(params, adapters, spec.scale), IDS, MASK)
    whole = merged(params, adapters, spec.scale)
    b = dec.apply(whole, IDS, MASK)
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    assert np.abs(np.asarray(a) - np.asarray(dec.apply(params, IDS, MASK))).max() > 1e-2
    for name in TARGETS:
        same = np.array_equal(whole["blocks"][name]["kernel"], params["blocks"][name]["kernel"])
        assert same == (name not in spec.targets), name
    want = params["blocks"]["q"]["kernel"][1] + 2.0 * adapters["q"]["a"][1] @ adapters["q"]["b"][1]
    np.testing.assert_allclose(whole["blocks"]["q"]["kernel"][1], want, rtol=1e-6, atol=1e-6)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A Hugging Face Llama folder (config.json, model.safetensors, tokenizer.json) and an
    Alpaca file of its records."""
    folder = tmp_path_factory.mktemp("base")
    config = tiny_config(tie_word_embeddings=True)
    write_decoder_folder(folder, config, config.init_params(jax.random.key(3)), WORDS)
    return folder, write_alpaca(RECORDS, folder / "alpaca_data.json")


def test_the_tasks_step_trains_the_adapters_alone_and_the_multipliers_move(base):
    """The task's own step (--lora-rank): the state holds the adapters, their Adam moments and
    the multipliers, nothing of the base's size; the frozen base is bitwise unchanged after
    steps; B leaves zero; a violated constraint's multiplier rises."""
    folder, data_file = base
    task = LLMTask()
    cfg = LLMConfig(
        checkpoint=str(folder), data=str(data_file), num_train=16, num_val=4, num_test=4,
        max_length=48, batch_size=4, lora_rank=2, lora_targets=("q", "v", "down"),
        epsilon=0.5, dual_lr=1.0, reference="none",
    )  # fmt: skip
    data = task.load(cfg)
    model = task.build(cfg, data, "llm", None)
    before = jax.tree.map(np.array, model.frozen)
    init, step = make_group_step(cfg, model, lr=1e-2, warmup=0, steps_per_epoch=4, jit=True)
    state = init(model.init(jax.random.key(0)))
    assert set(state.params) == {"lora"} and set(state.params["lora"]) == {"q", "v", "down"}
    base_shapes = {x.shape for x in jax.tree.leaves(data.decoder.params["blocks"])}
    assert not base_shapes & {x.shape for x in jax.tree.leaves(state)}
    examples = {k: jnp.asarray(v[:4]) for k, v in task.split_examples(data, "train").items()}
    batch = RunBatch(examples, jnp.float32(cfg.gamma_train), model.frozen)
    for i in range(3):
        state, metrics = step(state, batch, jax.random.key(i))
    assert np.abs(state.params["lora"]["v"]["b"]).max() > 0
    assert np.max(metrics["multipliers"]) > 0
    jax.tree.map(np.testing.assert_array_equal, model.frozen, before)
    # the gradient of the task's loss reaches the adapters through every adapted projection
    loss = lambda p: model.layer_losses(p, batch, jax.random.key(0)).mean()  # noqa: E731
    grads = jax.jit(jax.grad(loss))(model.init(jax.random.key(0)))
    assert all(np.abs(g["b"]).max() > 0 for g in grads["lora"].values())


def test_a_bfloat16_base_takes_half_the_bytes_and_moves_the_step_less_than_mixed_precision(base):
    """--base-dtype bfloat16 holds the frozen base in bfloat16: the same weights rounded once, half
    the bytes. Under --compute-dtype bfloat16 the blocks cast their weights to bfloat16 anyway;
    what changes is the readouts' head (and norm), read in bfloat16 instead of float32. The
    task's per-sample layer losses move by at most 1e-3 relative and the adapters' gradient by
    at most 2 % in norm, and each by less than a tenth of what mixed precision itself moves
    them from float32 (measured: 3e-4 and 0.5 %)."""
    folder, data_file = base
    task = LLMTask()
    runs = {}
    for compute, dtype in (
        ("float32", "float32"),
        ("bfloat16", "float32"),
        ("bfloat16", "bfloat16"),
    ):
        cfg = LLMConfig(
            checkpoint=str(folder), data=str(data_file), num_train=16, num_val=4, num_test=4,
            max_length=48, batch_size=4, lora_rank=2, compute_dtype=compute, base_dtype=dtype,
            noise_scale=0.5,
        )  # fmt: skip
        data = task.load(cfg)
        model = task.build(cfg, data, "llm", None)
        params = {"lora": random_adapters(data.decoder.config, lora_spec(cfg))}
        examples = {k: jnp.asarray(v[:4]) for k, v in task.split_examples(data, "train").items()}
        batch = RunBatch(examples, jnp.float32(cfg.gamma_train), model.frozen)
        losses = lambda p, b=batch, m=model: m.layer_losses(p, b, jax.random.key(1))  # noqa: E731
        grads = jax.jit(jax.grad(lambda p, f=losses: f(p).mean()))(params)
        flat = np.concatenate([np.ravel(g) for g in jax.tree.leaves(grads)]).astype(np.float64)
        runs[compute, dtype] = (
            jax.tree.leaves(model.frozen),
            np.asarray(jax.jit(losses)(params)),
            flat,
        )
    (_, exact, exact_grad), (f32, mixed, mixed_grad), (bf16, ours, our_grad) = runs.values()
    assert {x.dtype for x in f32} == {jnp.dtype(jnp.float32)}
    assert {x.dtype for x in bf16} == {jnp.dtype(jnp.bfloat16)}
    assert sum(x.nbytes for x in bf16) * 2 == sum(x.nbytes for x in f32)
    for a, b in zip(f32, bf16, strict=True):  # the same weights, rounded once
        np.testing.assert_array_equal(np.asarray(a.astype(jnp.bfloat16)), np.asarray(b))

    def rel(a, b):
        return float(np.max(np.abs(a - b) / np.abs(b)))

    def norm_rel(a, b):
        return float(np.linalg.norm(a - b) / np.linalg.norm(b))

    assert rel(ours, mixed) <= 1e-3 and rel(ours, mixed) < rel(mixed, exact)
    assert norm_rel(our_grad, mixed_grad) <= 2e-2
    assert norm_rel(our_grad, mixed_grad) < norm_rel(mixed_grad, exact_grad)
    print(
        f"bf16 base vs float32 base (mixed): losses {rel(ours, mixed):.2g}, grads "
        f"{norm_rel(our_grad, mixed_grad):.2g}; mixed vs float32: losses {rel(mixed, exact):.2g},"
        f" grads {norm_rel(mixed_grad, exact_grad):.2g}"
    )


RUN = [
    "--num-train", "16", "--num-val", "4", "--num-test", "4", "--max-length", "48",
    "--steps", "4", "--chunk-steps", "2", "--keep-checkpoints", "2", "--batch-size", "4",
    "--completions", "0", "--test-gammas", "0,1", "--kinds", "constrained", "--lr", "3e-2",
    "--tolerance", "10", "--lora-rank", "2", "--lora-targets", "q,v,down",
    "--no-figures",  # no test here reads them
]  # fmt: skip


@pytest.fixture(scope="module")
def lora_run(base, tmp_path_factory):
    folder, data_file = base
    root = tmp_path_factory.mktemp("lora-run")
    argv = [*RUN, "--checkpoint", str(folder), "--data", str(data_file)]
    out, models = root / "run", root / "models"
    assert llm_sft.main([*argv, "--out", str(out), "--export", str(models)]) == 0
    return argv, out, models, json.loads((out / "results.json").read_text())


def _restore(folder: Path, step: int | None = None):
    with GroupCheckpointer(folder) as checkpointer:
        return checkpointer.restore(None, step=step)[0]


def test_checkpoints_hold_the_adapters_only_and_resume_bitwise(
    lora_run, tmp_path, monkeypatch, capsys
):
    """A checkpoint is the adapters, their optimiser states and the duals: under 1/4 of the
    base's floats here (2.3 % of full fine-tuning's for SmolLM2 at rank 8,
    docs/results/llm.md); resumed from step 2, the run ends at step 4 with the same bits. The
    resume spells the flags another way, as a user rerunning from another folder may: the
    data file relative, the checkpoint folder with a trailing slash, the targets in another
    order (the same run, not another config)."""
    argv, out, _, results = lora_run
    (group,) = [p for p in (out / "checkpoints").iterdir() if p.is_dir()]
    states = _restore(group)
    assert set(states["params"]) == {"lora"}
    base_floats = sum(
        x.size for x in jax.tree.leaves(load_decoder(argv[argv.index("--checkpoint") + 1]).params)
    )
    saved = sum(np.size(x) for x in jax.tree.leaves(states))
    assert saved < base_floats / 4, (saved, base_floats)
    again = tmp_path / "again"
    shutil.copytree(out, again)
    (again / "results.json").unlink()
    shutil.rmtree(again / "checkpoints" / group.name / "4")
    respelt = list(argv)
    data = Path(argv[argv.index("--data") + 1])
    monkeypatch.chdir(data.parent)
    respelt[argv.index("--data") + 1] = f"./{data.name}"
    respelt[argv.index("--checkpoint") + 1] += "/"
    respelt[argv.index("--lora-targets") + 1] = "down,q,v"
    step2 = again / "checkpoints" / group.name / "2"
    before = {p: p.stat().st_mtime_ns for p in step2.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert llm_sft.main([*respelt, "--out", str(again)]) == 0
    # it resumed (a run that threw its checkpoints away and trained again from step 0 would end
    # with the same bits): it says so, and step 2's files are the ones it restored, not rewritten
    assert "resumed from the checkpoint at step 2" in capsys.readouterr().err
    assert {p: p.stat().st_mtime_ns for p in step2.rglob("*") if p.is_file()} == before
    resumed = _restore(again / "checkpoints" / group.name, step=4)
    jax.tree.map(np.testing.assert_array_equal, resumed, _restore(group, step=4))
    runs = json.loads((again / "results.json").read_text())["runs"]
    assert [r["train_objective"] for r in runs] == [r["train_objective"] for r in results["runs"]]


def test_lora_alpha_spelt_at_its_default_resumes_and_another_is_refused(lora_run, tmp_path):
    """``--lora-alpha 4`` at rank 2 is the default's run (alpha = 2 x rank): its resume was
    refused as another config (``lora_alpha None -> 4.0``); another alpha still is."""
    argv, out, _, results = lora_run
    (group,) = [p for p in (out / "checkpoints").iterdir() if p.is_dir()]
    again = tmp_path / "again"
    shutil.copytree(out, again)
    (again / "results.json").unlink()
    shutil.rmtree(again / "checkpoints" / group.name / "4")
    before = sorted(p.relative_to(again) for p in again.rglob("*"))
    assert llm_sft.main([*argv, "--lora-alpha", "8", "--out", str(again)]) == 2
    assert sorted(p.relative_to(again) for p in again.rglob("*")) == before
    assert llm_sft.main([*argv, "--lora-alpha", "4", "--out", str(again)]) == 0
    runs = json.loads((again / "results.json").read_text())["runs"]
    assert [r["train_objective"] for r in runs] == [r["train_objective"] for r in results["runs"]]


def test_the_merged_export_is_the_adapted_model_and_peft_loads_the_adapters(lora_run, base):
    """--export writes the merged model (transformers loads it) and, beside it, the adapters
    in PEFT's layout: transformers' base plus peft.PeftModel.from_pretrained gives cudt's
    adapted model's logits within 1e-4."""
    import peft
    import safetensors.numpy
    import torch
    import transformers

    argv, out, models, results = lora_run
    (chosen,) = [r for r in results["runs"] if r["best"]]
    folder = models / chosen["label"].replace(" ", "-")
    adapter = folder / ADAPTER_FOLDER
    raw = json.loads((adapter / ADAPTER_CONFIG).read_text())
    assert raw["r"] == 2 and raw["lora_alpha"] == 4 and raw["peft_type"] == "LORA"
    assert sorted(raw["target_modules"]) == ["down_proj", "q_proj", "v_proj"]
    tensors = safetensors.numpy.load_file(adapter / ADAPTER_WEIGHTS)
    assert tensors["base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight"].shape == (
        2,
        16,
    )
    assert tensors["base_model.model.model.layers.0.mlp.down_proj.lora_B.weight"].shape == (16, 2)
    assert len(tensors) == 2 * 3 * 2  # A and B, 3 targets, 2 layers
    (entry,) = json.loads((models / "export.json").read_text())["models"]
    assert entry["lora"] == {"rank": 2, "alpha": 4.0, "targets": ["q", "v", "down"]}

    # cudt's adapted model: the base and the trained adapters from the run's checkpoint
    (group,) = [p for p in (out / "checkpoints").iterdir() if p.is_dir()]
    lora = jax.tree.map(lambda x: x[0], _restore(group)["params"]["lora"])
    base_dec = load_decoder(base[0])
    spec = LoraSpec(2, 4.0, ("q", "v", "down"))
    assert np.abs(lora["q"]["b"]).max() > 1e-3  # trained: the check below can fail
    ids = np.array([[3, 8, 15, 22, 9, 4, 17]])
    ours = base_dec.readout_apply(
        base_dec.params, base_dec.apply(adapted(base_dec.params, lora, spec.scale), ids)
    )[-1]
    exported = load_decoder(folder)  # the merged model, as cudt reads it back
    np.testing.assert_allclose(exported.readout(exported(ids))[-1], ours, rtol=1e-4, atol=1e-4)
    with torch.no_grad():
        hf = transformers.AutoModelForCausalLM.from_pretrained(base[0]).eval()
        theirs = peft.PeftModel.from_pretrained(hf, adapter).eval()
        logits = theirs(input_ids=torch.tensor(ids)).logits.numpy()
        merged_hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
        merged_logits = merged_hf(input_ids=torch.tensor(ids)).logits.numpy()
    np.testing.assert_allclose(logits[0], ours[0], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(merged_logits[0], ours[0], rtol=1e-4, atol=1e-4)
    assert raw["base_model_name_or_path"] == str(Path(base[0]).resolve())


def test_the_adapters_name_their_base_for_any_folder(tmp_path, monkeypatch):
    """PEFT's base_model_name_or_path: an absolute path (a relative --checkpoint read from the
    run's folder named nothing from another), the Hub id for the bundled SmolLM2 GGUF."""
    from types import SimpleNamespace

    from cudt.tasks.llm_data import SMOLLM2, SMOLLM2_HUB
    from cudt.tasks.llm_export import adapter_base

    (tmp_path / "base").mkdir()
    monkeypatch.chdir(tmp_path)
    relative = SimpleNamespace(path=Path("base"))
    assert adapter_base("base/", relative) == str(tmp_path.resolve() / "base")
    assert adapter_base("./base", SimpleNamespace(path=None)) == str(tmp_path.resolve() / "base")
    assert adapter_base(SMOLLM2, SimpleNamespace(path=Path("x.gguf"))) == SMOLLM2_HUB


def test_adapters_saved_with_another_spec_are_refused(tmp_path):
    """PEFT loads an adapter folder whose tensors are not its config's without a word (a
    target the config leaves out is skipped; found by the export review): save_adapters
    refuses adapters of other targets or another rank than its spec, and writes nothing."""
    from cudt.errors import UsageError
    from cudt.models.llama import save_adapters

    config = tiny_config()
    adapters = random_adapters(config, LoraSpec(2, 4.0, ("q", "v", "down")))
    for spec, words in (
        (LoraSpec(2, 4.0, ("q", "v")), "the adapters are on q, v, down, the spec's targets q, v"),
        (LoraSpec(3, 4.0, ("q", "v", "down")), "the adapters have rank 2, the spec's rank is 3"),
    ):
        with pytest.raises(UsageError, match=words):
            save_adapters(tmp_path / "adapter", adapters, spec)
        assert not (tmp_path / "adapter").exists()
    save_adapters(tmp_path / "adapter", adapters, LoraSpec(2, 4.0, ("v", "down", "q")))
    assert (tmp_path / "adapter" / ADAPTER_WEIGHTS).is_file()
