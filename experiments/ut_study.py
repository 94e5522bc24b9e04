"""Which unrolled transformer meets the descent constraints: the UT's weight tying × eigenvalue
clip × residual connection, hard and resilient constraints, 3 seeds, each variant's phase I,
on the video default (issue 30; docs/results/video.md quotes its reports).

Tiny scale (what the tests run):

    python -m experiments.ut_study --scale tiny --seeds 1

The study at the video default (6 runner calls, 6 phase-I programs, then the settings stage on
the chosen UT):

    python -m experiments.ut_study --out runs/ut_study

The recorded study at the earlier default (γ_train = 0.5, dot attention, the shared ε = 0.1 and
dual rate 1000, the settings stage over rates 10-1000):

    python -m experiments.ut_study --gamma-train 0.5 --ut-attention dot --epsilon 0.1 \
        --dual-lr 1000 --dual-lrs 10,30,100,1000 --out runs/ut_study_0.5

Rerunning the same command with the same --out reuses finished calls and phase-I results.
Writes study.md and study.csv under --out and prints the report.
"""

from cudt.runner.cli import exit_process
from experiments.paper.ut_study import StudyConfig as Config
from experiments.paper.ut_study import main as study_main

__all__ = ["Config", "main"]


def main(argv=None) -> int:
    return study_main(argv, __doc__, "experiments.ut_study")


if __name__ == "__main__":
    exit_process(main())
