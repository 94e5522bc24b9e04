"""Which unrolled transformer meets the descent constraints: the UT's weight tying × eigenvalue
clip × residual connection, hard and resilient constraints, 3 seeds, each variant's phase I,
on the video default (issue 30; docs/results/video.md quotes its report).

Tiny scale (what the tests run):

    python -m experiments.ut_study --scale tiny --seeds 1

The study (8 runner calls and 8 phase-I programs on this 2-core CPU):

    python -m experiments.ut_study --out runs/ut_study

Rerunning the same command with the same --out reuses finished calls and phase-I results.
Writes study.md and study.csv under --out and prints the report.
"""

import sys

from cudt.paper.ut_study import StudyConfig as Config
from cudt.paper.ut_study import main as study_main

__all__ = ["Config", "main"]


def main(argv=None) -> int:
    return study_main(argv, __doc__, "experiments.ut_study")


if __name__ == "__main__":
    sys.exit(main())
