"""The training loop: several runs (seeds, sweep points) trained together in one compiled program.

The runs of a group share a model structure and a step; their states are stacked on a leading
axis and the step is mapped over them (:func:`map_runs`: ``vmap`` on accelerators and across a
device mesh, a loop over the runs inside the program on CPU, the step itself for one run). Up to ``chunk_steps`` steps run inside one
``lax.scan`` per call, so the host is touched only at chunk boundaries (the log steps): there the
metrics are fetched, checked for non-finite values, shown on the progress bar and, every
``checkpoint_every`` steps, the states are checkpointed.

Chunk boundaries are the multiples of ``chunk_steps`` (and of ``checkpoint_every``), counted from
step 0 whatever step a run resumes from, so a resumed run executes exactly the same compiled
chunks as an uninterrupted one. Batches are sampled *inside* the compiled program from
device-resident data, with indices drawn from ``fold_in(data_key, step)``: a run's data order is a
function of its key and step counter, so a resumed run sees exactly the batches it would have
seen.

A run whose watched metrics turn non-finite is *frozen*: its lane keeps computing (the runs share
one program) but its state is kept at the last finite value, its metrics from the next step on
are NaN (it takes no more steps), and the divergence is recorded with the step and the quantity;
the other runs of the group finish unaffected.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cudt.checkpoint import GroupCheckpointer, unreadable_loop

__all__ = [
    "Divergence",
    "LoopResult",
    "chunk_boundaries",
    "describe_placement",
    "loop_record",
    "map_runs",
    "placement",
    "sample_indices",
    "train_group",
]

# Metrics kept step by step for the training curves (TensorBoard, the multipliers plot).
CURVE_METRICS = (
    "objective",
    "lagrangian",
    "layer_loss",
    "constraint",
    "multipliers",
    "slacks",
    "projection",
)

_DATA_STREAM = 0x5EED  # keeps data-order randomness apart from the step's own key stream


def sample_indices(key: jax.Array, step: jax.Array, num_examples: int, batch_size: int):
    """Batch indices for ``step``: uniform with replacement, a pure function of (key, step)."""
    k = jax.random.fold_in(jax.random.fold_in(key, _DATA_STREAM), step)
    return jax.random.randint(k, (batch_size,), 0, num_examples)


RUN_AXIS_MODES = ("auto", "vmap", "map")


def map_runs(fn: Callable, *args: Any, how: str = "auto", spmd_axis_name: str | None = None) -> Any:
    """``fn`` applied to every run: ``args`` (pytrees) carry the runs on a leading axis ``[R]``.

    One compiled program either way; results agree with ``fn`` on each run up to float
    rounding (``"map"`` and a single run: bit for bit). ``how``:

    * ``"vmap"``: ``jax.vmap`` (the runs batched into every operation);
    * ``"map"``: ``jax.lax.map``, the runs one after another inside the program;
    * ``"auto"`` (default): ``"vmap"`` on GPU/TPU or with ``spmd_axis_name`` (runs sharded
      over a mesh), ``"map"`` on CPU: there batching adds no parallelism (a run's own
      products already occupy the cores) and multiplies the working set by R, so every
      operation streams R runs' arrays through the caches, which is slower than the runs in
      turn (``python -m benchmarks sweep`` measures both; docs/speed.md).

    With one run (and no mesh) ``fn`` runs on it directly, with no batching or loop around it.
    """
    if how not in RUN_AXIS_MODES:
        raise ValueError(f"how must be one of {RUN_AXIS_MODES}, got {how!r}")
    if how == "auto":
        how = "vmap" if spmd_axis_name is not None or jax.default_backend() != "cpu" else "map"
    num_runs = jax.tree.leaves(args)[0].shape[0]
    if num_runs == 1 and spmd_axis_name is None:
        out = fn(*jax.tree.map(lambda a: a[0], args))
        return jax.tree.map(lambda a: jnp.expand_dims(a, 0), out)
    if how == "vmap":
        return jax.vmap(fn, spmd_axis_name=spmd_axis_name)(*args)
    return jax.lax.map(lambda xs: fn(*xs), args)


@dataclasses.dataclass(frozen=True)
class Divergence:
    """Where a run first produced a non-finite watched metric."""

    run: int
    step: int  # the step (1-based count of steps taken) whose metrics were non-finite
    quantity: str
    last_good_checkpoint: int | None  # the latest checkpoint step before it (pinned), if any

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class LoopResult:
    states: Any  # stacked [R, ...]
    history: list[dict[str, np.ndarray]]  # one entry per chunk: step, and metrics [R, ...]
    diverged: np.ndarray  # [R] bool
    divergences: list[Divergence | None]  # per run
    resumed_from: int | None = None  # the checkpoint step training resumed from, if any
    curves: list[dict[str, np.ndarray]] = dataclasses.field(default_factory=list)  # per step
    max_multipliers: np.ndarray | None = None  # [R, L+1]: the max of λ over every step
    # where the resumed checkpoint was saved, when that is not where training goes on (its
    # state was resharded on load): the :func:`placement` records of both
    resharded: tuple[dict, dict] | None = None
    interrupted_saves: list[int] = dataclasses.field(default_factory=list)  # discarded steps

    @property
    def diverged_at(self) -> list[dict | None]:
        return [None if d is None else d.to_json() for d in self.divergences]


def chunk_boundaries(start: int, num_steps: int, chunk_steps: int, every: int | None = None):
    """The chunk ends after ``start``: multiples of ``chunk_steps`` or ``every``, and the end."""
    ends = []
    step = start
    while step < num_steps:
        nxt = (step // chunk_steps + 1) * chunk_steps
        if every:
            nxt = min(nxt, (step // every + 1) * every)
        step = min(nxt, num_steps)
        ends.append(step)
    return ends


def _history_to_json(history):
    return [{k: np.asarray(v).tolist() for k, v in h.items()} for h in history]


def _history_from_json(history):
    return [
        {k: np.asarray(v, np.float64 if k != "step" else np.int64) for k, v in h.items()}
        for h in history
    ]


def placement(shardings: Any) -> dict[str, Any]:
    """Where a group's states live, as its checkpoints record it: the device and process
    counts, the mesh (``{"run": r, "data": d}``) and whether the states are FSDP-split. A
    resumed run compares it with the checkpoint's (a checkpoint restores into any placement:
    its arrays are resharded on load)."""
    if shardings is None:
        return {"devices": 1, "processes": jax.process_count(), "mesh": None, "fsdp": False}
    return {
        "devices": int(shardings.devices),
        "processes": jax.process_count(),
        "mesh": {k: int(v) for k, v in shardings.shape.items()},
        "fsdp": bool(shardings.fsdp),
    }


def describe_placement(where: dict[str, Any]) -> str:
    """A placement record in words: ``4 devices (mesh run 2 × data 2)``, ``1 device``."""
    n, p = where.get("devices"), where.get("processes", 1)
    text = f"{n} device{'s' if n != 1 else ''}"
    if p != 1:
        text += f" in {p} processes"
    mesh = where.get("mesh")
    if mesh:
        text += " (mesh " + " × ".join(f"{k} {v}" for k, v in mesh.items())
        text += ", FSDP)" if where.get("fsdp") else ")"
    return text


def _abstract(leaf):
    if isinstance(leaf, jax.Array):
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=leaf.sharding)
    return leaf


def train_group(
    step_fn: Callable,
    states: Any,
    keys: jax.Array,
    make_batch: Callable[[jax.Array, jax.Array], Any],
    num_steps: int,
    *,
    chunk_steps: int = 100,
    progress: Any | None = None,
    watch: tuple[str, ...] = ("objective", "lagrangian", "multipliers", "grad_norm"),
    checkpointer: GroupCheckpointer | None = None,
    checkpoint_every: int | None = None,
    on_divergence: Callable[[Divergence], None] | None = None,
    fault: tuple[Any, int] | None = None,
    data: Any = None,
    extras: Any = None,
    shardings: Any = None,
    curve_every: int | None = None,
    run_axis: str = "auto",
) -> LoopResult:
    """Trains R runs for ``num_steps`` steps, resuming from ``checkpointer``'s latest checkpoint.

    Args:
      step_fn: the pure (un-jitted) ``step(state, batch, key)`` from ``make_train_step(jit=False)``.
      states: R train states stacked on a leading axis (``jax.vmap(init)(...)``), consumed like
        a donated argument; when the checkpointer holds a checkpoint, they only give the
        structure to restore into, and their arrays are deleted before the restore, so a resume
        never holds two states (six SmolLM2 lanes: 9.7 GB each).
      keys: [R] run keys (the step folds its counter in).
      make_batch: ``(key, step) -> batch`` for one run, traced inside the program; with
        ``data`` or ``extras`` given, ``(key, step, data, extras_r) -> batch`` instead.
      chunk_steps: steps per compiled ``scan``: the host sees metrics only every chunk.
      progress: a tqdm-like object (``update(n)``, ``set_postfix_str``) or None.
      watch: metrics whose non-finite values mark a run as diverged (then frozen, see above).
        The primal gradient's norm is among them: a finite loss with a non-finite gradient
        would otherwise write non-finite parameters before any loss showed it.
      checkpointer: saves every ``checkpoint_every`` steps and at the end; resumes from its
        latest checkpoint.
      checkpoint_every: steps between checkpoints (default: every chunk).
      on_divergence: called once per run that diverges, after its last good checkpoint is pinned.
      fault: ``(runs, step)``: for fault-injection tests, every floating leaf of the batch of
        each run in ``runs`` (an index or a list of them) at that step is replaced by NaN, so
        its loss becomes non-finite through the real step.
      data: a pytree of arrays shared by every run (training examples, frozen tables): an
        *argument* of the compiled program, not a constant baked into it.
      extras: a pytree of per-run arrays ``[R, ...]`` (e.g. a swept noise level) handed to
        ``make_batch``.
      shardings: a :class:`cudt.runner.mesh.Shardings` placing the run axis (states, keys,
        extras) and the batch axis on a device mesh; None keeps everything on one device.
      curve_every: keep every this many steps' metrics (the training curves, plus the last
        step of each chunk) in ``LoopResult.curves``; default: about ten points per chunk.
      run_axis: how a chunk (a ``lax.scan`` of one run's steps) is mapped over the runs:
        ``"auto"``, ``"vmap"`` or ``"map"`` (:func:`map_runs`; ``"map"``, the CPU default,
        gives each run the results of the run trained alone bit for bit, ``"vmap"`` up to
        float rounding).
    """
    num_runs = _check_group(states, keys, run_axis)
    every = checkpoint_every or chunk_steps
    curve_every = curve_every or max(1, -(-chunk_steps // 10))
    here = placement(shardings)
    states, record = _start(checkpointer, states, shardings, num_runs, here)
    program = _ChunkProgram(
        step_fn,
        make_batch,
        num_runs=num_runs,
        watch=watch,
        fault=fault,
        with_data=data is not None or extras is not None,
        shardings=shardings,
        run_axis=run_axis,
    )
    if extras is None:
        extras = jnp.zeros((num_runs,), jnp.float32)  # a placeholder to vmap over
    if shardings is not None:
        states = shardings.put_states(states)
        keys, record.frozen, extras = shardings.put_runs((keys, record.frozen, extras))
        data = shardings.put_replicated(data)
    fetch = jax.device_get if shardings is None else shardings.to_host
    done = _group_step(record, fetch(states.step))
    if progress is not None and done:
        progress.update(done)
    last_saved = record.resumed_from
    for end in chunk_boundaries(done, num_steps, chunk_steps, every):
        n = end - done
        (states, record.frozen), metrics = program(n)(states, record.frozen, data, keys, extras)
        metrics = {k: np.swapaxes(v, 0, 1) for k, v in fetch(metrics).items()}  # [n, R, ...]
        record.add_curves(metrics, done, n, curve_every)
        record.add_divergences(metrics, done, watch, last_saved, checkpointer, on_divergence)
        entry = record.add_history(metrics, end)
        done = end
        if checkpointer is not None and (done % every == 0 or done == num_steps):
            checkpointer.save(done, states, record.to_json(fetch, here))
            last_saved = done
        if progress is not None:
            _show_progress(progress, n, entry)
    if checkpointer is not None:
        checkpointer.wait()
    return record.result(states, fetch)


def _check_group(states: Any, keys: Any, run_axis: str) -> int:
    """The number of runs R, after one error for arguments that are not a group: ``keys``
    ``[R]`` and ``states`` stacked on a leading axis of R (one run's state, from ``init`` alone,
    failed deep inside with "tuple index out of range"; R keys for another number of states,
    with "scan got values with different leading axis sizes")."""
    if run_axis not in RUN_AXIS_MODES:
        raise ValueError(f"run_axis must be one of {RUN_AXIS_MODES}, got {run_axis!r}")
    if jnp.ndim(keys) == 0:
        raise ValueError("keys must be one key per run, [R]: pass jax.random.split(key, R)")
    num_runs = keys.shape[0]
    for path, leaf in jax.tree_util.tree_leaves_with_path(states):
        shape = getattr(leaf, "shape", None)
        if shape is not None and shape[:1] != (num_runs,):
            raise ValueError(
                f"states must be {num_runs} runs' states stacked on a leading axis (one per "
                f"key), but states{jax.tree_util.keystr(path)} has shape {tuple(shape)}: "
                "stack them, jax.vmap(lambda e: init(params, epsilon=e))(values), or pass "
                "one key per run"
            )
    return num_runs


@dataclasses.dataclass
class _Record:
    """What the loop keeps of its runs beside their states: a :class:`LoopResult` but the
    states. Checkpoints save it with them (:meth:`to_json`), the start aside."""

    frozen: Any  # [R] bool, on the device: runs kept at their last finite state
    divergences: list[Divergence | None]  # per run
    history: list[dict[str, np.ndarray]] = dataclasses.field(default_factory=list)
    curves: list[dict[str, np.ndarray]] = dataclasses.field(default_factory=list)
    max_multipliers: np.ndarray | None = None  # [R, L+1]
    # the start: as LoopResult's
    resumed_from: int | None = None
    resharded: tuple[dict, dict] | None = None
    interrupted: list[int] = dataclasses.field(default_factory=list)

    def result(self, states: Any, fetch: Callable) -> LoopResult:
        return LoopResult(
            states,
            self.history,
            np.asarray(fetch(self.frozen)),
            self.divergences,
            self.resumed_from,
            self.curves,
            self.max_multipliers,
            self.resharded,
            self.interrupted,
        )

    @classmethod
    def from_json(cls, loop: dict) -> _Record:
        """The record a checkpoint saved (``loop``: :meth:`to_json`'s, or an earlier cudt's)."""
        max_multipliers = None
        if loop.get("max_multipliers") is not None:
            max_multipliers = np.asarray(loop["max_multipliers"], np.float64)
        return cls(
            jnp.asarray(loop["frozen"], bool),
            [None if d is None else Divergence(**d) for d in loop["divergences"]],
            _history_from_json(loop["history"]),
            _history_from_json(loop.get("curves", [])),
            max_multipliers,
        )

    def to_json(self, fetch: Callable, here: dict) -> dict:
        """The record as a checkpoint saves it, with ``here``, the states' placement."""
        return {
            "frozen": np.asarray(fetch(self.frozen)).tolist(),
            "divergences": [None if d is None else d.to_json() for d in self.divergences],
            "history": _history_to_json(self.history),
            "curves": _history_to_json(self.curves),
            "max_multipliers": (
                None if self.max_multipliers is None else self.max_multipliers.tolist()
            ),
            "placement": here,
        }

    def add_curves(self, metrics: dict, done: int, n: int, curve_every: int) -> None:
        """A chunk's metrics ``[n, R, ...]`` from step ``done``: the running max of the
        multipliers, and every ``curve_every``-th step's curve metrics (and the chunk's last)."""
        if "multipliers" in metrics:
            with warnings.catch_warnings():  # a diverged run's NaN multipliers are expected
                warnings.simplefilter("ignore", RuntimeWarning)
                chunk_max = np.nanmax(np.asarray(metrics["multipliers"], np.float64), axis=0)
            self.max_multipliers = (
                chunk_max
                if self.max_multipliers is None
                else np.fmax(self.max_multipliers, chunk_max)
            )
        for i in range(n):
            if (done + i + 1) % curve_every == 0 or i == n - 1:
                self.curves.append(
                    {"step": np.asarray(done + i + 1)}
                    | {k: np.asarray(v[i]) for k, v in metrics.items() if k in CURVE_METRICS}
                )

    def add_divergences(self, metrics, done, watch, last_saved, checkpointer, on_divergence):
        """Records the runs not yet diverged whose watched metrics turned non-finite in this
        chunk (from step ``done``), each at its first such step, after pinning their last good
        checkpoint (``last_saved``); then tells ``on_divergence``."""
        for divergence in self._new_divergences(metrics, done, watch, last_saved):
            if last_saved is not None and checkpointer is not None:
                checkpointer.pin(last_saved)
            self.divergences[divergence.run] = divergence
            if on_divergence is not None:
                on_divergence(divergence)

    def _new_divergences(self, metrics, done, watch, last_saved) -> list[Divergence]:
        """Each run not yet diverged whose watched metrics hold a non-finite value in this chunk:
        its earliest such step, and there the first watched metric in ``watch``'s order."""
        found = []
        watched = [name for name in watch if name in metrics]
        for r, known in enumerate(self.divergences):
            if known is not None or not watched:
                continue
            bad = np.stack([_nonfinite_rows(metrics[name][:, r]) for name in watched])  # [W, n]
            if not bad.any():
                continue
            row = int(np.argmax(bad.any(axis=0)))
            name = watched[int(np.argmax(bad[:, row]))]
            found.append(Divergence(r, done + row + 1, name, last_saved))
        return found

    def add_history(self, metrics: dict, end: int) -> dict[str, np.ndarray]:
        """The chunk's history entry (at step ``end``: each metric's mean over the chunk's
        steps, NaN steps left out), appended and returned."""
        entry = {"step": np.asarray(end)}
        for name, value in metrics.items():
            with warnings.catch_warnings():  # an all-NaN column (a diverged run) is expected
                warnings.simplefilter("ignore", RuntimeWarning)
                entry[name] = np.nanmean(value, axis=0) if value.ndim >= 2 else value
        self.history.append(entry)
        return entry


def loop_record(loop: Any, num_runs: int, where: Any = "") -> _Record:
    """The loop record a checkpoint saved (``loop``, its JSON), checked against the group it
    resumes (``num_runs`` runs): JSON that is not such a record (``{}``, another group's, an
    edited one) raises :func:`cudt.checkpoint.unreadable_loop` naming ``where``, the step's
    folder, as a corrupt checkpoint, before any training (it failed mid-resume)."""
    why = _loop_problem(loop, num_runs)
    if why is not None:
        raise unreadable_loop(where, why)
    return _Record.from_json(loop)


_DIVERGENCE_FIELDS = {f.name for f in dataclasses.fields(Divergence)}


def _loop_problem(loop: Any, num_runs: int) -> str | None:
    """What makes ``loop`` no record of ``num_runs`` runs (None: it is one)."""
    if not isinstance(loop, dict):
        return f"{type(loop).__name__}, not a JSON object"
    for key in ("frozen", "divergences", "history"):
        if not isinstance(loop.get(key), list):
            return f"no list {key!r}"
    if len(loop["frozen"]) != num_runs or not all(type(f) is bool for f in loop["frozen"]):
        return f"'frozen' is not {num_runs} true/false values, one per run"
    if len(loop["divergences"]) != num_runs:
        return f"'divergences' has {len(loop['divergences'])} entries for {num_runs} runs"
    for d in loop["divergences"]:
        if d is not None and not (isinstance(d, dict) and set(d) == _DIVERGENCE_FIELDS):
            return f"a divergence {d!r} is not {sorted(_DIVERGENCE_FIELDS)}"
    for key in ("history", "curves"):
        for entry in loop.get(key) or []:
            if not isinstance(entry, dict) or "step" not in entry:
                return f"an entry of {key!r} has no step"
            for name, value in entry.items():
                if not _numbers(value, None if name == "step" else num_runs):
                    return f"{key!r} {name} is not numbers, one row per run"
    multipliers = loop.get("max_multipliers")
    if multipliers is not None and not _numbers(multipliers, num_runs):
        return "'max_multipliers' is not numbers, one row per run"
    return None


def _numbers(value: Any, rows: int | None) -> bool:
    """Whether ``value`` reads as an array of numbers (None: NaN), of ``rows`` rows (None: a
    scalar)."""
    try:
        array = np.asarray(value, np.float64)
    except (TypeError, ValueError):
        return False
    return array.ndim == 0 if rows is None else (array.ndim >= 1 and len(array) == rows)


def _nonfinite_rows(values: np.ndarray) -> np.ndarray:
    """``[n, ...] -> [n]``: whether each step's value holds a non-finite entry."""
    values = np.asarray(values)
    return ~np.isfinite(values.reshape(values.shape[0], -1)).all(axis=1)


def _group_step(record: _Record, steps) -> int:
    """Where the group stands: the checkpoint's step, else the furthest run's (a diverged run is
    frozen, its step too, at the step it diverged at: no one run's step is the group's)."""
    if record.resumed_from is not None:
        return record.resumed_from
    return int(np.asarray(steps).max())


def _start(checkpointer: GroupCheckpointer | None, states: Any, shardings, num_runs: int, here):
    """``(states, record)`` to train from: ``states`` (placed by ``shardings``) with a fresh
    record, or ``checkpointer``'s latest checkpoint (:func:`_restore`)."""
    # a save killed before it was committed leaves orbax's temporary folder: the latest
    # complete checkpoint is the one to resume from, and the partial one goes
    interrupted = checkpointer.discard_interrupted_saves() if checkpointer is not None else []
    if shardings is not None:
        # on the mesh first, so a checkpoint is restored straight into sharded arrays (on a
        # multi-host job each process then reads only its own shards)
        states = shardings.put_states(states)
    if checkpointer is None or checkpointer.latest_step() is None:
        record = _Record(jnp.zeros((num_runs,), bool), [None] * num_runs)
    else:
        states, record = _restore(checkpointer, states, num_runs, here)
    record.interrupted = interrupted
    return states, record


def _restore(checkpointer: GroupCheckpointer, states: Any, num_runs: int, here: dict):
    """``(states, record)`` from ``checkpointer``'s latest checkpoint, restored into the
    structure and placement of ``states``, whose arrays are deleted first (a resume never holds
    two states)."""
    target = jax.tree.map(_abstract, states)
    for leaf in jax.tree.leaves(states):
        if isinstance(leaf, jax.Array) and not leaf.is_deleted():
            leaf.delete()
    del states
    states, loop = checkpointer.restore(target)
    step = checkpointer.latest_step()
    record = loop_record(loop, num_runs, checkpointer.step_dir(step))
    record.resumed_from = step
    saved_on = loop.get("placement")  # absent in checkpoints of an earlier cudt
    if saved_on is not None and saved_on != here:
        record.resharded = (saved_on, here)
    return states, record


def _show_progress(progress: Any, n: int, entry: dict) -> None:
    progress.update(n)
    obj = entry.get("objective")
    if obj is not None:
        progress.set_postfix_str(
            "loss " + " ".join(f"{v:.3g}" for v in np.atleast_1d(obj)), refresh=False
        )


@dataclasses.dataclass
class _ChunkProgram:
    """A group's compiled chunks: ``program(n)`` is the jitted ``(states, frozen, data, keys,
    extras) -> ((states, frozen), metrics [R, n, ...])`` of ``n`` steps of every run, compiled
    once per ``n``. Arguments as :func:`train_group`'s."""

    step_fn: Callable
    make_batch: Callable
    num_runs: int
    watch: tuple[str, ...]
    fault: tuple[Any, int] | None
    with_data: bool  # make_batch takes (key, step, data, extra)
    shardings: Any
    run_axis: str
    compiled: dict[int, Callable] = dataclasses.field(default_factory=dict)
    fault_mask: np.ndarray = dataclasses.field(init=False)  # [R] bool: the runs fault poisons
    fault_step: int = dataclasses.field(init=False)

    def __post_init__(self):
        fault_runs, self.fault_step = self.fault if self.fault is not None else ((), -1)
        self.fault_mask = np.zeros((self.num_runs,), bool)
        self.fault_mask[np.asarray(fault_runs, int).reshape(-1)] = True

    def __call__(self, n: int) -> Callable:
        if n not in self.compiled:
            shardings = self.shardings

            def f(states, frozen, data, keys, extras):
                # The runs map OUTSIDE the scan over steps: on CPU (``lax.map``) each run takes
                # its n steps in turn with its own arrays hot in cache, as separate runs would
                # (docs/speed.md); vmapped, it is the same program as a scan of vmapped steps.
                return map_runs(
                    functools.partial(self.run_chunk, data=data, n=n),
                    states,
                    frozen,
                    keys,
                    jnp.arange(self.num_runs),
                    extras,
                    how=self.run_axis,
                    spmd_axis_name=None if shardings is None else shardings.run_axis,
                )

            self.compiled[n] = jax.jit(f, donate_argnums=(0,))
        return self.compiled[n]

    def run_chunk(self, state, frozen, key, run, extra, data, n):
        """``n`` steps of ONE run (a ``lax.scan``); a run whose watched metrics turn non-finite
        is frozen: its state stays that of its last finite step, and the metrics of the steps
        after the one that froze it are NaN (it takes no such step: recomputing its frozen
        step gave a diverged run's curves finite values, flat, where one metric alone, the
        gradient's norm, say, had turned non-finite)."""

        def body(carry, _):
            state, was_frozen = carry
            batch = self.batch(key, state.step, run, data, extra)
            new_state, metrics = self.step_fn(state, batch, key)
            finite = jnp.ones((), bool)
            for name in self.watch:
                if name in metrics:
                    finite &= jnp.all(jnp.isfinite(metrics[name]))
            frozen = was_frozen | ~finite
            new_state = jax.tree.map(lambda new, old: jnp.where(frozen, old, new), new_state, state)
            metrics = jax.tree.map(
                lambda m: (
                    jnp.where(was_frozen, jnp.nan, m)
                    if jnp.issubdtype(m.dtype, jnp.floating)
                    else m
                ),
                metrics,
            )
            return (new_state, frozen), metrics

        return jax.lax.scan(body, (state, frozen), None, length=n)

    def batch(self, key, step, run, data, extra):
        """Run ``run``'s batch at ``step``, placed on the mesh's data axis; NaN where
        ``fault`` poisons it."""
        if self.with_data:
            batch = self.make_batch(key, step, data, extra)
        else:
            batch = self.make_batch(key, step)
        if self.shardings is not None:
            batch = self.shardings.constrain_batch(batch)
        if self.fault is not None:
            poison = jnp.asarray(self.fault_mask)[run] & (step + 1 == self.fault_step)
            batch = jax.tree.map(
                lambda b: (
                    jnp.where(poison, jnp.nan, b) if jnp.issubdtype(b.dtype, jnp.floating) else b
                ),
                batch,
            )
        return batch
