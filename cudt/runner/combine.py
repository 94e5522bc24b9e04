"""One report from the runs of several output folders: a job's seeds trained as separate commands.

    python -m experiments.combine runs/seed0 runs/seeds12

A job's seeds (or sweep points) need not train in one program: ``--seed 1 --seeds 2`` trains
seeds 1 and 2 of ``--seed 0 --seeds 3`` (each seed on its own draw of the data), on another
machine or later; with ``--data-seed 0`` on every command, all on seed 0's draw.
:func:`combine` reads each folder's ``results.json``, checks that they are the
same experiment on the same data with the same settings (everything but the runs' seeds, the
sweep points, a hyperparameter either folder sweeps, the tune grids, where and how the runs
were executed, and a path spelt otherwise whose files' digests are alike; a setting a later
version added counts as its earlier behaviour in a folder written before it,
``RunConfig.ADDED``), and prints the experiment's summary
table and footer over all their runs: the best run of each setting chosen again (on validation
data, as every run does), the sweep point chosen over every seed, the intervals over seeds,
the paired constrained − ERM intervals. It writes nothing, and refuses a folder a job is still
writing (its lock is held). One folder gives that folder's
report as this version writes it (a run finished before the runner printed its chosen sweep
point, say), without retraining or touching the folder.
"""

from __future__ import annotations

import dataclasses
import json
import types
from pathlib import Path

from cudt.errors import UsageError
from cudt.knobs import KNOBS, TUNED_BY
from cudt.runner.choice import (
    _hparam_text,
    at_gamma,
    choose_points,
    chosen_lines,
    compare_chosen,
    comparison_lines,
    meets_constraints,
    select_best,
)
from cudt.runner.finished import removed_settings
from cudt.runner.lock import check_free
from cudt.runner.output import DATA_RECORD, described_alike
from cudt.runner.report import seed_intervals, summary_table
from cudt.runner.sweep import SWEEPABLE, label_suffix

__all__ = [
    "CONFIG_FREE",
    "DATA_FLAGS",
    "combine",
    "combine_per_folder",
    "load_results",
    "run_data_seed",
    "run_identity",
]

#: Config entries that may differ between the folders of one job: the runs' seeds, sweep
#: points and kinds (each run records its own), how and where they were executed, and which
#: states were read out at a γ other than γ_train (no reported number depends on it).
CONFIG_FREE = frozenset(
    {
        "seed",
        "seeds",
        "data_seed",
        "data_per_seed",
        "data_derived",
        "sweep",
        "sweeps",
        "swept",
        "kinds",
        "states_at_every_gamma",
        "model_hparams",
        "out",
        "overwrite",
        "resume",
        "figures",
        "eval_batch_size",
        "chunk_steps",
        "checkpoint_every",
        "keep_checkpoints",
        "devices",
        "distributed",
        "fsdp",
    }
)


def load_results(folder: str | Path) -> dict:
    """A run folder's ``results.json``, or a one-line :class:`UsageError` naming the folder (a
    folder a job holds, a run in progress, is refused: :func:`cudt.runner.lock.check_free`)."""
    check_free(folder, reader=True)
    path = Path(folder) / "results.json"
    if not path.is_file():
        raise UsageError(f"{folder}: no results.json (a finished run's --out folder is needed)")
    try:
        results = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(
            f"{path}: not readable as JSON ({exc}): rerun that folder's command to write it "
            "again (its checkpoints resume), or leave the folder out"
        ) from exc
    shape = {"experiment": str, "config": dict, "runs": list}
    wrong = (
        list(shape)
        if not isinstance(results, dict)
        else [k for k, kind in shape.items() if not isinstance(results.get(k), kind)]
    )
    if not wrong:  # every run a record with what each task's runs carry
        for i, run in enumerate(results["runs"]):
            missing = [k for k in _RUN_FIELDS if not isinstance(run, dict) or k not in run]
            if missing:
                wrong = [f"runs[{i}].{k}" for k in missing]
                break
    if wrong:  # another program's JSON, or one edited by hand: not a traceback further on
        raise UsageError(
            f"{path}: not a cudt run's results (no {', '.join(wrong)}): pass the --out folder "
            "of a finished run, or rerun that folder's command to write it again"
        )
    _idle_as_none(results, types.SimpleNamespace(**results["config"]))
    return results


#: The records of a run's setting in results.json (its runs', chosen points', comparisons').
_HPARAMS_RECORDS = frozenset({"hparams", "constrained_hparams", "erm_hparams"})


def _idle_as_none(record, config: types.SimpleNamespace) -> None:
    """Every setting recorded in ``record`` (results.json, walked) with the knobs that act on
    nothing in ``config`` None, as a run records them now (:meth:`cudt.knobs.Knob.acts`): an
    earlier cudt recorded --dual-lr (and nuPI's gains) under --formulation penalty, so its runs
    would be other points than a later folder's of the same setting."""
    if isinstance(record, list):
        for item in record:
            _idle_as_none(item, config)
        return
    if not isinstance(record, dict):
        return
    for key, value in record.items():
        if key not in _HPARAMS_RECORDS or not isinstance(value, dict):
            _idle_as_none(value, config)
            continue
        for knob in KNOBS:
            try:
                idle = knob.name in value and not knob.acts(config)
            except AttributeError:  # a config from before the setting it needs: as recorded
                idle = False
            if idle:
                value[knob.name] = None


#: What every run of a ``results.json`` holds, whatever its task (checked before they are read).
_RUN_FIELDS = ("label", "model", "seed", "constrained", "hparams")


def _data_seed(config: dict) -> int:
    value = config.get("data_seed")
    return int(config["seed"] if value is None else value)


def run_data_seed(config: dict, seed: int) -> int:
    """The draw of the data a run of ``seed`` read: its own seed's (``data_per_seed``), or the
    folder's one draw."""
    return seed if config.get("data_per_seed") else _data_seed(config)


#: What may differ, besides :data:`CONFIG_FREE`, between the folders of :func:`combine_per_folder`:
#: which data set each read (a folder per data set), and so what each derived from its data.
DATA_FLAGS = frozenset({"data_dir", "data", "train_data", "val_data", "test_data"})


def _load_job(task, folders: list[str | Path], own_data: bool = False) -> list[dict]:
    """The folders' results, checked to be one experiment with the same settings: all but
    :data:`CONFIG_FREE`, the sweeps, and (where seeds drew their own data) what each draw
    derived from its data; ``own_data``: each folder on its own data set, so the data flags
    (:data:`DATA_FLAGS`) and data seeds may differ too. A :class:`UsageError` names the first
    difference."""
    free = CONFIG_FREE | DATA_FLAGS if own_data else CONFIG_FREE
    flags = {f.name for f in dataclasses.fields(task.config_cls)}
    if not folders:
        raise UsageError("combine needs at least one run folder")
    results = [load_results(f) for f in folders]
    first, name = results[0], task.name
    for folder, res in zip(folders, results, strict=True):
        if res.get("experiment") != name:
            raise UsageError(
                f"{folder}: a {res.get('experiment')!r} run, not {name!r}: combine one "
                "experiment's folders"
            )
    # a field a later version added is, where a folder predates it, what that version did
    added = getattr(task.config_cls, "ADDED", {})
    base = {**added, **first["config"]}
    for folder, res in zip(folders[1:], results[1:], strict=True):
        config = {**added, **res["config"]}
        # a folder whose seeds drew their own data is checked over the runs below (one draw
        # for all, or each seed its own)
        fresh = config.get("data_per_seed") or base.get("data_per_seed")
        if not (fresh or own_data) and _data_seed(config) != _data_seed(base):
            raise UsageError(
                f"{folder}: data seed {_data_seed(config)}, not {_data_seed(base)} as in "
                f"{folders[0]}: train the other seeds with --data-seed {_data_seed(base)}"
            )
        # per-run values: a sweep's, and the tune grids' (each run records the point it trained
        # at; a point a folder's grid lacks is a seed short, no rival in choose_points)
        swept = set(config.get("sweeps", {})) | set(base.get("sweeps", {})) | _TUNE_FLAGS
        if fresh or own_data:  # what each draw's data gives (σ_x, a vocabulary), but not a
            # flag the task resolved (lr's default): that is a setting like any other
            derived = set(config.get("data_derived", [])) | set(base.get("data_derived", []))
            swept |= derived - flags
        # a flag that acted on nothing in both (recorded by a cudt that accepted it)
        idle_flags = getattr(task.config_cls, "idle_flags", lambda values: ())
        idle = set(idle_flags(config)) & set(idle_flags(base))
        differ = sorted(
            k
            for k in set(config) | set(base)
            if k not in free | swept | idle and config.get(k) != base.get(k)
        )
        # a path spelt otherwise (another working folder, another machine's mount) naming
        # the files the other folder's runs trained on (their digests alike): a resume's rule
        differ = [k for k in differ if not _same_files(task.config_cls, k, first, res)]
        if differ:
            _refuse_differences(task, folders[0], folder, base, config, differ)
    return results


def _same_files(config_cls: type, key: str, first: dict, other: dict) -> bool:
    """Whether the path flag ``key`` names, in two folders' results, files whose digests
    (the config's ``DESCRIBED_BY``: the training data's, the weights') each folder's data
    record holds alike (:func:`cudt.runner.output.described_alike`)."""

    def flat(record: dict, prefix: str = "") -> dict:
        out = {}
        for k, v in record.items():
            out |= flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v}
        return out

    records = [flat(r.get(DATA_RECORD) or {}) for r in (first, other)]
    return described_alike(key, *records, getattr(config_cls, "DESCRIBED_BY", {}))


def _refuse_differences(task, first, folder, base: dict, config: dict, differ: list) -> None:
    """The one-line refusal of two folders whose configs differ in ``differ``; a setting an
    earlier cudt recorded that this one no longer has (:func:`removed_settings`) is named as
    removed, not as a setting the other folder left unset (None)."""
    gone = set(removed_settings(task.config_cls, base))
    gone |= set(removed_settings(task.config_cls, config))
    differ = [k for k in differ if k not in gone] + [k for k in differ if k in gone]  # flags first
    shown = ", ".join(
        f"{k} ({base.get(k)!r} vs {config.get(k)!r}"
        + (
            "; a setting removed from cudt, which an earlier version recorded)"
            if k in gone
            else ")"
        )
        for k in differ[:3]
    )
    fix = (
        "; train the seeds of the folder that records it again with this cudt, or combine only "
        "folders that record the same"
        if gone & set(differ[:3])
        else ""
    )
    raise UsageError(f"{first} and {folder} differ in {shown}: they are not one job's runs{fix}")


def run_identity(r: dict) -> str:
    """What makes a run the one it is, whatever its label: model, depth, kind, seed and every
    hyperparameter (a label names only the values its folder swept)."""
    what = (r["model"], r.get("layers"), bool(r["constrained"]), int(r["seed"]), r["hparams"])
    return json.dumps(what, sort_keys=True)


def _lane_order(runs: list[dict]) -> list[dict]:
    """``runs`` of one draw of the data in the order one job over all their seeds lists them:
    each setting (model, kind, sweep point: a label without its seed) in the order first met,
    its seeds ascending within it, not folder by folder."""

    def setting(run: dict) -> str:
        return run["label"].partition(" seed ")[0] + " " + label_suffix(run["label"])

    first: dict[str, int] = {}
    for run in runs:
        first.setdefault(setting(run), len(first))
    return sorted(runs, key=lambda run: (first[setting(run)], int(run["seed"])))


def _runs(folders, results) -> list[dict]:
    """Every run of the folders; a run in two folders is refused, by its label or, where the
    folders swept other hyperparameters (so label it otherwise), by its settings and seed."""
    runs, seen, held = [], {}, {}
    for folder, res in zip(folders, results, strict=True):
        for r in res["runs"]:
            if r["label"] in seen:
                raise UsageError(
                    f"{r['label']} is in both {seen[r['label']]} and {folder}: pass each folder "
                    "once, and folders of other seeds (--seed)"
                )
            twin = held.get(run_identity(r))
            if twin is not None:
                raise UsageError(
                    f"{r['label']} in {folder} is {twin[0]} in {twin[1]} (the same seed and "
                    "settings): leave one of the two folders out, or train other seeds (--seed)"
                )
            seen[r["label"]] = folder
            held[run_identity(r)] = (r["label"], folder)
            runs.append(r)
    return runs


#: The flags of the grids the runner tunes knobs over (--tune-dual-lr): they may differ
#: between the folders of one job, whose lines then name each folder's.
_TUNE_FLAGS = frozenset(TUNED_BY.values())


def _folder_lines(folders, results) -> list[str]:
    """A line per folder: its seeds and commit, and its tune grids where the folders' differ."""
    grids = [{k: res["config"].get(k) for k in sorted(_TUNE_FLAGS)} for res in results]
    differ = [k for k in sorted(_TUNE_FLAGS) if any(g[k] != grids[0][k] for g in grids)]
    lines = []
    for folder, res, grid in zip(folders, results, grids, strict=True):
        seeds = sorted({int(r["seed"]) for r in res["runs"]})
        commit = (res.get("provenance") or {}).get("commit", "?")
        tuned = "".join(f", --{k.replace('_', '-')} {_grid_text(grid[k])}" for k in differ)
        lines.append(f"  {folder}: seeds {seeds}, commit {str(commit)[:12]}{tuned}")
    return lines


def _grid_text(values) -> str:
    return "-" if not values else ",".join(f"{v:g}" for v in values)


def _swept(results) -> list[str]:
    sweeps = {
        k
        for res in results
        for k in [*res["config"].get("sweeps", {}), *res["config"].get("swept", [])]
    }
    return [n for n in SWEEPABLE if n in sweeps]


def combine(task, folders: list[str | Path]) -> str:
    """The summary table and footer of ``task`` over the runs of ``folders`` (see the module
    docstring); a :class:`UsageError` when the folders are not one job's."""
    results = _load_job(task, folders)
    # every run's (seed, draw): one draw for all, or each seed its own; a list, not a dict by
    # seed, so that two folders' runs of one seed on two draws cannot hide one another
    draws = [
        (int(r["seed"]), run_data_seed(res["config"], int(r["seed"])), folder)
        for folder, res in zip(folders, results, strict=True)
        for r in res["runs"]
    ]
    if len({d for _, d, _ in draws}) > 1 and any(d != s for s, d, _ in draws):
        shared = next(f for s, d, f in draws if d != s)
        raise UsageError(
            f"{shared} trained on one draw of the data (--data-seed) and another folder on "
            "another: train every folder on each seed's own data (no --data-seed) or all with "
            f"--data-seed {_data_seed(results[0]['config'])}"
        )
    runs = _runs(folders, results)  # after: a seed on two draws is named as such first
    if len({d for _, d, _ in draws}) == 1:  # one draw: one job's groups hold every seed
        runs = _lane_order(runs)
    # the recorded config, read as attributes (selection_for reads flags such as --select)
    score, higher = task.selection_for(types.SimpleNamespace(**results[0]["config"]))
    select_best(runs, score, higher_is_better=higher)
    plural = "s" if len(folders) > 1 else ""
    lines = [f"{len(runs)} runs of {task.name} from {len(folders)} folder{plural}:"]
    lines += _folder_lines(folders, results)
    chosen = choose_points(runs, score, higher_is_better=higher)
    chosen += choose_points(runs, score, higher_is_better=higher, constrained=False)
    # one draw of the data for every seed (--data-seed on every command): the lines say so
    one = {d for _, d, _ in draws}
    data_draw = next(iter(one)) if len(one) == 1 else None
    tolerance = results[0]["config"].get("tolerance")
    comparisons = compare_chosen(runs, chosen, tolerance=tolerance, data_draw=data_draw)
    intervals = seed_intervals(runs, data_draw=data_draw)
    table = summary_table(task, runs, _swept(results), intervals, chosen, comparisons)
    return "\n".join([*lines, table])


def _given_points(runs, point: dict[str, str], point_text: str, folder) -> list[dict]:
    """The constrained point ``point`` names in one folder's runs, per model × L × γ_train, in
    :func:`choose_points`' form; a folder without it, or where it names several, is refused."""
    given = []
    groups = {
        (r.get("model"), r.get("layers"), r.get("gamma_train")) for r in runs if r["constrained"]
    }
    for model, layers, gamma_train in sorted(groups, key=str):
        points = []
        for r in runs:
            same = (r.get("model"), r.get("layers"), r.get("gamma_train")) == (
                model,
                layers,
                gamma_train,
            )
            at = all(_hparam_text(r["hparams"].get(k)) == v for k, v in point.items())
            if same and r["constrained"] and at and r["hparams"] not in points:
                points.append(r["hparams"])
        if len(points) != 1:
            found = "no constrained run" if not points else f"{len(points)} points"
            fix = (
                "pass a point every folder trained"
                if not points
                else "name the other swept values too"
            )
            raise UsageError(f"{folder}: {found} of {model}-{layers} at {point_text}: {fix}")
        given.append(
            {"model": model, "layers": layers, "gamma_train": gamma_train,
             "kind": "constrained", "hparams": points[0], "given": True}
        )  # fmt: skip
    return given


def combine_per_folder(task, folders: list[str | Path], point: dict[str, str] | None = None) -> str:
    """Folders of one experiment on different data sets (a held-out data set per seed, one
    command each with its own ``--data-dir``): each folder's sweep point chosen on its own
    validation data, as its run chose (:func:`choose_points`; a folder with one point: that
    point, if eligible), then chosen constrained − chosen ERM paired by seed over the folders
    where both kinds chose (:func:`compare_chosen`, pairing each folder's runs by their seed:
    folders may share seeds), with how many folders chose. The settings must be the same but for
    the data flags (:data:`DATA_FLAGS`) and what each data set derives.

    ``point`` (``{"dual_lr": "0.1"}``, values as the summary prints them): the constrained runs
    at that point in every folder instead of each folder's choice, against the chosen ERM: a
    lane reported at every seed, read on test data only, never a choice."""
    paths = [Path(f).resolve() for f in folders]
    twice = next((f for i, f in enumerate(folders) if paths[i] in paths[:i]), None)
    if twice is not None:
        raise UsageError(f"{twice} is given twice: name each data set's folder once")
    results = _load_job(task, folders, own_data=True)
    score, higher = task.selection_for(types.SimpleNamespace(**results[0]["config"]))
    point_text = " ".join(f"{k}={v}" for k, v in (point or {}).items())
    unknown = [k for k in point or {} if k not in SWEEPABLE]
    if unknown:
        raise UsageError(
            f"--point {unknown[0]}: not a per-run hyperparameter: name one of "
            + ", ".join(SWEEPABLE)
        )
    picked, chose, pairs, labels, resilient, judged = [], {}, {}, {}, {}, {}
    chooses = (
        f"its ERM choosing its own point on its own validation data, its constrained runs at "
        f"{point_text}"
        if point
        else "each choosing its own point on its own validation data"
    )
    lines = [f"{len(folders)} folders of {task.name}, each on its own data, {chooses}:"]
    lines += _folder_lines(folders, results)
    for i, (folder, res) in enumerate(zip(folders, results, strict=True)):
        runs = res["runs"]
        for constrained in (True, False):
            if constrained and point:
                picks = _given_points(runs, point, point_text, folder)
            else:
                picks = choose_points(
                    runs, score, higher_is_better=higher, min_points=1, constrained=constrained
                )
            for c in picks:
                group = (c["model"], c["layers"], c["gamma_train"], c["kind"])
                chose.setdefault(group, [0, 0])[1] += 1
                if c.get("given"):
                    lines.append(
                        f"  {folder}: {c['model']}-{c['layers']} constrained at {point_text}"
                    )
                else:
                    lines += [f"  {folder}: {x}" for x in chosen_lines([c], _swept([res]))]
                if c["hparams"] is None:
                    continue
                chose[group][0] += 1
                resilient[group] = resilient.get(group, 0) + bool(c.get("resilient"))
                for r in runs:
                    same = (r.get("model"), r.get("layers"), r.get("gamma_train")) == group[:3]
                    if same and r["constrained"] == constrained and r["hparams"] == c["hparams"]:
                        # a pair is a folder's seed: its number among all the folders' seeds
                        pair = pairs.setdefault((i, int(r["seed"])), len(pairs))
                        labels[pair] = f"{Path(folder).name}:{int(r['seed'])}"
                        picked.append({**r, "hparams": {}, "seed": pair})
                        # what ERM's feasibility is judged by: the folder's chosen ε, tolerance
                        judge = (c["hparams"].get("epsilon"), res["config"].get("tolerance"))
                        judged[(*group[:3], constrained, pair)] = (r, *judge)
    lines += _chose_lines(chose, point_text)
    common = [
        {
            "model": m,
            "layers": L,
            "gamma_train": g,
            "kind": k,
            "hparams": {},
            # the folders may differ: some choose a hard point, some the resilient fallback
            "resilient": bool(resilient.get((m, L, g, k))),
            "resilient_in": (resilient.get((m, L, g, k), 0), n),
        }
        for (m, L, g, k), (n, _) in chose.items()
        if n
    ]
    comparisons = compare_chosen(picked, common)
    for c in comparisons:
        c["erm_feasible"] = _erm_feasible(c, judged)
    for c in comparisons:  # a pair is a folder's seed: name it so, not by its number
        c["seeds"] = [labels[p] for p in c["seeds"]]
        c["unpaired"] = [labels[p] for p in c["unpaired"]]  # a folder where one kind chose
        for iv in c["constrained_minus_erm"].values():
            if "seeds" in iv:
                iv["seeds"] = [labels[p] for p in iv["seeds"]]
    lines += comparison_lines(
        comparisons, point="each folder's chosen point", fixed=point_text or None
    )
    if not comparisons:
        lines.append("no seed has a chosen point of both kinds: no comparison")
    return "\n".join(lines)


def _chose_lines(chose: dict[tuple, list[int]], point_text: str) -> list[str]:
    """In how many folders each model × L (× γ_train, where it has several) × kind chose a
    point (``chose``: ``{(model, L, γ_train, kind): [chose, folders]}``), or has the
    constrained point ``point_text`` names."""
    settings = [{"model": m, "layers": L, "gamma_train": g} for m, L, g, _ in chose]
    lines = []
    for (model, layers, gamma_train, kind), (n, of) in chose.items():
        setting = {"model": model, "layers": layers, "gamma_train": gamma_train}
        where = f"{model}-{layers}{at_gamma(setting, settings)}"
        if kind == "constrained" and point_text:
            lines.append(f"{where} constrained: at {point_text} in {n} of {of} folders")
        else:
            lines.append(f"{where} {kind}: a point chosen in {n} of {of} folders")
    return lines


def _erm_feasible(comparison: dict, judged: dict) -> int | None:
    """How many of a per-folder comparison's ERM runs meet the constraints of their own
    folder's chosen constrained point (its ε, its seed's reference bound, the folder's
    tolerance: :func:`compare_chosen`'s count, folder by folder); None where a folder's point
    has no ε or its results.json no tolerance."""
    where = (comparison["model"], comparison["layers"], comparison["gamma_train"])
    count = 0
    for pair in comparison["seeds"]:
        constrained, epsilon, tolerance = judged[(*where, True, pair)]
        erm = judged[(*where, False, pair)][0]
        if not isinstance(epsilon, (int, float)) or tolerance is None:
            return None
        count += meets_constraints(erm, epsilon, constrained, tolerance)
    return count
