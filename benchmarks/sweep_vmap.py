"""A hyperparameter sweep (one ε per run) as ONE program (looped or vmapped) vs run after run.

Run from the repository root:

    .venv/bin/python -m benchmarks.sweep_vmap               # UT-5 and DUST-5, R = 1,2,4,8; ~2 min

R constrained runs of the video setting (``VIDEO`` in ``benchmarks/_common.py``, batch 32) that
differ only in the descent factor, ε_r = 0.05·(r+1). Every program trains a CHUNK of ``--steps``
steps of all R runs, as ``cudt.loop.train_group`` compiles one (``lax.scan`` over the steps;
every step sees the same batch and key), four ways:

* ``one program``: what ``train_group`` does: :func:`cudt.loop.map_runs` (``how="auto"``) of
  a per-run scan over the chunk's steps. On CPU the runs go one after another (``lax.map``),
  each taking all its steps with its own arrays hot in cache; on GPU/TPU ``jax.vmap``; for
  R = 1 the scan of the step itself. States made by
  ``jax.vmap(lambda e: init(params, epsilon=e))``;
* ``steps outside``: a scan over the steps of ``map_runs`` over the runs, what ``train_group``
  compiled before (every step visits every run in turn);
* ``one program, vmap``: ``how="vmap"`` (``jax.vmap`` whatever the device, also for R = 1);
* ``sequential``: R states made by ``init(params, epsilon=ε_r)``, each trained by the same
  compiled single-run chunk (``jax.jit`` of the scan, compiled once, reused for every run and
  R), run after run.

All donate the states. Compile times are measured with ``jax.jit(...).lower(...).compile()``.
Equal work: one chunk is trained every way from the same init and run r of each program
compared with sequential run r (max abs difference of the parameters and multipliers, and the
fraction of parameters that differ by more than 0.1·lr: Adam moves every parameter by about lr
per step, so a gradient at rounding level can flip an element's step; the runs' multipliers
differ from each other, since ε differs). The timed blocks continue from there: every
alternative (R × way, both models) is interleaved over ``--repeats`` repetitions of one chunk;
the table gives the median ms per step of all R runs and the ratio of each way to
``one program``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks._common import (
    VIDEO,
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
from cudt.loop import map_runs


def parse_args(argv=None) -> argparse.Namespace:
    p = video_parser(__doc__, steps=5, repeats=5, quick_help="L=1, batch 4, R=1,2")
    p.add_argument(
        "--runs",
        type=lambda s: [int(r) for r in s.split(",")],
        default=[1, 2, 4, 8],
        help="comma-separated sweep sizes R (default 1,2,4,8)",
    )
    p.add_argument(
        "--no-check",
        dest="check",
        action="store_false",
        help="skip the equal-work check (one chunk trained every way and compared)",
    )
    quick = dict(layers=1, batch_size=4, runs=[1, 2], steps=2, repeats=1)
    return parse_video_args(p, argv, quick=quick)


def epsilons(num_runs: int) -> np.ndarray:
    """The sweep: ε_r = 0.05·(r+1)."""
    return 0.05 * np.arange(1, num_runs + 1, dtype=np.float32)


WAYS = ("one program", "steps outside", "one program, vmap")


class OneProgram:
    """R runs stacked in one state, trained a chunk at a time by one compiled program."""

    def __init__(self, compiled: Callable, states: Any, batch, key, steps: int):
        self.compiled, self.states, self.batch, self.key = compiled, states, batch, key
        self.n = steps

    def chunk(self) -> float:
        """Seconds per step of all R runs over one chunk."""
        t0 = time.perf_counter()
        self.states = self.compiled(self.states, self.batch, self.key)
        jax.block_until_ready(self.states)
        return (time.perf_counter() - t0) / self.n

    def run(self, r: int) -> Any:
        return jax.tree.map(lambda x: x[r], self.states)


class Sequential:
    """R separate states, each trained by the same compiled single-run chunk, run after run."""

    def __init__(self, compiled: Callable, states: list, batch, key, steps: int):
        self.compiled, self.states, self.batch, self.key = compiled, states, batch, key
        self.n = steps

    def chunk(self) -> float:
        t0 = time.perf_counter()
        for r in range(len(self.states)):
            self.states[r] = self.compiled(self.states[r], self.batch, self.key)
        jax.block_until_ready(self.states)
        return (time.perf_counter() - t0) / self.n

    def run(self, r: int) -> Any:
        return self.states[r]


def setup_model(args, model_name: str, train_x, sigma, batch, key):
    """The alternatives of one model: {(R, way): (object with .steps, compile s)} and checks."""
    setup = make_video_setup(model_name, train_x, sigma, layers=args.layers, jit=False)
    params = setup.params
    eps_all = epsilons(max(args.runs))

    n = args.steps

    def scan_steps(state, batch, key):
        """One run's chunk, as ``train_group`` scans it."""
        return jax.lax.scan(lambda s, _: (setup.step(s, batch, key)[0], None), state, None, n)[0]

    t0 = time.perf_counter()
    single = (
        jax.jit(scan_steps, donate_argnums=0)
        .lower(setup.init(copy_tree(params)), batch, key)
        .compile()
    )
    single_compile = time.perf_counter() - t0

    def runs_outside(how: str):
        def chunk(states, batch, key):
            return map_runs(lambda s: scan_steps(s, batch, key), states, how=how)

        return jax.jit(chunk, donate_argnums=0)

    def steps_outside(states, batch, key):
        def one_step(states, _):
            return map_runs(lambda s: setup.step(s, batch, key)[0], states), None

        return jax.lax.scan(one_step, states, None, n)[0]

    programs = {
        "one program": runs_outside("auto"),
        "steps outside": jax.jit(steps_outside, donate_argnums=0),
        "one program, vmap": runs_outside("vmap"),
    }
    make_states = jax.jit(jax.vmap(lambda e: setup.init(params, epsilon=e)))

    alternatives, compile_s, checks = {}, {}, []
    for R in args.runs:
        eps = jnp.asarray(eps_all[:R])
        ways = {}
        for way, jitted in programs.items():
            states = make_states(eps)
            t0 = time.perf_counter()
            compiled = jitted.lower(states, batch, key).compile()
            compile_s[(setup.name, R, way)] = time.perf_counter() - t0
            ways[way] = OneProgram(compiled, states, batch, key, n)
        compile_s[(setup.name, R, "sequential")] = single_compile
        seq = Sequential(
            single,
            [setup.init(copy_tree(params), epsilon=eps_all[r]) for r in range(R)],
            batch,
            key,
            n,
        )
        if args.check:
            seq.chunk()
        for way, one in ways.items():
            if not args.check:
                break
            one.chunk()
            diffs = np.concatenate(
                [
                    np.abs(np.asarray(a) - np.asarray(b)).ravel()
                    for r in range(R)
                    for a, b in zip(
                        jax.tree.leaves(one.run(r).params),
                        jax.tree.leaves(seq.run(r).params),
                        strict=True,
                    )
                ]
            )
            mult_diff = max(
                max_abs_diff(one.run(r).multipliers, seq.run(r).multipliers) for r in range(R)
            )
            lam = np.asarray(one.states.multipliers)  # [R, L+1]
            checks.append(
                [
                    setup.name,
                    R,
                    way,
                    float(diffs.max()),
                    # Adam moves a parameter by ~lr per step whatever its gradient's size: an
                    # element whose gradient is at rounding level may move either way.
                    float(np.mean(diffs > 0.1 * VIDEO["lr"])),
                    mult_diff,
                    float((lam.max(axis=0) - lam.min(axis=0)).max()),
                ]
            )
        for way, one in ways.items():
            alternatives[(setup.name, R, way)] = one
        alternatives[(setup.name, R, "sequential")] = seq
    return setup.name, alternatives, compile_s, checks


def main(argv=None) -> None:
    run_main("benchmarks.sweep_vmap", argv, parse_args, run)


def run(args: argparse.Namespace, lapack: str) -> None:
    print(lapack)
    t_total = time.perf_counter()
    train_x, sigma, batch, key = video_batch(args.seq_len, args.batch_size)
    print(
        f"video denoising, constrained: batch {args.batch_size}x{args.seq_len}x"
        f"{train_x.shape[-1]}, L = {args.layers}; sweep R = {args.runs} runs with "
        f"ε_r = 0.05·(r+1) (up to {epsilons(max(args.runs))[-1]:.2f}); {args.repeats} "
        f"interleaved repetitions of one chunk ({args.steps} steps) of all R runs"
    )
    alternatives, compile_s, checks, names = {}, {}, [], []
    for model_name in args.models:
        print(f"compiling {model_name} ...", flush=True)
        name, alts, comp, chk = setup_model(args, model_name, train_x, sigma, batch, key)
        names.append(name)
        alternatives.update(alts)
        compile_s.update(comp)
        checks += chk
    if checks:
        print(
            f"\nequal work: after one chunk ({args.steps} steps) from the same init, run r of the "
            "program vs sequential run r (max over r); spread = max over layers of "
            "(max - min over runs) of λ: the runs differ"
        )
        print_table(
            [
                "model",
                "R",
                "way",
                "params max abs diff",
                f"frac params > {0.1 * VIDEO['lr']:g}",
                "λ max abs diff",
                "λ spread over runs",
            ],
            checks,
        )
    measures = {name: alt.chunk for name, alt in alternatives.items()}
    ms = {name: 1e3 * s for name, s in time_alternatives(measures, args.repeats).items()}
    rows = []
    for model in names:
        for R in args.runs:
            for way in (*WAYS, "sequential"):
                value = ms[(model, R, way)]
                rows.append(
                    [
                        model,
                        R,
                        way,
                        compile_s[(model, R, way)],
                        value,
                        value / R,
                        value / ms[(model, R, "one program")],
                    ]
                )
    print(
        f"\nsteady state: median over {args.repeats} interleaved repetitions; ms/step = one "
        "step of all R runs; compile s: the chunk program for R (one per R and way), the "
        "single-run chunk (compiled once, shared by every R); one program = train_group's: "
        f"cudt.loop.map_runs(how='auto') of each run's {args.steps} steps, on "
        f"{jax.default_backend()}: "
        + ("the runs in turn (lax.map)" if jax.default_backend() == "cpu" else "jax.vmap")
    )
    print_table(
        ["model", "R", "way", "compile s", "ms/step", "ms/run-step", "this / one program"], rows
    )
    for model in names:
        for R in args.runs:
            for way in ("sequential", *WAYS[1:]):
                ratio = ms[(model, R, way)] / ms[(model, R, "one program")]
                print(f"ratio {model} R={R}: {way} / one program = {ratio:.3g}")
    print(f"total wall {time.perf_counter() - t_total:.0f}s")


if __name__ == "__main__":
    main()
