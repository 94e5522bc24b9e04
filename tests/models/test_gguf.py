"""GGUF files in ``cudt.load_decoder``: tiny random models written with ``gguf.GGUFWriter`` the
way llama.cpp's converter writes them (its query/key row permutation, its tensor names and
metadata keys, quantised matrices) load into the same decoder as a Hugging Face folder holding
the same weights; the rebuilt tokenizer equals a ``tokenizers`` BPE trained with the same
pre-tokenizer; the chat template renders as transformers renders it; the real SmolLM2 file,
when installed, answers the France question."""

from __future__ import annotations

import dataclasses
import json

import jax.numpy as jnp
import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from helpers import llama_cpp_permute  # noqa: E402

import cudt  # noqa: E402
from cudt.models.hf import ModelFolderError  # noqa: E402
from cudt.models.llama import (  # noqa: E402
    DecoderConfig,
    apply_chat_template,
    load_decoder,
    smollm2_gguf_path,
    write_decoder_folder,
    write_gguf,
)

Q = gguf.GGMLQuantizationType
CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)  # SmolLM2-Instruct's template, as its GGUF file stores it
# K-quant block layouts (bytes per 256 values) and where their float16 scales sit.
K_QUANTS = {
    Q.Q2_K: (84, [(80, 1e-3), (82, 1e-3)]),
    Q.Q3_K: (110, [(108, 2e-3)]),
    Q.Q4_K: (144, [(0, 2e-4), (2, 2e-4)]),
    Q.Q5_K: (176, [(0, 2e-4), (2, 2e-4)]),
    Q.Q6_K: (210, [(208, 2e-4)]),
}


def _quantised(w: np.ndarray, qtype, rng) -> np.ndarray:
    """``w`` quantised by gguf, or (K-quants, which gguf only dequantises) random valid blocks."""
    if qtype not in K_QUANTS:
        return gguf.quants.quantize(w, qtype)
    size, scales = K_QUANTS[qtype]
    blocks = rng.integers(0, 256, (w.shape[0], w.shape[1] // 256, size), dtype=np.uint8)
    for offset, value in scales:
        blocks[..., offset : offset + 2] = np.frombuffer(np.float16(value).tobytes(), np.uint8)
    return blocks.reshape(w.shape[0], -1)


def _write_pair(tmp_path, config: DecoderConfig, qtype, seed: int = 0, tokenizer=None):
    """A GGUF file written as llama.cpp writes one, and a Hugging Face folder holding exactly
    the weights that file dequantises to. Returns ``(gguf_file, hf_folder)``."""
    rng = np.random.default_rng(seed)
    c = config
    arch = "qwen2" if c.model_type == "qwen2" else "llama"
    hq, hk = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    hf: dict[str, np.ndarray] = {}  # HF names, torch [out, in] layout
    gg: dict[str, tuple[np.ndarray, object]] = {}

    def matrix(hf_name: str, gg_name: str, shape, heads=None):
        w = (0.05 * rng.standard_normal(shape)).astype(np.float32)
        q = _quantised(w, qtype, rng)
        hf[hf_name] = gguf.quants.dequantize(q, qtype).reshape(shape).astype(np.float32)
        if heads is not None and arch == "llama":
            q = llama_cpp_permute(q, c.num_heads, heads)
        gg[gg_name] = (np.ascontiguousarray(q), qtype)

    def vector(hf_name: str, gg_name: str, n: int, heads=None):
        v = (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)
        hf[hf_name] = v
        if heads is not None and arch == "llama":
            v = llama_cpp_permute(v, c.num_heads, heads)
        gg[gg_name] = (np.ascontiguousarray(v), None)

    matrix("model.embed_tokens.weight", "token_embd.weight", (c.vocab_size, c.hidden_size))
    vector("model.norm.weight", "output_norm.weight", c.hidden_size)
    if not c.tie_word_embeddings:
        matrix("lm_head.weight", "output.weight", (c.vocab_size, c.hidden_size))
    d, f = c.hidden_size, c.intermediate_size
    for i in range(c.num_layers):
        p, g = f"model.layers.{i}.", f"blk.{i}."
        vector(p + "input_layernorm.weight", g + "attn_norm.weight", d)
        vector(p + "post_attention_layernorm.weight", g + "ffn_norm.weight", d)
        for hf_name, gg_name, shape, heads in (
            ("self_attn.q_proj", "attn_q", (hq, d), c.num_heads),
            ("self_attn.k_proj", "attn_k", (hk, d), c.num_kv_heads),
            ("self_attn.v_proj", "attn_v", (hk, d), None),
            ("self_attn.o_proj", "attn_output", (d, hq), None),
            ("mlp.gate_proj", "ffn_gate", (f, d), None),
            ("mlp.up_proj", "ffn_up", (f, d), None),
            ("mlp.down_proj", "ffn_down", (d, f), None),
        ):
            matrix(p + hf_name + ".weight", g + gg_name + ".weight", shape, heads)
            if c.qkv_bias and gg_name in ("attn_q", "attn_k", "attn_v"):
                vector(p + hf_name + ".bias", g + gg_name + ".bias", shape[0], heads)
            if c.o_bias and gg_name == "attn_output":
                vector(p + hf_name + ".bias", g + gg_name + ".bias", shape[0])

    folder = tmp_path / "hf"
    folder.mkdir()
    import safetensors.numpy

    safetensors.numpy.save_file(hf, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(c.to_dict()), encoding="utf-8")

    file = tmp_path / "model.gguf"
    writer = gguf.GGUFWriter(str(file), arch)
    writer.add_block_count(c.num_layers)
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(d)
    writer.add_feed_forward_length(f)
    writer.add_head_count(c.num_heads)
    writer.add_head_count_kv(c.num_kv_heads)
    writer.add_rope_freq_base(c.rope_theta)
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_rope_dimension_count(c.head_dim)
    if tokenizer is not None:
        tokens, merges, types, pre = tokenizer
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(pre)
        writer.add_token_list(tokens)
        writer.add_token_types(types)
        writer.add_token_merges(merges)
    writer.add_chat_template(CHATML)
    for name, (arr, kind) in gg.items():
        writer.add_tensor(name, arr, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return file, folder


def _tiny(model_type="llama", **kw) -> DecoderConfig:
    base = dict(
        vocab_size=96,
        hidden_size=256,  # a multiple of every block size (K-quants: 256)
        intermediate_size=256,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
    )
    return DecoderConfig(model_type=model_type, **(base | kw))


def _assert_same_model(file, folder, rtol=1e-5, atol=1e-5):
    from_gguf, from_hf = load_decoder(file), load_decoder(folder)
    assert from_gguf.config.model_type == from_hf.config.model_type
    for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads"):
        assert getattr(from_gguf.config, name) == getattr(from_hf.config, name)
    ids = np.random.default_rng(1).integers(0, from_hf.config.vocab_size, (2, 9))
    mask = np.array([[1] * 9, [1] * 6 + [0] * 3])
    s_gguf, s_hf = from_gguf(ids, mask), from_hf(ids, mask)
    np.testing.assert_allclose(s_gguf, s_hf, rtol=rtol, atol=atol)
    np.testing.assert_allclose(
        from_gguf.readout(s_gguf)[:, mask == 1],
        from_hf.readout(s_hf)[:, mask == 1],
        rtol=rtol,
        atol=atol,
    )
    return from_gguf, from_hf


@pytest.mark.parametrize(
    "qtype",
    [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q4_K, Q.Q6_K, Q.Q2_K],
    ids=lambda q: q.name,
)
def test_quantised_llama_equals_the_hf_folder_of_its_weights(tmp_path, qtype):
    file, folder = _write_pair(tmp_path, _tiny(), qtype)
    dec, _ = _assert_same_model(file, folder)
    assert dec.config.tie_word_embeddings and "lm_head" not in dec.params
    assert dec.chat_template == CHATML


@pytest.mark.parametrize(
    "config",
    [
        _tiny(tie_word_embeddings=False, attention_bias=True, num_kv_heads=4),
        _tiny("qwen2", num_kv_heads=1),
    ],
    ids=["llama_untied_bias", "qwen2"],
)
def test_untied_head_biases_and_qwen2_equal_the_hf_folder(tmp_path, config):
    file, folder = _write_pair(tmp_path, config, Q.Q8_0)
    dec, _ = _assert_same_model(file, folder)
    assert dec.config.tie_word_embeddings == config.tie_word_embeddings
    assert dec.config.qkv_bias


def test_quantisation_error_is_bounded_against_the_float_weights(tmp_path):
    """Through write_gguf: F32 and F16 round trips are (near) exact; Q8_0 and Q4_0 stay within
    their quantisation error of the float weights; the tokenizer and template come back."""
    import jax

    reference, fields = _trained_tokenizer("smollm")
    config = _tiny(vocab_size=len(fields[0]), tie_word_embeddings=False)
    params = config.init_params(jax.random.key(0))
    write_decoder_folder(tmp_path / "hf", config, params)
    ref = load_decoder(tmp_path / "hf")
    ids = np.arange(12)[None] * 7 % config.vocab_size
    s_ref = np.asarray(ref(ids))
    for qtype, tol in (("F32", 1e-6), ("F16", 2e-3), ("Q8_0", 2e-2), ("Q4_0", 0.3)):
        file = write_gguf(
            tmp_path / f"m_{qtype}.gguf",
            config,
            params,
            tokenizer=reference,
            pre_tokenizer="smollm",
            chat_template=CHATML,
            qtype=qtype,
        )
        dec = load_decoder(file)
        s = np.asarray(dec(ids))
        rel = np.linalg.norm(s - s_ref) / np.linalg.norm(s_ref)
        assert rel < tol, (qtype, rel)
        if qtype == "F32":
            np.testing.assert_array_equal(
                dec.params["blocks"]["q"]["kernel"], params["blocks"]["q"]["kernel"]
            )
    assert rel > 1e-3  # Q4_0 is lossy: the bound is not vacuous
    text = "<|im_start|>user\nAdd 12 and 30.<|im_end|>\n"
    assert dec.tokenizer.encode(text).ids == reference.encode(text).ids
    assert dec.chat_template == CHATML and dec.config.pad_token_id == config.pad_token_id


def _trained_tokenizer(pre: str):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.pre_tokenizer = (
        pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
        if pre == "smollm"
        else byte_level
    )
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    text = [
        "The capital of France is Paris. The capital of Italy is Rome.",
        "What is 12 + 30? It is 42. Numbers like 2024 and 1999 appear too.",
        "  indented code:\n\tdef f(x):\n\t    return x * 2\n",
        "Ünïcödé wörds and émojis 🙂 are bytes in a byte-level BPE.",
    ] * 20
    tok.train_from_iterator(text, trainer)
    raw = json.loads(tok.to_str())
    vocab = raw["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in raw["model"]["merges"]]
    types = [3 if t in specials else 1 for t in tokens]
    return tok, (tokens, merges, types, pre)


@pytest.mark.parametrize("pre", ["gpt2", "smollm"])
def test_tokenizer_equals_a_tokenizers_bpe_with_the_same_vocabulary(tmp_path, pre):
    reference, fields = _trained_tokenizer(pre)
    config = _tiny(vocab_size=len(fields[0]))
    file, _ = _write_pair(tmp_path, config, Q.F32, tokenizer=fields)
    tok = load_decoder(file).tokenizer
    assert tok.get_vocab_size() == reference.get_vocab_size()
    texts = [
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
        "Numbers 12345 and 2024, spaces   and\ttabs\n\nnew lines.",
        "Ünïcödé 🙂 text<|endoftext|>more",
    ]
    for text in texts:
        ids = tok.encode(text, add_special_tokens=False).ids
        assert ids == reference.encode(text, add_special_tokens=False).ids, text
        assert tok.decode(ids, skip_special_tokens=False) == text
    special = tok.encode("<|im_start|>", add_special_tokens=False).ids
    assert special == [fields[0].index("<|im_start|>")]


def test_chat_template_renders_as_transformers_does():
    transformers = pytest.importorskip("transformers")
    reference, _ = _trained_tokenizer("gpt2")
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=reference, chat_template=CHATML)
    conversations = [
        [{"role": "user", "content": "What is the capital of France?"}],
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "2 + 2?"},
            {"role": "assistant", "content": "4"},
        ],
    ]
    for messages in conversations:
        for gen in (False, True):
            ours = apply_chat_template(messages, CHATML, add_generation_prompt=gen)
            theirs = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
            assert ours == theirs
    assert ours.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n")
    # tojson as transformers' (Jinja's own escapes <, > and & for HTML: other prompt text)
    as_json = "{% for message in messages %}{{ message['content'] | tojson }}{% endfor %}"
    hf_json = transformers.PreTrainedTokenizerFast(
        tokenizer_object=reference, chat_template=as_json
    )
    turn = [{"role": "user", "content": "is 2 < 3 & 'x' > 1?"}]
    ours = apply_chat_template(turn, as_json)
    assert ours == hf_json.apply_chat_template(turn, tokenize=False) == "\"is 2 < 3 & 'x' > 1?\""
    with pytest.raises(ModelFolderError, match="no chat template"):
        apply_chat_template(conversations[0], None)
    with pytest.raises(ModelFolderError, match="role"):
        apply_chat_template([{"content": "x"}], CHATML)


def test_bad_gguf_files_raise_one_line(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(ModelFolderError, match="cannot read .* as GGUF"):
        load_decoder(bad)
    with pytest.raises(ModelFolderError, match="does not exist"):
        load_decoder(tmp_path / "missing.gguf")
    file = tmp_path / "phi.gguf"
    writer = gguf.GGUFWriter(str(file), "phi2")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelFolderError, match=r"'general.architecture' = 'phi2' is not supported"):
        load_decoder(file)


def test_what_a_gguf_file_cannot_hold_is_refused_before_it_is_written(tmp_path):
    """Llama 3 rope scaling other than every Llama 3.x's frequency factors (the file holds
    rope_freqs alone, read back as factors 1 / 4), and rows narrower than a quantised block:
    one line each, and no file (both once wrote, then failed: on reading, or in gguf's
    quantiser with its own error)."""
    import jax

    config = _tiny(rope_type="llama3", rope_factor=8.0, rope_low_freq_factor=2.0)
    params = config.init_params(jax.random.key(0))
    with pytest.raises(ModelFolderError, match="factors 1 / 4, not 2 / 4: save a Hugging Face"):
        write_gguf(tmp_path / "rope.gguf", config, params)
    narrow = DecoderConfig(vocab_size=50, **cudt.models.llama.gguf.TINY_SIZES)
    with pytest.raises(ModelFolderError, match="blocks of 32 values; this model's rows are 16,"):
        write_gguf(
            tmp_path / "q8.gguf", narrow, narrow.init_params(jax.random.key(0)), qtype="Q8_0"
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    good = dataclasses.replace(config, rope_low_freq_factor=1.0)  # every Llama 3.x's: round trip
    file = write_gguf(tmp_path / "ok.gguf", good, params)
    assert load_decoder(file).config.rope_factor == 8.0


def test_real_smollm2_answers_the_france_question():
    try:
        path = smollm2_gguf_path()
    except ModelFolderError as err:
        pytest.skip(str(err))
    dec = cudt.load_decoder(path)
    assert (dec.config.num_layers, dec.config.hidden_size, dec.config.vocab_size) == (
        30,
        576,
        49152,
    )
    prompt = apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        dec.chat_template,
        add_generation_prompt=True,
    )
    ids = dec.tokenizer.encode(prompt, add_special_tokens=False).ids
    assert ids[:2] == [1, 9690]  # <|im_start|> as one token, then "system"
    out = dec.generate(dec.params, jnp.asarray([ids]), None, 8, eos_id=2)
    answer = dec.tokenizer.decode(np.asarray(out[0]).tolist(), skip_special_tokens=True)
    assert "Paris" in answer, answer


def test_llama3_pre_tokenizers_ignore_merges_and_add_bos_by_default_as_llama_cpp_does():
    """llama.cpp's llama-bpe / llama3: a word that is one vocabulary entry is that token
    whatever the merges, and BOS goes first unless the file's add_bos_token says otherwise;
    other pre-tokenizers apply the merges and add BOS only when the key says so."""
    from cudt.models.llama.gguf_tokenizer import gguf_pre_tokenizer, tokenizer_from_gguf

    tokens = ["<s>", "a", "b", "c", "ab", "abc"]
    base = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.merges": ["a b"],
        "tokenizer.ggml.token_type": [3, 1, 1, 1, 1, 1],
        "tokenizer.ggml.bos_token_id": 0,
    }

    def encode(**meta):
        return tokenizer_from_gguf({**base, **meta}).encode("abc").tokens

    assert encode(**{"tokenizer.ggml.pre": "llama-bpe"}) == ["<s>", "abc"]
    assert encode(**{"tokenizer.ggml.pre": "llama3", "tokenizer.ggml.add_bos_token": False}) == [
        "abc"
    ]
    assert encode(**{"tokenizer.ggml.pre": "gpt2"}) == ["ab", "c"]
    assert encode(**{"tokenizer.ggml.pre": "gpt2", "tokenizer.ggml.add_bos_token": True}) == [
        "<s>",
        "ab",
        "c",
    ]
    # written back: llama-bpe only for a tokenizer that ignores merges as llama.cpp will
    llama = tokenizer_from_gguf({**base, "tokenizer.ggml.pre": "llama-bpe"})
    assert gguf_pre_tokenizer(llama) == "llama-bpe"
    from tokenizers import Tokenizer

    raw = json.loads(llama.to_str())
    raw["model"]["ignore_merges"] = False
    with pytest.raises(ModelFolderError, match="applies its merges to whole-vocabulary words"):
        gguf_pre_tokenizer(Tokenizer.from_str(json.dumps(raw)))
    with pytest.raises(ModelFolderError, match="'tokenizer.ggml.token_type' has 5 entries for 6"):
        tokenizer_from_gguf({**base, "tokenizer.ggml.token_type": [1] * 5})
