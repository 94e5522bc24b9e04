"""Fixtures of the bad-input tests (their helpers are in ``refusals.py``): the temporary folder
that docs/errors.md writes as /tmp/, and the tables of docs/errors.md, written from a run.

The suite's second ``conftest.py``: both are imported as the module ``conftest``, the last one
collected holding the name, so no test imports from ``conftest`` (tests/helpers.py holds what
tests/conftest.py shares)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from refusals import MESSAGES, SECTIONS, TEMP_BASE, as_in_docs


@pytest.fixture(autouse=True)
def _temp_base(tmp_path_factory):
    TEMP_BASE[:] = [str(tmp_path_factory.getbasetemp())]


@pytest.fixture(scope="session", autouse=True)
def _write_table():
    """``CUDT_ERRORS_TABLE=path``: the tables of docs/errors.md, from the messages this session's
    tests recorded, written when it ends. In one process (``-n 0``): xdist's workers each run
    some of the files, and each would write its own part over the others'."""
    path = os.environ.get("CUDT_ERRORS_TABLE")
    if path and os.environ.get("PYTEST_XDIST_WORKER"):
        pytest.fail("CUDT_ERRORS_TABLE is written by one process: add -n 0", pytrace=False)
    yield
    if not path:
        return
    lines = []
    for title in dict.fromkeys(SECTIONS.values()):
        rows = [(case, line, st) for case, (sec, line, st) in MESSAGES.items() if sec == title]
        if not rows:
            continue
        lines += [f"### {title}", "", "| case | exit | message (stderr) |", "|---|---|---|"]
        for case, line, status in rows:
            cell = as_in_docs(line).replace("|", "\\|")
            lines.append(f"| {case} | {status} | `{cell}` |")
        lines.append("")
    Path(path).write_text("\n".join(lines))
