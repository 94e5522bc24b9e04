"""Fixtures shared by several test modules (plain helper functions are in ``helpers.py``)."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import jax
import pytest
from helpers import write_tiny_bert


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


_share_compiled_programs()


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> Path:
    """A random 2-block BERT folder (hidden size 32) with MiniLM's ``tokenizer.json``."""
    return write_tiny_bert(tmp_path_factory.mktemp("tiny_bert"))
