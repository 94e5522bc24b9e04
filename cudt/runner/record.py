"""A trained group's evaluation and each run's ``results.json`` record, and how to read it back.

:func:`summarise` evaluates a trained group with one compiled evaluator (:func:`evaluate_group`)
and turns each run into its record; :func:`metric_names` lists the record's reported metrics and
:func:`run_metric` reads one back (``NAME@γtr`` at the run's γ_train).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from cudt import descent
from cudt.loop import CURVE_METRICS, LoopResult
from cudt.metrics import applicable_steps, constraint_scales, descent_stats, feasibility
from cudt.runner.hparams import chance_offset

KINDS = {False: "ERM", True: "constrained"}


def _reference_setting(spec, bound: float | None) -> float | str | None:
    """A run's ``hparams.reference``: the bound where a number was asked, the spelling where it
    depends on the data (``chance``, ``chance+0.3``: ln V moves with a seed's vocabulary, and the
    seeds are one setting), None without a reference constraint (an ERM run, ``none``)."""
    if bound is None or not spec.constrained:
        return None
    asked = spec.hp["reference"]
    return str(asked) if chance_offset(asked) is not None else bound


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
    run into its ``results.json`` record: ``(records, descent ratios)``, each run's ratios
    ``ℓ_l / ℓ_(l−1)`` on the test set ``[N, L]``, NaN where excluded (None for a diverged
    run)."""
    model = group.model
    test, val = _evaluate_splits(task, cfg, data, group, result, gammas, val_gammas, eval_keys)
    eps = np.asarray(program.judged_epsilon, np.float32)  # not the trained ε + --epsilon-margin
    runs, ratios = [], []
    for r, spec in enumerate(group.specs):
        record, run_ratios = _run_record(
            task, cfg, group, program, result, r, spec, test, val, gammas, val_gammas, eps[r]
        )
        runs.append(record)
        ratios.append(run_ratios)
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
    """Run ``r``'s ``results.json`` record and its descent ratios ``[N, L]``, NaN where
    excluded (None if it diverged)."""
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
        # the draw of the data it read (cfg is the draw's): seeds on one draw (--data-seed)
        # replicate the initialisation and batch order only, as a task's footer then says
        "data_draw": int(cfg.data_rng_seed),
        "label": group.labels[r],
        "group": group.name,
        # the setting as asked (``chance`` is one setting over seeds whose data move ln V);
        # reference_bound: the C it resolved to on this run's data
        "hparams": dict(hp, reference=_reference_setting(spec, program.references[r])),
        "reference_bound": program.references[r] if spec.constrained else None,
        # the ε it trained at, where --epsilon-margin moved it (None: hparams' epsilon)
        "trained_epsilon": program.trained_epsilon[r],
        "sweep_point": spec.point,
        "gamma_train": gamma_train,
        "test_gamma": list(gammas),
        **task_metrics,
        "layer_loss": layer_loss,
        # reported only: the test split never decides anything (loss_decreases_val does);
        # judged as validation is, a step from a state at the loss floor left out
        "loss_decreases": decreases(layer_loss[gi], applicable_steps(layer_loss[gi])),
        "layer_loss_val": val_mean.tolist(),
        "loss_decreases_val": decreases(val_mean, applicable),
        "descent_rate": ratio_stats.descent_rate,
        "mean_ratio": ratio_stats.mean_ratio,
        "median_ratio": ratio_stats.median_ratio,
        "ratio_floor": ratio_stats.floor,
        "ratios_excluded": ratio_stats.excluded + ratio_stats.non_finite,
        "ratios_non_finite": ratio_stats.non_finite,  # of those: a NaN or infinite loss
        "ratios_total": ratio_stats.total,
        "feasible": verdict.feasible and not diverged,
        # the ε of that verdict: the run's own, or ERM's (the model's ε, which a sweep need not
        # choose: the chosen comparison judges ERM at the chosen point's, choice.compare_chosen)
        "judged_epsilon": program.judged_epsilon[r],
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
    return record, None if diverged else ratio_stats.ratios


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
    scale = constraint_scales(val_mean, reference)
    if cfg.constraint == "tail":
        scale[1:] = 1.0
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


def run_metric(run: dict, name: str) -> float:
    """A run's reported metric ``name`` as a float (NaN where it is None); ``NAME@γtr`` is the
    per-test-γ metric at the run's γ_train (:func:`metric_names`)."""
    v = at_gamma_train(run, name[: -len("@γtr")]) if name.endswith("@γtr") else run.get(name)
    return float("nan") if v is None else float(v)
