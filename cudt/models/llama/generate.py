"""Greedy decoding with a fixed-size KV cache, one compiled program (:meth:`Decoder.generate`).

Prompts are rolled so each row's last real token is last (right padding becomes left padding),
the prompt fills slots ``[0, T)`` of a ``[L, B, T + N, K, Dh]`` cache in one prefill, then one
``jax.lax.scan`` step per new token; optional Gaussian noise on every input embedding.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from cudt.models.llama.config import DecoderConfig, Params
from cudt.models.llama.layers import (
    attention,
    attention_allowed,
    cast,
    default_positions,
    embed_tokens,
    mlp,
    qkv,
    readout_logits,
    rms_norm,
    rotary,
    run_blocks,
)

__all__ = ["greedy_generate"]


def _left_align(input_ids: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Roll every row so its last real token sits in the last slot (right padding -> left)."""
    length = input_ids.shape[1]
    last = length - 1 - jnp.argmax(mask[:, ::-1], axis=1)  # [B] slot of the last real token
    src = (jnp.arange(length)[None, :] - (length - 1 - last)[:, None]) % length
    return jnp.take_along_axis(input_ids, src, axis=1), jnp.take_along_axis(mask, src, axis=1)


@functools.partial(
    jax.jit, static_argnames=("config", "dtype", "max_new_tokens", "eos_id", "pad_id")
)
def greedy_generate(
    params: Params,
    input_ids: jax.Array,  # [B, T]
    attention_mask: jax.Array,  # [B, T]
    noise_std: jax.Array,  # [] float32
    key: jax.Array | None,
    *,
    config: DecoderConfig,
    dtype: Any,
    max_new_tokens: int,
    eos_id: tuple[int, ...],  # every id that ends a row (none: every row runs to the end)
    pad_id: int,
) -> jax.Array:  # [B, max_new_tokens]
    c = config
    batch, length = input_ids.shape
    slots = length + max_new_tokens
    ids, mask = _left_align(input_ids, attention_mask != 0)
    positions = default_positions(mask)
    noise = None
    if key is not None:  # slot s of row b gets noise[b, s], prompt and generated tokens alike
        noise = noise_std * jax.random.normal(key, (batch, slots, c.hidden_size), jnp.float32)

    def embed(tokens: jax.Array, start: int | jax.Array, size: int) -> jax.Array:
        x = embed_tokens(params, tokens, dtype)
        if noise is not None:
            x = x + jax.lax.dynamic_slice_in_dim(noise, start, size, axis=1).astype(dtype)
        return x

    def next_token(h: jax.Array) -> jax.Array:  # [B, D] -> [B]
        return jnp.argmax(readout_logits(params, h, c, dtype), axis=-1).astype(input_ids.dtype)

    # Prefill: the prompt's keys/values go to slots [0, T) of a fixed-size cache.
    states, keys, values = run_blocks(
        params["blocks"], embed(ids, 0, length), positions, mask, c, dtype
    )
    pad_slots = ((0, 0), (0, 0), (0, max_new_tokens), (0, 0), (0, 0))
    k_cache, v_cache = jnp.pad(keys, pad_slots), jnp.pad(values, pad_slots)  # [L, B, S, K, Dh]
    valid = jnp.pad(mask, ((0, 0), (0, max_new_tokens)))  # [B, S]
    first = next_token(states[-1, :, -1])
    stops = jnp.asarray(eos_id, input_ids.dtype)

    def ends(token: jax.Array) -> jax.Array:  # [B] -> [B] bool
        return jnp.any(token[:, None] == stops[None, :], axis=-1)

    done = ends(first)

    def step(carry: tuple[jax.Array, ...], i: jax.Array) -> tuple[tuple[jax.Array, ...], jax.Array]:
        k_cache, v_cache, valid, token, done = carry
        slot = length + i
        valid = jax.lax.dynamic_update_slice(valid, jnp.ones((batch, 1), bool), (0, slot))
        pos = positions[:, -1:] + 1 + i  # [B, 1]
        cos, sin = rotary(pos, c, dtype)
        allowed = attention_allowed(valid, slot[None], c)  # [B, 1, S]

        def block(h: jax.Array, layer: tuple[Params, jax.Array, jax.Array]):
            p, k_l, v_l = layer
            p = cast(p, dtype)
            q, k, v = qkv(p, rms_norm(h, p["attn_norm"], c.rms_norm_eps), cos, sin, c)
            k_l = jax.lax.dynamic_update_slice(k_l, k, (0, slot, 0, 0))
            v_l = jax.lax.dynamic_update_slice(v_l, v, (0, slot, 0, 0))
            h = h + attention(p, q, k_l, v_l, allowed, c)
            return h + mlp(p, h, c), (k, v)

        h, (k_new, v_new) = jax.lax.scan(
            block, embed(token[:, None], slot, 1), (params["blocks"], k_cache, v_cache)
        )
        k_cache = jax.lax.dynamic_update_slice(k_cache, k_new, (0, 0, slot, 0, 0))
        v_cache = jax.lax.dynamic_update_slice(v_cache, v_new, (0, 0, slot, 0, 0))
        out = jnp.where(done, pad_id, next_token(h[:, -1]))
        done = done | ends(out)
        return (k_cache, v_cache, valid, out, done), out

    carry = (k_cache, v_cache, valid, first, done)
    _, rest = jax.lax.scan(step, carry, jnp.arange(max_new_tokens - 1))  # [N-1, B]
    return jnp.concatenate([first[:, None], rest.T], axis=1)
