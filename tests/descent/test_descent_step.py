"""The descent problem's constraint kinds through cudt.make_train_step: per-run values are state
(lanes of one program equal runs alone), indexed moves only the batch's rows, tail is the CVaR of
the per-sample ratios (against numpy) and meets its bound, and every kind composes with every
update scheme, dual optimiser and resilience mode."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cudt
from cudt.descent import tail_values
from cudt.optim import dual_optimizer, primal_optimizer

L, B, D, N = 3, 8, 4, 40


def _layer_losses(params, batch, key):
    pred = jnp.einsum("bd,ld->bl", batch["x"], params["w"])  # [B, L+1]
    noise = 0.01 * jax.random.normal(key, pred.shape) ** 2  # the step's key reaches the loss
    return (pred - batch["y"][:, None]) ** 2 + noise


# numpy, not jax arrays: importing this module starts no JAX backend
_rng = np.random.default_rng(0)
X = _rng.normal(size=(N, D)).astype(np.float32)
Y = _rng.normal(size=(N,)).astype(np.float32)
PARAMS = {"w": _rng.normal(size=(L + 1, D)).astype(np.float32)}


def _batch(t, size=B):
    index = jax.random.choice(jax.random.key(100 + t), N, (size,), replace=False)
    return {"x": X[index], "y": Y[index], "index": index}


@pytest.mark.parametrize("dual", ["adam", "nupi"])
def test_lanes_of_one_program_equal_each_run_alone(dual):
    """Three lanes of one vmapped program (reference on, different ε/lr/dual lr/β, resilience,
    an ERM lane) with a warm-up give what each run trained alone gives: the run's values are
    state, not program."""
    cfg = cudt.DescentConfig(num_layers=L, epsilon=0.1, warmup_steps=2)
    init, step = cudt.make_train_step(
        _layer_losses,
        primal_optimizer(1e-2),
        dual_optimizer(dual, 0.5, nupi_kp=0.5),
        cfg,
        update="alternating",
        jit=False,
    )
    hp = {
        "epsilon": [0.1, 0.2, 0.1],
        "reference": [0.5, np.nan, 0.2],
        "resilience": [np.inf, np.inf, 1.0],
        "constrained": [True, True, False],
        "lr": [1e-2, 3e-2, 1e-2],
        "dual_lr": [0.5, 0.2, 0.5],
    }
    hp = {k: jnp.asarray(v) for k, v in hp.items()}
    lanes = jax.vmap(lambda h: init(PARAMS, **h))(hp)
    vstep = jax.jit(jax.vmap(step, in_axes=(0, None, None)))
    one = jax.jit(step)
    alone = [init(PARAMS, **{k: v[r] for k, v in hp.items()}) for r in range(3)]
    for t in range(10):
        lanes, m = vstep(lanes, _batch(t), jax.random.key(t))
        alone = [one(s, _batch(t), jax.random.key(t))[0] for s in alone]
    for r, s in enumerate(alone):
        np.testing.assert_allclose(lanes.params["w"][r], s.params["w"], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(
            cudt.descent.multipliers(lanes)[r], cudt.descent.multipliers(s), rtol=1e-5, atol=1e-6
        )
    lam = cudt.descent.multipliers(lanes)
    assert float(jnp.max(lam[0, 1:])) > 0 and float(lam[0, 0]) > 0  # the reference is on
    assert float(lam[1, 0]) == 0.0  # ... and off
    assert np.all(np.asarray(lam[2]) == 0)  # the ERM lane


@pytest.mark.parametrize("update", ["simultaneous", "alternating"])
def test_indexed_moves_only_the_batch_rows(update):
    cfg = cudt.DescentConfig(num_layers=L, epsilon=0.3)
    init, step = cudt.make_train_step(
        _layer_losses,
        primal_optimizer(1e-2),
        dual_optimizer("adam", 0.5),
        cfg,
        constraint="indexed",
        update=update,
        num_examples=N,
        example_ids=lambda batch: batch["index"],
    )
    state = init(PARAMS)
    assert state.multipliers["descent"].shape == (N, L)
    for t in range(3):  # rows written by earlier steps must stay as they are too
        before = jax.tree.map(np.array, state)
        batch = _batch(t)
        state, metrics = step(state, batch, jax.random.key(t))
        rows = np.asarray(batch["index"])
        other = np.setdiff1d(np.arange(N), rows)
        table = np.asarray(state.multipliers["descent"])
        moments = [
            np.asarray(x) for x in jax.tree.leaves(state.dual_state["descent"]) if np.ndim(x) == 2
        ]
        old_moments = [x for x in jax.tree.leaves(before.dual_state["descent"]) if np.ndim(x) == 2]
        assert len(moments) == 2  # Adam's mu and nu, shaped like the table
        assert table[other].tobytes() == before.multipliers["descent"][other].tobytes()
        for new, old in zip(moments, old_moments, strict=True):
            assert new[other].tobytes() == old[other].tobytes()
            assert not np.array_equal(new[rows], old[rows])
        assert not np.array_equal(table[rows], before.multipliers["descent"][rows])
    # the summary: each layer's mean and max over the table
    lam = cudt.descent.multipliers(state)
    np.testing.assert_allclose(lam[1:], table.mean(0), rtol=1e-6)
    np.testing.assert_allclose(
        cudt.descent.multipliers(state, jnp.max)[1:], table.max(0), rtol=1e-6
    )
    np.testing.assert_allclose(metrics["multipliers"], lam, rtol=1e-6)
    np.testing.assert_allclose(metrics["multipliers_max"][1:], table.max(0), rtol=1e-6)


def _cvar_numpy(losses, eps, beta):
    ratios = losses[:, 1:] / losses[:, :-1]
    k = max(1, int(np.ceil(beta * losses.shape[0])))
    return np.sort(ratios, axis=0)[::-1][:k].mean(0) - (1 - eps)


@pytest.mark.parametrize("beta", [0.25, 0.5, 1.0])
def test_tail_constraint_is_the_cvar_of_the_ratios(beta):
    losses = np.asarray(_layer_losses(PARAMS, _batch(0), jax.random.key(0)), np.float64)
    got = np.asarray(tail_values(jnp.asarray(losses, jnp.float32), 0.1, beta))
    np.testing.assert_allclose(got, _cvar_numpy(losses, 0.1, beta), rtol=1e-5)
    mean_form = losses[:, 1:].mean(0) / losses[:, :-1].mean(0) - 0.9
    assert not np.allclose(got, mean_form, rtol=1e-3)  # not the ratio of the means

    # the step reports it, and its multipliers ascend on it
    cfg = cudt.DescentConfig(num_layers=L, epsilon=0.1, tail_beta=0.5)
    init, step = cudt.make_train_step(
        _layer_losses, primal_optimizer(1e-2), dual_optimizer("sgd", 0.5), cfg, constraint="tail"
    )
    state = init(PARAMS, tail_beta=beta)
    state, metrics = step(state, _batch(0), jax.random.key(0))
    key = jax.random.fold_in(jax.random.key(0), 0)
    seen = np.asarray(_layer_losses(PARAMS, _batch(0), key), np.float64)
    np.testing.assert_allclose(metrics["constraint"][1:], _cvar_numpy(seen, 0.1, beta), rtol=1e-5)
    np.testing.assert_allclose(
        cudt.descent.multipliers(state)[1:],
        np.maximum(0, 0.5 * _cvar_numpy(seen, 0.1, beta)),
        rtol=1e-5,
    )


@pytest.mark.parametrize("beta, size", [(0.3, 50), (0.15, 100), (0.27, 100)])
def test_the_tail_takes_beta_b_ratios_where_beta_b_is_whole(beta, size):
    """βB = 15, 15, 27 exactly, which float32 puts a hair above (0.3·50 = 15.0000006): the
    CVaR must average the βB largest ratios, not one more. The βB largest are 1, the rest 0:
    the tail's ratio is 1 (it read 15/16 with one 0 averaged in)."""
    n = round(beta * size)
    ratios = np.where(np.arange(size) < n, 1.0, 0.0)
    losses = np.stack([np.ones(size), ratios], axis=1).astype(np.float32)  # ℓ_0 = 1, ℓ_1 = r
    got = float(tail_values(jnp.asarray(losses), 0.0, jnp.float32(beta))[0])
    assert got == 0.0, got  # CVaR 1 − (1 − ε) with ε = 0


def test_tail_lowers_the_worst_ratios_that_mean_leaves():
    """A residual tanh denoiser (3 layers) on one batch of 32, 200 steps, ε = 0.3. What the tail
    constraint (β = 0.25) guarantees: every layer's CVaR of the per-sample ratios ℓ_l/ℓ_{l−1}
    stays near its bound 1 − ε. What the mean constraint does not: its worst layer leaves a tail
    (here a layer makes some samples 20× worse while its mean descends), far above the tail
    run's worst. Layer by layer the two runs can be close (the mean run's easy layers), so only
    the worst layer is compared.

    Both are read as averages over the last 50 steps, the iterates primal-dual methods make
    promises about: at dual rate 1 the tail run's CVaR oscillates around the bound, 0.68–0.93
    at single steps from 150 to 600, so one step's value depends on the code generator's
    rounding; the average was 0.77–0.80 on every layer under three XLA:CPU settings."""
    layers, dim, size = 3, 6, 32
    rng = np.random.default_rng(0)
    clean = jnp.asarray(rng.normal(size=(size, 2)) @ rng.normal(size=(2, dim)), jnp.float32)
    noisy = clean + 0.5 * jnp.asarray(rng.normal(size=(size, dim)), jnp.float32)

    def losses_of(params, batch, key):
        out = [batch[1]]
        for layer in range(layers):
            out.append(out[-1] - jnp.tanh(out[-1] @ params["w"][layer]))
        return jnp.mean((jnp.stack(out, 1) - batch[0][:, None]) ** 2, -1)

    params = {"w": 0.05 * jax.random.normal(jax.random.key(1), (layers, dim, dim))}

    def run(constraint):
        init, step = cudt.make_train_step(
            losses_of,
            primal_optimizer(3e-2),
            dual_optimizer("sgd", 1.0),
            cudt.DescentConfig(num_layers=layers, epsilon=0.3, tail_beta=0.25),
            constraint=constraint,
        )
        state, worst, cvar = init(params), [], []
        for t in range(200):
            state, _ = step(state, (clean, noisy), jax.random.key(t))
            if t >= 150:
                losses = np.asarray(losses_of(state.params, (clean, noisy), None))
                ratios = losses[:, 1:] / losses[:, :-1]
                worst.append(ratios.max(0))
                cvar.append(np.sort(ratios, 0)[::-1][:8].mean(0))
        return np.mean(worst, 0), np.mean(cvar, 0)

    (worst_mean, cvar_mean), (worst_tail, cvar_tail) = run("mean"), run("tail")
    assert np.all(cvar_tail < 0.7 + 0.15), cvar_tail  # near the bound 1 − ε on every layer
    assert cvar_tail.max() < 0.5 * cvar_mean.max(), (cvar_tail, cvar_mean)
    assert worst_tail.max() < 0.5 * worst_mean.max(), (worst_tail, worst_mean)


@pytest.mark.parametrize(
    "constraint,update",
    [
        ("mean", "alternating"),
        ("indexed", "alternating"),
        ("tail", "alternating"),
        ("mean", "extragradient"),
    ],
)
@pytest.mark.parametrize("mode", ["decay", "slack"])
def test_every_constraint_kind_takes_resilience_with_nupi_and_every_update(
    constraint, mode, update
):
    """The video default's dynamics (nuPI duals, alternating) and classic extragradient, with
    resilient constraints of every kind, in both forms: the relaxation is really there (the
    slacks grow where λ > 0; after two steps from λ = 0 the decay has taken λ_1/α off what the
    hard run's multipliers gained) and the runs stay finite."""
    cfg = dict(num_layers=L, epsilon=0.6, tail_beta=0.5, slack_lr=0.5)  # ε = 0.6: violated

    def train(resilience, resilience_mode, steps=8):
        init, step = cudt.make_train_step(
            _layer_losses,
            primal_optimizer(1e-2),
            dual_optimizer("nupi", 0.5, nupi_kp=1.0),
            cudt.DescentConfig(resilience=resilience, resilience_mode=resilience_mode, **cfg),
            constraint=constraint,
            update=update,
            num_examples=N,
            example_ids=lambda batch: batch["index"],
        )
        state = init(PARAMS)
        for t in range(steps):
            state, metrics = step(state, _batch(t % 2 if steps > 2 else 0), jax.random.key(t))
        assert all(bool(jnp.all(jnp.isfinite(v))) for v in jax.tree.leaves(metrics))
        return state

    alpha = 0.5 if mode == "slack" else 5.0  # the decay: a step of η(K_I + K_P)/α = 0.2 of λ
    state = train(alpha, mode)
    lam = cudt.descent.multipliers(state)
    assert float(jnp.max(lam[1:])) > 0  # the constraints are violated and active
    if mode == "slack":
        u = cudt.descent.slacks(state)
        assert u.shape == lam.shape and float(jnp.max(u[1:])) > 0
        assert bool(jnp.all(u >= 0))
    else:
        assert cudt.descent.slacks(state) is None
        hard = cudt.descent.multipliers(train(None, "decay", steps=2))
        soft = cudt.descent.multipliers(train(alpha, "decay", steps=2))
        assert float(jnp.sum(soft[1:])) < float(jnp.sum(hard[1:]))  # the decay took λ/α off


def _scaled(c):
    return lambda params, batch, key: c * _layer_losses(params, batch, key)


def test_relative_dual_step_ascends_the_relative_violation():
    """With dual_scale="relative", one dual SGD step from λ = 0 is lr·max(0, ℓ_l/ℓ_{l−1} −
    (1 − ε)) of the batch's mean losses (and lr·max(0, ℓ_0/C − 1) for the reference)."""
    eps, lr, C = 0.1, 0.5, 0.05
    cfg = cudt.DescentConfig(num_layers=L, epsilon=eps, reference=C, dual_scale="relative")
    init, step = cudt.make_train_step(
        _layer_losses, primal_optimizer(1e-2), cudt.dual_ascent(lr), cfg
    )
    state = init(PARAMS)
    batch, key = _batch(0), jax.random.key(0)
    state, m = step(state, batch, key)
    mean = np.asarray(m["layer_loss"], np.float64)
    want = lr * np.maximum(0.0, np.r_[mean[0] / C - 1.0, mean[1:] / mean[:-1] - (1 - eps)])
    assert np.any(want > 0)
    np.testing.assert_allclose(np.asarray(m["multipliers"]), want, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(
    "kind, slacks", [("mean", False), ("indexed", False), ("tail", False), ("mean", True)]
)
def test_relative_dual_scale_makes_multipliers_independent_of_the_loss_units(kind, slacks):
    """The same problem in other units (every loss times 1e-4, as pixel MSE against
    cross-entropy) trains the same multipliers with dual_scale="relative" (a scale-free primal,
    Adam, sees the same directions), while "absolute" multipliers shrink with the units. With
    explicit slacks too: they live in the losses' units and step by s·(their gradient) (they
    stepped by λ in any units, at 1e-4 overshooting to a slack past the violation)."""
    slack = dict(resilience=1.0, resilience_mode="slack", slack_lr=0.05) if slacks else {}

    def run(c, scale):
        cfg = cudt.DescentConfig(num_layers=L, epsilon=0.3, dual_scale=scale, **slack)
        init, step = cudt.make_train_step(
            _scaled(c),
            optax_adam(),
            cudt.nupi(2.0, kp=1.0),
            cfg,
            constraint=kind,
            num_examples=N,
            example_ids=lambda b: b["index"],
        )
        state = init(PARAMS)
        for t in range(6):
            state, m = step(state, _batch(t), jax.random.key(t))
        return np.asarray(m["multipliers"]), np.asarray(state.params["w"])

    lam1, w1 = run(1.0, "relative")
    lam2, w2 = run(1e-4, "relative")
    assert np.max(lam1) > 0.1  # the constraints are active
    np.testing.assert_allclose(lam2, lam1, rtol=2e-3, atol=1e-5)
    np.testing.assert_allclose(w2, w1, rtol=2e-3, atol=1e-5)
    if kind != "tail":  # "absolute": λ shrinks with the units (tail's value is a ratio)
        abs1, _ = run(1.0, "absolute")
        abs2, _ = run(1e-4, "absolute")
        assert np.max(abs2) < 1e-2 * np.max(abs1)


def test_erm_is_the_same_with_either_dual_scale():
    """The dual scale changes only the dual step: an ERM run's parameters are bit-identical."""
    out = []
    for scale in ("absolute", "relative"):
        cfg = cudt.DescentConfig(num_layers=L, epsilon=0.1, dual_scale=scale)
        init, step = cudt.make_train_step(
            _layer_losses, primal_optimizer(1e-2), cudt.dual_ascent(1.0), cfg
        )
        state = init(PARAMS, constrained=False)
        for t in range(3):
            state, _ = step(state, _batch(t), jax.random.key(t))
        out.append(np.asarray(state.params["w"]))
    np.testing.assert_array_equal(out[0], out[1])


def optax_adam():
    import optax

    return optax.adam(1e-2, eps=1e-20)  # scale-free: the update ignores the loss's units


@pytest.mark.parametrize("kind", ["mean", "indexed", "tail"])
def test_stopped_previous_loss_keeps_the_values_and_cuts_the_gradient_to_the_earlier_state(kind):
    """previous_loss="stop_gradient": the same constraint values, but ℓ_{l−1} is a target:
    the row of ``w`` that feeds only ℓ_0 gets no gradient from the descent constraints, and each
    other row gets only its own loss's; "differentiable" (the paper's) pushes ℓ_0 up."""
    batch, key = _batch(0), jax.random.key(0)

    def descent(previous):
        cfg = cudt.DescentConfig(num_layers=L, epsilon=0.1, previous_loss=previous)
        problem = cudt.descent.problem(_layer_losses, cfg, kind, example_ids=lambda b: b["index"])
        hp = cudt.descent.hparams(cfg)

        def total(params):
            return jnp.sum(problem(params, batch, key, hp)[1]["descent"].value)

        return total(PARAMS), jax.grad(total)({"w": jnp.asarray(PARAMS["w"])})["w"]

    value_d, grad_d = descent("differentiable")
    value_s, grad_s = descent("stop_gradient")
    np.testing.assert_allclose(value_s, value_d, rtol=1e-6)
    assert np.max(np.abs(grad_d[0])) > 1e-3  # the paper's form moves the input state's loss
    np.testing.assert_array_equal(grad_s[0], 0.0)
    if kind != "tail":  # a sum of ℓ_l − (1 − ε) ℓ_{l−1}: row l (1..L) gets exactly ℓ_l's gradient
        own = jax.grad(
            lambda w: jnp.sum(jnp.mean(_layer_losses({"w": w}, batch, key), axis=0)[1:])
        )(jnp.asarray(PARAMS["w"]))
        if kind == "indexed":  # the batch's rows, summed: B times the mean's gradient
            own = own * B
        np.testing.assert_allclose(grad_s[1:], own[1:], rtol=1e-4, atol=1e-6)
    with pytest.raises(ValueError, match="previous_loss must be one of"):
        cudt.DescentConfig(num_layers=L, previous_loss="detached")


def test_with_explicit_slacks_alpha_is_a_runs_value_not_the_programs():
    """DescentConfig's docstring listed ``resilience`` as static "with explicit slacks": it is
    a run's value there too (their cost (α/2)‖u‖² reads the state's α), so two lanes of one
    compiled step at α 0.5 and 4 grow other slacks, each as that run alone."""
    assert "(with explicit slacks, ``resilience`` too)" not in cudt.DescentConfig.__doc__
    cfg = cudt.DescentConfig(
        num_layers=L, epsilon=0.6, resilience=1.0, resilience_mode="slack", slack_lr=0.5
    )
    init, step = cudt.make_train_step(
        _layer_losses, primal_optimizer(1e-2), cudt.dual_ascent(0.5), cfg, jit=False
    )
    alphas = jnp.asarray([0.5, 4.0])
    lanes = jax.vmap(lambda a: init(PARAMS, resilience=a))(alphas)
    vstep = jax.jit(jax.vmap(step, in_axes=(0, None, None)))
    alone = [init(PARAMS, resilience=a) for a in alphas]
    for t in range(6):
        lanes, _ = vstep(lanes, _batch(t % 2), jax.random.key(t))
        alone = [jax.jit(step)(s, _batch(t % 2), jax.random.key(t))[0] for s in alone]
    u = np.asarray(cudt.descent.slacks(lanes))
    assert float(np.abs(u[0] - u[1]).max()) > 1e-3  # the α of each lane, not the config's 1
    for r, s in enumerate(alone):
        np.testing.assert_allclose(u[r], cudt.descent.slacks(s), rtol=1e-5, atol=1e-6)
