"""Tests of cudt.models.llama: parity with transformers' Llama / Mistral / Qwen2 causal LMs
(hidden states, logits, greedy generation), KV-cache generation with embedding noise, mixed
precision, writing folders, sharded forwards on 4 forced CPU devices, and load errors.

torch and transformers are the test-only reference stack (the ``test`` extra); the library
itself never imports them.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import ROOT, forced_devices_env
from hf_stack import torch, transformers  # local folders only: never the hub

import cudt
from cudt.models.hf import ModelFolderError
from cudt.models.llama import (
    Decoder,
    DecoderConfig,
    decoder_partition_specs,
    load_decoder,
    write_decoder_folder,
)
from cudt.models.llama.layers import inv_freq

TOL = dict(rtol=1e-4, atol=1e-4)  # float32 on CPU against transformers
TINY = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=0,
    attn_implementation="eager",
)
LLAMA3 = dict(
    rope_type="llama3",
    rope_theta=500.0,
    factor=8.0,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    original_max_position_embeddings=4,  # small, so most frequencies of head_dim 16 are scaled
)
# name -> (transformers config class, extra config kwargs, padding side of the test batch)
MODELS = {
    "llama_untied_llama3_bias": (
        "LlamaConfig",
        dict(rope_parameters=LLAMA3, attention_bias=True, mlp_bias=True),
        "left",
    ),
    "llama_tied": ("LlamaConfig", dict(tie_word_embeddings=True), "right"),
    "mistral_window": ("MistralConfig", dict(sliding_window=3), "left"),
    "qwen2_tied": ("Qwen2Config", dict(tie_word_embeddings=True), "right"),
}


def hf_model(name: str, folder: pathlib.Path, **save_kwargs):
    cls, extra, _ = MODELS[name]
    torch.manual_seed(sorted(MODELS).index(name))
    config = getattr(transformers, cls)(**TINY, **extra)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    model.save_pretrained(folder, **save_kwargs)
    return model


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Every reference model, saved; the first one sharded into several files."""
    out = {}
    for i, name in enumerate(MODELS):
        folder = tmp_path_factory.mktemp(name)
        kwargs = dict(max_shard_size="20KB") if i == 0 else {}
        out[name] = (hf_model(name, folder, **kwargs), folder)
    return out


def batch(padding: str, seed: int = 0, lengths=(7, 4, 5)) -> tuple[np.ndarray, np.ndarray]:
    """Random ids ``[3, 7]`` and a mask padded on ``padding`` to row lengths ``lengths``."""
    rng = np.random.default_rng(seed)
    length = max(lengths)
    ids = rng.integers(1, TINY["vocab_size"], (len(lengths), length))
    mask = np.zeros_like(ids)
    for row, n in enumerate(lengths):
        if padding == "left":
            mask[row, length - n :] = 1
        else:
            mask[row, :n] = 1
    return np.where(mask == 1, ids, 0), mask


def hf_positions(mask: np.ndarray) -> np.ndarray:
    """Position ids as transformers' generate computes them (cumsum of the mask, pads 0)."""
    return np.maximum(np.cumsum(mask, axis=1) - 1, 0)


# --------------------------------------------------------------------------------------------
# Parity with transformers
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(MODELS))
def test_states_and_logits_match_transformers(models, name):
    model, folder = models[name]
    dec = load_decoder(folder)
    padding = MODELS[name][2]
    ids, mask = batch(padding)
    # Transformers' plain forward numbers positions 0..T-1 whatever the padding; for a
    # left-padded batch it is given the positions its own generate uses, which are ours.
    kwargs = dict(position_ids=torch.tensor(hf_positions(mask))) if padding == "left" else {}
    with torch.no_grad():
        ref = model(
            input_ids=torch.tensor(ids),
            attention_mask=torch.tensor(mask),
            output_hidden_states=True,
            **kwargs,
        )
    hidden = np.stack([h.numpy() for h in ref.hidden_states])  # [L+1, B, T, D]
    states = np.asarray(dec(ids, mask))
    assert states.shape == (3, 3, 7, 64)
    real = mask == 1  # padded query positions are meaningless in both
    np.testing.assert_allclose(states[:-1][:, real], hidden[:-1][:, real], **TOL)
    # transformers 5.x ties hidden_states[-1] to the final-normed output; ours is pre-norm.
    assert np.abs(states[-1][real] - hidden[-1][real]).max() > 1e-2
    normed = np.asarray(dec.final_norm(dec.params, states[-1]))
    np.testing.assert_allclose(normed[real], hidden[-1][real], **TOL)
    logits = np.asarray(dec.readout(states))  # [L+1, B, T, V]
    assert logits.shape == (3, 3, 7, 128) and logits.dtype == np.float32
    np.testing.assert_allclose(logits[-1][real], ref.logits.numpy()[real], **TOL)


def test_loader_reads_shards_tokenizer_and_config(models, tmp_path):
    _, folder = models["llama_untied_llama3_bias"]
    assert (folder / "model.safetensors.index.json").is_file()
    assert len(list(folder.glob("model-*-of-*.safetensors"))) > 1
    dec = load_decoder(folder)
    c = dec.config
    assert (c.num_kv_heads, c.head_dim, c.rope_type, c.rope_original_max_positions) == (
        2,
        16,
        "llama3",
        4,
    )
    assert c.qkv_bias and c.o_bias and c.mlp_bias and not c.tie_word_embeddings
    assert "bias" in dec.params["blocks"]["o"] and dec.params["lm_head"].shape == (64, 128)
    assert dec.tokenizer is None
    # llama3 scaling really changes the rotary frequencies of this config.
    plain = inv_freq(DecoderConfig(128, 64, 96, 2, 4, rope_theta=500.0))
    assert np.abs(inv_freq(c) - plain).max() > 1e-3
    # Qwen2: biases on q/k/v only; Mistral keeps its sliding window.
    qwen = load_decoder(models["qwen2_tied"][1]).params["blocks"]
    assert "bias" in qwen["q"] and "bias" not in qwen["o"]
    assert load_decoder(models["mistral_window"][1]).config.sliding_window == 3


def test_a_list_of_named_chat_templates_gives_the_default_as_transformers_does(tmp_path):
    """tokenizer_config.json may hold its templates as a list of named ones (Hermes 2 Pro Llama
    3: default and tool_use); it was read as no template at all, so --prompt-format auto fell
    back to Alpaca prompts without a word and chat was refused. The default is the one
    transformers renders when no name is given."""
    from cudt.data.alpaca import AlpacaRecord, build_word_tokenizer

    config = DecoderConfig(64, 8, 16, 1, 1, 1, eos_token_id=(2,))
    words = build_word_tokenizer([AlpacaRecord("Say hi.", "", "hi")])
    write_decoder_folder(tmp_path, config, config.init_params(jax.random.key(0)), words)
    default = "{% for m in messages %}User: {{ m['content'] }}\n{% endfor %}Assistant:\n"
    named = [{"name": "tool_use", "template": "tools " + default}]
    named.append({"name": "default", "template": default})
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": named}))
    assert load_decoder(tmp_path).chat_template == default
    reference = transformers.PreTrainedTokenizerFast.from_pretrained(tmp_path)
    assert reference.get_chat_template() == default


def test_embed_noise_embeds_and_gradients(models):
    dec = load_decoder(models["llama_tied"][1])
    ids, mask = batch("right")
    clean = dec.apply(dec.params, ids, mask)
    noise = 0.1 * np.random.default_rng(1).standard_normal((3, 7, 64)).astype(np.float32)
    noisy = dec.apply(dec.params, ids, mask, embed_noise=noise)
    from_embeds = dec.apply_embeds(dec.params, dec.embed(dec.params, ids) + noise, mask)
    np.testing.assert_allclose(np.asarray(noisy), np.asarray(from_embeds), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(noisy[0]), np.asarray(clean[0]) + noise, atol=1e-6)

    def loss(params):
        return jnp.mean(dec.readout_apply(params, dec.apply(params, ids, mask)[-1]) ** 2)

    grads = jax.jit(jax.grad(loss))(dec.params)
    assert jax.tree.structure(grads) == jax.tree.structure(dec.params)
    assert float(jnp.abs(grads["blocks"]["q"]["kernel"]).max()) > 0
    # head_matrix is the tied embedding, transposed.
    np.testing.assert_array_equal(dec.head_matrix(dec.params), dec.params["embed"].T)


def test_bf16_compute_with_f32_params_is_close_to_f32(models):
    folder = models["llama_untied_llama3_bias"][1]
    f32 = load_decoder(folder)
    mixed = load_decoder(folder, jnp.bfloat16, param_dtype=jnp.float32)
    assert mixed.params["embed"].dtype == jnp.float32
    ids, mask = batch("left")
    ref, got = f32(ids, mask), mixed(ids, mask)
    assert got.dtype == jnp.bfloat16
    real = mask == 1
    scale = float(jnp.abs(ref).max())
    err = np.abs(np.asarray(got, np.float32) - np.asarray(ref))[:, real].max()
    assert err < 0.03 * scale, (err, scale)
    logit_ref, logit = f32.readout(ref)[-1], mixed.readout(got)[-1]
    assert logit.dtype == jnp.float32
    assert np.abs(np.asarray(logit - logit_ref))[real].max() < 0.03 * float(
        jnp.abs(logit_ref).max()
    )
    # the readout generation takes is the per-layer losses' product: the bfloat16 normed
    # state times the float32 head (cast to bfloat16, 0.1 nats apart at a trained head's scale)
    from cudt.lm_readout import head_logits

    states = mixed.apply(mixed.params, ids, mask)
    normed = mixed.final_norm(mixed.params, states)
    losses = head_logits(normed.reshape(-1, normed.shape[-1]), mixed.head_matrix(mixed.params).T)
    got = np.asarray(mixed.readout_apply(mixed.params, states)).reshape(losses.shape)
    np.testing.assert_allclose(got, losses, rtol=1e-5, atol=1e-5)  # float32 summation order


# --------------------------------------------------------------------------------------------
# Greedy generation with a KV cache
# --------------------------------------------------------------------------------------------


def no_cache_greedy(dec: Decoder, ids, mask, steps: int, noise=None) -> np.ndarray:
    """Reference: rerun the whole forward over the sequence so far at every step.

    The sequence lives in a fixed ``[B, T + steps]`` buffer whose unfilled slots are masked
    out (causal attention: they cannot change earlier slots), so one compiled forward serves
    every step; ``noise [B, T + steps, D]`` is the embedding noise of every slot.
    """
    batch, length = ids.shape
    ids = np.concatenate([ids, np.zeros((batch, steps), ids.dtype)], axis=1)
    mask = np.concatenate([mask, np.zeros((batch, steps), mask.dtype)], axis=1)

    @jax.jit
    def next_token(ids, mask, slot):
        states = dec.apply(dec.params, ids, mask, embed_noise=noise)
        last = jnp.take(states[-1], slot, axis=1)  # [B, D]
        return jnp.argmax(dec.readout_apply(dec.params, last), axis=-1)

    for i in range(steps):
        token = np.asarray(next_token(ids, mask, length + i - 1))
        ids[:, length + i], mask[:, length + i] = token, 1
    return ids[:, length:]


@pytest.mark.parametrize("name", ["llama_untied_llama3_bias", "mistral_window"])
def test_generate_matches_no_cache_loop_and_transformers(models, name):
    model, folder = models[name]
    dec = load_decoder(folder)
    ids, mask = batch("left")
    steps = 6
    got = np.asarray(dec.generate(dec.params, ids, mask, steps))
    assert got.shape == (3, steps)
    np.testing.assert_array_equal(got, no_cache_greedy(dec, ids, mask, steps))
    with torch.no_grad():
        ref = model.generate(
            input_ids=torch.tensor(ids),
            attention_mask=torch.tensor(mask),
            do_sample=False,
            max_new_tokens=steps,
        )
    np.testing.assert_array_equal(got, ref[:, ids.shape[1] :].numpy())
    # The same prompts right-padded are left-aligned first: the same tokens.
    shift = mask.sum(axis=1)  # roll each row's real tokens to its front
    right_ids = np.stack([np.roll(r, n) for r, n in zip(ids, shift, strict=True)])
    right_mask = np.stack([np.roll(r, n) for r, n in zip(mask, shift, strict=True)])
    assert (right_mask[:, 0] == 1).all() and (right_mask != mask).any()
    again = np.asarray(dec.generate(dec.params, right_ids, right_mask, steps))
    np.testing.assert_array_equal(again, got)


def test_noisy_generate_equals_the_noisy_no_cache_loop(models):
    dec = load_decoder(models["llama_tied"][1])
    ids, mask = batch("left")
    steps, std, key = 5, 0.5, jax.random.key(3)
    got = np.asarray(dec.generate(dec.params, ids, mask, steps, noise_std=std, key=key))
    noise = std * jax.random.normal(key, (3, ids.shape[1] + steps, 64), jnp.float32)
    np.testing.assert_array_equal(got, no_cache_greedy(dec, ids, mask, steps, np.asarray(noise)))
    clean = np.asarray(dec.generate(dec.params, ids, mask, steps))
    assert (got != clean).any()  # the noise reaches the tokens
    # noise_std 0 with a key is the noiseless run.
    zero = dec.generate(dec.params, ids, mask, steps, noise_std=0.0, key=key)
    np.testing.assert_array_equal(np.asarray(zero), clean)


def test_generate_stops_rows_at_eos(models):
    dec = load_decoder(models["llama_tied"][1])
    ids, mask = batch("left")
    clean = np.asarray(dec.generate(dec.params, ids, mask, 5))
    eos = int(clean[0, 1])
    got = np.asarray(dec.generate(dec.params, ids, mask, 5, eos_id=eos, pad_id=7))
    for row, ref in zip(got, clean, strict=True):
        hit = np.flatnonzero(ref == eos)
        stop = hit[0] + 1 if hit.size else 5
        np.testing.assert_array_equal(row[:stop], ref[:stop])
        assert (row[stop:] == 7).all()
    assert (got[0, 2:] == 7).all()


def test_generate_stops_each_row_at_the_first_of_several_end_ids(models):
    """Llama 3.1 Instruct lists three end ids; generation stopped on one only and went on past
    the others (found by review). Each row now stops at the first of any, padded with the
    first id by default; an id outside the vocabulary is refused."""
    dec = load_decoder(models["llama_tied"][1])
    ids, mask = batch("left")
    clean = np.asarray(dec.generate(dec.params, ids, mask, 6))
    stops = (int(clean[1, 2]), int(clean[0, 1]))  # row 0 stops at its 2nd token, row 1 by its 3rd
    got = np.asarray(dec.generate(dec.params, ids, mask, 6, eos_id=stops))
    for row, ref in zip(got, clean, strict=True):
        hit = np.flatnonzero(np.isin(ref, stops))
        stop = hit[0] + 1 if hit.size else 6
        np.testing.assert_array_equal(row[:stop], ref[:stop])
        assert (row[stop:] == stops[0]).all()
    assert (got[0, 2:] == stops[0]).all() and (got[1, 3:] == stops[0]).all()
    with pytest.raises(ModelFolderError, match="eos_id 500 is outside the vocabulary"):
        dec.generate(dec.params, ids, mask, 6, eos_id=(stops[0], 500))


# --------------------------------------------------------------------------------------------
# Random init and writing folders
# --------------------------------------------------------------------------------------------


def test_init_params_write_and_load_round_trip(tmp_path):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    cfg = DecoderConfig(
        vocab_size=32, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
        num_kv_heads=1, attention_bias=True, rope_type="llama3", rope_original_max_positions=8,
    )  # fmt: skip
    params = cfg.init_params(jax.random.key(0))
    tok = Tokenizer(WordLevel({f"w{i}": i for i in range(32)}, unk_token="w0"))
    write_decoder_folder(tmp_path / "m", cfg, params, tokenizer=tok)
    dec = load_decoder(tmp_path / "m")
    assert dec.config == cfg and dec.tokenizer.token_to_id("w5") == 5
    jax.tree.map(np.testing.assert_array_equal, dec.params, params)
    # transformers reads the folder as the same model.
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "m").eval()
    ids, mask = np.array([[3, 4, 5, 6]]), np.ones((1, 4), np.int64)
    with torch.no_grad():
        logits = ref(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits
    np.testing.assert_allclose(dec.readout(dec(ids, mask))[-1], logits.numpy(), **TOL)
    with pytest.raises(ModelFolderError, match=r"params\['blocks'\]\['q'\]\['kernel'\] has shape"):
        q = dict(params["blocks"]["q"], kernel=jnp.zeros((2, 32, 8)))
        bad = dict(params, blocks=dict(params["blocks"], q=q))
        write_decoder_folder(tmp_path / "bad", cfg, bad)


# --------------------------------------------------------------------------------------------
# Sharding on 4 forced CPU devices
# --------------------------------------------------------------------------------------------

SHARDED = """
import json, jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from cudt.models.llama import Decoder, DecoderConfig, decoder_partition_specs

cfg = DecoderConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_layers=2,
                    num_heads=4, num_kv_heads=2, attention_bias=True)
dec = Decoder(cfg, cfg.init_params(jax.random.key(0)))
rng = np.random.default_rng(0)
ids = rng.integers(0, 128, (4, 6)); mask = np.ones((4, 6), np.int32); mask[1, :2] = 0


@jax.jit
def forward(params, ids, mask):
    states = dec.apply(params, ids, mask)
    return states, dec.readout_apply(params, states)


ref, ref_logits = jax.device_get(forward(dec.params, ids, mask))
devices = np.array(jax.devices())
out = {"devices": len(devices)}
for mode, shape, names in [("fsdp", (4,), ("data",)), ("tp", (4,), ("model",)),
                           ("fsdp_tp", (2, 2), ("data", "model"))]:
    mesh = Mesh(devices.reshape(shape), names)
    specs = decoder_partition_specs(dec.params, mode, mesh)
    params = jax.device_put(dec.params, jax.tree.map(lambda s: NamedSharding(mesh, s), specs))
    batch = NamedSharding(mesh, P("data") if "data" in names else P())
    states, logits = forward(params, jax.device_put(ids, batch), jax.device_put(mask, batch))
    out[mode] = {
        "states": float(np.abs(np.asarray(states) - ref).max()),
        "logits": float(np.abs(np.asarray(logits) - ref_logits).max()),
        "q": specs["blocks"]["q"]["kernel"], "o": specs["blocks"]["o"]["kernel"],
        "embed": specs["embed"], "norm": specs["blocks"]["attn_norm"],
        "q_shards": len(params["blocks"]["q"]["kernel"].addressable_shards),
        "q_shard_shape": list(params["blocks"]["q"]["kernel"].addressable_shards[0].data.shape),
    }
odd = DecoderConfig(vocab_size=30, hidden_size=12, intermediate_size=18, num_layers=1,
                    num_heads=3)
odd_specs = decoder_partition_specs(jax.eval_shape(odd.init_params, jax.random.key(0)), "tp",
                                    Mesh(devices, ("model",)))
out["odd"] = {"embed": odd_specs["embed"], "gate": odd_specs["blocks"]["gate"]["kernel"]}
print(json.dumps(out, default=list))
"""


@pytest.mark.slow
def test_sharded_forward_equals_one_device(tmp_path):
    env = forced_devices_env(4)
    proc = subprocess.run(
        [sys.executable, "-c", SHARDED], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["devices"] == 4
    for mode in ("fsdp", "tp", "fsdp_tp"):
        assert out[mode]["states"] < 1e-5 and out[mode]["logits"] < 1e-5, (mode, out[mode])
        assert out[mode]["norm"] == [None, None]  # norms replicated
        assert out[mode]["q_shards"] == 4
    # The specs really shard: q kernel [L=2, D=64, H*Dh=64].
    assert out["fsdp"]["q_shard_shape"] == [2, 16, 64]  # first of the equal largest dims
    assert out["fsdp"]["q"] == [None, "data", None] and out["fsdp"]["embed"] == ["data", None]
    assert out["tp"]["q"] == [None, None, "model"] and out["tp"]["o"] == [None, "model", None]
    assert out["tp"]["embed"] == ["model", None]
    assert out["fsdp_tp"]["q"] == [None, "data", "model"]
    assert out["fsdp_tp"]["q_shard_shape"] == [2, 32, 32]
    # Dims the axis does not divide stay whole: vocab 30 -> hidden 12; width 18 -> replicated.
    assert out["odd"] == {"embed": [None, "model"], "gate": [None, None, None]}


def test_partition_spec_errors():
    cfg = DecoderConfig(vocab_size=30, hidden_size=12, intermediate_size=18, num_layers=1,
                        num_heads=3)  # fmt: skip
    params = jax.eval_shape(cfg.init_params, jax.random.key(0))
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("model",))
    with pytest.raises(ModelFolderError) as err:
        decoder_partition_specs(params, "pipeline", mesh)
    assert "sharding mode must be" in one_line(err)
    with pytest.raises(ModelFolderError) as err:
        decoder_partition_specs(params, "fsdp", mesh)
    assert "lack ['data']" in one_line(err)
    with pytest.raises(ModelFolderError) as err:
        decoder_partition_specs(params, "fsdp_tp")
    assert "needs mesh=" in one_line(err)


# --------------------------------------------------------------------------------------------
# Bad input: one clear line each
# --------------------------------------------------------------------------------------------


def one_line(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert "\n" not in message and isinstance(err.value, cudt.CudtError)
    return message


def write_config(folder: pathlib.Path, **overrides) -> pathlib.Path:
    folder.mkdir(parents=True, exist_ok=True)
    raw = DecoderConfig(vocab_size=16, hidden_size=8, intermediate_size=8, num_layers=1,
                        num_heads=2).to_dict()  # fmt: skip
    (folder / "config.json").write_text(json.dumps({**raw, **overrides}))
    return folder


def test_an_exports_root_or_adapter_folder_is_named_with_what_to_load(tmp_path):
    """An export's folder of models and a model's PEFT adapters hold no config.json: each is
    named as what it is, with the folder to load instead (not "pass a model folder")."""
    model = write_config(tmp_path / "export" / "llm-2-ERM-seed-0")
    (tmp_path / "export" / "export.json").write_text("{}")
    with pytest.raises(ModelFolderError) as err:
        load_decoder(tmp_path / "export")
    assert "is an export (export.json) of model folders (llm-2-ERM-seed-0)" in one_line(err)
    assert f"pass one of them, e.g. {model}" in one_line(err)
    (model / "adapter").mkdir()
    adapter = {"peft_type": "LORA", "base_model_name_or_path": "my/base"}
    (model / "adapter" / "adapter_config.json").write_text(json.dumps(adapter))
    with pytest.raises(ModelFolderError) as err:
        load_decoder(model / "adapter")
    assert "holds LoRA adapters (PEFT's adapter_config.json), not a model" in one_line(err)
    assert f"pass the merged model beside them, {model}, or their base my/base" in str(err.value)


def test_bad_folders_and_configs(tmp_path):
    with pytest.raises(ModelFolderError) as err:
        load_decoder(tmp_path / "nope")
    assert "does not exist" in one_line(err)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelFolderError) as err:
        load_decoder(tmp_path / "empty")
    assert "has no config.json" in one_line(err)
    pickled = write_config(tmp_path / "pickle")
    (pickled / "pytorch_model.bin").write_bytes(b"\x80\x04 never opened")
    with pytest.raises(ModelFolderError) as err:
        load_decoder(pickled)
    assert "pytorch_model.bin" in one_line(err) and "pickle" in str(err.value)
    for overrides, expected in [
        (dict(model_type="gpt2"), "unsupported architecture 'gpt2'"),
        (dict(hidden_act="gelu"), "unsupported hidden_act 'gelu'"),
        (dict(rope_parameters={"rope_type": "yarn", "factor": 2.0}), "unsupported rope_type"),
        (
            dict(model_type="qwen2", use_sliding_window=True, max_window_layers=0),
            "qwen2 with sliding-window",
        ),
        (
            dict(model_type="qwen2", layer_types=["sliding_attention"]),
            "qwen2 with sliding-window",
        ),
        (dict(num_key_value_heads=3), "not a multiple of num_key_value_heads"),
        (dict(hidden_size=None), "lacks hidden_size"),
    ]:
        folder = write_config(tmp_path / "cfg", **overrides)
        with pytest.raises(ModelFolderError) as err:
            load_decoder(folder)
        assert expected in one_line(err), (overrides, str(err.value))


def test_quantized_folders_are_refused_not_read_as_another_model(tmp_path):
    """A bitsandbytes int8 folder (its weights the int8 codes, the scales apart) loaded, the codes
    cast to float: another model, silently (found by review). Its quantization_config is
    refused; without one, so is an integer weight, the LM head too (read apart from the rest)."""
    config = DecoderConfig(vocab_size=16, hidden_size=8, intermediate_size=8, num_layers=1,
                           num_heads=2)  # fmt: skip
    params = config.init_params(jax.random.key(0))
    folder = write_decoder_folder(tmp_path / "quant", config, params)
    raw = json.loads((folder / "config.json").read_text())
    quant = {"quant_method": "bitsandbytes", "load_in_8bit": True}
    (folder / "config.json").write_text(json.dumps(raw | {"quantization_config": quant}))
    with pytest.raises(ModelFolderError) as err:
        load_decoder(folder)
    assert "quantization_config (quant_method 'bitsandbytes')" in one_line(err)
    for leaf in ("q", "lm_head"):
        codes = jax.tree.map(lambda a: a, params)
        if leaf == "lm_head":
            codes["lm_head"] = np.round(np.asarray(params["lm_head"]) * 100).astype(np.int8)
        else:
            kernel = np.asarray(params["blocks"]["q"]["kernel"])
            codes["blocks"]["q"]["kernel"] = np.round(kernel * 100).astype(np.int8)
        folder = write_decoder_folder(tmp_path / leaf, config, codes)
        with pytest.raises(ModelFolderError) as err:
            load_decoder(folder)
        assert "has dtype int8, not a floating point weight" in one_line(err), leaf


def test_weights_with_more_layers_than_the_config_are_refused(tmp_path):
    """A 2-layer folder whose config.json says 1 loaded as a 1-layer model, its second layer
    dropped silently (found by review)."""
    config = DecoderConfig(vocab_size=16, hidden_size=8, intermediate_size=8, num_layers=2,
                           num_heads=2)  # fmt: skip
    folder = write_decoder_folder(tmp_path / "m", config, config.init_params(jax.random.key(0)))
    raw = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(raw | {"num_hidden_layers": 1}))
    with pytest.raises(ModelFolderError) as err:
        load_decoder(folder)
    assert "holds more layers than the 1 of config.json (tensor 'model.layers.1." in one_line(err)


def test_a_tied_config_over_an_untied_head_is_refused(tmp_path):
    """tie_word_embeddings true over a file whose lm_head differs from the embeddings: ours read
    out with the embeddings, transformers 5.x with the stored head (logits 0.4 apart; found by
    review). A stored head equal to the embeddings (some exporters keep both) still loads."""
    config = DecoderConfig(vocab_size=16, hidden_size=8, intermediate_size=8, num_layers=1,
                           num_heads=2)  # fmt: skip
    params = config.init_params(jax.random.key(0))
    folder = write_decoder_folder(tmp_path / "m", config, params)
    raw = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(raw | {"tie_word_embeddings": True}))
    with pytest.raises(ModelFolderError) as err:
        load_decoder(folder)
    assert "holds an 'lm_head.weight' that differs from them: set tie_word_embeddings" in (
        one_line(err)
    )
    same = write_decoder_folder(tmp_path / "same", config, params | {"lm_head": params["embed"].T})
    (same / "config.json").write_text(json.dumps(raw | {"tie_word_embeddings": True}))
    assert load_decoder(same).config.tie_word_embeddings


def test_a_qwen2_whose_window_starts_past_its_last_layer_is_full_attention():
    """transformers slides only the layers from max_window_layers on: with it at or past the
    last layer, use_sliding_window=true is plain attention, and was refused (found by review)."""
    raw = DecoderConfig(vocab_size=16, hidden_size=8, intermediate_size=8, num_layers=2,
                        num_heads=2).to_dict()  # fmt: skip
    raw |= dict(model_type="qwen2", use_sliding_window=True, sliding_window=4)
    assert DecoderConfig.from_dict(raw | dict(max_window_layers=2)).num_layers == 2
    assert DecoderConfig.from_dict(raw).num_layers == 2  # transformers' default, 28
    layer_types = ["full_attention", "full_attention"]
    DecoderConfig.from_dict(raw | dict(max_window_layers=0, layer_types=layer_types))
    with pytest.raises(ModelFolderError, match="qwen2 with sliding-window"):
        DecoderConfig.from_dict(raw | dict(max_window_layers=1))


def test_bad_call_arguments(models):
    dec = load_decoder(models["llama_tied"][1])
    ids, mask = batch("left")
    cases = [
        (lambda: dec(ids.astype(np.float32), mask), "input_ids must be an integer array"),
        (lambda: dec(ids, mask[:, :3]), "attention_mask has shape"),
        (lambda: dec(ids + 500, mask), "input_ids must lie in [0, 128)"),
        (lambda: dec.generate(dec.params, ids, mask, 3, noise_std=0.1), "needs a key"),
        (lambda: dec.generate(dec.params, ids, 0 * mask, 3), "no real token"),
        (lambda: dec.generate(dec.params, ids, mask, -1), "max_new_tokens must be"),
        (lambda: dec.readout(np.zeros((2, 5))), "states have shape"),
    ]
    for call, expected in cases:
        with pytest.raises(ModelFolderError) as err:
            call()
        assert expected in one_line(err), str(err.value)


@pytest.mark.slow
def test_block_remat_gives_the_same_gradients_with_less_saved_memory():
    """``remat=True``: the same per-layer losses and gradients, and the compiled backward keeps
    less temporary memory (autodiff no longer saves each block's attention and MLP internals)."""
    import dataclasses

    from cudt.lm_loss import layer_token_losses
    from cudt.models.llama import Decoder, DecoderConfig

    config = DecoderConfig(
        vocab_size=64, hidden_size=32, intermediate_size=128, num_layers=3, num_heads=4,
        num_kv_heads=2,
    )  # fmt: skip
    dec = Decoder(config=config, params=config.init_params(jax.random.key(0)))
    rem = dataclasses.replace(dec, remat=True)
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(0, 64, size=(4, 48)), jnp.int32)
    labels = jnp.roll(ids, -1, axis=1)
    mask = jnp.ones(ids.shape, jnp.float32)

    def loss(d):
        def f(params):
            states = d.apply(params, ids)
            ce, _ = layer_token_losses(
                states, lambda x: d.final_norm(params, x), d.head_matrix(params), labels, mask
            )
            return ce.mean(0) @ jnp.arange(1.0, 5.0)

        return f

    (v0, g0), (v1, g1) = (jax.value_and_grad(loss(d))(dec.params) for d in (dec, rem))
    np.testing.assert_allclose(float(v1), float(v0), rtol=1e-5)
    for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1), strict=True):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-6)
    temp = [
        jax.jit(jax.grad(loss(d))).lower(dec.params).compile().memory_analysis().temp_size_in_bytes
        for d in (dec, rem)
    ]
    assert temp[1] < temp[0], temp


def test_float64_inputs_keep_float64_statistics_scores_and_logits():
    """The float32 statistics, scores and logits widen bf16; they narrowed float64 (x64, a
    float64 decoder for a gradient check) to float32 precision (found by review)."""
    from cudt.models.llama import layers

    with jax.enable_x64(True):
        x = jnp.array([[1.0, 1.0 + 1e-12, 2.0, 3.0]], jnp.float64)
        y = layers.rms_norm(x, jnp.ones(4, jnp.float64), 1e-6)
        assert y.dtype == jnp.float64 and float(y[0, 1] - y[0, 0]) > 0  # 1e-12 apart, kept
        config = DecoderConfig(vocab_size=16, hidden_size=8, intermediate_size=8, num_layers=2,
                               num_heads=2)  # fmt: skip
        params = config.init_params(jax.random.key(0), jnp.float64)
        dec = Decoder(config, params, dtype=jnp.float64)
        ids = jnp.arange(12, dtype=jnp.int32).reshape(2, 6)
        for f in (lambda p: dec.apply(p, ids, None), lambda p: dec.readout_apply(p, dec(ids))):
            # no float64 value cast down or multiplied into float32 (the RoPE angles of the
            # integer positions are float32 by design, as transformers computes them)
            assert _narrowings(jax.make_jaxpr(f)(params).jaxpr) == []


def _narrowings(jaxpr) -> list[str]:
    """The equations of ``jaxpr`` (and the programs inside it) that take a float64 operand to
    a float32 result."""
    found = []
    for eqn in jaxpr.eqns:
        wide = any(getattr(v.aval, "dtype", None) == jnp.float64 for v in eqn.invars)
        if wide and any(getattr(v.aval, "dtype", None) == jnp.float32 for v in eqn.outvars):
            found.append(str(eqn))
        for param in eqn.params.values():
            for sub in param if isinstance(param, (tuple, list)) else (param,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    found += _narrowings(inner)
    return found
