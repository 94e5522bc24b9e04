"""``python -m benchmarks sweep``: R runs trained as one program vs one after another.

    .venv/bin/python -m benchmarks sweep                # UT-5 and DUST-5, R = 1, 2, 4, 8
    .venv/bin/python -m benchmarks sweep --runs 1,8,64  # a GPU's sizes
    .venv/bin/python -m benchmarks sweep --quick        # tiny sizes (the tests)

A job's runs (seeds × sweep points) that share a model structure train as ONE compiled program
(:func:`cudt.loop.train_group`: each chunk of steps a ``lax.scan``, mapped over the runs: one run
after another inside the program on a CPU, ``jax.vmap`` on an accelerator). This measures what
that buys: for each R in ``--runs``, the runner's group of R constrained runs (R seeds of the
main job's config, ``benchmarks/setting.py``) is trained by ``train_group`` for one chunk
(tracing + compilation + the chunk) and ``--chunks`` more, timed per chunk after its metrics
reach the host; ``--repeats`` such calls, every R and model interleaved. The alternative,
training the R runs one after another, costs R times the R = 1 program's time per step (its one
compilation reused). Printed: the first chunk's seconds, the steady ms per step of all R runs,
and ``one after another / one program`` = R·t(1) / t(R) per run-step (> 1: the program wins);
and for a job of ``--job-steps`` steps, the end-to-end ratio with compilation included.

Equal work: run 0 of every R program (seed 0, its own batches) against the R = 1 program's run
after the first call: the largest parameter difference (0 on a CPU, where the runs go one after
another; rounding on an accelerator, where ``vmap`` batches their products).
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp

from benchmarks.common import (
    ChunkClock,
    header,
    interleave,
    max_abs_diff,
    median,
    number_flag,
    parse_quick,
    positive_int,
    positive_int_list,
    print_table,
)
from benchmarks.setting import VideoSetup, video_config, video_parser, video_setup
from cudt.loop import train_group

QUICK = dict(runs=[1, 2], chunk_steps=2, chunks=1, repeats=1, batch_size=4)


def parse_args(argv=None) -> argparse.Namespace:
    defaults = video_config()
    p = video_parser("python -m benchmarks sweep", __doc__)
    p.add_argument(
        "--runs", type=positive_int_list, default=[1, 2, 4, 8], help="R values (default 1,2,4,8)"
    )
    number_flag(p, "--chunk-steps", 10, "steps per chunk")
    number_flag(p, "--chunks", 3, "timed chunks per call")
    number_flag(p, "--repeats", 3, "interleaved calls")
    p.add_argument(
        "--job-steps",
        type=positive_int,
        default=defaults.steps,
        help=f"steps of the end-to-end ratio (default: VideoConfig's, {defaults.steps})",
    )
    args = parse_quick(
        p,
        argv,
        QUICK,
        "tiny sizes for the tests (L = 2, 3 short videos, batch 4, R = 1,2, one call of "
        "two chunks of 2 steps)",
    )
    if 1 not in args.runs:
        args.runs = [1, *args.runs]  # the reference of every ratio
    return args


def group_setup(args: argparse.Namespace, model_name: str, num_runs: int) -> VideoSetup:
    overrides = {"seeds": num_runs}
    if args.layers is not None:
        overrides["layers"] = args.layers
    if args.batch_size is not None:
        overrides["batch_size"] = args.batch_size
    return video_setup(video_config(quick=args.quick, **overrides), model_name)


class GroupCall:
    """One ``train_group`` call of a group, as the runner makes it: returns (first chunk s,
    median steady s/step) and keeps the first call's final states."""

    def __init__(self, setup: VideoSetup, chunk_steps: int, chunks: int):
        self.setup, self.chunk_steps, self.chunks = setup, chunk_steps, chunks
        program = setup.program
        self.data = {
            "examples": jax.tree.map(jnp.asarray, program.train_examples),
            "frozen": setup.model.frozen,
        }
        self.first_states = None

    def __call__(self) -> tuple[float, float]:
        program = self.setup.program
        clock = ChunkClock()
        states = program.initial_states()
        clock.start()
        result = train_group(
            program.step,
            states,
            program.keys,
            program.make_batch,
            (1 + self.chunks) * self.chunk_steps,
            chunk_steps=self.chunk_steps,
            progress=clock,
            data=self.data,
            extras=program.extras,
        )
        if self.first_states is None:
            self.first_states = result.states
        return clock.first, median(clock.steady) / self.chunk_steps


def measure(args: argparse.Namespace) -> dict:
    """``{"rows": table rows, "checks": equal-work rows, "speedup": {(model, R): ratio}}``."""
    calls: dict[tuple[str, int], GroupCall] = {}
    names: dict[str, str] = {}
    for model_name in args.models:
        for num_runs in args.runs:
            setup = group_setup(args, model_name, num_runs)
            names[model_name] = setup.name
            calls[(setup.name, num_runs)] = GroupCall(setup, args.chunk_steps, args.chunks)
    if calls:
        print(next(iter(calls.values())).setup.describe(), flush=True)
    results = interleave(calls, args.repeats)
    rows, checks, speedup, end_to_end = [], [], {}, {}
    for (name, num_runs), values in results.items():
        first = median([v[0] for v in values])
        step = median([v[1] for v in values])
        one_first = median([v[0] for v in results[(name, 1)]])
        one_step = median([v[1] for v in results[(name, 1)]])
        speedup[(name, num_runs)] = num_runs * one_step / step
        s = args.job_steps
        # a job of s steps: one program = its compilation + s steps of all R runs; one after
        # another = the R = 1 program's compilation once, then R runs of s steps each
        sequential = (one_first - args.chunk_steps * one_step) + num_runs * s * one_step
        together = (first - args.chunk_steps * step) + s * step
        end_to_end[(name, num_runs)] = sequential / together
        rows.append(
            [name, num_runs, first, 1e3 * step, 1e3 * step / num_runs,
             speedup[(name, num_runs)], end_to_end[(name, num_runs)]]
        )  # fmt: skip
        if num_runs == 1:  # the run alone is what the others are checked against
            checks.append([name, num_runs, "reference"])
            continue
        alone = calls[(name, 1)].first_states
        run0 = jax.tree.map(lambda a: a[0], calls[(name, num_runs)].first_states)
        diff = max_abs_diff(run0.params, jax.tree.map(lambda a: a[0], alone.params))
        checks.append([name, num_runs, diff])
    return {"rows": rows, "checks": checks, "speedup": speedup, "end_to_end": end_to_end}


def main(argv=None) -> int:
    args = parse_args(argv)
    header("sweep", argv)
    t0 = time.perf_counter()
    print(
        f"R = {','.join(map(str, args.runs))} constrained runs (seeds) per program; chunks of "
        f"{args.chunk_steps} steps, the first one compiled, {args.chunks} timed; "
        f"{args.repeats} interleaved calls; run axis: train_group's default on "
        f"{jax.devices()[0].platform}",
        flush=True,
    )
    result = measure(args)
    print(
        "\nequal work: run 0 of the R-run program vs the run trained alone, after "
        f"{(1 + args.chunks) * args.chunk_steps} steps (largest parameter difference)"
    )
    print_table(["model", "R", "params max abs diff"], result["checks"])
    print(
        f"\nmedians over {args.repeats} calls; one after another / one program: per run-step "
        f"(R·t(1) / t(R)), and end to end for a job of {args.job_steps} steps, compilation "
        "included (> 1: one program is faster)"
    )
    print_table(
        ["model", "R", "first chunk s", "ms/step (all R)", "ms/run-step", "per run-step",
         "end to end"],
        result["rows"],
    )  # fmt: skip
    for (name, num_runs), ratio in result["speedup"].items():
        if num_runs > 1:
            print(
                f"ratio {name} R={num_runs}: one after another / one program = {ratio:.3g} per "
                f"run-step, {result['end_to_end'][(name, num_runs)]:.3g} end to end"
            )
    print(f"total wall {time.perf_counter() - t0:.0f}s")
    return 0
