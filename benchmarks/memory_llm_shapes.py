"""The LLM task's model and step at one depth and precision, built from shapes, and the bytes
of its state and of its compiled programs: what ``python -m benchmarks memory llm``
(:mod:`benchmarks.memory_llm`, whose docstring says how each figure is measured) tabulates.

Nothing is allocated or run: the decoder ``memory_llm`` names (Llama 3.1 8B, or ``--quick``'s
tiny one) as ``jax.ShapeDtypeStruct`` leaves, the task's own ``LLMTask.build`` and the runner's own step.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import math
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import print_saved_residuals

from cudt.models.llama import Decoder, DecoderConfig
from cudt.runner.groups import make_group_step
from cudt.runner.mesh import fsdp_spec
from cudt.runner.task import GroupModel, RunBatch
from cudt.tasks.llm import LLMTask
from cudt.tasks.llm_config import LLMConfig
from cudt.tasks.llm_data import LLMData

# LLVM optimisation off: compiles 2-3x faster; buffer assignment, and so every memory figure,
# is decided before LLVM runs (identical temp bytes checked for the 8B at L = 3, both dtypes).
COMPILER_OPTIONS = {"xla_backend_optimization_level": 0}
# Short dtype names of jax's residual printer -> bytes per element.
_ITEMSIZE = {"bool": 1, "bf16": 2, "f16": 2, "f32": 4, "f64": 8}


# --------------------------------------------------------------------------------------------------
# The batch's layout
# --------------------------------------------------------------------------------------------------


def batch_layout(shards: int, batch: int) -> tuple[int, int]:
    """``(data, extra)``: the batch is split ``data = gcd(shards, batch)`` ways; the state over
    ``data x extra = shards`` devices (``extra`` devices hold the same examples)."""
    data = math.gcd(shards, batch)
    return data, shards // data


# --------------------------------------------------------------------------------------------------
# The task's model, step and shapes
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class Program:
    """The LLM task's model at one depth and precision, as shapes."""

    config: DecoderConfig
    task_cfg: LLMConfig
    model: GroupModel
    params: Any  # trainable params, ShapeDtypeStruct leaves
    batch: RunBatch  # ShapeDtypeStruct leaves
    key: Any

    def objective(self, params, batch, key) -> jax.Array:
        """Every layer's batch-mean loss, summed: the Lagrangian's shape with unit weights."""
        return jnp.sum(jnp.mean(self.model.layer_losses(params, batch, key), axis=0))


def build_program(
    args: argparse.Namespace,
    config: DecoderConfig,
    compute_dtype: str,
    remat: bool = False,
    lora_rank: int | None = None,
    base_dtype: str = "float32",
) -> Program:
    """The LLM task's ``layer_losses`` (``LLMTask.build``) over ``config``'s decoder made of shapes;
    ``remat`` rematerialises every block in the backward pass (the task's ``--remat``);
    ``lora_rank``: the task's ``--lora-rank`` over a frozen base stored in ``base_dtype``."""
    shapes = jax.eval_shape(config.init_params, jax.random.key(0))
    shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, jnp.dtype(base_dtype)), shapes)
    decoder = Decoder(config=config, params=shapes, dtype=jnp.dtype(compute_dtype), remat=remat)
    task_cfg = LLMConfig(
        max_length=args.seq,
        batch_size=args.batch,
        compute_dtype=compute_dtype,
        chunk_tokens=args.chunk_tokens,
        vocab_chunk=args.vocab_chunk,
        train_embeddings=args.train_embeddings and lora_rank is None,
        remat=remat,
        **({} if lora_rank is None else {"lora_rank": lora_rank, "checkpoint": "(shapes)"}),
    )
    data = LLMData(
        decoder=decoder,
        tokenizer=None,
        records={},
        tokens={},
        source="shapes only",
        noise_unit=1.0,
        from_scratch=True,
    )
    model = LLMTask().build(task_cfg, data, "llm", None)
    params = jax.eval_shape(model.init, jax.random.key(0))
    s = jax.ShapeDtypeStruct
    tokens = (args.batch, args.seq)
    examples = {
        "input_ids": s(tokens, jnp.int32),
        "attention_mask": s(tokens, jnp.int32),
        "labels": s(tokens, jnp.int32),
        "loss_mask": s(tokens, jnp.float32),
    }
    batch = RunBatch(examples, s((), jnp.float32), model.frozen)
    key = jax.eval_shape(jax.random.key, 0)
    return Program(config, task_cfg, model, params, batch, key)


def make_step(program: Program, *, jit: bool):
    """The runner's own step for the LLM task (:func:`cudt.runner.groups.make_group_step`);
    its ``init`` puts the task's ``chance`` reference, ln V, in the state."""
    cfg, task = program.task_cfg, LLMTask()
    init, step = make_group_step(
        cfg,
        program.model,
        lr=task.default_lr(cfg, "llm"),
        warmup=0,
        steps_per_epoch=1,
        jit=jit,
    )
    reference = math.log(program.config.vocab_size)
    return (lambda params: init(params, reference=reference)), step


def _nbytes(leaf: Any) -> int:
    return int(np.prod(leaf.shape, dtype=np.int64)) * jnp.dtype(leaf.dtype).itemsize


def device_bytes(tree: Any, shards: int) -> int:
    """Bytes of ``tree`` on one device when each leaf is split as ``--fsdp`` splits it."""
    total = 0
    for leaf in jax.tree.leaves(tree):
        spec = fsdp_spec((1, *leaf.shape), shards)
        split = shards if any(axis is not None for axis in tuple(spec)[1:]) else 1
        total += _nbytes(leaf) // split
    return total


@dataclasses.dataclass(frozen=True)
class StateBytes:
    """Bytes on one device of everything that outlives a step (and of the gradients)."""

    params: int  # trainable parameters
    frozen: int  # the frozen input embedding table (replicated; 0 with --train-embeddings),
    # or under LoRA the whole frozen base
    grads: int
    adam: int  # the primal optimiser's state: mu, nu, the count and the injected learning rate
    duals: int  # multipliers [L+1], dual state, slacks, per-run hyperparameters, step
    multipliers: int  # of which the multipliers

    @property
    def total(self) -> int:
        return self.params + self.frozen + self.grads + self.adam + self.duals


def state_shapes(program: Program) -> tuple[Any, Any]:
    """``(train state, gradients)`` as shapes: ``jax.eval_shape`` of the step's ``init`` and of
    the ``value_and_grad``."""
    init, _ = make_step(program, jit=False)
    state = jax.eval_shape(init, program.params)
    _, grads = jax.eval_shape(
        jax.value_and_grad(program.objective), program.params, program.batch, program.key
    )
    return state, grads


def state_bytes(program: Program, shapes: tuple[Any, Any], shards: int) -> StateBytes:
    """:class:`StateBytes` on one of ``shards`` devices, from :func:`state_shapes`."""
    state, grads = shapes
    rest = state.replace(params=None, opt_state=None)
    return StateBytes(
        params=device_bytes(state.params, shards),
        frozen=sum(_nbytes(leaf) for leaf in jax.tree.leaves(program.batch.frozen)),
        grads=device_bytes(grads, shards),
        adam=device_bytes(state.opt_state, shards),
        duals=sum(_nbytes(leaf) for leaf in jax.tree.leaves(rest)),
        multipliers=sum(_nbytes(leaf) for leaf in jax.tree.leaves(state.multipliers)),
    )


# --------------------------------------------------------------------------------------------------
# Compiled memory
# --------------------------------------------------------------------------------------------------


def compiled_temp(program: Program) -> int:
    """XLA's scratch bytes of the jitted ``value_and_grad`` on one device (compiled, not run)."""
    grad_fn = jax.jit(jax.value_and_grad(program.objective))
    compiled = grad_fn.lower(program.params, program.batch, program.key).compile(COMPILER_OPTIONS)
    return int(compiled.memory_analysis().temp_size_in_bytes)


def sharded_temp(program: Program, shards: int) -> int:
    """Per-device scratch bytes of the ``value_and_grad`` compiled over ``shards`` devices: the
    batch over ``data``, each state leaf as ``--fsdp`` splits it over ``data x extra``."""
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    data, extra = batch_layout(shards, program.batch.examples["input_ids"].shape[0])
    devices = np.asarray(jax.devices()[:shards]).reshape(data, extra)
    mesh = Mesh(devices, ("data", "extra"))
    state_axes = ("data", "extra") if extra > 1 else "data"

    def place(leaf: Any, spec: Any) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=NamedSharding(mesh, spec))

    def state_spec(leaf: Any) -> Any:
        spec = tuple(fsdp_spec((1, *leaf.shape), shards))[1:]
        return P(*(state_axes if axis is not None else None for axis in spec))

    params = jax.tree.map(lambda x: place(x, state_spec(x)), program.params)
    batch = program.batch._replace(
        examples=jax.tree.map(lambda x: place(x, P("data")), program.batch.examples),
        gamma=place(program.batch.gamma, P()),
        frozen=jax.tree.map(lambda x: place(x, P()), program.batch.frozen),
    )
    out = (NamedSharding(mesh, P()), jax.tree.map(lambda x: x.sharding, params))
    grad_fn = jax.jit(jax.value_and_grad(program.objective), out_shardings=out)
    compiled = grad_fn.lower(params, batch, program.key).compile(COMPILER_OPTIONS)
    return int(compiled.memory_analysis().temp_size_in_bytes)


def step_peak(program: Program) -> dict[str, int]:
    """The real jitted constrained step (state donated), compiled on one device."""
    init, step = make_step(program, jit=True)
    state = jax.eval_shape(init, program.params)
    compiled = step.lower(state, program.batch, program.key).compile(COMPILER_OPTIONS)
    m = compiled.memory_analysis()
    out = {
        "arguments": m.argument_size_in_bytes,
        "temp": m.temp_size_in_bytes,
        "outputs not aliased": m.output_size_in_bytes - m.alias_size_in_bytes,
    }
    out["peak"] = sum(out.values())
    return {k: int(v) for k, v in out.items()}


def saved_residuals(program: Program) -> dict[str, int]:
    """Bytes of what JAX's autodiff saves for the backward pass (platform-independent), besides
    the arguments: ``total`` and ``weight copies`` (compute-dtype copies of block weights)."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        print_saved_residuals(program.objective, program.params, program.batch, program.key)
    params = program.params if "blocks" in program.params else program.batch.frozen  # LoRA: base
    block_shapes = {tuple(x.shape) for x in jax.tree.leaves(params["blocks"])}
    total = copies = 0
    for line in buffer.getvalue().splitlines():
        found = re.match(r"(\w+)\[([\d,]*)\] (.*)", line)
        if found is None or found.group(3).startswith("from the argument"):
            continue
        name, dims = found.group(1), found.group(2)
        shape = tuple(int(d) for d in dims.split(",") if d)
        digits = re.sub(r"\D", "", name)
        size = _ITEMSIZE.get(name, int(digits) // 8 if digits else 8)
        nbytes = int(np.prod(shape, dtype=np.int64)) * size
        total += nbytes
        if shape in block_shapes and len(shape) >= 2:
            copies += nbytes
    return {"total": total, "weight copies": copies}
