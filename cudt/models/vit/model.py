"""The forward of a ViT, read back as a per-layer image denoiser: patch layout, flax modules,
and :class:`ViT` (config, params, preprocessor and pure functions).

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
"""

from __future__ import annotations

import dataclasses
import functools
import math
import pathlib
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from cudt.models.hf import (
    FolderModel,
    ModelFolderError,
    Params,
    activation,
    layer_norm,
    self_attention,
)
from cudt.models.vit.config import ViTConfig, ViTPreprocessor

__all__ = ["ViT"]


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
        y = layer_norm(c.layer_norm_eps, dt, "layernorm_before")(h)
        h = h + self_attention(y, c.num_heads, dt)

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
class ViT(FolderModel[ViTConfig]):
    """A loaded ViT: config, params pytree (``{"embeddings": {...}, "blocks": {... leaves [L,
    ...]}}``), preprocessor and pure functions (see :class:`~cudt.models.hf.FolderModel`)."""

    preprocessor: ViTPreprocessor = ViTPreprocessor()
    dtype: Any = jnp.float32
    path: pathlib.Path | None = None

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
