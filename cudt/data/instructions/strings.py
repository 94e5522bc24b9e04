"""Task families of the string group: one word reversed, recased, measured, indexed, edited,
counted or repeated."""

from __future__ import annotations

from cudt.data.instructions.registry import (
    _LETTERS,
    VOWELS,
    WORDS,
    WithInput,
    _family,
    _int,
    _pick,
    _word,
    ordinal,
)

# ---- string operations -----------------------------------------------------------------------


def _w(args):
    return {"w": args[0], "data": args[0]}


def _case_key(args) -> str:
    """A word recased any way is one question (``MAGNET`` lowercased is ``magnet`` uppercased
    the other way round): one split for all three case families."""
    return f"case:{args[0].lower()}"


@_family(
    "reverse_word",
    "string",
    [
        "Reverse the letters of the word {w}.",
        "Spell {w} backwards.",
        "Write the word {w} in reverse order.",
        WithInput("Reverse the letters of this word."),
        WithInput("Spell the word backwards."),
    ],
    fields=_w,
    answer=lambda a: a[0][::-1],
)
def _reverse_word(rng):
    return (_word(rng),)


@_family(
    "uppercase_word",
    "string",
    [
        "Write {w} in uppercase.",
        "Convert the word {w} to capital letters.",
        "Give {w} in all caps.",
        WithInput("Convert this word to uppercase."),
    ],
    fields=_w,
    answer=lambda a: a[0].upper(),
    split_key=_case_key,
)
def _uppercase_word(rng):
    return (_word(rng),)


@_family(
    "lowercase_word",
    "string",
    [
        "Write {w} in lowercase.",
        "Convert the word {w} to small letters.",
        "Give {w} with no capital letters.",
        WithInput("Convert this word to lowercase."),
    ],
    fields=_w,
    answer=lambda a: a[0].lower(),
    split_key=_case_key,
)
def _lowercase_word(rng):
    word = _word(rng)
    return (word.upper() if rng.random() < 0.5 else word.capitalize(),)


@_family(
    "capitalize_word",
    "string",
    [
        "Capitalize the first letter of {w}.",
        "Write {w} with a capital first letter.",
        "Start the word {w} with an uppercase letter.",
        WithInput("Capitalize the first letter of this word."),
    ],
    fields=_w,
    answer=lambda a: a[0][0].upper() + a[0][1:],
    split_key=_case_key,
)
def _capitalize_word(rng):
    return (_word(rng),)


@_family(
    "word_length",
    "string",
    [
        "How many letters are in the word {w}?",
        "Count the letters of {w}.",
        "What is the length of the word {w}?",
        WithInput("How many letters does this word have?"),
    ],
    fields=_w,
    answer=lambda a: str(len(a[0])),
)
def _word_length(rng):
    return (_word(rng),)


@_family(
    "nth_letter",
    "string",
    [
        "What is the {nth} letter of the word {w}?",
        "Give letter number {n} of {w}.",
        "Which letter is in position {n} of {w}?",
        WithInput("What is the {nth} letter of this word?"),
    ],
    fields=lambda a: {"w": a[0], "n": str(a[1]), "nth": ordinal(a[1]), "data": a[0]},
    answer=lambda a: a[0][a[1] - 1],
)
def _nth_letter(rng):
    word = _word(rng)
    return (word, _int(rng, 1, len(word)))


@_family(
    "last_letter",
    "string",
    [
        "What is the last letter of {w}?",
        "Give the final letter of the word {w}.",
        "Which letter does {w} end with?",
        WithInput("What is the last letter of this word?"),
    ],
    fields=_w,
    answer=lambda a: a[0][-1],
)
def _last_letter(rng):
    return (_word(rng),)


@_family(
    "replace_letter",
    "string",
    [
        "Replace every {x} in {w} with {y}.",
        "In the word {w}, change each letter {x} to {y}.",
        "Write {w} with the letter {x} replaced by {y}.",
        WithInput("Replace every {x} in this word with {y}."),
    ],
    fields=lambda a: {"w": a[0], "x": a[1], "y": a[2], "data": a[0]},
    answer=lambda a: a[0].replace(a[1], a[2]),
)
def _replace_letter(rng):
    word = _word(rng)
    x = _pick(rng, sorted(set(word)))
    y = _pick(rng, [c for c in _LETTERS if c not in word])
    return (word, x, y)


@_family(
    "count_letter",
    "counting",
    [
        "How many times does the letter {x} appear in {w}?",
        "Count the letter {x} in the word {w}.",
        "How many {x}'s are in {w}?",
        WithInput("How many times does the letter {x} appear in this word?"),
    ],
    fields=lambda a: {"w": a[0], "x": a[1], "data": a[0]},
    answer=lambda a: str(a[0].count(a[1])),
)
def _count_letter(rng):
    word = _word(rng)
    inside = rng.random() < 0.8
    x = _pick(rng, sorted(set(word)) if inside else [c for c in _LETTERS if c not in word])
    return (word, x)


@_family(
    "remove_vowels",
    "string",
    [
        "Remove the vowels (a, e, i, o, u) from {w}.",
        "Write {w} without its vowels a, e, i, o and u.",
        WithInput("Delete every vowel (a, e, i, o, u) from this word."),
    ],
    fields=_w,
    answer=lambda a: "".join(c for c in a[0] if c not in VOWELS),
)
def _remove_vowels(rng):
    return (_word(rng),)


@_family(
    "join_words",
    "string",
    [
        "Join {u} and {v} into one word.",
        "Write {u} followed by {v} with no space.",
        "Concatenate the words {u} and {v}.",
        WithInput("Join the two words into one, with no space."),
    ],
    fields=lambda a: {"u": a[0], "v": a[1], "data": f"{a[0]} {a[1]}"},
    answer=lambda a: a[0] + a[1],
)
def _join_words(rng):
    return _pick(rng, WORDS, 2)


@_family(
    "repeat_word",
    "string",
    [
        "Repeat the word {w} {k} times.",
        "Write {w} {k} times, separated by spaces.",
        "Say {w} {k} times in a row.",
        WithInput("Repeat this word {k} times."),
    ],
    fields=lambda a: {"w": a[0], "k": str(a[1]), "data": a[0]},
    answer=lambda a: " ".join([a[0]] * a[1]),
)
def _repeat_word(rng):
    return (_word(rng), _int(rng, 2, 5))
