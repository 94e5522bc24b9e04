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

from cudt.constrained import SHAPES, Schedule, constant_schedule, schedule
from cudt.errors import UsageError
from cudt.knobs import KNOBS, knob_names

__all__ = [
    "CONDITIONAL",
    "CONSTRAINT_ONLY",
    "EPSILON_SCHEDULE_SPELLING",
    "SWEEPABLE",
    "chance_offset",
    "epsilon_schedule",
    "is_reference",
    "normalize_reference",
    "parse_epsilon_schedule",
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
EPSILON_SCHEDULE_SPELLING = (
    "constant or SHAPE:START@STEPS[+BEGIN] (SHAPE one of linear, cosine, step; START in [0, 1); "
    "e.g. linear:0@200)"
)


def parse_epsilon_schedule(
    text, total_steps: int | None = None
) -> tuple[str, float, int, int] | None:
    """``--epsilon-schedule``: None for ``constant``, else ``(shape, start, steps, begin)``: ε
    moves from ``start`` to the run's own ε over ``steps`` steps after ``begin``
    (:func:`cudt.schedule`). A ValueError names what is wrong with any other spelling, or with
    a schedule that ends after ``total_steps`` (a run judged at an ε it never trained at)."""
    t = str(text).strip().lower()
    if t == "constant":
        return None
    shape, colon, rest = t.partition(":")
    start, at, length = rest.partition("@")
    steps, plus, begin = length.partition("+")
    try:
        if not (colon and at) or shape not in SHAPES:
            raise ValueError
        start_, steps_, begin_ = float(start), int(steps), int(begin) if plus else 0
    except ValueError:
        raise ValueError(f"must be {EPSILON_SCHEDULE_SPELLING}, got {text!r}") from None
    if not 0.0 <= start_ < 1.0:
        raise ValueError(f"its START must lie in [0, 1) like epsilon, got {start_:g} in {text!r}")
    if steps_ < 1 or begin_ < 0:
        raise ValueError(f"needs STEPS >= 1 and BEGIN >= 0, got {text!r}")
    # steps run 0 .. total − 1: one that reaches ε at step total never trains at it
    if total_steps is not None and begin_ + steps_ >= total_steps:
        raise ValueError(
            f"{text!r} reaches epsilon at step {begin_ + steps_}, and the run's {total_steps} "
            f"steps end at step {total_steps - 1}: shorten it or pass more --steps"
        )
    return shape, start_, steps_, begin_


def normalize_epsilon_schedule(text) -> str:
    """The canonical spelling of a valid ``--epsilon-schedule`` (so values compare and print
    alike): ``constant`` or ``linear:0@200`` (``+BEGIN`` when it waits)."""
    parsed = parse_epsilon_schedule(text)
    if parsed is None:
        return "constant"
    shape, start, steps, begin = parsed
    return f"{shape}:{start:g}@{steps}" + (f"+{begin}" if begin else "")


def epsilon_schedule(text, epsilon: float) -> Schedule:
    """The run's ε as a :class:`cudt.Schedule` ending at ``epsilon`` (``constant``: ``epsilon``
    at every step), for a group where some run's ε follows a schedule."""
    parsed = parse_epsilon_schedule("constant" if text is None else text)
    if parsed is None:
        return constant_schedule(epsilon)
    shape, start, steps, begin = parsed
    return schedule(shape, start, epsilon, steps, begin=begin)


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


def canonical_reference(value: object) -> object:
    """What a ``--reference`` value names, for a resume's comparison: its canonical spelling
    (``CHANCE`` is ``chance``, ``.5`` is ``0.5``); a value no spelling accepts, as it stands
    (a saved config is read as it is, never refused here)."""
    return normalize_reference(value) if is_reference(value) else value


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
