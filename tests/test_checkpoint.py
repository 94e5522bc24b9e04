"""``cudt.checkpoint.GroupCheckpointer`` as a library user meets it: a loop record that is not
JSON, and a step that was never saved, are one clear error each, and nothing is written."""

from __future__ import annotations

import jax.numpy as jnp
import pytest

from cudt.checkpoint import GroupCheckpointer
from cudt.errors import CheckpointError, UsageError


def test_a_bad_loop_record_or_a_missing_step_is_one_clear_error(tmp_path):
    states = {"w": jnp.arange(3.0)}
    with GroupCheckpointer(tmp_path / "ck") as ck:
        with pytest.raises(UsageError, match=r"must be JSON .*x\.tolist\(\)"):
            ck.save(1, states, {"a": jnp.ones(2)})  # an array, not JSON
        assert ck.all_steps() == [] and not any((tmp_path / "ck").glob("1*"))
        ck.save(2, states, {"a": [1.0, 1.0]})
        ck.wait()
        with pytest.raises(CheckpointError, match=r"no checkpoint of step 99 .*steps: \[2\]"):
            ck.restore(states, step=99)
        restored, loop = ck.restore(states)
    assert restored["w"].tolist() == [0.0, 1.0, 2.0] and loop["a"] == [1.0, 1.0]
