"""What the paper-table jobs share (:mod:`cudt.paper.video_table`, video; :mod:`cudt.paper.text_table`, text).

A table job is a grid of sub-runs, each ONE :func:`cudt.runner.run` call (γ_train × sweep point
× seed as one vmapped program), in its own folder under ``--out``. Shared here: the checks of
the grid flags, a sub-run's config and the reuse/refusal rule of its folder, the training loop
over sub-runs, the rows of the best run of each setting, the CSV writer, the Markdown tables
(constrained vs ERM, and the direction of each cell against the paper's table), the figure
helpers, and the job itself (:class:`TableJob`, :func:`run_job`) with its entry point
(:func:`table_main`): a table module says only what is its own (grid, datasets, metric, the
paper's table, figures).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import shutil
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from cudt.errors import UsageError
from cudt.io import atomic_write, fresh_run_dir, savefig_atomic, to_jsonable
from cudt.runner.cli import config_from_args, configure_process, run_cli
from cudt.runner.config import flag
from cudt.runner.hparams import SWEEPABLE
from cudt.runner.output import CHECKPOINTS, CONFIG_FILE
from cudt.runner.report import KINDS
from cudt.runner.run import run

__all__ = [
    "STYLE",
    "SubRun",
    "TableJob",
    "best_of_setting",
    "check_grid_flags",
    "check_known",
    "check_subrun",
    "csv_text",
    "datasets_flag",
    "devices_flag",
    "direction_markdown",
    "draw_line",
    "figure_note",
    "fmt",
    "grid_axes",
    "headline_flag",
    "index_rows",
    "keep_or_build",
    "keep_unique",
    "mark_train_gamma",
    "need",
    "out_flag",
    "overwrite_flag",
    "paper_table",
    "peak",
    "run_job",
    "save_figure",
    "setting_rows",
    "sort_rows",
    "subrun_config",
    "sweep_flag",
    "table_lines",
    "table_main",
    "train_subruns",
    "unique",
    "write_text",
]

HPARAMS = tuple(n for n in SWEEPABLE if n != "gamma_train")  # what --sweep may name
# The CSV's first columns (the setting) and its last (the run shown and how it was chosen);
# each table puts its own numbers between them.
SETTING_COLUMNS = ("dataset", "model", "layers", "kind", "gamma_train", "status")
RUN_COLUMNS = (*HPARAMS, "runs", "diverged_runs", "infeasible_runs", "label", "sub_run")


# --------------------------------------------------------------------------------------------------
# Flags
# --------------------------------------------------------------------------------------------------


def finite(values) -> bool:
    return all(isinstance(v, int) or math.isfinite(v) for v in values)


def unique(values) -> tuple:
    """The values in the order given, each once (a repeated value would be a second sub-run)."""
    return tuple(dict.fromkeys(values))


def fmt(values) -> str:
    return ",".join(f"{v:g}" for v in values)


# The flags every table job has, their help written once (each call makes a new field).


def out_flag(job: str):
    """``--out`` of a table job (default: a fresh ``runs/<job>-<time>``)."""
    return flag(
        None,
        f"output folder (default: a fresh runs/{job}-<time>); rerun the same command with "
        "the same --out to reuse finished sub-runs and resume interrupted ones",
    )


def datasets_flag(datasets: Sequence[str]):
    return flag(tuple(datasets), "datasets: " + ", ".join(datasets))


def headline_flag(default: float):
    return flag(default, "the γ_train of the headline table and the figures")


def sweep_flag(example: str):
    """``--sweep``, repeatable (``example``: a single value, in its help)."""
    return flag(
        (),
        "NAME=V1,V2,...: also sweep NAME (" + ", ".join(HPARAMS) + ") in every sub-run; "
        f"a single value fixes it (e.g. {example})",
        repeat=True,
    )


def devices_flag():
    return flag(None, "use at most this many devices (default: every visible one)")


def overwrite_flag():
    return flag(False, "retrain every sub-run, discarding results already in --out")


def need(ok: bool, message: str) -> None:
    """The one-line UsageError ``message`` unless ``ok``."""
    if not ok:
        raise UsageError(message)


def check_known(name: str, what: str, values, known: Sequence[str], hint: str = "") -> None:
    """``--<name>``: every value one of ``known`` (``what``: one value, in the message)."""
    bad = [v for v in values if v not in known]
    if bad:
        raise UsageError(
            f"--{name}: unknown {what} {bad[0]!r}: choose from {', '.join(known)}{hint}"
        )


def keep_unique(opts, names: Sequence[str] = ("datasets", "models", "layers", "gamma_trains")):
    """The tuple flags ``names`` of the frozen ``opts`` with each value once, in the order given
    (a repeated value would be a second sub-run)."""
    for name in names:
        object.__setattr__(opts, name, unique(getattr(opts, name)))


def check_grid_flags(opts, need: Callable[[bool, str], None], counts: Sequence[str]) -> None:
    """The checks every table config shares: γ_train levels, the headline γ, test γ, the
    tolerance, the positive counts named in ``counts``, and no ``--sweep gamma_train`` (the
    levels are ``--gamma-trains``). ``need(ok, message)`` raises the one-line error."""
    gammas = opts.gamma_trains
    need(
        finite(gammas) and all(g >= 0 for g in gammas),
        "--gamma-trains must all be finite numbers >= 0, got " + ",".join(f"{g:g}" for g in gammas),
    )
    need(
        math.isfinite(opts.headline_gamma) and opts.headline_gamma >= 0,
        f"--headline-gamma must be a finite number >= 0, got {opts.headline_gamma:g}",
    )
    need(
        opts.headline_gamma in gammas,
        f"--headline-gamma {opts.headline_gamma:g} is not among --gamma-trains "
        f"({','.join(f'{g:g}' for g in gammas)}): pass one of them",
    )
    if opts.test_gammas is not None:
        need(
            finite(opts.test_gammas) and all(g >= 0 for g in opts.test_gammas),
            "--test-gammas must all be finite numbers >= 0, got "
            + ",".join(f"{g:g}" for g in opts.test_gammas),
        )
    if opts.tolerance is not None:
        need(
            math.isfinite(opts.tolerance) and opts.tolerance >= 0,
            f"--tolerance must be a finite number >= 0, got {opts.tolerance:g}",
        )
    for name in counts:
        value = getattr(opts, name)
        need(
            value is None or value >= 1,
            f"--{name.replace('_', '-')} must be >= 1, got {value}",
        )
    for item in opts.sweep:
        name = item.partition("=")[0].strip().replace("-", "_")
        need(
            name != "gamma_train",
            "--sweep gamma_train: the training levels are --gamma-trains (every sub-run "
            "sweeps them): pass --gamma-trains " + item.partition("=")[2],
        )


# --------------------------------------------------------------------------------------------------
# Sub-runs: reuse, refusal, training
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class SubRun:
    """One runner call of a table: its config (a task's RunConfig) and folder.

    ``key`` is what the table calls it (``(dataset, L)`` for video, ``(dataset, model, L)`` for
    text); ``resolved``: config fields whose default the task resolves into results.json (the
    text task writes its default ``lr`` there), as resolved now; ``finished`` is set by
    :func:`check_subrun` when its results can be reused."""

    name: str
    key: tuple
    cfg: Any
    out: Path
    resolved: dict[str, Any] = dataclasses.field(default_factory=dict)
    finished: bool = False


def subrun_config(config_cls: type, opts, out: Path, **fields) -> Any:
    """The task config (``config_cls``) of one sub-run writing to ``out``: ``fields``, and what
    every table passes down (its γ_train levels as a sweep, the headline γ_train, ``--sweep``,
    ``--tolerance``, ``--devices``, ``--overwrite``); a config the task refuses is one
    UsageError line, before anything is written."""
    kw = dict(
        sweep=(f"gamma_train={fmt(opts.gamma_trains)}", *opts.sweep),
        gamma_train=opts.headline_gamma,  # the sub-run's own plots mark this γ
        devices=opts.devices,
        out=str(out),
        overwrite=opts.overwrite,
        **fields,
    )
    if opts.tolerance is not None:
        kw["tolerance"] = opts.tolerance
    try:
        return config_cls(**kw)
    except ValueError as e:
        raise UsageError(str(e)) from None


def keep_or_build(root: Path, name: str, top: Path, spec: dict, build, *, overwrite: bool) -> Path:
    """A generated dataset folder ``top`` under ``root``: kept when a complete copy of the same
    ``spec`` is there (its marker ``root/.<name>.json``), else written by ``build(tmp)``
    (returning the written folder inside ``tmp``) into a temporary folder and renamed, so a
    killed job never leaves half a dataset."""
    marker = root / f".{name}.json"
    if not overwrite and top.is_dir() and marker.exists():
        try:
            if json.loads(marker.read_text()) == spec:
                return top
        except (OSError, ValueError):
            pass
    tmp = root / f".tmp-{name}"
    shutil.rmtree(tmp, ignore_errors=True)
    written = build(tmp)
    marker.unlink(missing_ok=True)
    shutil.rmtree(top, ignore_errors=True)
    written.rename(top)
    shutil.rmtree(tmp, ignore_errors=True)
    marker.write_text(json.dumps(spec))
    return top


def _differences(saved: dict, want: dict[str, Any]) -> list[str]:
    want = to_jsonable(want)
    return [
        f"{k}: {saved.get(k)!r} there, {v!r} now"
        for k, v in want.items()
        if saved.get(k) != v  # a field missing there reads None, as the runner's resume rule
    ]


def _refuse(sub: SubRun, what: str, diff: list[str]) -> UsageError:
    shown = "; ".join(diff[:3]) + (f"; and {len(diff) - 3} more" if len(diff) > 3 else "")
    return UsageError(
        f"{sub.out} holds {what} of another config ({shown}): rerun with the flags that made "
        "it, pass another --out, or --overwrite to retrain"
    )


def check_subrun(sub: SubRun, overwrite: bool) -> None:
    """Sets ``sub.finished`` (results.json of the same config: reused); refuses a folder holding
    results or checkpoints of another config unless ``overwrite``."""
    if overwrite:
        return
    results = sub.out / "results.json"
    if results.exists():
        try:
            saved = json.loads(results.read_text())["config"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise UsageError(
                f"{results} is unreadable ({e}): delete {sub.out}, or pass --overwrite"
            ) from e
        diff = _differences(saved, sub.cfg.fingerprint() | sub.resolved)
        if diff:
            raise _refuse(sub, "results", diff)
        sub.finished = True
        return
    saved_config = sub.out / CHECKPOINTS / CONFIG_FILE
    if saved_config.exists():  # the runner resumes these; a foreign one is refused up front
        try:
            saved = json.loads(saved_config.read_text())
        except (OSError, ValueError) as e:
            raise UsageError(
                f"{saved_config} is unreadable ({e}): delete {sub.out}, or pass --overwrite"
            ) from e
        diff = _differences(saved, sub.cfg.fingerprint())  # the runner's own record
        if diff:
            raise _refuse(sub, "checkpoints", diff)


def train_subruns(subs: list[SubRun], make_task: Callable[[], Any]) -> dict[tuple, dict]:
    """Trains every unfinished sub-run with the shared runner (a finished one is reused);
    returns ``{sub.key: its results.json}``."""
    results = {}
    for k, sub in enumerate(subs, start=1):
        if sub.finished:
            print(f"[{k}/{len(subs)}] {sub.name}: reusing {sub.out / 'results.json'}")
        else:
            print(f"[{k}/{len(subs)}] {sub.name}: training")
            run(make_task(), sub.cfg, sub.out)
        results[sub.key] = json.loads((sub.out / "results.json").read_text())
    return results


# --------------------------------------------------------------------------------------------------
# Best runs, CSV
# --------------------------------------------------------------------------------------------------


def num(value) -> float:
    return math.nan if value is None else float(value)


def peak(values) -> float:
    """The largest multiplier over training (None, a non-finite one in JSON, reads inf)."""
    vals = [math.inf if v is None else float(v) for v in values]
    return max(vals) if vals else 0.0


def best_of_setting(
    runs: list[dict], constrained: bool, *, score: str, higher: bool
) -> tuple[dict | None, dict[str, Any]]:
    """The run shown for one setting (model, L, kind, γ_train) and its status fields.

    The shown run is the runner's ``best`` mark (the best ``score`` among non-diverged runs that
    are feasible, for constrained ones); where no constrained run is feasible, the best of the
    infeasible ones, flagged (``status`` ``infeasible``); None where every run diverged."""
    best = [r for r in runs if r.get("best")]
    shown = best
    if not best and constrained:  # infeasible: still show its best number, flagged
        alive = [r for r in runs if not r.get("diverged") and math.isfinite(num(r.get(score)))]
        shown = sorted(alive, key=lambda r: r[score], reverse=higher)[:1]
    infeasible = sum(
        (not r.get("diverged")) and constrained and not r.get("feasible") for r in runs
    )
    status = {
        "status": "ok" if best else ("infeasible" if infeasible else "diverged"),
        "runs": len(runs),
        "diverged_runs": sum(bool(r.get("diverged")) for r in runs),
        "infeasible_runs": infeasible,
    }
    return (shown[0] if shown else None), status


def setting_rows(
    res: dict, dataset: str, sub_run: str, *, score: str, higher: bool, fields
) -> list[dict]:
    """One row per (model, L, kind, γ_train) of one sub-run's ``results.json`` ``res``: its best
    run (:func:`best_of_setting` by ``score``) and status, and (unless every run diverged) what
    every table shows of that run; ``fields(best, i)`` adds the table's own numbers of it
    (``i``: the index of its γ_train in its test γ grid). L is each run's own (a pretrained
    model's depth is its checkpoint's)."""
    settings: dict[tuple, list[dict]] = defaultdict(list)
    for r in res["runs"]:
        key = (r["model"], int(r["layers"]), r["constrained"], float(r["gamma_train"]))
        settings[key].append(r)
    rows = []
    for (model, layers, constrained, gamma), runs in settings.items():
        b, status = best_of_setting(runs, constrained, score=score, higher=higher)
        row = {
            "dataset": dataset,
            "model": model,
            "layers": layers,
            "kind": KINDS[constrained],
            "gamma_train": gamma,
            **status,
            "sub_run": sub_run,
        }
        if b is not None:
            test_gamma = [float(g) for g in b["test_gamma"]]
            i = test_gamma.index(gamma)
            row |= fields(b, i) | {
                "feasible": bool(b["feasible"]),
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


# --------------------------------------------------------------------------------------------------
# Markdown tables: constrained vs ERM, and the direction of each cell against the paper
# --------------------------------------------------------------------------------------------------


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


def _cell(row: dict | None, metric: str) -> str:
    if row is None:
        return "—"
    if row["status"] == "ok":
        return f"{row[metric]:.3f}"
    if metric in row:  # infeasible: the best of the infeasible runs, not eligible
        return f"{row['status']} ({row[metric]:.3f})"
    return row["status"]


def _pair_cells(c: dict | None, e: dict | None, metric: str, higher: bool) -> tuple[str, str]:
    """Constrained and ERM cells, the better ``metric`` bold (both when equal to 3 decimals)."""
    cc, ec = _cell(c, metric), _cell(e, metric)
    if c and e and c["status"] == "ok" and e["status"] == "ok":
        cv, ev = round(c[metric], 3), round(e[metric], 3)
        if (cv >= ev) if higher else (cv <= ev):
            cc = f"**{cc}**"
        if (ev >= cv) if higher else (ev <= cv):
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
    better = "higher" if higher else "lower"
    flagged = "`infeasible: C`" if signed else "`infeasible (C)`"
    head = ["model"] + [names[d] for d in datasets]
    lines = [
        f"### Direction against the paper's table (appendix B.4), γ_train = {gamma:g}",
        "",
        f"Cell: the {better} of constrained (C) and ERM (E) here / in the paper (=: equal to 3 "
        "decimals, not counted)"
        + (", with constrained minus ERM here and there" if signed else "")
        + f"; ✓ same direction; {flagged}: no feasible constrained run, the best infeasible "
        "one's direction." + legend,
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
            if c and e and e["status"] == "ok" and metric in c:
                diff = round(c[metric], 3) - round(e[metric], 3)
                o = _direction(diff, higher)
                od = f" ({diff:+.3f})" if signed else ""
                group = "eligible" if c["status"] == "ok" else "infeasible"
            lost = [r["status"] for r in (c, e) if r and r["status"] != "ok"]
            if group == "eligible":
                shown = f"{o}{od}"
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
        f"\nEligible cells: same direction in {agree} of {n}; constrained {better} in {ours} of "
        f"them here, {paper_c} in the paper."
    )
    agree, n, ours, paper_c = counts["infeasible"]
    if n:
        lines.append(
            f"Cells without a feasible constrained run (best infeasible run): same direction in "
            f"{agree} of {n}; constrained {better} in {ours} here, {paper_c} in the paper."
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------------------------------


STYLE = {
    "ERM": {"color": "tab:blue", "marker": "o", "label": "ERM"},
    "constrained": {"color": "tab:red", "marker": "s", "label": "constrained"},
}


def draw_line(ax, style: dict, row: dict, x, y, *, has_value: bool, ms: float = 4) -> None:
    """One best run as a line in the project's convention (:mod:`cudt.runner.plots`): an infeasible
    one dashed and named so, one without numbers (diverged) only named in the legend."""
    if row["status"] == "diverged" or not has_value:
        ax.plot([], [], color="0.5", ls=":", label=f"{style['label']}: {row['status']}")
        return
    ok = row["status"] == "ok"
    ax.plot(
        x,
        y,
        color=style["color"],
        ls="-" if ok else "--",
        marker=style["marker"],
        ms=ms,
        alpha=1.0 if ok else 0.8,
        label=style["label"] + ("" if ok else f" ({row['status']})"),
    )


def grid_axes(nrows: int, ncols: int, w: float, h: float, min_width: float = 7.5):
    """A figure of ``nrows × ncols`` panels of ``w × h`` inches (room for a title and a note)."""
    import matplotlib.pyplot as plt

    width = max(w * ncols, min_width)
    fig, axes = plt.subplots(nrows, ncols, figsize=(width, h * nrows + 0.6), squeeze=False)
    return fig, axes


def save_figure(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    # room for the title above the panels and the note under them
    h = fig.get_figheight()
    fig.tight_layout(rect=(0, 0.3 / h, 1, 1 - 0.3 / h))
    savefig_atomic(fig, path, dpi=100)
    plt.close(fig)


def figure_note(fig, text: str) -> None:
    """A grey line under the panels (how the runs shown were chosen)."""
    fig.text(0.5, 0.005, text, ha="center", va="bottom", fontsize=8, color="0.35")


def mark_train_gamma(ax, gamma: float, *, label_y: float) -> None:
    """The training level ``gamma`` as a dotted line, the test levels beyond it shaded and
    named OOD (the label at height ``label_y`` in axes units)."""
    ax.axvline(gamma, color="k", lw=0.8, ls=":")
    lo, hi = ax.get_xlim()
    ax.axvspan(gamma, hi, color="0.94", zorder=0)
    ax.set_xlim(lo, hi)
    ax.text(0.98, label_y, "OOD", transform=ax.transAxes, ha="right", fontsize=8, color="0.4")


# --------------------------------------------------------------------------------------------------
# The job
# --------------------------------------------------------------------------------------------------


class TableJob:
    """A paper-table job, as :class:`cudt.runner.Task` is a task: a subclass says what the job
    is (its data, sub-runs, rows, Markdown and figures); :func:`run_job` does the rest.

    Every method takes the job's frozen flags ``opts`` (which have ``out``, ``scale``,
    ``overwrite``, ``gamma_trains``, ``sweep``); ``cfg`` is the first sub-run's task config."""

    name: str  # in its messages ("video table"); with "_" for " ": its default --out folder
    table: str  # the CSV and Markdown file names: <table>.csv, <table>.md
    title: str  # the Markdown's heading, before ", --scale <scale>"
    csv_columns: Sequence[str]

    def check(self, opts) -> None:
        """Inputs checked before anything is written (one-line errors)."""

    def plan(self, opts, out: Path) -> list[SubRun]:
        raise NotImplementedError

    def prepare_tiny(self, opts, out: Path) -> None:
        """--scale tiny: write the generated data."""

    def make_task(self):
        """The task that trains each sub-run."""
        raise NotImplementedError

    def best_rows(self, results: dict[tuple, dict]) -> list[dict]:
        """``{sub.key: results.json}`` → one row per setting."""
        raise NotImplementedError

    def settings(self, opts, cfg) -> str:
        """The training settings, for the note."""
        raise NotImplementedError

    def details(self, opts, cfg) -> str:
        """The note's last clause (the data, ...)."""
        return ""

    def headline(self, rows: list[dict], opts, test_gammas: Sequence[float]) -> str:
        raise NotImplementedError

    def direction(self, rows: list[dict], opts) -> str:
        """The cells against the paper."""
        raise NotImplementedError

    def every_gamma(self, rows: list[dict], opts) -> list[str]:
        """The table at every γ_train."""
        raise NotImplementedError

    def figures(self, rows: list[dict], opts, out: Path) -> dict[str, Path]:
        """Writes the job's figures; returns ``{name: path}``."""
        return {}


def run_job(job: TableJob, opts) -> dict[str, Any]:
    """Trains (or reuses) every sub-run of ``job``, then writes the table, CSV and figures;
    returns ``{"rows", "markdown", "paths", "trained", "reused", "wall_seconds"}``.

    Every input check and sub-run refusal comes before anything is written or trained."""
    t0 = time.perf_counter()
    job.check(opts)
    out = Path(opts.out) if opts.out else fresh_run_dir(job.name.replace(" ", "_"))
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file, not a folder: pass a folder path")
    subs = job.plan(opts, out)
    for sub in subs:
        check_subrun(sub, opts.overwrite)
    todo = [s for s in subs if not s.finished]
    print(
        f"{job.name}: {len(subs)} sub-runs under {out} ({len(subs) - len(todo)} finished, "
        f"reused; {len(todo)} to train); rerun this command with --out {out} to resume"
    )
    if opts.scale == "tiny":
        job.prepare_tiny(opts, out)
    results = train_subruns(subs, job.make_task)
    rows = job.best_rows(results)
    test_gammas = results[subs[0].key]["config"]["test_gamma"]
    wall = time.perf_counter() - t0
    trained, reused = len(todo), len(subs) - len(todo)
    counted = f"{len(subs)} sub-runs ({trained} trained, {reused} reused)"
    cfg = subs[0].cfg
    note = (
        f"{counted}, {job.settings(opts, cfg)}, γ_train ∈ {{{fmt(opts.gamma_trains)}}}"
        + (f", sweeps {'; '.join(opts.sweep)}" if opts.sweep else "")
        + f"; {job.details(opts, cfg)}."
    )
    trained_seconds = sum(float(r.get("wall_seconds") or 0) for r in results.values())
    headline, direction = job.headline(rows, opts, test_gammas), job.direction(rows, opts)
    parts = [
        f"# {job.title}, --scale {opts.scale}",
        "",
        note,
        "",
        headline,
        "",
        direction,
        "",
        "### Every γ_train",
        "",
        *job.every_gamma(rows, opts),
        "",
        f"Wall time of the job that wrote this: {wall:.0f} s (sub-runs' own wall times, "
        f"summed: {trained_seconds:.0f} s).",
    ]
    markdown = "\n".join(parts) + "\n"
    paths = {"csv": out / f"{job.table}.csv", "md": out / f"{job.table}.md"}
    write_text(paths["csv"], csv_text(rows, job.csv_columns))
    write_text(paths["md"], markdown)
    paths |= job.figures(rows, opts, out)
    wall = time.perf_counter() - t0
    print()
    print(headline)
    print()
    print(direction)
    print()
    print(f"wrote {', '.join(str(p) for p in paths.values())}")
    print(f"{job.name}: {counted} in {wall:.0f}s wall")
    return {
        "rows": rows,
        "markdown": markdown,
        "paths": paths,
        "trained": trained,
        "reused": reused,
        "wall_seconds": wall,
    }


def table_main(config_cls: type, run_table, argv: Sequence[str] | None, doc: str, prog: str) -> int:
    """The whole entry point of a table job: flags (``config_cls``, described by the first
    paragraph of ``doc``) → ``run_table(opts)``; a bad flag or input is one line, status 2."""
    configure_process()
    try:
        opts, _ = config_from_args(config_cls, argv, doc.split("\n\n")[0], prog)
    except SystemExit as e:  # --help, or a bad flag (already reported in one line)
        return 0 if e.code is None else int(e.code)
    return run_cli(lambda: run_table(opts))
