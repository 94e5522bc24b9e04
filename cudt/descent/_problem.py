"""The paper's layerwise-descent problem, as a problem for :func:`cudt.make_constrained_step`.

    problem = cudt.descent.problem(layer_losses, cfg, constraint="mean")
    init, step = cudt.make_constrained_step(problem, optax.adam(1e-3), cudt.dual_ascent(1e-2),
                                            has_aux=True, warmup_steps=cfg.warmup_steps)
    state = init(params, constraints=cudt.descent.constraints(cfg),
                 hparams=cudt.descent.hparams(cfg))

(:func:`cudt.make_train_step` is exactly this, with the metrics of :func:`metrics`.)

From the per-sample losses ``ℓ [B, L+1]`` of ``layer_losses(params, batch, key)`` (column 0 the
input state, column L the output), the objective is ``mean ℓ_L`` and the constraints are

- ``"reference"`` (a scalar): ``mean ℓ_0 − C`` (0 for runs without a reference constraint);
- ``"descent"``, by ``constraint``:

  - ``"mean"``: ``mean ℓ_l − (1 − ε_l) mean ℓ_{l−1}``, ``[L]`` (the paper's);
  - ``"indexed"``: ``ℓ_l(x_i) − (1 − ε_l) ℓ_{l−1}(x_i)`` for every example ``i`` of the batch,
    ``[B, L]``, with a multiplier table of ``num_examples × L`` entries indexed by
    ``example_ids(batch)`` (each example's row in the training set); only the batch's rows move.
    With ``example_features`` the constraint carries each example's features instead (implicit
    multipliers, a model of them: :func:`cudt.implicit`); :func:`loss_features`, the example's
    own log-ratios ``log ℓ_l(x_i)/ℓ_{l−1}(x_i)``, serve any task and any unseen example;
  - ``"tail"``: ``CVaR_β(r_l) − (1 − ε_l)``, ``[L]``, with ``r_l = ℓ_l(x)/ℓ_{l−1}(x)`` the
    per-sample ratio and ``CVaR_β`` over the batch the mean of its ``⌈βB⌉`` largest ratios: the
    worst β-fraction of the examples must descend by the factor on average (β = 1 is the mean
    ratio; a ratio's denominator is floored at ``RATIO_FLOOR``).

With ``objective="violation"`` the objective is the normalised total violation of the descent
constraints instead, ``Σ_l max(0, mean ℓ_l / mean ℓ_{l−1} − (1 − ε_l))`` (:func:`violation`): a
phase-I problem, whose minimum is 0 exactly when the model can meet every constraint on the
batch. Trained as ERM (``constrained=False``) it answers "does a feasible point exist?".
``objective="judged_violation"`` sums only the steps the runner's verdicts judge
(:func:`judged_steps`: not a step from a state at the loss floor, such as the clean input at
γ_train 0), so that its minimum is 0 exactly when a point the runner calls feasible exists.

With ``DescentConfig(dual_scale="relative")`` every constraint carries its :func:`scales` (the
loss it bounds, stop-gradient): the dual step ascends ``mean ℓ_l / mean ℓ_{l−1} − (1 − ε_l)``
(``"indexed"``: each example's violation over the batch's mean ``ℓ_{l−1}``; ``"tail"``: its
CVaR ratio, entering the Lagrangian times ``mean ℓ_{l−1}``), so λ and the dual rate are
dimensionless. The objective and the Lagrangian are unchanged.

With ``DescentConfig(previous_loss="stop_gradient")`` the loss each descent constraint must
improve on, ``ℓ_{l−1}``, is a stop-gradient target: the values are the same, but the
Lagrangian's gradient no longer raises ``ℓ_{l−1}`` with weight ``−(1 − ε_l) λ_l`` (with λ of a
few units that push can outweigh the objective's pull: docs/results/text.md). The phase-I
objective (``"violation"``) keeps the differentiable form.

Both constraints carry the run's resilience α (inf: hard) in ``cfg.resilience_mode``: the dual
decay or explicit slacks. The run's own values (ε, C, α, β) are :func:`hparams`, arrays in the
train state, so runs that differ only in them share one compiled step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cudt.constrained import Constraint, broadcast_schedule, is_schedule
from cudt.descent._config import DescentConfig
from cudt.metrics import RELATIVE_FLOOR

__all__ = [
    "CONSTRAINTS",
    "OBJECTIVES",
    "RATIO_FLOOR",
    "SCALE_FLOOR",
    "constraint_values",
    "constraints",
    "hparams",
    "judged_steps",
    "loss_features",
    "metrics",
    "multipliers",
    "problem",
    "scales",
    "slacks",
    "tail_values",
    "violation",
]

CONSTRAINTS = ("mean", "indexed", "tail")
OBJECTIVES = ("loss", "violation", "judged_violation")
RATIO_FLOOR = 1e-12
SCALE_FLOOR = 1e-3


def _check_kind(constraint: str) -> None:
    if constraint not in CONSTRAINTS:
        raise ValueError(f"constraint must be one of {CONSTRAINTS}, got {constraint!r}")


def hparams(
    config: DescentConfig,
    *,
    epsilon=None,
    epsilon_schedule=None,
    reference=None,
    resilience=None,
    tail_beta=None,
) -> dict[str, Any]:
    """The run's values of the problem, as arrays (each defaults to ``config``'s):

    ``epsilon [L]``, ``reference []`` (C; 0 when ``has_reference`` is False), ``has_reference``
    (``reference`` None or NaN: off), ``resilience`` α (None or inf: hard; with explicit slacks
    finite, None: the config's α), ``tail_beta`` β of ``"tail"``. ``epsilon``, ``reference`` and
    ``resilience`` may be a :class:`cudt.Schedule` (:func:`cudt.schedule`): the step hands the
    problem its value at each step (a reference schedule's ends must both be finite: a bound that
    is on). ``epsilon_schedule``: ε's path to ``epsilon`` (the runner's ``--epsilon-schedule``),
    a schedule whose ``end`` is replaced by ``epsilon``; None: ``epsilon`` from the start."""
    L = config.num_layers
    epsilon = config.epsilon_array if epsilon is None else epsilon
    try:
        epsilon = broadcast_schedule(epsilon, (L,))
    except (ValueError, TypeError) as err:
        raise ValueError(
            f"epsilon must be a scalar or {L} values (one per layer 1..{L}): {err}"
        ) from err
    if epsilon_schedule is not None:
        if is_schedule(epsilon):
            raise ValueError(
                "epsilon_schedule ends at epsilon: pass epsilon as a value, not a Schedule"
            )
        epsilon = dataclasses.replace(broadcast_schedule(epsilon_schedule, (L,)), end=epsilon)
    ref = config.reference if reference is None else reference
    if is_schedule(ref):
        ref, has_ref = broadcast_schedule(ref, ()), jnp.asarray(True)
    else:
        try:
            ref = jnp.asarray(jnp.nan if ref is None else ref, jnp.float32)
        except (TypeError, ValueError) as err:
            raise ValueError(
                f"reference must be a number (the bound C of E l_0 <= C; None or NaN: off) or a "
                f"cudt.Schedule, got {ref!r}"
            ) from err
        has_ref = jnp.isfinite(ref)
        ref = jnp.where(has_ref, ref, 0.0)
    alpha = config.resilience if resilience is None else resilience
    alpha = broadcast_schedule(jnp.inf if alpha is None else alpha, ())
    beta = config.tail_beta if tail_beta is None else tail_beta
    values = {
        "epsilon": epsilon,
        "reference": ref,
        "has_reference": has_ref,
        "resilience": alpha,
        "tail_beta": jnp.asarray(beta, jnp.float32),
    }
    _check_values(values)
    if config.resilience_mode == "slack":
        _check_finite_slack_cost(alpha)
    return values


def _check_finite_slack_cost(alpha) -> None:
    """Explicit slacks cost ``(α/2)·u²``: NaN at α = inf (a concrete value only)."""
    for v in _concrete_ends(alpha):
        if not np.all(np.isfinite(v)):
            raise ValueError(
                f"resilience must be finite with explicit slacks (resilience_mode='slack'), "
                f"got {v.tolist()}: pass a finite alpha"
            )


# the per-run values a run may hold, as DescentConfig checks its own (a concrete value only:
# under vmap, a sweep, each run's is a tracer)
_RANGES = {
    "epsilon": (lambda v: (v >= 0) & (v < 1), "lie in [0, 1)"),
    "resilience": (lambda v: v > 0, "be > 0 (inf: a hard constraint)"),
    "tail_beta": (lambda v: (v > 0) & (v <= 1), "lie in (0, 1]"),
}


def _concrete_ends(value):
    """The value (a schedule: its start and end) as float64 arrays, where concrete (a sweep's
    value under vmap is a tracer: skipped)."""
    for end in (value.start, value.end) if is_schedule(value) else (value,):
        try:
            yield np.asarray(end, np.float64)
        except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
            continue


def _check_values(values: dict) -> None:
    for name, (ok, says) in _RANGES.items():
        for v in _concrete_ends(values[name]):
            if not np.all(ok(v)):
                raise ValueError(f"{name} must {says}, got {v.tolist()}")


def constraint_values(mean_losses, epsilon, reference=None, reference_active=None, previous=None):
    """g [L+1] from the mean per-layer losses [L+1].

    g_0 = mean ℓ_0 − C (0 when ``reference`` is None, or where ``reference_active`` is False:
    a traced per-run switch, so runs with and without the reference constraint share a program);
    g_l = mean ℓ_l − (1 − ε_l)·mean ℓ_{l−1}, with ``epsilon[l-1]`` the factor of layer l.
    ``previous`` [L]: the ``mean ℓ_{l−1}`` to use instead (e.g. their stop-gradient).
    """
    # ℓ_l sliced before ℓ_{l−1}, as always: the gradient's sums keep their order (bit-equal runs)
    current = mean_losses[1:]
    descent = current - (1.0 - epsilon) * (mean_losses[:-1] if previous is None else previous)
    if reference is None:
        g0 = jnp.zeros((), mean_losses.dtype)
    else:
        g0 = mean_losses[0] - reference
        if reference_active is not None:
            # where, not a product: no gradient reaches ℓ_0 through an inactive constraint
            g0 = jnp.where(reference_active, g0, jnp.zeros_like(g0))
    return jnp.concatenate([g0[None], descent])


def tail_values(losses, epsilon, beta, previous=None):
    """``[L]``: ``CVaR_β(ℓ_l/ℓ_{l−1}) − (1 − ε_l)`` from per-sample losses ``[B, L+1]``; the CVaR
    of the batch is the mean of its ``k = ⌈βB⌉`` (at least 1) largest ratios. ``beta`` may be a
    traced array (a sweep). ``previous`` [B, L]: the ``ℓ_{l−1}`` to use instead."""
    current = losses[:, 1:]  # sliced first, as always (see constraint_values)
    prev = losses[:, :-1] if previous is None else previous
    ratios = current / jnp.maximum(prev, RATIO_FLOOR)  # [B, L]
    size = ratios.shape[0]
    # βB in float32 lands above a whole number it equals (0.3·50 = 15.0000006): a hair below
    # it, so that ⌈βB⌉ is that number, not one more
    k = jnp.clip(jnp.ceil(beta * size * (1.0 - 1e-6)), 1, size)
    ranked = -jnp.sort(-ratios, axis=0)  # largest first
    top = (jnp.arange(size) < k)[:, None]
    cvar = jnp.sum(jnp.where(top, ranked, 0.0), axis=0) / k
    return cvar - (1.0 - epsilon)


def violation(mean_losses, epsilon, judged=None):
    """``Σ_l max(0, ℓ_l / ℓ_{l−1} − (1 − ε_l))`` of the mean losses ``[..., L+1]``: the descent
    constraints' total violation, each relative to the loss it must improve on (so every layer
    counts alike whatever the loss scale); 0 exactly when all of them hold. ``judged [..., L]``
    (None: every step): the steps to count (:func:`judged_steps`), the others left out."""
    prev = jnp.maximum(mean_losses[..., :-1], RATIO_FLOOR)
    terms = jax.nn.relu(mean_losses[..., 1:] / prev - (1.0 - epsilon))
    if judged is not None:
        terms = jnp.where(judged, terms, jnp.zeros_like(terms))
    return jnp.sum(terms, axis=-1)


def judged_steps(mean_losses):
    """``[..., L]``: the descent steps ``l−1 -> l`` the runner's verdicts judge, by their rule
    (:func:`cudt.metrics.applicable_steps`): those whose earlier state's mean loss is above
    ``RELATIVE_FLOOR`` times the largest finite mean loss of the states (1e-12 at the least); a
    state at that floor (the clean input, ℓ_0 = 0, at γ_train 0) cannot be undercut. NaN stays
    judged. No gradient flows through the choice."""
    m = jax.lax.stop_gradient(mean_losses)
    scale = jnp.max(jnp.where(jnp.isfinite(m), jnp.abs(m), 0.0), axis=-1, keepdims=True)
    floor = jnp.maximum(RELATIVE_FLOOR * scale, 1e-12)
    return ~(m[..., :-1] <= floor)


def loss_features(batch, losses) -> jax.Array:
    """``[B, L]``: each example's ``log ℓ_l(x_i) − log ℓ_{l−1}(x_i)`` (stop-gradient; losses
    floored at ``RATIO_FLOOR``), the features of implicit multipliers that any task has, for any
    example, seen or not: the margin of the example's own descent constraints
    (``ℓ_l ≤ (1 − ε_l) ℓ_{l−1}`` is ``log-ratio ≤ log(1 − ε_l)``), unchanged when the loss is
    multiplied by a constant (as ``dual_scale="relative"``), and of order 1 whatever the task.
    ``batch`` is unused (the signature of ``example_features``)."""
    del batch
    logs = jnp.log(jnp.maximum(jax.lax.stop_gradient(losses), RATIO_FLOOR))
    return logs[:, 1:] - logs[:, :-1]


def _resilient(
    value, config: DescentConfig, alpha, index=None, scale=None, features=None
) -> Constraint:
    return Constraint(
        value,
        index=index,
        resilience=alpha,
        resilience_mode=config.resilience_mode,
        scale=scale,
        features=features,
    )


def scales(mean_losses, reference, has_reference):
    """The units of ``dual_scale="relative"`` (stop-gradient): ``[L+1]``, the bound C of the
    reference (1 without one), then each layer's ``mean ℓ_{l−1}``, floored at ``SCALE_FLOOR``
    times the largest mean loss (a state at ~0 loss by construction must not blow the dual
    step up)."""
    mean = jax.lax.stop_gradient(mean_losses)
    floor = jnp.maximum(SCALE_FLOOR * jnp.max(mean), RATIO_FLOOR)
    ref = jnp.where(has_reference & (jnp.abs(reference) > 0), jnp.abs(reference), 1.0)
    return jnp.concatenate([ref[None], jnp.maximum(mean[:-1], floor)])


def _checked_losses(losses, L: int):
    """``layer_losses``'s output, after one error unless it is floating-point ``[B, L+1]``."""
    if losses.ndim != 2 or losses.shape[1] != L + 1:
        # the models' states are [L+1, B, ...]: losses taken from them come out [L+1, B]
        transposed = losses.ndim == 2 and losses.shape[0] == L + 1
        fix = (
            f"return losses.T (these look like [{L + 1}, B], a state's losses a row)"
            if transposed
            else "check num_layers in DescentConfig matches the model"
        )
        raise ValueError(
            f"layer_losses must return per-sample losses of shape [B, {L + 1}] "
            f"(layers 0..{L}), got {losses.shape}: {fix}"
        )
    if not jnp.issubdtype(losses.dtype, jnp.floating):
        raise TypeError(
            f"layer_losses must return floating-point losses, got {losses.dtype}: integers "
            "carry no gradient; compute the losses in float"
        )
    return losses


def _rows_of(example_ids, batch, table: bool):
    """``example_ids(batch)``: the batch's rows of ``"indexed"``'s table (``table``), where
    None was taken for a constraint that is not indexed and refused as a state built for
    another problem ("build the state with this step's init")."""
    index = example_ids(batch)
    if index is None and table:
        raise ValueError(
            "example_ids(batch) returned None: constraint='indexed' with a multiplier table "
            "needs each example's row, integer ids [B]; return them (e.g. batch['ids'])"
        )
    return index


def problem(
    layer_losses: Callable[[Any, Any, jax.Array], jax.Array],
    config: DescentConfig,
    constraint: str = "mean",
    *,
    example_ids: Callable[[Any], jax.Array] | None = None,
    example_features: Callable[[Any, jax.Array], Any] | None = None,
    objective: str = "loss",
):
    """``problem(params, batch, key, hparams) -> (mean ℓ_L, constraints, aux)`` (module
    docstring); ``aux``: ``layer_loss [L+1]`` (the batch means) and ``constraint [L+1]`` (index 0
    the reference, then the descent constraint's value per layer: its batch mean for
    ``"indexed"``). ``example_ids(batch) -> [B]`` names the rows of ``"indexed"``'s table;
    ``example_features(batch, losses [B, L+1]) -> [B, ...]`` (e.g. :func:`loss_features`) gives
    its constraint the examples' features, for implicit multipliers.
    ``objective="violation"``: the phase-I objective :func:`violation` instead of mean ℓ_L;
    ``"judged_violation"``: the same over the steps the runner judges (:func:`judged_steps` of
    the batch's mean losses)."""
    _check_kind(constraint)
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    if constraint == "indexed" and example_ids is None:
        raise ValueError("constraint='indexed' needs example_ids=batch -> [B] (each example's row)")
    if example_features is not None and constraint != "indexed":
        raise ValueError(
            f"example_features are the per-example constraints' features: constraint "
            f"{constraint!r} has one constraint per layer, not per example; use "
            "constraint='indexed'"
        )
    L = config.num_layers
    relative = config.dual_scale == "relative"
    stopped = config.previous_loss == "stop_gradient"

    def descent_problem(params, batch, key, hp):
        losses = layer_losses(params, batch, key)
        losses = _checked_losses(losses, L).astype(jnp.float32)
        mean = jnp.mean(losses, axis=0)
        epsilon = hp["epsilon"]
        if jnp.shape(epsilon) not in ((), (L,)):  # static: checked once, while traced
            raise ValueError(
                f"the state's epsilon has shape {tuple(jnp.shape(epsilon))}, where this step's "
                f"DescentConfig has num_layers={L} (epsilon [{L}]): the state was built for "
                "another config; build it with this step's init"
            )
        # the loss each layer must improve on: as it is (None), or a target (stop-gradient);
        # built only where used, so the paper's form compiles to the program it always did
        target = jax.lax.stop_gradient if stopped else None
        g = constraint_values(
            mean,
            epsilon,
            hp["reference"],
            hp["has_reference"],
            None if target is None else target(mean[:-1]),
        )
        index, features, shown = None, None, g[1:]
        s = scales(mean, hp["reference"], hp["has_reference"]) if relative else None
        if constraint == "mean":
            descent = g[1:]
        elif constraint == "indexed":
            current = losses[:, 1:]  # sliced first, as always (see constraint_values)
            prev = losses[:, :-1] if target is None else target(losses[:, :-1])
            descent = current - (1.0 - epsilon) * prev  # [B, L]
            index = _rows_of(example_ids, batch, table=example_features is None)
            if example_features is not None:
                features = jax.lax.stop_gradient(example_features(batch, losses))
        else:
            prev = None if target is None else target(losses[:, :-1])
            descent = shown = tail_values(losses, epsilon, hp["tail_beta"], prev)
            if relative:  # a ratio: in the loss's units in the Lagrangian, so λ is dimensionless
                descent = s[1:] * descent
        alpha = hp["resilience"]
        cons = {
            "reference": _resilient(g[0], config, alpha, scale=None if s is None else s[0]),
            "descent": _resilient(
                descent, config, alpha, index, None if s is None else s[1:], features
            ),
        }
        aux = {"layer_loss": mean, "constraint": jnp.concatenate([g[:1], shown])}
        if objective == "loss":
            f = mean[-1]
        else:
            judged = judged_steps(mean) if objective == "judged_violation" else None
            f = violation(mean, epsilon, judged)
        return f, cons, aux

    return descent_problem


def constraints(config: DescentConfig, constraint: str = "mean") -> dict[str, Constraint]:
    """The structure of :func:`problem`'s constraints (abstract values), for ``init`` without a
    batch: ``init(params, constraints=constraints(cfg, kind), num_indexed=...)``."""
    _check_kind(constraint)
    L = config.num_layers
    f32 = jnp.float32
    indexed = constraint == "indexed"
    descent = jax.ShapeDtypeStruct((1, L) if indexed else (L,), f32)
    index = jax.ShapeDtypeStruct((1,), jnp.int32) if indexed else None
    alpha = jax.ShapeDtypeStruct((), f32)
    return {
        "reference": _resilient(jax.ShapeDtypeStruct((), f32), config, alpha),
        "descent": _resilient(descent, config, alpha, index),
    }


def _summary(tables: dict, reduce) -> jax.Array:
    """``[..., L+1]``: the reference's entry, then each layer's (an indexed table of shape
    ``[..., N, L]``: ``reduce`` over its rows)."""
    ref, descent = tables["reference"], tables["descent"]
    if descent.ndim > ref.ndim + 1:
        descent = reduce(descent, axis=-2)
    return jnp.concatenate([ref[..., None], descent], axis=-1)


def multipliers(state, reduce=jnp.mean) -> jax.Array:
    """``[..., L+1]``: λ of the reference, then each layer's λ (``"indexed"``: ``reduce`` of the
    table's rows, e.g. ``jnp.max``); any leading run axes are kept. Implicit multipliers have no
    table: their summary is the step's (:func:`metrics`, the batch's rows)."""
    if not hasattr(state.multipliers["descent"], "ndim"):
        raise TypeError(
            "the descent constraint's multipliers are implicit (a model, not a table): read "
            "the step's metrics['multipliers'] (its batch's rows) or evaluate the model at the "
            "examples' features"
        )
    return _summary(state.multipliers, reduce)


def slacks(state, reduce=jnp.mean) -> jax.Array | None:
    """``[..., L+1]`` like :func:`multipliers` for explicit slacks; None without them."""
    return _summary(state.slacks, reduce) if state.slacks else None


def metrics(state, step_metrics: dict, constraint: str = "mean") -> dict[str, jax.Array]:
    """The descent step's flat metrics from the general step's: ``objective``, ``lagrangian``,
    ``layer_loss [L+1]``, ``constraint [L+1]``, ``grad_norm``, ``multipliers [L+1]`` (after the
    step), ``projection`` (the share of the primal update the parameter projection took back)
    with ``project_params``, ``slacks [L+1]`` with explicit slacks, ``multipliers_max [L+1]`` for
    ``"indexed"`` (implicit multipliers: the mean and max over the batch's rows, the model after
    the step at the batch's features)."""
    aux = step_metrics["aux"]
    implicit = step_metrics.get("implicit", {}).get("descent")
    if implicit is None:
        lam = multipliers(state)
    else:
        ref = state.multipliers["reference"][..., None]
        lam = jnp.concatenate([ref, implicit["mean"]], axis=-1)
        lam_max = jnp.concatenate([ref, implicit["max"]], axis=-1)
    out = {
        "objective": step_metrics["objective"],
        "lagrangian": step_metrics["lagrangian"],
        "layer_loss": aux["layer_loss"],
        "constraint": aux["constraint"],
        "multipliers": lam,
        "grad_norm": step_metrics["grad_norm"],
    }
    if "projection" in step_metrics:
        out["projection"] = step_metrics["projection"]
    if state.slacks:
        out["slacks"] = slacks(state)
    if constraint == "indexed":
        out["multipliers_max"] = multipliers(state, jnp.max) if implicit is None else lam_max
    return out
