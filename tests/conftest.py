"""Fixtures shared by several test modules (plain helper functions are in ``helpers.py``)."""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import pytest
from helpers import QUICK_CODEGEN, write_tiny_bert


def _share_compiled_programs() -> None:
    """One persistent XLA compilation cache for the test session and every process its tests
    start (they inherit the environment): many tests compile the same tiny programs (the video
    runs, the experiments in subprocesses), and a cached executable is the same program, so
    results are unchanged, bit for bit. A cache the user set up (``JAX_COMPILATION_CACHE_DIR``)
    is used as it is. Set at import, before any test compiles: in the environment for the
    processes to come, and in jax's config for this one (jax read the environment when
    ``helpers`` imported it)."""
    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return
    path = tempfile.mkdtemp(prefix="cudt-tests-xla-cache-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    # every program, however quick to compile or small (jax's defaults skip those under 1 s)
    settings = {
        "jax_compilation_cache_dir": path,
        "jax_persistent_cache_min_compile_time_secs": 0,
        "jax_persistent_cache_min_entry_size_bytes": 0,
    }
    for name, value in settings.items():
        os.environ[name.upper()] = str(value)
        jax.config.update(name, value)


def _skip_optimisation_passes() -> None:
    """Compiling is most of the suite's time (a profile: 511 s of XLA backend compilation in
    one worker against 49 s of tracing), and the suite's programs are tiny: XLA's optimisation
    passes cost more than they save on them (the few tests that train for minutes turn them
    back on: the ``optimized`` marker). The programs compute the same functions; the tests
    compare floats with tolerances, and bitwise claims (resume) compare two runs of the same
    build. A user's own setting is kept."""
    if "JAX_DISABLE_MOST_OPTIMIZATIONS" not in os.environ:
        os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] = "True"
        jax.config.update("jax_disable_most_optimizations", True)


def _one_thread_per_worker() -> None:
    """With at least as many xdist workers as cores, each worker's XLA runs its matrix products
    on one thread: Eigen's thread pool would otherwise put every core's threads in every
    worker, which only adds contention (two files side by side on this 2-core machine: 8–13 %
    less time). Set before jax starts its backend, in the environment so the processes
    the tests start inherit it. A run without xdist (``-n 0``) keeps every core."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers < (os.cpu_count() or 1):
        return
    flags = os.environ.get("XLA_FLAGS", "")
    if "multi_thread_eigen" in flags:
        return  # the user's own threading
    os.environ["XLA_FLAGS"] = f"{flags} --xla_cpu_multi_thread_eigen=false".strip()


def _quick_codegen() -> None:
    """:data:`QUICK_CODEGEN` for this process and the processes its tests start (set before jax
    starts its backend, like the thread setting below); a flag the user set is kept. XLA aborts
    a process whose ``XLA_FLAGS`` name a flag it does not know, so the flags are tried once in a
    subprocess first, and left out (the suite only slower) by a jaxlib without them; xdist's
    workers inherit the result and try nothing."""
    flags = os.environ.get("XLA_FLAGS", "")
    missing = [flag for flag in QUICK_CODEGEN if flag.split("=")[0] not in flags]
    if not missing:
        return
    candidate = " ".join([flags, *missing]).strip()
    probe = subprocess.run(
        [sys.executable, "-c", "import jax; jax.devices('cpu')"],
        env=dict(os.environ, XLA_FLAGS=candidate, JAX_PLATFORMS="cpu"),
        capture_output=True,
    )
    if probe.returncode == 0:
        os.environ["XLA_FLAGS"] = candidate


_share_compiled_programs()
_skip_optimisation_passes()
_quick_codegen()
_one_thread_per_worker()


@contextlib.contextmanager
def _optimizations_on():
    """XLA's optimisation passes for a test that trains for minutes (the ``optimized``
    marker), for this process's compilations and the processes it starts."""
    before = jax.config.read("jax_disable_most_optimizations")
    env = os.environ.get("JAX_DISABLE_MOST_OPTIMIZATIONS")
    jax.config.update("jax_disable_most_optimizations", False)
    os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] = "false"
    try:
        yield
    finally:
        jax.config.update("jax_disable_most_optimizations", before)
        if env is None:
            os.environ.pop("JAX_DISABLE_MOST_OPTIMIZATIONS", None)
        else:
            os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] = env


@pytest.fixture(scope="module", autouse=True)
def _optimized_module(request):
    """A module marked ``optimized`` (``pytestmark``): on for its module-scoped fixtures too
    (autouse fixtures set up before the others of their scope)."""
    if request.node.get_closest_marker("optimized") is not None:  # the Module's own marks
        with _optimizations_on():
            yield
    else:
        yield


@pytest.fixture(autouse=True)
def _optimized_test(request):
    if request.node.get_closest_marker("optimized") is not None:
        with _optimizations_on():
            yield
    else:
        yield


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items) -> None:
    """The files that take longest run first. With ``--dist loadfile`` a worker takes a whole
    file, in collection order (addopts: ``--no-loadscope-reorder``); the files that train for
    minutes (a test marked ``optimized``), handed out last, kept one worker busy long after
    the other ran out of files. So: files with an ``optimized`` test, then files with a
    ``slow`` test, then the rest, each group as xdist would order it (most tests first). The
    tests of a file keep their order. Last of the hooks: ranked by the tests that will run,
    after ``-m`` has deselected (``-m "not slow"`` leaves a file's other tests in the rest)."""
    files: dict[str, list[pytest.Item]] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::")[0], []).append(item)

    def rank(tests: list[pytest.Item]) -> tuple[int, int]:
        for group, marker in enumerate(("optimized", "slow")):
            if any(t.get_closest_marker(marker) is not None for t in tests):
                return group, -len(tests)
        return 2, -len(tests)

    items[:] = [item for tests in sorted(files.values(), key=rank) for item in tests]


def pytest_collection_finish(session) -> None:
    """The objects alive once every test module is imported (jax, numpy, matplotlib, the
    modules themselves: about 200,000) moved out of the garbage collector's reach
    (``gc.freeze``): they live to the end anyway, and each full collection walked them all
    again. Measured (tests/runner/test_runner.py and test_combine.py in one process, -n 0):
    5.1 s in full collections, 3.6 s with them frozen. Nothing is collected differently but
    garbage left over from the imports (collected first)."""
    gc.collect()
    gc.freeze()


_START = time.monotonic()
_WORKERS: dict[str, list[float]] = {}  # xdist worker -> [seconds in tests, last report]


def pytest_runtest_logreport(report) -> None:
    """In xdist's controller: each worker's time in tests (setup, call, teardown) and when it
    last reported, for the summary below."""
    node = getattr(report, "node", None)
    if node is not None:
        busy = _WORKERS.setdefault(node.gateway.id, [0.0, 0.0])
        busy[0] += report.duration
        busy[1] = time.monotonic() - _START


def pytest_terminal_summary(terminalreporter) -> None:
    """One line: each worker's seconds in tests and when its last test ended. With
    ``--dist loadfile`` a worker holds a file to its end, so a worker that ends long before
    the other sat idle: a heavy file handed out late (see the ordering above)."""
    if _WORKERS:
        parts = [f"{w} {busy:.0f} s in tests, done at {end:.0f} s"
                 for w, (busy, end) in sorted(_WORKERS.items())]  # fmt: skip
        terminalreporter.write_line("workers: " + "; ".join(parts))


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> Path:
    """A random 2-block BERT folder (hidden size 32) with MiniLM's ``tokenizer.json``."""
    return write_tiny_bert(tmp_path_factory.mktemp("tiny_bert"))


@pytest.fixture
def closed_figures(monkeypatch) -> list:
    """The matplotlib figures the code under test closes, kept to read back: ``plt.close``
    appends its figure here instead (the plots close each figure once it is saved)."""
    import matplotlib.pyplot as plt

    figures: list = []
    monkeypatch.setattr(plt, "close", figures.append)
    return figures
