"""GGUF tokenizers <-> ``tokenizers.Tokenizer``: llama.cpp's byte-level BPE metadata
(``tokenizer.ggml.model == "gpt2"``: ``tokens``, ``merges``, ``token_type``, ``pre``).

:func:`tokenizer_from_gguf` rebuilds the tokenizer llama.cpp runs: the vocabulary and merges as
stored, control tokens (type 3) as special added tokens and user-defined ones (type 4) as added
tokens, each matched whole in text; the pre-tokenizer regex of ``tokenizer.ggml.pre`` (GPT-2,
SmolLM's digit split, Llama 3, Qwen2), and a BOS post-processor when ``add_bos_token`` is set.
:func:`tokenizer_to_gguf` gives those fields of a byte-level BPE tokenizer for writing.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

from cudt.models.hf import ModelFolderError

__all__ = [
    "TOKEN_CONTROL",
    "TOKEN_USER_DEFINED",
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
# tokenizer.ggml.token_type values of added tokens
TOKEN_CONTROL, TOKEN_USER_DEFINED = 3, 4


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
    vocab = {tok: i for i, tok in enumerate(tokens)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
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
    if get("tokenizer.ggml.add_bos_token") and bos is not None and 0 <= bos < len(tokens):
        # llama.cpp prepends BOS when this is set: encode(..., add_special_tokens=True) does too
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{tokens[bos]} $A", special_tokens=[(tokens[bos], int(bos))]
        )
    return tokenizer


def tokenizer_to_gguf(tokenizer: Any) -> tuple[list[str], list[str], list[int]]:
    """``(tokens, merges, token_types)`` of a byte-level BPE ``tokenizers.Tokenizer``."""
    raw = json.loads(tokenizer.to_str())
    model = raw.get("model") or {}
    if model.get("type") != "BPE":
        raise ModelFolderError(
            f"write_gguf writes byte-level BPE tokenizers, not {model.get('type')!r}: pass "
            "tokenizer=None"
        )
    vocab = dict(model["vocab"])
    added = {t["content"]: t for t in raw.get("added_tokens") or []}
    for tok, info in added.items():
        vocab.setdefault(tok, info["id"])
    tokens = [""] * (max(vocab.values()) + 1)
    for tok, i in vocab.items():
        tokens[i] = tok
    types = [
        (TOKEN_CONTROL if added[t]["special"] else TOKEN_USER_DEFINED) if t in added else 1
        for t in tokens
    ]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
    return tokens, merges, types
