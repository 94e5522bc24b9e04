"""The benchmark scripts still run against the library (tiniest sizes; no timing is asserted).

Speed is measured only by running the scripts in ``benchmarks/`` (see benchmarks/README.md);
these tests only keep them from rotting: each ``main`` completes and prints its ratio table.
"""

import importlib
import math
import re
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
    import torch  # the test extra installs it: a missing torch fails, never skips

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


def _ratios(out: str, prefix: str) -> dict[str, float]:
    """``ratio <what> = <number>`` lines starting with ``prefix``: {what: number} (all finite)."""
    found = {}
    for line in out.splitlines():
        if line.startswith(f"ratio {prefix}"):
            what, _, value = line[len("ratio ") :].rpartition(" = ")
            found[what] = float(value)
    assert found, f"no 'ratio {prefix}...' lines in the output"
    assert all(0 < v < float("inf") for v in found.values()), found
    return found


def _check_header(out: str, module: str) -> None:
    lines = out.splitlines()
    assert lines[0].startswith("command: ") and f"-m benchmarks.{module} --quick" in lines[0]
    assert lines[1].startswith("environment: jax ") and "default device " in lines[1]


def test_cooper_baseline_prints_ratios_and_equal_work(bench, capsys):
    bench("cooper_baseline").main(["--quick"])
    out = capsys.readouterr().out
    _check_header(out, "cooper_baseline")
    losses = _table(out, "model losses [B, L+1] max abs diff max rel to max loss")
    assert [r.split()[0] for r in losses] == ["UT-3", "DUST-3"]
    assert all(float(r.split()[2]) < 1e-6 for r in losses)  # same per-layer losses
    steps = _table(
        out,
        "model impl layer loss rel lagrangian rel multipliers abs grad rel cudt λ moved "
        "params max abs frac params > 0.0001 match",
    )
    assert len(steps) == 4 and all(r.split()[-1] == "yes" for r in steps)
    # the first step's gradient of the Lagrangian, torch against cudt (relative L2)
    assert all(0 <= float(r.split()[5]) < 1e-2 for r in steps)
    clip = _table(out, "model steps layer loss rel params max abs at the clip match")
    assert [r.split()[0] for r in clip] == ["UT-3"] and clip[0].split()[-1] == "yes"
    speed = _table(out, "model impl threads ms/step this / cudt Cooper / hand")
    # (cudt, Cooper, hand) x (1 thread, default) per model, and the UT's default clipping
    assert len(speed) == 2 * 6 + 2
    ratios = _ratios(out, "UT-3: ")
    assert "UT-3: torch + Cooper [torch threads 1] / cudt" in ratios
    assert "UT-3: torch + Cooper [torch threads 1] / cudt, default clip" in ratios
    assert "UT-3: torch + Cooper / torch hand-written [torch threads 1]" in ratios
    assert len(_ratios(out, "DUST-3: ")) == 6


def test_erm_vs_constrained_prints_ratios(bench, capsys):
    bench("erm_vs_constrained").main(["--quick"])
    out = capsys.readouterr().out
    _check_header(out, "erm_vs_constrained")
    rows = _table(out, "model step compile s ms/step this / ERM")
    assert [r.split()[:-3] for r in rows] == [
        ["UT-1", "plain", "ERM"],
        ["UT-1", "ERM"],
        ["UT-1", "constrained"],
        ["DUST-1", "plain", "ERM"],
        ["DUST-1", "ERM"],
        ["DUST-1", "constrained"],
    ]
    assert rows[1].split()[-1] == "1"
    assert set(_ratios(out, "")) == {
        f"{m}: constrained / {erm}" for m in ("UT-1", "DUST-1") for erm in ("ERM", "plain ERM")
    }
    assert "same work, UT-1: first step's objective mean ℓ_L max - min over the three = 0 " in out


def test_sweep_vmap_prints_ratios_and_equal_work(bench, capsys):
    # One model: every R compiles its two programs (~3 s each on 2 cores).
    bench("sweep_vmap").main(["--quick", "--models", "ut"])
    out = capsys.readouterr().out
    assert out.splitlines()[0].endswith("-m benchmarks.sweep_vmap --quick --models ut")
    checks = _table(
        out,
        "model R way params max abs diff frac params > 0.0001 λ max abs diff λ spread over runs",
    )
    ways = ["one program", "steps outside", "one program, vmap"]
    assert [(r.split()[1], " ".join(r.split()[2:-4])) for r in checks] == [
        (R, way) for R in ("1", "2") for way in ways
    ]
    # each program's run r == sequential run r: few parameters differ, the multipliers agree
    assert all(float(r.split()[-3]) < 0.01 and float(r.split()[-2]) < 1e-6 for r in checks)
    rows = _table(out, "model R way compile s ms/step ms/run-step this / one program")
    assert [(r.split()[1], " ".join(r.split()[2:-4])) for r in rows] == [
        (R, way) for R in ("1", "2") for way in [*ways, "sequential"]
    ]
    assert set(_ratios(out, "UT-1 ")) == {
        f"UT-1 R={r}: {way} / one program"
        for r in (1, 2)
        for way in ("sequential", "steps outside", "one program, vmap")
    }


def test_xla_options_reach_the_compiler_and_bad_ones_stop_with_one_line(bench, capsys):
    xla_options = bench("xla_options")
    xla_options.main(["--quick", "--models", "ut", "--options", "fast_math"])
    out = capsys.readouterr().out
    _check_header(out, "xla_options")
    rows = _table(out, "model options ms/step default / this params, λ max abs diff")
    assert [r.split()[:2] for r in rows] == [["UT-2", "default"], ["UT-2", "fast_math"]]
    assert rows[0].split()[-2:] == ["1", "0"]  # the reference, against itself
    # fast math reassociates and approximates: a program that got the option rounds otherwise
    # (an option jax.jit dropped would leave the programs, and the trained states, identical)
    assert float(rows[1].split()[-1]) > 0
    assert set(_ratios(out, "UT-2: ")) == {"UT-2: default / fast_math"}

    with pytest.raises(SystemExit) as exc:
        xla_options.parse_args(["--custom", "prefer_vector_width=512"])
    assert exc.value.code == 2
    assert "is not KEY=VALUE with an XLA option as KEY" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="option set 'custom' .* does not compile: .*not_a_width"):
        xla_options.main(
            ["--quick", "--models", "ut", "--options", "default"]
            + ["--custom", "xla_cpu_prefer_vector_width=not_a_width"]
        )


def test_flops_prints_rates_against_the_matmul(bench, capsys):
    bench("flops").main(["--quick"])
    out = capsys.readouterr().out
    _check_header(out, "flops")
    rows = _table(out, "program GFLOP as compiled GFLOP used ms/call GFLOP/s / matmul rate")
    assert [r.split()[0] for r in rows] == ["matmul", "UT-2", "DUST-2"]
    assert rows[0].split()[-1] == "1"
    for row in rows:
        assert float(row.split()[-5]) > 0  # GFLOP counted
    # XLA counts the layer scan's body once: unrolled, L = 2 layers count more FLOPs (the UT's
    # step is mostly its 26-matmul eigenvalue clipping, outside the scan: a small excess).
    assert _ratios(out, "UT-2: GFLOP unrolled")["UT-2: GFLOP unrolled / as compiled"] > 1.0
    assert _ratios(out, "DUST-2: GFLOP unrolled")["DUST-2: GFLOP unrolled / as compiled"] > 1.05
    assert set(_ratios(out, "")) == {
        "UT-2: achieved FLOP/s / matmul rate",
        "UT-2: GFLOP unrolled / as compiled",
        "DUST-2: achieved FLOP/s / matmul rate",
        "DUST-2: GFLOP unrolled / as compiled",
    }


def test_lm_loss_memory_prints_memory_ratios_and_equal_work(bench, capsys):
    bench("lm_loss_memory").main(["--quick"])
    out = capsys.readouterr().out
    _check_header(out, "lm_loss_memory")
    memory = _table(
        out,
        "V L+1 logits MiB naive MiB chunked MiB chunked+vocab MiB naive / chunked "
        "naive / chunked+vocab",
    )
    assert [r.split()[:2] for r in memory] == [["1024", "3"]]
    checks = _table(out, "way ce acc d states d head d scale")
    assert [r.split()[0] for r in checks] == ["chunked", "chunked+vocab"]
    assert all(float(v) < 1e-5 for r in checks for v in r.split()[1:])  # same values, gradients
    assert _table(out, "way ms/call this / naive")[0].split()[-1] == "1"
    ratios = _ratios(out, "V=1024 L+1=3: ")
    # compiled memory is deterministic: the chunks need less scratch than the full logits
    assert ratios["V=1024 L+1=3: naive / chunked temp memory"] > 1
    assert ratios["V=1024 L+1=3: naive / chunked+vocab temp memory"] > 1
    assert "V=1024 L+1=3: chunked / naive time" in ratios


def test_llm_memory_table_adds_up_and_matches_the_compiled_step(bench, capsys):
    # float32 only: each compile costs ~2 s on 2 cores whatever the size, and the mixed
    # precision path differs only in the compute dtype.
    bench("llm_memory").main(["--quick", "--precisions", "float32"])
    out = capsys.readouterr().out
    _check_header(out, "llm_memory")
    # the tiny decoder (L 6, D 32, F 64, V 512, 4 heads, 2 kv heads of 8), counted by hand:
    # per block 32·8·(4 + 2 + 2 + 4) + 3·32·64 + 2·32 = 9280; trained 6·9280 + 32 + 32·512
    # (blocks, final norm, LM head); the frozen embedding table 512·32
    assert "parameters: 88,480 (72,096 trained, 16,384 in the frozen embedding table)" in out
    states = _table(out, "shards params GB frozen GB grads GB Adam GB duals B multipliers B")
    assert [r.split()[0] for r in states] == ["4", "1"]
    assert all(r.split()[-1] == "28" for r in states)  # the [L+1] float32 multipliers
    four, one = ([float(v) for v in r.split()[1:5]] for r in states)
    assert one[0] == pytest.approx(72_096 * 4 / 1e9, rel=1e-3)  # trained params, float32
    assert one[3] == pytest.approx(2 * one[0], rel=1e-3)  # Adam's mu and nu
    assert one[1] == four[1]  # the frozen table stays whole on every device
    assert one[2] / 4 <= four[2] < one[2] / 3  # FSDP 4 splits all but the small leaves
    extrapolated = _ratios(out, "float32: extrapolated")
    assert 0.5 < extrapolated["float32: extrapolated from L=2,3 / compiled at L=6"] < 2
    # the table's accounting is the real jitted constrained step's compiled memory
    step = _ratios(out, "step peak")[
        "step peak / table total (params + frozen + grads + Adam + duals + activations)"
    ]
    assert step == pytest.approx(1.0, abs=0.01)
    rows = [
        line.split(" | ") for line in out.splitlines() if line.startswith("| ") and "B (+" in line
    ]
    assert [r[0].lstrip("| ") for r in rows] == ["4 x 80 GB, FSDP 4", "1 x H200 141 GB"]
    for row in rows:
        params, grads, adam, activations, total = (float(row[i]) for i in (2, 3, 4, 6, 7))
        assert total == pytest.approx(params + grads + adam + activations, rel=2e-3)
        assert row[8].startswith("yes")
        # block remat, compiled (Decoder(remat=True)): the attention and MLP intermediates of
        # every layer are no longer kept, only the blocks' inputs
        activations_rm, total_rm = float(row[9]), float(row[10])
        assert 0 < activations_rm < activations / 2
        assert total_rm == pytest.approx(params + grads + adam + activations_rm, rel=2e-3)


def test_linalg_step_prints_errors_and_ratios(bench, capsys):
    bench("linalg_step").main(["--quick"])
    out = capsys.readouterr().out
    _check_header(out, "linalg_step")
    acc = _table(out, "model quantity max error (relative for μ and the encoder)")
    assert len(acc) == 4 and all(float(r.split()[-1]) < 1e-4 for r in acc)
    assert set(_ratios(out, "")) == {
        "UT-2: Newton–Schulz / LAPACK",
        "UT-2: Lanczos (default) / LAPACK",
        "DUST-2: matmul only / LAPACK",
    }


def test_imported_step_runs_fresh_processes_without_changing_settings(bench, capsys):
    bench("imported_step").main(["--quick", "--models", "dust"])
    out = capsys.readouterr().out
    _check_header(out, "imported_step")
    assert "DUST-1: import cudt changed OPENBLAS_NUM_THREADS: False" in out
    rows = _table(out, "model process OPENBLAS_NUM_THREADS ms/step")
    assert [r.split()[1:3] for r in rows] == [["imported", "unset"], ["runner", "1"]]
    assert list(_ratios(out, "DUST-1")) == ["DUST-1: imported / runner"]


def test_gpu_suite_small_writes_its_markdown_table(bench, capsys, monkeypatch, tmp_path):
    suite = bench("gpu_suite")

    # one section fails (the LLM's: its table is checked through the same function in the
    # SmolLM2 test below): reported in its place, every other one still measured, exit 1
    def broken(args, data):
        raise RuntimeError("no cuSOLVER handle")

    monkeypatch.setitem(suite.SECTION_FUNCTIONS, "llm", broken)
    out_file = tmp_path / "suite.md"
    with pytest.raises(SystemExit, match=r"section\(s\) llm failed"):
        suite.main(["--small", "--out", str(out_file)])
    text = out_file.read_text()
    # in the suite's order: step, sweep, llm, clip, bf16
    order = ["## Constrained step", "## Sweep scaling", "## llm: failed", "## The UT's", "## bf16"]
    assert [text.index(h) for h in order] == sorted(text.index(h) for h in order)
    assert "## llm: failed\n\nRuntimeError: no cuSOLVER handle" in text
    captured = capsys.readouterr()
    assert "Traceback" in captured.err and "[section bf16:" in captured.out

    def table(heading: str) -> dict[str, list[str]]:
        """The rows of the table under the ``## heading...`` section, by first cell."""
        body = next(part for part in text.split("\n## ") if part.startswith(heading))
        rows = [line.strip("|").split(" | ") for line in body.splitlines() if line[:2] == "| "]
        return {cells[0].strip(): [c.strip() for c in cells] for cells in rows[1:]}

    steps = table("Constrained step")
    for model in ("UT-1", "DUST-1", "DUST-1-K576"):
        # cudt and torch + Cooper (on the CPU here), measured in the same repetitions
        _, cudt_ms, device, torch_ms, ratio = steps[model]
        assert device == "cpu" and ratio.endswith("x")
        assert math.isclose(float(ratio[:-1]), float(torch_ms) / float(cudt_ms), rel_tol=0.02)
    # bf16 against float32: the speed-up is the ratio of the two times, and bf16 moves the
    # layer losses further than the float32 control (a start 1e-6 away) does
    bf16 = table("bf16: every model product in bfloat16 against float32")
    assert sorted(bf16) == ["DUST-1", "UT-1"]
    for _, f32_ms, bf16_ms, speedup, low, control in bf16.values():
        assert math.isclose(float(speedup[:-1]), float(f32_ms) / float(bf16_ms), rel_tol=0.02)
        low_max, control_max = float(low.split(" / ")[0]), float(control.split(" / ")[0])
        assert low_max > 1e-4 and low_max > 10 * control_max
    sweep = table("Sweep scaling")
    assert sorted(sweep) == ["1", "2"] and sweep["1"][-1] == "1.00"
    # the UT step with each clipping method, single and vmapped, as ratios to the default's
    assert (
        "| ut_project method | ms/step | / default | ms/step, 2 runs vmapped | / default |" in text
    )
    clips = table("The UT's eigenvalue clipping")
    assert sorted(clips) == sorted(["matmul", "lanczos", "newton_schulz", "eigh"])
    for _, one, ratio_one, many, ratio_many in clips.values():
        assert min(float(one), float(many), float(ratio_one), float(ratio_many)) > 0
    assert clips["matmul"][2] == "1.00" and clips["matmul"][4] == "1.00"
    for method in ("lanczos", "eigh"):
        ratio = float(clips[method][1]) / float(clips["matmul"][1])
        assert math.isclose(float(clips[method][2]), ratio, rel_tol=0.02, abs_tol=0.006)
    assert f"wrote {out_file}" in captured.out


def test_gpu_suite_sections_are_checked_and_run_alone(bench, capsys, tmp_path):
    suite = bench("gpu_suite")
    with pytest.raises(SystemExit) as exc:
        suite.parse_args(["--sections", "sweep,nope"])
    assert exc.value.code == 2
    assert (
        "unknown section(s) nope: choose from step,sweep,llm,clip,bf16" in capsys.readouterr().err
    )
    # given in any order, measured in the suite's
    assert suite.parse_args(["--sections", "bf16, step"]).sections == ["step", "bf16"]


def test_smollm2_peer_tiny_agrees_with_torch_and_cooper_and_prints_its_table(bench, capsys):
    # --tiny: a random 2-block Llama written as GGUF, through the same script as SmolLM2, run
    # as the GPU suite's LLM section runs it (--small: B 2 x T 32, one round)
    suite = bench("gpu_suite")
    section = suite.llm_markdown(suite.parse_args(["--small"]), None)
    out = capsys.readouterr().out
    assert out.splitlines()[0].endswith(
        "-m benchmarks.smollm2_peer --batch 2 --seq 32 --rounds 1 --tiny"
    )
    # the readout's default chunking (this CPU's RAM, a 400-token vocabulary): one chunk
    assert re.search(
        r"states \(cudt: a window of \d+ positions per sample, \d+ readout rows in 1 "
        r"chunk, no rematerialisation\)",
        out,
    )
    # the suite's section: the same two rows as the script's table, with its heading
    assert section.startswith("## LLM step: tokens/s and MFU")
    table = [line for line in section.splitlines() if line.startswith("| ")]
    assert table[1:] == [
        line for line in out.splitlines() if line.startswith(("| cudt | ", "| torch + Cooper | "))
    ]
    checks = [
        line for line in out.splitlines() if line.startswith("| 1 |") or line.startswith("| 2 |")
    ]
    assert len(checks) == 8 and all(line.endswith("| yes |") for line in checks)
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith("| cudt | ")]
    rows += [
        line.split(" | ") for line in out.splitlines() if line.startswith("| torch + Cooper | ")
    ]
    assert [r[1:3] for r in rows] == [["cpu", "default"], ["cpu", "default"]]
    assert all(r[7] == "n/a" for r in rows)  # no GPU: no MFU
    assert rows[0][-1].endswith("x |") and rows[1][-1] == "1 |"
    assert all(float(r[5]) > 0 for r in rows)  # tokens/s
    ratio = next(line for line in out.splitlines() if line.startswith("ratio [threads default]"))
    assert ratio.startswith("ratio [threads default]: torch + Cooper / cudt s/step = ")
    speedup = float(ratio.rsplit(" ", 1)[1])
    assert math.isclose(
        float(rows[0][-1].removesuffix("x |")), speedup, rel_tol=2e-3, abs_tol=0.006
    )
    torch_s, cudt_s = float(rows[1][3]), float(rows[0][3])
    assert math.isclose(speedup, torch_s / cudt_s, rel_tol=0.02)


@pytest.mark.parametrize(
    "sabotage", [["--torch-epsilon", "0.2"], ["--torch-weight-noise", "1e-3"]], ids=["eps", "w"]
)
def test_smollm2_peer_check_fails_when_torch_takes_another_step(bench, capsys, sabotage):
    peer = bench("smollm2_peer")
    with pytest.raises(peer.PeerMismatch) as failed:
        peer.main(["--tiny", "--rounds", "1", *sabotage])
    assert isinstance(failed.value, SystemExit)  # exit status 1 from the command line
    assert "the torch side does not take cudt's step" in str(failed.value)
    out = capsys.readouterr().out
    assert "| NO |" in out and "| side |" not in out  # stopped before any timing
