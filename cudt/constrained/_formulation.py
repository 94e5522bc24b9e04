"""How constraints enter the primal objective: Lagrangian, augmented Lagrangian, quadratic penalty.

Each formulation is a pure function of the objective ``f``, the constraint values ``g`` of one
constraint, its multipliers ``λ`` and its penalty coefficient ``ρ`` (per constraint, a scalar; the
step divides it by the constraint's ``scale`` where one is given, so it may be an array):

- :class:`Lagrangian`:          ``f + Σ λ·g``.
- :class:`AugmentedLagrangian`: ``f + Σ λ·g + (ρ/2) Σ h²`` with ``h = g`` for equalities and, for
  inequalities, ``h = g`` where the constraint is violated or its multiplier is positive
  (``g > 0`` or ``λ > 0``) and ``0`` elsewhere. There is no division by ρ (the textbook form
  ``(ρ/2)max(0, g + λ/ρ)² − λ²/(2ρ)`` has one; Cooper's too), so ρ = 0 is exactly the Lagrangian.
- :class:`QuadraticPenalty`:    ``f + (ρ/2) Σ h²`` with ``h = max(g, 0)`` for inequalities; its
  multipliers are not used and stay at 0 (no dual update).

The dual gradient (what the dual optimiser ascends) is ``g`` for the Lagrangian and the augmented
Lagrangian. Penalty coefficients follow one documented rule, applied after every step::

    v_t = ‖h_t‖ (the violation of the constraint, mean-squared-root over its entries)
    ρ ← min(ρ·growth, penalty_max)   if v_t > tolerance · v_{t−1}     (not enough progress)
    ρ ← ρ                            otherwise

With the default ``growth=1.0`` the coefficient is constant.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

__all__ = ["AugmentedLagrangian", "Lagrangian", "QuadraticPenalty", "check_formulation"]


def _violation(g, lam, kind, active_by_multiplier):
    if kind == "eq":
        return g
    active = (g > 0) | jnp.isnan(g)  # a NaN constraint shows as a NaN violation, not as met
    if active_by_multiplier:
        active = active | (lam > 0)
    return jnp.where(active, g, jnp.zeros_like(g))


@dataclasses.dataclass(frozen=True)
class Lagrangian:
    """``f + Σ λ·g``; multipliers updated by the dual optimiser on ``g``."""

    uses_multipliers = True
    uses_penalty = False

    def term(self, g, lam, kind, rho):
        del kind, rho
        return jnp.sum(lam * g)

    def violation(self, g, lam, kind):
        return _violation(g, lam, kind, False)

    def next_penalty(self, rho, prev_violation, violation):
        return rho


@dataclasses.dataclass(frozen=True)
class _Penalised:
    penalty: float = 1.0
    growth: float = 1.0
    tolerance: float = 1.0
    penalty_max: float = 1e6

    def __post_init__(self):
        if not float(self.penalty) >= 0:
            raise ValueError(f"penalty must be >= 0, got {self.penalty}: pass penalty=rho >= 0")
        if not float(self.growth) >= 1:
            raise ValueError(f"growth must be >= 1, got {self.growth}")
        if not 0 < float(self.tolerance) < float("inf"):
            raise ValueError(f"tolerance must be a finite number > 0, got {self.tolerance}")
        if not float(self.penalty_max) >= float(self.penalty):
            raise ValueError(
                f"penalty_max must be >= penalty ({self.penalty}), got {self.penalty_max}: the "
                "cap of the growing penalty"
            )

    uses_penalty = True

    def next_penalty(self, rho, prev_violation, violation):
        grow = violation > self.tolerance * prev_violation
        return jnp.where(grow, jnp.minimum(rho * self.growth, self.penalty_max), rho)


@dataclasses.dataclass(frozen=True)
class AugmentedLagrangian(_Penalised):
    """``f + Σ λ·g + (ρ/2)Σ h²`` (see the module doc); finite and equal to the Lagrangian at ρ=0."""

    uses_multipliers = True

    def term(self, g, lam, kind, rho):
        h = _violation(g, lam, kind, True)
        return jnp.sum(lam * g) + 0.5 * jnp.sum(rho * h * h)

    def violation(self, g, lam, kind):
        return _violation(g, lam, kind, True)


@dataclasses.dataclass(frozen=True)
class QuadraticPenalty(_Penalised):
    """``f + (ρ/2)Σ max(g,0)²`` (inequalities), ``(ρ/2)Σ g²`` (equalities); no multipliers."""

    uses_multipliers = False

    def term(self, g, lam, kind, rho):
        del lam
        h = _violation(g, None, kind, False)
        return 0.5 * jnp.sum(rho * h * h)

    def violation(self, g, lam, kind):
        return _violation(g, lam, kind, False)


def check_formulation(formulation) -> None:
    """One ``ValueError`` unless ``formulation`` is one of this module's formulations."""
    if not isinstance(formulation, (Lagrangian, AugmentedLagrangian, QuadraticPenalty)):
        raise ValueError(
            f"unknown formulation {formulation!r}: pass cudt.Lagrangian(), "
            "cudt.AugmentedLagrangian(penalty=rho) or cudt.QuadraticPenalty(penalty=rho)"
        )
