"""Which runs and sweep points the report picks, and the lines that say so.

:func:`select_best` marks the best run of each setting; :func:`choose_points` chooses a sweep
point on validation (with the resilient fallback) and :func:`mark_chosen` marks its runs;
:func:`compare_chosen` pairs the chosen constrained point with the chosen ERM point by seed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cudt import stats
from cudt.metrics import feasibility
from cudt.runner.record import KINDS, RUNNER_METRICS, run_metric


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
            and np.isfinite(run_metric(r, score))  # results.json writes NaN as null
        ]
        if eligible:
            pick = (max if higher_is_better else min)(eligible, key=lambda r: run_metric(r, score))
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
    points trained at every seed of the setting (every seed any of its points has: folders
    of other grids joined by ``combine`` may leave a point a seed short, and a mean over
    fewer seeds is no rival) whose every run passes ``ok`` with a finite ``score``; ties by
    sweep order."""
    seeds = {r["seed"] for rs in points.values() for r in rs}
    good = []
    for order, (point, rs) in enumerate(points.items()):
        values = np.array([run_metric(r, score) for r in rs], np.float64)
        every_seed = {r["seed"] for r in rs} == seeds
        if every_seed and all(ok(r) for r in rs) and np.all(np.isfinite(values)):
            good.append((sign * float(values.mean()), order, point, rs))
    return len(good), (min(good, key=lambda g: (g[0], g[1])) if good else None)


def _points(runs: list[dict]) -> dict[tuple, list[dict]]:
    """``{point: runs}``: runs grouped by their every hyperparameter, in the runs' order."""
    points: dict[tuple, list[dict]] = {}
    for r in runs:
        points.setdefault(tuple(sorted(r["hparams"].items())), []).append(r)
    return points


def best_trained_point(
    runs: list[dict], score: str, *, higher_is_better: bool
) -> tuple[list[dict] | None, bool]:
    """Where :func:`choose_points` chose nothing for one setting's constrained runs: the best
    mean ``score`` among the points that trained at every seed (none diverged, every ``score``
    finite), of those feasible at every seed where there are any (then only monotone descent
    was missed), else of all; ties by sweep order. Returns ``(its runs or None, whether
    feasible at every seed)``, so a table can show the best of what trained, flagged."""
    points, sign = _points(runs), -1.0 if higher_is_better else 1.0

    def live(r: dict) -> bool:
        return not r.get("diverged")

    _, feasible = _best_point(points, score, sign, lambda r: live(r) and bool(r.get("feasible")))
    _, trained = _best_point(points, score, sign, live)
    pick = feasible or trained
    return (pick[3] if pick else None), feasible is not None


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
    settings: dict[tuple, list[dict]] = {}
    for r in runs:
        if r["constrained"] == constrained:
            key = (r.get("model"), r.get("layers"), r.get("gamma_train"))
            settings.setdefault(key, []).append(r)
    groups = {key: _points(rs) for key, rs in settings.items()}
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
        if pick is None:
            entry["missed"] = _missed(points, score, constrained)
        if entry["resilient"]:
            entry["relaxation"] = np.max([r["relaxation"] for r in rs], axis=0).tolist()
        out.append(entry)
    return out


def _compared_points(runs: list[dict], chosen: list[dict]) -> dict[tuple, dict[str, dict]]:
    """``{(model, L, γ_train): {kind: point}}``: each kind's chosen point, and where ERM chose
    none but trained at one point, that point (``"only": True``: nothing to choose)."""
    picks: dict[tuple, dict[str, dict]] = {}
    for c in chosen:
        if c["hparams"] is not None:
            key = (c["model"], c["layers"], c["gamma_train"])
            picks.setdefault(key, {})[c.get("kind", "constrained")] = c
    for key, kinds in picks.items():
        erm = {
            tuple(sorted(r["hparams"].items(), key=lambda kv: kv[0]))
            for r in runs
            if not r["constrained"]
            and (r.get("model"), r.get("layers"), r.get("gamma_train")) == key
        }
        if "ERM" not in kinds and len(erm) == 1:
            model, layers, gamma_train = key
            where = {"model": model, "layers": layers, "gamma_train": gamma_train}
            kinds["ERM"] = where | {"kind": "ERM", "hparams": dict(next(iter(erm))), "only": True}
    return picks


def meets_constraints(erm: dict, epsilon: float, constrained: dict, tolerance: float) -> bool:
    """Whether an ERM run meets a constrained run's constraints on validation: its ε and
    reference bound (that seed's), at the verdict's tolerance; a diverged run does not."""
    if erm.get("diverged"):  # its numbers may be null in results.json
        return False
    losses = np.asarray(erm["layer_loss_val"], np.float64)
    return feasibility(losses, epsilon, constrained.get("reference_bound"), tolerance).feasible


def compare_chosen(
    runs: list[dict],
    chosen: list[dict],
    level: float = 0.95,
    *,
    tolerance: float | None = None,
    data_draw: int | None = None,
) -> list[dict]:
    """Chosen constrained − chosen ERM, paired by seed: for each model × L × γ_train where both
    kinds chose a point on validation (:func:`choose_points` with ``constrained`` True and
    False; ERM trained at one point: that point), the paired Student-t interval over the seeds
    the two share of every reported metric, and the counts a claim needs (seeds, the
    constrained point's feasibility on validation, each kind's monotone test losses). Seeds
    that drew their own data make these independent replicates; the intervals are the
    headline, never a bootstrap over items.

    With the verdict's ``tolerance``, ``erm_feasible`` counts the ERM runs that meet the chosen
    constrained point's own constraints on validation (its ε; its seed's reference bound, where
    it has one): an ERM run's ``feasible`` is judged at the model's ε, which a sweep of ε need
    not choose. None without ``tolerance`` (results.json before it) or a point without ε.
    ``data_draw``: the one draw of the data every run read (``--data-seed``), recorded where
    the seeds are several (:func:`one_draw`)."""
    picks = _compared_points(runs, chosen)

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
        epsilon = kinds["constrained"]["hparams"].get("epsilon")
        erm_feasible = None
        if tolerance is not None and isinstance(epsilon, (int, float)):
            erm_feasible = sum(
                meets_constraints(e, epsilon, r, tolerance) for r, e in zip(a, b, strict=True)
            )
        names = list(dict.fromkeys(a[0].get("interval_metrics", []) + list(RUNNER_METRICS)))
        # a diverged run is evaluated at its last finite state: finite numbers of a run that
        # failed, left out as NaN's are (a --point given to combine is not filtered before)
        trained = np.array(
            [not (r.get("diverged") or e.get("diverged")) for r, e in zip(a, b, strict=True)]
        )
        metrics = {}
        for name in names:
            vb = np.array([run_metric(r, name) for r in b], np.float64)
            iv, ok = finite_interval(seeds, [run_metric(r, name) for r in a], vb, level, trained)
            if iv is not None:
                metrics[name] = iv | {"erm_mean": float(vb[ok].mean())}
        out.append(
            {
                "model": model,
                "layers": layers,
                "gamma_train": gamma_train,
                "constrained_hparams": kinds["constrained"]["hparams"],
                "erm_hparams": kinds["ERM"]["hparams"],
                "erm_chosen": not kinds["ERM"].get("only"),  # False: ERM's one point
                "seeds": seeds,
                "unpaired": sorted(set(con) ^ set(erm)),  # seeds of one side only: left out
                "feasible": sum(bool(r.get("feasible")) for r in a),
                # the fallback's point: judged on the relaxed problem (choose_points)
                "resilient": bool(kinds["constrained"].get("resilient")),
                # per-folder choices: how many folders' choices were resilient, of how many
                "resilient_in": kinds["constrained"].get("resilient_in"),
                "feasible_relaxed": sum(bool(r.get("feasible_relaxed")) for r in a),
                "erm_feasible": erm_feasible,
                "monotone": sum(bool(r.get("loss_decreases")) for r in a),
                "erm_monotone": sum(bool(r.get("loss_decreases")) for r in b),
                "constrained_minus_erm": metrics,
                **one_draw(seeds, data_draw),
            }
        )
    return out


def one_draw(seeds: Sequence[int], data_draw: int | None) -> dict:
    """``{"data_draw": D}`` for an interval over two or more ``seeds`` that all read one draw
    of the data (``--data-seed D``): they replicate the initialisation and the batch order,
    not the data, as the lines then say (:func:`draw_text`); else ``{}``."""
    return {"data_draw": int(data_draw)} if data_draw is not None and len(seeds) >= 2 else {}


def draw_text(entry: dict) -> str:
    """`` on one data draw (data seed 0)`` after "over N seeds" where the seeds shared one
    draw of the data (:func:`one_draw`), else ""."""
    draw = entry.get("data_draw")
    return f" on one data draw (data seed {draw})" if draw is not None else ""


#: a line's words where no metric has an interval over two or more seeds
NO_FINITE_INTERVAL = "no interval: no metric is finite at two of its seeds"


def finite_interval(
    seeds: Sequence[int], a, b=None, level: float = 0.95, keep=None
) -> tuple[dict | None, np.ndarray]:
    """The Student-t interval of a metric over ``seeds`` (its values ``a``, one per seed; of
    ``a − b`` paired by seed where ``b`` is given), over the seeds where the values are finite
    (and ``keep``): None where fewer than two are; the seeds it is over named (``"seeds"``)
    where it leaves some out, as the lines then say (:func:`over_seeds`). And that mask."""
    a = np.asarray(a, np.float64)
    ok = np.isfinite(a) if keep is None else np.isfinite(a) & np.asarray(keep, bool)
    if b is not None:
        b = np.asarray(b, np.float64)
        ok &= np.isfinite(b)
    if ok.sum() < 2:
        return None, ok
    iv = (
        stats.t_interval(a[ok], level)
        if b is None
        else stats.paired_t_interval(a[ok], b[ok], level)
    )
    iv = iv.as_dict()
    if not ok.all():
        iv["seeds"] = [int(s) for s, k in zip(seeds, ok, strict=True) if k]
    return iv, ok


def over_seeds(iv: dict) -> str:
    """`` (over seeds 0, 2)`` after an interval over some of its seeds (:func:`finite_interval`:
    the others not finite), else ""."""
    return f" (over seeds {', '.join(map(str, iv['seeds']))})" if "seeds" in iv else ""


def comparison_lines(
    comparisons: list[dict],
    swept: Sequence[str] = (),
    point: str | None = None,
    fixed: str | None = None,
) -> list[str]:
    """The summary's lines for :func:`compare_chosen`: each metric's paired interval, "level"
    where it spans 0, and the counts; ``point`` names both kinds' points instead of their
    values of ``swept``; ``fixed`` names a constrained point given, not chosen."""

    def point_text(hp):
        shown = [f"{n}={_hparam_text(hp[n])}" for n in swept if hp.get(n) is not None]
        return point or " ".join(shown) or "its one point"

    lines = []
    for c in comparisons:
        # a model × L compared at several γ_train: its lines say which, where no point does
        named = point is None and "gamma_train" in swept
        where = f"{c['model']}-{c['layers']}" + ("" if named else at_gamma(c, comparisons))
        n = len(c["seeds"])
        cells = []
        for name, iv in c["constrained_minus_erm"].items():
            text = f"{name} {iv['mean']:+.4g} [{iv['low']:+.4g}, {iv['high']:+.4g}]"
            cells.append(text + stats.level_mark(iv) + over_seeds(iv))  # not finite at the others
        resilient = c.get("resilient", False)  # results.json before the fallback: hard
        kind = "constrained, resilient" if resilient else "constrained"
        if resilient and c.get("resilient_in"):
            k, of = c["resilient_in"]
            kind += f" in {k} of {of} folders"
        feasible = f"constrained feasible at {c['feasible']} of {n}"
        if resilient:
            feasible += f" (relaxed: {c['feasible_relaxed']} of {n})"
        if c.get("erm_feasible") is not None:  # results.json before it: not said
            feasible += f", ERM at {c['erm_feasible']} of {n} (the same constraints)"
        head = (
            f"{kind} at {fixed} (given, not chosen)"
            if fixed
            else f"chosen {kind} ({point_text(c['constrained_hparams'])})"
        )
        lines.append(
            f"{where}: {head} "
            f"− {'chosen ' if c.get('erm_chosen', True) else ''}ERM "
            f"({point_text(c['erm_hparams'])}), paired t over {n} seed"
            f"{'s' if n != 1 else ''}{draw_text(c)}{_unpaired(c)}: "
            + (
                "; ".join(cells)
                if cells
                else "no interval with one seed"
                if n == 1
                else NO_FINITE_INTERVAL
            )
            + f" | {feasible}, monotone (test) at "
            f"{c['monotone']} of {n}; ERM monotone (test) at {c['erm_monotone']} of {n}"
        )
    return lines


def at_gamma(c: dict, entries: Sequence[dict]) -> str:
    """`` at gamma_train=0.3`` where ``entries`` hold ``c``'s model and L at several γ_train
    (a choice and a comparison each), so that its line says which; else ""."""
    gammas = {
        e["gamma_train"] for e in entries if (e["model"], e["layers"]) == (c["model"], c["layers"])
    }
    if len(gammas) < 2 or c["gamma_train"] is None:
        return ""
    return f" at gamma_train={c['gamma_train']:g}"


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


def _missed(points: dict, score: str, constrained: bool) -> dict:
    """Why no point of a setting is eligible (:func:`_best_point`), point by point (a point may
    count under several): ``short``, points without a run at every seed the setting has
    (``missing_seeds``: folders of other grids joined by ``combine``); ``diverged``, points with
    a diverged seed; ``not_finite``, points with a seed that did not diverge yet has no finite
    ``score``; ``constraints``, constrained points with such a seed infeasible or not monotone
    on validation."""
    seeds = {r["seed"] for rs in points.values() for r in rs}
    out = {"short": 0, "diverged": 0, "not_finite": 0, "constraints": 0}
    missing: set = set()
    for rs in points.values():
        live = [r for r in rs if not r.get("diverged")]
        lacks = seeds - {r["seed"] for r in rs}
        missing |= lacks
        out["short"] += bool(lacks)
        out["diverged"] += len(live) < len(rs)
        out["not_finite"] += not all(np.isfinite(run_metric(r, score)) for r in live)
        out["constraints"] += constrained and not all(_eligible(r, True) for r in live)
    return out | {"missing_seeds": sorted(int(s) for s in missing)}


# a sweep, not --tune-epsilon: lanes chosen on validation that win over a model's own ε
# (--model-hparams, the text UT's 0.02), which a tuned grid leaves in place (it is refused)
_SMALLER = "--sweep epsilon=0.01,0.02, chosen on validation"


def _constraint_fix(c: dict) -> str:
    """What to pass where points miss their constraints (a smaller α where resilient lanes
    missed their relaxed ones too)."""
    if c.get("resilient_points"):
        return (
            f"try smaller epsilons ({_SMALLER}), another --dual-lr, or a smaller resilience α "
            "(more relaxation)"
        )
    return (
        f"try smaller epsilons ({_SMALLER}), another --dual-lr, or resilient "
        "constraints (--sweep resilience=none,ALPHA: chosen only where no hard point is "
        "eligible, and reported as such)"
    )


def _no_point_line(c: dict, head: str, rule: str) -> str:
    """Why a setting has no chosen point (each reason :func:`_missed` found, with how many
    points it rules out), and what to do about each."""
    constrained = c.get("kind", "constrained") == "constrained"
    line = f"{head}: no sweep point chosen: none of {c['points']} is eligible ({rule})"
    if constrained and c.get("resilient_points"):
        line += (
            f", nor any of its {c['resilient_points']} resilient points on its relaxed "
            "constraints (ε relaxed by the run's own λ/α)"
        )
    missed = c.get("missed")
    if missed is None:  # a choice results.json stored before the reasons were recorded
        if constrained:
            return f"{line}: {_constraint_fix(c)}"
        return (
            f"{line}: at every point a seed diverged, is missing or has no finite {c['score']}; "
            "where one diverged, try a smaller learning rate (--tune-lr 0.25,0.5)"
        )

    def has(n: int, what: str) -> str:
        return f"{n} {'has' if n == 1 else 'have'} {what}"

    why = []
    if missed["short"]:
        seeds = ",".join(map(str, missed["missing_seeds"]))
        why.append(
            f"{missed['short']} {'lacks' if missed['short'] == 1 else 'lack'} a run at a seed "
            f"other points trained (missing: {seeds}): folders of other grids were joined; "
            "train those seeds at those points too, or join only folders of the same points"
        )
    if missed["diverged"]:
        dual = " or a smaller --dual-lr" if constrained else ""
        why.append(
            has(missed["diverged"], "a seed that diverged")
            + f": try a smaller learning rate (--tune-lr 0.25,0.5){dual}"
        )
    if missed["not_finite"]:
        why.append(
            has(missed["not_finite"], f"a seed with no finite {c['score']} (NaN, or null in ")
            + "results.json) though it did not diverge: check that seed's validation data and "
            "rerun it"
        )
    if missed["constraints"]:
        why.append(
            has(missed["constraints"], "a seed infeasible or not monotone on validation")
            + f": {_constraint_fix(c)}"
        )
    return f"{line}: {'; '.join(why)}"


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
            relaxed = relaxation_text(c["relaxation"], c["hparams"].get("epsilon"))
            lines.append(
                f"{head}: no hard point eligible (0 of {c['points']}: {rule}); chosen "
                f"resilient point on validation: {point or 'the only varied point'} "
                f"(relaxation per layer λ/α of ℓ_(l−1), largest over seeds: {relaxed}; "
                f"{seeds}; {c['resilient_eligible']} of "
                f"{c['resilient_points']} resilient points eligible: every seed feasible with ε "
                f"relaxed by its own λ/α and monotone on validation, then the {best})"
            )
            continue
        lines.append(
            f"{head}: chosen on validation: {point or 'the only varied point'} "
            f"({seeds}; {c['eligible']} of {c['points']} points eligible: {rule})"
        )
    return lines


def _unpaired(c: dict) -> str:
    """`` (seed 2 left out: one side only)`` where a seed has a run of one kind alone (folders
    of one kind joined by ``combine``); "" where every seed pairs (and before the record)."""
    left = c.get("unpaired") or []
    if not left:
        return ""
    word = "seed" if len(left) == 1 else "seeds"
    return f" ({word} {','.join(map(str, left))} left out: one side only)"
