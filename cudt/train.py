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

__all__ = ["TrainState", "make_train_step"]

LayerLosses = Callable[[Any, Any, jax.Array], jax.Array]


@flax.struct.dataclass
class TrainState:
    """Everything a run's future depends on, as one pytree (vmappable, checkpointable).

    ``epsilon`` and ``reference`` are arrays in the state, not static config, so that a sweep
    over them is a ``vmap`` over states of the same compiled step.
    """

    step: jax.Array  # [] int32
    params: Any
    opt_state: Any
    multipliers: jax.Array  # [L+1]; index 0 the reference constraint
    dual_state: Any
    slacks: jax.Array  # [L+1]; explicit resilience slacks (zeros unless resilience_mode="slack")
    slack_state: Any
    epsilon: jax.Array  # [L]
    reference: jax.Array  # [] the bound C (unused when DescentConfig.reference is None)


def _where_tree(pred, new, old):
    return jax.tree.map(lambda n, o: jnp.where(pred, n, o), new, old)


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
      config: the constraints; ``DescentConfig(num_layers=L, constrained=False)`` is ERM.
      project_params: applied to the parameters after every primal update (e.g. the UT's
        eigenvalue clipping, :func:`cudt.models.ut_project`).
      jit: False returns the pure step, to be composed (``vmap`` over seeds, ``scan`` over
        steps) and jitted by the caller.
      donate: donate the input state's buffers to the jitted step (saves a copy of the state).

    ``metrics`` is a flat dict: ``objective`` (mean ℓ_L), ``lagrangian``, ``layer_loss`` [L+1],
    ``constraint`` [L+1] (g), ``multipliers`` [L+1] and ``slacks`` [L+1] (after the step),
    ``grad_norm``. All are measured at the parameters before the step.
    """
    cfg = config
    num_states = cfg.num_layers + 1
    if cfg.constrained and cfg.resilience is not None and cfg.resilience_mode == "decay":
        dual_tx = optax.chain(resilience_decay(cfg.resilience), dual_optimizer)
    else:
        dual_tx = dual_optimizer
    slack_tx = optax.chain(optax.sgd(cfg.slack_lr), project_nonnegative())
    alpha = cfg.resilience if cfg.uses_slacks else None

    def init(params, *, epsilon=None, reference=None) -> TrainState:
        eps = cfg.epsilon_array if epsilon is None else epsilon
        eps = jnp.broadcast_to(jnp.asarray(eps, jnp.float32), (cfg.num_layers,))
        ref = cfg.reference if reference is None else reference
        # Fresh buffers for each field: a shared one could not be donated twice.
        zeros = lambda: jnp.zeros((num_states,), jnp.float32)  # noqa: E731
        return TrainState(
            step=jnp.zeros((), jnp.int32),
            params=params,
            opt_state=optimizer.init(params),
            multipliers=zeros(),
            dual_state=dual_tx.init(zeros()),
            slacks=zeros(),
            slack_state=slack_tx.init(zeros()),
            epsilon=eps,
            reference=jnp.asarray(0.0 if ref is None else ref, jnp.float32),
        )

    def objective(params, multipliers, slacks, state: TrainState, batch, key):
        losses = layer_losses(params, batch, key)
        if losses.ndim != 2 or losses.shape[1] != num_states:
            raise ValueError(
                f"layer_losses must return per-sample losses of shape [B, {num_states}] "
                f"(layers 0..{cfg.num_layers}), got {losses.shape}: check num_layers in "
                "DescentConfig matches the model"
            )
        reference = state.reference if cfg.reference is not None else None
        lag, mean_losses, g = lagrangian_terms(
            losses.astype(jnp.float32), multipliers, slacks, state.epsilon, reference, alpha
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
        if cfg.constrained:
            # g_mult = ∇_λ𝓛 = g − u, evaluated at the pre-step parameters and multipliers.
            dual_updates, new_dual_state = dual_tx.update(g_mult, dual_state, multipliers)
            new_multipliers = optax.apply_updates(multipliers, dual_updates)
            if cfg.uses_slacks:
                slack_updates, new_slack_state = slack_tx.update(g_slacks, slack_state, slacks)
                new_slacks = optax.apply_updates(slacks, slack_updates)
            else:
                new_slacks, new_slack_state = slacks, slack_state
            if cfg.warmup_steps > 0:
                active = state.step >= cfg.warmup_steps
                new_multipliers = jnp.where(active, new_multipliers, multipliers)
                new_dual_state = _where_tree(active, new_dual_state, dual_state)
                new_slacks = jnp.where(active, new_slacks, slacks)
                new_slack_state = _where_tree(active, new_slack_state, slack_state)
            if cfg.uses_slacks and cfg.slack_restart_steps is not None:
                restart = (state.step + 1) % cfg.slack_restart_steps == 0
                new_slacks = jnp.where(restart, jnp.zeros_like(new_slacks), new_slacks)
            multipliers, dual_state = new_multipliers, new_dual_state
            slacks, slack_state = new_slacks, new_slack_state

        new_state = state.replace(
            step=state.step + 1,
            params=params,
            opt_state=opt_state,
            multipliers=multipliers,
            dual_state=dual_state,
            slacks=slacks,
            slack_state=slack_state,
        )
        metrics = {
            "objective": mean_losses[-1],
            "lagrangian": lag,
            "layer_loss": mean_losses,
            "constraint": g,
            "multipliers": multipliers,
            "slacks": slacks,
            "grad_norm": optax.tree.norm(g_params),
        }
        return new_state, metrics

    if jit:
        step = jax.jit(step, donate_argnums=(0,) if donate else ())
    return init, step
