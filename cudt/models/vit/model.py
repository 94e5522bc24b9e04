"""Pretrained Vision Transformer (ViT) in Flax, read back as a per-layer image denoiser.

Loads a Hugging Face ViT folder (``config.json`` with ``model_type "vit"``, ``model.safetensors``,
optionally ``preprocessor_config.json``) with no torch/transformers at run time and returns EVERY
layer's hidden state, matching the ``hidden_states`` tuple of ``transformers.ViTModel``
(``output_hidden_states=True``, eval mode)::

    vit = load_vit("path/to/folder")
    pixel_values = vit.preprocess(frames)          # [B, H, W] gray uint8 / [0,1] -> [B, 3, H', W']
    states = vit(pixel_values)                     # [L+1, B, N+1, D], N = (H'/p)(W'/p) patches
    readout = vit.init_readout(jax.random.key(0))  # trainable D -> p*p*C linear map
    frames_hat = vit.readout(readout, states)      # [L+1, B, C, H', W'] (normalised pixels)
    gray_hat = vit.postprocess(frames_hat[-1])     # [B, H', W'] in [0, 1]

``states[0]`` is the embedding output (patch embedding, [CLS] prepended, position embeddings
added), ``states[i]`` the output of block ``i`` (pre-LayerNorm blocks). Every state is taken
BEFORE the model's final ``layernorm``: in transformers 5.x ``ViTModel.forward`` is wrapped in
``capture_outputs(tie_last_hidden_states=False)``, whose hooks on each ``ViTLayer`` record the
first layer's input and then every layer's output, and ``tie_last_hidden_states=False`` keeps
``hidden_states[-1]`` as the last block's raw output instead of overwriting it with
``last_hidden_state`` (= ``layernorm(hidden_states[-1])``). So ``states[-1] ==
hidden_states[-1] != last_hidden_state``; the final LayerNorm, the pooler, a classifier head,
a masked-image-modeling decoder and its mask token are all ignored (not loaded).

``vit.params`` is a nested dict pytree (trainable by optax); every leaf under
``params["blocks"]`` has a leading ``[L]`` axis because the blocks run as one ``jax.lax.scan``.
A checkpoint with ``qkv_bias=false`` gets zero (trainable) query/key/value biases, which
computes the same function.

Only safetensors checkpoints are read: pickle checkpoints (``pytorch_model.bin``, ...) are
refused, never opened. Loading problems raise :class:`cudt.models.hf.ModelFolderError`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import pathlib
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from cudt.models.hf import (
    ACTIVATIONS,
    SAFETENSORS_FILE,
    ModelFolderError,
    activation,
    find_prefix,
    layer_norm,
    load_tensors,
    model_folder,
    read_json,
)
from cudt.models.hf import (
    Weights as _HFWeights,
)

__all__ = ["ViT", "ViTConfig", "ViTPreprocessor", "load_vit"]

Params = dict[str, Any]

# The tensor that identifies a ViT checkpoint and gives its prefix ('' or 'vit.').
_PATCH_KEY = "embeddings.patch_embeddings.projection.weight"

# Our block param name -> HF sub-module name (relative to the layer), for the layout every hub
# checkpoint and transformers' save_pretrained use ("legacy") and for transformers 5.x's
# in-memory module names, in case a checkpoint was written without reverting them.
_LEGACY_BLOCK = {
    "layernorm_before": "layernorm_before",
    "query": "attention.attention.query",
    "key": "attention.attention.key",
    "value": "attention.attention.value",
    "attn_out": "attention.output.dense",
    "layernorm_after": "layernorm_after",
    "mlp_in": "intermediate.dense",
    "mlp_out": "output.dense",
}
_V5_BLOCK = {
    "layernorm_before": "layernorm_before",
    "query": "attention.q_proj",
    "key": "attention.k_proj",
    "value": "attention.v_proj",
    "attn_out": "attention.o_proj",
    "layernorm_after": "layernorm_after",
    "mlp_in": "mlp.fc1",
    "mlp_out": "mlp.fc2",
}


# --------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------


def _pair(value: Any, name: str) -> tuple[int, int]:
    if isinstance(value, list | tuple):
        if len(value) != 2:
            raise ModelFolderError(f"config.json gives {name}={value}: must be an int or [h, w]")
        return int(value[0]), int(value[1])
    return int(value), int(value)


@dataclasses.dataclass(frozen=True)
class ViTConfig:
    """Architecture hyper-parameters parsed from a Hugging Face ViT ``config.json``.

    Hashable, so it can be a static argument of ``jax.jit``.
    """

    hidden_size: int  # D
    num_layers: int  # L
    num_heads: int  # H
    intermediate_size: int  # F, MLP width
    activation: str  # "gelu" (exact erf) | "gelu_tanh" | "relu" | "silu"
    layer_norm_eps: float
    image_size: tuple[int, int]  # (H, W) the position embeddings were trained for
    patch_size: tuple[int, int]  # (ph, pw)
    num_channels: int  # C
    qkv_bias: bool

    @property
    def head_dim(self) -> int:
        """Per-head width ``D // H``."""
        return self.hidden_size // self.num_heads

    @property
    def grid(self) -> tuple[int, int]:
        """Patch grid ``(H / ph, W / pw)``."""
        return (
            self.image_size[0] // self.patch_size[0],
            self.image_size[1] // self.patch_size[1],
        )

    @property
    def num_patches(self) -> int:
        """N, patch tokens per image (the sequence is N+1 long with [CLS])."""
        return self.grid[0] * self.grid[1]

    @property
    def patch_dim(self) -> int:
        """Pixels per patch, ``C * ph * pw``."""
        return self.num_channels * self.patch_size[0] * self.patch_size[1]

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> ViTConfig:
        """Parse a ``config.json`` dict, filling keys it omits with the HF ``ViTConfig`` defaults."""
        model_type = raw.get("model_type")
        if model_type != "vit":
            raise ModelFolderError(
                f"unsupported architecture {model_type!r}: load_vit reads 'vit' models only "
                "(config.json model_type); pass a ViT folder"
            )
        act_name = raw.get("hidden_act", "gelu")
        if not isinstance(act_name, str) or act_name not in ACTIVATIONS:
            raise ModelFolderError(
                f"unsupported activation {act_name!r}: supported are {', '.join(ACTIVATIONS)}"
            )
        try:
            cfg = cls(
                hidden_size=int(raw.get("hidden_size", 768)),
                num_layers=int(raw.get("num_hidden_layers", 12)),
                num_heads=int(raw.get("num_attention_heads", 12)),
                intermediate_size=int(raw.get("intermediate_size", 3072)),
                activation=ACTIVATIONS[act_name],
                layer_norm_eps=float(raw.get("layer_norm_eps", 1e-12)),
                image_size=_pair(raw.get("image_size", 224), "image_size"),
                patch_size=_pair(raw.get("patch_size", 16), "patch_size"),
                num_channels=int(raw.get("num_channels", 3)),
                qkv_bias=bool(raw.get("qkv_bias", True)),
            )
        except (TypeError, ValueError) as err:
            if isinstance(err, ModelFolderError):
                raise
            raise ModelFolderError(f"config.json has a malformed field: {err}") from err
        sizes = ("hidden_size", "num_layers", "num_heads", "intermediate_size", "num_channels")
        for name in sizes:
            if getattr(cfg, name) < 1:
                raise ModelFolderError(
                    f"config.json gives {name}={getattr(cfg, name)}: must be >= 1"
                )
        if min(cfg.patch_size) < 1 or any(
            s < p or s % p for s, p in zip(cfg.image_size, cfg.patch_size, strict=True)
        ):
            raise ModelFolderError(
                f"image_size {list(cfg.image_size)} is not a positive multiple of patch_size "
                f"{list(cfg.patch_size)}: fix config.json"
            )
        if cfg.hidden_size % cfg.num_heads:
            raise ModelFolderError(
                f"hidden size {cfg.hidden_size} is not divisible by {cfg.num_heads} heads"
            )
        head_dim = raw.get("head_dim")
        if head_dim is not None and int(head_dim) != cfg.head_dim:
            raise ModelFolderError(
                f"head_dim {head_dim} != hidden_size / num_attention_heads = {cfg.head_dim}: "
                "not supported"
            )
        return cfg


@dataclasses.dataclass(frozen=True)
class ViTPreprocessor:
    """Pixel normalisation from ``preprocessor_config.json`` (HF ``ViTImageProcessor`` defaults)."""

    image_mean: tuple[float, ...] = (0.5, 0.5, 0.5)  # one per channel
    image_std: tuple[float, ...] = (0.5, 0.5, 0.5)
    do_normalize: bool = True
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    size: tuple[int, int] | None = None  # (height, width) the processor resizes to, if it says

    @property
    def intensity_scale(self) -> float:
        """Model-input value (before normalisation) of a full-white pixel (intensity 1)."""
        return 255.0 * self.rescale_factor if self.do_rescale else 255.0

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], num_channels: int) -> ViTPreprocessor:
        """Parse a ``preprocessor_config.json`` dict for a model with ``num_channels`` channels."""

        def per_channel(name: str, default: float) -> tuple[float, ...]:
            value = raw.get(name, default)
            values = [value] if isinstance(value, int | float) else value
            if not isinstance(values, list | tuple) or len(values) not in (1, num_channels):
                raise ModelFolderError(
                    f"preprocessor_config.json gives {name}={value!r}: expected a number or "
                    f"{num_channels} numbers"
                )
            out = tuple(float(v) for v in values)
            return out * num_channels if len(out) == 1 else out

        try:
            size = raw.get("size")
            if isinstance(size, Mapping) and "height" in size and "width" in size:
                size = (int(size["height"]), int(size["width"]))
            elif isinstance(size, int):
                size = (size, size)
            else:  # {"shortest_edge": ...} or absent: the model's image_size decides
                size = None
            pre = cls(
                image_mean=per_channel("image_mean", 0.5),
                image_std=per_channel("image_std", 0.5),
                do_normalize=bool(raw.get("do_normalize", True)),
                do_rescale=bool(raw.get("do_rescale", True)),
                rescale_factor=float(raw.get("rescale_factor", 1 / 255)),
                size=size,
            )
        except (TypeError, ValueError) as err:
            if isinstance(err, ModelFolderError):
                raise
            raise ModelFolderError(
                f"preprocessor_config.json has a malformed field: {err}"
            ) from err
        if pre.do_normalize and min(pre.image_std) <= 0:
            raise ModelFolderError(
                f"preprocessor_config.json image_std {pre.image_std} must be > 0"
            )
        if pre.do_rescale and pre.rescale_factor <= 0:
            raise ModelFolderError(f"rescale_factor {pre.rescale_factor} must be > 0")
        return pre


# --------------------------------------------------------------------------------------------
# Patch layout
# --------------------------------------------------------------------------------------------


def _patchify(x: jax.Array, patch: tuple[int, int]) -> jax.Array:
    """``[..., C, H, W] -> [..., N, C*ph*pw]``: row-major patch grid, each patch as (C, ph, pw).

    The same order as HF's ``Conv2d(stride=patch).flatten(2).transpose(1, 2)`` and as a flattened
    conv weight ``[D, C, ph, pw]``, so the patch embedding is ``patches @ W.reshape(D, -1).T``.
    """
    *lead, c, h, w = x.shape
    ph, pw = patch
    gh, gw = h // ph, w // pw
    x = x.reshape(*lead, c, gh, ph, gw, pw)
    n = len(lead)
    # (..., c, gh, ph, gw, pw) -> (..., gh, gw, c, ph, pw)
    x = jnp.moveaxis(x, (n, n + 1, n + 2, n + 3, n + 4), (n + 2, n, n + 3, n + 1, n + 4))
    return x.reshape(*lead, gh * gw, c * ph * pw)


def _unpatchify(
    p: jax.Array, patch: tuple[int, int], grid: tuple[int, int], channels: int
) -> jax.Array:
    """Inverse of :func:`_patchify`: ``[..., N, C*ph*pw] -> [..., C, H, W]``."""
    *lead, _, _ = p.shape
    ph, pw = patch
    gh, gw = grid
    x = p.reshape(*lead, gh, gw, channels, ph, pw)
    n = len(lead)
    # (..., gh, gw, c, ph, pw) -> (..., c, gh, ph, gw, pw)
    x = jnp.moveaxis(x, (n + 2, n, n + 3, n + 1, n + 4), (n, n + 1, n + 2, n + 3, n + 4))
    return x.reshape(*lead, channels, gh * ph, gw * pw)


# --------------------------------------------------------------------------------------------
# Flax modules
# --------------------------------------------------------------------------------------------


class _Embeddings(nn.Module):
    """Patch embedding (a patchify + matmul, i.e. the stride-p conv), [CLS], position embeddings."""

    config: ViTConfig
    dtype: Any

    @nn.compact
    def __call__(self, pixel_values: jax.Array) -> jax.Array:  # [B, C, H, W] -> [B, N+1, D]
        c, dt = self.config, self.dtype
        d = c.hidden_size
        init = nn.initializers.normal(0.02)
        cls_token = self.param("cls_token", init, (d,), dt)
        pos = self.param("position_embeddings", init, (c.num_patches + 1, d), dt)
        patches = _patchify(pixel_values.astype(dt), c.patch_size)  # [B, N, C*ph*pw]
        x = nn.Dense(d, dtype=dt, param_dtype=dt, name="patch_embedding")(patches)  # [B, N, D]
        cls = jnp.broadcast_to(cls_token.astype(x.dtype), (x.shape[0], 1, d))
        return jnp.concatenate([cls, x], axis=1) + pos.astype(x.dtype)


class _Block(nn.Module):
    """One pre-LayerNorm ViT block; the body of the layer scan. Returns ``(out, out)``."""

    config: ViTConfig
    dtype: Any

    @nn.compact
    def __call__(self, h: jax.Array, _: Any = None) -> tuple[jax.Array, jax.Array]:
        c, dt = self.config, self.dtype
        dense = functools.partial(nn.Dense, dtype=dt, param_dtype=dt)
        batch, length, _d = h.shape
        split = (batch, length, c.num_heads, c.head_dim)

        y = layer_norm(c.layer_norm_eps, dt, "layernorm_before")(h)
        q = dense(c.hidden_size, name="query")(y).reshape(split)  # [B, T, H, Dh]
        k = dense(c.hidden_size, name="key")(y).reshape(split)
        v = dense(c.hidden_size, name="value")(y).reshape(split)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) * (1.0 / math.sqrt(c.head_dim))
        # Softmax in float32 even for half-precision params (as HF does).
        probs = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(v.dtype)
        ctx = jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(batch, length, c.hidden_size)
        h = h + dense(c.hidden_size, name="attn_out")(ctx)

        y = layer_norm(c.layer_norm_eps, dt, "layernorm_after")(h)
        m = activation(c.activation)(dense(c.intermediate_size, name="mlp_in")(y))
        h = h + dense(c.hidden_size, name="mlp_out")(m)
        return h, h


class _ViTModule(nn.Module):
    """Embeddings then ``L`` blocks scanned over stacked params; returns all hidden states."""

    config: ViTConfig
    dtype: Any

    @nn.compact
    def __call__(self, pixel_values: jax.Array) -> jax.Array:  # [L+1, B, N+1, D]
        h0 = _Embeddings(self.config, self.dtype, name="embeddings")(pixel_values)
        scanned = nn.scan(
            _Block,
            variable_axes={"params": 0},  # params["blocks"] leaves: leading [L] axis
            split_rngs={"params": True},
            length=self.config.num_layers,
        )
        _, ys = scanned(self.config, self.dtype, name="blocks")(h0, None)
        return jnp.concatenate([h0[None], ys], axis=0)


@functools.partial(jax.jit, static_argnames=("config", "dtype"))
def _forward(params: Params, pixel_values: jax.Array, *, config: ViTConfig, dtype: Any):
    return _ViTModule(config, dtype).apply({"params": params}, pixel_values)


# --------------------------------------------------------------------------------------------
# ViT
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class ViT:
    """A loaded ViT: config, params pytree, preprocessor and pure functions.

    Not itself a pytree: pass ``vit.params`` (or a trained copy) to ``vit.apply``. ``eq=False``
    keeps hashing by identity, so bound methods such as ``vit.apply`` can be jitted.
    """

    config: ViTConfig
    params: Params  # {"embeddings": {...}, "blocks": {... leaves [L, ...]}}
    preprocessor: ViTPreprocessor = ViTPreprocessor()
    dtype: Any = jnp.float32
    path: pathlib.Path | None = None

    @property
    def num_layers(self) -> int:
        """L, the number of transformer blocks."""
        return self.config.num_layers

    # ---- forward ----------------------------------------------------------------------------

    def apply(self, params: Params, pixel_values: Any) -> jax.Array:
        """Pure forward pass: ``pixel_values [B, C, H, W]`` (normalised, as HF takes them) ->
        ``states [L+1, B, N+1, D]``: the embedding output, then each block's output, all before
        the final LayerNorm (HF ``hidden_states``). Differentiable and jittable."""
        pixel_values = jnp.asarray(pixel_values)
        c = self.config
        expected = (c.num_channels, *c.image_size)
        if pixel_values.ndim != 4 or tuple(pixel_values.shape[1:]) != expected:
            raise ModelFolderError(
                f"pixel_values has shape {list(pixel_values.shape)}, expected [B, "
                f"{', '.join(map(str, expected))}]: the position embeddings are for "
                f"{c.image_size[0]}x{c.image_size[1]} images (no interpolation); resize first "
                "(preprocess does)"
            )
        if not jnp.issubdtype(pixel_values.dtype, jnp.floating):
            pixel_values = pixel_values.astype(jnp.float32)
        return _forward(params, pixel_values, config=c, dtype=jnp.dtype(self.dtype))

    def __call__(self, pixel_values: Any) -> jax.Array:
        """``apply`` with the loaded params: ``[B, C, H, W] -> [L+1, B, N+1, D]``."""
        return self.apply(self.params, pixel_values)

    # ---- patches <-> images -----------------------------------------------------------------

    def patchify(self, images: Any) -> jax.Array:
        """``[..., C, H, W] -> [..., N, C*ph*pw]`` in the patch embedding's layout."""
        images = jnp.asarray(images)
        expected = (self.config.num_channels, *self.config.image_size)
        if images.ndim < 3 or tuple(images.shape[-3:]) != expected:
            raise ModelFolderError(
                f"images have shape {list(images.shape)}, expected [..., {expected}]"
            )
        return _patchify(images, self.config.patch_size)

    def unpatchify(self, patches: Any) -> jax.Array:
        """Inverse of :meth:`patchify`: ``[..., N, C*ph*pw] -> [..., C, H, W]`` (exact)."""
        patches = jnp.asarray(patches)
        c = self.config
        if patches.ndim < 2 or tuple(patches.shape[-2:]) != (c.num_patches, c.patch_dim):
            raise ModelFolderError(
                f"patches have shape {list(patches.shape)}, expected [..., {c.num_patches}, "
                f"{c.patch_dim}]"
            )
        return _unpatchify(patches, c.patch_size, c.grid, c.num_channels)

    def init_readout(self, key: jax.Array, scale: float = 1.0) -> Params:
        """A trainable linear readout ``{"kernel": [D, C*ph*pw], "bias": [C*ph*pw]}`` shared by
        all states: LeCun-normal kernel (std ``scale / sqrt(D)``), zero bias, in ``vit.dtype``."""
        d, p = self.config.hidden_size, self.config.patch_dim
        kernel = jax.random.normal(key, (d, p), jnp.float32) * (scale / math.sqrt(d))
        return {"kernel": kernel.astype(self.dtype), "bias": jnp.zeros((p,), self.dtype)}

    def readout(self, readout_params: Params, states: Any) -> jax.Array:
        """Read states back as images: ``[..., N+1, D] -> [..., C, H, W]`` (e.g. ``[L+1, B, N+1,
        D] -> [L+1, B, C, H, W]``), in the model's normalised pixel space (``postprocess`` maps
        it to intensities). Drops [CLS], maps every patch token through the shared linear
        readout to its ``C*ph*pw`` pixels and folds the patches back (:meth:`unpatchify`)."""
        states = jnp.asarray(states)
        c = self.config
        if states.ndim < 2 or tuple(states.shape[-2:]) != (c.num_patches + 1, c.hidden_size):
            raise ModelFolderError(
                f"states have shape {list(states.shape)}, expected [..., {c.num_patches + 1}, "
                f"{c.hidden_size}] (N+1 tokens with [CLS], D)"
            )
        patches = states[..., 1:, :] @ readout_params["kernel"] + readout_params["bias"]
        return _unpatchify(patches, c.patch_size, c.grid, c.num_channels)

    patches_to_pixels = readout  # the paper's name for reading states back as frames

    # ---- pixels -----------------------------------------------------------------------------

    def preprocess(self, frames: Any) -> jax.Array:
        """Gray frames ``[B, H, W]`` (uint8 0..255, or floats in [0, 1]) -> ``pixel_values [B, C,
        H', W']`` float32: bilinearly resized to the config's image_size (when different), gray
        repeated to C channels, then rescaled and normalised as the preprocessor says."""
        frames = jnp.asarray(frames)
        if frames.ndim != 3:
            raise ModelFolderError(
                f"frames have shape {list(frames.shape)}, expected [B, H, W] gray"
            )
        if jnp.issubdtype(frames.dtype, jnp.integer):
            intensity = frames.astype(jnp.float32) / 255.0
        else:
            intensity = frames.astype(jnp.float32)
        h, w = self.config.image_size
        if tuple(intensity.shape[1:]) != (h, w):
            intensity = jax.image.resize(intensity, (intensity.shape[0], h, w), "bilinear")
        pre = self.preprocessor
        x = intensity[:, None] * pre.intensity_scale  # [B, 1, H', W']
        x = jnp.repeat(x, self.config.num_channels, axis=1)
        if pre.do_normalize:
            mean = jnp.asarray(pre.image_mean, jnp.float32)[:, None, None]
            std = jnp.asarray(pre.image_std, jnp.float32)[:, None, None]
            x = (x - mean) / std
        return x

    def postprocess(self, pixel_values: Any, *, clip: bool = True) -> jax.Array:
        """Undo :meth:`preprocess`'s normalisation: ``[..., C, H, W] -> [..., H, W]`` gray
        intensities (mean over channels), clipped to [0, 1] unless ``clip=False``; multiply by
        255 for RMSE on the 0-255 scale."""
        x = jnp.asarray(pixel_values, jnp.float32)
        if x.ndim < 3 or x.shape[-3] != self.config.num_channels:
            raise ModelFolderError(
                f"pixel_values have shape {list(x.shape)}, expected [..., "
                f"{self.config.num_channels}, H, W]"
            )
        pre = self.preprocessor
        if pre.do_normalize:
            mean = jnp.asarray(pre.image_mean, jnp.float32)[:, None, None]
            std = jnp.asarray(pre.image_std, jnp.float32)[:, None, None]
            x = x * std + mean
        gray = jnp.mean(x, axis=-3) / pre.intensity_scale
        return jnp.clip(gray, 0.0, 1.0) if clip else gray


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------


class _Weights(_HFWeights):
    """HF state dict with a model prefix, giving named, shape-checked numpy tensors (the
    encoders' reader; ViT's query/key/value may have no bias, ``qkv_bias=False``)."""

    def dense(self, name: str, n_in: int, n_out: int, bias: bool = True) -> dict[str, np.ndarray]:
        if bias:
            return super().dense(name, n_in, n_out)
        # torch Linear stores weight as [out, in]; flax Dense kernels are [in, out].
        weight = self.get(f"{name}.weight", (n_out, n_in))
        return {"kernel": weight.T, "bias": np.zeros((n_out,), weight.dtype)}


def _find_prefix(tensors: Mapping[str, np.ndarray]) -> str:
    """The prefix before ``embeddings.`` ('' for ViTModel, 'vit.' for ViTForX checkpoints)."""
    return find_prefix(
        tensors,
        _PATCH_KEY,
        ("", "vit."),
        f"tensor {_PATCH_KEY!r} (optionally prefixed 'vit.') is missing from the checkpoint: it "
        "is not a ViT model; pass the folder of a ViT model, or the config.json that came with "
        "these weights",
    )


def _convert(weights: _Weights, config: ViTConfig) -> Params:
    """HF tensors -> our params tree (numpy): ``{"embeddings": ..., "blocks": [L]-stacked}``."""
    c = config
    d, f = c.hidden_size, c.intermediate_size
    conv = weights.get(_PATCH_KEY, (d, c.num_channels, *c.patch_size))  # [D, C, ph, pw]
    embeddings = {
        "cls_token": weights.get("embeddings.cls_token", (1, 1, d)).reshape(d),
        "position_embeddings": weights.get(
            "embeddings.position_embeddings", (1, c.num_patches + 1, d)
        ).reshape(c.num_patches + 1, d),
        "patch_embedding": {
            # Flattened in (C, ph, pw) order, the order _patchify lays out each patch.
            "kernel": conv.reshape(d, c.patch_dim).T,
            "bias": weights.get("embeddings.patch_embeddings.projection.bias", (d,)),
        },
    }
    v5 = weights.prefix + "layers.0.layernorm_before.weight" in weights.tensors
    names, layer_fmt = (_V5_BLOCK, "layers.{}.") if v5 else (_LEGACY_BLOCK, "encoder.layer.{}.")
    layers = []
    for i in range(c.num_layers):
        p = layer_fmt.format(i)
        layers.append(
            {
                "layernorm_before": weights.norm(p + names["layernorm_before"], d),
                "query": weights.dense(p + names["query"], d, d, c.qkv_bias),
                "key": weights.dense(p + names["key"], d, d, c.qkv_bias),
                "value": weights.dense(p + names["value"], d, d, c.qkv_bias),
                "attn_out": weights.dense(p + names["attn_out"], d, d),
                "layernorm_after": weights.norm(p + names["layernorm_after"], d),
                "mlp_in": weights.dense(p + names["mlp_in"], d, f),
                "mlp_out": weights.dense(p + names["mlp_out"], f, d),
            }
        )
    # Stack per leaf: [L, ...] so the layer scan slices one block's params per step.
    blocks = jax.tree.map(lambda *xs: np.stack(xs), *layers)
    return {"embeddings": embeddings, "blocks": blocks}


def load_vit(path: str | pathlib.Path, dtype: Any = jnp.float32) -> ViT:
    """Load a Hugging Face ViT folder into a :class:`ViT`.

    Reads ``config.json``, ``model.safetensors`` (or a sharded safetensors index) and, when
    present, ``preprocessor_config.json`` (else the ViT defaults: mean = std = 0.5, rescale
    1/255). A ``vit.`` prefix on tensor names (``ViTForImageClassification``,
    ``ViTForMaskedImageModeling``) is handled; the final LayerNorm, pooler, classifier head,
    decoder and mask token are ignored. Params are cast to ``dtype``. Raises
    :class:`ModelFolderError` with a one-line fix for every loading problem.
    """
    folder, config_file = model_folder(path)
    config = ViTConfig.from_dict(read_json(config_file))
    pre_file = folder / "preprocessor_config.json"
    preprocessor = (
        ViTPreprocessor.from_dict(read_json(pre_file), config.num_channels)
        if pre_file.is_file()
        else ViTPreprocessor(
            image_mean=(0.5,) * config.num_channels, image_std=(0.5,) * config.num_channels
        )
    )
    tensors, source = load_tensors(folder)
    weights = _Weights(tensors, _find_prefix(tensors), source)
    params = jax.tree.map(lambda a: jnp.asarray(a, dtype=dtype), _convert(weights, config))
    return ViT(config=config, params=params, preprocessor=preprocessor, dtype=dtype, path=folder)


def write_vit_folder(
    folder: str | pathlib.Path,
    *,
    image_size: int = 32,
    patch_size: int = 8,
    hidden_size: int = 32,
    num_layers: int = 2,
    num_heads: int = 2,
    intermediate_size: int = 64,
    num_channels: int = 3,
    seed: int = 0,
    std: float = 0.02,
) -> pathlib.Path:
    """Write a random-weight ViT in the Hugging Face layout (``config.json``,
    ``model.safetensors`` with ``ViTModel``'s tensor names, ``preprocessor_config.json``), as
    transformers' ``save_pretrained`` does (initialised the way transformers does: matrices
    ~ N(0, std), biases 0, LayerNorm weights 1), with no torch. It stands in for a pretrained
    ViT where none can be downloaded (the tiny Table 3 job) and reads back with
    :func:`load_vit`. Returns the folder."""
    import safetensors.numpy

    folder = pathlib.Path(folder).expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    d, f = hidden_size, intermediate_size
    n = (image_size // patch_size) ** 2

    def normal(*shape):
        return (std * rng.standard_normal(shape)).astype(np.float32)

    tensors = {
        "embeddings.cls_token": normal(1, 1, d),
        "embeddings.position_embeddings": normal(1, n + 1, d),
        _PATCH_KEY: normal(d, num_channels, patch_size, patch_size),
        "embeddings.patch_embeddings.projection.bias": np.zeros(d, np.float32),
        "layernorm.weight": np.ones(d, np.float32),
        "layernorm.bias": np.zeros(d, np.float32),
    }
    shapes = {"query": (d, d), "key": (d, d), "value": (d, d), "attn_out": (d, d)}
    shapes |= {"mlp_in": (f, d), "mlp_out": (d, f)}
    for i in range(num_layers):
        p = f"encoder.layer.{i}."
        for name in ("layernorm_before", "layernorm_after"):
            tensors[p + _LEGACY_BLOCK[name] + ".weight"] = np.ones(d, np.float32)
            tensors[p + _LEGACY_BLOCK[name] + ".bias"] = np.zeros(d, np.float32)
        for name, (n_out, n_in) in shapes.items():
            tensors[p + _LEGACY_BLOCK[name] + ".weight"] = normal(n_out, n_in)
            tensors[p + _LEGACY_BLOCK[name] + ".bias"] = np.zeros(n_out, np.float32)
    safetensors.numpy.save_file(tensors, str(folder / SAFETENSORS_FILE), metadata={"format": "pt"})
    config = {
        "model_type": "vit",
        "architectures": ["ViTModel"],
        "hidden_size": d,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads,
        "intermediate_size": f,
        "hidden_act": "gelu",
        "layer_norm_eps": 1e-12,
        "image_size": image_size,
        "patch_size": patch_size,
        "num_channels": num_channels,
        "qkv_bias": True,
        "initializer_range": std,
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    processor = {
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.5] * num_channels,
        "image_std": [0.5] * num_channels,
        "rescale_factor": 1 / 255,
        "size": {"height": image_size, "width": image_size},
        "image_processor_type": "ViTImageProcessor",
    }
    (folder / "preprocessor_config.json").write_text(
        json.dumps(processor, indent=2) + "\n", encoding="utf-8"
    )
    return folder
