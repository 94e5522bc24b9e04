"""One command for the accelerator figures of issue 18; writes a Markdown table.

Run from the repository root on a machine with a GPU (runs on the CPU too; ``--small`` for a
quick check):

    .venv/bin/python -m benchmarks.gpu_suite --out gpu_suite.md

Measures, on jax's default device, in one process:

* the constrained step of the video setting (``VIDEO`` in ``benchmarks/_common.py``) for UT-5
  and DUST-5 (K = 400 and 576) at ``--batch-size`` (default 32): median ms/step, jitted,
  donated, over ``--repeats`` interleaved repetitions of ``--steps`` steps;
* sweep scaling: R = ``--runs`` (default 1, 2, 4, ..., 64) runs of UT-5 (ε differing per run)
  as one ``jax.vmap``-ed program: ms per step of all R runs and the speed-up per run-step over
  R = 1.

Not covered yet (issue 18 item 6 asks for them): the LLM step's tokens/s and MFU, and
PyTorch + Cooper on the same GPU (``benchmarks.cooper_baseline`` runs torch on the CPU).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from benchmarks._common import (
    JaxSteps,
    copy_tree,
    environment,
    header,
    make_video_setup,
    median,
    video_batch,
)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", default="gpu_suite.md", help="Markdown file to write")
    p.add_argument("--layers", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=8)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument(
        "--runs",
        type=lambda s: [int(r) for r in s.split(",")],
        default=[1, 2, 4, 8, 16, 32, 64],
        help="sweep sizes R (default 1,2,4,...,64)",
    )
    p.add_argument("--small", action="store_true", help="tiny sizes (L=1, batch 2, R=1,2)")
    args = p.parse_args(argv)
    if args.small:
        args.layers, args.batch_size, args.steps, args.repeats, args.runs = 1, 2, 2, 1, [1, 2]
    return args


def _time(measure, repeats: int) -> float:
    measure()  # compile / warm up
    return median([measure() for _ in range(repeats)])


def step_rows(args, train_x, sigma, batch, key) -> list[list]:
    rows = []
    for model, atoms in (("ut", None), ("dust", 20), ("dust", 24)):
        setup = make_video_setup(model, train_x, sigma, layers=args.layers, atoms_per_dim=atoms)
        steps = JaxSteps(setup.step, setup.init(copy_tree(setup.params)), batch, key)
        seconds = _time(lambda s=steps: s.block(args.steps), args.repeats)
        rows.append([setup.name, f"{1e3 * seconds:.3f}"])
    return rows


def sweep_rows(args, train_x, sigma, batch, key) -> list[list]:
    setup = make_video_setup("ut", train_x, sigma, layers=args.layers, jit=False)
    vmapped = jax.jit(jax.vmap(setup.step, in_axes=(0, None, None)), donate_argnums=0)
    make = jax.jit(jax.vmap(lambda e: setup.init(setup.params, epsilon=e)))
    rows, base = [], None
    for runs in args.runs:
        holder = {"states": make(0.05 * jnp.arange(1, runs + 1, dtype=jnp.float32))}

        def block(h=holder) -> float:
            t0 = time.perf_counter()
            for _ in range(args.steps):
                h["states"], _ = vmapped(h["states"], batch, key)
            jax.block_until_ready(h["states"])
            return (time.perf_counter() - t0) / args.steps

        seconds = _time(block, args.repeats)
        per_run = seconds / runs
        base = base or per_run
        rows.append(
            [str(runs), f"{1e3 * seconds:.3f}", f"{1e3 * per_run:.3f}", f"{base / per_run:.2f}"]
        )
    return rows


def markdown(headers: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(map(str, r)) + " |" for r in rows]
    return "\n".join(lines)


def main(argv=None) -> None:
    args = parse_args(argv)
    header("benchmarks.gpu_suite", argv)
    train_x, sigma, batch, key = video_batch(args.seq_len, args.batch_size)
    steps = step_rows(args, train_x, sigma, batch, key)
    sweep = sweep_rows(args, train_x, sigma, batch, key)
    text = "\n\n".join(
        [
            f"# benchmarks.gpu_suite\n\n{environment()}; batch {args.batch_size}x{args.seq_len}"
            f"x256, L = {args.layers}; medians of {args.repeats} x {args.steps} steps",
            "## Constrained step\n\n" + markdown(["model", "ms/step"], steps),
            "## Sweep scaling (UT, R runs as one vmapped program)\n\n"
            + markdown(
                ["R", "ms/step (all R)", "ms/run-step", "speed-up per run-step vs R=1"], sweep
            ),
        ]
    )
    Path(args.out).write_text(text + "\n")
    print(text)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
