"""The pure building blocks of a Llama-family decoder, shared by the forward and generation.

Rotary embeddings (default and ``llama3`` scaling, float32 angles), RMSNorm with float32
statistics, grouped-query causal attention with an optional sliding window, the SwiGLU MLP, the
scan over the ``[L]``-stacked blocks (with optional rematerialisation), and the readout (final
norm + LM head, float32 logits). Params are cast to the compute dtype one layer at a time inside
the scan (mixed precision without a full-size copy).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cudt.models.llama.config import DecoderConfig, Params

NEG = float(np.finfo(np.float32).min)  # masked attention score: finite, so never NaN


def inv_freq(c: DecoderConfig) -> np.ndarray:
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


def rotary(positions: jax.Array, c: DecoderConfig, dtype: Any) -> tuple[jax.Array, jax.Array]:
    """``cos, sin [B, T, Dh]`` of integer ``positions [B, T]``: angles in float32, then cast."""
    freqs = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq(c))
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb).astype(dtype), jnp.sin(emb).astype(dtype)


def rotate(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotary embedding of ``x [B, T, N, Dh]`` (the rotate-half layout of HF checkpoints)."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[:, :, None] + rotated * sin[:, :, None]


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """RMSNorm with float32 statistics (float64 ones for float64 ``x``); the result in
    ``x.dtype`` times the weight."""
    xf = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return weight.astype(x.dtype) * y.astype(x.dtype)


def linear(x: jax.Array, p: Mapping[str, jax.Array]) -> jax.Array:
    y = x @ p["kernel"]
    if "lora_a" in p:  # a LoRA adapter, its scale in lora_b (cudt.models.llama.lora.adapted)
        y = y + (x @ p["lora_a"]) @ p["lora_b"]
    return y + p["bias"] if "bias" in p else y


def cast(tree: Any, dtype: Any) -> Any:
    return jax.tree.map(lambda a: a.astype(dtype), tree)


def attention_allowed(
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


def attention(
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
    wide = jnp.promote_types(q.dtype, jnp.float32)  # float32 scores at least
    scores = jnp.einsum("btkgd,bskd->bkgts", q, k, preferred_element_type=wide)
    scores = scores * (c.head_dim**-0.5)
    scores = jnp.where(allowed[:, None, None], scores, NEG)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    ctx = jnp.einsum("bkgts,bskd->btkgd", probs, v).reshape(b, t, c.num_heads * c.head_dim)
    return linear(ctx, p["o"])


def qkv(
    p: Params, y: jax.Array, cos: jax.Array, sin: jax.Array, c: DecoderConfig
) -> tuple[jax.Array, jax.Array, jax.Array]:
    b, t, _ = y.shape
    q = linear(y, p["q"]).reshape(b, t, c.num_heads, c.head_dim)
    k = linear(y, p["k"]).reshape(b, t, c.num_kv_heads, c.head_dim)
    v = linear(y, p["v"]).reshape(b, t, c.num_kv_heads, c.head_dim)
    return rotate(q, cos, sin), rotate(k, cos, sin), v


def mlp(p: Params, x: jax.Array, c: DecoderConfig) -> jax.Array:
    y = rms_norm(x, p["mlp_norm"], c.rms_norm_eps)
    return linear(jax.nn.silu(linear(y, p["gate"])) * linear(y, p["up"]), p["down"])


def run_blocks(
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
    intermediates nor the per-layer compute-dtype copies of the weights. Without it autodiff
    keeps the outputs of the projections (the products without batch dimensions) and recomputes
    the elementwise work between them (norms, rotary, SiLU, softmax, casts) and the small
    attention products in the backward: each kept intermediate is an ``[L, ...]`` stack that
    the forward zero-fills and writes and the backward reads, which cost more than recomputing
    it (SmolLM2's constrained step: 24 % less temporary memory, less CPU time; docs/speed.md)."""
    cos, sin = rotary(positions, c, dtype)
    allowed = attention_allowed(key_valid, jnp.arange(x.shape[1]), c)

    def block(h: jax.Array, p: Params) -> tuple[jax.Array, tuple[jax.Array, ...]]:
        p = cast(p, dtype)  # one layer at a time: mixed precision without a full-size copy
        q, k, v = qkv(p, rms_norm(h, p["attn_norm"], c.rms_norm_eps), cos, sin, c)
        h = h + attention(p, q, k, v, allowed, c)
        h = h + mlp(p, h, c)
        return h, (h, k, v)

    policies = jax.checkpoint_policies
    saved = policies.nothing_saveable if remat else policies.dots_with_no_batch_dims_saveable
    body = jax.checkpoint(block, policy=saved)
    with jax.named_scope("blocks"):  # profiles name the blocks' operations by this scope
        _, (states, keys, values) = jax.lax.scan(body, x, blocks)
    return states, keys, values


def default_positions(attention_mask: jax.Array) -> jax.Array:
    """``max(cumsum(mask) - 1, 0)``: 0, 1, ... over real tokens; pads get 0 (as HF generate)."""
    return jnp.maximum(jnp.cumsum(attention_mask.astype(jnp.int32), axis=1) - 1, 0)


def embed_tokens(params: Params, input_ids: jax.Array, dtype: Any) -> jax.Array:
    return jnp.take(params["embed"], input_ids, axis=0).astype(dtype)


def head_matrix(params: Params, config: DecoderConfig) -> jax.Array:
    return params["embed"].T if config.tie_word_embeddings else params["lm_head"]


def readout_logits(
    params: Params, states: jax.Array, config: DecoderConfig, dtype: Any
) -> jax.Array:
    # the head as the params hold it, as the per-layer losses read it (cudt.lm_readout): with
    # bfloat16 compute over float32 params the product is float32, so greedy generation picks
    # the tokens whose scores the token accuracy counts
    x = rms_norm(states.astype(dtype), params["final_norm"], config.rms_norm_eps)
    head = head_matrix(params, config)
    wide = jnp.promote_types(x.dtype, jnp.float32)  # float32 logits at least
    return jnp.einsum("...d,dv->...v", x, head, preferred_element_type=wide)
