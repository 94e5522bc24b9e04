"""The video grid's flags, datasets and sub-runs: Table 3's axes, the paper's own numbers, the
data folders (real archives, or tiny ones written in each archive's layout) and one sub-run per
(dataset, model, depth).
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from pathlib import Path
from typing import Any

from cudt.data.video import archives
from cudt.errors import DataError, UsageError
from cudt.models.vit import write_vit_folder
from cudt.runner.config import Needs, flag
from cudt.tasks.video import CONTROL, VideoConfig, test_gamma_grid
from experiments.paper import job as grid
from experiments.paper import rows as table_rows
from experiments.paper.job import SubRun

DATASETS = ("ucsd", "avenue", "shanghaitech")


UNROLLED = ("dust", "ut")  # depth = --layers
_LAYERS = (3, 5, 7)


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
    # test videos of 8 frames per dataset, 60 steps, one seed, 16 DUST atoms.
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


@dataclasses.dataclass(frozen=True)
class Table3Config:
    """Flags of ``python -m experiments.video_table``."""

    scale: str = flag(
        "tiny",
        "tiny: generated copies of the three datasets in their real layouts under <out>/data, "
        "small settings, a few minutes on a CPU; paper: the real datasets under --data-root, "
        "800 steps, 5 seeds",
    )
    data_root: str | None = grid.paper_data_flag(
        "folder holding UCSD_Anomaly_Dataset.v1p2, 'Avenue Dataset' and shanghaitech as their "
        "archives extract"
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
        needs=Needs(
            lambda o: "vit" in o.models,
            "--vit-checkpoint is read with --models ...,vit only: add vit to --models or drop it",
        ),
    )
    layers: tuple[int, ...] = flag(
        _LAYERS,
        "depths L of dust and ut",
        needs=Needs(  # the ViT's depth is its checkpoint's
            lambda o: any(m in UNROLLED for m in o.models),
            "--layers sets the depths of dust and ut, and --models vit trains neither (the ViT "
            "keeps its checkpoint's depth): drop --layers or add dust or ut to --models",
        ),
    )
    datasets: tuple[str, ...] = grid.datasets_flag(DATASETS)
    gamma_trains: tuple[float, ...] = flag(GAMMA_TRAINS, "training perturbation levels γ_train")
    headline_gamma: float = grid.headline_flag(0.15)
    sweep: tuple[str, ...] = grid.sweep_flag("epsilon=0.05", VideoConfig)
    seeds: int | None = grid.seeds_flag()
    steps: int | None = flag(None, "training steps per run (default: tiny 60, paper 800)")
    batch_size: int | None = flag(None, "examples per batch (default 32)")
    test_gammas: tuple[float, ...] | None = grid.test_gammas_flag(
        "paper 0 to 4x the largest γ_train, 0, 0.5, 1, 1.5, 2, 3, 4 times it; tiny 0, 0.15, "
        "0.3, 0.45, 0.6"
    )
    tolerance: float | None = grid.tolerance_flag(f"the video task's, {VideoConfig.tolerance:g}")
    max_videos: int | None = flag(
        None,
        "read at most this many training and this many test videos of each dataset (the first "
        "by name), per camera of a UCSD folder holding both UCSDped1 and UCSDped2",
    )
    devices: int | None = grid.devices_flag()
    figures: bool = grid.figures_flag("the table's figures")
    overwrite: bool = grid.overwrite_flag()

    def __post_init__(self):
        need = grid.need
        need(self.scale in SCALES, f"--scale must be tiny or paper, got {self.scale!r}")
        grid.check_known("datasets", "dataset", self.datasets, DATASETS)
        grid.check_needs(self)  # --vit-checkpoint, --layers, --data-root: where they act
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
        grid.check_grid_flags(
            self, need, ("seeds", "steps", "batch_size", "max_videos", "devices"), VideoConfig
        )
        grid.keep_unique(self)


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
        # relative to the largest γ_train, not to --headline-gamma (reporting only: moving it
        # re-reports a finished --out); by default the same level, 0.15
        opts.test_gammas or scale["test_gammas"] or tuple(test_gamma_grid(max(opts.gamma_trains)))
    )
    subs = []
    unrolled = tuple(m for m in opts.models if m in UNROLLED)
    for dataset in opts.datasets:
        data = (dataset, dirs[dataset], test_gammas)
        for layers in opts.layers if unrolled else ():
            name = f"{dataset}-L{layers}"
            video = {
                k: v for k, v in scale["video"].items() if k != "dust_atoms" or "dust" in unrolled
            }
            cfg = _config(opts, out / name, *data, layers=layers, models=unrolled, **video)
            subs.append(SubRun(name, (dataset, layers), cfg, out / name))
        if "vit" in opts.models:  # one sub-run per dataset: the ViT at every γ_train
            name = f"{dataset}-vit"
            video = {k: v for k, v in scale["video"].items() if k != "dust_atoms"}
            vit = str(vit_folder(opts, out))
            cfg = _config(opts, out / name, *data, models=("vit",), vit_checkpoint=vit, **video)
            subs.append(SubRun(name, (dataset, "vit"), cfg, out / name))
    return subs


def _config(opts: Table3Config, out: Path, dataset, data_dir, test_gammas, **fields):
    """The video task's config of one sub-run (:func:`experiments.paper.job.subrun_config`)."""
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


def data_note(opts: Table3Config, cfg: VideoConfig) -> str:
    return f"data: {'generated tiny copies' if opts.scale == 'tiny' else opts.data_root}"
