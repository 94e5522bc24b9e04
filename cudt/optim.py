"""The optimisers every runner-built step uses: Adam on the parameters, projected ascent on the
multipliers, each with its learning rate in its state (a per-run array under a sweep), and the
learning-rate schedules they share.

Anyone wiring :func:`cudt.make_train_step` the way the runner does imports these:

    init, step = cudt.make_train_step(layer_losses, primal_optimizer(1e-3, "cosine", steps),
                                      dual_optimizer("sgd", 1e3, "constant", steps - warmup), cfg)
"""

from __future__ import annotations

import optax

from cudt.constrained import as_dual, nupi, project_nonnegative
from cudt.constrained._dual import _check_lr

__all__ = ["DUAL_OPTIMIZERS", "SCHEDULES", "dual_optimizer", "lr_factor", "primal_optimizer"]

SCHEDULES = ("constant", "cosine", "linear")
DUAL_OPTIMIZERS = ("adam", "sgd", "nupi")  # the names dual_optimizer takes


def lr_factor(schedule: str, steps: int):
    """``count -> factor`` of a learning-rate schedule over ``steps`` updates (1 at count 0):
    constant 1; cosine ``(1 + cos(π t/steps))/2``; linear ``1 - t/steps``; both reach 0 at
    ``steps`` and stay there."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}: choose from {', '.join(SCHEDULES)}")
    if schedule == "cosine":
        return optax.cosine_decay_schedule(1.0, max(1, steps))
    if schedule == "linear":
        return optax.linear_schedule(1.0, 0.0, max(1, steps))
    return optax.constant_schedule(1.0)


def _scheduled(inner: optax.GradientTransformation, schedule: str, steps: int):
    if schedule == "constant":
        return inner  # no schedule state: checkpoints of constant-rate runs keep their layout
    return optax.chain(inner, optax.scale_by_schedule(lr_factor(schedule, steps)))


def primal_optimizer(
    lr: float, schedule: str = "constant", steps: int = 1
) -> optax.GradientTransformation:
    """Adam with its learning rate in its state (a per-run array under a sweep), times the
    factor of ``schedule`` over ``steps`` updates."""
    return _scheduled(optax.inject_hyperparams(optax.adam)(learning_rate=lr), schedule, steps)


def _nupi_raw(learning_rate, nupi_kp, nupi_ema):
    # the injected names are the knobs' (cudt.knobs): flag, sweep, results and state say nupi_*
    return nupi(learning_rate, kp=nupi_kp, ema_nu=nupi_ema, project=False)


def dual_optimizer(
    name: str,
    lr: float,
    schedule: str = "constant",
    steps: int = 1,
    *,
    nupi_kp: float = 0.0,
    nupi_ema: float = 0.0,
) -> optax.GradientTransformation:
    """Projected ascent with Adam (the paper), SGD or nuPI (:func:`cudt.nupi` with
    ``kp=nupi_kp`` and ``ema_nu=nupi_ema``, K_I = 1), the learning rate (and nuPI's ``nupi_kp``,
    ``nupi_ema``: the knobs' names, :mod:`cudt.knobs`) in its state, times
    the factor of ``schedule`` over ``steps`` dual updates (the dual state, and so the
    schedule's count, stands still during the primal warm-up)."""
    if name not in DUAL_OPTIMIZERS:
        raise ValueError(
            f"unknown dual optimiser {name!r}: choose from {', '.join(DUAL_OPTIMIZERS)}"
        )
    _check_lr("dual learning rate", lr)
    if name == "nupi":
        raw = optax.inject_hyperparams(_nupi_raw)(
            learning_rate=lr, nupi_kp=nupi_kp, nupi_ema=nupi_ema
        )
        return optax.chain(_scheduled(raw, schedule, steps), project_nonnegative())
    inner = optax.adam if name == "adam" else optax.sgd
    return as_dual(_scheduled(optax.inject_hyperparams(inner)(learning_rate=lr), schedule, steps))
