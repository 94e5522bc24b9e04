"""One runner for every task: config fields and checks, sweeps, devices, training groups,
evaluation, results, tables, plots and logs, written once (see :func:`run`)."""

from cudt.runner.config import RunConfig
from cudt.runner.run import run
from cudt.runner.task import EvalBatch, GroupModel, RunBatch, Task

__all__ = ["EvalBatch", "GroupModel", "RunBatch", "RunConfig", "Task", "run"]
