"""Text classification with perturbed embeddings: ERM vs layerwise-descent constrained models.

Run (all-MiniLM-L6-v2 from the pip package, generated sentiment reviews, no download; about
7 minutes on a 2-core CPU, evaluation included):

    python -m experiments.text_classify

RoBERTa on IMDb, one constraint per sub-layer (the paper's L = 24), from a prepared TFDS folder:

    python -m experiments.text_classify --model roberta --checkpoint /models/roberta-base \\
        --dataset imdb --data-dir ~/tensorflow_datasets --granularity sublayer

A UT over MiniLM's word embeddings on MNLI (premise and hypothesis joined by the tokenizer):

    python -m experiments.text_classify --model ut --layers 5 --dataset mnli --data-dir DIR

Writes ``results.json``, ``layer_loss.png``, ``accuracy_vs_gamma.png`` and ``ratio_hist.png``
under ``--out`` (a fresh ``runs/text_classify-<time>`` folder by default) and prints a summary
table with the paper's per-sample descent figures beside it.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from dataclasses import field

from cudt.cli import config_from_args, run_cli

MODELS = ("minilm", "bert", "distilbert", "roberta", "ut")  # = cudt.text.MODELS (light import)
DATASETS = ("synthetic", "imdb", "mnli", "aclimdb")  # = cudt.data.text.TEXT_DATASETS


def _help(text: str):
    return {"help": text}


def _is_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


@dataclasses.dataclass(frozen=True)
class Config:
    model: str = field(
        default="minilm",
        metadata=_help(
            "minilm (all-MiniLM-L6-v2, pip package), bert, distilbert, roberta (need "
            "--checkpoint) or ut (a UT over the encoder's word embeddings)"
        ),
    )
    checkpoint: str | None = field(
        default=None,
        metadata=_help(
            "Hugging Face model folder (config.json, model.safetensors, tokenizer.json); for "
            "ut, the encoder whose tokenizer and word embeddings it uses (default for minilm "
            "and ut: the pip all-MiniLM-L6-v2)"
        ),
    )
    dataset: str = field(
        default="synthetic",
        metadata=_help(
            "synthetic (generated reviews), imdb or mnli (prepared TFDS folders), aclimdb "
            "(the Stanford aclImdb folder)"
        ),
    )
    data_dir: str | None = field(
        default=None,
        metadata=_help("TFDS data folder (imdb, mnli; default $TFDS_DATA_DIR) or aclImdb folder"),
    )
    download: bool = field(
        default=False, metadata=_help("imdb/mnli: download and prepare missing TFDS data")
    )
    num_train: int | None = field(
        default=2000,
        metadata=_help("training pool (train + val) drawn from the source; none: all of it"),
    )
    num_test: int | None = field(
        default=400, metadata=_help("test examples drawn from the source; none: all of it")
    )
    val_fraction: float = field(
        default=0.1, metadata=_help("fraction of the pool held out to check feasibility")
    )
    max_length: int = field(default=64, metadata=_help("tokens per text (truncated / padded)"))
    layers: int | None = field(
        default=None,
        metadata=_help("ut: unrolled layers L (default 3); pretrained encoders use their blocks"),
    )
    granularity: str = field(
        default="block",
        metadata=_help(
            "block (a constraint per block: L+1 states) or sublayer (attention and MLP outputs "
            "each a state: 2L+1)"
        ),
    )
    pooling: str | None = field(
        default=None,
        metadata=_help(
            "the shared head's input: first (token: [CLS] / <s>) or mean (of the tokens); "
            "default: first for bert, distilbert, roberta and mean for ut (the paper's), mean "
            "for minilm (the pooling it was trained with)"
        ),
    )
    gamma_train: float = field(
        default=0.5,
        metadata=_help("training perturbation: embeddings + gamma * noise_scale * N(0, 1)"),
    )
    test_gammas: tuple[float, ...] | None = field(
        default=None,
        metadata=_help("test perturbations (default 0,0.5,1,1.5,2 plus gamma_train)"),
    )
    noise_scale: float | None = field(
        default=None,
        metadata=_help("noise std at gamma = 1 (default: the std of the word-embedding table)"),
    )
    steps: int = field(default=160, metadata=_help("training steps per run"))
    batch_size: int = field(default=16, metadata=_help("texts per batch"))
    seeds: int = field(
        default=1,
        metadata=_help(
            "seeds per setting, trained together (vmap); they change the head init, batch "
            "order and noise"
        ),
    )
    seed: int = field(default=0, metadata=_help("first seed; also seeds the data subsets"))
    lr: float | None = field(
        default=None, metadata=_help("primal Adam learning rate (default 1e-4; ut: 1e-3)")
    )
    train_embeddings: bool = field(
        default=False,
        metadata=_help(
            "also train the word-embedding table (frozen by default: the noise scale is fixed "
            "from it)"
        ),
    )
    epsilon: float = field(default=0.1, metadata=_help("descent factor: l_l <= (1-eps) l_{l-1}"))
    reference: str = field(
        default="chance",
        metadata=_help(
            "bound C of the reference constraint E l_0 <= C: chance (ln of the number of "
            "classes, the loss of a uniform guess), a number, or none"
        ),
    )
    resilience: float | None = field(
        default=None, metadata=_help("resilience alpha (None: hard constraints)")
    )
    resilience_mode: str = field(
        default="decay",
        metadata=_help(
            "decay (dual weight decay 1/alpha) or slack (explicit slacks, restarted every epoch)"
        ),
    )
    slack_lr: float = field(default=1e-2, metadata=_help("learning rate of explicit slacks"))
    dual_optimizer: str = field(default="adam", metadata=_help("adam (the paper) or sgd"))
    dual_lr: float = field(
        default=0.1,
        metadata=_help(
            "dual learning rate (dual Adam moves each multiplier by about this per step: a short "
            "run needs them to grow within ~100 steps)"
        ),
    )
    warmup_steps: int | None = field(
        default=None,
        metadata=_help(
            "primal warm-up steps with duals frozen (default: one epoch, at most steps/4)"
        ),
    )
    tolerance: float = field(
        default=0.01, metadata=_help("feasibility tolerance, relative to the previous layer's loss")
    )
    ut_a: float = field(default=1.0, metadata=_help("UT attention step a"))
    ut_b: float = field(default=1.0, metadata=_help("UT feed-forward step b"))
    chunk_steps: int = field(default=40, metadata=_help("steps per compiled chunk (log every)"))
    eval_batch_size: int = field(default=64, metadata=_help("texts per evaluation batch"))
    checkpoint_every: int | None = field(
        default=None, metadata=_help("steps between checkpoints (default: every chunk)")
    )
    keep_checkpoints: int = field(default=1, metadata=_help("checkpoints kept per group"))
    out: str | None = field(
        default=None,
        metadata=_help(
            "output folder (default: a fresh runs/text_classify-<time>); rerunning with the "
            "same --out and flags resumes from its checkpoints"
        ),
    )
    resume: bool = field(
        default=False,
        metadata=_help(
            "require a checkpoint in --out to resume from (resuming is automatic when --out "
            "holds checkpoints of the same config)"
        ),
    )
    overwrite: bool = field(
        default=False, metadata=_help("discard results and checkpoints already in --out")
    )

    def __post_init__(self):
        def need(cond, msg):
            if not cond:
                raise ValueError(msg)

        need(
            self.model in MODELS,
            f"--model {self.model!r} is unknown: choose from {', '.join(MODELS)}",
        )
        need(
            self.model in ("minilm", "ut") or self.checkpoint,
            f"--model {self.model} needs --checkpoint FOLDER (a Hugging Face {self.model} "
            "folder with config.json, model.safetensors and tokenizer.json)",
        )
        need(
            self.dataset in DATASETS,
            f"--dataset {self.dataset!r} is unknown: choose from {', '.join(DATASETS)}",
        )
        need(
            self.dataset != "aclimdb" or self.data_dir,
            "--dataset aclimdb needs --data-dir pointing at the aclImdb folder",
        )
        need(
            self.layers is None or self.model == "ut",
            f"--layers applies to --model ut only ({self.model} uses all its blocks): drop it",
        )
        need(self.layers is None or self.layers >= 1, f"--layers must be >= 1, got {self.layers}")
        need(
            self.granularity in ("block", "sublayer"),
            f"--granularity must be block or sublayer, got {self.granularity!r}",
        )
        need(
            self.pooling in (None, "first", "mean"),
            f"--pooling must be first or mean, got {self.pooling!r}",
        )
        need(self.num_train is None or self.num_train >= 2, "--num-train must be >= 2")
        need(self.num_test is None or self.num_test >= 1, "--num-test must be >= 1")
        need(
            0 < self.val_fraction < 1,
            f"--val-fraction must lie in (0, 1), got {self.val_fraction}",
        )
        need(self.max_length >= 4, f"--max-length must be >= 4, got {self.max_length}")
        need(self.gamma_train >= 0, f"--gamma-train must be >= 0, got {self.gamma_train}")
        need(all(g >= 0 for g in (self.test_gammas or ())), "--test-gammas must all be >= 0")
        need(
            self.noise_scale is None or self.noise_scale > 0,
            f"--noise-scale must be > 0, got {self.noise_scale}",
        )
        need(self.steps >= 1, f"--steps must be >= 1, got {self.steps}")
        need(self.batch_size >= 1, f"--batch-size must be >= 1, got {self.batch_size}")
        need(self.seeds >= 1, f"--seeds must be >= 1, got {self.seeds}")
        need(self.seed >= 0, f"--seed must be >= 0, got {self.seed}")
        need(self.lr is None or self.lr > 0, f"--lr must be > 0, got {self.lr}")
        need(0 <= self.epsilon < 1, f"--epsilon must lie in [0, 1), got {self.epsilon}")
        need(
            self.reference.lower() in ("chance", "none") or _is_number(self.reference),
            f"--reference must be chance, none or a number, got {self.reference!r}",
        )
        need(
            self.resilience is None or self.resilience > 0,
            f"--resilience must be > 0, got {self.resilience}",
        )
        need(
            self.resilience_mode in ("decay", "slack"),
            f"--resilience-mode must be decay or slack, got {self.resilience_mode!r}",
        )
        need(
            self.resilience_mode == "decay" or self.resilience is not None,
            "--resilience-mode slack needs --resilience ALPHA",
        )
        need(self.slack_lr > 0, f"--slack-lr must be > 0, got {self.slack_lr}")
        need(
            self.dual_optimizer in ("adam", "sgd"),
            f"--dual-optimizer must be adam or sgd, got {self.dual_optimizer!r}",
        )
        need(self.dual_lr > 0, f"--dual-lr must be > 0, got {self.dual_lr}")
        need(
            self.warmup_steps is None or self.warmup_steps >= 0,
            f"--warmup-steps must be >= 0, got {self.warmup_steps}",
        )
        need(self.tolerance >= 0, f"--tolerance must be >= 0, got {self.tolerance}")
        need(self.chunk_steps >= 1, f"--chunk-steps must be >= 1, got {self.chunk_steps}")
        need(self.eval_batch_size >= 1, "--eval-batch-size must be >= 1")
        need(
            self.checkpoint_every is None or self.checkpoint_every >= 1,
            f"--checkpoint-every must be >= 1, got {self.checkpoint_every}",
        )
        need(
            self.keep_checkpoints >= 1,
            f"--keep-checkpoints must be >= 1, got {self.keep_checkpoints}",
        )
        need(
            not (self.resume and self.overwrite),
            "--resume and --overwrite contradict each other: pass one of them",
        )


def main(argv=None) -> int:
    cfg, _ = config_from_args(Config, argv, __doc__.split("\n\n")[0], "experiments.text_classify")

    def go():
        from cudt.text import run_experiment

        run_experiment(cfg)

    return run_cli(go)


if __name__ == "__main__":
    sys.exit(main())
