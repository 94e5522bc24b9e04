"""GGUF tokenizers <-> ``tokenizers.Tokenizer``: llama.cpp's byte-level BPE metadata
(``tokenizer.ggml.model == "gpt2"``: ``tokens``, ``merges``, ``token_type``, ``pre``).

:func:`tokenizer_from_gguf` rebuilds the tokenizer llama.cpp runs: the vocabulary and merges as
stored, control tokens (type 3) as special added tokens and user-defined ones (type 4) as added
tokens, each matched whole in text; the pre-tokenizer regex of ``tokenizer.ggml.pre`` (GPT-2,
SmolLM's digit split, Llama 3, Qwen2), and a BOS post-processor when ``add_bos_token`` is set
(absent, llama.cpp's default: on for Llama 3's pre-tokenizers, whose BPE also ignores merges).
:func:`tokenizer_to_gguf` gives those fields of a byte-level BPE tokenizer for writing, and
:func:`gguf_pre_tokenizer` the ``pre`` name of its splitting (the inverse of the table below).
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

from cudt.models.hf import ModelFolderError

__all__ = [
    "TOKEN_CONTROL",
    "TOKEN_USER_DEFINED",
    "adds_bos",
    "gguf_pre_tokenizer",
    "tokenizer_from_gguf",
    "tokenizer_to_gguf",
]

# Pre-tokenizer regexes of llama.cpp's ``tokenizer.ggml.pre`` values (llama-vocab.cpp).
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = _LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")
# value: (regex, split digits one by one first)
_PRE_TOKENIZERS = {
    "default": (_GPT2, False),
    "gpt2": (_GPT2, False),
    "smollm": (_GPT2, True),
    "llama-bpe": (_LLAMA3, False),
    "llama3": (_LLAMA3, False),
    "qwen2": (_QWEN2, False),
}
# the pre-tokenizers llama.cpp runs as Llama 3's: a word that is one vocabulary entry is that
# token, whatever the merges (BPE ``ignore_merges``), and BOS is prepended unless the file's
# ``add_bos_token`` says otherwise (llama-vocab.cpp)
_LLAMA3_FAMILY = ("llama-bpe", "llama3")
# tokenizer.ggml.token_type values (llama.cpp's llama_token_type)
TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED = 1, 3, 4, 5


def tokenizer_from_gguf(meta: Any, path: pathlib.Path | None = None) -> Any:
    """A ``tokenizers.Tokenizer`` from a GGUF file's ``tokenizer.ggml.*`` metadata (byte-level
    BPE): vocabulary and merges as stored, control and user-defined tokens as single added
    tokens, llama.cpp's pre-tokenizer for ``tokenizer.ggml.pre``. ``meta`` is a reader's
    metadata or a plain dict of those keys. None when the file has no tokenizer."""
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
    )

    get = meta.get
    name = path.name if path is not None else "the GGUF file"
    kind = get("tokenizer.ggml.model")
    tokens = get("tokenizer.ggml.tokens")
    if kind is None or tokens is None:
        return None
    if kind != "gpt2":
        raise ModelFolderError(
            f"{name}: GGUF key 'tokenizer.ggml.model' = {kind!r} is not supported (only 'gpt2', "
            "byte-level BPE): use a Hugging Face folder with tokenizer.json instead"
        )
    pre = get("tokenizer.ggml.pre") or "default"
    if pre not in _PRE_TOKENIZERS:
        raise ModelFolderError(
            f"{name}: GGUF key 'tokenizer.ggml.pre' = {pre!r} is not supported (supported: "
            f"{', '.join(_PRE_TOKENIZERS)}): use a Hugging Face folder with tokenizer.json"
        )
    merges = [tuple(m.split(" ", 1)) for m in (get("tokenizer.ggml.merges") or [])]
    types = list(get("tokenizer.ggml.token_type") or [1] * len(tokens))
    if len(types) != len(tokens):
        raise ModelFolderError(
            f"{name}: GGUF key 'tokenizer.ggml.token_type' has {len(types)} entries for "
            f"{len(tokens)} tokens: the file is corrupt; convert the model again"
        )
    vocab = {tok: i for i, tok in enumerate(tokens)}
    llama3 = pre in _LLAMA3_FAMILY
    tokenizer = Tokenizer(
        models.BPE(vocab=vocab, merges=merges, fuse_unk=False, ignore_merges=llama3)
    )
    regex, digits = _PRE_TOKENIZERS[pre]
    split = pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False)
    steps = [pre_tokenizers.Digits(individual_digits=True)] if digits else []
    steps += [split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tokenizer.decoder = decoders.ByteLevel()
    added = [
        AddedToken(tok, special=(kind_ == TOKEN_CONTROL), normalized=False)
        for tok, kind_ in zip(tokens, types, strict=True)
        if kind_ in (TOKEN_CONTROL, TOKEN_USER_DEFINED)
    ]
    specials = [t for t in added if t.special]
    tokenizer.add_special_tokens(specials)
    tokenizer.add_tokens([t for t in added if not t.special])
    bos = get("tokenizer.ggml.bos_token_id")
    add_bos = get("tokenizer.ggml.add_bos_token")
    add_bos = llama3 if add_bos is None else add_bos  # llama.cpp's default where the key is absent
    if add_bos and bos is not None and 0 <= bos < len(tokens):
        # llama.cpp prepends BOS when this is set: encode(..., add_special_tokens=True) does too
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{tokens[bos]} $A", special_tokens=[(tokens[bos], int(bos))]
        )
    return tokenizer


def gguf_pre_tokenizer(tokenizer: Any) -> str:
    """The ``tokenizer.ggml.pre`` name of a byte-level BPE ``tokenizers.Tokenizer``: the entry
    of llama.cpp's table whose regex (a ``Split`` step, or GPT-2's for a ``ByteLevel`` step that
    splits itself) and digit splitting it has, so llama.cpp cuts text where it does. One line
    when it is none of them, or not byte-level."""
    raw = json.loads(tokenizer.to_str())
    steps, todo = [], [raw.get("pre_tokenizer") or {}]
    while todo:
        step = todo.pop(0)
        if step.get("type") == "Sequence":
            todo = list(step.get("pretokenizers") or []) + todo
        else:
            steps.append(step)
    kinds = [s.get("type") for s in steps]
    if "ByteLevel" not in kinds or (raw.get("decoder") or {}).get("type") != "ByteLevel":
        raise ModelFolderError(
            f"a GGUF file holds byte-level BPE tokenizers (llama.cpp's gpt2 model); this one "
            f"pre-tokenizes with {', '.join(map(str, kinds)) or 'nothing'}: save a Hugging "
            "Face folder instead"
        )
    digits = any(s.get("type") == "Digits" and s.get("individual_digits") for s in steps)
    regexes = [(s.get("pattern") or {}).get("Regex") for s in steps if s.get("type") == "Split"] + [
        _GPT2 for s in steps if s.get("type") == "ByteLevel" and s.get("use_regex", True)
    ]
    for name in ("gpt2", "smollm", "llama-bpe", "qwen2"):
        if [_PRE_TOKENIZERS[name][0]] == regexes and _PRE_TOKENIZERS[name][1] == digits:
            if name in _LLAMA3_FAMILY and not (raw.get("model") or {}).get("ignore_merges"):
                raise ModelFolderError(
                    "the tokenizer splits text as llama.cpp's llama-bpe does, but applies its "
                    "merges to whole-vocabulary words, which llama-bpe does not (Llama 3's "
                    "tokenizer.json sets ignore_merges): save a Hugging Face folder instead"
                )
            return name
    raise ModelFolderError(
        "the tokenizer splits text in a way none of llama.cpp's pre-tokenizers gpt2, smollm, "
        "llama-bpe, qwen2 does (tokenizer.ggml.pre): save a Hugging Face folder instead"
    )


def adds_bos(tokenizer: Any) -> bool:
    """Whether the tokenizer's post-processor puts one token in front of a text (GGUF
    ``tokenizer.ggml.add_bos_token``)."""
    bare = tokenizer.encode("a", add_special_tokens=False).ids
    full = tokenizer.encode("a", add_special_tokens=True).ids
    return len(full) == len(bare) + 1 and full[1:] == bare


def tokenizer_to_gguf(
    tokenizer: Any, vocab_size: int | None = None
) -> tuple[list[str], list[str], list[int]]:
    """``(tokens, merges, token_types)`` of a byte-level BPE ``tokenizers.Tokenizer``; ids it
    lacks, up to ``vocab_size`` (a model may have more embedding rows than tokens), are
    ``[PAD{id}]`` tokens of type unused, as llama.cpp's converter writes them."""
    raw = json.loads(tokenizer.to_str())
    model = raw.get("model") or {}
    if model.get("type") != "BPE":
        raise ModelFolderError(
            f"a GGUF file holds byte-level BPE tokenizers (llama.cpp's gpt2 model), not "
            f"{model.get('type')!r} ones: save a Hugging Face folder instead, or write the "
            "GGUF file without a tokenizer"
        )
    vocab = dict(model["vocab"])
    added = {t["content"]: t for t in raw.get("added_tokens") or []}
    for tok, info in added.items():
        vocab.setdefault(tok, info["id"])
    size = max(max(vocab.values()) + 1, vocab_size or 0)
    tokens = [f"[PAD{i}]" for i in range(size)]
    types = [TOKEN_UNUSED] * size
    for tok, i in vocab.items():
        tokens[i] = tok
        types[i] = (
            (TOKEN_CONTROL if added[tok]["special"] else TOKEN_USER_DEFINED)
            if tok in added
            else TOKEN_NORMAL
        )
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
    return tokens, merges, types
