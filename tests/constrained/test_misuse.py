"""What a user of the library gets wrong, named in one line (or shown as NaN) instead of trained
silently: a dual optimiser's name or rate, negative gains, a non-positive resilience or penalty,
indexed ids that are not row ids of the table, a NaN constraint's violation, the arguments of
``make_train_step`` in another order, an injected hyperparameter under another name, a state built
by another step's ``init`` (another update scheme, optimiser, problem or config)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import cudt
from cudt.optim import dual_optimizer

N = 10


def indexed_problem(params, batch, key):
    x, ids = batch
    g = (x * params["w"]) ** 2 - 1.0  # violated wherever |x·w| > 1
    return jnp.mean(params["w"] ** 2), {"rows": cudt.Constraint(g, index=ids)}


def indexed_step(jit):
    return cudt.make_constrained_step(
        indexed_problem, optax.sgd(1e-2), cudt.dual_ascent(0.5), jit=jit, donate=False
    )


def test_the_dual_optimiser_factory_checks_its_name_and_rate():
    with pytest.raises(ValueError, match="unknown dual optimiser 'adamw': choose from adam, sgd"):
        dual_optimizer("adamw", 0.5)
    with pytest.raises(ValueError, match="dual learning rate must be > 0, got -0.5"):
        dual_optimizer("sgd", -0.5)
    dual_optimizer("nupi", 0.5)  # the three names build
    # a schedule (dual_ascent takes one) failed deep inside nupi's first step
    with pytest.raises(TypeError, match="not a schedule: pass a number, or nupi"):
        cudt.nupi(optax.linear_schedule(0.1, 0.01, 10))


def test_negative_gains_resilience_and_penalty_are_refused():
    with pytest.raises(ValueError, match="nupi's ki must be >= 0, got -1.0"):
        cudt.nupi(0.5, ki=-1.0)
    with pytest.raises(ValueError, match="nupi's kp must be >= 0, got -0.5"):
        cudt.nupi(0.5, kp=-0.5)
    with pytest.raises(ValueError, match="Constraint resilience must be > 0"):
        cudt.Constraint(jnp.ones(()), resilience=-0.5)
    # the fix names α, not a learning rate (found by review)
    with pytest.raises(ValueError, match=r"alpha must be > 0, got 0\.0: pass a positive alpha"):
        cudt.resilience_decay(0)
    cudt.Constraint(jnp.ones(()), resilience=jnp.inf)  # inf: a hard constraint
    # but explicit slacks cost (α/2)·u², NaN at α = inf: refused wherever α is concrete
    with pytest.raises(ValueError, match="finite with explicit slacks"):
        cudt.Constraint(jnp.ones(()), resilience=jnp.inf, resilience_mode="slack")
    with pytest.raises(ValueError, match="needs resilience=alpha > 0 and finite, got inf"):
        cudt.DescentConfig(num_layers=2, resilience=float("inf"), resilience_mode="slack")
    cfg = cudt.DescentConfig(num_layers=2, resilience=1.0, resilience_mode="slack")
    init_run, _ = cudt.make_train_step(
        lambda p, b, k: jnp.stack(
            [jnp.ones(4), p[0] ** 2 * jnp.ones(4), p[1] ** 2 * jnp.ones(4)], 1
        ),
        optax.sgd(0.1),
        cudt.dual_ascent(0.1),
        cfg,
    )
    with pytest.raises(ValueError, match="finite with explicit slacks"):
        init_run(jnp.ones(2), resilience=float("inf"))
    init, _ = cudt.make_constrained_step(
        lambda p, b, k: (jnp.sum(p["w"] ** 2), {"c": cudt.Constraint(p["w"][0] - 1.0)}),
        optax.sgd(0.1),
        cudt.dual_ascent(0.1),
        cudt.AugmentedLagrangian(penalty=1.0),
    )
    # a cap under the penalty or a tolerance <= 0 drove the penalty negative, the run to NaN
    with pytest.raises(ValueError, match=r"penalty_max must be >= penalty \(10\)"):
        cudt.QuadraticPenalty(penalty=10, growth=2, penalty_max=-1)
    for tolerance in (0.0, -1.0, float("inf")):
        with pytest.raises(ValueError, match="tolerance must be a finite number > 0"):
            cudt.AugmentedLagrangian(penalty=1.0, growth=2, tolerance=tolerance)
    with pytest.raises(ValueError, match="init's penalty must be >= 0"):
        init({"w": jnp.ones(2)}, None, penalty=-1.0)
    assert float(init({"w": jnp.ones(2)}, None, penalty=2.0).penalty["c"]) == 2.0


def test_init_values_that_no_part_of_the_step_reads_are_refused():
    """``penalty=`` under the Lagrangian and ``tail_beta=`` under a constraint other than
    "tail" sat in the state unread: the run trained as if they were not given."""
    init, _ = cudt.make_constrained_step(
        lambda p, b, k: (jnp.sum(p["w"] ** 2), {"c": cudt.Constraint(p["w"][0] - 1.0)}),
        optax.sgd(0.1),
        cudt.dual_ascent(0.1),
    )
    with pytest.raises(ValueError, match="Lagrangian has none .*AugmentedLagrangian"):
        init({"w": jnp.ones(2)}, None, penalty=2.0)
    losses = lambda p, b, k: jnp.stack([jnp.ones(4), jnp.ones(4) * p["w"]], 1)  # noqa: E731
    cfg = cudt.DescentConfig(num_layers=1, epsilon=0.1)
    for constraint, fine in (("mean", False), ("tail", True)):
        init, _ = cudt.make_train_step(
            losses, optax.sgd(0.1), cudt.dual_ascent(0.1), cfg, constraint=constraint
        )
        if fine:
            assert float(init({"w": jnp.ones(())}, tail_beta=0.5).hparams["tail_beta"]) == 0.5
        else:
            with pytest.raises(ValueError, match="constraint is 'mean' .*constraint='tail'"):
                init({"w": jnp.ones(())}, tail_beta=0.5)


def test_a_dual_rate_given_twice_to_init_is_refused():
    """``init(dual_lr=a, dual_hparams={"learning_rate": b})`` trained at b, a dropped unseen."""
    losses = lambda p, b, k: jnp.stack([jnp.ones(4), jnp.ones(4) * p["w"]], 1)  # noqa: E731
    dual = optax.inject_hyperparams(cudt.dual_ascent)(learning_rate=0.1)
    init, _ = cudt.make_train_step(
        losses, optax.sgd(0.1), dual, cudt.DescentConfig(num_layers=1, epsilon=0.1)
    )
    with pytest.raises(ValueError, match="'learning_rate' twice, as dual_lr= and in dual_hparams"):
        init({"w": jnp.ones(())}, dual_lr=0.5, dual_hparams={"learning_rate": 0.2})
    once = init({"w": jnp.ones(())}, dual_hparams={"learning_rate": 0.2})  # once is fine
    assert float(once.dual_state["descent"].hyperparams["learning_rate"]) == pytest.approx(0.2)


def test_indexed_ids_outside_the_table_are_refused_or_nan_never_dropped():
    params = {"w": jnp.ones(())}
    x = jnp.full((16,), 3.0)  # every row violated
    ids = jnp.arange(16)  # rows 10..15 are not in a table of 10
    init, step = indexed_step(jit=False)
    state = init(params, (x, ids % N), num_indexed={"rows": N})
    with pytest.raises(ValueError, match=r"index ids must lie in \[0, 10\).*got 0 to 15"):
        step(state, (x, ids), jax.random.key(0))
    _, jitted = indexed_step(jit=True)
    _, m = jitted(state, (x, ids), jax.random.key(0))
    assert np.isnan(float(m["lagrangian"]))  # shown, not a violated row silently ignored
    new, m = jitted(state, (x, ids % N), jax.random.key(0))  # in range: the rows rise
    assert np.isfinite(float(m["lagrangian"])) and np.all(np.asarray(new.multipliers["rows"]) > 0)
    with pytest.raises(ValueError, match="index must hold integer row ids, got dtype float32"):
        step(state, (x, ids.astype(jnp.float32)), jax.random.key(0))
    with pytest.raises(ValueError, match=r"ids of shape \(8,\) against values of shape \(16,\)"):
        step(state, (x, ids[:8]), jax.random.key(0))


def test_a_nan_constraint_shows_a_nan_violation():
    for formulation in (cudt.Lagrangian(), cudt.AugmentedLagrangian(), cudt.QuadraticPenalty()):
        init, step = cudt.make_constrained_step(
            lambda p, b, k: (jnp.sum(p["w"]), {"c": cudt.Constraint(jnp.sqrt(p["w"][0] - 100))}),
            optax.sgd(0.1),
            cudt.dual_ascent(0.1),
            formulation,
        )
        _, m = step(init({"w": jnp.ones(2)}, None), None, jax.random.key(0))
        assert np.isnan(float(m["violation"]["c"])), formulation  # was 0.0: "met"


def test_make_train_step_names_its_config_when_the_arguments_are_swapped():
    cfg = cudt.DescentConfig(num_layers=2, epsilon=0.1)
    with pytest.raises(TypeError, match="config must be a cudt.DescentConfig, got"):
        cudt.make_train_step(lambda p, b, k: b, cfg, optax.adam(1e-2), cudt.dual_ascent(0.1))
    init, _ = cudt.make_train_step(lambda p, b, k: b, optax.adam(1e-2), cudt.dual_ascent(0.1), cfg)
    with pytest.raises(TypeError, match="make_train_step's init takes the params alone"):
        init({"w": jnp.ones(())}, jnp.ones((4, 3)))  # make_constrained_step's habit: a batch
    with pytest.raises(ValueError, match="reference must be a number .* got 'a'"):
        init({"w": jnp.ones(())}, reference="a")
    init, step = cudt.make_train_step(
        lambda p, b, k: jnp.round(b * p["w"]).astype(jnp.int32),  # no gradient: said, not 0
        optax.adam(1e-2),
        cudt.dual_ascent(0.1),
        cfg,
    )
    with pytest.raises(TypeError, match="must return floating-point losses, got int32"):
        step(init({"w": jnp.ones(())}), jnp.ones((4, 3)), jax.random.key(0))


def test_an_injected_hyperparameter_under_another_name_is_named():
    cfg = cudt.DescentConfig(num_layers=2, epsilon=0.1)
    own = optax.inject_hyperparams(cudt.nupi)(learning_rate=0.1, kp=1.0)
    init, _ = cudt.make_train_step(
        lambda p, b, k: jnp.stack([b, b * p["w"], b * p["w"] ** 2], axis=1),
        optax.adam(1e-2),
        own,
        cfg,
    )
    with pytest.raises(ValueError, match=r"injects .*'kp'.*not 'nupi_kp'.*\{'kp': value\}"):
        init({"w": jnp.ones(())}, nupi_kp=2.0)
    state = init({"w": jnp.ones(())}, dual_hparams={"kp": 2.0})  # under its own name
    # checked as cudt.nupi checks them (a per-run EMA of 1.5 diverged without a word)
    for hparams, says in (({"kp": -5.0}, "must be >= 0"), ({"ema_nu": 1.5}, r"in \[0, 1\)")):
        with pytest.raises(ValueError, match=says):
            init({"w": jnp.ones(())}, dual_hparams=hparams)
    hyper = [
        n.hyperparams["kp"]
        for n in jax.tree.leaves(state.dual_state, is_leaf=lambda n: hasattr(n, "hyperparams"))
        if hasattr(n, "hyperparams")
    ]
    assert hyper and all(float(h) == 2.0 for h in hyper)


# -- a state built for another step: refused while the step is traced, in one line -----------------


def vector_problem(p, batch, key):
    return jnp.sum(p["w"] ** 2), {"c": cudt.Constraint(p["w"] - 1.0)}


def vector_step(primal=None, dual=None, **kw):
    primal = optax.sgd(0.1) if primal is None else primal
    dual = cudt.dual_ascent(0.1) if dual is None else dual
    return cudt.make_constrained_step(vector_problem, primal, dual, donate=False, **kw)


W3 = {"w": np.zeros(3, np.float32)}  # numpy: no test module starts JAX at import


def test_a_state_without_the_previous_update_is_refused_by_the_optimistic_step():
    init, _ = vector_step(update="alternating")
    _, optimistic = vector_step(update="optimistic")
    # was an IndexError (tuple index out of range) inside the step
    with pytest.raises(
        ValueError, match=r"built for another update scheme\): build the state with"
    ):
        optimistic(init(W3), None, jax.random.key(0))


def test_an_optimistic_state_is_refused_by_a_step_that_would_drop_its_previous_update():
    init, _ = vector_step(update="optimistic")
    _, simultaneous = vector_step()
    # was taken: the step dropped prev_update, and a scan over steps broke on its carry
    with pytest.raises(ValueError, match="update='simultaneous' step would drop"):
        simultaneous(init(W3), None, jax.random.key(0))


def test_a_primal_optimiser_state_of_another_optimiser_is_refused():
    init_adam, step_adam = vector_step(optax.adam(0.1))
    init_sgd, step_sgd = vector_step()
    # Adam's state under SGD trained silently; SGD's under Adam failed on a missing 'mu'
    with pytest.raises(ValueError, match=r"primal optimiser state is \(ScaleByAdamState, Empty"):
        step_sgd(init_adam(W3), None, jax.random.key(0))
    with pytest.raises(ValueError, match=r"keeps \(ScaleByAdamState, EmptyState\).*this step's"):
        step_adam(init_sgd(W3), None, jax.random.key(0))


def test_a_dual_optimiser_state_of_another_dual_is_refused():
    init_adam, step_adam = vector_step(dual=cudt.dual_adam(0.1))
    init_sgd, step_sgd = vector_step()
    with pytest.raises(ValueError, match="dual optimiser state of 'c' is .*ScaleByAdamState"):
        step_sgd(init_adam(W3), None, jax.random.key(0))
    with pytest.raises(ValueError, match="dual optimiser state of 'c' is"):
        step_adam(init_sgd(W3), None, jax.random.key(0))


def test_a_dual_state_built_for_the_other_kind_of_constraint_is_named_so():
    """init's ``constraints=`` of another kind than the problem's: a stateful dual's state was
    refused as one "built for another optimiser" (a PyTreeDef dump); it is named as the kind.
    A stateless dual's (dual_ascent) is the same either way, and the step reads the problem's
    kind (left as is: nothing in the state records the kind init was given)."""

    def problem(p, b, k):
        return jnp.sum(p["w"] ** 2), {"c": cudt.Constraint(p["w"][0] - 1.0, kind=kind)}

    for kind, other in (("ineq", "eq"), ("eq", "ineq")):
        given = {"c": cudt.Constraint(jax.ShapeDtypeStruct((), jnp.float32), kind=other)}
        init, step = cudt.make_constrained_step(problem, optax.sgd(0.1), cudt.dual_adam(0.1))
        a, b = ("an equality", "an inequality")[:: 1 if kind == "eq" else -1]
        with pytest.raises(ValueError, match=f"constraint 'c' is {a}, but the state's dual "
                           f"optimiser state of it was built for {b} \\(init's constraints= "
                           "of another kind"):  # fmt: skip
            step(init({"w": jnp.ones(2)}, constraints=given), None, jax.random.key(0))
        ok = {"c": cudt.Constraint(jax.ShapeDtypeStruct((), jnp.float32), kind=kind)}
        step(init({"w": jnp.ones(2)}, constraints=ok), None, jax.random.key(0))


def test_a_multiplier_table_of_another_shape_is_refused():
    init, step = vector_step()
    state = init(W3)
    one = state.replace(multipliers={"c": jnp.zeros(())})  # broadcast: one λ for three
    with pytest.raises(ValueError, match=r"'c': its multipliers have shape \(\), where its values"):
        step(one, None, jax.random.key(0))
    init_rows, step_rows = indexed_step(jit=True)
    x, ids = jnp.full((4,), 3.0), jnp.arange(4)
    state = init_rows({"w": jnp.ones(())}, (x, ids), num_indexed={"rows": N})
    wide = state.replace(multipliers={"rows": jnp.zeros((N, 2))})  # [N, 2] for values [B]
    with pytest.raises(ValueError, match=r"shape \(10, 2\), where its indexed values of shape"):
        step_rows(wide, (x, ids), jax.random.key(0))


def test_a_slack_table_of_another_shape_is_refused():
    def problem(p, batch, key):
        g = cudt.Constraint(p["w"] - 1.0, resilience=1.0, resilience_mode="slack")
        return jnp.sum(p["w"] ** 2), {"c": g}

    init, step = cudt.make_constrained_step(problem, optax.sgd(0.1), cudt.dual_ascent(0.1))
    state = init(W3)
    one = state.replace(
        slacks={"c": jnp.zeros(())}, slack_state={"c": optax.sgd(0.1).init(jnp.zeros(()))}
    )
    with pytest.raises(ValueError, match=r"'c': its slacks have shape \(\), where its values"):
        step(one, None, jax.random.key(0))


def test_a_descent_state_of_another_number_of_layers_is_refused():
    def losses(p, b, k):
        return jnp.stack([b * p["w"] ** i for i in range(3)], 1)  # [B, 3]: two layers

    def train_step(layers):
        cfg = cudt.DescentConfig(num_layers=layers)
        return cudt.make_train_step(losses, optax.sgd(0.1), cudt.dual_ascent(0.1), cfg)

    init3, _ = train_step(3)
    _, step2 = train_step(2)
    # was a TypeError on broadcasting (3,) against (2,), deep in the constraint values
    with pytest.raises(ValueError, match=r"epsilon has shape \(3,\), where this step's Descent"):
        step2(init3({"w": jnp.ones(())}), jnp.ones(4), jax.random.key(0))


def test_the_drop_in_lagrangian_refuses_multipliers_of_another_shape():
    lag = cudt.lagrangian(vector_problem, cudt.dual_ascent(0.1))
    # () trained one multiplier for three constraints; (2,) failed on broadcasting
    for lam in (jnp.zeros(()), jnp.zeros(2)):
        with pytest.raises(ValueError, match="its multipliers have shape .* build them with init"):
            lag.loss(W3, {"c": lam}, None)
    lag.loss(W3, lag.init(W3, None), None)


def test_the_drop_in_lagrangian_refuses_multipliers_whose_sign_is_not_their_kind():
    """The dual update takes its sign rule from cudt.FreeSign: a bare equality multiplier (built
    by hand) was projected to 0, its constraint p = 3 left at p = 2 without a word."""

    def problem(p, batch, key):
        return jnp.sum((p - 2.0) ** 2), {
            "bal": cudt.Constraint(p[0] - 3.0, kind="eq"),
            "cap": cudt.Constraint(p[1] - 5.0),
        }

    lag, p = cudt.lagrangian(problem, cudt.dual_ascent(0.5)), jnp.zeros(2)
    good = lag.init(p, None)
    with pytest.raises(ValueError, match="'bal' is an equality .* not cudt.FreeSign"):
        lag.loss(p, good | {"bal": jnp.zeros(())}, None)
    with pytest.raises(ValueError, match="'cap' is an inequality .* a cudt.FreeSign"):
        jax.grad(lambda m: lag.loss(p, m, None)[0])(good | {"cap": cudt.FreeSign(jnp.zeros(()))})
    lag.loss(p, good, None)


def test_the_drop_in_dual_update_refuses_a_gradient_of_another_shape_and_a_partial_state():
    """aux["constraints"] (each constraint's mean) passed as the dual gradient of a vector
    constraint broadcast one value to every multiplier: two bounds p ≤ [1, 2] trained as one
    and ended at p = [0.77, 0.77], λ = [0.38, 0.38] (KKT: p = [1, 2], λ = [1, 1])."""

    def problem(p, batch, key):
        return -jnp.sum(p), {"cap": cudt.Constraint(p - jnp.array([1.0, 2.0]))}

    lag, p = cudt.lagrangian(problem, cudt.dual_ascent(0.1)), jnp.zeros(2)
    mult = lag.init(p, None)
    state = lag.dual.init(mult)
    (_, aux), (_, dual_grads) = jax.value_and_grad(lag.loss, (0, 1), True)(p, mult, None)
    with pytest.raises(ValueError, match=r"gradient for constraint 'cap' has shape \(\), where"):
        lag.dual.update(aux["constraints"], state, mult)
    with pytest.raises(ValueError, match=r"dual state has no entry for constraints \['cap'\]"):
        lag.dual.update(dual_grads, {}, mult)  # was a KeyError
    lag.dual.update(dual_grads, state, mult)


def test_an_objective_of_per_example_losses_is_named_by_the_step_and_the_drop_in():
    # per-example losses [B] as the objective failed inside the Lagrangian's gradient:
    # "TypeError: Gradient only defined for scalar-output functions. Output had shape: (2,)."
    def problem(w, batch, key):
        return w**2, {"norm": cudt.Constraint(jnp.sum(w**2) - 1.0)}

    says = r"problem's objective must be a scalar, got shape \(2,\): return its mean"
    init, _ = cudt.make_constrained_step(problem, optax.sgd(0.1), cudt.dual_ascent(0.1))
    with pytest.raises(ValueError, match=says):
        init(jnp.zeros(2), None)
    lag = cudt.lagrangian(problem, cudt.dual_ascent(0.1))
    with pytest.raises(ValueError, match=says):
        lag.init(jnp.zeros(2), None)


def test_a_scheduled_injected_rate_is_refused_not_overwritten():
    # optax recomputes a scheduled injected hyperparameter at every update: init's lr=10 was
    # set in the state, then overwritten by the schedule's 0.1 at the first step, silently
    def problem(p, batch, key):
        return jnp.sum(p**2), {"n": cudt.Constraint(1.0 - p[0])}

    ramp = optax.linear_schedule(0.1, 0.0, 100)
    scheduled = optax.inject_hyperparams(optax.sgd)(learning_rate=ramp)
    init, _ = cudt.make_constrained_step(problem, scheduled, cudt.dual_ascent(0.1))
    with pytest.raises(ValueError, match="cannot set lr: the optimiser's injected 'learning_rate'"):
        init(jnp.ones(2), None, lr=10.0)
    init(jnp.ones(2), None)  # the schedule alone is fine
    dual = optax.inject_hyperparams(cudt.dual_ascent)(learning_rate=ramp)
    cfg = cudt.DescentConfig(num_layers=2)
    init, _ = cudt.make_train_step(lambda p, b, k: p * b, optax.sgd(0.1), dual, cfg)
    with pytest.raises(ValueError, match="the dual's learning_rate: .* is a schedule"):
        init(jnp.ones(3), dual_lr=10.0)


def test_an_index_given_as_a_list_is_named():
    # a list of ids failed in the step's gather: "Using a non-tuple sequence for
    # multidimensional indexing is not allowed"
    with pytest.raises(ValueError, match="index must be an integer array, got a list: pass index="):
        cudt.Constraint(jnp.ones(3), index=[0, 1, 2])
    cudt.Constraint(jnp.ones(3), index=np.arange(3))  # an array of ids, numpy's too, is fine


def test_init_without_the_batch_its_problem_reads_says_to_pass_one():
    # make_train_step's init takes the params alone; make_constrained_step's init(params) ran
    # the problem on batch=None: "TypeError: cannot unpack non-iterable NoneType object"
    def problem(w, batch, key):
        x, y = batch
        return jnp.mean((x @ w - y) ** 2), {"norm": cudt.Constraint(jnp.sum(w**2) - 1.0)}

    init, _ = cudt.make_constrained_step(problem, optax.sgd(0.1), cudt.dual_ascent(0.1))
    with pytest.raises(TypeError, match=r"got none \(TypeError: cannot unpack .*init\(params, b"):
        init(jnp.zeros(2))
    init(jnp.zeros(2), (jnp.ones((4, 2)), jnp.ones(4)))
    # a call the problem's signature refuses is not about the batch: its own error stays
    init, _ = cudt.make_constrained_step(
        lambda w, b, k, hp: problem(w, b, k), optax.sgd(0.1), cudt.dual_ascent(0.1)
    )
    with pytest.raises(TypeError, match=r"^\S*<lambda>\(\) missing 1 required positional arg"):
        init(jnp.zeros(2))


def test_example_ids_that_return_none_are_named_not_called_another_problems_state():
    # constraint="indexed" with example_ids returning None (the batch's ids not found) said
    # "its multipliers have shape (10, 2), where its values have shape (4, 2) ...: build the
    # state with this step's init", which it was
    cfg = cudt.DescentConfig(num_layers=2, epsilon=0.5)
    init, step = cudt.make_train_step(
        lambda p, b, k: (b["x"][:, None] * p[None, :]) ** 2,
        optax.sgd(0.1),
        cudt.dual_ascent(0.1),
        cfg,
        constraint="indexed",
        num_examples=10,
        example_ids=lambda b: b.get("id"),  # the batch calls them "ids"
    )
    batch = {"x": jnp.ones(4), "ids": jnp.arange(4)}
    with pytest.raises(ValueError, match=r"example_ids\(batch\) returned None: .*integer ids"):
        step(init(jnp.array([1.0, 0.9, 0.95])), batch, jax.random.key(0))
