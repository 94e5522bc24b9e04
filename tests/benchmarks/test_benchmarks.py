"""``python -m benchmarks`` still runs against the library (tiniest sizes; no timing is asserted).

Speed is measured only by running the subcommands (benchmarks/README.md); these tests keep them
from rotting: each subcommand's main completes once at its tiniest sizes and prints its tables,
and the equal-work checks are shown to fail when the peer takes another step. Pieces that cost
a compilation (a setup, the LLM's cudt side, a sweep's result) are built once per module.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math
import os
import re

import jax
import numpy as np
import pytest
from helpers import assert_one_line_error

from benchmarks import __main__ as cli
from benchmarks import gpu, llm, memory, memory_llm, peer, step, sweep
from benchmarks.setting import (
    DYNAMICS,
    dynamics_config,
    video_config,
    video_setup,
)
from cudt.models.llama.lora import TARGETS
from cudt.tasks.video import VideoConfig


def _table(out: str, header: str) -> list[list[str]]:
    """The rows of the table printed with these column names (``print_table``'s layout), split
    on runs of two or more spaces."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split() == header.split())
    width = len(lines[start])
    assert lines[start + 1] == "-" * width
    rows = []
    for line in lines[start + 2 :]:
        cells = re.split(r"\s{2,}", line.strip())
        # every row is padded to the header's width and has columns; a sentence printed after
        # the table can happen to be as long (a ratio printed as "1": "ratio DUST-2 R=2: ...")
        if len(line) != width or len(cells) < 2:
            break
        rows.append(cells)
    assert rows, f"empty table {header!r}"
    return rows


def _check_header(out: str, subcommand: str, argv: str) -> None:
    lines = out.splitlines()
    assert lines[0].startswith("command: ")
    assert lines[0].endswith(f"-m benchmarks {subcommand} {argv}".rstrip()), lines[0]
    assert lines[1].startswith("environment: jax ")


# --------------------------------------------------------------------------------------------------
# The command line
# --------------------------------------------------------------------------------------------------


def test_main_lists_the_subcommands_and_refuses_others(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(f"  {name} " in out for name in cli.SUBCOMMANDS)
    assert cli.main(["stepp"]) == 2
    assert "unknown subcommand 'stepp'" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["step", "sweep", "memory", "llm", "gpu"])
def test_every_subcommand_has_help(name, capsys):
    try:
        code = cli.main([name, "--help"])
    except SystemExit as e:  # argparse's --help
        code = e.code
    assert code == 0
    out = capsys.readouterr().out
    assert f"python -m benchmarks {name}" in out


def test_fewer_threads_than_cores_run_in_a_child_started_on_that_many(tmp_path):
    """XLA sizes its thread pool for the cores a process starts with, so n threads are a child
    process started on n cores (benchmarks.common.on_cores), whose medians the parent merges."""
    from benchmarks.common import narrow_thread_counts, on_cores

    child = on_cores(1, ["-c", "import os; print(len(os.sched_getaffinity(0)), os.cpu_count())"])
    assert child.returncode == 0 and child.stdout.split()[0] == "1", child.stderr
    with pytest.raises(ValueError, match="num_cores"):
        on_cores(0, ["-c", "pass"])
    cores = len(os.sched_getaffinity(0))
    assert narrow_thread_counts([1, 0, cores]) == ([1] if cores > 1 else [])
    # the child's speed medians come back keyed as the parent's (here the quick sizes, whose
    # --quick asks for the child's default threads: one), for one model and one dynamics (the
    # child's step command is the one test_step_quick_prints_checks_ratios_and_the_flop_rate
    # runs in this process, there on the UT and both dynamics). The parent's own --json is the
    # parent's to write: the child does not get it (its check refuses a file that exists)
    parents = tmp_path / "parent.json"
    parents.write_text("[]")
    argv = ["--quick", "--no-flops", "--models", "dust", "--dynamics", "default"]
    ms = step.speed_on_cores([*argv, "--json", str(parents)], 1)
    assert parents.read_text() == "[]"
    assert {k[2] for k in ms} == {"cudt", "torch + Cooper"}
    assert {k[3] for k in ms} == {step.thread_label(0) if cores == 1 else "1 (default)"}
    assert all(v > 0 for v in ms.values())
    one = ("UT-2", "video default", "cudt", step.thread_label(1))
    two = ("UT-2", "video default", "cudt", step.thread_label(0))
    merged = step.merge_threads({1: {one: 2.0}, 0: {two: 1.0}}, [1, 0])
    assert list(merged) == [one, two]


@pytest.mark.parametrize(
    "argv, words",
    [
        (["stepp"], "unknown subcommand 'stepp': choose from step, sweep, memory, llm, gpu"),
        # nothing to measure: a failed command (it printed the usage and exited 0)
        ([], "no subcommand: python -m benchmarks {step,sweep,memory,llm,gpu} [flags]"),
        (["step", "--steps", "0"], "argument --steps: must be a whole number >= 1, got '0'"),
        (["step", "--repeats", "0"], "argument --repeats: must be a whole number >= 1"),
        (["step", "--batch-size", "0"], "argument --batch-size: must be a whole number >= 1"),
        (["step", "--torch-threads", "1,-1"], "comma-separated whole numbers >= 0, got '1,-1'"),
        (["step", "--quick", "--json", "NOWHERE/x.json"], "the folder NOWHERE does not exist"),
        (["sweep", "--runs", "0"], "argument --runs: expected comma-separated whole numbers >= 1"),
        (["sweep", "--chunk-steps", "0"], "argument --chunk-steps: must be a whole number >= 1"),
        # a job of -5 steps printed an end-to-end ratio after the timing
        (["sweep", "--quick", "--job-steps", "-5"], "argument --job-steps: must be a whole number"),
        (["memory", "lm-loss", "--vocab", "0"], "argument --vocab: expected comma-separated"),
        (["memory", "llm", "--gpu-gb", "nan"], "argument --gpu-gb: must be a finite number > 0"),
        (["llm", "--lora-ranks", "8,0"], "argument --lora-ranks: expected comma-separated"),
        (["llm", "--checkpoint", "NOWHERE/m.gguf"], "GGUF file NOWHERE/m.gguf does not exist"),
        # --tiny measured its own random Llama and ignored the checkpoint
        (["llm", "--tiny", "--checkpoint", "m.gguf"], "so --checkpoint m.gguf would be ignored"),
        # --small handed llm --tiny, which measured its random Llama and dropped the checkpoint
        (["gpu", "--small", "--llm-checkpoint", "m.gguf"], "--llm-checkpoint m.gguf would be"),
        (["gpu", "--out", "NOWHERE/gpu.md"], "argument --out: the folder NOWHERE does not exist"),
        (["gpu", "--out", "."], "argument --out: . is a folder: pass a file path"),
    ],
)
def test_bad_flags_are_one_line_and_exit_2_before_anything_is_measured(
    argv, words, capsys, tmp_path, monkeypatch
):
    """A size of 0 or a negative thread count was a traceback (some after 20 s of measuring),
    an output file in a missing folder lost the whole measurement at the end, a missing
    checkpoint ended in a traceback: each is now one line, exit 2, and nothing printed on
    stdout but the environment a subcommand reports before it loads a file. In an empty
    folder: a gpu.md left in the working folder would be refused first."""
    monkeypatch.chdir(tmp_path)
    assert_one_line_error(cli.main, argv, capsys, words)


def test_llm_lora_ranks_above_a_projection_name_the_benchmarks_own_flags(capsys):
    """A rank the tiny Llama's projections cannot take was the task's refusal passed through,
    naming --lora-rank and --checkpoint of a temporary file: flags this command does not have.
    It names --lora-ranks and --tiny, before any LoRA side is built."""
    err = assert_one_line_error(
        cli.main,
        ["llm", "--tiny", "--lora-ranks", "4,32"],
        capsys,
        "--lora-ranks 4,32: rank 32 exceeds the k projection of --tiny's random Llama (16 x 8)",
        "pass --lora-ranks of 8 or less",
    )
    assert "--lora-rank " not in err and "--checkpoint" not in err and "tiny.gguf" not in err


@pytest.mark.parametrize("parse, flag", [(gpu.parse_args, "--out"), (step.parse_args, "--json")])
def test_an_output_file_that_exists_is_refused_and_kept(parse, flag, tmp_path, capsys):
    """A second ``gpu`` run on the default gpu.md replaced the first one's figures at its end
    (the flags alone are parsed here: without the check, the subcommand would measure)."""
    earlier = tmp_path / "gpu.md"
    earlier.write_text("an earlier measurement\n")
    words = f"{earlier} exists (an earlier measurement): pass another path, or move that file"
    assert_one_line_error(parse, [flag, str(earlier)], capsys, f"argument {flag}: ", words)
    assert earlier.read_text() == "an earlier measurement\n"


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="/proc: a folder that takes no file")
@pytest.mark.parametrize(
    "parse, flag",
    [(gpu.parse_args, "--out"), (step.parse_args, "--json"), (llm.parse_args, "--json")],
)
def test_an_output_file_in_a_folder_that_takes_no_file_is_refused(parse, flag, capsys):
    """A --json in a folder that exists but takes no file (/proc; a read-only one) failed when
    written, after the timing (20 s of llm --tiny, minutes at its sizes)."""
    words = "cannot write in the folder /proc"
    assert_one_line_error(
        parse, [flag, "/proc/cudt-bench.json"], capsys, f"argument {flag}: ", words
    )


def test_a_profile_folder_that_cannot_be_written_is_refused(tmp_path, capsys):
    """llm --profile under a file failed in the profiler's export, after the timed rounds."""
    afile = tmp_path / "afile"
    afile.write_text("not a folder\n")
    for path, words in (
        (afile / "trace", f"{afile} is a file, so no folder can be made under it"),
        (afile, f"{afile} is a file: pass a folder"),
    ):
        argv = ["--tiny", "--profile", str(path)]
        assert_one_line_error(llm.parse_args, argv, capsys, "argument --profile: ", words)
    assert afile.read_text() == "not a folder\n"
    if os.path.isdir("/proc"):
        argv = ["--tiny", "--profile", "/proc/cudt-trace"]
        assert_one_line_error(llm.parse_args, argv, capsys, "cannot write in the folder /proc")
    new = tmp_path / "new" / "trace"  # made by the profiler: its parents need not exist
    assert llm.parse_args(["--tiny", "--profile", str(new)]).profile == new
    assert sorted(tmp_path.iterdir()) == [afile]  # the checks wrote nothing


def test_memory_refuses_flags_without_a_section(capsys):
    assert memory.main(["--vocab", "8"]) == 2
    assert "takes a section (lm-loss or llm)" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------------
# The setting: the main job's config, through the runner's wiring
# --------------------------------------------------------------------------------------------------


def test_the_setting_is_the_main_jobs_config_and_the_paper_dynamics_the_shared_defaults():
    from cudt.runner.config import RunConfig
    from cudt.tasks.video import VideoConfig

    main_job, cfg = VideoConfig(), video_config()
    changed = {
        f.name for f in dataclasses.fields(cfg) if getattr(cfg, f.name) != getattr(main_job, f.name)
    }
    # one constrained run, duals on from step 1, one ε (the step's cost does not depend on it)
    assert changed <= {"kinds", "seeds", "warmup_steps", "tune_epsilon", "tune_dual_lr", "tune_lr"}
    assert (cfg.dual_optimizer, cfg.update) == (main_job.dual_optimizer, main_job.update)
    assert cfg.dual_scale == main_job.dual_scale == "relative"
    paper = dynamics_config(cfg, "paper")
    shared = RunConfig()
    for name in DYNAMICS["paper"]:
        assert getattr(paper, name) == getattr(shared, name)
    assert (paper.update, paper.dual_optimizer) == ("simultaneous", "adam")


@pytest.fixture(scope="module")
def ut_default():
    """The quick UT setup of the video default's dynamics (its step compiled once here)."""
    return video_setup(video_config(quick=True, batch_size=4), "ut")


@pytest.mark.slow
def test_cooper_as_released_fails_the_nupi_check_and_the_fixed_one_passes(ut_default, monkeypatch):
    # cooper-org/cooper issue 107: the released nuPI stores ξ_0 = 0 after its first step, so
    # its second step's K_P term differs; the check compares the first steps' multipliers
    good = step.check_equal_work(ut_default, "video default", 3, 0.5)
    assert good["ok"] and [r[-1] for r in good["rows"]] == ["yes", "yes", "yes"]
    assert good["rows"][0][5] > 0  # λ moved at step 1: the dual step is exercised
    import cooper

    monkeypatch.setattr(peer, "NuPI", cooper.optim.nuPI)
    bad = step.check_equal_work(ut_default, "video default", 2, 0.5)
    assert not bad["ok"] and [r[-1] for r in bad["rows"]] == ["yes", "NO"]  # at step 2


def test_the_check_fails_when_the_peer_takes_another_update_order(ut_default, monkeypatch):
    # the peer given simultaneous updates while cudt alternates: both take the first dual step
    # at θ_0, and Adam's first primal step is about lr·sign(gradient) whichever λ weighs it, so
    # the orders part at step 3 (measured: λ 9 % apart, 1.5e-4 when both alternate)
    original = peer.cooper_optimizer
    monkeypatch.setattr(
        peer,
        "cooper_optimizer",
        lambda cfg, *a, **k: original(dataclasses.replace(cfg, update="simultaneous"), *a, **k),
    )
    bad = step.check_equal_work(ut_default, "video default", 3, 0.5)
    assert not bad["ok"] and [r[-1] for r in bad["rows"]] == ["yes", "yes", "NO"]


def test_the_check_fails_when_the_peer_takes_another_primal_step_under_adam_duals(monkeypatch):
    """The paper's dynamics (Adam duals): a dual step is about lr·sign(g), so the multipliers
    hardly see the primal step; a peer at twice cudt's primal learning rate passed a check of
    the multipliers alone after step 1. Its layer losses tell it."""
    from benchmarks.setting import dynamics_config

    setup = video_setup(dynamics_config(video_config(quick=True, batch_size=4), "paper"), "ut")
    assert step.check_equal_work(setup, "paper", 3, 0.5)["ok"]
    original = peer.cooper_optimizer
    monkeypatch.setattr(
        peer,
        "cooper_optimizer",
        lambda cfg, cmp, params, lr, **k: original(cfg, cmp, params, 2 * lr, **k),
    )
    bad = step.check_equal_work(setup, "paper", 2, 0.5)  # λ 0.5 % apart at step 2, losses 6 %
    assert not bad["ok"] and [r[-1] for r in bad["rows"]] == ["yes", "NO"], bad["rows"]


@pytest.mark.parametrize("attention", ["dot", "distance"])
def test_the_pytorch_ut_computes_the_same_states_for_either_attention(attention):
    import torch

    from cudt.models import UT

    model = UT(num_layers=3, dim=8, a=0.5, b=1.0, tying="attention", skip=True, attention=attention)
    x = jax.random.uniform(jax.random.PRNGKey(0), (2, 5, 8))
    params = model.init(jax.random.PRNGKey(1), x)
    # a random attention matrix, so the key-norm term of the distance kernel is not negligible
    params["params"]["attn"] = jax.random.normal(jax.random.PRNGKey(2), (8, 8))
    _, states = model.apply(params, x)
    mirror = peer.TorchUT(params, 3, a=0.5, b=1.0, skip=True, attention=attention)
    with torch.no_grad():
        theirs = mirror(torch.tensor(np.asarray(x))).numpy()
    np.testing.assert_allclose(theirs, np.asarray(states), rtol=1e-4, atol=1e-5)
    other = model.clone(attention="dot" if attention == "distance" else "distance")
    assert not np.allclose(np.asarray(other.apply(params, x)[1]), theirs, atol=1e-3)


@pytest.mark.slow
def test_dust_takes_the_same_step_as_its_pytorch_mirror():
    setup = video_setup(video_config(quick=True, batch_size=4), "dust")
    check = step.check_equal_work(setup, "video default", 3, 0.5)
    assert check["ok"], check["rows"]
    assert setup.name == "DUST-2" and setup.module.per_layer_dictionary  # the paper's DUST


# --------------------------------------------------------------------------------------------------
# The subcommands, once each at their tiniest
# --------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_step_quick_prints_checks_ratios_and_the_flop_rate(capsys):
    argv = "--quick --models ut"
    assert step.main(argv.split()) == 0
    out = capsys.readouterr().out
    _check_header(out, "step", argv)
    checks = _table(out, "model dynamics step layer loss rel λ rel largest λ match")
    assert [r[:3] for r in checks] == [
        ["UT-2", dynamics, str(i)] for dynamics in ("video default", "paper") for i in (1, 2, 3)
    ]
    assert all(r[-1] == "yes" for r in checks)
    speed = _table(out, "model dynamics threads cudt ms torch + Cooper ms torch / cudt")
    assert [r[:2] for r in speed] == [["UT-2", "video default"], ["UT-2", "paper"]]
    for r in speed:
        assert math.isclose(float(r[5]), float(r[4]) / float(r[3]), rel_tol=2e-3)
        assert f"ratio UT-2 [{r[1]}, threads {r[2]}]: torch + Cooper / cudt = " in out
    flops = _table(out, "program GFLOP as compiled GFLOP used ms/call GFLOP/s / matmul rate")
    assert [r[0] for r in flops] == ["256² matmul", "UT-2"]
    assert float(flops[1][2]) > 0 and "ratio UT-2: achieved FLOP/s / matmul rate = " in out
    # the bound: torch / (the step's FLOPs as products alone), next to the measured ratio
    (bound,) = _table(out, "model threads floor ms torch + Cooper ms bound torch / cudt")
    assert bound[:2] == ["UT-2", speed[0][2]] and float(bound[2]) > 0
    assert bound[3] == speed[0][4]  # the same torch timing as the speed table's
    assert math.isclose(float(bound[4]), float(bound[3]) / float(bound[2]), rel_tol=2e-3)
    assert f"ratio UT-2 [threads {bound[1]}]: bound torch / floor = " in out
    # the video default's dual rate, as the runner trains it
    rate = VideoConfig().dual_lr
    assert f"nupi duals (lr {rate:g}, K_P 5, K_I 1, EMA 0), alternating updates" in out
    assert "adam duals (lr 0.05), simultaneous updates" in out


@pytest.fixture(scope="module")
def sweep_result(tmp_path_factory):
    """``sweep --quick --models dust``'s output and measured result (run once; DUST's chunk
    compiles in half the UT's time)."""
    import contextlib
    import io

    results = []
    original = sweep.measure

    def keep(args):
        results.append(original(args))
        return results[-1]

    buffer = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(buffer):
        mp.setattr(sweep, "measure", keep)
        assert sweep.main(["--quick", "--models", "dust"]) == 0
    return buffer.getvalue(), results[0]


@pytest.mark.slow
def test_sweep_quick_prints_ratios_and_runs_that_match_the_run_alone(sweep_result):
    out, result = sweep_result
    _check_header(out, "sweep", "--quick --models dust")
    checks = _table(out, "model R params max abs diff")
    # a CPU: the runs take turns, each equal to the run alone. Bit for bit as the benchmark
    # compiles (its recorded runs print 0, docs/speed.md); the suite turns XLA's optimisation
    # passes off (conftest), where the R = 2 and R = 1 programs may round apart (4.7e-7 here)
    assert [row[:2] for row in checks] == [["DUST-2", "1"], ["DUST-2", "2"]]
    assert checks[0][2] == "reference" and float(checks[1][2]) < 1e-5  # R = 1: the run alone
    rows = _table(
        out,
        "model R first chunk s ms/step (all R) ms/run-step per run-step end to end",
    )
    assert [r[:2] for r in rows] == [["DUST-2", "1"], ["DUST-2", "2"]]
    assert rows[0][5] == "1" and rows[0][6] == "1"  # R = 1 is the reference
    ratio = result["speedup"][("DUST-2", 2)]
    assert f"ratio DUST-2 R=2: one after another / one program = {ratio:.3g} per run-step" in out


@pytest.mark.slow
def test_memory_lm_loss_quick_prints_ratios_and_equal_work(capsys):
    assert memory.main(["lm-loss", "--quick"]) == 0
    out = capsys.readouterr().out
    _check_header(out, "memory", "lm-loss --quick")
    rows = _table(
        out,
        "V L+1 logits MiB naive MiB chunked MiB chunked+vocab MiB naive / chunked "
        "naive / chunked+vocab",
    )
    assert [r[:2] for r in rows] == [["1024", "3"]]
    checks = _table(out, "way ce acc d states d head d scale")
    assert [r[0] for r in checks] == ["chunked", "chunked+vocab"]
    assert all(float(v) < 1e-4 for r in checks for v in r[1:])
    assert "ratio V=1024 L+1=3: naive / chunked temp memory = " in out


def test_a_plan_over_jaxs_default_share_of_the_device_names_the_fraction_it_needs():
    """JAX takes 75 % of a GPU unless told otherwise: 139 GB of a 141 GB H200 was "yes (99%)",
    an out-of-memory error at the defaults (found by review)."""
    assert memory_llm.fits(100e9, 141e9) == "yes (71%)"
    assert memory_llm.fits(139e9, 141e9) == "with XLA_PYTHON_CLIENT_MEM_FRACTION=0.99 (99%)"
    assert memory_llm.fits(128.8e9, 141e9) == "with XLA_PYTHON_CLIENT_MEM_FRACTION=0.92 (91%)"
    assert memory_llm.fits(150e9, 141e9) == "no (106%)"


@pytest.fixture(scope="module")
def memory_llm_quick():
    """``memory llm --quick`` in mixed precision with LoRA rank 2 rows, run once: its output."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        argv = ["llm", "--quick", "--precisions", "mixed", "--lora-rank", "2"]
        assert memory.main(argv) == 0
    return buffer.getvalue()


def _memory_rows(out: str, setup: str) -> list[list[str]]:
    """The markdown table's rows of this setup, split into cells."""
    return [line.split(" | ") for line in out.splitlines() if line.startswith(f"| {setup} | ")]


def _adds_up(row: list[str]) -> float:
    """A row's total, checked to be params + grads + Adam + activations (the table's GB)."""
    params, grads, adam, activations, total = (float(row[i].rstrip("†")) for i in (2, 3, 4, 6, 7))
    assert math.isclose(params + grads + adam + activations, total, rel_tol=1e-2)
    return total


@pytest.mark.slow
def test_memory_llm_quick_table_adds_up_and_matches_the_compiled_step(memory_llm_quick):
    out = memory_llm_quick
    # the real jitted step's arguments + scratch + outputs against the table's total
    ratio = float(re.search(r"ratio step peak / table total .* = ([\d.]+)", out).group(1))
    assert 0.9 < ratio < 1.1
    table = _memory_rows(out, "1 x H200 141 GB")
    assert len(table) == 1  # one precision
    _adds_up(table[0])


@pytest.mark.slow
def test_memory_llm_quick_lora_state_is_the_adapters_and_their_moments(memory_llm_quick):
    out = memory_llm_quick
    config = memory_llm.tiny_config(6)  # --quick's decoder
    blocks = config.param_shapes()["blocks"]
    # A [L, in, 2] and B [L, 2, out] float32 on every projection, from the shapes alone
    adapters = sum(
        4 * layers * 2 * (n_in + n_out)
        for layers, n_in, n_out in (blocks[t]["kernel"] for t in TARGETS)
    )
    base = sum(math.prod(s) for s in jax.tree.leaves(config.param_shapes(), is_leaf=_is_shape))
    rows = _table(out, "rank base adapters B frozen base B grads B Adam B duals B")
    assert [r[:2] for r in rows] == [["2", "float32"], ["2", "bfloat16"]]
    for r, itemsize in zip(rows, (4, 2), strict=True):
        assert int(r[2]) == adapters and int(r[4]) == adapters  # the adapters and their grads
        assert int(r[3]) == itemsize * base  # the whole frozen base in its dtype
        # Adam: mu and nu of the adapters, plus a few scalars (its count, injected hyperparameters)
        assert 0 < int(r[5]) - 2 * adapters <= 64
    ratio = float(re.search(r"ratio LoRA step peak / table total .* = ([\d.]+)", out).group(1))
    assert 0.9 < ratio < 1.1
    full = _memory_rows(out, "1 x H200 141 GB")[0]
    lora = _memory_rows(out, "1 x H200 141 GB, LoRA r 2")
    assert [r[1] for r in lora] == ["mixed", "mixed, bf16 base"]
    full_state = sum(float(full[i]) for i in (2, 3, 4))
    for r in lora:
        _adds_up(r)
        assert sum(float(r[i]) for i in (2, 3, 4)) < 0.5 * full_state
    # the base in bfloat16: its bytes halve, the adapters' state stays
    assert math.isclose(float(lora[1][2]), (adapters + 2 * base) / 1e9, rel_tol=1e-3)
    assert math.isclose(float(lora[0][2]), (adapters + 4 * base) / 1e9, rel_tol=1e-3)


def _is_shape(x) -> bool:
    return isinstance(x, tuple) and all(isinstance(d, int) for d in x)


# --------------------------------------------------------------------------------------------------
# The LLM: one tiny cudt side, shared
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_llm(tmp_path_factory):
    """The tiny Llama's cudt side (compiled by its first step) and its initial state."""
    folder = tmp_path_factory.mktemp("tiny_llm")
    side = llm.build_cudt(llm.write_tiny_gguf(folder), 2, 32)
    initial = jax.tree.map(np.asarray, side.state)
    return side, initial, folder


def _fresh(tiny_llm):
    side, initial, folder = tiny_llm
    return dataclasses.replace(side, state=jax.tree.map(jax.numpy.asarray, initial)), folder


@pytest.mark.slow
def test_llm_tiny_agrees_with_transformers_and_cooper_and_prints_its_table(capsys, tmp_path):
    """Also one thread, which on a machine of more cores is timed in a child process started on
    one core (benchmarks.common.measure_on_cores), without tracing it again."""
    argv = (
        f"--tiny --batch 2 --seq 32 --rounds 1 --torch-threads 0,1 --profile {tmp_path / 'trace'}"
    )
    assert llm.main(argv.split()) == 0
    out = capsys.readouterr().out
    narrow = len(os.sched_getaffinity(0)) > 1
    assert ("1 thread(s): a child process started on 1 core(s)" in out) == narrow
    _check_header(out, "llm", argv)
    assert "sgd duals lr 0.1, simultaneous updates" in out  # LLMConfig's dynamics
    # exactly the response tokens, in buckets
    assert re.search(
        r"exactly the response tokens: \d+ readout rows in \d+ buckets? of \d+ \(\d+ padding "
        r"rows\), logits (kept for|recomputed in) the backward",
        out,
    )
    checks = [line for line in out.splitlines() if re.match(r"\| [123] \| ", line)]
    assert len(checks) == 11 and all(line.endswith("| yes |") for line in checks)
    assert sum(" | update | " in line for line in checks) == 2  # steps 2 and 3
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith("| cudt | ")]
    rows += [line.split(" | ") for line in out.splitlines() if line.startswith("| torch + ")]
    assert [r[1:3] for r in rows] == [["cpu", t] for _ in range(2) for t in ("default", "1")]
    assert all(r[7] == "n/a" for r in rows)  # no GPU: no MFU
    for i, label in enumerate(("default", "1")):
        ratio = re.search(rf"ratio \[threads {label}\]: .* s/step = ([\d.e+]+)", out).group(1)
        assert math.isclose(float(ratio), float(rows[2 + i][3]) / float(rows[i][3]), rel_tol=0.02)
        assert re.search(rf"^tiny Llama +{label} +[\d.]+ +[\d.]+", out, re.M)  # its bound
    # --profile: every part of the step found by its scope, its products among its thunks
    assert list((tmp_path / "trace").glob("**/perfetto_trace.json.gz"))
    parts = dict(
        re.findall(r"^\| ((?:blocks|readout) (?:forward|backward)) \| (\d+) \|", out, re.M)
    )
    assert sorted(parts) == sorted(
        f"{s} {d}" for s in ("blocks", "readout") for d in ("forward", "backward")
    )
    assert all(int(n) > 0 for n in parts.values()), parts
    assert re.search(r"^\| the rest \(optimisers, losses, noise\) \| [1-9]", out, re.M)


def _without_multipliers_in_the_primal_step(torch_side) -> None:
    """The torch side's constraints detached: its multipliers move as cudt's, its primal step
    leaves them out (what the losses alone could not see: the updates must)."""
    import cooper

    real = torch_side.cmp.compute_cmp_state

    def detached(**kwargs):
        state = real(**kwargs)
        observed = {
            c: cooper.ConstraintState(
                violation=v.violation.detach(),
                strict_violation=None if v.strict_violation is None else v.strict_violation,
            )
            for c, v in state.observed_constraints.items()
        }
        return cooper.CMPState(loss=state.loss, observed_constraints=observed, misc=state.misc)

    torch_side.cmp.compute_cmp_state = detached


@pytest.mark.slow
@pytest.mark.parametrize(
    "sabotage",
    [dict(epsilon=0.2), dict(weight_noise=1e-3), dict(primal_without_multipliers=True)],
    ids=["eps", "w", "lambda"],
)
def test_llm_check_fails_when_torch_takes_another_step(tiny_llm, capsys, sabotage):
    side, folder = _fresh(tiny_llm)
    model = llm.load_hf_model(side, folder / "hf", sabotage.get("weight_noise", 0.0))
    import torch

    torch_side = llm.TorchSide(
        model, side, sabotage.get("epsilon", side.cfg.epsilon), torch.device("cpu")
    )
    if sabotage.get("primal_without_multipliers"):
        _without_multipliers_in_the_primal_step(torch_side)
    with pytest.raises(llm.PeerMismatch) as failed:
        llm.check_agreement(side, torch_side, 1e-4)
    assert isinstance(failed.value, SystemExit)  # exit status 1 from the command line
    assert "the torch side does not take cudt's step" in str(failed.value)
    assert "| NO |" in capsys.readouterr().out
    if sabotage.get("primal_without_multipliers"):  # seen by the updates alone
        assert "update" in str(failed.value) and "layer_loss" not in str(failed.value)


# --------------------------------------------------------------------------------------------------
# gpu: the same functions, Markdown out, a failing section isolated
# --------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_gpu_writes_the_sections_it_measured_and_isolates_a_failing_one(
    sweep_result, monkeypatch, tmp_path, capsys
):
    _, result = sweep_result
    monkeypatch.setattr(sweep, "measure", lambda args: result)  # the real quick sweep, reused

    out_file = tmp_path / "gpu.md"

    def broken(args):  # the llm section's agreement check fails: a SystemExit, caught too
        assert "## Sweep" in out_file.read_text()  # what was measured is on disk already
        raise llm.PeerMismatch("the torch side does not take cudt's step")

    monkeypatch.setattr(llm, "measure", broken)
    code = gpu.main(["--small", "--sections", "llm,sweep", "--out", str(out_file)])
    assert code == 1
    text = out_file.read_text()
    assert text.index("## Sweep") < text.index("## llm: failed")  # the suite's order
    assert "PeerMismatch: the torch side does not take cudt's step" in text
    rows = [line for line in text.splitlines() if line.startswith("| DUST-2 | ")]
    assert len(rows) == 4  # the sweep's table and its equal-work table, R = 1 and 2
    assert "section(s) llm failed" in capsys.readouterr().out


def test_gpu_hands_its_sweep_flags_to_the_sweep(sweep_result, monkeypatch, tmp_path):
    """`--runs` and `--sweep-repeats` reach `benchmarks sweep` (a lease of minutes could not
    wait for three compiling calls at R = 64)."""
    _, result = sweep_result
    seen = []
    monkeypatch.setattr(sweep, "measure", lambda args: seen.append(args) or result)
    argv = ["--sections", "sweep", "--runs", "1,4", "--sweep-repeats", "1"]
    assert gpu.main([*argv, "--out", str(tmp_path / "gpu.md")]) == 0
    assert seen[0].runs == [1, 4] and seen[0].repeats == 1
