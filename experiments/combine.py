"""One report from the runs of several output folders of one experiment (a job's seeds trained
as separate commands, each seed on its own draw of the data, or all on ``--data-seed``'s).

    python -m experiments.llm_section6 --seeds 1 --out runs/s0
    python -m experiments.llm_section6 --seed 1 --seeds 2 --out runs/s12
    python -m experiments.combine runs/s0 runs/s12

Prints the experiment's summary table and footer over every run of the folders (intervals over
seeds, paired constrained − ERM intervals, the best run and the sweep point chosen on
validation data); it refuses folders of another experiment, other data or other settings. One
folder: its report again, as this version writes it. :mod:`cudt.runner.combine`; a task of
your own (not one of cudt's): ``print(cudt.runner.combine.combine(YourTask(), folders))``.

``--per-folder``: folders on different data sets (a held-out data set per seed, each command
with its own ``--data-dir``): each folder's point is chosen on its own validation data, and the
chosen constrained − chosen ERM paired t runs over the seeds of the folders where both kinds
chose, with how many did::

    python -m experiments.combine --per-folder runs/plaza0 runs/plaza1 runs/plaza2

``--point dual_lr=0.1`` (with ``--per-folder``): the constrained runs at that point in every
folder, against each folder's chosen ERM: a lane reported at every seed, not a choice.
"""

import argparse

from cudt.errors import CudtError
from cudt.runner.cli import OneLineParser, exit_process, run_cli
from cudt.runner.combine import combine, combine_per_folder, load_results
from cudt.tasks.llm import LLMTask
from cudt.tasks.text import TextTask
from cudt.tasks.video import VideoTask

__all__ = ["main"]

TASKS = {t.name: t for t in (VideoTask, TextTask, LLMTask)}


def main(argv=None) -> int:
    parser = OneLineParser(
        prog="python -m experiments.combine", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("folders", nargs="+", help="finished runs' --out folders")
    parser.add_argument(
        "--per-folder",
        action="store_true",
        help="each folder on its own data set: each chooses its own point on its own "
        "validation data; the paired t runs over the folders where both kinds chose",
    )
    parser.add_argument(
        "--point",
        type=_point,
        default=None,
        metavar="NAME=V[,NAME=V]",
        help="with --per-folder: the constrained runs at this point in every folder (e.g. "
        "dual_lr=0.1) against each folder's chosen ERM, instead of each folder's choice: a "
        "lane reported at every seed, not chosen",
    )
    args = parser.parse_args(argv)
    if args.point and not args.per_folder:
        parser.error("--point goes with --per-folder: pass both")
    return run_cli(lambda: _report(args.folders, args.per_folder, args.point))


def _point(text: str) -> dict[str, str]:
    """``dual_lr=0.1,epsilon=0.05`` -> ``{"dual_lr": "0.1", "epsilon": "0.05"}``."""
    point = {}
    for item in text.split(","):
        name, eq, value = item.partition("=")
        if not eq or not name.strip() or not value.strip():
            raise argparse.ArgumentTypeError(f"{item!r} is not NAME=VALUE (e.g. dual_lr=0.1)")
        value = value.strip()
        try:
            value = f"{float(value):g}"  # as the summary prints it: 0.10 -> 0.1
        except ValueError:
            pass
        point[name.strip()] = value
    return point


def _report(folders, per_folder: bool = False, point=None) -> None:
    name = load_results(folders[0]).get("experiment")
    if name not in TASKS:
        raise CudtError(
            f"{folders[0]}: unknown experiment {name!r} (this command knows "
            f"{', '.join(TASKS)}): combine a task of your own in Python, "
            "print(cudt.runner.combine.combine(YourTask(), folders)) (or combine_per_folder)"
        )
    if per_folder:
        print(combine_per_folder(TASKS[name](), folders, point))
    else:
        print(combine(TASKS[name](), folders))


if __name__ == "__main__":
    exit_process(main())
