"""The constrained step's state and its ``init``: what :func:`cudt.make_constrained_step` was
given (checked, as ``_Spec``), the ``ConstrainedState`` pytree and a new run's state.

:mod:`cudt.constrained._step` holds the step itself (its module docstring describes both).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from cudt.constrained._constraint import Constraint, FreeSign, _concrete
from cudt.constrained._dual import check_dual
from cudt.constrained._formulation import check_formulation
from cudt.constrained._implicit import Implicit
from cudt.constrained._schedule import values_at

__all__ = ["UPDATES", "ConstrainedState", "check_objective", "set_learning_rate"]

UPDATES = ("simultaneous", "alternating", "extragradient", "optimistic")


@flax.struct.dataclass
class ConstrainedState:
    """Everything a run's future depends on, as one pytree (vmappable, checkpointable)."""

    step: jax.Array  # [] int32
    params: Any
    opt_state: Any
    multipliers: dict  # name -> array (indexed: table [N, ...]; implicit: the model's φ); >= f32
    dual_state: dict  # name -> the dual optimiser's state of that constraint
    slacks: dict  # name -> u (same shape as its multipliers), explicit-slack constraints only
    slack_state: dict  # name -> the slack optimiser's state
    penalty: dict  # name -> [] ρ
    violation: dict  # name -> [] last violation norm (for the penalty rule)
    prev_update: Any  # "optimistic": (params, multipliers, slacks) updates of the last step
    hparams: Any  # per-run values handed to the problem (None: problem(params, batch, key))
    constrained: jax.Array  # [] bool: False runs the objective alone (ERM), duals frozen


def _is_injected(node) -> bool:
    return isinstance(node, optax.InjectStatefulHyperparamsState)


# the injected hyperparameters whose range is known: learning rates, nupi's gains and EMA
# (as cudt.nupi names them, and as cudt.optim.dual_optimizer injects them)
_RANGES = {
    "learning_rate": (lambda v: v > 0, "> 0"),
    **dict.fromkeys(("kp", "ki", "nupi_kp"), (lambda v: v >= 0, ">= 0")),
    **dict.fromkeys(("ema_nu", "nupi_ema"), (lambda v: (v >= 0) & (v < 1), "in [0, 1)")),
}


def set_learning_rate(opt_state, value, name: str = "learning_rate", what: str = "lr"):
    """``opt_state`` with the injected hyperparameter ``name`` set to ``value`` (float32).

    The optimiser must be built with ``optax.inject_hyperparams`` (for example
    ``optax.inject_hyperparams(optax.adam)(learning_rate=1e-3)``), which keeps its learning
    rate in its state, so runs stacked on a leading axis each train with their own. Raises a
    ``ValueError`` naming the fix (and ``what`` asked) when no such hyperparameter is in the
    state, or when a concrete learning rate is not > 0.
    """
    found, scheduled = [], []

    def put(node):
        if _is_injected(node) and name in node.hyperparams:
            found.append(node)
            if name in node.hyperparams_states:  # a schedule: recomputed at every update
                scheduled.append(node)
            hyper = dict(node.hyperparams)
            hyper[name] = jnp.asarray(value, jnp.float32).reshape(jnp.shape(hyper[name]))
            return node._replace(hyperparams=hyper)
        return node

    if name in _RANGES:  # the checks the optimiser's own factory makes (cudt.nupi's)
        ok, says = _RANGES[name]
        with contextlib.suppress(jax.errors.ConcretizationTypeError, TypeError):
            if not np.all(ok(np.asarray(value, np.float64))):  # concrete (not a sweep's)
                raise ValueError(f"{what} must be {says}, got {np.asarray(value).tolist()}")
    new_state = jax.tree.map(put, opt_state, is_leaf=_is_injected)
    if scheduled:  # the value set was overwritten by the schedule's at the first update
        raise ValueError(
            f"cannot set {what}: the optimiser's injected {name!r} is a schedule, which it "
            "recomputes at every update (the value set would be ignored): inject a number and "
            "chain the schedule's factor, e.g. optax.chain(optax.inject_hyperparams(optax.adam)"
            "(learning_rate=1e-3), optax.scale_by_schedule(...)), as cudt.optim does"
        )
    if not found:
        kept = sorted(
            {
                k
                for node in jax.tree.leaves(opt_state, is_leaf=_is_injected)
                if _is_injected(node)
                for k in node.hyperparams
            }
        )
        if kept:  # injected, under other names (an optimiser of one's own: its own names)
            like = next((k for k in kept if name.endswith("_" + k)), "NAME")  # nupi_kp: kp
            raise ValueError(
                f"cannot set {what}: the optimiser injects {', '.join(map(repr, kept))}, not "
                f"{name!r}; pass the value under its name (dual_hparams={{{like!r}: value}} "
                "for a dual), or build the dual with cudt.optim.dual_optimizer, which injects "
                "learning_rate, nupi_kp and nupi_ema"
            )
        raise ValueError(
            f"cannot set {what}: the optimiser keeps no injected {name!r} in its state; build it "
            "with optax.inject_hyperparams, e.g. optax.inject_hyperparams(optax.adam)"
            "(learning_rate=1e-3), or cudt.optim.dual_optimizer('nupi', 0.1) for a dual"
        )
    return new_state


def _copy(tree):
    """Fresh buffers for every array leaf: a donating step may delete what the state holds,
    and the caller's arrays must stay the caller's."""
    return jax.tree.map(lambda x: jnp.array(x, copy=True) if hasattr(x, "shape") else x, tree)


def _fresh_hyperparams(opt_state):
    """``opt_state`` with every injected hyperparameter in a buffer of its own: optax keeps a
    rate given as an array (``inject_hyperparams(adam)(learning_rate=jnp.asarray(1e-3))``) as
    that very array, so the donating step deleted the caller's and, shared by the dual states
    of two constraints, refused it ("Attempt to donate the same buffer twice")."""

    def fresh(node):
        if _is_injected(node):
            return node._replace(hyperparams=_copy(dict(node.hyperparams)))
        return node

    return jax.tree.map(fresh, opt_state, is_leaf=_is_injected)


def _check_takes_hparams(problem) -> None:
    """``problem`` must take a fourth argument when a run holds ``hparams``."""
    try:
        inspect.signature(problem).bind(None, None, None, None)
    except TypeError:
        raise TypeError(
            "init(..., hparams=...) hands the problem a fourth argument, but it takes "
            f"{inspect.signature(problem)}: define problem(params, batch, key, hparams)"
        ) from None
    except ValueError:  # no signature to read (a builtin): the call will say
        return


def _check_params(params) -> None:
    """Every array of ``params`` is trained, so floating-point: an integer one (a count, an
    index) has no gradient to descend and fails inside the optimiser."""
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        dtype = getattr(leaf, "dtype", None)
        if dtype is not None and not jnp.issubdtype(dtype, jnp.inexact):
            raise TypeError(
                f"params{jax.tree_util.keystr(path)} is {dtype}, not floating-point: every "
                "array in params is trained; keep integer arrays out of params (in the batch "
                "or the problem's closure), or cast them"
            )


def _check_constraints(cons):
    if not isinstance(cons, dict) or not all(isinstance(c, Constraint) for c in cons.values()):
        raise TypeError(
            "problem must return (objective, {name: cudt.Constraint(...)}): wrap each "
            "constraint's values in cudt.Constraint"
        )
    # checked here, on the problem's output, not in Constraint itself: a tree map over
    # constraints may hold any leaf in ``value`` (a tuple of arrays, a sentinel)
    for name, c in cons.items():
        if isinstance(c.value, (dict, list, tuple)):
            raise TypeError(
                f"constraint {name!r}: a Constraint's value must be one array (any shape), got "
                f"a {type(c.value).__name__}: return one Constraint per array, e.g. "
                "{'a': Constraint(a), 'b': Constraint(b)}, or stack them into one array"
            )


@dataclasses.dataclass(frozen=True)
class _Spec:
    """What :func:`make_constrained_step` was given, checked: the static part of every step."""

    problem: Callable
    primal: optax.GradientTransformation
    dual: optax.GradientTransformation
    formulation: Any
    update: str
    dual_radius: float | None
    has_aux: bool
    project_params: Callable[[Any], Any] | None
    warmup_steps: int
    slack_tx: optax.GradientTransformation  # the slack optimiser, projected onto u >= 0
    slack_restart_steps: int | None
    penalty: float  # ρ of a new run: the formulation's (0 without one)
    implicit: dict  # name -> Implicit: the constraints whose multipliers are a model

    def __post_init__(self):
        """One ``ValueError`` or ``TypeError`` naming the fix for a bad argument."""
        implicit, formulation = self.implicit, self.formulation
        check_formulation(formulation)
        check_dual(self.dual)
        if not isinstance(self.primal, optax.GradientTransformation):
            raise ValueError(
                f"primal must be an optax GradientTransformation, got "
                f"{type(self.primal).__name__}: pass e.g. optax.adam(1e-3)"
            )
        if not all(isinstance(m, Implicit) for m in implicit.values()):
            raise TypeError("implicit must map constraint names to cudt.implicit(apply, params)")
        if implicit and not formulation.uses_multipliers:
            raise ValueError(
                f"{type(formulation).__name__} has no multipliers, so none can be implicit: drop "
                "implicit= or use the Lagrangian or the augmented Lagrangian"
            )
        if self.update not in UPDATES:
            raise ValueError(f"update must be one of {UPDATES}, got {self.update!r}")
        radius, warmup, restart = self.dual_radius, self.warmup_steps, self.slack_restart_steps
        if radius is not None and not float(radius) > 0:
            raise ValueError(f"dual_radius must be > 0 or None, got {radius}")
        if isinstance(warmup, bool) or int(warmup) != warmup or warmup < 0:
            raise ValueError(f"warmup_steps must be an integer >= 0, got {warmup!r}")
        if restart is not None and not restart >= 1:
            raise ValueError(f"slack_restart_steps must be >= 1 or None, got {restart}")


# -- the problem and a new state ------------------------------------------------------------------


def _call(spec: _Spec, params, batch, key, hparams, step=0):
    """``problem``'s outputs at ``step`` (the value of every schedule in ``hparams``), checked."""
    problem, hparams = spec.problem, values_at(hparams, step)
    out = problem(params, batch, key) if hparams is None else problem(params, batch, key, hparams)
    if not isinstance(out, tuple) or len(out) != (3 if spec.has_aux else 2):
        raise TypeError(
            f"problem must return (objective, {{name: cudt.Constraint}}"
            f"{', aux' if spec.has_aux else ''}), got {type(out).__name__}"
            + (f" of {len(out)} items" if isinstance(out, tuple) else "")
            + ("" if spec.has_aux else ": pass has_aux=True if it returns a third output")
        )
    check_objective(out[0])
    _check_constraints(out[1])
    return out


def check_objective(f) -> None:
    """The problem's objective is one number: per-example losses ``[B]`` failed inside the
    Lagrangian's gradient ("Gradient only defined for scalar-output functions")."""
    if jnp.ndim(f) != 0:
        raise ValueError(
            f"problem's objective must be a scalar, got shape {tuple(jnp.shape(f))}: return "
            "its mean (jnp.mean of per-example losses)"
        )


def _constraints_of(spec: _Spec, params, batch, key, hparams) -> dict:
    """The problem's constraints, from one abstract evaluation on ``batch``. Without a batch
    (``init(params)``, as :func:`cudt.make_train_step`'s init is called) a problem that reads
    it failed inside itself ("cannot unpack non-iterable NoneType object"): named here."""
    if batch is None:
        problem = spec.problem

        def without_batch(*args):
            try:
                inspect.signature(problem).bind(*args)
            except (TypeError, ValueError):  # called with too few arguments: its own error
                return problem(*args)
            try:
                return problem(*args)
            except (TypeError, AttributeError, IndexError, KeyError) as err:
                raise TypeError(
                    f"init evaluates the problem on a batch to find its constraints' shapes, "
                    f"and got none ({type(err).__name__}: {err}): pass one, init(params, "
                    "batch), or init(params, constraints={name: cudt.Constraint(...)})"
                ) from err

        spec = dataclasses.replace(spec, problem=without_batch)
    return jax.eval_shape(functools.partial(_call, spec), params, batch, key, hparams)[1]


def _zero_multipliers(constraints, num_indexed: dict) -> dict:
    """``{name: 0}`` shaped like each constraint's values (indexed: a table of ``N`` rows)."""
    unknown = set(num_indexed) - set(constraints)
    if unknown:
        raise ValueError(f"num_indexed names unknown constraints {sorted(unknown)}")
    mult = {}
    for name, c in constraints.items():
        if c.index is not None:
            if name not in num_indexed:
                raise ValueError(
                    f"constraint {name!r} is indexed: pass num_indexed={{{name!r}: N}} to init"
                )
            shape = (int(num_indexed[name]),) + tuple(c.value.shape[1:])
        else:
            if name in num_indexed:  # a table size for a constraint with one multiplier a value
                raise ValueError(
                    f"constraint {name!r} is not indexed (its values carry no index): drop "
                    f"{name!r} from num_indexed"
                )
            shape = tuple(c.value.shape)
        mult[name] = jnp.zeros(shape, multiplier_dtype(c.value.dtype))
    return mult


def multiplier_dtype(value_dtype):
    """The dtype of a constraint's multipliers (slacks and dual state alike): its values'
    dtype, at least float32. A bfloat16 λ stalls: past 1 its spacing is 2^-7, so a dual step
    under 2^-8 rounds to nothing (λ stayed at 1.0 through 1000 steps of +0.0025)."""
    return jnp.promote_types(value_dtype, jnp.float32)


def _init(
    spec: _Spec,
    params,
    batch=None,
    num_indexed=None,
    key=None,
    *,
    constraints=None,
    hparams=None,
    constrained=True,
    lr=None,
    dual_hparams=None,
    penalty=None,
    multipliers=None,
) -> ConstrainedState:
    """``init`` of :func:`make_constrained_step` (its docstring says what each argument does)."""
    if hparams is not None:
        _check_takes_hparams(spec.problem)
    num_indexed = dict(num_indexed or {})
    if constraints is None:
        key = jax.random.key(0) if key is None else key
        constraints = _constraints_of(spec, params, batch, key, hparams)
    _check_constraints(constraints)
    phis = _implicit_params(spec, constraints, dict(multipliers or {}))
    tables = {n: c for n, c in constraints.items() if n not in phis}
    mult = _zero_multipliers(tables, {n: v for n, v in num_indexed.items() if n not in phis})
    mult = {n: phis[n] if n in phis else mult[n] for n in constraints}
    dual_state = {
        n: _fresh_hyperparams(
            spec.dual.init(FreeSign(m) if constraints[n].kind == "eq" or n in phis else m)
        )
        for n, m in mult.items()
    }
    for name, value in dict(dual_hparams or {}).items():
        if value is not None:
            dual_state = set_learning_rate(dual_state, value, name, f"the dual's {name}")
    # fresh buffers per field: a shared one could not be donated twice
    slacks = {n: jnp.zeros_like(m) for n, m in mult.items() if constraints[n].has_slack}
    _check_params(params)
    params = _copy(params)
    if spec.project_params is not None:  # every iterate in the set, the first one too
        params = spec.project_params(params)
    opt_state = _fresh_hyperparams(spec.primal.init(params))
    if lr is not None:
        opt_state = set_learning_rate(opt_state, lr)
    if penalty is not None and not spec.formulation.uses_penalty:
        raise ValueError(
            f"init's penalty is rho of the augmented Lagrangian or the quadratic penalty, and "
            f"{type(spec.formulation).__name__} has none (it would sit in the state unread): "
            "drop penalty= or pass formulation=cudt.AugmentedLagrangian(penalty=rho)"
        )
    rho = spec.penalty if penalty is None else penalty
    concrete = _concrete(penalty) if penalty is not None else None  # a sweep's lanes: traced
    if concrete is not None and not np.all(concrete >= 0):
        raise ValueError(
            f"init's penalty must be >= 0 (the formulation's rho), got {concrete.tolist()}: pass "
            "penalty=rho >= 0"
        )
    prev = ()
    if spec.update == "optimistic":
        prev = tuple(jax.tree.map(jnp.zeros_like, t) for t in (params, mult, slacks))
    return ConstrainedState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=opt_state,
        multipliers=mult,
        dual_state=dual_state,
        slacks=slacks,
        slack_state={n: _fresh_hyperparams(spec.slack_tx.init(u)) for n, u in slacks.items()},
        # jnp.array copies: a caller's float32 rho (or bool constrained) kept as it is was one
        # buffer in several fields (a donating step refused it) and the caller's to lose
        penalty={n: jnp.array(rho, jnp.float32) for n in mult},
        violation={n: jnp.asarray(jnp.inf, jnp.float32) for n in mult},
        prev_update=prev,
        hparams=_copy(hparams),
        constrained=jnp.array(constrained, bool),
    )


def _implicit_params(spec: _Spec, constraints, given: dict) -> dict:
    """``{name: φ}`` of a new state's implicit multipliers (fresh buffers): ``given``'s, else
    the model's own, checked against the constraints."""
    unknown = (set(spec.implicit) | set(given)) - set(constraints)
    if unknown:
        raise ValueError(f"implicit multipliers name unknown constraints {sorted(unknown)}")
    extra = set(given) - set(spec.implicit)
    if extra:
        raise ValueError(
            f"init got multipliers for {sorted(extra)}, which are not implicit: name their "
            "models in make_constrained_step(..., implicit={name: cudt.implicit(apply)})"
        )
    phis = {}
    for name, model in spec.implicit.items():
        if constraints[name].has_slack:
            raise ValueError(
                f"constraint {name!r} has explicit slacks (resilience_mode='slack'), a table of "
                "one slack per example, which implicit multipliers are meant to avoid: use "
                "resilience_mode='decay' or table multipliers"
            )
        phi = given.get(name, model.params)
        if phi is None:
            raise ValueError(
                f"implicit multipliers of {name!r} have no parameters: pass "
                f"cudt.implicit(apply, params) or init(..., multipliers={{{name!r}: params}})"
            )
        phis[name] = _copy(phi)
    return phis


def check_table_shape(name: str, table, value_shape, indexed: bool, what: str, fix: str) -> None:
    """``table`` (constraint ``name``'s multipliers or slacks, ``what``) has the shape its
    values ask: theirs, or for an indexed constraint ``[N, *values.shape[1:]]``. A table of
    another shape broadcast against the values (a ``()`` table against ``[3]`` values trained
    three multipliers in one, then grew) or failed deep inside with a shape error. Static:
    checked once, while the step is traced."""
    shape, value_shape = tuple(jnp.shape(table)), tuple(value_shape)
    if indexed:
        ok = len(shape) == len(value_shape) and shape[1:] == value_shape[1:]
        rest = "".join(f", {d}" for d in value_shape[1:])
        need = f"its indexed values of shape {value_shape} need a table [N{rest}]"
    else:
        ok, need = shape == value_shape, f"its values have shape {value_shape} (one per value)"
    if not ok:
        raise ValueError(f"constraint {name!r}: {what} have shape {shape}, where {need}: {fix}")
