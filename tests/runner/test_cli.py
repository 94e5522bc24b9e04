"""cudt.runner.cli's helpers for recorded command lines, and the process settings of the entry
points."""

import os
import subprocess
import sys

from cudt.runner.cli import without_flag


def test_without_flag_drops_the_flag_and_its_value_in_both_spellings():
    argv = ["--seeds", "3", "--out", "runs/a", "--models", "ut", "--out=runs/b", "--outer", "x"]
    assert without_flag(argv, "--out") == ["--seeds", "3", "--models", "ut", "--outer", "x"]
    assert without_flag(argv, "--profile") == argv  # absent: unchanged
    assert without_flag(["--out"], "--out") == []  # a trailing flag without its value


_CACHE_PROBE = """
import os, jax, jax.numpy as jnp
from cudt.runner.cli import configure_process
configure_process()
path = jax.config.jax_compilation_cache_dir
hits = []
jax.monitoring.register_event_listener(
    lambda name, **kw: hits.append(name) if name.endswith("cache_hits") else None
)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)  # tiny programs too
for _ in range(2):  # the same program built anew, as each group builds its step
    jax.jit(lambda x: jnp.sin(x) * 2 + 1)(jnp.ones(3)).block_until_ready()
print(path, os.path.isdir(path), len(hits))
"""


def _probe(env: dict) -> list[str]:
    """What the probe sees in a fresh process, and whether its cache folder outlives it."""
    run = subprocess.run(
        [sys.executable, "-c", _CACHE_PROBE], env=env, capture_output=True, text=True, check=True
    )
    path, existed, hits = run.stdout.split()
    return [existed, hits, str(os.path.exists(path))]


def test_an_entry_point_compiles_a_program_built_again_once_and_removes_its_cache(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    assert _probe(env) == ["True", "1", "False"]  # a hit the second time; the folder removed
    mine = tmp_path / "mine"
    assert _probe({**env, "JAX_COMPILATION_CACHE_DIR": str(mine)}) == ["True", "1", "True"]
