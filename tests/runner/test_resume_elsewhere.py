"""Resume on whatever hardware comes back, and after a save killed midway.

A run checkpointed on 4 forced CPU devices resumes on 1, and one checkpointed on 1 resumes on 4:
the state is resharded on load, the run says so in one line, and its results equal the
uninterrupted run's to the tolerance of a change of reduction order (the batch split over the
mesh's data axis, the runs vmapped instead of mapped): docs/runner.md. A process killed inside an
orbax save (its arrays written, nothing committed) leaves the previous checkpoint usable: the
rerun resumes from it, says so in one line, and ends bit for bit where the uninterrupted run
does. (2 processes -> 1: tests/runner/test_runner.py, with the two-process job.)

The toy task (tests/helpers.py): 12 steps in chunks of 4, a checkpoint at every chunk, all kept.
An "interrupted" run is a finished run's folder cut back to its step-4 checkpoint: what a job
killed after that save leaves (its results.json and later checkpoints gone)."""

from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from helpers import ROOT, forced_devices_env, start_script, toy

from cudt.runner.lock import LOCK_FILE

ARGS = ["--seeds", "1", "--keep-checkpoints", "3"]  # checkpoints at steps 4, 8 and 12
GROUP = "toy-2"
STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"
RTOL, ATOL = 1e-4, 1e-6  # a change of device count (docs/runner.md)


def _cut(run: Path, to: Path, step: int = 4) -> Path:
    """A copy of the finished ``run`` as a job killed after its save of ``step`` leaves it."""
    shutil.copytree(run, to)
    (to / "results.json").unlink()
    for saved in (to / "checkpoints" / GROUP).iterdir():
        if int(saved.name) > step:
            shutil.rmtree(saved)
    return to


def _numbers(runs: list[dict]) -> np.ndarray:
    """Every number the runs of a results.json report (losses, λ, curves, metrics), in order."""

    def flat(x):
        if isinstance(x, dict):
            return [v for k in sorted(x) for v in flat(x[k])]
        if isinstance(x, list):
            return [v for item in x for v in flat(item)]
        if isinstance(x, bool) or not isinstance(x, int | float | type(None)):
            return []
        return [np.nan if x is None else float(x)]

    return np.asarray(flat(runs), np.float64)


FOUR_DEVICES = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {tests!r})
    import jax
    from helpers import toy
    assert jax.device_count() == 4, jax.devices()
    toy({args!r}, sys.argv[1])  # the uninterrupted run on 4 devices
    toy({args!r}, sys.argv[2])  # the 1-device run's cut folder, resumed on 4
    """
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """The uninterrupted run on 1 device (this process) and on 4 (a subprocess), and the
    1-device run cut at step 4 and resumed on 4 devices (the subprocess's stderr kept)."""
    root = tmp_path_factory.mktemp("elsewhere")
    one = root / "one"
    toy(ARGS, one)
    one_on_four = _cut(one, root / "one-on-four")
    env = forced_devices_env(4)
    code = FOUR_DEVICES.format(tests=str(ROOT / "tests"), args=ARGS)
    proc = subprocess.run(
        [sys.executable, "-c", code, str(root / "four"), str(one_on_four)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"root": root, "stderr": proc.stderr}


def _results(folder: Path) -> dict:
    return json.loads((folder / "results.json").read_text())


def _resume_lines(stderr: str) -> list[str]:
    return [s for s in re.split(r"[\r\n]", stderr) if s.startswith(f"{GROUP}: resumed")]


def test_four_devices_resume_on_one(runs, capsys):
    root = runs["root"]
    four = _results(root / "four")
    assert four["devices"] == 4
    cut = _cut(root / "four", root / "four-on-one")
    capsys.readouterr()
    resumed = toy(ARGS, cut)
    assert resumed["devices"] == 1
    assert _resume_lines(capsys.readouterr().err) == [
        f"{GROUP}: resumed from the checkpoint at step 4; saved on 4 devices (mesh run 2 × "
        "data 2), resharded onto 1 device: results agree with an uninterrupted run to float "
        "rounding (docs/runner.md)"
    ]
    for uninterrupted in (four, _results(root / "one")):  # on the old hardware, on the new
        a, b = _numbers(uninterrupted["runs"]), _numbers(resumed["runs"])
        assert a.shape == b.shape and a.size > 100
        np.testing.assert_allclose(b, a, rtol=RTOL, atol=ATOL, equal_nan=True)
    # training went on from step 4: the steps after it are in the resumed run's curves
    assert resumed["runs"][0]["curves"]["step"][-1] == 12


def test_one_device_resumes_on_four(runs):
    root = runs["root"]
    resumed = _results(root / "one-on-four")
    assert resumed["devices"] == 4
    assert _resume_lines(runs["stderr"]) == [
        f"{GROUP}: resumed from the checkpoint at step 4; saved on 1 device, resharded onto 4 "
        "devices (mesh run 2 × data 2): results agree with an uninterrupted run to float "
        "rounding (docs/runner.md)"
    ]
    for uninterrupted in (_results(root / "one"), _results(root / "four")):
        a, b = _numbers(uninterrupted["runs"]), _numbers(resumed["runs"])
        np.testing.assert_allclose(b, a, rtol=RTOL, atol=ATOL, equal_nan=True)


KILLED_IN_SAVE = textwrap.dedent(
    """
    import os, signal, sys
    from orbax.checkpoint._src.path import atomicity
    from helpers import toy

    commit = atomicity.AtomicRenameTemporaryPath.finalize

    async def finalize(self, *args, **kwargs):
        # the state of step 8 is written in full, and is about to be committed: die here
        if self.get_final().name == "state" and self.get().parent.name.startswith("8."):
            os.kill(os.getpid(), signal.SIGKILL)
        return await commit(self, *args, **kwargs)

    atomicity.AtomicRenameTemporaryPath.finalize = finalize
    toy({args!r}, sys.argv[1])
    """
)


def test_a_kill_inside_a_save_resumes_from_the_previous_checkpoint(runs, capsys):
    """SIGKILL inside orbax's save of step 8 (its arrays on disk, not yet committed): step 4
    is the last complete checkpoint, the rerun resumes from it, says so in one line (and takes
    over the dead job's lock in one more), and gives the uninterrupted run bit for bit."""
    root = runs["root"]
    out = root / "killed"
    proc = start_script(KILLED_IN_SAVE.format(args=ARGS), out)
    _, killed_err = proc.communicate(timeout=600)
    assert proc.returncode == -signal.SIGKILL, killed_err[-3000:]  # killed, inside the save
    group = out / "checkpoints" / GROUP
    assert sorted(p.name for p in group.iterdir()) == ["4", "8.orbax-checkpoint-tmp"]
    assert (group / "8.orbax-checkpoint-tmp" / "state.orbax-checkpoint-tmp").is_dir()
    assert (out / LOCK_FILE).exists() and not (out / "results.json").exists()
    capsys.readouterr()
    resumed = toy(ARGS, out)
    err = capsys.readouterr().err
    # besides the group's progress bar and its resume line, one line: the lock taken over
    others = [s for s in re.split(r"[\r\n]", err) if s and not s.startswith(f"{GROUP}: ")]
    assert len(others) == 1, err
    assert re.fullmatch(
        f"warning: --out {re.escape(str(out))}: took over the lock of PID {proc.pid} on host "
        f"{re.escape(socket.gethostname())}, started {STAMP}, which is no longer running",
        others[0],
    ), others
    assert _resume_lines(err) == [
        f"{GROUP}: resumed from the checkpoint at step 4, the last complete one (the save of "
        "step 8 was interrupted: its partial folder is removed)"
    ]
    assert sorted(p.name for p in group.iterdir()) == ["12", "4", "8"]
    straight = _results(root / "one")
    for key in ("final_loss", "multipliers", "max_multipliers", "curves", "layer_loss"):
        assert [r[key] for r in resumed["runs"]] == [r[key] for r in straight["runs"]], key
