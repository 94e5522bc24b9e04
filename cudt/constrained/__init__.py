"""Constrained learning for any JAX problem: named constraints, formulations, dual updates,
implicit multipliers, the one primal-dual step and the drop-in Lagrangian for a loop of one's own
(docs/constrained.md).

Each idea is a module of this package (``_constraint``, ``_formulation``, ``_dual``,
``_implicit``, ``_schedule``, ``_step``, ``_dropin``); import the names from here (or from
:mod:`cudt`), not from the modules.
"""

from cudt.constrained._constraint import (
    RESILIENCE_MODES,
    Constraint,
    FreeSign,
)
from cudt.constrained._dropin import (
    ConstrainedLoss,
    init_multipliers,
    lagrangian,
)
from cudt.constrained._dual import (
    as_dual,
    dual_adam,
    dual_ascent,
    nupi,
    project_nonnegative,
    resilience_decay,
)
from cudt.constrained._formulation import (
    AugmentedLagrangian,
    Lagrangian,
    QuadraticPenalty,
)
from cudt.constrained._implicit import (
    Implicit,
    implicit,
    implicit_mlp,
)
from cudt.constrained._schedule import (
    SHAPES,
    Schedule,
    broadcast_schedule,
    constant_schedule,
    describe_schedule,
    is_schedule,
    schedule,
    values_at,
)
from cudt.constrained._state import (
    UPDATES,
    ConstrainedState,
)
from cudt.constrained._step import (
    make_constrained_step,
)

__all__ = [
    "RESILIENCE_MODES",
    "SHAPES",
    "UPDATES",
    "AugmentedLagrangian",
    "ConstrainedLoss",
    "ConstrainedState",
    "Constraint",
    "FreeSign",
    "Implicit",
    "Lagrangian",
    "QuadraticPenalty",
    "Schedule",
    "as_dual",
    "broadcast_schedule",
    "constant_schedule",
    "describe_schedule",
    "dual_adam",
    "dual_ascent",
    "implicit",
    "implicit_mlp",
    "init_multipliers",
    "is_schedule",
    "lagrangian",
    "make_constrained_step",
    "nupi",
    "project_nonnegative",
    "resilience_decay",
    "schedule",
    "values_at",
]
