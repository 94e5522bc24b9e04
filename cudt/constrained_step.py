"""The general constrained step: any problem, named constraints, formulations, dual dynamics.

    init, step = cudt.make_constrained_step(problem, primal=optax.adam(1e-3),
                                            dual=cudt.dual_ascent(1e-2),
                                            formulation=cudt.Lagrangian(),
                                            update="simultaneous")
    state = init(params, batch, num_indexed={"per_sample": N})
    state, metrics = step(state, batch, key)

``problem(params, batch, key) -> (objective, {name: Constraint})``. One forward per step: the
step takes the VJP of the problem's outputs (objective and constraint values) and builds the
cotangent from the formulation, so the primal gradient can use the multipliers of before
(``"simultaneous"``) or after (``"alternating"``: dual-then-primal) the dual step without a
second forward. ``"extragradient"`` is extrapolation from the past (Popov): the gradient is
taken at ``x_t + u_{t−1}`` (the previous step's update, primal and dual), and applied at ``x_t``:
one gradient per step.

Indexed constraints (``Constraint(..., index=ids)``) have a multiplier table of ``N`` rows; only
the batch's rows (and the rows of every dual-state leaf shaped like the table, e.g. Adam moments)
are read and written, the rest stay bit-identical (scalar state such as Adam's step count is
shared). Ids within one batch should be distinct (a repeated id keeps one of its updates).
Constraint values are whatever the problem computes; under ``jit`` with a batch sharded over a
mesh's data axis, means over the batch are global means, so multi-device runs equal one device.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax

from cudt.constraint import Constraint, FreeSign
from cudt.formulation import Lagrangian

__all__ = ["ConstrainedState", "make_constrained_step"]

UPDATES = ("simultaneous", "alternating", "extragradient")


@flax.struct.dataclass
class ConstrainedState:
    """Everything a run's future depends on, as one pytree (vmappable, checkpointable)."""

    step: jax.Array
    params: Any
    opt_state: Any
    multipliers: dict  # name -> array (indexed: table [N, ...])
    dual_state: dict  # name -> the dual optimiser's state of that constraint
    penalty: dict  # name -> [] ρ
    violation: dict  # name -> [] last violation norm (for the penalty rule)
    prev_update: Any  # (primal updates, dual updates) of the last step (extragradient), else ()


def _copy(tree):
    return jax.tree.map(lambda x: jnp.array(x, copy=True), tree)


def _check_constraints(cons):
    if not isinstance(cons, dict) or not all(isinstance(c, Constraint) for c in cons.values()):
        raise TypeError(
            "problem must return (objective, {name: cudt.Constraint(...)}): wrap each "
            "constraint's values in cudt.Constraint"
        )


def _rows(tree, ids, n):
    return jax.tree.map(lambda x: x[ids] if x.ndim >= 1 and x.shape[0] == n else x, tree)


def _put_rows(tree, rows, ids, n):
    return jax.tree.map(
        lambda x, r: x.at[ids].set(r) if x.ndim >= 1 and x.shape[0] == n else r, tree, rows
    )


def make_constrained_step(
    problem: Callable,
    primal: optax.GradientTransformation,
    dual: optax.GradientTransformation,
    formulation=None,
    update: str = "simultaneous",
    dual_radius: float | None = None,
    *,
    has_aux: bool = False,
    jit: bool = True,
):
    """``(init, step)`` for ``problem``; see the module docstring.

    ``has_aux``: ``problem`` returns ``(objective, constraints, aux)``; ``aux`` (any pytree,
    measured at the pre-step parameters) is returned as ``metrics["aux"]``. ``jit=False``
    returns the pure step, to be composed (``vmap`` over runs, ``scan`` over steps).

    ``dual`` follows :mod:`cudt.dual`'s convention (additive, projected updates from ``g``);
    equality multipliers are passed as :class:`cudt.FreeSign` so they are not projected.
    ``dual_radius`` bounds the multipliers to ``λ ≤ R`` (``|λ| ≤ R`` for equalities), as TFCO.
    """
    formulation = Lagrangian() if formulation is None else formulation
    if update not in UPDATES:
        raise ValueError(f"update must be one of {UPDATES}, got {update!r}")
    if dual_radius is not None and not float(dual_radius) > 0:
        raise ValueError(f"dual_radius must be > 0 or None, got {dual_radius}")
    rho0 = float(getattr(formulation, "penalty", 0.0))

    def init(params, batch, num_indexed=None, key=None):
        num_indexed = dict(num_indexed or {})
        key = jax.random.key(0) if key is None else key
        cons = jax.eval_shape(problem, params, batch, key)[1]
        _check_constraints(cons)
        unknown = set(num_indexed) - set(cons)
        if unknown:
            raise ValueError(f"num_indexed names unknown constraints {sorted(unknown)}")
        mult = {}
        for name, c in cons.items():
            if c.index is not None:
                if name not in num_indexed:
                    raise ValueError(
                        f"constraint {name!r} is indexed: pass num_indexed={{{name!r}: N}} to init"
                    )
                shape = (int(num_indexed[name]),) + tuple(c.value.shape[1:])
            else:
                shape = tuple(c.value.shape)
            mult[name] = jnp.zeros(shape, c.value.dtype)
        dual_state = {
            n: dual.init(FreeSign(m) if cons[n].kind == "eq" else m) for n, m in mult.items()
        }
        params = _copy(params)
        prev = ()
        if update == "extragradient":
            prev = (jax.tree.map(jnp.zeros_like, params), jax.tree.map(jnp.zeros_like, mult))
        return ConstrainedState(
            step=jnp.zeros((), jnp.int32),
            params=params,
            opt_state=primal.init(params),
            multipliers=mult,
            dual_state=dual_state,
            penalty={n: jnp.asarray(rho0, jnp.float32) for n in mult},
            violation={n: jnp.asarray(jnp.inf, jnp.float32) for n in mult},
            prev_update=prev,
        )

    def lagr(f, values, lams, kinds, rho):
        total = f
        for n in values:
            total = total + formulation.term(values[n], lams[n], kinds[n], rho[n])
        return total

    def dual_step(state, cons, lam_batch, values):
        new_mult, new_dual, updates = {}, {}, {}
        for n, c in cons.items():
            table, dstate = state.multipliers[n], state.dual_state[n]
            if not formulation.uses_multipliers:
                new_mult[n], new_dual[n] = table, dstate
                updates[n] = jnp.zeros_like(table)
                continue
            wrap = FreeSign if c.kind == "eq" else (lambda x: x)
            unwrap = (lambda x: x.value) if c.kind == "eq" else (lambda x: x)
            if c.index is None:
                lam, ds = table, dstate
            else:
                N = table.shape[0]
                lam, ds = table[c.index], _rows(dstate, c.index, N)
            u, ds = dual.update(wrap(values[n]), ds, wrap(lam))
            u = unwrap(u)
            lam_new = lam + u
            if dual_radius is not None:
                lo = -dual_radius if c.kind == "eq" else 0.0
                lam_new = jnp.clip(lam_new, lo, dual_radius)
            if c.index is None:
                new_mult[n], new_dual[n] = lam_new, ds
            else:
                new_mult[n] = table.at[c.index].set(lam_new)
                new_dual[n] = _put_rows(dstate, ds, c.index, N)
            updates[n] = new_mult[n] - table
        return new_mult, new_dual, updates

    def gather(mult, cons):
        return {n: (m if cons[n].index is None else m[cons[n].index]) for n, m in mult.items()}

    def step(state: ConstrainedState, batch, key):
        params, mult = state.params, state.multipliers
        if update == "extragradient":
            pu, du = state.prev_update
            params = optax.apply_updates(params, pu)
            mult = jax.tree.map(lambda m, u: m + u, mult, du)

        def outputs(p):
            f, cons, *aux = problem(p, batch, key)
            return (f, {n: c.value for n, c in cons.items()}), (cons, aux)

        (f, values), vjp_fn, (cons, aux) = jax.vjp(outputs, params, has_aux=True)
        _check_constraints(cons)
        kinds = {n: c.kind for n, c in cons.items()}

        state_for_dual = state if update != "extragradient" else state.replace(multipliers=mult)
        new_mult, new_dual, dual_updates = dual_step(state_for_dual, cons, None, values)
        if update == "extragradient":
            # the dual gradient was taken at the extrapolated point; apply it at λ_t
            new_mult = jax.tree.map(lambda m, u: m + u, state.multipliers, dual_updates)
            if formulation.uses_multipliers:
                new_mult = {
                    n: (m if kinds[n] == "eq" else jnp.maximum(m, 0.0)) for n, m in new_mult.items()
                }
            dual_updates = jax.tree.map(lambda a, b: a - b, new_mult, state.multipliers)

        lam_for_primal = gather(new_mult if update == "alternating" else mult, cons)
        L, cot = jax.value_and_grad(
            lambda fv: lagr(fv[0], fv[1], lam_for_primal, kinds, state.penalty)
        )((f, values))
        (grads,) = vjp_fn(cot)
        p_updates, opt_state = primal.update(grads, state.opt_state, state.params)
        new_params = optax.apply_updates(state.params, p_updates)

        lam_now = gather(mult, cons)
        violation = {
            n: jnp.sqrt(jnp.mean(formulation.violation(values[n], lam_now[n], kinds[n]) ** 2))
            for n in values
        }
        penalty = {
            n: formulation.next_penalty(state.penalty[n], state.violation[n], violation[n])
            for n in values
        }
        prev = (p_updates, dual_updates) if update == "extragradient" else ()
        new_state = ConstrainedState(
            step=state.step + 1,
            params=new_params,
            opt_state=opt_state,
            multipliers=new_mult,
            dual_state=new_dual,
            penalty=penalty,
            violation=violation,
            prev_update=prev,
        )
        metrics = {
            "objective": f,
            "lagrangian": L,
            "constraints": {n: jnp.mean(v) for n, v in values.items()},
            "violation": violation,
        }
        if has_aux:
            metrics["aux"] = aux[0]
        return new_state, metrics

    return init, (jax.jit(step) if jit else step)
