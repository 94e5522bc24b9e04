"""Llama-family decoders (Llama, Mistral, Qwen2) in JAX, from a Hugging Face folder.

Loads a Hugging Face causal-LM folder (``config.json``, ``model.safetensors`` or sharded
``model-0000x-of-0000y.safetensors`` + ``model.safetensors.index.json``, optionally
``tokenizer.json``) with no torch/transformers at run time and returns EVERY layer's hidden
state, BEFORE the final RMSNorm::

    dec = load_decoder("path/to/folder")                  # or Decoder(cfg, cfg.init_params(key))
    states = dec(input_ids, attention_mask)                # [L+1, B, T, D]
    logits = dec.readout(states)                           # [L+1, B, T, V]: norm + LM head, each
    new_ids = dec.generate(dec.params, ids, mask, 16, noise_std=0.1, key=key)  # [B, 16]

``states[0]`` is the token embedding (plus ``embed_noise`` if given), ``states[i]`` the output of
block ``i``. Transformers' ``hidden_states`` differ in their LAST entry only: Llama's
``capture_outputs`` ties ``hidden_states[-1]`` to ``last_hidden_state`` (the final norm applied),
so ``hidden_states[-1] == dec.final_norm(params, states[-1])`` and ``hidden_states[:L] ==
states[:L]``; ``readout`` gives every state the final norm and LM head, so ``readout(states)[-1]``
are the model's logits.

The forward is pure JAX (no flax modules): ``params`` is a nested dict pytree, every leaf under
``params["blocks"]`` has a leading ``[L]`` axis and the blocks run as one ``jax.lax.scan``::

    {"embed": [V, D], "final_norm": [D], "lm_head": [D, V] (untied only),
     "blocks": {"attn_norm": [L, D], "mlp_norm": [L, D],
                "q": {"kernel": [L, D, H*Dh], "bias"?}, "k"/"v": {"kernel": [L, D, K*Dh], "bias"?},
                "o": {"kernel": [L, H*Dh, D], "bias"?},
                "gate"/"up": {"kernel": [L, D, F], "bias"?}, "down": {"kernel": [L, F, D], "bias"?}}}

``dtype`` is the COMPUTE dtype: params of any dtype are cast to it one layer at a time inside the
scan (float32 params with ``dtype=bfloat16`` is mixed precision; gradients stay float32), while
RMSNorm statistics, rotary angles, attention scores and softmax, and logits are float32.

Attention is grouped-query causal attention (head ``h`` uses key/value head ``h // (H / K)``) with
an optional sliding window (Mistral) measured in sequence slots; padded keys never get
attention. Position ids default to ``max(cumsum(mask) - 1, 0)``: ``0, 1, 2, ...`` over the real
tokens, which is ``arange(T)`` for right-padded or unpadded rows and what transformers'
``generate`` uses for left-padded ones (its plain forward uses ``arange(T)`` whatever the padding;
pass ``position_ids`` to reproduce that). Padded query positions are computed but meaningless.

Supported: ``model_type`` ``llama`` (``attention_bias``, ``mlp_bias``, ``head_dim``, GQA, rope
``default`` and ``llama3``), ``mistral`` (the same blocks without biases, ``sliding_window``) and
``qwen2`` (query/key/value biases, no output bias, no sliding-window layers). Anything else is
refused with one line. Only safetensors checkpoints are read: pickle checkpoints are refused,
never opened. Loading problems raise :class:`cudt.models.encoders.EncoderError`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import pathlib
from collections.abc import Mapping
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec

from cudt.models.encoders import (
    _SAFETENSORS_FILE,
    EncoderError,
    _check_range,
    _check_shape,
    _find_prefix_of,
    _load_tensors,
    _model_folder,
    _read_tokenizer,
    _Weights,
)

__all__ = [
    "SUPPORTED_DECODER_TYPES",
    "Decoder",
    "DecoderConfig",
    "decoder_partition_specs",
    "load_decoder",
    "write_decoder_folder",
]

SUPPORTED_DECODER_TYPES: tuple[str, ...] = ("llama", "mistral", "qwen2")
ShardingMode = Literal["fsdp", "tp", "fsdp_tp"]
Params = dict[str, Any]

_ROPE_TYPES = ("default", "llama3")
_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
}
# Projections and their HF sub-module names (relative to ``model.layers.{i}.``).
_HF_LINEAR = {
    "q": "self_attn.q_proj",
    "k": "self_attn.k_proj",
    "v": "self_attn.v_proj",
    "o": "self_attn.o_proj",
    "gate": "mlp.gate_proj",
    "up": "mlp.up_proj",
    "down": "mlp.down_proj",
}
_HF_NORM = {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"}
_EMBED_KEY = "embed_tokens.weight"
_NEG = float(np.finfo(np.float32).min)  # masked attention score: finite, so never NaN


# --------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
    """Architecture hyper-parameters of a Llama-family decoder; hashable (a static jit argument).

    ``num_kv_heads`` (K) defaults to ``num_heads`` (H, no grouping), ``head_dim`` (Dh) to
    ``hidden_size // num_heads``; ``attention_bias`` defaults to what the ``model_type`` has
    (Qwen2: biases on query/key/value only; Llama: on all four projections when true).
    ``rope_type="llama3"`` uses ``rope_factor``, ``rope_low_freq_factor``,
    ``rope_high_freq_factor`` and ``rope_original_max_positions`` (default
    ``max_position_embeddings``).
    """

    vocab_size: int  # V
    hidden_size: int  # D
    intermediate_size: int  # F, SwiGLU width
    num_layers: int  # L
    num_heads: int  # H
    num_kv_heads: int | None = None  # K
    head_dim: int | None = None  # Dh
    model_type: str = "llama"
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_type: str = "default"  # "default" | "llama3"
    rope_factor: float = 8.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_positions: int | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool | None = None
    mlp_bias: bool = False
    sliding_window: int | None = None  # Mistral: a query sees the last `sliding_window` slots
    initializer_range: float = 0.02
    bos_token_id: int | None = None
    eos_token_id: tuple[int, ...] = ()
    pad_token_id: int | None = None

    def __post_init__(self) -> None:
        set_ = functools.partial(object.__setattr__, self)
        if self.model_type not in SUPPORTED_DECODER_TYPES:
            raise EncoderError(
                f"unsupported architecture {self.model_type!r}: supported are "
                f"{', '.join(SUPPORTED_DECODER_TYPES)} (config.json model_type)"
            )
        sizes = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads")
        for name in sizes:
            if int(getattr(self, name)) < 1:
                raise EncoderError(f"config gives {name}={getattr(self, name)}: must be >= 1")
        if self.num_kv_heads is None:
            set_("num_kv_heads", self.num_heads)
        if self.head_dim is None:
            if self.hidden_size % self.num_heads:
                raise EncoderError(
                    f"hidden size {self.hidden_size} is not divisible by {self.num_heads} heads: "
                    "give head_dim explicitly"
                )
            set_("head_dim", self.hidden_size // self.num_heads)
        if self.num_kv_heads < 1 or self.num_heads % self.num_kv_heads:
            raise EncoderError(
                f"num_attention_heads {self.num_heads} is not a multiple of num_key_value_heads "
                f"{self.num_kv_heads}: fix config.json"
            )
        if self.head_dim < 2 or self.head_dim % 2:
            raise EncoderError(f"head_dim {self.head_dim} must be even (rotary embeddings)")
        own_bias = self.model_type == "qwen2"
        if self.attention_bias is None:
            set_("attention_bias", own_bias)
        if self.model_type != "llama" and (self.attention_bias != own_bias or self.mlp_bias):
            raise EncoderError(
                f"{self.model_type} has {'query/key/value biases' if own_bias else 'no biases'}"
                f" and no MLP biases: attention_bias={self.attention_bias}, "
                f"mlp_bias={self.mlp_bias} need model_type 'llama'"
            )
        if self.sliding_window is not None:
            if self.model_type != "mistral":
                raise EncoderError(
                    f"sliding_window is supported for mistral only, not {self.model_type}"
                )
            if int(self.sliding_window) < 1:
                raise EncoderError(f"sliding_window {self.sliding_window} must be >= 1 or null")
        if self.rope_type not in _ROPE_TYPES:
            raise EncoderError(
                f"unsupported rope_type {self.rope_type!r}: supported are {', '.join(_ROPE_TYPES)}"
            )
        if self.rope_original_max_positions is None:
            set_("rope_original_max_positions", self.max_position_embeddings)
        if self.rope_type == "llama3" and not (
            self.rope_factor > 0 and self.rope_high_freq_factor > self.rope_low_freq_factor > 0
        ):
            raise EncoderError(
                "llama3 rope needs factor > 0 and high_freq_factor > low_freq_factor > 0, got "
                f"{self.rope_factor}, {self.rope_high_freq_factor}, {self.rope_low_freq_factor}"
            )
        if not self.rms_norm_eps > 0 or not self.rope_theta > 0:
            raise EncoderError("rms_norm_eps and rope_theta must be > 0")
        set_("eos_token_id", tuple(int(i) for i in self.eos_token_id))

    # ---- derived ----------------------------------------------------------------------------

    @property
    def qkv_bias(self) -> bool:
        """Whether the query/key/value projections have biases."""
        return bool(self.attention_bias)

    @property
    def o_bias(self) -> bool:
        """Whether the attention output projection has a bias (Llama ``attention_bias`` only)."""
        return bool(self.attention_bias) and self.model_type == "llama"

    @property
    def groups(self) -> int:
        """Query heads per key/value head, ``H // K``."""
        return self.num_heads // self.num_kv_heads

    # ---- Hugging Face config.json -------------------------------------------------------------

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> DecoderConfig:
        """Parse a Hugging Face ``config.json`` dict (transformers 4.x ``rope_scaling`` +
        ``rope_theta`` or 5.x ``rope_parameters``); unsupported options raise one line."""
        model_type = raw.get("model_type")
        if model_type not in SUPPORTED_DECODER_TYPES:
            raise EncoderError(
                f"unsupported architecture {model_type!r}: load_decoder reads "
                f"{', '.join(SUPPORTED_DECODER_TYPES)} models (config.json model_type); pass "
                "the folder of one of those"
            )
        missing = [
            k
            for k in (
                "vocab_size",
                "hidden_size",
                "intermediate_size",
                "num_hidden_layers",
                "num_attention_heads",
            )
            if raw.get(k) is None
        ]
        if missing:
            raise EncoderError(f"config.json lacks {', '.join(missing)}: re-export the model")
        act = raw.get("hidden_act", "silu")
        if act not in ("silu", "swish"):
            raise EncoderError(
                f"unsupported hidden_act {act!r}: Llama-family decoders use silu (SwiGLU)"
            )
        rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
        if not isinstance(rope, Mapping) or any(isinstance(v, Mapping) for v in rope.values()):
            raise EncoderError(
                "rope_parameters per layer type (nested dicts) are not supported: one rope "
                "for every layer only"
            )
        rope_type = rope.get("rope_type", rope.get("type")) or "default"
        partial = rope.get("partial_rotary_factor", raw.get("partial_rotary_factor"))
        if partial not in (1, 1.0, None):
            raise EncoderError(f"partial_rotary_factor {partial} is not supported: only 1 (full)")
        if model_type == "qwen2" and (
            raw.get("use_sliding_window") or "sliding_attention" in (raw.get("layer_types") or ())
        ):
            raise EncoderError(
                "qwen2 with sliding-window layers (use_sliding_window=true) is not supported: "
                "set use_sliding_window to false"
            )
        if model_type == "llama" and raw.get("sliding_window") is not None:
            raise EncoderError("llama has no sliding_window: remove it from config.json")
        eos = raw.get("eos_token_id")
        eos = () if eos is None else (eos if isinstance(eos, list | tuple) else (eos,))

        def opt_int(key: str, default: Any = None) -> int | None:
            value = raw.get(key, default)
            return None if value is None else int(value)

        try:
            max_pos = int(raw.get("max_position_embeddings") or 2048)
            return cls(
                model_type=model_type,
                vocab_size=int(raw["vocab_size"]),
                hidden_size=int(raw["hidden_size"]),
                intermediate_size=int(raw["intermediate_size"]),
                num_layers=int(raw["num_hidden_layers"]),
                num_heads=int(raw["num_attention_heads"]),
                num_kv_heads=opt_int("num_key_value_heads"),
                head_dim=opt_int("head_dim"),
                rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
                rope_theta=float(rope.get("rope_theta", raw.get("rope_theta", 10000.0))),
                rope_type=str(rope_type),
                rope_factor=float(rope.get("factor", 8.0)),
                rope_low_freq_factor=float(rope.get("low_freq_factor", 1.0)),
                rope_high_freq_factor=float(rope.get("high_freq_factor", 4.0)),
                rope_original_max_positions=int(
                    rope.get("original_max_position_embeddings") or max_pos
                ),
                max_position_embeddings=max_pos,
                tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
                attention_bias=(
                    bool(raw.get("attention_bias", False)) if model_type == "llama" else None
                ),
                mlp_bias=bool(raw.get("mlp_bias", False)) if model_type == "llama" else False,
                sliding_window=opt_int("sliding_window") if model_type == "mistral" else None,
                initializer_range=float(raw.get("initializer_range", 0.02)),
                bos_token_id=opt_int("bos_token_id"),
                eos_token_id=tuple(int(e) for e in eos),
                pad_token_id=opt_int("pad_token_id"),
            )
        except (TypeError, ValueError, KeyError) as err:
            if isinstance(err, EncoderError):
                raise
            raise EncoderError(f"config.json has a malformed field: {err}") from err

    @classmethod
    def from_file(cls, path: str | pathlib.Path) -> DecoderConfig:
        """Parse a ``config.json`` file."""
        path = pathlib.Path(path)
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise EncoderError(f"{path} is not valid JSON ({err}); re-export the model") from err
        if not isinstance(raw, dict):
            raise EncoderError(f"{path} must hold a JSON object; re-export the model")
        return cls.from_dict(raw)

    def to_dict(self) -> dict[str, Any]:
        """The Hugging Face ``config.json`` dict (transformers 5.x layout) of this config."""
        rope: dict[str, Any] = {"rope_type": self.rope_type, "rope_theta": self.rope_theta}
        if self.rope_type == "llama3":
            rope.update(
                factor=self.rope_factor,
                low_freq_factor=self.rope_low_freq_factor,
                high_freq_factor=self.rope_high_freq_factor,
                original_max_position_embeddings=self.rope_original_max_positions,
            )
        eos = list(self.eos_token_id)
        out: dict[str, Any] = {
            "architectures": [_ARCHITECTURES[self.model_type]],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_parameters": rope,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "initializer_range": self.initializer_range,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": eos[0] if len(eos) == 1 else (eos or None),
            "pad_token_id": self.pad_token_id,
        }
        if self.model_type == "llama":
            out.update(attention_bias=self.attention_bias, mlp_bias=self.mlp_bias)
        elif self.model_type == "mistral":
            out.update(sliding_window=self.sliding_window)
        else:
            out.update(use_sliding_window=False, sliding_window=None)
        return out

    # ---- parameters -------------------------------------------------------------------------

    def param_shapes(self) -> Params:
        """The params tree of this config with shape tuples as leaves."""
        c = self
        d, f, L = c.hidden_size, c.intermediate_size, c.num_layers
        hq, hk = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim

        def linear(n_in: int, n_out: int, bias: bool) -> dict[str, tuple[int, ...]]:
            out = {"kernel": (L, n_in, n_out)}
            if bias:
                out["bias"] = (L, n_out)
            return out

        blocks = {
            "attn_norm": (L, d),
            "q": linear(d, hq, c.qkv_bias),
            "k": linear(d, hk, c.qkv_bias),
            "v": linear(d, hk, c.qkv_bias),
            "o": linear(hq, d, c.o_bias),
            "mlp_norm": (L, d),
            "gate": linear(d, f, c.mlp_bias),
            "up": linear(d, f, c.mlp_bias),
            "down": linear(f, d, c.mlp_bias),
        }
        shapes: Params = {"embed": (c.vocab_size, d), "blocks": blocks, "final_norm": (d,)}
        if not c.tie_word_embeddings:
            shapes["lm_head"] = (d, c.vocab_size)
        return shapes

    def init_params(self, key: jax.Array, dtype: Any = jnp.float32) -> Params:
        """Random params as transformers initialises them: matrices ~ N(0, initializer_range),
        biases 0, norm weights 1 (pad token's embedding row 0 when ``pad_token_id`` is set)."""
        shapes = self.param_shapes()
        paths, treedef = jax.tree_util.tree_flatten_with_path(
            shapes, is_leaf=lambda x: isinstance(x, tuple)
        )
        keys = jax.random.split(key, len(paths))
        leaves = []
        for (path, shape), k in zip(paths, keys, strict=True):
            name = jax.tree_util.keystr(path)
            if "norm" in name:
                leaves.append(jnp.ones(shape, dtype))
            elif name.endswith("['bias']"):
                leaves.append(jnp.zeros(shape, dtype))
            else:
                leaves.append(self.initializer_range * jax.random.normal(k, shape, dtype))
        params = jax.tree.unflatten(treedef, leaves)
        if self.pad_token_id is not None and 0 <= self.pad_token_id < self.vocab_size:
            params["embed"] = params["embed"].at[self.pad_token_id].set(0)
        return params

    def check_params(self, params: Params) -> None:
        """Raise unless ``params`` has this config's tree structure and shapes."""
        expected = self.param_shapes()
        is_shape = lambda x: isinstance(x, tuple)
        want = jax.tree_util.tree_flatten_with_path(expected, is_leaf=is_shape)
        try:
            got = jax.tree_util.tree_flatten_with_path(params)[0]
        except Exception as err:  # any non-pytree
            raise EncoderError(f"params is not a pytree of arrays ({err})") from err
        want_map = {jax.tree_util.keystr(p): s for p, s in want[0]}
        got_map = {jax.tree_util.keystr(p): tuple(np.shape(x)) for p, x in got}
        if want_map.keys() != got_map.keys():
            extra = sorted(got_map.keys() - want_map.keys())
            lacking = sorted(want_map.keys() - got_map.keys())
            raise EncoderError(
                f"params do not fit the config: missing {lacking or 'nothing'}, unexpected "
                f"{extra or 'nothing'}; build them with config.init_params or load_decoder"
            )
        for name, shape in want_map.items():
            if got_map[name] != shape:
                raise EncoderError(
                    f"params{name} has shape {list(got_map[name])}, expected {list(shape)} "
                    "from the config"
                )


# --------------------------------------------------------------------------------------------
# Pure forward
# --------------------------------------------------------------------------------------------


def _inv_freq(c: DecoderConfig) -> np.ndarray:
    """Rotary inverse frequencies ``[Dh/2]`` float32, computed in float32 as transformers does."""
    dim = c.head_dim
    exponents = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)
    inv = np.float32(1.0) / np.power(np.float32(c.rope_theta), exponents)
    if c.rope_type == "llama3":
        f32 = np.float32
        factor, low = f32(c.rope_factor), f32(c.rope_low_freq_factor)
        high = f32(c.rope_high_freq_factor)
        old = f32(c.rope_original_max_positions)
        low_wavelen, high_wavelen = old / low, old / high
        wavelen = f32(2 * math.pi) / inv
        scaled = np.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (f32(1) - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        inv = np.where(medium, smoothed, scaled)
    return inv.astype(np.float32)


def _rotary(positions: jax.Array, c: DecoderConfig, dtype: Any) -> tuple[jax.Array, jax.Array]:
    """``cos, sin [B, T, Dh]`` of integer ``positions [B, T]``: angles in float32, then cast."""
    freqs = positions.astype(jnp.float32)[..., None] * jnp.asarray(_inv_freq(c))
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb).astype(dtype), jnp.sin(emb).astype(dtype)


def _rotate(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotary embedding of ``x [B, T, N, Dh]`` (the rotate-half layout of HF checkpoints)."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[:, :, None] + rotated * sin[:, :, None]


def _rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """RMSNorm with float32 statistics; the result in ``x.dtype`` times the weight."""
    xf = x.astype(jnp.float32)
    y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return weight.astype(x.dtype) * y.astype(x.dtype)


def _linear(x: jax.Array, p: Mapping[str, jax.Array]) -> jax.Array:
    y = x @ p["kernel"]
    return y + p["bias"] if "bias" in p else y


def _cast(tree: Any, dtype: Any) -> Any:
    return jax.tree.map(lambda a: a.astype(dtype), tree)


def _allowed(
    key_valid: jax.Array,  # [B, S] bool: a real (or already generated) token in that slot
    query_slots: jax.Array,  # [T] int
    c: DecoderConfig,
) -> jax.Array:  # [B, T, S] bool
    key_slots = jnp.arange(key_valid.shape[1])
    diff = query_slots[:, None] - key_slots[None, :]  # [T, S]
    ok = diff >= 0
    if c.sliding_window is not None:
        ok = ok & (diff < c.sliding_window)
    return key_valid[:, None, :] & ok[None]


def _attention(
    p: Params,
    q: jax.Array,  # [B, T, H, Dh]
    k: jax.Array,  # [B, S, K, Dh]
    v: jax.Array,  # [B, S, K, Dh]
    allowed: jax.Array,  # [B, T, S] bool
    c: DecoderConfig,
) -> jax.Array:  # [B, T, D]
    b, t = q.shape[:2]
    # Head h reads key/value head h // G (transformers' repeat_kv order).
    q = q.reshape(b, t, c.num_kv_heads, c.groups, c.head_dim)
    scores = jnp.einsum("btkgd,bskd->bkgts", q, k, preferred_element_type=jnp.float32)
    scores = scores * (c.head_dim**-0.5)
    scores = jnp.where(allowed[:, None, None], scores, _NEG)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    ctx = jnp.einsum("bkgts,bskd->btkgd", probs, v).reshape(b, t, c.num_heads * c.head_dim)
    return _linear(ctx, p["o"])


def _qkv(
    p: Params, y: jax.Array, cos: jax.Array, sin: jax.Array, c: DecoderConfig
) -> tuple[jax.Array, jax.Array, jax.Array]:
    b, t, _ = y.shape
    q = _linear(y, p["q"]).reshape(b, t, c.num_heads, c.head_dim)
    k = _linear(y, p["k"]).reshape(b, t, c.num_kv_heads, c.head_dim)
    v = _linear(y, p["v"]).reshape(b, t, c.num_kv_heads, c.head_dim)
    return _rotate(q, cos, sin), _rotate(k, cos, sin), v


def _mlp(p: Params, x: jax.Array, c: DecoderConfig) -> jax.Array:
    y = _rms_norm(x, p["mlp_norm"], c.rms_norm_eps)
    return _linear(jax.nn.silu(_linear(y, p["gate"])) * _linear(y, p["up"]), p["down"])


def _run_blocks(
    blocks: Params,  # leaves [L, ...]
    x: jax.Array,  # [B, T, D] compute dtype
    positions: jax.Array,  # [B, T] int
    key_valid: jax.Array,  # [B, T] bool
    c: DecoderConfig,
    dtype: Any,
    remat: bool = False,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """All blocks over a full sequence: ``(states [L, B, T, D], keys, values [L, B, T, K, Dh])``.

    ``remat``: rematerialise each block in the backward pass (``jax.checkpoint``): autodiff keeps
    only the blocks' inputs (which are the states anyway), not their attention and MLP
    intermediates nor the per-layer compute-dtype copies of the weights."""
    cos, sin = _rotary(positions, c, dtype)
    allowed = _allowed(key_valid, jnp.arange(x.shape[1]), c)

    def block(h: jax.Array, p: Params) -> tuple[jax.Array, tuple[jax.Array, ...]]:
        p = _cast(p, dtype)  # one layer at a time: mixed precision without a full-size copy
        q, k, v = _qkv(p, _rms_norm(h, p["attn_norm"], c.rms_norm_eps), cos, sin, c)
        h = h + _attention(p, q, k, v, allowed, c)
        h = h + _mlp(p, h, c)
        return h, (h, k, v)

    body = (
        jax.checkpoint(block, policy=jax.checkpoint_policies.nothing_saveable) if remat else block
    )
    _, (states, keys, values) = jax.lax.scan(body, x, blocks)
    return states, keys, values


def _default_positions(attention_mask: jax.Array) -> jax.Array:
    """``max(cumsum(mask) - 1, 0)``: 0, 1, ... over real tokens; pads get 0 (as HF generate)."""
    return jnp.maximum(jnp.cumsum(attention_mask.astype(jnp.int32), axis=1) - 1, 0)


def _embed_tokens(params: Params, input_ids: jax.Array, dtype: Any) -> jax.Array:
    return jnp.take(params["embed"], input_ids, axis=0).astype(dtype)


@functools.partial(jax.jit, static_argnames=("config", "dtype", "remat"))
def _forward(
    params: Params,
    embeds: jax.Array,  # [B, T, D]
    attention_mask: jax.Array,  # [B, T]
    position_ids: jax.Array | None,  # [B, T]
    *,
    config: DecoderConfig,
    dtype: Any,
    remat: bool = False,
) -> jax.Array:  # [L+1, B, T, D]
    mask = attention_mask != 0
    positions = _default_positions(mask) if position_ids is None else position_ids
    x = embeds.astype(dtype)
    states, _, _ = _run_blocks(params["blocks"], x, positions, mask, config, dtype, remat)
    return jnp.concatenate([x[None], states], axis=0)


@functools.partial(jax.jit, static_argnames=("config", "dtype", "remat"))
def _forward_ids(
    params: Params,
    input_ids: jax.Array,
    attention_mask: jax.Array,
    position_ids: jax.Array | None,
    embed_noise: jax.Array | None,
    *,
    config: DecoderConfig,
    dtype: Any,
    remat: bool = False,
) -> jax.Array:
    x = _embed_tokens(params, input_ids, dtype)
    if embed_noise is not None:
        x = x + embed_noise.astype(dtype)
    return _forward(
        params, x, attention_mask, position_ids, config=config, dtype=dtype, remat=remat
    )


def _head_matrix(params: Params, config: DecoderConfig) -> jax.Array:
    return params["embed"].T if config.tie_word_embeddings else params["lm_head"]


def _readout(params: Params, states: jax.Array, config: DecoderConfig, dtype: Any) -> jax.Array:
    x = _rms_norm(states.astype(dtype), params["final_norm"], config.rms_norm_eps)
    head = _head_matrix(params, config).astype(dtype)
    return jnp.einsum("...d,dv->...v", x, head, preferred_element_type=jnp.float32)


# --------------------------------------------------------------------------------------------
# Greedy generation with a KV cache
# --------------------------------------------------------------------------------------------


def _left_align(input_ids: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Roll every row so its last real token sits in the last slot (right padding -> left)."""
    length = input_ids.shape[1]
    last = length - 1 - jnp.argmax(mask[:, ::-1], axis=1)  # [B] slot of the last real token
    src = (jnp.arange(length)[None, :] - (length - 1 - last)[:, None]) % length
    return jnp.take_along_axis(input_ids, src, axis=1), jnp.take_along_axis(mask, src, axis=1)


@functools.partial(
    jax.jit, static_argnames=("config", "dtype", "max_new_tokens", "eos_id", "pad_id")
)
def _generate(
    params: Params,
    input_ids: jax.Array,  # [B, T]
    attention_mask: jax.Array,  # [B, T]
    noise_std: jax.Array,  # [] float32
    key: jax.Array | None,
    *,
    config: DecoderConfig,
    dtype: Any,
    max_new_tokens: int,
    eos_id: int | None,
    pad_id: int,
) -> jax.Array:  # [B, max_new_tokens]
    c = config
    batch, length = input_ids.shape
    slots = length + max_new_tokens
    ids, mask = _left_align(input_ids, attention_mask != 0)
    positions = _default_positions(mask)
    noise = None
    if key is not None:  # slot s of row b gets noise[b, s], prompt and generated tokens alike
        noise = noise_std * jax.random.normal(key, (batch, slots, c.hidden_size), jnp.float32)

    def embed(tokens: jax.Array, start: int | jax.Array, size: int) -> jax.Array:
        x = _embed_tokens(params, tokens, dtype)
        if noise is not None:
            x = x + jax.lax.dynamic_slice_in_dim(noise, start, size, axis=1).astype(dtype)
        return x

    def next_token(h: jax.Array) -> jax.Array:  # [B, D] -> [B]
        return jnp.argmax(_readout(params, h, c, dtype), axis=-1).astype(input_ids.dtype)

    # Prefill: the prompt's keys/values go to slots [0, T) of a fixed-size cache.
    states, keys, values = _run_blocks(
        params["blocks"], embed(ids, 0, length), positions, mask, c, dtype
    )
    pad_slots = ((0, 0), (0, 0), (0, max_new_tokens), (0, 0), (0, 0))
    k_cache, v_cache = jnp.pad(keys, pad_slots), jnp.pad(values, pad_slots)  # [L, B, S, K, Dh]
    valid = jnp.pad(mask, ((0, 0), (0, max_new_tokens)))  # [B, S]
    first = next_token(states[-1, :, -1])
    done = (first == eos_id) if eos_id is not None else jnp.zeros((batch,), bool)

    def step(carry: tuple[jax.Array, ...], i: jax.Array) -> tuple[tuple[jax.Array, ...], jax.Array]:
        k_cache, v_cache, valid, token, done = carry
        slot = length + i
        valid = jax.lax.dynamic_update_slice(valid, jnp.ones((batch, 1), bool), (0, slot))
        pos = positions[:, -1:] + 1 + i  # [B, 1]
        cos, sin = _rotary(pos, c, dtype)
        allowed = _allowed(valid, slot[None], c)  # [B, 1, S]

        def block(h: jax.Array, layer: tuple[Params, jax.Array, jax.Array]):
            p, k_l, v_l = layer
            p = _cast(p, dtype)
            q, k, v = _qkv(p, _rms_norm(h, p["attn_norm"], c.rms_norm_eps), cos, sin, c)
            k_l = jax.lax.dynamic_update_slice(k_l, k, (0, slot, 0, 0))
            v_l = jax.lax.dynamic_update_slice(v_l, v, (0, slot, 0, 0))
            h = h + _attention(p, q, k_l, v_l, allowed, c)
            return h + _mlp(p, h, c), (k, v)

        h, (k_new, v_new) = jax.lax.scan(
            block, embed(token[:, None], slot, 1), (params["blocks"], k_cache, v_cache)
        )
        k_cache = jax.lax.dynamic_update_slice(k_cache, k_new, (0, 0, slot, 0, 0))
        v_cache = jax.lax.dynamic_update_slice(v_cache, v_new, (0, 0, slot, 0, 0))
        out = jnp.where(done, pad_id, next_token(h[:, -1]))
        if eos_id is not None:
            done = done | (out == eos_id)
        return (k_cache, v_cache, valid, out, done), out

    carry = (k_cache, v_cache, valid, first, done)
    _, rest = jax.lax.scan(step, carry, jnp.arange(max_new_tokens - 1))  # [N-1, B]
    return jnp.concatenate([first[:, None], rest.T], axis=1)


# --------------------------------------------------------------------------------------------
# Decoder
# --------------------------------------------------------------------------------------------


def _is_traced(x: Any) -> bool:
    return isinstance(x, jax.core.Tracer)


@dataclasses.dataclass(frozen=True, eq=False)
class Decoder:
    """A Llama-family decoder: config, params pytree, tokenizer and pure functions.

    Not itself a pytree: pass ``dec.params`` (or a trained copy) to ``dec.apply``. ``eq=False``
    keeps hashing by identity, so bound methods such as ``dec.apply`` can be jitted. ``dtype`` is
    the compute dtype (see the module docstring); params are used in whatever dtype they have.
    ``remat`` rematerialises every block in the backward pass (``dataclasses.replace(dec,
    remat=True)``): the same values and gradients, less activation memory.
    """

    config: DecoderConfig
    params: Params
    tokenizer: Any = None  # tokenizers.Tokenizer | None
    dtype: Any = jnp.float32
    path: pathlib.Path | None = None
    remat: bool = False

    @property
    def num_layers(self) -> int:
        """L, the number of decoder blocks."""
        return self.config.num_layers

    # ---- forward ----------------------------------------------------------------------------

    def _mask_and_positions(
        self, shape: tuple[int, int], attention_mask: Any, position_ids: Any
    ) -> tuple[jax.Array, jax.Array | None]:
        mask = jnp.ones(shape, jnp.int32) if attention_mask is None else jnp.asarray(attention_mask)
        _check_shape("attention_mask", mask.shape, shape)
        if position_ids is not None:
            position_ids = jnp.asarray(position_ids)
            _check_shape("position_ids", position_ids.shape, shape)
            if not jnp.issubdtype(position_ids.dtype, jnp.integer):
                raise EncoderError(f"position_ids must be integers, got {position_ids.dtype}")
        return mask, position_ids

    def apply(
        self,
        params: Params,
        input_ids: Any,  # [B, T] int
        attention_mask: Any = None,  # [B, T], 1 = real token, 0 = padding; None = no padding
        *,
        embed_noise: Any = None,  # [B, T, D], added to the token embeddings
        position_ids: Any = None,  # [B, T] int; None = max(cumsum(mask) - 1, 0)
    ) -> jax.Array:  # [L+1, B, T, D]
        """Pure forward: the token embeddings (plus ``embed_noise``), then every block's
        output, all before the final norm. Differentiable and jittable. Ids outside the
        vocabulary raise :class:`EncoderError` when called eagerly."""
        input_ids = jnp.asarray(input_ids)
        if input_ids.ndim != 2 or not jnp.issubdtype(input_ids.dtype, jnp.integer):
            raise EncoderError(
                f"input_ids must be an integer array [B, T], got {input_ids.dtype}"
                f"{list(input_ids.shape)}"
            )
        mask, position_ids = self._mask_and_positions(input_ids.shape, attention_mask, position_ids)
        _check_range("input_ids", input_ids, self.config.vocab_size)
        if embed_noise is not None:
            embed_noise = jnp.asarray(embed_noise)
            _check_shape(
                "embed_noise", embed_noise.shape, (*input_ids.shape, self.config.hidden_size)
            )
        return _forward_ids(
            params,
            input_ids,
            mask,
            position_ids,
            embed_noise,
            config=self.config,
            dtype=jnp.dtype(self.dtype),
            remat=self.remat,
        )

    def apply_embeds(
        self,
        params: Params,
        embeds: Any,  # [B, T, D]
        attention_mask: Any = None,  # [B, T]
        *,
        position_ids: Any = None,  # [B, T] int
    ) -> jax.Array:  # [L+1, B, T, D]
        """:meth:`apply` from input embeddings instead of token ids (``states[0] == embeds``)."""
        embeds = jnp.asarray(embeds)
        if embeds.ndim != 3 or embeds.shape[-1] != self.config.hidden_size:
            raise EncoderError(
                f"embeds has shape {list(embeds.shape)}, expected [B, T, {self.config.hidden_size}]"
            )
        mask, position_ids = self._mask_and_positions(
            embeds.shape[:2], attention_mask, position_ids
        )
        return _forward(
            params,
            embeds,
            mask,
            position_ids,
            config=self.config,
            dtype=jnp.dtype(self.dtype),
            remat=self.remat,
        )

    def embed(self, params: Params, input_ids: Any) -> jax.Array:
        """Token embedding lookup ``[B, T] -> [B, T, D]`` in the compute dtype (the space
        ``embed_noise`` lives in)."""
        input_ids = jnp.asarray(input_ids)
        _check_range("input_ids", input_ids, self.config.vocab_size)
        return _embed_tokens(params, input_ids, jnp.dtype(self.dtype))

    def __call__(self, input_ids: Any, attention_mask: Any = None) -> jax.Array:
        """``apply`` with the loaded params: ``[B, T] -> [L+1, B, T, D]``."""
        return self.apply(self.params, input_ids, attention_mask)

    # ---- readout ----------------------------------------------------------------------------

    def final_norm(self, params: Params, x: Any) -> jax.Array:
        """The model's final RMSNorm of ``x [..., D]``, in the compute dtype."""
        x = jnp.asarray(x).astype(self.dtype)
        return _rms_norm(x, params["final_norm"], self.config.rms_norm_eps)

    def head_matrix(self, params: Params) -> jax.Array:
        """The LM head as ``[D, V]`` (the embedding transposed when tied), in the params' dtype."""
        return _head_matrix(params, self.config)

    def readout_apply(self, params: Params, states: Any) -> jax.Array:
        """Final norm + LM head of every state: ``[..., D] -> [..., V]`` float32 logits (e.g.
        ``[L+1, B, T, D] -> [L+1, B, T, V]``; ``[-1]`` is the model's output)."""
        states = jnp.asarray(states)
        if states.ndim < 1 or states.shape[-1] != self.config.hidden_size:
            raise EncoderError(
                f"states have shape {list(states.shape)}, expected [..., {self.config.hidden_size}]"
            )
        return _readout(params, states, self.config, jnp.dtype(self.dtype))

    def readout(self, states: Any) -> jax.Array:
        """:meth:`readout_apply` with the loaded params."""
        return self.readout_apply(self.params, states)

    # ---- generation -------------------------------------------------------------------------

    def generate(
        self,
        params: Params,
        input_ids: Any,  # [B, T] int
        attention_mask: Any,  # [B, T]; None = no padding
        max_new_tokens: int,
        *,
        noise_std: float | jax.Array = 0.0,
        key: jax.Array | None = None,
        eos_id: int | None = None,
        pad_id: int | None = None,
    ) -> jax.Array:  # [B, max_new_tokens]
        """Greedy decoding with a fixed-size KV cache, one compiled program.

        Prompts may be left- or right-padded (each row is first rolled so its last real token
        is last; position ids count real tokens only, as transformers' ``generate``). With a
        ``key``, Gaussian noise ``noise_std * jax.random.normal(key, (B, T + max_new_tokens,
        D))`` is added to the input embedding of every token: slot ``s`` (after that roll) of
        row ``b`` gets ``noise[b, s]``, prompt and generated tokens alike. Once a row emits
        ``eos_id`` its later tokens are ``pad_id`` (default ``eos_id``); with ``eos_id=None``
        every row runs ``max_new_tokens`` steps. ``noise_std`` may be an array (no recompile).
        """
        input_ids = jnp.asarray(input_ids)
        if input_ids.ndim != 2 or not jnp.issubdtype(input_ids.dtype, jnp.integer):
            raise EncoderError(
                f"input_ids must be an integer array [B, T], got {input_ids.dtype}"
                f"{list(input_ids.shape)}"
            )
        if not isinstance(max_new_tokens, int | np.integer) or max_new_tokens < 0:
            raise EncoderError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
        mask, _ = self._mask_and_positions(input_ids.shape, attention_mask, None)
        _check_range("input_ids", input_ids, self.config.vocab_size)
        if not _is_traced(mask) and input_ids.shape[1] and not bool(np.all(np.any(mask, axis=1))):
            raise EncoderError(
                "a prompt row has no real token (attention_mask all 0): give every row one"
            )
        if input_ids.shape[1] == 0:
            raise EncoderError("prompts are empty (T = 0): give every row at least one token")
        noise_std = jnp.asarray(noise_std, jnp.float32)
        if key is None and not _is_traced(noise_std) and float(noise_std) != 0.0:
            raise EncoderError(f"noise_std={float(noise_std)} needs a key: pass key=...")
        for name, value in (("eos_id", eos_id), ("pad_id", pad_id)):
            if value is not None and not 0 <= int(value) < self.config.vocab_size:
                raise EncoderError(
                    f"{name} {value} is outside the vocabulary [0, {self.config.vocab_size})"
                )
        if max_new_tokens == 0:
            return jnp.zeros((input_ids.shape[0], 0), input_ids.dtype)
        eos = None if eos_id is None else int(eos_id)
        pad = int(pad_id) if pad_id is not None else (eos if eos is not None else 0)
        return _generate(
            params,
            input_ids,
            mask,
            noise_std,
            key,
            config=self.config,
            dtype=jnp.dtype(self.dtype),
            max_new_tokens=int(max_new_tokens),
            eos_id=eos,
            pad_id=pad,
        )


# --------------------------------------------------------------------------------------------
# Sharding
# --------------------------------------------------------------------------------------------

# Megatron tensor parallelism: the dim of each block kernel [L, in, out] split over "model".
_COLUMN = ("q", "k", "v", "gate", "up")  # split the output dim; the bias follows it
_ROW = ("o", "down")  # split the input dim; the bias is replicated (added after the reduce)


def decoder_partition_specs(params: Params, mode: ShardingMode, mesh: Mesh | None = None) -> Any:
    """A pytree of :class:`jax.sharding.PartitionSpec` for ``params`` (same structure).

    * ``"fsdp"``: every matrix's largest dim that the ``"data"`` axis size divides is split
      over ``"data"`` (the stacked blocks' leading ``[L]`` axis never is); vectors (norms,
      biases) are replicated.
    * ``"tp"``: Megatron over ``"model"``: q/k/v/gate/up kernels column-parallel (output dim,
      with their biases), o/down row-parallel (input dim), the embedding over the vocabulary
      (else the hidden dim), the untied LM head over the vocabulary; norms replicated.
    * ``"fsdp_tp"``: ``"tp"`` plus, for each matrix, its largest remaining dim split over
      ``"data"`` (a 2-D ``data x model`` mesh).

    A dim that the axis size does not divide is left whole. Axis sizes come from ``mesh``;
    without one, ``"fsdp"`` and ``"tp"`` assume the axis spans every device. Place params with
    ``jax.device_put(params, jax.tree.map(lambda s: NamedSharding(mesh, s), specs))``.
    """
    if mode not in ("fsdp", "tp", "fsdp_tp"):
        raise EncoderError(f"sharding mode must be 'fsdp', 'tp' or 'fsdp_tp', got {mode!r}")
    axes = ("data",) if mode == "fsdp" else ("model",) if mode == "tp" else ("data", "model")
    if mesh is None:
        if mode == "fsdp_tp":
            raise EncoderError("mode 'fsdp_tp' needs mesh=a Mesh with 'data' and 'model' axes")
        sizes = {axes[0]: jax.device_count()}
    else:
        missing = [a for a in axes if a not in mesh.shape]
        if missing:
            raise EncoderError(
                f"mesh axes {list(mesh.shape)} lack {missing} needed by mode {mode!r}: build the "
                f"mesh with axis names {list(axes)}"
            )
        sizes = {a: int(mesh.shape[a]) for a in axes}

    def spec(path: tuple[Any, ...], leaf: Any) -> PartitionSpec:
        names = [getattr(k, "key", getattr(k, "name", str(k))) for k in path]
        shape = tuple(np.shape(leaf))
        dims: list[str | None] = [None] * len(shape)
        first = 1 if names[0] == "blocks" else 0  # never split the stacked layer axis
        if "model" in sizes:
            m = sizes["model"]
            want: list[int] = []
            if names[0] == "blocks" and names[1] in _COLUMN:
                want = [len(shape) - 1]
            elif names[0] == "blocks" and names[1] in _ROW and names[-1] == "kernel":
                want = [1]
            elif names[0] == "embed":
                want = [0, 1]  # vocab first, else hidden
            elif names[0] == "lm_head":
                want = [1, 0]
            for d in want:
                if shape[d] % m == 0:
                    dims[d] = "model"
                    break
        if "data" in sizes and len(shape) - first >= 2:
            n = sizes["data"]
            free = [d for d in range(first, len(shape)) if dims[d] is None and shape[d] % n == 0]
            if free:
                dims[max(free, key=lambda d: (shape[d], -d))] = "data"
        return PartitionSpec(*dims)

    return jax.tree_util.tree_map_with_path(spec, params)


# --------------------------------------------------------------------------------------------
# Loading and writing Hugging Face folders
# --------------------------------------------------------------------------------------------


def _find_prefix(tensors: Mapping[str, np.ndarray]) -> str:
    """The prefix before ``embed_tokens.`` ('model.' for ForCausalLM, '' for a base model)."""
    return _find_prefix_of(
        tensors,
        _EMBED_KEY,
        ("model.", ""),
        f"tensor 'model.{_EMBED_KEY}' is missing from the checkpoint: it is not a Llama-family "
        "decoder; pass the folder of one, or the config.json that came with these weights",
    )


def _convert(tensors: Mapping[str, np.ndarray], source: pathlib.Path, c: DecoderConfig) -> Params:
    """HF tensors -> our params tree (numpy), block leaves stacked to ``[L, ...]``."""
    prefix = _find_prefix(tensors)
    w = _Weights(tensors, prefix, source)
    shapes = c.param_shapes()
    layers = []
    for i in range(c.num_layers):
        layer: Params = {}
        for name, hf in _HF_NORM.items():
            layer[name] = w.get(f"layers.{i}.{hf}.weight", shapes["blocks"][name][1:])
        for name, hf in _HF_LINEAR.items():
            _, n_in, n_out = shapes["blocks"][name]["kernel"]
            # torch Linear stores weight as [out, in]; our kernels are [in, out].
            layer[name] = {"kernel": w.get(f"layers.{i}.{hf}.weight", (n_out, n_in)).T}
            if "bias" in shapes["blocks"][name]:
                layer[name]["bias"] = w.get(f"layers.{i}.{hf}.bias", (n_out,))
        layers.append(layer)
    params: Params = {
        "embed": w.get(_EMBED_KEY, shapes["embed"]),
        "blocks": jax.tree.map(lambda *xs: np.stack(xs), *layers),
        "final_norm": w.get("norm.weight", shapes["final_norm"]),
    }
    if not c.tie_word_embeddings:
        head = "lm_head.weight"
        if head not in tensors:
            raise EncoderError(
                f"tensor {head!r} is missing from {source.name} and tie_word_embeddings is "
                "false: a base model without its LM head cannot be read out; pass a "
                "ForCausalLM folder"
            )
        found = tensors[head]
        if tuple(found.shape) != (c.vocab_size, c.hidden_size):
            raise EncoderError(
                f"tensor {head!r} has shape {list(found.shape)}, expected "
                f"{[c.vocab_size, c.hidden_size]} from config.json"
            )
        params["lm_head"] = found.T
    return params


def load_decoder(
    path: str | pathlib.Path, dtype: Any = jnp.float32, *, param_dtype: Any = None
) -> Decoder:
    """Load a Hugging Face Llama / Mistral / Qwen2 causal-LM folder into a :class:`Decoder`.

    Reads ``config.json``, ``model.safetensors`` (or the shards of
    ``model.safetensors.index.json``) and, when present, ``tokenizer.json`` (``dec.tokenizer``,
    a ``tokenizers.Tokenizer``; else None). ``dtype`` is the compute dtype; params are stored in
    ``param_dtype`` (default ``dtype``; ``dtype=jnp.bfloat16, param_dtype=jnp.float32`` is
    mixed precision). Raises :class:`EncoderError` with a one-line fix for every problem.
    """
    folder, config_file = _model_folder(path)
    config = DecoderConfig.from_file(config_file)
    tensors, source = _load_tensors(folder)
    store = jnp.dtype(dtype if param_dtype is None else param_dtype)
    params = jax.tree.map(lambda a: jnp.asarray(a, dtype=store), _convert(tensors, source, config))
    tokenizer = _read_tokenizer(folder)
    return Decoder(config=config, params=params, tokenizer=tokenizer, dtype=dtype, path=folder)


def write_decoder_folder(
    folder: str | pathlib.Path,
    config: DecoderConfig,
    params: Params,
    tokenizer: Any = None,
) -> pathlib.Path:
    """Write ``config.json`` + ``model.safetensors`` (HF ``*ForCausalLM`` tensor names, the
    params' dtype) and, given a ``tokenizers.Tokenizer``, ``tokenizer.json``: a folder that
    :func:`load_decoder` and transformers' ``from_pretrained`` read back. Returns the folder."""
    import safetensors.numpy

    config.check_params(params)
    folder = pathlib.Path(folder).expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    host = jax.tree.map(np.asarray, params)
    tensors: dict[str, np.ndarray] = {
        "model.embed_tokens.weight": host["embed"],
        "model.norm.weight": host["final_norm"],
    }
    if not config.tie_word_embeddings:
        tensors["lm_head.weight"] = host["lm_head"].T
    blocks = host["blocks"]
    for i in range(config.num_layers):
        for name, hf in _HF_NORM.items():
            tensors[f"model.layers.{i}.{hf}.weight"] = blocks[name][i]
        for name, hf in _HF_LINEAR.items():
            tensors[f"model.layers.{i}.{hf}.weight"] = blocks[name]["kernel"][i].T
            if "bias" in blocks[name]:
                tensors[f"model.layers.{i}.{hf}.bias"] = blocks[name]["bias"][i]
    tensors = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
    safetensors.numpy.save_file(tensors, str(folder / _SAFETENSORS_FILE), metadata={"format": "pt"})
    dtypes = {str(v.dtype) for v in tensors.values()}
    raw = config.to_dict()
    if len(dtypes) == 1:
        raw["dtype"] = dtypes.pop()
    (folder / "config.json").write_text(json.dumps(raw, indent=2) + "\n", encoding="utf-8")
    if tokenizer is not None:
        tokenizer.save(str(folder / "tokenizer.json"))
    return folder
