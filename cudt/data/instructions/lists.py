"""Task families of the list and counting groups: lists of numbers or words sorted, reduced,
indexed and deduplicated; words and occurrences counted."""

from __future__ import annotations

import numpy as np

from cudt.data.instructions.registry import (
    WORDS,
    WithInput,
    _family,
    _int,
    _join,
    _list,
    _pick,
    ordinal,
)

# ---- list operations -------------------------------------------------------------------------


def _numbers(rng, low=3, high=7, top=99):
    return (tuple(int(x) for x in rng.choice(top + 1, size=_int(rng, low, high), replace=False)),)


def _mirrored(names, words, answers, phrasings) -> None:
    """Register two families of :func:`_numbers` lists that ask one question in mirrored words
    (ascending / descending, largest / smallest): family ``names[i]`` has the phrasings
    ``phrasings(*words[i])`` and the answer ``answers[i]``."""
    for name, these, answer in zip(names, words, answers, strict=True):
        _family(name, "list", phrasings(*these), fields=_list, answer=answer)(_numbers)


_mirrored(
    ("sort_ascending", "sort_descending"),
    (("ascending", "smallest", "largest"), ("descending", "largest", "smallest")),
    (lambda a: _join(sorted(a[0])), lambda a: _join(sorted(a[0], reverse=True))),
    lambda order, first, last: [
        f"Sort these numbers from {first} to {last}: {{data}}",
        f"Put in {order} order: {{data}}",
        WithInput(f"Sort the numbers in {order} order."),
        WithInput(f"Arrange these numbers from {first} to {last}."),
    ],
)
_mirrored(
    ("list_max", "list_min"),
    (("largest", "maximum"), ("smallest", "minimum")),
    (lambda a: str(max(a[0])), lambda a: str(min(a[0]))),
    lambda most, extreme: [
        f"What is the {most} number in this list: {{data}}?",
        f"Find the {extreme} of {{data}}.",
        WithInput(f"Give the {most} number in the list."),
        WithInput(f"Which number is the {extreme}?"),
    ],
)


@_family(
    "list_sum",
    "list",
    [
        "What is the sum of {data}?",
        "Add up these numbers: {data}",
        WithInput("Add up all the numbers in the list."),
        WithInput("What is the total of these numbers?"),
    ],
    fields=_list,
    answer=lambda a: str(sum(a[0])),
)
def _list_sum(rng):
    return _numbers(rng, 3, 5, 50)


@_family(
    "list_length",
    "list",
    [
        "How many items are in this list: {data}?",
        "Count the items in {data}.",
        WithInput("How many items does the list have?"),
    ],
    fields=_list,
    answer=lambda a: str(len(a[0])),
)
def _list_length(rng):
    return (_pick(rng, WORDS, _int(rng, 2, 9), replace=True),)


@_family(
    "dedupe",
    "list",
    [
        "Remove the duplicates from {data}, keeping the first of each.",
        "List each number of {data} once, in order of first appearance.",
        WithInput("Remove repeated numbers, keeping the first occurrence of each."),
    ],
    fields=_list,
    answer=lambda a: _join(dict.fromkeys(a[0])),
)
def _dedupe(rng):
    pool = tuple(int(x) for x in rng.choice(np.arange(1, 30), size=_int(rng, 2, 4), replace=False))
    while True:
        values = _pick(rng, pool, _int(rng, 4, 8), replace=True)
        if len(set(values)) < len(values):
            return (values,)


@_family(
    "last_item",
    "list",
    [
        "What is the last item of this list: {data}?",
        "Give the final item in {data}.",
        WithInput("What is the last item in the list?"),
    ],
    fields=_list,
    answer=lambda a: a[0][-1],
)
def _last_item(rng):
    return (_pick(rng, WORDS, _int(rng, 3, 6)),)


@_family(
    "item_at",
    "list",
    [
        "What is the {nth} item of the list {data}?",
        "Give item number {n} of {data}.",
        WithInput("What is the {nth} item in the list?"),
    ],
    fields=lambda a: {"data": _join(a[0]), "n": str(a[1]), "nth": ordinal(a[1])},
    answer=lambda a: a[0][a[1] - 1],
)
def _item_at(rng):
    words = _pick(rng, WORDS, _int(rng, 3, 6))
    return (words, _int(rng, 1, len(words)))


@_family(
    "sort_words",
    "list",
    [
        "Sort these words alphabetically: {data}",
        "Put in alphabetical order: {data}",
        WithInput("Sort the words in alphabetical order."),
    ],
    fields=_list,
    answer=lambda a: _join(sorted(a[0])),
)
def _sort_words(rng):
    return (_pick(rng, WORDS, _int(rng, 3, 5)),)


# ---- counting --------------------------------------------------------------------------------


@_family(
    "count_words",
    "counting",
    [
        "How many words are in this sentence: {data}",
        "Count the words in: {data}",
        WithInput("How many words are in the sentence?"),
        WithInput("Count the words in this text."),
    ],
    fields=lambda a: {"data": " ".join(a[0])},
    answer=lambda a: str(len(a[0])),
)
def _count_words(rng):
    return (_pick(rng, WORDS, _int(rng, 3, 10), replace=True),)


@_family(
    "count_occurrences",
    "counting",
    [
        "How many times does the word {w} appear in: {data}",
        "Count how often {w} occurs in: {data}",
        WithInput("How many times does the word {w} appear in the text?"),
    ],
    fields=lambda a: {"data": " ".join(a[0]), "w": a[1]},
    answer=lambda a: str(a[0].count(a[1])),
)
def _count_occurrences(rng):
    pool = _pick(rng, WORDS, 3)
    text = _pick(rng, pool, _int(rng, 5, 10), replace=True)
    return (text, _pick(rng, pool))
