"""A paper-table job: a grid of sub-runs over the shared runner.

A table job is a grid of sub-runs, each ONE :func:`cudt.runner.run` call (γ_train × sweep point
× seed as one vmapped program), in its own folder under ``--out``. Shared here: the checks of
the grid flags, a sub-run's config and the reuse/refusal rule of its folder, the training loop
over sub-runs, and the job itself (:class:`TableJob`, :func:`run_job`; its entry point is
:func:`cudt.runner.cli.config_main`). The rows, CSV and Markdown tables are
:mod:`experiments.paper.rows`, the figure helpers :mod:`experiments.paper.figures`; a table
module says only what is its own (grid, datasets, metric, the paper's table, figures).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from cudt.errors import UsageError
from cudt.io import check_not_a_file, claimed_run_dir, to_jsonable, write_json_atomic
from cudt.knobs import KNOBS
from cudt.runner.config import Needs, flag, unmet_needs
from cudt.runner.lock import check_free, lock_output
from cudt.runner.output import (
    CHECKPOINTS,
    CONFIG_FILE,
    JOB_FILE,
    OPENED,
    TENSORBOARD,
    checkpoint_record,
    record_differences,
)
from cudt.runner.run import check_reused, run
from experiments.paper.rows import HPARAMS, csv_text, finite, fmt, unique, write_text

# --scale tiny of a study's runs of the video task: seconds per run (the tests)
TINY_VIDEO = dict(
    layers=3,
    num_videos=3,
    num_frames=8,
    seq_len=4,
    batch_size=16,
    steps=30,
    chunk_steps=30,
    warmup_steps=5,
)


def scaled(fields: dict[str, Any], opts, tiny: dict[str, Any]) -> dict[str, Any]:
    """A study run's config ``fields`` at the study's ``--scale`` and ``--steps``: ``tiny``
    over them at --scale tiny; --steps N replaces the steps, and caps the scale's own chunk at N
    (where it sets none, the task's stays: a chunk of N steps would checkpoint only at the end,
    and an interrupted run resume from its start) and the scale's own primal warm-up below N (the
    studies have no --warmup-steps to lower it: --steps 5 at --scale tiny was refused for a
    warm-up that flag would fix)."""
    fields = dict(fields)
    if opts.scale == "tiny":
        fields |= tiny
    if opts.steps is not None:
        fields["steps"] = opts.steps
        if fields.get("chunk_steps") is not None:
            fields["chunk_steps"] = min(fields["chunk_steps"], opts.steps)
        if fields.get("warmup_steps") is not None:
            fields["warmup_steps"] = min(fields["warmup_steps"], opts.steps - 1)
    return fields


def out_flag(job: str):
    """``--out`` of a table job (default: a fresh ``runs/<job>-<time>``)."""
    return flag(
        None,
        f"output folder (default: a fresh runs/{job}-<time>); rerun the same command with "
        "the same --out to reuse finished sub-runs and resume interrupted ones",
    )


def paper_data_flag(help: str):
    """The folder of the real data a table job reads at ``--scale paper`` (``help``: what it
    holds); set at --scale tiny, which writes its own data, it is refused."""
    return flag(
        None,
        "--scale paper: " + help,
        needs=Needs(
            lambda o: o.scale == "paper",
            lambda _, name: (
                f"{name} is read by --scale paper only (--scale tiny writes its own data under "
                f"<out>/data): drop {name} or pass --scale paper"
            ),
        ),
    )


def datasets_flag(datasets: Sequence[str]):
    return flag(tuple(datasets), "datasets: " + ", ".join(datasets))


def headline_flag(default: float):
    return flag(
        default,
        "the γ_train (one of --gamma-trains) whose cells the headline table and the figures "
        "show: reporting only, every --gamma-trains level trains, so a finished --out is "
        "re-reported at another without retraining",
    )


def sweepable_in(task_config: type) -> tuple[str, ...]:
    """The knobs a table's sub-runs can sweep: those that act under the task's own formulation,
    constraint kind and dual optimiser, which every table trains (it has no flag for them)."""
    cfg = task_config()
    return tuple(k.name for k in KNOBS if k.name in HPARAMS and k.active(cfg))


def sweep_flag(example: str, task_config: type):
    """``--sweep``, repeatable (``example``: a single value, in its help)."""
    return flag(
        (),
        "NAME=V1,V2,...: also sweep NAME (" + ", ".join(sweepable_in(task_config)) + ") in "
        f"every sub-run; a single value fixes it (e.g. {example})",
        repeat=True,
    )


def seeds_flag():
    return flag(None, "seeds per setting (default: tiny 1, paper 5)")


def test_gammas_flag(default: str):
    """``--test-gammas`` of a table job (``default``: the levels used without it)."""
    return flag(None, f"test perturbation levels, joined with every γ_train (default: {default})")


def tolerance_flag(default: str):
    """``--tolerance`` of a table job (``default``: the one used without it)."""
    return flag(None, f"feasibility tolerance on validation data (default: {default})")


def devices_flag():
    return flag(None, "use at most this many devices (default: every visible one)")


def figures_flag(own: str | None):
    """``--figures`` / ``--no-figures`` of a job, passed to its runner calls (the runner's
    ``--no-figures``); ``own``: what the job draws itself (None: nothing), which the same
    command without the flag draws, reusing every finished runner call."""
    if own is None:
        later = "no command redraws them from results.json (docs/runner.md, Outputs)"
    else:
        later = (
            f"the same command without it reuses every runner call and draws {own} (a runner "
            "call's own: docs/runner.md, Outputs)"
        )
    what = "each runner call's figures" if own is None else f"{own} and each runner call's"
    return flag(
        True,
        f"draw {what}; --no-figures skips them (a batch job: the same results and tables): {later}",
    )


def overwrite_flag():
    return flag(False, "retrain every sub-run, discarding results already in --out")


def need(ok: bool, message: str) -> None:
    """The one-line UsageError ``message`` unless ``ok``."""
    if not ok:
        raise UsageError(message)


def check_needs(opts) -> None:
    """A job's flag set where nothing reads it (its ``needs``: :func:`cudt.runner.config.flag`):
    the one-line UsageError."""
    unmet = unmet_needs(opts)
    need(unmet is None, unmet or "")


def check_known(name: str, what: str, values, known: Sequence[str], hint: str = "") -> None:
    """``--<name>``: every value one of ``known`` (``what``: one value, in the message)."""
    bad = [v for v in values if v not in known]
    if bad:
        raise UsageError(
            f"--{name}: unknown {what} {bad[0]!r}: choose from {', '.join(known)}{hint}"
        )


def keep_unique(opts, names: Sequence[str] = ("datasets", "models", "layers", "gamma_trains")):
    """The tuple flags ``names`` of the frozen ``opts`` with each value once, in the order given
    (a repeated value would be a second sub-run)."""
    for name in names:
        object.__setattr__(opts, name, unique(getattr(opts, name)))


def check_grid_flags(
    opts, need: Callable[[bool, str], None], counts: Sequence[str], task_config: type
) -> None:
    """The checks every table config shares: γ_train levels, the headline γ, test γ, the
    tolerance, the positive counts named in ``counts``, no ``--sweep gamma_train`` (the
    levels are ``--gamma-trains``) and no ``--sweep`` of a knob that does not act under
    ``task_config``'s settings. ``need(ok, message)`` raises the one-line error."""
    gammas = opts.gamma_trains
    need(
        finite(gammas) and all(g >= 0 for g in gammas),
        "--gamma-trains must all be finite numbers >= 0, got " + ",".join(f"{g:g}" for g in gammas),
    )
    need(
        math.isfinite(opts.headline_gamma) and opts.headline_gamma >= 0,
        f"--headline-gamma must be a finite number >= 0, got {opts.headline_gamma:g}",
    )
    need(
        opts.headline_gamma in gammas,
        f"--headline-gamma {opts.headline_gamma:g} is not among --gamma-trains "
        f"({','.join(f'{g:g}' for g in gammas)}): pass one of them",
    )
    if opts.test_gammas is not None:
        need(
            finite(opts.test_gammas) and all(g >= 0 for g in opts.test_gammas),
            "--test-gammas must all be finite numbers >= 0, got "
            + ",".join(f"{g:g}" for g in opts.test_gammas),
        )
    if opts.tolerance is not None:
        need(
            math.isfinite(opts.tolerance) and opts.tolerance >= 0,
            f"--tolerance must be a finite number >= 0, got {opts.tolerance:g}",
        )
    for name in counts:
        value = getattr(opts, name)
        need(
            value is None or value >= 1,
            f"--{name.replace('_', '-')} must be >= 1, got {value}",
        )
    for item in opts.sweep:
        name = item.partition("=")[0].strip().replace("-", "_")
        need(
            name != "gamma_train",
            "--sweep gamma_train: the training levels are --gamma-trains (every sub-run "
            "sweeps them): pass --gamma-trains " + item.partition("=")[2],
        )
        knob = next((k for k in KNOBS if k.name == name), None)
        if knob is not None and knob.needs is not None:
            field, _ = knob.needs
            need(
                name in sweepable_in(task_config),
                f"--sweep {name} does not act in this table's runs, which train "
                f"--{field.replace('_', '-')} {getattr(task_config(), field)} (the task's; the "
                f"table has no flag for it): sweep one of {', '.join(sweepable_in(task_config))}",
            )


@dataclasses.dataclass
class SubRun:
    """One runner call of a table: its config (a task's RunConfig) and folder.

    ``key`` is what the table calls it (``(dataset, L)`` for video, ``(dataset, model, L)`` for
    text); ``resolved``: config fields whose default the task resolves into results.json (the
    text task writes its default ``lr`` there), as resolved now; ``finished`` is set by
    :func:`check_subrun` when its results can be reused."""

    name: str
    key: tuple
    cfg: Any
    out: Path
    resolved: dict[str, Any] = dataclasses.field(default_factory=dict)
    finished: bool = False
    # path flags (``--data-dir``, ``--checkpoint``) that name other folders than its record:
    # the digests of what they hold decide, checked as a resume checks them (train_subruns)
    moved: tuple[str, ...] = ()


def subrun_config(config_cls: type, opts, out: Path, **fields) -> Any:
    """The task config (``config_cls``) of one sub-run writing to ``out``: ``fields``, and what
    every table passes down (its γ_train levels as a sweep, ``--sweep``, ``--tolerance``,
    ``--devices``, ``--figures``, ``--overwrite``); a config the task refuses is one UsageError
    line, before anything is written. Not ``--headline-gamma``, which only chooses what the
    report shows."""
    kw = dict(
        sweep=(f"gamma_train={fmt(opts.gamma_trains)}", *opts.sweep),
        # every run's γ_train is the sweep's (its plots mark each run's own): the config's is
        # a placeholder, one of the levels, fixed by them alone so that the headline γ (once
        # put here) moves no fingerprint; the largest, the default headline of both tables
        gamma_train=max(opts.gamma_trains),
        devices=opts.devices,
        figures=opts.figures,
        out=str(out),
        overwrite=opts.overwrite,
        **fields,
    )
    if opts.tolerance is not None:
        kw["tolerance"] = opts.tolerance
    try:
        return config_cls(**kw)
    except ValueError as e:
        raise UsageError(str(e)) from None


def keep_or_build(root: Path, name: str, top: Path, spec: dict, build, *, overwrite: bool) -> Path:
    """A generated dataset folder ``top`` under ``root``: kept when a complete copy of the same
    ``spec`` is there (its marker ``root/.<name>.json``), else written by ``build(tmp)``
    (returning the written folder inside ``tmp``) into a temporary folder and renamed, so a
    killed job never leaves half a dataset."""
    marker = root / f".{name}.json"
    if not overwrite and top.is_dir() and marker.exists():
        try:
            if json.loads(marker.read_text()) == spec:
                return top
        except (OSError, ValueError):
            pass
    tmp = root / f".tmp-{name}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        written = build(tmp)
    except BaseException:  # interrupted (Ctrl-C) or failed: no half-built data set left
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    marker.unlink(missing_ok=True)
    shutil.rmtree(top, ignore_errors=True)
    written.rename(top)
    shutil.rmtree(tmp, ignore_errors=True)
    marker.write_text(json.dumps(spec))
    return top


def config_differences(saved: dict, want: dict[str, Any], added: dict[str, Any]) -> list[str]:
    """``want``'s fields that ``saved`` records otherwise; a field missing there reads None, as
    the runner's resume rule, but for one a later cudt added (``added``: the config's ``ADDED``,
    the value that is what earlier versions did) kept at that value. A field only ``saved``
    records (one this cudt no longer has) is not compared: these are results, reused as
    they are (the runner refuses to resume such checkpoints, naming it)."""
    want, added = to_jsonable(want), to_jsonable(added)
    return [
        f"{k}: {saved.get(k)!r} there, {v!r} now"
        for k, v in want.items()
        if saved.get(k) != v and not (k not in saved and k in added and added[k] == v)
    ]


def moved_paths(config_cls: type, saved: dict, want: dict[str, Any]) -> tuple[str, ...]:
    """The path flags of ``want`` (a config's record) that name another place than ``saved``
    records: those of ``config_cls.DESCRIBED_BY``, for the digests of what they hold to decide
    whether they differ, as a resume's do (:func:`cudt.runner.output.described_alike`)."""
    described = getattr(config_cls, "DESCRIBED_BY", {})
    now = to_jsonable(want)
    return tuple(k for k in now if k in described and k in saved and saved[k] != now[k])


def differences_by_content(
    config_cls: type, saved: dict, want: dict[str, Any], saved_data: dict | None, data: dict
) -> tuple[list[str], list[str]]:
    """:func:`config_differences` of a record that also holds the data's (``saved_data``: the
    task's fingerprint of each draw, as a run's checkpoints record it) against ``want`` and the
    data read now (``data``), and the data's differences: the files decide by what they hold,
    as a resume decides (a path flag naming a copy is no difference, other files behind the
    same path are). A record without the data's (``saved_data`` None: an earlier cudt's)
    compares the paths as written."""
    if saved_data is None:
        return config_differences(saved, want, getattr(config_cls, "ADDED", {})), []
    diff, _ = _differences_but_moved(config_cls, saved, want)
    described = getattr(config_cls, "DESCRIBED_BY", {})
    return diff, record_differences(to_jsonable(saved_data), to_jsonable(data), described)


def _differences_but_moved(
    config_cls: type, saved: dict, want: dict[str, Any]
) -> tuple[list[str], tuple[str, ...]]:
    """:func:`config_differences` of a record of ``config_cls``, but for a path flag that
    names another place (one of its ``DESCRIBED_BY``, recorded there), and those flags: set
    aside, for the digests of what they hold to decide (a sub-run's ``moved``, read by
    :func:`train_subruns`), as a resume's do."""
    moved = moved_paths(config_cls, saved, want)
    kept = {k: v for k, v in want.items() if k not in moved}
    return config_differences(saved, kept, getattr(config_cls, "ADDED", {})), moved


def _refuse(sub: SubRun, what: str, diff: list[str]) -> UsageError:
    shown = "; ".join(diff[:3]) + (f"; and {len(diff) - 3} more" if len(diff) > 3 else "")
    return UsageError(
        f"{sub.out} holds {what} of another config ({shown}): rerun with the flags that made "
        "it, pass another --out, or --overwrite to retrain"
    )


def _sweeps_gamma_train(cfg) -> bool:
    """Whether ``cfg``'s sweep sets every run's γ_train (a table's sub-run)."""
    return any(
        item.partition("=")[0].strip().replace("-", "_") == "gamma_train"
        for item in getattr(cfg, "sweep", ())
    )


@dataclasses.dataclass(frozen=True)
class OverwriteStart:
    """What the outputs under a job's ``out`` were when an ``--overwrite`` of it started, by
    content (``states``: path under ``out`` → :func:`output_state`), so that a resume of it
    tells what was redone since: not by file times, which a copied folder (``cp -r``) makes
    all new, so that every call not yet retrained read as retrained."""

    out: Path
    states: dict[str, str]

    @classmethod
    def take(cls, out: Path) -> OverwriteStart:
        """The outputs under ``out`` now: every runner call's checkpoints and phase I."""
        states = {}
        for folder, dirs, files in os.walk(out):
            here = Path(folder)
            paths = [here / CHECKPOINTS] if CHECKPOINTS in dirs else []
            paths += [here / n for n in files if n in REDONE_FILES]
            for path in paths:
                state = output_state(path)
                if state is not None:
                    states[path.relative_to(out).as_posix()] = state
            dirs[:] = [d for d in dirs if d not in (CHECKPOINTS, TENSORBOARD)]
        return cls(out, states)

    def redone(self, path: Path) -> bool:
        """Whether ``path`` (a call's checkpoints folder, a phase I file) was written afresh
        since the ``--overwrite`` started."""
        now = output_state(path)
        return now is not None and now != self.states.get(path.relative_to(self.out).as_posix())


# the files a job writes beside its runner calls' that an --overwrite redoes (ut_study's)
REDONE_FILES = ("phase1.json",)


def output_state(path: Path) -> str | None:
    """A call's checkpoints folder: the token of the run that started it (``OPENED``, written
    anew by each fresh start, kept by a resume); a file: its SHA-256. None where there is none
    (or a record from before the token)."""
    try:
        if path.name == CHECKPOINTS:
            token = json.loads((path / CONFIG_FILE).read_text(encoding="utf-8")).get(OPENED)
            return token if isinstance(token, str) else None
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except (OSError, ValueError, AttributeError):
        return None


def check_subrun(sub: SubRun, overwrite: bool, since: OverwriteStart | None = None) -> None:
    """Sets ``sub.finished`` (results.json of the same config: reused); refuses a folder holding
    results or checkpoints of another config unless ``overwrite``. ``since``: what the
    interrupted ``--overwrite`` this command resumes found (:func:`overwrite_since`): a sub-run
    started afresh since (its checkpoints' token is new) is kept (reused, or its checkpoints
    resumed), not retrained again."""
    sub.finished, sub.moved = False, ()  # this check's alone, not an earlier one's
    if overwrite and since is not None and since.redone(sub.out / CHECKPOINTS):
        overwrite = False
        sub.cfg = dataclasses.replace(sub.cfg, overwrite=False)
    if overwrite:
        return
    results = sub.out / "results.json"
    if results.exists():
        try:
            saved = json.loads(results.read_text())["config"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise UsageError(
                f"{results} is unreadable ({e}): delete {sub.out}, or pass --overwrite"
            ) from e
        want = _read(sub.cfg, sub.cfg.fingerprint(evaluation=True) | sub.resolved)
        if _sweeps_gamma_train(sub.cfg):  # no run trains at it (subrun_config); an older
            want.pop("gamma_train")  # table put its --headline-gamma there
        diff, sub.moved = _differences_but_moved(type(sub.cfg), saved, want)
        if diff:
            raise _refuse(sub, "results", diff)
        sub.finished = True
        return
    saved_config = sub.out / CHECKPOINTS / CONFIG_FILE
    if saved_config.exists():  # the runner resumes these; a foreign one is refused up front
        try:
            saved = json.loads(saved_config.read_text())
        except (OSError, ValueError) as e:
            raise UsageError(
                f"{saved_config} is unreadable ({e}): delete {sub.out}, or pass --overwrite"
            ) from e
        # the runner's own record
        want = _read(sub.cfg, checkpoint_record(sub.cfg))
        diff, sub.moved = _differences_but_moved(type(sub.cfg), saved, want)
        if diff:
            raise _refuse(sub, "checkpoints", diff)


def _read(cfg, record: dict[str, Any]) -> dict[str, Any]:
    """``record`` (of a sub-run's ``cfg``) without the flags that act on nothing in ``cfg``
    (``idle_flags``: the multipliers' steps under the penalty formulation), which the runner's
    resume does not compare either: a call an earlier version recorded at another value of
    one (a job that passed it there, refused now) is reused or resumed."""
    idle = set(type(cfg).idle_flags(dataclasses.asdict(cfg)))
    return {k: v for k, v in record.items() if k not in idle}


def train_subruns(subs: list[SubRun], make_task: Callable[[SubRun], Any]) -> dict[tuple, dict]:
    """Trains every unfinished sub-run with the shared runner and the task ``make_task(sub)``
    (a finished one is reused, refused first where its checkpoints were trained on other data
    than its config reads now: :func:`cudt.runner.run.check_reused`); returns ``{sub.key: its
    results.json}``."""
    for sub in subs:  # before anything trains
        if sub.finished or sub.moved:
            # the user's --out is the job's: the refusal names the sub-run's folder in it; a
            # path flag moved (sub.moved) is no difference where the digests are alike
            name = f"the {'finished ' if sub.finished else ''}sub-run {sub.out}"
            check_reused(make_task(sub), sub.cfg, sub.out, name, flags=sub.moved)
    results = {}
    for k, sub in enumerate(subs, start=1):
        if sub.finished:
            print(f"[{k}/{len(subs)}] {sub.name}: reusing {sub.out / 'results.json'}")
        else:
            print(f"[{k}/{len(subs)}] {sub.name}: training")
            run(make_task(sub), sub.cfg, sub.out)
        results[sub.key] = json.loads((sub.out / "results.json").read_text())
    return results


# A job's --out says which job it holds (written when the job starts, JOB_FILE): another job's
# folder, or one sub-run's, is refused instead of being written into, and the runner refuses a
# job's folder as a run's --out (cudt.runner.output).
# job.json's list of the finished job's sub-run folders, relative to its --out
SUBRUNS = "subruns"


def check_job_folder(out: Path, name: str) -> None:
    """``out`` may hold this job (or nothing): not a run of an experiment (one sub-run's own
    folder, as its resume hint names it) nor another job. Also for ``experiments.phase_one``,
    whose folder holds its own result files only."""
    ran = [n for n in ("results.json", CHECKPOINTS) if (out / n).exists()]
    if ran:
        raise UsageError(
            f"--out {out} holds a run of an experiment ({ran[0]}), not a {name}: pass the "
            f"{name}'s own --out or another folder"
        )
    try:
        other = json.loads((out / JOB_FILE).read_text(encoding="utf-8")).get("job")
    except (OSError, ValueError, AttributeError):
        return  # none yet (a new folder, or one from before the record)
    if other != name:
        raise UsageError(f"--out {out} holds a {other}, not a {name}: pass another --out")


def _overwriting(opts) -> dict[str, Any]:
    """The flags an ``--overwrite`` is recorded under: every one but ``--out`` (the first
    command may have had the default folder, which the resume then names) and ``--figures``
    (the same results with or without them)."""
    kept = {k: v for k, v in dataclasses.asdict(opts).items() if k not in ("out", "figures")}
    return to_jsonable(kept)


def overwrite_since(out: Path, opts) -> OverwriteStart | None:
    """What ``--overwrite`` with these flags found on ``out`` when it started, where it has not
    finished (the record open_job keeps in job.json): the sub-runs retrained since are kept.
    None without ``--overwrite`` or such a record (one from before the record's ``before``:
    every sub-run is retrained)."""
    if not opts.overwrite:
        return None
    try:
        record = json.loads((out / JOB_FILE).read_text(encoding="utf-8"))["overwriting"]
        before = record["before"]
        if record["flags"] == _overwriting(opts) and isinstance(before, dict):
            return OverwriteStart(out, {str(k): str(v) for k, v in before.items()})
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    return None


def check_overwrite_finished(out: Path, opts) -> None:
    """Refuse a rerun without ``--overwrite`` of a folder whose ``--overwrite`` was interrupted:
    its sub-runs not yet retrained still hold the old results, which it would reuse beside the
    new ones (a table half of one config, half of another)."""
    if opts.overwrite:
        return
    try:
        record = json.loads((out / JOB_FILE).read_text(encoding="utf-8"))["overwriting"]
    except (OSError, ValueError, KeyError, TypeError):
        return
    if isinstance(record, dict):
        raise UsageError(
            f"--out {out}: an --overwrite of this job was interrupted, so some of its sub-runs "
            "still hold the old results: rerun with --overwrite and the same flags to finish "
            "it, or pass another --out"
        )


@contextlib.contextmanager
def open_job(
    name: str, opts, plan: Callable[[Any, Path], list[SubRun]], what: str = "sub-runs"
) -> Iterator[tuple[Path, list[SubRun], list[SubRun]]]:
    """A job's ``--out`` (default: a fresh ``runs/<name>-<time>``), its sub-runs
    ``plan(opts, out)`` each checked for reuse or refusal before anything is written, and the
    ones left to train; prints how many there are and how to resume. The job holds the lock on
    its ``--out`` (:mod:`cudt.runner.lock`) until the ``with`` block ends, as each sub-run holds
    its own folder's while it runs.

    An ``--overwrite`` is recorded in job.json (``overwriting``: its flags and start) until the
    job ends, so the same command after an interruption resumes it: the sub-runs retrained
    since are kept (:func:`check_subrun`), the others retrained; a rerun without
    ``--overwrite`` is refused until then (:func:`check_overwrite_finished`). When the job ends,
    job.json lists its sub-runs' folders (:data:`SUBRUNS`)."""
    # the default folder is claimed now (two jobs in one second get two), gone if refused
    with claimed_run_dir(opts.out, name.replace(" ", "_")) as out:
        check_not_a_file(out)
        check_free(out)  # another job there: refused before its folders are read
        check_job_folder(out, name)
        check_overwrite_finished(out, opts)
        subs = plan(opts, out)
        since = overwrite_since(out, opts)
        for sub in subs:
            check_subrun(sub, opts.overwrite, since)
        todo = [s for s in subs if not s.finished]
        with lock_output(out):
            record: dict[str, Any] = {"job": name}
            write_json_atomic(out / JOB_FILE, record)
            if opts.overwrite:  # what it replaces, as it is before anything is retrained
                since = OverwriteStart.take(out) if since is None else since
                record["overwriting"] = {"flags": _overwriting(opts), "before": since.states}
                write_json_atomic(out / JOB_FILE, record)
            print(
                f"{name}: {len(subs)} {what} under {out} ({len(subs) - len(todo)} finished, "
                f"reused; {len(todo)} to train); rerun this command with --out {out} to resume"
            )
            yield out, subs, todo
            # done: nothing left to resume; the sub-runs this job has, for what reads its report
            # (experiments.pages): folders of an earlier grid left in --out are not among them
            done = {"job": name, SUBRUNS: [s.out.relative_to(out).as_posix() for s in subs]}
            write_json_atomic(out / JOB_FILE, done)


class TableJob:
    """A paper-table job, as :class:`cudt.runner.Task` is a task: a subclass says what the job
    is (its data, sub-runs, rows, Markdown and figures); :func:`run_job` does the rest.

    Every method takes the job's frozen flags ``opts`` (which have ``out``, ``scale``,
    ``overwrite``, ``gamma_trains``, ``sweep``); ``cfg`` is the first sub-run's task config."""

    name: str  # in its messages ("video table"); with "_" for " ": its default --out folder
    table: str  # the CSV and Markdown file names: <table>.csv, <table>.md
    title: str  # the Markdown's heading, before ", --scale <scale>"
    csv_columns: Sequence[str]

    def check(self, opts) -> None:
        """Inputs checked before anything is written (one-line errors)."""

    def plan(self, opts, out: Path) -> list[SubRun]:
        raise NotImplementedError

    def prepare_tiny(self, opts, out: Path) -> None:
        """--scale tiny: write the generated data."""

    def make_task(self):
        """The task that trains each sub-run."""
        raise NotImplementedError

    def best_rows(self, results: dict[tuple, dict]) -> list[dict]:
        """``{sub.key: results.json}`` → one row per setting."""
        raise NotImplementedError

    def settings(self, opts, cfg) -> str:
        """The training settings, for the note."""
        raise NotImplementedError

    def details(self, opts, cfg) -> str:
        """The note's last clause (the data, ...)."""
        return ""

    def headline(self, rows: list[dict], opts, test_gammas: Sequence[float]) -> str:
        raise NotImplementedError

    def direction(self, rows: list[dict], opts) -> str:
        """The cells against the paper."""
        raise NotImplementedError

    def every_gamma(self, rows: list[dict], opts) -> list[str]:
        """The table at every γ_train."""
        raise NotImplementedError

    def figures(self, rows: list[dict], opts, out: Path) -> dict[str, Path]:
        """Writes the job's figures; returns ``{name: path}``."""
        return {}


def run_job(job: TableJob, opts) -> dict[str, Any]:
    """Trains (or reuses) every sub-run of ``job``, then writes the table, CSV and figures;
    returns ``{"rows", "markdown", "paths", "trained", "reused", "wall_seconds"}``.

    Every input check and sub-run refusal comes before anything is written or trained."""
    t0 = time.perf_counter()
    job.check(opts)
    with open_job(job.name, opts, job.plan) as (out, subs, todo):
        if opts.scale == "tiny":
            job.prepare_tiny(opts, out)
        results = train_subruns(subs, lambda sub: job.make_task())
        rows = job.best_rows(results)
        test_gammas = results[subs[0].key]["config"]["test_gamma"]
        wall = time.perf_counter() - t0
        trained, reused = len(todo), len(subs) - len(todo)
        counted = f"{len(subs)} sub-runs ({trained} trained, {reused} reused)"
        cfg = subs[0].cfg
        note = (
            f"{counted}, {job.settings(opts, cfg)}, γ_train ∈ {{{fmt(opts.gamma_trains)}}}"
            + (f", sweeps {'; '.join(opts.sweep)}" if opts.sweep else "")
            + f"; {job.details(opts, cfg)}."
        )
        trained_seconds = sum(float(r.get("wall_seconds") or 0) for r in results.values())
        headline, direction = job.headline(rows, opts, test_gammas), job.direction(rows, opts)
        parts = [
            f"# {job.title}, --scale {opts.scale}",
            "",
            note,
            "",
            headline,
            "",
            direction,
            "",
            "### Every γ_train",
            "",
            *job.every_gamma(rows, opts),
            "",
            f"Wall time of the job that wrote this: {wall:.0f} s (sub-runs' own wall times, "
            f"summed: {trained_seconds:.0f} s).",
        ]
        markdown = "\n".join(parts) + "\n"
        paths = {"csv": out / f"{job.table}.csv", "md": out / f"{job.table}.md"}
        write_text(paths["csv"], csv_text(rows, job.csv_columns))
        write_text(paths["md"], markdown)
        if opts.figures:
            paths |= job.figures(rows, opts, out)
        wall = time.perf_counter() - t0
        print()
        print(headline)
        print()
        print(direction)
        print()
        print(f"wrote {', '.join(str(p) for p in paths.values())}")
        print(f"{job.name}: {counted} in {wall:.0f}s wall")
    return {
        "rows": rows,
        "markdown": markdown,
        "paths": paths,
        "trained": trained,
        "reused": reused,
        "wall_seconds": wall,
    }
