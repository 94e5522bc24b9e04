"""The toy instruction set: eight small templated tasks in the Alpaca format, what the LLM task
trains on without ``--data`` (``--data toy``), split by record. The task families
(:mod:`cudt.data.instructions`, ``--data tasks``) are the larger set, split by item; the toy set
draws with their helpers from their word list.
"""

from __future__ import annotations

import numpy as np

from cudt.data.alpaca import AlpacaDataError, AlpacaRecord, AlpacaSplits
from cudt.data.instructions.registry import WORDS, _int, _pick

__all__ = ["INSTRUCTION_KINDS", "generated_instructions", "toy_splits"]


_WORDS = WORDS[:20]  # 20 nouns: the task families' first
_OPPOSITES = (
    ("hot", "cold"), ("big", "small"), ("fast", "slow"), ("happy", "sad"), ("light", "dark"),
    ("up", "down"), ("early", "late"), ("open", "closed"), ("full", "empty"), ("hard", "soft"),
    ("old", "new"), ("strong", "weak"), ("rich", "poor"), ("wet", "dry"), ("loud", "quiet"),
    ("high", "low"), ("long", "short"), ("clean", "dirty"), ("push", "pull"), ("win", "lose"),
)  # fmt: skip
_OPPOSITE = {**dict(_OPPOSITES), **{b: a for a, b in _OPPOSITES}}
_MAX_NUMBER = 30  # every number in the set is in [0, _MAX_NUMBER]

INSTRUCTION_KINDS: tuple[str, ...] = (
    "reverse", "sort", "repeat", "uppercase", "add", "opposite", "count", "next",
)  # fmt: skip


def _words(rng: np.random.Generator, low: int, high: int) -> tuple[str, ...]:
    return _pick(rng, _WORDS, _int(rng, low, high))


def _instruction(rng: np.random.Generator, kind: str) -> tuple[str, str, str, str]:
    """``(instruction with input, input, instruction without input, output)`` of one task."""
    if kind == "reverse":
        words = _words(rng, 3, 5)
        task, data, out = "Reverse the following words", " ".join(words), " ".join(words[::-1])
        return task + ".", data, f"{task}: {data}", out
    if kind == "sort":
        k = _int(rng, 3, 5)
        nums = [int(x) for x in rng.choice(_MAX_NUMBER + 1, size=k, replace=False)]
        task = "Sort these numbers in ascending order"
        data = ", ".join(map(str, nums))
        return task + ".", data, f"{task}: {data}", ", ".join(map(str, sorted(nums)))
    if kind == "repeat":
        word, k = _pick(rng, _WORDS), _int(rng, 2, 5)
        out = " ".join([word] * k)
        return f"Repeat the word {k} times.", word, f"Repeat the word {word} {k} times.", out
    if kind == "uppercase":
        words = _words(rng, 1, 3)
        data = " ".join(words)
        return "Convert to uppercase.", data, f"Convert to uppercase: {data}", data.upper()
    if kind == "add":
        a, b = (int(x) for x in rng.integers(0, _MAX_NUMBER // 2 + 1, size=2))
        out = f"{a} plus {b} is {a + b}."
        return "Add the two numbers.", f"{a} and {b}", f"What is {a} plus {b}?", out
    if kind == "opposite":
        word = _pick(rng, sorted(_OPPOSITE))
        out = f"The opposite of {word} is {_OPPOSITE[word]}."
        return "Give the opposite of the word.", word, f"Give the opposite of: {word}", out
    if kind == "count":
        words = _words(rng, 2, 6)
        data = " ".join(words)
        return (
            "Count the words.",
            data,
            f"Count the words: {data}",
            f"There are {len(words)} words.",
        )
    # "next"
    x = int(rng.integers(0, _MAX_NUMBER))
    out = f"The number after {x} is {x + 1}."
    return (
        "Give the number that comes after this one.",
        str(x),
        f"What number comes after {x}?",
        out,
    )


def generated_instructions(num_records: int, seed: int = 0) -> tuple[AlpacaRecord, ...]:
    """``num_records`` distinct Alpaca records of eight small tasks with learnable structure.

    Tasks (:data:`INSTRUCTION_KINDS`): reverse 3-5 words, sort 3-5 numbers, repeat a word 2-5
    times, convert 1-3 words to uppercase, add two numbers in 0-15, give the opposite of one of
    40 words, count 2-6 words, give the number after one in 0-29. Words come from a list of 20
    nouns. Each task is drawn uniformly and phrased half the time with an input
    (``"Reverse the following words."`` + input ``"river tiger lemon"``) and half the time without
    (``"Reverse the following words: river tiger lemon"``).

    Candidate ``j`` depends only on ``(seed, j)``; repeats are skipped, so the records are the
    first ``num_records`` distinct candidates and a longer set extends a shorter one.
    """
    if num_records < 0 or seed < 0:
        raise AlpacaDataError(
            f"generated_instructions needs num_records >= 0 and seed >= 0, got {num_records} "
            f"and {seed}: pass non-negative values"
        )
    records: list[AlpacaRecord] = []
    seen: set[AlpacaRecord] = set()
    max_candidates = 20 * num_records + 1000
    j = 0
    while len(records) < num_records:
        if j >= max_candidates:
            raise AlpacaDataError(
                f"generated_instructions found only {len(records)} distinct records in {j} "
                f"draws: ask for fewer than {num_records}"
            )
        rng = np.random.default_rng([seed, j])
        j += 1
        kind = INSTRUCTION_KINDS[int(rng.integers(len(INSTRUCTION_KINDS)))]
        with_input, data, without_input, output = _instruction(rng, kind)
        if rng.random() < 0.5:
            record = AlpacaRecord(instruction=with_input, input=data, output=output)
        else:
            record = AlpacaRecord(instruction=without_input, input="", output=output)
        if record not in seen:
            seen.add(record)
            records.append(record)
    return tuple(records)


def toy_splits(
    num_train: int | None = 2000, num_val: int = 200, num_test: int = 200, *, seed: int = 0
) -> AlpacaSplits:
    """Train / val / test records of the toy set: :func:`generated_instructions` makes exactly
    ``num_test + num_val + num_train`` distinct records from ``seed`` (``num_train=None`` means
    2000), dealt in the order drawn: test first, then val, then train. A longer set extends a
    shorter one, so test and val do not change with ``num_train`` (a permutation of all of them,
    as :func:`cudt.data.alpaca.split_alpaca` deals a fixed file, shared 23 of 200 test records
    between 1000 and 2000 training records)."""
    n_train = 2000 if num_train is None else num_train
    if n_train < 0 or num_val < 0 or num_test < 0:
        raise AlpacaDataError(
            f"split sizes must be num_train >= 0, num_val >= 0, num_test >= 0, got "
            f"{n_train}, {num_val}, {num_test}: pass non-negative counts"
        )
    records = generated_instructions(num_test + num_val + n_train, seed=seed)
    return AlpacaSplits(
        train=records[num_test + num_val :],
        val=records[num_test : num_test + num_val],
        test=records[:num_test],
        source=f"generated instructions (seed={seed}): train {n_train}, val {num_val}, test "
        f"{num_test} of {len(records)} (held out first, in the order drawn)",
    )
