"""The task families' registry and shared vocabulary: :class:`Family`, :data:`FAMILIES` (filled
by the family modules as they are imported, in draw order), the ``_family`` decorator, the
word and name lists, and the draw helpers every family uses."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

__all__ = [
    "FAMILIES",
    "FIRST_NAMES",
    "LAST_NAMES",
    "VOWELS",
    "WORDS",
    "Family",
    "WithInput",
    "ordinal",
]

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


def _list(args) -> dict[str, str]:
    """The fields of a family whose first argument is a list: ``data``, its items joined."""
    return {"data": _join(args[0])}


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
