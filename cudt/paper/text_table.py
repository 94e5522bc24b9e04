"""The paper's text grid (appendix B.4, "Table 4") as one job: IMDb and MNLI, DistilBERT,
RoBERTa and UT of every depth, every γ_train, ERM and constrained, through the shared runner;
then the table of accuracy AUCs and Figures 1, 4 and 12.

For each (dataset, model, L) ONE :func:`cudt.runner.run` call of the text task trains the whole
γ_train × sweep point × seed grid, ERM and constrained, as one vmapped program (the runner
shards it over the devices), into ``<out>/<dataset>-<model>[-L<L>]/``. A sub-run whose
``results.json`` exists and whose config matches is reused; an interrupted one resumes from its
checkpoints (the runner's rule); ``--overwrite`` retrains every sub-run. The best run of each
(dataset, model, L, kind, γ_train) is the runner's ``best`` mark: the highest validation
accuracy AUC (the paper's rule, appendix B.3: validation data scored over the same test γ grid,
the text task's ``--select val-auc``) among non-diverged runs that are feasible (constrained).
The test AUC in the table is never used to choose.

Metric (the paper's B.3): the area under test accuracy vs test γ (trapezoid), over one γ grid
shared by every cell (the text task's 0, 0.5, 1, 1.5, 2 joined with every γ_train), so AUCs
compare across cells.

Scales. ``paper``: the pretrained DistilBERT and RoBERTa folders, one constraint per sub-layer
(attention and MLP of each block: the paper's L = 12 and 24), UT with L in {3, 5, 7, 9} over
DistilBERT's word embeddings (as the paper's B.3), IMDb and MNLI from a prepared TFDS folder,
γ_train in {0, 0.2, ..., 1}, five seeds per setting. ``tiny`` (minutes on a CPU): MiniLM
(all-MiniLM-L6-v2, pip) stands in for both pretrained encoders (6 blocks, so L = 12 sub-layers,
as DistilBERT), the UT reads MiniLM's word embeddings, and the data are generated and written
under ``<out>/data`` as prepared TFDS folders (``imdb_reviews/plain_text/1.0.0``,
``glue/mnli/2.0.0``, array_record), read back by the same reader as the real ones: the
generated sentiment reviews of :func:`cudt.data.text.synthetic_sentiment` for IMDb, and
generated premise/hypothesis pairs (:func:`cudt.data.text.nli.generated_nli`) for MNLI.

Figure 12 needs every run's per-sample ratios ℓ_l / ℓ_{l-1}, which ``results.json`` summarises
(descent rate, mean, median) but does not keep: each sub-run is trained by
:class:`RatioRecordingTextTask`, the text task that also writes the histogram of every run's
ratios (per layer, fixed bins) to ``<sub-run>/ratio_histograms.npz`` before ``results.json``.

Outputs under ``<out>``: ``table4.csv`` (long format: one row per best run), ``table4.md`` (the
headline table at ``--headline-gamma``, the direction of each cell against the paper's table,
every γ_train), ``fig1_layer_loss.png``, ``fig4_accuracy_vs_gamma.png``,
``fig12_ratio_hist.png``.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import numpy as np

from cudt.data.text.nli import tfds_builder, tiny_splits
from cudt.errors import DataError
from cudt.io import atomic_write
from cudt.paper import figures as figs
from cudt.paper import job as grid
from cudt.paper import rows as table_rows
from cudt.paper.figures import grid_axes, save_figure
from cudt.paper.job import SubRun
from cudt.paper.rows import fmt
from cudt.runner.config import flag
from cudt.tasks.text import TextConfig, TextTask

__all__ = [
    "DATASETS",
    "PAPER_TABLE4",
    "SCALES",
    "RatioRecordingTextTask",
    "Table4Config",
    "best_rows",
    "build_tiny_datasets",
    "headline_markdown",
    "plan",
    "run_table",
]

DATASETS = ("imdb", "mnli")
NAMES = {"imdb": "IMDb", "mnli": "MNLI"}
TABLE_MODELS = ("ut", "distilbert", "roberta", "minilm")  # the paper's row order, then MiniLM
MODEL_NAMES = {"ut": "UT", "distilbert": "DistilBERT", "roberta": "RoBERTa", "minilm": "MiniLM"}
PRETRAINED = ("distilbert", "roberta", "minilm")
# The paper's L of its pretrained rows (one constraint per sub-layer), and the paper row a
# stand-in is compared with: MiniLM has DistilBERT's 6 blocks, so its 12 sub-layers.
PAPER_LAYERS = {"distilbert": 12, "roberta": 24}
STAND_IN = {"minilm": "distilbert"}
GAMMA_TRAINS = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
UT_LAYERS = (3, 5, 7, 9)
HPARAMS = table_rows.HPARAMS
RATIOS_FILE = "ratio_histograms.npz"
RATIO_EDGES = np.linspace(0.0, 2.5, 101)  # 0.025-wide bins; one more count: r > 2.5

# Settings per scale (flags override each of them).
SCALES: dict[str, dict[str, Any]] = {
    # Minutes on a 2-core CPU: MiniLM and UT-3, 400 generated examples per dataset (360 train,
    # 40 validation) and 100 test ones, 48 tokens, 40 steps of 8, one seed, γ_train 0 and 1.
    "tiny": {
        "models": ("minilm", "ut"),
        "layers": (3,),
        "gamma_trains": (0.0, 1.0),
        "steps": 40,
        "seeds": 1,
        "batch_size": 8,
        "num_train": 400,
        "num_test": 100,
        "max_length": 48,
        # one chunk (one checkpoint), test and validation in one batch shape each
        "text": {"chunk_steps": 40, "eval_batch_size": 100},
    },
    # The paper's grid on the real data; the paper's Bayesian search of five constrained runs
    # per setting is five seeds here (ERM likewise), plus any --sweep.
    "paper": {
        "models": ("distilbert", "roberta", "ut"),
        "layers": UT_LAYERS,
        "gamma_trains": GAMMA_TRAINS,
        "steps": 2000,
        "seeds": 5,
        "batch_size": 32,
        "num_train": None,  # all of it
        "num_test": None,
        "max_length": 256,
        "text": {"chunk_steps": 200, "eval_batch_size": 256},
    },
}

# The paper's text table (appendix B.4): accuracy AUC, (constrained, ERM) on IMDb then MNLI, per
# (model, L, γ_train).
_PAPER_ROWS = """
ut 3 0.0 1.719 1.707 0.892 0.887
ut 3 0.2 1.719 1.714 0.902 0.896
ut 3 0.4 1.723 1.720 0.914 0.909
ut 3 0.6 1.731 1.728 0.921 0.920
ut 3 0.8 1.740 1.735 0.930 0.926
ut 3 1.0 1.736 1.731 0.935 0.933
ut 5 0.0 1.680 1.680 0.889 0.882
ut 5 0.2 1.686 1.687 0.902 0.894
ut 5 0.4 1.702 1.706 0.913 0.909
ut 5 0.6 1.714 1.718 0.924 0.918
ut 5 0.8 1.727 1.729 0.930 0.927
ut 5 1.0 1.739 1.740 0.933 0.931
ut 7 0.0 1.673 1.672 0.889 0.885
ut 7 0.2 1.679 1.685 0.901 0.895
ut 7 0.4 1.696 1.695 0.915 0.911
ut 7 0.6 1.712 1.714 0.922 0.919
ut 7 0.8 1.726 1.724 0.929 0.925
ut 7 1.0 1.736 1.733 0.932 0.931
ut 9 0.0 1.672 1.670 0.890 0.885
ut 9 0.2 1.680 1.676 0.902 0.893
ut 9 0.4 1.697 1.693 0.914 0.909
ut 9 0.6 1.711 1.711 0.923 0.920
ut 9 0.8 1.724 1.724 0.928 0.929
ut 9 1.0 1.734 1.733 0.932 0.930
distilbert 12 0.0 1.583 1.608 1.052 1.064
distilbert 12 0.2 1.592 1.586 1.091 1.096
distilbert 12 0.4 1.653 1.602 1.162 1.153
distilbert 12 0.6 1.677 1.660 1.253 1.227
distilbert 12 0.8 1.738 1.704 1.328 1.322
distilbert 12 1.0 1.789 1.745 1.408 1.405
roberta 24 0.0 1.797 1.651 1.532 1.544
roberta 24 0.2 1.789 1.702 1.570 1.532
roberta 24 0.4 1.785 1.642 1.621 1.568
roberta 24 0.6 1.778 1.708 1.668 1.626
roberta 24 0.8 1.828 1.719 1.742 1.694
roberta 24 1.0 1.874 1.824 1.783 1.756
"""


PAPER_TABLE4 = table_rows.paper_table(_PAPER_ROWS, DATASETS)  # the paper's order: IMDb, MNLI


# --------------------------------------------------------------------------------------------------
# Flags
# --------------------------------------------------------------------------------------------------

_CHECKPOINT_FLAGS = {"distilbert": "checkpoint_distilbert", "roberta": "checkpoint_roberta"}


@dataclasses.dataclass(frozen=True)
class Table4Config:
    """Flags of ``python -m experiments.text_table``."""

    scale: str = flag(
        "tiny",
        "tiny: MiniLM standing in for DistilBERT and RoBERTa, generated IMDb- and MNLI-format "
        "data written under <out>/data, small settings, minutes on a CPU; paper: the "
        "pretrained folders, the TFDS data under --data-dir, 5 seeds per setting",
    )
    data_dir: str | None = flag(
        None,
        "--scale paper: TFDS data folder holding prepared imdb_reviews/plain_text and glue/mnli "
        "(tfds build ... --file_format array_record)",
    )
    checkpoint_distilbert: str | None = flag(
        None,
        "Hugging Face DistilBERT folder (config.json, model.safetensors, tokenizer.json); at "
        "--scale paper the UT reads its word embeddings too, as the paper",
    )
    checkpoint_roberta: str | None = flag(None, "Hugging Face RoBERTa folder")
    checkpoint_minilm: str | None = flag(
        None,
        "the BERT folder of the minilm rows, whose word embeddings the UT reads at --scale tiny "
        "(default: all-MiniLM-L6-v2 from its pip package)",
    )
    out: str | None = grid.out_flag("text_table")
    models: tuple[str, ...] | None = flag(
        None,
        "models: " + ", ".join(TABLE_MODELS) + " (default: tiny minilm,ut; paper "
        "distilbert,roberta,ut)",
    )
    layers: tuple[int, ...] | None = flag(
        None, "UT depths L (default: tiny 3, paper 3,5,7,9); the encoders use all their blocks"
    )
    encoder_granularity: str = flag(
        "sublayer",
        "constraints of the pretrained encoders: sublayer (attention and MLP of each block: "
        "the paper's L = 12 for DistilBERT, 24 for RoBERTa) or block",
    )
    datasets: tuple[str, ...] = grid.datasets_flag(DATASETS)
    gamma_trains: tuple[float, ...] | None = flag(
        None, "training perturbation levels γ_train (default: tiny 0,1; paper 0,0.2,...,1)"
    )
    headline_gamma: float = grid.headline_flag(1.0)
    sweep: tuple[str, ...] = grid.sweep_flag("dual_lr=0.05")
    seeds: int | None = flag(None, "seeds per setting (default: tiny 1, paper 5)")
    steps: int | None = flag(None, "training steps per run (default: tiny 40, paper 2000)")
    batch_size: int | None = flag(None, "examples per batch (default: tiny 8, paper 32)")
    num_train: int | None = flag(
        None, "training pool (train + validation) per dataset (default: tiny 400, paper all)"
    )
    num_test: int | None = flag(None, "test examples per dataset (default: tiny 100, paper all)")
    max_length: int | None = flag(None, "tokens per text (default: tiny 48, paper 256)")
    test_gammas: tuple[float, ...] | None = flag(
        None,
        "test perturbation levels, joined with every γ_train (default: the text task's 0, 0.5, "
        "1, 1.5, 2)",
    )
    tolerance: float | None = flag(
        None, "feasibility tolerance on validation data (default: the text task's, 0.01)"
    )
    devices: int | None = grid.devices_flag()
    overwrite: bool = grid.overwrite_flag()

    def __post_init__(self):
        need = grid.need
        need(self.scale in SCALES, f"--scale must be tiny or paper, got {self.scale!r}")
        scale = SCALES[self.scale]
        for name in ("models", "layers", "gamma_trains"):  # the scale's default where not given
            if getattr(self, name) is None:
                object.__setattr__(self, name, scale[name])
        grid.check_known("datasets", "dataset", self.datasets, DATASETS)
        grid.check_known("models", "model", self.models, TABLE_MODELS)
        need(
            all(n >= 1 for n in self.layers),
            f"--layers must all be >= 1, got {','.join(map(str, self.layers))}",
        )
        need(
            self.encoder_granularity in ("block", "sublayer"),
            f"--encoder-granularity must be block or sublayer, got {self.encoder_granularity!r}",
        )
        grid.check_grid_flags(self, need, ("seeds", "steps", "batch_size", "num_test", "devices"))
        for name, low in (("num_train", 2), ("max_length", 4)):
            value = getattr(self, name)
            need(
                value is None or value >= low,
                f"--{name.replace('_', '-')} must be >= {low}, got {value}",
            )
        needed = {  # at --scale paper the UT reads DistilBERT's word embeddings
            "distilbert": "distilbert" in self.models
            or (self.scale == "paper" and "ut" in self.models),
            "roberta": "roberta" in self.models,
        }
        missing = [
            f"--checkpoint-{model} DIR"
            for model, flag_name in _CHECKPOINT_FLAGS.items()
            if needed[model] and getattr(self, flag_name) is None
        ]
        if self.scale == "paper":
            if self.data_dir is None:
                missing.insert(0, "--data-dir TFDS_DIR")
            need(
                not missing,
                f"--scale paper needs {', '.join(missing)} (models {','.join(self.models)}; "
                "the UT reads DistilBERT's word embeddings): pass them, or --scale tiny for "
                "MiniLM and generated data",
            )
        else:
            need(
                not missing,
                f"--models {','.join(self.models)} needs {', '.join(missing)} (a Hugging Face "
                "folder: config.json, model.safetensors, tokenizer.json): pass it, or drop the "
                "model (minilm stands in for both at --scale tiny)",
            )
            need(
                self.data_dir is None,
                "--data-dir is read by --scale paper only (--scale tiny writes its own data "
                "under <out>/data): drop --data-dir or pass --scale paper",
            )
        grid.keep_unique(self)

    def setting(self, name: str):
        """A per-scale setting: the flag when given, else the scale's default."""
        value = getattr(self, name)
        return SCALES[self.scale][name] if value is None else value


# --------------------------------------------------------------------------------------------------
# Inputs: pretrained folders, TFDS data
# --------------------------------------------------------------------------------------------------


def _checkpoint_source(opts: Table4Config, model: str) -> str:
    """Whose folder a sub-run of ``model`` loads: the UT reads the word embeddings (and the
    tokenizer) of DistilBERT at --scale paper, as the paper, of the MiniLM stand-in at tiny."""
    if model == "ut":
        return "distilbert" if opts.scale == "paper" else "minilm"
    return model


def checkpoint_of(opts: Table4Config, model: str) -> str | None:
    """The folder a sub-run of ``model`` loads (None: the pip all-MiniLM-L6-v2)."""
    return getattr(opts, f"checkpoint_{_checkpoint_source(opts, model)}")


_TFDS_FOLDERS = {"imdb": "imdb_reviews/plain_text", "mnli": "glue/mnli"}


def check_inputs(opts: Table4Config) -> None:
    """Every pretrained folder and (``--scale paper``) dataset is there: one line if not,
    before anything is written or trained."""
    from cudt.models.encoders import EncoderConfig

    wanted = {"minilm": "bert", "distilbert": "distilbert", "roberta": "roberta"}
    for model in opts.models:
        folder = checkpoint_of(opts, model)
        if folder is None:
            continue
        flag_name = f"--checkpoint-{_checkpoint_source(opts, model)}"
        path = Path(folder).expanduser()
        if not path.is_dir():
            raise DataError(
                f"{flag_name} '{path}' {'is not a folder' if path.exists() else 'does not exist'}"
                ": pass a Hugging Face model folder (config.json, model.safetensors, "
                "tokenizer.json)"
            )
        lacking = [f for f in ("config.json", "tokenizer.json") if not (path / f).is_file()]
        if (
            not (path / "model.safetensors").is_file()
            and not (path / "model.safetensors.index.json").is_file()
        ):
            lacking.append("model.safetensors")
        if lacking:
            raise DataError(
                f"{flag_name} '{path}' has no {', '.join(lacking)}: export the model with "
                "save_pretrained(dir, safe_serialization=True) and its tokenizer beside it"
            )
        if model == "ut":  # any encoder's word embeddings will do
            continue
        model_type = EncoderConfig.from_file(path / "config.json").model_type
        if model_type != wanted[model]:
            raise DataError(
                f"{flag_name} '{path}' holds a {model_type} model, not {wanted[model]}: pass a "
                f"{wanted[model]} folder"
            )
    if opts.scale != "paper":
        return
    root = Path(opts.data_dir).expanduser()
    if not root.is_dir():
        raise DataError(
            f"--data-dir '{root}' {'is not a folder' if root.exists() else 'does not exist'}: "
            "pass the TFDS data folder holding imdb_reviews/ and glue/"
        )
    for d in opts.datasets:
        folder = root / _TFDS_FOLDERS[d]
        if not any(folder.glob("*/dataset_info.json")):
            raise DataError(
                f"--data-dir '{root}' has no prepared {_TFDS_FOLDERS[d]} (expected "
                f"{folder}/<version>/dataset_info.json): run `tfds build {_TFDS_FOLDERS[d]} "
                f"--data_dir {root} --file_format array_record`, or drop {d} from --datasets"
            )


# --------------------------------------------------------------------------------------------------
# Plan: one sub-run per (dataset, model, L)
# --------------------------------------------------------------------------------------------------


def _sub_name(dataset: str, model: str, layers: int | None) -> str:
    return f"{dataset}-{model}" + ("" if layers is None else f"-L{layers}")


def plan(opts: Table4Config, out: Path) -> list[SubRun]:
    """The sub-runs (dataset-major, the table's model order), their configs checked before
    anything is written."""
    scale = SCALES[opts.scale]
    data_dir = Path(opts.data_dir).expanduser() if opts.scale == "paper" else out / "data"
    models = [m for m in TABLE_MODELS if m in opts.models]
    subs = []
    for dataset in opts.datasets:
        for model in models:
            for layers in opts.layers if model == "ut" else (None,):
                name = _sub_name(dataset, model, layers)
                cfg = grid.subrun_config(
                    TextConfig,
                    opts,
                    out / name,
                    model=model,
                    checkpoint=checkpoint_of(opts, model),
                    dataset=dataset,
                    data_dir=str(data_dir),
                    layers=layers,
                    granularity="block" if model == "ut" else opts.encoder_granularity,
                    test_gammas=opts.test_gammas,
                    seeds=opts.setting("seeds"),
                    steps=opts.setting("steps"),
                    batch_size=opts.setting("batch_size"),
                    num_train=opts.setting("num_train"),
                    num_test=opts.setting("num_test"),
                    max_length=opts.setting("max_length"),
                    **scale["text"],
                )
                # results.json holds the learning rate the task resolved (its default: None here)
                lr = cfg.lr if cfg.lr is not None else TextTask().default_lr(cfg, model)
                subs.append(SubRun(name, (dataset, model, layers), cfg, out / name, {"lr": lr}))
    return subs


# --------------------------------------------------------------------------------------------------
# Tiny datasets: generated text in the prepared-TFDS layout of imdb_reviews and glue/mnli
# --------------------------------------------------------------------------------------------------


def build_tiny_datasets(
    root: Path, datasets, num_train: int, num_test: int, *, overwrite: bool = False
) -> dict[str, Path]:
    """Generated IMDb and MNLI in the prepared-TFDS layout under the data folder ``root``
    (``imdb_reviews/plain_text/1.0.0``, ``glue/mnli/2.0.0``, array_record), with ``num_train``
    training and ``num_test`` test (``validation_matched``) examples; a complete copy of the same
    spec is kept. Each is prepared in a temporary folder, then renamed, so a killed job never
    leaves half a dataset."""
    root.mkdir(parents=True, exist_ok=True)
    made = {}
    for d in datasets:
        top_name = _TFDS_FOLDERS[d].split("/")[0]

        def prepare(tmp: Path, d=d, top_name=top_name) -> Path:
            import tensorflow_datasets as tfds

            tfds.disable_progress_bar()
            builder = tfds_builder(d, tiny_splits(d, num_train, num_test))(
                data_dir=str(tmp), file_format="array_record"
            )
            builder.download_and_prepare()
            return tmp / top_name

        want = {"dataset": d, "train": num_train, "test": num_test, "generator": 2}
        made[d] = grid.keep_or_build(root, d, root / top_name, want, prepare, overwrite=overwrite)
    return made


# --------------------------------------------------------------------------------------------------
# Per-sample ratio histograms (Figure 12)
# --------------------------------------------------------------------------------------------------


def ratio_histograms(runs: list[dict], ratios: list) -> tuple[np.ndarray, list[str]]:
    """``counts [R, L, B+1]``: per run and layer, how many test samples have their ratio
    ``ℓ_l / ℓ_{l-1}`` (at the run's γ_train) in each bin of :data:`RATIO_EDGES`, the last count
    those ``> 2.5``; a diverged run (no ratios) counts nothing. And the runs' labels."""
    width = max((int(r["layers"]) for r in runs), default=1)
    bins = len(RATIO_EDGES) - 1
    counts = np.zeros((len(runs), width, bins + 1), np.int64)
    for i, (run, r) in enumerate(zip(runs, ratios, strict=True)):
        if r is None:
            continue
        per_layer = np.asarray(r, np.float64).reshape(-1, int(run["layers"]))  # [N, L]
        for layer in range(per_layer.shape[1]):
            v = per_layer[:, layer]
            counts[i, layer, :bins] = np.histogram(v, bins=RATIO_EDGES)[0]
            counts[i, layer, bins] = int(np.sum(v > RATIO_EDGES[-1]))
    return counts, [r["label"] for r in runs]


class RatioRecordingTextTask(TextTask):
    """The text task, also writing every run's per-sample ratio histograms (:func:`ratio_
    histograms`) to ``ratio_histograms.npz`` beside its figures, before ``results.json``."""

    def figures(self, runs, ratios, out, gammas, cfg):
        paths = super().figures(runs, ratios, out, gammas, cfg)
        counts, labels = ratio_histograms(runs, ratios)

        def write(f):
            np.savez(f, edges=RATIO_EDGES, counts=counts, labels=np.asarray(labels, dtype=str))

        atomic_write(Path(out) / RATIOS_FILE, write)
        return paths


def read_ratio_histograms(folder: Path) -> dict[str, np.ndarray]:
    """``{run label: counts [L, B+1]}`` of a sub-run (empty if it has no histograms: trained
    by ``experiments.text_classify``, say)."""
    path = Path(folder) / RATIOS_FILE
    if not path.is_file():
        return {}
    with np.load(path, allow_pickle=False) as z:
        if not np.array_equal(z["edges"], RATIO_EDGES):
            return {}
        return {str(label): c for label, c in zip(z["labels"], z["counts"], strict=True)}


# --------------------------------------------------------------------------------------------------
# Best runs, tables
# --------------------------------------------------------------------------------------------------


def best_rows(results: dict[tuple, dict]) -> list[dict]:
    """One row per (dataset, model, L, kind, γ_train): its best run (the runner's ``best`` mark:
    validation accuracy AUC) or, where no run is eligible, its status (``diverged``: every run
    diverged; ``infeasible``: the best infeasible one, flagged)."""

    def fields(b: dict, i: int) -> dict[str, Any]:
        accuracy = [table_rows.num(v) for v in b["accuracy"]]
        return {
            "auc": float(b["auc"]),
            "acc_at_gamma_train": accuracy[i],
            "acc_at_max_gamma": accuracy[-1],
            "val_auc": float(b["val_auc"]),
            "val_accuracy": float(b["val_accuracy"]),
            "loss_decreases": bool(b["loss_decreases"]),
            "descent_rate": float(b["descent_rate"]),
            "mean_ratio": float(b["mean_ratio"]),
            "median_ratio": float(b["median_ratio"]),
            "accuracy": accuracy,  # for Figure 4 (not in the CSV)
        }

    rows = []
    for (dataset, _, _), res in results.items():
        sub_run = Path(res["config"]["out"]).name
        rows += table_rows.setting_rows(
            res, dataset, sub_run, score="val_auc", higher=True, fields=fields
        )
    return table_rows.sort_rows(rows, DATASETS, TABLE_MODELS)


CSV_COLUMNS = (
    *table_rows.SETTING_COLUMNS,
    "auc",
    "acc_at_gamma_train",
    "acc_at_max_gamma",
    "val_auc",
    "val_accuracy",
    "feasible",
    "loss_decreases",
    "descent_rate",
    "mean_ratio",
    "median_ratio",
    "peak_lambda",
    "seed",
    *table_rows.RUN_COLUMNS,
)


def _row_models(rows) -> list[tuple[str, int]]:
    """(model, L) of the table's rows, in the paper's order (UT by depth, then the encoders)."""
    order = {m: i for i, m in enumerate(TABLE_MODELS)}
    return sorted({(r["model"], r["layers"]) for r in rows}, key=lambda k: (order[k[0]], k[1]))


def _label(model: str, layers: int) -> str:
    return f"{MODEL_NAMES.get(model, model)}-{layers}"


def _table_lines(rows, datasets, gammas, *, label_gamma: bool) -> list[str]:
    """Accuracy AUC of constrained and ERM per dataset, the higher bold (both when equal to 3
    decimals)."""
    return table_rows.table_lines(
        rows,
        NAMES,
        datasets,
        [(_label(model, L), model, L) for model, L in _row_models(rows)],
        gammas,
        metric="auc",
        higher=True,
        label_gamma=label_gamma,
    )


def headline_markdown(rows, datasets, gamma, test_gammas) -> str:
    """The headline table at γ_train = ``gamma`` (Markdown), with its legend and counts."""
    idx = table_rows.index_rows(rows)
    lines = [
        f"### Table 4: test accuracy AUC over test γ ∈ {{{fmt(test_gammas)}}}, γ_train = {gamma:g}",
        "",
        *_table_lines(rows, datasets, [gamma], label_gamma=False),
        "",
        "Best run per cell by validation accuracy AUC among non-diverged runs, feasible ones for "
        "constrained; **bold**: the higher of constrained and ERM; `infeasible`: no constrained "
        "run met its constraints on validation data (the best infeasible one's AUC in "
        "brackets); `diverged`: every run diverged. L of an encoder: its constrained states "
        "(one per sub-layer: DistilBERT 12, RoBERTa 24, MiniLM 12).",
    ]
    wins = both = 0
    for model, L in _row_models(rows):
        for d in datasets:
            c, e = (
                idx.get((d, model, L, "constrained", gamma)),
                idx.get((d, model, L, "ERM", gamma)),
            )
            if c and e and c["status"] == "ok" and e["status"] == "ok":
                both += 1
                wins += round(c["auc"], 3) > round(e["auc"], 3)
    lines.append(
        f"\nConstrained higher than ERM in {wins} of {both} model×dataset cells with both numbers."
    )
    return "\n".join(lines)


def paper_direction_markdown(rows, datasets, gamma) -> str:
    """Per cell: which of constrained (C) / ERM (E) has the higher AUC here and in the paper's
    table, with constrained minus ERM (:func:`cudt.paper.job.direction_markdown`); MiniLM against
    the paper's DistilBERT-12, the encoder it stands in for. A cell without a feasible
    constrained run reads ``infeasible: C``."""
    return table_rows.direction_markdown(
        rows,
        NAMES,
        datasets,
        [(_label(model, L), model, L) for model, L in _row_models(rows)],
        gamma,
        _paper_pair,
        metric="auc",
        higher=True,
        signed=True,
        legend=" MiniLM rows are compared with the paper's DistilBERT-12.",
    )


def _paper_pair(model: str, L: int, gamma: float, dataset: str) -> tuple[float, float] | None:
    """The paper's (constrained, ERM) cell of ``model`` (a stand-in: of the model it stands in
    for, at that model's L)."""
    ref = STAND_IN.get(model, model)
    paper_l = L if ref == "ut" else PAPER_LAYERS.get(ref)
    return PAPER_TABLE4.get((ref, paper_l, gamma, dataset))


# --------------------------------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------------------------------

STYLE = figs.STYLE
_NOTE = (
    "best run per setting by validation AUC; dashed: no feasible constrained run (the best "
    "infeasible one shown)"
)


def _panels(rows, opts):
    """The figures' panels: datasets × the table's (model, L), and each panel's two runs."""
    idx, g = table_rows.index_rows(rows), opts.headline_gamma
    cols = _row_models(rows)

    def series(d, model, L):
        found = [(k, idx.get((d, model, L, k, g))) for k in ("ERM", "constrained")]
        return [(k, r) for k, r in found if r is not None]

    return cols, series


def _finish_panel(ax, d: str, model: str, L: int, j: int, xlabel: str, ylabel: str, **legend):
    """A panel's title (dataset · model), axis labels (y on the first column only), grid and
    legend (``legend``: its keywords)."""
    ax.set_title(f"{NAMES[d]} · {_label(model, L)}", fontsize=9)
    ax.set_xlabel(xlabel)
    if j == 0:
        ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend(**legend)


def plot_fig1(rows, opts, path: Path) -> None:
    """Mean test cross-entropy per state at the headline γ_train (the paper's Figure 1)."""
    from matplotlib.ticker import MaxNLocator

    cols, series = _panels(rows, opts)
    fig, axes = grid_axes(len(opts.datasets), len(cols), w=3.8, h=2.8)
    for i, d in enumerate(opts.datasets):
        for j, (model, L) in enumerate(cols):
            ax = axes[i, j]
            for key, row in series(d, model, L):
                loss = row.get("layer_loss")
                x = None if loss is None else np.arange(len(loss))
                figs.draw_line(ax, STYLE[key], row, x, loss, has_value="auc" in row, ms=3)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            xlabel, ylabel = "state l (0: the perturbed embeddings)", "mean test cross-entropy ℓ_l"
            _finish_panel(ax, d, model, L, j, xlabel, ylabel, fontsize=7)
    g = opts.headline_gamma
    fig.suptitle(f"Fig. 1: mean test loss per layer, γ_train = test γ = {g:g}", fontsize=11)
    figs.figure_note(fig, _NOTE)
    save_figure(fig, path)


def plot_fig4(rows, opts, path: Path) -> None:
    """Test accuracy vs test γ at the headline γ_train (the paper's Figure 4)."""
    cols, series = _panels(rows, opts)
    g = opts.headline_gamma
    fig, axes = grid_axes(len(opts.datasets), len(cols), w=3.8, h=2.9)
    for i, d in enumerate(opts.datasets):
        for j, (model, L) in enumerate(cols):
            ax = axes[i, j]
            for key, row in series(d, model, L):
                style = STYLE[key]
                if "auc" in row:
                    style = style | {"label": f"{style['label']} (AUC {row['auc']:.3f})"}
                x, y = row.get("test_gamma"), row.get("accuracy")
                figs.draw_line(ax, style, row, x, y, has_value="auc" in row)
            figs.mark_train_gamma(ax, g, label_y=0.9)
            _finish_panel(
                ax, d, model, L, j, "test γ", "test accuracy", fontsize=7, loc="lower left"
            )
    fig.suptitle(
        f"Fig. 4: test accuracy vs embedding perturbation, γ_train = {g:g} (dotted; shaded: OOD)",
        fontsize=11,
    )
    figs.figure_note(fig, _NOTE)
    save_figure(fig, path)


def plot_fig12(rows, opts, out: Path, path: Path) -> None:
    """Histograms of the per-sample ratios ℓ_l / ℓ_{l-1} over every layer and test sample at
    the headline γ_train, best ERM vs best constrained run (the paper's Figure 12)."""
    cols, series = _panels(rows, opts)
    g = opts.headline_gamma
    width = RATIO_EDGES[1] - RATIO_EDGES[0]
    hists: dict[str, dict[str, np.ndarray]] = {}
    fig, axes = grid_axes(len(opts.datasets), len(cols), w=3.8, h=2.8)
    for i, d in enumerate(opts.datasets):
        for j, (model, L) in enumerate(cols):
            ax = axes[i, j]
            drawn = 0
            for key, row in series(d, model, L):
                if "label" not in row:
                    continue
                if row["sub_run"] not in hists:
                    hists[row["sub_run"]] = read_ratio_histograms(out / row["sub_run"])
                counts = hists[row["sub_run"]].get(row["label"])
                if counts is None or counts.sum() == 0:
                    continue
                total = counts.sum(axis=0)  # [B+1] over every layer
                n = total.sum()
                over = total[-1] / n
                s = STYLE[key]
                flagged = "" if row["status"] == "ok" else f" ({row['status']})"
                ax.stairs(
                    total[:-1] / (n * width),
                    RATIO_EDGES,
                    fill=True,
                    color=s["color"],
                    alpha=0.45,
                    label=f"{s['label']}{flagged}: mean {row['mean_ratio']:.2f}, median "
                    f"{row['median_ratio']:.2f}, {100 * row['descent_rate']:.0f}% < 1"
                    + (f", {100 * over:.0f}% > {RATIO_EDGES[-1]:g}" if over >= 0.005 else ""),
                )
                if key == "constrained" and row.get("epsilon") is not None:
                    ax.axvline(1 - row["epsilon"], color=s["color"], lw=0.9, ls="--")
                drawn += 1
            ax.axvline(1.0, color="k", lw=0.8, ls=":")
            if not drawn:
                ax.text(
                    0.5,
                    0.5,
                    "no ratio histograms recorded",
                    transform=ax.transAxes,
                    ha="center",
                    fontsize=8,
                    color="0.4",
                )
            ax.set_xlim(RATIO_EDGES[0], RATIO_EDGES[-1])
            _finish_panel(
                ax, d, model, L, j, "ℓ_l / ℓ_(l-1)", "density", fontsize=6, loc="upper right"
            )
    fig.suptitle(
        f"Fig. 12: per-sample layer ratios on the test set at γ_train = {g:g} (dotted: 1; "
        "dashed: 1 − ε)",
        fontsize=11,
    )
    figs.figure_note(
        fig,
        "every layer and test sample of the best run per setting; paper, constrained RoBERTa on "
        "IMDb: mean 0.87, median 0.82, 70.8% < 1",
    )
    save_figure(fig, path)


# --------------------------------------------------------------------------------------------------
# The job
# --------------------------------------------------------------------------------------------------


def prepare_tiny(opts: Table4Config, out: Path) -> None:
    """``--scale tiny``: the generated IMDb and MNLI in the prepared-TFDS layout under
    ``<out>/data``."""
    t = time.perf_counter()
    built = build_tiny_datasets(
        out / "data",
        opts.datasets,
        opts.setting("num_train"),
        opts.setting("num_test"),
        overwrite=opts.overwrite,
    )
    print(
        f"tiny datasets in the prepared-TFDS layout under {out / 'data'}: "
        f"{', '.join(p.name for p in built.values())} ({time.perf_counter() - t:.1f}s)"
    )


def figures(rows: list[dict], opts: Table4Config, out: Path) -> dict[str, Path]:
    """Figures 1, 4 and 12 (the last from the sub-runs' ratio histograms under ``out``)."""
    paths = {
        "fig1": out / "fig1_layer_loss.png",
        "fig4": out / "fig4_accuracy_vs_gamma.png",
        "fig12": out / "fig12_ratio_hist.png",
    }
    plot_fig1(rows, opts, paths["fig1"])
    plot_fig4(rows, opts, paths["fig4"])
    plot_fig12(rows, opts, out, paths["fig12"])
    return paths


def _settings(opts: Table4Config, cfg: TextConfig) -> str:
    return (
        f"{cfg.steps} steps of {cfg.batch_size}, {cfg.seeds} seed(s), "
        f"{'all' if cfg.num_train is None else cfg.num_train} training examples "
        f"({int(round(100 * cfg.val_fraction))}% of them held out for validation), "
        f"{'all' if cfg.num_test is None else cfg.num_test} test ones, {cfg.max_length} tokens"
    )


def _details(opts: Table4Config, cfg: TextConfig) -> str:
    data = (
        "generated, in the TFDS layout (synthetic reviews for IMDb, generated premise/hypothesis "
        "pairs for MNLI); MiniLM stands in for DistilBERT and RoBERTa"
        if opts.scale == "tiny"
        else f"TFDS data in {opts.data_dir}"
    )
    return (
        f"constraint settings: the text task's defaults (ε {cfg.epsilon:g}, reference "
        f"{cfg.reference}, dual lr {cfg.dual_lr:g}, resilience {cfg.resilience}, tolerance "
        f"{cfg.tolerance:g}); data: {data}"
    )


class TextTableJob(grid.TableJob):
    name = "text table"
    table = "table4"
    title = "Text grid (the paper's Table 4)"
    csv_columns = CSV_COLUMNS

    def check(self, opts):
        check_inputs(opts)

    def plan(self, opts, out):
        return plan(opts, out)

    def prepare_tiny(self, opts, out):
        prepare_tiny(opts, out)

    def make_task(self):
        return RatioRecordingTextTask()

    def best_rows(self, results):
        return best_rows(results)

    def settings(self, opts, cfg):
        return _settings(opts, cfg)

    def details(self, opts, cfg):
        return _details(opts, cfg)

    def headline(self, rows, opts, test_gammas):
        return headline_markdown(rows, opts.datasets, opts.headline_gamma, test_gammas)

    def direction(self, rows, opts):
        return paper_direction_markdown(rows, opts.datasets, opts.headline_gamma)

    def every_gamma(self, rows, opts):
        return _table_lines(rows, opts.datasets, list(opts.gamma_trains), label_gamma=True)

    def figures(self, rows, opts, out):
        return figures(rows, opts, out)


def run_table(opts: Table4Config) -> dict[str, Any]:
    """Trains (or reuses) every sub-run, then writes the table, CSV and figures
    (:func:`cudt.paper.job.run_job`); returns ``{"rows", "markdown", "paths", "trained", "reused",
    "wall_seconds"}``."""
    return grid.run_job(TextTableJob(), opts)
