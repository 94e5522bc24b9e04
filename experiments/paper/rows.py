"""The rows of a table job: what each setting shows (the sweep point the runner's rule
chooses on validation: one seed, that run; several, its mean over the seeds, with every seed's
numbers for the paired intervals), sorted, as CSV, and as Markdown tables (constrained vs ERM
at one γ_train, and the direction of each cell against the paper's table).
"""

from __future__ import annotations

import csv
import io
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from cudt.io import atomic_write
from cudt.knobs import KNOBS
from cudt.runner.choice import best_trained_point, choose_points
from cudt.runner.record import KINDS
from cudt.stats import paired_t_interval

# the knobs a run's row names (gamma_train, the data's, is a setting column)
HPARAMS = tuple(k.name for k in KNOBS if k.goes != "data")


# The CSV's first columns (the setting) and its last (the run shown and how it was chosen);
# each table puts its own numbers between them.
SETTING_COLUMNS = ("dataset", "model", "layers", "kind", "gamma_train", "status")


RUN_COLUMNS = (
    *HPARAMS,
    "runs",
    "diverged_runs",
    "infeasible_runs",
    "not_applicable",
    "label",
    "resilient",
    "sub_run",
)

# A cell whose shown run has descent constraints that are not applicable (the previous state's
# validation loss at the floor: ℓ_l ≤ (1 − ε)·~0 cannot hold) carries this mark.
NOT_APPLICABLE_LEGEND = (
    "`n/a:l`: layer l's descent constraint is not applicable (its previous state's validation "
    "loss is at the floor, e.g. UT's input state at γ_train = 0): not judged"
)


# the status of a cell over several seeds where every setting lost a seed or more (the others
# trained): no setting is shown, since a cell needs every seed (:func:`_chosen_point`)
SEED_DIVERGED = "seed diverged"
# the status of a constrained cell where a point met its constraints at every
# seed but none also descended monotonically on validation at every seed (the runner's rule)
NOT_MONOTONE = "not monotone"
# the status of a cell where no run diverged, yet no point has a finite validation score at
# every seed (NaN, or null in results.json), so nothing is chosen or shown
NO_SCORE = "no finite score"
# the mark of a cell whose point the runner chose by its resilient fallback
RESILIENT_MARK = " r"


def status_legend(rows: list[dict]) -> str:
    """The legend's words for :data:`SEED_DIVERGED`, :data:`NOT_MONOTONE`, :data:`NO_SCORE`
    and :data:`RESILIENT_MARK`, where a row has them ("" elsewhere)."""
    words = ""
    if any(r.get("status") == SEED_DIVERGED for r in rows):
        words += (
            f"; `{SEED_DIVERGED}`: at every setting one seed or more diverged (the others "
            "trained; a setting is shown only where every seed trained)"
        )
    if any(r.get("status") == NOT_MONOTONE for r in rows):
        words += (
            f"; `{NOT_MONOTONE}`: a setting met its constraints at every seed, but none also "
            "descended at every layer on validation at every seed (the best in brackets)"
        )
    if any(r.get("status") == NO_SCORE for r in rows):
        words += (
            f"; `{NO_SCORE}`: no run diverged, but no setting has a finite validation score at "
            "every seed (NaN, or null in results.json): check that validation data and rerun"
        )
    if any(r.get("resilient") for r in rows):
        words += (
            f"; `{RESILIENT_MARK.strip()}`: no setting met the hard constraints at every seed; "
            "the one chosen on the relaxed problem its resilience solved (the runner's "
            "resilient fallback)"
        )
    return words


def finite(values) -> bool:
    return all(isinstance(v, int) or math.isfinite(v) for v in values)


def unique(values) -> tuple:
    """The values in the order given, each once (a repeated value would be a second sub-run)."""
    return tuple(dict.fromkeys(values))


def fmt(values) -> str:
    return ",".join(f"{v:g}" for v in values)


def num(value) -> float:
    return math.nan if value is None else float(value)


def peak(values) -> float:
    """The largest of a run's multipliers (None, a non-finite one in JSON, reads inf; 0 for
    none)."""
    vals = [math.inf if v is None else float(v) for v in values]
    return max(vals) if vals else 0.0


def _status(runs: list[dict], constrained: bool, word: str | None) -> dict[str, Any]:
    """A setting's status fields: ``word`` where given, else ``infeasible`` (a constrained run
    that did not diverge missed its constraints), ``diverged`` (every run did) or
    :data:`NO_SCORE` (none did, yet none was shown); how many runs of each."""
    infeasible = sum(
        (not r.get("diverged")) and constrained and not r.get("feasible") for r in runs
    )
    diverged = all(r.get("diverged") for r in runs)
    return {
        "status": word or ("infeasible" if infeasible else "diverged" if diverged else NO_SCORE),
        "runs": len(runs),
        "diverged_runs": sum(bool(r.get("diverged")) for r in runs),
        "infeasible_runs": infeasible,
    }


def setting_rows(
    res: dict, dataset: str, sub_run: str, *, score: str, higher: bool, fields
) -> list[dict]:
    """One row per (model, L, kind, γ_train) of one sub-run's ``results.json`` ``res``: the
    point the runner's rule chooses by ``score`` (:func:`_chosen_point`, at one seed or
    several) and its status, and (unless nothing trained) what every table shows of it: the
    run itself at one seed, the mean over the seeds at several; ``fields(run, i)`` adds the
    table's own numbers of a run (``i``: the index of its γ_train in its test γ grid). L is
    each run's own (a pretrained model's depth is its checkpoint's)."""
    settings: dict[tuple, list[dict]] = defaultdict(list)
    for r in res["runs"]:
        key = (r["model"], int(r["layers"]), r["constrained"], float(r["gamma_train"]))
        settings[key].append(r)
    rows = []
    for (model, layers, constrained, gamma), runs in settings.items():
        b, status = _chosen_point(runs, constrained, score=score, higher=higher)
        if b is not None and len(b) == 1:  # one seed: the chosen point is that run
            [b] = b
        row = {
            "dataset": dataset,
            "model": model,
            "layers": layers,
            "kind": KINDS[constrained],
            "gamma_train": gamma,
            **status,
            "sub_run": sub_run,
        }
        if isinstance(b, list):  # several seeds: the chosen point's mean over them
            row |= _mean_row(b, gamma, fields)
        elif b is not None:
            test_gamma = [float(g) for g in b["test_gamma"]]
            i = test_gamma.index(gamma)
            row |= fields(b, i) | {
                "feasible": bool(b["feasible"]),
                "not_applicable": ",".join(str(i) for i in b.get("not_applicable") or []),
                "peak_lambda": peak(b["max_multipliers"]),
                "seed": int(b["seed"]),
                "label": b["label"],
                **{n: b["hparams"].get(n) for n in HPARAMS},
                # for the figures (not in the CSV)
                "test_gamma": test_gamma,
                "layer_loss": b["layer_loss"][i],
            }
        rows.append(row)
    return rows


def _chosen_point(
    runs: list[dict], constrained: bool, *, score: str, higher: bool
) -> tuple[list[dict] | None, dict[str, Any]]:
    """The runs (one a seed) of the sweep point shown for one setting, and its status: the
    runner's own choice on validation (:func:`cudt.runner.choice.choose_points`, one rule for
    the report and the tables: every seed eligible, i.e. not diverged and, constrained,
    feasible and monotone on validation; the best mean ``score``;
    where no point is, the resilient fallback, the status fields then saying ``resilient``);
    where nothing is chosen, the best of the points that trained at every seed, flagged
    ``infeasible`` (constrained; :data:`NOT_MONOTONE` where a point met its constraints at
    every seed but did not descend at every layer), so a cell is never one lucky seed."""
    [choice] = choose_points(
        runs, score, higher_is_better=higher, min_points=1, constrained=constrained
    )
    if choice["hparams"] is not None:
        shown = [r for r in runs if r["hparams"] == choice["hparams"]]
        return shown, _status(runs, constrained, "ok") | {"resilient": choice["resilient"]}
    if constrained:  # no point eligible: the best of those that trained at every seed, flagged
        shown, feasible = best_trained_point(runs, score, higher_is_better=higher)
        if shown is not None:
            return shown, _status(runs, constrained, NOT_MONOTONE if feasible else "infeasible")
    # no point trained at every seed: "diverged" only where every run did, SEED_DIVERGED where
    # some did (over seeds); where none did (runs without a finite score), infeasible or
    # NO_SCORE, as _status says
    diverged = [bool(r.get("diverged")) for r in runs]
    word = SEED_DIVERGED if any(diverged) and not all(diverged) else None
    return None, _status(runs, constrained, word)


def _mean_row(runs: list[dict], gamma: float, fields) -> dict[str, Any]:
    """The row of a sweep point over its seeds: each number of ``fields`` (and each list,
    element by element) averaged over the seeds, ``per_seed`` keeping every seed's numbers for
    the paired intervals between constrained and ERM."""
    runs = sorted(runs, key=lambda r: int(r["seed"]))
    first = runs[0]
    test_gamma = [float(g) for g in first["test_gamma"]]
    i = test_gamma.index(gamma)
    each = [fields(r, i) for r in runs]

    def mean(values: list) -> Any:
        if all(isinstance(v, bool) for v in values):
            return all(values)
        if all(isinstance(v, (int, float)) for v in values):
            return sum(float(v) for v in values) / len(values)
        if all(isinstance(v, list) for v in values):
            return [mean([num(x) for x in col]) for col in zip(*values, strict=True)]
        return values[0]

    seeds = [int(r["seed"]) for r in runs]
    return {k: mean([f[k] for f in each]) for k in each[0]} | {
        "feasible": all(bool(r["feasible"]) for r in runs),
        "not_applicable": ",".join(str(j) for j in first.get("not_applicable") or []),
        "peak_lambda": max(peak(r["max_multipliers"]) for r in runs),
        "seed": None,
        "seeds": seeds,
        "label": f"{first['label'].rsplit(' seed ', 1)[0]} (mean of seeds {fmt(seeds)})",
        "labels": [r["label"] for r in runs],  # each seed's run (its files: histograms)
        **{n: first["hparams"].get(n) for n in HPARAMS},
        "test_gamma": test_gamma,
        "layer_loss": mean([[num(x) for x in r["layer_loss"][i]] for r in runs]),
        "per_seed": {s: f for s, f in zip(seeds, each, strict=True)},
    }


def paired(c: dict | None, e: dict | None, metric: str):
    """The paired t interval over seeds of constrained minus ERM ``metric`` (rows of several
    seeds, over the seeds both have), or None (one seed, fewer than two shared, or a number not
    finite: :func:`comparable`)."""
    return _seed_interval(c, e, metric) if comparable(c, e, metric) else None


def _finite_metric(row: dict, metric: str) -> bool:
    """Whether ``row`` has a finite ``metric`` (a test metric null in results.json, inf or NaN,
    reads NaN: its seeds' mean too)."""
    return math.isfinite(num(row.get(metric)))


def comparable(c: dict | None, e: dict | None, metric: str) -> bool:
    """Whether constrained and ERM are compared on ``metric``: both rows there with their
    numbers (:func:`both_ok`), and those finite (a NaN is no side of a comparison)."""
    return both_ok(c, e) and _finite_metric(c, metric) and _finite_metric(e, metric)


def _seed_interval(c: dict, e: dict, metric: str):
    """:func:`paired` whatever the rows' status (an infeasible constrained row's seeds, too)."""
    if "per_seed" not in c or "per_seed" not in e:
        return None
    shared = sorted(set(c["per_seed"]) & set(e["per_seed"]))
    if len(shared) < 2:
        return None
    return paired_t_interval(
        [c["per_seed"][s][metric] for s in shared], [e["per_seed"][s][metric] for s in shared]
    )


def _interval_direction(iv, higher: bool) -> str:
    """ "C" or "E" where the paired interval of constrained − ERM excludes 0, else "="."""
    if iv.low > 0 or iv.high < 0:
        return "C" if (iv.mean > 0) == higher else "E"
    return "="


def _over_seeds(c: dict, e: dict) -> bool:
    """Whether either row is a mean over seeds (then only a paired interval decides)."""
    return "per_seed" in c or "per_seed" in e


def better(c: dict | None, e: dict | None, metric: str, higher: bool) -> str | None:
    """Which of constrained ("C") and ERM ("E") has the better ``metric``, or "=" (level): over
    several seeds, only where the paired t interval excludes 0 (level where there is none: a
    row of means beside a single run, or fewer than two seeds shared); two single runs (one
    seed, as the tables' legend says: no interval), to 3 decimals. None where the two are not
    both there with finite numbers."""
    if not comparable(c, e, metric):
        return None
    iv = paired(c, e, metric)
    if iv is not None:
        return _interval_direction(iv, higher)
    if _over_seeds(c, e):  # seeds' means without an interval: 3 decimals would decide on noise
        return "="
    cv, ev = round(c[metric], 3), round(e[metric], 3)
    return "=" if cv == ev else ("C" if (cv > ev) == higher else "E")


def several_seeds(rows: Iterable[dict]) -> bool:
    """Whether the rows are means over seeds (bold and counts then need a paired interval)."""
    return any("per_seed" in r for r in rows)


def selection_legend(score: str, rows: Iterable[dict], word: str) -> str:
    """How a cell's run was chosen and what bold means (one seed, or means over seeds)."""
    if not several_seeds(rows):
        return (
            f"Per cell: the sweep point the runner chooses, the best {score} among the runs "
            "that did not diverge (and, constrained, met their constraints and descended at "
            f"every layer on validation); **bold**: the {word} of constrained and ERM on test "
            "data (one seed: no interval, so no verdict)"
        )
    return (
        f"Per cell: the sweep point the runner chooses, the best mean {score} over its seeds "
        "among those where no run diverged (and, constrained, every run met its constraints "
        "and descended at every layer on validation), its mean over the seeds; **bold**: the "
        f"{word} of constrained and ERM where the paired t interval over seeds (95 %) excludes "
        "0, neither where it spans 0 (level)"
    )


def shown_runs(rows: Iterable[dict], score: str) -> str:
    """What a figure's line of a setting is, for its note (one seed, or means over seeds)."""
    if several_seeds(rows):
        return f"seeds' mean at the point the runner chooses on {score}"
    return f"the point the runner chooses on {score}"


def line_note(rows: Iterable[dict], score: str) -> str:
    """A line figure's note: what a line is (:func:`shown_runs`), and what a dashed one is."""
    return (
        f"{shown_runs(rows, score)}; dashed: no eligible constrained run (the best of the "
        "others, its status in the legend)"
    )


def count_rule(rows: Iterable[dict]) -> str:
    """What a counted cell needs, said after "Constrained lower than ERM": an interval over
    seeds, or (one seed) that the count reads test numbers without one."""
    if several_seeds(rows):
        return " on test data (paired t interval over seeds excluding 0)"
    return " on test data (one seed: no interval, a count of signs, not of wins)"


def sort_rows(rows: list[dict], datasets: Sequence[str], models: Sequence[str]) -> list[dict]:
    """``rows`` in the CSV's order: by dataset and model (in the order given; an unlisted model
    last), L, kind, γ_train."""
    order = {m: i for i, m in enumerate(models)}
    rows.sort(
        key=lambda r: (
            datasets.index(r["dataset"]),
            order.get(r["model"], 9),
            r["layers"],
            r["kind"],
            r["gamma_train"],
        )
    )
    return rows


def csv_text(rows: Iterable[dict], columns: Sequence[str]) -> str:
    """Long-format CSV of ``rows`` (one best run each): floats to 6 significant digits."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        cells = {}
        for k in columns:
            v = row.get(k)
            if v is None:
                cells[k] = ""
            elif isinstance(v, float):
                cells[k] = "inf" if math.isinf(v) else f"{v:.6g}"
            else:
                cells[k] = v
        writer.writerow(cells)
    return buf.getvalue()


def write_text(path: Path, text: str) -> None:
    data = text.encode()
    atomic_write(path, lambda f: f.write(data))


def paper_table(text: str, datasets: Sequence[str]) -> dict[tuple[str, int, float, str], tuple]:
    """A paper's table typed as lines ``model L γ_train c₁ e₁ c₂ e₂ ...``: one (constrained,
    ERM) pair per dataset, in the paper's column order ``datasets``; keyed by
    ``(model, L, γ_train, dataset)``."""
    table = {}
    for line in text.strip().splitlines():
        model, layers, gamma, *values = line.split()
        v = [float(x) for x in values]
        for i, dataset in enumerate(datasets):
            table[(model, int(layers), float(gamma), dataset)] = (v[2 * i], v[2 * i + 1])
    return table


def index_rows(rows: Iterable[dict]) -> dict[tuple, dict]:
    """``{(dataset, model, L, kind, γ_train): row}``."""
    return {(r["dataset"], r["model"], r["layers"], r["kind"], r["gamma_train"]): r for r in rows}


def both_ok(c: dict | None, e: dict | None) -> bool:
    """Whether a constrained and an ERM row both exist with their numbers (status ok): the
    cells a comparison of the two counts."""
    return bool(c and e and c["status"] == "ok" and e["status"] == "ok")


def _cell(row: dict | None, metric: str) -> str:
    if row is None:
        return "—"
    na = f" n/a:{row['not_applicable']}" if row.get("not_applicable") else ""
    na += RESILIENT_MARK if row.get("resilient") else ""
    if row["status"] == "ok":
        return f"{row[metric]:.3f}{na}"
    if metric in row:  # infeasible: the best of the infeasible runs, not eligible
        return f"{row['status']} ({row[metric]:.3f}){na}"
    return row["status"]


def _pair_cells(c: dict | None, e: dict | None, metric: str, higher: bool) -> tuple[str, str]:
    """Constrained and ERM cells, the better ``metric`` bold: one seed, to 3 decimals (both
    when equal); several, only where the paired t interval over seeds excludes 0 (neither
    where there is none)."""
    cc, ec = _cell(c, metric), _cell(e, metric)
    won = better(c, e, metric, higher)
    several = bool(c and e) and _over_seeds(c, e)  # "=": level, neither bold
    if won == "C" or (won == "=" and not several):
        cc = f"**{cc}**"
    if won == "E" or (won == "=" and not several):
        ec = f"**{ec}**"
    return cc, ec


def table_lines(
    rows: list[dict],
    names: dict[str, str],
    datasets: Sequence[str],
    table_rows: Iterable[tuple[str, str, int]],
    gammas: Sequence[float],
    *,
    metric: str,
    higher: bool,
    label_gamma: bool,
) -> list[str]:
    """A Markdown table: a line per ``(label, model, L)`` of ``table_rows`` and γ_train of
    ``gammas`` (the γ_train a column where ``label_gamma``); per dataset (shown as ``names``) the
    constrained and the ERM best run's ``metric``, the better one bold (``higher``: larger)."""
    idx = index_rows(rows)
    head = ["model"] + (["γ_train"] if label_gamma else [])
    for d in datasets:
        head += [f"{names[d]} constr.", f"{names[d]} ERM"]
    lines = [
        "| " + " | ".join(head) + " |",
        "|" + "|".join(["---"] * (1 + label_gamma) + ["---:"] * (2 * len(datasets))) + "|",
    ]
    for label, model, L in table_rows:
        for g in gammas:
            cells = [label] + ([f"{g:g}"] if label_gamma else [])
            for d in datasets:
                c = idx.get((d, model, L, "constrained", g))
                e = idx.get((d, model, L, "ERM", g))
                cells += list(_pair_cells(c, e, metric, higher))
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def _direction(diff: float, higher: bool) -> str:
    """C where constrained is the better (``diff``: constrained minus ERM, to 3 decimals)."""
    if round(diff, 3) == 0:
        return "="
    return "C" if (diff > 0) == higher else "E"


def direction_markdown(
    rows: list[dict],
    names: dict[str, str],
    datasets: Sequence[str],
    table_rows: Iterable[tuple[str, str, int]],
    gamma: float,
    paper: Callable[[str, int, float, str], tuple[float, float] | None],
    *,
    metric: str,
    higher: bool,
    signed: bool,
    legend: str = "",
) -> str:
    """Per cell: which of constrained (C) / ERM (E) has the better ``metric`` here and in the
    paper's table (``paper(model, L, gamma, dataset)``: its (constrained, ERM) pair, None where
    it has no such row); ``signed``: with constrained minus ERM here and there. ``legend``
    ends the legend line.

    Cells whose constrained runs are all infeasible are counted apart, by the number of the best
    infeasible run: they are not eligible for the table's comparison."""
    idx = index_rows(rows)
    word = "higher" if higher else "lower"
    flagged = "`infeasible: C`" if signed else "`infeasible (C)`"
    head = ["model"] + [names[d] for d in datasets]
    lines = [
        f"### Direction against the paper's table (appendix B.4), γ_train = {gamma:g}",
        "",
        f"Cell: the {word} of constrained (C) and ERM (E) here / in the paper (=: "
        + (
            "level here, the paired t interval over seeds spanning 0, or equal in the paper to 3 "
            "decimals; not counted)"
            if several_seeds(rows)
            else "equal to 3 decimals, not counted)"
        )
        + (", with constrained minus ERM here and there" if signed else "")
        + f"; ✓ same direction; {flagged}: no feasible constrained run, the best infeasible "
        "one's direction" + status_legend(rows) + "." + legend,
        "",
        "| " + " | ".join(head) + " |",
        "|" + "|".join(["---"] * len(head)) + "|",
    ]
    counts = {"eligible": [0, 0, 0, 0], "infeasible": [0, 0, 0, 0]}  # agree, n, ours C, paper C
    for label, model, L in table_rows:
        cells = [label]
        for d in datasets:
            ref = paper(model, L, gamma, d)
            c = idx.get((d, model, L, "constrained", gamma))
            e = idx.get((d, model, L, "ERM", gamma))
            p, pd = "—", ""
            if ref is not None:
                pdiff = round(ref[0] - ref[1], 3)
                p = _direction(pdiff, higher)
                pd = f" ({pdiff:+.3f})" if signed else ""
            o, od, group = "—", "", None
            finite = c and e and _finite_metric(c, metric) and _finite_metric(e, metric)
            if finite and e["status"] == "ok" and metric in c:
                diff = round(c[metric], 3) - round(e[metric], 3)
                o = _direction(diff, higher)
                # several seeds: level unless the interval excludes 0, an infeasible row's too
                iv = _seed_interval(c, e, metric) if c["status"] != SEED_DIVERGED else None
                if iv is not None:
                    o = _interval_direction(iv, higher)
                od = f" ({diff:+.3f})" if signed else ""
                group = "eligible" if c["status"] == "ok" else "infeasible"
            lost = [r["status"] for r in (c, e) if r and r["status"] != "ok"]
            if group == "eligible":
                shown = f"{o}{od}" + (RESILIENT_MARK if c.get("resilient") else "")
            elif lost and o != "—":
                shown = f"{lost[0]}: {o}{od}" if signed else f"{lost[0]} ({o})"
            else:
                shown = lost[0] if lost else "—"
            mark = ""
            if group and o != "=" and p in ("C", "E"):
                n = counts[group]
                n[0] += o == p
                n[1] += 1
                n[2] += o == "C"
                n[3] += p == "C"
                mark = " ✓" if o == p else " ✗"
            cells.append(f"{shown} / {p}{pd}{mark}")
        lines.append("| " + " | ".join(cells) + " |")
    agree, n, ours, paper_c = counts["eligible"]
    lines.append(
        f"\nEligible cells: same direction in {agree} of {n}; constrained {word} in {ours} of "
        f"them here, {paper_c} in the paper."
    )
    agree, n, ours, paper_c = counts["infeasible"]
    if n:
        which = (
            "an eligible constrained point (the best of the others)"
            if any(r.get("status") == NOT_MONOTONE for r in rows)
            else "a feasible constrained run (best infeasible run)"
        )
        lines.append(
            f"Cells without {which}: same direction in {agree} of {n}; constrained {word} in "
            f"{ours} here, {paper_c} in the paper."
        )
    return "\n".join(lines)
