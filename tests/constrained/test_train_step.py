"""The constrained step, on its jitted path, against updates computed by hand.

The toy model has L scalar "layers": x_l = w_l·x_{l−1}, per-sample loss ℓ_l = (x_l − y)², so every
mean loss, constraint value and gradient can be computed independently in numpy-like code.

Tolerances. The jitted step and the hand computation are two differently compiled programs
(XLA fuses, reorders reductions and contracts multiply-adds into FMAs differently on different
CPUs), so float results are compared with ``rtol=1e-5`` and an ``atol`` of about 1e-5 of the
compared quantities' scale (``atol=1e-6`` for constraint values and multipliers of order 0.1–1).
Every bug targeted here (a sign, a wrong index, a missing projection or decay, stale parameters)
moves the result by 1e-2 or more. Exact equality is kept only where the step promises it:
a projection that pins a value at exactly 0 (``max(λ+u, 0) - λ + λ`` is exactly 0), values the
step must leave untouched (``jnp.where`` of the old value: warm-up, ERM), and the same compiled
program run twice on the same inputs.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import cudt

L = 3


def layer_losses(params, batch, key):
    del key
    x, y = batch["x"], batch["y"]  # [B], [B]
    states = [x]
    for layer in range(params["w"].shape[0]):
        states.append(states[-1] * params["w"][layer])
    states = jnp.stack(states, axis=1)  # [B, L+1]
    return (states - y[:, None]) ** 2


def make_batch(seed=0, n=16):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n).astype(np.float32)
    return {"x": jnp.asarray(x), "y": jnp.asarray(0.5 * x)}


def params0():
    return {"w": jnp.asarray([1.1, 0.95, 0.7], jnp.float32)}


def expected_g(params, batch, epsilon, reference=None):
    m = np.asarray(layer_losses(params, batch, None)).mean(0)
    eps = np.broadcast_to(np.asarray(epsilon, np.float64), (L,))
    g = np.zeros(L + 1)
    g[1:] = m[1:] - (1 - eps) * m[:-1]
    if reference is not None:
        g[0] = m[0] - reference
    return m, g


def split(vector):
    """An ``[L+1]`` vector (index 0 the reference) as the state's ``{reference, descent}``."""
    v = jnp.asarray(vector, jnp.float32)
    return {"reference": v[0], "descent": v[1:]}


def lam_of(state):
    return cudt.descent.multipliers(state)


def slk(state):
    return cudt.descent.slacks(state)


def run(cfg, dual, steps=1, primal=None, batches=None, lam0=None, slacks0=None, **kw):
    init, step = cudt.make_train_step(
        layer_losses, primal or optax.sgd(0.0), dual, cfg, donate=False, **kw
    )
    state = init(params0())
    if lam0 is not None:
        state = state.replace(multipliers=split(lam0))
    if slacks0 is not None:
        state = state.replace(slacks=split(slacks0))
    key = jax.random.key(0)
    history = []
    for i in range(steps):
        batch = batches[i] if batches else make_batch(i)
        before = state
        state, metrics = step(state, batch, key)
        history.append((before, batch, metrics))
    return state, history


def test_dual_ascent_is_projected_sgd_ascent_exactly():
    eps = np.array([0.05, 0.1, 0.3], np.float32)
    cfg = cudt.DescentConfig(num_layers=L, epsilon=eps)
    lr = 0.5
    # λ starts positive on layer 3 so a negative g must be clipped at 0, not go negative.
    lam0 = [0.0, 0.2, 0.0, 0.01]
    state, hist = run(cfg, cudt.dual_ascent(lr), steps=3, lam0=lam0)
    for before, batch, metrics in hist:
        _, g = expected_g(before.params, batch, eps)
        np.testing.assert_allclose(metrics["constraint"], g, rtol=1e-5, atol=1e-6)
        lam_expected = np.maximum(0.0, np.asarray(lam_of(before)) + lr * g)
        np.testing.assert_allclose(metrics["multipliers"], lam_expected, rtol=1e-5, atol=1e-6)
    assert np.all(np.asarray(lam_of(state)) >= 0)
    # the sign: the first layer's constraint is violated (w_1 = 1.1 makes ℓ grow), λ_1 grows.
    assert float(lam_of(state)[1]) > 0.2
    # the projection: layer 3 descends (g < 0) and its multiplier is pinned at exactly 0.
    assert hist[0][2]["constraint"][3] < 0
    assert float(lam_of(state)[3]) == 0.0
    # no reference constraint: λ_0 stays 0.
    assert float(lam_of(state)[0]) == 0.0


def test_epsilon_indexing_per_layer():
    eps = np.array([0.0, 0.5, 0.9], np.float32)
    cfg = cudt.DescentConfig(num_layers=L, epsilon=eps)
    _, hist = run(cfg, cudt.dual_ascent(1.0))
    before, batch, metrics = hist[0]
    m, g = expected_g(before.params, batch, eps)
    # g_l uses ε_l = epsilon[l-1] against layer l-1: check each entry by hand.
    for layer in range(1, L + 1):
        want = m[layer] - (1 - eps[layer - 1]) * m[layer - 1]
        np.testing.assert_allclose(metrics["constraint"][layer], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(metrics["layer_loss"], m, rtol=1e-5)
    # a reversed ε would give a different answer: the test can tell them apart.
    _, g_rev = expected_g(before.params, batch, eps[::-1])
    assert not np.allclose(g, g_rev)


def test_simultaneous_update_uses_pre_step_parameters():
    cfg = cudt.DescentConfig(num_layers=L, epsilon=0.1)
    lr_primal, lr_dual = 0.3, 1.0
    batch = make_batch(0)
    _, hist = run(cfg, cudt.dual_ascent(lr_dual), primal=optax.sgd(lr_primal), batches=[batch])
    before, _, metrics = hist[0]
    _, g_pre = expected_g(before.params, batch, 0.1)
    np.testing.assert_allclose(
        metrics["multipliers"], np.maximum(0, lr_dual * g_pre), rtol=1e-5, atol=1e-6
    )
    # The primal step moved the parameters enough that g at the new ones differs clearly.
    params_after = {
        "w": before.params["w"]
        - lr_primal
        * jax.grad(lambda p: jnp.mean(layer_losses(p, batch, None)[:, -1]))(before.params)["w"]
    }
    _, g_post = expected_g(params_after, batch, 0.1)
    assert np.max(np.abs(np.maximum(0, g_post) - np.maximum(0, g_pre))) > 1e-2


def test_primal_gradient_is_gradient_of_lagrangian():
    cfg = cudt.DescentConfig(num_layers=L, epsilon=0.1)
    lr = 0.1
    lam0 = jnp.asarray([0.0, 2.0, 0.5, 1.0])
    batch = make_batch(3)
    state, hist = run(cfg, cudt.dual_ascent(1e-3), primal=optax.sgd(lr), batches=[batch], lam0=lam0)

    def lag(p):
        m = jnp.mean(layer_losses(p, batch, None), axis=0)
        g = m[1:] - 0.9 * m[:-1]
        return m[-1] + jnp.sum(lam0[1:] * g)

    want = params0()["w"] - lr * jax.grad(lag)(params0())["w"]
    np.testing.assert_allclose(state.params["w"], want, rtol=1e-5, atol=1e-6)
    # 𝓛 ≈ 0.1 is a sum of terms of order 1: an absolute tolerance at that scale.
    np.testing.assert_allclose(hist[0][2]["lagrangian"], lag(params0()), rtol=1e-5, atol=1e-5)


def test_erm_is_the_same_step_with_zero_multipliers():
    cfg = cudt.DescentConfig(num_layers=L, constrained=False)
    lr = 0.1
    batch = make_batch(4)
    state, hist = run(cfg, cudt.dual_ascent(10.0), primal=optax.sgd(lr), steps=1, batches=[batch])
    grad = jax.grad(lambda p: jnp.mean(layer_losses(p, batch, None)[:, -1]))(params0())
    np.testing.assert_allclose(
        state.params["w"], params0()["w"] - lr * grad["w"], rtol=1e-5, atol=1e-6
    )
    assert np.all(np.asarray(lam_of(state)) == 0)  # never updated: exactly 0
    m = hist[0][2]
    np.testing.assert_allclose(m["lagrangian"], m["objective"], rtol=1e-5)


def test_resilience_decay_form():
    alpha, lr = 2.0, 0.5
    cfg = cudt.DescentConfig(num_layers=L, epsilon=0.1, resilience=alpha)
    lam0 = [0.0, 1.0, 0.3, 0.0]
    _, hist = run(cfg, cudt.dual_ascent(lr), steps=2, lam0=lam0)
    for before, batch, metrics in hist:
        _, g = expected_g(before.params, batch, 0.1)
        lam = np.asarray(lam_of(before))
        want = np.maximum(0.0, lam + lr * (g - lam / alpha))
        np.testing.assert_allclose(metrics["multipliers"], want, rtol=1e-5, atol=1e-6)


def test_dual_adam_matches_optax_adam_on_negated_gradient():
    cfg = cudt.DescentConfig(num_layers=L, epsilon=0.1)
    lr = 0.05
    _, hist = run(cfg, cudt.dual_adam(lr), steps=3)
    adam = optax.adam(lr)
    lam = jnp.zeros(L + 1)
    opt_state = adam.init(lam)
    for before, batch, metrics in hist:
        _, g = expected_g(before.params, batch, 0.1)
        upd, opt_state = adam.update(-jnp.asarray(g, jnp.float32), opt_state, lam)
        lam = jnp.maximum(lam + upd, 0.0)
        # Adam moves each λ by about lr per step: atol relative to that scale.
        np.testing.assert_allclose(metrics["multipliers"], lam, rtol=1e-5, atol=1e-4 * lr)


def test_reference_constraint():
    cfg = cudt.DescentConfig(num_layers=L, epsilon=0.1, reference=0.01)
    _, hist = run(cfg, cudt.dual_ascent(1.0))
    before, batch, metrics = hist[0]
    m, g = expected_g(before.params, batch, 0.1, reference=0.01)
    assert g[0] > 0
    np.testing.assert_allclose(metrics["constraint"][0], m[0] - 0.01, rtol=1e-5)
    np.testing.assert_allclose(metrics["multipliers"][0], g[0], rtol=1e-5)


def test_warmup_freezes_duals():
    cfg = cudt.DescentConfig(num_layers=L, epsilon=0.1, warmup_steps=2)
    _, hist = run(cfg, cudt.dual_ascent(1.0), steps=3)
    assert np.all(np.asarray(hist[0][2]["multipliers"]) == 0)
    assert np.all(np.asarray(hist[1][2]["multipliers"]) == 0)
    assert float(hist[2][2]["multipliers"][1]) > 0


def adam_states(dual_state):
    """The ``ScaleByAdamState`` node (count, mu, nu) of the descent constraints' dual optimiser."""
    found = [
        node
        for node in jax.tree.leaves(
            dual_state["descent"], is_leaf=lambda n: isinstance(n, optax.ScaleByAdamState)
        )
        if isinstance(node, optax.ScaleByAdamState)
    ]
    assert len(found) == 1, dual_state
    return found[0]


def test_warmup_freezes_dual_adam_state_then_starts_fresh():
    """During warm-up neither λ nor Adam's moments/count move; the first active step is a fresh
    Adam's first step. (A warm-up that only masks λ but lets Adam accumulate would start with
    a stale bias correction and moments: visibly different updates.)"""
    warmup, lr = 3, 0.05
    cfg = cudt.DescentConfig(num_layers=L, epsilon=0.1, warmup_steps=warmup)
    # The primal moves during warm-up (it is a primal warm-up), so g changes from step to step.
    state, hist = run(cfg, cudt.dual_adam(lr), steps=warmup + 2, primal=optax.sgd(0.05))
    initial = hist[0][0].dual_state
    for i in range(warmup):
        before, _, metrics = hist[i]
        after = hist[i + 1][0]
        assert np.all(np.asarray(metrics["multipliers"]) == 0)
        assert np.all(np.asarray(lam_of(after)) == 0)
        adam = adam_states(after.dual_state)
        assert int(adam.count) == 0
        assert np.all(np.asarray(adam.mu) == 0) and np.all(np.asarray(adam.nu) == 0)
        chex.assert_trees_all_equal(after.dual_state, initial)
        # ... while the primal did train.
        assert not np.array_equal(after.params["w"], before.params["w"])

    # From step `warmup` on: an independent, fresh optax Adam on −g, projected onto λ ≥ 0.
    ref = optax.adam(lr)
    lam = jnp.zeros(L + 1, jnp.float32)
    ref_state = ref.init(lam)
    for k, (before, batch, metrics) in enumerate(hist[warmup:], start=1):
        _, g = expected_g(before.params, batch, 0.1)
        upd, ref_state = ref.update(-jnp.asarray(g, jnp.float32), ref_state, lam)
        lam = jnp.maximum(lam + upd, 0.0)
        np.testing.assert_allclose(metrics["multipliers"], lam, rtol=1e-5, atol=1e-4 * lr)
        after = hist[warmup + k][0] if warmup + k < len(hist) else state
        assert int(adam_states(after.dual_state).count) == k
    # The first active step is Adam's lr·sign(g) on the violated layer 1 (not lr·g, not 0).
    first = np.asarray(hist[warmup][2]["multipliers"])
    np.testing.assert_allclose(first[1], lr, rtol=1e-4)
    assert float(lam_of(state)[1]) > lr


def test_slack_projection_binds_at_exactly_zero():
    """u ← max(0, u − lr·(α·u − λ)): where λ = 0 and lr·α > 1 the unprojected step is negative
    and the slack must land at exactly 0; elsewhere it is the plain gradient step."""
    alpha, slack_lr = 1.0, 3.0
    cfg = cudt.DescentConfig(
        num_layers=L, epsilon=0.1, resilience=alpha, resilience_mode="slack", slack_lr=slack_lr
    )
    lam0 = np.array([0.0, 1.0, 0.0, 2.0], np.float32)
    u0 = np.array([0.5, 0.2, 0.4, 0.1], np.float32)
    _, hist = run(cfg, cudt.dual_ascent(0.1), lam0=lam0, slacks0=u0)
    before, _, metrics = hist[0]
    np.testing.assert_array_equal(slk(before), u0)  # the step really started from u0
    unprojected = u0.astype(np.float64) - slack_lr * (alpha * u0 - lam0)
    binds = unprojected < 0
    assert binds.tolist() == [True, False, True, False]  # both cases in one step
    slacks = np.asarray(metrics["slacks"])
    assert np.all(slacks >= 0)
    assert np.all(slacks[binds] == 0.0)  # the projection, exactly (not -1e-8, not u0)
    np.testing.assert_allclose(slacks[~binds], unprojected[~binds], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(slacks[~binds], [2.6, 5.8], rtol=1e-5)  # by hand


def test_explicit_slacks_and_restarts():
    alpha, slack_lr, lr = 4.0, 0.25, 1.0
    cfg = cudt.DescentConfig(
        num_layers=L,
        epsilon=0.1,
        resilience=alpha,
        resilience_mode="slack",
        slack_lr=slack_lr,
        slack_restart_steps=3,
    )
    _, hist = run(cfg, cudt.dual_ascent(lr), steps=4, lam0=[0.0, 1.0, 0.5, 0.0])
    for i, (before, batch, metrics) in enumerate(hist):
        _, g = expected_g(before.params, batch, 0.1)
        lam, u = np.asarray(lam_of(before)), np.asarray(slk(before))
        # ∇_λ𝓛 = g − u ; ∇_u𝓛 = αu − λ
        np.testing.assert_allclose(
            metrics["multipliers"], np.maximum(0, lam + lr * (g - u)), rtol=1e-5, atol=1e-6
        )
        u_new = np.maximum(0.0, u - slack_lr * (alpha * u - lam))
        if (i + 1) % 3 == 0:
            u_new = np.zeros_like(u_new)
        np.testing.assert_allclose(metrics["slacks"], u_new, rtol=1e-5, atol=1e-6)
    assert float(hist[1][2]["slacks"][1]) > 0  # slacks really moved before the restart
    assert np.all(np.asarray(hist[2][2]["slacks"]) == 0)  # ... and were reset at step 3


def test_step_compiles_once_and_metrics_shapes():
    cfg = cudt.DescentConfig(num_layers=L, epsilon=0.1)

    @chex.assert_max_traces(n=1)
    def traced_losses(params, batch, key):
        return layer_losses(params, batch, key)

    init, step = cudt.make_train_step(traced_losses, optax.adam(1e-2), cudt.dual_ascent(0.1), cfg)
    state = init(params0())
    key = jax.random.key(1)
    for i in range(4):
        state, metrics = step(state, make_batch(i), key)
    assert int(state.step) == 4
    for name in ("objective", "lagrangian", "grad_norm"):
        assert metrics[name].shape == ()
    for name in ("layer_loss", "constraint", "multipliers"):
        assert metrics[name].shape == (L + 1,)
    assert "slacks" not in metrics  # only with explicit slacks
    assert lam_of(state).shape == (L + 1,)


def test_state_is_donated():
    cfg = cudt.DescentConfig(num_layers=L)
    init, step = cudt.make_train_step(layer_losses, optax.adam(1e-2), cudt.dual_ascent(0.1), cfg)
    state = init(params0())
    old = state.params["w"]
    state, _ = step(state, make_batch(0), jax.random.key(0))
    assert old.is_deleted()


def test_randomness_comes_from_the_step_counter():
    cfg = cudt.DescentConfig(num_layers=L)

    def noisy_losses(params, batch, key):
        noise = jax.random.normal(key, batch["x"].shape)
        return layer_losses(params, {"x": batch["x"] + noise, "y": batch["y"]}, key)

    init, step = cudt.make_train_step(
        noisy_losses, optax.sgd(0.0), cudt.dual_ascent(1.0), cfg, donate=False
    )
    key = jax.random.key(3)
    s0 = init(params0())
    s1, m1 = step(s0, make_batch(0), key)
    _, m1_again = step(s0, make_batch(0), key)
    _, m2 = step(s1, make_batch(0), key)  # same batch, next step: new noise
    np.testing.assert_array_equal(m1["layer_loss"], m1_again["layer_loss"])
    assert not np.allclose(m1["layer_loss"], m2["layer_loss"])


def test_vmapped_seeds_equal_separate_runs():
    cfg = cudt.DescentConfig(num_layers=L, epsilon=0.1)
    init, step = cudt.make_train_step(
        layer_losses, optax.adam(1e-2), cudt.dual_adam(0.1), cfg, jit=False
    )
    ws = jnp.asarray([[1.1, 0.9, 0.8], [0.7, 1.2, 1.0]], jnp.float32)
    states = jax.vmap(lambda w: init({"w": w}))(ws)
    vstep = jax.jit(jax.vmap(step, in_axes=(0, None, None)))
    jstep = jax.jit(step)
    batch, key = make_batch(0), jax.random.key(0)
    singles = [init({"w": w}) for w in ws]
    for _ in range(3):
        states, _ = vstep(states, batch, key)
        singles = [jstep(s, batch, key)[0] for s in singles]
    # vmap vs one run at a time: two compiled programs; a mixed-up run differs by ~1e-2.
    for i, s in enumerate(singles):
        np.testing.assert_allclose(states.params["w"][i], s.params["w"], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(lam_of(states)[i], lam_of(s), rtol=1e-5, atol=1e-5)


def test_epsilon_sweep_via_state():
    cfg = cudt.DescentConfig(num_layers=L, epsilon=0.1)
    init, step = cudt.make_train_step(
        layer_losses, optax.sgd(0.0), cudt.dual_ascent(1.0), cfg, jit=False
    )
    eps_grid = jnp.asarray([0.0, 0.2, 0.4])
    states = jax.vmap(lambda e: init(params0(), epsilon=e))(eps_grid)
    batch = make_batch(0)
    _, metrics = jax.jit(jax.vmap(step, in_axes=(0, None, None)))(states, batch, jax.random.key(0))
    for i, e in enumerate(np.asarray(eps_grid)):
        _, g = expected_g(params0(), batch, e)
        np.testing.assert_allclose(metrics["constraint"][i], g, rtol=1e-5, atol=1e-6)


def test_wrong_loss_shape_is_a_clear_error():
    cfg = cudt.DescentConfig(num_layers=L + 1)
    init, step = cudt.make_train_step(layer_losses, optax.sgd(0.1), cudt.dual_ascent(0.1), cfg)
    with pytest.raises(ValueError, match=r"shape \[B, 5\].*num_layers"):
        step(init(params0()), make_batch(0), jax.random.key(0))
    # per-layer losses taken from the model's states [L+1, B, ...] come out [L+1, B]: the
    # message said to check num_layers, which was already right
    cfg = cudt.DescentConfig(num_layers=L)
    transposed = lambda p, b, k: layer_losses(p, b, k).T  # noqa: E731
    init, step = cudt.make_train_step(transposed, optax.sgd(0.1), cudt.dual_ascent(0.1), cfg)
    with pytest.raises(
        ValueError, match=rf"shape \[B, {L + 1}\].*got \({L + 1}, \d+\): return losses.T"
    ):
        step(init(params0()), make_batch(0), jax.random.key(0))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(num_layers=0), "num_layers"),
        (dict(num_layers=3, epsilon=1.0), r"\[0, 1\)"),
        (dict(num_layers=3, epsilon=-0.1), r"\[0, 1\)"),
        (dict(num_layers=3, epsilon=[0.1, 0.2]), "3 values"),
        (dict(num_layers=3, resilience=0.0), "resilience"),
        (dict(num_layers=3, resilience_mode="slack"), "needs resilience"),
        (dict(num_layers=3, warmup_steps=-1), "warmup_steps"),
    ],
)
def test_config_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        cudt.DescentConfig(**kwargs)


def test_dual_learning_rate_validation():
    with pytest.raises(ValueError, match="dual learning rate must be > 0"):
        cudt.dual_ascent(0.0)
    with pytest.raises(ValueError, match="dual learning rate must be > 0"):
        cudt.dual_adam(-1e-3)


def test_config_is_hashable():
    cfg = cudt.DescentConfig(num_layers=3, epsilon=np.array([0.1, 0.2, 0.3]))
    assert hash(cfg) == hash(cudt.DescentConfig(num_layers=3, epsilon=[0.1, 0.2, 0.3]))


def test_config_numbers_are_python_floats_whatever_their_spelling():
    """reference, resilience, tail_beta and slack_lr given as ints, numpy or JAX scalars are
    stored as floats: a 0-d array made the config unhashable (no static jit argument)."""
    plain = cudt.DescentConfig(
        num_layers=2, reference=1.0, resilience=2.0, tail_beta=0.5, slack_lr=0.25
    )
    for number in (int, np.float32, np.array, jnp.asarray):
        cfg = cudt.DescentConfig(
            num_layers=2,
            reference=number(1),
            resilience=number(2),
            tail_beta=np.float64(0.5),
            slack_lr=number(0.25) if number is not int else 0.25,
        )
        assert cfg == plain and hash(cfg) == hash(plain), number
        for name in ("reference", "resilience", "tail_beta", "slack_lr"):
            assert type(getattr(cfg, name)) is float, (number, name)
        layers = jax.jit(lambda c: c.num_layers, static_argnums=0)(cfg)
        assert layers == 2
    with pytest.raises(ValueError, match=r"tail_beta must be a number, got \[0.5\]"):
        cudt.DescentConfig(num_layers=2, tail_beta=[0.5])


def test_scheduled_dual_ascent_counts_only_dual_steps_and_settles():
    """A linear dual schedule over N dual steps: the k-th dual update (after the warm-up) is
    ``lr·(1 − k/N)·g`` exactly as SGD ascent would be with that rate, and λ stands still
    once the rate reaches 0 (the schedule's count stands still during the warm-up)."""
    from cudt.optim import dual_optimizer, lr_factor

    factor = lr_factor("linear", 4)
    np.testing.assert_allclose([float(factor(k)) for k in (0, 2, 4, 9)], [1, 0.5, 0, 0])
    cosine = lr_factor("cosine", 10)
    np.testing.assert_allclose([float(cosine(k)) for k in (0, 5, 10)], [1, 0.5, 0], atol=1e-7)
    cfg = cudt.DescentConfig(num_layers=L, epsilon=0.1, warmup_steps=2)
    lr = 2.0
    _, hist = run(cfg, dual_optimizer("sgd", lr, "linear", 4), steps=8, lam0=[0, 0.3, 0.3, 0.3])
    for i, (before, _, metrics) in enumerate(hist):
        lam_before = np.asarray(lam_of(before))
        lam_after = np.asarray(metrics["multipliers"])
        if i < 2 or i >= 6:  # warm-up, then the rate is 0: λ is left exactly as it was
            np.testing.assert_array_equal(lam_after, lam_before)
            continue
        rate = lr * (1 - (i - 2) / 4)
        g = np.asarray(metrics["constraint"])
        want = np.maximum(lam_before + rate * g, 0.0)
        want[0] = lam_before[0]  # no reference constraint: its λ stays 0
        np.testing.assert_allclose(lam_after, want, rtol=1e-5, atol=1e-6)
        assert not np.allclose(lam_after, lam_before)  # the dual does move while the rate > 0
