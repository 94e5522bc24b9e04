"""The constrained step: any problem, named constraints, formulations, dual dynamics, resilience.

    init, step = cudt.make_constrained_step(problem, primal=optax.adam(1e-3),
                                            dual=cudt.dual_ascent(1e-2),
                                            formulation=cudt.Lagrangian(),
                                            update="simultaneous")
    state = init(params, batch, num_indexed={"per_sample": N})
    state, metrics = step(state, batch, key)

``problem(params, batch, key) -> (objective, {name: Constraint})`` (``has_aux``: a third output,
any pytree, comes back as ``metrics["aux"]``). This is cudt's one primal-dual step: the paper's
layerwise-descent problem is one instance of it (:mod:`cudt.descent`, wrapped by
:func:`cudt.make_train_step`).

**One forward per gradient.** The step takes the VJP of the problem's outputs (objective and
constraint values) and builds their cotangent from the formulation, so the primal gradient can
use the multipliers of before the dual step (``"simultaneous"``) or after it (``"alternating"``:
dual-then-primal) without a second forward. The update schemes:

- ``"simultaneous"``: both gradients at ``(θ_t, λ_t)``;
- ``"alternating"``: ``λ_{t+1}`` from the constraints at ``θ_t``, then ``θ_{t+1}`` from the
  Lagrangian at ``(θ_t, λ_{t+1})`` (one forward: the same constraint values);
- ``"extragradient"`` (Korpelevich; Cooper's ``ExtraSGD``): two gradients per step; the first, at
  ``x_t = (θ_t, λ_t, u_t)``, gives the extrapolated point ``x̃ = x_t + Δ(x_t)``; the second, at
  ``x̃``, gives the update applied at ``x_t``. The optimisers' states advance once per step, by
  the second update (the extrapolation's states are discarded);
- ``"optimistic"`` (Popov, extrapolation from the past): one gradient per step, at
  ``x_t + Δ_{t−1}`` (the previous step's update), applied at ``x_t``. Cheaper than extragradient,
  with a smaller stability region.

**Per-run values in the state.** ``init(..., hparams=tree)`` stores any pytree of arrays in the
state and the step then calls ``problem(params, batch, key, hparams)``: runs that differ only in
such values (ε, a bound, α, ...) share one compiled program (``vmap`` over states). A leaf may
be a :class:`cudt.Schedule`: the problem gets its value at ``state.step`` (ε warm-started, a
bound that follows a curriculum), and runs with other schedules still share the program. The
learning rates (``lr``, ``dual_hparams``: optimisers built with ``optax.inject_hyperparams``) and
the penalty ρ are per-run state too.

**ERM lanes and the warm-up, as a mask.** ``init(..., constrained=False)`` gives a run that
minimises the objective alone through the same program; with ``warmup_steps=W`` every run does so
for its first ``W`` steps. Masked, the constraints' cotangent is zero and the multipliers, slacks,
penalties and dual/slack optimiser states stay exactly as they were.

**Resilience** is a property of a constraint (:class:`cudt.Constraint`'s ``resilience`` α and
``resilience_mode``): the dual decay ``g − λ/α`` or explicit slacks ``u ≥ 0`` in the state,
updated with the primal variables by ``slack_optimizer`` (projected onto ``u ≥ 0``) and reset to
0 every ``slack_restart_steps`` steps if given. Both compose with every formulation, update
scheme and dual optimiser.

**Implicit multipliers** (``implicit={name: cudt.implicit(apply, φ)}``, :mod:`cudt.constrained`'s
``_implicit``): the constraint's multipliers are a model of the batch's features
(``Constraint(..., features=f)``) and ``state.multipliers[name]`` holds its parameters φ, trained
by the dual optimiser on the pull-back of the rows' dual gradients; every update scheme applies to
φ as to a table (alternating: ``λ_{t+1} = λ(φ_{t+1})``; optimistic: ``prev_update`` holds φ's
update). Not with explicit slacks (an ``N``-row table of their own) nor without multipliers
(:class:`cudt.QuadraticPenalty`).

Indexed constraints (``Constraint(..., index=ids)``) have a multiplier table of ``N`` rows; only
the batch's rows (and the rows of every dual- or slack-state leaf shaped like the table, e.g. Adam
moments) are read and written, the rest stay bit-identical (scalar state such as Adam's step count
is shared). Ids within one batch should be distinct (a repeated id keeps one of its updates).
Constraint values are whatever the problem computes; under ``jit`` with a batch sharded over a
mesh's data axis, means over the batch are global means, so multi-device runs equal one device.

The key handed to ``problem`` is ``fold_in(key, state.step)``: a fixed key still gives each step
its own randomness, and a resumed run draws what the uninterrupted one would have.

In the code, each update scheme is one small function (``_simultaneous``, ``_alternating``,
``_extragradient``, ``_optimistic``) over shared pieces: ``_evaluate`` (one forward and its VJP),
``_descend`` (one primal-dual update from an evaluation: ``_ascend`` for the multipliers, then
the parameters' and slacks' descent) and ``_advance`` (the state after the step: slack restarts,
violation, penalty).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from cudt.constrained._constraint import Constraint, FreeSign, _concrete
from cudt.constrained._dual import project_nonnegative
from cudt.constrained._formulation import Lagrangian
from cudt.constrained._implicit import Implicit, ascent_gradient
from cudt.constrained._implicit import rows as implicit_rows
from cudt.constrained._state import (
    ConstrainedState,
    _call,
    _init,
    _Spec,
    check_table_shape,
    multiplier_dtype,
)

__all__ = ["make_constrained_step"]


def _rows(tree, ids, n):
    return jax.tree.map(lambda x: x[ids] if x.ndim >= 1 and x.shape[0] == n else x, tree)


def _put_rows(tree, rows, ids, n):
    # an id outside [0, n), negative ones too (not row n − 1), writes nothing
    def put(x, r):
        return x.at[ids].set(r, mode="drop", wrap_negative_indices=False)

    return jax.tree.map(
        lambda x, r: put(x, r) if x.ndim >= 1 and x.shape[0] == n else r, tree, rows
    )


def _update_rows(table, opt_state, index, fn):
    """``fn(values, opt_state) -> (values, opt_state)`` on a variable and its optimiser state:
    the whole array, or for an indexed table (``index`` [B]) only the batch's rows, of the table
    and of every state leaf shaped like it; the other rows stay bit-identical."""
    if index is None:
        return fn(table, opt_state)
    n = table.shape[0]
    values, new_state = fn(_gather(table, index), _rows(opt_state, index, n))
    return _put_rows(table, values, index, n), _put_rows(opt_state, new_state, index, n)


def _gather(table, ids):
    """``table``'s rows ``ids``; under jit an id outside ``[0, n)`` reads NaN, a negative one
    too (not row n − 1)."""
    return table.at[ids].get(mode="fill", fill_value=jnp.nan, wrap_negative_indices=False)


def _per_scale(x, c: Constraint, inverse: bool = False):
    """``x / s`` in the constraint's scale (:class:`cudt.Constraint`'s ``scale``; none: ``x``);
    ``inverse``: ``x · s``, from the scale back to the constraint's units."""
    if c.scale is None:
        return x
    x = jnp.asarray(x)  # its own dtype back (a bf16 value or float32 multipliers)
    s = jax.lax.stop_gradient(jnp.asarray(c.scale, jnp.float32))
    return (x * s if inverse else x / s).astype(x.dtype)


def _where(pred, new, old):
    return jax.tree.map(lambda n, o: jnp.where(pred, n, o), new, old)


def _add(a, b):
    return jax.tree.map(lambda x, y: x + y, a, b)


def make_constrained_step(
    problem: Callable,
    primal: optax.GradientTransformation,
    dual: optax.GradientTransformation,
    formulation=None,
    update: str = "simultaneous",
    dual_radius: float | None = None,
    *,
    has_aux: bool = False,
    project_params: Callable[[Any], Any] | None = None,
    warmup_steps: int = 0,
    slack_optimizer: optax.GradientTransformation | None = None,
    slack_restart_steps: int | None = None,
    jit: bool = True,
    donate: bool = True,
    implicit: dict[str, Implicit] | None = None,
):
    """``(init, step)`` for ``problem``; see the module docstring.

    Args:
      problem: ``(params, batch, key[, hparams]) -> (objective, {name: Constraint}[, aux])``.
      primal: the optax optimiser of the parameters (minimises the Lagrangian).
      dual: a dual transformation following the dual updates' convention (additive, projected
        updates from the dual gradient ``g``): :func:`cudt.dual_ascent`, :func:`cudt.dual_adam`,
        :func:`cudt.nupi`, :func:`cudt.as_dual` of any optax optimiser. Equality multipliers are
        passed as :class:`cudt.FreeSign` so they are not projected.
      formulation: :class:`cudt.Lagrangian` (default), :class:`cudt.AugmentedLagrangian` or
        :class:`cudt.QuadraticPenalty`.
      update: one of ``UPDATES`` (module docstring).
      dual_radius: bounds the multipliers to ``λ ≤ R`` (``|λ| ≤ R`` for equalities), as TFCO.
      has_aux: ``problem`` returns a third output, returned as ``metrics["aux"]``.
      project_params: applied to the parameters ``init`` is given, after every primal update
        and to the extrapolated ones, e.g. the UT's eigenvalue clipping
        :func:`cudt.models.ut_project`: the first step, too, is taken in the set.
      warmup_steps: the first steps minimise the objective alone (duals frozen at their start).
      slack_optimizer: the optax optimiser of explicit slacks (``resilience_mode="slack"``),
        projected onto ``u ≥ 0``; default ``optax.sgd(1e-2)``.
      slack_restart_steps: reset explicit slacks to 0 every this many steps (the paper's
        "resilience restarts" after each epoch); None: never. Under ``"optimistic"`` the reset
        is the slacks' last update, so the next extrapolation starts them at 0 too.
      jit: False returns the pure step, to be composed (``vmap`` over runs, ``scan`` over steps)
        and jitted by the caller.
      donate: the jitted step donates the input state's buffers (saves a copy of the state per
        step); ``init`` copies what it is given, so the caller's arrays are never donated.
      implicit: ``{name: cudt.implicit(apply, φ)}``: these constraints' multipliers are a model
        of the batch's features (module docstring); ``init``'s ``multipliers={name: φ}``
        overrides the model's own φ.

    ``init(params, batch=None, num_indexed=None, key=None, *, constraints=None, hparams=None,
    constrained=True, lr=None, dual_hparams=None, penalty=None, multipliers=None)``: the
    constraints' structure
    comes from ``jax.eval_shape`` of ``problem`` on ``batch``, or from ``constraints`` (``{name:
    Constraint}`` whose values may be ``jax.ShapeDtypeStruct``) when known without a batch.
    ``hparams``: the per-run values handed to ``problem``; ``constrained=False``: an ERM run;
    ``lr``, ``dual_hparams`` (``{name: value}``, e.g. ``{"learning_rate": 0.1, "kp": 2.0}``):
    injected hyperparameters of the primal and dual optimisers; ``penalty``: ρ of every
    constraint (a formulation with one: refused under the Lagrangian, which would not read
    it). Each may be an array under ``vmap`` (a sweep).

    ``multipliers``: ``{name: φ}``, the starting parameters of implicit multipliers.

    ``metrics``: ``objective``, ``lagrangian``, ``constraints`` (name -> mean value),
    ``violation`` (name -> the RMS of h, sqrt(mean h²), in the constraint's scale), ``grad_norm`` (of the primal gradient), all measured at the
    point the gradient was taken (before the step; the extrapolated point for ``"optimistic"``;
    ``"alternating"``'s ``lagrangian`` at the new multipliers its primal step reads;
    ``"extragradient"``'s values at θ_t, its ``grad_norm`` and ``projection`` at the
    extrapolated point, whose gradient the step applies),
    ``projection`` with ``project_params`` (the share of the primal update it took back,
    ``‖P(θ') − θ'‖ / ‖θ' − θ‖``: 0 when the update stayed feasible) and ``aux`` when
    ``has_aux``; ``implicit`` (name -> ``{"mean", "max"}`` over the batch's rows of the implicit
    multipliers after the step, at the batch's features).
    """
    formulation = Lagrangian() if formulation is None else formulation
    spec = _Spec(
        problem=problem,
        primal=primal,
        dual=dual,
        formulation=formulation,
        update=update,
        dual_radius=dual_radius,
        has_aux=has_aux,
        project_params=project_params,
        warmup_steps=warmup_steps,
        slack_tx=optax.chain(
            optax.sgd(1e-2) if slack_optimizer is None else slack_optimizer,
            project_nonnegative(),
        ),
        slack_restart_steps=slack_restart_steps,
        penalty=float(getattr(formulation, "penalty", 0.0)),
        implicit=dict(implicit or {}),
    )
    scheme = _SCHEMES[update]

    def step(state: ConstrainedState, batch, key):
        return _step(spec, scheme, state, batch, key)

    if jit:
        step = jax.jit(step, donate_argnums=(0,) if donate else ())
    return functools.partial(_init, spec), step


class _Evaluation(NamedTuple):
    """The problem at one point: its outputs and the VJP that turns cotangents into gradients."""

    f: jax.Array  # the objective
    values: dict  # name -> the constraint's values
    vjp_fn: Callable  # (cot_f, {name: cot}) -> (∇_θ,)
    cons: dict  # name -> Constraint, as the problem returned it
    aux: Any


class _Descent(NamedTuple):
    """One primal-dual update from an evaluation: where it goes and what it measured."""

    variables: tuple  # (params, multipliers, slacks)
    opt_states: tuple  # (opt_state, dual_state, slack_state)
    p_updates: Any  # the primal update (before any projection)
    lagrangian: jax.Array
    grads: Any  # the primal gradient
    projection: jax.Array | None  # the share of the update project_params took back


# -- the shared pieces of a step ------------------------------------------------------------------


def _rows_of(tables, cons):
    """The batch's rows of every (indexed) table: ``{name: rows}``. An id outside ``[0, N)`` is
    an error where the ids are concrete, and reads NaN under ``jit`` (the Lagrangian NaN, not
    a row silently clamped or dropped)."""
    return {
        n: (t if cons[n].index is None else _take_rows(t, cons[n].index, n))
        for n, t in tables.items()
    }


def _take_rows(table, ids, name):
    concrete = _concrete(ids)
    n = table.shape[0]
    if concrete is not None and concrete.size and not (0 <= concrete.min() and concrete.max() < n):
        raise ValueError(
            f"constraint {name!r}: index ids must lie in [0, {n}) (its num_indexed), got "
            f"{int(concrete.min())} to {int(concrete.max())}: pass num_indexed={{{name!r}: N}} "
            "with N above every id"
        )
    return _gather(table, ids)


def _features(cons, name):
    if cons[name].features is None:
        raise ValueError(
            f"constraint {name!r} has implicit multipliers but no features: return "
            f"cudt.Constraint(value, features=f) with the batch's features f [B, ...]"
        )
    return cons[name].features


def _multiplier_rows(spec: _Spec, multipliers, cons):
    """The batch's multipliers of every constraint: a table's rows, or an implicit model at the
    batch's features."""
    out = _rows_of({n: m for n, m in multipliers.items() if n not in spec.implicit}, cons)
    for n, model in spec.implicit.items():
        c = cons[n]
        if jnp.ndim(c.value) == 0:  # φ's gradient is a mean over the batch's rows
            raise ValueError(
                f"implicit multipliers of {n!r}: its constraint is one value (shape ()), where "
                "a model of the example needs one value per example [B, ...]: return the "
                "batch's values with their features, or drop it from implicit= (a table of one)"
            )
        out[n] = implicit_rows(model, multipliers[n], _features(cons, n), c.kind, spec.dual_radius)
        if out[n].shape != c.value.shape:  # static: checked once, while the step is traced
            raise ValueError(
                f"implicit multipliers of {n!r}: the model's apply returns shape "
                f"{tuple(out[n].shape)} at the batch's features, where the constraint's values "
                f"have shape {tuple(c.value.shape)}: return one multiplier per value (reshape "
                f"apply's output to {tuple(c.value.shape)})"
            )
    return {n: out[n] for n in multipliers}


def _point(state: ConstrainedState) -> tuple:
    """``x_t = (θ_t, λ_t, u_t)``: the state's variables."""
    return state.params, state.multipliers, state.slacks


def _evaluate(spec: _Spec, params, state: ConstrainedState, batch, key) -> _Evaluation:
    """One forward of the problem at ``params``, with its VJP (the gradients come later, from
    cotangents the formulation builds)."""

    def outputs(p):
        f, cons, *aux = _call(spec, p, batch, key, state.hparams, state.step)
        return (f, {n: _inexact(c.value) for n, c in cons.items()}), (cons, aux)

    (f, values), vjp_fn, (cons, aux) = jax.vjp(outputs, params, has_aux=True)
    if set(cons) != set(state.multipliers) or {n for n, c in cons.items() if c.has_slack} != set(
        state.slacks
    ):
        raise ValueError(
            f"problem returned constraints {sorted(cons)} (explicit slacks on "
            f"{sorted(n for n, c in cons.items() if c.has_slack)}) but the state was built "
            f"for {sorted(state.multipliers)} (slacks on {sorted(state.slacks)}): build the "
            "state with init from the same problem"
        )
    _check_tables(spec, state, cons)
    return _Evaluation(f, values, vjp_fn, cons, aux[0] if aux else None)


def _inexact(value):
    """A constraint's values as the VJP differentiates them: an integer or bool value (a count,
    constant in the parameters) as float32, as the drop-in Lagrangian reads it (its VJP failed:
    "grad requires real- or complex-valued inputs")."""
    value = jnp.asarray(value)
    return value if jnp.issubdtype(value.dtype, jnp.inexact) else value.astype(jnp.float32)


_REBUILD = "build the state with this step's init (from the same problem and num_indexed)"


def _short(tree_def, other) -> str:
    """An optimiser state's structure in a line: its states' names (``(ScaleByAdamState,
    EmptyState)``), or where those are ``other``'s too, the tree itself (cut)."""
    names = ", ".join(re.findall(r"namedtuple\[(\w+)\]", str(tree_def)))
    if names and names != ", ".join(re.findall(r"namedtuple\[(\w+)\]", str(other))):
        return f"({names})"
    text = str(tree_def)
    return text if len(text) <= 160 else text[:157] + "..."


def _check_structure(got, want, what: str) -> None:
    """``got``'s tree structure is ``want``'s (one from the step's own ``init``), else one error
    naming ``what`` and the fix."""
    got, want = jax.tree.structure(got), jax.tree.structure(want)
    if got != want:
        raise ValueError(
            f"the state's {what} is {_short(got, want)}, where this step's optimiser keeps "
            f"{_short(want, got)}: the state was built for another optimiser; {_REBUILD}"
        )


def _check_state(spec: _Spec, state) -> None:
    """The state was built by this step's ``init``: a ``ConstrainedState``, with the previous
    update ``"optimistic"`` steps from (and only then), and the primal optimiser's state. A state
    of another step ran on (a simultaneous state under ``"optimistic"`` failed with an opaque
    IndexError; an Adam state under SGD trained, under Adam SGD's failed on a missing ``mu``).
    Static structure: checked once, while the step is traced."""
    if not isinstance(state, ConstrainedState):
        raise TypeError(
            f"step takes the ConstrainedState its init returns, got {type(state).__name__}"
        )
    here = (state.params, state.multipliers, state.slacks)
    if spec.update == "optimistic":
        if jax.tree.structure(state.prev_update) != jax.tree.structure(here):
            raise ValueError(
                "update='optimistic' steps from the previous step's update, which this state "
                f"does not hold (it was built for another update scheme): {_REBUILD}"
            )
    elif jax.tree.structure(state.prev_update) != jax.tree.structure(()):
        raise ValueError(
            f"the state holds an optimistic step's previous update, which this "
            f"update={spec.update!r} step would drop (the state was built for "
            f"update='optimistic'): {_REBUILD}"
        )
    want = jax.eval_shape(spec.primal.init, state.params)
    _check_structure(state.opt_state, want, "primal optimiser state")


def _check_tables(spec: _Spec, state: ConstrainedState, cons) -> None:
    """The state's multiplier and slack tables have the shapes the constraints' values ask
    (:func:`check_table_shape`), and their dual and slack optimiser states the structure this
    step's optimisers keep. Static: checked once, while the step is traced."""
    for n, c in cons.items():
        m, indexed = state.multipliers[n], c.index is not None
        if n not in spec.implicit:
            check_table_shape(n, m, jnp.shape(c.value), indexed, "its multipliers", _REBUILD)
        free = c.kind == "eq" or n in spec.implicit
        want = jax.eval_shape(spec.dual.init, FreeSign(m) if free else m)
        _check_kind(spec, n, c.kind, state.dual_state[n], want, m)
        _check_structure(state.dual_state[n], want, f"dual optimiser state of {n!r}")
        if n in state.slacks:
            u = state.slacks[n]
            check_table_shape(n, u, jnp.shape(c.value), indexed, "its slacks", _REBUILD)
            want = jax.eval_shape(spec.slack_tx.init, u)
            _check_structure(state.slack_state[n], want, f"slack optimiser state of {n!r}")


def _check_kind(spec: _Spec, name: str, kind: str, got, want, table) -> None:
    """A dual state built for the other kind of constraint (``init``'s ``constraints=`` of
    another kind than the problem's: a stateful dual keeps equalities' moments unprojected) is
    named as such, not as a state of another optimiser. A stateless dual (``dual_ascent``) keeps
    no trace of the kind: its state is the same either way, and the step reads the problem's."""
    if name in spec.implicit or jax.tree.structure(got) == jax.tree.structure(want):
        return
    other = jax.eval_shape(spec.dual.init, table if kind == "eq" else FreeSign(table))
    if jax.tree.structure(got) == jax.tree.structure(other):
        a, b = (
            ("an equality", "an inequality") if kind == "eq" else ("an inequality", "an equality")
        )
        raise ValueError(
            f"constraint {name!r} is {a}, but the state's dual optimiser state of it was built "
            f"for {b} (init's constraints= of another kind than the problem's): pass init "
            "constraints of the kinds the problem returns, or a batch instead"
        )


def _dual_gradient(values, lam, u, cons):
    """``∇_λ`` of the (resilient) Lagrangian at the batch's rows, in the constraint's
    ``scale``: ``g/s``, ``(g − u)/s`` (explicit slacks) or ``g/s − λ/α`` (the decay form)."""
    out = {}
    for n, c in cons.items():
        d = _per_scale(_minus_slack(values, u, n, c), c)
        d = d.astype(multiplier_dtype(d.dtype))  # a bf16 constraint's step, in float32
        if not c.has_slack and c.resilience is not None:  # a per-run α (float32) keeps the dtype
            d = d - (lam[n] / c.resilience).astype(d.dtype)
        out[n] = d
    return out


def _minus_slack(values, u, n, c: Constraint):
    """Constraint ``n``'s value as the step relaxes it: ``g − u`` with explicit slacks, else
    ``g`` (the decay form relaxes it by :func:`_decay_relaxed`)."""
    return values[n] - u[n] if c.has_slack else values[n]


def _decay_relaxed(formulation, g, lam, rho, c: Constraint):
    """``(g, ρ)`` of a penalised constraint under resilience in the decay form (no slack in the
    state), the relaxation ``u`` of ``g ≤ u`` (cost ``(α/2)u²``, both in the scale ``s``) put in:

    - augmented Lagrangian: the constraint at ``g − s·λ/α``, the slack the dual's fixed point
      ``u = s·λ/α`` sets (a constant of the primal step), so its fixed points are the resilient
      problem's, as the Lagrangian's are (without it the penalty keeps pulling ``g`` to 0:
      the cost of a relaxation would be ``α + ρ``);
    - quadratic penalty (no λ): the slack minimised out, ``min_u (α/2)u² + (ρ/2)max(g − u, 0)²
      = (ρ_α/2)·max(g, 0)²`` with ``ρ_α = ρ/(1 + ρ/α)``: the explicit slacks' fixed point, and
      as ρ grows the resilient problem itself (``ρ_α → α``).

    α = inf (a hard run of a sweep) leaves both unchanged. Anything else: as given."""
    if c.has_slack or c.resilience is None or not formulation.uses_penalty:
        return g, rho
    if formulation.uses_multipliers:
        return _minus_decay_slack(g, lam, c), rho
    return g, rho / (1.0 + rho / c.resilience)


def _minus_decay_slack(g, lam, c: Constraint):
    """``g − s·λ/α``: a constraint in the decay form (resilience without a slack in the state)
    relaxed by the slack its dual's fixed point sets, a constant of the primal step."""
    shift = lam / c.resilience if c.scale is None else lam * c.scale / c.resilience
    return g - jax.lax.stop_gradient(shift).astype(g.dtype)


def _relaxed(formulation, values, u, lam, rho, n, c: Constraint):
    """Constraint ``n`` as a resilient problem relaxes it, whatever the formulation: ``g − u``
    with explicit slacks, ``g − s·λ/α`` in the decay form (the quadratic penalty's, without λ:
    ``g − u*`` with the slack :func:`_decay_relaxed` minimises out, ``u* = max(g, 0)·ρ/(α + ρ)``),
    else ``g`` (what a violation is measured on: the same resilient problem reads the same
    under either form)."""
    g = _minus_slack(values, u, n, c)
    if c.has_slack or c.resilience is None:
        return g
    if formulation.uses_multipliers or not formulation.uses_penalty:
        return _minus_decay_slack(g, lam, c)
    # g − u* = g / (1 + ρ/α) where violated; α = inf (a hard run of a sweep): g
    return jnp.where(g > 0, g / (1.0 + rho / c.resilience), g).astype(g.dtype)


def _lagrangian(formulation, f, values, u, lam, rho, cons):
    """The objective plus every constraint's term (and explicit slacks' costs)."""
    total = f
    for n, c in cons.items():
        g, rho_n = _decay_relaxed(formulation, _minus_slack(values, u, n, c), lam[n], rho[n], c)
        total = total + formulation.term(g, lam[n], c.kind, _per_scale(rho_n, c))
        if c.has_slack:
            total = total + 0.5 * c.resilience * jnp.sum(_per_scale(u[n] ** 2, c))
    return total


def _ascend_one(spec: _Spec, c: Constraint, d, active, lam, ds):
    """One constraint's multipliers (or the batch's rows of them) and dual state after the dual
    optimiser's step on ``d``, clipped to ``dual_radius``; unchanged where not ``active``."""
    eq = c.kind == "eq"
    wrap = FreeSign if eq else (lambda x: x)
    u, ds_new = spec.dual.update(wrap(d), ds, wrap(lam))
    lam_new = lam + (u.value if eq else u)
    if spec.dual_radius is not None:
        lam_new = jnp.clip(lam_new, -spec.dual_radius if eq else 0.0, spec.dual_radius)
    return _where(active, (lam_new, ds_new), (lam, ds))


def _ascend_implicit(spec: _Spec, cons, name, phi_at, d, active, phi, ds):
    """An implicit constraint's φ and dual state after the dual optimiser's ascent on the
    pull-back of the rows' ``d`` taken at ``phi_at`` (the evaluation's point), applied at ``phi``
    (as :func:`_ascend_one` applies a table's); unchanged where not ``active``."""
    model, kind = spec.implicit[name], cons[name].kind
    grad = ascent_gradient(model, phi_at, _features(cons, name), d, kind, spec.dual_radius)
    u, ds_new = spec.dual.update(FreeSign(grad), ds, FreeSign(phi))
    phi_new = jax.tree.map(lambda p, x: p + x, phi, u.value)
    return _where(active, (phi_new, ds_new), (phi, ds))


def _ascend(spec: _Spec, state: ConstrainedState, grad, cons, active, phi_at=None):
    """New multipliers and dual states: the dual optimiser's update from ``grad`` applied at
    ``state``'s multipliers (masked rows and runs keep theirs); implicit multipliers' gradient
    is taken at ``phi_at``'s parameters (the evaluation's point; default the state's)."""
    if not spec.formulation.uses_multipliers:
        return state.multipliers, state.dual_state
    phi_at = state.multipliers if phi_at is None else phi_at
    new_mult, new_dual = {}, {}
    for n, c in cons.items():
        if n in spec.implicit:
            new_mult[n], new_dual[n] = _ascend_implicit(
                spec,
                cons,
                n,
                phi_at[n],
                grad[n],
                active,
                state.multipliers[n],
                state.dual_state[n],
            )
            continue
        new_mult[n], new_dual[n] = _update_rows(
            state.multipliers[n],
            state.dual_state[n],
            c.index,
            functools.partial(_ascend_one, spec, c, grad[n], active),
        )
    return new_mult, new_dual


def _descend_slack(spec: _Spec, d, active, u, ss):
    upd, ss_new = spec.slack_tx.update(d, ss, u)
    return _where(active, (u + upd, ss_new), (u, ss))


def _descend_slacks(spec: _Spec, state: ConstrainedState, grad, cons, active):
    """New explicit slacks and slack states: projected descent on ``grad`` (masked rows and
    runs keep theirs)."""
    new_u, new_s = {}, {}
    for n in state.slacks:
        # u is in the constraint's units: its gradient (α u / s − λ) times s, so that a step
        # moves u by (a fraction of) s·λ, as the problem in other units moves it (scale-free)
        d = grad[n] if cons[n].scale is None else _per_scale(grad[n], cons[n], inverse=True)
        new_u[n], new_s[n] = _update_rows(
            state.slacks[n],
            state.slack_state[n],
            cons[n].index,
            functools.partial(_descend_slack, spec, d, active),
        )
    return new_u, new_s


def _descend_params(spec: _Spec, state: ConstrainedState, grads):
    """The primal optimiser's step from ``state``'s parameters, then ``project_params``:
    ``(params, opt_state, updates, the share of the updates the projection took back)``."""
    p_updates, opt_state = spec.primal.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, p_updates)
    removed = None
    if spec.project_params is not None:
        raw, params = params, spec.project_params(params)
        # the share of the primal update the projection takes back: ‖P(θ') − θ'‖ / ‖θ' − θ‖
        moved = jax.tree.map(lambda a, b: a - b, params, raw)
        removed = optax.tree.norm(moved) / jnp.maximum(optax.tree.norm(p_updates), 1e-30)
    return params, opt_state, p_updates, removed


def _descend(
    spec: _Spec, state: ConstrainedState, at, ev: _Evaluation, active, *, dual_first=False
) -> _Descent:
    """The step's new variables and optimiser states from the gradients of ``ev``, the
    evaluation at the point ``at = (params, multipliers, slacks)``, applied at ``state``'s
    variables with ``state``'s optimiser states. ``dual_first``: the primal gradient uses the
    multipliers after the dual step (alternating), else those at ``at``."""
    cons = ev.cons
    lam_at = _multiplier_rows(spec, at[1], cons)
    u_at = _rows_of(at[2], cons)
    new_mult, new_dual = _ascend(
        spec, state, _dual_gradient(ev.values, lam_at, u_at, cons), cons, active, at[1]
    )
    lam = _multiplier_rows(spec, new_mult, cons) if dual_first else lam_at
    L, ((cot_f, cot_v), grad_u) = jax.value_and_grad(
        lambda fv, uu: _lagrangian(spec.formulation, fv[0], fv[1], uu, lam, state.penalty, cons),
        argnums=(0, 1),
    )((ev.f, ev.values), u_at)
    # ERM and the warm-up: the constraints do not reach the parameters, nor the reported
    # Lagrangian (a penalty formulation's terms are not zero at λ = 0)
    cot_v = jax.tree.map(lambda v: jnp.where(active, v, jnp.zeros_like(v)), cot_v)
    L = jnp.where(active, L, ev.f)
    (grads,) = ev.vjp_fn((cot_f, cot_v))
    params, opt_state, p_updates, removed = _descend_params(spec, state, grads)
    new_u, new_slack_state = _descend_slacks(spec, state, grad_u, cons, active)
    return _Descent(
        (params, new_mult, new_u),
        (opt_state, new_dual, new_slack_state),
        p_updates,
        L,
        grads,
        removed,
    )


def _advance(spec: _Spec, state, active, shown: _Evaluation, shown_at, d: _Descent):
    """The state after the step ``d``: slack restarts, and the violation and penalty measured by
    ``shown``, the evaluation at ``shown_at``. Also returns ``shown_at``'s multipliers' rows and
    the violation measured (the state keeps its last active value, the penalty's reference:
    an ERM run and the warm-up steps report what they measure, not that value)."""
    params, multipliers, slacks = d.variables
    opt_state, dual_state, slack_state = d.opt_states
    if spec.slack_restart_steps is not None:
        restart = (state.step + 1) % spec.slack_restart_steps == 0
        slacks = jax.tree.map(lambda u: jnp.where(restart, jnp.zeros_like(u), u), slacks)
    form, cons, values = spec.formulation, shown.cons, shown.values
    lam = _multiplier_rows(spec, shown_at[1], cons)
    u = _rows_of(shown_at[2], cons)
    # of the relaxed constraint, g − u (explicit slacks) or decayed multipliers; in the state's
    # dtype (as the penalty below): float64 values under x64 kept a scan's carry from closing
    violation = {
        n: jnp.sqrt(
            jnp.mean(
                form.violation(
                    _per_scale(_relaxed(form, values, u, lam[n], state.penalty[n], n, c), c),
                    lam[n],
                    c.kind,
                )
                ** 2
            )
        ).astype(state.violation[n].dtype)
        for n, c in cons.items()
    }
    penalty = {
        n: jnp.where(
            active,
            form.next_penalty(state.penalty[n], state.violation[n], violation[n]),
            state.penalty[n],
        ).astype(state.penalty[n].dtype)
        for n in values
    }
    measured = violation
    violation = _where(active, violation, state.violation)
    new_state = state.replace(
        step=state.step + 1,
        params=params,
        opt_state=opt_state,
        multipliers=multipliers,
        dual_state=dual_state,
        slacks=slacks,
        slack_state=slack_state,
        penalty=penalty,
        violation=violation,
        prev_update=(),
    )
    return new_state, lam, measured


def _metrics(spec: _Spec, shown: _Evaluation, lagrangian, violation, d: _Descent) -> dict:
    metrics = {
        "objective": shown.f,
        "lagrangian": lagrangian,
        "constraints": {n: jnp.mean(v) for n, v in shown.values.items()},
        "violation": violation,
        "grad_norm": optax.tree.norm(d.grads),
    }
    if d.projection is not None:
        metrics["projection"] = d.projection
    if spec.has_aux:
        metrics["aux"] = shown.aux
    if spec.implicit:
        lam = _multiplier_rows(spec, d.variables[1], shown.cons)
        metrics["implicit"] = {
            n: {"mean": jnp.mean(lam[n], axis=0), "max": jnp.max(lam[n], axis=0)}
            for n in spec.implicit
        }
    return metrics


# -- the update schemes ---------------------------------------------------------------------------


def _simultaneous(spec: _Spec, state, batch, key, active, *, dual_first=False):
    """Both gradients at ``x_t = (θ_t, λ_t, u_t)``, from one forward."""
    here = _point(state)
    ev = _evaluate(spec, here[0], state, batch, key)
    d = _descend(spec, state, here, ev, active, dual_first=dual_first)
    new_state, _, measured = _advance(spec, state, active, ev, here, d)
    return new_state, _metrics(spec, ev, d.lagrangian, measured, d)


def _alternating(spec: _Spec, state, batch, key, active):
    """Dual, then primal: ``λ_{t+1}`` from the constraints at ``θ_t``, then ``θ_{t+1}`` from the
    Lagrangian at ``(θ_t, λ_{t+1})``. One forward: both use the constraint values at ``θ_t``,
    so this is the simultaneous step with the dual update first."""
    return _simultaneous(spec, state, batch, key, active, dual_first=True)


def _extragradient(spec: _Spec, state, batch, key, active):
    """Korpelevich (Cooper's ``ExtraSGD``): two gradients per step. The first, at ``x_t``, gives
    the extrapolated point ``x̃ = x_t + Δ(x_t)``; the second, at ``x̃``, gives the update applied
    at ``x_t``. The optimisers' states advance once, by the second update (the extrapolation's
    are discarded); the metrics are those of ``x_t``, as in the other schemes."""
    here = _point(state)
    shown = _evaluate(spec, here[0], state, batch, key)
    at = _descend(spec, state, here, shown, active).variables
    ev = _evaluate(spec, at[0], state, batch, key)
    d = _descend(spec, state, at, ev, active)
    new_state, lam, measured = _advance(spec, state, active, shown, here, d)
    u = _rows_of(state.slacks, shown.cons)
    L = _lagrangian(spec.formulation, shown.f, shown.values, u, lam, state.penalty, shown.cons)
    L = jnp.where(active, L, shown.f)  # as _descend reports it
    return new_state, _metrics(spec, shown, L, measured, d)


def _feasible_duals(spec: _Spec, multipliers, slacks, cons):
    """Multiplier tables in their feasible set (``λ ≥ 0`` for inequalities, ``|λ| ≤`` the dual
    radius), slacks ``u ≥ 0``: where the update projects them. Implicit multipliers' φ are a
    model's parameters, unconstrained (its outputs are projected)."""
    lam = {}
    for n, m in multipliers.items():
        if n in spec.implicit:
            lam[n] = m
            continue
        eq, radius = cons[n].kind == "eq", spec.dual_radius
        lo = (-radius if radius is not None else None) if eq else 0.0
        lam[n] = jnp.clip(m, lo, radius) if lo is not None or radius is not None else m
    return lam, jax.tree.map(lambda u: jnp.maximum(u, 0.0), slacks)


def _optimistic(spec: _Spec, state, batch, key, active):
    """Popov (extrapolation from the past): one gradient per step, at ``x_t + Δ_{t−1}`` (the
    previous step's update, kept in ``state.prev_update``) put back in the feasible set
    (``project_params``, ``λ ≥ 0``, ``u ≥ 0``: the extrapolation of a projected variable may
    leave it, and a negative multiplier would reward a violation), applied at ``x_t``; the
    metrics are those of that extrapolated point."""
    here = _point(state)
    params = optax.apply_updates(state.params, state.prev_update[0])
    if spec.project_params is not None:
        params = spec.project_params(params)
    ev = _evaluate(spec, params, state, batch, key)
    lam, u = (_add(x, d) for x, d in zip(here[1:], state.prev_update[1:], strict=True))
    at = (params, *_feasible_duals(spec, lam, u, ev.cons))
    d = _descend(spec, state, at, ev, active)
    new_state, _, measured = _advance(spec, state, active, ev, at, d)
    new_state = new_state.replace(
        prev_update=(
            d.p_updates,
            jax.tree.map(lambda a, b: a - b, new_state.multipliers, state.multipliers),
            jax.tree.map(lambda a, b: a - b, new_state.slacks, state.slacks),
        )
    )
    return new_state, _metrics(spec, ev, d.lagrangian, measured, d)


_SCHEMES = {
    "simultaneous": _simultaneous,
    "alternating": _alternating,
    "extragradient": _extragradient,
    "optimistic": _optimistic,
}


def _step(spec: _Spec, scheme: Callable, state: ConstrainedState, batch, key):
    """One step of ``scheme``: the key of this step, and the mask of the constraints (off for
    ERM runs and during the warm-up)."""
    _check_state(spec, state)
    key = jax.random.fold_in(key, state.step)
    active = state.constrained
    if spec.warmup_steps > 0:
        active = active & (state.step >= spec.warmup_steps)
    return scheme(spec, state, batch, key, active)
