"""The paper's layerwise-descent problem on the one constrained step (:mod:`cudt.constrained`):
its configuration, the problem and its metrics, and the train step by the paper's name.

    problem = cudt.descent.problem(layer_losses, cfg, constraint="mean")
    state = init(params, constraints=cudt.descent.constraints(cfg),
                 hparams=cudt.descent.hparams(cfg))
    lam = cudt.descent.multipliers(state)  # [L+1], index 0 the reference

Each idea is a module of this package (``_config``, ``_problem``, ``_step``); import the names
from here (or :func:`cudt.make_train_step` and :class:`cudt.DescentConfig` from :mod:`cudt`).
"""

from cudt.descent._config import (
    DUAL_SCALES,
    DescentConfig,
)
from cudt.descent._problem import (
    CONSTRAINTS,
    OBJECTIVES,
    RATIO_FLOOR,
    SCALE_FLOOR,
    constraint_values,
    constraints,
    hparams,
    loss_features,
    metrics,
    multipliers,
    problem,
    scales,
    slacks,
    tail_values,
    violation,
)
from cudt.descent._step import make_train_step

__all__ = [
    "CONSTRAINTS",
    "DUAL_SCALES",
    "OBJECTIVES",
    "RATIO_FLOOR",
    "SCALE_FLOOR",
    "DescentConfig",
    "constraint_values",
    "constraints",
    "hparams",
    "loss_features",
    "make_train_step",
    "metrics",
    "multipliers",
    "problem",
    "scales",
    "slacks",
    "tail_values",
    "violation",
]
