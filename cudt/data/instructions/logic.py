"""Task families of the logic group: membership and alphabetical order."""

from __future__ import annotations

from cudt.data.instructions.registry import (
    WORDS,
    WithInput,
    _family,
    _int,
    _join,
    _list,
    _pick,
    _yes,
)

# ---- logic -----------------------------------------------------------------------------------


@_family(
    "is_member",
    "logic",
    [
        "Is {w} in the list {data}? Answer yes or no.",
        "Answer yes or no: does {data} contain {w}?",
        WithInput("Is the word {w} in this list? Answer yes or no."),
    ],
    fields=lambda a: {"data": _join(a[0]), "w": a[1]},
    answer=lambda a: _yes(a[1] in a[0]),
)
def _is_member(rng):
    words = _pick(rng, WORDS, _int(rng, 3, 6) + 1)
    shown = words[:-1]
    return (shown, _pick(rng, shown) if rng.random() < 0.5 else words[-1])


@_family(
    "first_alphabetically",
    "logic",
    [
        "Which word comes first in alphabetical order: {data}?",
        "Of {data}, which comes first in the dictionary?",
        WithInput("Which of these words comes first alphabetically?"),
    ],
    fields=_list,
    answer=lambda a: min(a[0]),
)
def _first_alphabetically(rng):
    return (_pick(rng, WORDS, _int(rng, 2, 4)),)
