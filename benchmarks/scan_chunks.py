"""Steps fused in one ``lax.scan`` per host round trip: ``train_group`` with several ``chunk_steps``.

Run from the repository root:

    .venv/bin/python -m benchmarks.scan_chunks           # defaults: chunks 1, 10, 100; ~2 min

Measures the steady-state training speed of ``cudt.loop.train_group`` (a constrained UT-3
denoiser on synthetic 16x16-patch video sequences [B, T, 256], as in the video experiment) with
``chunk_steps`` = 1 (the host fetches metrics and checks them after every step), 10 and 100
(steps fused in one compiled ``lax.scan``). The alternatives are interleaved over ``--repeats``
repetitions from the same starting state; in each, one warm-up chunk (tracing + compilation) is
followed by ``--steps`` timed steps, timed chunk by chunk through ``train_group``'s ``progress``
hook. Prints the median steady-state ms/step, steps/s and the speed ratio to ``chunk_steps=1``.
"""

from __future__ import annotations

import argparse
import math
import time

import jax
import jax.numpy as jnp

from benchmarks._common import (
    ChunkClock,
    add_lapack_threads_flag,
    burn_in,
    command_line,
    copy_tree,
    environment,
    interleave,
    lapack_threads,
    make_ut_setup,
    median,
    print_table,
    stack_states,
    video_data,
)
from cudt.loop import train_group


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--chunks",
        type=lambda s: [int(c) for c in s.split(",")],
        default=[1, 10, 100],
        help="comma-separated chunk_steps values (default 1,10,100)",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=100,
        help="timed steps per alternative and repetition, rounded up to whole chunks (default 100)",
    )
    p.add_argument("--runs", type=int, default=1, help="R, runs vmapped in the group (default 1)")
    p.add_argument("--layers", type=int, default=3, help="UT layers L (default 3)")
    p.add_argument("--batch-size", type=int, default=64, help="sequences per batch (default 64)")
    p.add_argument("--seq-len", type=int, default=8, help="frames per sequence T (default 8)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved repetitions (default 3)")
    p.add_argument(
        "--burn-in",
        type=int,
        default=20,
        help="steps trained before the benchmark, so W̃_f is no longer diagonal (default 20)",
    )
    add_lapack_threads_flag(p)
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    print(f"command: {command_line('benchmarks.scan_chunks', argv)}")
    with lapack_threads(args.lapack_threads) as lapack:
        run(args, lapack)


def run(args: argparse.Namespace, lapack: str) -> None:
    R = args.runs
    print(f"scan_chunks: {environment()}; {lapack}")
    train_x, sigma = video_data(seq_len=args.seq_len)
    setup = make_ut_setup(train_x, sigma, layers=args.layers, batch_size=args.batch_size)
    keys = jnp.stack([jax.random.key(seed) for seed in range(R)])
    print(
        f"UT-{args.layers} denoiser, dim {train_x.shape[-1]}, batch {args.batch_size}x"
        f"{args.seq_len}x{train_x.shape[-1]}, R = {R} run(s); chunk_steps {args.chunks}; "
        f"1 warm-up chunk + >= {args.steps} timed steps each; {args.repeats} repetitions"
    )
    t0 = time.perf_counter()
    start = burn_in(setup, stack_states(setup.init, setup.params, R), keys, args.burn_in)
    jax.block_until_ready(start)
    print(f"burn-in: {args.burn_in} steps in {time.perf_counter() - t0:.1f}s")

    def alternative(chunk: int):
        timed_chunks = math.ceil(args.steps / chunk)

        def run():
            clock = ChunkClock()
            clock.start()
            train_group(
                setup.step,
                copy_tree(start),
                keys,
                setup.make_batch,
                chunk * (1 + timed_chunks),
                chunk_steps=chunk,
                progress=clock,
            )
            return clock.first, sum(clock.steady) / (chunk * timed_chunks)

        return run

    results = interleave({f"chunk_steps={c}": alternative(c) for c in args.chunks}, args.repeats)
    per_step = {name: median([m[1] for m in ms]) for name, ms in results.items()}
    base = per_step[f"chunk_steps={args.chunks[0]}"]
    rows = [
        [
            name,
            median([m[0] for m in results[name]]),
            1e3 * per_step[name],
            R / per_step[name],
            base / per_step[name],
        ]
        for name in results
    ]
    print()
    print(
        f"steady state, medians over {args.repeats} repetitions; "
        f"speedup = ms/step of chunk_steps={args.chunks[0]} / this ms/step"
    )
    print_table(
        ["alternative", "first chunk s", "ms/step", "run-steps/s", "speedup"],
        rows,
    )
    print(
        "first chunk s = tracing + compilation + the first chunk (train_group compiles anew on "
        f"every call); total wall {time.perf_counter() - t0:.0f}s"
    )


if __name__ == "__main__":
    main()
