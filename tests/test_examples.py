"""Every script under examples/ runs as a user runs it (a subprocess, its full size), is at most
60 lines, and ends with its constraints met (the figures it prints)."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "examples").glob("*.py"))


def test_there_are_three_examples():
    assert [p.name for p in SCRIPTS] == [
        "jax_norm_bound.py",
        "nnx_fairness.py",
        "optax_per_example.py",
    ]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_example_runs_and_meets_its_constraints(script):
    assert len(script.read_text(encoding="utf-8").splitlines()) <= 60
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr[-2000:]
    figures = ast.literal_eval(out.stdout.strip().splitlines()[-1])
    if script.stem == "optax_per_example":
        assert figures["max error"] <= 0.1 + 1e-3 and figures["λ > 0"] > 0
    else:
        name = {"nnx_fairness": "fair", "jax_norm_bound": "norm"}[script.stem]
        assert figures[name] <= 1e-3  # feasible, to the dual's oscillation
        assert figures["λ"][name] > 0  # and the constraint was active
    if script.stem == "jax_norm_bound":  # the fit is a fit: better than the mean of y
        assert figures["mse"] < 1.0  # var(y) ≈ 2.5


def test_the_documented_diff_is_the_example():
    """docs/constrained.md's before/after diff: its added lines are the example's, ≤ 10 of them."""
    doc = (ROOT / "docs" / "constrained.md").read_text(encoding="utf-8")
    diff = doc.split("```diff\n", 1)[1].split("```", 1)[0].splitlines()
    added = [line[1:].strip() for line in diff if line.startswith("+")]
    example = {line.strip() for line in (ROOT / "examples" / "optax_per_example.py").open()}
    assert 0 < len(added) <= 10 and all(line in example for line in added), added
