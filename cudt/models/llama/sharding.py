"""Partition specs of a decoder's params: FSDP, Megatron tensor parallelism, or both."""

from __future__ import annotations

from typing import Any, Literal

import jax
import numpy as np
from jax.sharding import Mesh, PartitionSpec

from cudt.models.hf import ModelFolderError
from cudt.models.llama.config import Params

__all__ = ["ShardingMode", "decoder_partition_specs"]

ShardingMode = Literal["fsdp", "tp", "fsdp_tp"]

# Megatron tensor parallelism: the dim of each block kernel [L, in, out] split over "model".
_COLUMN = ("q", "k", "v", "gate", "up")  # split the output dim; the bias follows it
_ROW = ("o", "down")  # split the input dim; the bias is replicated (added after the reduce)


def decoder_partition_specs(params: Params, mode: ShardingMode, mesh: Mesh | None = None) -> Any:
    """A pytree of :class:`jax.sharding.PartitionSpec` for ``params`` (same structure).

    * ``"fsdp"``: every matrix's largest dim that the ``"data"`` axis size divides is split
      over ``"data"`` (the stacked blocks' leading ``[L]`` axis never is); vectors (norms,
      biases) are replicated.
    * ``"tp"``: Megatron over ``"model"``: q/k/v/gate/up kernels column-parallel (output dim,
      with their biases), o/down row-parallel (input dim), the embedding over the vocabulary
      (else the hidden dim), the untied LM head over the vocabulary; norms replicated.
    * ``"fsdp_tp"``: ``"tp"`` plus, for each matrix, its largest remaining dim split over
      ``"data"`` (a 2-D ``data x model`` mesh).

    A dim that the axis size does not divide is left whole. Axis sizes come from ``mesh``;
    without one, ``"fsdp"`` and ``"tp"`` assume the axis spans every device. Place params with
    ``jax.device_put(params, jax.tree.map(lambda s: NamedSharding(mesh, s), specs))``.
    """
    if mode not in ("fsdp", "tp", "fsdp_tp"):
        raise ModelFolderError(f"sharding mode must be 'fsdp', 'tp' or 'fsdp_tp', got {mode!r}")
    axes = ("data",) if mode == "fsdp" else ("model",) if mode == "tp" else ("data", "model")
    if mesh is None:
        if mode == "fsdp_tp":
            raise ModelFolderError("mode 'fsdp_tp' needs mesh=a Mesh with 'data' and 'model' axes")
        sizes = {axes[0]: jax.device_count()}
    else:
        missing = [a for a in axes if a not in mesh.shape]
        if missing:
            raise ModelFolderError(
                f"mesh axes {list(mesh.shape)} lack {missing} needed by mode {mode!r}: build the "
                f"mesh with axis names {list(axes)}"
            )
        sizes = {a: int(mesh.shape[a]) for a in axes}

    def spec(path: tuple[Any, ...], leaf: Any) -> PartitionSpec:
        names = [getattr(k, "key", getattr(k, "name", str(k))) for k in path]
        shape = tuple(np.shape(leaf))
        dims: list[str | None] = [None] * len(shape)
        first = 1 if names[0] == "blocks" else 0  # never split the stacked layer axis
        if "model" in sizes:
            m = sizes["model"]
            want: list[int] = []
            if names[0] == "blocks" and names[1] in _COLUMN:
                want = [len(shape) - 1]
            elif names[0] == "blocks" and names[1] in _ROW and names[-1] == "kernel":
                want = [1]
            elif names[0] == "embed":
                want = [0, 1]  # vocab first, else hidden
            elif names[0] == "lm_head":
                want = [1, 0]
            for d in want:
                if shape[d] % m == 0:
                    dims[d] = "model"
                    break
        if "data" in sizes and len(shape) - first >= 2:
            n = sizes["data"]
            free = [d for d in range(first, len(shape)) if dims[d] is None and shape[d] % n == 0]
            if free:
                dims[max(free, key=lambda d: (shape[d], -d))] = "data"
        return PartitionSpec(*dims)

    return jax.tree_util.tree_map_with_path(spec, params)
