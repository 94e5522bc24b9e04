"""What the bad-input tests of this folder share. Bad input, tried as a new user would: every
case exits 2 with ONE line ``error: <problem>: <fix>``, no traceback, and nothing the user
already had is overwritten or left half-written (docs/errors.md).

Cases are driven through the command line: ``experiments.video_denoise.main(argv)`` in-process
(:func:`cli`; its exit status is the return value, or ``SystemExit.code`` for flag errors), a
real subprocess where the process itself must be limited (:func:`cli_subprocess`: a full disk,
simulated with ``RLIMIT_FSIZE``, which works as root), ``cudt.runner.cli.run_cli(lambda:
cudt.load_encoder(folder))`` for pretrained weights, and the same weights through
``experiments.text_classify --checkpoint FOLDER``; the other entry points' ``main`` likewise
(:func:`entry_cli`).

Every case's message is checked against its row of docs/errors.md by :func:`check`, in the test
that records it, and test_errors_page.py reads the sources of this folder's tests for the cases
that docs/errors.md must list: neither depends on which tests ran or in what order.
``CUDT_ERRORS_TABLE=path pytest -n 0 tests/bad_inputs`` writes the tables of case -> message
(from this run's real output) that docs/errors.md shows, without comparing them with the page
(conftest.py; one process, as xdist's workers would each hold some of the cases).
"""

from __future__ import annotations

import gc
import hashlib
import io
import logging
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from helpers import ROOT, exit_status

from experiments import video_denoise

# A tiny run: one layer of DUST and UT, 4 steps in chunks of 2 (checkpoints at steps 2 and 4),
# one seed. Four groups: DUST ERM and constrained (one dictionary per layer: another model), the
# control (ERM DUST with per-layer dictionaries), and UT, whose ERM and constrained runs share
# one program. A one-step warm-up (the default, one epoch, outlasts the 4 steps: the runner
# would warn that the duals never move).
TINY = [
    "--warmup-steps",
    "1",
    "--models",
    "dust,ut",
    "--dust-atoms",
    "16",
    "--layers",
    "1",
    "--steps",
    "4",
    "--chunk-steps",
    "2",
    "--seeds",
    "1",
    "--batch-size",
    "4",
    "--num-videos",
    "3",
    "--num-frames",
    "4",
    "--seq-len",
    "4",
]
# TINY for a real --dataset: the synthetic clips' sizes left out (they do not act there: refused)
SYNTHETIC_ONLY = ("--num-videos", "--num-frames")
TINY_REAL = [
    a for k, v in zip(TINY[::2], TINY[1::2], strict=True) if k not in SYNTHETIC_ONLY for a in (k, v)
]


# Progress reports of the tiny run, on stderr before a failure after training started: its
# progress bars and "resumed from" notes.
PROGRESS = re.compile(
    r"^(dust-1 (ERM|constrained)|dust-pl-1 ERM|ut-1):"
    r"(\s+\d+%\|| resumed from the checkpoint at step)"
)


# case -> (section, message, exit status), for docs/errors.md
MESSAGES: dict[str, tuple[str, str, int]] = {}


def cli(argv, capsys) -> tuple[int, str]:
    """Runs the video CLI in-process: ``(exit status, stderr)``.

    What a command-line run would also print on stderr counts as stderr here: Python warnings
    (default filters), log records of WARNING and above (the root logger's default), and
    unraisable exceptions (e.g. a coroutine dying when collected, flushed by ``gc.collect``).
    """
    capsys.readouterr()
    logged = io.StringIO()
    handler = logging.StreamHandler(logged)
    handler.setLevel(logging.WARNING)
    unraisable: list[str] = []
    previous_hook = sys.unraisablehook
    sys.unraisablehook = lambda u: unraisable.append(f"Exception ignored in: {u.object!r}\n")
    logging.getLogger().addHandler(handler)
    # what existed before the call is set aside, so the collection below walks only what the
    # call made (a worker's heap after hundreds of tests: a full collection took ~1 s a call)
    gc.freeze()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")
            for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning):
                warnings.filterwarnings("ignore", category=category)
            status = exit_status(video_denoise.main, argv)
            gc.collect()
    finally:
        gc.unfreeze()
        logging.getLogger().removeHandler(handler)
        sys.unraisablehook = previous_hook
    shown = "".join(
        warnings.formatwarning(w.message, w.category, w.filename, w.lineno) for w in caught
    )
    return status, shown + logged.getvalue() + "".join(unraisable) + capsys.readouterr().err


def entry_cli(main, argv, capsys) -> tuple[int, str]:
    """Runs an entry point's ``main`` in-process: ``(exit status, stderr)``."""
    capsys.readouterr()
    status = exit_status(main, argv)
    return status, capsys.readouterr().err


def entry(main):
    """``via`` of :func:`refused` for another entry point's ``main``: :func:`entry_cli`, its
    stderr with the temporary folders written as docs/errors.md writes them (/tmp/...)."""

    def via(argv, capsys) -> tuple[int, str]:
        status, err = entry_cli(main, argv, capsys)
        return status, as_in_docs(err)

    return via


# Starts the CLI with a file size limit: SIGXFSZ ignored, so a write past the limit fails with
# EFBIG ("File too large"), as a write to a full disk fails with ENOSPC; it works as root.
_LIMITED = (
    "import os, resource, signal, sys; "
    "signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
    "n = int(sys.argv[1]); resource.setrlimit(resource.RLIMIT_FSIZE, (n, n)); "
    "os.execv(sys.executable, [sys.executable, '-m', 'experiments.video_denoise', *sys.argv[2:]])"
)


def cli_subprocess(argv, *, max_file_bytes: int | None = None) -> tuple[int, str]:
    """Runs the video CLI as a real process, as a user starts it (a fresh interpreter), unable
    to write a file past ``max_file_bytes`` when that is given.

    Without the session's compilation cache (tests/conftest.py): on a full disk its writes
    fail too, and jax warns of each on stderr, which must hold the CLI's one line."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    if max_file_bytes is None:
        command = [sys.executable, "-m", "experiments.video_denoise"]
    else:
        command = [sys.executable, "-c", _LIMITED, str(max_file_bytes)]
    proc = subprocess.run(
        [*command, *map(str, argv)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return proc.returncode, proc.stderr


def over_cases(cases: list[tuple], argnames: str = "case, build, problem, fix"):
    """``pytest.mark.parametrize`` over a table of cases (tuples, the case first), each test
    named by its case; test_errors_page.py reads the table this decorator names for the cases
    docs/errors.md lists."""
    return pytest.mark.parametrize(argnames, cases, ids=[c[0] for c in cases])


def check(case, status: int, err: str, problem: str, fix: str, *, progress=False) -> str:
    """Exit status 2 and exactly one stderr line ``error: ...`` naming the problem and the fix.

    ``progress=True``: the run failed after training started, so stderr also holds that run's
    progress report (bars, "resumed from ..."), not errors; it is set aside first.
    """
    assert "Traceback" not in err, err
    text = err
    if progress:
        text = "\n".join(s for s in re.split(r"[\r\n]", err) if s and not PROGRESS.match(s))
    lines = text.splitlines()
    assert len(lines) == 1, err
    line = lines[0]
    assert line.startswith("error: "), err
    assert problem in line, (problem, line)
    assert fix in line, (fix, line)
    assert status == 2, (status, err)
    if case is not None:
        section = section_of()
        MESSAGES[case] = (section, line, status)
        if not os.environ.get("CUDT_ERRORS_TABLE"):  # regenerating: the page may be stale
            shown = as_in_docs(line)
            assert docs_rows().get(case) == (section, status, shown), (
                f"docs/errors.md's row {case!r} is not this run's message "
                f"({section!r}, {status}, {shown!r}): regenerate it with CUDT_ERRORS_TABLE "
                "(see docs/errors.md)"
            )
    return line


def refused(case, argv, capsys, problem: str, fix: str, *, keeps: Path, via=None, **kw) -> str:
    """:func:`check` of ``via(argv, capsys)`` (default :func:`cli`), and ``keeps`` (a file or
    folder the user already had) is byte for byte as it was: nothing overwritten, nothing
    half-written. ``kw`` goes to :func:`check`."""
    before = tree(keeps)
    status, err = (cli if via is None else via)(argv, capsys)
    line = check(case, status, err, problem, fix, **kw)
    assert tree(keeps) == before, f"{keeps} changed"
    return line


# Sections of docs/errors.md, by the test that records a case.
SECTIONS = {
    "test_invalid_config": "Flags and config values",
    "test_bad_data_folder": "Data folders",
    "test_bad_weights": "Pretrained weights (`cudt.load_encoder`, `--checkpoint FOLDER`)",
    "test_model_flag": "Pretrained weights (`cudt.load_encoder`, `--checkpoint FOLDER`)",
    "test_output": "Output folder, full disk",
    "test_disk_full": "Output folder, full disk",
    "test_llm_": "Instruction data and model exports (`experiments.llm_sft`, "
    "`experiments.export_decoder`)",
    "test_held_out_data": "Held-out data sets (`experiments.held_out_data`)",
    "test_": "Checkpoints in `--out`",
}


def section_of(test: str | None = None) -> str:
    """The docs/errors.md section of a test's cases (by default the test running now)."""
    if test is None:
        test = os.environ.get("PYTEST_CURRENT_TEST", "").split("::")[-1]
    return next(title for prefix, title in SECTIONS.items() if test.startswith(prefix))


# The pytest base temporary folder, as docs/errors.md writes it: /tmp/ (set for every test
# by conftest.py).
TEMP_BASE: list[str] = []


def as_in_docs(line: str) -> str:
    """A message with each test's temporary folder written as /tmp/, as docs/errors.md has it,
    and the holder of a lock (its PID, host and start) as one example holder."""
    for base in TEMP_BASE:
        line = re.sub(re.escape(base) + r"/[^/]+/", "/tmp/", line)
    return re.sub(
        r"PID \d+ on host [^,]+, started [^)]+",
        "PID 12345 on host node1, started 2026-01-01 12:00:00 UTC",
        line,
    )


def docs_rows() -> dict[str, tuple[str, int, str]]:
    """docs/errors.md's table rows: case -> (section, exit status, message)."""
    rows, section = {}, None
    for line in (ROOT / "docs" / "errors.md").read_text().splitlines():
        if line.startswith("### "):
            section = line[4:]
        m = re.fullmatch(r"\| (.+?) \| (\d+) \| `(.*)` \|", line)
        if m:
            rows[m.group(1)] = (section, int(m.group(2)), m.group(3).replace("\\|", "|"))
    return rows


def tree(path: Path) -> dict[str, str] | None:
    """Every file and folder under ``path`` with a hash of its bytes (None: nothing there)."""
    if not path.exists() and not path.is_symlink():
        return None
    if path.is_file():
        return {".": hashlib.sha256(path.read_bytes()).hexdigest()}
    out = {}
    for p in sorted(path.rglob("*")):
        rel = str(p.relative_to(path))
        out[rel] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
    return out


def previous_run(folder: Path) -> Path:
    """An --out folder holding the results of an earlier finished run."""
    folder.mkdir(parents=True)
    (folder / "results.json").write_text('{"experiment": "video_denoise", "runs": []}')
    (folder / "layer_loss.png").write_bytes(b"\x89PNG earlier figure")
    return folder
