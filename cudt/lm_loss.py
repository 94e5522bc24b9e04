"""Per-layer language-model losses without materialising every layer's logits.

A decoder returns its residual stream before the final norm, ``states [L+1, B, T, D]``; each
state is read out with the model's own final norm and LM head, ``norm_fn(state) @ head`` with
``head [D, V]`` (METHOD.md, "Language modelling"). The per-layer loss of sample ``b`` at layer
``l`` is the mean token cross-entropy of that readout over the response tokens:

    ce[b, l]  = Σ_t m[b, t] · CE(logits[l, b, t], labels[b, t]) / Σ_t m[b, t]
    acc[b, l] = Σ_t m[b, t] · [argmax logits[l, b, t] == labels[b, t]] / Σ_t m[b, t]

with ``labels[b, t]`` the next token and ``m = loss_mask`` (1 on response tokens, 0 on prompt
and padding). Conventions shared by both functions here:

* A sample with no response tokens (``Σ_t m[b, t] = 0``) gets loss 0 and accuracy 0, with zero
  gradient: it neither contributes nor produces a NaN.
* Positions with mask 0 contribute nothing, and their labels are ignored (any value, e.g. the
  Hugging Face ``-100``). A label outside ``[0, V)`` at a position with mask != 0 makes that
  sample's loss NaN (a loud signal, since traced labels cannot be checked) and its accuracy 0.
* Logits, log-sum-exp and the losses are float32, also for bfloat16 states and head (the head
  matmul accumulates in float32). Ties in the argmax go to the lowest token id.

:func:`naive_layer_token_losses` builds the ``[L+1, B, T, V]`` logits: the reference, fine for
small models. :func:`layer_token_losses` gives the same values and gradients while holding one
chunk of logits at a time, forward and backward: at Llama-3 sizes (L = 32, V = 128256) the full
logits of one 4 x 512-token batch are 33 x 2048 x 128256 float32 = 35 GB.
:func:`response_token_losses` (the LLM task's) gives them too, reading out exactly the response
tokens (a packed gather, rows processed in buckets: padding costs less than one bucket) through
a fused cross-entropy whose backward reuses the forward's logits wherever they fit in memory
and skips every bucket whose rows get no gradient (an ERM run's intermediate readouts, a
constraint whose multipliers are 0).
"""

from __future__ import annotations

import functools
import math
import numbers
import os
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from cudt.errors import UsageError
from cudt.lm_readout import fused_readout, row_stats

__all__ = [
    "default_bucket_tokens",
    "default_chunk_tokens",
    "keeps_logits",
    "layer_token_losses",
    "naive_layer_token_losses",
    "response_capacities",
    "response_keep_tokens",
    "response_span",
    "response_token_losses",
]

NormFn = Callable[[jax.Array], jax.Array]


def naive_layer_token_losses(
    states: jax.Array,
    norm_fn: NormFn,
    head: jax.Array,
    labels: jax.Array,
    loss_mask: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """Per-sample per-layer token cross-entropy and accuracy, the direct way (the reference).

    Args:
      states: ``[L+1, B, T, D]`` every layer's residual stream, before the final norm.
      norm_fn: the final norm, ``[..., D] -> [..., D]``, acting on the last axis only.
      head: ``[D, V]`` the LM head (may be a traced parameter).
      labels: ``[B, T]`` integer next-token ids.
      loss_mask: ``[B, T]`` 1 on response tokens, 0 elsewhere (bool or numeric).

    Returns:
      ``(ce [B, L+1], acc [B, L+1])`` float32 (see the module docstring for the conventions).
      Materialises ``[L+1, B, T, V]`` float32 logits; use :func:`layer_token_losses` at scale.
    """
    vocab = _check(states, head, labels, loss_mask)
    logits = jnp.einsum(
        "lbtd,dv->lbtv", norm_fn(states), head, preferred_element_type=jnp.float32
    )  # [L+1, B, T, V]
    safe = _safe_labels(labels, loss_mask, vocab)  # [B, T]
    rows = jnp.broadcast_to(safe, logits.shape[:-1])  # [L+1, B, T]
    label_logit = jnp.take_along_axis(logits, rows[..., None], axis=-1)[..., 0]
    ce = jax.nn.logsumexp(logits, axis=-1) - label_logit  # [L+1, B, T]
    correct = jnp.argmax(logits, axis=-1) == rows  # [L+1, B, T]
    return _per_sample(ce, correct, labels, loss_mask, vocab)


def layer_token_losses(
    states: jax.Array,
    norm_fn: NormFn,
    head: jax.Array,
    labels: jax.Array,
    loss_mask: jax.Array,
    *,
    chunk_tokens: int = 512,
    vocab_chunk: int | None = None,
    response_tokens: int | None = None,
) -> tuple[jax.Array, jax.Array]:
    """:func:`naive_layer_token_losses`, holding at most one chunk of logits at a time.

    With ``response_tokens = R`` only ``R`` positions of each sample are read out: the window
    that starts at its first position with mask != 0 (moved left to fit in ``T``), so a
    prompt-heavy batch pays for ``(L+1)·B·R`` readouts instead of ``(L+1)·B·T``. It gives the
    same values and gradients whenever every sample's masked positions lie within ``R`` of its
    first one (``R >= response_span(loss_mask)``, which instruction data meets: the response is
    one contiguous run); a sample with a masked position outside its window gets a NaN loss,
    loudly, rather than a silently smaller mean.

    The ``(L+1)·B·T`` rows of ``states`` (layer-major, then sample, then token) are processed
    ``chunk_tokens`` rows at a time by a ``jax.lax.scan`` whose body is ``jax.checkpoint``-ed:
    the forward keeps only each chunk's per-row cross-entropy and hit (two floats a row), and
    the backward recomputes one chunk's ``[chunk_tokens, V]`` float32 logits at a time from the
    states (rematerialisation: about one extra forward matmul). When ``chunk_tokens`` covers
    every row there is one chunk and no rematerialisation: the backward reuses the logits
    (``(L+1)·B·T x V`` float32 held from the forward to the backward), two head matmuls per
    row instead of three. With ``vocab_chunk`` the
    vocabulary is chunked too, inside each row chunk, with an online log-sum-exp and argmax, so
    the largest logits block is ``[chunk_tokens, vocab_chunk]`` (each block is a slice of the
    head, not a copy). Worth it when a few ``chunk_tokens x V`` float32 buffers weigh more
    than the head's own gradient ``[D, V]``, which the backward holds whole in any case.

    Neither size needs to divide its axis. The rows go into ``n = ceil(rows / chunk_tokens)``
    chunks of equal size ``ceil(rows / n)`` (at most ``chunk_tokens``), padded by fewer than
    ``n`` rows, which repeat the last row (real values, so ``norm_fn`` sees no artificial
    zeros); the padded rows' results are dropped: they get exactly zero gradient. When ``n``
    divides ``(L+1)·B·T`` the states are only reshaped, not copied. The last vocabulary block is the
    head's last ``vocab_chunk`` columns, with those already seen set to -inf. Values and
    gradients (w.r.t. the states, the head and anything ``norm_fn`` closes over) equal the
    naive version's up to float32 summation order.

    The gradients of the head and of ``norm_fn``'s parameters are sums over the chunks; for a
    bfloat16 (or float16) head or norm scale they are summed in float32 and rounded once,
    which costs one float32 copy of the head next to its float32 gradient sum.

    Args:
      states, norm_fn, head, labels, loss_mask: as in :func:`naive_layer_token_losses`;
        ``norm_fn`` is applied to ``[chunk_tokens, D]`` blocks, so it must act row by row.
      chunk_tokens: rows of the flattened (layer, sample, token) axis per chunk (clipped to the
        row count). Peak logits memory is a few ``chunk_tokens x V`` float32 buffers.
      vocab_chunk: vocabulary entries per block (clipped to V), or None for the whole
        vocabulary at once.
      response_tokens: positions per sample to read out (clipped to T), or None for all.

    Returns:
      ``(ce [B, L+1], acc [B, L+1])`` float32.
    """
    vocab = _check(states, head, labels, loss_mask)
    if not _positive_int(chunk_tokens):
        raise UsageError(f"chunk_tokens must be a positive int, got {chunk_tokens!r}")
    if vocab_chunk is not None and not _positive_int(vocab_chunk):
        raise UsageError(f"vocab_chunk must be a positive int or None, got {vocab_chunk!r}")
    if response_tokens is not None:
        if not _positive_int(response_tokens):
            raise UsageError(
                f"response_tokens must be a positive int or None, got {response_tokens!r}"
            )
        states, labels, loss_mask = _response_window(states, labels, loss_mask, response_tokens)
    shape = states.shape[:3]  # (L+1, B, T)
    num_rows = math.prod(shape)
    rows, row_labels = _row_chunks(states, labels, loss_mask, vocab, int(chunk_tokens))
    if vocab_chunk is None or vocab_chunk >= vocab:
        readout = _rows_full_vocab
    else:
        readout = functools.partial(_rows_vocab_chunked, vocab_chunk=int(vocab_chunk))
    ce, correct = _chunked_readout(readout, norm_fn, head, rows, row_labels)
    ce = ce.reshape(-1)[:num_rows].reshape(shape)
    correct = correct.reshape(-1)[:num_rows].reshape(shape)
    return _per_sample(ce, correct, labels, loss_mask, vocab)


def _row_chunks(
    states: jax.Array, labels: jax.Array, loss_mask: jax.Array, vocab: int, chunk_tokens: int
) -> tuple[jax.Array, jax.Array]:
    """The ``(L+1)·B·T`` rows of ``states`` and their safe labels in ``n`` equal chunks,
    ``[n, C, D]`` and ``[n, C]``, padded by repeating the last row (see
    :func:`layer_token_losses`)."""
    num_states, batch, seq, dim = states.shape
    num_rows = num_states * batch * seq
    # as few chunks as chunk_tokens allows, of equal size: fewer padded rows than chunks (a
    # fixed size of chunk_tokens could pad almost a whole chunk of readouts over V)
    num_chunks = math.ceil(num_rows / min(chunk_tokens, num_rows))
    chunk = math.ceil(num_rows / num_chunks)
    pad = num_chunks * chunk - num_rows

    rows = states.reshape(num_rows, dim)
    safe = _safe_labels(labels, loss_mask, vocab)
    row_labels = jnp.broadcast_to(safe, (num_states, batch, seq)).reshape(num_rows)
    if pad:
        rows = jnp.pad(rows, ((0, pad), (0, 0)), mode="edge")
        row_labels = jnp.pad(row_labels, (0, pad), mode="edge")
    return rows.reshape(num_chunks, chunk, dim), row_labels.reshape(num_chunks, chunk)


def _chunked_readout(
    readout: Callable, norm_fn: NormFn, head: jax.Array, rows: jax.Array, row_labels: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Per-row ``(ce, correct) [n, C]`` of ``readout(norm_fn(rows), head, labels)``, one chunk
    of rows at a time (a rematerialised scan; no scan for a single chunk)."""
    # The scan sums the gradients of the head and of what norm_fn closes over (its scale)
    # chunk by chunk. It gets them in float32, cast back inside the body (exact), so that a
    # bfloat16 parameter's gradient is summed in float32 and rounded once, not once per chunk.
    norm_converted, norm_consts = jax.closure_convert(norm_fn, rows[0])
    params = (head, tuple(norm_consts))
    dtypes = jax.tree.map(lambda a: a.dtype, params)
    wide = jax.tree.map(_float32_if_narrower, params)

    def body(carry: None, xs: tuple[jax.Array, jax.Array]) -> tuple[None, tuple]:
        x, lab = xs  # [C, D], [C]
        head_, consts = jax.tree.map(lambda a, dtype: a.astype(dtype), wide, dtypes)
        return carry, readout(norm_converted(x, *consts), head_, lab)

    if rows.shape[0] == 1:
        # One chunk holds every row's logits anyway: no scan and no rematerialisation, so the
        # backward reuses the forward's logits (two head matmuls per row instead of three).
        _, (ce, correct) = body(None, (rows[0], row_labels[0]))
        return ce[None], correct[None]
    # prevent_cse=False: inside a scan the rematerialised body cannot be merged with the
    # forward anyway (jax.checkpoint's documented advice for scan bodies).
    _, (ce, correct) = jax.lax.scan(
        jax.checkpoint(body, prevent_cse=False), None, (rows, row_labels)
    )  # [num_chunks, C] each
    return ce, correct


def response_token_losses(
    states: jax.Array,
    norm_fn: NormFn,
    head: jax.Array,
    labels: jax.Array,
    loss_mask: jax.Array,
    *,
    capacity: int | None = None,
    bucket_tokens: int | None = None,
    chunk_tokens: int | None = None,
    keep_logits: bool | None = None,
    keep_tokens: int | None = None,
) -> tuple[jax.Array, jax.Array]:
    """:func:`naive_layer_token_losses`, reading out exactly the response tokens.

    **The gather.** The batch's ``N = Σ_{b,t} [m[b, t] != 0]`` response tokens are packed in
    row-major order (``jnp.nonzero`` with the static size ``capacity``), and every state is read
    out at them only: ``(L+1)·N`` rows, layer-major, contiguous. The rows are processed in
    buckets of ``bucket_tokens`` by a loop whose trip count is ``ceil((L+1)·N / bucket_tokens)``,
    a traced number: every shape is static (one compiled program for every batch), and the
    padding costs less than one bucket, whatever ``N`` is. ``capacity`` bounds ``N`` (memory
    only; default ``B·T``): a batch with more response tokens than ``capacity`` gets a NaN loss
    at every sample whose tokens did not fit, loudly, rather than a silently smaller mean.

    **The readout.** Each bucket's rows go through ``norm_fn`` and the head once: logits,
    log-sum-exp, label logit, argmax. The backward of the cross-entropy is ``dL/dz = g·(softmax
    − onehot)``, then ``dL/dh = dL/dz · headᵀ`` and, only when the head is trained (it is
    perturbed, ``jax.custom_vjp``'s symbolic zeros), ``dL/dhead = hᵀ · dL/dz``: two head products
    per row for a frozen head, three for a trained one, when the forward keeps its float32
    logits (``(L+1)·keep_tokens`` rows, rounded up to whole buckets) for the backward; otherwise
    the backward recomputes each bucket's logits (one more head product).
    :func:`keeps_logits` decides by default: keep them wherever they fit in ``chunk_tokens``
    (on a quiet CPU too, where the extra product measured slower, docs/speed.md).
    ``keep_tokens`` sizes the kept logits by a typical batch rather than the largest: the
    buckets of the first ``(L+1)·keep_tokens`` rows are kept, and a batch with more response
    tokens recomputes the logits of the buckets past them in the backward (one more head product
    for those rows only). The kept buffer is written in place by the forward's loop, so it is
    zeroed every step: sized by ``capacity`` it was 21 buckets (528 MB) per run at the LLM
    task's Section 6 setting, where a batch averages 18 response tokens, 5 buckets
    (:func:`response_keep_tokens`; the measured step, docs/speed.md).
    The backward loops over only the buckets with a nonzero cotangent, listed first (no branch
    inside the loop): it skips an ERM run's intermediate readouts, which its metrics need and
    its gradient does not, and any layer whose multipliers are 0. A row with a zero cotangent
    contributes exactly zero, also where its logits are not finite.

    Values and gradients (w.r.t. the states, the head and anything ``norm_fn`` closes over)
    equal the naive version's up to float32 summation order, with the conventions of the module
    docstring. ``norm_fn`` is applied to ``[L+1, capacity, D]`` gathered rows (so it must act
    row by row); padding rows repeat a real token (no artificial zeros) and get zero gradient.

    Args:
      states, norm_fn, head, labels, loss_mask: as in :func:`naive_layer_token_losses`.
      capacity: the most response tokens a batch may hold (clipped to ``B·T``; None: ``B·T``);
        :func:`response_capacities` gives the bound of a data set.
      bucket_tokens: readout rows per bucket (None: :func:`default_bucket_tokens`).
      chunk_tokens: the most logits rows held from the forward to the backward (None:
        :func:`default_chunk_tokens`).
      keep_logits: keep the forward's logits for the backward (True; they must fit in
        ``chunk_tokens``) or recompute them (False); None: :func:`keeps_logits`.
      keep_tokens: the packed response tokens per state whose logits are kept (clipped to
        ``capacity``; None: ``capacity``); :func:`response_keep_tokens` gives a typical batch's.

    Returns:
      ``(ce [B, L+1], acc [B, L+1])`` float32.
    """
    vocab = _check(states, head, labels, loss_mask)
    # numpy labels or mask (a batch closed over by a jitted caller) are indexed by traced ids
    labels, loss_mask = jnp.asarray(labels), jnp.asarray(loss_mask)
    for name, value in (
        ("capacity", capacity),
        ("bucket_tokens", bucket_tokens),
        ("chunk_tokens", chunk_tokens),
        ("keep_tokens", keep_tokens),
    ):
        if value is not None and not _positive_int(value):
            raise UsageError(f"{name} must be a positive int or None, got {value!r}")
    num_states, batch, seq, dim = states.shape
    cap = batch * seq if capacity is None else min(int(capacity), batch * seq)
    bucket, kept = _bucket_plan(
        num_states, cap, vocab, bucket_tokens, chunk_tokens, keep_logits, keep_tokens
    )

    on = (loss_mask != 0).reshape(-1)  # [B·T]
    total = jnp.sum(on, dtype=jnp.int32)
    count = jnp.minimum(total, cap)  # the packed rows per state
    (idx,) = jnp.nonzero(on, size=cap, fill_value=0)  # [cap]: flat token ids, row-major
    packed = jnp.arange(cap) < count  # [cap]
    rows = states.reshape(num_states, batch * seq, dim)[:, idx]  # [L+1, cap, D]
    safe = _safe_labels(labels, loss_mask, vocab).reshape(-1)[idx]  # [cap]
    readout = fused_readout(bucket, kept // bucket)
    with jax.named_scope("readout"):  # profiles name the readout's operations by this scope
        ce, correct = readout(norm_fn(rows), head, safe, count)  # [L+1, cap] each
    return _packed_means(ce, correct, idx, packed, labels, loss_mask, vocab)


def _bucket_plan(
    num_states: int,
    cap: int,
    vocab: int,
    bucket_tokens: int | None,
    chunk_tokens: int | None,
    keep_logits: bool | None,
    keep_tokens: int | None,
) -> tuple[int, int]:
    """``(bucket, kept)`` of :func:`response_token_losses`: the rows per bucket and the rows
    whose logits the forward keeps for the backward (whole buckets; 0: none)."""
    bucket = default_bucket_tokens() if bucket_tokens is None else int(bucket_tokens)
    bucket = min(bucket, num_states * cap)
    held = default_chunk_tokens(vocab) if chunk_tokens is None else int(chunk_tokens)
    keep = cap if keep_tokens is None else min(int(keep_tokens), cap)
    kept = math.ceil(num_states * keep / bucket) * bucket  # the kept rows, in whole buckets
    if keep_logits is None:
        keep_logits = keeps_logits(kept, held)
    elif keep_logits and kept > held:
        raise UsageError(
            f"keep_logits=True holds {kept} rows of logits, more than chunk_tokens={held}: "
            "raise chunk_tokens or pass keep_logits=None"
        )
    return bucket, kept if keep_logits else 0


def _packed_means(
    ce: jax.Array,
    correct: jax.Array,
    idx: jax.Array,
    packed: jax.Array,
    labels: jax.Array,
    loss_mask: jax.Array,
    vocab: int,
) -> tuple[jax.Array, jax.Array]:
    """Per-row ``ce, correct [L+1, cap]`` of the packed tokens ``idx [cap]`` (real where
    ``packed``) -> the masked means ``[B, L+1]``, NaN for a sample with a token past the
    capacity or an invalid label (the module docstring's conventions)."""
    batch, seq = loss_mask.shape
    sample = jnp.where(packed, idx // seq, batch)  # [cap]; batch: dropped by the sums
    weight = loss_mask.reshape(-1)[idx].astype(jnp.float32)  # [cap]
    ce_sum = jax.ops.segment_sum((ce * weight).T, sample, num_segments=batch)  # [B, L+1]
    hits = jax.ops.segment_sum((correct.astype(jnp.float32) * weight).T, sample, num_segments=batch)
    weight_in = jax.ops.segment_sum(jnp.where(packed, 1, 0), sample, num_segments=batch)
    weights = loss_mask.astype(jnp.float32)
    denom = jnp.sum(weights, axis=-1)  # [B]
    invalid = (loss_mask != 0) & ((labels < 0) | (labels >= vocab))
    lost = weight_in != jnp.sum(loss_mask != 0, axis=-1)  # tokens past the capacity
    poisoned = (lost | jnp.any(invalid, axis=-1))[:, None]  # [B, 1]
    some = (denom != 0)[:, None]
    safe_denom = jnp.where(some, denom[:, None], 1.0)
    loss = jnp.where(poisoned, jnp.nan, jnp.where(some, ce_sum / safe_denom, 0.0))
    acc = jnp.where(some & ~poisoned, hits / safe_denom, 0.0)
    return loss, acc


def kept_logit_rows(
    num_states: int,
    capacity: int,
    vocab: int,
    *,
    bucket_tokens: int | None = None,
    chunk_tokens: int | None = None,
    keep_tokens: int | None = None,
) -> int:
    """The rows of logits :func:`response_token_losses` keeps from the forward to the backward
    with these arguments and ``keep_logits=None`` (0: it recomputes them all)."""
    plan = _bucket_plan(num_states, capacity, vocab, bucket_tokens, chunk_tokens, None, keep_tokens)
    return plan[1]


def keeps_logits(rows: int, chunk_tokens: int) -> bool:
    """Whether :func:`response_token_losses` keeps ``rows`` rows of float32 logits from the
    forward to the backward by default: wherever they fit in ``chunk_tokens``, a CPU included
    (recomputing them costs one more head product per row; ``python -m benchmarks llm`` times
    the step that takes this default, docs/speed.md)."""
    return rows <= chunk_tokens


def default_bucket_tokens() -> int:
    """Readout rows per bucket of :func:`response_token_losses`: 128 on a CPU (a ``[128, D] x
    [D, V]`` product already occupies the cores, and the padding stays small), 1024 on an
    accelerator (fewer, larger products)."""
    return 128 if jax.default_backend() == "cpu" else 1024


def response_capacities(masks, *, draws: int | None = None) -> tuple[int, ...]:
    """``c[k - 1]``: the most response tokens (positions with mask != 0) ``k`` examples of
    ``masks`` (``[N, T]`` arrays, e.g. every split) can hold together (at least 1): a
    ``capacity`` for :func:`response_token_losses` that no batch of ``k`` of them exceeds.
    Host-side (numpy).

    Without ``draws``: batches of distinct examples (evaluation's), the sum of the ``k`` largest
    per-example counts, for ``k`` up to every example. With ``draws``: batches of up to
    ``draws`` examples drawn with replacement (training's, :func:`cudt.loop.sample_indices`),
    where one example may fill the whole batch: ``k`` times the largest count, for ``k`` up to
    ``draws`` (the sum of distinct examples' counts is no bound there, and a batch larger than
    the data set exceeds it at every step)."""
    counts = np.concatenate([np.sum(np.asarray(m) != 0, axis=1).reshape(-1) for m in masks])
    if draws is not None:
        if not _positive_int(draws) or counts.size == 0:
            raise UsageError(f"draws must be a positive int and masks non-empty, got {draws!r}")
        return tuple(max(k * int(counts.max()), 1) for k in range(1, draws + 1))
    return tuple(int(c) for c in np.maximum(np.cumsum(np.sort(counts)[::-1]), 1))


def response_keep_tokens(masks, batch: int, quantile: float = 0.99) -> tuple[int, ...]:
    """``k[b - 1]``, for ``b`` up to ``batch``: the fewest response tokens ``n`` such that ``b``
    examples of ``masks`` (``[N, T]`` arrays) drawn at random hold more than ``n`` with
    probability at most ``1 − quantile``, the ``keep_tokens`` of :func:`response_token_losses`
    for a typical batch. Exact for independent draws (the histogram of per-example counts
    convolved ``b`` times), and never above :func:`response_capacities`. Host-side (numpy)."""
    if not 0.0 < quantile <= 1.0:
        raise UsageError(f"quantile must be in (0, 1], got {quantile!r}")
    counts = np.concatenate([np.sum(np.asarray(m) != 0, axis=1).reshape(-1) for m in masks])
    if not _positive_int(batch) or counts.size == 0:
        raise UsageError(f"batch must be a positive int and masks non-empty, got {batch!r}")
    single = np.bincount(counts) / counts.size  # P(one example holds n tokens)
    caps = response_capacities(masks)
    dist, keep = np.ones(1), []
    for b in range(1, batch + 1):
        dist = np.convolve(dist, single)  # P(b examples hold n tokens)
        above = 1.0 - np.cumsum(dist)  # P(more than n)
        n = int(np.argmax(above <= 1.0 - quantile + 1e-12))
        keep.append(max(1, min(n, caps[min(b, len(caps)) - 1])))
    return tuple(keep)


# --------------------------------------------------------------------------------------------------
# Pieces
# --------------------------------------------------------------------------------------------------


#: The fewest rows :func:`default_chunk_tokens` gives, and what it gives where the memory is
#: unknown: 2048 rows of float32 logits over a vocabulary of 49152 are 400 MB.
MIN_CHUNK_TOKENS = 2048
#: The share of the device's memory (a CPU's: the machine's RAM) the readout's logits may take.
LOGITS_MEMORY_FRACTION = 1 / 8


def default_chunk_tokens(vocab: int, *, runs: int = 1, bytes_limit: int | None = None) -> int:
    """The ``chunk_tokens`` to use when none is given: as many rows as three ``[rows, V]``
    float32 buffers (the logits held from the forward to the backward, their softmax and its
    gradient) of each of ``runs`` runs batched together fit in :data:`LOGITS_MEMORY_FRACTION`
    of ``bytes_limit``, never fewer than :data:`MIN_CHUNK_TOKENS`.

    Enough rows for one chunk means no rematerialised logits: two head products per row
    instead of three, so the step is faster wherever the memory allows it (``python -m
    benchmarks llm`` and ``memory``; docs/speed.md).

    ``bytes_limit`` defaults to the memory of jax's first device: an accelerator's
    ``memory_stats()["bytes_limit"]`` (what jax's allocator may use), a CPU's physical RAM;
    :data:`MIN_CHUNK_TOKENS` where neither is known."""
    if bytes_limit is None:
        device = jax.devices()[0]
        if device.platform == "cpu":
            bytes_limit = _physical_memory()
        else:
            bytes_limit = (device.memory_stats() or {}).get("bytes_limit")
    if not bytes_limit:
        return MIN_CHUNK_TOKENS
    rows = int(bytes_limit * LOGITS_MEMORY_FRACTION) // (3 * 4 * int(vocab) * int(runs))
    return max(MIN_CHUNK_TOKENS, rows)


def _physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # not a POSIX system
        return None


def _check(states: jax.Array, head: jax.Array, labels: jax.Array, loss_mask: jax.Array) -> int:
    """Shape checks at the border; returns V."""
    if jnp.ndim(states) != 4:
        raise UsageError(
            f"states must be [L+1, B, T, D] (every layer's residual stream), got shape "
            f"{jnp.shape(states)}"
        )
    _, batch, seq, dim = states.shape
    if jnp.ndim(head) != 2 or head.shape[0] != dim:
        raise UsageError(
            f"head must be [D, V] with D = {dim} (the states' last axis), got shape "
            f"{jnp.shape(head)}; pass the LM head's kernel, transposed if it is stored [V, D]"
        )
    if jnp.shape(labels) != (batch, seq) or jnp.shape(loss_mask) != (batch, seq):
        raise UsageError(
            f"labels and loss_mask must be [B, T] = {(batch, seq)} like the states, got "
            f"{jnp.shape(labels)} and {jnp.shape(loss_mask)}"
        )
    if not jnp.issubdtype(jnp.result_type(labels), jnp.integer):
        raise UsageError(
            f"labels must be integer token ids, got dtype {jnp.result_type(labels)}: "
            "pass them as int32"
        )
    return int(head.shape[1])


def response_span(loss_mask) -> int:
    """The largest ``last - first + 1`` over the samples' positions with mask != 0 (0 when none
    has any): the smallest ``response_tokens`` that changes nothing. Host-side (numpy)."""
    on = np.asarray(loss_mask) != 0
    if on.ndim != 2 or not on.any():
        return 0
    seq = on.shape[1]
    first = np.argmax(on, axis=1)
    last = seq - 1 - np.argmax(on[:, ::-1], axis=1)
    return int(np.max(np.where(on.any(axis=1), last - first + 1, 0)))


def _response_window(
    states: jax.Array, labels: jax.Array, loss_mask: jax.Array, window: int
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Each sample's ``R = min(window, T)`` positions from its first masked one (moved left to
    fit): ``states [L+1, B, R, D]``, ``labels``, ``loss_mask [B, R]``. A sample whose masked
    positions do not all fit gets the invalid label -1 at its masked window positions (NaN)."""
    seq = states.shape[2]
    r = min(int(window), seq)
    on = loss_mask != 0
    start = jnp.minimum(jnp.argmax(on, axis=1), seq - r)  # [B]
    idx = start[:, None] + jnp.arange(r)[None, :]  # [B, R]
    states = jnp.take_along_axis(states, idx[None, :, :, None], axis=2)
    labels_w = jnp.take_along_axis(labels, idx, axis=1)
    mask_w = jnp.take_along_axis(loss_mask, idx, axis=1)
    lost = jnp.sum(on, axis=1) != jnp.sum(mask_w != 0, axis=1)  # [B]
    labels_w = jnp.where(lost[:, None], -1, labels_w)
    return states, labels_w, mask_w


def _positive_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 1


def _float32_if_narrower(value: jax.Array) -> jax.Array:
    dtype = jnp.result_type(value)
    if jnp.issubdtype(dtype, jnp.floating) and dtype.itemsize < 4:
        return value.astype(jnp.float32)
    return value


def _safe_labels(labels: jax.Array, loss_mask: jax.Array, vocab: int) -> jax.Array:
    """``[B, T]`` labels clipped into ``[0, V)`` (ignored and invalid ones are handled later)."""
    return jnp.clip(jnp.where(loss_mask != 0, labels, 0), 0, vocab - 1).astype(jnp.int32)


def _per_sample(
    ce: jax.Array, correct: jax.Array, labels: jax.Array, loss_mask: jax.Array, vocab: int
) -> tuple[jax.Array, jax.Array]:
    """Per-token ``ce, correct [L+1, B, T]`` -> masked means ``[B, L+1]`` (float32)."""
    weight = loss_mask.astype(jnp.float32)  # [B, T]
    on = loss_mask != 0
    invalid = on & ((labels < 0) | (labels >= vocab))
    # where, not a product: a non-finite value at a masked-off position stays out, forward
    # and backward; an out-of-range label where the mask is on poisons its sample.
    ce = jnp.where(on, jnp.where(invalid, jnp.nan, ce) * weight, 0.0)
    hits = jnp.where(on & ~invalid, correct.astype(jnp.float32) * weight, 0.0)
    count = jnp.sum(weight, axis=-1)  # [B]
    denom = jnp.where(count != 0, count, 1.0)
    loss = jnp.where(count != 0, jnp.sum(ce, axis=-1) / denom, 0.0)  # [L+1, B]
    scored = (count != 0) & ~jnp.any(invalid, axis=-1)  # a poisoned sample scores 0
    acc = jnp.where(scored, jnp.sum(hits, axis=-1) / denom, 0.0)
    return loss.T, acc.T


def _rows_full_vocab(
    normed: jax.Array, head: jax.Array, labels: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """``normed [C, D]`` -> per-row ``(ce [C], correct [C])`` over the whole vocabulary."""
    logits = jnp.dot(normed, head, preferred_element_type=jnp.float32)  # [C, V]
    lse, label_logit, is_top = row_stats(logits, labels)
    return lse - label_logit, is_top


def _rows_vocab_chunked(
    normed: jax.Array, head: jax.Array, labels: jax.Array, *, vocab_chunk: int
) -> tuple[jax.Array, jax.Array]:
    """``normed [C, D]`` -> per-row ``(ce [C], correct [C])``, one vocabulary block at a time.

    Block ``k`` reads the head's columns ``[s_k, s_k + vc)`` with ``s_k = min(k·vc, V − vc)``
    (a slice of the head, no copy); in the last block the columns below ``k·vc``, already seen,
    are set to -inf. Online log-sum-exp: ``lse = m + log s`` with ``m`` the running maximum (held
    constant for the gradient, which stays exact: d lse / d logit_j = exp(logit_j − m) / s, the
    softmax) and ``s = Σ_j exp(logit_j − m)`` rescaled whenever ``m`` grows. The argmax keeps
    the earlier block's index on ties, as ``jnp.argmax`` does.
    """
    rows = normed.shape[0]
    dim, vocab = head.shape
    num_blocks = math.ceil(vocab / vocab_chunk)

    def body(carry: tuple, k: jax.Array) -> tuple[tuple, None]:
        top, total, label_logit, best, best_id = carry
        start = jnp.minimum(k * vocab_chunk, vocab - vocab_chunk)
        block = jax.lax.dynamic_slice(head, (0, start), (dim, vocab_chunk))  # [D, vc]
        ids = start + jnp.arange(vocab_chunk, dtype=jnp.int32)  # [vc]
        logits = jnp.dot(normed, block, preferred_element_type=jnp.float32)  # [C, vc]
        fresh = ids >= k * vocab_chunk  # [vc]: False where block k - 1 already had the column
        logits = jnp.where(fresh, logits, -jnp.inf)
        block_max = jnp.max(logits, axis=-1)  # [C]
        new_top = jax.lax.stop_gradient(jnp.maximum(top, block_max))
        total = total * jnp.exp(top - new_top) + jnp.sum(
            jnp.exp(logits - new_top[:, None]), axis=-1
        )
        label_logit = label_logit + jnp.sum(
            jnp.where(fresh & (ids == labels[:, None]), logits, 0.0), axis=-1
        )
        better = block_max > best
        best_id = jnp.where(better, start + jnp.argmax(logits, axis=-1), best_id)
        best = jnp.where(better, block_max, best)
        return (new_top, total, label_logit, best, best_id), None

    neg_inf = jnp.full((rows,), -jnp.inf, jnp.float32)
    zeros = jnp.zeros((rows,), jnp.float32)
    init = (neg_inf, zeros, zeros, neg_inf, jnp.zeros((rows,), jnp.int32))
    (top, total, label_logit, _, best_id), _ = jax.lax.scan(
        jax.checkpoint(body, prevent_cse=False),
        init,
        jnp.arange(num_blocks, dtype=jnp.int32),
    )
    return top + jnp.log(total) - label_logit, best_id == labels
