"""The fields every experiment shares, their checks declared once, and what is sweepable.

A task's config is a frozen dataclass that subclasses :class:`RunConfig` and adds its own
fields. Every field is declared with :func:`flag`: its help text, and its check (``positive``,
``at_least(n)``, ``in_range(lo, hi)``, ``one_of(...)``) and where it acts (``needs``: a
:class:`Needs`, refused set where nothing reads it; a knob's is its row's,
:func:`knob_needs`). The checks run in
``RunConfig.__post_init__`` for the base fields and the task's alike, and every float field
(scalar, optional or tuple) rejects NaN and infinities whatever its own check says. A task
changes the default of a shared field with :func:`shared` (``steps: int = shared("steps",
160)``), keeping its help and check, and adds cross-field checks in ``validate()``.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable, Collection, Sequence
from typing import Any

from cudt.constrained import RESILIENCE_MODES, UPDATES
from cudt.descent import CONSTRAINTS, DUAL_SCALES, PREVIOUS_LOSSES
from cudt.knobs import DUAL_FLAGS, KNOBS, multipliers_in, no_multipliers_message
from cudt.optim import DUAL_OPTIMIZERS, SCHEDULES
from cudt.runner.hparams import (
    CONDITIONAL,
    REFERENCE_SPELLINGS,
    SWEEPABLE,
    canonical_reference,
    is_reference,
    parse_epsilon_schedule,
)
from cudt.runner.sweep import (
    canonical_model_hparams,
    canonical_sweeps,
    parse_model_hparams,
    parse_sweeps,
)

__all__ = [
    "CONSTRAINT_KINDS",
    "FORMULATIONS",
    "Needs",
    "RunConfig",
    "at_least",
    "field_defaults",
    "flag",
    "in_range",
    "knob_needs",
    "one_of",
    "positive",
    "read_by_real_data",
    "sets_field",
    "shared",
    "unmet_needs",
]


CONSTRAINT_KINDS = CONSTRAINTS  # the descent problem's constraint kinds
FORMULATIONS = ("lagrangian", "augmented", "penalty")
# --inject-nan's KIND as the runs name their kinds (cudt.runner.record.KINDS)
INJECT_KINDS = ("ERM", "constrained")


@dataclasses.dataclass(frozen=True)
class Check:
    """A field's condition: ``ok(value)`` and how to say it (``"> 0"``, ``"lie in [0, 1)"``)."""

    ok: Callable[[Any], bool]
    text: str

    def message(self, name: str, value, *, is_float: bool, many: bool) -> str:
        shown = repr(value) if isinstance(value, str) else str(value)
        if self.text[0] in "<>" and is_float:
            what = "all be finite numbers" if many else "be a finite number"
            return f"{name} must {what} {self.text}, got {shown}"
        verb = "" if self.text.split()[0] in ("lie", "be") else "be "
        return f"{name} must {'all ' if many else ''}{verb}{self.text}, got {shown}"


positive = Check(lambda v: v > 0, "> 0")
non_negative = Check(lambda v: v >= 0, ">= 0")


def at_least(n) -> Check:
    return Check(lambda v: v >= n, f">= {n}")


def in_range(lo, hi) -> Check:
    return Check(lambda v: lo <= v < hi, f"lie in [{lo:g}, {hi:g})")


def one_of(*choices) -> Check:
    return Check(lambda v: v in choices, f"be one of {', '.join(map(str, choices))}")


@dataclasses.dataclass(frozen=True)
class Needs:
    """Where a flag acts (:func:`flag`'s ``needs``): ``ok(cfg)``, whether a config of these
    values reads the field, and ``says``, the one-line refusal when the field is set where
    ``ok`` is false (what was set, why it acts on nothing there, and the fix): a string, or
    ``says(cfg, flag)`` (``flag``: its spelling, ``--ut-b``)."""

    ok: Callable[[Any], bool]
    says: str | Callable[[Any, str], str]

    def message(self, cfg, flag: str) -> str:
        return self.says if isinstance(self.says, str) else self.says(cfg, flag)


def read_by_real_data(real: str) -> Needs:
    """``--data-dir``'s :class:`Needs` in a task with a ``synthetic`` dataset: it is read by a
    real one only (``real``: their names as the fix spells them, ``imdb|mnli``)."""
    return Needs(
        lambda c: c.dataset != "synthetic",
        lambda c, _: (
            f"--data-dir {c.data_dir} is read only by a real dataset, and --dataset is "
            f"synthetic: pass --dataset {real}, or drop --data-dir"
        ),
    )


def flag(
    default,
    help: str,
    *,
    check: Check | None = None,
    needs: Needs | None = None,
    repeat: bool = False,
    path: bool = False,
    unordered: bool = False,
    canonical: Callable[[Any], Any] | None = None,
    default_text: str | None = None,
    **kw,
):
    """A config field: its default, help text and check (applied to each element of a tuple,
    skipped for None). ``needs``: where the flag acts (:class:`Needs`, e.g. ``--ut-b`` where
    ``--models`` trains a UT); set to other than its default where ``needs.ok`` is false, it
    would act on nothing, and the config is refused with ``needs.says`` (:func:`unmet_needs`,
    run by every :class:`RunConfig`; a job's own options call it in their checks).
    ``repeat``: a flag given several times (``--sweep A --sweep B``); ``path``: it names a file
    or folder; ``unordered``: a list whose order means nothing; ``canonical``: what a value
    names, however spelt (a resume spelling any of these another way resumes:
    ``cudt.runner.output``); ``default_text``: the default as ``--help`` gives it where the
    value does not say it (None standing for a rule: ``--lr``'s "the task's")."""
    metadata = {"help": help, "check": check, "needs": needs, "repeat": repeat}
    metadata |= {"default_text": default_text}
    if unordered:  # the same values in another order name the same
        canonical = sorted if canonical is None else canonical
    metadata |= {"path": path, "canonical": canonical}
    if isinstance(default, list | dict | set):
        raise TypeError("use a tuple default for a config field")
    return dataclasses.field(default=default, metadata=metadata, **kw)


def field_defaults(config) -> dict[str, Any]:
    """``{field: default}`` of a config dataclass (a class or an instance): for a task's config,
    the task's own defaults (:func:`shared`)."""
    return {f.name: f.default for f in dataclasses.fields(config)}


def sets_field(config, name: str, value) -> bool:
    """Whether ``value`` of field ``name`` of ``config`` (a dataclass of :func:`flag` fields, a
    class or an instance) sets it: other than its default, and, for a field of
    :class:`RunConfig` whose default the task changed (:func:`shared`), other than RunConfig's
    own too, the value every other task runs it at (a task whose default is nupi may still be
    run with sgd and a gain at its neutral 0)."""
    if value == field_defaults(config)[name]:
        return False
    cls = config if isinstance(config, type) else type(config)
    if not issubclass(cls, RunConfig):
        return True
    base = field_defaults(RunConfig)
    return name not in base or value != base[name]


def unmet_needs(config, given: Collection[str] | None = None) -> str | None:
    """The refusal of the first field of ``config`` (a dataclass of :func:`flag` fields) set
    where its ``needs`` is not met, else None: a flag that would act on nothing. Set: named on
    the command line (``given``: the fields argparse saw, whatever their values), else, for a
    config built in code, other than its default (:func:`sets_field`)."""
    for f in dataclasses.fields(config):
        needs = f.metadata.get("needs")
        if needs is None or needs.ok(config):
            continue
        if given is None:
            set_ = sets_field(config, f.name, getattr(config, f.name))
        else:
            set_ = f.name in given
        if set_:
            return needs.message(config, _flag_name(f.name))
    return None


def knob_needs(name: str) -> Needs:
    """The :class:`Needs` of the flag of a knob that acts only with some settings: its row of
    :data:`cudt.knobs.KNOBS` (``needs``, and a ``dual`` knob's formulation with multipliers:
    the rule, written there alone, :meth:`~cudt.knobs.Knob.acts`; ``idle_message``: the
    refusal), which the sweep's and ``--model-hparams``'s checks read as well."""
    (knob,) = (k for k in KNOBS if k.name == name and (k.needs is not None or k.goes == "dual"))
    return Needs(knob.acts, lambda cfg, _: knob.idle_message(cfg))


def dual_needs(name: str) -> Needs:
    """The :class:`Needs` of a flag of :data:`cudt.knobs.DUAL_FLAGS` (``name``), which steps
    the multipliers and is no knob: the rule and refusal of the ``dual`` knobs
    (:func:`cudt.knobs.multipliers_in`), written there alone."""
    assert name in DUAL_FLAGS, name
    return Needs(multipliers_in, lambda cfg, flag: no_multipliers_message(flag, cfg))


def shared(name: str, default, default_text: str | None = None):
    """A shared field of :class:`RunConfig` with another default (same help and check);
    ``default_text``: that default in ``--help``'s words where the value does not say it (a
    task's rule for ``--lr``'s None)."""
    base = {f.name: f for f in dataclasses.fields(RunConfig)}[name]
    metadata = dict(base.metadata)
    if default_text is not None:
        metadata["default_text"] = default_text
    return dataclasses.field(default=default, metadata=metadata)


def _is_float_type(tp) -> bool:
    if tp is float:
        return True
    args = typing.get_args(tp)
    return any(_is_float_type(a) for a in args if a is not type(None) and a is not Ellipsis)


def _flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """What every experiment shares: runs, training, constraints, evaluation and output."""

    # -- runs --------------------------------------------------------------------------------
    seeds: int = flag(
        2,
        "seeds per setting: each seed on its own draw of the data is its own program, trained "
        "after the others (with --data-seed, the seeds are lanes of one program)",
        check=at_least(1),
    )
    seed: int = flag(
        0, "first seed; each seed also seeds its data unless --data-seed", check=non_negative
    )
    data_seed: int | None = flag(
        None,
        "one draw of the data (splits, generated sets, the shared start, the evaluation noise) "
        "for every seed; default: each seed draws its own from its seed, so seeds are "
        "independent replicates (--seed 1 --seeds 2 then trains seeds 1 and 2 of --seed 0 "
        "--seeds 3). --data-seed D: all seeds on D's draw (they then vary only the "
        "initialisation and the batch order)",
        check=non_negative,
    )
    sweep: tuple[str, ...] = flag(
        (),
        "NAME=V1,V2,...: train every value of NAME (one of " + ", ".join(SWEEPABLE) + "); "
        "repeat for a Cartesian product; all points train as lanes of one program per model "
        "structure and draw of the data (each seed's own, or --data-seed's)",
        repeat=True,
        canonical=canonical_sweeps,
    )
    model_hparams: tuple[str, ...] = flag(
        (),
        "MODEL:NAME=V[,NAME=V...]: a model's own values of per-run hyperparameters (the names "
        "of --sweep), e.g. ut:epsilon=0.05,dual_lr=100; they replace the flags' defaults for "
        "that model's runs, while a flag set to another value or a --sweep wins",
        repeat=True,
        canonical=canonical_model_hparams,
    )
    tune_epsilon: tuple[float, ...] = flag(
        (),
        "epsilon values the constrained runs train as lanes of one program when --epsilon is "
        "not set: the runner chooses one on validation (every seed feasible and monotone, "
        "then the task's score) and reports it against ERM's choice of --tune-lr; one value: "
        "that epsilon alone; empty (the shared default): --epsilon",
        check=in_range(0.0, 1.0),
    )
    tune_dual_lr: tuple[float, ...] = flag(
        (),
        "dual learning rates the constrained runs also train as lanes (crossed with "
        "--tune-epsilon) when --dual-lr is not set, one point chosen on validation by the same "
        "rule; give ERM as many lanes with --tune-lr; empty (the shared default): --dual-lr",
        check=positive,
        needs=dual_needs("tune_dual_lr"),
    )
    tune_lr: tuple[float, ...] = flag(
        (),
        "factors of the learning rate the ERM runs train as lanes when --lr is not set (as "
        "many tuned lanes as the constrained runs' --tune-epsilon), one chosen on validation; "
        "--tune-lr 1: the learning rate alone",
        check=positive,
    )
    kinds: str = flag(
        "both",
        "which runs to train: both (ERM and constrained), erm, or constrained (e.g. a study "
        "that trains its ERM reference once)",
        check=one_of("both", "erm", "constrained"),
    )
    # -- training ----------------------------------------------------------------------------
    steps: int = flag(800, "training steps per run", check=at_least(1))
    batch_size: int = flag(32, "examples per batch", check=at_least(1))
    lr: float | None = flag(
        None, "primal Adam learning rate", check=positive, default_text="the task's, per model"
    )
    lr_schedule: str = flag(
        "constant",
        "primal learning-rate schedule over --steps: constant, cosine or linear (decay to 0)",
        check=one_of(*SCHEDULES),
    )
    gamma_train: float = flag(0.5, "training perturbation level gamma", check=non_negative)
    test_gammas: tuple[float, ...] | None = flag(
        None, "test perturbation levels", check=non_negative, default_text="the task's grid"
    )
    # -- constraints -------------------------------------------------------------------------
    epsilon: float = flag(0.1, "descent factor: l_l <= (1-eps) l_{l-1}", check=in_range(0.0, 1.0))
    epsilon_schedule: str = flag(
        "constant",
        "how each constrained run's epsilon reaches its value: constant, or SHAPE:START@STEPS"
        "[+BEGIN] (linear, cosine or step), from START to the run's own epsilon over STEPS steps "
        "after BEGIN, e.g. linear:0@200 (sweepable: --sweep epsilon_schedule=constant,linear:0@200)",
    )
    epsilon_margin: float = flag(
        0.0,
        "train each constrained run's descent constraints at epsilon + this margin and judge "
        "them at epsilon on validation (feasibility, the choice of a point): room for how much "
        "a constraint held at its edge on the training batches moves on held-out data",
        check=in_range(0.0, 1.0),
    )
    reference: str = flag(
        "none",
        "bound C of the reference constraint E l_0 <= C: a number, none, or (classification) "
        "chance = ln(number of classes), chance+X = ln(number of classes) + X",
        canonical=canonical_reference,
    )
    resilience: float | None = flag(
        None, "resilience alpha (none: hard constraints)", check=positive
    )
    resilience_mode: str = flag(
        "decay",
        "decay (dual weight decay 1/alpha) or slack (explicit slacks, restarted every epoch)",
        check=one_of(*RESILIENCE_MODES),
    )
    slack_lr: float = flag(1e-2, "learning rate of explicit slacks", check=positive)
    constraint: str = flag(
        "mean",
        "descent constraints: mean (E l_l <= (1-eps) E l_{l-1}), indexed (l_l(x_i) <= (1-eps) "
        "l_{l-1}(x_i) for every training example, one multiplier per example and layer) or tail "
        "(CVaR_beta of the per-sample ratio l_l/l_{l-1} <= 1-eps); the reference stays a mean",
        check=one_of(*CONSTRAINT_KINDS),
    )
    multipliers: str = flag(
        "table",
        "multipliers of --constraint indexed: table (one per training example and layer, a "
        "table that grows with the data) or implicit (a small model from each example's "
        "per-layer log-loss ratios to its multipliers, trained by dual ascent: its size does "
        "not depend on the data)",
        check=one_of("table", "implicit"),
    )
    tail_beta: float = flag(
        0.1,
        "beta of --constraint tail: the mean of the largest ceil(beta*B) ratios of a batch",
        check=Check(lambda v: 0 < v <= 1, "lie in (0, 1]"),
        needs=knob_needs("tail_beta"),
    )
    formulation: str = flag(
        "lagrangian",
        "lagrangian, augmented (augmented Lagrangian, + (rho/2) h^2) or penalty (quadratic "
        "penalty (rho/2) max(g, 0)^2, no multipliers)",
        check=one_of(*FORMULATIONS),
    )
    penalty: float = flag(
        1.0,
        "penalty coefficient rho of --formulation augmented or penalty",
        check=non_negative,
        needs=knob_needs("penalty"),
    )
    update: str = flag(
        "simultaneous",
        "primal-dual update: simultaneous, alternating (dual first, then primal with the new "
        "multipliers, one forward), extragradient (two gradients a step) or optimistic "
        "(extrapolation from the past, one gradient a step)",
        check=one_of(*UPDATES),
    )
    dual_optimizer: str = flag(
        "adam",
        "adam (the paper), sgd or nupi (PI control: --nupi-kp, --nupi-ema)",
        check=one_of(*DUAL_OPTIMIZERS),
        needs=dual_needs("dual_optimizer"),
    )
    nupi_kp: float = flag(
        0.0,
        "proportional gain K_P of --dual-optimizer nupi",
        check=non_negative,
        needs=knob_needs("nupi_kp"),
    )
    nupi_ema: float = flag(
        0.0,
        "EMA factor nu of the error in --dual-optimizer nupi",
        check=in_range(0.0, 1.0),
        needs=knob_needs("nupi_ema"),
    )
    dual_scale: str = flag(
        "relative",
        "units of the dual step: relative (each constraint over the loss it bounds, a "
        "stop-gradient of the batch's mean l_{l-1}: the dual step ascends the relative "
        "violation, so --dual-lr, --penalty and --resilience are dimensionless and mean the "
        "same on any data) or absolute (the loss's own units, the paper's)",
        check=one_of(*DUAL_SCALES),
    )
    previous_loss: str = flag(
        "differentiable",
        "how a descent constraint l_l <= (1-eps) l_{l-1} reads l_{l-1}: differentiable (the "
        "paper's: its gradient also raises the earlier state's loss, weight -(1-eps) lambda_l) "
        "or stop_gradient (a target: the Lagrangian's gradient only lowers losses)",
        check=one_of(*PREVIOUS_LOSSES),
    )
    dual_lr: float = flag(5e-2, "dual learning rate", check=positive, needs=knob_needs("dual_lr"))
    dual_lr_schedule: str = flag(
        "constant",
        "dual learning-rate schedule over the steps after the warm-up: constant, cosine or "
        "linear (decay to 0: the multipliers settle before the end)",
        check=one_of(*SCHEDULES),
        needs=dual_needs("dual_lr_schedule"),
    )
    warmup_steps: int | None = flag(
        None, "primal warm-up steps with duals frozen (default: one epoch)", check=non_negative
    )
    tolerance: float = flag(
        0.05,
        "feasibility tolerance on held-out data, relative to the previous layer's loss",
        check=non_negative,
    )
    # -- loop, evaluation, devices -----------------------------------------------------------
    chunk_steps: int = flag(100, "steps per compiled chunk (log every)", check=at_least(1))
    eval_batch_size: int = flag(512, "examples per evaluation batch", check=at_least(1))
    devices: int | None = flag(
        None, "use at most this many devices (default: every visible one)", check=at_least(1)
    )
    fsdp: bool = flag(
        False,
        "fully sharded data parallel: split each run's parameters and optimizer states over "
        "the devices of its data axis too (for models that do not fit one device)",
    )
    distributed: bool = flag(
        False,
        "multi-host job: call jax.distributed.initialize() first (SLURM, TPU VM, or the "
        "JAX_COORDINATOR_ADDRESS/JAX_NUM_PROCESSES/JAX_PROCESS_ID variables)",
    )
    # -- output ------------------------------------------------------------------------------
    checkpoint_every: int | None = flag(
        None, "steps between checkpoints (default: every chunk)", check=at_least(1)
    )
    keep_checkpoints: int = flag(2, "checkpoints kept per group", check=at_least(1))
    out: str | None = flag(
        None,
        "output folder (default: a fresh runs/<experiment>-<time>); rerunning with the same "
        "--out and flags resumes from its checkpoints",
    )
    resume: bool = flag(
        False,
        "require a checkpoint in --out to resume from (resuming is automatic when --out holds "
        "checkpoints of the same config)",
    )
    overwrite: bool = flag(False, "discard results and checkpoints already in --out")
    figures: bool = flag(
        True,
        "draw the PNG figures; --no-figures skips them (a batch job), results.json the same. No "
        "command redraws them from results.json: rerun the command without --no-figures on a "
        "copy of --out without its results.json, which trains nothing (docs/runner.md)",
    )
    inject_nan: tuple[str, ...] | None = flag(
        None,
        "fault injection for testing divergence handling: MODEL,KIND,SEED,STEP (e.g. "
        "ut,constrained,0,30) makes the batch of that run (every sweep point of it) NaN at STEP",
    )

    # Where and how the runs execute, how many checkpoints are kept and whether figures are
    # drawn, which do not change what a run computes: in no fingerprint, so a checkpoint stays
    # valid when only these differ (class attributes).
    RESUME_IGNORES: typing.ClassVar[tuple[str, ...]] = (
        "out",
        "overwrite",
        "resume",
        "figures",
        "eval_batch_size",
        "devices",
        "distributed",
        "fsdp",
        "keep_checkpoints",
    )
    # What a run does once it has trained and evaluated (write its models elsewhere): a finished
    # run read back (cudt.runner.finished) takes their defaults, so nothing is done again.
    AFTER_TRAINING: typing.ClassVar[tuple[str, ...]] = ()
    # What only the evaluation after training reads: not in a checkpoint's fingerprint, so a
    # finished run's checkpoints can be evaluated again with other values (docs/runner.md).
    EVALUATION_ONLY: typing.ClassVar[tuple[str, ...]] = ("test_gammas", "tolerance")
    # The fields of a checkpoint's record naming where files lie (a path flag, a line of the
    # task's fingerprint derived from one: the data's ``data_source``), each with the digests
    # of what they hold (``{field: (digest, *more)}``): a resume, and a finished run read
    # back, compare the digests, not the paths (the same files copied or moved elsewhere
    # resume), and the path where the first digest is not recorded on both sides (an older
    # record). One entry per pair: cudt.runner.output.described_alike.
    DESCRIBED_BY: typing.ClassVar[dict[str, tuple[str, ...]]] = {"data_source": ("train_digest",)}
    # Fields a later version added, each with the value that is what earlier versions did: a
    # checkpoint written before the field existed resumes when the run keeps that value.
    ADDED: typing.ClassVar[dict[str, typing.Any]] = {
        "epsilon_schedule": "constant",
        "multipliers": "table",
        "previous_loss": "differentiable",
        "epsilon_margin": 0.0,
    }

    def __post_init__(self):
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            many = isinstance(value, tuple)
            values = value if many else (value,)
            name = _flag_name(f.name)
            is_float = _is_float_type(hints[f.name])
            check = f.metadata.get("check")
            for v in values:
                finite = not (isinstance(v, float) and not math.isfinite(v))
                if finite and (check is None or check.ok(v)):
                    continue
                if check is None:
                    what = "all be finite numbers" if many else "be a finite number"
                    raise ValueError(f"{name} must {what}, got {v}")
                raise ValueError(check.message(name, v, is_float=is_float, many=many))
        self._validate_shared()
        unmet = unmet_needs(self)  # a task's flag set where nothing reads it (its needs)
        self.require(unmet is None, unmet or "")
        self.validate()

    @classmethod
    def idle_flags(cls, values: typing.Mapping[str, Any]) -> tuple[str, ...]:
        """The fields that act on nothing in a config of ``values`` (``{field: value}``, a
        missing field at its default): those whose ``needs`` (:func:`flag`) is not met. Set on a
        command line, such a flag is refused (:func:`unmet_needs`); recorded by an earlier
        version that accepted it, it is read back at its default (a finished run:
        :func:`cudt.runner.finished.finished_run`; a resume ignores it)."""
        view = types.SimpleNamespace(**(field_defaults(cls) | dict(values)))
        return tuple(
            f.name
            for f in dataclasses.fields(cls)
            if f.metadata.get("needs") is not None and not f.metadata["needs"].ok(view)
        )

    @staticmethod
    def require(condition, message: str) -> None:
        """Cross-field checks: ``message`` (the flag, the problem and the fix) unless true."""
        if not condition:
            raise ValueError(message)

    def _validate_shared(self) -> None:
        need = self.require
        need(
            self.out is None or bool(self.out.strip()),
            "--out needs a path: pass --out DIR, or leave it out for a fresh "
            "runs/<experiment>-<time>",
        )
        need(
            not (self.resume and self.overwrite),
            "--resume and --overwrite contradict each other: pass one of them",
        )
        need(
            not self.resume or self.out is not None,
            "--resume needs --out DIR, the folder to resume: without it the run gets a fresh "
            "runs/<experiment>-<time>, which holds nothing to resume from",
        )
        need(
            self.resilience_mode == "decay" or self.resilience is not None,
            "--resilience-mode slack needs --resilience ALPHA",
        )
        need(
            self.multipliers == "table" or self.constraint == "indexed",
            "--multipliers implicit needs per-example constraints: pass --constraint indexed "
            "or drop --multipliers",
        )
        need(
            self.multipliers == "table" or self.formulation != "penalty",
            "--multipliers implicit has no multipliers to learn under --formulation penalty: "
            "pass --formulation lagrangian or augmented, or drop --multipliers",
        )
        need(
            self.multipliers == "table" or self.resilience_mode == "decay",
            "--multipliers implicit cannot keep explicit slacks (a table of one per example): "
            "pass --resilience-mode decay or --multipliers table",
        )
        need(
            self.warmup_steps is None or self.warmup_steps < self.steps,
            f"--warmup-steps {self.warmup_steps} freezes the multipliers for all {self.steps} "
            "steps, so the constrained runs would train as ERM: pass --warmup-steps below "
            "--steps",
        )
        need(
            is_reference(self.reference),
            f"--reference must be {REFERENCE_SPELLINGS}, got {self.reference!r}",
        )
        try:
            parse_epsilon_schedule(self.epsilon_schedule, self.steps)
        except ValueError as e:
            need(False, f"--epsilon-schedule {e}")
        self._validate_inject_nan()
        # Sweep syntax is checked here so a typo fails before any data is read.
        sweeps = parse_sweeps(self)
        own = parse_model_hparams(self)
        if self.epsilon_margin:
            trained = {self.epsilon, *self.tune_epsilon, *sweeps.get("epsilon", ())}
            trained |= {hp["epsilon"] for hp in own.values() if "epsilon" in hp}
            need(
                max(trained) + self.epsilon_margin < 1.0,
                f"--epsilon-margin {self.epsilon_margin:g} trains epsilon {max(trained):g} at "
                f"{max(trained) + self.epsilon_margin:g} (at least 1: a loss below 0): pass a "
                "smaller margin",
            )
        self._validate_dual_dynamics(sweeps, own)

    def _validate_inject_nan(self) -> None:
        """``--inject-nan MODEL,KIND,SEED,STEP``: its syntax, and a fault this run would fire (a
        seed, kind and step it trains: a fault that never fires passes its test vacuously); the
        model and its runs of KIND are checked with the runs (``cudt.runner.run``)."""
        if self.inject_nan is None:
            return
        need, parts = self.require, self.inject_nan
        # KIND in any case (--kinds spells it erm): kept as the runs name their kinds
        kinds = {k.lower(): k for k in INJECT_KINDS}
        if len(parts) == 4 and parts[1].lower() in kinds:
            parts = (parts[0], kinds[parts[1].lower()], *parts[2:])
            object.__setattr__(self, "inject_nan", parts)  # frozen: set once, validated
        ok = (
            len(parts) == 4
            and parts[1] in INJECT_KINDS
            and parts[2].isdigit()
            and parts[3].isdigit()
            and int(parts[3]) >= 1
        )
        need(
            ok,
            "--inject-nan must be MODEL,KIND,SEED,STEP with KIND erm or constrained (any case; "
            f"e.g. ut,constrained,0,30), got {','.join(parts)!r}",
        )
        need(
            self.seed <= int(parts[2]) < self.seed + self.seeds,
            f"--inject-nan seed {parts[2]} is not among the seeds trained "
            f"({self.seed}..{self.seed + self.seeds - 1})",
        )
        need(
            int(parts[3]) <= self.steps,
            f"--inject-nan step {parts[3]} is past the last of --steps {self.steps}, so the "
            f"fault would never fire: pass a STEP from 1 to {self.steps}",
        )
        need(
            self.kinds in ("both", parts[1].lower()),
            f"--inject-nan kind {parts[1]} is not trained with --kinds {self.kinds}: pass KIND "
            f"{'ERM' if self.kinds == 'erm' else 'constrained'}, or --kinds both",
        )

    def _validate_dual_dynamics(self, sweeps, own) -> None:
        need = self.require
        for knob in CONDITIONAL:  # a knob swept where it does not act (cudt.knobs: its needs;
            # its flag set there: the flag's needs, the same row, unmet_needs)
            need(knob.active(self) or knob.name not in sweeps, knob.off_message())
            for model, values in own.items():  # a model's own value of it, the same
                need(
                    knob.active(self) or knob.name not in values,
                    f"--model-hparams {model}: {knob.off_message()}",
                )
        # the multipliers' steps of a formulation without multipliers (cudt.knobs: Knob.acts):
        # lanes of them would train one problem
        for name in (k.name for k in KNOBS if k.active(self) and not k.acts(self)):
            need(
                name not in sweeps and not any(name in values for values in own.values()),
                f"{name} varies the multipliers' steps and --formulation {self.formulation} has "
                "none (its lanes would train one problem): drop it from --sweep and "
                "--model-hparams, or pass --formulation lagrangian or augmented",
            )

    def validate(self) -> None:
        """Cross-field checks of a task's config: raise ValueError with the flag and the fix."""

    @property
    def data_rng_seed(self) -> int:
        """The seed of the data and the evaluation noise: ``--data-seed``, else ``--seed``."""
        return self.seed if self.data_seed is None else self.data_seed

    @property
    def seed_list(self) -> list[int]:
        return [self.seed + i for i in range(self.seeds)]

    def resolved_defaults(self) -> dict[str, Any]:
        """``{flag: the value it takes when not given}`` for a flag whose default (None) the
        config resolves from its other flags (``LLMConfig``: ``--lora-alpha`` from the rank):
        given at that value it trains the default's runs, so a resume spelling it either way
        resumes the other's checkpoints (:func:`cudt.runner.output.open_output`; the runner
        adds the defaults a task resolves, ``--lr``: :func:`cudt.runner.run.task_defaults`)."""
        return {}

    def fingerprint(self, *, evaluation: bool = False) -> dict[str, Any]:
        """The fields a checkpoint depends on: the config minus where and how the runs execute
        (``RESUME_IGNORES``) and what only the evaluation reads (``EVALUATION_ONLY``);
        ``evaluation=True``: the fields a run's results depend on (the latter included)."""
        ignore = set(self.RESUME_IGNORES) | (set() if evaluation else set(self.EVALUATION_ONLY))
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in ignore}


def model_list(value: Sequence[str]) -> tuple[str, ...]:
    return tuple(value)
