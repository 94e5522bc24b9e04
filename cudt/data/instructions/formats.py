"""Task families of the units, lookup and format groups: exact unit conversions, a value looked
up in a given table, dates, names and identifiers rewritten."""

from __future__ import annotations

import numpy as np

from cudt.data.instructions.registry import (
    FIRST_NAMES,
    LAST_NAMES,
    WORDS,
    WithInput,
    _family,
    _int,
    _pick,
)

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


def _both_ways(names, formats, *, draw, split_key, phrasings) -> None:
    """Register an inverse pair of format families: ``names[0]`` rewrites a value from the first
    of ``formats`` (``(label, writer)``) to the second, ``names[1]`` from the second to the
    first; both draw with ``draw`` and share ``split_key`` (a rewrite and its inverse are one
    question). ``phrasings(src, dst)`` are a family's phrasings, written in the two labels."""
    for name, (src, show), (dst, write) in zip(names, formats, formats[::-1], strict=True):
        _family(
            name,
            "format",
            phrasings(src, dst),
            fields=lambda a, show=show: {"data": show(a)},
            answer=write,
            split_key=split_key,
        )(draw)


def _date(rng):
    return (_int(rng, 1950, 2035), _int(rng, 1, 12), _int(rng, 1, 28))


def _iso(a) -> str:
    return f"{a[0]:04d}-{a[1]:02d}-{a[2]:02d}"


def _us(a) -> str:
    return f"{a[1]:02d}/{a[2]:02d}/{a[0]:04d}"


def _date_key(a) -> str:
    return f"date:{_iso(a)}"


_both_ways(
    ("iso_to_us_date", "us_to_iso_date"),
    (("YYYY-MM-DD", _iso), ("MM/DD/YYYY", _us)),
    draw=_date,
    split_key=_date_key,
    phrasings=lambda src, dst: [
        f"Rewrite the date {{data}} as {dst}.",
        f"Convert {{data}} from {src} to {dst}.",
        WithInput(f"Rewrite this {src} date in the {dst} format."),
    ],
)


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


def _identifier(rng):
    return _pick(rng, WORDS, _int(rng, 2, 3))


_both_ways(
    ("snake_to_camel", "camel_to_snake"),
    (("snake_case", _snake), ("camelCase", _camel)),
    draw=_identifier,
    split_key=lambda a: f"identifier:{a}",
    phrasings=lambda src, dst: [
        f"Convert {{data}} from {src} to {dst}.",
        f"Write the identifier {{data}} in {dst}.",
        WithInput(f"Rewrite this {src} name in {dst}."),
    ],
)
