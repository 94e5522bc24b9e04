"""The per-run hyperparameters ("knobs"): one row each, read by every place that needs them.

A knob is a value that may differ between runs that share one compiled step: an array in the
train state (or, for ``gamma_train``, in the batch), so a sweep is a vmap over runs. Each row of
:data:`KNOBS` says

- ``name``: the one spelling of the flag (``--nupi-ema``, dashes for underscores), of
  ``--sweep`` and ``--model-hparams``, of a run's ``hparams`` in results.json, of the keyword
  of :func:`cudt.make_train_step`'s ``init`` and of its place in the state;
- ``short``: the label in run names and plots (``eps=0.05``);
- ``constrained_only``: ERM runs neither sweep it nor carry it (None in their ``hparams``);
- ``needs``: ``(field, values)`` when the knob only acts with some settings (the config's
  ``field`` one of ``values``): otherwise a run carries None for it and setting it is an error;
  ``role`` and ``where`` word that error. It is written here alone: the knob's flag takes it as
  its ``needs`` (:func:`cudt.runner.config.knob_needs`), as do the checks of ``--sweep`` and
  ``--model-hparams``;
- ``tuned_by``: the flag whose grid the runner tunes it over as lanes chosen on validation
  (``tune_epsilon``; :data:`TUNED_BY`, read by the sweep's grids and the command line's pins);
- ``goes``: where ``init`` puts it: ``problem`` (:func:`cudt.descent.hparams`, handed to the
  problem), ``primal`` / ``dual`` (an injected hyperparameter of that optimiser, under
  ``state_key`` where optax names it otherwise), ``penalty`` (the formulation's ρ) or ``data``
  (handed to the batch, not the state). ``slack`` names the explicit slacks' optimiser: no knob
  goes there yet. A ``dual`` knob steps the multipliers, and ``--formulation penalty`` has none
  (:data:`NO_MULTIPLIERS`): there it acts on nothing (:meth:`Knob.acts`), its flag named on
  the command line (or set in code to another value than its default) refused as any knob's
  where it acts on nothing (:meth:`Knob.idle_message`), a sweep of it refused, a run's
  ``hparams`` recording None for it (the dual optimiser's state keeps a place for it, unread). The flags of the multipliers'
  steps that are no knob (one value per run call: :data:`DUAL_FLAGS`) follow the same rule
  (:func:`multipliers_in`, :func:`no_multipliers_message`).

A new knob is one row here plus its use where it ``goes``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = [
    "DUAL_FLAGS",
    "DUAL_STEPS",
    "GOES",
    "KNOBS",
    "NO_MULTIPLIERS",
    "TUNED_BY",
    "Knob",
    "knob_names",
    "knobs",
    "multipliers_in",
    "no_multipliers_message",
]

GOES = ("problem", "primal", "dual", "penalty", "slack", "data")
# (field, values): the formulations without multipliers, where the knobs that go to the dual
# optimiser (its steps of the multipliers) act on nothing
NO_MULTIPLIERS = ("formulation", ("penalty",))
# the run flags that only step the multipliers and are no knob (one value per run call): the
# dual optimiser, its rate's schedule, the tuned dual-rate lanes; under NO_MULTIPLIERS they act
# on nothing, as the ``dual`` knobs (--update is not one: extragradient and optimistic steps
# extrapolate the parameters too)
DUAL_FLAGS = ("dual_optimizer", "dual_lr_schedule", "tune_dual_lr")


def multipliers_in(cfg: Any) -> bool:
    """Whether a run of ``cfg`` has multipliers to step (its formulation not one of
    :data:`NO_MULTIPLIERS`): where the dual knobs and :data:`DUAL_FLAGS` act."""
    field, values = NO_MULTIPLIERS
    return getattr(cfg, field, None) not in values


def no_multipliers_message(flag: str, cfg: Any) -> str:
    """The error for setting ``flag`` (``--dual-lr``), which steps the multipliers, in a run of
    ``cfg`` that has none (:func:`multipliers_in`)."""
    field, _ = NO_MULTIPLIERS
    return (
        f"{flag} steps the multipliers and --{field} {getattr(cfg, field)} has none (it "
        f"would act on nothing): drop {flag}, or pass --{field} lagrangian or augmented"
    )


@dataclasses.dataclass(frozen=True)
class Knob:
    """One per-run hyperparameter (see the module's docstring for each field)."""

    name: str
    short: str
    goes: str
    constrained_only: bool = True
    needs: tuple[str, tuple[str, ...]] | None = None
    role: str = ""  # what it is to the setting it needs: "the beta", "rho", "a gain"
    state_key: str | None = None  # its name in the optimiser's state, where optax fixes one
    tuned_by: str | None = None  # the flag whose grid the runner tunes it over (--tune-epsilon)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def active(self, cfg: Any) -> bool:
        """Whether the knob acts in a run of ``cfg`` (any object with the ``needs`` field)."""
        return self.needs is None or getattr(cfg, self.needs[0]) in self.needs[1]

    def acts(self, cfg: Any) -> bool:
        """Whether a run of ``cfg`` reads the knob: :meth:`active`, and a knob of the
        multipliers' steps (``goes`` dual) under a formulation that has multipliers. One that
        does not act is None in a run's ``hparams``, is not swept, and its flag is refused
        (:meth:`idle_message`); :meth:`active` alone decides whether the state holds a place
        for it."""
        return self.active(cfg) and (self.goes != "dual" or multipliers_in(cfg))

    def off_message(self) -> str:
        """The error for setting the knob where it does not act (``needs`` is not met)."""
        field, values = self.needs
        where = f"--{field.replace('_', '-')} {' or '.join(values)}"
        fix = where if len(values) == 1 else "one of them"
        return f"{self.flag} is {self.role} of {where}: pass {fix} or drop it"

    def idle_message(self, cfg: Any) -> str:
        """The error for setting the knob in a run of ``cfg`` that does not read it
        (:meth:`acts`): its ``needs`` unmet (:meth:`off_message`), or a knob of the
        multipliers' steps under a formulation without multipliers."""
        if not self.active(cfg):
            return self.off_message()
        return no_multipliers_message(self.flag, cfg)


KNOBS = (
    Knob("epsilon", "eps", "problem", tuned_by="tune_epsilon"),
    Knob("epsilon_schedule", "sched", "problem"),
    Knob("reference", "C", "problem"),
    Knob(
        "lr", "lr", "primal", constrained_only=False, state_key="learning_rate", tuned_by="tune_lr"
    ),
    Knob("dual_lr", "dlr", "dual", state_key="learning_rate", tuned_by="tune_dual_lr"),
    Knob("resilience", "alpha", "problem"),
    Knob("gamma_train", "gamma", "data", constrained_only=False),
    Knob("penalty", "rho", "penalty", needs=("formulation", ("augmented", "penalty")), role="rho"),
    Knob("tail_beta", "beta", "problem", needs=("constraint", ("tail",)), role="the beta"),
    Knob("nupi_kp", "kp", "dual", needs=("dual_optimizer", ("nupi",)), role="a gain"),
    Knob("nupi_ema", "nu", "dual", needs=("dual_optimizer", ("nupi",)), role="a gain"),
)


def knobs(goes: str | None = None) -> tuple[Knob, ...]:
    """The rows of :data:`KNOBS` (those that go to ``goes``), in the table's order."""
    return tuple(k for k in KNOBS if goes is None or k.goes == goes)


def knob_names(goes: str | None = None) -> tuple[str, ...]:
    return tuple(k.name for k in knobs(goes))


# every run flag that steps the multipliers (the dual knobs and :data:`DUAL_FLAGS`): a call
# under NO_MULTIPLIERS passes none of them (the dual study's penalty call, llm_section6's)
DUAL_STEPS = (*knob_names("dual"), *DUAL_FLAGS)

# each knob the runner tunes as lanes chosen on validation, and its grid's flag
TUNED_BY = {k.name: k.tuned_by for k in KNOBS if k.tuned_by}
