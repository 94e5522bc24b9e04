"""Per-layer LM losses: the chunked version equals the naive one and needs less memory."""

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import readout_objective, readout_problem, rms_norm

from cudt.errors import UsageError
from cudt.lm_loss import layer_token_losses, naive_layer_token_losses, response_token_losses

L1, B, T, D, V = 3, 3, 5, 8, 50  # 45 rows of the flattened (layer, sample, token) axis
TOL = dict(rtol=1e-5, atol=1e-5)


def problem(dtype=jnp.float32, batch=B, seq=T):
    """States that read out better with depth, sample 1 all masked (helpers.readout_problem)."""
    return readout_problem(L1, batch, seq, D, V, seed=0, masked=0.3, kept=(2, 0), dtype=dtype)


objective = readout_objective


def eager_value_and_grads(fn, states, head, scale, labels, mask):
    """``((objective, (ce, acc)), (d/d states, d/d head, d/d scale))``."""
    return jax.value_and_grad(objective, argnums=(1, 2, 3), has_aux=True)(
        fn, states, head, scale, labels, mask
    )


# Jitted: one compilation per loss function instead of one per operation (fast tests).
value_and_grads = jax.jit(eager_value_and_grads, static_argnums=0)


@pytest.mark.slow
def test_naive_matches_a_float64_numpy_reference():
    states, head, scale, labels, mask = problem()
    (_, (ce, acc)), _ = value_and_grads(
        naive_layer_token_losses, states, head, scale, labels, mask.astype(jnp.float32)
    )
    s, h, g = (np.asarray(a, np.float64) for a in (states, head, scale))
    normed = s / np.sqrt(np.mean(s * s, axis=-1, keepdims=True) + 1e-6) * g
    logits = normed @ h  # [L+1, B, T, V]
    lse = np.log(np.sum(np.exp(logits - logits.max(-1, keepdims=True)), -1)) + logits.max(-1)
    m = np.asarray(mask)
    want_ce, want_acc = np.zeros((B, L1)), np.zeros((B, L1))
    for b in range(B):
        for layer in range(L1):
            ts = np.flatnonzero(m[b])
            if ts.size:
                lab = np.asarray(labels)[b, ts]
                want_ce[b, layer] = np.mean(lse[layer, b, ts] - logits[layer, b, ts, lab])
                want_acc[b, layer] = np.mean(np.argmax(logits[layer, b, ts], -1) == lab)
    np.testing.assert_allclose(ce, want_ce, **TOL)
    np.testing.assert_allclose(acc, want_acc, atol=1e-6)
    assert ce.dtype == acc.dtype == jnp.float32
    # not trivially 0 or 1: deeper layers read out better
    assert 0 < want_acc[[0, 2], -1].min() and want_acc.max() < 1
    assert np.all(want_acc[[0, 2], -1] > want_acc[[0, 2], 0])


@pytest.mark.parametrize(
    "chunk_tokens, vocab_chunk",
    [
        (15, None),  # divides the 45 rows
        (7, None),  # does not: 7 chunks of 7 rows, 4 of them padding
        (44, None),  # 2 chunks of 23 rows, 1 of them padding
        (100, None),  # more than the rows: one chunk
        (15, 10),  # vocabulary blocks dividing V = 50
        (7, 16),  # neither divides: padded rows and an overlapping last vocabulary block
        (45, 1),  # one vocabulary entry per block
        (9, 50),  # a block of the whole vocabulary: the unchunked path
    ],
)
def test_chunked_equals_naive_values_and_gradients(chunk_tokens, vocab_chunk):
    args = problem()
    (_, (ce, acc)), grads = value_and_grads(naive_layer_token_losses, *args)
    chunked = functools.partial(
        layer_token_losses, chunk_tokens=chunk_tokens, vocab_chunk=vocab_chunk
    )
    (_, (ce_c, acc_c)), grads_c = value_and_grads(chunked, *args)
    np.testing.assert_allclose(ce_c, ce, **TOL)
    np.testing.assert_allclose(acc_c, acc, atol=1e-6)
    for name, g, g_c in zip(("states", "head", "scale"), grads, grads_c, strict=True):
        assert np.abs(g).max() > 1e-3, name  # the gradient is not trivially zero
        np.testing.assert_allclose(g_c, g, **TOL, err_msg=name)


def test_a_sample_without_response_tokens_gets_zero_loss_and_zero_gradient():
    states, head, scale, labels, mask = problem()
    chunked = functools.partial(layer_token_losses, chunk_tokens=7, vocab_chunk=16)
    (_, (ce, acc)), (g_states, g_head, _) = value_and_grads(
        chunked, states, head, scale, labels, mask
    )
    ce, acc, g_states, g_head = (np.asarray(a) for a in (ce, acc, g_states, g_head))
    assert np.all(ce[1] == 0) and np.all(acc[1] == 0)
    assert np.all(ce[[0, 2]] > 0)
    assert np.all(np.isfinite(g_states)) and np.all(np.isfinite(g_head))
    assert np.all(g_states[:, 1] == 0)
    # masked-off tokens of the other samples get no gradient either
    off = ~np.asarray(mask)
    assert np.all(g_states[:, off] == 0)
    assert np.abs(g_states[:, ~off]).min() > 0


def test_eager_matches_jit():
    states, head, scale, labels, mask = problem()
    norm = lambda x: rms_norm(x, scale)
    chunked = functools.partial(layer_token_losses, chunk_tokens=7, vocab_chunk=16)
    ce, acc = chunked(states, norm, head, labels, mask)  # eager: op by op
    (_, (ce_j, acc_j)), _ = value_and_grads(chunked, states, head, scale, labels, mask)
    np.testing.assert_allclose(ce, ce_j, **TOL)
    np.testing.assert_allclose(acc, acc_j, atol=1e-6)


def test_a_numpy_batch_closed_over_by_a_jitted_caller_is_read():
    """A caller that closes over its numpy batch inside jit (experiments.layer_gradients did):
    the readout indexes the mask and labels with traced token ids, so they must become arrays
    (numpy raised TracerArrayConversionError)."""
    states, head, scale, labels, mask = problem()
    labels, mask = np.asarray(labels), np.asarray(mask, np.float32)
    norm = lambda x: rms_norm(x, scale)
    ce, acc = jax.jit(lambda s: response_token_losses(s, norm, head, labels, mask))(states)
    ce_e, acc_e = response_token_losses(states, norm, head, jnp.asarray(labels), mask)
    np.testing.assert_allclose(ce, ce_e, **TOL)
    np.testing.assert_allclose(acc, acc_e, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("vocab_chunk", [None, 16])
def test_bfloat16_states_and_head_give_float32_losses_and_sound_gradients(vocab_chunk):
    # 384 rows in 96 chunks: the head's and the norm scale's gradients are sums over 96 chunks
    args = problem(jnp.bfloat16, batch=4, seq=32)
    chunked = functools.partial(layer_token_losses, chunk_tokens=4, vocab_chunk=vocab_chunk)
    (_, (ce, _)), _ = value_and_grads(naive_layer_token_losses, *args)
    (_, (ce_c, _)), grads_c = value_and_grads(chunked, *args)
    assert ce.dtype == ce_c.dtype == jnp.float32
    assert all(g.dtype == jnp.bfloat16 for g in grads_c)
    # Equal up to one bf16 rounding of the normed states (2**-8 relative): whether XLA rounds
    # them before the float32 product depends on its CPU kernels (with Eigen on one thread it
    # does in one path and not the other: 2e-4 relative apart; threaded: equal to 1e-6). A
    # wrong, missing or shifted chunk is off by whole nats.
    np.testing.assert_allclose(ce_c, ce, rtol=2**-8, atol=2**-8)
    wide = tuple(a.astype(jnp.float32) for a in args[:3]) + args[3:]
    _, grads_32 = value_and_grads(naive_layer_token_losses, *wide)
    # Gradients: bf16 roundings of the float32 ones (error as a fraction of the largest entry).
    # Summed over the chunks in bf16, the head's and the scale's would be off by 0.8 % and
    # 1.5 % here; summed in float32 and rounded once, by 0.2-0.45 %.
    for name, g_c, g_32, bound in zip(
        ("states", "head", "scale"), grads_c, grads_32, (0.02, 0.006, 0.008), strict=True
    ):
        g_c, g_32 = np.asarray(g_c, np.float32), np.asarray(g_32)
        assert np.abs(g_c - g_32).max() < bound * np.abs(g_32).max(), name


@pytest.mark.parametrize(
    "fn", [naive_layer_token_losses, layer_token_losses, response_token_losses]
)
def test_an_out_of_range_label_on_a_response_token_poisons_its_sample(fn):
    """Its loss NaN and its accuracy 0, in every implementation (the naive and chunked ones
    counted its other tokens' hits, the packed one scored 0)."""
    states, head, scale, labels, mask = problem()
    labels = labels.at[2, 0].set(V)  # mask[2, 0] is on
    ce, acc = (np.asarray(a) for a in fn(states, lambda x: rms_norm(x, scale), head, labels, mask))
    assert np.all(np.isnan(ce[2])) and np.all(np.isfinite(ce[[0, 1]]))
    assert np.all(acc[2] == 0) and np.all(np.isfinite(acc))
    want = naive_layer_token_losses(states, lambda x: rms_norm(x, scale), head, labels, mask)[1]
    np.testing.assert_allclose(acc[[0, 1]], np.asarray(want)[[0, 1]], atol=1e-6)


def test_bad_inputs_raise_one_line_usage_errors():
    states, head, scale, labels, mask = problem()
    norm = lambda x: rms_norm(x, scale)
    cases = [
        ((states, norm, head.T, labels, mask), {}, "head must be [D, V] with D = 8"),
        ((states[0], norm, head, labels, mask), {}, "states must be [L+1, B, T, D]"),
        ((states, norm, head, labels[:, :-1], mask), {}, "labels and loss_mask must be [B, T]"),
        ((states, norm, head, labels * 1.0, mask), {}, "labels must be integer token ids"),
        ((states, norm, head, labels, mask), {"chunk_tokens": 0}, "chunk_tokens must be"),
        ((states, norm, head, labels, mask), {"vocab_chunk": 0}, "vocab_chunk must be"),
    ]
    for args, kwargs, message in cases:
        with pytest.raises(UsageError) as info:
            layer_token_losses(*args, **kwargs)
        assert message in str(info.value) and "\n" not in str(info.value)


def compiled_value_and_grad(fn, num_states, vocab, batch=4, seq=64, dim=32):
    """The compiled forward + backward (value_and_grad) of ``fn``'s summed losses, never run."""
    spec = jax.ShapeDtypeStruct
    args = (
        spec((num_states, batch, seq, dim), jnp.float32),
        spec((dim, vocab), jnp.float32),
        spec((dim,), jnp.float32),
        spec((batch, seq), jnp.int32),
        spec((batch, seq), jnp.float32),
    )

    def loss(states, head, scale, labels, mask):
        return jnp.sum(fn(states, lambda x: rms_norm(x, scale), head, labels, mask)[0])

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2))).lower(*args).compile()


def temp_bytes(fn, num_states, vocab):
    """Temp memory of the compiled forward + backward."""
    return compiled_value_and_grad(fn, num_states, vocab).memory_analysis().temp_size_in_bytes


def test_chunked_program_needs_less_temp_memory():
    # V = 4096, L+1 = 5, B*T = 256: the naive logits alone are 5*256*4096 float32 = 21 MB, the
    # chunked ones 128*4096 (or 128*1024) float32 = 2 MB (0.5 MB).
    naive = temp_bytes(naive_layer_token_losses, 5, 4096)
    chunked = temp_bytes(functools.partial(layer_token_losses, chunk_tokens=128), 5, 4096)
    by_vocab = functools.partial(layer_token_losses, chunk_tokens=128, vocab_chunk=1024)
    assert naive > 5 * 256 * 4096 * 4
    assert chunked < naive / 4
    assert temp_bytes(by_vocab, 5, 4096) < chunked
    # deeper: the naive program grows with the depth, the chunked one does not
    assert temp_bytes(naive_layer_token_losses, 17, 4096) > 3 * naive
    deeper = temp_bytes(functools.partial(layer_token_losses, chunk_tokens=128), 17, 4096)
    assert deeper < 1.2 * chunked


@pytest.mark.slow
def test_response_window_equals_every_position_values_and_gradients():
    """Reading out only a window of R positions per sample from its first response token gives
    the full version's values and gradients when the responses fit (R = their span), and a
    NaN, not a silently different mean, for a sample whose response does not."""
    from cudt.lm_loss import response_span

    states, head, scale, labels, _ = problem(seq=12)
    # contiguous responses at different offsets (sample 1 has none), as instruction data has
    mask = np.zeros((B, 12), bool)
    mask[0, 3:7] = True
    mask[2, 8:12] = True
    mask = jnp.asarray(mask)
    labels = jnp.where(mask, jnp.abs(labels) % V, -100)
    span = response_span(mask)
    assert span == 4
    args = (states, head, scale, labels, mask.astype(jnp.float32))
    full = functools.partial(layer_token_losses, chunk_tokens=7)
    window = functools.partial(layer_token_losses, chunk_tokens=7, response_tokens=span)
    (_, (ce, acc)), grads = value_and_grads(full, *args)
    (_, (ce_w, acc_w)), grads_w = value_and_grads(window, *args)
    np.testing.assert_allclose(ce_w, ce, **TOL)
    np.testing.assert_allclose(acc_w, acc, atol=1e-6)
    assert np.all(np.asarray(ce)[[0, 2]] > 0)
    for name, g, g_w in zip(("states", "head", "scale"), grads, grads_w, strict=True):
        assert np.abs(g).max() > 1e-3, name
        np.testing.assert_allclose(g_w, g, **TOL, err_msg=name)
    # a window narrower than sample 0's response: that sample is NaN, the others unchanged
    (_, (ce_short, _)), _ = value_and_grads(
        functools.partial(layer_token_losses, chunk_tokens=7, response_tokens=3), *args
    )
    assert np.all(np.isnan(ce_short[0])) and np.all(np.isnan(ce_short[2]))
    np.testing.assert_allclose(ce_short[1], 0.0)
    with pytest.raises(UsageError, match="response_tokens"):
        layer_token_losses(states, lambda x: x, head, labels, mask, response_tokens=0)


def _flops(fn, num_states: int, vocab: int) -> float:
    cost = compiled_value_and_grad(fn, num_states, vocab, seq=16, dim=64).cost_analysis()
    return float((cost[0] if isinstance(cost, list) else cost)["flops"])


def test_one_chunk_reuses_the_logits_in_the_backward():
    """With every row in one chunk the head matmuls are the forward, d/d states and d/d head:
    3 per row. Chunked, the backward also recomputes each chunk's logits: 4 per row. (XLA's
    cost analysis counts a scan's body once, so the chunked figure is per chunk.)"""
    rows = 5 * 4 * 16
    head_matmul = 2.0 * rows * 64 * 4096  # one [rows, D] x [D, V] product
    one = _flops(functools.partial(layer_token_losses, chunk_tokens=rows), 5, 4096)
    per_chunk = _flops(functools.partial(layer_token_losses, chunk_tokens=rows // 2), 5, 4096)
    assert 2.9 * head_matmul < one < 3.3 * head_matmul, one / head_matmul
    assert per_chunk > 3.9 * head_matmul / 2, per_chunk / (head_matmul / 2)


def test_chunks_are_balanced_so_padding_costs_under_one_row_per_chunk():
    """320 rows with ``chunk_tokens=300`` are two chunks of 160, not of 300 (280 rows of
    readouts over V that would be thrown away)."""
    head_matmul = 2.0 * 160 * 64 * 4096  # one [160, D] x [D, V] product
    per_chunk = _flops(functools.partial(layer_token_losses, chunk_tokens=300), 5, 4096)
    assert 3.9 * head_matmul < per_chunk < 4.4 * head_matmul, per_chunk / head_matmul


def test_default_chunk_tokens_is_one_chunk_where_the_device_has_memory_to_spare():
    from cudt.lm_loss import MIN_CHUNK_TOKENS, default_chunk_tokens

    # an H200's allocator (105 GB): 1/8 of it holds three [rows, 49152] float32 buffers for
    # 22 252 rows, so SmolLM2 at B 16 (8928 readout rows) is one chunk
    assert default_chunk_tokens(49152, bytes_limit=105 * 10**9) == 22252
    # 8 runs vmapped together share that memory: an eighth of the rows each
    assert default_chunk_tokens(49152, runs=8, bytes_limit=105 * 10**9) == 22252 // 8
    # a small device, or one that does not report its memory: never below 2048
    assert default_chunk_tokens(49152, bytes_limit=10**9) == MIN_CHUNK_TOKENS == 2048
    assert default_chunk_tokens(49152, bytes_limit=0) == 2048
    # this process's device is a CPU: its share of the machine's RAM
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert default_chunk_tokens(49152) == max(2048, ram // 8 // (12 * 49152))
