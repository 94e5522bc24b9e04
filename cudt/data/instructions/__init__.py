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

from cudt.data.instructions.items import (
    FAMILY_GROUPS,
    SPLIT_FRACTIONS,
    TaskItem,
    TaskSplits,
    describe_families,
    exact_answer,
    make_item,
    split_of,
    task_splits,
)
from cudt.data.instructions.registry import FAMILIES, Family, WithInput
from cudt.data.instructions.toy import INSTRUCTION_KINDS, generated_instructions, toy_splits

__all__ = [
    "FAMILIES",
    "FAMILY_GROUPS",
    "INSTRUCTION_KINDS",
    "SPLIT_FRACTIONS",
    "Family",
    "TaskItem",
    "TaskSplits",
    "WithInput",
    "describe_families",
    "exact_answer",
    "generated_instructions",
    "make_item",
    "split_of",
    "task_splits",
    "toy_splits",
]
