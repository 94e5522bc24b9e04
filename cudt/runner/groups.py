"""Training groups: runs that share a model structure, trained as one vmapped program.

An experiment's runs (sweep points × seeds, ERM and constrained) are grouped by model structure
(:func:`plan_groups`); a group's step, initial states and per-run arrays are one
:class:`GroupProgram`, trained by :func:`run_group` (:func:`cudt.loop.train_group` with a
progress bar, checkpoints and divergence messages).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from cudt.checkpoint import GroupCheckpointer
from cudt.constrained import AugmentedLagrangian, Lagrangian, QuadraticPenalty
from cudt.descent import DescentConfig, make_train_step
from cudt.knobs import KNOBS
from cudt.loop import Divergence, LoopResult, describe_placement, sample_indices, train_group
from cudt.optim import dual_optimizer, primal_optimizer
from cudt.runner.hparams import epsilon_schedule, parse_epsilon_schedule
from cudt.runner.record import KINDS
from cudt.runner.sweep import RunSpec, model_defaults, swept_suffix
from cudt.runner.task import GroupModel, RunBatch, Task

__all__ = ["Group", "GroupProgram", "make_group_step", "plan_groups", "run_group"]


@dataclasses.dataclass
class Group:
    """Runs that share a model structure: trained as one program, evaluated by one."""

    model_name: str
    structure: Hashable
    specs: list[RunSpec]
    model: GroupModel | None = None
    name: str = ""
    labels: list[str] = dataclasses.field(default_factory=list)
    data_seed: int | None = None  # the draw of the data its runs read

    @property
    def slug(self) -> str:
        return self.name.replace(" ", "-")


def plan_groups(task: Task, cfg, specs: list[RunSpec]) -> list[Group]:
    groups: dict[tuple, Group] = {}
    for spec in specs:
        structure = task.structure(cfg, spec.model, spec.constrained)
        key = (spec.model, structure)
        if key not in groups:
            groups[key] = Group(spec.model, structure, [])
        groups[key].specs.append(spec)
    return list(groups.values())


def name_group(group: Group, swept: list[str], data_seed: int | None = None) -> None:
    """The group's name (its checkpoint folder) and its runs' labels; ``data_seed``: the
    draw of the data when each seed reads its own (a group per draw)."""
    L = group.model.num_layers
    kinds = {s.constrained for s in group.specs}
    group.name = (
        f"{group.model_name}-{L}"
        + (f" {KINDS[next(iter(kinds))]}" if len(kinds) == 1 else "")
        + (f" data {data_seed}" if data_seed is not None else "")
    )
    group.labels = []
    for s in group.specs:
        suffix = swept_suffix(s, swept)
        group.labels.append(
            f"{group.model_name}-{L} {KINDS[s.constrained]} seed {s.seed}"
            + (f" {suffix}" if suffix else "")
        )


FORMULATIONS = {
    "lagrangian": lambda rho: Lagrangian(),
    "augmented": lambda rho: AugmentedLagrangian(penalty=rho),
    "penalty": lambda rho: QuadraticPenalty(penalty=rho),
}


def make_group_step(
    cfg,
    model: GroupModel,
    *,
    lr: float,
    warmup: int,
    steps_per_epoch: int,
    slack_alpha: float | None = None,
    num_examples: int | None = None,
    jit: bool = False,
):
    """``(init, step)`` of :func:`cudt.make_train_step` wired as the runner wires every group:
    the model's per-sample layer losses and projection, Adam on the parameters
    (:func:`cudt.optim.primal_optimizer`, ``cfg.lr_schedule`` over ``cfg.steps``), the dual
    optimiser of ``cfg`` over the steps after the ``warmup``, ``cfg``'s constraint kind,
    formulation and update scheme, and the problem's static structure (``DescentConfig``).
    Each run's own ε, reference, α, β, ρ, ERM/constrained, learning rates and nuPI gains go to
    ``init`` (:class:`GroupProgram` hands it every knob); a caller that gives none of ε and β
    (a benchmark, a test) gets ``cfg``'s. ``slack_alpha``: the α of explicit slacks
    (``--resilience-mode slack``), restarted every epoch. ``num_examples``: the training set's
    size (the rows of ``--constraint indexed``'s table; the batch's ``index`` names its
    examples' rows); ``--multipliers implicit``: no table, a model of the examples' loss ratios
    (:func:`cudt.descent.loss_features`)."""
    slack = cfg.resilience_mode == "slack"
    structure = DescentConfig(
        num_layers=model.num_layers,
        resilience=slack_alpha if slack else None,
        resilience_mode=cfg.resilience_mode,
        slack_lr=cfg.slack_lr,
        slack_restart_steps=steps_per_epoch if slack else None,
        warmup_steps=warmup,
        dual_scale=cfg.dual_scale,
        previous_loss=cfg.previous_loss,
    )
    primal = primal_optimizer(lr, cfg.lr_schedule, cfg.steps)
    dual = dual_optimizer(
        cfg.dual_optimizer,
        cfg.dual_lr,
        cfg.dual_lr_schedule,
        cfg.steps - warmup,
        nupi_kp=cfg.nupi_kp,
        nupi_ema=cfg.nupi_ema,
    )
    init, step = make_train_step(
        model.layer_losses,
        primal,
        dual,
        structure,
        constraint=cfg.constraint,
        formulation=FORMULATIONS[cfg.formulation](cfg.penalty),
        update=cfg.update,
        num_examples=num_examples,
        example_ids=lambda batch: batch.index,
        multipliers=cfg.multipliers,
        project_params=model.project,
        jit=jit,
    )
    # β where the constraint reads it (init refuses a value that nothing reads)
    beta = {k.name: cfg.tail_beta for k in KNOBS if k.name == "tail_beta" and k.active(cfg)}
    return functools.partial(init, epsilon=cfg.epsilon, **beta), step


class GroupProgram:
    """The step, initial states and per-run arrays of one group."""

    def __init__(self, task: Task, cfg, data, group: Group):
        model = group.model
        self.train_examples = task.train_examples(data, model)
        num_train = jax.tree.leaves(self.train_examples)[0].shape[0]
        steps_per_epoch = max(1, math.ceil(num_train / cfg.batch_size))
        hps = [s.hp for s in group.specs]
        resolved_ref = [task.resolve_reference(hp["reference"], data) for hp in hps]
        alphas = [hp["resilience"] for hp in hps]
        self.warmup = warmup = task.warmup_steps(cfg, steps_per_epoch)
        # ERM runs alone (--kinds erm, an ERM-only control) have no α: the flag's, as below
        slack_alpha = next((a for a in alphas if a is not None), cfg.resilience)
        init, self.step = make_group_step(
            cfg,
            model,
            lr=hps[0]["lr"],
            warmup=warmup,
            steps_per_epoch=steps_per_epoch,
            slack_alpha=slack_alpha,
            num_examples=num_train,
        )

        def col(values, fill):
            return jnp.asarray([fill if v is None else v for v in values], jnp.float32)

        # every knob's column (cudt.knobs), named as the flag names it: the run's values, and
        # for a run without one (None: ERM, or a knob whose setting is off) this fill. A knob
        # whose setting is off keeps the flag's value where the state has a place for it (the
        # problem's β, the formulation's ρ); a dual optimiser other than nuPI has no K_P.
        fill = {
            # what an ERM run (no constraint hyperparameters) is judged by: the model's own ε
            "epsilon": model_defaults(cfg, group.model_name).get("epsilon", cfg.epsilon),
            "reference": np.nan,
            # ERM runs have no α: inf (no decay) in decay mode; in slack mode the group's α,
            # since (α/2)·‖u‖² with u ≡ 0 must stay 0, not inf·0
            "resilience": cfg.resilience if cfg.resilience_mode == "slack" else np.inf,
        }
        # ε: each run judged by its own (feasibility, choice); a constrained run trains at ε +
        # --epsilon-margin in float64, as the flag (0.02 + margin 0.02: the bits of ε 0.04)
        judged = [fill["epsilon"] if hp["epsilon"] is None else hp["epsilon"] for hp in hps]
        # as given (results.json's); the verdicts read it in float32, as the state holds ε
        self.judged_epsilon = [float(e) for e in judged]
        margin = cfg.epsilon_margin
        self.trained_epsilon = [
            e + margin if s.constrained and margin else None
            for s, e in zip(group.specs, judged, strict=True)
        ]
        for e in self.trained_epsilon:
            if e is not None and not e < 1.0:
                raise ValueError(
                    f"--epsilon-margin {margin:g} trains a run at epsilon {e:g} (at least 1: a "
                    "loss below 0): pass a smaller margin"
                )
        values = {
            "reference": resolved_ref,
            "epsilon": [
                e if t is None else t for e, t in zip(judged, self.trained_epsilon, strict=True)
            ],
        }
        self.per_run = {
            k.name: col(
                values.get(k.name, [hp[k.name] for hp in hps]),
                fill.get(k.name, getattr(cfg, k.name)),
            )
            for k in KNOBS
            if k.goes != "data" and k.active(cfg) and k.name != "epsilon_schedule"
        }
        # ε's path to its value: a schedule per run (constant lanes too) only where some run has
        # one, so a group without schedules keeps the program it always had
        schedules = [hp["epsilon_schedule"] for hp in hps]
        if any(parse_epsilon_schedule(s or "constant") for s in schedules):
            self.per_run["epsilon_schedule"] = jax.tree.map(
                lambda *x: jnp.stack(x),
                *[
                    epsilon_schedule(s, float(e))
                    for s, e in zip(schedules, self.per_run["epsilon"], strict=True)
                ],
            )
        self.per_run["constrained"] = jnp.asarray([s.constrained for s in group.specs])
        self.references = resolved_ref
        self.extras = col([hp["gamma_train"] for hp in hps], 0.0)  # the one "data" knob
        self.keys = jnp.stack([jax.random.key(s.seed) for s in group.specs])
        self.init_keys = jax.vmap(lambda k: jax.random.fold_in(k, 1))(self.keys)

        def init_states(init_keys, per_run):
            def one(k, hp):
                return init(model.init(k), **hp)

            return jax.vmap(one)(init_keys, per_run)

        self.init_states = init_states
        batch_size = cfg.batch_size

        def make_batch(key, step, data, gamma):
            index = sample_indices(key, step, num_train, batch_size)
            examples = jax.tree.map(lambda a: a[index], data["examples"])
            return RunBatch(examples, gamma, data["frozen"], index)

        self.make_batch = make_batch

    def abstract_states(self):
        return jax.eval_shape(self.init_states, self.init_keys, self.per_run)

    def initial_states(self):
        """The runs' initial states, from one compiled program. The arrays its trace closes over
        (a pretrained body and word table, which ``model.init`` returns as they are) are its
        arguments, not constants baked into the executable: a constant is copied into the
        program, hashed for its cache key and compressed into the persistent cache (MiniLM's
        90 MB: a 40 MB cache entry, 2.5 s of CPU per run). The states are the same values."""
        args = (self.init_keys, self.per_run)
        closed, shape = jax.make_jaxpr(self.init_states, return_shape=True)(*args)

        def init(consts, *flat):
            return jax.core.eval_jaxpr(closed.jaxpr, consts, *flat)

        flat = jax.jit(init)(closed.consts, *jax.tree.leaves(args))
        return jax.tree.unflatten(jax.tree.structure(shape), flat)


def fault_runs(cfg, group: Group) -> tuple[list[int], int] | None:
    if not cfg.inject_nan:
        return None
    model, kind, seed, step = cfg.inject_nan
    runs = [
        i
        for i, s in enumerate(group.specs)
        if s.model == model and KINDS[s.constrained] == kind and s.seed == int(seed)
    ]
    return (runs, int(step)) if runs else None


def run_group(
    step_fn: Callable,
    states: Any,
    keys: Any,
    make_batch: Callable,
    *,
    name: str,
    labels: Sequence[str],
    num_steps: int,
    chunk_steps: int,
    checkpoint_dir: Path | None,
    checkpoint_every: int | None = None,
    keep_checkpoints: int = 2,
    fault: tuple[Any, int] | None = None,
    log: Callable[[str], None] | None = None,
    **loop_kwargs: Any,
) -> LoopResult:
    """:func:`cudt.loop.train_group` with a progress bar, checkpoints and divergence messages.

    ``labels[r]`` names run ``r`` in messages (e.g. ``"dust-3 constrained seed 1"``);
    ``loop_kwargs`` (``data``, ``extras``, ``shardings``, ``curve_every``) go to the loop.
    """
    log = log or (lambda msg: tqdm.write(msg, file=sys.stderr))

    def report(d: Divergence) -> None:
        where = (
            f"its last good checkpoint, step {d.last_good_checkpoint}, is kept in "
            f"{checkpoint_dir / str(d.last_good_checkpoint)}"
            if d.last_good_checkpoint is not None and checkpoint_dir is not None
            else "no checkpoint was written before it"
        )
        log(
            f"DIVERGED: {labels[d.run]} at step {d.step}: {d.quantity} is non-finite; {where}; "
            "the other runs go on"
        )

    checkpointer = None
    if checkpoint_dir is not None:
        checkpointer = GroupCheckpointer(checkpoint_dir, keep=keep_checkpoints)
    try:
        with tqdm(
            total=num_steps, desc=name, unit="step", leave=True, mininterval=1.0, dynamic_ncols=True
        ) as bar:
            result = train_group(
                step_fn,
                states,
                keys,
                make_batch,
                num_steps,
                chunk_steps=chunk_steps,
                progress=bar,
                checkpointer=checkpointer,
                checkpoint_every=checkpoint_every,
                on_divergence=report,
                fault=fault,
                **loop_kwargs,
            )
    finally:
        if checkpointer is not None:
            checkpointer.close()
    line = resume_line(name, result)
    if line:
        log(line)
    return result


def resume_line(name: str, result: LoopResult) -> str | None:
    """The one line a group says when it resumed, or found a save it must discard: from which
    step, which interrupted saves were dropped, and where the state was saved when it is
    resharded onto other devices or processes (docs/runner.md states the tolerance)."""
    dropped = ", ".join(map(str, result.interrupted_saves))
    plural = "s" if len(result.interrupted_saves) > 1 else ""
    if result.resumed_from is None:
        if not dropped:
            return None
        return (
            f"{name}: the save of step{plural} {dropped} was interrupted before any checkpoint "
            "was complete: its partial folder is removed and training starts from step 0"
        )
    line = f"{name}: resumed from the checkpoint at step {result.resumed_from}"
    if dropped:
        line += (
            f", the last complete one (the save of step{plural} {dropped} was interrupted: "
            "its partial folder is removed)"
        )
    if result.resharded is not None:
        saved, here = result.resharded
        line += (
            f"; saved on {describe_placement(saved)}, resharded onto {describe_placement(here)}"
            ": results agree with an uninterrupted run to float rounding (docs/runner.md)"
        )
    return line
