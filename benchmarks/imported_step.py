"""The step as a user imports it vs the runner's configured step, in fresh processes.

Run from the repository root:

    .venv/bin/python -m benchmarks.imported_step            # UT-5 and DUST-5, batch 32; ~2 min

For each model two fresh Python processes (workers) build the constrained step of the video
setting (``VIDEO`` in ``benchmarks/_common.py``) with ``cudt.make_train_step``, jitted:

* ``imported``: ``import cudt`` and go, with the environment as it comes (no configuration
  call; the parent removes ``OPENBLAS_NUM_THREADS`` from the worker's environment, so OpenBLAS
  keeps its own default of one thread per core);
* ``runner``: calls ``cudt.runner.cli.configure_process()`` first, as the experiments' entry
  points do (one OpenBLAS thread unless the user set one).

Both workers compile and warm up, then the parent asks them in turn (the order rotating every
repetition, only one worker running at a time) to time ``--steps`` steps; medians over
``--repeats`` repetitions and the ratio imported / runner are printed. Before timing, each
worker reports whether ``import cudt`` changed ``OPENBLAS_NUM_THREADS`` (it must not).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks._common import median, parse_video_args, print_table, video_parser

MODES = ("imported", "runner")


def parse_args(argv=None) -> argparse.Namespace:
    p = video_parser(__doc__, steps=10, repeats=7, quick_help="L=1, batch 4, 1 repeat")
    p.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    p.add_argument("--model", default="ut", help=argparse.SUPPRESS)
    return parse_video_args(p, argv, quick=dict(layers=1, batch_size=4, steps=2, repeats=1))


def worker(args: argparse.Namespace) -> None:
    """One process: build the step, then time ``steps`` steps per line read from stdin."""
    before = os.environ.get("OPENBLAS_NUM_THREADS")
    if args.worker == "runner":
        from cudt.runner.cli import configure_process

        configure_process()
    import jax

    import cudt  # noqa: F401  (the import a user does)
    from benchmarks._common import JaxSteps, make_video_setup, video_batch

    changed = args.worker == "imported" and os.environ.get("OPENBLAS_NUM_THREADS") != before
    train_x, sigma, batch, key = video_batch(args.seq_len, args.batch_size)
    setup = make_video_setup(args.model, train_x, sigma, layers=args.layers)
    steps = JaxSteps(setup.step, setup.init(setup.params), batch, key)
    steps.block(max(2, args.steps // 2))  # compile + warm up
    print(
        json.dumps(
            {
                "ready": setup.name,
                "openblas": os.environ.get("OPENBLAS_NUM_THREADS"),
                "import_changed_env": changed,
                "backend": jax.default_backend(),
            }
        ),
        flush=True,
    )
    for line in sys.stdin:
        if line.strip() != "go":
            break
        print(json.dumps({"s": steps.block(args.steps)}), flush=True)


class Worker:
    def __init__(self, mode: str, model: str, args: argparse.Namespace):
        env = dict(os.environ)
        env.pop("OPENBLAS_NUM_THREADS", None)  # the environment as it comes to a user
        cmd = [sys.executable, "-m", "benchmarks.imported_step", "--worker", mode]
        cmd += ["--model", model, "--layers", str(args.layers)]
        cmd += ["--batch-size", str(args.batch_size), "--seq-len", str(args.seq_len)]
        cmd += ["--steps", str(args.steps)]
        root = Path(__file__).resolve().parents[1]  # benchmarks/ is a folder of the repo
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=root
        )
        self.info = self._read()

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker {self.proc.args} exited with {self.proc.wait()}")
        return json.loads(line)

    def time(self) -> float:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        return self._read()["s"]

    def close(self) -> None:
        self.proc.stdin.write("stop\n")
        self.proc.stdin.flush()
        self.proc.wait()


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return
    from benchmarks._common import header

    header("benchmarks.imported_step", argv)
    t_total = time.perf_counter()
    print(
        f"video denoising, constrained step: batch {args.batch_size}x{args.seq_len}x256, "
        f"L = {args.layers}; {args.repeats} interleaved repetitions of {args.steps} steps; "
        "one fresh process per (model, mode)"
    )
    rows, ratios = [], {}
    for model in args.models:
        workers = {mode: Worker(mode, model, args) for mode in MODES}
        for mode, w in workers.items():
            print(f"  {mode}: {w.info}", flush=True)
        times: dict[str, list[float]] = {mode: [] for mode in MODES}
        for rep in range(args.repeats + 1):  # the first repetition is a warm-up
            order = MODES if rep % 2 == 0 else MODES[::-1]
            for mode in order:
                t = workers[mode].time()
                if rep > 0:
                    times[mode].append(t)
        for w in workers.values():
            w.close()
        name = workers["runner"].info["ready"]
        ms = {mode: 1e3 * median(ts) for mode, ts in times.items()}
        for mode in MODES:
            rows.append([name, mode, workers[mode].info["openblas"] or "unset", ms[mode]])
        ratios[name] = ms["imported"] / ms["runner"]
        changed = workers["imported"].info["import_changed_env"]
        print(f"  {name}: import cudt changed OPENBLAS_NUM_THREADS: {changed}")
    print(f"\nsteady state: median ms/step over {args.repeats} repetitions")
    print_table(["model", "process", "OPENBLAS_NUM_THREADS", "ms/step"], rows)
    for name, ratio in ratios.items():
        print(f"ratio {name}: imported / runner = {ratio:.3g}")
    print(f"total wall {time.perf_counter() - t_total:.0f}s")


if __name__ == "__main__":
    main()
