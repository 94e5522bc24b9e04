"""Schedules of a run's values: ε, a reference bound or a resilience α that change over training.

    eps = cudt.schedule("linear", 0.0, 0.1, steps=200)      # 0 → 0.1 over the first 200 steps
    state = init(params, constraints=..., hparams=cudt.descent.hparams(cfg, epsilon=eps))

A :class:`Schedule` is a pytree of arrays, so it lives in the train state's ``hparams`` like any
per-run value: :func:`cudt.make_constrained_step` hands the problem every schedule's value at the
state's step (:func:`values_at`), runs with different schedules (other shapes, ends or lengths)
share one compiled step and sweep as lanes of a ``vmap``, and a checkpoint holds the schedule
with the state. Nothing recompiles when a schedule changes.

Each schedule holds ``start`` until ``begin``, moves to ``end`` over ``steps`` steps along its
``shape``, then holds ``end``:

- ``"linear"``: ``optax.linear_schedule(start, end, steps, begin)``;
- ``"cosine"``: ``end + (start − end)·½(1 + cos(π·t/steps))``, which is
  ``optax.cosine_decay_schedule(start, steps, alpha=end/start)`` shifted by ``begin`` (and, unlike
  it, may start at 0: ε warm-started from no constraint);
- ``"step"``: ``start`` before ``begin + steps``, ``end`` from it on (a curriculum's jump, as
  ``optax.piecewise_constant_schedule``).

``start`` and ``end`` may be arrays (ε per layer, ``[L]``); the shape and the lengths are per run.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "SHAPES",
    "Schedule",
    "broadcast_schedule",
    "constant_schedule",
    "describe_schedule",
    "is_schedule",
    "schedule",
    "values_at",
]

SHAPES = ("linear", "cosine", "step")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Schedule:
    """A value of the step (see the module docstring); build it with :func:`schedule`."""

    start: jax.Array
    end: jax.Array
    steps: jax.Array  # [] float32, >= 1
    begin: jax.Array  # [] float32, >= 0
    shape: jax.Array  # [] int32, an index of SHAPES

    def __call__(self, count) -> jax.Array:
        """The value at step ``count`` (an integer, traced or not)."""
        t = jnp.clip(jnp.asarray(count, jnp.float32) - self.begin, 0.0, self.steps)
        frac = t / self.steps  # 0 → 1 over the transition
        weight = jnp.select(  # of start: 1 at the transition's beginning, 0 at its end
            [self.shape == 0, self.shape == 1],
            [1.0 - frac, 0.5 * (1.0 + jnp.cos(jnp.pi * frac))],
            jnp.where(frac < 1.0, 1.0, 0.0),
        )
        return self.end + (self.start - self.end) * weight


def _check_whole(name: str, value, least: int) -> None:
    whole = isinstance(value, (int, np.integer)) or (
        isinstance(value, (float, np.floating)) and float(value).is_integer()
    )
    if isinstance(value, bool) or not whole or value < least:
        raise ValueError(f"a schedule's {name} must be an integer >= {least}, got {value!r}")


def schedule(shape: str, start, end, steps, *, begin=0) -> Schedule:
    """A :class:`Schedule` from ``start`` to ``end`` over ``steps`` steps after ``begin``.

    Raises ``ValueError`` naming the fix for an unknown shape, ``steps`` that is not an integer
    >= 1, a ``begin`` that is not an integer >= 0, a non-finite value, or ends whose shapes do
    not broadcast."""
    if shape not in SHAPES:
        raise ValueError(f"schedule shape must be one of {', '.join(SHAPES)}, got {shape!r}")
    _check_whole("steps", steps, 1)
    _check_whole("begin", begin, 0)
    start_, end_ = np.asarray(start, np.float32), np.asarray(end, np.float32)
    if not (np.all(np.isfinite(start_)) and np.all(np.isfinite(end_))):
        raise ValueError(f"a schedule's start and end must be finite, got {start!r} and {end!r}")
    try:
        start_, end_ = np.broadcast_arrays(start_, end_)
    except ValueError:
        raise ValueError(
            f"a schedule's start and end must broadcast to one shape, got {start_.shape} and "
            f"{end_.shape}: pass one value per lane on both, or a scalar on one"
        ) from None
    return Schedule(
        start=jnp.asarray(start_),
        end=jnp.asarray(end_),
        steps=jnp.asarray(float(steps), jnp.float32),
        begin=jnp.asarray(float(begin), jnp.float32),
        shape=jnp.asarray(SHAPES.index(shape), jnp.int32),
    )


def constant_schedule(value) -> Schedule:
    """``value`` at every step, as a schedule: how a lane without one joins lanes with one."""
    return schedule("step", value, value, 1)


def is_schedule(x: Any) -> bool:
    return isinstance(x, Schedule)


def values_at(tree: Any, count) -> Any:
    """``tree`` with every :class:`Schedule` replaced by its value at step ``count``."""
    return jax.tree.map(lambda x: x(count) if is_schedule(x) else x, tree, is_leaf=is_schedule)


def broadcast_schedule(x, shape) -> Any:
    """``x`` (a value or a :class:`Schedule`) as float32 of ``shape`` (a schedule's ends)."""
    if is_schedule(x):
        return dataclasses.replace(
            x, start=broadcast_schedule(x.start, shape), end=broadcast_schedule(x.end, shape)
        )
    return jnp.broadcast_to(jnp.asarray(x, jnp.float32), shape)


def describe_schedule(s: Schedule) -> str:
    """``linear:0→0.1@200`` (``+begin`` when it waits): the runner's ``--epsilon-schedule``
    spelling (``linear:0@200``, which goes to ``--epsilon``) with the end written in, ``→0.1``;
    for reading, not for the flag."""
    start, end = (np.asarray(v).reshape(-1) for v in (s.start, s.end))
    one = len(set(start.tolist())) == 1 and len(set(end.tolist())) == 1

    def num(v):
        return f"{float(v[0]):g}" if one else "[" + ",".join(f"{float(x):g}" for x in v) + "]"

    text = f"{SHAPES[int(s.shape)]}:{num(start)}→{num(end)}@{int(s.steps)}"
    begin = float(s.begin)
    return text + (f"+{int(begin)}" if begin else "") if math.isfinite(begin) else text
