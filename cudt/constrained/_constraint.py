"""A named constraint returned by a user's problem: ``Constraint(value, kind, index, resilience)``.

    def problem(params, batch, key):
        return objective, {
            "budget": cudt.Constraint(g, kind="ineq"),                    # g <= 0, any shape
            "balance": cudt.Constraint(h, kind="eq"),                     # h == 0, free-sign λ
            "per_sample": cudt.Constraint(g_i, kind="ineq", index=ids),   # [B] values, ids [B]
            "learned": cudt.Constraint(g_i, features=f),                 # implicit λ(f_i)
            "soft": cudt.Constraint(g, resilience=alpha),                 # g <= u, cost (α/2)‖u‖²
            "relative": cudt.Constraint(g, scale=jax.lax.stop_gradient(s)),  # dual step g / s
        }

``index`` (int [B]) names the rows of a multiplier table of ``N`` rows (``num_indexed`` in
:func:`cudt.make_constrained_step`'s ``init``) that the batch's values ``value[b]`` belong to.

``features`` ([B, ...], any pytree; stop-gradient) are the batch's inputs of implicit multipliers
(:func:`cudt.implicit`, ``make_constrained_step(..., implicit={name: model})``): each row's
multiplier is the model at its features, not a table's row; other constraints ignore them.

``resilience`` α relaxes an inequality to ``g ≤ u`` with a slack ``u ≥ 0`` that costs
``(α/2)‖u‖²`` (Hounie et al. 2023); ``None`` (or α = inf, so a sweep can mix hard and resilient
runs in one program) keeps it hard. ``resilience_mode`` says how the slack is carried:

- ``"decay"``: implicitly, at its optimum ``u = λ/α``: the dual ascends ``g − λ/α`` (weight decay
  ``1/α`` on the multipliers), nothing else changes;
- ``"slack"``: explicitly, ``u`` is a variable of the train state (a table like the multipliers for
  an indexed constraint), updated with the primal variables by projected descent on
  ``(α/2)‖u‖² + term(g − u)``; the dual ascends ``g − u``. α must be finite.

Either works with every formulation, update scheme and dual optimiser of the step.

``scale`` s (positive, broadcastable to ``value``; None: 1) says in which units the constraint is
measured, without changing it (``g ≤ 0`` and ``g/s ≤ 0`` are the same constraint) or its
Lagrangian term ``λ·g``: the dual optimiser ascends ``g/s`` (with resilience, ``g/s − λ/α``;
with explicit slacks, ``(g − u)/s``), and a penalty ``(ρ/2)·h²`` and a slack's cost
``(α/2)·u²`` are divided by ``s``. So with ``s`` in the units of ``g`` (say, a stop-gradient of
the loss that ``g`` bounds), the multipliers, the dual learning rate, ρ and α are
dimensionless: a dual rate chosen on one loss scale means the same on another (a diagonal,
positive preconditioner of the dual ascent; its fixed points are the unscaled problem's, where
the constraint is hard: a resilient one, or a quadratic penalty, settles where the unscaled
problem with ``α/s``, ``ρ/s`` does). The scale is read each step, so it may follow the batch.
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import numpy as np

__all__ = ["RESILIENCE_MODES", "Constraint", "FreeSign"]

KINDS = ("ineq", "eq")
RESILIENCE_MODES = ("decay", "slack")


def _concrete(x) -> np.ndarray | None:
    """``x`` as a float64 array when it is a concrete number or array (not a tracer under jit or
    vmap, nor any other leaf a pytree transformation may put there), else None."""
    if not isinstance(x, (int, float, np.ndarray, np.generic, jax.Array)) or isinstance(x, bool):
        return None
    try:
        return np.asarray(x, np.float64)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError, TypeError):
        return None


@flax.struct.dataclass
class Constraint:
    """``value ≤ 0`` (``kind="ineq"``) or ``value = 0`` (``kind="eq"``), ``value`` one array of
    any shape; the Constraint itself is a pytree."""

    value: Any
    kind: str = flax.struct.field(pytree_node=False, default="ineq")
    index: Any = None
    resilience: Any = None
    resilience_mode: str = flax.struct.field(pytree_node=False, default="decay")
    scale: Any = None
    features: Any = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(
                f"Constraint kind must be 'ineq' or 'eq', got {self.kind!r}: pass kind='ineq' "
                "for value <= 0 or kind='eq' for value == 0"
            )
        if self.resilience_mode not in RESILIENCE_MODES:
            raise ValueError(
                f"Constraint resilience_mode must be 'decay' or 'slack', got "
                f"{self.resilience_mode!r}"
            )
        if self.kind == "eq" and (self.resilience is not None or self.resilience_mode == "slack"):
            raise ValueError(
                "resilience relaxes inequality constraints only: drop resilience from the "
                "kind='eq' constraint, or write it as two inequalities"
            )
        if self.resilience_mode == "slack" and self.resilience is None:
            raise ValueError(
                "resilience_mode='slack' needs the slack's cost: pass resilience=alpha (> 0, "
                "finite)"
            )
        scale = _concrete(self.scale)
        if scale is not None and not np.all(scale > 0):
            raise ValueError(
                f"Constraint scale must be > 0 (the units a violation is measured in), got "
                f"{scale.tolist()}: pass a positive scale, or none"
            )
        self._check_index()
        alpha = _concrete(self.resilience) if self.resilience is not None else None
        if alpha is not None and not np.all(alpha > 0):  # inf (hard) is allowed; NaN is not
            raise ValueError(
                f"Constraint resilience must be > 0 (the slack's cost α; inf or None: hard), "
                f"got {alpha.tolist()}: pass a positive alpha"
            )
        if alpha is not None and self.has_slack and not np.all(np.isfinite(alpha)):
            raise ValueError(
                f"Constraint resilience must be finite with explicit slacks (its cost "
                f"(α/2)·u² at u = 0 is NaN at α = inf), got {alpha.tolist()}: pass a finite "
                "alpha, or resilience_mode='decay', whose α = inf is a hard constraint"
            )

    def _check_index(self) -> None:
        """``index``: integer ids, one per value (``[B]`` against values ``[B, ...]``); checked
        on whatever has a dtype and shape (arrays, tracers, shape structs)."""
        ids, value = self.index, self.value
        if isinstance(ids, (list, tuple)):  # failed in the step: "non-tuple sequence for ..."
            raise ValueError(
                f"Constraint index must be an integer array, got a {type(ids).__name__}: pass "
                "index=jnp.asarray(ids)"
            )
        if not (hasattr(ids, "dtype") and hasattr(ids, "shape")):
            return
        if not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(
                f"Constraint index must hold integer row ids, got dtype {ids.dtype}: pass "
                "index=ids.astype(jnp.int32)"
            )
        if hasattr(value, "shape") and (len(ids.shape) != 1 or ids.shape != value.shape[:1]):
            raise ValueError(
                f"Constraint index must hold one row id per value: ids of shape "
                f"{tuple(ids.shape)} against values of shape {tuple(value.shape)}; pass "
                "index of shape [B] for values [B, ...]"
            )

    @property
    def has_slack(self) -> bool:
        """Whether this constraint carries an explicit slack variable in the train state."""
        return self.resilience_mode == "slack"


@flax.struct.dataclass
class FreeSign:
    """Marks multipliers of equality constraints: :func:`cudt.project_nonnegative` skips them."""

    value: Any
