"""Devices: a mesh over every visible device, with a run axis and a batch axis.

Runs of a group (sweep points × seeds) are independent, so their stacked states, keys and
per-run values are split over the mesh's ``run`` axis; each run's batch is split over its
``data`` axis (data parallelism inside a run). Everything shared by the runs (training examples,
frozen tables) is replicated. The vmapped step is compiled once with ``jax.jit`` over
``NamedSharding``-placed arguments; ``vmap(..., spmd_axis_name="run")`` tells the partitioner
that the vmapped axis is the run axis. No ``pmap``.

The mesh shape is chosen per group: ``run`` = the largest divisor of the device count that
divides the number of runs, ``data`` = the largest divisor of the remaining devices that
divides the batch size; devices that fit neither are left idle (``Shardings.devices`` says how
many are used). With ``fsdp=True`` (``--fsdp``) the run states (parameters, optimiser moments)
are also split over the ``data`` axis, fully sharded data parallelism: every state leaf of at
least :data:`FSDP_MIN_ELEMENTS` elements per run is split along its largest dimension that the
``data`` size divides (small leaves, norms and biases, stay replicated within the run); XLA
all-gathers a layer's weights where the step needs them and reduce-scatters the gradients.
Multi-host jobs call :func:`initialize_distributed` first; host-side reads
then gather the global arrays (:meth:`Shardings.to_host`).
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

__all__ = [
    "Shardings",
    "check_job_devices",
    "initialize_distributed",
    "make_shardings",
    "mesh_shape",
]

RUN, DATA = "run", "data"
FSDP_MIN_ELEMENTS = 1024  # per run: smaller leaves are not worth a collective


def fsdp_spec(shape: tuple[int, ...], data: int, run_axis: str = RUN, data_axis: str = DATA) -> P:
    """The spec of a stacked state leaf ``[R, ...]`` under FSDP: the run axis first, then the
    data axis on the largest trailing dimension ``data`` divides (None: replicated in the run)."""
    if len(shape) < 2 or data == 1 or math.prod(shape[1:]) < FSDP_MIN_ELEMENTS:
        return P(run_axis)
    dims = [d for d in range(1, len(shape)) if shape[d] % data == 0 and shape[d] >= data]
    if not dims:
        return P(run_axis)
    best = max(dims, key=lambda d: (shape[d], -d))
    return P(run_axis, *([None] * (best - 1)), data_axis)


def initialize_distributed() -> None:
    """``jax.distributed.initialize()`` for a multi-host job (SLURM, TPU VM, or the
    ``JAX_COORDINATOR_ADDRESS`` / ``JAX_NUM_PROCESSES`` / ``JAX_PROCESS_ID`` variables): every
    process then sees every device of the job, and the mesh spans them all."""
    if jax.distributed.is_initialized():
        return
    from cudt.errors import UsageError

    env = os.environ
    kwargs = {}
    if env.get("JAX_COORDINATOR_ADDRESS"):  # an explicit launch; else SLURM / TPU VM detection
        kwargs = {"coordinator_address": env["JAX_COORDINATOR_ADDRESS"]}
        try:
            kwargs["num_processes"] = int(env["JAX_NUM_PROCESSES"])
            kwargs["process_id"] = int(env["JAX_PROCESS_ID"])
        except (KeyError, ValueError) as e:
            raise UsageError(
                f"--distributed with JAX_COORDINATOR_ADDRESS needs integer JAX_NUM_PROCESSES and "
                f"JAX_PROCESS_ID ({e!r}): set both for every process of the job"
            ) from e
    try:
        jax.distributed.initialize(**kwargs)
    except (ValueError, RuntimeError) as e:
        raise UsageError(
            f"--distributed: cannot join the job ({e}): launch it under SLURM or on a TPU VM, "
            "or set JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID"
        ) from e


def _largest_divisor(n: int, of: int) -> int:
    """The largest divisor of ``n`` that also divides ``of``."""
    return math.gcd(n, of)


def mesh_shape(num_devices: int, num_runs: int, batch_size: int) -> tuple[int, int]:
    """``(run, data)`` sizes of the mesh for a group (see the module docstring)."""
    run = _largest_divisor(num_devices, num_runs)
    data = _largest_divisor(num_devices // run, batch_size)
    return run, data


@dataclasses.dataclass(frozen=True)
class Shardings:
    """Where a group's arrays live: the run axis, the batch axis, replicated data."""

    mesh: Mesh
    run_axis: str = RUN
    data_axis: str = DATA
    fsdp: bool = False

    @property
    def devices(self) -> int:
        return int(self.mesh.devices.size)

    @property
    def shape(self) -> dict[str, int]:
        return dict(self.mesh.shape)

    def runs(self) -> NamedSharding:
        return NamedSharding(self.mesh, P(self.run_axis))

    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, P())

    def put_runs(self, tree: Any) -> Any:
        """Places every leaf of ``tree`` split along its leading (run) axis."""
        return _put(tree, self.runs())

    def state_sharding(self, x: Any) -> NamedSharding:
        """Where a stacked run-state leaf lives: split over runs, and under FSDP over data."""
        if not self.fsdp:
            return self.runs()
        spec = fsdp_spec(
            tuple(x.shape), self.mesh.shape[self.data_axis], self.run_axis, self.data_axis
        )
        return NamedSharding(self.mesh, spec)

    def put_states(self, tree: Any) -> Any:
        """Places stacked run states: :meth:`put_runs`, with FSDP's splits when ``fsdp``."""
        if not self.fsdp:
            return self.put_runs(tree)
        one = (lambda x, s: jax.device_put(x, s)) if jax.process_count() == 1 else _put_global
        return jax.tree.map(lambda x: one(x, self.state_sharding(x)), tree)

    def abstract_states(self, tree: Any) -> Any:
        """Shapes and dtypes of stacked run states (``jax.eval_shape``'s), each with the sharding
        :meth:`put_states` gives it: a restore target that reads a checkpoint onto this mesh."""
        return jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=self.state_sharding(x)), tree
        )

    def put_replicated(self, tree: Any) -> Any:
        return _put(tree, self.replicated())

    def constrain_batch(self, batch: Any) -> Any:
        """Splits a run's examples over the data axis (inside the vmapped step: ``[R, B, ...]``
        then lies on ``(run, data)``). Only ``batch.examples`` when the batch has it, so
        frozen tables travelling with the batch stay replicated."""
        spec = NamedSharding(self.mesh, P(self.data_axis))
        if self.mesh.shape[self.data_axis] == 1:
            return batch

        def constrain(x):
            return jax.lax.with_sharding_constraint(x, spec) if getattr(x, "ndim", 0) else x

        if hasattr(batch, "examples") and hasattr(batch, "_replace"):
            return batch._replace(examples=jax.tree.map(constrain, batch.examples))
        return jax.tree.map(constrain, batch)

    def to_host(self, tree: Any) -> Any:
        """numpy copies of (possibly sharded, possibly multi-host) arrays."""
        if jax.process_count() == 1:
            return jax.device_get(tree)
        from jax.experimental import multihost_utils

        return jax.tree.map(
            np.asarray, multihost_utils.process_allgather(tree, tiled=True)
        )  # pragma: no cover - multi-host only


def _put(tree: Any, sharding: NamedSharding) -> Any:
    if tree is None:
        return None
    if jax.process_count() == 1:
        return jax.tree.map(lambda x: jax.device_put(x, sharding), tree)
    return jax.tree.map(lambda x: _put_global(x, sharding), tree)


def _put_global(x, sharding: NamedSharding):
    """A value every process holds whole, as a global array of which each process places only
    its own shards (``device_put`` accepts only shardings of this process's devices)."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:  # already global
        return x if x.sharding == sharding else jax.device_put(x, sharding)
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):  # typed keys: place their data
        impl = jax.random.key_impl(x)
        data = _put_global(jax.random.key_data(x), sharding)
        return jax.random.wrap_key_data(data, impl=impl)
    host = np.asarray(jax.device_get(x))
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def make_shardings(
    num_runs: int, batch_size: int, max_devices: int | None = None, *, fsdp: bool = False
) -> Shardings | None:
    """The shardings of a group of ``num_runs`` runs with batches of ``batch_size``, over every
    visible device (at most ``max_devices``); None with a single device (plain placement).
    ``fsdp``: also split the run states over the data axis (see the module docstring). In a
    job of several processes the mesh holds as many devices of each process (a process with
    none in it could not run the group's program: the job would hang), and a UsageError
    says what to change where that cannot be (:func:`check_job_devices`)."""
    devices = jax.devices()
    processes = jax.process_count()
    if processes > 1:
        check_job_devices(max_devices)
    elif max_devices is not None:
        devices = devices[:max_devices]
    if len(devices) == 1 and processes == 1:
        return None
    run, data = mesh_shape(len(devices), num_runs, batch_size)
    if processes > 1:
        devices = _spanning_processes(devices, run, data, num_runs, batch_size)
    grid = np.asarray(devices[: run * data], dtype=object).reshape(run, data)
    return Shardings(Mesh(grid, (RUN, DATA)), fsdp=fsdp)


def check_job_devices(max_devices: int | None) -> None:
    """``--devices`` in a job of several processes: a cap below the job's device count would
    leave some process out of every mesh (a hang), so it is refused."""
    from cudt.errors import UsageError

    total, processes = jax.device_count(), jax.process_count()
    if processes > 1 and max_devices is not None and max_devices < total:
        raise UsageError(
            f"--devices {max_devices} in a job of {processes} processes: every process trains "
            f"on its own devices (the job's {total}), and a process left out of the mesh would "
            "wait forever: drop --devices, or launch fewer processes or devices"
        )


def _spanning_processes(devices, run: int, data: int, num_runs: int, batch_size: int) -> list:
    """``run * data`` of a multi-process job's ``devices``, as many from each process, in
    process order (a run's data axis then stays within a process where it can)."""
    from cudt.errors import UsageError

    processes, size = jax.process_count(), run * data
    if size % processes:
        raise UsageError(
            f"a group of {num_runs} runs with batches of {batch_size} fills a mesh of {size} of "
            f"the job's {len(devices)} devices (run {run} × data {data}: each divides the "
            f"device count and its runs or batch), and a job of {processes} processes needs "
            f"devices of every process in it: pass a --batch-size that {len(devices)} divides"
        )
    per = size // processes
    return [d for p in range(processes) for d in [d for d in devices if d.process_index == p][:per]]


def visible_devices() -> int:
    return jax.device_count()


def forced_cpu_devices() -> int | None:
    """The count forced by ``XLA_FLAGS=--xla_force_host_platform_device_count=N``, if any."""
    flags = os.environ.get("XLA_FLAGS", "")
    for part in flags.split():
        if part.startswith("--xla_force_host_platform_device_count="):
            return int(part.split("=", 1)[1])
    return None
