"""The fused readout cross-entropy of :func:`cudt.lm_loss.response_token_losses`.

:func:`fused_readout` reads packed rows out through the LM head in buckets and gives each
row's cross-entropy and hit, as a ``jax.custom_vjp`` whose backward is written out: it reuses
the forward's logits where they were kept, recomputes the others, and skips every bucket whose
rows get no gradient. :func:`row_stats` is the per-row log-sum-exp, label logit and hit that
every readout of :mod:`cudt.lm_loss` shares.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero

__all__ = ["fused_readout", "head_logits", "row_stats"]


def head_logits(x: jax.Array, head_t: jax.Array) -> jax.Array:
    """``x [C, D] @ head_tᵀ`` with ``head_t [V, D]``: float32 logits (the forward's, and the
    backward's when it recomputes them). The loops take the head as ``[V, D]``: a tied head is
    the embedding table transposed, and XLA folds ``transpose(transpose(table))`` outside the
    loop, where a ``[D, V]`` operand inside it cost a copy of the table every step
    (``python -m benchmarks llm``'s profile, docs/speed.md)."""
    return jnp.einsum("cd,vd->cv", x, head_t, preferred_element_type=jnp.float32)


@functools.cache
def fused_readout(bucket: int, kept: int) -> Callable:
    """``(normed [S, C, D], head [D, V], labels [C], count []) -> (ce, correct) [S, C]``: the
    readout cross-entropy of the first ``count`` packed rows of every state (rows ``r <
    S·count`` of the layer-major order, ``r -> (r // count, r % count)``), in buckets of
    ``bucket`` rows; the rest are 0 / False. A ``jax.custom_vjp``: the backward is written out
    (see :func:`cudt.lm_loss.response_token_losses`). The forward keeps the logits of buckets ``k < kept``
    for the backward, which recomputes the others'."""

    @jax.custom_vjp
    def readout(normed, head, labels, count):
        ce, hit, _, _ = _readout_forward(bucket, normed, head, labels, count, keep=0)
        return ce, hit

    def readout_fwd(normed, head, labels, count):
        trained = head.perturbed
        normed, head, labels, count = (a.value for a in (normed, head, labels, count))
        ce, hit, saved, saved_lse = _readout_forward(bucket, normed, head, labels, count, kept)
        # the head's gradient is taken only where the head is trained: the residuals' last
        # entry is an empty array then, None (no leaf) for a frozen head
        flag = jnp.zeros((0,)) if trained else None
        return (ce, hit), (normed, head, labels, count, saved, saved_lse, flag)

    def readout_bwd(res, cts):
        return _readout_backward(bucket, kept, res, cts)

    readout.defvjp(readout_fwd, readout_bwd, symbolic_zeros=True)
    return readout


def _bucket_places(
    bucket: int, k: jax.Array, num_states: int, count: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Bucket ``k``'s rows as ``(layer, pos, valid)`` ``[bucket]`` each; the padding rows past
    ``S·count`` get layer ``S`` (out of range: scatters drop them)."""
    r = k * bucket + jnp.arange(bucket)
    per = jnp.maximum(count, 1)
    valid = r < num_states * count
    return jnp.where(valid, r // per, num_states), r % per, valid


def _num_buckets(bucket: int, num_states: int, count: jax.Array) -> jax.Array:
    return (num_states * count + bucket - 1) // bucket


def _readout_forward(
    bucket: int, normed: jax.Array, head: jax.Array, labels: jax.Array, count, keep: int
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """``(ce, hit, saved logits, saved lse)`` of :func:`fused_readout`'s forward. Two loops,
    each over a traced number of buckets: the first ``keep`` buckets, whose logits are written
    into the kept buffer, then the rest (none when ``keep`` covers the capacity: the second
    loop is not built)."""
    num_states, cap, _ = normed.shape
    vocab = head.shape[1]
    most = math.ceil(num_states * cap / bucket)
    keep = min(keep, most)
    head_t = jnp.transpose(head)  # [V, D], see head_logits

    def body(k, carry):
        ce, hit, *held = carry
        layer, pos, _ = _bucket_places(bucket, k, num_states, count)
        x = normed[jnp.minimum(layer, num_states - 1), pos]  # [bucket, D]
        lab = labels[pos]
        logits = head_logits(x, head_t)
        lse, label_logit, is_top = row_stats(logits, lab)
        ce = ce.at[layer, pos].set(lse - label_logit, mode="drop")
        hit = hit.at[layer, pos].set(is_top, mode="drop")
        if held:
            saved, saved_lse = held
            saved = jax.lax.dynamic_update_slice(saved, logits, (k * bucket, 0))
            saved_lse = jax.lax.dynamic_update_slice(saved_lse, lse, (k * bucket,))
            return ce, hit, saved, saved_lse
        return ce, hit

    nb = _num_buckets(bucket, num_states, count)
    ce = jnp.zeros((num_states, cap), jnp.float32)
    hit = jnp.zeros((num_states, cap), bool)
    saved = jnp.zeros((keep * bucket, vocab if keep else 0), jnp.float32)
    saved_lse = jnp.zeros((keep * bucket,), jnp.float32)
    if keep:
        ce, hit, saved, saved_lse = jax.lax.fori_loop(
            0, jnp.minimum(nb, keep), body, (ce, hit, saved, saved_lse)
        )
    if keep < most:
        ce, hit = jax.lax.fori_loop(jnp.minimum(nb, keep), nb, body, (ce, hit))
    return ce, hit, saved, saved_lse


def _readout_backward(bucket: int, kept: int, res: tuple, cts: tuple) -> tuple:
    """:func:`fused_readout`'s backward: ``dL/dz = g·(softmax − onehot)`` per row, then
    ``dL/dnormed = dL/dz · headᵀ`` and, for a trained head, ``dL/dhead = normedᵀ · dL/dz``,
    over the buckets with a nonzero cotangent only (the kept ones from their saved logits)."""
    normed, head, labels, count, saved, saved_lse, flag = res
    g_ce = cts[0]
    trained = flag is not None
    if isinstance(g_ce, SymbolicZero):
        return (jnp.zeros_like(normed), jnp.zeros_like(head) if trained else None, None, None)
    num_states, cap, _ = normed.shape
    vocab = head.shape[1]
    ids = jnp.arange(vocab, dtype=labels.dtype)
    # [V, D], once for every bucket, in the type the forward's product took: a float32 state
    # times a bfloat16 head (a frozen bfloat16 base, float32 compute) is float32, and rounding
    # dz to the head's bfloat16 moved the state gradient 2.5e-3 (relative) from the naive one
    ct = jnp.promote_types(normed.dtype, head.dtype)
    head_t = jnp.transpose(head).astype(ct)
    most = math.ceil(num_states * cap / bucket)
    keep = min(kept, most)

    def row_grads(k):  # bucket k's rows and their cotangents (0 on the padding)
        layer, pos, valid = _bucket_places(bucket, k, num_states, count)
        return layer, pos, jnp.where(valid, g_ce[jnp.minimum(layer, num_states - 1), pos], 0.0)

    # only the buckets with a nonzero cotangent, listed first and looped over: no branch
    # inside the loop (XLA:CPU copied a conditional's operands, the head among them, into
    # the branch at every bucket: python -m benchmarks llm's profile, docs/speed.md); one
    # loop over the kept buckets, one over the others, whose logits are recomputed
    ks = jnp.arange(most)
    wanted = jnp.any(jax.vmap(row_grads)(ks)[2] != 0, axis=1) & (
        ks < _num_buckets(bucket, num_states, count)
    )

    def loop(carry, from_saved):
        part = wanted & ((ks < keep) if from_saved else (ks >= keep))
        (order,) = jnp.nonzero(part, size=keep if from_saved else most - keep, fill_value=0)

        def body(i, carry):
            d_normed, d_head = carry
            k = order[i]
            layer, pos, g = row_grads(k)
            x = normed[jnp.minimum(layer, num_states - 1), pos]  # [bucket, D]
            if from_saved:
                logits = jax.lax.dynamic_slice(saved, (k * bucket, 0), (bucket, vocab))
                lse = jax.lax.dynamic_slice(saved_lse, (k * bucket,), (bucket,))
            else:
                logits = head_logits(x, head_t)
                lse = jax.nn.logsumexp(logits, axis=-1)
            dz = _logits_cotangent(logits, lse, labels[pos], g, ids)  # [bucket, V] float32
            dx = jnp.dot(dz.astype(ct), head_t, preferred_element_type=jnp.float32)
            d_normed = d_normed.at[layer, pos].add(dx, mode="drop")
            if trained:
                # in that type too (a bfloat16 state times a float32 head: float32), not
                # rounding dz to the state's bfloat16
                d_head = d_head + jnp.dot(
                    x.T.astype(ct), dz.astype(ct), preferred_element_type=jnp.float32
                )
            return d_normed, d_head

        return jax.lax.fori_loop(0, jnp.sum(part), body, carry)

    carry = (
        jnp.zeros(normed.shape, jnp.float32),
        jnp.zeros(head.shape, jnp.float32) if trained else None,
    )
    if keep:
        carry = loop(carry, from_saved=True)
    if keep < most:
        carry = loop(carry, from_saved=False)
    d_normed, d_head = carry
    return (
        d_normed.astype(normed.dtype),
        d_head.astype(head.dtype) if trained else None,
        None,
        None,
    )


def _logits_cotangent(
    logits: jax.Array, lse: jax.Array, lab: jax.Array, g: jax.Array, ids: jax.Array
) -> jax.Array:
    """``dL/dz = g·(softmax(logits) − onehot(lab))`` ``[bucket, V]`` float32 of rows with
    cross-entropy cotangents ``g [bucket]``."""
    # where, not a product: a row without gradient adds exactly 0 (also a NaN row)
    return jnp.where(
        (g != 0)[:, None],
        g[:, None] * (jnp.exp(logits - lse[:, None]) - (ids == lab[:, None])),
        0.0,
    )


def row_stats(logits: jax.Array, labels: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``logits [C, V]``, ``labels [C]`` -> ``(lse, label_logit, correct) [C]``: the
    log-sum-exp, the label's logit and ``argmax(logits) == label`` (ties to the lowest id).

    The argmax is not computed: the label is the argmax exactly when its logit is the row's
    maximum and no lower id reaches it. XLA:CPU's variadic (value, index) reduce is several
    times slower than a plain maximum, and the maximum is the log-sum-exp's anyway
    (``python -m benchmarks llm`` times the step, docs/speed.md)."""
    top = jnp.max(logits, axis=-1)  # [C]
    shift = jax.lax.stop_gradient(jnp.where(jnp.isfinite(top), top, 0.0))
    lse = shift + jnp.log(jnp.sum(jnp.exp(logits - shift[:, None]), axis=-1))
    label_logit = jnp.take_along_axis(logits, labels[:, None], axis=-1)[:, 0]
    ids = jnp.arange(logits.shape[-1], dtype=labels.dtype)
    earlier_tie = jnp.any((logits == top[:, None]) & (ids < labels[:, None]), axis=-1)
    return lse, label_logit, (label_logit == top) & ~earlier_tie
