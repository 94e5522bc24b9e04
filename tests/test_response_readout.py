"""The packed readout: exactly the response tokens, a fused cross-entropy, no backward where no
gradient goes (cudt.lm_loss.response_token_losses)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import readout_objective, readout_problem, rms_norm

import cudt
import cudt.lm_loss as lm_loss
import cudt.lm_readout as lm_readout
from cudt.errors import UsageError
from cudt.lm_loss import (
    naive_layer_token_losses,
    response_capacities,
    response_keep_tokens,
    response_token_losses,
)

L1, B, T, D, V = 3, 3, 6, 8, 50
RTOL, ATOL = 1e-5, 1e-6


def problem(seed=0, batch=B, seq=T, dtype=jnp.float32):
    """States that read out better with depth, sample 1 without response tokens
    (helpers.readout_problem)."""
    return readout_problem(L1, batch, seq, D, V, seed=seed, masked=0.4, kept=(2, -1), dtype=dtype)


objective = readout_objective


value_and_grads = jax.jit(
    jax.value_and_grad(objective, argnums=(1, 2, 3), has_aux=True), static_argnums=0
)


@functools.partial(jax.jit, static_argnums=5)
def losses(states, head, scale, labels, mask, capacity=None):
    return response_token_losses(
        states, lambda x: rms_norm(x, scale), head, labels, mask, capacity=capacity
    )


def assert_equal_to_naive(fn, args):
    (_, (ce, acc)), grads = value_and_grads(naive_layer_token_losses, *args)
    (_, (ce_p, acc_p)), grads_p = value_and_grads(fn, *args)
    np.testing.assert_allclose(ce_p, ce, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(acc_p, acc, atol=1e-6)
    for name, g, g_p in zip(("states", "head", "scale"), grads, grads_p, strict=True):
        assert np.abs(g).max() > 1e-3, name
        np.testing.assert_allclose(g_p, g, rtol=RTOL, atol=ATOL, err_msg=name)


def count(mask) -> int:
    return int(np.sum(np.asarray(mask) != 0))


@pytest.mark.parametrize(
    "kwargs",
    [
        {},  # defaults: capacity B·T, one bucket of every row (on a CPU: logits recomputed)
        {"bucket_tokens": 4, "keep_logits": True},  # buckets straddle the states, one padded
        {"bucket_tokens": 1, "keep_logits": True},
        {"bucket_tokens": 4, "keep_logits": False},  # logits recomputed in the backward
        {"capacity": "exact", "bucket_tokens": 5},  # the capacity is the batch's own count
        {"bucket_tokens": 4, "keep_logits": True, "keep_tokens": 2},  # most buckets recomputed
        {"bucket_tokens": 3, "keep_tokens": 5},  # kept by default: they fit
    ],
)
def test_values_and_gradients_equal_the_naive_loss(kwargs):
    args = problem()
    if kwargs.get("capacity") == "exact":
        kwargs = {**kwargs, "capacity": count(args[4])}
    assert_equal_to_naive(functools.partial(response_token_losses, **kwargs), args)


def test_a_frozen_head_costs_two_head_products_per_row_and_a_trained_one_three():
    """The jaxprs' matrix products: the forward's logits, dL/dh, and dL/dhead only when the head
    is differentiated; a fourth (the logits again) only when they are not kept."""
    states, head, scale, labels, mask = problem()

    def products(argnums, **kwargs):
        fn = functools.partial(response_token_losses, **kwargs)
        loss = lambda s, h: jnp.sum(fn(s, lambda x: rms_norm(x, scale), h, labels, mask)[0])  # noqa: E731
        return str(jax.make_jaxpr(jax.grad(loss, argnums))(states, head)).count("dot_general")

    assert products(0, keep_logits=True) == 2
    assert products((0, 1), keep_logits=True) == 3
    assert products(0, keep_logits=False) == 3
    assert products((0, 1), keep_logits=False) == 4
    with pytest.raises(UsageError, match="keep_logits=True holds"):
        products(0, keep_logits=True, chunk_tokens=1)


def test_the_readouts_are_exactly_the_response_tokens(monkeypatch):
    """Every head product sees the normed states at exactly the response tokens (layer-major,
    then row-major), each once, plus less than one bucket of padding; a label or a state off the
    response changes nothing, and every response token gets a gradient."""
    states, head, scale, labels, mask = problem(seed=3, batch=4, seq=9)
    n, bucket = count(mask), 4
    seen = []
    logits_of = lm_readout.head_logits

    def recording(x, h):
        jax.debug.callback(lambda rows: seen.append(np.asarray(rows)), x)
        return logits_of(x, h)

    monkeypatch.setattr(lm_readout, "head_logits", recording)
    norm = lambda x: rms_norm(x, scale)  # noqa: E731
    fn = functools.partial(response_token_losses, bucket_tokens=bucket, keep_logits=True)
    ce, _ = jax.jit(lambda *a: fn(a[0], norm, *a[1:]))(states, head, labels, mask)
    jax.effects_barrier()
    rows = np.concatenate(seen)
    assert len(rows) == -(-L1 * n // bucket) * bucket  # ceil: padding < one bucket
    b_idx, t_idx = np.nonzero(np.asarray(mask))
    want = np.asarray(norm(states[:, b_idx, t_idx])).reshape(L1 * n, D)
    np.testing.assert_allclose(rows[: L1 * n], want, rtol=1e-6, atol=1e-6)

    monkeypatch.setattr(lm_readout, "head_logits", logits_of)
    off = ~np.asarray(mask)
    other_labels = jnp.where(off, (jnp.abs(labels) + 7) % V, labels)
    other_states = jnp.where(off[None, :, :, None], 5.0 * states + 1.0, states)
    (_, (ce_a, acc_a)), (g_a, *_) = value_and_grads(fn, states, head, scale, labels, mask)
    (_, (ce_b, acc_b)), (g_b, *_) = value_and_grads(
        fn, other_states, head, scale, other_labels, mask
    )
    np.testing.assert_array_equal(ce_a, ce_b)
    np.testing.assert_array_equal(acc_a, acc_b)
    np.testing.assert_allclose(ce_a, ce, rtol=1e-6)
    g_a = np.asarray(g_a)
    assert np.all(g_a[:, off] == 0)
    assert np.all(np.abs(g_a[:, ~off]).max(axis=-1) > 0)  # every response token, every state


@pytest.mark.parametrize("trained", [False, True])
def test_only_the_buckets_past_keep_tokens_recompute_their_logits(monkeypatch, trained):
    """The forward reads out every bucket once; the backward recomputes the logits of exactly
    the buckets past the first ``(L+1)·keep_tokens`` rows, and none when the batch fits."""
    states, head, scale, labels, mask = problem(seed=3, batch=4, seq=9)
    n, bucket = count(mask), 4
    buckets = -(-L1 * n // bucket)
    calls = []
    logits_of = lm_readout.head_logits

    def recording(x, h):
        jax.debug.callback(lambda rows: calls.append(len(rows)), x)
        return logits_of(x, h)

    monkeypatch.setattr(lm_readout, "head_logits", recording)

    def head_rows(keep_tokens):
        calls.clear()
        fn = functools.partial(
            response_token_losses, bucket_tokens=bucket, keep_logits=True, keep_tokens=keep_tokens
        )
        argnums = (1, 2, 3) if trained else (1, 3)
        grads = jax.jit(
            jax.value_and_grad(objective, argnums=argnums, has_aux=True), static_argnums=0
        )
        jax.block_until_ready(grads(fn, states, head, scale, labels, mask))
        jax.effects_barrier()
        return sum(calls) // bucket

    for keep_tokens, kept in (
        (n, buckets),
        (n + 5, buckets),
        (n // 2, -(-L1 * (n // 2) // bucket)),
        (1, 1),
    ):
        assert kept <= buckets
        assert head_rows(keep_tokens) == buckets + (buckets - kept), keep_tokens


def test_response_keep_tokens_is_the_quantile_of_a_random_batch():
    rng = np.random.default_rng(0)
    counts = rng.choice([1, 2, 3, 12], size=400, p=[0.4, 0.3, 0.25, 0.05])
    mask = np.arange(16)[None, :] < counts[:, None]
    keep = response_keep_tokens([mask], 3, quantile=0.9)
    caps = response_capacities([mask])
    draws = rng.choice(counts, size=(200_000, 3)).cumsum(axis=1)  # b = 1, 2, 3 at random
    for b in (1, 2, 3):
        over = np.mean(draws[:, b - 1] > keep[b - 1])
        assert over <= 0.1 + 0.005, (b, over)
        assert np.mean(draws[:, b - 1] > keep[b - 1] - 1) > 0.1 - 0.005, b  # the fewest
        assert 1 <= keep[b - 1] <= caps[b - 1]
    assert response_keep_tokens([mask], 2, quantile=1.0) == (12, 24)
    with pytest.raises(UsageError, match="quantile"):
        response_keep_tokens([mask], 2, quantile=0.0)


def test_a_batch_over_the_capacity_poisons_the_samples_that_did_not_fit():
    states, head, scale, labels, mask = problem()
    per_sample = np.sum(np.asarray(mask), axis=1)  # sample 1 has none
    ce_full, _ = losses(states, head, scale, labels, mask)
    ce, acc = (
        np.asarray(a) for a in losses(states, head, scale, labels, mask, int(per_sample[0]) + 1)
    )
    assert np.all(np.isnan(ce[2])) and np.all(acc[2] == 0)
    np.testing.assert_allclose(ce[[0, 1]], np.asarray(ce_full)[[0, 1]], rtol=1e-6)
    assert response_capacities([mask, mask[:1]]) == tuple(
        np.cumsum(sorted([*per_sample, per_sample[0]], reverse=True)).clip(min=1)
    )
    # training draws with replacement: one example may fill the batch, which the sum of the
    # largest distinct counts does not bound (a batch of 3 copies of sample 0 overflows it)
    most = int(per_sample.max())
    assert response_capacities([mask], draws=4) == (most, 2 * most, 3 * most, 4 * most)
    assert 3 * most > response_capacities([mask])[2]
    with pytest.raises(UsageError, match="draws"):
        response_capacities([mask], draws=0)


def test_an_out_of_range_label_on_a_response_token_poisons_its_sample():
    states, head, scale, labels, mask = problem()
    labels = labels.at[2, -1].set(V)
    ce, acc = (np.asarray(a) for a in losses(states, head, scale, labels, mask))
    assert np.all(np.isnan(ce[2])) and np.all(np.isfinite(ce[[0, 1]]))
    assert np.all(np.isfinite(acc))


@pytest.mark.parametrize("keep_tokens", [None, "between"])
def test_runs_vmapped_with_different_response_counts_equal_each_run_alone(keep_tokens):
    a, b = problem(seed=1), problem(seed=2)
    b = (*b[:4], b[4].at[1].set(True))  # sample 1 of run b has a response: T more tokens
    assert count(b[4]) > count(a[4])
    if keep_tokens == "between":  # run a's logits all kept, some of run b's recomputed
        keep_tokens = count(a[4])
    fn = functools.partial(response_token_losses, bucket_tokens=4, keep_tokens=keep_tokens)

    def grads(*args):
        return jax.value_and_grad(objective, argnums=(1, 2, 3), has_aux=True)(fn, *args)

    both = jax.jit(jax.vmap(grads))(*(jnp.stack([x, y]) for x, y in zip(a, b, strict=True)))
    for run, args in enumerate((a, b)):
        alone = jax.jit(grads)(*args)
        for x, y in zip(jax.tree.leaves(alone), jax.tree.leaves(both), strict=True):
            np.testing.assert_allclose(y[run], x, rtol=RTOL, atol=ATOL)


def test_bad_arguments_raise_one_line_usage_errors():
    states, head, _, labels, mask = problem()
    for name in ("capacity", "bucket_tokens", "chunk_tokens", "keep_tokens"):
        with pytest.raises(UsageError, match=f"{name} must be a positive int") as info:
            response_token_losses(states, lambda x: x, head, labels, mask, **{name: 0})
        assert "\n" not in str(info.value)


def test_bfloat16_states_and_head_give_float32_losses_and_bfloat16_gradients():
    args = problem(dtype=jnp.bfloat16)
    (_, (ce, _)), _ = value_and_grads(naive_layer_token_losses, *args)
    (_, (ce_p, _)), grads_p = value_and_grads(
        functools.partial(response_token_losses, bucket_tokens=4), *args
    )
    assert ce_p.dtype == jnp.float32 and all(g.dtype == jnp.bfloat16 for g in grads_p)
    np.testing.assert_allclose(ce_p, ce, rtol=1e-5, atol=1e-5)
    wide = tuple(a.astype(jnp.float32) for a in args[:3]) + args[3:]
    _, grads_32 = value_and_grads(naive_layer_token_losses, *wide)
    for name, g_p, g_32 in zip(("states", "head", "scale"), grads_p, grads_32, strict=True):
        g_p, g_32 = np.asarray(g_p, np.float32), np.asarray(g_32)
        assert np.abs(g_p - g_32).max() < 0.02 * np.abs(g_32).max(), name


# --------------------------------------------------------------------------------------------------
# ERM lanes through the one engine
# --------------------------------------------------------------------------------------------------


def erm_problem(poison: bool):
    """A two-matrix model whose states feed the packed readout; ``poison`` puts an infinite
    value into state 0 at a response token (the last state does not depend on it)."""
    states, head, _, labels, mask = problem()
    x = states[0]  # [B, T, D]
    params = {
        "w": [jnp.eye(D) + 0.1 * jax.random.normal(jax.random.key(i), (D, D)) for i in (1, 2)]
    }

    def model_states(p):
        s1 = jnp.tanh(x @ p["w"][0])
        s2 = jnp.tanh(s1 @ p["w"][1])
        s0 = x + (jnp.zeros_like(x).at[0, 0, 0].set(jnp.inf) if poison else 0.0)
        return jnp.stack([s0, s1, s2])

    def layer_losses(p, batch, key):
        ce, _ = response_token_losses(
            model_states(p), lambda s: s, head, labels, mask, bucket_tokens=count(mask)
        )
        return ce  # [B, L+1]

    def last_layer_loss(p):
        return jnp.mean(layer_losses(p, None, None)[:, -1])

    return params, layer_losses, last_layer_loss


@pytest.mark.parametrize("poison", [False, True])
def test_erm_lanes_take_the_plain_last_layer_gradient_without_the_intermediate_readouts(poison):
    """An ERM run (constrained=False) of the one step: its update is SGD on the plain last-layer
    loss. With an infinite intermediate state its metrics show it, but its gradient stays the
    same finite one: the readouts no gradient goes to are never back-propagated."""
    params, layer_losses, last_layer_loss = erm_problem(poison)
    lr = 0.5
    cfg = cudt.DescentConfig(num_layers=2, epsilon=0.1, reference=None)
    init, step = cudt.make_train_step(layer_losses, optax.sgd(lr), cudt.dual_ascent(0.1), cfg)
    state, metrics = step(init(params, constrained=False), None, jax.random.key(0))
    grads = jax.jit(jax.grad(last_layer_loss))(params)  # jitted: op by op took seconds
    for new, old, g in zip(
        jax.tree.leaves(state.params), jax.tree.leaves(params), jax.tree.leaves(grads), strict=True
    ):
        assert np.abs(g).max() > 1e-3 and np.all(np.isfinite(np.asarray(new)))
        np.testing.assert_allclose(new, old - lr * g, rtol=RTOL, atol=ATOL)
    layer_loss = np.asarray(metrics["layer_loss"])
    assert np.isnan(layer_loss[0]) == poison and np.all(np.isfinite(layer_loss[1:]))


@pytest.mark.parametrize(
    "fn",
    [
        functools.partial(response_token_losses, bucket_tokens=4, keep_logits=True),
        functools.partial(lm_loss.layer_token_losses, chunk_tokens=5),
    ],
    ids=["packed", "chunked"],
)
def test_accuracy_breaks_ties_to_the_lowest_id_as_argmax_does(fn):
    """The accuracy reads the row maximum, not an argmax: a label tied with a lower id at the top
    is a miss, a label tied only with higher ids a hit (jnp.argmax's rule)."""
    d = 4
    head = jnp.zeros((d, V)).at[0, 7].set(1.0).at[0, 3].set(1.0).at[0, 9].set(1.0)
    states = jnp.zeros((2, 1, 4, d)).at[:, :, :, 0].set(2.0)  # logits: 2 at ids 3, 7, 9; else 0
    labels = jnp.array([[3, 7, 9, 0]])
    mask = jnp.ones((1, 4), bool)
    # jitted: op by op took seconds
    _, acc = jax.jit(lambda *a: fn(a[0], lambda x: x, *a[1:]))(states, head, labels, mask)
    naive = jax.jit(lambda *a: naive_layer_token_losses(a[0], lambda x: x, *a[1:]))
    _, acc_naive = naive(states, head, labels, mask)
    np.testing.assert_array_equal(acc, acc_naive)
    np.testing.assert_allclose(acc, [[0.25, 0.25]])  # only label 3 (the lowest tied id) hits


@pytest.mark.parametrize("keep_tokens", [1, None])  # logits recomputed / kept from the forward
@pytest.mark.parametrize("bfloat16", ["states", "head"])
def test_a_product_of_mixed_types_gives_the_float32_gradient(keep_tokens, bfloat16):
    """The forward's product of a bfloat16 and a float32 operand is float32, so must be the
    float32 operand's gradient:

    - mixed precision (bfloat16 states, a float32 master head): the head's. Rounding the
      logits' cotangent to the states' bfloat16 first put it 8e-4 (relative) from the naive
      readout's;
    - a frozen bfloat16 base under float32 compute (``--lora-rank R --base-dtype bfloat16``):
      the states'. Rounding the cotangent to the head's bfloat16 put it 2.5e-3 from it.

    (The states as the norm returns them: an identity here, so both readouts see the same
    rows.)"""
    states, head, _, labels, mask = problem(batch=4, seq=16)
    if bfloat16 == "states":
        states = states.astype(jnp.bfloat16)
    else:
        head = head.astype(jnp.bfloat16)
    weights = jnp.linspace(0.1, 1.0, L1 * 4).reshape(4, L1)  # ce is [B, L+1]

    def gradient(fn):  # of the float32 operand
        def loss(x):
            s, h = (states, x) if bfloat16 == "states" else (x, head)
            return jnp.sum(weights * fn(s, lambda y: y, h, labels, mask)[0])

        return jax.jit(jax.grad(loss))(head if bfloat16 == "states" else states)

    got = gradient(functools.partial(response_token_losses, keep_tokens=keep_tokens))
    want = gradient(naive_layer_token_losses)
    assert got.dtype == jnp.float32
    err = float(jnp.linalg.norm(got - want) / jnp.linalg.norm(want))
    assert err < 1e-5, err
