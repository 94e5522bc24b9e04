"""What a run reports: its evaluation record, the best run of each setting, the summary table.

:func:`summarise` evaluates a trained group with one compiled evaluator and turns each run into
its ``results.json`` record; :func:`select_best` marks the best run of each setting;
:func:`summary_table` is the fixed-width table every experiment prints.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from cudt import descent
from cudt.loop import LoopResult
from cudt.metrics import descent_stats, feasibility

__all__ = [
    "KINDS",
    "Column",
    "format_table",
    "select_best",
    "status_cell",
    "summarise",
    "summary_table",
]

KINDS = {False: "ERM", True: "constrained"}


def evaluate_group(evaluator, params, frozen, batches, num_examples, gammas, key) -> dict:
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


def decreases(losses) -> bool:
    losses = np.asarray(losses, np.float64)
    return bool(np.all(np.isfinite(losses)) and np.all(np.diff(losses) < 0))


def curves_of(result: LoopResult, r: int) -> dict[str, list]:
    out: dict[str, list] = {"step": [int(c["step"]) for c in result.curves]}
    for name in ("objective", "lagrangian", "layer_loss", "constraint", "multipliers", "slacks"):
        if result.curves and name in result.curves[0]:
            out[name] = [np.asarray(c[name])[r].tolist() for c in result.curves]
    return out


def summarise(task, cfg, data, group, program, result, gammas, val_gammas, eval_key):
    model = group.model
    evaluator = jax.jit(
        jax.vmap(model.eval_outputs, in_axes=(0, None, None, None, None, None))
    )  # compiled once per group (and per batch shape)

    def evaluate(split: str, split_gammas, key):
        batches = task.eval_batches(data, split, model, cfg.eval_batch_size)
        return evaluate_group(
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
            "loss_decreases": decreases(layer_loss[gi]),
            "descent_rate": stats.descent_rate,
            "mean_ratio": stats.mean_ratio,
            "median_ratio": stats.median_ratio,
            "feasible": verdict.feasible and not diverged,
            "constraint_val": verdict.constraint,
            "relative_violation_val": verdict.relative_violation,
            "val_objective": float(val_mean[-1]),
            "multipliers": np.asarray(descent.multipliers(result.states)[r]).tolist(),
            **(
                {
                    "multipliers_table_max": np.asarray(
                        descent.multipliers(result.states, jnp.max)[r]
                    ).tolist()
                }
                if cfg.constraint == "indexed"
                else {}
            ),
            "max_multipliers": (
                np.zeros(model.num_layers + 1).tolist()
                if result.max_multipliers is None
                else np.nan_to_num(result.max_multipliers[r], nan=np.inf).tolist()
            ),
            "diverged": diverged,
            "diverged_at": result.diverged_at[r],
            "train_objective": [float(h["objective"][r]) for h in result.history],
            "train_steps": [int(h["step"]) for h in result.history],
            "curves": curves_of(result, r),
        }
        runs.append(record)
        ratios.append(None if diverged else stats.ratios.ravel())
    extra = task.trained_outputs(cfg, data, model, result.states.params, group.labels)
    for record, fields in zip(runs, extra, strict=True):
        record.update(fields)
    return runs, ratios


def select_best(runs: list[dict], score: str, *, higher_is_better: bool) -> None:
    """Marks ``best: True`` on the best run of each setting: (model, layers, constrained,
    gamma_train), across sweep points and seeds.

    A diverged run is never eligible, nor is an infeasible constrained run: a broken run is never
    silently picked as "best". (ERM runs have no constraints to satisfy: their feasibility verdict
    is reported, not required.) A group with no eligible run has no best.
    """
    groups: dict[tuple, list[dict]] = {}
    for run in runs:
        run["best"] = False
        setting = (run["model"], run["layers"], run["constrained"], run.get("gamma_train"))
        groups.setdefault(setting, []).append(run)
    for group in groups.values():
        eligible = [
            r
            for r in group
            if not r.get("diverged")
            and (r.get("feasible") or not r["constrained"])
            and np.isfinite(r.get(score, np.nan))
        ]
        if eligible:
            pick = (max if higher_is_better else min)(eligible, key=lambda r: r[score])
            pick["best"] = True


@dataclasses.dataclass(frozen=True)
class Column:
    header: str
    width: int
    cell: Callable[[dict], str]


def format_table(runs: Iterable[dict], columns: Sequence[Column]) -> str:
    """A fixed-width text table, one row per run."""
    head = " ".join(f"{c.header:>{c.width}}" for c in columns)
    lines = [head, "-" * len(head)]
    for run in runs:
        lines.append(" ".join(f"{c.cell(run):>{c.width}}" for c in columns))
    return "\n".join(lines)


def status_cell(run: dict) -> str:
    """``DIVERGED`` / ``yes`` / ``NO`` (feasibility), ``*`` for the best run of its group."""
    if run.get("diverged"):
        return "DIVERGED"
    return ("yes" if run.get("feasible") else "NO") + ("*" if run.get("best") else " ")


def summary_table(task, runs: list[dict], swept: list[str]) -> str:
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
