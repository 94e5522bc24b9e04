"""Which dual dynamics keep the descent constraints feasible and the losses monotone: every
formulation × dual optimiser × update, over a 100x range of dual step sizes and 3 seeds, on the
video default (DUST-5), the constrained UT-5 and the text default (MiniLM-6).

Tiny scale (what the tests run):

    python -m experiments.dual_study --scale tiny --settings video --seeds 1

The full study (one runner call per setting × combination, each one vmapped program of its
step sizes × seeds; long on a CPU: a batch job, best on a GPU):

    python -m experiments.dual_study --out runs/dual_study

Rerunning the same command with the same --out reuses finished calls and resumes interrupted
ones. Writes study.md, study.csv, success.png, by_step_size.png and multipliers.png under --out
and prints one headline line per setting.
"""

from cudt.runner.cli import exit_process
from experiments.paper.dual_study import StudyConfig as Config
from experiments.paper.dual_study import main as study_main

__all__ = ["Config", "main"]


def main(argv=None) -> int:
    return study_main(argv, __doc__, "experiments.dual_study")


if __name__ == "__main__":
    exit_process(main())
