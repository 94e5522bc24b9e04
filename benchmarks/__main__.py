"""``python -m benchmarks <subcommand> [flags]``: one command per measurement.

    step     the video step: cudt vs PyTorch + Cooper (UT-5, DUST-5; both dynamics), FLOP rate
    sweep    R runs as one program vs one after another (the runner's train_group)
    memory   compiled memory: per-layer LM losses, and fine-tuning Llama 3.1 8B
    llm      SmolLM2-135M's constrained step vs transformers + Cooper
    gpu      the sections a lent GPU should run (step, sweep, llm), as Markdown

``python -m benchmarks <subcommand> --help`` lists its flags; ``--quick`` (``llm``: ``--tiny``)
runs it at its tiniest sizes. The process is configured as the main job's entry points
configure theirs (``cudt.runner.cli.configure_process``: one OpenBLAS thread unless set).
"""

from __future__ import annotations

import importlib
import sys

from cudt.runner.cli import exit_process

SUBCOMMANDS = {
    "step": "the video step: cudt vs PyTorch + Cooper, and its FLOP rate",
    "sweep": "R runs as one program vs one after another",
    "memory": "compiled memory of the per-layer LM losses and of an 8B fine-tuning step",
    "llm": "SmolLM2-135M's constrained step vs transformers + Cooper",
    "gpu": "the sections a lent GPU should run, as Markdown",
}


def usage() -> str:
    lines = ["usage: python -m benchmarks {" + ",".join(SUBCOMMANDS) + "} [flags]", ""]
    lines += [f"  {name:7s} {what}" for name, what in SUBCOMMANDS.items()]
    lines += ["", "python -m benchmarks SUBCOMMAND --help: its flags"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    if not argv:  # nothing measured: a failed command, as a missing argument is elsewhere
        print(
            f"error: no subcommand: {usage().splitlines()[0][len('usage: ') :]} "
            "(python -m benchmarks --help says what each measures)",
            file=sys.stderr,
        )
        return 2
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(
            f"error: unknown subcommand {name!r}: choose from {', '.join(SUBCOMMANDS)} "
            "(python -m benchmarks --help)",
            file=sys.stderr,
        )
        return 2
    from cudt.errors import CudtError
    from cudt.runner.cli import configure_process

    configure_process()
    module = importlib.import_module(f"benchmarks.{name}")
    try:
        return module.main(rest) or 0
    except CudtError as e:  # a file or flag the user gave, e.g. --checkpoint: one line
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    exit_process(main())
