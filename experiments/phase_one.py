"""Phase I of the video task's models: is there a point that meets every descent constraint on
training and validation data, and does it descend on test?

    python -m experiments.phase_one --models dust --seeds 5 --out runs/phase1-dust

The flags are the video task's own (``python -m experiments.video_denoise --help``): the data
(``--dataset``, ``--data-dir``, ...), the models and their architecture (``--layers``,
``--dust-dictionary``, ...), the seeds, the steps, the constraints (``--epsilon``,
``--tune-epsilon``, ``--model-hparams``, ``--tolerance``). Each seed draws its own data as the
runner does (``--data-seed D``: one draw for every seed), and each model is built as its
constrained runs are (DUST with one dictionary per layer under ``--dust-dictionary paper``).
For every ε × learning rate × γ_train its constrained runs would train (the dual-rate lanes
change nothing here), phase I (:mod:`experiments.paper.phase1`) minimises the constraints'
total violation for ``--steps`` steps from the model's initialisation and from its ERM point
(``--steps`` ERM steps first).

Each point is judged on VALIDATION as the runner judges a run (:func:`cudt.metrics.feasibility`
at ``--tolerance``, monotone mean losses), with the runner's evaluation noise; the same on TEST
is reported only, never deciding: whether a point feasible on the data it was found on exists,
and whether it generalises. Writes ``phase1.json`` (every point's per-layer losses and ratios
r_l = ℓ_l / ℓ_(l−1) on both splits) and ``phase1.md`` under ``--out``; the same command with
the same ``--out`` reuses a finished result; a result of other flags there is refused (one line,
status 2) unless ``--overwrite``.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

from cudt import descent
from cudt.errors import UsageError
from cudt.io import check_not_a_file, claimed_run_dir, to_jsonable, write_json_atomic
from cudt.metrics import feasibility
from cudt.runner.cli import (
    config_main,
    exit_process,
    given_on_command_line,
)
from cudt.runner.config import RunConfig
from cudt.runner.lock import check_free, lock_output
from cudt.runner.provenance import provenance
from cudt.runner.record import decreases, evaluation_keys
from cudt.runner.run import data_draws, data_record, evaluation_grids
from cudt.runner.sweep import parse_model_hparams, parse_sweeps
from cudt.tasks.video import VideoConfig, VideoTask
from experiments.paper.job import JOB_FILE, check_job_folder, differences_by_content
from experiments.paper.phase1 import (
    ERM_POINT,
    STARTS,
    judged_violation,
    split_means,
    train_phase_one,
)
from experiments.paper.rows import write_text

__all__ = ["judge", "main", "markdown", "run_phase_one", "settings"]

RESULT, TABLE = "phase1.json", "phase1.md"


def settings(task, cfg) -> list[dict[str, Any]]:
    """``[{model, epsilon, lr, gamma_train}]``: each model's distinct constrained settings, read
    from the runs the runner would train (:meth:`cudt.runner.Task.run_specs`)."""
    seen: dict[tuple, dict] = {}
    for spec in task.run_specs(cfg):
        if spec.constrained:
            hp = spec.hp
            key = (spec.model, float(hp["epsilon"]), float(hp["lr"]), float(hp["gamma_train"]))
            seen.setdefault(
                key, dict(zip(("model", "epsilon", "lr", "gamma_train"), key, strict=True))
            )
    if not seen:
        raise UsageError(
            f"--models {','.join(cfg.models)} --kinds {cfg.kinds}: no constrained runs, so no "
            "constraints to meet: pass --kinds both or constrained"
        )
    return list(seen.values())


def judge(means, epsilon: float, tolerance: float) -> dict[str, Any]:
    """One split's verdict on mean losses ``[L+1]``, as the runner's: ``violation`` (the phase-I
    objective over the constraints the runner judges), ``max_relative_violation`` over the
    judged constraints, ``feasible`` within ``tolerance`` (:func:`cudt.metrics.feasibility`),
    ``monotone``, ``layer_loss``, ``ratio``."""
    m = np.asarray(means, np.float64)
    verdict = feasibility(m, np.full(m.size - 1, epsilon), None, tolerance)
    rel = np.asarray(verdict.relative_violation[1:])[np.asarray(verdict.applicable[1:])]
    return {
        "violation": float(judged_violation(m[None], epsilon)[0][0]),
        "max_relative_violation": float(rel.max()) if rel.size else None,
        "feasible": verdict.feasible,
        "monotone": decreases(m, verdict.applicable[1:]),
        "layer_loss": m.tolist(),
        "ratio": (m[1:] / np.maximum(m[:-1], descent.RATIO_FLOOR)).tolist(),
    }


def _eval_keys(task, cfg, draw_cfg, gamma_train: float) -> dict[str, jax.Array]:
    """The keys of the runner's evaluation noise at ``gamma_train`` (its
    :func:`cudt.runner.record.evaluation_keys`, folded with the γ's index in its test and
    validation grids, :func:`cudt.runner.run.evaluation_grids`), so the phase-I points see the
    noisy inputs its runs see."""
    gammas, val_gammas = evaluation_grids(task, cfg, task.run_specs(cfg))
    test_key, val_key = evaluation_keys(draw_cfg.data_rng_seed)
    return {
        "test": jax.random.fold_in(test_key, gammas.index(gamma_train)),
        "val": jax.random.fold_in(val_key, val_gammas.index(gamma_train)),
    }


def _spec(cfg, data: dict[str, Any]) -> dict[str, Any]:
    """What a result is of: the flags, and the data's record (``data``: the task's fingerprint
    of each draw, its digests, as a run's checkpoints record it)."""
    return {
        "job": "phase_one",
        "config": to_jsonable(cfg.fingerprint(evaluation=True)),
        "data": to_jsonable(data),
    }


def _finished(out: Path, cfg, data: dict[str, Any]) -> dict | None:
    """The result in ``out`` of the same flags and data (reused), None when there is none; a
    result of other flags is refused unless ``--overwrite``. ``data``: the data's record now
    (:func:`cudt.runner.run.data_record`): the files decide by what they hold, as a run's
    resume decides (a ``--data-dir`` naming a copy is reused, other files at the same path
    refused); a result from before the record compares the paths as written."""
    path = out / RESULT
    if not path.exists() or cfg.overwrite:
        return None
    try:
        saved = json.loads(path.read_text())
        spec = saved["spec"]
        # a field a later cudt added, kept at what earlier versions did, is no difference
        diff, other_files = differences_by_content(
            type(cfg), spec["config"], _spec(cfg, data)["config"], spec.get("data"), data
        )
        same = spec["job"] == "phase_one" and not diff
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise UsageError(f"{path} is unreadable ({e}): delete it, or pass --overwrite") from e
    if same and other_files:
        raise UsageError(
            f"{path} holds phase I of other files than the flags name now "
            f"({'; '.join(other_files[:3])}): restore the files it was computed on, pass "
            "another --out, or --overwrite"
        )
    if not same:
        raise UsageError(
            f"{path} holds phase I of other flags ({'; '.join(diff[:3]) or 'another job'}): "
            "rerun with the flags that made it, pass another --out, or --overwrite"
        )
    return saved


def _rows(task, cfg, draw_cfg, data, setting: dict, seeds: list[int]) -> list[dict]:
    """Phase I of one model and setting on one draw of the data, as vmapped seeds: a row per
    seed × start, each judged on validation and test (the ``erm`` row also holds its start,
    the ERM point, under :data:`ERM_POINT`)."""
    name, gamma, eps = setting["model"], setting["gamma_train"], setting["epsilon"]
    model = task.build(draw_cfg, data, name, task.structure(cfg, name, True))
    t = time.perf_counter()
    trained = train_phase_one(
        model,
        task.train_examples(data, model),
        gamma=gamma,
        epsilon=eps,
        steps=cfg.steps,
        seeds=seeds,
        lr=setting["lr"],
        batch_size=cfg.batch_size,
    )
    keys = _eval_keys(task, cfg, draw_cfg, gamma)
    examples = {k: task.split_examples(data, k, model) for k in ("val", "test")}
    evaluate = split_means(model, min(cfg.eval_batch_size, max(map(len, examples.values()))))
    points = {
        start: {"train_objective": np.asarray(obj, np.float64)}
        | {k: evaluate(params, examples[k], gamma, keys[k]) for k in examples}
        for start, (params, obj) in trained.items()
    }
    seconds = time.perf_counter() - t

    def point(start: str, i: int) -> dict:
        p = points[start]
        return {"train_objective": float(p["train_objective"][i])} | {
            k: judge(p[k][i], eps, cfg.tolerance) for k in examples
        }

    rows = []
    for i, seed in enumerate(seeds):
        for start in STARTS:
            row = setting | {"seed": seed, "data_seed": draw_cfg.data_rng_seed, "start": start}
            row |= point(start, i) | {"seconds": seconds / len(seeds)}
            if start == "erm":  # where it began: the ERM solution
                row[ERM_POINT] = point(ERM_POINT, i)
            rows.append(row)
    return rows


def run_phase_one(cfg: VideoConfig) -> dict[str, Any]:
    """Phase I of every model, setting and seed of ``cfg``; writes and returns the result. The
    default folder is claimed at the start (two jobs in one second get two), gone if refused."""
    with claimed_run_dir(cfg.out, "phase_one") as out:
        return _phase_one_in(cfg, out)


def _phase_one_in(cfg: VideoConfig, out: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    task = VideoTask()
    check_not_a_file(out)
    check_free(out)
    check_job_folder(out, "phase_one")  # not into a run's folder, nor another job's
    draws = data_draws(cfg)
    datas = {d: task.load(c) for d, c in draws.items()}  # bad data: refused before writing
    record = to_jsonable(data_record(task, draws, datas))  # what a saved result is checked by
    saved = _finished(out, cfg, record)
    if saved is None and cfg.resume:
        raise UsageError(
            f"--resume: --out {out} holds no phase I result of these flags to reuse: drop "
            "--resume to compute it"
        )
    if saved is not None:
        print(f"reusing {out / RESULT} (the same flags)\n")
        print(saved["markdown"])
        return saved
    plan = settings(task, cfg)
    origin = provenance()
    with lock_output(out):
        # again under the lock: a job on this folder may have finished since the check above
        saved = _finished(out, cfg, record)
        if saved is not None:
            print(f"reusing {out / RESULT} (the same flags, written meanwhile)\n")
            print(saved["markdown"])
            return saved
        # the folder holds this job from now on: a table or study job is refused there
        write_json_atomic(out / JOB_FILE, {"job": "phase_one"})
        rows = []
        for data_seed, draw_cfg in draws.items():
            seeds = cfg.seed_list if cfg.data_seed is not None else [data_seed]
            for setting in plan:
                t = time.perf_counter()
                rows += _rows(task, cfg, draw_cfg, datas[data_seed], setting, seeds)
                print(
                    f"data seed {data_seed}: {setting['model']}-{cfg.layers} {_named(setting)}: "
                    f"phase I of seeds {','.join(map(str, seeds))} in "
                    f"{time.perf_counter() - t:.0f} s"
                )
        wall = time.perf_counter() - t0
        result = {
            "spec": _spec(cfg, record),
            "provenance": origin,
            "tolerance": cfg.tolerance,
            "steps": cfg.steps,
            "wall_seconds": wall,
            "rows": rows,
        }
        result["markdown"] = markdown(result, cfg)
        write_json_atomic(out / RESULT, result)
        write_text(out / TABLE, result["markdown"])
    print()
    print(result["markdown"])
    print(f"wrote {out / RESULT}, {out / TABLE} ({wall:.0f} s wall)")
    return result


def _command(argv) -> str:
    """The command a result was made by, as a shell reruns it: ``python -m
    experiments.phase_one`` for the script's path ``python -m`` puts in ``sys.argv[0]``, and
    every argument quoted (a ``--data-dir`` with a space in it stays one argument)."""
    argv = list(argv or [])
    if argv and Path(argv[0]).name == "phase_one.py":
        argv = ["python", "-m", "experiments.phase_one", *argv[1:]]
    return shlex.join(argv)


def _num(x) -> str:
    return "n/a" if x is None else f"{x:+.4f}"


def _named(setting: dict) -> str:
    """A setting as its progress line names it: ε, learning rate and γ_train (a sweep over any
    of them gives settings that differ in that alone)."""
    return f"ε {setting['epsilon']:g}, lr {setting['lr']:g}, γ_train {setting['gamma_train']:g}"


_COUNTED = (("val", "feasible"), ("test", "feasible"), ("test", "monotone"))


def markdown(result: dict, cfg) -> str:
    """The result as a Markdown table: per model × seed × start, validation (deciding) then
    test (reported only), and each split's ratios r_l."""
    origin = result["provenance"]
    commit = (origin.get("commit") or "?")[:7] + ("+dirty" if origin.get("dirty") else "")
    lines = [
        f"# Phase I, {cfg.dataset}, L = {cfg.layers}",
        "",
        f"`{_command(origin.get('argv'))}` at commit {commit}, {result['steps']} steps "
        f"from each start, {result['wall_seconds']:.0f} s wall. Feasible: every constraint "
        f"within {result['tolerance']:g} of ℓ_(l−1) (the runner's rule); viol.: the phase-I "
        "objective left (at start: the ERM point's, before phase I); rel.: the largest relative violation; mono.: losses fall at every "
        "layer. Validation decides; test is reported only.",
        "",
        "| model | ε | lr | γ_train | seed | start | viol. at start (val) | viol. (val) | "
        "rel. (val) | feasible (val) | mono. (val) | rel. (test) | feasible (test) | "
        "mono. (test) | r_l val | r_l test |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    yes = lambda b: "yes" if b else "NO"  # noqa: E731
    for r in result["rows"]:
        v, t = r["val"], r["test"]
        lines.append(
            f"| {r['model']} | {r['epsilon']:g} | {r['lr']:g} | {r['gamma_train']:g} | "
            f"{r['seed']} | {r['start']} | "
            + (f"{r[ERM_POINT]['val']['violation']:.4f}" if ERM_POINT in r else "-")
            + f" | {v['violation']:.4f} | {_num(v['max_relative_violation'])} | {yes(v['feasible'])} "
            f"| {yes(v['monotone'])} | {_num(t['max_relative_violation'])} | "
            f"{yes(t['feasible'])} | {yes(t['monotone'])} | "
            f"{' '.join(f'{x:.3f}' for x in v['ratio'])} | "
            f"{' '.join(f'{x:.3f}' for x in t['ratio'])} |"
        )
    lines += [
        "",
        "| model | ε | lr | γ_train | start | feasible (val) | feasible (test) | monotone (test) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    groups: dict[tuple, list] = {}  # one setting and start, over the seeds
    for r in result["rows"]:
        key = (r["model"], r["epsilon"], r["lr"], r["gamma_train"], r["start"])
        groups.setdefault(key, []).append(r)
    for (model, eps, lr, gamma_train, start), rs in groups.items():
        n = [sum(bool(r[k][what]) for r in rs) for k, what in _COUNTED]
        lines.append(
            f"| {model} | {eps:g} | {lr:g} | {gamma_train:g} | {start} | "
            + " | ".join(f"{c} of {len(rs)}" for c in n)
            + " |"
        )
    return "\n".join(lines) + "\n"


# the runner's flags phase I reads (the video task's own, the data and the models, all act but
# --select): the settings (ε, learning rate, γ_train and their grids), the steps, the seeds and
# data draws, the verdict and the output. Phase I trains as ERM at a constant rate with no
# multipliers and no reference, in one program, so every other flag would not act.
READ = (
    "seeds", "seed", "data_seed", "sweep", "model_hparams", "tune_epsilon", "kinds", "steps",
    "batch_size", "lr", "gamma_train", "test_gammas", "epsilon", "tolerance", "eval_batch_size",
    "out", "resume", "overwrite",
)  # fmt: skip
SWEPT = ("epsilon", "lr", "gamma_train")  # the --sweep names that change a setting


def _acting() -> set[str]:
    """The flags phase I reads (``--help`` lists these only): the video task's own but
    ``--select``, and the runner's in :data:`READ`."""
    task_own = {f.name for f in dataclasses.fields(VideoConfig)} - {
        f.name for f in dataclasses.fields(RunConfig)
    }
    return (task_own - {"select"}) | set(READ)


def _refuse_inert_flags(argv) -> None:
    """Refuse (one line) a flag ``argv`` gives that would not act in phase I, a runner flag not
    in :data:`READ` or ``--select``: before its value is read (a bad value of a flag phase I
    does not use was reported as the value's fault)."""
    extra = sorted(given_on_command_line(VideoConfig, argv, quiet=True) - _acting())
    if extra:
        raise UsageError(
            f"--{extra[0].replace('_', '-')} has no effect in phase I (an ERM run of the "
            "phase-I objective at a constant rate, no multipliers, no reference): drop it"
        )


def _refuse_inert(cfg, argv) -> None:
    """Refuse (one line) a ``--sweep`` or ``--model-hparams`` of a name not in :data:`SWEPT`
    (the flags themselves: :func:`_refuse_inert_flags`)."""
    given = given_on_command_line(VideoConfig, argv)
    sweeps = parse_sweeps(cfg) if "sweep" in given else {}
    named = {f"--sweep {n.replace('_', '-')}": n for n in sweeps}
    if "model_hparams" in given:
        table = parse_model_hparams(cfg)
        named |= {f"--model-hparams {m}:{n}": n for m, hp in table.items() for n in hp}
    for shown, name in named.items():
        if name not in SWEPT:
            raise UsageError(
                f"{shown} has no effect in phase I (it reads only the settings' "
                f"{', '.join(SWEPT)}): drop it"
            )


def main(argv=None) -> int:
    """The entry point: the video task's flags → phase I; bad input (a flag that would not
    act here too) is one line, status 2, nothing written."""
    argv = sys.argv[1:] if argv is None else list(argv)

    def job(cfg):
        _refuse_inert(cfg, argv)
        return run_phase_one(cfg)

    return config_main(
        VideoConfig,
        job,
        argv,
        __doc__,
        "experiments.phase_one",
        refuse=_refuse_inert_flags,
        shown=_acting(),
    )


if __name__ == "__main__":
    exit_process(main())
