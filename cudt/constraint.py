"""A named constraint returned by a user's problem: ``Constraint(value, kind, index)``.

    def problem(params, batch, key):
        return objective, {
            "budget": cudt.Constraint(g, kind="ineq"),                    # g <= 0, any shape
            "balance": cudt.Constraint(h, kind="eq"),                     # h == 0, free-sign λ
            "per_sample": cudt.Constraint(g_i, kind="ineq", index=ids),   # [B] values, ids [B]
        }

``index`` (int [B]) names the rows of a multiplier table of ``N`` rows (``num_indexed`` in
:func:`cudt.make_constrained_step`'s ``init``) that the batch's values ``value[b]`` belong to.
"""

from __future__ import annotations

from typing import Any

import flax.struct

__all__ = ["Constraint", "FreeSign"]

KINDS = ("ineq", "eq")


@flax.struct.dataclass
class Constraint:
    """``value ≤ 0`` (``kind="ineq"``) or ``value = 0`` (``kind="eq"``); a pytree."""

    value: Any
    kind: str = flax.struct.field(pytree_node=False, default="ineq")
    index: Any = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(
                f"Constraint kind must be 'ineq' or 'eq', got {self.kind!r}: pass kind='ineq' "
                "for value <= 0 or kind='eq' for value == 0"
            )


@flax.struct.dataclass
class FreeSign:
    """Marks multipliers of equality constraints: :func:`cudt.project_nonnegative` skips them."""

    value: Any
