"""The train state and the one jitted primal-dual step.

    import cudt, optax
    cfg = cudt.DescentConfig(num_layers=L, epsilon=0.1)
    init, step = cudt.make_train_step(layer_losses, optax.adam(1e-3), cudt.dual_ascent(1e-2), cfg)
    state = init(params)                      # multipliers start at 0
    state, metrics = step(state, batch, key)  # one jitted, compiled program

``layer_losses(params, batch, key) -> [B, L+1]`` is the user's function: per-sample losses of every
layer's state (column 0 the input state, column L the output). One ``value_and_grad`` of the
Lagrangian gives both the primal gradient (in θ) and the dual gradient (in λ, which is the vector
of constraint values); both updates use the parameters and multipliers from *before* the step
(simultaneous gradient descent-ascent).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax

from cudt.constrained import DescentConfig, lagrangian_terms
from cudt.dual import project_nonnegative, resilience_decay

__all__ = ["TrainState", "make_train_step", "set_learning_rate"]

LayerLosses = Callable[[Any, Any, jax.Array], jax.Array]


@flax.struct.dataclass
class TrainState:
    """Everything a run's future depends on, as one pytree (vmappable, checkpointable).

    The run's hyperparameters are arrays in the state, not static config, so that a sweep over
    them (and ERM next to constrained runs) is a ``vmap`` over states of ONE compiled step:
    ``epsilon``, ``reference`` (with ``has_reference``), ``resilience`` (α; inf for hard
    constraints), ``constrained`` (False: an ERM run, λ ≡ 0, no dual update), and the learning
    rates when the optimisers are built with ``optax.inject_hyperparams`` (they then live in
    ``opt_state`` / ``dual_state``; see :func:`set_learning_rate`).
    """

    step: jax.Array  # [] int32
    params: Any
    opt_state: Any
    multipliers: jax.Array  # [L+1]; index 0 the reference constraint
    dual_state: Any
    slacks: jax.Array  # [L+1]; explicit resilience slacks (zeros unless resilience_mode="slack")
    slack_state: Any
    epsilon: jax.Array  # [L]
    reference: jax.Array  # [] the bound C (0 when has_reference is False)
    has_reference: jax.Array  # [] bool: whether the reference constraint E ℓ_0 <= C is on
    resilience: jax.Array  # [] α of the resilient relaxation; inf: hard constraints
    constrained: jax.Array  # [] bool: False is ERM through the same step


def _where_tree(pred, new, old):
    return jax.tree.map(lambda n, o: jnp.where(pred, n, o), new, old)


def _is_injected(node) -> bool:
    return isinstance(node, optax.InjectStatefulHyperparamsState)


def set_learning_rate(opt_state, value, name: str = "learning_rate"):
    """``opt_state`` with the injected hyperparameter ``name`` set to ``value`` (float32).

    The optimiser must be built with ``optax.inject_hyperparams`` (for example
    ``optax.inject_hyperparams(optax.adam)(learning_rate=1e-3)``), which keeps its learning
    rate in its state, so runs stacked on a leading axis each train with their own. Raises a
    ``ValueError`` naming the fix when no such hyperparameter is in the state.
    """
    found = []

    def put(node):
        if _is_injected(node) and name in node.hyperparams:
            found.append(node)
            hyper = dict(node.hyperparams)
            hyper[name] = jnp.asarray(value, jnp.float32).reshape(jnp.shape(hyper[name]))
            return node._replace(hyperparams=hyper)
        return node

    new_state = jax.tree.map(put, opt_state, is_leaf=_is_injected)
    if not found:
        raise ValueError(
            f"cannot set {name}: the optimizer keeps no injected {name!r} in its state; build it "
            f"with optax.inject_hyperparams, e.g. optax.inject_hyperparams(optax.adam)({name}=1e-3)"
        )
    return new_state


def _copy_tree(tree):
    """Fresh buffers for every array leaf: the donating step may delete what the state holds,
    and the caller's arrays must stay the caller's."""
    return jax.tree.map(lambda x: jnp.array(x, copy=True) if hasattr(x, "shape") else x, tree)


def make_train_step(
    layer_losses: LayerLosses,
    optimizer: optax.GradientTransformation,
    dual_optimizer: optax.GradientTransformation,
    config: DescentConfig,
    *,
    project_params: Callable[[Any], Any] | None = None,
    jit: bool = True,
    donate: bool = True,
):
    """Builds ``init(params) -> TrainState`` and ``step(state, batch, key) -> (state, metrics)``.

    Args:
      layer_losses: ``(params, batch, key) -> [B, L+1]`` per-sample losses of layers 0..L.
      optimizer: the primal optax optimiser (minimises the Lagrangian in the parameters).
      dual_optimizer: a dual transformation from :mod:`cudt.dual` (``cudt.dual_ascent(lr)``,
        ``cudt.dual_adam(lr)`` or ``cudt.as_dual(any_optax_optimizer)``): it takes the
        constraint values and returns additive, projected multiplier updates.
      config: the constraints; ``DescentConfig(num_layers=L, constrained=False)`` is ERM. Its
        epsilon, reference, resilience and constrained are the *defaults* of the per-run values
        that ``init`` puts in the state; the rest (layers, warm-up, slack mode) is static.
      project_params: applied to the parameters after every primal update (e.g. the UT's
        eigenvalue clipping, :func:`cudt.models.ut_project`).
      jit: False returns the pure step, to be composed (``vmap`` over seeds, ``scan`` over
        steps) and jitted by the caller.
      donate: donate the input state's buffers to the jitted step (saves a copy of the state).
        ``init`` copies the params it is given, so the caller's arrays are never donated.

    ``init(params, *, epsilon=None, reference=None, resilience=None, constrained=None, lr=None,
    dual_lr=None)`` overrides the config's values for one run (arrays under ``vmap``: a sweep).
    ``reference`` NaN means no reference constraint; ``resilience`` inf means hard constraints.
    ``lr`` / ``dual_lr`` need optimisers built with ``optax.inject_hyperparams``.

    ``metrics`` is a flat dict: ``objective`` (mean ℓ_L), ``lagrangian``, ``layer_loss`` [L+1],
    ``constraint`` [L+1] (g), ``multipliers`` [L+1] and ``slacks`` [L+1] (after the step),
    ``grad_norm``. All are measured at the parameters before the step.
    """
    cfg = config
    num_states = cfg.num_layers + 1
    decay = cfg.resilience_mode == "decay"
    slack_tx = optax.chain(optax.sgd(cfg.slack_lr), project_nonnegative())

    def dual_tx(alpha):
        # The resilient decay g - λ/α is a stateless transform in front of the dual optimiser;
        # α = inf makes it the identity (hard constraints), so α can differ per run.
        if decay:
            return optax.chain(resilience_decay(alpha), dual_optimizer)
        return dual_optimizer

    def init(
        params,
        *,
        epsilon=None,
        reference=None,
        resilience=None,
        constrained=None,
        lr=None,
        dual_lr=None,
    ) -> TrainState:
        eps = cfg.epsilon_array if epsilon is None else epsilon
        eps = jnp.broadcast_to(jnp.asarray(eps, jnp.float32), (cfg.num_layers,))
        ref = cfg.reference if reference is None else reference
        ref = jnp.asarray(jnp.nan if ref is None else ref, jnp.float32)
        has_ref = jnp.isfinite(ref)
        alpha = cfg.resilience if resilience is None else resilience
        alpha = jnp.asarray(jnp.inf if alpha is None else alpha, jnp.float32)
        flag = cfg.constrained if constrained is None else constrained
        params = _copy_tree(params)
        opt_state = optimizer.init(params)
        if lr is not None:
            opt_state = set_learning_rate(opt_state, lr)
        # Fresh buffers for each field: a shared one could not be donated twice.
        zeros = lambda: jnp.zeros((num_states,), jnp.float32)  # noqa: E731
        dual_state = dual_tx(alpha).init(zeros())
        if dual_lr is not None:
            dual_state = set_learning_rate(dual_state, dual_lr)
        return TrainState(
            step=jnp.zeros((), jnp.int32),
            params=params,
            opt_state=opt_state,
            multipliers=zeros(),
            dual_state=dual_state,
            slacks=zeros(),
            slack_state=slack_tx.init(zeros()),
            epsilon=eps,
            reference=jnp.where(has_ref, ref, 0.0),
            has_reference=has_ref,
            resilience=alpha,
            constrained=jnp.asarray(flag, bool),
        )

    def objective(params, multipliers, slacks, state: TrainState, batch, key):
        losses = layer_losses(params, batch, key)
        if losses.ndim != 2 or losses.shape[1] != num_states:
            raise ValueError(
                f"layer_losses must return per-sample losses of shape [B, {num_states}] "
                f"(layers 0..{cfg.num_layers}), got {losses.shape}: check num_layers in "
                "DescentConfig matches the model"
            )
        alpha = state.resilience if cfg.uses_slacks else None
        lag, mean_losses, g = lagrangian_terms(
            losses.astype(jnp.float32),
            multipliers,
            slacks,
            state.epsilon,
            state.reference,
            alpha,
            reference_active=state.has_reference,
        )
        return lag, (mean_losses, g)

    grad_fn = jax.value_and_grad(objective, argnums=(0, 1, 2), has_aux=True)

    def step(state: TrainState, batch, key: jax.Array):
        key = jax.random.fold_in(key, state.step)
        (lag, (mean_losses, g)), (g_params, g_mult, g_slacks) = grad_fn(
            state.params, state.multipliers, state.slacks, state, batch, key
        )

        updates, opt_state = optimizer.update(g_params, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        if project_params is not None:
            params = project_params(params)

        multipliers, dual_state = state.multipliers, state.dual_state
        slacks, slack_state = state.slacks, state.slack_state
        # g_mult = ∇_λ𝓛 = g − u, evaluated at the pre-step parameters and multipliers.
        dual_updates, new_dual_state = dual_tx(state.resilience).update(
            g_mult, dual_state, multipliers
        )
        new_multipliers = optax.apply_updates(multipliers, dual_updates)
        if cfg.uses_slacks:
            slack_updates, new_slack_state = slack_tx.update(g_slacks, slack_state, slacks)
            new_slacks = optax.apply_updates(slacks, slack_updates)
        else:
            new_slacks, new_slack_state = slacks, slack_state
        # ERM runs (and constrained ones during the primal warm-up) keep λ, u and the dual
        # optimisers' states frozen: the same compiled step, with the duals switched off.
        active = state.constrained
        if cfg.warmup_steps > 0:
            active = active & (state.step >= cfg.warmup_steps)
        new_multipliers = jnp.where(active, new_multipliers, multipliers)
        new_dual_state = _where_tree(active, new_dual_state, dual_state)
        new_slacks = jnp.where(active, new_slacks, slacks)
        new_slack_state = _where_tree(active, new_slack_state, slack_state)
        if cfg.uses_slacks and cfg.slack_restart_steps is not None:
            restart = (state.step + 1) % cfg.slack_restart_steps == 0
            new_slacks = jnp.where(restart, jnp.zeros_like(new_slacks), new_slacks)

        new_state = state.replace(
            step=state.step + 1,
            params=params,
            opt_state=opt_state,
            multipliers=new_multipliers,
            dual_state=new_dual_state,
            slacks=new_slacks,
            slack_state=new_slack_state,
        )
        metrics = {
            "objective": mean_losses[-1],
            "lagrangian": lag,
            "layer_loss": mean_losses,
            "constraint": g,
            "multipliers": new_multipliers,
            "slacks": new_slacks,
            "grad_norm": optax.tree.norm(g_params),
        }
        return new_state, metrics

    if jit:
        step = jax.jit(step, donate_argnums=(0,) if donate else ())
    return init, step
