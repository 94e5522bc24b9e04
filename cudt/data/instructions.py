"""Generated instruction tasks with exactly checkable answers, split by item (no download).

Forty-eight task families (:data:`FAMILIES`) in eight groups (:data:`FAMILY_GROUPS`):
arithmetic, string operations, list operations, counting, unit conversion, lookup in a given
text, format rewriting and simple logic. Every answer is a short exact string (a number, a
word, a list, ``yes``/``no``), compared case-sensitively by :func:`exact_answer`. Records are
:class:`cudt.data.alpaca.AlpacaRecord`, so tokenizing and prompting are those of
:mod:`cudt.data.alpaca`. Select the set in the LLM task with ``--data tasks``.

* An **item** is one task instance: a family and its arguments (``add`` of ``(48, 275)``).
  Its ``key`` names it (``"add:(48, 275)"``); each family has several phrasings, some with the
  data in the record's ``input`` field and some with it inline in the instruction. An item
  becomes one record, in one phrasing drawn with it.
* **Split by item, not by record**: an item's split is a hash of its ``split_key`` and the seed
  (:func:`split_of`), whatever its phrasing. The split key is the item key, made coarser where
  two items are the same question: commutative operands are sorted (``add(275, 48)`` is
  ``add(48, 275)``), and inverse pairs share one (``300 cm -> m`` and ``3 m -> cm``, a date
  ISO -> US and back, ``snake_case`` <-> ``camelCase``), so no item, paraphrase or inverse
  crosses train / val / test.
* :func:`task_splits` draws candidate ``j`` from ``(seed, j)`` alone, skips an item already
  drawn (same key), and deals each new item to the split its hash names until every split has
  its size. So test and val do not change with ``num_train``, and a larger split extends a
  smaller one.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable

import numpy as np

from cudt.data.alpaca import AlpacaDataError, AlpacaRecord, AlpacaSplits

__all__ = [
    "FAMILIES",
    "FAMILY_GROUPS",
    "SPLIT_FRACTIONS",
    "Family",
    "TaskItem",
    "TaskSplits",
    "WithInput",
    "describe_families",
    "exact_answer",
    "make_item",
    "split_of",
    "task_splits",
]

# The share of hash space each split owns: an item's split depends on its key and the seed only.
SPLIT_FRACTIONS = (("test", 0.25), ("val", 0.10), ("train", 0.65))


def exact_answer(prediction: str, reference: str) -> bool:
    """Whether ``prediction`` is ``reference`` once both are stripped of surrounding whitespace;
    case, punctuation and inner spacing count (``"APPLE"`` is not ``"apple"``)."""
    return prediction.strip() == reference.strip()


# --------------------------------------------------------------------------------------------------
# Vocabulary
# --------------------------------------------------------------------------------------------------

WORDS = tuple(
    """
    apple river cloud stone tiger lemon chair piano candle garden rocket pencil window forest
    button rabbit orange mirror castle bridge basket bottle carpet dragon engine finger flower
    guitar hammer island jacket kettle ladder magnet needle oyster parrot pepper planet pocket
    puzzle rubber saddle shovel silver spider spring statue summer ticket tomato tunnel turtle
    valley velvet wallet winter yellow zebra anchor bakery banana beaver blanket branch breeze
    cactus camera canyon carrot cherry circle coffee copper cotton desert dinner doctor donkey
    eagle farmer feather fossil galaxy giant glove grape harbor helmet honey insect jelly jungle
    kitten lantern leaf lizard marble meadow melon monkey morning motor mountain muffin napkin
    ocean olive onion palace panda paper peach pillow pirate plum pond potato pumpkin queen
    radio raven robot salad sandal shadow sheep shell singer sketch snake socks spoon storm
    sugar sunset sweater table teapot thunder timber toast tower train tulip umbrella violin
    wagon walnut whale wheat wizard wolf yogurt badge bench brick broom cabin chalk clock coral
    crown daisy drum fence flute frost grass hawk horse jewel kite knife lamp lily maple mask
    nest owl pearl quilt ring rope scarf seed shark skate sled slope smoke spark stamp swan
    thorn torch trail vase wheel
    """.split()
)
FIRST_NAMES = tuple(
    """
    Alice Bruno Carla Daniel Elena Felix Grace Hugo Irene Jonas Karen Liam Maria Nora Oscar
    Paula Quentin Rosa Samuel Tara Umar Vera Walter Xenia Yusuf Zoe Anna Boris Clara David Emma
    Frank Greta Henry Ingrid Jacob Laura Martin Nina Peter
    """.split()
)
LAST_NAMES = tuple(
    """
    Adams Becker Castro Dalton Evans Fischer Garcia Hansen Ibarra Jensen Keller Lopez Meyer
    Novak Olsen Parker Quinn Romero Schmidt Torres Ulrich Vargas Weber Young Zimmer Brooks
    Carter Duval Ellis Foster Gray Hughes Klein Lambert Moreau Nolan Ortiz Price Reyes Stone
    """.split()
)
VOWELS = "aeiou"
_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def ordinal(n: int) -> str:
    """``1st``, ``2nd``, ``3rd``, ``4th``, ..., ``11th``, ``12th``, ``13th``, ``21st``."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _join(values) -> str:
    return ", ".join(map(str, values))


# --------------------------------------------------------------------------------------------------
# Families
# --------------------------------------------------------------------------------------------------


class WithInput(str):
    """A phrasing whose record carries the family's data in its ``input`` field."""


@dataclasses.dataclass(frozen=True)
class Family:
    """One task family.

    ``draw(rng)`` gives the arguments (a tuple of ints, strings and tuples of them);
    ``fields(args)`` the strings the phrasings format with (``data``: the input text);
    ``answer(args)`` the exact answer; ``split_key(args)`` the key that decides the split
    (default: the item key). A phrasing that is a :class:`WithInput` puts ``fields["data"]`` in
    the record's input; any other is the whole instruction, input ``""``.
    """

    name: str
    group: str
    draw: Callable[[np.random.Generator], tuple]
    fields: Callable[[tuple], dict[str, str]]
    answer: Callable[[tuple], str]
    phrasings: tuple[str, ...]
    split_key: Callable[[tuple], str] | None = None


FAMILIES: dict[str, Family] = {}


def _family(name, group, phrasings, *, fields, answer, split_key=None):
    def register(draw):
        FAMILIES[name] = Family(name, group, draw, fields, answer, tuple(phrasings), split_key)
        return draw

    return register


def _int(rng: np.random.Generator, low: int, high: int) -> int:
    """An integer in ``[low, high]``."""
    return int(rng.integers(low, high + 1))


def _pick(rng: np.random.Generator, pool, k: int | None = None, replace: bool = False):
    if k is None:
        return pool[int(rng.integers(len(pool)))]
    return tuple(pool[int(i)] for i in rng.choice(len(pool), size=k, replace=replace))


def _word(rng) -> str:
    return _pick(rng, WORDS)


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _sorted_key(name: str) -> Callable[[tuple], str]:
    return lambda args: f"{name}:{tuple(sorted(args))}"


# ---- arithmetic ------------------------------------------------------------------------------


def _ab(args):
    return {"a": str(args[0]), "b": str(args[1]), "data": f"{args[0]} and {args[1]}"}


@_family(
    "add",
    "arithmetic",
    [
        "What is {a} plus {b}?",
        "Add {a} and {b}.",
        "Compute {a} + {b}.",
        "Find the sum of {a} and {b}.",
        WithInput("Add the two numbers."),
        WithInput("What is the sum of these numbers?"),
    ],
    fields=_ab,
    answer=lambda a: str(a[0] + a[1]),
    split_key=_sorted_key("add"),
)
def _add(rng):
    return (_int(rng, 10, 999), _int(rng, 10, 999))


@_family(
    "subtract",
    "arithmetic",
    [
        "What is {a} minus {b}?",
        "Subtract {b} from {a}.",
        "Compute {a} - {b}.",
        WithInput("Subtract the second number from the first."),
        WithInput("What is the difference of the first number minus the second?"),
    ],
    fields=_ab,
    answer=lambda a: str(a[0] - a[1]),
)
def _subtract(rng):
    a = _int(rng, 10, 999)
    return (a, _int(rng, 0, a))


@_family(
    "multiply",
    "arithmetic",
    [
        "What is {a} times {b}?",
        "Multiply {a} by {b}.",
        "Compute {a} * {b}.",
        "Find the product of {a} and {b}.",
        WithInput("Multiply the two numbers."),
    ],
    fields=_ab,
    answer=lambda a: str(a[0] * a[1]),
    split_key=_sorted_key("multiply"),
)
def _multiply(rng):
    return (_int(rng, 2, 99), _int(rng, 2, 19))


@_family(
    "divide",
    "arithmetic",
    [
        "What is {a} divided by {b}?",
        "Divide {a} by {b}.",
        "Compute {a} / {b}.",
        WithInput("Divide the first number by the second."),
    ],
    fields=_ab,
    answer=lambda a: str(a[0] // a[1]),
)
def _divide(rng):
    b = _int(rng, 2, 12)
    return (b * _int(rng, 2, 99), b)


@_family(
    "remainder",
    "arithmetic",
    [
        "What is the remainder when {a} is divided by {b}?",
        "Compute {a} mod {b}.",
        "Find {a} modulo {b}.",
        WithInput("Give the remainder of the first number divided by the second."),
    ],
    fields=_ab,
    answer=lambda a: str(a[0] % a[1]),
)
def _remainder(rng):
    return (_int(rng, 10, 300), _int(rng, 2, 12))


@_family(
    "larger",
    "arithmetic",
    [
        "Which is larger, {a} or {b}?",
        "Give the larger of {a} and {b}.",
        "What is the bigger number: {a} or {b}?",
        WithInput("Which of the two numbers is larger?"),
    ],
    fields=_ab,
    answer=lambda a: str(max(a)),
    split_key=_sorted_key("larger"),
)
def _larger(rng):
    a, b = (int(x) for x in rng.choice(1000, size=2, replace=False))
    return (a, b)


@_family(
    "is_less",
    "logic",
    [
        "Is {a} less than {b}? Answer yes or no.",
        "Is {a} smaller than {b}? Answer yes or no.",
        "Answer yes or no: {a} < {b}?",
        WithInput("Is the first number less than the second? Answer yes or no."),
    ],
    fields=_ab,
    answer=lambda a: _yes(a[0] < a[1]),
)
def _is_less(rng):
    a, b = (int(x) for x in rng.choice(1000, size=2, replace=False))
    return (a, b)


@_family(
    "even_odd",
    "logic",
    [
        "Is {a} even or odd?",
        "Say whether {a} is even or odd.",
        "Even or odd: {a}?",
        WithInput("Is this number even or odd?"),
    ],
    fields=lambda a: {"a": str(a[0]), "data": str(a[0])},
    answer=lambda a: "even" if a[0] % 2 == 0 else "odd",
)
def _even_odd(rng):
    return (_int(rng, 0, 9999),)


@_family(
    "is_divisible",
    "logic",
    [
        "Is {a} divisible by {b}? Answer yes or no.",
        "Answer yes or no: can {a} be divided evenly by {b}?",
        "Does {b} divide {a} with no remainder? Answer yes or no.",
        WithInput("Is the first number divisible by the second? Answer yes or no."),
    ],
    fields=_ab,
    answer=lambda a: _yes(a[0] % a[1] == 0),
)
def _is_divisible(rng):
    b = _int(rng, 2, 12)
    a = b * _int(rng, 2, 40) if rng.random() < 0.5 else _int(rng, 10, 400)
    return (a, b)


# ---- string operations -----------------------------------------------------------------------


def _w(args):
    return {"w": args[0], "data": args[0]}


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


# ---- list operations -------------------------------------------------------------------------


def _list(args):
    return {"data": _join(args[0])}


def _numbers(rng, low=3, high=7, top=99):
    return (tuple(int(x) for x in rng.choice(top + 1, size=_int(rng, low, high), replace=False)),)


@_family(
    "sort_ascending",
    "list",
    [
        "Sort these numbers from smallest to largest: {data}",
        "Put in ascending order: {data}",
        WithInput("Sort the numbers in ascending order."),
        WithInput("Arrange these numbers from smallest to largest."),
    ],
    fields=_list,
    answer=lambda a: _join(sorted(a[0])),
)
def _sort_ascending(rng):
    return _numbers(rng)


@_family(
    "sort_descending",
    "list",
    [
        "Sort these numbers from largest to smallest: {data}",
        "Put in descending order: {data}",
        WithInput("Sort the numbers in descending order."),
        WithInput("Arrange these numbers from largest to smallest."),
    ],
    fields=_list,
    answer=lambda a: _join(sorted(a[0], reverse=True)),
)
def _sort_descending(rng):
    return _numbers(rng)


@_family(
    "list_max",
    "list",
    [
        "What is the largest number in this list: {data}?",
        "Find the maximum of {data}.",
        WithInput("Give the largest number in the list."),
        WithInput("Which number is the maximum?"),
    ],
    fields=_list,
    answer=lambda a: str(max(a[0])),
)
def _list_max(rng):
    return _numbers(rng)


@_family(
    "list_min",
    "list",
    [
        "What is the smallest number in this list: {data}?",
        "Find the minimum of {data}.",
        WithInput("Give the smallest number in the list."),
        WithInput("Which number is the minimum?"),
    ],
    fields=_list,
    answer=lambda a: str(min(a[0])),
)
def _list_min(rng):
    return _numbers(rng)


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
    fields=lambda a: {"data": _join(a[0])},
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


# ---- unit conversion (exact integers) --------------------------------------------------------

_UNITS = {  # family: (from unit, to unit, units of the small one in the big one, dimension)
    "cm_to_m": ("cm", "m", 100, "length"),
    "m_to_cm": ("m", "cm", 100, "length"),
    "minutes_to_hours": ("minutes", "hours", 60, "time"),
    "hours_to_minutes": ("hours", "minutes", 60, "time"),
    "grams_to_kg": ("grams", "kg", 1000, "mass"),
    "kg_to_grams": ("kg", "grams", 1000, "mass"),
}


def _unit_family(name: str) -> None:
    src, dst, factor, dimension = _UNITS[name]
    down = name in ("cm_to_m", "minutes_to_hours", "grams_to_kg")  # from the small unit

    def draw(rng):
        big = _int(rng, 1, 999 if factor <= 100 else 99)
        return (big * factor,) if down else (big,)

    def answer(args):
        return str(args[0] // factor if down else args[0] * factor)

    def split_key(args):  # a conversion and its inverse are one question
        return f"{dimension}:{args[0] // factor if down else args[0]}"

    _family(
        name,
        "units",
        [
            f"Convert {{x}} {src} to {dst}.",
            f"How many {dst} is {{x}} {src}?",
            f"Express {{x}} {src} in {dst}.",
            WithInput(f"Convert this many {src} to {dst}."),
            WithInput(f"How many {dst} are there in this many {src}?"),
        ],
        fields=lambda a: {"x": str(a[0]), "data": str(a[0])},
        answer=answer,
        split_key=split_key,
    )(draw)


for _name in _UNITS:
    _unit_family(_name)


# ---- lookup in a given text ------------------------------------------------------------------


def _table(rng):
    names = _pick(rng, FIRST_NAMES, _int(rng, 3, 5))
    ages = tuple(int(x) for x in rng.choice(np.arange(18, 91), size=len(names), replace=False))
    return tuple(zip(names, ages, strict=True))


def _table_text(rows) -> str:
    return "\n".join(f"{name}: {age}" for name, age in rows)


@_family(
    "lookup_value",
    "lookup",
    [
        WithInput("How old is {who}?"),
        WithInput("Give the age of {who} from the list."),
        WithInput("The input lists people and their ages. What is {who}'s age?"),
    ],
    fields=lambda a: {"data": _table_text(a[0]), "who": a[1]},
    answer=lambda a: str(dict(a[0])[a[1]]),
)
def _lookup_value(rng):
    rows = _table(rng)
    return (rows, _pick(rng, rows)[0])


@_family(
    "lookup_key",
    "lookup",
    [
        WithInput("Who is {age} years old?"),
        WithInput("Which person in the list has age {age}?"),
        WithInput("The input lists people and their ages. Who is {age}?"),
    ],
    fields=lambda a: {"data": _table_text(a[0]), "age": str(a[1])},
    answer=lambda a: next(name for name, age in a[0] if age == a[1]),
)
def _lookup_key(rng):
    rows = _table(rng)
    return (rows, _pick(rng, rows)[1])


# ---- format rewriting ------------------------------------------------------------------------


def _date(rng):
    return (_int(rng, 1950, 2035), _int(rng, 1, 12), _int(rng, 1, 28))


def _iso(a) -> str:
    return f"{a[0]:04d}-{a[1]:02d}-{a[2]:02d}"


def _us(a) -> str:
    return f"{a[1]:02d}/{a[2]:02d}/{a[0]:04d}"


def _date_key(a) -> str:
    return f"date:{_iso(a)}"


@_family(
    "iso_to_us_date",
    "format",
    [
        "Rewrite the date {data} as MM/DD/YYYY.",
        "Convert {data} from YYYY-MM-DD to MM/DD/YYYY.",
        WithInput("Rewrite this YYYY-MM-DD date in the MM/DD/YYYY format."),
    ],
    fields=lambda a: {"data": _iso(a)},
    answer=_us,
    split_key=_date_key,
)
def _iso_to_us(rng):
    return _date(rng)


@_family(
    "us_to_iso_date",
    "format",
    [
        "Rewrite the date {data} as YYYY-MM-DD.",
        "Convert {data} from MM/DD/YYYY to YYYY-MM-DD.",
        WithInput("Rewrite this MM/DD/YYYY date in the YYYY-MM-DD format."),
    ],
    fields=lambda a: {"data": _us(a)},
    answer=_iso,
    split_key=_date_key,
)
def _us_to_iso(rng):
    return _date(rng)


@_family(
    "last_name_first",
    "format",
    [
        "Write the name {data} as Lastname, Firstname.",
        "Rewrite {data} in the form Lastname, Firstname.",
        WithInput("Rewrite this name as Lastname, Firstname."),
    ],
    fields=lambda a: {"data": f"{a[0]} {a[1]}"},
    answer=lambda a: f"{a[1]}, {a[0]}",
)
def _last_name_first(rng):
    return (_pick(rng, FIRST_NAMES), _pick(rng, LAST_NAMES))


def _snake(words) -> str:
    return "_".join(words)


def _camel(words) -> str:
    return words[0] + "".join(w.capitalize() for w in words[1:])


@_family(
    "snake_to_camel",
    "format",
    [
        "Convert {data} from snake_case to camelCase.",
        "Write the identifier {data} in camelCase.",
        WithInput("Rewrite this snake_case name in camelCase."),
    ],
    fields=lambda a: {"data": _snake(a)},
    answer=_camel,
    split_key=lambda a: f"identifier:{a}",
)
def _snake_to_camel(rng):
    return _pick(rng, WORDS, _int(rng, 2, 3))


@_family(
    "camel_to_snake",
    "format",
    [
        "Convert {data} from camelCase to snake_case.",
        "Write the identifier {data} in snake_case.",
        WithInput("Rewrite this camelCase name in snake_case."),
    ],
    fields=lambda a: {"data": _camel(a)},
    answer=_snake,
    split_key=lambda a: f"identifier:{a}",
)
def _camel_to_snake(rng):
    return _pick(rng, WORDS, _int(rng, 2, 3))


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
    fields=lambda a: {"data": _join(a[0])},
    answer=lambda a: min(a[0]),
)
def _first_alphabetically(rng):
    return (_pick(rng, WORDS, _int(rng, 2, 4)),)


FAMILY_GROUPS: dict[str, tuple[str, ...]] = {}
for _f in FAMILIES.values():
    FAMILY_GROUPS[_f.group] = (*FAMILY_GROUPS.get(_f.group, ()), _f.name)
_ORDER = tuple(FAMILIES)  # draw order: registration order


# --------------------------------------------------------------------------------------------------
# Items and splits
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TaskItem:
    """One task instance and the record it became: ``key`` names the item (family + args),
    ``split_key`` decides its split (the key, or coarser), ``phrasing`` indexes the family's
    phrasings."""

    family: str
    args: tuple
    phrasing: int
    record: AlpacaRecord

    @property
    def key(self) -> str:
        return f"{self.family}:{self.args!r}"

    @property
    def split_key(self) -> str:
        fam = FAMILIES[self.family]
        return self.key if fam.split_key is None else fam.split_key(self.args)


def make_item(family: str, args: tuple, phrasing: int = 0) -> TaskItem:
    """The record of ``family`` at ``args`` in phrasing ``phrasing``."""
    fam = FAMILIES[family]
    fields = fam.fields(args)
    template = fam.phrasings[phrasing]
    instruction = template.format(**fields)
    data = fields.get("data", "") if isinstance(template, WithInput) else ""
    record = AlpacaRecord(instruction=instruction, input=data, output=fam.answer(args))
    return TaskItem(family=family, args=args, phrasing=phrasing, record=record)


def split_of(split_key: str, seed: int) -> str:
    """``"train"``, ``"val"`` or ``"test"``: a hash of ``(seed, split_key)`` into
    :data:`SPLIT_FRACTIONS`, so every phrasing of an item, and its inverse, lands together."""
    digest = hashlib.blake2b(f"{seed}\x00{split_key}".encode(), digest_size=8).digest()
    u = int.from_bytes(digest, "big") / 2**64
    edge = 0.0
    for name, share in SPLIT_FRACTIONS:
        edge += share
        if u < edge:
            return name
    return SPLIT_FRACTIONS[-1][0]


@dataclasses.dataclass(frozen=True)
class TaskSplits:
    """Train / val / test items of the generated task families, disjoint by split key."""

    train: tuple[TaskItem, ...]
    val: tuple[TaskItem, ...]
    test: tuple[TaskItem, ...]
    seed: int
    draws: int  # candidates drawn to fill the splits

    def records(self, split: str) -> tuple[AlpacaRecord, ...]:
        return tuple(item.record for item in getattr(self, split))

    def alpaca(self) -> AlpacaSplits:
        """The records as :class:`cudt.data.alpaca.AlpacaSplits` (what the LLM task trains on)."""
        return AlpacaSplits(
            train=self.records("train"),
            val=self.records("val"),
            test=self.records("test"),
            source=(
                f"generated tasks ({len(FAMILIES)} families, seed={self.seed}): train "
                f"{len(self.train)}, val {len(self.val)}, test {len(self.test)} items, split by "
                "item hash"
            ),
        )


def task_splits(
    num_train: int = 2000, num_val: int = 200, num_test: int = 500, *, seed: int = 0
) -> TaskSplits:
    """Disjoint train / val / test items of :data:`FAMILIES`, ``num_*`` of each, from ``seed``.

    Candidate ``j``: a family drawn uniformly, its arguments and a phrasing, all from
    ``np.random.default_rng([seed, 31, j])``. A candidate whose item key was drawn before is
    skipped; a new one goes to :func:`split_of` its split key, and is kept while that split is
    short. Each split is in draw order.
    """
    sizes = {"train": num_train, "val": num_val, "test": num_test}
    if num_train < 0 or num_val < 0 or num_test < 0 or seed < 0:
        raise AlpacaDataError(
            f"task_splits needs num_train >= 0, num_val >= 0, num_test >= 0 and seed >= 0, got "
            f"{num_train}, {num_val}, {num_test} and {seed}: pass non-negative counts"
        )
    out: dict[str, list[TaskItem]] = {k: [] for k in sizes}
    seen: set[str] = set()
    total = sum(sizes.values())
    max_draws = 10 * total + 1000
    j = 0
    while any(len(out[k]) < n for k, n in sizes.items()):
        if j >= max_draws:
            have = ", ".join(f"{k} {len(v)}" for k, v in out.items())
            raise AlpacaDataError(
                f"task_splits found only {have} distinct items in {j} draws: ask for fewer "
                f"than train {num_train}, val {num_val}, test {num_test}"
            )
        rng = np.random.default_rng([seed, 31, j])
        j += 1
        family = _ORDER[int(rng.integers(len(_ORDER)))]
        fam = FAMILIES[family]
        args = fam.draw(rng)
        item = make_item(family, args, int(rng.integers(len(fam.phrasings))))
        if item.key in seen:
            continue
        seen.add(item.key)
        split = split_of(item.split_key, seed)
        if len(out[split]) < sizes[split]:
            out[split].append(item)
    return TaskSplits(
        train=tuple(out["train"]),
        val=tuple(out["val"]),
        test=tuple(out["test"]),
        seed=seed,
        draws=j,
    )


def describe_families() -> list[str]:
    """One line per group: its families."""
    return [f"{group}: {', '.join(names)}" for group, names in FAMILY_GROUPS.items()]
