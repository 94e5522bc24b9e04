"""``run(task, cfg)``: one runner for every task.

read the data → expand runs (sweep points × seeds, ERM and constrained) → group them by model
structure → open the output folder → pre-check every group's checkpoint → for each group: init
the stacked states, train them as one program over the device mesh, evaluate them with one
compiled evaluator → pick the best run of each setting → results.json, table, plots, training
curves (TensorBoard + PNG) → what the task writes from the finished run (:meth:`Task.finish`).

Order matters for safety: every input error is raised before the output folder is touched, and
results.json is written last, so its presence means a complete run.
"""

from __future__ import annotations

import dataclasses
import shlex
import sys
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from cudt.checkpoint import GroupCheckpointer
from cudt.errors import UsageError
from cudt.io import digest, fresh_run_dir, given_out, to_jsonable, write_json_atomic
from cudt.loop import describe_placement, loop_record, placement
from cudt.runner.choice import choose_points, compare_chosen, mark_chosen, select_best
from cudt.runner.curves import plot_training_curves, write_tensorboard
from cudt.runner.groups import GroupProgram, fault_runs, name_group, plan_groups, run_group
from cudt.runner.hparams import resolve_reference
from cudt.runner.lock import check_free
from cudt.runner.mesh import check_job_devices, initialize_distributed, make_shardings
from cudt.runner.model_check import check_model
from cudt.runner.output import (
    CHECKPOINTS,
    DATA_RECORD,
    TENSORBOARD,
    check_same_data,
    checkpoint_record,
    open_output_once,
)
from cudt.runner.provenance import provenance
from cudt.runner.record import KINDS, curves_of, evaluation_keys, summarise
from cudt.runner.report import seed_intervals, summary_table
from cudt.runner.sweep import model_defaults, parse_sweeps, tuned_names
from cudt.runner.task import Task

__all__ = [
    "check_reused",
    "data_draws",
    "data_record",
    "evaluation_grids",
    "examples_digests",
    "inert_warnings",
    "run",
]


def data_draws(cfg) -> dict[int, Any]:
    """``{data seed: config}``: the draws of the data a run reads. Each seed draws its own
    (generated sets, the train/val/test split, the evaluation noise: ``--data-seed`` of its
    config is the seed), so seeds are independent replicates and intervals over them hold;
    ``--data-seed D`` makes every seed share one draw (seeds of one job split over commands on
    the same data)."""
    if cfg.data_seed is not None:
        return {cfg.data_seed: cfg}
    return {s: dataclasses.replace(cfg, data_seed=s) for s in cfg.seed_list}


def data_record(task: Task, draws: dict[int, Any], datas: dict[int, Any]) -> dict[str, Any]:
    """What a run's checkpoints record of the data its draws (:func:`data_draws`, loaded:
    ``datas``) give: the task's fingerprint, one per draw (``data_per_seed``) where each seed
    drew its own."""
    if len(draws) == 1:
        ((seed, data),) = datas.items()
        return task.fingerprint(draws[seed], data)
    return {"data_per_seed": {str(k): task.fingerprint(draws[k], d) for k, d in datas.items()}}


def examples_digests(task: Task, datas: dict[int, Any], groups, record: dict) -> dict:
    """``record`` (:func:`data_record`) with the runner's own digest of each draw's training
    examples, ``examples_digest``, where the task's fingerprint holds no ``train_digest``: a
    task whose fingerprint does not name its data (``{}``, or a file's path alone) is still
    refused a resume over other training examples behind the same flags. The examples are
    those its models train on (:meth:`Task.train_examples` of each group of the draw), each
    array once."""
    per_seed = record.get("data_per_seed")
    out = dict(record) if per_seed is None else {**record, "data_per_seed": dict(per_seed)}
    for seed, data in datas.items():
        own = out if per_seed is None else out["data_per_seed"][str(seed)]
        if "train_digest" in own:
            continue
        arrays: dict[int, Any] = {}  # kept alive while listed, so an id names one array
        for group in (g for g in groups if g.data_seed == seed):
            for leaf in jax.tree.leaves(task.train_examples(data, group.model)):
                arrays.setdefault(id(leaf), leaf)
        mine = {**own, "examples_digest": digest(list(arrays.values()))}
        if per_seed is None:
            out = mine
        else:
            out["data_per_seed"][str(seed)] = mine
    return out


def check_reused(
    task: Task, cfg, out: str | Path, name: str | None = None, flags: Collection[str] = ()
) -> None:
    """Refuses to reuse the finished run of ``cfg`` in ``out`` (a paper job's sub-run, its
    config matched) where the data ``cfg`` reads now is not what its checkpoints were trained
    on: the refusal a resume of them makes (:func:`cudt.runner.output.check_same_data`), so a
    table does not mix results of old and new files behind the same flags; ``flags``: path
    flags that name other places than the record, compared as a resume compares them (alike
    where the digests of what they hold are). ``name``: what the refusal calls ``out``
    (``--out OUT``)."""
    draws = data_draws(cfg)
    now = data_record(task, draws, {k: task.load(d) for k, d in draws.items()})
    fingerprint = checkpoint_record(cfg) | now
    check_same_data(out, fingerprint, [*now, *flags], cfg, task_defaults(task, cfg), name)


def say(line: str) -> None:
    """A line of the run's report: on stdout, a warning (``warning: ...``) on stderr, where it
    is seen when stdout goes to a log."""
    print(line, file=sys.stderr if line.startswith("warning:") else sys.stdout)


def inert_warnings(task: Task, cfg, groups) -> list[str]:
    """One line per (group, γ_train) whose constrained runs would train a descent constraint
    after a state whose loss is ~0 by construction (:meth:`Task.inert_states`): ℓ_l ≤ (1 − ε)·0
    is infeasible; the runner reports it as not applicable (``n/a``), and says so before
    training; once, though each seed's draw of the data has its groups."""
    lines = []
    for group in groups:
        for g in sorted({float(s.hp["gamma_train"]) for s in group.specs if s.constrained}):
            for state, why in sorted(task.inert_states(cfg, group.model, g).items()):
                lines.append(
                    f"warning: {group.model_name}-{group.model.num_layers} constrained at "
                    f"γ_train = {g:g}: {why}, so layer {state + 1}'s descent constraint "
                    f"ℓ_{state + 1} ≤ (1 − ε)·ℓ_{state} is infeasible by construction; it is "
                    "trained as asked and reported n/a"
                )
    return list(dict.fromkeys(lines))


def _warmup_warnings(cfg, groups, programs) -> list[str]:
    """One line per group whose constrained runs would never leave the warm-up: the task's
    default (one epoch; an explicit --warmup-steps that long is refused with the config); once,
    though each seed's draw of the data has its groups."""
    lines = [
        f"warning: {g.model_name}-{g.model.num_layers}: the warm-up, one epoch of {p.warmup} "
        f"steps, covers all {cfg.steps} --steps, so the multipliers stay 0 and the constrained "
        f"runs train as ERM: pass --warmup-steps below {cfg.steps}, or more --steps"
        for g, p in zip(groups, programs, strict=True)
        if p.warmup >= cfg.steps and any(s.constrained for s in g.specs)
    ]
    return list(dict.fromkeys(lines))


def _placement_lines(groups, meshes) -> list[str]:
    """Where each group's runs train, one line a group, on more than one device: ``placement:
    dust-5 (4 runs): 4 devices (mesh run 2 × data 2)`` (``run`` splits the group's
    runs, ``data`` each run's batch; docs/runner.md, Devices). None on one device."""
    if all(m is None for m in meshes):
        return []
    return [
        f"placement: {g.name} ({len(g.specs)} run{'s' if len(g.specs) != 1 else ''}): "
        f"{describe_placement(placement(m))}"
        for g, m in zip(groups, meshes, strict=True)
    ]


def run(task: Task, cfg, out_dir: str | Path | None = None) -> dict[str, Any]:
    """Runs the whole experiment of ``cfg`` (a ``task.config_cls``); returns the results."""
    t0 = time.perf_counter()
    _check_inject_nan(task, cfg)
    if cfg.distributed:
        initialize_distributed()
    check_job_devices(cfg.devices)  # a --devices that leaves a process out: before anything
    origin = provenance()  # the code and command that ran (after the backend starts)
    main_process = jax.process_index() == 0
    given = out_dir if out_dir is not None else cfg.out
    if given is not None:
        given = given_out(given)  # an empty --out is refused, not read as none
    if given is not None and jax.process_count() == 1:
        check_free(given)  # a job holds --out: refused now, before its data is read
    sweeps = parse_sweeps(cfg)
    swept = tuned_names(cfg, sweeps)
    specs = task.run_specs(cfg)
    _check_specs(task, cfg, specs)
    draws = data_draws(cfg)
    datas, trained_on = _load_draws(task, draws)
    data = next(iter(datas.values()))  # what is the same in every draw (config extras)
    _print_model_defaults(cfg, specs, sweeps)
    groups = _plan_all_groups(task, cfg, specs, draws, datas, swept)
    trained_on = examples_digests(task, datas, groups, trained_on)
    # before --out is opened: a job whose processes cannot all hold a group's mesh is refused
    meshes = [
        make_shardings(len(g.specs), cfg.batch_size, cfg.devices, fsdp=cfg.fsdp) for g in groups
    ]
    gammas, val_gammas = evaluation_grids(task, cfg, specs)  # a bad grid: before --out
    fingerprint = checkpoint_record(cfg) | trained_on
    # the default folder is chosen when it is opened, and created then by a job alone on its
    # host: two jobs started in the same second get two folders
    path = given if given is not None else fresh_run_dir(task.name, claim=jax.process_count() == 1)
    _check_group_folders(path, groups, cfg.overwrite)
    with open_output_once(path, fingerprint, cfg, main_process, task_defaults(task, cfg)) as out:
        # the command's --out only: a caller's out_dir (a paper job's sub-run) is resumed by
        # rerunning the caller, which says how
        hint = f" (if interrupted, rerun with --out {shlex.quote(str(out.path))} to resume)"
        print(f"output: {out.path}" + (" (resuming)" if out.resuming else "" if out_dir else hint))
        for line in _placement_lines(groups, meshes):
            print(line)
        for line in inert_warnings(task, cfg, groups):
            say(line)
        programs = [GroupProgram(task, draws[g.data_seed], datas[g.data_seed], g) for g in groups]
        for line in _warmup_warnings(cfg, groups, programs):
            say(line)
        if out.resuming:  # a corrupt or foreign checkpoint is refused before any training
            _check_checkpoints(out, cfg, groups, programs, meshes)
        trained = _train_and_evaluate(
            task, cfg, out, draws, datas, groups, programs, meshes, gammas, val_gammas
        )
        results = _results(task, cfg, out, draws, data, sweeps, swept, gammas, val_gammas, trained)
        results[DATA_RECORD] = to_jsonable(trained_on)  # checked when its checkpoints are gone
        results["provenance"] = origin
        if main_process:
            _write_results(task, cfg, data, out, results, trained["ratios"], gammas, swept, t0)
        return results


def task_defaults(task: Task, cfg) -> dict[str, Any]:
    """The flags whose default (None) the task resolves, with the value it resolves to, where
    giving that value trains the same runs: ``--lr`` when the models' default learning rates
    (:meth:`Task.default_lr`) are one value, so that ``--lr 1e-3`` resumes the checkpoints of
    a run without it, and the other way (it was refused as another config: ``lr 0.001 ->
    None``). The runs of both spellings are compared, so a model's own ``--model-hparams`` lr
    or a sweep of lr is accounted for (:func:`cudt.runner.output.open_output`)."""
    if not any(f.name == "lr" for f in dataclasses.fields(cfg)):
        return {}
    lrs = {task.default_lr(cfg, m) for m in task.model_names(cfg)}
    if len(lrs) != 1:  # --lr sets every model's rate: it can equal one default only
        return {}
    (lr,) = lrs
    given, default = dataclasses.replace(cfg, lr=lr), dataclasses.replace(cfg, lr=None)
    return {"lr": lr} if task.run_specs(given) == task.run_specs(default) else {}


def _check_group_folders(path: Path, groups, overwrite: bool) -> None:
    """A file where a group's checkpoint folder goes (``--out``'s ``checkpoints/<group>``) is
    refused before anything is written: the group's first save failed on it, after its
    training. ``--overwrite`` removes the checkpoints, that file with them."""
    for group in groups:
        folder = path / CHECKPOINTS / group.slug
        if not overwrite and (folder.exists() or folder.is_symlink()) and not folder.is_dir():
            raise UsageError(
                f"--out {path}: {folder} is a file, where the checkpoints of {group.name} go: "
                "move or delete it, or pass another --out"
            )


def _check_inject_nan(task: Task, cfg) -> None:
    """``--inject-nan MODEL,...`` names a model this run trains (the rest of its syntax is
    checked with the config)."""
    names = task.model_names(cfg)
    if cfg.inject_nan and cfg.inject_nan[0] not in names:
        raise UsageError(
            f"--inject-nan model {cfg.inject_nan[0]!r} is not trained by this run: name one "
            f"of {', '.join(names)}"
        )


def _check_specs(task: Task, cfg, specs) -> None:
    """Refusals the runs' settings decide, before the data is read: no runs of ``--kinds``,
    an ``--inject-nan`` kind its model does not train, and a chance spelling of ``--reference`` on a task without a chance level (one that does
    not override :meth:`Task.chance_level`; the others resolve with their data)."""
    if not specs:
        raise UsageError(
            f"--kinds {cfg.kinds}: none of the models ({', '.join(task.model_names(cfg))}) "
            "has such runs: pass --kinds both"
        )
    if type(task).chance_level is Task.chance_level:
        for spec in specs:
            resolve_reference(spec.hp["reference"], None, task.name)
    if cfg.inject_nan:  # a model of this run (_check_inject_nan) without runs of that kind
        model, kind = cfg.inject_nan[:2]
        kinds = sorted({KINDS[s.constrained] for s in specs if s.model == model})
        if kind not in kinds:
            raise UsageError(
                f"--inject-nan {model},{kind}: {model} has no {kind} runs here (only "
                f"{', '.join(kinds)}), so the fault would never fire: pass KIND {kinds[0]}, or "
                "another MODEL"
            )


def _load_draws(task: Task, draws: dict[int, Any]) -> tuple[dict[int, Any], dict[str, Any]]:
    """``{data seed: data}`` and their :func:`data_record`: each draw's data, described, and
    where the seeds' draws hold the same training examples (a real data set split by its
    videos' names, whatever the seed), said so rather than called fresh."""
    datas = {data_seed: task.load(draw_cfg) for data_seed, draw_cfg in draws.items()}
    record = data_record(task, draws, datas)
    digests = [r.get("train_digest") for r in record.get("data_per_seed", {}).values()]
    fresh = None if None in digests else len(set(digests)) == len(digests)
    for data_seed, draw_cfg in draws.items():
        if len(draws) > 1:
            print(f"seed {data_seed}'s data" + (":" if fresh is None else f" ({_DRAWS[fresh]}):"))
        for line in task.describe(draw_cfg, datas[data_seed]):
            say(line)
    return datas, record


_DRAWS = {
    True: "fresh per seed; --data-seed D shares one draw",
    False: "the same training examples at every seed: this data's split does not depend on "
    "the seed, so the seeds vary initialisation, batches and noise, not the data; "
    "replicates over data: one folder per seed, then experiments.combine --per-folder",
}


def _print_model_defaults(cfg, specs, sweeps) -> None:
    """One line per model with hyperparameters of its own (``--model-hparams``)."""
    for name in dict.fromkeys(s.model for s in specs):
        own = model_defaults(cfg, name, sweeps)
        if own:
            print(
                f"{name}: its own "
                + ", ".join(
                    f"{k} = {v:g}" if isinstance(v, float) else f"{k} = {v}" for k, v in own.items()
                )
                + " (--model-hparams; a flag set to another value or a --sweep wins)"
            )


def _plan_all_groups(task: Task, cfg, specs, draws, datas, swept) -> list:
    """The training groups of every draw of the data, built and named; every run's reference
    resolves, and each model gives what the runner reads (:func:`check_model`), before
    anything is written."""
    groups = []
    for data_seed in draws:  # one set of groups per draw of the data
        mine = [s for s in specs if len(draws) == 1 or s.seed == data_seed]
        for group in plan_groups(task, cfg, mine):
            group.data_seed = data_seed
            group.model = task.build(
                draws[data_seed], datas[data_seed], group.model_name, group.structure
            )
            name_group(group, swept, data_seed if len(draws) > 1 else None)
            if not any(g.model_name == group.model_name for g in groups):  # once a model
                check_model(task, draws[data_seed], datas[data_seed], group.model)
            for spec in group.specs:  # every reference resolves before anything is written
                task.resolve_reference(spec.hp["reference"], datas[data_seed])
            groups.append(group)
    return groups


def _check_checkpoints(out, cfg, groups, programs, meshes) -> None:
    """Restores every group's latest checkpoint, if any, onto the devices training will use
    (from any it was saved on), and reads its loop record: a corrupt or foreign one is
    refused before any training."""
    for group, program, shardings in zip(groups, programs, meshes, strict=True):
        folder = out.group_dir(group.slug)
        if folder.is_dir():
            with GroupCheckpointer(folder, keep=cfg.keep_checkpoints) as checkpointer:
                if checkpointer.latest_step() is not None:
                    abstract = program.abstract_states()
                    if shardings is not None:
                        abstract = shardings.abstract_states(abstract)
                    _, loop = checkpointer.restore(abstract)
                    step_dir = checkpointer.step_dir(checkpointer.latest_step())
                    loop_record(loop, program.keys.shape[0], step_dir)  # not mid-resume


def evaluation_grids(task: Task, cfg, specs) -> tuple[list[float], list[float]]:
    """``(test γs, validation γs)`` every run of ``specs`` is evaluated at: one test grid for
    every run, the union of their grids, so runs swept over γ_train are evaluated (and
    compiled) alike; the task's validation γs and every γ_train. A task's grid without its
    γ_train or a ``--test-gammas`` value (a grid that ignores the flag) is refused."""
    gamma_trains = sorted({float(s.hp["gamma_train"]) for s in specs})
    grids = {gt: [float(g) for g in task.test_gamma_grid(cfg, gt)] for gt in gamma_trains}
    for gt, grid in grids.items():  # a run's γ_train is where its descent is judged
        left_out = [g for g in [gt, *(cfg.test_gammas or ())] if g not in grid]
        if left_out:
            raise UsageError(
                f"{task.name}'s test_gamma_grid(cfg, {gt:g}) is {grid}, without "
                f"{', '.join(f'{g:g}' for g in left_out)}: return a grid holding the run's "
                "gamma_train and every --test-gammas value"
            )
    gammas = sorted({g for grid in grids.values() for g in grid})
    val_gammas = sorted(set(task.val_gammas(cfg, gamma_trains, gammas)) | set(gamma_trains))
    return gammas, val_gammas


def _train_and_evaluate(
    task: Task, cfg, out, draws, datas, groups, programs, meshes, gammas, val_gammas
) -> dict[str, Any]:
    """Trains each group, writes its training logs, evaluates it: ``{"runs", "ratios",
    "train_seconds", "eval_seconds", "devices"}`` over every group."""
    on_device: dict[int, Any] = {}  # groups reading the same examples share one device copy
    runs: list[dict] = []
    ratios: list = []
    train_seconds, eval_seconds = {}, {}
    devices_used = 1
    for group, program, shardings in zip(groups, programs, meshes, strict=True):
        group_cfg, group_data = draws[group.data_seed], datas[group.data_seed]
        eval_keys = evaluation_keys(group_cfg.data_rng_seed)
        t = time.perf_counter()
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
            fault=fault_runs(cfg, group),
            data={"examples": examples, "frozen": group.model.frozen},
            extras=program.extras,
            shardings=shardings,
        )
        train_seconds[group.name] = time.perf_counter() - t
        if shardings is not None and jax.process_count() > 1:  # every process reads every run
            result = dataclasses.replace(result, states=shardings.to_host(result.states))
        if jax.process_index() == 0:  # training logs, as soon as the group has trained
            _write_group_logs(out, group, result)
        t = time.perf_counter()
        group_runs, group_ratios = summarise(
            task, group_cfg, group_data, group, program, result, gammas, val_gammas, eval_keys
        )
        eval_seconds[group.name] = time.perf_counter() - t
        runs += group_runs
        ratios += group_ratios
    return {
        "runs": runs,
        "ratios": ratios,
        "train_seconds": train_seconds,
        "eval_seconds": eval_seconds,
        "devices": devices_used,
    }


def _write_group_logs(out, group, result) -> None:
    """The group's training curves as TensorBoard logs (rewritten whole)."""
    write_tensorboard(
        [
            {
                "label": label,
                "group": group.name,
                "constrained": spec.constrained,
                "curves": curves_of(result, r),
            }
            for r, (label, spec) in enumerate(zip(group.labels, group.specs, strict=True))
            if result.curves
        ],
        out.path / TENSORBOARD,
    )


def _results(
    task: Task, cfg, out, draws, data, sweeps, swept, gammas, val_gammas, trained
) -> dict[str, Any]:
    """results.json's content (without its provenance and wall time): the runs with the best
    of each setting marked, the intervals over seeds, the chosen points, the config."""
    runs = trained["runs"]
    score, higher = task.selection_for(cfg)
    select_best(runs, score, higher_is_better=higher)
    # --data-seed: every seed read one draw (the intervals say so)
    intervals = seed_intervals(runs, data_draw=cfg.data_seed) if cfg.seeds >= 2 else []
    chosen = choose_points(runs, score, higher_is_better=higher)
    chosen += choose_points(runs, score, higher_is_better=higher, constrained=False)
    comparisons = compare_chosen(runs, chosen, tolerance=cfg.tolerance, data_draw=cfg.data_seed)
    mark_chosen(runs, chosen)  # before the figures: they draw the unchosen lanes faint
    extras = task.config_extras(draws[next(iter(draws))], data)
    config = (
        dataclasses.asdict(cfg)
        | extras
        | {
            # what the task derived from the data: the first draw's (per seed in the runs)
            "data_derived": sorted(extras),
            "test_gamma": gammas,
            "val_gamma": val_gammas,
            "out": str(out.path),
            "sweeps": {k: list(v) for k, v in sweeps.items()},
            "swept": swept,
            "data_per_seed": cfg.data_seed is None,
        }
    )
    return {
        "experiment": task.name,
        "config": config,
        "devices": trained["devices"],
        "processes": jax.process_count(),
        **task.results_extras(cfg, data),
        "runs": runs,
        **({"intervals": intervals} if intervals else {}),
        **({"chosen_points": chosen} if chosen else {}),
        **({"chosen_comparison": comparisons} if comparisons else {}),
        "train_seconds": trained["train_seconds"],
        "eval_seconds": trained["eval_seconds"],
    }


def _write_results(task: Task, cfg, data, out, results, ratios, gammas, swept, t0) -> None:
    """The figures (none with ``--no-figures``), the training curves, results.json (last: a
    complete run), the summary table, and what the task writes from the finished run."""
    runs = results["runs"]
    figures = task.figures(cfg, runs, ratios, out.path, gammas) if cfg.figures else []
    figures += task.outputs(cfg, runs, ratios, out.path, gammas)
    if cfg.figures:
        curve_runs = [r for r in runs if r["curves"]["step"]]
        figures.append(out.path / "training_curves.png")
        plot_training_curves(
            curve_runs, figures[-1], title="multipliers and constraint values during training"
        )
    # what --overwrite removes with the results (cudt.runner.output.open_output)
    results["files"] = [
        p.relative_to(out.path).as_posix() for p in figures if p.is_relative_to(out.path)
    ]
    results["wall_seconds"] = time.perf_counter() - t0
    write_json_atomic(out.path / "results.json", results)
    intervals = results.get("intervals", [])
    chosen = results.get("chosen_points", [])
    comparisons = results.get("chosen_comparison", [])
    print(summary_table(task, runs, swept, intervals, chosen, comparisons))
    names = ", ".join(str(p) for p in [out.path / "results.json", *figures])
    print(f"training curves: tensorboard --logdir {shlex.quote(str(out.path / TENSORBOARD))}")
    print(f"wrote {names} in {results['wall_seconds']:.0f}s")
    task.finish(cfg, data, results, out.path)
