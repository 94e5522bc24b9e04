"""The benchmark scripts still run against the library (tiniest sizes; no timing is asserted).

Speed is measured only by running the scripts in ``benchmarks/`` (see benchmarks/README.md);
these tests only keep them from rotting: each ``main`` completes and prints its ratio table.
"""

import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def bench(monkeypatch):
    """``bench(name)`` imports ``benchmarks.<name>`` (a folder of the repository, not installed)."""
    monkeypatch.syspath_prepend(str(ROOT))
    return lambda name: importlib.import_module(f"benchmarks.{name}")


def _table(out: str, header: str) -> list[str]:
    """The rows of the table printed with these column names (``print_table``'s layout)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split() == header.split())
    width = len(lines[start])
    assert lines[start + 1] == "-" * width
    rows = []
    for line in lines[start + 2 :]:
        if len(line) != width:  # every row is padded to the header's width
            break
        rows.append(line)
    assert rows, f"empty table {header!r}"
    return rows


def test_seeds_vmap_prints_its_speedup_table(bench, capsys):
    # Every train_group call compiles its program anew (~2 s of CPU each): skipping the
    # equal-work check (which trains both ways through the same methods as the timed runs)
    # halves the compilations.
    bench("seeds_vmap").main(
        "--runs 2 --layers 1 --batch-size 4 --chunk-steps 2 --timed-chunks 1 --repeats 1 "
        "--check-steps 0".split()
    )
    out = capsys.readouterr().out
    assert "LAPACK threads: " in out
    rows = _table(
        out,
        "way R/call calls first chunk s compile s jax compile s steady s ms/step(all R) "
        "run-steps/s speedup",
    )
    assert [r.split()[:3] for r in rows] == [["vmapped", "2", "1"], ["sequential", "1", "2"]]
    assert rows[1].split()[-1] == "1"  # the reference row
    assert "end to end: " in out
    assert "vmapped speedup (steady state): " in out


def test_scan_chunks_prints_its_speedup_table(bench, capsys):
    bench("scan_chunks").main(
        "--chunks 1,2 --steps 2 --layers 1 --batch-size 4 --repeats 1 --burn-in 0".split()
    )
    out = capsys.readouterr().out
    rows = _table(out, "alternative first chunk s ms/step run-steps/s speedup")
    assert [r.split()[0] for r in rows] == ["chunk_steps=1", "chunk_steps=2"]
    assert rows[0].split()[-1] == "1"


def test_torch_baseline_reports_torch_compile_unavailable(bench, capsys, monkeypatch):
    torch = pytest.importorskip("torch")

    def no_compile(*args, **kwargs):
        raise RuntimeError("no C++ compiler here\nsecond line")

    # The clean failure path, and fast: the real torch.compile takes ~20 s on 2 cores.
    monkeypatch.setattr(torch, "compile", no_compile)
    bench("torch_baseline").main("--batch-sizes 4 --layers 1 --steps 1 --repeats 1".split())
    out = capsys.readouterr().out
    checks = _table(
        out,
        "batch vs jax layer loss rel lagrangian rel multipliers abs params max abs "
        "frac params > 0.0002 match",
    )
    assert checks[0].split()[1:3] == ["torch", "eager"] and checks[0].split()[-1] == "yes"
    speed = _table(out, "batch impl ms/step / torch eager jax / this")
    assert [r.split()[1] for r in speed] == ["jax", "torch", "torch"]
    assert "torch compile  unavailable: RuntimeError: no C++ compiler here" in speed[2]
    assert "second line" not in out
