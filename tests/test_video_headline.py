"""The video default's headline at a small scale: constrained DUST-5 ends monotone and feasible on
held-out clips where the control ``dust-pl`` (ERM with the same per-layer dictionaries) does not.

A run of ``experiments.video_denoise`` with the default model and constraint settings on fewer,
shorter clips and fewer steps (the effect needs about 150 steps; 60 do not show it). If the
constraints were dropped, ignored or mis-signed, constrained DUST would train like the control
and this test would fail.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from experiments import video_denoise

SMALL = [
    "--models", "dust",
    "--num-videos", "10",
    "--num-frames", "16",
    "--steps", "150",
    "--chunk-steps", "50",
    "--seeds", "1",
]  # fmt: skip

# trains for minutes: XLA's optimisation passes pay for themselves here
pytestmark = pytest.mark.optimized


@pytest.fixture(scope="module")
def headline(tmp_path_factory):
    out = tmp_path_factory.mktemp("headline") / "run"
    assert video_denoise.main([*SMALL, "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    return {(r["model"], r["constrained"]): r for r in results["runs"]}


def _at_train_gamma(run) -> np.ndarray:
    return np.asarray(run["layer_loss"][run["test_gamma"].index(run["gamma_train"])])


@pytest.mark.slow
def test_constrained_dust_descends_at_every_layer_where_the_control_does_not(headline):
    constrained = _at_train_gamma(headline["dust", True])
    control = _at_train_gamma(headline["dust-pl", False])
    assert np.all(np.diff(constrained) < 0), constrained
    assert not np.all(np.diff(control) < 0), control
    assert headline["dust", True]["feasible"]
    assert not headline["dust-pl", False]["feasible"]
    assert max(headline["dust", True]["max_multipliers"]) > 0  # the constraints were active
