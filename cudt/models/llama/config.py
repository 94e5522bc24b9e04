"""The configuration of a Llama-family decoder, parsed from a Hugging Face ``config.json``.

:class:`DecoderConfig` holds the architecture (hashable: a static ``jax.jit`` argument), parses
and writes ``config.json`` (transformers 4.x ``rope_scaling`` and 5.x ``rope_parameters``), and
knows the params tree: :meth:`~DecoderConfig.param_shapes`, :meth:`~DecoderConfig.init_params`,
:meth:`~DecoderConfig.check_params`. Unsupported options raise one
:class:`~cudt.models.hf.ModelFolderError` line.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from collections.abc import Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cudt.models.hf import (
    FolderConfig,
    ModelFolderError,
    check_heads,
    check_sizes,
    malformed_fields,
)

__all__ = [
    "ARCHITECTURES",
    "BLOCK_LINEARS",
    "BLOCK_NORMS",
    "SUPPORTED_DECODER_TYPES",
    "DecoderConfig",
    "Params",
    "Place",
    "leaf_at",
    "params_from_places",
]

SUPPORTED_DECODER_TYPES: tuple[str, ...] = ("llama", "mistral", "qwen2")
Params = dict[str, Any]
# Where a tensor sits in the params tree: dict keys, then, for a block leaf, its layer index
# (``("blocks", "q", "kernel", 3)``): the checkpoint layouts of hf.py and gguf.py name each
# tensor of a file by its place.
Place = tuple[Any, ...]

ROPE_TYPES = ("default", "llama3")
# A block's tensors: our leaf -> (its Hugging Face sub-module after ``model.layers.{i}.``, its
# llama.cpp GGUF name after ``blk.{i}.``).
BLOCK_NORMS = {
    "attn_norm": ("input_layernorm", "attn_norm"),
    "mlp_norm": ("post_attention_layernorm", "ffn_norm"),
}
BLOCK_LINEARS = {
    "q": ("self_attn.q_proj", "attn_q"),
    "k": ("self_attn.k_proj", "attn_k"),
    "v": ("self_attn.v_proj", "attn_v"),
    "o": ("self_attn.o_proj", "attn_output"),
    "gate": ("mlp.gate_proj", "ffn_gate"),
    "up": ("mlp.up_proj", "ffn_up"),
    "down": ("mlp.down_proj", "ffn_down"),
}
ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
}


def _qwen2_slides(raw: Mapping[str, Any]) -> bool:
    """Whether a qwen2 config has sliding-window layers, as transformers decides: its
    ``layer_types``, else the layers from ``max_window_layers`` (default 28) on, where
    ``use_sliding_window`` and a window (default 4096) are set. A config that sets the window
    on but starts it past the last layer is full attention throughout."""
    types = raw.get("layer_types")
    if types is not None:
        return "sliding_attention" in types
    if not raw.get("use_sliding_window") or raw.get("sliding_window", 4096) is None:
        return False
    layers = raw.get("num_hidden_layers", raw.get("num_layers", 0))
    return int(raw.get("max_window_layers", 28)) < int(layers or 0)


@dataclasses.dataclass(frozen=True)
class DecoderConfig(FolderConfig):
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
            raise ModelFolderError(
                f"unsupported architecture {self.model_type!r}: supported are "
                f"{', '.join(SUPPORTED_DECODER_TYPES)} (config.json model_type)"
            )
        sizes = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads")
        check_sizes(self, sizes, "config")
        if self.num_kv_heads is None:
            set_("num_kv_heads", self.num_heads)
        if self.head_dim is None:
            check_heads(self.hidden_size, self.num_heads, ": give head_dim explicitly")
            set_("head_dim", self.hidden_size // self.num_heads)
        if self.num_kv_heads < 1 or self.num_heads % self.num_kv_heads:
            raise ModelFolderError(
                f"num_attention_heads {self.num_heads} is not a multiple of num_key_value_heads "
                f"{self.num_kv_heads}: fix config.json"
            )
        if self.head_dim < 2 or self.head_dim % 2:
            raise ModelFolderError(f"head_dim {self.head_dim} must be even (rotary embeddings)")
        own_bias = self.model_type == "qwen2"
        if self.attention_bias is None:
            set_("attention_bias", own_bias)
        if self.model_type != "llama" and (self.attention_bias != own_bias or self.mlp_bias):
            raise ModelFolderError(
                f"{self.model_type} has {'query/key/value biases' if own_bias else 'no biases'}"
                f" and no MLP biases: attention_bias={self.attention_bias}, "
                f"mlp_bias={self.mlp_bias} need model_type 'llama'"
            )
        if self.sliding_window is not None:
            if self.model_type != "mistral":
                raise ModelFolderError(
                    f"sliding_window is supported for mistral only, not {self.model_type}"
                )
            if int(self.sliding_window) < 1:
                raise ModelFolderError(f"sliding_window {self.sliding_window} must be >= 1 or null")
        if self.rope_type not in ROPE_TYPES:
            raise ModelFolderError(
                f"unsupported rope_type {self.rope_type!r}: supported are {', '.join(ROPE_TYPES)}"
            )
        if self.rope_original_max_positions is None:
            set_("rope_original_max_positions", self.max_position_embeddings)
        if self.rope_type == "llama3" and not (
            self.rope_factor > 0 and self.rope_high_freq_factor > self.rope_low_freq_factor > 0
        ):
            raise ModelFolderError(
                "llama3 rope needs factor > 0 and high_freq_factor > low_freq_factor > 0, got "
                f"{self.rope_factor}, {self.rope_high_freq_factor}, {self.rope_low_freq_factor}"
            )
        if not self.rms_norm_eps > 0 or not self.rope_theta > 0:
            raise ModelFolderError("rms_norm_eps and rope_theta must be > 0")
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
            raise ModelFolderError(
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
            raise ModelFolderError(f"config.json lacks {', '.join(missing)}: re-export the model")
        act = raw.get("hidden_act", "silu")
        if act not in ("silu", "swish"):
            raise ModelFolderError(
                f"unsupported hidden_act {act!r}: Llama-family decoders use silu (SwiGLU)"
            )
        rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
        if not isinstance(rope, Mapping) or any(isinstance(v, Mapping) for v in rope.values()):
            raise ModelFolderError(
                "rope_parameters per layer type (nested dicts) are not supported: one rope "
                "for every layer only"
            )
        rope_type = rope.get("rope_type", rope.get("type")) or "default"
        partial = rope.get("partial_rotary_factor", raw.get("partial_rotary_factor"))
        if partial not in (1, 1.0, None):
            raise ModelFolderError(
                f"partial_rotary_factor {partial} is not supported: only 1 (full)"
            )
        if model_type == "qwen2" and _qwen2_slides(raw):
            raise ModelFolderError(
                "qwen2 with sliding-window layers (use_sliding_window=true, layers from "
                "max_window_layers on) is not supported: set use_sliding_window to false"
            )
        if model_type == "llama" and raw.get("sliding_window") is not None:
            raise ModelFolderError("llama has no sliding_window: remove it from config.json")
        eos = raw.get("eos_token_id")
        eos = () if eos is None else (eos if isinstance(eos, list | tuple) else (eos,))

        def opt_int(key: str, default: Any = None) -> int | None:
            value = raw.get(key, default)
            return None if value is None else int(value)

        with malformed_fields():
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

    def to_dict(self) -> dict[str, Any]:
        """The Hugging Face ``config.json`` dict of this config: transformers 5.x's
        ``rope_parameters``, and the same rope as 4.x reads it (``rope_theta``, and
        ``rope_scaling`` when scaled), so neither falls back to its default silently."""
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
            "architectures": [ARCHITECTURES[self.model_type]],
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
            "rope_theta": self.rope_theta,
            "rope_scaling": (
                None
                if self.rope_type == "default"
                else {k: v for k, v in rope.items() if k != "rope_theta"}
            ),
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

    def tensor_shape(self, place: Place) -> tuple[int, ...]:
        """The shape of the tensor at ``place``: a block leaf's place names one layer, so its
        shape lacks the leading ``[L]``."""
        if place[0] == "blocks":
            return leaf_at(self.param_shapes(), place[:-1])[1:]
        return leaf_at(self.param_shapes(), place)

    def block_tensors(self, fmt: int) -> Iterator[tuple[int, str, str, Place, bool]]:
        """Every block tensor, as both checkpoint formats list them: per layer the norms, then
        each projection's weight and, where this config has one, its bias. Each is ``(layer,
        name after the layer's prefix in format fmt (0: Hugging Face, 1: GGUF), our leaf, place,
        transposed)``: both store a matrix as torch's ``[out, in]``, our kernels are
        ``[in, out]``."""
        blocks = self.param_shapes()["blocks"]
        for i in range(self.num_layers):
            for ours, names in BLOCK_NORMS.items():
                yield i, f"{names[fmt]}.weight", ours, ("blocks", ours, i), False
            for ours, names in BLOCK_LINEARS.items():
                yield i, f"{names[fmt]}.weight", ours, ("blocks", ours, "kernel", i), True
                if "bias" in blocks[ours]:
                    yield i, f"{names[fmt]}.bias", ours, ("blocks", ours, "bias", i), False

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
            raise ModelFolderError(f"params is not a pytree of arrays ({err})") from err
        want_map = {jax.tree_util.keystr(p): s for p, s in want[0]}
        got_map = {jax.tree_util.keystr(p): tuple(np.shape(x)) for p, x in got}
        if want_map.keys() != got_map.keys():
            extra = sorted(got_map.keys() - want_map.keys())
            lacking = sorted(want_map.keys() - got_map.keys())
            raise ModelFolderError(
                f"params do not fit the config: missing {lacking or 'nothing'}, unexpected "
                f"{extra or 'nothing'}; build them with config.init_params or load_decoder"
            )
        for name, shape in want_map.items():
            if got_map[name] != shape:
                raise ModelFolderError(
                    f"params{name} has shape {list(got_map[name])}, expected {list(shape)} "
                    "from the config"
                )


def leaf_at(tree: Any, place: Place) -> Any:
    """The value at ``place`` (dict keys, then a layer index for a block leaf)."""
    return functools.reduce(operator.getitem, place, tree)


def params_from_places(c: DecoderConfig, found: Mapping[Place, np.ndarray]) -> Params:
    """Our params tree from ``{place: array}`` (every place of a layout): block leaves stacked
    to ``[L, ...]`` by their layer index."""
    params: Params = {}
    stacks: dict[Place, dict[int, np.ndarray]] = {}
    for place, arr in found.items():
        if place[0] == "blocks":
            stacks.setdefault(place[:-1], {})[place[-1]] = arr
        else:
            leaf_parent(params, place)[place[-1]] = arr
    for keys, layers in stacks.items():
        leaf_parent(params, keys)[keys[-1]] = np.stack([layers[i] for i in range(c.num_layers)])
    return params


def leaf_parent(tree: dict, place: Place) -> dict:
    """The dict that holds ``place``'s last key, created on the way."""
    for key in place[:-1]:
        tree = tree.setdefault(key, {})
    return tree
