"""``flag(..., needs=...)``: a flag declares where it acts, and one check refuses it set (to other
than its default) where nothing reads it, for every task's config and a job's own options."""

import dataclasses

import pytest

from cudt.runner.config import Needs, RunConfig, flag, unmet_needs

_FAST = Needs(lambda c: c.mode == "fast", "--level is read in --mode fast only: drop it")


@dataclasses.dataclass(frozen=True)
class _Toy(RunConfig):
    mode: str = flag("slow", "slow or fast")
    level: int = flag(1, "how fast", needs=_FAST)
    label: str | None = flag(
        None,
        "a name",
        needs=Needs(lambda c: c.mode == "fast", lambda c, name: f"{name} {c.label}: {c.mode}"),
    )


def test_a_flag_is_refused_set_where_its_needs_are_false_and_kept_at_its_default():
    assert _Toy().level == 1 and _Toy(level=1).level == 1  # the default acts on nothing: kept
    assert _Toy(mode="fast", level=3, label="x").level == 3  # where it acts: any value
    with pytest.raises(ValueError, match="^--level is read in --mode fast only: drop it$"):
        _Toy(level=3)
    with pytest.raises(ValueError, match="^--label x: slow$"):  # the message of the values
        _Toy(label="x")
    assert unmet_needs(_Toy(mode="fast", level=2)) is None
