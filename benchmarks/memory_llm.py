"""Memory per device to fine-tune Llama 3.1 8B with cudt's constrained step (the paper's Section 6).

The ``llm`` section of ``python -m benchmarks memory``:

    .venv/bin/python -m benchmarks memory llm            # the 8B table; ~2 min on 2 CPU cores
    .venv/bin/python -m benchmarks memory llm --quick    # a tiny decoder: the code paths only
    .venv/bin/python -m benchmarks memory llm --lora-rank 8,32   # and LoRA rows on one H200

Nothing is allocated or run: every number comes from shapes or from XLA's compiler. Setups:
``--gpus`` x ``--gpu-gb`` with the run's state split over every GPU (FSDP); the same machine as
cudt's runner lays one run out for this batch (its data axis is ``gcd(gpus, batch)``, so 4 of 8
GPUs for a batch of 4); one H200 (``--h200-gb``). Precisions: float32, and mixed (bfloat16
compute, float32 parameters, gradients and Adam moments: the LLM task's ``--compute-dtype
bfloat16``).

* **The model and the step are cudt's own**: the LLM task's per-sample layer losses
  (:meth:`cudt.tasks.llm.LLMTask.build`: ``Decoder.apply`` + :func:`cudt.lm_loss.
  layer_token_losses` at ``--chunk-tokens``, every position read out: the task's
  ``--readout-tokens all --chunk-tokens 2048``, not its defaults, which read the response
  tokens only and hold up to 1/8 of the device's memory in logits
  (:func:`cudt.lm_loss.default_chunk_tokens`: 8588 rows on an H200 at jax's default 75 %,
  22.6 GB of activations where 2048 take 16.8); the input embedding table frozen, as the
  task's default), the runner's own step (:func:`cudt.runner.groups.make_group_step`: Adam,
  the dual optimiser and :func:`cudt.make_train_step`, wired as for every group), over a
  :class:`~cudt.models.llama.DecoderConfig` with Llama 3.1 8B's architecture.
* **State bytes, exactly from shapes**: ``jax.eval_shape`` of the step's ``init`` (parameters,
  Adam's ``mu`` and ``nu``, the ``[L+1]`` multipliers (``[L]`` with LoRA), the dual state) and of the
  ``value_and_grad`` (the gradients). Under FSDP each leaf is split as ``--fsdp`` splits it
  (:func:`cudt.runner.mesh.fsdp_spec`); the frozen table stays whole on every device.
* **Activations, from the compiler**: ``jax.jit(value_and_grad(objective)).lower(shapes)
  .compile().memory_analysis().temp_size_in_bytes``, XLA's scratch besides the arguments (the
  parameters) and the outputs (the gradients); ``objective`` sums the batch-mean layer losses
  (the Lagrangian's shape). On one device it is compiled at depths ``L = 1, L0, L0 + 1`` and at
  ``--layers`` directly (the blocks are one ``lax.scan``: compiling 32 layers costs what 2 do),
  and the line through ``L0, L0 + 1`` is printed next to the direct compile; ``L0 >= 2`` is the
  first depth with whole ``chunk_tokens`` loss blocks. Under FSDP the program is compiled
  sharded (``NamedSharding`` arguments, forced CPU devices in a subprocess), so its per-device
  scratch includes the gathered weights and the unreduced gradients.
* **Cross-check**: the real jitted constrained step (state donated), compiled on one device:
  its arguments + scratch + non-aliased outputs against the table's total.
* **Residuals**: what autodiff saves per layer (``jax.ad_checkpoint.print_saved_residuals``),
  independent of the backend, next to the compiled slope (XLA:CPU has no bfloat16 matmul).
* **Block rematerialisation**: the same programs compiled at ``--layers`` with the decoder's
  ``remat=True`` (the LLM task's ``--remat``: ``jax.checkpoint`` with ``nothing_saveable``
  around each block of the scan), one device and sharded alike: measured, not estimated.
* **LoRA** (``--lora-rank r``, repeatable or ``8,32``): rows on one H200 for the task's
  ``--lora-rank r`` (alpha 2r, every projection: :func:`cudt.tasks.llm_export.lora_spec`),
  built by the same ``LLMTask.build``: the run's parameters are the float32 adapters, the
  whole base the group's frozen argument. The state, from the same shapes (``eval_shape``), is the
  adapters, their gradients and Adam moments, the multipliers, and the frozen base; the
  activations are the compiled ``value_and_grad`` w.r.t. the adapters, with and without
  remat; the real step is compiled for the first rank as the cross-check. The base is
  stored in float32 in each precision (what the task loads), and in mixed precision also in
  bfloat16 (``--base-dtype bfloat16``): its bytes halve, and the compiled program changes
  only by the casts it no longer needs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

from benchmarks.common import (
    choice_list,
    number_flag,
    parse_quick,
    positive_float,
    positive_int,
    positive_int_list,
    print_table,
    subcommand_parser,
)
from benchmarks.memory_llm_shapes import (
    Program,
    StateBytes,
    batch_layout,
    build_program,
    compiled_temp,
    saved_residuals,
    sharded_temp,
    state_bytes,
    state_shapes,
    step_peak,
)
from cudt.errors import UsageError
from cudt.models.llama import DecoderConfig
from cudt.runner.mesh import mesh_shape

ROOT = Path(__file__).resolve().parents[1]
GB = 1e9
JAX_MEM_FRACTION = 0.75  # of a GPU's memory, what JAX's allocator takes unless told otherwise
PRECISIONS = {"float32": "float32", "mixed": "bfloat16"}  # label -> compute dtype


# --------------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------------


def llama31_8b(num_layers: int = 32) -> DecoderConfig:
    """Llama 3.1 8B's architecture (its ``config.json``), with ``num_layers`` blocks."""
    return DecoderConfig(
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_layers=num_layers,
        num_heads=32,
        num_kv_heads=8,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        rope_type="llama3",
        rope_factor=8.0,
        rope_low_freq_factor=1.0,
        rope_high_freq_factor=4.0,
        rope_original_max_positions=8192,
        max_position_embeddings=131072,
        tie_word_embeddings=False,
        bos_token_id=128000,
        eos_token_id=(128001, 128008, 128009),
    )


def tiny_config(num_layers: int) -> DecoderConfig:
    """A decoder of the same family small enough for the tests (``--quick``)."""
    return DecoderConfig(
        vocab_size=512,
        hidden_size=32,
        intermediate_size=64,
        num_layers=num_layers,
        num_heads=4,
        num_kv_heads=2,
        rope_type="llama3",
        rope_original_max_positions=64,
        max_position_embeddings=256,
    )


def decoder_config(args: argparse.Namespace, num_layers: int) -> DecoderConfig:
    return tiny_config(num_layers) if args.quick else llama31_8b(num_layers)


precision_list = choice_list(PRECISIONS, "precision")


def parse_args(argv=None) -> argparse.Namespace:
    p = subcommand_parser("python -m benchmarks memory llm", __doc__)
    number_flag(p, "--layers", 32, "blocks L of the table")
    p.add_argument(
        "--batch", type=positive_int, default=4, help="sequences per step (default 4, the paper's)"
    )
    number_flag(p, "--seq", 512, "tokens per sequence T")
    p.add_argument(
        "--chunk-tokens",
        type=positive_int,
        default=2048,
        help="layer_token_losses rows (default 2048, the least the task's own default takes)",
    )
    p.add_argument(
        "--vocab-chunk",
        type=positive_int,
        default=None,
        help="layer_token_losses vocabulary block (none)",
    )
    p.add_argument(
        "--train-embeddings",
        action="store_true",
        help="train the input embedding table too (the task freezes it by default)",
    )
    p.add_argument(
        "--precisions",
        type=precision_list,
        default=list(PRECISIONS),
        help="float32 and/or mixed (bf16 compute, float32 state); default float32,mixed",
    )
    number_flag(p, "--gpus", 8, "GPUs of the FSDP machine")
    p.add_argument(
        "--gpu-gb", type=positive_float, default=80.0, help="their memory, GB (default 80)"
    )
    p.add_argument("--h200-gb", type=positive_float, default=141.0, help="one H200's memory, GB")
    p.add_argument(
        "--lora-rank",
        type=positive_int_list,
        action="extend",
        default=[],
        help="add rows on one H200 for LoRA adapters of this rank (the task's --lora-rank; "
        "repeatable, or comma-separated: 8,32)",
    )
    args = parse_quick(
        p,
        argv,
        dict(layers=6, seq=16, chunk_tokens=32, gpus=4),
        "a tiny decoder (L 6, D 32, V 512, T 16) on 4 GPUs; fewer compiles",
    )
    for name in ("layers", "batch", "seq", "chunk_tokens", "gpus"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    for name in ("gpu_gb", "h200_gb"):
        if not getattr(args, name) > 0:
            raise UsageError(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    for rank in args.lora_rank:
        if rank < 1:
            raise UsageError(f"--lora-rank must be >= 1, got {rank}")
    if args.layers < 4:
        raise UsageError(
            f"--layers must be >= 4 (the slope is measured below it), got {args.layers}"
        )
    return args


def lora_variants(args: argparse.Namespace) -> list[tuple[str, str]]:
    """``(precision, base dtype)`` of the LoRA rows: the base in float32 in each precision (what
    the task loads), and in bfloat16 in mixed precision (``--base-dtype bfloat16``)."""
    out = [(p, "float32") for p in args.precisions]
    return out + ([("mixed", "bfloat16")] if "mixed" in args.precisions else [])


@dataclasses.dataclass(frozen=True)
class Setup:
    """A machine and how one run's state is laid out on it."""

    label: str
    shards: int  # ways the run's state is split (FSDP over that many devices); 1: one device
    capacity_gb: float


def setups(args: argparse.Namespace) -> list[Setup]:
    """FSDP over every GPU; FSDP as cudt's runner lays it out for this batch; one H200."""
    gpus, gb = args.gpus, f"{args.gpu_gb:g} GB"
    out = []
    if gpus > 1:
        out.append(Setup(f"{gpus} x {gb}, FSDP {gpus}", gpus, args.gpu_gb))
        data = mesh_shape(gpus, 1, args.batch)[1]  # the runner's data axis for one run
        if 1 < data < gpus:
            out.append(Setup(f"{gpus} x {gb}, cudt runner (FSDP {data})", data, args.gpu_gb))
    out.append(Setup(f"1 x H200 {args.h200_gb:g} GB", 1, args.h200_gb))
    return out


def first_depth(args: argparse.Namespace) -> int:
    """The smallest L >= 2 at which ``layer_token_losses`` holds full ``chunk_tokens`` blocks
    (``(L+1)·B·T >= chunk_tokens``); below it the logits block grows with L."""
    return max(2, math.ceil(args.chunk_tokens / (args.batch * args.seq)) - 1)


# --------------------------------------------------------------------------------------------------
# The sharded compiles run in a subprocess with forced CPU devices
# --------------------------------------------------------------------------------------------------


def item_key(item: dict[str, Any]) -> tuple:
    """A compile item's key in the table's dictionaries: ``(precision, shards, depth, remat)``,
    and ``(lora rank, base dtype)`` after them for a LoRA item."""
    key = (item["precision"], item["shards"], item["depth"], item["remat"])
    return key + ((item["lora"], item["base"]) if item.get("lora") else ())


def _job_args(args: argparse.Namespace) -> dict[str, Any]:
    keys = ("quick", "batch", "seq", "chunk_tokens", "vocab_chunk", "train_embeddings")
    return {k: getattr(args, k) for k in keys}


def start_sharded(args: argparse.Namespace, items: list[dict[str, Any]]) -> subprocess.Popen | None:
    """Starts the subprocess compiling ``items`` (``{precision, shards, depth, remat}``; sharded
    when ``shards > 1``): it needs ``max(shards)`` devices, so it runs on forced CPU devices."""
    if not items:
        return None
    devices = max(item["shards"] for item in items)
    env = dict(os.environ)
    env["XLA_FLAGS"] = (
        env.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={devices}"
    ).strip()
    env["JAX_PLATFORMS"] = "cpu"
    job = json.dumps({"args": _job_args(args), "items": items})
    errors = tempfile.TemporaryFile(mode="w+")  # XLA's warnings may outgrow a pipe
    proc = subprocess.Popen(
        [sys.executable, "-c", "from benchmarks.memory_llm import worker; worker()", job],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=errors,
        text=True,
    )
    proc.errors = errors  # Popen keeps no handle on a file it was given (proc.stderr is None)
    return proc


def finish_sharded(proc: subprocess.Popen | None) -> dict[tuple, int]:
    """``{item_key: temp bytes}`` from the subprocess's JSON lines."""
    if proc is None:
        return {}
    out = proc.stdout.read()
    with proc.errors as errors:
        if proc.wait() != 0:
            errors.seek(0)
            tail = "\n".join(errors.read().strip().splitlines()[-15:])
            raise RuntimeError(f"the sharded-compile subprocess failed:\n{tail}")
    results = {}
    for line in out.splitlines():
        item = json.loads(line)
        results[item_key(item)] = item["temp"]
    return results


def temp_of(args: argparse.Namespace, item: dict[str, Any]) -> int:
    """Scratch bytes of one compile item ``{precision, shards, depth, remat}`` (and ``lora``,
    ``base``: a LoRA program)."""
    program = build_program(
        args,
        decoder_config(args, item["depth"]),
        PRECISIONS[item["precision"]],
        item["remat"],
        item.get("lora"),
        item.get("base", "float32"),
    )
    if item["shards"] == 1:
        return compiled_temp(program)
    return sharded_temp(program, item["shards"])


def worker() -> None:
    """The subprocess: ``{args, items}`` as JSON in ``sys.argv[1]``; one JSON line per item."""
    job = json.loads(sys.argv[1])
    args = argparse.Namespace(**job["args"])
    for item in job["items"]:
        print(json.dumps({**item, "temp": temp_of(args, item)}), flush=True)


# --------------------------------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------------------------------


def gb(nbytes: float) -> float:
    return nbytes / GB


@dataclasses.dataclass
class Plan:
    """What :func:`run` compiles: ``here`` in this process (one device), ``there`` in the
    subprocess (the sharded items, and one-device ones to share the work)."""

    depth: int  # --layers: the table's depth
    low: int  # the slope's first depth (:func:`first_depth`)
    measured: list[int]  # the depths of the activation table's line
    machines: list[Setup]
    here: list[dict[str, Any]]
    there: list[dict[str, Any]]


def plan(args: argparse.Namespace, on_cpu: bool) -> Plan:
    depth, low = args.layers, first_depth(args)
    if low + 1 >= depth:
        raise UsageError(f"--layers {depth} must exceed {low + 1}, the depths of the slope")
    machines = setups(args)
    measured = ([] if args.quick else [1]) + [low, low + 1]  # --quick: fewer compiles
    # (depth, remat): the line's depths, then the full depth without and with block remat
    here = [
        {"precision": p, "shards": 1, "depth": d, "remat": r}
        for p in args.precisions
        for d, r in (*((d, False) for d in measured), (depth, False), (depth, True))
    ]
    here += [  # LoRA: one device, the full depth, without and with remat
        {"precision": p, "shards": 1, "depth": depth, "remat": r, "lora": rank, "base": b}
        for rank in args.lora_rank
        for p, b in lora_variants(args)
        for r in (False, True)
    ]
    there = [
        {"precision": p, "shards": s.shards, "depth": d, "remat": r}
        for s in machines
        if s.shards > 1
        for p in args.precisions
        for d, r in ((low, False), (depth, False), (depth, True))
    ]
    # The subprocess compiles on the other core meanwhile: the sharded programs, and one-device
    # ones until both have about as many (this process also compiles the step).
    while on_cpu and len(there) < len(here) + 1:
        there.append(here.pop(0))
    return Plan(depth, low, measured, machines, here, there)


@dataclasses.dataclass
class Measured:
    """Everything the report prints from: state bytes from shapes, compiled scratch, the real
    steps' peaks and the per-layer saved residuals."""

    states: dict[int, StateBytes]  # shards: the full fine-tuning state per device
    lora_states: dict[tuple[int, str], StateBytes]  # (rank, base dtype): one device
    temps: dict[tuple, int]  # item_key: scratch bytes
    check: dict[str, int]  # the real step's compiled memory (the first precision)
    lora_check: tuple[tuple[int, str, str], dict[str, int]] | None  # (rank, precision, base)
    residuals: dict[str, dict[str, int]]  # precision: per layer (the slope's two depths)
    lora_residuals: dict[tuple[int, str], dict[str, int]]  # (rank, precision): per layer


def _print_decoder(args: argparse.Namespace, depth: int) -> None:
    config = decoder_config(args, depth)
    print(
        f"decoder: V {config.vocab_size}, D {config.hidden_size}, F {config.intermediate_size}, "
        f"H {config.num_heads} (kv {config.num_kv_heads}), Dh {config.head_dim}, L {depth}, "
        f"untied, rope {config.rope_type}; batch {args.batch} x {args.seq} tokens; "
        f"layer_token_losses chunk_tokens {args.chunk_tokens}, vocab_chunk {args.vocab_chunk}; "
        f"input embeddings {'trained' if args.train_embeddings else 'frozen (the task default)'}"
    )
    print(
        f"compiled for: {jax.devices()[0].platform} (one device; a subprocess compiles on "
        "forced CPU devices)"
    )


def _full_states(args: argparse.Namespace, p: Plan) -> tuple[Program, dict[int, StateBytes]]:
    """The full fine-tuning program at the table's depth (the first precision: the state is
    float32 in either) and its state bytes per device of each machine; printed."""
    program = build_program(args, decoder_config(args, p.depth), PRECISIONS[args.precisions[0]])
    shapes = state_shapes(program)
    states = {s.shards: state_bytes(program, shapes, s.shards) for s in p.machines}
    n_train = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(program.params))
    frozen = program.batch.frozen
    n_frozen = 0 if frozen is None else int(np.prod(frozen.shape))
    print(
        f"\nparameters: {n_train + n_frozen:,} ({n_train:,} trained, {n_frozen:,} in the frozen "
        "embedding table); the state is float32 in both precisions (mixed precision casts "
        "each layer to bfloat16 inside the scan; gradients and Adam moments stay float32)"
    )
    print("state bytes per device (jax.eval_shape of the step's init and of the value_and_grad):")
    print_table(
        ["shards", "params GB", "frozen GB", "grads GB", "Adam GB", "duals B", "multipliers B"],
        [
            [k, gb(st.params), gb(st.frozen), gb(st.grads), gb(st.adam), st.duals, st.multipliers]
            for k, st in states.items()
        ],
    )
    return program, states


def _lora_states(
    args: argparse.Namespace, depth: int
) -> tuple[dict[tuple[int, str, str], Program], dict[tuple[int, str], StateBytes]]:
    """The LoRA programs at the table's depth, ``(rank, precision, base dtype)``, and their
    state bytes on one device, ``(rank, base dtype)``; printed."""
    programs: dict[tuple[int, str, str], Program] = {}
    states: dict[tuple[int, str], StateBytes] = {}
    for rank in args.lora_rank:
        for p, b in lora_variants(args):
            program = build_program(
                args, decoder_config(args, depth), PRECISIONS[p], lora_rank=rank, base_dtype=b
            )
            programs[rank, p, b] = program
            if (rank, b) not in states:  # the state is the same in either precision
                states[rank, b] = state_bytes(program, state_shapes(program), 1)
    if states:
        print(
            "LoRA state bytes on one device (the same eval_shapes; trained: the float32 "
            "adapters; frozen: the whole base, in its dtype):"
        )
        print_table(
            ["rank", "base", "adapters B", "frozen base B", "grads B", "Adam B", "duals B"],
            [
                [rank, b, st.params, st.frozen, st.grads, st.adam, st.duals]
                for (rank, b), st in states.items()
            ],
        )
    return programs, states


def _residuals_per_layer(
    args: argparse.Namespace, low: int, precision: str, lora_rank: int | None = None
) -> dict[str, int]:
    """Saved residuals at ``low + 1`` blocks less those at ``low``: one block's."""
    at = [
        saved_residuals(
            build_program(args, decoder_config(args, d), PRECISIONS[precision], lora_rank=lora_rank)
        )
        for d in (low, low + 1)
    ]
    return {k: at[1][k] - at[0][k] for k in at[0]}


def measure(args: argparse.Namespace, p: Plan, t0: float) -> Measured:
    """Compiles ``p.here`` while the subprocess compiles ``p.there``; the real steps' peaks and
    the saved residuals meanwhile. Prints the state tables and the progress."""
    proc = start_sharded(args, p.there)
    _print_decoder(args, p.depth)
    full, states = _full_states(args, p)
    lora_programs, lora_states = _lora_states(args, p.depth)
    temps = {item_key(item): temp_of(args, item) for item in p.here}
    print(f"  {len(p.here)} compiles here done ({time.perf_counter() - t0:.0f}s)", flush=True)
    check = step_peak(full)
    lora_check = None
    if args.lora_rank:  # the real LoRA step: the first rank, the last variant
        key = (args.lora_rank[0], *lora_variants(args)[-1])
        lora_check = key, step_peak(lora_programs[key])
    residuals = {q: _residuals_per_layer(args, p.low, q) for q in args.precisions}
    lora_residuals = {  # the float32 base's LoRA program, per layer
        (rank, q): _residuals_per_layer(args, p.low, q, rank)
        for rank in args.lora_rank
        for q in args.precisions
    }
    temps.update(finish_sharded(proc))
    print(f"  {len(p.there)} compiles in the subprocess done ({time.perf_counter() - t0:.0f}s)")
    return Measured(states, lora_states, temps, check, lora_check, residuals, lora_residuals)


def _print_activations(args: argparse.Namespace, p: Plan, temps: dict) -> dict[str, int]:
    """The one-device activation table: the measured depths, their line and the direct
    compile; returns the slope per layer of each precision."""
    depth, low = p.depth, p.low
    print(
        f"\nactivations on one device: XLA temp of the compiled value_and_grad, batch {args.batch}"
    )
    slopes, rows = {}, []
    for q in args.precisions:
        slopes[q] = temps[q, 1, low + 1, False] - temps[q, 1, low, False]
        line = temps[q, 1, low, False] + (depth - low) * slopes[q]
        rows.append(
            [
                q,
                *(gb(temps[q, 1, d, False]) for d in p.measured),
                gb(slopes[q]),
                gb(line),
                gb(temps[q, 1, depth, False]),
                gb(temps[q, 1, depth, True]),
            ]
        )
    print_table(
        [
            "precision",
            *(f"L={d} GB" for d in p.measured),
            f"slope L={low}-{low + 1} GB/layer",
            f"line at L={depth} GB",
            f"compiled L={depth} GB",
            f"compiled L={depth}, remat GB",
        ],
        rows,
    )
    for q in args.precisions:
        line = temps[q, 1, low, False] + (depth - low) * slopes[q]
        print(
            f"ratio {q}: extrapolated from L={low},{low + 1} / compiled at L={depth} = "
            f"{line / temps[q, 1, depth, False]:.4g}"
        )
        if 1 in p.measured and low == 2:
            line_12 = temps[q, 1, 1, False] + (depth - 1) * (
                temps[q, 1, 2, False] - temps[q, 1, 1, False]
            )
            print(
                f"ratio {q}: extrapolated from L=1,2 / compiled at L={depth} = "
                f"{line_12 / temps[q, 1, depth, False]:.4g}"
            )
    print(
        "(the table uses the direct compile: the blocks are one lax.scan, so compiling at "
        f"L={depth} costs what L=2 does."
        + (
            " L = 1 lies off the line: XLA removes a while loop that runs once."
            if 1 in p.measured
            else ""
        )
        + f" Below L = {low} the loss's logits block [chunk_tokens, V] still grows with L.)"
    )
    return slopes


def _print_residuals(args: argparse.Namespace, m: Measured, slopes: dict[str, int]) -> None:
    print(
        f"\nper layer, batch {args.batch}: saved residuals (jax.ad_checkpoint."
        "print_saved_residuals, besides the arguments; platform-independent) vs the compiled slope"
    )
    print_table(
        ["precision", "residuals GB/layer", "of which weight copies GB", "compiled slope GB/layer"],
        [
            [q, gb(m.residuals[q]["total"]), gb(m.residuals[q]["weight copies"]), gb(slopes[q])]
            for q in args.precisions
        ]
        + [
            [f"{q}, LoRA r {rank}", gb(r["total"]), gb(r["weight copies"]), "-"]
            for (rank, q), r in m.lora_residuals.items()
        ],
    )
    if m.lora_residuals:
        print(
            "(LoRA: the blocks' policy, dots_with_no_batch_dims_saveable, saves every dot's "
            "output: each adapted projection's x W and also its adapter's (x A)(s B), "
            "[B, T, out] too)"
        )


def _print_checks(args: argparse.Namespace, p: Plan, m: Measured) -> None:
    """The real jitted steps' compiled peaks against the table's totals."""
    base = args.precisions[0]
    table_total = m.states[1].total + m.temps[base, 1, p.depth, False]
    print(
        f"\ncheck: the jitted constrained step ({base}, one device, L={p.depth}, state donated) "
        "compiled: " + ", ".join(f"{k} {gb(v):.4g} GB" for k, v in m.check.items())
    )
    print(
        f"ratio step peak / table total (params + frozen + grads + Adam + duals + activations) = "
        f"{m.check['peak'] / table_total:.6g}"
    )
    if m.lora_check is not None:
        (rank, q, b), lora_check = m.lora_check
        lora_total = m.lora_states[rank, b].total + m.temps[q, 1, p.depth, False, rank, b]
        print(
            f"check: the jitted LoRA step (rank {rank}, {q}, base {b}, one device, L={p.depth}) "
            "compiled: " + ", ".join(f"{k} {gb(v):.4g} GB" for k, v in lora_check.items())
        )
        print(
            f"ratio LoRA step peak / table total (adapters + frozen base + grads + Adam + duals "
            f"+ activations) = {lora_check['peak'] / lora_total:.6g}"
        )


def _print_sharded(args: argparse.Namespace, p: Plan, temps: dict) -> None:
    sharded = [s for s in p.machines if s.shards > 1]
    if not sharded:
        return
    print(
        "\nactivations per device under FSDP: XLA temp of the value_and_grad compiled over "
        "forced CPU devices"
    )
    print_table(
        [
            "setup",
            "batch split",
            "state split",
            "precision",
            f"L={p.low} GB",
            f"L={p.depth} GB",
            f"L={p.depth}, remat GB",
        ],
        [
            [
                s.label,
                batch_layout(s.shards, args.batch)[0],
                s.shards,
                q,
                gb(temps[q, s.shards, p.low, False]),
                gb(temps[q, s.shards, p.depth, False]),
                gb(temps[q, s.shards, p.depth, True]),
            ]
            for s in sharded
            for q in args.precisions
        ],
    )


_TABLE_COLUMNS = [
    "setup",
    "precision",
    "params GB",
    "grads GB",
    "Adam μ,ν GB",
    "multipliers",
    "activations GB",
    "total GB",
    "fits",
    "activations, remat GB",
    "total, remat GB",
    "fits, remat",
]


def _table_row(
    label: str, precision: str, st: StateBytes, temps: dict, key: tuple, capacity_gb: float
) -> str:
    """One row of the Markdown table: ``temps[key]`` the activations without remat, ``key``
    with remat True the ones with it (``key``: an :func:`item_key` with ``remat`` False)."""
    cap = capacity_gb * GB
    activations = temps[key]
    activations_rm = temps[(*key[:3], True, *key[4:])]
    total = st.total + activations
    total_rm = st.total + activations_rm
    mark = "†" if precision.startswith("mixed") and jax.devices()[0].platform == "cpu" else ""
    cells = [
        label,
        precision,
        f"{gb(st.params + st.frozen):.4g}",
        f"{gb(st.grads):.4g}",
        f"{gb(st.adam):.4g}",
        f"{st.multipliers} B (+{st.duals - st.multipliers} B duals)",
        f"{gb(activations):.4g}{mark}",
        f"{gb(total):.4g}",
        fits(total, cap),
        f"{gb(activations_rm):.4g}{mark}",
        f"{gb(total_rm):.4g}",
        fits(total_rm, cap),
    ]
    return "| " + " | ".join(cells) + " |"


def fits(total: float, capacity: float) -> str:
    """The "fits" cell of ``total`` bytes on a device of ``capacity``: "yes" within the share
    JAX takes by default (:data:`JAX_MEM_FRACTION`); within the device, the
    ``XLA_PYTHON_CLIENT_MEM_FRACTION`` it needs (a plain "yes" there was an out-of-memory
    error at JAX's defaults; found by review); else "no". The share of the device in brackets."""
    share = total / capacity
    if share <= JAX_MEM_FRACTION:
        return f"yes ({100 * share:.0f}%)"
    if share <= 1:
        return f"with XLA_PYTHON_CLIENT_MEM_FRACTION={math.ceil(100 * share) / 100:.2f} ({100 * share:.0f}%)"
    return f"no ({100 * share:.0f}%)"


def _print_table(args: argparse.Namespace, p: Plan, m: Measured) -> None:
    """The Markdown table: every machine and precision, then the LoRA rows on one H200."""
    print(
        f"\n## Memory per device: {'a tiny decoder' if args.quick else 'Llama 3.1 8B'}, cudt "
        f"constrained step, batch {args.batch} x {args.seq} tokens\n"
    )
    print("| " + " | ".join(_TABLE_COLUMNS) + " |")
    print("|" + "|".join("---" for _ in _TABLE_COLUMNS) + "|")
    for setup in p.machines:
        for q in args.precisions:
            key = (q, setup.shards, p.depth, False)
            print(
                _table_row(setup.label, q, m.states[setup.shards], m.temps, key, setup.capacity_gb)
            )
    h200 = p.machines[-1]
    for rank in args.lora_rank:
        for q, b in lora_variants(args):
            label = f"{h200.label}, LoRA r {rank}"
            precision = q if b == "float32" else f"{q}, bf16 base"
            key = (q, 1, p.depth, False, rank, b)
            print(
                _table_row(label, precision, m.lora_states[rank, b], m.temps, key, h200.capacity_gb)
            )


def _print_notes(args: argparse.Namespace, p: Plan, m: Measured, slopes: dict[str, int]) -> None:
    """The table's legend, and what the CPU's compiles say about mixed precision."""
    on_cpu = jax.devices()[0].platform == "cpu"
    print(
        "\nGB = 1e9 bytes; capacities are the nominal ones, of which JAX takes 75% unless "
        "XLA_PYTHON_CLIENT_MEM_FRACTION says otherwise (fits: yes within 75%, else the fraction "
        "to set). params: the trained parameters, split "
        "as --fsdp splits them, plus the frozen input embedding table, whole on every device "
        "(the runner replicates frozen tables). Adam: mu, nu (and its count and injected "
        "learning rate). multipliers: the [L+1] float32 λ (LoRA, whose reference constraint reads "
        "block 1: [L]); duals: the dual optimiser's state, "
        "slacks and the per-run hyperparameters. activations: XLA temp of the compiled "
        "value_and_grad at the per-device batch (under FSDP: the sharded program, gathered "
        "weights and unreduced gradients included). remat: the same program compiled with every "
        "decoder block rematerialised in the backward pass (Decoder(remat=True), the task's "
        "--remat: jax.checkpoint with nothing_saveable around each block of the scan)."
    )
    if args.lora_rank:
        print(
            "LoRA r: the task's --lora-rank r (alpha 2r, q, k, v, o, gate, up, down of every "
            "block): params are the float32 adapters plus the whole frozen base, in float32 "
            "unless 'bf16 base' (--base-dtype bfloat16); grads and Adam are the adapters'. "
            "activations: the value_and_grad w.r.t. the adapters, the base an argument."
        )
    if "mixed" in args.precisions and on_cpu:
        mixed = m.residuals["mixed"]
        has_f32 = "float32" in args.precisions
        f32_slope = f" (float32: {gb(slopes['float32']):.3g})" if has_f32 else ""
        f32_saved = f" (float32: {gb(m.residuals['float32']['total']):.3g} GB)" if has_f32 else ""
        print(
            "† compiled for the CPU: XLA:CPU computes bfloat16 matmuls in float32 and holds many "
            "bfloat16 values in float32-sized buffers. Its mixed-precision slope is "
            f"{gb(slopes['mixed']):.3g} GB/layer{f32_slope}, while autodiff saves "
            f"{gb(mixed['total']):.3g} GB per layer in mixed precision{f32_saved}, of which "
            f"{gb(mixed['weight copies']):.3g} GB are the bfloat16 copies of the layer's weights "
            "cast inside the scan. On a GPU the † figures are likely upper bounds."
        )
    bf16_bases = [(r, q) for r in args.lora_rank for q, b in lora_variants(args) if b == "bfloat16"]
    if on_cpu and bf16_bases:
        copy = m.states[1].params  # float32 bytes of what the base's dots read: blocks, norms, head
        for rank, q in bf16_bases:
            with_bf16 = m.temps[q, 1, p.depth, False, rank, "bfloat16"]
            extra = with_bf16 - m.temps[q, 1, p.depth, False, rank, "float32"]
            total = m.lora_states[rank, "bfloat16"].total + with_bf16
            print(
                f"bf16 base on the CPU, LoRA r {rank}: its activations exceed the float32 base's "
                f"by {gb(extra):.4g} GB, {extra / copy:.4g} x the float32 bytes of the base's "
                f"weights but the embedding table ({gb(copy):.4g} GB): XLA:CPU, without "
                "bfloat16 dots, converts each stacked bfloat16 kernel to float32 once, outside "
                f"the scan; less that copy the total is {gb(total - extra):.4g} GB (arithmetic, "
                "not compiled)."
            )


def run(args: argparse.Namespace) -> None:
    """Measures (:func:`measure`), then prints the tables, the checks and the Markdown table."""
    t0 = time.perf_counter()
    p = plan(args, on_cpu=jax.devices()[0].platform == "cpu")
    m = measure(args, p, t0)
    slopes = _print_activations(args, p, m.temps)
    _print_residuals(args, m, slopes)
    _print_checks(args, p, m)
    _print_sharded(args, p, m.temps)
    _print_table(args, p, m)
    _print_notes(args, p, m, slopes)
    print(f"total wall {time.perf_counter() - t0:.0f}s")
