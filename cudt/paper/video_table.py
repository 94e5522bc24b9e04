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
(:mod:`cudt.data.video.archives`), read back through the real readers.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from cudt.data.video import archives
from cudt.errors import DataError, UsageError
from cudt.models.vit import write_vit_folder
from cudt.paper import figures as figs
from cudt.paper import job as grid
from cudt.paper import rows as table_rows
from cudt.paper.figures import grid_axes, save_figure
from cudt.paper.job import SubRun
from cudt.paper.rows import fmt
from cudt.runner.config import flag
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
FOLDERS = {"ucsd": archives.UCSD, "avenue": archives.AVENUE, "shanghaitech": archives.SHANGHAITECH}
WRITERS = {
    "ucsd": archives.write_ucsd,
    "avenue": archives.write_avenue,
    "shanghaitech": archives.write_shanghaitech,
}
GAMMA_TRAINS = (0.0, 0.09, 0.11, 0.13, 0.15)
HPARAMS = table_rows.HPARAMS

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


PAPER_TABLE3 = table_rows.paper_table(_PAPER_ROWS, ("avenue", "shanghaitech", "ucsd"))  # its order


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
    out: str | None = grid.out_flag("video_table")
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
    datasets: tuple[str, ...] = grid.datasets_flag(DATASETS)
    gamma_trains: tuple[float, ...] = flag(GAMMA_TRAINS, "training perturbation levels γ_train")
    headline_gamma: float = grid.headline_flag(0.15)
    sweep: tuple[str, ...] = grid.sweep_flag("epsilon=0.05")
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
    devices: int | None = grid.devices_flag()
    overwrite: bool = grid.overwrite_flag()

    def __post_init__(self):
        need = grid.need
        need(self.scale in SCALES, f"--scale must be tiny or paper, got {self.scale!r}")
        grid.check_known("datasets", "dataset", self.datasets, DATASETS)
        need(
            self.vit_checkpoint is None or "vit" in self.models,
            "--vit-checkpoint is read with --models ...,vit only: add vit to --models or drop it",
        )
        need(
            self.scale == "tiny" or "vit" not in self.models or self.vit_checkpoint,
            "--scale paper --models vit needs --vit-checkpoint FOLDER (a Hugging Face ViT "
            "folder, e.g. google/vit-base-patch16-224)",
        )
        hint = f" ({CONTROL} rows come with dust)"
        grid.check_known("models", "model", self.models, TABLE_MODELS, hint)
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
        grid.keep_unique(self)


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
        data = (dataset, dirs[dataset], test_gammas)
        for layers in opts.layers if unrolled else ():
            name = f"{dataset}-L{layers}"
            cfg = _config(opts, out / name, *data, layers=layers, models=unrolled, **scale["video"])
            subs.append(SubRun(name, (dataset, layers), cfg, out / name))
        if "vit" in opts.models:  # one sub-run per dataset: the ViT at every γ_train
            name = f"{dataset}-vit"
            video = {k: v for k, v in scale["video"].items() if k != "dust_atoms"}
            vit = str(vit_folder(opts, out))
            cfg = _config(opts, out / name, *data, models=("vit",), vit_checkpoint=vit, **video)
            subs.append(SubRun(name, (dataset, "vit"), cfg, out / name))
    return subs


def _config(opts: Table3Config, out: Path, dataset, data_dir, test_gammas, **fields):
    """The video task's config of one sub-run (:func:`cudt.paper.job.subrun_config`)."""
    scale = SCALES[opts.scale]
    return grid.subrun_config(
        VideoConfig,
        opts,
        out,
        dataset=dataset,
        data_dir=str(data_dir),
        test_gammas=tuple(test_gammas),
        seeds=opts.seeds or scale["seeds"],
        steps=opts.steps or scale["steps"],
        batch_size=opts.batch_size or scale["batch_size"],
        max_videos=opts.max_videos,
        **fields,
    )


def vit_folder(opts: Table3Config, out: Path) -> Path:
    """The ViT to fine-tune: ``--vit-checkpoint``, or (tiny) the stand-in under <out>/data."""
    if opts.vit_checkpoint is not None:
        return Path(opts.vit_checkpoint).expanduser()
    return out / "data" / "vit-tiny-random"


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

        def write(tmp: Path, d=d) -> Path:
            from cudt.data.video import synthetic_videos

            n_train, n_test = spec["train_videos"], spec["test_videos"]
            videos = synthetic_videos(n_train + n_test, spec["frames"], seed=TINY_SEEDS[d])
            return WRITERS[d](
                tmp, {"train": list(videos[:n_train]), "test": list(videos[n_train:])}
            )

        want = dict(spec, seed=TINY_SEEDS[d], layout=FOLDERS[d])
        made[d] = grid.keep_or_build(root, d, root / FOLDERS[d], want, write, overwrite=overwrite)
    return made


# --------------------------------------------------------------------------------------------------
# Best runs, tables
# --------------------------------------------------------------------------------------------------


def best_rows(results: dict[tuple[str, int], dict]) -> list[dict]:
    """One row per (dataset, model, L, kind, γ_train): its best run (the runner's ``best`` mark)
    or, where no run is eligible, its status (``diverged``: every run diverged; ``infeasible``)."""

    def fields(b: dict, i: int) -> dict[str, Any]:
        rmse = [table_rows.num(v) for v in b["rmse"]]
        return {
            "mean_rmse": float(b["mean_rmse"]),
            "rmse_at_gamma_train": rmse[i],
            "val_objective": float(b["val_objective"]),
            "rmse": rmse,  # for Figure 2 (not in the CSV)
        }

    rows = []
    for (dataset, depth), res in results.items():  # a ViT's depth is its checkpoint's
        sub_run = f"{dataset}-vit" if depth == "vit" else f"{dataset}-L{depth}"
        rows += table_rows.setting_rows(
            res, dataset, sub_run, score="val_objective", higher=False, fields=fields
        )
    return table_rows.sort_rows(rows, sorted(DATASETS), ("dust", CONTROL, "ut", "vit"))  # by name


CSV_COLUMNS = (
    *table_rows.SETTING_COLUMNS,
    "mean_rmse",
    "rmse_at_gamma_train",
    "feasible",
    "peak_lambda",
    "val_objective",
    "seed",
    *table_rows.RUN_COLUMNS,
)


def _depths(rows, model: str, layers) -> list[int]:
    """The depths of ``model``'s rows: ``layers`` for the unrolled models, the ViT's own."""
    if model != "vit":
        return list(layers)
    return sorted({r["layers"] for r in rows if r["model"] == "vit"})


def _row_models(models) -> list[str]:
    """dust, ut, then the control rows."""
    names = [m for m in models if m != CONTROL]
    return names + ([CONTROL] if "dust" in names else [])


def _table_rows(rows, models, layers) -> list[tuple[str, str, int]]:
    """(label, model, L) of the table's lines: dust, ut, the ViT at its own depth, the control."""
    return [(f"{m}-{L}", m, L) for m in _row_models(models) for L in _depths(rows, m, layers)]


def _table_lines(rows, datasets, models, layers, gammas, *, label_gamma: bool) -> list[str]:
    """Mean RMSE of constrained and ERM per dataset, the lower bold."""
    return table_rows.table_lines(
        rows,
        NAMES,
        datasets,
        _table_rows(rows, models, layers),
        gammas,
        metric="mean_rmse",
        higher=False,
        label_gamma=label_gamma,
    )


def _wins(rows, datasets, models, layers, gamma):
    """(constrained lower, cells with both numbers) per L, over models × datasets."""
    idx = table_rows.index_rows(rows)
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
    """Per cell: which of constrained (C) / ERM (E) is lower here and in the paper's table
    (:func:`cudt.paper.job.direction_markdown`); a cell without a feasible constrained run reads
    ``infeasible (C)``."""
    lines = [line for line in _table_rows(rows, models, layers) if line[1] != CONTROL]
    return table_rows.direction_markdown(
        rows,
        NAMES,
        datasets,
        lines,
        gamma,
        _paper_pair,
        metric="mean_rmse",
        higher=False,
        signed=False,
    )


def _paper_pair(model: str, L: int, gamma: float, dataset: str) -> tuple[float, float] | None:
    """The paper's (constrained, ERM) cell; its ViT is ViT-Base (12 blocks), whatever ours is."""
    return PAPER_TABLE3.get((model, PAPER_VIT_LAYERS if model == "vit" else L, gamma, dataset))


# --------------------------------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------------------------------

STYLE = figs.STYLE | {
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
    """One best run as a line (:func:`cudt.paper.job.draw_line`)."""
    figs.draw_line(ax, STYLE[key], row, x, y, has_value="mean_rmse" in row, ms=ms)


def _legend_note(fig) -> None:
    figs.figure_note(
        fig,
        "best run per setting by validation RMSE; dashed: no feasible constrained run (the best "
        "infeasible one shown)",
    )


def plot_fig2(rows, opts, path: Path) -> None:
    """RMSE vs test γ of the best runs at the headline γ_train, L = 3 (or the shallowest)."""
    idx, g = table_rows.index_rows(rows), opts.headline_gamma
    shallow = 3 if 3 in opts.layers else min(opts.layers)
    models = [m for m in opts.models if m != CONTROL]
    fig, axes = grid_axes(len(opts.datasets), len(models), w=4.4, h=3.1)
    for i, d in enumerate(opts.datasets):
        for j, m in enumerate(models):
            ax = axes[i, j]
            L = (_depths(rows, m, opts.layers) or [0])[0] if m == "vit" else shallow
            for key, row in _series(idx, d, m, L, g):
                _draw(ax, key, row, row.get("test_gamma"), row.get("rmse"))
            figs.mark_train_gamma(ax, g, label_y=0.04)
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
    idx, g = table_rows.index_rows(rows), opts.headline_gamma
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
    figs.figure_note(
        fig,
        "best run per setting by validation RMSE; hollow: no feasible constrained run (the best "
        "infeasible one shown)",
    )
    save_figure(fig, path)


def plot_fig7(rows, opts, path: Path) -> None:
    """Mean test loss per layer at the headline γ_train, one panel per (dataset, model) × L."""
    idx, g = table_rows.index_rows(rows), opts.headline_gamma
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


def prepare_tiny(opts: Table3Config, out: Path) -> None:
    """``--scale tiny``: the datasets in their real layouts under ``<out>/data``, and (with
    ``--models vit`` but no ``--vit-checkpoint``) a random-weight ViT folder."""
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


def figures(rows: list[dict], opts: Table3Config, out: Path) -> dict[str, Path]:
    """Figure 2, and with an unrolled model the depth study (3) and per-layer losses (7)."""
    paths = {"fig2": out / "fig2_rmse_vs_gamma.png"}
    plot_fig2(rows, opts, paths["fig2"])
    if any(m in UNROLLED for m in opts.models):
        paths["fig3"] = out / "fig3_depth.png"
        paths["fig7"] = out / "fig7_layer_loss.png"
        plot_fig3(rows, opts, paths["fig3"])
        plot_fig7(rows, opts, paths["fig7"])
    return paths


def _data_note(opts: Table3Config, cfg: VideoConfig) -> str:
    return f"data: {'generated tiny copies' if opts.scale == 'tiny' else opts.data_root}"


class VideoTableJob(grid.TableJob):
    name = "video table"
    table = "table3"
    title = "Video grid (the paper's Table 3)"
    csv_columns = CSV_COLUMNS

    def check(self, opts):
        check_data_root(opts)

    def plan(self, opts, out):
        return plan(opts, out)

    def prepare_tiny(self, opts, out):
        prepare_tiny(opts, out)

    def make_task(self):
        return VideoTask()

    def best_rows(self, results):
        return best_rows(results)

    def settings(self, opts, cfg):
        return f"{cfg.steps} steps, {cfg.seeds} seed(s)"

    def details(self, opts, cfg):
        return _data_note(opts, cfg)

    def headline(self, rows, opts, test_gammas):
        return headline_markdown(
            rows, opts.datasets, opts.models, opts.layers, opts.headline_gamma, test_gammas
        )

    def direction(self, rows, opts):
        return paper_direction_markdown(
            rows, opts.datasets, opts.models, opts.layers, opts.headline_gamma
        )

    def every_gamma(self, rows, opts):
        return _table_lines(
            rows, opts.datasets, opts.models, opts.layers, list(opts.gamma_trains), label_gamma=True
        )

    def figures(self, rows, opts, out):
        return figures(rows, opts, out)


def run_table(opts: Table3Config) -> dict[str, Any]:
    """Trains (or reuses) every sub-run, then writes the table, CSV and figures
    (:func:`cudt.paper.job.run_job`); returns ``{"rows", "markdown", "paths", "trained", "reused",
    "wall_seconds"}``."""
    return grid.run_job(VideoTableJob(), opts)
