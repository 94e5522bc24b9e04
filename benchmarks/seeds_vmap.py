"""R seeds as ONE vmapped program vs the same R runs trained one after another.

Run from the repository root:

    .venv/bin/python -m benchmarks.seeds_vmap            # defaults: R=4, UT-3, batch 64, ~2-3 min

Measures ``cudt.loop.train_group`` training R seeds of a constrained UT denoiser (synthetic
16x16-patch video sequences [B, T, 256], primal Adam, SGD dual ascent, eigenvalue clipping)
two ways, interleaved over ``--repeats`` repetitions from the same starting states:

* ``vmapped``: one ``train_group`` call with the R states stacked (R = ``--runs``);
* ``sequential``: R ``train_group`` calls with one run each (R = 1), one after another.

Each call runs one warm-up chunk (tracing + XLA compilation + the chunk) and then
``--timed-chunks`` chunks of ``--chunk-steps`` steps; chunks are timed through the ``progress``
hook (called once per chunk, after its metrics reach the host). Reported per way (medians over
repetitions): the compile overhead (first chunk minus a steady chunk, and jax's own trace +
lower + compile seconds), the steady-state time and run-steps/s (R × steps per second), the
speedup of vmapped over sequential, and the run length up to which the way that compiles
faster still finishes first.

Equal work: the first ``--check-steps`` steps (which also serve as the burn-in the timed runs
start from) are trained both ways and their parameters compared (max abs diff, float32 level
expected). The timed runs' final parameters and losses are printed too: over longer runs the
parameters drift apart, as they do under any rounding-level perturbation in this training.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks._common import (
    ChunkClock,
    add_lapack_threads_flag,
    command_line,
    compile_seconds,
    copy_tree,
    environment,
    interleave,
    lapack_threads,
    make_ut_setup,
    max_abs_diff,
    median,
    print_table,
    stack_states,
    video_data,
)
from cudt.loop import train_group


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--runs", type=int, default=4, help="R, seeds trained (default 4)")
    p.add_argument("--layers", type=int, default=3, help="UT layers L (default 3)")
    p.add_argument("--batch-size", type=int, default=64, help="sequences per batch (default 64)")
    p.add_argument("--seq-len", type=int, default=8, help="frames per sequence T (default 8)")
    p.add_argument("--chunk-steps", type=int, default=10, help="steps per scan chunk (default 10)")
    p.add_argument(
        "--timed-chunks", type=int, default=2, help="timed chunks after the warm-up (default 2)"
    )
    p.add_argument("--repeats", type=int, default=3, help="interleaved repetitions (default 3)")
    p.add_argument(
        "--check-steps",
        type=int,
        default=10,
        help="steps trained both ways and compared before timing; also the burn-in that makes "
        "W̃_f non-diagonal, as mid-training; 0 skips both (default 10)",
    )
    add_lapack_threads_flag(p)
    return p.parse_args(argv)


class Trainer:
    """Trains the R stacked runs with ``train_group``, vmapped or one run at a time."""

    def __init__(self, setup, keys):
        self.setup, self.keys = setup, keys

    def _group(self, states, keys, num_steps: int, chunk_steps: int):
        clock = ChunkClock()
        with compile_seconds() as compiled:
            clock.start()
            result = train_group(
                self.setup.step,
                states,
                keys,
                self.setup.make_batch,
                num_steps,
                chunk_steps=chunk_steps,
                progress=clock,
            )
        return clock.first, sum(clock.steady), compiled[0], result

    def vmapped(self, states, num_steps: int, chunk_steps: int):
        """(first chunk s, steady s, jax compile s, final states [R], last objective [R])."""
        first, steady, comp, result = self._group(
            copy_tree(states), self.keys, num_steps, chunk_steps
        )
        return first, steady, comp, result.states, result.history[-1]["objective"]

    def sequential(self, states, num_steps: int, chunk_steps: int):
        """The same, summed over R calls of one run each; states and objectives concatenated."""
        first = steady = comp = 0.0
        finals, objectives = [], []
        for r in range(self.keys.shape[0]):
            one = jax.tree.map(lambda x, r=r: jnp.copy(x[r : r + 1]), states)
            f, s, c, result = self._group(one, self.keys[r : r + 1], num_steps, chunk_steps)
            first, steady, comp = first + f, steady + s, comp + c
            finals.append(result.states)
            objectives.append(result.history[-1]["objective"])
        final = jax.tree.map(lambda *xs: jnp.concatenate(xs), *finals)
        return first, steady, comp, final, np.concatenate(objectives)


def relative_diff(a, b, start) -> float:
    """‖a − b‖ / ‖a − start‖ over all leaves: the disagreement relative to the distance trained."""
    sq = lambda t: sum(float(jnp.sum(x**2)) for x in jax.tree.leaves(t))  # noqa: E731
    return (sq(jax.tree.map(jnp.subtract, a, b)) / sq(jax.tree.map(jnp.subtract, a, start))) ** 0.5


def break_even(compile_v: float, compile_s: float, ms_v: float, ms_s: float) -> str:
    """One line: which way finishes a whole run first, from the compile and per-step columns."""
    saved, extra = compile_s - compile_v, (ms_v - ms_s) / 1e3
    if saved >= 0 and extra <= 0:
        return "end to end: vmapped is ahead both in compilation and per step"
    if saved <= 0 and extra >= 0:
        return "end to end: sequential is ahead both in compilation and per step"
    steps = saved / extra
    first, second = ("vmapped", "sequential") if saved > 0 else ("sequential", "vmapped")
    return (
        f"end to end: vmapped {'saves' if saved > 0 else 'spends'} {abs(saved):.3g}s of "
        f"compilation and {'spends' if extra > 0 else 'saves'} {1e3 * abs(extra):.3g} ms per "
        f"step (all runs): {first} finishes first for runs shorter than ~{steps:.0f} steps, "
        f"{second} for longer ones"
    )


def main(argv=None) -> None:
    args = parse_args(argv)
    print(f"command: {command_line('benchmarks.seeds_vmap', argv)}")
    with lapack_threads(args.lapack_threads) as lapack:
        run(args, lapack)


def run(args: argparse.Namespace, lapack: str) -> None:
    R, chunk = args.runs, args.chunk_steps
    t_total = time.perf_counter()
    print(f"seeds_vmap: {environment()}; {lapack}")
    train_x, sigma = video_data(seq_len=args.seq_len)
    setup = make_ut_setup(train_x, sigma, layers=args.layers, batch_size=args.batch_size)
    trainer = Trainer(setup, jnp.stack([jax.random.key(seed) for seed in range(R)]))
    print(
        f"UT-{args.layers} denoiser, dim {train_x.shape[-1]}, batch {args.batch_size}x"
        f"{args.seq_len}x{train_x.shape[-1]}, {train_x.shape[0]} train sequences; R = {R} runs; "
        f"{chunk} steps/chunk, 1 warm-up + {args.timed_chunks} timed chunks per call; "
        f"{args.repeats} repetitions"
    )

    # Equal work, strictly: the first steps trained both ways must agree to float32 rounding.
    t0 = time.perf_counter()
    init = stack_states(setup.init, setup.params, R)
    n = args.check_steps
    if n > 0:
        check_v = trainer.vmapped(init, n, n)[3]
        check_s = trainer.sequential(init, n, n)[3]
        check_diff = max_abs_diff(check_v.params, check_s.params)
        print(
            f"equal work: after {n} steps from the same init, params max |vmapped - sequential| "
            f"= {check_diff:.3g} ({time.perf_counter() - t0:.0f}s)"
        )
        # Timed runs start there, step counter at 0 (train_group's chunks start at its multiples).
        start = check_v.replace(step=jnp.zeros_like(check_v.step))
    else:
        print("equal work: check skipped (--check-steps 0); the timed runs start from the init")
        start = init

    num_steps = chunk * (1 + args.timed_chunks)
    timed_steps = chunk * args.timed_chunks
    results = interleave(
        {
            "vmapped": lambda: trainer.vmapped(start, num_steps, chunk),
            "sequential": lambda: trainer.sequential(start, num_steps, chunk),
        },
        args.repeats,
    )

    steady = {name: median([m[1] for m in ms]) for name, ms in results.items()}
    rows = []
    for name, ms in results.items():
        steady_chunk = [m[1] / args.timed_chunks for m in ms]
        rows.append(
            [
                name,
                R if name == "vmapped" else 1,
                1 if name == "vmapped" else R,
                median([m[0] for m in ms]),
                median([m[0] - c for m, c in zip(ms, steady_chunk, strict=True)]),
                median([m[2] for m in ms]),
                steady[name],
                1e3 * steady[name] / timed_steps,
                R * timed_steps / steady[name],
                steady["sequential"] / steady[name],
            ]
        )
    print()
    print(
        f"steady state: {timed_steps} steps x {R} runs per repetition; medians over "
        f"{args.repeats} repetitions; speedup = sequential steady s / this steady s"
    )
    print_table(
        [
            "way",
            "R/call",
            "calls",
            "first chunk s",
            "compile s",
            "jax compile s",
            "steady s",
            "ms/step(all R)",
            "run-steps/s",
            "speedup",
        ],
        rows,
    )
    print(
        "compile s = first chunk - one steady chunk; jax compile s = jax's trace + lower + XLA "
        "compile time, summed over the calls"
    )
    print(break_even(rows[0][4], rows[1][4], rows[0][7], rows[1][7]))

    (_, _, _, final_v, obj_v), (_, _, _, final_s, obj_s) = (
        results["vmapped"][-1],
        results["sequential"][-1],
    )
    final_diff = max_abs_diff(final_v.params, final_s.params)
    print(
        f"final (after {num_steps} more steps): params max |vmapped - sequential| = "
        f"{final_diff:.3g}, relative to the distance trained "
        f"{relative_diff(final_v.params, final_s.params, start.params):.3g}; last-chunk mean "
        f"objective vmapped {np.array2string(np.asarray(obj_v), precision=5)} vs sequential "
        f"{np.array2string(np.asarray(obj_s), precision=5)}"
    )
    if final_diff == 0.0:
        print("(bit-identical: here the vmapped program computes every run exactly as one run)")
    else:
        print(
            "(the two ways round differently, e.g. vmap may change the summation order; this "
            "training amplifies rounding-level differences over tens of steps, so the parameters "
            "drift apart; the objectives show how far the runs' outcomes differ)"
        )
    print(
        f"vmapped speedup (steady state): {steady['sequential'] / steady['vmapped']:.2f}x; "
        f"total wall {time.perf_counter() - t_total:.0f}s"
    )


if __name__ == "__main__":
    main()
