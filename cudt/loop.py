"""The training loop: several runs (seeds, sweep points) trained together in one compiled program.

The runs of a group share a model structure and a step; their states are stacked on a leading
axis and the step is ``vmap``-ed over them. ``chunk_steps`` steps run inside one ``lax.scan`` per
call, so the host is touched only at chunk boundaries (the log steps): there the metrics are
fetched, checked for non-finite values and shown on the progress bar.

Batches are sampled *inside* the compiled program from device-resident data, with indices drawn
from ``fold_in(data_key, step)``: a run's data order is a function of its key and step counter, so
a run resumed from a checkpoint sees exactly the batches it would have seen.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["LoopResult", "sample_indices", "train_group"]

_DATA_STREAM = 0x5EED  # keeps data-order randomness apart from the step's own key stream


def sample_indices(key: jax.Array, step: jax.Array, num_examples: int, batch_size: int):
    """Batch indices for ``step``: uniform with replacement, a pure function of (key, step)."""
    k = jax.random.fold_in(jax.random.fold_in(key, _DATA_STREAM), step)
    return jax.random.randint(k, (batch_size,), 0, num_examples)


@dataclasses.dataclass
class LoopResult:
    states: Any  # stacked [R, ...]
    history: list[dict[str, np.ndarray]]  # one entry per chunk: step, and metrics [R, ...]
    diverged: np.ndarray  # [R] bool
    diverged_at: list[dict | None]  # per run: {"step", "quantity"} of the first non-finite value


def _first_non_finite(metrics: dict[str, np.ndarray], run: int, names) -> str | None:
    for name in names:
        if name in metrics and not np.all(np.isfinite(metrics[name][:, run])):
            return name
    return None


def train_group(
    step_fn: Callable,
    states: Any,
    keys: jax.Array,
    make_batch: Callable[[jax.Array, jax.Array], Any],
    num_steps: int,
    *,
    chunk_steps: int = 100,
    progress: Any | None = None,
    watch: tuple[str, ...] = ("objective", "lagrangian", "multipliers"),
    on_chunk: Callable[[Any, dict], None] | None = None,
) -> LoopResult:
    """Trains R runs for ``num_steps`` steps.

    Args:
      step_fn: the pure (un-jitted) ``step(state, batch, key)`` from ``make_train_step(jit=False)``.
      states: R train states stacked on a leading axis (``jax.vmap(init)(...)``).
      keys: [R] run keys (the step folds its counter in).
      make_batch: ``(key, step) -> batch`` for one run, traced inside the program.
      chunk_steps: steps per compiled ``scan``: the host sees metrics only every chunk.
      progress: a tqdm-like object (``update(n)``, ``set_postfix_str``) or None.
      watch: metrics whose non-finite values mark a run as diverged. A diverged run is frozen at
        its last finite state (its lane keeps computing, but the result is not kept), so the other
        runs of the group finish unaffected.
      on_chunk: called with ``(states, chunk_metrics)`` after every chunk (checkpointing hooks).
    """

    def one_step(carry, _):
        states, frozen = carry

        def run_step(state, key):
            batch = make_batch(key, state.step)
            return step_fn(state, batch, key)

        new_states, metrics = jax.vmap(run_step)(states, keys)
        finite = jnp.ones(frozen.shape, bool)
        for name in watch:
            if name in metrics:
                m = metrics[name]
                finite &= jnp.all(jnp.isfinite(m.reshape(m.shape[0], -1)), axis=1)
        frozen = frozen | ~finite

        def keep(new, old):
            mask = frozen.reshape(frozen.shape + (1,) * (new.ndim - 1))
            return jnp.where(mask, old, new)

        new_states = jax.tree.map(keep, new_states, states)
        return (new_states, frozen), metrics

    compiled: dict[int, Callable] = {}

    def chunk_fn(n: int):
        if n not in compiled:

            def f(states, frozen):
                return jax.lax.scan(one_step, (states, frozen), None, length=n)

            compiled[n] = jax.jit(f, donate_argnums=(0,))
        return compiled[n]

    num_runs = keys.shape[0]
    frozen = jnp.zeros((num_runs,), bool)
    diverged_at: list[dict | None] = [None] * num_runs
    history: list[dict[str, np.ndarray]] = []
    done = int(np.asarray(jax.device_get(states.step)).reshape(-1)[0])
    while done < num_steps:
        n = min(chunk_steps, num_steps - done)
        (states, frozen), metrics = chunk_fn(n)(states, frozen)
        metrics = jax.device_get(metrics)  # [n, R, ...]
        for r in range(num_runs):
            if diverged_at[r] is None:
                bad = _first_non_finite(metrics, r, watch)
                if bad is not None:
                    rows = [i for i in range(n) if not np.all(np.isfinite(metrics[bad][i, r]))]
                    diverged_at[r] = {"step": done + rows[0] + 1, "quantity": bad}
        entry = {"step": np.asarray(done + n)}
        for name, value in metrics.items():
            with warnings.catch_warnings():  # an all-NaN column (a diverged run) is expected
                warnings.simplefilter("ignore", RuntimeWarning)
                entry[name] = np.nanmean(value, axis=0) if value.ndim >= 2 else value
        history.append(entry)
        done += n
        if on_chunk is not None:
            on_chunk(states, entry)
        if progress is not None:
            progress.update(n)
            obj = entry.get("objective")
            if obj is not None:
                progress.set_postfix_str(
                    "loss " + " ".join(f"{v:.3g}" for v in np.atleast_1d(obj)), refresh=False
                )
    return LoopResult(states, history, np.asarray(jax.device_get(frozen)), diverged_at)
