"""--epsilon-margin: constrained runs train at ε + margin and are judged at ε. A run trained
with a margin is, bit for bit, the run trained at the summed ε; only its verdicts move, each
descent constraint's relative violation by exactly the margin. Toy runs through the runner."""

from __future__ import annotations

import contextlib
import io

import numpy as np
import pytest
from helpers import toy

from cudt.metrics import feasibility


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("margin")
    plain = toy(["--seeds", "1", "--epsilon", "0.3"], root / "plain")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        margin = toy(["--seeds", "1", "--epsilon", "0.1", "--epsilon-margin", "0.2"], root / "m")
    return plain, margin, printed.getvalue()


def _constrained(results):
    return [r for r in results["runs"] if r["constrained"]]


def test_a_margin_trains_the_run_of_the_summed_epsilon(pair):
    plain, margin, _ = pair
    for p, m in zip(_constrained(plain), _constrained(margin), strict=True):
        assert m["train_objective"] == p["train_objective"]  # the same training, bit for bit
        assert m["layer_loss_val"] == p["layer_loss_val"]
        assert m["multipliers"] == p["multipliers"]
        assert m["curves"]["constraint"] == p["curves"]["constraint"]
        assert m["hparams"]["epsilon"] == 0.1 and m["trained_epsilon"] == pytest.approx(0.3)
        assert p["trained_epsilon"] is None


def test_the_verdict_is_at_epsilon_and_the_summary_says_so(pair):
    plain, margin, printed = pair
    tolerance = margin["config"]["tolerance"]
    for p, m in zip(_constrained(plain), _constrained(margin), strict=True):
        # (the runner judges at ε as float32, its value in the state)
        verdict = feasibility(np.asarray(m["layer_loss_val"]), 0.1, tolerance=tolerance)
        assert m["relative_violation_val"] == pytest.approx(verdict.relative_violation, abs=1e-7)
        assert m["feasible"] == verdict.feasible
        shift = np.subtract(p["relative_violation_val"], m["relative_violation_val"])[1:]
        np.testing.assert_allclose(shift, 0.2, atol=1e-7)  # ε 0.3 asks 0.2 more of each layer
    assert all(r["trained_epsilon"] is None for r in margin["runs"] if not r["constrained"])
    assert "--epsilon-margin 0.2: the constrained runs trained at epsilon + margin" in printed


def test_a_margin_over_an_epsilon_sweep_is_said_once(tmp_path):
    """ε + margin − ε differs in its last bits between ε: the note named "0.02, 0.02"."""
    printed = io.StringIO()
    argv = ["--seeds", "1", "--sweep", "epsilon=0.05,0.1,0.2", "--epsilon-margin", "0.02"]
    with contextlib.redirect_stdout(printed):
        results = toy(argv, tmp_path / "swept")
    trained = [r["trained_epsilon"] - r["hparams"]["epsilon"] for r in _constrained(results)]
    assert len(set(trained)) > 1  # the float sums this note reads
    (line,) = [x for x in printed.getvalue().splitlines() if "--epsilon-margin" in x]
    assert line.startswith("--epsilon-margin 0.02: the constrained runs trained at"), line
