"""Task families of the arithmetic group: sums, differences, products, quotients, remainders,
comparisons and divisibility of small integers."""

from __future__ import annotations

from cudt.data.instructions.registry import (
    WithInput,
    _family,
    _int,
    _sorted_key,
    _yes,
)

# ---- arithmetic ------------------------------------------------------------------------------


def _two_numbers(rng):
    """Two distinct numbers in 0-999."""
    a, b = (int(x) for x in rng.choice(1000, size=2, replace=False))
    return (a, b)


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
    # a - b = c is the inverse of c + b = a: one question, one split
    split_key=lambda a: f"add:{tuple(sorted((a[0] - a[1], a[1])))}",
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
    # a / b = c (exact) is the inverse of c * b = a: one question, one split
    split_key=lambda a: f"multiply:{tuple(sorted((a[0] // a[1], a[1])))}",
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
    return _two_numbers(rng)


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
    return _two_numbers(rng)


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
