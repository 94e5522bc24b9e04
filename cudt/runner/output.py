"""An experiment's output folder: what it holds, and the rules that keep a user's work safe.

    <out>/checkpoints/config.json        the config the checkpoints belong to
    <out>/checkpoints/<group>/<step>/    orbax checkpoints of each group (last k, pinned)
    <out>/tensorboard/<run>/             training curves (TensorBoard event files)
    <out>/*.png                          plots (atomic)
    <out>/results.json                   written last (atomic): its presence means "complete"
    <out>/cudt.lock                      while a job runs: its lock (cudt.runner.lock)

One job at a time: the folder is locked before anything is written, and a second job is refused.
A folder holding ``results.json`` is never overwritten without ``--overwrite``; a folder holding
checkpoints of the *same* config is resumed; one holding checkpoints of a different config is
refused with the differences named.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import secrets
import shutil
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from cudt.errors import CudtError, UsageError
from cudt.io import (
    RESULT_FILES,
    check_not_a_file,
    check_writable,
    remove_created,
    to_jsonable,
    topmost_missing,
    write_json_atomic,
)
from cudt.runner.lock import OutputLock, check_job_token, lock_output

__all__ = [
    "CHECKPOINTS",
    "CONFIG_FILE",
    "DATA_RECORD",
    "JOB_FILE",
    "OPENED",
    "STATE_LAYOUT",
    "TENSORBOARD",
    "OutputDir",
    "check_same_data",
    "checkpoint_record",
    "described_alike",
    "open_output",
    "open_output_once",
    "record_differences",
]

CHECKPOINTS = "checkpoints"
CONFIG_FILE = "config.json"
# a paper job's record in its --out (experiments.paper.job): its runner calls each have a folder
# of their own under it, never that folder itself
JOB_FILE = "job.json"
TENSORBOARD = "tensorboard"  # <out>/tensorboard/<run label>/events.out.tfevents.*


@dataclasses.dataclass(frozen=True)
class OutputDir:
    """An opened output folder; as a context manager it releases the folder's lock (held by
    process 0 of the job, :mod:`cudt.runner.lock`) on leaving."""

    path: Path
    resuming: bool  # the folder holds checkpoints of this same config
    lock: OutputLock | None = dataclasses.field(default=None, compare=False, repr=False)

    def __enter__(self) -> OutputDir:
        return self

    def __exit__(self, *exc) -> None:
        if self.lock is not None:
            self.lock.release()

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS

    def group_dir(self, slug: str) -> Path:
        return self.checkpoints / slug


# The layout of the train state a run's checkpoints hold, recorded in its saved config. It
# changes when the state's pytree changes shape (e.g. the one-engine state, layout 2, after the
# hand-fused TrainState and the DescentState wrapper of layout 1; layout 3: nuPI's ``started``
# flag per multiplier, not one per table), so an older folder is named as such instead of
# failing inside orbax.
STATE_LAYOUT = 3


def checkpoint_record(cfg) -> dict[str, Any]:
    """What a run's ``checkpoints/config.json`` records: the config's fingerprint and the
    layout of the train state its checkpoints hold (:data:`STATE_LAYOUT`)."""
    evaluation = {k: getattr(cfg, k) for k in cfg.EVALUATION_ONLY if hasattr(cfg, k)}
    # the evaluation-only flags: never compared (:data:`EVALUATION_FLAGS`), kept to name the
    # one that moved where it changed the training data after all (a split dealt test first)
    return cfg.fingerprint() | {"state_layout": STATE_LAYOUT, EVALUATION_FLAGS: evaluation}


#: the key of ``results.json`` holding the data the run was trained on, as its checkpoints'
#: record holds it (the task's fingerprint, or one per draw: its digests), so that a finished
#: run whose checkpoints were deleted can still be checked by what its files hold
DATA_RECORD = "data_record"
#: the key of ``checkpoints/config.json`` holding the evaluation-only flags' values
EVALUATION_FLAGS = "evaluation_flags"
#: the key of ``checkpoints/config.json`` holding a token of the run call that wrote it (a fresh
#: start, not a resume: never compared): a job resuming an interrupted ``--overwrite`` tells by
#: it which of its calls were started afresh since (experiments.paper.job), by content, which a
#: copied folder keeps, where file times change
OPENED = "opened"


def _differences(
    old: dict,
    new: dict,
    ignore: Collection[str] = (),
    added: Mapping[str, Any] | None = None,
    described_by: Mapping[str, Sequence[str]] | None = None,
) -> list[str]:
    """The fields that differ, but ``ignore``, a ``*_digest`` one side does not record (a
    digest is an extra check a later version adds: checkpoints written before it resume), a
    field of ``added`` (``{name: the earlier versions' behaviour}``) the old config lacks
    while the new one keeps that value, and a line on where files lie whose digests are alike
    (``described_by``: :func:`described_alike`)."""
    added = dict(added or {})
    keys = sorted((set(old) | set(new)) - set(ignore) - {EVALUATION_FLAGS, OPENED})
    keys = [k for k in keys if not (k in added and k not in old and new.get(k) == added[k])]
    # nested records (a fingerprint per data draw: ``data_per_seed``) compared field by field,
    # so that their digests follow the same rule and a difference is named where it is
    old = {k: old[k] for k in keys if k in old}
    new = {k: new[k] for k in keys if k in new}
    apart, draws = _seeds_apart(old.get(_PER_SEED), new.get(_PER_SEED))
    old, new = _flat(old), _flat(new)
    # ``ignore`` inside them too: an evaluation-only field of a draw's record (its description
    # with the test count) is no more a difference there than at the top
    keys = sorted(k for k in set(old) | set(new) if k.rsplit(".", 1)[-1] not in ignore)
    keys = [k for k in keys if not k.endswith("_digest") or (k in old and k in new)]
    keys = [k for k in keys if not described_alike(k, old, new, described_by or {})]
    keys = [k for k in keys if not k.startswith(draws)]  # a draw one side lacks: named once
    diff = [f"{k} {old.get(k)!r} -> {new.get(k)!r}" for k in keys if old.get(k) != new.get(k)]
    return diff + apart


#: the key of a record holding one fingerprint of the data per seed's draw (``{seed: ...}``)
_PER_SEED = "data_per_seed"


def _seeds_apart(old, new) -> tuple[list[str], tuple[str, ...]]:
    """The seeds whose draw of the data one record holds (``data_per_seed``: ``{seed: its
    fingerprint}``) and the other not (another seed range): a line each way, naming them once,
    and the flat keys' prefixes of their draws (whose every field differs from None: not named
    one by one)."""
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return [], ()
    new_only, old_only = _by_seed(set(new) - set(old)), _by_seed(set(old) - set(new))
    lines = [f"{_seeds_text(new_only)} not in this folder"] if new_only else []
    if old_only:
        lines.append(f"{_seeds_text(old_only)} in this folder, not in this command")
    return lines, tuple(f"{_PER_SEED}.{k}." for k in new_only + old_only)


def _per_seed_form(old: dict, new: dict) -> tuple[dict, dict]:
    """``old`` and ``new``, where one holds a fingerprint per seed's draw (``data_per_seed``)
    and the other its one seed's draw at the top (a run of one seed, each drawing its own
    data: ``data_seed`` None), with that draw under its seed as the other holds them, so that
    another seed range is named by its seeds (:func:`_seeds_apart`), not field by field."""
    pair = [old, new]
    for i, (one, many) in enumerate(((old, new), (new, old))):
        draws = many.get(_PER_SEED)
        if _PER_SEED in one or not isinstance(draws, dict) or one.get("data_seed") is not None:
            continue
        fields = {k for d in draws.values() if isinstance(d, dict) for k in d}
        if "seed" not in one or not fields & set(one):
            continue
        draw = {k: v for k, v in one.items() if k in fields}
        rest = {k: v for k, v in one.items() if k not in fields}
        # a draw's field that is a flag too (the LLM's checkpoint, prompt_format): the other's
        # top holds the flag as given, this one's top the draw's value over it; compared in
        # the draw, not named as a flag that changed
        rest |= {k: many[k] for k in draw if k in many}
        pair[i] = rest | {_PER_SEED: {str(one["seed"]): draw}}
    return pair[0], pair[1]


def _by_seed(keys: set[str]) -> list[str]:
    return sorted(keys, key=lambda k: (not k.isdigit(), int(k) if k.isdigit() else 0, k))


def _seeds_text(keys: list[str]) -> str:
    """``["2", "3", "5"]`` as ``seeds 2-3, 5 are`` (``seed 2 is`` for one)."""
    parts, run = [], []
    for k in keys:
        if run and k.isdigit() and run[-1].isdigit() and int(k) == int(run[-1]) + 1:
            run.append(k)
            continue
        if run:
            parts.append(run[0] if len(run) == 1 else f"{run[0]}-{run[-1]}")
        run = [k]
    parts.append(run[0] if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return f"seed {parts[0]} is" if len(keys) == 1 else f"seeds {', '.join(parts)} are"


def record_differences(
    old: dict, new: dict, described_by: Mapping[str, Sequence[str]] | None = None
) -> list[str]:
    """``["field OLD -> NEW", ...]``: what two records of the data a run reads (the task's
    fingerprint, or one per draw under ``data_per_seed``) differ in, by a resume's rule: a
    digest one side does not record is no difference, nor a line on where files lie whose
    digests are alike (``described_by``: the config's ``DESCRIBED_BY``)."""
    return _differences(old, new, described_by=described_by)


def described_alike(
    key: str,
    old: Mapping[str, Any],
    new: Mapping[str, Any],
    described_by: Mapping[str, Sequence[str]],
) -> bool:
    """Whether ``key`` of two records (flat: ``data_per_seed.0.data_source``) is a line on
    where files lie (``described_by``: a config's ``DESCRIBED_BY``, ``{line: (digest, *more)}``)
    whose digests of what they hold decide, alike on both sides: the first digest recorded by
    both, and each other one that both record. A digest beside the line's (its record, or
    every draw's record under it: a flag's ``data_per_seed.*.train_digest``) is what counts."""
    head, _, name = key.rpartition(".")
    if name not in described_by:
        return False
    first, *more = described_by[name]
    prefix = f"{head}." if head else ""
    old_first, new_first = _digests(old, prefix, first), _digests(new, prefix, first)
    if not old_first or old_first != new_first:  # not recorded (an older record), or other
        return False
    for other in more:
        a, b = _digests(old, prefix, other), _digests(new, prefix, other)
        if a and b and a != b:
            return False
    return True


def _digests(record: Mapping[str, Any], prefix: str, name: str) -> dict[str, Any]:
    """The digests ``name`` of the flat ``record`` under ``prefix``: its own, or its draws'."""
    return {
        k: v
        for k, v in record.items()
        if k.startswith(prefix) and (k == prefix + name or k.endswith(f".{name}"))
    }


def _as_now(
    old: dict,
    new: dict,
    paths: Collection[str],
    canonical: Mapping[str, Callable[[Any], Any]] | None = None,
    defaults: Mapping[str, Any] | None = None,
) -> dict:
    """The saved config ``old`` with what names the same thing as ``new`` written as ``new``
    writes it, so that only real differences are named: a path flag (``paths``) spelt another
    way for the same file or folder (relative or absolute, a trailing slash, a link), in the
    flag and in the records derived from it (a data source ``ucsd:<path>``); a flag of
    ``canonical`` (``{name: what its value names}``: ``--sweep``'s lanes, ``sorted`` for a list
    whose order means nothing, ``--reference``'s spelling) whose two values name the same; a
    flag of ``defaults`` (``{name: the value it takes when not given}``: ``--lr`` from the
    task, ``--lora-alpha`` from the rank) given on one side at the value the other side's
    default (None) resolves to."""
    old = dict(old)
    for key, value in (defaults or {}).items():
        a, b = old.get(key), new.get(key)
        if a != b and (value if a is None else a) == (value if b is None else b):
            old[key] = b
    for key, meaning in (canonical or {}).items():
        a, b = old.get(key), new.get(key)
        # a list (its lanes, its items) or a value (``--reference .5`` names ``0.5``)
        same_kind = type(a) is type(b) and isinstance(a, list | str | int | float)
        if same_kind and a != b and meaning(a) == meaning(b):
            old[key] = b
    spellings = {}
    for key in paths:
        a, b = old.get(key), new.get(key)
        if isinstance(a, str) and isinstance(b, str) and a != b and _same_file(a, b):
            spellings[a] = b
    if not spellings:
        return old
    # the old spelling where it stands whole: not inside a longer name or path
    pattern = re.compile("|".join(rf"(?<![\w./~-]){re.escape(a)}(?![\w./-])" for a in spellings))

    def respell(value):
        if isinstance(value, dict):
            return {k: respell(v) for k, v in value.items()}
        if isinstance(value, list):
            return [respell(v) for v in value]
        if isinstance(value, str):
            return pattern.sub(lambda m: spellings[m.group(0)], value)
        return value

    return respell(old)


def _same_file(a: str, b: str) -> bool:
    """Whether two paths, relative to the working folder, name one existing file or folder."""
    try:
        return os.path.samefile(os.path.expanduser(a), os.path.expanduser(b))
    except (OSError, ValueError):
        return False


def _flat(record: dict, prefix: str = "") -> dict:
    """``{"a": {"b": 1}}`` as ``{"a.b": 1}``; an empty record inside one holds no field (a
    draw's fingerprint ``{}``, which a later record's ``examples_digest`` adds to)."""
    out = {}
    for k, v in record.items():
        if isinstance(v, dict) and (v or prefix):
            out |= _flat(v, f"{prefix}{k}.")
        else:
            out[f"{prefix}{k}"] = v
    return out


def _files_of_finished_run(out: Path) -> list[Path]:
    """The files the finished run in ``out`` wrote beside its ``results.json`` (its ``"files"``:
    plots, completions), those inside ``out`` that are files; none where the record is
    unreadable or predates the list."""
    try:
        names = json.loads((out / "results.json").read_text(encoding="utf-8"))["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    if not isinstance(names, list):
        return []
    paths = [Path(n) for n in names if isinstance(n, str) and n]
    paths = [out / p for p in paths if not p.is_absolute() and ".." not in p.parts]
    return [p for p in paths if p.is_file() and not p.is_symlink()]


def _holds_checkpoints(folder: Path) -> bool:
    """Whether ``folder`` holds a saved step: a group folder's (``<group>/<step>/``), or one of
    its own (``<step>/``, as an earlier cudt's single group saved them)."""
    if not folder.is_dir():
        return False
    return any(
        entry.is_dir()
        and (entry.name.isdigit() or any(step.name.isdigit() for step in entry.iterdir()))
        for entry in folder.iterdir()
    )


def _check_same_config(
    out: Path,
    saved_config: Path | dict,
    config: dict,
    ignore: Collection[str],
    added: Mapping[str, Any] | None,
    flags: Collection[str],
    paths: Collection[str],
    canonical: Mapping[str, Callable[[Any], Any]] | None = None,
    defaults: Mapping[str, Any] | None = None,
    only: Collection[str] | None = None,
    name: str | None = None,
    described_by: Mapping[str, Sequence[str]] | None = None,
    held: str = "checkpoints",
) -> None:
    """Refuses checkpoints in ``out`` that ``config`` cannot resume (:func:`open_output`'s
    arguments): an unreadable saved config, an earlier state layout, other files behind the
    same flags, or another config (the flags' differences first). ``only``: the fields
    compared (the data's: :func:`check_same_data`), the state layout not; ``saved_config``:
    the record's file, or the record itself (``held``: what the refusals say ``out`` holds)."""
    try:
        old = saved_config
        if isinstance(old, Path):
            old = json.loads(old.read_text())
        if not isinstance(old, dict):
            raise ValueError(f"a JSON {type(old).__name__}, not an object")
    except (OSError, ValueError) as e:  # json.JSONDecodeError is a ValueError
        raise UsageError(
            f"{saved_config} is unreadable ({e}): pass another --out, or --overwrite to start again"
        ) from e
    who = name or f"--out {out}"  # what the refusals call the folder
    layout = old.get("state_layout", 1)
    if only is None and layout != config.get("state_layout", layout):
        raise UsageError(
            f"{who} holds checkpoints of an earlier cudt whose train state has another "
            f"layout ({layout}; this version writes {config['state_layout']}), which cannot "
            "be resumed: pass another --out, or --overwrite to discard them"
        )
    same = _as_now(old, config, paths, canonical, defaults)
    if only is not None:  # the other fields as now (their spellings respelt by _as_now first)
        same = {k: v for k, v in same.items() if k in only} | {
            k: v for k, v in config.items() if k not in only
        }
    same, config = _per_seed_form(same, config)
    diff = _differences(same, config, ignore, added, described_by)
    changed = [d for d in diff if d.split(" ", 1)[0].endswith("_digest")]
    flag_changed = [d for d in diff if d.split(" ", 1)[0].split(".", 1)[0] in flags]
    # the files behind the same flags changed (the training data, a frozen base, and what
    # the task derives from them); a flag that changed changes a digest too: named below
    if changed and not flag_changed:
        moved = _evaluation_flags_moved(old, config)
        if moved:  # no file changed: an evaluation-only flag moved the training examples
            raise UsageError(
                f"{who} holds {held} trained on other examples than this command "
                f"gives: {', '.join(moved)} changes this data's training split "
                f"({'; '.join(changed[:2])}): rerun with the values they were trained with "
                "to resume, pass another --out, or --overwrite to discard them"
            )
        derived = [d for d in diff if d not in changed][:3]
        raise UsageError(
            f"{who} holds {held} trained on other files than its flags name now "
            f"({'; '.join(changed + derived)}): restore the files they were trained on, "
            "pass another --out, or --overwrite to discard them"
        )
    # fields an earlier cudt recorded that this one has not (a setting since removed): no flag
    # of this version resumes them ("rerun with the same flags" cannot be followed)
    gone = [d for d in diff if d.split(" ", 1)[0].split(".", 1)[0] not in config]
    if diff and len(gone) == len(diff):
        named = "; ".join(d.rsplit(" -> ", 1)[0] for d in gone[:4])
        raise UsageError(
            f"{who} holds {held} of an earlier cudt, with settings this version no "
            f"longer has ({named}{f'; and {len(gone) - 4} more' if len(gone) > 4 else ''}): "
            "pass another --out, or --overwrite to discard them"
        )
    diff = flag_changed + [d for d in diff if d not in flag_changed]  # the flags first
    if diff:
        raise UsageError(
            f"{who} holds {held} of a different config ({'; '.join(diff[:4])}"
            f"{f'; and {len(diff) - 4} more' if len(diff) > 4 else ''}): "
            "pass another --out, rerun with the same flags to resume, or --overwrite to "
            "discard them"
        )


def _evaluation_flags_moved(old: dict, new: dict) -> list[str]:
    """``--flag OLD -> NEW`` for each evaluation-only flag the saved config recorded with
    another value (none for checkpoints written before the record)."""
    before, now = old.get(EVALUATION_FLAGS) or {}, new.get(EVALUATION_FLAGS) or {}
    return [
        f"--{k.replace('_', '-')} {before[k]} -> {now[k]}"
        for k in sorted(set(before) & set(now))
        if before[k] != now[k]
    ]


def _check_not_a_job(out: Path) -> None:
    """Refuses the ``--out`` of a paper job (a table, a study: its :data:`JOB_FILE`), which a
    run written into would make the job refuse its own folder."""
    try:
        job = json.loads((out / JOB_FILE).read_text(encoding="utf-8")).get("job")
    except (OSError, ValueError, AttributeError):
        return
    if isinstance(job, str) and job:
        raise UsageError(
            f"--out {out} holds a {job} ({JOB_FILE}), not a run's folder: pass another --out"
        )


def open_output(
    out: str | Path,
    config: dict[str, Any],
    *,
    overwrite: bool = False,
    resume: bool = False,
    ignore: Collection[str] = (),
    added: Mapping[str, Any] | None = None,
    flags: Collection[str] = (),
    paths: Collection[str] = (),
    canonical: Mapping[str, Callable[[Any], Any]] | None = None,
    defaults: Mapping[str, Any] | None = None,
    described_by: Mapping[str, Sequence[str]] | None = None,
) -> OutputDir:
    """Checks and prepares the output folder of a run of ``config`` (a JSON-able dict).

    * holds ``results.json``: refused unless ``overwrite`` (then its outputs are removed: the
      results, checkpoints, training curves and the files its record names, ``"files"``, so
      no plot or table of the old run is left beside the new one's);
    * holds checkpoints of the same config: resumed (``resuming=True``);
    * holds checkpoints of another config, or checkpoints without the config they belong to:
      refused (the differing fields are named) unless ``overwrite``; a config alone (a job
      stopped before its first checkpoint) is replaced;
    * ``resume=True`` and nothing to resume: refused.

    ``ignore``: fields a saved config may hold with another value (the evaluation-only flags,
    which an earlier version recorded); ``added``: fields a later version added, with the value
    that is the earlier behaviour (``RunConfig.ADDED``): a saved config without one resumes;
    ``flags``: the fields the user sets (the config's): when one of them differs, the refusal
    names the config's differences, not files that changed behind the same flags (a flag such
    as ``--max-length`` changes a digest too); ``paths``: the fields naming a file or folder,
    ``canonical``: ``{field: what its value names}`` (``--sweep``'s lanes; ``sorted``: a list
    whose order means nothing), ``defaults``: ``{field: the value it takes when not given}``
    (a resume spelling the same folder, the same set, the same sweep another way or a default
    out resumes: :func:`_as_now`); ``described_by``: ``{field: (digest, *more)}``, the fields
    naming where files lie that are no difference where the digests of what they hold are
    alike (the config's ``DESCRIBED_BY``: :func:`described_alike`).
    """
    out = Path(out)
    check_not_a_file(out)
    _check_not_a_job(out)
    config = to_jsonable(config)
    saved_config = out / CHECKPOINTS / CONFIG_FILE
    finished = [name for name in RESULT_FILES if (out / name).exists()]
    if finished and resume:  # not a conflict to settle: there is nothing left to resume
        raise UsageError(
            f"--resume: the run in {out} is finished (its results are in {out / finished[0]}), "
            "so there is nothing to resume: read them there, or drop --resume and pass "
            "--overwrite to train it again"
        )
    if finished and not overwrite:
        raise UsageError(
            f"--out {out} already holds {finished[0]} of a finished run: pass another --out, or "
            "--overwrite to replace it"
        )
    resuming = False
    # a config alone (a job stopped before its first checkpoint: at most empty group folders,
    # which a checkpointer makes when it opens, or a save cut short) holds nothing to resume
    # or protect: the folder starts afresh under the new config
    alone = saved_config.exists() and not _holds_checkpoints(out / CHECKPOINTS)
    if saved_config.exists() and not overwrite and not alone:
        _check_same_config(
            out, saved_config, config, ignore, added, flags, paths, canonical, defaults,
            described_by=described_by,
        )  # fmt: skip
        resuming = True
    elif not overwrite and _holds_checkpoints(out / CHECKPOINTS):
        raise UsageError(
            f"--out {out} holds checkpoints but no {CHECKPOINTS}/{CONFIG_FILE} saying which config "
            "they belong to: pass another --out, or --overwrite to discard them"
        )
    if resume and not resuming:
        raise UsageError(
            f"--resume: {out} holds no checkpoint to resume from: drop --resume to start a new run"
        )
    created = topmost_missing(out)
    try:
        check_writable(out)
        if overwrite:
            for path in _files_of_finished_run(out):
                path.unlink(missing_ok=True)
            for name in RESULT_FILES:
                (out / name).unlink(missing_ok=True)
            shutil.rmtree(out / CHECKPOINTS, ignore_errors=True)
            shutil.rmtree(out / "tensorboard", ignore_errors=True)
        if not resuming:
            (out / CHECKPOINTS).mkdir(parents=True, exist_ok=True)
            write_json_atomic(saved_config, config | {OPENED: secrets.token_hex(8)})
    except (CudtError, OSError) as e:
        remove_created(out, created)  # a full disk, say: leave no empty folders behind
        if isinstance(e, OSError):
            raise UsageError(
                f"cannot write to --out {out} ({e.strerror or e}): free disk space or pass a "
                "writable --out"
            ) from e
        raise
    return OutputDir(out, resuming)


def _resume_rules(cfg, defaults: Mapping[str, Any] | None) -> dict[str, Any]:
    """What a saved config may differ in from ``cfg``'s and still resume (:func:`open_output`'s
    ``ignore``, ``added``, ``flags``, ``paths``, ``canonical``, ``defaults``,
    ``described_by``)."""
    return dict(
        # what a resume may change: a saved config of an earlier version may record it, and
        # a flag that acts on nothing here (an earlier version accepted it: refused now)
        ignore=(
            *cfg.EVALUATION_ONLY,
            *cfg.RESUME_IGNORES,
            *cfg.idle_flags(dataclasses.asdict(cfg)),
        ),
        added=getattr(cfg, "ADDED", None),
        flags=[f.name for f in dataclasses.fields(cfg)],
        paths=[f.name for f in dataclasses.fields(cfg) if f.metadata.get("path")],
        canonical={
            f.name: f.metadata["canonical"]
            for f in dataclasses.fields(cfg)
            if f.metadata.get("canonical")
        },
        defaults=cfg.resolved_defaults() | dict(defaults or {}),
        described_by=cfg.DESCRIBED_BY,
    )


def check_same_data(
    out: str | Path,
    fingerprint: dict[str, Any],
    data: Collection[str],
    cfg,
    defaults: Mapping[str, Any] | None = None,
    name: str | None = None,
) -> None:
    """Refuses, as a resume of them would (:func:`open_output`), the checkpoints in ``out``
    where their record names other data than ``fingerprint`` (what a run of ``cfg`` records
    now: :func:`checkpoint_record` and the task's fingerprint) on its fields ``data`` (the
    task's): for a finished run whose results are reused (``experiments.paper.job``), whose
    config its results.json decides; ``name``: what the refusal calls ``out`` (``--out OUT``).
    A folder whose record is gone (its checkpoints deleted to save disk) is checked by its
    results.json, which records the data too (:data:`DATA_RECORD`); one from before that
    record is refused: nothing else says what its results were trained on."""
    out = Path(out)
    saved: Path | dict | None = out / CHECKPOINTS / CONFIG_FILE
    held = "checkpoints"
    if not saved.is_file():
        saved, held = _results_record(out), "results"
    if saved is None:
        raise UsageError(
            f"{name or f'--out {out}'} has no {CHECKPOINTS}/{CONFIG_FILE}, the record of the "
            "data it was trained on, so its results cannot be checked against the files its "
            f"flags name now: restore that file, or delete {out} to train it again"
        )
    rules = _resume_rules(cfg, defaults)
    fingerprint = to_jsonable(fingerprint)
    _check_same_config(out, saved, fingerprint, **rules, only=data, name=name, held=held)


def _results_record(out: Path) -> dict | None:
    """What a finished run's results.json records of its config and the data it was trained
    on, as its checkpoints' record holds them; None where it holds no data record (written
    before :data:`DATA_RECORD`) or cannot be read."""
    try:
        results = json.loads((out / "results.json").read_text(encoding="utf-8"))
        config, record = results["config"], results[DATA_RECORD]
        if isinstance(config, dict) and isinstance(record, dict):
            return config | record
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def open_output_once(
    path, fingerprint, cfg, main_process: bool, defaults: Mapping[str, Any] | None = None
) -> OutputDir:
    """:func:`open_output` under the folder's lock, by process 0 of a multi-host job; the
    others wait for it, take its verdict (resuming or not) and check that the lock they see is
    their job's, so no two jobs, and no two processes of one, race on the folder. The lock is
    taken before anything is written (a job refused for it writes nothing) and held until the
    returned :class:`OutputDir` is left (``with``); a refusal while opening releases it and
    removes a folder the lock created. ``defaults``: the flags' resolved defaults a task adds
    to the config's own (``cfg.resolved_defaults()``; :func:`open_output`)."""
    flags = dict(overwrite=cfg.overwrite, resume=cfg.resume, **_resume_rules(cfg, defaults))
    if jax.process_count() == 1:
        lock = lock_output(path)
        try:
            return dataclasses.replace(open_output(path, fingerprint, **flags), lock=lock)
        except BaseException:
            lock.release(discard=True)
            raise
    from jax.experimental import multihost_utils

    lock, out, failed, resuming, token = None, None, 0, 0, 0
    if main_process:
        try:
            lock = lock_output(path)
            token = lock.token
            out = open_output(path, fingerprint, **flags)
            resuming = int(out.resuming)
        except BaseException:
            failed = 1
            if lock is not None:
                lock.release(discard=True)
            raise
        finally:
            verdict = multihost_utils.broadcast_one_to_all(
                np.asarray([failed, resuming, token], np.int32)
            )
        problem = None
    else:
        verdict = multihost_utils.broadcast_one_to_all(np.asarray([0, 0, 0], np.int32))
        if verdict[0]:
            raise UsageError(f"process 0 could not open --out {path}: see its error")
        out = OutputDir(Path(path), bool(verdict[1]))
        problem = check_job_token(path, int(verdict[2]))
    seen = multihost_utils.process_allgather(np.asarray([problem is None], np.int32))
    blind = [i for i, ok in enumerate(np.asarray(seen).reshape(-1)) if not ok]
    if blind:
        if lock is not None:
            lock.release()
        raise UsageError(
            f"--out {path} is not one folder for every process of this job (process {blind[0]} "
            f"does not see the lock process 0 holds there{': it sees ' + problem if problem else ''}"
            "): put --out on a file system every process shares"
        )
    return dataclasses.replace(out, lock=lock)
