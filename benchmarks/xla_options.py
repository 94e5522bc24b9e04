"""The constrained step compiled with XLA:CPU options of its own, against jax's defaults.

Run from the repository root:

    .venv/bin/python -m benchmarks.xla_options              # UT-5 and DUST-5, batch 32; ~2.5 min

XLA's CPU compiler takes options per program: ``jax.jit(step, compiler_options={...})`` sets
them for that one program, with no environment variable and nothing process-wide, so a library
could pass them to its own step without the setup an importer never does (issue 18, "fast as
imported"). This script measures whether any is worth it. For each model (the constrained step
of the video setting, ``VIDEO`` in ``benchmarks/_common.py``), each option set in ``--options``
compiles the same step; the programs are timed interleaved (medians of ``--repeats``
repetitions of ``--steps`` steps) and the table gives ms/step and the default's time over each
(above 1: faster). Then each program trains ``--check-steps`` steps from the same state and
batch, and the table gives the largest difference of its parameters and multipliers from the
default's: 0 when
the option changes no rounding; anything else is a different float32 result, to be weighed
against the noise of the experiments (docs/results/video.md's 1e-6 controls).

The option sets (``--options``, comma-separated; ``--custom KEY=VALUE[,KEY=VALUE]`` adds one):

* ``default``: jax's defaults (the reference);
* ``vector512``: ``xla_cpu_prefer_vector_width=512`` (XLA's own loops in AVX-512 registers;
  the default prefers 256-bit vectors);
* ``onednn``: ``xla_cpu_use_onednn`` (oneDNN for the products it supports);
* ``scheduler``: ``xla_cpu_enable_concurrency_optimized_scheduler`` (orders the program for
  concurrent thunks);
* ``ynn_off``: ``xla_cpu_experimental_ynn_fusion_type=""`` (no YNNPACK fusions: XLA's own dot
  kernels);
* ``fast_math``: ``xla_cpu_enable_fast_math`` (reassociation and approximate functions; jax
  turns it off because it does not honour NaN and infinity, which the loop's divergence check
  relies on).

The options are XLA:CPU's: on another default device they would change nothing, and the script
stops with one line saying so.
"""

from __future__ import annotations

import argparse
import sys

import jax

from benchmarks._common import (
    JaxSteps,
    choice_list,
    copy_tree,
    make_video_setup,
    max_abs_diff,
    parse_video_args,
    print_table,
    run_main,
    time_alternatives,
    video_batch,
    video_parser,
)

OPTION_SETS: dict[str, dict[str, object]] = {
    "default": {},
    "vector512": {"xla_cpu_prefer_vector_width": 512},
    "onednn": {"xla_cpu_use_onednn": True},
    "scheduler": {"xla_cpu_enable_concurrency_optimized_scheduler": True},
    "ynn_off": {"xla_cpu_experimental_ynn_fusion_type": ""},
    "fast_math": {"xla_cpu_enable_fast_math": True},
}


def custom_options(text: str) -> dict[str, str]:
    """``KEY=VALUE[,KEY=VALUE]`` -> {key: value} (values as text: XLA parses them as a flag's)."""
    options = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.startswith("xla_"):
            raise argparse.ArgumentTypeError(
                f"{item!r} is not KEY=VALUE with an XLA option as KEY: e.g. "
                "--custom xla_cpu_prefer_vector_width=128"
            )
        options[key] = value
    if not options:
        raise argparse.ArgumentTypeError("--custom needs at least one KEY=VALUE")
    return options


def parse_args(argv=None) -> argparse.Namespace:
    p = video_parser(__doc__, steps=20, repeats=15, quick_help="L=2, batch 4, 1 repeat")
    p.add_argument(
        "--options",
        type=choice_list(tuple(OPTION_SETS), "option set"),
        default=list(OPTION_SETS),
        help=f"option sets to compare (default {','.join(OPTION_SETS)}; 'default' is always "
        "measured, as the reference)",
    )
    p.add_argument("--custom", type=custom_options, help="one more option set: KEY=VALUE,...")
    p.add_argument(
        "--check-steps", type=int, default=20, help="training steps of the accuracy check"
    )
    quick = dict(layers=2, batch_size=4, steps=2, repeats=1, check_steps=2)
    return parse_video_args(p, argv, quick=quick)


def option_sets(args: argparse.Namespace) -> dict[str, dict[str, object]]:
    sets = {"default": {}}
    sets.update({name: OPTION_SETS[name] for name in args.options})
    if args.custom:
        sets["custom"] = args.custom
    return sets


def main(argv=None) -> None:
    run_main("benchmarks.xla_options", argv, parse_args, run)


def run(args: argparse.Namespace, lapack: str) -> None:
    del lapack  # no LAPACK in the default steps
    backend = jax.default_backend()
    if backend != "cpu":
        sys.exit(
            f"error: these are XLA:CPU options and jax's default device is {backend}: run on a "
            "CPU (JAX_PLATFORMS=cpu) or use benchmarks.gpu_suite"
        )
    sets = option_sets(args)
    for name, options in sets.items():
        print(f"{name}: {options or 'jax defaults'}")
    train_x, sigma, batch, key = video_batch(args.seq_len, args.batch_size)
    rows, ratios = [], []
    for model_name in args.models:
        setup = make_video_setup(model_name, train_x, sigma, layers=args.layers, jit=False)
        start = setup.init(copy_tree(setup.params))
        compiled = {}
        for name, options in sets.items():
            try:
                compiled[name] = (
                    jax.jit(setup.step, donate_argnums=0, compiler_options=options)
                    .lower(start, batch, key)
                    .compile()
                )
            except Exception as err:  # XLA rejects an unknown option or value at compile time
                first = str(err).strip().splitlines()[0] if str(err).strip() else type(err)
                sys.exit(f"error: option set {name!r} ({options}) does not compile: {first}")
        timers = {
            name: JaxSteps(program, copy_tree(start), batch, key)
            for name, program in compiled.items()
        }
        print(f"{setup.name}: timing {len(sets)} programs", flush=True)
        seconds = time_alternatives(
            {name: (lambda t=t: t.block(args.steps)) for name, t in timers.items()}, args.repeats
        )
        trained = {}
        for name, program in compiled.items():
            check = JaxSteps(program, copy_tree(start), batch, key)
            check.block(args.check_steps)
            trained[name] = (check.state.params, check.state.multipliers)
        for name in sets:
            speedup = seconds["default"] / seconds[name]
            rows.append(
                [
                    setup.name,
                    name,
                    1e3 * seconds[name],
                    speedup,
                    max_abs_diff(trained[name], trained["default"]),
                ]
            )
            if name != "default":
                ratios.append(f"ratio {setup.name}: default / {name} = {speedup:.3g}")
    print(
        f"\nmedian ms/step over {args.repeats} interleaved repetitions of {args.steps} steps; "
        "parameters and multipliers λ: max abs diff from the default's after "
        f"{args.check_steps} steps"
    )
    print_table(["model", "options", "ms/step", "default / this", "params, λ max abs diff"], rows)
    print("\n".join(ratios))


if __name__ == "__main__":
    main()
