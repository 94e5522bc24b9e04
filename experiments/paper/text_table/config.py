"""The text grid's flags, datasets and sub-runs: Table 4's axes, the paper's own numbers, the
checkpoints and prepared TFDS data it reads (or the tiny generated ones it writes) and one
sub-run per (dataset, model, depth).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from cudt.data.text.nli import tfds_builder, tiny_splits
from cudt.errors import DataError
from cudt.models.classifier import GRANULARITIES
from cudt.runner.config import Needs, flag
from cudt.runner.sweep import parse_model_hparams
from cudt.tasks.text import TextConfig, TextTask
from experiments.paper import job as grid
from experiments.paper import rows as table_rows
from experiments.paper.job import SubRun

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


_CHECKPOINT_FLAGS = {"distilbert": "checkpoint_distilbert", "roberta": "checkpoint_roberta"}


def _trains(test, what: str) -> Needs:
    """A flag of some of the models (``test(model)``: it acts in that model's sub-runs); ``what``:
    what the flag is to them, and the fix, after ``--models X trains``."""
    return Needs(
        lambda o: any(test(m) for m in o.setting("models")),
        lambda o, name: what.format(flag=name, models=",".join(o.setting("models"))),
    )


def _read_by_a_sub_run(source: str) -> Needs:
    """``--checkpoint-<source>``: read where a sub-run loads that folder (a model of it, or the
    UT reading its word embeddings: :func:`_checkpoint_source`)."""
    return Needs(lambda o: source in _sources(o), lambda o, _: _unread_checkpoints(o))


def _sources(opts) -> set[str]:
    return {_checkpoint_source(opts, model) for model in opts.setting("models")}


def _unread_checkpoints(opts) -> str:
    """The refusal of every ``--checkpoint-...`` given that no sub-run reads, named together."""
    read = _sources(opts)
    unread = [
        f"--checkpoint-{m}"
        for m in ("distilbert", "roberta", "minilm")
        if m not in read and getattr(opts, f"checkpoint_{m}") is not None
    ]
    return (
        f"{', '.join(unread)} would be read by no sub-run (--models "
        f"{','.join(opts.setting('models'))} at --scale {opts.scale}; the UT reads "
        f"{_checkpoint_source(opts, 'ut')}'s word embeddings): add the model to --models, "
        "or drop the flag"
    )


@dataclasses.dataclass(frozen=True)
class Table4Config:
    """Flags of ``python -m experiments.text_table``."""

    scale: str = flag(
        "tiny",
        "tiny: MiniLM standing in for DistilBERT and RoBERTa, generated IMDb- and MNLI-format "
        "data written under <out>/data, small settings, minutes on a CPU; paper: the "
        "pretrained folders, the TFDS data under --data-dir, 5 seeds per setting",
    )
    data_dir: str | None = grid.paper_data_flag(
        "TFDS data folder holding prepared imdb_reviews/plain_text and glue/mnli (tfds build "
        "... --file_format array_record)"
    )
    checkpoint_distilbert: str | None = flag(
        None,
        "Hugging Face DistilBERT folder (config.json, model.safetensors, tokenizer.json); at "
        "--scale paper the UT reads its word embeddings too, as the paper",
        needs=_read_by_a_sub_run("distilbert"),
    )
    checkpoint_roberta: str | None = flag(
        None, "Hugging Face RoBERTa folder", needs=_read_by_a_sub_run("roberta")
    )
    checkpoint_minilm: str | None = flag(
        None,
        "the BERT folder of the minilm rows, whose word embeddings the UT reads at --scale tiny "
        "(default: all-MiniLM-L6-v2 from its pip package)",
        needs=_read_by_a_sub_run("minilm"),
    )
    out: str | None = grid.out_flag("text_table")
    models: tuple[str, ...] | None = flag(
        None,
        "models: " + ", ".join(TABLE_MODELS) + " (default: tiny minilm,ut; paper "
        "distilbert,roberta,ut)",
    )
    layers: tuple[int, ...] | None = flag(
        None,
        "UT depths L (default: tiny 3, paper 3,5,7,9); the encoders use all their blocks",
        needs=_trains(
            lambda m: m == "ut",
            "{flag} sets the UT's depths, and --models {models} trains no UT (the encoders use "
            "all their blocks): drop {flag} or add ut to --models",
        ),
    )
    encoder_granularity: str = flag(
        "sublayer",
        "constraints of the pretrained encoders: sublayer (attention and MLP of each block: "
        "the paper's L = 12 for DistilBERT, 24 for RoBERTa) or block",
        needs=_trains(
            lambda m: m != "ut",
            "{flag} is read by the pretrained encoders, and --models {models} trains none: drop "
            "{flag} or add an encoder to --models",
        ),
    )
    datasets: tuple[str, ...] = grid.datasets_flag(DATASETS)
    gamma_trains: tuple[float, ...] | None = flag(
        None, "training perturbation levels γ_train (default: tiny 0,1; paper 0,0.2,...,1)"
    )
    headline_gamma: float = grid.headline_flag(1.0)
    sweep: tuple[str, ...] = grid.sweep_flag("dual_lr=0.05", TextConfig)
    seeds: int | None = grid.seeds_flag()
    steps: int | None = flag(None, "training steps per run (default: tiny 40, paper 2000)")
    batch_size: int | None = flag(None, "examples per batch (default: tiny 8, paper 32)")
    num_train: int | None = flag(
        None, "training pool (train + validation) per dataset (default: tiny 400, paper all)"
    )
    num_test: int | None = flag(None, "test examples per dataset (default: tiny 100, paper all)")
    max_length: int | None = flag(None, "tokens per text (default: tiny 48, paper 256)")
    test_gammas: tuple[float, ...] | None = grid.test_gammas_flag(
        "the text task's 0, 0.5, 1, 1.5, 2"
    )
    tolerance: float | None = grid.tolerance_flag(f"the text task's, {TextConfig.tolerance:g}")
    devices: int | None = grid.devices_flag()
    figures: bool = grid.figures_flag("the table's figures")
    overwrite: bool = grid.overwrite_flag()

    def __post_init__(self):
        need = grid.need
        need(self.scale in SCALES, f"--scale must be tiny or paper, got {self.scale!r}")
        scale = SCALES[self.scale]
        grid.check_needs(self)  # before the scale's defaults fill --models and --layers
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
            self.encoder_granularity in GRANULARITIES,
            f"--encoder-granularity must be block or sublayer, got {self.encoder_granularity!r}",
        )
        grid.check_grid_flags(
            self, need, ("seeds", "steps", "batch_size", "num_test", "devices"), TextConfig
        )
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
        grid.keep_unique(self)

    def setting(self, name: str):
        """A per-scale setting: the flag when given, else the scale's default."""
        value = getattr(self, name)
        return SCALES[self.scale][name] if value is None else value


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


def settings_note(opts: Table4Config, cfg: TextConfig) -> str:
    return (
        f"{cfg.steps} steps of {cfg.batch_size}, {cfg.seeds} seed(s), "
        f"{'all' if cfg.num_train is None else cfg.num_train} training examples "
        f"({int(round(100 * cfg.val_fraction))}% of them held out for validation), "
        f"{'all' if cfg.num_test is None else cfg.num_test} test ones, {cfg.max_length} tokens"
    )


def details_note(opts: Table4Config, cfg: TextConfig) -> str:
    data = (
        "generated, in the TFDS layout (synthetic reviews for IMDb, generated premise/hypothesis "
        "pairs for MNLI); MiniLM stands in for DistilBERT and RoBERTa"
        if opts.scale == "tiny"
        else f"TFDS data in {opts.data_dir}"
    )
    given = "" if opts.tolerance is None else " from --tolerance"  # not the task's default
    return (
        f"constraint settings: the text task's defaults (ε {cfg.epsilon:g}, reference "
        f"{cfg.reference}, dual lr {cfg.dual_lr:g}, resilience {cfg.resilience}, tolerance "
        f"{cfg.tolerance:g}{given}{_models_own(opts, cfg)}); data: {data}"
    )


def _models_own(opts: Table4Config, cfg: TextConfig) -> str:
    """The text task's per-model values (its ``model_hparams``, e.g. the UT's ε 0.02) of the
    models in the table, less what ``--sweep`` sets: the shared ε of the note is not the UT's."""
    swept = {s.partition("=")[0].strip().replace("-", "_") for s in opts.sweep}
    own = []
    for model, values in parse_model_hparams(cfg).items():
        shown = [
            k.replace("epsilon", "ε").replace("_", " ")
            + (f" {v:g}" if isinstance(v, float) else f" {v}")
            for k, v in values.items()
            if k not in swept
        ]
        if model in opts.models and shown:
            own.append(f"{MODEL_NAMES.get(model, model)}'s own {', '.join(shown)}")
    return "".join(f"; {text}" for text in own)
