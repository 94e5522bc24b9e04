"""The video CLI's --out: checkpoints that are not this run's, an output folder it must not
touch (finished results, a file, another job's), and a full disk (docs/errors.md: "Checkpoints
in `--out`", "Output folder, full disk"). One real tiny run, copied per case. The helpers are
in refusals.py."""

from __future__ import annotations

import gc
import json
import os
import shutil
import warnings
from pathlib import Path

import pytest
from helpers import LockHolder, finished_job
from refusals import (
    TINY,
    check,
    cli,
    cli_subprocess,
    entry_cli,
    over_cases,
    previous_run,
    refused,
    tree,
)

from experiments import combine, video_denoise

RESULTS = ("results.json", "layer_loss.png", "rmse_vs_gamma.png", "training_curves.png")


def temp_files(path: Path) -> list[str]:
    """Half-written leftovers: our atomic-write temporaries and orbax's temporary folders."""
    return [
        str(p)
        for p in path.rglob("*")
        if p.name.endswith(".tmp") or "orbax-checkpoint-tmp" in p.name
    ]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A real finished tiny run: results, plots, checkpoints at steps 2 and 4 of both groups."""
    out = finished_job(video_denoise.main, TINY, tmp_path_factory.mktemp("finished") / "run")
    assert (out / "results.json").is_file()
    for group in ("dust-1-ERM", "dust-1-constrained", "dust-pl-1-ERM", "ut-1"):
        assert sorted(p.name for p in (out / "checkpoints" / group).iterdir()) == ["2", "4"]
    return out


@pytest.fixture
def interrupted_run(finished_run, tmp_path) -> Path:
    """The same run as if killed before it wrote its results: only checkpoints."""
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    for name in RESULTS:
        (out / name).unlink()
    return out


FINISHED_RUN_CASES = [
    # (case, flags, problem ({run}: the finished run's folder), fix)
    (
        "--out holds results of a finished run",
        [],
        "already holds results.json of a finished run",
        "pass another --out, or --overwrite to replace it",
    ),
    # --resume of a finished run was told to pass --overwrite as if two runs conflicted (and
    # --overwrite with --resume is refused): it is told the run is done and where its results are
    (
        "--resume of a finished run",
        ["--resume"],
        "--resume: the run in {run} is finished (its results are in {run}/results.json), so "
        "there is nothing to resume",
        "read them there, or drop --resume and pass --overwrite to train it again",
    ),
]


@pytest.mark.slow
@over_cases(FINISHED_RUN_CASES, "case, flags, problem, fix")
def test_output_of_a_finished_run(case, flags, problem, fix, finished_run, capsys):
    """A finished run's folder is never written again without --overwrite."""
    argv = [*TINY, *flags, "--out", finished_run]
    refused(case, argv, capsys, problem.format(run=finished_run), fix, keeps=finished_run)


def _zeroed_arrays(out: Path) -> None:
    """The last group's latest checkpoint with its array chunks zeroed: found before the first
    group trains or writes."""
    step = out / "checkpoints" / "ut-1" / "4"
    for chunk in (step / "state" / "ocdbt.process_0" / "d").iterdir():
        chunk.write_bytes(b"\0" * 64)


def _truncated_index(out: Path) -> None:
    state = out / "checkpoints" / "ut-1" / "4" / "state"
    for manifest in state.rglob("manifest.ocdbt"):
        manifest.write_bytes(manifest.read_bytes()[:10])


def _loop_records(edit):
    """Each group's latest loop record (a JSON file) rewritten by ``edit``."""

    def build(out: Path) -> None:
        for record in out.glob("checkpoints/*/4/loop/metadata"):
            record.write_text(json.dumps(edit(json.loads(record.read_text()))))

    return build


def _trained_with_each_models_lr(out: Path) -> None:
    """Nothing changed: the run was trained with each model's default lr (what --lr overrides)."""
    assert video_denoise.Config().lr is None


def _dust_checkpoint_as_ut(out: Path) -> None:
    """A DUST checkpoint under the UT group's name (a folder copied from another group): its
    arrays are compared with this model's before anything is trained."""
    checkpoints = out / "checkpoints"
    shutil.rmtree(checkpoints / "ut-1")
    shutil.copytree(checkpoints / "dust-1-ERM", checkpoints / "ut-1")


def _older_state_layout(out: Path) -> None:
    """ut-1's latest checkpoint rewritten as cudt wrote it before nuPI's gains took the knobs'
    names (``kp`` / ``ema_nu`` in the dual state, now ``nupi_kp`` / ``nupi_ema``): the same
    arrays under other names, named as such, not as a corrupt file."""
    from jax.tree_util import keystr, tree_flatten_with_path

    from cudt.checkpoint import GroupCheckpointer

    def old_names(tree):
        if isinstance(tree, (list, tuple)):
            return type(tree)(old_names(v) for v in tree)
        if not isinstance(tree, dict):
            return tree
        rename = {"nupi_kp": "kp", "nupi_ema": "ema_nu"}
        return {rename.get(k, k): old_names(v) for k, v in tree.items()}

    group = out / "checkpoints" / "ut-1"
    checkpointer = GroupCheckpointer(group)
    states, loop = checkpointer.restore(None, 4)
    checkpointer.close()
    paths = [keystr(p) for p, _ in tree_flatten_with_path(states)[0]]
    assert any(p.endswith("['nupi_kp']") for p in paths)  # the video task's default is nuPI
    shutil.rmtree(group / "4")
    checkpointer = GroupCheckpointer(group)
    checkpointer.save(4, old_names(states), {k: v for k, v in loop.items() if k != "pinned"})
    checkpointer.close()


RESUME_ELSEWHERE = "delete that folder to resume from an earlier step, or pass --overwrite"
SAME_FLAGS = "pass another --out, rerun with the same flags to resume, or --overwrite"
DISCARD = "pass another --out, or --overwrite to discard it"

CHECKPOINT_CASES = [
    # (case, build(out): the interrupted run's checkpoints made so, flags, problem, fix)
    (
        "corrupt checkpoint",
        _zeroed_arrays,
        [],
        "ut-1/4 is corrupt (its arrays cannot be read",
        RESUME_ELSEWHERE,
    ),
    (
        "checkpoint with a truncated array index",
        _truncated_index,
        [],
        "ut-1/4 is corrupt (its arrays cannot be read",
        RESUME_ELSEWHERE,
    ),
    (
        "checkpoint with a corrupt loop record",
        lambda out: (out / "checkpoints" / "ut-1" / "4" / "loop" / "metadata").write_text("{"),
        [],
        "ut-1/4 is corrupt (its loop record cannot be read",
        RESUME_ELSEWHERE,
    ),
    # a loop record that reads as JSON but is not a record of the group's runs crashed
    # mid-resume (a KeyError; one of fewer runs an IndexError after training, results half
    # written): refused as a corrupt checkpoint before any training
    (
        "checkpoint with an empty loop record",
        _loop_records(lambda loop: {}),
        [],
        "4 is corrupt (its loop record cannot be read: no list 'frozen')",
        RESUME_ELSEWHERE,
    ),
    (
        "checkpoint with a loop record of other runs",
        _loop_records(lambda loop: loop | {"frozen": [False], "divergences": [None]}),
        [],
        "4 is corrupt (its loop record cannot be read: 'frozen' is not ",
        RESUME_ELSEWHERE,
    ),
    (
        "checkpoints of a different config",
        _trained_with_each_models_lr,
        ["--lr", 5e-4],
        "holds checkpoints of a different config (lr None -> 0.0005)",
        SAME_FLAGS,
    ),
    (
        "checkpoints of a different model (--models)",
        lambda out: None,
        ["--models", "dust"],
        "holds checkpoints of a different config (models ['dust', 'ut'] -> ['dust'])",
        SAME_FLAGS,
    ),
    (
        "checkpoints of an earlier cudt with a setting since removed",
        lambda out: _record_in_checkpoints_config(out, removed_setting=3),
        [],
        "holds checkpoints of an earlier cudt, with settings this version no longer has "
        "(removed_setting 3)",
        "pass another --out, or --overwrite to discard them",
    ),
    (
        "checkpoint written by a different model",
        _dust_checkpoint_as_ut,
        [],
        "ut-1/4 was written by a different model or optimiser (",
        DISCARD,
    ),
    (
        "checkpoint of an older state layout",
        _older_state_layout,
        [],
        "ut-1/4 was written by another version of cudt (it names dual_state/",
        DISCARD,
    ),
    (
        "checkpoints without their config.json",
        lambda out: (out / "checkpoints" / "config.json").unlink(),
        [],
        "holds checkpoints but no checkpoints/config.json saying which config they belong to",
        "pass another --out, or --overwrite to discard them",
    ),
    (
        "checkpoint config.json unreadable",
        lambda out: (out / "checkpoints" / "config.json").write_text('{"lr": 0.0'),
        [],
        "checkpoints/config.json is unreadable",
        "pass another --out, or --overwrite to start again",
    ),
]


def _record_in_checkpoints_config(out: Path, **fields) -> None:
    """``fields`` added to the checkpoints' config.json, as an earlier cudt recorded them."""
    path = out / "checkpoints" / "config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | fields))


@pytest.mark.slow
@over_cases(CHECKPOINT_CASES, "case, build, flags, problem, fix")
def test_checkpoints_in_out(case, build, flags, problem, fix, interrupted_run, capsys):
    """The interrupted run's checkpoints, made by ``build`` unusable for this run (broken, of
    another config or model, or without their config), resumed with ``flags``: refused before
    any training, the folder as it was."""
    build(interrupted_run)
    argv = [*TINY, *flags, "--out", interrupted_run]
    refused(case, argv, capsys, problem, fix, keeps=interrupted_run)


def _orbax_read_coroutine():
    """An unstarted coroutine shaped like orbax's per-array read (its name and file)."""
    namespace: dict = {}
    code = compile(
        "async def _read_array_index_and_device_put():\n    pass\n",
        "/site-packages/orbax/checkpoint/_src/serialization/serialization.py",
        "exec",
    )
    exec(code, namespace)
    return namespace["_read_array_index_and_device_put"]()


def test_failed_restore_closes_orbax_reads_it_left_unstarted():
    """What the restore above leaves when orbax's loop closes under queued reads: each such
    coroutine warns "never awaited" when collected, unless the restore closes it (it did print,
    intermittently, after the error line above)."""
    from cudt.checkpoint import _close_orbax_stragglers

    def warnings_on_collect(close: bool) -> list[str]:
        coro = _orbax_read_coroutine()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if close:
                assert _close_orbax_stragglers() >= 1
            del coro
            gc.collect()
        return [str(w.message) for w in caught]

    assert any("never awaited" in m for m in warnings_on_collect(close=False))
    assert warnings_on_collect(close=True) == []


def test_resume_with_nothing_to_resume(tmp_path, capsys):
    out = tmp_path / "new"
    status, err = cli([*TINY, "--resume", "--out", out], capsys)
    check(
        "--resume with no checkpoint",
        status,
        err,
        "holds no checkpoint to resume from",
        "drop --resume to start a new run",
    )
    assert not out.exists()


def test_output_is_a_file(tmp_path, capsys):
    out = tmp_path / "results.txt"
    out.write_text("my notes")
    status, err = cli([*TINY, "--out", out], capsys)
    check("--out is a file", status, err, "is a file, not a folder", "pass a folder path")
    assert out.read_text() == "my notes"


def test_output_empty(tmp_path, capsys, monkeypatch):
    """``--out ""`` (an unset shell variable) trained into a fresh runs/... folder and exited 0."""
    monkeypatch.chdir(tmp_path)
    status, err = cli([*TINY, "--out", ""], capsys)
    check("--out empty", status, err, "--out needs a path", "pass --out DIR, or leave it out")
    assert not any(tmp_path.iterdir())  # no runs/ folder


@pytest.mark.parametrize(
    "job",
    [
        "text_classify",
        "llm_sft",
        "phase_one",
        "video_table",
        "text_table",
        "ut_study",
        "dual_study",
    ],
)
def test_output_empty_for_every_job(job, tmp_path, capsys, monkeypatch):
    """``--out ""`` of the jobs whose folder cudt.io.claimed_run_dir claims (the paper jobs)
    was read as no --out: a fresh runs/... folder was written, the job trained."""
    import importlib

    monkeypatch.chdir(tmp_path)
    main = importlib.import_module(f"experiments.{job}").main
    status, err = entry_cli(main, ["--out", ""], capsys)
    check(None, status, err, "--out needs a path", "pass --out DIR, or leave it out")
    assert not any(tmp_path.iterdir())  # no runs/ folder


def test_output_with_a_file_where_a_group_checkpoints(tmp_path, capsys):
    """A file at checkpoints/<group> failed that group's first save, after its training (and
    the run's config.json was written): refused before anything is written."""
    out = tmp_path / "run"
    (out / "checkpoints").mkdir(parents=True)
    (out / "checkpoints" / "ut-1").write_text("my notes")
    refused(
        "a file where a group's checkpoints go",
        [*TINY, "--out", out],
        capsys,
        "checkpoints/ut-1 is a file, where the checkpoints of ut-1 go",
        "move or delete it, or pass another --out",
        keeps=out,
    )


def test_output_under_a_file(tmp_path, capsys):
    """An unwritable --out that stays unwritable as root: its parent is a regular file."""
    parent = tmp_path / "notes.txt"
    parent.write_text("my notes")
    status, err = cli([*TINY, "--out", parent / "run"], capsys)
    check(
        "--out cannot be created",
        status,
        err,
        "cannot write to --out",
        "(Not a directory): pass a writable folder",
    )
    assert parent.read_text() == "my notes"


def test_output_in_a_read_only_folder(tmp_path, capsys):
    """--out inside a folder nobody may write to. As a normal user: a chmod 0o555 folder. Root
    writes through file permissions, so as root the folder is one the kernel refuses to
    anyone: /sys (sysfs; mkdir there fails with EPERM for root too). Never skipped."""
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o555)
        out, reason = locked / "run", "(Permission denied)"
    else:
        locked, out, reason = Path("/sys"), Path("/sys/cudt-test-run"), "(Operation not permitted)"
    assert not out.exists()
    before = sorted(p.name for p in locked.iterdir())
    try:
        status, err = cli([*TINY, "--out", out], capsys)
    finally:
        if locked != Path("/sys"):
            locked.chmod(0o755)
    # the OS reason differs between the two mechanisms: not a docs/errors.md row
    check(None, status, err, f"cannot write to --out {out} {reason}", "pass a writable folder")
    assert not out.exists() and sorted(p.name for p in locked.iterdir()) == before


@pytest.fixture(scope="module")
def other_job():
    """Another job's process, holding output folders' locks."""
    other = LockHolder()
    yield other
    other.close()


def test_output_in_use_by_another_job(other_job, tmp_path, capsys):
    out = tmp_path / "run"
    other_job.hold(out)
    refused(
        "--out in use by another job",
        [*TINY, "--out", out],
        capsys,
        f"--out {out} is in use by another job (PID {other_job.pid} on host ",
        "wait for it to finish (or stop it), or pass another --out",
        keeps=out,
    )
    other_job.release(out)


def test_output_being_written_is_not_combined(other_job, tmp_path, capsys):
    run = previous_run(tmp_path / "run")  # a job running again on it (say with --overwrite)
    before = tree(run)
    other_job.hold(run)
    capsys.readouterr()
    try:
        status = combine.main([str(run)])
    finally:
        other_job.release(run)
    check(
        "experiments.combine on a folder a job is writing",
        status,
        capsys.readouterr().err,
        f"{run} is being written by a job still running (PID {other_job.pid} on host ",
        "wait for it to finish",
    )
    assert tree(run) == before


FREE_DISK = "free disk space or pass a writable --out"


def _on_a_full_disk(out: Path, max_file_bytes: int) -> tuple[int, str]:
    """The video CLI's exit status and stderr on ``--out out``, run as a process that cannot
    write a file past ``max_file_bytes`` (a full disk)."""
    return cli_subprocess([*TINY, "--out", out], max_file_bytes=max_file_bytes)


def test_disk_full_at_start(tmp_path):
    """No room even for the run's config: refused, and the new --out is removed again."""
    out = tmp_path / "run"
    problem = "checkpoints/config.json (File too large)"
    status, err = _on_a_full_disk(out, 200)
    check("disk full when the run starts", status, err, problem, FREE_DISK)
    assert not out.exists()


@pytest.mark.slow
def test_disk_full_while_checkpointing(tmp_path):
    """The disk fills up during training: the checkpoint being written is removed, no
    half-written checkpoint or result is left, and the message names the cause."""
    out = tmp_path / "run"
    problem, fix = "cannot write checkpoints in", "(File too large): " + FREE_DISK
    status, err = _on_a_full_disk(out, 100_000)
    check("disk full while writing a checkpoint", status, err, problem, fix, progress=True)
    assert temp_files(out) == []
    assert not any((out / name).exists() for name in RESULTS)
    steps = [p for p in (out / "checkpoints").rglob("*") if p.is_dir() and p.name.isdigit()]
    assert steps == []  # no checkpoint that looks complete but is not
    assert json.loads((out / "checkpoints" / "config.json").read_text())["steps"] == 4


@pytest.mark.slow
def test_disk_full_while_writing_results(interrupted_run):
    """Resuming a run whose training is done, with no room for its figures: no half-written
    figure or results.json (atomic writes), and its checkpoints are untouched."""
    before = tree(interrupted_run / "checkpoints")
    problem = "cannot write " + str(interrupted_run / "layer_loss.png") + " (File too large)"
    status, err = _on_a_full_disk(interrupted_run, 8_000)
    check("disk full while writing results", status, err, problem, FREE_DISK, progress=True)
    assert temp_files(interrupted_run) == []
    # what training wrote (checkpoints, the training curves' logs) stays; no result file
    assert sorted(p.name for p in interrupted_run.iterdir()) == ["checkpoints", "tensorboard"]
    assert tree(interrupted_run / "checkpoints") == before


def test_output_of_a_paper_job(tmp_path, capsys):
    """A run written into a table's or a study's --out (exit 0, beside the job's report) made
    the job refuse its own folder ("holds a run of an experiment ... pass the dual study's own
    --out") from then on."""
    out = tmp_path / "study"
    out.mkdir()
    (out / "job.json").write_text('{"job": "dual study"}')
    (out / "study.md").write_text("# the study")
    before = tree(out)
    status, err = cli([*TINY, "--out", out], capsys)
    check(
        "--out holds a table or study job",
        status,
        err,
        "holds a dual study (job.json), not a run's folder",
        "pass another --out",
    )
    assert tree(out) == before
