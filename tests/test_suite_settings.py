"""The suite's own compile settings (tests/conftest.py): XLA's optimisation passes are off for
the tiny programs unless the user chose, and back on, in this process and the processes a test
starts, where a test is marked ``optimized``."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import pytest

_READ = "import jax; print(jax.config.read('jax_disable_most_optimizations'))"


def _in_a_subprocess() -> bool:
    out = subprocess.run([sys.executable, "-c", _READ], capture_output=True, text=True, check=True)
    return {"True": True, "False": False}[out.stdout.strip()]


def test_the_suite_compiles_without_optimisation_passes_unless_the_user_chose():
    chosen = os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"]  # set by conftest if not by the user
    expected = chosen.lower() in ("1", "true", "t", "y", "yes", "on")
    assert jax.config.read("jax_disable_most_optimizations") is expected
    assert _in_a_subprocess() is expected


@pytest.mark.optimized
def test_a_test_marked_optimized_compiles_with_them_here_and_in_its_subprocesses():
    assert jax.config.read("jax_disable_most_optimizations") is False
    assert _in_a_subprocess() is False


def test_with_a_worker_per_core_each_worker_runs_its_products_on_one_thread():
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    flags = os.environ.get("XLA_FLAGS", "")
    assert ("--xla_cpu_multi_thread_eigen=false" in flags) is (workers >= (os.cpu_count() or 1))


def test_the_suite_compiles_with_its_quick_codegen_here_and_in_its_subprocesses():
    from helpers import QUICK_CODEGEN

    read = "import os; print(os.environ.get('XLA_FLAGS', ''))"
    out = subprocess.run([sys.executable, "-c", read], capture_output=True, text=True, check=True)
    for flags in (os.environ["XLA_FLAGS"], out.stdout):
        for flag in QUICK_CODEGEN:
            # absent: this jaxlib refused it (conftest's probe); drop it from QUICK_CODEGEN
            assert flag.split("=")[0] in flags, (flag, flags)


def test_the_files_that_train_for_minutes_are_handed_out_first(request):
    """tests/conftest.py orders the session's files: those with an ``optimized`` test, then
    those with a ``slow`` test, then the rest; xdist hands them out in that order."""
    files: dict[str, int] = {}
    for item in request.session.items:
        group = next(
            (g for g, m in enumerate(("optimized", "slow")) if item.get_closest_marker(m)), 2
        )
        name = item.nodeid.split("::")[0]
        files[name] = min(files.get(name, 2), group)
    assert files[request.node.nodeid.split("::")[0]] == 0  # this file has an optimized test
    assert list(files.values()) == sorted(files.values()), files
    # a file's tests stay together: each file appears in one run of items
    names = [item.nodeid.split("::")[0] for item in request.session.items]
    assert len([n for i, n in enumerate(names) if i == 0 or names[i - 1] != n]) == len(files)
