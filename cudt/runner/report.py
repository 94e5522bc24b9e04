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

from cudt import descent, stats
from cudt.loop import CURVE_METRICS, LoopResult
from cudt.metrics import descent_stats, feasibility
from cudt.runner.hparams import CONSTRAINT_ONLY

__all__ = [
    "KINDS",
    "at_gamma_train",
    "choose_points",
    "chosen_lines",
    "evaluation_keys",
    "compare_chosen",
    "comparison_lines",
    "Column",
    "format_table",
    "interval_lines",
    "mark_chosen",
    "relaxation",
    "seed_intervals",
    "select_best",
    "status_cell",
    "summarise",
    "summary_table",
]

KINDS = {False: "ERM", True: "constrained"}


def evaluate_group(
    evaluator, params, frozen, batches, num_examples, gammas, key, last=None, per_state=None
) -> dict:
    """``{name: [G, R, N, S]}`` of every run at every γ, with the group's compiled evaluator.

    ``last`` (the compiled ``eval_last``, or None) evaluates the last state only at every γ
    not in ``per_state`` (default: all of them per state); the other states are NaN there. The
    key of γ index ``gi`` is ``fold_in(key, gi)`` either way, so the noise does not change.
    """
    out: dict[str, np.ndarray] = {}
    batches = list(batches)
    for gi, gamma in enumerate(gammas):
        k = jax.random.fold_in(key, gi)
        whole = last is None or per_state is None or gamma in per_state
        fn, cols = (evaluator, slice(None)) if whole else (last, slice(-1, None))
        for b in batches:
            args = (params, frozen, b.examples, jnp.asarray(b.index), jnp.float32(gamma), k)
            res = jax.device_get(fn(*args))
            if not out:  # [G, R, N, S]: the widths are the whole evaluator's
                for name, v in jax.eval_shape(evaluator, *args).items():
                    fill = np.nan if np.issubdtype(v.dtype, np.floating) else 0
                    out[name] = np.full(
                        (len(gammas), v.shape[0], num_examples, v.shape[2]), fill, v.dtype
                    )
            idx = b.index[: b.count]
            for name, value in res.items():  # [R, B, S], S = 1 for the last state only
                out[name][gi, :, idx, cols] = np.asarray(value)[:, : b.count].transpose(1, 0, 2)
    return out


def decreases(losses, applicable=None) -> bool:
    """Whether the mean loss falls at every layer: ``losses [L+1]``; ``applicable [L]`` (default
    all) leaves out the steps from a state whose loss is at the floor (they cannot fall)."""
    losses = np.asarray(losses, np.float64)
    steps = np.diff(losses) < 0
    if applicable is not None:
        steps = steps | ~np.asarray(applicable, bool)
    return bool(np.all(np.isfinite(losses)) and np.all(steps))


def curves_of(result: LoopResult, r: int) -> dict[str, list]:
    out: dict[str, list] = {"step": [int(c["step"]) for c in result.curves]}
    for name in CURVE_METRICS:
        if result.curves and name in result.curves[0]:
            out[name] = [np.asarray(c[name])[r].tolist() for c in result.curves]
    return out


def evaluation_keys(data_rng_seed: int) -> tuple[jax.Array, jax.Array]:
    """``(test, validation)``: the base keys of the evaluation noise of every run on the data
    draw ``data_rng_seed`` (:func:`evaluate_group` folds in each γ's index in its split's grid),
    for the runner and for a job that evaluates points as its runs are (experiments.phase_one)."""
    key = jax.random.key(10_000 + data_rng_seed)
    return key, jax.random.fold_in(key, 99)


def summarise(task, cfg, data, group, program, result, gammas, val_gammas, eval_keys):
    """Evaluates a trained group on test and validation (one compiled evaluator) and turns each
    run into its ``results.json`` record: ``(records, kept descent ratios)`` (None for a
    diverged run)."""
    model = group.model
    test, val = _evaluate_splits(task, cfg, data, group, result, gammas, val_gammas, eval_keys)
    eps = np.asarray(program.per_run["epsilon"])
    runs, ratios = [], []
    for r, spec in enumerate(group.specs):
        record, kept = _run_record(
            task, cfg, group, program, result, r, spec, test, val, gammas, val_gammas, eps[r]
        )
        runs.append(record)
        ratios.append(kept)
    extra = task.trained_outputs(cfg, data, model, result.states.params, group.labels)
    for record, fields in zip(runs, extra, strict=True):
        record.update(fields)
    return runs, ratios


def _evaluate_splits(task, cfg, data, group, result, gammas, val_gammas, eval_keys):
    """``(test, val)``: :func:`evaluate_group` of the group's runs on each split at its γs."""
    model = group.model
    axes = (0, None, None, None, None, None)
    evaluator = jax.jit(jax.vmap(model.eval_outputs, in_axes=axes))  # once per batch shape
    last = None if model.eval_last is None else jax.jit(jax.vmap(model.eval_last, in_axes=axes))
    per_state = {float(spec.hp["gamma_train"]) for spec in group.specs}

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
            last,
            per_state,
        )

    test_key, val_key = eval_keys
    test = evaluate("test", gammas, test_key)
    val = evaluate("val", val_gammas, val_key)
    return test, val


def _run_record(task, cfg, group, program, result, r, spec, test, val, gammas, val_gammas, eps):
    """Run ``r``'s ``results.json`` record and its kept descent ratios (None if it diverged)."""
    model = group.model
    hp = spec.hp
    gamma_train = float(hp["gamma_train"])
    gi = gammas.index(gamma_train)
    vi = val_gammas.index(gamma_train)
    diverged = bool(result.diverged[r])
    per_gamma = test["losses"][:, r]  # [G, N, S]
    ratio_stats = descent_stats(per_gamma[gi])
    val_mean = val["losses"][vi, r].mean(0)
    verdict = feasibility(
        val_mean, np.full(model.num_layers, eps), program.references[r], cfg.tolerance
    )
    applicable = verdict.applicable[1:]  # [L]: steps l-1 -> l judged (not at the floor)
    task_metrics = task.run_metrics(
        cfg,
        {k: v[:, r] for k, v in test.items()},
        {k: v[vi, r] for k, v in val.items()},
        gammas,
        gamma_train,
    ) | task.val_metrics(cfg, {k: v[:, r] for k, v in val.items()}, val_gammas, gamma_train)
    layer_loss = [pg.mean(0).tolist() for pg in per_gamma]
    multipliers = _multiplier_fields(cfg, model, result, r)
    relaxed = _relaxed_fields(
        cfg, spec, multipliers["multipliers"], val_mean, program.references[r], eps, diverged
    )
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
        **task_metrics,
        "layer_loss": layer_loss,
        # reported only: the test split never decides anything (loss_decreases_val does)
        "loss_decreases": decreases(layer_loss[gi]),
        "layer_loss_val": val_mean.tolist(),
        "loss_decreases_val": decreases(val_mean, applicable),
        "descent_rate": ratio_stats.descent_rate,
        "mean_ratio": ratio_stats.mean_ratio,
        "median_ratio": ratio_stats.median_ratio,
        "ratio_floor": ratio_stats.floor,
        "ratios_excluded": ratio_stats.excluded,
        "ratios_total": ratio_stats.total,
        "feasible": verdict.feasible and not diverged,
        "constraint_val": verdict.constraint,
        "relative_violation_val": verdict.relative_violation,
        "constraint_applicable_val": verdict.applicable,
        "not_applicable": verdict.not_applicable,
        **relaxed,
        "val_objective": float(val_mean[-1]),
        **multipliers,
        "diverged": diverged,
        "diverged_at": result.diverged_at[r],
        "train_objective": [float(h["objective"][r]) for h in result.history],
        "train_steps": [int(h["step"]) for h in result.history],
        "curves": curves_of(result, r),
    }
    record["interval_metrics"] = metric_names(task_metrics, len(gammas))
    return record, None if diverged else ratio_stats.kept


def relaxation(cfg, alpha: float, multipliers, val_mean, reference=None) -> np.ndarray:
    """``[L+1]``: a resilient run's relaxation of each constraint at the end of training, in
    the verdict's relative units (``u_l`` of ``mean ℓ_{l−1}``, ``u_0`` of C: what
    :func:`cudt.metrics.feasibility` adds to the tolerance).

    The slack that costs ``(α/2)‖u‖²`` (in the constraint's scale) is at its optimum
    ``u = λ/α`` for the final multipliers ``λ`` (``multipliers [L+1]``; an indexed table's mean,
    implicit multipliers' last batch mean): exactly the slack the decay form carries, and the
    point explicit slacks (``--resilience-mode slack``) descend to between their restarts, which
    may leave them at 0 at the last step. With ``--dual-scale relative`` the constraints' scale is
    ``mean ℓ_{l−1}`` (C for the reference), so ``λ/α`` is already relative; with ``absolute``
    the slack is in the loss's units and is divided by the validation ``mean ℓ_{l−1}`` (and
    |C|), as the verdict divides ``g_l`` (a ``--constraint tail`` slack is a ratio already)."""
    u = np.asarray(multipliers, np.float64) / float(alpha)
    if cfg.dual_scale == "relative":
        return u
    m = np.asarray(val_mean, np.float64)
    scale = np.ones_like(u)
    if cfg.constraint != "tail":
        scale[1:] = np.maximum(np.abs(m[:-1]), 1e-12)
    if reference is not None:
        scale[0] = max(abs(float(reference)), 1e-12)
    return u / scale


def _relaxed_fields(cfg, spec, multipliers, val_mean, reference, eps, diverged) -> dict:
    """``relaxation`` (:func:`relaxation`) and ``feasible_relaxed`` (the constraints on
    validation against ε relaxed by it: the resilient problem the run solved) of a resilient
    run; None for a hard or ERM run (``feasible`` is always the hard problem's verdict)."""
    alpha = spec.hp.get("resilience")
    if not spec.constrained or alpha is None:
        return {"relaxation": None, "feasible_relaxed": None}
    u = relaxation(cfg, alpha, multipliers, val_mean, reference)
    eps = np.full(len(val_mean) - 1, eps)
    verdict = feasibility(val_mean, eps, reference, cfg.tolerance, relaxation=u)
    return {"relaxation": u.tolist(), "feasible_relaxed": verdict.feasible and not diverged}


def _multiplier_fields(cfg, model, result, r) -> dict:
    """Run ``r``'s final multipliers (and, for indexed constraints, each table's maximum) and
    the largest each reached during training. Implicit multipliers have no table: their final
    multipliers are the last step's (its batch's rows' mean)."""
    if cfg.constraint == "indexed" and cfg.multipliers == "implicit":
        last = np.asarray(result.curves[-1]["multipliers"][r]).tolist()
        table = {}
    else:
        last = np.asarray(descent.multipliers(result.states)[r]).tolist()
        table = (
            {
                "multipliers_table_max": np.asarray(
                    descent.multipliers(result.states, jnp.max)[r]
                ).tolist()
            }
            if cfg.constraint == "indexed"
            else {}
        )
    return {
        "multipliers": last,
        **table,
        "max_multipliers": (
            np.zeros(model.num_layers + 1).tolist()
            if result.max_multipliers is None
            else np.nan_to_num(result.max_multipliers[r], nan=np.inf).tolist()
        ),
    }


# What the summary's interval lines cover besides the task's own metrics.
RUNNER_METRICS = ("val_objective", "descent_rate", "mean_ratio", "median_ratio")


def metric_names(task_metrics: dict, num_gammas: int) -> list[str]:
    """The task's reported scalar metrics: its scalars, and ``NAME@γtr`` for a metric given per
    test γ (a list of ``num_gammas`` numbers: its value at γ_train)."""
    out = []
    for k, v in task_metrics.items():
        if isinstance(v, bool):
            continue
        if isinstance(v, int | float | np.floating | np.integer):
            out.append(k)
        elif isinstance(v, list) and len(v) == num_gammas and num_gammas > 1:
            if all(isinstance(x, int | float) and not isinstance(x, bool) for x in v):
                out.append(f"{k}@γtr")
    return out


def at_gamma_train(run: dict, key: str):
    """A run's per-test-γ ``run[key]`` (one entry per ``run["test_gamma"]``) at its γ_train."""
    return run[key][list(run["test_gamma"]).index(run["gamma_train"])]


def _metric(run: dict, name: str) -> float:
    if name.endswith("@γtr"):
        return float(at_gamma_train(run, name[: -len("@γtr")]))
    v = run.get(name)
    return float("nan") if v is None else float(v)


def _setting_key(run: dict, keep=lambda name: True) -> tuple:
    hp = tuple(sorted((k, v) for k, v in run["hparams"].items() if keep(k)))
    return (run["model"], run["layers"], hp)


def seed_intervals(runs: list[dict], level: float = 0.95) -> list[dict]:
    """One entry per model × kind × sweep point with at least two seeds (diverged runs left
    out): the mean and Student-t interval over seeds of every reported metric, and for a
    constrained setting, of constrained − ERM paired by seed (the ERM runs of the same model,
    L and non-constraint hyperparameters)."""
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        if not r.get("diverged"):
            groups.setdefault((r["constrained"], *_setting_key(r)), []).append(r)
    erm_by: dict[tuple, dict[int, dict]] = {}
    for r in runs:
        if not r["constrained"] and not r.get("diverged"):
            key = _setting_key(r, lambda k: k not in CONSTRAINT_ONLY)
            erm_by.setdefault(key, {})[int(r["seed"])] = r
    out = []
    for (constrained, model, layers, hp), rs in groups.items():
        seeds = sorted({int(r["seed"]) for r in rs})
        if len(seeds) < 2 or len(seeds) != len(rs):
            continue
        rs = sorted(rs, key=lambda r: int(r["seed"]))
        names = list(dict.fromkeys(rs[0].get("interval_metrics", []) + list(RUNNER_METRICS)))

        def finite_values(items, name):
            vals = np.array([_metric(r, name) for r in items], np.float64)
            return vals if np.all(np.isfinite(vals)) else None

        metrics = {}
        for name in names:
            vals = finite_values(rs, name)
            if vals is not None:
                metrics[name] = stats.t_interval(vals, level).as_dict()
        minus_erm = {}
        partners = erm_by.get(_setting_key(rs[0], lambda k: k not in CONSTRAINT_ONLY), {})
        if constrained and all(int(r["seed"]) in partners for r in rs):
            erm = [partners[int(r["seed"])] for r in rs]
            for name in names:
                a, b = finite_values(rs, name), finite_values(erm, name)
                if a is not None and b is not None:
                    minus_erm[name] = stats.paired_t_interval(a, b, level).as_dict()
        out.append(
            {
                "model": model,
                "layers": layers,
                "kind": KINDS[constrained],
                "constrained": constrained,
                "gamma_train": rs[0].get("gamma_train"),
                "hparams": dict(hp),
                "seeds": seeds,
                "method": "t",
                "level": level,
                "metrics": metrics,
                "constrained_minus_erm": minus_erm,
            }
        )
    return out


def interval_lines(intervals: list[dict], swept: Sequence[str] = ()) -> list[str]:
    """The summary's lines: one per model × kind (× sweep point), ``name mean [low, high]``."""

    def cell(name, iv):
        if iv["low"] is None:
            return f"{name} {iv['mean']:.4g}"
        return f"{name} {iv['mean']:.4g} [{iv['low']:.4g}, {iv['high']:.4g}]"

    lines = []
    for e in intervals:
        point = " ".join(
            f"{n}={e['hparams'][n]:g}"
            for n in swept
            if isinstance(e["hparams"].get(n), int | float)
        )
        head = f"{e['model']}-{e['layers']} {e['kind']}" + (f" {point}" if point else "")
        pct = f"{100 * e['level']:g}%"
        line = (
            f"{head}: mean [{pct} Student-t interval] over {len(e['seeds'])} seeds: "
            + "; ".join(cell(n, iv) for n, iv in e["metrics"].items())
        )
        if e["constrained_minus_erm"]:
            line += " | constrained − ERM, paired by seed: " + "; ".join(
                cell(n, iv) for n, iv in e["constrained_minus_erm"].items()
            )
        lines.append(line)
    return lines


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


def mark_chosen(runs: list[dict], chosen: list[dict]) -> None:
    """``chosen`` on each run of a setting the runner chose among lanes (:func:`choose_points`):
    True on the chosen point's runs, False on the other lanes'. Runs of a setting with no
    choice made (one point, or none eligible) get no mark. Figures draw the unchosen faint."""
    for c in chosen:
        if c["hparams"] is None:
            continue
        for r in runs:
            same = (r.get("model"), r.get("layers"), r.get("gamma_train")) == (
                c["model"],
                c["layers"],
                c["gamma_train"],
            )
            if same and KINDS[r["constrained"]] == c["kind"]:
                r["chosen"] = r["hparams"] == c["hparams"]


def _eligible(r: dict, constrained: bool, relaxed: bool = False) -> bool:
    """A run a chosen point may hold: not diverged and, constrained, feasible (``relaxed``: on
    the relaxed problem its resilience solved, ``feasible_relaxed``) and monotone on
    validation. ERM has no constraints to meet."""
    if r.get("diverged"):
        return False
    if not constrained:
        return True
    feasible = r.get("feasible_relaxed") if relaxed else r.get("feasible")
    return bool(feasible) and bool(r.get("loss_decreases_val"))


def _best_point(points: dict, score: str, sign: float, ok) -> tuple[int, tuple | None]:
    """``(eligible count, (signed mean, order, point, runs) of the best or None)`` among the
    points whose every run passes ``ok`` with a finite ``score``; ties by sweep order."""
    good = []
    for order, (point, rs) in enumerate(points.items()):
        values = np.array([_metric(r, score) for r in rs], np.float64)
        if all(ok(r) for r in rs) and np.all(np.isfinite(values)):
            good.append((sign * float(values.mean()), order, point, rs))
    return len(good), (min(good, key=lambda g: (g[0], g[1])) if good else None)


def choose_points(
    runs: list[dict],
    score: str,
    *,
    higher_is_better: bool,
    min_points: int = 2,
    constrained: bool = True,
) -> list[dict]:
    """The sweep point chosen on validation, for each model × L × γ_train whose constrained runs
    span ``min_points`` or more points (the runner's report: two, a choice to make): among the
    points whose every seed is eligible (not diverged, feasible and monotone on validation),
    the best mean ``score`` (the task's selection metric, a validation number) over the seeds;
    ties by sweep order.

    Only where no point is eligible on the hard problem, the resilient fallback: among the
    points trained with resilience (``hparams["resilience"]`` not None) whose every seed is
    feasible on the relaxed problem its slacks solved (``feasible_relaxed``: ε relaxed by the
    run's own final relaxation, :func:`relaxation`) and monotone on validation, the best mean
    ``score``; the entry then says ``"resilient": True`` and gives ``relaxation``, each
    constraint's largest relaxation over the seeds ``[L+1]``. A resilient point that meets the
    hard constraints is a hard point like any other.

    Unlike ``best`` (one run), this chooses a setting, as a study would: a point that misses
    its constraints at one seed is out, however good its other seeds. ``constrained=False``
    chooses among the ERM runs' points (their learning rates, say) by the same rule, where
    eligible means not diverged (ERM has no constraints to meet). Returns one entry per
    model × L × γ_train: ``{"model", "layers", "gamma_train", "score", "higher_is_better",
    "points", "eligible", "resilient_points", "resilient_eligible", "resilient", "hparams",
    "mean", "seeds", "relaxation"}``; ``hparams`` (every hyperparameter of the chosen point),
    ``mean`` and ``seeds`` are None when no point is eligible, ``relaxation`` unless the choice
    is resilient.
    """
    groups: dict[tuple, dict[tuple, list[dict]]] = {}
    for r in runs:
        if r["constrained"] == constrained:
            key = (r.get("model"), r.get("layers"), r.get("gamma_train"))
            point = tuple(sorted(r["hparams"].items(), key=lambda kv: kv[0]))
            groups.setdefault(key, {}).setdefault(point, []).append(r)
    out = []
    sign = -1.0 if higher_is_better else 1.0
    for (model, layers, gamma_train), points in groups.items():
        if len(points) < min_points:
            continue
        eligible, best = _best_point(points, score, sign, lambda r: _eligible(r, constrained))
        resilient = {
            p: rs
            for p, rs in points.items()
            if constrained and all(r["hparams"].get("resilience") is not None for r in rs)
        }
        res_eligible, res_best = _best_point(
            resilient, score, sign, lambda r: _eligible(r, True, relaxed=True)
        )
        entry = {
            "model": model,
            "layers": layers,
            "kind": KINDS[constrained],
            "gamma_train": gamma_train,
            "score": score,
            "higher_is_better": higher_is_better,
            "points": len(points),
            "eligible": eligible,
            "resilient_points": len(resilient),
            "resilient_eligible": res_eligible,
            "resilient": best is None and res_best is not None,
            "hparams": None,
            "mean": None,
            "seeds": None,
            "relaxation": None,
        }
        pick = best if best is not None else res_best
        if pick is not None:
            signed, _, point, rs = pick
            entry |= {
                "hparams": dict(point),
                "mean": sign * signed,
                "seeds": sorted(int(r["seed"]) for r in rs),
            }
        if entry["resilient"]:
            entry["relaxation"] = np.max([r["relaxation"] for r in rs], axis=0).tolist()
        out.append(entry)
    return out


def compare_chosen(runs: list[dict], chosen: list[dict], level: float = 0.95) -> list[dict]:
    """Chosen constrained − chosen ERM, paired by seed: for each model × L × γ_train where both
    kinds chose a point on validation (:func:`choose_points` with ``constrained`` True and
    False), the paired Student-t interval over the seeds the two share of every reported
    metric, and the counts a claim needs (seeds, the constrained point's feasibility on
    validation, each kind's monotone test losses). Seeds that drew their own data make these
    independent replicates; the intervals are the headline, never a bootstrap over items."""
    picks: dict[tuple, dict[str, dict]] = {}
    for c in chosen:
        if c["hparams"] is not None:
            key = (c["model"], c["layers"], c["gamma_train"])
            picks.setdefault(key, {})[c.get("kind", "constrained")] = c

    def runs_of(c, constrained):
        point = tuple(sorted(c["hparams"].items(), key=lambda kv: kv[0]))
        return {
            int(r["seed"]): r
            for r in runs
            if r["constrained"] == constrained
            and (r.get("model"), r.get("layers"), r.get("gamma_train"))
            == (c["model"], c["layers"], c["gamma_train"])
            and tuple(sorted(r["hparams"].items(), key=lambda kv: kv[0])) == point
        }

    out = []
    for (model, layers, gamma_train), kinds in picks.items():
        if set(kinds) != {"constrained", "ERM"}:
            continue
        con, erm = runs_of(kinds["constrained"], True), runs_of(kinds["ERM"], False)
        seeds = sorted(set(con) & set(erm))
        if not seeds:
            continue
        a, b = [con[s] for s in seeds], [erm[s] for s in seeds]
        names = list(dict.fromkeys(a[0].get("interval_metrics", []) + list(RUNNER_METRICS)))
        metrics = {}
        for name in names:
            va = np.array([_metric(r, name) for r in a], np.float64)
            vb = np.array([_metric(r, name) for r in b], np.float64)
            if len(seeds) >= 2 and np.all(np.isfinite(va)) and np.all(np.isfinite(vb)):
                metrics[name] = stats.paired_t_interval(va, vb, level).as_dict() | {
                    "erm_mean": float(vb.mean())
                }
        out.append(
            {
                "model": model,
                "layers": layers,
                "gamma_train": gamma_train,
                "constrained_hparams": kinds["constrained"]["hparams"],
                "erm_hparams": kinds["ERM"]["hparams"],
                "seeds": seeds,
                "feasible": sum(bool(r.get("feasible")) for r in a),
                # the fallback's point: judged on the relaxed problem (choose_points)
                "resilient": bool(kinds["constrained"].get("resilient")),
                "feasible_relaxed": sum(bool(r.get("feasible_relaxed")) for r in a),
                "monotone": sum(bool(r.get("loss_decreases")) for r in a),
                "erm_monotone": sum(bool(r.get("loss_decreases")) for r in b),
                "constrained_minus_erm": metrics,
            }
        )
    return out


def comparison_lines(comparisons: list[dict], swept: Sequence[str] = ()) -> list[str]:
    """The summary's lines for :func:`compare_chosen`: each metric's paired interval, "level"
    where it spans 0, and the counts."""

    def point(hp):
        shown = [f"{n}={_hparam_text(hp[n])}" for n in swept if hp.get(n) is not None]
        return " ".join(shown) or "its one point"

    lines = []
    for c in comparisons:
        n = len(c["seeds"])
        cells = []
        for name, iv in c["constrained_minus_erm"].items():
            text = f"{name} {iv['mean']:+.4g} [{iv['low']:+.4g}, {iv['high']:+.4g}]"
            if iv["low"] <= 0 <= iv["high"]:
                text += " level"
            cells.append(text)
        resilient = c.get("resilient", False)  # results.json before the fallback: hard
        kind = "constrained, resilient" if resilient else "constrained"
        feasible = f"constrained feasible at {c['feasible']} of {n}"
        if resilient:
            feasible += f" (relaxed: {c['feasible_relaxed']} of {n})"
        lines.append(
            f"{c['model']}-{c['layers']}: chosen {kind} ({point(c['constrained_hparams'])}) "
            f"− chosen ERM ({point(c['erm_hparams'])}), paired t over {n} seed"
            f"{'s' if n != 1 else ''}: "
            + ("; ".join(cells) if cells else "no interval with one seed")
            + f" | {feasible}, monotone (test) at "
            f"{c['monotone']} of {n}; ERM monotone at {c['erm_monotone']} of {n}"
        )
    return lines


def _hparam_text(value) -> str:
    """A sweep value as the summary prints it: ``none`` (e.g. resilience off), or ``:g``."""
    if value is None:
        return "none"
    return f"{value:g}" if isinstance(value, int | float) else str(value)


def relaxation_text(u, epsilon=None) -> str:
    """``0.012, 0.03, 0.0041`` (layers 1..L), with ``; reference 0.02`` where that is relaxed,
    and the layers whose relaxation reaches ``epsilon`` (their relaxed constraint asks for no
    descent)."""
    text = ", ".join(f"{x:.3g}" for x in u[1:])
    text += f"; reference {u[0]:.3g}" if u[0] else ""
    if isinstance(epsilon, int | float):
        whole = [str(layer) for layer, x in enumerate(u[1:], 1) if x >= epsilon]
        if whole:
            text += (
                f"; at layer {','.join(whole)} it reaches ε = {epsilon:g}: no descent asked "
                "there beyond monotone"
            )
    return text


def _no_point_line(c: dict, head: str, rule: str) -> str:
    """Why a setting has no chosen point, and what to pass."""
    if c.get("kind", "constrained") != "constrained":
        fix = ": every point diverged; try a smaller learning rate (--tune-lr 0.25,0.5)"
    elif c.get("resilient_points"):
        fix = (
            f", nor any of its {c['resilient_points']} resilient points on its relaxed "
            "constraints (ε relaxed by the run's own λ/α): try smaller epsilons (--tune-epsilon "
            "0.01,0.02), another --dual-lr, or a smaller resilience α (more relaxation)"
        )
    else:
        fix = (
            ": try smaller epsilons (--tune-epsilon 0.01,0.02), another --dual-lr, or "
            "resilient constraints (--sweep resilience=none,ALPHA: chosen only where no hard "
            "point is eligible, and reported as such)"
        )
    return f"{head}: no sweep point chosen: none of {c['points']} is eligible ({rule})" + fix


def chosen_lines(chosen: list[dict], swept: Sequence[str] = ()) -> list[str]:
    """The summary's lines for :func:`choose_points`: the chosen point, or why there is none;
    a resilient choice (the fallback) says so, with its relaxation per layer."""
    lines = []
    for c in chosen:
        kind = c.get("kind", "constrained")
        head = f"{c['model']}-{c['layers']} {kind}"
        if len({x["gamma_train"] for x in chosen}) > 1 and c["gamma_train"] is not None:
            head += f" at gamma_train={c['gamma_train']:g}"
        rule = (
            "every seed feasible and monotone on validation, then the "
            if kind == "constrained"
            else "no seed diverged, then the "
        )
        best = f"{'highest' if c['higher_is_better'] else 'lowest'} mean {c['score']}"
        rule += best
        if c["hparams"] is None:
            lines.append(_no_point_line(c, head, rule))
            continue
        point = " ".join(
            f"{n}={_hparam_text(c['hparams'][n])}"
            for n in swept
            if n in c["hparams"] and (kind == "constrained" or c["hparams"][n] is not None)
        )
        seeds = f"{c['score']} {c['mean']:.4g} over seeds {','.join(map(str, c['seeds']))}"
        if c.get("resilient"):
            lines.append(
                f"{head}: no hard point eligible (0 of {c['points']}: {rule}); chosen "
                f"resilient point on validation: {point or 'the only varied point'} "
                f"(relaxation per layer λ/α of ℓ_(l−1), largest over seeds: "
                f"{relaxation_text(c['relaxation'], c['hparams'].get('epsilon'))}; {seeds}; {c['resilient_eligible']} of "
                f"{c['resilient_points']} resilient points eligible: every seed feasible with ε "
                f"relaxed by its own λ/α and monotone on validation, then the {best})"
            )
            continue
        lines.append(
            f"{head}: chosen on validation: {point or 'the only varied point'} "
            f"({seeds}; {c['eligible']} of {c['points']} points eligible: {rule})"
        )
    return lines


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
    """``DIVERGED`` / ``yes`` / ``NO`` (feasibility), ``relaxed`` for a resilient run that
    misses the hard constraints but meets its relaxed ones, ``*`` for the best run of its
    group."""
    if run.get("diverged"):
        return "DIVERGED"
    verdict = "yes" if run.get("feasible") else "relaxed" if run.get("feasible_relaxed") else "NO"
    return verdict + ("*" if run.get("best") else " ")


def _ratio(x, pct: bool = False) -> str:
    if x is None or not np.isfinite(x):
        return "n/a"  # every ratio excluded (all denominators at the floor)
    return f"{100 * x:.1f}%" if pct else f"{x:.3f}"


def summary_table(
    task, runs: list[dict], swept: list[str], intervals=None, chosen=None, comparisons=None
) -> str:
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
        Column("descent", 8, lambda r: _ratio(r["descent_rate"], pct=True)),
        Column("mean r", 7, lambda r: _ratio(r["mean_ratio"])),
        Column("med r", 7, lambda r: _ratio(r["median_ratio"])),
    ]
    columns += task.after_columns()
    if any(r.get("not_applicable") for r in runs):
        columns.append(
            Column(
                "n/a at l",
                8,
                lambda r: ",".join(map(str, r.get("not_applicable") or [])) or "-",
            )
        )
    resilient = any(r.get("relaxation") is not None for r in runs)
    if resilient:
        columns.append(
            Column(
                "relax u",
                8,
                lambda r: "-" if r.get("relaxation") is None else f"{max(r['relaxation']):.3g}",
            )
        )
    columns += [
        Column("feasible", 9, status_cell),
        Column("max λ", 8, lambda r: f"{max(r['multipliers']):.3g}"),
        Column("peak λ", 8, lambda r: f"{max(r['max_multipliers']):.3g}"),
    ]
    table = format_table(runs, columns)
    notes = []
    if any(r.get("not_applicable") for r in runs):
        notes.append(
            "n/a at l: the descent constraint of layer l asks ℓ_l ≤ (1 − ε)·ℓ_{l−1} with the "
            "mean validation ℓ_{l−1} at the floor (infeasible by construction): not applicable, "
            "left out of the feasibility and monotone verdicts"
        )
    if resilient:
        notes.append(
            "relax u: a resilient run's largest relaxation λ/α at the end of training, in units "
            "of ℓ_(l−1) (-: hard); feasible 'relaxed': it misses the hard constraints on "
            "validation but meets them with ε relaxed by its own λ/α (the resilient problem), "
            "within the same tolerance"
        )
    for r in runs:
        if r.get("ratios_excluded"):
            notes.append(
                f"{r['label']}: per-sample ratios excluded: {r['ratios_excluded']} of "
                f"{r['ratios_total']} (denominator ℓ_(l−1) below {r['ratio_floor']:.3g}); "
                "descent and mean/median r are over the rest"
            )
    notes += interval_lines(intervals or [], swept)
    notes += chosen_lines(chosen or [], swept)
    notes += comparison_lines(comparisons or [], swept)
    footer = task.table_footer(runs)
    return "\n".join([table, *notes] + ([footer] if footer else []))
