"""The hyperparameters a run may sweep, and the one rule that resolves ``--reference``.

``SWEEPABLE`` fields are arrays in the train state (or handed to the batch), so a sweep is a
vmap over runs. ``--reference`` names the bound C of ``E ℓ_0 <= C``: ``none`` (no reference
constraint), a number, or ``chance`` / ``chance+X``, the task's chance level (the loss of a
uniform guess: ln K for K classes, ln V for a vocabulary of V tokens) plus X. A task states its
chance level through ``Task.chance_level``; :func:`resolve_reference` is the one function that
turns a spelling into C.
"""

from __future__ import annotations

import math

from cudt.errors import UsageError
from cudt.knobs import KNOBS, knob_names

__all__ = [
    "CONDITIONAL",
    "CONSTRAINT_ONLY",
    "SWEEPABLE",
    "chance_offset",
    "is_reference",
    "normalize_reference",
    "resolve_reference",
]

# Hyperparameters that may take several values in one program (``--sweep NAME=V1,V2``): every
# row of the one table, cudt.knobs.KNOBS (which also says where each goes and when it acts).
SWEEPABLE = knob_names()
# Those that only matter to constrained runs: ERM runs are not swept over them.
CONSTRAINT_ONLY = tuple(k.name for k in KNOBS if k.constrained_only)
# Those that act only with some settings (a run of other settings carries None for them).
CONDITIONAL = tuple(k for k in KNOBS if k.needs is not None)

REFERENCE_SPELLINGS = "chance, chance+X (X >= 0), none or a finite number"


def chance_offset(text) -> float | None:
    """``chance`` → 0, ``chance+X`` → X (finite, >= 0); None for anything else (a number,
    none, or text that is neither)."""
    t = str(text).strip().lower()
    if t == "chance":
        return 0.0
    if not t.startswith("chance+"):
        return None
    try:
        x = float(t[len("chance+") :])
    except ValueError:
        return None
    return x if math.isfinite(x) and x >= 0 else None


def is_reference(text) -> bool:
    """Whether ``text`` is a valid ``--reference`` spelling."""
    if str(text).strip().lower() == "none" or chance_offset(text) is not None:
        return True
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def normalize_reference(text) -> str:
    """The canonical spelling of a valid ``--reference``: none, chance, chance+X or a number
    (so swept and flag values compare and print alike)."""
    t = str(text).strip().lower()
    if t == "none":
        return t
    offset = chance_offset(t)
    if offset is not None:
        return "chance" if t == "chance" else f"chance+{offset:g}"
    return str(float(t))


def resolve_reference(value, chance_level: float | None, task: str = "this task") -> float | None:
    """The bound C named by ``value``: None for ``none`` (or None), ``chance_level + X`` for
    ``chance+X``, else the number. A UsageError for a chance spelling on a task without a chance
    level (``chance_level`` None) and for anything that is not a valid spelling."""
    if value is None or str(value).strip().lower() == "none":
        return None
    offset = chance_offset(value)
    if offset is not None:
        if chance_level is None:
            raise UsageError(
                f"--reference {value} needs a classification task; {task} has no chance "
                "level: pass a number or none"
            )
        return float(chance_level) + offset
    try:
        bound = float(value)
    except ValueError:
        bound = math.nan
    if not math.isfinite(bound):
        raise UsageError(f"--reference must be {REFERENCE_SPELLINGS}, got {value}")
    return bound
