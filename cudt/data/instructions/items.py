"""Task items and their splits: :func:`make_item`, :func:`split_of`, :func:`task_splits`, and
the case-sensitive scorer :func:`exact_answer`. Importing it registers every family, in the
draw order of the groups."""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np

from cudt.data.alpaca import AlpacaDataError, AlpacaRecord, AlpacaSplits
from cudt.data.instructions.registry import FAMILIES, WithInput

# The family modules register their families as they are imported: this order (the groups'
# order in the module docstring) is FAMILIES' order, and so the draw order of task_splits.
# isort: off
from cudt.data.instructions import arithmetic  # noqa: F401, E402
from cudt.data.instructions import strings  # noqa: F401, E402
from cudt.data.instructions import lists  # noqa: F401, E402
from cudt.data.instructions import formats  # noqa: F401, E402
from cudt.data.instructions import logic  # noqa: F401, E402

# isort: on

__all__ = [
    "FAMILY_GROUPS",
    "SPLIT_FRACTIONS",
    "TaskItem",
    "TaskSplits",
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
