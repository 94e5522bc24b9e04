"""The paper's video grid (appendix B.4, "Table 3") as one job: every dataset, depth, γ_train,
model, ERM and constrained, through the shared runner; then the table and Figures 2, 3 and 7.

For each (dataset, L) ONE :func:`cudt.runner.run` call trains the whole γ_train × sweep point ×
seed grid of each model structure as one vmapped program (the runner shards it over the
devices), into ``<out>/<dataset>-L<L>/``. A sub-run whose ``results.json`` exists and whose
config matches is reused; an interrupted one resumes from its checkpoints (the runner's rule);
``--overwrite`` retrains every sub-run. The best run of each (dataset, model, L, kind, γ_train)
is the runner's ``best`` mark: the lowest validation RMSE among non-diverged runs that are
feasible (constrained).

Outputs under ``<out>``: ``table3.csv`` (long format: one row per best run), ``table3.md`` (the
headline table at ``--headline-gamma``, the direction of each cell against the paper's table, and
every γ_train), ``fig2_rmse_vs_gamma.png``, ``fig3_depth.png``, ``fig7_layer_loss.png``; with
``--scale tiny`` also ``data/``: tiny copies of the three datasets in their real layouts
(:mod:`cudt.data.layouts`), read back through the real readers.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from cudt import grid
from cudt.data import layouts
from cudt.errors import DataError, UsageError
from cudt.grid import SubRun, check_subrun, fmt, grid_axes, save_figure, write_text
from cudt.io import fresh_run_dir
from cudt.models.vit import write_vit_folder
from cudt.runner.config import SWEEPABLE, flag
from cudt.tasks.video import CONTROL, VideoConfig, VideoTask, test_gamma_grid

__all__ = [
    "DATASETS",
    "PAPER_TABLE3",
    "SCALES",
    "Table3Config",
    "best_rows",
    "build_tiny_datasets",
    "headline_markdown",
    "plan",
    "run_table",
]

DATASETS = ("ucsd", "avenue", "shanghaitech")
UNROLLED = ("dust", "ut")  # depth = --layers
TABLE_MODELS = (*UNROLLED, "vit")  # the ViT's depth is its checkpoint's (the paper's: 12)
PAPER_VIT_LAYERS = 12
# --scale tiny without --vit-checkpoint: a random-weight ViT written in the Hugging Face layout
# (no pretrained weights can be downloaded here), read back through the real loader.
TINY_VIT = dict(
    image_size=32, patch_size=8, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64
)
NAMES = {"ucsd": "UCSD", "avenue": "Avenue", "shanghaitech": "ShanghaiTech"}
FOLDERS = {"ucsd": layouts.UCSD, "avenue": layouts.AVENUE, "shanghaitech": layouts.SHANGHAITECH}
WRITERS = {
    "ucsd": layouts.write_ucsd,
    "avenue": layouts.write_avenue,
    "shanghaitech": layouts.write_shanghaitech,
}
GAMMA_TRAINS = (0.0, 0.09, 0.11, 0.13, 0.15)
KIND = grid.KIND
HPARAMS = tuple(n for n in SWEEPABLE if n != "gamma_train")

# Settings per scale (flags override steps, seeds, batch size, test γ).
SCALES: dict[str, dict[str, Any]] = {
    # A few minutes on a 2-core CPU: 4-frame sequences, 3 training videos (2 train + 1 val) and 2
    # test videos of 8 frames per dataset, 60 steps, one seed, 256 DUST atoms.
    "tiny": {
        "steps": 60,
        "seeds": 1,
        "batch_size": 32,
        # one chunk (one checkpoint); test and val evaluated in batches of one shape (one
        # compiled evaluator per group); a shorter test grid
        "video": {"seq_len": 4, "dust_atoms": 16, "chunk_steps": 60, "eval_batch_size": 200},
        "test_gammas": (0.0, 0.15, 0.3, 0.45, 0.6),
        "data": {"train_videos": 3, "test_videos": 2, "frames": 8},
    },
    # The paper's protocol with the task's defaults (8-frame sequences, 400 DCT atoms); the
    # paper's hyperparameter search is left to --sweep.
    "paper": {
        "steps": 800,
        "seeds": 5,
        "batch_size": 32,
        "video": {},
        "data": None,
        "test_gammas": None,
    },
}
# Synthetic seeds of the tiny datasets: three different "scenes".
TINY_SEEDS = {"ucsd": 11, "avenue": 12, "shanghaitech": 13}

# The paper's video table (appendix B.4): mean RMSE over its test γ grid, (constrained, ERM),
# per (model, L, γ_train) and dataset. Its rows for γ_train = 0.11 of DUST-5 UCSD (105.8) and of
# DUST-7 ShanghaiTech (131-138) are its primal-dual failures.
_PAPER_ROWS = """
dust 3 0.00 21.145 19.679 19.290 19.357 19.165 19.323
dust 3 0.09 16.976 17.139 16.175 15.952 14.856 14.974
dust 3 0.11 16.054 16.410 15.377 15.444 14.166 14.167
dust 3 0.13 15.409 15.878 17.452 14.838 13.562 13.505
dust 3 0.15 14.765 15.264 13.781 14.276 12.970 12.934
dust 5 0.00 17.650 21.072 18.643 19.174 17.517 19.469
dust 5 0.09 15.599 20.344 15.018 15.259 14.362 14.443
dust 5 0.11 15.848 20.960 13.633 12.463 105.767 20.965
dust 5 0.13 18.057 22.368 13.231 13.738 13.240 13.257
dust 5 0.15 14.724 28.269 12.410 18.636 12.642 12.840
dust 7 0.00 16.179 19.370 131.102 19.233 14.448 19.396
dust 7 0.09 28.916 36.374 132.968 14.754 13.040 25.968
dust 7 0.11 14.885 25.883 138.362 13.470 22.551 20.503
dust 7 0.13 14.515 63.309 13.106 13.502 12.365 62.931
dust 7 0.15 14.330 30.617 11.986 13.065 12.024 23.470
ut 3 0.00 16.770 16.180 17.691 18.471 15.074 15.353
ut 3 0.09 14.098 14.639 14.381 15.026 12.938 13.481
ut 3 0.11 13.523 14.063 13.618 13.783 12.770 13.293
ut 3 0.13 13.196 13.481 13.432 15.538 11.996 12.871
ut 3 0.15 12.377 13.110 12.952 15.306 11.342 12.442
ut 5 0.00 16.464 14.786 17.705 18.601 15.227 15.675
ut 5 0.09 13.828 15.084 14.977 13.988 13.394 12.923
ut 5 0.11 13.228 13.961 14.258 12.638 12.283 12.784
ut 5 0.13 12.701 13.631 13.498 11.540 12.144 12.360
ut 5 0.15 12.398 13.214 12.728 11.832 10.815 11.643
ut 7 0.00 16.609 14.979 14.626 16.817 15.047 12.361
ut 7 0.09 13.962 13.819 16.286 13.567 12.818 11.953
ut 7 0.11 16.731 14.005 13.606 13.300 13.092 11.849
ut 7 0.13 12.553 13.357 18.531 12.735 11.155 11.534
ut 7 0.15 12.232 12.996 12.726 12.316 10.577 11.768
vit 12 0.00 11.577 12.124 11.577 12.124 21.308 21.793
vit 12 0.09 7.595 7.582 7.538 8.008 16.349 17.037
vit 12 0.11 7.219 7.495 7.387 7.240 16.638 18.515
vit 12 0.13 7.094 7.138 7.021 7.351 23.186 23.482
vit 12 0.15 6.953 6.865 6.650 6.889 12.695 14.632
"""


def _paper_table() -> dict[tuple[str, int, float, str], tuple[float, float]]:
    table = {}
    for line in _PAPER_ROWS.strip().splitlines():
        model, layers, gamma, *values = line.split()
        v = [float(x) for x in values]
        for i, dataset in enumerate(("avenue", "shanghaitech", "ucsd")):  # the paper's order
            table[(model, int(layers), float(gamma), dataset)] = (v[2 * i], v[2 * i + 1])
    return table


PAPER_TABLE3 = _paper_table()


# --------------------------------------------------------------------------------------------------
# Flags
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Table3Config:
    """Flags of ``python -m experiments.video_table``."""

    scale: str = flag(
        "tiny",
        "tiny: generated copies of the three datasets in their real layouts under <out>/data, "
        "small settings, a few minutes on a CPU; paper: the real datasets under --data-root, "
        "800 steps, 5 seeds",
    )
    data_root: str | None = flag(
        None,
        "--scale paper: folder holding UCSD_Anomaly_Dataset.v1p2, 'Avenue Dataset' and "
        "shanghaitech as their archives extract",
    )
    out: str | None = flag(
        None,
        "output folder (default: a fresh runs/video_table-<time>); rerun the same command with "
        "the same --out to reuse finished sub-runs and resume interrupted ones",
    )
    models: tuple[str, ...] = flag(
        ("dust", "ut"),
        "models: dust (also trains the ERM control dust-pl), ut, vit (a pretrained ViT "
        "fine-tuned as a denoiser, its depth its own)",
    )
    vit_checkpoint: str | None = flag(
        None,
        "Hugging Face ViT folder for --models vit (the paper: google/vit-base-patch16-224); "
        "--scale tiny without it writes a random-weight tiny ViT in that layout",
    )
    layers: tuple[int, ...] = flag((3, 5, 7), "depths L")
    datasets: tuple[str, ...] = flag(DATASETS, "datasets: " + ", ".join(DATASETS))
    gamma_trains: tuple[float, ...] = flag(GAMMA_TRAINS, "training perturbation levels γ_train")
    headline_gamma: float = flag(0.15, "the γ_train of the headline table and the figures")
    sweep: tuple[str, ...] = flag(
        (),
        "NAME=V1,V2,...: also sweep NAME (" + ", ".join(HPARAMS) + ") in every sub-run; "
        "a single value fixes it (e.g. epsilon=0.05)",
        repeat=True,
    )
    seeds: int | None = flag(None, "seeds per setting (default: tiny 1, paper 5)")
    steps: int | None = flag(None, "training steps per run (default: tiny 60, paper 800)")
    batch_size: int | None = flag(None, "examples per batch (default 32)")
    test_gammas: tuple[float, ...] | None = flag(
        None,
        "test perturbation levels, joined with every γ_train (default: paper 0 to 4x the "
        "headline γ_train, 0, 0.5, 1, 1.5, 2, 3, 4 times it; tiny 0, 0.15, 0.3, 0.45, 0.6)",
    )
    tolerance: float | None = flag(
        None, "feasibility tolerance on validation data (default: the runner's, 0.05)"
    )
    max_videos: int | None = flag(None, "read at most this many videos per split")
    devices: int | None = flag(None, "use at most this many devices (default: every visible one)")
    overwrite: bool = flag(False, "retrain every sub-run, discarding results already in --out")

    def __post_init__(self):
        def need(ok, message):
            if not ok:
                raise UsageError(message)

        need(self.scale in SCALES, f"--scale must be tiny or paper, got {self.scale!r}")
        bad = [d for d in self.datasets if d not in DATASETS]
        need(
            not bad,
            f"--datasets: unknown dataset {bad[0] if bad else ''!r}: choose from "
            + ", ".join(DATASETS),
        )
        need(
            self.vit_checkpoint is None or "vit" in self.models,
            "--vit-checkpoint is read with --models ...,vit only: add vit to --models or drop it",
        )
        need(
            self.scale == "tiny" or "vit" not in self.models or self.vit_checkpoint,
            "--scale paper --models vit needs --vit-checkpoint FOLDER (a Hugging Face ViT "
            "folder, e.g. google/vit-base-patch16-224)",
        )
        bad = [m for m in self.models if m not in TABLE_MODELS]
        need(
            not bad,
            f"--models: unknown model {bad[0] if bad else ''!r}: choose from "
            f"{', '.join(TABLE_MODELS)} ({CONTROL} rows come with dust)",
        )
        need(
            all(n >= 1 for n in self.layers),
            f"--layers must all be >= 1, got {','.join(map(str, self.layers))}",
        )
        grid.check_grid_flags(self, need, ("seeds", "steps", "batch_size", "max_videos", "devices"))
        need(
            self.scale == "paper" or self.data_root is None,
            "--data-root is read by --scale paper only (--scale tiny writes its own data under "
            "<out>/data): drop --data-root or pass --scale paper",
        )
        # Unique values, in the order given (a repeated value would be a second sub-run).
        for name in ("datasets", "models", "layers", "gamma_trains"):
            object.__setattr__(self, name, grid.unique(getattr(self, name)))


# --------------------------------------------------------------------------------------------------
# Plan: one sub-run per (dataset, L)
# --------------------------------------------------------------------------------------------------


def data_dirs(opts: Table3Config, out: Path) -> dict[str, Path]:
    """The folder of each dataset: under ``--data-root`` (paper) or ``<out>/data`` (tiny)."""
    root = Path(opts.data_root).expanduser() if opts.scale == "paper" else out / "data"
    return {d: root / FOLDERS[d] for d in opts.datasets}


def check_data_root(opts: Table3Config) -> None:
    """``--scale paper``: every requested dataset folder is there (one DataError line if not);
    ``--vit-checkpoint`` a model folder."""
    if opts.vit_checkpoint is not None:
        folder = Path(opts.vit_checkpoint).expanduser()
        if not (folder / "config.json").is_file():
            raise DataError(
                f"--vit-checkpoint '{folder}' holds no config.json: pass a Hugging Face ViT "
                "folder (config.json, model.safetensors)"
            )
    if opts.scale != "paper":
        return
    if opts.data_root is None:
        raise UsageError(
            "--scale paper needs --data-root DIR holding "
            + ", ".join(repr(FOLDERS[d]) for d in opts.datasets)
            + " as their archives extract: pass --data-root, or --scale tiny for generated data"
        )
    root = Path(opts.data_root).expanduser()
    if not root.is_dir():
        raise DataError(
            f"--data-root '{root}' {'is not a folder' if root.exists() else 'does not exist'}: "
            "pass the folder holding " + ", ".join(repr(FOLDERS[d]) for d in opts.datasets)
        )
    markers = {
        "ucsd": None,  # UCSDped1/, UCSDped2/ (the reader finds them)
        "avenue": ("training_videos", "testing_videos"),
        "shanghaitech": ("training/videos", "testing/frames"),
    }
    for d in opts.datasets:
        top = root / FOLDERS[d]
        if not top.is_dir():
            raise DataError(
                f"--data-root '{root}' has no '{FOLDERS[d]}' folder for dataset {d}: extract "
                f"the {NAMES[d]} archive there, or drop {d} from --datasets"
            )
        if d == "ucsd" and not any(
            p.is_dir() and p.name.lower().startswith(("ucsdped", "train")) for p in top.iterdir()
        ):
            raise DataError(
                f"'{top}' has no UCSDped1/ or UCSDped2/ folder: extract the whole UCSD archive "
                f"there (expected {top}/UCSDped2/Train/Train001/001.tif)"
            )
        for sub in markers[d] or ():
            if not (top / sub).is_dir():
                raise DataError(
                    f"'{top}' has no {sub}/ folder: extract the whole {NAMES[d]} archive there "
                    f"(expected {top}/{sub}/)"
                )


def plan(opts: Table3Config, out: Path) -> list[SubRun]:
    """The sub-runs (dataset-major), their configs checked before anything is written."""
    scale = SCALES[opts.scale]
    dirs = data_dirs(opts, out)
    test_gammas = (
        opts.test_gammas or scale["test_gammas"] or tuple(test_gamma_grid(opts.headline_gamma))
    )
    subs = []
    unrolled = tuple(m for m in opts.models if m in UNROLLED)
    for dataset in opts.datasets:
        for layers in opts.layers if unrolled else ():
            sub_out = out / f"{dataset}-L{layers}"
            kw = dict(
                dataset=dataset,
                data_dir=str(dirs[dataset]),
                layers=layers,
                models=unrolled,
                sweep=(f"gamma_train={fmt(opts.gamma_trains)}", *opts.sweep),
                gamma_train=opts.headline_gamma,  # the sub-run's own plots mark this γ
                test_gammas=tuple(test_gammas),
                seeds=opts.seeds or scale["seeds"],
                steps=opts.steps or scale["steps"],
                batch_size=opts.batch_size or scale["batch_size"],
                max_videos=opts.max_videos,
                devices=opts.devices,
                out=str(sub_out),
                overwrite=opts.overwrite,
                **scale["video"],
            )
            if opts.tolerance is not None:
                kw["tolerance"] = opts.tolerance
            try:
                cfg = VideoConfig(**kw)
            except ValueError as e:
                raise UsageError(str(e)) from None
            subs.append(SubRun(f"{dataset}-L{layers}", (dataset, layers), cfg, sub_out))
        if "vit" in opts.models:
            subs.append(_vit_subrun(opts, out, dataset, dirs[dataset], test_gammas))
    return subs


def vit_folder(opts: Table3Config, out: Path) -> Path:
    """The ViT to fine-tune: ``--vit-checkpoint``, or (tiny) the stand-in under <out>/data."""
    if opts.vit_checkpoint is not None:
        return Path(opts.vit_checkpoint).expanduser()
    return out / "data" / "vit-tiny-random"


def _vit_subrun(opts: Table3Config, out: Path, dataset: str, data_dir: Path, test_gammas):
    """One sub-run per dataset: the ViT (ERM and constrained) at every γ_train."""
    scale = SCALES[opts.scale]
    sub_out = out / f"{dataset}-vit"
    kw = dict(
        dataset=dataset,
        data_dir=str(data_dir),
        models=("vit",),
        vit_checkpoint=str(vit_folder(opts, out)),
        sweep=(f"gamma_train={fmt(opts.gamma_trains)}", *opts.sweep),
        gamma_train=opts.headline_gamma,
        test_gammas=tuple(test_gammas),
        seeds=opts.seeds or scale["seeds"],
        steps=opts.steps or scale["steps"],
        batch_size=opts.batch_size or scale["batch_size"],
        max_videos=opts.max_videos,
        devices=opts.devices,
        out=str(sub_out),
        overwrite=opts.overwrite,
        **{k: v for k, v in scale["video"].items() if k != "dust_atoms"},
    )
    if opts.tolerance is not None:
        kw["tolerance"] = opts.tolerance
    try:
        cfg = VideoConfig(**kw)
    except ValueError as e:
        raise UsageError(str(e)) from None
    return SubRun(f"{dataset}-vit", (dataset, "vit"), cfg, sub_out)


# --------------------------------------------------------------------------------------------------
# Tiny datasets
# --------------------------------------------------------------------------------------------------


def build_tiny_datasets(root: Path, datasets, *, overwrite: bool = False) -> dict[str, Path]:
    """Tiny copies of ``datasets`` in their real layouts under ``root``, from synthetic video
    (one scene seed per dataset); a complete copy of the same spec is kept. Each is written to
    a temporary folder, then renamed, so a killed job never leaves half a dataset."""
    spec = SCALES["tiny"]["data"]
    root.mkdir(parents=True, exist_ok=True)
    made = {}
    for d in datasets:
        from cudt.data.video import synthetic_videos

        top = root / FOLDERS[d]
        marker = root / f".{d}.json"
        want = dict(spec, seed=TINY_SEEDS[d], layout=FOLDERS[d])
        if not overwrite and top.is_dir() and marker.exists():
            try:
                if json.loads(marker.read_text()) == want:
                    made[d] = top
                    continue
            except (OSError, ValueError):
                pass
        n_train, n_test = spec["train_videos"], spec["test_videos"]
        videos = synthetic_videos(n_train + n_test, spec["frames"], seed=TINY_SEEDS[d])
        tmp = root / f".tmp-{d}"
        shutil.rmtree(tmp, ignore_errors=True)
        written = WRITERS[d](tmp, {"train": list(videos[:n_train]), "test": list(videos[n_train:])})
        marker.unlink(missing_ok=True)
        shutil.rmtree(top, ignore_errors=True)
        written.rename(top)
        shutil.rmtree(tmp, ignore_errors=True)
        marker.write_text(json.dumps(want))
        made[d] = top
    return made


# --------------------------------------------------------------------------------------------------
# Best runs, tables
# --------------------------------------------------------------------------------------------------


def best_rows(results: dict[tuple[str, int], dict]) -> list[dict]:
    """One row per (dataset, model, L, kind, γ_train): its best run (the runner's ``best`` mark)
    or, where no run is eligible, its status (``diverged``: every run diverged; ``infeasible``)."""
    rows = []
    for (dataset, depth), res in results.items():
        settings: dict[tuple, list[dict]] = defaultdict(list)
        for r in res["runs"]:  # the depth of a ViT is its checkpoint's: read it from the runs
            settings[
                (r["model"], int(r["layers"]), r["constrained"], float(r["gamma_train"]))
            ].append(r)
        for (model, layers, constrained, gamma), runs in settings.items():
            b, status = grid.best_of_setting(runs, constrained, score="val_objective", higher=False)
            row = {
                "dataset": dataset,
                "model": model,
                "layers": layers,
                "kind": KIND[constrained],
                "gamma_train": gamma,
                **status,
                "sub_run": f"{dataset}-vit" if depth == "vit" else f"{dataset}-L{layers}",
            }
            if b is not None:
                test_gamma = [float(g) for g in b["test_gamma"]]
                rmse = [math.nan if v is None else float(v) for v in b["rmse"]]
                row |= {
                    "mean_rmse": float(b["mean_rmse"]),
                    "rmse_at_gamma_train": rmse[test_gamma.index(gamma)],
                    "feasible": bool(b["feasible"]),
                    "peak_lambda": grid.peak(b["max_multipliers"]),
                    "val_objective": float(b["val_objective"]),
                    "seed": int(b["seed"]),
                    "label": b["label"],
                    **{n: b["hparams"].get(n) for n in HPARAMS},
                    # for the figures (not in the CSV)
                    "test_gamma": test_gamma,
                    "rmse": rmse,
                    "layer_loss": b["layer_loss"][test_gamma.index(gamma)],
                }
            rows.append(row)
    order = {m: i for i, m in enumerate(("dust", CONTROL, "ut", "vit"))}
    rows.sort(
        key=lambda r: (
            r["dataset"],
            order.get(r["model"], 9),
            r["layers"],
            r["kind"],
            r["gamma_train"],
        )
    )
    return rows


CSV_COLUMNS = (
    "dataset",
    "model",
    "layers",
    "kind",
    "gamma_train",
    "status",
    "mean_rmse",
    "rmse_at_gamma_train",
    "feasible",
    "peak_lambda",
    "val_objective",
    "seed",
    *HPARAMS,
    "runs",
    "diverged_runs",
    "infeasible_runs",
    "label",
    "sub_run",
)


def csv_text(rows: list[dict]) -> str:
    return grid.csv_text(rows, CSV_COLUMNS)


def _index(rows):
    return {(r["dataset"], r["model"], r["layers"], r["kind"], r["gamma_train"]): r for r in rows}


def _cell(row: dict | None) -> str:
    if row is None:
        return "—"
    if row["status"] == "ok":
        return f"{row['mean_rmse']:.3f}"
    if "mean_rmse" in row:  # infeasible: the best of the infeasible runs, not eligible
        return f"{row['status']} ({row['mean_rmse']:.3f})"
    return row["status"]


def _depths(rows, model: str, layers) -> list[int]:
    """The depths of ``model``'s rows: ``layers`` for the unrolled models, the ViT's own."""
    if model != "vit":
        return list(layers)
    return sorted({r["layers"] for r in rows if r["model"] == "vit"})


def _row_models(models) -> list[str]:
    """dust, ut, then the control rows."""
    names = [m for m in models if m != CONTROL]
    return names + ([CONTROL] if "dust" in names else [])


def _pair_cells(c: dict | None, e: dict | None) -> tuple[str, str]:
    cc, ec = _cell(c), _cell(e)
    if c and e and c["status"] == "ok" and e["status"] == "ok":
        cv, ev = round(c["mean_rmse"], 3), round(e["mean_rmse"], 3)
        if cv <= ev:
            cc = f"**{cc}**"
        if ev <= cv:
            ec = f"**{ec}**"
    return cc, ec


def _table_lines(rows, datasets, models, layers, gammas, *, label_gamma: bool) -> list[str]:
    idx = _index(rows)
    head = ["model"] + (["γ_train"] if label_gamma else [])
    for d in datasets:
        head += [f"{NAMES[d]} constr.", f"{NAMES[d]} ERM"]
    lines = [
        "| " + " | ".join(head) + " |",
        "|" + "|".join(["---"] * (1 + label_gamma) + ["---:"] * (2 * len(datasets))) + "|",
    ]
    for model in _row_models(models):
        for L in _depths(rows, model, layers):
            for g in gammas:
                cells = [f"{model}-{L}"] + ([f"{g:g}"] if label_gamma else [])
                for d in datasets:
                    c = idx.get((d, model, L, "constrained", g))
                    e = idx.get((d, model, L, "ERM", g))
                    cells += list(_pair_cells(c, e))
                lines.append("| " + " | ".join(cells) + " |")
    return lines


def _wins(rows, datasets, models, layers, gamma):
    """(constrained lower, cells with both numbers) per L, over models × datasets."""
    idx = _index(rows)
    out = {}
    for L in layers:
        wins = both = 0
        for m in models:
            if m == CONTROL:
                continue
            for d in datasets:
                c, e = idx.get((d, m, L, "constrained", gamma)), idx.get((d, m, L, "ERM", gamma))
                if c and e and c["status"] == "ok" and e["status"] == "ok":
                    both += 1
                    wins += c["mean_rmse"] < e["mean_rmse"]
        out[L] = (wins, both)
    return out


def headline_markdown(rows, datasets, models, layers, gamma, test_gammas) -> str:
    """The headline table at γ_train = ``gamma`` (Markdown), with its legend and counts."""
    lines = [
        f"### Table 3: mean test RMSE (0-255) over test γ ∈ {{{fmt(test_gammas)}}}, "
        f"γ_train = {gamma:g}",
        "",
        *_table_lines(rows, datasets, models, layers, [gamma], label_gamma=False),
        "",
        "Best run per cell by validation RMSE among non-diverged runs, feasible ones for "
        "constrained; **bold**: the lower of constrained and ERM; `infeasible`: no constrained "
        "run met its constraints on validation data; `diverged`: every run diverged; "
        f"{CONTROL}: ERM DUST with one dictionary per layer (the constrained model's "
        "architecture), the control.",
    ]
    wins = _wins(rows, datasets, models, layers, gamma)
    total_w, total_b = sum(w for w, _ in wins.values()), sum(b for _, b in wins.values())
    per_l = ", ".join(f"L={L}: {w}/{b}" for L, (w, b) in wins.items())
    lines.append(
        f"\nConstrained lower than ERM in {total_w} of {total_b} model×dataset cells with both "
        f"numbers ({per_l})."
    )
    return "\n".join(lines)


def paper_direction_markdown(rows, datasets, models, layers, gamma) -> str:
    """Per cell: which of constrained (C) / ERM (E) is lower here and in the paper's table.

    Cells whose constrained runs are all infeasible are counted apart, by the number of the best
    infeasible run (``infeasible (C)``): they are not eligible for the table's comparison."""
    idx = _index(rows)
    head = ["model"] + [NAMES[d] for d in datasets]
    lines = [
        f"### Direction against the paper's table (appendix B.4), γ_train = {gamma:g}",
        "",
        "Cell: the lower of constrained (C) and ERM (E) here / in the paper (=: equal to 3 "
        "decimals, not counted); ✓ same direction; "
        "`infeasible (C)`: no feasible constrained run, the best infeasible one's direction.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "|".join(["---"] * len(head)) + "|",
    ]
    counts = {"eligible": [0, 0, 0, 0], "infeasible": [0, 0, 0, 0]}  # agree, n, ours C, paper C
    for m in [m for m in models if m != CONTROL]:
        for L in _depths(rows, m, layers):
            cells = [f"{m}-{L}"]
            for d in datasets:  # the paper's ViT is ViT-Base (12 blocks), whatever ours is
                paper = PAPER_TABLE3.get((m, PAPER_VIT_LAYERS if m == "vit" else L, gamma, d))
                c, e = idx.get((d, m, L, "constrained", gamma)), idx.get((d, m, L, "ERM", gamma))
                p = "—" if paper is None else ("C" if paper[0] < paper[1] else "E")
                o, group = "—", None
                if c and e and e["status"] == "ok" and "mean_rmse" in c:
                    diff = round(c["mean_rmse"], 3) - round(e["mean_rmse"], 3)
                    o = "=" if diff == 0 else ("C" if diff < 0 else "E")
                    group = "eligible" if c["status"] == "ok" else "infeasible"
                lost = [r["status"] for r in (c, e) if r and r["status"] != "ok"]
                shown = o if group == "eligible" else (f"{lost[0]} ({o})" if o != "—" else None)
                shown = shown or (lost[0] if lost else "—")
                mark = ""
                if group and o != "=" and p in ("C", "E"):
                    n = counts[group]
                    n[0] += o == p
                    n[1] += 1
                    n[2] += o == "C"
                    n[3] += p == "C"
                    mark = " ✓" if o == p else " ✗"
                cells.append(f"{shown} / {p}{mark}")
            lines.append("| " + " | ".join(cells) + " |")
    agree, n, ours, paper = counts["eligible"]
    lines.append(
        f"\nEligible cells: same direction in {agree} of {n}; constrained lower in {ours} of "
        f"them here, {paper} in the paper."
    )
    agree, n, ours, paper = counts["infeasible"]
    if n:
        lines.append(
            f"Cells without a feasible constrained run (best infeasible run): same direction in "
            f"{agree} of {n}; constrained lower in {ours} here, {paper} in the paper."
        )
    return "\n".join(lines)


def table_markdown(
    rows, opts: Table3Config, test_gammas, wall: float, note: str, trained_seconds: float
) -> str:
    datasets, models, layers = opts.datasets, opts.models, opts.layers
    parts = [
        f"# Video grid (the paper's Table 3), --scale {opts.scale}",
        "",
        note,
        "",
        headline_markdown(rows, datasets, models, layers, opts.headline_gamma, test_gammas),
        "",
        paper_direction_markdown(rows, datasets, models, layers, opts.headline_gamma),
        "",
        "### Every γ_train",
        "",
        *_table_lines(rows, datasets, models, layers, list(opts.gamma_trains), label_gamma=True),
        "",
        f"Wall time of the job that wrote this: {wall:.0f} s (sub-runs' own wall times, "
        f"summed: {trained_seconds:.0f} s).",
    ]
    return "\n".join(parts) + "\n"


# --------------------------------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------------------------------

STYLE = {
    "ERM": {"color": "tab:blue", "marker": "o", "label": "ERM"},
    "constrained": {"color": "tab:red", "marker": "s", "label": "constrained"},
    CONTROL: {"color": "tab:green", "marker": "^", "label": "control: ERM, per-layer dict."},
}


def _series(idx, d, m, L, g):
    """(style key, row) of the lines of one panel: ERM, constrained, and DUST's control."""
    out = [
        ("ERM", idx.get((d, m, L, "ERM", g))),
        ("constrained", idx.get((d, m, L, "constrained", g))),
    ]
    if m == "dust":
        out.append((CONTROL, idx.get((d, CONTROL, L, "ERM", g))))
    return [(k, r) for k, r in out if r is not None]


def _draw(ax, key, row, x, y, ms=4) -> None:
    """One best run as a line (:func:`cudt.grid.draw_line`)."""
    grid.draw_line(ax, STYLE[key], row, x, y, has_value="mean_rmse" in row, ms=ms)


def _legend_note(fig) -> None:
    grid.figure_note(
        fig,
        "best run per setting by validation RMSE; dashed: no feasible constrained run (the best "
        "infeasible one shown)",
    )


def plot_fig2(rows, opts, path: Path) -> None:
    """RMSE vs test γ of the best runs at the headline γ_train, L = 3 (or the shallowest)."""
    idx, g = _index(rows), opts.headline_gamma
    shallow = 3 if 3 in opts.layers else min(opts.layers)
    models = [m for m in opts.models if m != CONTROL]
    fig, axes = grid_axes(len(opts.datasets), len(models), w=4.4, h=3.1)
    for i, d in enumerate(opts.datasets):
        for j, m in enumerate(models):
            ax = axes[i, j]
            L = (_depths(rows, m, opts.layers) or [0])[0] if m == "vit" else shallow
            for key, row in _series(idx, d, m, L, g):
                _draw(ax, key, row, row.get("test_gamma"), row.get("rmse"))
            ax.axvline(g, color="k", lw=0.8, ls=":")
            lo, hi = ax.get_xlim()
            ax.axvspan(g, hi, color="0.94", zorder=0)
            ax.set_xlim(lo, hi)
            ax.text(0.98, 0.04, "OOD", transform=ax.transAxes, ha="right", fontsize=8, color="0.4")
            ax.set_title(f"{NAMES[d]} · {m.upper()}-{L}", fontsize=10)
            ax.set_xlabel("test γ")
            ax.set_ylabel("RMSE (0-255)")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7, loc="upper left")
    fig.suptitle(
        f"Fig. 2: test RMSE vs test γ, γ_train = {g:g} (dotted line; shaded: OOD)", fontsize=11
    )
    _legend_note(fig)
    save_figure(fig, path)


def plot_fig3(rows, opts, path: Path) -> None:
    """Mean RMSE over the test γ grid vs depth L, per dataset and model, at the headline γ."""
    idx, g = _index(rows), opts.headline_gamma
    models = [m for m in opts.models if m in UNROLLED]  # the ViT's depth is not varied
    layers = sorted(opts.layers)
    fig, axes = grid_axes(len(opts.datasets), len(models), w=4.2, h=3.0)
    for i, d in enumerate(opts.datasets):
        for j, m in enumerate(models):
            ax = axes[i, j]
            keys = ["ERM", "constrained"] + ([CONTROL] if m == "dust" else [])
            for key in keys:
                model, kind = (CONTROL, "ERM") if key == CONTROL else (m, key)
                found = {L: idx.get((d, model, L, kind, g)) for L in layers}
                found = {L: r for L, r in found.items() if r is not None}
                s = STYLE[key]
                shown = {L: r for L, r in found.items() if "mean_rmse" in r}
                # feasible points joined by a solid line, infeasible ones as hollow markers
                ok = [L for L, r in shown.items() if r["status"] == "ok"]
                bad = [L for L, r in shown.items() if r["status"] != "ok"]
                lost = [f"L={L} {r['status']}" for L, r in found.items() if L not in shown]
                label = s["label"] + (f" ({', '.join(lost)})" if lost else "")
                if not ok and not lost:
                    label = None  # only infeasible points: named by their own entry
                ax.plot(
                    ok,
                    [shown[L]["mean_rmse"] for L in ok],
                    color=s["color"],
                    marker=s["marker"],
                    ms=6,
                    label=label,
                )
                if bad:
                    ax.plot(
                        bad,
                        [shown[L]["mean_rmse"] for L in bad],
                        ls="none",
                        marker=s["marker"],
                        ms=7,
                        mfc="none",
                        mec=s["color"],
                        label=f"{s['label']} (infeasible)",
                    )
            ax.set_xticks(layers)
            ax.set_title(f"{NAMES[d]} · {m.upper()}", fontsize=10)
            ax.set_xlabel("layers L")
            ax.set_ylabel("mean RMSE over test γ")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
    fig.suptitle(f"Fig. 3: mean test RMSE vs depth, γ_train = {g:g}", fontsize=11)
    grid.figure_note(
        fig,
        "best run per setting by validation RMSE; hollow: no feasible constrained run (the best "
        "infeasible one shown)",
    )
    save_figure(fig, path)


def plot_fig7(rows, opts, path: Path) -> None:
    """Mean test loss per layer at the headline γ_train, one panel per (dataset, model) × L."""
    idx, g = _index(rows), opts.headline_gamma
    models = [m for m in opts.models if m in UNROLLED]
    layers = sorted(opts.layers)
    pairs = [(d, m) for d in opts.datasets for m in models]
    fig, axes = grid_axes(len(pairs), len(layers), w=3.7, h=2.6)
    for i, (d, m) in enumerate(pairs):
        for j, L in enumerate(layers):
            ax = axes[i, j]
            for key, row in _series(idx, d, m, L, g):
                loss = row.get("layer_loss")
                x = None if loss is None else np.arange(len(loss))
                _draw(ax, key, row, x, loss, ms=3)
            ax.set_yscale("log")
            ax.set_xticks(range(L + 1))
            ax.set_title(f"{NAMES[d]} · {m.upper()}-{L}", fontsize=9)
            ax.grid(True, which="both", alpha=0.3)
            if j == 0:
                ax.set_ylabel("mean test loss ℓ_l")
            if i == len(pairs) - 1:
                ax.set_xlabel("layer l (0: the noisy input)")
            ax.legend(fontsize=6)
    fig.suptitle(f"Fig. 7: mean test loss per layer at γ_train = {g:g}, log scale", fontsize=11)
    _legend_note(fig)
    save_figure(fig, path)


# --------------------------------------------------------------------------------------------------
# The job
# --------------------------------------------------------------------------------------------------


def run_table(opts: Table3Config) -> dict[str, Any]:
    """Trains (or reuses) every sub-run, then writes the table, CSV and figures; returns
    ``{"rows", "markdown", "paths", "trained", "reused", "wall_seconds"}``."""
    t0 = time.perf_counter()
    check_data_root(opts)
    out = Path(opts.out) if opts.out else fresh_run_dir("video_table")
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file, not a folder: pass a folder path")
    subs = plan(opts, out)
    for sub in subs:  # every refusal before anything is written or trained
        check_subrun(sub, opts.overwrite)
    todo = [s for s in subs if not s.finished]
    print(
        f"video table: {len(subs)} sub-runs under {out} ({len(subs) - len(todo)} finished, "
        f"reused; {len(todo)} to train); rerun this command with --out {out} to resume"
    )
    if opts.scale == "tiny":
        t = time.perf_counter()
        build_tiny_datasets(out / "data", opts.datasets, overwrite=opts.overwrite)
        if "vit" in opts.models and opts.vit_checkpoint is None:
            folder = vit_folder(opts, out)
            if not (folder / "model.safetensors").is_file():
                tmp = folder.with_name(f".tmp-{folder.name}")
                shutil.rmtree(tmp, ignore_errors=True)
                write_vit_folder(tmp, **TINY_VIT)
                tmp.rename(folder)
        print(
            f"tiny datasets in their real layouts under {out / 'data'} ({time.perf_counter() - t:.1f}s)"
        )
    results = grid.train_subruns(subs, VideoTask)
    rows = best_rows(results)
    test_gammas = results[subs[0].key]["config"]["test_gamma"]
    wall = time.perf_counter() - t0
    trained = len(todo)
    note = (
        f"{len(subs)} sub-runs ({trained} trained, {len(subs) - trained} reused), "
        f"{subs[0].cfg.steps} steps, {subs[0].cfg.seeds} seed(s), γ_train ∈ "
        f"{{{fmt(opts.gamma_trains)}}}"
        + (f", sweeps {'; '.join(opts.sweep)}" if opts.sweep else "")
        + f"; data: {'generated tiny copies' if opts.scale == 'tiny' else opts.data_root}."
    )
    trained_seconds = sum(float(r.get("wall_seconds") or 0) for r in results.values())
    markdown = table_markdown(rows, opts, test_gammas, wall, note, trained_seconds)
    paths = {
        "csv": out / "table3.csv",
        "md": out / "table3.md",
        "fig2": out / "fig2_rmse_vs_gamma.png",
    }
    write_text(paths["csv"], csv_text(rows))
    write_text(paths["md"], markdown)
    plot_fig2(rows, opts, paths["fig2"])
    if any(m in UNROLLED for m in opts.models):  # depth study, per-layer loss per depth
        paths["fig3"] = out / "fig3_depth.png"
        paths["fig7"] = out / "fig7_layer_loss.png"
        plot_fig3(rows, opts, paths["fig3"])
        plot_fig7(rows, opts, paths["fig7"])
    wall = time.perf_counter() - t0
    print()
    print(
        headline_markdown(
            rows, opts.datasets, opts.models, opts.layers, opts.headline_gamma, test_gammas
        )
    )
    print()
    print(
        paper_direction_markdown(rows, opts.datasets, opts.models, opts.layers, opts.headline_gamma)
    )
    print()
    print(f"wrote {', '.join(str(p) for p in paths.values())}")
    print(
        f"video table: {len(subs)} sub-runs ({trained} trained, {len(subs) - trained} reused) in {wall:.0f}s wall"
    )
    return {
        "rows": rows,
        "markdown": markdown,
        "paths": paths,
        "trained": trained,
        "reused": len(subs) - trained,
        "wall_seconds": wall,
    }
