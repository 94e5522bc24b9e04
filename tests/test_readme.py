"""The README's set-up commands are the ones CI runs, and its layout section is the tree.

The layout FORMAT these tests read (README.md, the first fenced block after ``## Layout``)::

    cudt/                the library                  <- an entry: NAMES, two+ spaces, description
      constrained.py     DescentConfig, ...           <- indented under the folder it is in
      runner/            one runner for every task    <- a folder: its one name ends in '/'
        config.py, sweep.py  flags and sweeps         <- several names: ', ' or ' ' between them
        groups.py        training groups and their    <- a description may go on ...
                         compiled step                <- ... on lines indented at least to
                                                         the column where it started
    experiments/         thin entry points
      video_denoise.py   ...
    docs/errors.md       a path with '/' is relative to the enclosing folder (here the root)

- NAMES is everything before the first run of two or more spaces; the description after it is
  free text and is never read as names (so a file named only in a description is not listed).
- An entry belongs to the nearest folder entry above it with a smaller indent (at indent 0: the
  repository root). Every line is read, however deep its indent, except description lines.
- A line whose NAMES are one folder opens that folder for the lines indented under it.

Checked: every listed path exists, and every git-tracked file under cudt/, experiments/ and
benchmarks/ and every top-level file is listed, except ``__init__.py`` (its package folder is
listed) and top-level dot-files (``.gitignore``).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COVERED = ("cudt/", "experiments/", "benchmarks/")


def _readme() -> str:
    return (ROOT / "README.md").read_text(encoding="utf-8")


def layout_paths(readme: str) -> list[str]:
    """The repository-relative paths the layout block lists, folders ending in '/'."""
    if "## Layout" not in readme:
        raise AssertionError("README.md has no '## Layout' section")
    fenced = re.search(r"```[^\n]*\n(.*?)```", readme.split("## Layout", 1)[1], re.S)
    if fenced is None:
        raise AssertionError("the '## Layout' section has no fenced block")
    paths: list[str] = []
    folders: list[tuple[int, str]] = []  # (indent, "cudt/runner/") of the open folders
    description_column = None  # where the last entry's description started
    for line in fenced.group(1).splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        if description_column is not None and indent >= description_column:
            continue  # the description goes on
        head = re.split(r" {2,}", line.strip(), maxsplit=1)
        names = [n for n in re.split(r"[,\s]+", head[0]) if n]
        if len(head) == 2:
            description_column = indent + line.strip().index(head[1], len(head[0]))
        else:
            description_column = None
        while folders and folders[-1][0] >= indent:
            folders.pop()
        base = folders[-1][1] if folders else ""
        paths.extend(base + name for name in names)
        if len(names) == 1 and names[0].endswith("/"):
            folders.append((indent, base + names[0]))
    return paths


def unlisted_and_missing(listed: list[str], tracked: list[str]) -> tuple[list[str], list[str]]:
    """(tracked files the layout should list and does not, listed paths that do not exist)."""
    names = {p.rstrip("/") for p in listed}
    missing = sorted(p for p in names if not (ROOT / p).exists())
    unlisted = []
    for path in tracked:
        top = "/" not in path
        if not (top or path.startswith(COVERED)) or (top and path.startswith(".")):
            continue
        if path.endswith("/__init__.py") and path.rsplit("/", 1)[0] in names:
            continue
        if path not in names:
            unlisted.append(path)
    return unlisted, missing


def _tracked() -> list[str]:
    try:
        out = subprocess.run(
            ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: no tracked-file list to compare with")
    return [p for p in out.splitlines() if (ROOT / p).exists()]  # deleted, not yet committed


def test_ci_runs_exactly_the_readme_test_command():
    lines = [ln.strip() for ln in _readme().splitlines()[:4] if ln.strip()]
    run_cmd, test_cmd = lines[1], lines[2]
    assert "python -m experiments.video_denoise" in run_cmd
    assert test_cmd.endswith("python -m pytest")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert ci[-1].strip() == test_cmd


def test_layout_lists_every_tracked_file_and_only_existing_paths():
    listed = layout_paths(_readme())
    unlisted, missing = unlisted_and_missing(listed, _tracked())
    assert not missing, f"README layout lists paths that do not exist: {missing}"
    assert not unlisted, f"README layout does not list these tracked files: {unlisted}"


SAMPLE = """\
## Layout

```
cudt/            the library
  io.py          atomic writes
  runner/        the runner
    cli.py, run.py  flags
    report.py    tables, and a description that
                 goes on here: not_a_file.py
  models/        models
    llama/       the decoder
      model.py   forward
  linalg.py      eigh
experiments/     entry points
  video_denoise.py
docs/errors.md   messages
```
"""


def test_layout_reader_reads_every_depth_and_skips_descriptions():
    """The reader itself, on a block in the format above: the deepest lines are names, a
    description's continuation is not, and a dropped deep entry is reported."""
    assert layout_paths(SAMPLE) == [
        "cudt/", "cudt/io.py", "cudt/runner/", "cudt/runner/cli.py", "cudt/runner/run.py",
        "cudt/runner/report.py", "cudt/models/", "cudt/models/llama/",
        "cudt/models/llama/model.py", "cudt/linalg.py", "experiments/",
        "experiments/video_denoise.py", "docs/errors.md",
    ]  # fmt: skip
    tracked = ["cudt/runner/report.py", "cudt/models/llama/model.py", "cudt/io.py"]
    dropped = SAMPLE.replace("      model.py   forward\n", "")
    unlisted, _ = unlisted_and_missing(layout_paths(dropped), tracked)
    assert unlisted == ["cudt/models/llama/model.py"]
