"""benchmarks/general_step.py runs against the library and prints its ratio (no timing asserted)."""

import importlib
from pathlib import Path


def test_general_step_benchmark_prints_ratio(monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1]))
    out = importlib.import_module("benchmarks.general_step").main(["--quick"])
    text = capsys.readouterr().out
    assert "ratio general / make_train_step:" in text
    assert set(out["ms"]) == {"general", "make_train_step"} and out["ratio"] > 0
