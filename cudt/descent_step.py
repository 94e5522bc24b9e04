"""Layerwise descent through the general step: mean, per-example and tail descent constraints.

    init, step = cudt.make_descent_step(layer_losses, optax.adam(1e-3), cudt.dual_ascent(1e-2),
                                        cudt.DescentConfig(num_layers=L, epsilon=0.1),
                                        constraint="indexed", num_examples=N,
                                        example_ids=lambda batch: batch.index)

The problem handed to :func:`cudt.make_constrained_step` has two constraints, from the
per-sample losses ``ℓ [B, L+1]`` of ``layer_losses`` (the same function
:func:`cudt.make_train_step` takes):

- ``"reference"`` (a scalar): ``mean ℓ_0 − C`` (0 for runs without a reference constraint);
- ``"descent"``, by ``constraint``:

  - ``"mean"``: ``mean ℓ_l − (1 − ε_l) mean ℓ_{l−1}``, ``[L]`` (what ``make_train_step`` does);
  - ``"indexed"``: ``ℓ_l(x_i) − (1 − ε_l) ℓ_{l−1}(x_i)`` for every example ``i`` of the batch,
    ``[B, L]``, with a multiplier table of ``num_examples × L`` entries indexed by
    ``example_ids(batch)`` (each example's row in the training set); only the batch's rows move;
  - ``"tail"``: ``CVaR_β(r_l) − (1 − ε_l)``, ``[L]``, with ``r_l = ℓ_l(x)/ℓ_{l−1}(x)`` the
    per-sample ratio and ``CVaR_β`` over the batch the mean of its ``⌈βB⌉`` largest ratios: the
    worst β-fraction of the examples must descend by the factor on average (β = 1 is the mean
    ratio; a ratio's denominator is floored at 1e-12).

Per-run values are arrays in :class:`DescentState`, as in :class:`cudt.TrainState` (ε, C, α of
the resilient decay, ERM/constrained, β, the learning rates, the penalty ρ and any injected
dual hyperparameter), so runs that differ only in them share one compiled step. ERM runs and
the primal warm-up see zero constraint values and keep their multipliers and dual state frozen.
Explicit slacks (``resilience_mode="slack"``) are :func:`cudt.make_train_step`'s only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax

from cudt.constrained import DescentConfig, constraint_values
from cudt.constrained_step import ConstrainedState, make_constrained_step
from cudt.constraint import Constraint
from cudt.dual import resilience_decay
from cudt.formulation import Lagrangian
from cudt.train import set_learning_rate

__all__ = ["CONSTRAINTS", "DescentState", "make_descent_step", "tail_values"]

CONSTRAINTS = ("mean", "indexed", "tail")
RATIO_FLOOR = 1e-12


def _summary(mult: dict, reduce) -> jax.Array:
    """``[..., L+1]``: λ of the reference, then each layer's λ (indexed: ``reduce`` over rows)."""
    ref, descent = mult["reference"], mult["descent"]
    if descent.ndim > ref.ndim + 1:  # an indexed table [..., N, L]
        descent = reduce(descent, axis=-2)
    return jnp.concatenate([ref[..., None], descent], axis=-1)


@flax.struct.dataclass
class DescentState:
    """The general step's state plus the run's own constraint values (vmappable, checkpointable).

    ``multipliers`` is ``[L+1]`` like :class:`cudt.TrainState`'s (index 0 the reference): for an
    indexed table, each layer's mean over the table; ``multipliers_max`` its maximum.
    """

    inner: ConstrainedState
    epsilon: jax.Array  # [L]
    reference: jax.Array  # [] C (0 when has_reference is False)
    has_reference: jax.Array  # [] bool
    resilience: jax.Array  # [] α of the dual decay g − λ/α; inf: hard constraints
    constrained: jax.Array  # [] bool: False is ERM
    tail_beta: jax.Array  # [] β of the tail constraint (unused by the other kinds)

    @property
    def step(self):
        return self.inner.step

    @property
    def params(self):
        return self.inner.params

    @property
    def multipliers(self):
        return _summary(self.inner.multipliers, jnp.mean)

    @property
    def multipliers_max(self):
        return _summary(self.inner.multipliers, jnp.max)


def tail_values(losses, epsilon, beta):
    """``[L]``: ``CVaR_β(ℓ_l/ℓ_{l−1}) − (1 − ε_l)`` from per-sample losses ``[B, L+1]``; the CVaR
    of the batch is the mean of its ``k = ⌈βB⌉`` (at least 1) largest ratios. ``beta`` may be a
    traced array (a sweep)."""
    ratios = losses[:, 1:] / jnp.maximum(losses[:, :-1], RATIO_FLOOR)  # [B, L]
    size = ratios.shape[0]
    k = jnp.clip(jnp.ceil(beta * size), 1, size)
    ranked = -jnp.sort(-ratios, axis=0)  # largest first
    top = (jnp.arange(size) < k)[:, None]
    cvar = jnp.sum(jnp.where(top, ranked, 0.0), axis=0) / k
    return cvar - (1.0 - epsilon)


def make_descent_step(
    layer_losses: Callable[[Any, Any, jax.Array], jax.Array],
    optimizer: optax.GradientTransformation,
    dual_optimizer: optax.GradientTransformation,
    config: DescentConfig,
    *,
    constraint: str = "mean",
    formulation=None,
    update: str = "simultaneous",
    num_examples: int | None = None,
    example_ids: Callable[[Any], jax.Array] | None = None,
    tail_beta: float = 0.1,
    project_params: Callable[[Any], Any] | None = None,
    jit: bool = True,
):
    """``(init, step)`` of the descent problem of ``constraint`` (see the module docstring)
    through :func:`cudt.make_constrained_step` with ``formulation`` and ``update``.

    ``init(params, *, epsilon, reference, resilience, constrained, lr, dual_lr, penalty,
    tail_beta, dual_hparams)`` takes :func:`cudt.make_train_step`'s per-run overrides plus the
    penalty ρ, β and ``dual_hparams`` ``{name: value}`` set in the dual optimiser's injected
    hyperparameters (e.g. nuPI's ``kp``). ``metrics``: ``objective``, ``lagrangian``,
    ``layer_loss [L+1]``, ``constraint [L+1]`` (index 0 the reference; then the descent
    constraint's value: its batch mean for ``indexed``), ``multipliers [L+1]`` (after the step;
    indexed: the table's mean per layer) and, for ``indexed``, ``multipliers_max [L+1]``.
    """
    cfg = config
    if constraint not in CONSTRAINTS:
        raise ValueError(f"constraint must be one of {CONSTRAINTS}, got {constraint!r}")
    if cfg.uses_slacks:
        raise ValueError(
            "explicit slacks (resilience_mode='slack') are make_train_step's only: use "
            "resilience_mode='decay' here"
        )
    indexed = constraint == "indexed"
    if indexed and (num_examples is None or example_ids is None):
        raise ValueError("constraint='indexed' needs num_examples=N and example_ids=batch -> [B]")
    formulation = Lagrangian() if formulation is None else formulation
    L = cfg.num_layers

    def build(problem, alpha):
        dual = optax.chain(resilience_decay(alpha), dual_optimizer)
        return make_constrained_step(
            problem, optimizer, dual, formulation, update, has_aux=True, jit=False
        )

    def init(
        params,
        *,
        epsilon=None,
        reference=None,
        resilience=None,
        constrained=None,
        lr=None,
        dual_lr=None,
        penalty=None,
        tail_beta=None,
        dual_hparams=None,
    ) -> DescentState:
        eps = cfg.epsilon_array if epsilon is None else epsilon
        eps = jnp.broadcast_to(jnp.asarray(eps, jnp.float32), (L,))
        ref = cfg.reference if reference is None else reference
        ref = jnp.asarray(jnp.nan if ref is None else ref, jnp.float32)
        has_ref = jnp.isfinite(ref)
        alpha = cfg.resilience if resilience is None else resilience
        alpha = jnp.asarray(jnp.inf if alpha is None else alpha, jnp.float32)
        flag = cfg.constrained if constrained is None else constrained
        beta = tail_beta_default if tail_beta is None else tail_beta

        # the state depends only on the constraints' shapes: a shape-only problem gives them
        def shapes(p, batch, key):
            descent = jnp.zeros((1, L) if indexed else (L,), jnp.float32)
            index = jnp.zeros((1,), jnp.int32) if indexed else None
            return (
                jnp.zeros(()),
                {
                    "reference": Constraint(jnp.zeros(())),
                    "descent": Constraint(descent, index=index),
                },
            )

        inner_init, _ = build(shapes, alpha)
        inner = inner_init(params, None, num_indexed={"descent": num_examples} if indexed else None)
        if lr is not None:
            inner = inner.replace(opt_state=set_learning_rate(inner.opt_state, lr))
        dual_state = inner.dual_state
        for name, value in ({"learning_rate": dual_lr} | dict(dual_hparams or {})).items():
            if value is not None:
                dual_state = set_learning_rate(dual_state, value, name)
        inner = inner.replace(dual_state=dual_state)
        if penalty is not None:
            rho = jnp.asarray(penalty, jnp.float32)
            inner = inner.replace(penalty={n: rho for n in inner.penalty})
        return DescentState(
            inner=inner,
            epsilon=eps,
            reference=jnp.where(has_ref, ref, 0.0),
            has_reference=has_ref,
            resilience=alpha,
            constrained=jnp.asarray(flag, bool),
            tail_beta=jnp.asarray(beta, jnp.float32),
        )

    tail_beta_default = tail_beta

    def step(state: DescentState, batch, key: jax.Array):
        key = jax.random.fold_in(key, state.inner.step)  # as make_train_step: same noise
        active = state.constrained
        if cfg.warmup_steps > 0:
            active = active & (state.inner.step >= cfg.warmup_steps)

        def problem(params, batch, key):
            losses = layer_losses(params, batch, key)
            if losses.ndim != 2 or losses.shape[1] != L + 1:
                raise ValueError(
                    f"layer_losses must return per-sample losses of shape [B, {L + 1}] "
                    f"(layers 0..{L}), got {losses.shape}: check num_layers in DescentConfig"
                )
            losses = losses.astype(jnp.float32)
            mean = jnp.mean(losses, axis=0)
            eps = state.epsilon
            g = constraint_values(mean, eps, state.reference, state.has_reference)
            index, shown = None, g[1:]
            if constraint == "mean":
                descent = g[1:]
            elif indexed:
                descent = losses[:, 1:] - (1.0 - eps) * losses[:, :-1]  # [B, L]
                index = example_ids(batch)
            else:
                descent = shown = tail_values(losses, eps, state.tail_beta)
            # ERM and the warm-up: no constraint reaches the primal or the duals
            cons = {
                "reference": Constraint(jnp.where(active, g[0], 0.0)),
                "descent": Constraint(jnp.where(active, descent, 0.0), index=index),
            }
            aux = {"layer_loss": mean, "constraint": jnp.concatenate([g[:1], shown])}
            return mean[-1], cons, aux

        _, inner_step = build(problem, state.resilience)
        inner, m = inner_step(state.inner, batch, key)
        if project_params is not None:
            inner = inner.replace(params=project_params(inner.params))
        keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(active, n, o), new, old)  # noqa: E731
        inner = inner.replace(
            multipliers=keep(inner.multipliers, state.inner.multipliers),
            dual_state=keep(inner.dual_state, state.inner.dual_state),
        )
        new_state = state.replace(inner=inner)
        aux = m["aux"]
        metrics = {
            "objective": aux["layer_loss"][-1],
            "lagrangian": m["lagrangian"],
            "layer_loss": aux["layer_loss"],
            "constraint": aux["constraint"],
            "multipliers": new_state.multipliers,
        }
        if indexed:
            metrics["multipliers_max"] = new_state.multipliers_max
        return new_state, metrics

    if jit:
        step = jax.jit(step)
    return init, step
