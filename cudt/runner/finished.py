"""A finished run read back: its config, its data and each run's trained parameters.

For commands that work on a run after training (``experiments.export_decoder``,
``experiments.layer_gradients``): :func:`finished_run` rebuilds the config from the run's
``results.json`` and its checkpoints' record and loads the data again, refused (one line) unless
it gives what the checkpoints were trained on (:meth:`cudt.runner.Task.fingerprint`);
:func:`trained_params` reads each named run's parameters from its group's last orbax checkpoint;
:func:`run_data` gives each run the draw of its own seed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax

from cudt.checkpoint import GroupCheckpointer
from cudt.errors import CheckpointError, CudtError, UsageError
from cudt.io import to_jsonable
from cudt.runner.config import field_defaults, sets_field
from cudt.runner.groups import Group
from cudt.runner.lock import check_free
from cudt.runner.output import CHECKPOINTS, CONFIG_FILE, checkpoint_record, described_alike
from cudt.runner.sweep import canonical_items

__all__ = [
    "RESULTS_CONFIG_EXTRAS",
    "finished_run",
    "removed_settings",
    "run_data",
    "trained_params",
]

#: What results.json's config records besides the config's fields and what the task derived
#: from the data (its ``data_derived``): the runner's (:func:`cudt.runner.run.run`'s results).
RESULTS_CONFIG_EXTRAS = frozenset(
    {"data_derived", "test_gamma", "val_gamma", "out", "sweeps", "swept", "data_per_seed"}
)


def removed_settings(config_cls: Any, saved: dict) -> list[str]:
    """The keys of ``saved`` (a results.json config) naming settings this cudt no longer has:
    not a field of ``config_cls``, nor what the runner records beside them
    (:data:`RESULTS_CONFIG_EXTRAS`), nor what the task derived from the data. An earlier cudt
    recorded them; no flag of this one gives them (a resume of such a run is refused, a
    finished run is read without them, combine names them)."""
    fields = {f.name for f in dataclasses.fields(config_cls)}
    derived = set(saved.get("data_derived") or ())
    return sorted(k for k in saved if k not in fields | RESULTS_CONFIG_EXTRAS | derived)


def trained_params(out: Path, results: dict, labels: Sequence[str], steps: int) -> dict[str, Any]:
    """``{label: params}`` of the named runs of the finished run in ``out``: each run's
    parameters as its group's last checkpoint holds them (:class:`GroupCheckpointer`; the
    group's folder and the run's row from its record in ``results``). A checkpoint short of
    ``steps`` is one error line."""
    rows: dict[str, list[str]] = {}
    for r in results["runs"]:  # a group's records are its runs in order: row r of its states
        rows.setdefault(r["group"], []).append(r["label"])
    found = {}
    for name, group_labels in rows.items():
        wanted = [label for label in group_labels if label in labels]
        if not wanted:
            continue
        folder = out / CHECKPOINTS / Group("", None, [], name=name).slug
        if not folder.is_dir():  # (opening one would create it)
            raise CheckpointError(
                f"{folder} is missing: the run's checkpoints are lost; train it again"
            )
        with GroupCheckpointer(folder) as checkpointer:
            step = checkpointer.latest_step()
            if step != steps:
                raise CheckpointError(
                    f"{folder} holds {'no checkpoint' if step is None else f'step {step}'}, "
                    f"not the last step {steps}: finish the run first (rerun its command with "
                    "this --out)"
                )
            states, _ = checkpointer.restore(None)  # as saved: the run's own arrays
        for label in wanted:
            row = group_labels.index(label)
            found[label] = jax.tree.map(lambda x, row=row: x[row], states["params"])
    return found


def finished_run(out: str | Path, task: Any, reader: str) -> tuple[Any, Any, dict]:
    """``(cfg, data, results)`` of the finished run of ``task`` in ``out``: its config from
    ``results.json``, at their defaults the flags that would act again after training (its
    config's ``AFTER_TRAINING``: the LLM's ``--export``), its data and model loaded again,
    refused (one line, naming the command ``reader``) unless they give the fingerprint its
    checkpoints were written with (the same training data, model and noise scale), or while a
    job holds ``out`` (:func:`cudt.runner.lock.check_free`)."""
    out = Path(out).expanduser().absolute()
    check_free(out, reader=True)  # a job on it (an --overwrite rerun) is rewriting what is read
    file = out / "results.json"
    if not out.is_dir():
        raise UsageError(
            f"{out} {'is a file, not a folder' if out.exists() else 'does not exist'}: pass the "
            f"--out folder of a finished experiments.{task.name} run"
        )
    if not file.is_file():
        raise UsageError(
            f"{out} holds no results.json: pass the --out folder of a finished "
            f"experiments.{task.name} run (rerun its command with that --out to finish it)"
        )
    try:
        results = json.loads(file.read_text(encoding="utf-8"))
        saved = results["config"]
        experiment = results.get("experiment")
        for run in results["runs"]:  # what trained_params and run_data read of each run
            run["label"], run["group"], run["seed"]  # noqa: B018
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise UsageError(f"{file} is unreadable ({err}): pass the --out of a finished run") from err
    if experiment != task.name:
        raise UsageError(
            f"{out} holds a {experiment} run: {reader} reads experiments.{task.name} runs"
        )
    record = out / CHECKPOINTS / CONFIG_FILE
    try:
        trained = json.loads(record.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise UsageError(f"{record} is unreadable ({err}): the run's checkpoints are lost") from err
    # the flags as given: the checkpoints' record (results.json holds some resolved: the
    # learning rate, the reference state), and the evaluation's from results.json
    fields = {f.name: f for f in dataclasses.fields(task.config_cls)}
    # but the paths as results.json's command gave them: relative to its provenance's cwd,
    # where they are read, while the record's are the first start's (a resume elsewhere)
    paths = set(getattr(task.config_cls, "DESCRIBED_BY", {}))
    kw = (
        {k: v for k, v in saved.items() if k in fields}
        | {k: v for k, v in trained.items() if k in fields}
        | {k: v for k, v in saved.items() if k in fields and k in paths}
    )
    kw = {k: tuple(v) if isinstance(v, list) else v for k, v in kw.items()}
    if "sweep" in kw:  # the lanes it trained (a repeated value, refused now, trained one)
        kw["sweep"] = canonical_items(kw["sweep"])
    kw |= {k: fields[k].default for k in task.config_cls.AFTER_TRAINING}
    kw |= _idle_at_default(task.config_cls, kw, file)
    kw |= dict(out=str(out), overwrite=False, resume=False)
    with _where_it_ran(results):
        try:
            cfg = task.config_cls(**kw)
        except ValueError as err:
            raise UsageError(f"{file}'s config is not one this cudt runs ({err})") from err
        data = _load_again(task, cfg, out, reader)
        # once: it digests the training data and the pretrained weights
        now = to_jsonable(task.fingerprint(cfg, data))
        _check_trained_on(cfg, now, trained, out)
    _note_removed(cfg, now, saved, trained, file)
    return cfg, data, results


def _note_removed(cfg: Any, now: dict, saved: dict, trained: dict, file: Path) -> None:
    """A note on stderr naming the settings an earlier cudt recorded (in ``results.json`` and
    the checkpoints' record alike) that this one no longer has: the run is read without them,
    as no flag of this version can give them (a resume of its checkpoints is refused, naming
    them: :func:`cudt.runner.output.open_output`)."""
    # the record's keys now: the config's, the data's fingerprint (or one per seed's draw)
    known = {*checkpoint_record(cfg), *now, "data_per_seed"}
    gone = [k for k in removed_settings(type(cfg), saved) if k in trained and k not in known]
    if gone:
        shown = "; ".join(f"{k} {saved[k]!r}" for k in gone[:4])
        more = f"; and {len(gone) - 4} more" if len(gone) > 4 else ""
        print(
            f"note: {file} records settings this cudt no longer has ({shown}{more}): read "
            "without them",
            file=sys.stderr,
        )


def _idle_at_default(config_cls: Any, kw: dict, file: Path) -> dict:
    """``{flag: its default}`` of the flags in ``kw`` (a finished run's config) that act on
    nothing (``config_cls.idle_flags``) and were recorded at another value (accepted by an
    earlier version; refused on a command line now), each named in a note on stderr."""
    defaults = field_defaults(config_cls)
    idle = [k for k in config_cls.idle_flags(kw) if k in kw and sets_field(config_cls, k, kw[k])]
    if idle:
        shown = ", ".join(f"--{k.replace('_', '-')} {kw[k]}" for k in idle)
        print(
            f"note: {file} records {shown}, which acted on nothing in that run (an earlier "
            "cudt accepted it): read at its default",
            file=sys.stderr,
        )
    return {k: defaults[k] for k in idle}


def _load_again(task: Any, cfg: Any, out: Path, reader: str) -> Any:
    """``task.load(cfg)`` of a finished run; a file it read gone or changed since is refused
    with its problem and the reader's fix (restore it), not the fix of the run's own command
    (a flag's path to pass, which ``reader`` takes none of)."""
    try:
        return task.load(cfg)
    except CudtError as err:
        err.fix_in_words(f"{reader} reads the files of the run in {out} again; restore them")
        raise


def _check_trained_on(cfg: Any, now: dict, trained: dict, out: Path) -> None:
    """A one-line :class:`UsageError` unless ``now`` (the task's fingerprint of the data of
    ``cfg.data_rng_seed``'s draw, as JSON) is what the data and weights gave when the checkpoints were written (``trained``, the
    checkpoints' record: the training tokens, the vocabulary, the noise scale; per seed when
    each seed drew its own data), evaluation-only values aside."""
    per_seed = trained.get("data_per_seed")
    expected = per_seed.get(str(cfg.data_rng_seed), {}) if per_seed else trained
    diff = [
        f"{k} {expected.get(k)!r} -> {v!r}"
        for k, v in now.items()
        if k in expected
        and k not in cfg.EVALUATION_ONLY
        and expected[k] != v
        # the same files elsewhere: their digests decide
        and not described_alike(k, expected, now, cfg.DESCRIBED_BY)
    ]
    if diff:
        raise UsageError(
            f"{out}'s checkpoints were trained on other data or weights than its config gives "
            f"now ({'; '.join(diff[:3])}): restore the files it was trained on"
        )


def _where_it_ran(results: dict):
    """In the folder the run's command ran in (its relative paths, ``--data-dir``,
    ``--checkpoint``, are relative to it), where that folder still exists."""
    ran_in = (results.get("provenance") or {}).get("cwd")
    ran_in = ran_in if isinstance(ran_in, str) and Path(ran_in).is_dir() else None
    return contextlib.chdir(ran_in) if ran_in else contextlib.nullcontext()


def resolved_where_it_ran(results: dict, paths: dict[str, Path]) -> dict[str, Path]:
    """``paths`` (a finished run's flags as given, by name) resolved in the folder its command
    ran in, those that exist there."""
    with _where_it_ran(results):
        return {k: p.expanduser().resolve() for k, p in paths.items() if p.expanduser().exists()}


def run_data(task: Any, cfg: Any, data: Any, out: Path | None = None) -> Callable[[dict], Any]:
    """``data_of(record)``: the data a run of ``cfg`` was trained on. With ``--data-seed`` every
    run read ``data``; without it each seed drew its own (:func:`cudt.runner.run.data_draws`:
    its data, and what the task draws with it: the LLM's decoder init), so a
    run of another seed than ``data``'s has its draw loaded again, checked against the
    checkpoints' record in ``out`` when given (and read in the folder its command ran in, as
    :func:`finished_run` reads the first)."""
    if cfg.data_seed is not None:
        return lambda record: data
    draws = {cfg.data_rng_seed: data}
    if out is not None:  # a finished run: its results and its checkpoints' record
        results = json.loads((out / "results.json").read_text("utf-8"))
        trained = json.loads((out / CHECKPOINTS / CONFIG_FILE).read_text("utf-8"))

    def data_of(record: dict) -> Any:
        seed = int(record["seed"])
        if seed not in draws:
            # a config to draw that seed's data with, not to run: without --out, whose checks
            # (say --export's: "--out holds a finished run") refuse the folder it just wrote
            draw = dataclasses.replace(cfg, data_seed=seed, out=None)
            if out is None:  # a run that just trained: its paths are relative to here
                draws[seed] = task.load(draw)
                return draws[seed]
            with _where_it_ran(results):
                draws[seed] = _load_again(task, draw, out, "this command")
            _check_trained_on(draw, to_jsonable(task.fingerprint(draw, draws[seed])), trained, out)
        return draws[seed]

    return data_of
