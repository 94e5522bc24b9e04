"""Dual updates for the Lagrange multipliers, as optax transformations.

Every dual transformation here follows one convention so it composes with optax:

    updates, state = dual_tx.update(g, state, multipliers)
    multipliers = optax.apply_updates(multipliers, updates)

where ``g = ∇_λ 𝓛`` is the vector of constraint values and the returned ``updates`` are *additive*
and already make the result feasible (λ ≥ 0). The ascent sign flip, the resilience decay and the
projection onto the non-negative orthant live in this module and nowhere else.

``as_dual(opt)`` turns any optax *minimiser* into projected gradient *ascent*: maximising 𝓛 in λ is
minimising −𝓛, so it feeds ``−g`` to ``opt`` and projects afterwards. ``dual_ascent(lr)`` (plain
projected SGD ascent, the literature's recommended default) and ``dual_adam(lr)`` (the paper's
choice) are the two ready-made ones. ``resilience_decay(alpha)`` turns ``g`` into ``g − λ/α``,
the gradient of the resilient dual (Hounie et al. 2023), for a dual chained by hand; the step of
:func:`cudt.make_constrained_step` applies the same decay itself to a constraint carrying
``resilience`` (``Constraint(..., resilience=α)``, ``DescentConfig.resilience``), so chaining it
in front of such a constraint's dual decays twice.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from cudt.constrained._constraint import FreeSign

__all__ = [
    "as_dual",
    "check_dual",
    "dual_adam",
    "dual_ascent",
    "nupi",
    "project_nonnegative",
    "resilience_decay",
]


def _check_lr(name: str, value, what: str = "learning rate") -> None:
    # Arrays (for vmapped sweeps) are checked only when concrete.
    try:
        v = float(value)
    except (TypeError, jax.errors.ConcretizationTypeError):
        return
    if not v > 0:
        raise ValueError(f"{name} must be > 0, got {v}: pass a positive {what}")


def _stateless_on_multipliers(name: str, state_cls, fn) -> optax.GradientTransformation:
    """A stateless transformation (its state an empty ``state_cls``) whose update is
    ``fn(updates, params)`` and needs ``params``, the current multipliers."""

    def init_fn(params):
        del params
        return state_cls()

    def update_fn(updates, state, params=None):
        if params is None:
            raise ValueError(f"{name} needs the current multipliers as `params`")
        return fn(updates, params), state

    return optax.GradientTransformation(init_fn, update_fn)


class ProjectNonnegativeState(NamedTuple):
    """Stateless; a NamedTuple so it checkpoints and vmaps like every optax state."""


def project_nonnegative() -> optax.GradientTransformation:
    """Rewrites additive updates ``u`` so that ``λ + u`` is ``max(λ + u, 0)``.

    Needs ``params`` (the current multipliers) in ``update``.
    """

    def proj(u, p):
        if isinstance(p, FreeSign):  # equality multipliers: free sign, no projection
            return u
        return jnp.maximum(p + u, 0.0) - p

    return _stateless_on_multipliers(
        "project_nonnegative",
        ProjectNonnegativeState,
        lambda updates, params: jax.tree.map(
            proj, updates, params, is_leaf=lambda x: isinstance(x, FreeSign)
        ),
    )


class ResilienceDecayState(NamedTuple):
    """Stateless; see :func:`resilience_decay`."""


def resilience_decay(alpha) -> optax.GradientTransformation:
    """``g ↦ g − λ/α``: the dual gradient of the resilient relaxation with cost (α/2)‖u‖².

    The optimal slack is ``u = λ/α``, so the resilient dual step is ordinary ascent on ``g − λ/α``
    (weight decay ``1/α`` on the multipliers). Place it *before* the dual optimiser. The step
    runs one dual transformation for every constraint, so a chain with it relaxes them all, and
    decays equality multipliers and implicit multipliers' parameters φ too: to relax one
    constraint, give it ``Constraint(..., resilience=α)`` instead (the step decays those itself;
    both would decay twice). ``alpha`` may be a traced array so resilience can be swept under
    ``vmap``.
    """
    _check_lr("resilience alpha", alpha, "alpha (the relaxation's cost, (alpha/2)|u|^2)")

    return _stateless_on_multipliers(
        "resilience_decay",
        ResilienceDecayState,
        lambda updates, params: jax.tree.map(lambda g, lam: g - lam / alpha, updates, params),
    )


def check_dual(dual) -> None:
    """One ``ValueError`` unless ``dual`` is a dual transformation of this module's kind: an
    optax transformation whose chain ends in :func:`project_nonnegative` (every one here does;
    :func:`as_dual` makes one of any optax minimiser). A plain optax optimiser minimises: given
    the constraint values it would *lower* the multipliers of violated constraints, silently."""
    if not isinstance(dual, optax.GradientTransformation):
        raise ValueError(
            f"dual must be an optax GradientTransformation, got {type(dual).__name__}: pass "
            "cudt.dual_ascent(lr), cudt.dual_adam(lr), cudt.nupi(lr) or cudt.as_dual(optax...)"
        )
    is_proj = lambda x: isinstance(x, ProjectNonnegativeState)  # noqa: E731
    # a stateless transformation's state (an empty NamedTuple) is a leaf too: one chained after
    # the projection (optax.scale(2.0)) would move the projected multipliers below 0
    stateless = lambda x: isinstance(x, tuple) and hasattr(x, "_fields") and not x  # noqa: E731
    state = jax.eval_shape(dual.init, jnp.zeros((), jnp.float32))
    leaves = jax.tree.leaves(state, is_leaf=lambda x: is_proj(x) or stateless(x))
    if not any(is_proj(x) for x in leaves):
        raise ValueError(
            "dual is a plain optax optimiser: it minimises, so it would lower the multipliers "
            "of violated constraints: wrap it, cudt.as_dual(optimizer) (ascent, λ >= 0), or "
            "pass cudt.dual_ascent(lr), cudt.dual_adam(lr) or cudt.nupi(lr)"
        )
    if not is_proj(leaves[-1]):
        raise ValueError(
            "dual's chain goes on after cudt.project_nonnegative(), so it can move the "
            "multipliers of inequalities below 0: end the chain in the projection "
            "(optax.chain(..., cudt.project_nonnegative()))"
        )


def as_dual(optimizer: optax.GradientTransformation) -> optax.GradientTransformation:
    """Projected gradient *ascent* with any optax minimiser.

    The returned transformation takes the constraint values ``g`` (``∇_λ 𝓛``) and the current
    multipliers, and returns updates with ``λ + updates ≥ 0``.
    """
    return optax.chain(optax.scale(-1.0), optimizer, project_nonnegative())


def dual_ascent(learning_rate) -> optax.GradientTransformation:
    """Projected SGD ascent: ``λ ← max(0, λ + lr·g)``.

    ``learning_rate`` may be a float, a schedule, or a (vmapped) array.
    """
    _check_lr("dual learning rate", learning_rate)
    return as_dual(optax.sgd(learning_rate))


def dual_adam(learning_rate, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8):
    """Projected Adam ascent (the paper's choice: "a second Adam for the duals")."""
    _check_lr("dual learning rate", learning_rate)
    return as_dual(optax.adam(learning_rate, b1=b1, b2=b2, eps=eps))


class NuPIState(NamedTuple):
    xi: object  # ξ_{t−1}, the EMA of the constraint values
    started: object  # like ξ, bool: whether each entry's ξ_{−1} has been set (an indexed
    # table's row is set when a batch first holds it)


def nupi(learning_rate, kp=0.0, ki=1.0, ema_nu=0.0, init="sgd", project=True):
    """nuPI control of the multipliers (Sohrabi et al. 2024), projected onto λ ≥ 0.

        ξ_t = ν ξ_{t−1} + (1 − ν) e_t
        λ ← [λ + η (K_I e_t + K_P (ξ_t − ξ_{t−1}))]₊

    with ``e_t = g`` the constraint values and ``ξ_{−1} = e_0`` (``init="sgd"``: the first step is
    plain projected ascent with rate η·K_I) or ``ξ_{−1} = 0`` (``init="zeros"``). Cooper 1.0.1's
    code for its SGD init sets ``ξ_0 = 0`` where its docstring says ``e_0``, so the two differ
    from the second step on; this follows the recurrence (``ZEROS`` agrees). ``kp=0`` is
    :func:`dual_ascent` with rate ``η·ki``. Equality multipliers (:class:`cudt.FreeSign`) are not
    projected. ``project=False`` returns the raw updates (to scale them, e.g. by a schedule,
    before :func:`project_nonnegative`). ``kp`` and ``ema_nu`` may be traced arrays (a sweep,
    ``optax.inject_hyperparams``); they are checked only when concrete.
    """
    if callable(learning_rate):  # it failed deep inside the first step
        raise TypeError(
            "nupi takes a number as its learning rate, not a schedule: pass a number, or "
            "nupi(..., project=False) chained with optax.scale_by_schedule(...) and "
            "cudt.project_nonnegative()"
        )
    _check_lr("dual learning rate", learning_rate)
    if init not in ("sgd", "zeros"):
        raise ValueError(f"nupi init must be 'sgd' or 'zeros', got {init!r}")
    try:
        nu = float(ema_nu)
    except (TypeError, jax.errors.ConcretizationTypeError):
        nu = 0.0
    if not 0.0 <= nu < 1.0:
        raise ValueError(f"ema_nu must lie in [0, 1), got {ema_nu}")
    for gain, value in (("kp", kp), ("ki", ki)):
        try:
            v = float(value)
        except (TypeError, jax.errors.ConcretizationTypeError):
            continue
        if not v >= 0:  # a negative gain turns ascent on a violated constraint into descent
            raise ValueError(f"nupi's {gain} must be >= 0, got {v}: pass a non-negative gain")

    def init_fn(params):
        xi = jax.tree.map(jnp.zeros_like, params)
        return NuPIState(xi=xi, started=jax.tree.map(lambda x: jnp.zeros(x.shape, bool), xi))

    def update_fn(updates, state, params=None):
        e = updates
        if init == "sgd":
            prev = jax.tree.map(lambda x, ei, s: jnp.where(s, x, ei), state.xi, e, state.started)
        else:
            prev = state.xi
        xi = jax.tree.map(lambda p, ei: ema_nu * p + (1.0 - ema_nu) * ei, prev, e)
        raw = jax.tree.map(lambda ei, x, p: learning_rate * (ki * ei + kp * (x - p)), e, xi, prev)
        return raw, NuPIState(xi=xi, started=jax.tree.map(jnp.ones_like, state.started))

    core = optax.GradientTransformation(init_fn, update_fn)
    return optax.chain(core, project_nonnegative()) if project else core
