"""One job per output folder (:mod:`cudt.runner.lock`): a second job on a held ``--out`` is
refused in one line and writes nothing, the first is unaffected, a stale lock is taken over with
one line, a record of another host is judged by its heartbeat, a multi-host job's processes check
process 0's token, and ``experiments.combine`` and the pages' writer refuse a folder a job holds.

The other job is a real second process taking the lock with the runner's own code
(``helpers.LockHolder``), or a real run of the toy task in a subprocess."""

from __future__ import annotations

import json
import os
import re
import socket
import textwrap
import threading
import time
from pathlib import Path

import pytest
from helpers import LockHolder, ToyTask, one_line_error, snapshot, start_script, toy

import cudt.runner.lock as lock_module
from cudt.runner.cli import task_main
from cudt.runner.lock import LOCK_FILE, OutputInUse, check_free, check_job_token, lock_output
from experiments import combine, dual_study
from experiments.paper import pages as pages_module
from experiments.paper.pages import Block, write_pages

HOST = socket.gethostname()
STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"  # a holder's start, as a message shows it
TOY = ["--seeds", "1"]


@pytest.fixture(scope="module")
def holder():
    other = LockHolder()
    yield other
    other.close()


@pytest.fixture(scope="module")
def lone(tmp_path_factory) -> dict:
    """The toy run alone: what a job on a folder nobody else touches writes."""
    return toy(TOY, tmp_path_factory.mktemp("lone") / "run")


def test_a_second_job_is_refused_in_one_line_and_writes_nothing(holder, tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("the first job's folder")
    holder.hold(out)
    before = snapshot(out)
    assert task_main(ToyTask(), [*TOY, "--out", str(out)], "toy", "toy") == 2
    err = one_line_error(capsys)
    assert f"--out {out} is in use by another job (PID {holder.pid} on host {HOST}, started " in err
    assert err.endswith("wait for it to finish (or stop it), or pass another --out")
    assert snapshot(out) == before
    # the same refusal when the folder is free at the start and taken before the lock
    with pytest.raises(OutputInUse, match=f"PID {holder.pid} on host {HOST}"):
        lock_output(out)
    assert snapshot(out) == before
    holder.release(out)
    assert not (out / LOCK_FILE).exists()
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


TOY_JOB = textwrap.dedent(
    """
    import sys
    from helpers import ToyTask
    from cudt.runner.cli import task_main
    sys.exit(task_main(ToyTask(), {argv!r} + ["--out", sys.argv[1]], "toy", "toy"))
    """
)


def test_a_study_job_on_a_held_folder_is_refused(holder, tmp_path, capsys):
    """The table and study jobs write outside the runner (their data, reports, figures), so
    they lock their own --out too (experiments.paper.job.open_job)."""
    out = tmp_path / "study"
    holder.hold(out)
    before = snapshot(out)
    argv = ["--scale", "tiny", "--settings", "video", "--seeds", "1", "--steps", "2",
            "--formulations", "lagrangian", "--dual-optimizers", "sgd", "--updates",
            "simultaneous", "--dual-lr-factors", "1", "--out", str(out)]  # fmt: skip
    assert dual_study.main(argv) == 2
    assert f"--out {out} is in use by another job (PID {holder.pid}" in one_line_error(capsys)
    assert snapshot(out) == before
    holder.release(out)


def test_two_jobs_on_one_folder_the_first_is_unaffected(lone, tmp_path, capsys):
    """The issue's case: the same command started twice on one --out. The first (a real toy
    run in a subprocess) trains on; the second, started while the first holds the folder,
    is refused in one line; the first's results.json equals a lone run's."""
    out = tmp_path / "run"
    first = start_script(TOY_JOB.format(argv=TOY), out)
    deadline = time.monotonic() + 300
    while not (out / LOCK_FILE).exists() and first.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    status = task_main(ToyTask(), [*TOY, "--out", str(out)], "toy", "toy")
    assert first.poll() is None, "the first job ended before the second started"
    _, first_err = first.communicate(timeout=600)
    assert first.returncode == 0, first_err[-3000:]
    assert status == 2
    err = one_line_error(capsys)
    assert f"is in use by another job (PID {first.pid} on host {HOST}" in err
    results = json.loads((out / "results.json").read_text())
    assert [r["final_loss"] for r in results["runs"]] == [r["final_loss"] for r in lone["runs"]]
    assert [r["curves"] for r in results["runs"]] == [r["curves"] for r in lone["runs"]]
    assert not (out / LOCK_FILE).exists()  # released at the end


def test_a_stale_lock_is_taken_over_with_one_line(tmp_path):
    stale = LockHolder()
    out = tmp_path / "run"
    stale.hold(out)
    pid = stale.pid
    stale.die()  # SIGKILL: the kernel drops its flock, its lock file stays
    assert (out / LOCK_FILE).exists()
    said: list[str] = []
    with lock_output(out, say=said.append) as lock:
        assert len(said) == 1
        assert re.fullmatch(
            f"warning: --out {re.escape(str(out))}: took over the lock of PID {pid} on host "
            f"{re.escape(HOST)}, started {STAMP}, which is no longer running",
            said[0],
        ), said
        assert json.loads((out / LOCK_FILE).read_text())["pid"] == os.getpid()
        assert check_job_token(out, lock.token) is None
        assert "another job" in check_job_token(out, lock.token + 1)
    assert not out.joinpath(LOCK_FILE).exists()
    assert check_job_token(out, 1) == f"no lock file in {out}"


def test_a_lock_that_refuses_removes_only_what_it_created(tmp_path):
    new = tmp_path / "a" / "b"
    lock = lock_output(new)
    assert new.is_dir() and (new / LOCK_FILE).is_file()
    lock.release(discard=True)  # refused while opening: nothing to keep
    assert not (tmp_path / "a").exists()
    there = tmp_path / "there"
    there.mkdir()
    lock_output(there).release(discard=True)
    assert there.is_dir() and list(there.iterdir()) == []
    # a job refused after another made its own folder beside it in the parent this one created
    # (array jobs on runs/new/$ID): the other job's folder and files stay
    refused = lock_output(tmp_path / "runs" / "new" / "b")
    other = lock_output(tmp_path / "runs" / "new" / "a")
    (other.out / "config.json").write_text("{}")
    refused.release(discard=True)
    assert not (tmp_path / "runs" / "new" / "b").exists()
    assert (other.out / "config.json").is_file() and (other.out / LOCK_FILE).is_file()
    other.release()


def _elsewhere(out: Path, beat: int = 0) -> None:
    """The record a job on another host writes (its host is not this one)."""
    record = {"pid": 4242, "host": "elsewhere", "started": "2026-01-01T00:00:00+00:00"}
    (out / LOCK_FILE).write_text(json.dumps(record | {"job": 7, "beat": beat}) + "\n")


def test_another_hosts_lock_is_judged_by_its_heartbeat(tmp_path, monkeypatch):
    """Where flock is not shared between hosts, a job on another host is invisible to it:
    its record, refreshed every HEARTBEAT_S while it runs, is what tells it is alive."""
    monkeypatch.setattr(lock_module, "STALE_AFTER_S", 0.6)
    out = tmp_path / "run"
    out.mkdir()
    _elsewhere(out)
    stop = threading.Event()

    def beat():
        n = 0
        while not stop.wait(0.1):
            n += 1
            _elsewhere(out, n)

    thread = threading.Thread(target=beat)
    thread.start()
    try:
        with pytest.raises(OutputInUse) as refused:
            lock_output(out)
        with pytest.raises(OutputInUse):
            check_free(out, reader=True)
    finally:
        stop.set()
        thread.join()
    assert "PID 4242 on host elsewhere, started 2026-01-01 00:00:00 UTC" in str(refused.value)
    assert "docs/runner.md lists the file systems whose locks every host sees" in str(refused.value)
    check_free(out)  # no heartbeat for STALE_AFTER_S: that job no longer runs
    said: list[str] = []
    with lock_output(out, say=said.append):
        pass
    assert said == [
        f"warning: --out {out}: took over the lock of PID 4242 on host elsewhere, started "
        "2026-01-01 00:00:00 UTC, from another host: its record was not refreshed for 0.6 s"
    ]


def test_a_record_of_this_host_name_from_another_machine_is_judged_by_its_heartbeat(
    tmp_path, monkeypatch
):
    """Containers given one host name on two machines: a record naming this host but another
    kernel (boot id) is another machine's, whose flock may not reach here; while its record is
    refreshed it is refused, not taken over as "no longer running". A record without a boot id
    (from before it) is judged by its host name, as before."""
    monkeypatch.setattr(lock_module, "STALE_AFTER_S", 0.6)
    out = tmp_path / "run"
    out.mkdir()
    other_machine = {"pid": os.getpid() + 1, "host": HOST, "boot": "another-kernel"}
    stop = threading.Event()

    def beat():
        n = 0
        while not stop.wait(0.1):
            n += 1
            (out / LOCK_FILE).write_text(json.dumps(other_machine | {"beat": n}) + "\n")

    (out / LOCK_FILE).write_text(json.dumps(other_machine | {"beat": 0}) + "\n")
    thread = threading.Thread(target=beat)
    thread.start()
    try:
        with pytest.raises(OutputInUse, match=f"PID {os.getpid() + 1} on host {HOST}"):
            lock_output(out)
    finally:
        stop.set()
        thread.join()
    older = {"pid": os.getpid() + 1, "host": HOST}  # no boot id, no such process alive here
    (out / LOCK_FILE).write_text(json.dumps(older) + "\n")
    said: list[str] = []
    with lock_output(out, say=said.append):
        pass
    assert len(said) == 1 and "which is no longer running" in said[0], said


def test_a_held_lock_is_refreshed_and_read_without_writing(holder, tmp_path, monkeypatch):
    monkeypatch.setattr(lock_module, "HEARTBEAT_S", 0.05)
    out = tmp_path / "run"
    with lock_output(out):
        first = json.loads((out / LOCK_FILE).read_text())
        time.sleep(0.5)
        later = json.loads((out / LOCK_FILE).read_text())
        assert later["beat"] > first["beat"] and later["pid"] == first["pid"] == os.getpid()
    check_free(tmp_path / "nothing-here")  # no folder: free, and nothing created
    assert not (tmp_path / "nothing-here").exists()


def test_combine_and_the_pages_writer_refuse_a_folder_a_job_holds(holder, tmp_path, capsys):
    runs = tmp_path / "runs"
    folder = runs / "tiny"
    folder.mkdir(parents=True)
    (folder / "results.json").write_text('{"experiment": "toy", "config": {}, "runs": []}')
    pages = tmp_path / "pages"
    pages.mkdir()
    page = pages / "a.md"
    text = (
        "x\n<!-- generated:tiny (python -m experiments.pages write) -->\nold\n<!-- end:tiny -->\n"
    )
    page.write_text(text)
    registry = {"tiny": Block("tiny", "experiments.video_denoise", (), pages_module._video_task)}
    holder.hold(folder)
    before = snapshot(tmp_path)
    try:
        capsys.readouterr()
        assert combine.main([str(folder)]) == 2
        err = one_line_error(capsys)
        assert re.fullmatch(
            f"error: {re.escape(str(folder))} is being written by a job still running "
            f"\\(PID {holder.pid} on host {re.escape(HOST)}, started {STAMP}\\): wait for it "
            "to finish",
            err,
        ), err
        assert write_pages(pages, runs, registry=registry) == 2
        err = one_line_error(capsys)
        assert f"error: {folder} is being written by a job still running" in err
        assert err.endswith("wait for it to finish; nothing written")
        # the readers of a finished run's checkpoints too: they would pair its results.json
        # with checkpoints an --overwrite rerun is replacing
        from experiments import export_decoder, layer_gradients

        for main, argv in (
            (export_decoder.main, [str(folder), str(tmp_path / "models")]),
            (layer_gradients.main, [str(folder)]),
        ):
            assert main(argv) == 2
            assert one_line_error(capsys).startswith(
                f"error: {folder} is being written by a job still running (PID {holder.pid}"
            )
        assert snapshot(tmp_path) == before
    finally:
        holder.release(folder)
    # released: both read the folder again (a toy run is no experiment combine knows)
    assert combine.main([str(folder)]) == 2
    assert "unknown experiment 'toy'" in one_line_error(capsys)
    assert write_pages(pages, runs, registry=registry) == 2  # another experiment's results
    assert "holds experiment 'toy', not 'video_denoise'" in one_line_error(capsys)
