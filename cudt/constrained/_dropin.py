"""Constraints in any training loop: a Lagrangian to differentiate and a dual optax transformation.

    lag = cudt.lagrangian(problem, dual=cudt.dual_ascent(1e-2))   # formulation=, num_indexed=
    multipliers = lag.init(params, batch)                          # {name: zeros}
    dual_state = lag.dual.init(multipliers)
    ...                                                            # in the loop:
    (value, aux), (grads, dual_grads) = jax.value_and_grad(lag.loss, argnums=(0, 1),
                                                           has_aux=True)(params, multipliers, batch)
    updates, opt_state = opt.update(grads, opt_state, params)      # the loop's own optimiser
    params = optax.apply_updates(params, updates)
    updates, dual_state = lag.dual.update(dual_grads, dual_state, multipliers)
    multipliers = optax.apply_updates(multipliers, updates)

``problem(params, batch, key) -> (objective, {name: Constraint}[, aux])`` is the problem of
:func:`cudt.make_constrained_step`; ``params`` may be anything the loop differentiates (an NNX
module under ``nnx.grad`` too). ``lag.loss`` is the formulation's Lagrangian: its gradient in
``params`` is the primal direction, and its gradient in ``multipliers`` is the dual gradient the
step ascends (``g/s``, ``g/s − λ/α`` with resilience), whatever the formulation's own derivative
in λ. ``lag.dual`` is the caller's dual transformation applied per constraint, with
``dual_radius``: the step's own ascent (``cudt.constrained._step._ascend_one``), so a loop with
this pair and simultaneous updates equals ``make_constrained_step(update="simultaneous")``.
Indexed constraints (``num_indexed={name: N}``) need the batch's ids in the dual update,
``lag.dual.update(g, state, multipliers, index=ids)``: only those rows of the table and of its
dual state move, as in the step. The ids within a batch must be distinct, as the step asks: a
repeated id's values add up here (the table's gradient), where the step keeps one of them.

What stays with :func:`cudt.make_constrained_step`: the alternating, extragradient and optimistic
updates, explicit slacks (``resilience_mode="slack"``), a growing penalty (``growth > 1``),
per-run ``hparams`` and ERM lanes, warm-up, ``project_params``, vmapped sweeps of states.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from cudt.constrained._constraint import Constraint, FreeSign
from cudt.constrained._dual import check_dual
from cudt.constrained._formulation import Lagrangian, check_formulation
from cudt.constrained._state import (
    _check_constraints,
    _zero_multipliers,
    check_objective,
    check_table_shape,
)
from cudt.constrained._step import (
    _ascend_one,
    _dual_gradient,
    _lagrangian,
    _take_rows,
    _update_rows,
)

__all__ = ["ConstrainedLoss", "init_multipliers", "lagrangian"]


class ConstrainedLoss(NamedTuple):
    """What :func:`lagrangian` returns (unpacks as ``loss, dual, init``)."""

    loss: Callable  # (params, multipliers, batch, key=None) -> (lagrangian value, aux)
    dual: optax.GradientTransformationExtraArgs  # on the multipliers; update(..., index=ids)
    init: Callable  # (params, batch, key=None) -> multipliers


def init_multipliers(constraints: dict, num_indexed: dict | None = None) -> dict:
    """``{name: 0}`` shaped like each constraint's values (an indexed one: a table of ``N`` rows,
    ``num_indexed={name: N}``); equality multipliers wrapped in :class:`cudt.FreeSign`.
    ``constraints``: ``{name: Constraint}``, values arrays or ``jax.ShapeDtypeStruct``."""
    _check_constraints(constraints)
    mult = _zero_multipliers(constraints, dict(num_indexed or {}))
    return {n: FreeSign(m) if constraints[n].kind == "eq" else m for n, m in mult.items()}


def _unwrap(x):
    return x.value if isinstance(x, FreeSign) else x


def _is_free(x) -> bool:
    return isinstance(x, FreeSign)


def lagrangian(
    problem: Callable,
    dual: optax.GradientTransformation,
    formulation=None,
    *,
    num_indexed: dict | None = None,
    dual_radius: float | None = None,
    has_aux: bool = False,
) -> ConstrainedLoss:
    """``(loss, dual, init)`` for ``problem``; see the module docstring.

    Args:
      problem: ``(params, batch, key) -> (objective, {name: Constraint}[, aux])``.
      dual: a :mod:`cudt.constrained` dual transformation (``dual_ascent``, ``dual_adam``, ``nupi``,
        ``as_dual(any optax)``).
      formulation: ``cudt.Lagrangian()`` (default), ``AugmentedLagrangian(penalty=ρ)`` or
        ``QuadraticPenalty(penalty=ρ)``, with a constant ρ (``growth=1``).
      num_indexed: ``{name: N}`` for every indexed constraint (its table's rows).
      dual_radius: bounds the multipliers to ``λ ≤ R`` (``|λ| ≤ R`` for equalities).
      has_aux: ``problem`` returns a third output, returned as ``aux["aux"]``.

    ``loss(params, multipliers, batch, key=None) -> (value, aux)``: ``aux`` holds
    ``objective``, ``constraints`` (name -> mean value) and ``aux`` when ``has_aux``.
    """
    formulation = _checked(formulation, dual, dual_radius)
    num_indexed = dict(num_indexed or {})
    rho = jnp.asarray(getattr(formulation, "penalty", 0.0), jnp.float32)
    call = functools.partial(_call, problem, has_aux, num_indexed)

    def loss(params, multipliers, batch, key=None):
        f, cons, *aux = call(params, batch, key)
        if set(cons) != set(multipliers):
            raise ValueError(
                f"problem returned constraints {sorted(cons)} but the multipliers are for "
                f"{sorted(multipliers)}: {_BUILD}"
            )
        for n, c in cons.items():
            check_table_shape(
                n,
                _unwrap(multipliers[n]),
                jnp.shape(c.value),
                c.index is not None,
                "its multipliers",
                _BUILD,
            )
            if _is_free(multipliers[n]) != (c.kind == "eq"):
                raise ValueError(_sign_error(n, c.kind))
        values = {n: c.value for n, c in cons.items()}
        lam = {
            # out-of-table ids refused when concrete, NaN when traced, as the step reads them
            # (numpy indexing wrapped -1 and clamped the others, which the dual update skips)
            n: _unwrap(m) if c.index is None else _take_rows(_unwrap(m), c.index, n)
            for n, c, m in ((n, cons[n], multipliers[n]) for n in cons)
        }
        rho_of = dict.fromkeys(cons, rho)
        sg = jax.lax.stop_gradient
        value = _lagrangian(formulation, f, values, {}, sg(lam), rho_of, cons)
        if formulation.uses_multipliers:
            # ∂/∂λ is the step's dual gradient (g/s, g/s − λ/α); value and ∂/∂θ are unchanged
            d = sg(_dual_gradient(values, lam, {}, cons))
            value = value + sum(jnp.sum(lam[n] * d[n]) - sg(jnp.sum(lam[n] * d[n])) for n in d)
        out = {"objective": f, "constraints": {n: jnp.mean(v) for n, v in values.items()}}
        if has_aux:
            out["aux"] = aux[0]
        return value, out

    def init(params, batch, key=None):
        key = jax.random.key(0) if key is None else key
        cons = jax.eval_shape(call, params, batch, key)[1]
        return init_multipliers(cons, num_indexed)

    return ConstrainedLoss(
        loss, _dual_transformation(dual, dual_radius, formulation, num_indexed), init
    )


def _sign_error(name, kind) -> str:
    """The error for a multiplier whose :class:`cudt.FreeSign` wrapping is not its constraint's
    kind: the dual update reads the sign rule from the wrapping, so a bare equality multiplier
    was projected to λ ≥ 0 (its constraint left unmet) and a wrapped inequality's went negative."""
    if kind == "eq":
        what = f"constraint {name!r} is an equality but its multipliers are not cudt.FreeSign"
        return what + ", so the dual update would hold them >= 0: " + _BUILD
    what = f"constraint {name!r} is an inequality but its multipliers are a cudt.FreeSign"
    return what + ", so the dual update would let them go below 0: " + _BUILD


_BUILD = "build them with init (or cudt.init_multipliers) from the same problem"


def _checked(formulation, dual, dual_radius):
    """The formulation (default :class:`cudt.Lagrangian`), after one clear error for any argument
    the drop-in Lagrangian cannot take."""
    formulation = Lagrangian() if formulation is None else formulation
    check_formulation(formulation)
    if getattr(formulation, "growth", 1.0) != 1.0:
        raise ValueError(
            f"penalty growth {formulation.growth} needs the penalty in a train state: pass "
            "growth=1 to the drop-in lagrangian, or use cudt.make_constrained_step"
        )
    check_dual(dual)
    if dual_radius is not None and not float(dual_radius) > 0:
        raise ValueError(f"dual_radius must be > 0 or None, got {dual_radius}: pass R > 0")
    return formulation


def _call(problem, has_aux, num_indexed, params, batch, key):
    """``problem``'s outputs, checked: their number, their constraints, and that what is indexed
    matches ``num_indexed``."""
    out = problem(params, batch, key)
    n = 3 if has_aux else 2
    if not isinstance(out, tuple) or len(out) != n:
        raise ValueError(
            f"problem must return {n} outputs (objective, {{name: Constraint}}"
            f"{', aux' if has_aux else ''}): got {type(out).__name__}"
            + ("" if has_aux else "; pass has_aux=True if it returns a third output")
        )
    check_objective(out[0])
    _check_constraints(out[1])
    cons = out[1]
    for name, c in cons.items():
        if c.has_slack:
            raise ValueError(
                f"constraint {name!r} has resilience_mode='slack', whose slacks live in "
                "make_constrained_step's state: use resilience_mode='decay' here"
            )
        if (c.index is not None) != (name in num_indexed):
            raise ValueError(
                f"constraint {name!r} is {'' if c.index is not None else 'not '}indexed: "
                + (
                    f"pass num_indexed={{{name!r}: N}} to cudt.lagrangian"
                    if c.index is not None
                    else f"drop {name!r} from num_indexed"
                )
            )
    return out


def _check_dual_inputs(grads, state, multipliers):
    """One ``ValueError`` for a dual state without a constraint's entry (was a ``KeyError``) or
    a gradient of another shape than its multipliers: a scalar (``aux["constraints"]``'s mean
    of a vector constraint) broadcast to every multiplier and trained them as one."""
    missing = sorted(set(multipliers) - set(state))
    if missing:
        raise ValueError(
            f"the dual state has no entry for constraints {missing}: build it with "
            "lag.dual.init(multipliers) from these multipliers"
        )
    for n, m in multipliers.items():
        got, want = jnp.shape(_unwrap(grads[n])), jnp.shape(_unwrap(m))
        if got != want:
            raise ValueError(
                f"the dual update's gradient for constraint {n!r} has shape {got}, where its "
                f"multipliers have shape {want}: pass the gradient of lag.loss with respect to "
                'the multipliers (not aux["constraints"], their means)'
            )


def _check_update_index(name: str, ids) -> None:
    """The dual update's ids of an indexed constraint, as ``Constraint(index=...)`` takes them:
    an integer array. A list failed in the gather ("non-tuple sequence for multidimensional
    indexing"), a tuple indexed one axis per entry ("Too many indices")."""
    if isinstance(ids, (list, tuple)):
        raise ValueError(
            f"the dual update's index for constraint {name!r} must be an integer array, got a "
            f"{type(ids).__name__}: pass index=jnp.asarray(ids)"
        )
    if hasattr(ids, "dtype") and not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(
            f"the dual update's index for constraint {name!r} must hold integer row ids, got "
            f"dtype {ids.dtype}: pass index=ids.astype(jnp.int32)"
        )


def _dual_transformation(dual, dual_radius, formulation, num_indexed):
    """``lag.dual``: the caller's ``dual`` applied per constraint with the step's own ascent
    (``_ascend_one``), reading and writing only the batch's rows of an indexed table."""
    ascent = types.SimpleNamespace(dual=dual, dual_radius=dual_radius)  # what _ascend_one reads

    def dual_init(multipliers):
        return {n: dual.init(m) for n, m in multipliers.items()}

    def dual_update(grads, state, params=None, *, index=None, **extra):
        del extra
        if params is None:
            raise ValueError("the dual update needs the current multipliers as its third argument")
        missing = sorted(set(params) - set(grads))
        if missing:
            raise ValueError(
                f"the dual update got no gradient for constraints {missing}: pass the gradient "
                "of lag.loss with respect to all the multipliers (one entry per constraint)"
            )
        _check_dual_inputs(grads, state, params)
        updates, new_state = {}, {}
        for n, m in params.items():
            lam, d, eq = _unwrap(m), _unwrap(grads[n]), _is_free(m)
            ids = None
            if n in num_indexed:
                ids = index.get(n) if isinstance(index, dict) else index
                if ids is None:
                    raise ValueError(
                        f"constraint {n!r} is indexed: pass the batch's ids, "
                        "dual.update(grads, state, multipliers, index=ids)"
                    )
                _check_update_index(n, ids)
                d = d[ids]
            if not formulation.uses_multipliers:
                new, new_state[n] = lam, state[n]
            else:
                kind = Constraint(None, kind="eq" if eq else "ineq")
                new, new_state[n] = _update_rows(
                    lam,
                    state[n],
                    ids,
                    lambda lam_, ds_, d=d, c=kind: _ascend_one(ascent, c, d, True, lam_, ds_),
                )
            updates[n] = FreeSign(new - lam) if eq else new - lam
        return updates, new_state

    return optax.GradientTransformationExtraArgs(dual_init, dual_update)
