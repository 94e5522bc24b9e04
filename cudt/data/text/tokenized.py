"""Text splits: raw texts (or premise/hypothesis pairs) with int32 labels, and their tokens.

A :class:`TextSplit` holds raw strings (one text, or a premise/hypothesis pair, per example) and
int32 labels; :class:`TextSplits` the train / val / test splits of one source.
:func:`tokenize_split` turns a split into ``(ids, mask)`` with the encoder's tokenizer;
:class:`TokenizedSplit`, :func:`tokenize_splits` and :func:`length_batches` are the tokenized form
the text classifier (:mod:`cudt.models.classifier`) is trained and evaluated on.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import jax.numpy as jnp
import numpy as np

from cudt.errors import DataError

if TYPE_CHECKING:
    from cudt.models.classifier import Batch, TextClassifier

__all__ = [
    "TextSplit",
    "TextSplits",
    "TokenizedSplit",
    "length_batches",
    "tokenize_split",
    "tokenize_splits",
]


# --------------------------------------------------------------------------------------------------
# Splits
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class TextSplit:
    """One split: raw texts (and second segments for pair tasks) with int32 labels.

    ``texts``: the first segment (a review, an MNLI premise). ``pairs``: the second segment (MNLI
    hypothesis), ``None`` for single-text tasks. ``labels``: ``[N]`` int32 in
    ``[0, num_classes)``.
    """

    texts: tuple[str, ...]
    pairs: tuple[str, ...] | None
    labels: np.ndarray  # [N] int32
    # what each example belongs to (aclImdb: its movie's URL), or None: a validation split
    # holds whole groups (:func:`cudt.data.text.load_text_data`)
    groups: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "texts", tuple(self.texts))
        if self.pairs is not None:
            object.__setattr__(self, "pairs", tuple(self.pairs))
        if self.groups is not None:
            object.__setattr__(self, "groups", tuple(self.groups))
            if len(self.groups) != len(self.texts):
                raise DataError(
                    f"TextSplit has {len(self.texts)} texts and {len(self.groups)} groups: pass "
                    "one group per text, or none"
                )
        labels = np.asarray(self.labels)
        if labels.ndim != 1 or (labels.size and not np.issubdtype(labels.dtype, np.integer)):
            raise DataError(
                f"TextSplit labels must be a 1-D integer array, got shape {labels.shape} and "
                f"dtype {labels.dtype}: pass one class index per text"
            )
        object.__setattr__(self, "labels", labels.astype(np.int32))
        if len(self.labels) != len(self.texts) or (
            self.pairs is not None and len(self.pairs) != len(self.texts)
        ):
            n_pairs = None if self.pairs is None else len(self.pairs)
            raise DataError(
                f"TextSplit has {len(self.texts)} texts, {n_pairs} pairs and {len(self.labels)} "
                "labels: pass the same number of each"
            )

    def __len__(self) -> int:
        return len(self.texts)

    def inputs(self) -> list[str] | list[tuple[str, str]]:
        """Exactly what ``Encoder.tokenize`` takes: texts, or ``(text, pair)`` tuples."""
        if self.pairs is None:
            return list(self.texts)
        return list(zip(self.texts, self.pairs, strict=True))

    def take(self, indices: Sequence[int] | np.ndarray) -> TextSplit:
        """The examples at ``indices``, in that order."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        return TextSplit(
            texts=tuple(self.texts[i] for i in idx),
            pairs=None if self.pairs is None else tuple(self.pairs[i] for i in idx),
            labels=self.labels[idx],
            groups=None if self.groups is None else tuple(self.groups[i] for i in idx),
        )


@dataclasses.dataclass(frozen=True, eq=False)
class TextSplits:
    """Train / val / test splits of one source, its classes and a description of the source."""

    train: TextSplit
    val: TextSplit
    test: TextSplit
    num_classes: int
    label_names: tuple[str, ...]
    source: str


def tokenize_split(
    encoder: Any, split: TextSplit, max_length: int, *, return_token_type_ids: bool = False
) -> tuple[np.ndarray, ...]:
    """``encoder.tokenize(split.inputs(), max_length)``: ``(ids, mask)``, each ``[N, max_length]``.

    Pairs use the tokenizer's pair template (BERT: ``[CLS] a [SEP] b [SEP]``), truncated
    longest-first. With ``return_token_type_ids`` a third ``[N, max_length]`` array gives the
    segment of each token (pass it to the encoder so a hypothesis gets its type embedding).
    """
    if len(split) == 0:
        raise DataError("cannot tokenize an empty TextSplit: load or generate some examples first")
    out = encoder.tokenize(split.inputs(), max_length, return_token_type_ids=return_token_type_ids)
    return tuple(np.asarray(a, dtype=np.int32) for a in out)


# --------------------------------------------------------------------------------------------------
# Tokenized data and evaluation
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class TokenizedSplit:
    """A tokenized split: ``ids``, ``mask`` ``[N, T]``, ``labels`` ``[N]``, ``types`` or None."""

    ids: np.ndarray
    mask: np.ndarray
    labels: np.ndarray
    types: np.ndarray | None = None

    def __len__(self) -> int:
        return self.ids.shape[0]

    @property
    def lengths(self) -> np.ndarray:
        return self.mask.sum(axis=1)

    def batch(self, index: np.ndarray | None = None, length: int | None = None) -> Batch:
        """The rows ``index`` (all by default), cut to the first ``length`` tokens."""
        index = np.arange(len(self)) if index is None else index
        t = self.ids.shape[1] if length is None else length
        out = {
            "ids": jnp.asarray(self.ids[index, :t]),
            "mask": jnp.asarray(self.mask[index, :t], jnp.float32),
            "labels": jnp.asarray(self.labels[index]),
        }
        if self.types is not None:
            out["types"] = jnp.asarray(self.types[index, :t])
        return out


def tokenize_splits(
    model: TextClassifier, data: TextSplits, max_length: int
) -> dict[str, TokenizedSplit]:
    """Tokenizes train / val / test with the model's tokenizer (pairs use its pair template)."""
    out = {}
    for name in ("train", "val", "test"):
        split: TextSplit = getattr(data, name)
        arrays = tokenize_split(
            model.encoder, split, max_length, return_token_type_ids=model.uses_token_types
        )
        types = arrays[2] if model.uses_token_types else None
        out[name] = TokenizedSplit(arrays[0], arrays[1], np.asarray(split.labels, np.int32), types)
    return out


def length_batches(lengths: np.ndarray, batch_size: int, max_length: int, multiple: int = 16):
    """Batches of examples of similar length: ``(index [batch_size], count, padded length)``.

    Sorting by length and cutting each batch to its longest example (rounded up to ``multiple``)
    skips most padding; the last batch is filled with repeats of its first row so every batch
    has the same size (one compiled program per padded length).
    """
    order = np.argsort(lengths, kind="stable")
    for start in range(0, order.size, batch_size):
        index = order[start : start + batch_size]
        count = index.size
        length = min(max_length, multiple * math.ceil(max(int(lengths[index].max()), 1) / multiple))
        if count < batch_size:
            index = np.concatenate([index, np.full(batch_size - count, index[0])])
        yield index, count, length
