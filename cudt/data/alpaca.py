"""Alpaca instruction data for causal-LM fine-tuning: reading, prompting, tokenizing, splits.

Pipeline::

    alpaca_data.json / .jsonl --load_alpaca--> records --split_alpaca(seed)--> train / val / test
    (generated sets in the same format, no file: cudt.data.instructions)
    records + tokenizer.json --tokenize_alpaca(max_length)--> input_ids, attention_mask, labels,
                                                              loss_mask [N, T], prompt_length [N]
    records + tokenizer.json --prompt_batches(batch_size, max_prompt_length)--> left-padded prompts

* Records follow the Stanford ``alpaca_data.json`` layout: a JSON list of
  ``{"instruction": str, "input": str, "output": str}`` (``input`` may be missing or ``""``);
  JSON lines (one object a line) are read too.
* The prompt is the Stanford Alpaca template (:data:`ALPACA_PROMPT`, or
  :data:`ALPACA_PROMPT_NO_INPUT` when the input is empty); the response is the output followed by
  the tokenizer's EOS token.
* Tokenizers are ``tokenizers.Tokenizer`` objects read from a ``tokenizer.json`` (what a Hugging
  Face Llama folder ships), wrapped with their BOS / EOS / PAD ids by :func:`load_tokenizer`. The
  no-download default, :func:`build_word_tokenizer`, is saved as a ``tokenizer.json`` and read
  back through the same :func:`load_tokenizer`.

Every bad input (missing file, invalid JSON, a record without ``"output"``, ...) raises
:class:`AlpacaDataError`, one line naming the file, the record and the fix; it is both a
:class:`cudt.errors.DataError` and a :class:`cudt.errors.UsageError`.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from cudt.errors import DataError, UsageError

__all__ = [
    "ALPACA_PROMPT",
    "ALPACA_PROMPT_NO_INPUT",
    "AlpacaDataError",
    "AlpacaRecord",
    "AlpacaSplits",
    "InstructionTokenizer",
    "PromptBatch",
    "TokenizedAlpaca",
    "alpaca_chat_template",
    "alpaca_prompt",
    "alpaca_splits",
    "build_word_tokenizer",
    "deal_splits",
    "load_alpaca",
    "load_tokenizer",
    "prompt_batches",
    "shared_records",
    "split_alpaca",
    "tokenize_alpaca",
    "write_alpaca",
]


class AlpacaDataError(DataError, UsageError):
    """Unusable instruction data or tokenizer: a missing or malformed file, bad sizes."""


# The Stanford Alpaca templates (tatsu-lab/stanford_alpaca, PROMPT_DICT), with a newline after
# "### Response:" so the response starts on its own line, as in Alpaca-LoRA and most fine-tunes.
ALPACA_PROMPT = (
    "Below is an instruction that describes a task, paired with an input that provides further "
    "context. Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
)
ALPACA_PROMPT_NO_INPUT = (
    "Below is an instruction that describes a task. Write a response that appropriately "
    "completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Response:\n"
)

_FORMAT_HINT = (
    'every record needs string "instruction" and "output" keys (and an optional string "input")'
)


# --------------------------------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class AlpacaRecord:
    """One instruction example: ``input`` is ``""`` when the instruction stands alone."""

    instruction: str
    input: str
    output: str

    def prompt(self) -> str:
        """:func:`alpaca_prompt` of this record."""
        return alpaca_prompt(self)


def alpaca_prompt(record: AlpacaRecord) -> str:
    """The Stanford Alpaca prompt of ``record``: with-input template when ``record.input`` is not
    empty, else the no-input one. Ends with ``"### Response:\\n"``; the response follows it."""
    if record.input:
        return ALPACA_PROMPT.format(instruction=record.instruction, input=record.input)
    return ALPACA_PROMPT_NO_INPUT.format(instruction=record.instruction)


def alpaca_chat_template(bos: bool) -> str:
    """A Jinja chat template that writes each user turn as :func:`alpaca_prompt` does a record:
    the turn's text as the instruction, and its ``input`` key, where the message has one that is
    not empty, as the input (:data:`ALPACA_PROMPT`; else :data:`ALPACA_PROMPT_NO_INPUT`); each
    assistant turn as its text and the EOS token; after a ``bos_token`` when ``bos``. What a
    model trained on Alpaca prompts (:func:`tokenize_alpaca`) reads, for tools that format
    prompts by the chat template (transformers' ``apply_chat_template``, which passes a
    message's extra keys through). Other roles are refused."""
    content, given = "{{ message['content'] }}", "{{ message['input'] }}"
    with_input = ALPACA_PROMPT.format(instruction=content, input=given)
    without = ALPACA_PROMPT_NO_INPUT.format(instruction=content)
    return (
        ("{{ bos_token }}" if bos else "")
        + "{% for message in messages %}{% if message['role'] == 'user' %}"
        + "{% if message['input'] %}"
        + with_input
        + "{% else %}"
        + without
        + "{% endif %}"
        + "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}"
        + "{% else %}{{ raise_exception('the Alpaca template has user and assistant turns "
        + "only') }}{% endif %}{% endfor %}"
    )


def shared_records(ours: Sequence[AlpacaRecord], others: Sequence[AlpacaRecord]) -> int:
    """How many records of ``others`` are also in ``ours`` (the same instruction, input and
    output): a test record that is a training record too is not held out."""
    seen = set(ours)
    return sum(record in seen for record in others)


def _record(obj: Any, where: str) -> AlpacaRecord:
    """Validate one decoded JSON object; ``where`` names the file and record for the error."""
    if not isinstance(obj, dict):
        raise AlpacaDataError(f"{where} is a JSON {_json_type(obj)}, not an object: {_FORMAT_HINT}")
    for key in ("instruction", "output"):
        if key not in obj:
            keys = ", ".join(sorted(map(str, obj))) or "none"
            raise AlpacaDataError(
                f'{where} has no "{key}" key (keys: {keys}): {_FORMAT_HINT}; fix or remove it'
            )
    fields = {
        "instruction": obj["instruction"],
        # null is how many exported Alpaca-style files (pandas, HF datasets) spell "no input"
        "input": "" if obj.get("input") is None else obj["input"],
        "output": obj["output"],
    }
    for key, value in fields.items():
        if not isinstance(value, str):
            raise AlpacaDataError(
                f'{where} has a {_json_type(value)} "{key}", not a string: {_FORMAT_HINT}'
            )
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as err:  # JSON's \ud83d alone: half of an emoji, cut
            bad = value[err.start : err.end].encode("unicode_escape").decode()
            raise AlpacaDataError(
                f'{where} has an unpaired surrogate {bad} in "{key}" (half of a character '
                "written as a UTF-16 pair, e.g. an emoji cut in two): fix or remove it"
            ) from None
    if not fields["instruction"].strip():
        raise AlpacaDataError(f'{where} has an empty "instruction": fill it in or remove it')
    return AlpacaRecord(**fields)


def _lines(text: str) -> list[str]:
    """``text``'s lines, split at ``\\n`` only (a trailing ``\\r`` dropped): ``str.splitlines``
    also breaks at U+2028, U+2029 and U+0085, which JSON allows unescaped inside a string
    (``json.dumps(ensure_ascii=False)`` writes them so)."""
    return [line.removesuffix("\r") for line in text.split("\n")]


def _json_type(value: Any) -> str:
    """``value``'s JSON type name, for an error (``null``, not ``NoneType``)."""
    names = {type(None): "null", bool: "boolean", int: "number", float: "number"}
    names |= {str: "string", list: "array", dict: "object"}
    return names.get(type(value), type(value).__name__)


def _parse_json_lines(text: str, path: Path) -> list[tuple[Any, str]]:
    """``(object, where)`` per non-blank line."""
    out = []
    for lineno, line in enumerate(_lines(text), start=1):
        if not line.strip():
            continue
        where = f"'{path}' record {len(out)} (line {lineno})"
        try:
            out.append((json.loads(line), where))
        except json.JSONDecodeError as err:
            try:  # a JSON list pretty-printed into a .jsonl file
                whole = isinstance(json.loads(text), list)
            except json.JSONDecodeError:
                whole = False
            if whole:
                raise AlpacaDataError(
                    f"'{path}' holds one JSON list, not one JSON object per line: name it "
                    f"{Path(path).with_suffix('.json').name} (a .json file is read as a list)"
                ) from err
            raise AlpacaDataError(
                f"'{path}' line {lineno} is not valid JSON ({err.msg}, column {err.colno}): "
                "fix the line; a .jsonl file holds one JSON object per line"
            ) from err
    return out


def load_alpaca(path: str | Path) -> tuple[AlpacaRecord, ...]:
    """Read an Alpaca-format file: a JSON list of records (``alpaca_data.json``) or JSON lines.

    ``.jsonl`` / ``.ndjson`` files are read line by line (blank lines skipped); any other name is
    parsed as one JSON document, falling back to JSON lines when that fails and the first line is
    an object on its own. A missing or null ``"input"`` means ``""``; other keys are ignored.
    Records come in file order. Raises :class:`AlpacaDataError` naming the file and the record
    index for a missing file, invalid JSON, an empty list, a record that is not an object, lacks
    ``"instruction"`` or ``"output"``, has a non-string field or an empty instruction.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        what = "is a folder" if path.is_dir() else "does not exist"
        raise AlpacaDataError(
            f"Alpaca data file '{path}' {what}: pass the path of a JSON file such as "
            "alpaca_data.json (a list of instruction/input/output records) or a .jsonl file"
        )
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise AlpacaDataError(
            f"'{path}' is not UTF-8 ({err.reason} at byte {err.start}): re-save it as UTF-8 JSON"
        ) from err
    lines = path.suffix.lower() in (".jsonl", ".ndjson")
    if not text.strip():  # the layout its name says: a JSON list in a .jsonl file is refused
        layout = "one JSON record per line" if lines else "a JSON list of records"
        raise AlpacaDataError(f"'{path}' is empty: it must hold {layout}")

    if lines:
        items = _parse_json_lines(text, path)
        if len(items) == 1 and isinstance(items[0][0], list):  # a JSON list on one line
            raise AlpacaDataError(
                f"'{path}' holds one JSON list, not one JSON object per line: name it "
                f"{path.with_suffix('.json').name} (a .json file is read as a list)"
            )
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            first = _lines(text.strip())[0]
            try:
                looks_like_lines = isinstance(json.loads(first), dict) and first != text.strip()
            except json.JSONDecodeError:
                looks_like_lines = False
            if not looks_like_lines:
                raise AlpacaDataError(
                    f"'{path}' is not valid JSON ({err.msg} at line {err.lineno} column "
                    f"{err.colno}): fix the file (a JSON list of records, or .jsonl with one "
                    "record per line)"
                ) from err
            items = _parse_json_lines(text, path)
        else:
            if not isinstance(data, list):
                raise AlpacaDataError(
                    f"'{path}' holds a JSON {_json_type(data)}, not a list of records: "
                    "write the records as a JSON list (the alpaca_data.json layout), or one "
                    f"object per line in {path.with_suffix('.jsonl').name}"
                )
            items = [(obj, f"'{path}' record {i}") for i, obj in enumerate(data)]
    if not items:
        raise AlpacaDataError(
            f"'{path}' holds no records: add instruction/input/output records to it"
        )
    return tuple(_record(obj, where) for obj, where in items)


def write_alpaca(records: Sequence[AlpacaRecord], path: str | Path) -> Path:
    """Write ``records`` in the ``alpaca_data.json`` layout (JSON lines for ``.jsonl``)."""
    path = Path(path)
    rows = [dataclasses.asdict(r) for r in records]
    if path.suffix.lower() in (".jsonl", ".ndjson"):
        text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    else:
        text = json.dumps(rows, indent=4, ensure_ascii=False) + "\n"
    path.write_text(text, encoding="utf-8")
    return path


# --------------------------------------------------------------------------------------------------
# Splits
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class AlpacaSplits:
    """Train / val / test records of one source and a description of the source."""

    train: tuple[AlpacaRecord, ...]
    val: tuple[AlpacaRecord, ...]
    test: tuple[AlpacaRecord, ...]
    source: str


def split_alpaca(
    records: Sequence[AlpacaRecord],
    *,
    num_train: int | None,
    num_val: int,
    num_test: int,
    seed: int = 0,
) -> AlpacaSplits:
    """Seeded disjoint train / val / test subsets of ``records``, each in the records' order.

    A seeded permutation deals ``num_test`` records to test, the next ``num_val`` to val and the
    next ``num_train`` to train (``None``: all the rest), so test and val do not change with
    ``num_train``. ``num_train=0`` deals no training records (a split given otherwise, as
    ``--train-data``).
    """
    for name, value in (("num_val", num_val), ("num_test", num_test)):
        if value < 0:
            raise AlpacaDataError(f"{name} must be >= 0, got {value}: pass a count")
    if num_train is not None and num_train < 0:
        raise AlpacaDataError(f"num_train must be >= 0 or None, got {num_train}: pass a count")
    n = len(records)
    n_train = n - num_val - num_test if num_train is None else num_train
    if (n_train < 1 and num_train != 0) or n_train + num_val + num_test > n:
        raise AlpacaDataError(
            f"cannot split {n} records into train {num_train}, val {num_val} and test "
            f"{num_test}: pass smaller sizes (--num-train, --num-val, --num-test) or more records"
        )
    perm = np.random.default_rng([seed, 2]).permutation(n)
    parts = np.split(perm, [num_test, num_test + num_val, num_test + num_val + n_train])

    def take(idx: np.ndarray) -> tuple[AlpacaRecord, ...]:
        return tuple(records[int(i)] for i in np.sort(idx))

    return AlpacaSplits(
        train=take(parts[2]), val=take(parts[1]), test=take(parts[0]), source=f"{n} records"
    )


def alpaca_splits(
    path: str | Path,
    *,
    num_train: int | None = 2000,
    num_val: int = 200,
    num_test: int = 200,
    seed: int = 0,
) -> AlpacaSplits:
    """Train / val / test records from an Alpaca file: :func:`load_alpaca`, each exact repeat of
    a record (instruction, input and output) left out after its first, then :func:`deal_splits`
    (``num_train=None``: every record not in val or test). The generated
    sets: :func:`cudt.data.instructions.toy_splits`, :func:`cudt.data.instructions.task_splits`.
    """
    records = load_alpaca(path)
    unique = list(dict.fromkeys(records))  # exact repeats after the first left out: dealt
    repeats = len(records) - len(unique)  # apart, a copy in test would be a training record
    return deal_splits(
        unique,
        f"Alpaca file {path}" + (f" ({repeats} exact repeats left out)" if repeats else ""),
        num_train=num_train,
        num_val=num_val,
        num_test=num_test,
        seed=seed,
    )


def deal_splits(
    records: Sequence[AlpacaRecord],
    source: str,
    *,
    num_train: int | None,
    num_val: int,
    num_test: int,
    seed: int = 0,
) -> AlpacaSplits:
    """:func:`split_alpaca` of ``records``, described as ``source`` with the split sizes and
    seed (what the runs print and their checkpoints' fingerprint holds)."""
    try:
        out = split_alpaca(
            records, num_train=num_train, num_val=num_val, num_test=num_test, seed=seed
        )
    except AlpacaDataError as err:  # which records could not be dealt
        raise AlpacaDataError(f"{source}: {err}") from None
    return dataclasses.replace(
        out,
        source=f"{source}: train {len(out.train)}, val {len(out.val)}, test {len(out.test)} "
        f"of {len(records)} (split seed={seed})",
    )


# --------------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------------

# Fallbacks when tokenizer_config.json does not name the token (Llama 2, Llama 3, GPT-2, Gemma).
_EOS_NAMES = ("</s>", "<|end_of_text|>", "<|endoftext|>", "<eos>", "<|eot_id|>")
_PAD_NAMES = ("<pad>", "[PAD]", "<|pad|>", "<|finetune_right_pad_id|>")


@dataclasses.dataclass(frozen=True, eq=False)
class InstructionTokenizer:
    """A ``tokenizers.Tokenizer`` (padding and truncation off) with its special token ids.

    ``bos_id`` is ``None`` when the tokenizer puts nothing in front of a sequence. ``pad_id`` only
    fills positions that masks exclude; it may equal ``eos_id`` (Llama has no pad token).
    """

    tokenizer: Any  # tokenizers.Tokenizer
    bos_id: int | None
    eos_id: int
    pad_id: int
    path: Path | None = None

    @property
    def vocab_size(self) -> int:
        return int(self.tokenizer.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` alone: no BOS, no EOS (the post-processor is not applied)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def encode_batch(self, texts: Sequence[str], *, specials: bool = True) -> list[list[int]]:
        """Token ids of each text (no BOS, no EOS added). ``specials=False``: the texts' own
        characters only, a special token's text (``</s>`` in an output: an HTML strike-through)
        encoded as ordinary text, never as that token; a chat template's rendering needs its
        special tokens parsed (``True``)."""
        if specials:
            return [
                list(e.ids) for e in self.tokenizer.encode_batch(texts, add_special_tokens=False)
            ]
        before = self.tokenizer.encode_special_tokens  # the caller's own setting, put back
        self.tokenizer.encode_special_tokens = True
        try:
            out = self.tokenizer.encode_batch(texts, add_special_tokens=False)
        finally:
            self.tokenizer.encode_special_tokens = before
        return [list(e.ids) for e in out]

    def decode(self, ids: Sequence[int] | np.ndarray, *, skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(
            [int(i) for i in np.asarray(ids).reshape(-1)], skip_special_tokens=skip_special_tokens
        )


def _token_id(tokenizer: Any, token: str, what: str, where: str) -> int:
    token_id = tokenizer.token_to_id(token)
    if token_id is None:
        raise AlpacaDataError(
            f"{what} token {token!r} is not in the vocabulary of {where}: pass {what}= with a "
            "token the tokenizer has"
        )
    return int(token_id)


def _config_token(config: dict[str, Any], key: str) -> str | None:
    """``tokenizer_config.json`` writes a token as a string or as ``{"content": ...}``."""
    value = config.get(key)
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _leading_token(tokenizer: Any) -> int | None:
    """The id the tokenizer's post-processor puts in front of a single sequence, if exactly one."""
    bare = tokenizer.encode("a", add_special_tokens=False).ids
    full = tokenizer.encode("a", add_special_tokens=True).ids
    for k in range(len(full) - len(bare) + 1):
        if full[k : k + len(bare)] == bare:
            return int(full[0]) if k == 1 else None
    return None


def _wrap(
    tokenizer: Any,
    config: dict[str, Any],
    *,
    bos: str | None | Literal["auto"],
    eos: str | None,
    pad: str | None,
    path: Path | None,
    where: str,
) -> InstructionTokenizer:
    from tokenizers import Tokenizer

    # A private copy: the caller's tokenizer keeps its own padding and truncation settings.
    tok = Tokenizer.from_str(tokenizer.to_str())
    tok.no_padding()
    tok.no_truncation()

    if bos == "auto":
        config_bos = _config_token(config, "bos_token")
        if config.get("add_bos_token") is False:
            bos_id = None
        elif config.get("add_bos_token") is True and config_bos is not None:
            bos_id = _token_id(tok, config_bos, "bos", where)
        else:
            bos_id = _leading_token(tok)
    elif bos is None:
        bos_id = None
    else:
        bos_id = _token_id(tok, bos, "bos", where)

    eos = eos or _config_token(config, "eos_token")
    if eos is None:
        eos = next((t for t in _EOS_NAMES if tok.token_to_id(t) is not None), None)
    if eos is None:
        raise AlpacaDataError(
            f"cannot tell the end-of-sequence token of {where} (no eos_token in "
            f"tokenizer_config.json, none of {', '.join(_EOS_NAMES)} in the vocabulary): pass eos="
        )
    eos_id = _token_id(tok, eos, "eos", where)

    pad = pad or _config_token(config, "pad_token")
    if pad is None:
        pad = next((t for t in _PAD_NAMES if tok.token_to_id(t) is not None), None)
    pad_id = eos_id if pad is None else _token_id(tok, pad, "pad", where)
    return InstructionTokenizer(tok, bos_id=bos_id, eos_id=eos_id, pad_id=pad_id, path=path)


def load_tokenizer(
    path: Any,
    *,
    bos: str | None | Literal["auto"] = "auto",
    eos: str | None = None,
    pad: str | None = None,
) -> InstructionTokenizer:
    """A ``tokenizer.json`` (or a model folder holding one) as an :class:`InstructionTokenizer`.

    ``path`` may also be a ``tokenizers.Tokenizer`` object (copied, never changed). Special
    tokens, each overridable by name:

    * BOS (``bos="auto"``): ``tokenizer_config.json``'s ``bos_token`` when its ``add_bos_token``
      is true, none when it is false, else the token the tokenizer's own post-processor puts in
      front (Llama 2 ``<s>``, Llama 3 ``<|begin_of_text|>``; none for GPT-2). ``bos=None``: none.
    * EOS: ``tokenizer_config.json``'s ``eos_token``, else the first of ``</s>``,
      ``<|end_of_text|>``, ``<|endoftext|>``, ``<eos>``, ``<|eot_id|>`` in the vocabulary.
    * PAD: ``pad_token``, else ``<pad>``, ``[PAD]``, ``<|pad|>``,
      ``<|finetune_right_pad_id|>``, else the EOS id (pads are masked out everywhere).

    ``tokenizer_config.json`` is read from the folder of ``tokenizer.json`` when present.
    """
    from tokenizers import Tokenizer

    if isinstance(path, Tokenizer):
        return _wrap(path, {}, bos=bos, eos=eos, pad=pad, path=None, where="the tokenizer")
    path = Path(path).expanduser()
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise AlpacaDataError(
            f"no tokenizer file at '{file}': pass a tokenizer.json or a model folder holding one "
            "(a Hugging Face Llama folder; or save build_word_tokenizer(records) there)"
        )
    try:
        tokenizer = Tokenizer.from_file(str(file))
    except Exception as err:  # tokenizers raises plain Exception subclasses
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise AlpacaDataError(
            f"'{file}' is not a readable tokenizer.json ({first}): replace it with the model's "
            "tokenizer.json (tokenizers format)"
        ) from err
    config: dict[str, Any] = {}
    config_file = file.parent / "tokenizer_config.json"
    if config_file.is_file():
        try:
            loaded = json.loads(config_file.read_text(encoding="utf-8-sig"))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise AlpacaDataError(
                f"'{config_file}' is not valid JSON ({err}): fix it or delete it"
            ) from err
        config = loaded if isinstance(loaded, dict) else {}
    return _wrap(tokenizer, config, bos=bos, eos=eos, pad=pad, path=file, where=f"'{file}'")


def _as_tokenizer(tokenizer: Any) -> InstructionTokenizer:
    return tokenizer if isinstance(tokenizer, InstructionTokenizer) else load_tokenizer(tokenizer)


# The word tokenizer: one token per word (with the space before it, SentencePiece style), per
# run of punctuation and per run of whitespace holding a newline, so decoding is exact.
_SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")
_SPLIT_PATTERN = r"\s*\n\s*|[^\w\s]+"


def _word_pre_tokenizer() -> Any:
    from tokenizers import Regex
    from tokenizers import pre_tokenizers as pt

    return pt.Sequence(
        [
            pt.Split(Regex(_SPLIT_PATTERN), behavior="isolated"),
            pt.Metaspace(replacement="\u2581", prepend_scheme="never", split=True),
        ]
    )


def build_word_tokenizer(records: Sequence[AlpacaRecord]) -> Any:
    """A word-level ``tokenizers.Tokenizer`` covering ``records`` and both prompt templates.

    Pre-tokenization splits at runs of punctuation and at whitespace holding a newline, then at
    spaces, a word keeping the space before it (``"\u2581word"``, as SentencePiece does), so
    ``decode(encode(text)) == text`` for any text made of known pieces. Ids: ``<pad>`` 0,
    ``<s>`` 1, ``</s>`` 2, ``<unk>`` 3, then the pieces by decreasing count (ties by name). The
    post-processor prepends ``<s>`` (like Llama's), so :func:`load_tokenizer` finds BOS ``<s>``,
    EOS ``</s>`` and PAD ``<pad>`` with no ``tokenizer_config.json``. Save it with
    ``tokenizer.save(".../tokenizer.json")``.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, processors

    if not records:
        raise AlpacaDataError("build_word_tokenizer got no records: pass the records to cover")
    pre = _word_pre_tokenizer()
    counts: Counter[str] = Counter()
    texts = [ALPACA_PROMPT.format(instruction="", input=""), ALPACA_PROMPT_NO_INPUT]
    texts[1] = texts[1].format(instruction="")
    for r in records:
        texts += [alpaca_prompt(r), r.output]
    for text in texts:
        counts.update(piece for piece, _ in pre.pre_tokenize_str(text))
    for special in _SPECIAL_TOKENS:
        counts.pop(special, None)
    pieces = sorted(counts, key=lambda p: (-counts[p], p))
    vocab = {t: i for i, t in enumerate((*_SPECIAL_TOKENS, *pieces))}

    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="never", split=True)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in _SPECIAL_TOKENS])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", vocab["<s>"])]
    )
    return tok


# --------------------------------------------------------------------------------------------------
# Tokenized training arrays
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class TokenizedAlpaca:
    """Right-padded causal-LM arrays of ``N`` records, ``T = max_length``.

    Row ``i`` holds ``[BOS] prompt response EOS`` then padding. ``labels[i, t]`` is the next
    token ``input_ids[i, t + 1]`` (``pad_id`` at the last real position and on padding).
    ``loss_mask[i, t]`` is 1 exactly where ``labels[i, t]`` is a response token or the EOS,
    i.e. ``t`` in ``[prompt_length[i] - 1, length[i] - 1)``. ``prompt_length`` counts BOS and the
    (possibly truncated) prompt; ``truncated`` flags rows that lost tokens to ``max_length``.
    """

    input_ids: np.ndarray  # [N, T] int32
    attention_mask: np.ndarray  # [N, T] int32
    labels: np.ndarray  # [N, T] int32
    loss_mask: np.ndarray  # [N, T] int32
    prompt_length: np.ndarray  # [N] int32
    truncated: np.ndarray  # [N] bool

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def take(self, indices: Sequence[int] | np.ndarray) -> TokenizedAlpaca:
        """The rows at ``indices``, in that order."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        return TokenizedAlpaca(**{f.name: getattr(self, f.name)[idx] for f in _FIELDS})

    def arrays(self) -> dict[str, np.ndarray]:
        """The five training arrays by name (``truncated`` left out)."""
        return {f.name: getattr(self, f.name) for f in _FIELDS if f.name != "truncated"}


_FIELDS = dataclasses.fields(TokenizedAlpaca)


def _fit(
    prompt: list[int], response: list[int], space: int, min_response: int
) -> tuple[list[int], list[int]]:
    """The truncation rule of :func:`tokenize_alpaca` for one example (``space`` excludes BOS)."""
    if len(prompt) + len(response) <= space:
        return prompt, response
    keep_response = min(len(response), max(min_response, space - len(prompt)))
    keep_prompt = space - keep_response
    return prompt[len(prompt) - keep_prompt :], response[:keep_response]


def _prompt_ids(tok: InstructionTokenizer, texts: list[str], specials: bool) -> list[list[int]]:
    """The prompts' ids without a leading BOS when the tokenizer adds one (a chat template that
    writes ``bos_token`` first: BOS once, and truncation keeps it)."""
    ids = tok.encode_batch(texts, specials=specials)
    if tok.bos_id is None:
        return ids
    return [p[1:] if p[:1] == [tok.bos_id] else p for p in ids]


def tokenize_alpaca(
    records: Sequence[AlpacaRecord],
    tokenizer: Any,
    max_length: int,
    *,
    min_response_tokens: int | None = None,
    prompt: Callable[[AlpacaRecord], str] = alpaca_prompt,
    prompt_specials: bool = False,
) -> TokenizedAlpaca:
    """Tokenize ``records`` for causal-LM training on the responses (see :class:`TokenizedAlpaca`).

    ``tokenizer``: an :class:`InstructionTokenizer`, or anything :func:`load_tokenizer` takes.
    The prompt (``prompt(record)``, by default :func:`alpaca_prompt`; a chat template's
    rendering of the instruction for chat models) and the output are tokenized separately, then
    ``[BOS] + prompt + output + [EOS]`` (BOS only if the tokenizer has one).

    Truncation to ``max_length`` tokens, with ``S = max_length - (1 if BOS else 0)``: when
    prompt + response (output and EOS) exceed ``S``, the response keeps its first
    ``min(len(response), max(m, S - len(prompt)))`` tokens and the prompt its last
    ``S - kept response`` tokens, where ``m = min_response_tokens`` (default ``S // 4``). So the
    prompt is cut from the left first (its template header goes before the instruction), and a
    long prompt never leaves the response fewer than ``m`` tokens; a response cut at the right
    loses its EOS. BOS is always kept, and written once: a prompt whose tokens start with it (a
    chat template that writes ``bos_token``) gives it up to the front.

    The records' text is encoded as text: a special token's spelling in it (``</s>``) is not
    that token. ``prompt_specials``: the prompt's special tokens are parsed (a chat template's
    rendering, whose markers are special tokens; the record's words inside it are parsed too,
    as transformers' ``apply_chat_template`` does).
    """
    tok = _as_tokenizer(tokenizer)
    if not records:
        raise AlpacaDataError("tokenize_alpaca got no records: load or generate some first")
    n_bos = 0 if tok.bos_id is None else 1
    space = max_length - n_bos
    if space < 2:
        raise AlpacaDataError(
            f"max_length={max_length} leaves no room for a prompt and a response token: pass "
            f"max_length >= {n_bos + 2}"
        )
    m = max(1, space // 4) if min_response_tokens is None else min_response_tokens
    if not 1 <= m <= space - 1:
        raise AlpacaDataError(
            f"min_response_tokens={min_response_tokens} must be in [1, {space - 1}] for "
            f"max_length={max_length}: pass a value in that range"
        )
    prompts = _prompt_ids(tok, [prompt(r) for r in records], prompt_specials)
    outputs = tok.encode_batch([r.output for r in records], specials=False)

    n = len(records)
    input_ids = np.full((n, max_length), tok.pad_id, dtype=np.int32)
    labels = np.full((n, max_length), tok.pad_id, dtype=np.int32)
    attention_mask = np.zeros((n, max_length), dtype=np.int32)
    loss_mask = np.zeros((n, max_length), dtype=np.int32)
    prompt_length = np.zeros(n, dtype=np.int32)
    truncated = np.zeros(n, dtype=bool)
    for i, (p, o) in enumerate(zip(prompts, outputs, strict=True)):
        response = o + [tok.eos_id]
        p_kept, r_kept = _fit(p, response, space, m)
        row = ([tok.bos_id] if n_bos else []) + p_kept + r_kept
        length, start = len(row), n_bos + len(p_kept)
        input_ids[i, :length] = row
        attention_mask[i, :length] = 1
        labels[i, : length - 1] = row[1:]
        loss_mask[i, start - 1 : length - 1] = 1
        prompt_length[i] = start
        truncated[i] = len(p_kept) < len(p) or len(r_kept) < len(response)
    return TokenizedAlpaca(
        input_ids=input_ids,
        attention_mask=attention_mask,
        labels=labels,
        loss_mask=loss_mask,
        prompt_length=prompt_length,
        truncated=truncated,
    )


# --------------------------------------------------------------------------------------------------
# Prompt batches for generation
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class PromptBatch:
    """``B`` left-padded prompts ``[pad.. BOS prompt]``, ``P = max_prompt_length``.

    Generation continues every row at column ``P``. ``positions`` is each token's index among its
    row's real tokens (0 on padding). ``indices`` are the rows' positions in the records given;
    a final short batch is filled up with copies of its last prompt, marked ``valid == False``.
    """

    input_ids: np.ndarray  # [B, P] int32
    attention_mask: np.ndarray  # [B, P] int32
    positions: np.ndarray  # [B, P] int32
    prompt_length: np.ndarray  # [B] int32, real tokens incl. BOS
    indices: np.ndarray  # [B] int32
    valid: np.ndarray  # [B] bool


def prompt_batches(
    records: Sequence[AlpacaRecord],
    tokenizer: Any,
    *,
    batch_size: int,
    max_prompt_length: int,
    prompt: Callable[[AlpacaRecord], str] = alpaca_prompt,
    prompt_specials: bool = False,
) -> Iterator[PromptBatch]:
    """Yield the prompts of ``records`` in order, ``batch_size`` at a time, left-padded.

    Each row is ``[BOS] + prompt(record)`` (as in :func:`tokenize_alpaca`), the prompt cut from the left
    to fit ``max_prompt_length``. Every batch has the same shape ``[batch_size,
    max_prompt_length]``, so a jitted generation step compiles once. ``prompt_specials``: as
    :func:`tokenize_alpaca`'s.
    """
    tok = _as_tokenizer(tokenizer)
    if not records:
        raise AlpacaDataError("prompt_batches got no records: load or generate some first")
    n_bos = 0 if tok.bos_id is None else 1
    if batch_size < 1 or max_prompt_length < n_bos + 1:
        raise AlpacaDataError(
            f"prompt_batches needs batch_size >= 1 and max_prompt_length >= {n_bos + 1}, got "
            f"{batch_size} and {max_prompt_length}: pass larger values"
        )
    prompts = _prompt_ids(tok, [prompt(r) for r in records], prompt_specials)
    space = max_prompt_length - n_bos
    for start in range(0, len(records), batch_size):
        idx = list(range(start, min(start + batch_size, len(records))))
        valid = np.array([True] * len(idx) + [False] * (batch_size - len(idx)))
        idx += [idx[-1]] * (batch_size - len(idx))
        input_ids = np.full((batch_size, max_prompt_length), tok.pad_id, dtype=np.int32)
        mask = np.zeros((batch_size, max_prompt_length), dtype=np.int32)
        lengths = np.zeros(batch_size, dtype=np.int32)
        for b, i in enumerate(idx):
            prompt = prompts[i]
            row = ([tok.bos_id] if n_bos else []) + prompt[max(0, len(prompt) - space) :]
            input_ids[b, max_prompt_length - len(row) :] = row
            mask[b, max_prompt_length - len(row) :] = 1
            lengths[b] = len(row)
        positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0).astype(np.int32)
        yield PromptBatch(
            input_ids=input_ids,
            attention_mask=mask,
            positions=positions,
            prompt_length=lengths,
            indices=np.asarray(idx, dtype=np.int32),
            valid=valid,
        )
