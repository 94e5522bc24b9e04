"""``run(task, cfg)``: one runner for every task.

read the data → expand runs (sweep points × seeds, ERM and constrained) → group them by model
structure → open the output folder → pre-check every group's checkpoint → for each group: init
the stacked states, train them as one program over the device mesh, evaluate them with one
compiled evaluator → pick the best run of each setting → results.json, table, plots, training
curves (TensorBoard + PNG).

Order matters for safety: every input error is raised before the output folder is touched, and
results.json is written last, so its presence means a complete run.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from cudt import curves as curves_lib
from cudt.checkpoint import GroupCheckpointer
from cudt.constrained import DescentConfig
from cudt.dual import as_dual
from cudt.errors import UsageError
from cudt.experiment import (
    Column,
    OutputDir,
    format_table,
    open_output,
    run_group,
    select_best,
    status_cell,
)
from cudt.io import fresh_run_dir, write_json_atomic
from cudt.loop import LoopResult, sample_indices
from cudt.metrics import descent_stats, feasibility
from cudt.runner.config import SWEEPABLE
from cudt.runner.mesh import initialize_distributed, make_shardings
from cudt.runner.sweep import RunSpec, expand_runs, parse_sweeps, swept_suffix
from cudt.runner.task import GroupModel, RunBatch, Task
from cudt.train import make_train_step

__all__ = ["Group", "plan_groups", "run"]

KINDS = {False: "ERM", True: "constrained"}
TENSORBOARD = "tensorboard"  # <out>/tensorboard/<run label>/events.out.tfevents.*


SCHEDULES = ("constant", "cosine", "linear")


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


def dual_optimizer(
    name: str, lr: float, schedule: str = "constant", steps: int = 1
) -> optax.GradientTransformation:
    """Projected ascent with Adam (the paper) or SGD, the learning rate in its state, times the
    factor of ``schedule`` over ``steps`` dual updates (the dual state, and so the schedule's
    count, stands still during the primal warm-up)."""
    inner = optax.adam if name == "adam" else optax.sgd
    return as_dual(_scheduled(optax.inject_hyperparams(inner)(learning_rate=lr), schedule, steps))


@dataclasses.dataclass
class Group:
    """Runs that share a model structure: trained as one program, evaluated by one."""

    model_name: str
    structure: Hashable
    specs: list[RunSpec]
    model: GroupModel | None = None
    name: str = ""
    labels: list[str] = dataclasses.field(default_factory=list)

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


def _name_group(group: Group, swept: list[str]) -> None:
    L = group.model.num_layers
    kinds = {s.constrained for s in group.specs}
    group.name = f"{group.model_name}-{L}" + (
        f" {KINDS[next(iter(kinds))]}" if len(kinds) == 1 else ""
    )
    group.labels = []
    for s in group.specs:
        suffix = swept_suffix(s, swept)
        group.labels.append(
            f"{group.model_name}-{L} {KINDS[s.constrained]} seed {s.seed}"
            + (f" {suffix}" if suffix else "")
        )


class _GroupProgram:
    """The step, initial states and per-run arrays of one group."""

    def __init__(self, task: Task, cfg, data, group: Group):
        model = group.model
        self.train_examples = task.train_examples(data, model)
        num_train = jax.tree.leaves(self.train_examples)[0].shape[0]
        steps_per_epoch = max(1, math.ceil(num_train / cfg.batch_size))
        hps = [s.hp for s in group.specs]
        resolved_ref = [task.resolve_reference(hp["reference"], data) for hp in hps]
        alphas = [hp["resilience"] for hp in hps]
        warmup = task.warmup_steps(cfg, steps_per_epoch)
        descent = DescentConfig(
            num_layers=model.num_layers,
            epsilon=cfg.epsilon,
            reference=None,
            resilience=next((a for a in alphas if a is not None), None)
            if cfg.resilience_mode == "slack"
            else None,
            resilience_mode=cfg.resilience_mode,
            slack_lr=cfg.slack_lr,
            slack_restart_steps=steps_per_epoch if cfg.resilience_mode == "slack" else None,
            warmup_steps=warmup,
            constrained=True,
        )
        init, self.step = make_train_step(
            model.layer_losses,
            primal_optimizer(hps[0]["lr"], cfg.lr_schedule, cfg.steps),
            dual_optimizer(
                cfg.dual_optimizer, cfg.dual_lr, cfg.dual_lr_schedule, cfg.steps - warmup
            ),
            descent,
            project_params=model.project,
            jit=False,
        )

        def col(values, fill):
            return jnp.asarray([fill if v is None else v for v in values], jnp.float32)

        self.per_run = {
            "epsilon": col([hp["epsilon"] for hp in hps], cfg.epsilon),
            "reference": col(resolved_ref, np.nan),
            # ERM runs have no α: inf (no decay) in decay mode; in slack mode the group's α,
            # since (α/2)·‖u‖² with u ≡ 0 must stay 0, not inf·0
            "resilience": col(alphas, cfg.resilience if cfg.resilience_mode == "slack" else np.inf),
            "constrained": jnp.asarray([s.constrained for s in group.specs]),
            "lr": col([hp["lr"] for hp in hps], 0.0),
            "dual_lr": col([hp["dual_lr"] for hp in hps], cfg.dual_lr),
        }
        self.references = resolved_ref
        self.extras = col([hp["gamma_train"] for hp in hps], 0.0)
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
            return RunBatch(examples, gamma, data["frozen"])

        self.make_batch = make_batch

    def abstract_states(self):
        return jax.eval_shape(self.init_states, self.init_keys, self.per_run)

    def initial_states(self):
        return jax.jit(self.init_states)(self.init_keys, self.per_run)


def _fault_runs(cfg, group: Group) -> tuple[list[int], int] | None:
    if not cfg.inject_nan:
        return None
    model, kind, seed, step = cfg.inject_nan
    runs = [
        i
        for i, s in enumerate(group.specs)
        if s.model == model and KINDS[s.constrained] == kind and s.seed == int(seed)
    ]
    return (runs, int(step)) if runs else None


def _evaluate(evaluator, params, frozen, batches, num_examples, gammas, key) -> dict:
    """``{name: [G, R, N, S]}`` of every run at every γ, with the group's compiled evaluator."""
    out: dict[str, np.ndarray] = {}
    batches = list(batches)
    for gi, gamma in enumerate(gammas):
        k = jax.random.fold_in(key, gi)
        for b in batches:
            res = evaluator(params, frozen, b.examples, jnp.asarray(b.index), jnp.float32(gamma), k)
            res = jax.device_get(res)
            for name, value in res.items():  # [R, B, S]
                if name not in out:
                    r, _, s = value.shape
                    out[name] = np.zeros((len(gammas), r, num_examples, s), value.dtype)
                idx = b.index[: b.count]
                out[name][gi, :, idx] = np.asarray(value)[:, : b.count].transpose(1, 0, 2)
    return out


def _decreases(losses) -> bool:
    losses = np.asarray(losses, np.float64)
    return bool(np.all(np.isfinite(losses)) and np.all(np.diff(losses) < 0))


def _curves_of(result: LoopResult, r: int) -> dict[str, list]:
    out: dict[str, list] = {"step": [int(c["step"]) for c in result.curves]}
    for name in ("objective", "lagrangian", "layer_loss", "constraint", "multipliers", "slacks"):
        if result.curves and name in result.curves[0]:
            out[name] = [np.asarray(c[name])[r].tolist() for c in result.curves]
    return out


def _summarise(task, cfg, data, group, program, result, gammas, val_gammas, eval_key):
    model = group.model
    evaluator = jax.jit(
        jax.vmap(model.eval_outputs, in_axes=(0, None, None, None, None, None))
    )  # compiled once per group (and per batch shape)

    def evaluate(split: str, split_gammas, key):
        batches = task.eval_batches(data, split, model, cfg.eval_batch_size)
        return _evaluate(
            evaluator,
            result.states.params,
            model.frozen,
            batches,
            task.split_size(data, split, model),
            split_gammas,
            key,
        )

    test = evaluate("test", gammas, eval_key)
    val = evaluate("val", val_gammas, jax.random.fold_in(eval_key, 99))
    eps = np.asarray(program.per_run["epsilon"])
    runs, ratios = [], []
    for r, spec in enumerate(group.specs):
        hp = spec.hp
        gamma_train = float(hp["gamma_train"])
        gi = gammas.index(gamma_train)
        vi = val_gammas.index(gamma_train)
        diverged = bool(result.diverged[r])
        per_gamma = test["losses"][:, r]  # [G, N, S]
        stats = descent_stats(per_gamma[gi])
        val_mean = val["losses"][vi, r].mean(0)
        verdict = feasibility(
            val_mean, np.full(model.num_layers, eps[r]), program.references[r], cfg.tolerance
        )
        layer_loss = [pg.mean(0).tolist() for pg in per_gamma]
        record = {
            "model": model.name,
            "layers": model.num_layers,
            **model.record,
            "constrained": spec.constrained,
            "seed": int(spec.seed),
            "label": group.labels[r],
            "group": group.name,
            "hparams": dict(hp, reference=program.references[r] if spec.constrained else None),
            "sweep_point": spec.point,
            "gamma_train": gamma_train,
            "test_gamma": list(gammas),
            **task.run_metrics(
                cfg,
                {k: v[:, r] for k, v in test.items()},
                {k: v[vi, r] for k, v in val.items()},
                gammas,
                gamma_train,
            ),
            **task.val_metrics(cfg, {k: v[:, r] for k, v in val.items()}, val_gammas, gamma_train),
            "layer_loss": layer_loss,
            "loss_decreases": _decreases(layer_loss[gi]),
            "descent_rate": stats.descent_rate,
            "mean_ratio": stats.mean_ratio,
            "median_ratio": stats.median_ratio,
            "feasible": verdict.feasible and not diverged,
            "constraint_val": verdict.constraint,
            "relative_violation_val": verdict.relative_violation,
            "val_objective": float(val_mean[-1]),
            "multipliers": np.asarray(result.states.multipliers[r]).tolist(),
            "max_multipliers": (
                np.zeros(model.num_layers + 1).tolist()
                if result.max_multipliers is None
                else np.nan_to_num(result.max_multipliers[r], nan=np.inf).tolist()
            ),
            "diverged": diverged,
            "diverged_at": result.diverged_at[r],
            "train_objective": [float(h["objective"][r]) for h in result.history],
            "train_steps": [int(h["step"]) for h in result.history],
            "curves": _curves_of(result, r),
        }
        runs.append(record)
        ratios.append(None if diverged else stats.ratios.ravel())
    extra = task.trained_outputs(cfg, data, model, result.states.params, group.labels)
    for record, fields in zip(runs, extra, strict=True):
        record.update(fields)
    return runs, ratios


def _table(task: Task, runs: list[dict], swept: list[str]) -> str:
    width = max([5] + [len(r["model"]) for r in runs])
    columns = [
        Column("model", width, lambda r: r["model"]),
        Column("L", 2, lambda r: str(r["layers"])),
        Column("kind", 11, lambda r: KINDS[r["constrained"]]),
        Column("seed", 4, lambda r: str(r["seed"])),
    ]
    for name in swept:
        columns.append(
            Column(
                name,
                max(8, len(name)),
                lambda r, n=name: (
                    "-"
                    if r["hparams"][n] is None
                    else f"{r['hparams'][n]:.3g}"
                    if isinstance(r["hparams"][n], float)
                    else str(r["hparams"][n])
                ),
            )
        )
    columns += task.metric_columns()
    columns += [
        Column("descent", 8, lambda r: f"{100 * r['descent_rate']:.1f}%"),
        Column("mean r", 7, lambda r: f"{r['mean_ratio']:.3f}"),
        Column("med r", 7, lambda r: f"{r['median_ratio']:.3f}"),
    ]
    columns += task.after_columns()
    columns += [
        Column("feasible", 9, status_cell),
        Column("max λ", 8, lambda r: f"{max(r['multipliers']):.3g}"),
        Column("peak λ", 8, lambda r: f"{max(r['max_multipliers']):.3g}"),
    ]
    table = format_table(runs, columns)
    footer = task.table_footer(runs)
    return table + (f"\n{footer}" if footer else "")


def _open_output_once(path, fingerprint, cfg, main_process: bool):
    """:func:`open_output` by process 0 of a multi-host job; the others wait for it and take
    its verdict (resuming or not), so no two processes race on the folder."""
    if jax.process_count() == 1:
        return open_output(path, fingerprint, overwrite=cfg.overwrite, resume=cfg.resume)
    from jax.experimental import multihost_utils

    out, failed, resuming = None, 0, 0
    if main_process:
        try:
            out = open_output(path, fingerprint, overwrite=cfg.overwrite, resume=cfg.resume)
            resuming = int(out.resuming)
        except Exception:
            failed = 1
            raise
        finally:
            verdict = multihost_utils.broadcast_one_to_all(np.asarray([failed, resuming]))
    else:
        verdict = multihost_utils.broadcast_one_to_all(np.asarray([failed, resuming]))
        if verdict[0]:
            raise UsageError(f"process 0 could not open --out {path}: see its error")
        out = OutputDir(Path(path), bool(verdict[1]))
    return out


def run(task: Task, cfg, out_dir: str | Path | None = None) -> dict[str, Any]:
    """Runs the whole experiment of ``cfg`` (a ``task.config_cls``); returns the results."""
    t0 = time.perf_counter()
    if cfg.distributed:
        initialize_distributed()
    main_process = jax.process_index() == 0
    sweeps = parse_sweeps(cfg)
    swept = [n for n in SWEEPABLE if n in sweeps]
    data = task.load(cfg)
    for line in task.describe(cfg, data):
        print(line)
    specs = expand_runs(
        cfg,
        task.model_names(cfg),
        lambda m: task.default_lr(cfg, m),
        lambda m: task.kinds(cfg, m),
    )
    groups = plan_groups(task, cfg, specs)
    for group in groups:
        group.model = task.build(cfg, data, group.model_name, group.structure)
        _name_group(group, swept)
        for spec in group.specs:  # every reference resolves before anything is written
            task.resolve_reference(spec.hp["reference"], data)
    fingerprint = cfg.fingerprint() | task.fingerprint(cfg, data)
    out = _open_output_once(
        out_dir or cfg.out or fresh_run_dir(task.name), fingerprint, cfg, main_process
    )
    print(
        f"output: {out.path}"
        + (
            " (resuming)"
            if out.resuming
            else f" (if interrupted, rerun with --out {out.path} to resume)"
        )
    )
    programs = [_GroupProgram(task, cfg, data, g) for g in groups]
    if out.resuming:  # a corrupt or foreign checkpoint is refused before any training
        for group, program in zip(groups, programs, strict=True):
            folder = out.group_dir(group.slug)
            if folder.is_dir():
                with GroupCheckpointer(folder, keep=cfg.keep_checkpoints) as checkpointer:
                    if checkpointer.latest_step() is not None:
                        checkpointer.restore(program.abstract_states())
    gamma_trains = sorted({float(s.hp["gamma_train"]) for s in specs})
    gammas = task.test_gammas(cfg, gamma_trains)
    val_gammas = sorted(set(task.val_gammas(cfg, gamma_trains, gammas)) | set(gamma_trains))
    eval_key = jax.random.key(10_000 + cfg.seed)
    on_device: dict[int, Any] = {}  # groups reading the same examples share one device copy
    runs: list[dict] = []
    ratios: list = []
    train_seconds, eval_seconds = {}, {}
    devices_used = 1
    for group, program in zip(groups, programs, strict=True):
        t = time.perf_counter()
        shardings = make_shardings(len(group.specs), cfg.batch_size, cfg.devices, fsdp=cfg.fsdp)
        if shardings is not None:
            devices_used = max(devices_used, shardings.devices)
        if id(program.train_examples) not in on_device:
            on_device[id(program.train_examples)] = jax.tree.map(
                jnp.asarray, program.train_examples
            )
        examples = on_device[id(program.train_examples)]
        result = run_group(
            program.step,
            program.initial_states(),
            program.keys,
            program.make_batch,
            name=group.name,
            labels=group.labels,
            num_steps=cfg.steps,
            chunk_steps=cfg.chunk_steps,
            checkpoint_dir=out.group_dir(group.slug),
            checkpoint_every=cfg.checkpoint_every,
            keep_checkpoints=cfg.keep_checkpoints,
            fault=_fault_runs(cfg, group),
            data={"examples": examples, "frozen": group.model.frozen},
            extras=program.extras,
            shardings=shardings,
        )
        train_seconds[group.name] = time.perf_counter() - t
        if shardings is not None and jax.process_count() > 1:  # every process reads every run
            result = dataclasses.replace(result, states=shardings.to_host(result.states))
        if main_process:  # training logs, as soon as the group has trained (rewritten whole)
            curves_lib.write_tensorboard(
                [
                    {
                        "label": label,
                        "group": group.name,
                        "constrained": spec.constrained,
                        "curves": _curves_of(result, r),
                    }
                    for r, (label, spec) in enumerate(zip(group.labels, group.specs, strict=True))
                    if result.curves
                ],
                out.path / TENSORBOARD,
            )
        t = time.perf_counter()
        group_runs, group_ratios = _summarise(
            task, cfg, data, group, program, result, gammas, val_gammas, eval_key
        )
        eval_seconds[group.name] = time.perf_counter() - t
        runs += group_runs
        ratios += group_ratios
    score, higher = task.selection_for(cfg)
    select_best(runs, score, higher_is_better=higher)
    config = (
        dataclasses.asdict(cfg)
        | task.config_extras(cfg, data)
        | {
            "test_gamma": gammas,
            "val_gamma": val_gammas,
            "out": str(out.path),
            "sweeps": {k: list(v) for k, v in sweeps.items()},
        }
    )
    results = {
        "experiment": task.name,
        "config": config,
        "devices": devices_used,
        "processes": jax.process_count(),
        **task.results_extras(cfg, data),
        "runs": runs,
        "train_seconds": train_seconds,
        "eval_seconds": eval_seconds,
    }
    if main_process:
        figures = task.figures(runs, ratios, out.path, gammas, cfg)
        curve_runs = [r for r in runs if r["curves"]["step"]]
        figures.append(out.path / "training_curves.png")
        curves_lib.plot_training_curves(
            curve_runs, figures[-1], title="multipliers and constraint values during training"
        )
        results["wall_seconds"] = time.perf_counter() - t0
        write_json_atomic(out.path / "results.json", results)
        print(_table(task, runs, swept))
        names = ", ".join(str(p) for p in [out.path / "results.json", *figures])
        print(f"training curves: tensorboard --logdir {out.path / TENSORBOARD}")
        print(f"wrote {names} in {results['wall_seconds']:.0f}s")
    return results
