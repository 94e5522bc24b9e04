"""``python -m benchmarks memory``: memory from XLA's compiler, nothing run at full size.

    .venv/bin/python -m benchmarks memory                 # both sections, their defaults
    .venv/bin/python -m benchmarks memory lm-loss [flags] # the per-layer LM losses
    .venv/bin/python -m benchmarks memory llm [flags]     # fine-tuning Llama 3.1 8B
    .venv/bin/python -m benchmarks memory --quick         # both, tiny sizes (the tests)

``lm-loss``: every layer's full logits vs :mod:`cudt.lm_loss`'s chunks. A decoder's states
``[L+1, B, T, D]`` are read out by an RMS norm (with a scale parameter) and a head ``[D, V]``;
the per-sample per-layer token cross-entropy ``[B, L+1]`` is computed three ways:

* ``naive``: ``naive_layer_token_losses``, the ``[L+1, B, T, V]`` float32 logits at once;
* ``chunked``: ``layer_token_losses(chunk_tokens=--chunk-tokens)``, ``[chunk, V]`` at a time;
* ``chunked+vocab``: the same with ``vocab_chunk=--vocab-chunk`` too (online log-sum-exp).

For every vocabulary size (``--vocab``) and depth (``--depths``, L+1) at a fixed small batch
``--batch x --seq``, the forward + backward program, ``jax.jit(jax.value_and_grad(...))`` w.r.t.
the states, the head and the norm scale, is compiled (never run) and its
``memory_analysis().temp_size_in_bytes`` printed: XLA's peak scratch memory, besides the
arguments and the outputs. The ``logits`` column is the size of one ``[L+1, B, T, V]`` float32
array. At one mid size (``--time-vocab``, ``--time-depth``) the three compiled programs are
compared (equal work: losses and gradients against the naive ones) and run interleaved over
``--repeats`` repetitions (medians).

``llm``: memory per device to fine-tune Llama 3.1 8B with the LLM task's step
(``benchmarks/memory_llm.py``; ``memory llm --help``).
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import (
    header,
    max_abs_diff,
    number_flag,
    parse_quick,
    positive_int,
    positive_int_list,
    print_table,
    subcommand_parser,
    time_alternatives,
)
from cudt.lm_loss import layer_token_losses, naive_layer_token_losses

MIB = 2**20


# --quick: tiny sizes for the tests
QUICK = dict(
    vocab=[1024],
    depths=[3],
    batch=1,
    seq=16,
    dim=16,
    chunk_tokens=8,
    vocab_chunk=128,
    time_vocab=1024,
    time_depth=3,
    repeats=1,
)


def parse_args(argv=None) -> argparse.Namespace:
    p = subcommand_parser("python -m benchmarks memory lm-loss", __doc__)
    p.add_argument(
        "--vocab",
        type=positive_int_list,
        default=[8192, 32768, 131072],
        help="default 8192,32768,131072",
    )
    p.add_argument(
        "--depths", type=positive_int_list, default=[5, 17, 33], help="L+1; default 5,17,33"
    )
    number_flag(p, "--batch", 2, "sequences B")
    number_flag(p, "--seq", 64, "tokens per sequence T")
    number_flag(p, "--dim", 128, "model width D")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument(
        "--chunk-tokens", type=int, default=512, help="rows per chunk (default 512, the library's)"
    )
    number_flag(p, "--vocab-chunk", 8192, "vocabulary block")
    p.add_argument("--time-vocab", type=positive_int, default=32768, help="V of the timed size")
    p.add_argument("--time-depth", type=positive_int, default=17, help="L+1 of the timed size")
    number_flag(p, "--repeats", 5, "interleaved repetitions")
    return parse_quick(p, argv, QUICK, "tiny sizes for the tests (V 1024, L+1 3)")


def rms_norm(x: jax.Array, scale: jax.Array) -> jax.Array:
    """``[..., D] -> [..., D]``: Llama's final norm."""
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + 1e-6)
    return (normed * scale.astype(jnp.float32)).astype(x.dtype)


def value_and_grad_program(fn: Callable) -> Callable:
    """``(states, head, scale, labels, mask) -> ((Σ ce, (ce, acc)), grads)``, jitted."""

    def loss(states, head, scale, labels, mask):
        ce, acc = fn(states, lambda x: rms_norm(x, scale), head, labels, mask)
        return jnp.sum(ce), (ce, acc)

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))


def ways(args: argparse.Namespace) -> dict[str, Callable]:
    chunked = functools.partial(layer_token_losses, chunk_tokens=args.chunk_tokens)
    return {
        "naive": value_and_grad_program(naive_layer_token_losses),
        "chunked": value_and_grad_program(chunked),
        "chunked+vocab": value_and_grad_program(
            functools.partial(chunked, vocab_chunk=args.vocab_chunk)
        ),
    }


def specs(args: argparse.Namespace, depth: int, vocab: int) -> tuple:
    dtype = jnp.dtype(args.dtype)
    s = jax.ShapeDtypeStruct
    return (
        s((depth, args.batch, args.seq, args.dim), dtype),
        s((args.dim, vocab), dtype),
        s((args.dim,), dtype),
        s((args.batch, args.seq), jnp.int32),
        s((args.batch, args.seq), jnp.float32),
    )


def inputs(args: argparse.Namespace, depth: int, vocab: int) -> tuple:
    """Random states and head, labels everywhere, the first quarter of each sequence a prompt."""
    dtype = jnp.dtype(args.dtype)
    ks = jax.random.split(jax.random.key(0), 3)
    states = jax.random.normal(ks[0], (depth, args.batch, args.seq, args.dim), dtype)
    head = (jax.random.normal(ks[1], (args.dim, vocab)) / np.sqrt(args.dim)).astype(dtype)
    labels = jax.random.randint(ks[2], (args.batch, args.seq), 0, vocab)
    mask = jnp.broadcast_to(jnp.arange(args.seq) >= args.seq // 4, (args.batch, args.seq))
    return states, head, jnp.ones((args.dim,), dtype), labels, mask.astype(jnp.float32)


def _compiled_grid(
    args: argparse.Namespace, programs: dict[str, Any], t_total: float
) -> tuple[dict[str, Any], list[str]]:
    """Every way compiled at every ``(V, L+1)`` of the grid, its scratch printed as a table;
    returns the timed size's executables (none when the grid lacks it) and the ratio lines."""
    tokens = args.batch * args.seq
    timed_size = (args.time_vocab, args.time_depth)
    compiled = {}  # the timed size's programs, when the grid has it
    rows, ratios = [], []
    for vocab in args.vocab:
        for depth in args.depths:
            temp = {}
            for name, program in programs.items():
                executable = program.lower(*specs(args, depth, vocab)).compile()
                temp[name] = executable.memory_analysis().temp_size_in_bytes
                if (vocab, depth) == timed_size:
                    compiled[name] = executable
            logits = depth * tokens * vocab * 4
            rows.append(
                [
                    vocab,
                    depth,
                    logits / MIB,
                    temp["naive"] / MIB,
                    temp["chunked"] / MIB,
                    temp["chunked+vocab"] / MIB,
                    temp["naive"] / temp["chunked"],
                    temp["naive"] / temp["chunked+vocab"],
                ]
            )
            for name in ("chunked", "chunked+vocab"):
                ratios.append(
                    f"ratio V={vocab} L+1={depth}: naive / {name} temp memory = "
                    f"{temp['naive'] / temp[name]:.3g}"
                )
        print(f"  V = {vocab} compiled ({time.perf_counter() - t_total:.0f}s)", flush=True)
    print(
        "\ntemp MiB: memory_analysis().temp_size_in_bytes of the compiled value_and_grad "
        "(compiled, not run); logits MiB: one [L+1, B, T, V] float32 array"
    )
    print_table(
        [
            "V",
            "L+1",
            "logits MiB",
            "naive MiB",
            "chunked MiB",
            "chunked+vocab MiB",
            "naive / chunked",
            "naive / chunked+vocab",
        ],
        rows,
    )
    return compiled, ratios


def _print_equal_work(compiled: dict[str, Any], data, vocab: int, depth: int) -> None:
    """Every way's losses, accuracies and gradients against the naive way's."""
    results = {name: jax.block_until_ready(c(*data)) for name, c in compiled.items()}
    (_, (ce, acc)), grads = results["naive"]
    print(f"\nequal work at V = {vocab}, L+1 = {depth} (max abs difference to naive):")
    checks = []
    for name in ("chunked", "chunked+vocab"):
        (_, (ce_c, acc_c)), grads_c = results[name]
        checks.append(
            [
                name,
                max_abs_diff(ce_c, ce),
                max_abs_diff(acc_c, acc),
                max_abs_diff(grads_c[0], grads[0]),
                max_abs_diff(grads_c[1], grads[1]),
                max_abs_diff(grads_c[2], grads[2]),
            ]
        )
    print_table(["way", "ce", "acc", "d states", "d head", "d scale"], checks)
    print(f"(mean ce over samples and layers: {float(jnp.mean(ce)):.4g})")


def _print_timing(
    args: argparse.Namespace, compiled: dict[str, Any], data, ratios: list[str]
) -> None:
    """The ways' calls timed in interleaved repetitions; the ratio lines."""
    vocab, depth = args.time_vocab, args.time_depth

    def timed(c: Callable) -> Callable[[], float]:
        def measure() -> float:
            t0 = time.perf_counter()
            jax.block_until_ready(c(*data))
            return time.perf_counter() - t0

        return measure

    print(f"\ntiming at V = {vocab}, L+1 = {depth}: {args.repeats} interleaved repetitions")
    seconds = time_alternatives({n: timed(c) for n, c in compiled.items()}, args.repeats)
    print(f"\nms per value_and_grad call, medians over {args.repeats} repetitions")
    print_table(
        ["way", "ms/call", "this / naive"],
        [[n, 1e3 * s, s / seconds["naive"]] for n, s in seconds.items()],
    )
    for line in ratios:
        print(line)
    for name in ("chunked", "chunked+vocab"):
        print(
            f"ratio V={vocab} L+1={depth}: {name} / naive time = "
            f"{seconds[name] / seconds['naive']:.3g}"
        )


def run(args: argparse.Namespace) -> None:
    t_total = time.perf_counter()
    print(
        f"per-layer token cross-entropy [B, L+1] and its gradient w.r.t. states, head, norm "
        f"scale; B x T = {args.batch} x {args.seq}, D = {args.dim}, {args.dtype}; chunked: "
        f"chunk_tokens {args.chunk_tokens}, chunked+vocab: also vocab_chunk {args.vocab_chunk}"
    )
    programs = ways(args)
    compiled, ratios = _compiled_grid(args, programs, t_total)
    vocab, depth = args.time_vocab, args.time_depth
    data = inputs(args, depth, vocab)
    if not compiled:
        compiled = {name: p.lower(*data).compile() for name, p in programs.items()}
    _print_equal_work(compiled, data, vocab, depth)
    _print_timing(args, compiled, data, ratios)
    print(f"total wall {time.perf_counter() - t_total:.0f}s")


SECTIONS = ("lm-loss", "llm")


def main(argv=None) -> int:
    """``memory [lm-loss|llm] [flags]``: one section with its flags, or both (``--quick`` the
    only flag then)."""
    argv = list(argv or [])
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    if argv and argv[0] in SECTIONS:
        sections, rest = [argv[0]], argv[1:]
    elif all(a == "--quick" for a in argv):
        sections, rest = list(SECTIONS), argv
    else:
        print(
            "error: memory takes a section (lm-loss or llm) before its flags, or only --quick",
            file=sys.stderr,
        )
        return 2
    from benchmarks import memory_llm

    # every section's flags checked before anything is printed or measured
    runs = {"lm-loss": (run, parse_args), "llm": (memory_llm.run, memory_llm.parse_args)}
    parsed = [(section, runs[section][1](rest)) for section in sections]
    header("memory", argv)
    for section, args in parsed:
        print(f"\n=== memory {section} ===", flush=True)
        runs[section][0](args)
    return 0
