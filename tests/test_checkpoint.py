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


def test_a_library_user_is_told_what_to_do_with_folders_the_command_line_with_its_flags(
    tmp_path, capsys
):
    from cudt.runner.cli import run_cli

    with GroupCheckpointer(tmp_path / "ck") as ck:
        ck.save(1, {"w": jnp.arange(3.0)}, {})
        ck.wait()
        with pytest.raises(CheckpointError) as err:
            ck.restore({"w": jnp.zeros(4)})  # another model's shapes
    message = str(err.value)
    assert "written by a different model" in message
    assert message.endswith("use another folder, or delete this one to start again")
    assert "--" not in message  # no command-line flag in the library's words
    assert err.value.cli.endswith("pass another --out, or --overwrite to discard it")

    def main():
        raise err.value

    assert run_cli(main) == 2  # the entry points print the command line's words
    assert capsys.readouterr().err.strip() == f"error: {err.value.cli}"


def test_a_checkpoint_of_another_number_of_runs_is_named_as_such(tmp_path):
    """The same model's states stacked for 2 runs, restored into 3: it says so (it read as a
    checkpoint "written by a different model or optimiser"); another model's still does."""
    two = {"w": jnp.zeros((2, 4, 4)), "step": jnp.zeros(2, jnp.int32)}
    with GroupCheckpointer(tmp_path / "ck") as ck:
        ck.save(1, two, {})
        ck.wait()
        three = {"w": jnp.zeros((3, 4, 4)), "step": jnp.zeros(3, jnp.int32)}
        with pytest.raises(CheckpointError, match=r"holds 2 runs .*, and the states to restore 3"):
            ck.restore(three)
        other = {"w": jnp.zeros((3, 4, 5)), "step": jnp.zeros(3, jnp.int32)}
        with pytest.raises(CheckpointError, match="written by a different model or optimiser"):
            ck.restore(other)
        assert ck.restore(two)[0]["w"].shape == (2, 4, 4)


def test_after_a_failed_save_its_unstarted_writes_are_not_reported_other_warnings_are():
    """The "coroutine ... was never awaited" of a failed save's write coroutines, which the
    garbage collector reports at some point after the one error line, is dropped; another
    coroutine's still prints."""
    import gc
    import warnings

    from cudt import checkpoint

    async def write_fragment():  # the name of orbax's per-array write
        pass

    async def compute():
        pass

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        checkpoint._ignore_unawaited_writes()
        for make in (write_fragment, compute):
            coroutine = make()
            del coroutine
            gc.collect()
    said = [str(w.message) for w in seen if issubclass(w.category, RuntimeWarning)]
    # the names end in the function's own: the test's name (…failed_save…) does not count
    assert len(said) == 1 and said[0].endswith("<locals>.compute' was never awaited"), said


def test_restoring_from_a_folder_that_does_not_exist_leaves_none_behind(tmp_path):
    """A mistyped folder: the one line says there is nothing to resume from, and the folders the
    checkpointer made to open it are gone again (an existing empty folder stays)."""
    with pytest.raises(CheckpointError, match="nothing to resume from"):
        with GroupCheckpointer(tmp_path / "typo" / "dir") as ck:
            ck.restore(None)
    assert not (tmp_path / "typo").exists()
    (tmp_path / "mine").mkdir()
    with pytest.raises(CheckpointError, match="nothing to resume from"):
        with GroupCheckpointer(tmp_path / "mine") as ck:
            ck.restore(None)
    assert (tmp_path / "mine").is_dir()


def test_a_step_without_its_metadata_brings_no_absl_warnings(tmp_path, caplog):
    """A step folder without orbax's metadata file (a half-deleted step, as a killed job leaves
    it) made orbax warn on stderr ('WARNING:absl:Metadata file does not exist: ...') at every
    opening of the folder; the checkpointer says what matters in its own words."""
    import logging

    states = {"w": jnp.arange(3.0)}
    with GroupCheckpointer(tmp_path / "ck") as ck:
        ck.save(1, states, {"a": 1})
        ck.save(2, states, {"a": 2})
        ck.wait()
    (tmp_path / "ck" / "2" / "_CHECKPOINT_METADATA").unlink()
    absl = logging.getLogger("absl")
    level = absl.level
    caplog.set_level(logging.WARNING)
    with GroupCheckpointer(tmp_path / "ck") as ck:
        restored, loop = ck.restore(states)
    assert [r.getMessage() for r in caplog.records if r.name == "absl"] == []
    assert restored["w"].tolist() == [0.0, 1.0, 2.0] and loop["a"] == 2
    assert absl.level == level  # set back: absl's own warnings elsewhere still print
