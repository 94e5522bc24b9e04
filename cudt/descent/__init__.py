"""The paper's layerwise-descent problem on the one constrained step (:mod:`cudt.constrained`):
its configuration, the problem and its metrics, and the train step by the paper's name.

    problem = cudt.descent.problem(layer_losses, cfg, constraint="mean")
    state = init(params, constraints=cudt.descent.constraints(cfg),
                 hparams=cudt.descent.hparams(cfg))
    lam = cudt.descent.multipliers(state)  # [L+1], index 0 the reference

Each idea is a module of this package (``_config``, ``_problem``, ``_step``); import the names
from here (or :func:`cudt.make_train_step` and :class:`cudt.DescentConfig` from :mod:`cudt`).
"""

from cudt.descent import _problem
from cudt.descent._config import DUAL_SCALES, PREVIOUS_LOSSES, DescentConfig
from cudt.descent._problem import *  # noqa: F403  (the names of its __all__)
from cudt.descent._step import make_train_step

__all__ = ["DUAL_SCALES", "PREVIOUS_LOSSES", "DescentConfig", "make_train_step", *_problem.__all__]
