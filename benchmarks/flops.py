"""FLOP/s of the cudt step against this machine's measured float32 matmul rate.

Run from the repository root:

    .venv/bin/python -m benchmarks.flops                    # UT-5 and DUST-5, batch 32; ~1 min

For the constrained step of the video setting (``VIDEO`` in ``benchmarks/_common.py``: forward
through every layer, per-layer MSE, backward, Adam, dual ascent, and for the UT the eigenvalue
clipping), jitted on jax's default device:

* FLOPs per step from XLA: ``jax.jit(step).lower(...).compile().cost_analysis()['flops']``.
  XLA's cost analysis counts a ``while`` loop's body ONCE, whatever its trip count, and the
  models run their L layers in a ``jax.lax.scan`` (a while loop): the step "as compiled"
  is therefore undercounted by about (L−1) layers. The script also lowers the same step with
  every ``jax.lax.scan`` call fully unrolled (``unroll=True``, only for the count) and uses
  that count for the FLOP/s. XLA also counts a ``lax.cond``'s costly branch whether it runs
  or not: the UT's default clipping (a Lanczos deflation whose Newton–Schulz fallback, about
  0.9 GFLOP, does not run in this training) would be overcounted, so the UT's FLOPs are
  counted on the same step with ``ut_project(method="eigh")`` (a LAPACK custom call, counted
  as 0: the count leaves out the clipping's own work, about 30 MFLOP of matrix-vector and
  ``n x 64`` products, under 1.5 % of the step); the timed program is the default one.
* Seconds per step: the jitted (rolled) step, state donated, same batch and key every step.
* The reference rate: a float32 ``jnp.dot`` of two ``--matmul-size`` square matrices (2n³
  FLOPs; XLA's own count is printed next to it), jitted on the same device.

The matmul and the steps are interleaved over ``--repeats`` repetitions (medians). The table
gives each one's GFLOP, ms, achieved GFLOP/s and the fraction of the measured matmul rate.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import time
from collections.abc import Iterator

import jax
import jax.numpy as jnp

from benchmarks._common import (
    JaxSteps,
    copy_tree,
    make_video_setup,
    parse_video_args,
    print_table,
    run_main,
    time_alternatives,
    video_batch,
    video_parser,
)


def parse_args(argv=None) -> argparse.Namespace:
    p = video_parser(__doc__, steps=10, repeats=5, quick_help="L=2, batch 4, n=256")
    p.add_argument("--matmul-size", type=int, default=2048, help="n of the n x n matmul")
    p.add_argument("--matmuls", type=int, default=3, help="matmuls per timed block (default 3)")
    quick = dict(layers=2, batch_size=4, steps=2, repeats=1, matmul_size=256, matmuls=2)
    return parse_video_args(p, argv, quick=quick)


def xla_flops(compiled) -> float:
    """``cost_analysis()['flops']`` (a dict, or a list of one dict in some jax versions)."""
    analysis = compiled.cost_analysis()
    if isinstance(analysis, (list, tuple)):
        analysis = analysis[0]
    return float(analysis["flops"])


@contextlib.contextmanager
def scans_unrolled() -> Iterator[None]:
    """Inside the block, ``jax.lax.scan`` fully unrolls (for XLA's FLOP count only)."""
    original = jax.lax.scan
    jax.lax.scan = functools.partial(original, unroll=True)
    try:
        yield
    finally:
        jax.lax.scan = original


class Matmul:
    def __init__(self, n: int):
        ka, kb = jax.random.split(jax.random.key(1))
        self.a = jax.random.normal(ka, (n, n), jnp.float32)
        self.b = jax.random.normal(kb, (n, n), jnp.float32)
        self.compiled = jax.jit(jnp.dot).lower(self.a, self.b).compile()
        self.flops = 2.0 * n**3

    def block(self, calls: int) -> float:
        t0 = time.perf_counter()
        out = [self.compiled(self.a, self.b) for _ in range(calls)]
        jax.block_until_ready(out)
        return (time.perf_counter() - t0) / calls


def main(argv=None) -> None:
    run_main("benchmarks.flops", argv, parse_args, run)


def run(args: argparse.Namespace, lapack: str) -> None:
    print(lapack)
    t_total = time.perf_counter()
    train_x, sigma, batch, key = video_batch(args.seq_len, args.batch_size)
    n = args.matmul_size
    print(
        f"video denoising, constrained step: batch {args.batch_size}x{args.seq_len}x"
        f"{train_x.shape[-1]}, L = {args.layers}; reference: float32 {n}x{n} @ {n}x{n} matmul; "
        f"{args.repeats} interleaved repetitions"
    )
    matmul = Matmul(n)
    alternatives = {f"matmul {n}": lambda: matmul.block(args.matmuls)}
    counts = {f"matmul {n}": (xla_flops(matmul.compiled), matmul.flops)}
    for model_name in args.models:
        setup = make_video_setup(model_name, train_x, sigma, layers=args.layers, jit=False)
        state = setup.init(copy_tree(setup.params))
        timed = jax.jit(setup.step, donate_argnums=0).lower(state, batch, key).compile()
        # no lax.cond in the counted program (see the docstring): the UT with eigh clipping
        counted = (
            make_video_setup(
                model_name, train_x, sigma, layers=args.layers, jit=False, ut_clip="eigh"
            )
            if model_name == "ut"
            else setup
        )
        compiled = jax.jit(counted.step).lower(state, batch, key).compile()
        with scans_unrolled():
            # A fresh function: jax caches traces per function, and the step was traced
            # (rolled) just above.
            fresh = functools.partial(counted.step)
            unrolled = jax.jit(fresh).lower(state, batch, key).compile()
        counts[setup.name] = (xla_flops(compiled), xla_flops(unrolled))
        steps = JaxSteps(timed, state, batch, key)
        alternatives[setup.name] = lambda s=steps: s.block(args.steps)
    seconds = time_alternatives(alternatives, args.repeats)
    peak = matmul.flops / seconds[f"matmul {n}"]
    rows = []
    for name, (as_compiled, used) in counts.items():
        rate = used / seconds[name]
        rows.append(
            [name, as_compiled / 1e9, used / 1e9, 1e3 * seconds[name], rate / 1e9, rate / peak]
        )
    print(
        "\nGFLOP: XLA cost_analysis of the compiled program (a while loop's body counted once) "
        f"and the count used (steps: every lax.scan unrolled; matmul: 2n³); medians over "
        f"{args.repeats} repetitions"
    )
    print_table(
        ["program", "GFLOP as compiled", "GFLOP used", "ms/call", "GFLOP/s", "/ matmul rate"],
        rows,
    )
    print(f"measured float32 matmul rate: {peak / 1e9:.4g} GFLOP/s ({n}x{n}, jnp.dot, jitted)")
    for name, (as_compiled, used) in counts.items():
        if name.startswith("matmul"):
            continue
        print(f"ratio {name}: achieved FLOP/s / matmul rate = {used / seconds[name] / peak:.3g}")
        print(f"ratio {name}: GFLOP unrolled / as compiled = {used / as_compiled:.3g}")
    print(f"total wall {time.perf_counter() - t_total:.0f}s")


if __name__ == "__main__":
    main()
