"""The jitted cudt constrained step vs the same step hand-written in PyTorch (eager, torch.compile).

Run from the repository root:

    .venv/bin/python -m benchmarks.torch_baseline        # defaults: batch 16 and 64; ~2-3 min

One training step of a constrained UT denoiser (L = 3 tied layers, dim 256, on synthetic
16x16-patch video sequences [B, T, 256]): noise x̃ = x + γ·σ·n, forward through every layer,
per-layer MSE to the clean patches, Lagrangian mean ℓ_L + Σ λ_l g_l with
g_l = mean ℓ_l − (1−ε)·mean ℓ_{l−1}, primal Adam, projected dual ascent λ ← max(0, λ + η·g),
then the UT's eigenvalue clipping of W̃_f. Three implementations:

* ``jax``: ``cudt.make_train_step`` (jitted, state donated) with ``cudt.models.UT``, the
  experiment's layer losses and ``cudt.models.ut_project``;
* ``torch eager``: the same math written by hand in PyTorch (``torch.optim.Adam``,
  ``torch.linalg.eigh``), starting from the same weights (copied from JAX);
* ``torch compile``: the same, with the forward + Lagrangian under ``torch.compile`` (the
  optimiser and projection stay eager); reported as "unavailable: <reason>" if it cannot
  compile here.

Before timing, two steps of each are run on the same batch and the same noise and compared
(layer losses, Lagrangian, multipliers, parameters), so the timings are of equal work. Then the
alternatives are interleaved over ``--repeats`` repetitions of ``--steps`` steps each, and the
median ms/step and the ratios JAX/torch are printed for each batch size. PyTorch runs with
``torch.set_num_threads(<CPU cores>)`` (``--torch-threads`` changes it); the eigendecomposition
of the clipping runs with ``--lapack-threads`` threads on both sides (default 1, see
``benchmarks/_common.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch

from benchmarks._common import (
    add_lapack_threads_flag,
    command_line,
    copy_tree,
    environment,
    lapack_threads,
    make_ut_setup,
    print_table,
    time_alternatives,
    video_data,
)
from cudt.data.video import perturb


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--batch-sizes",
        type=lambda s: [int(b) for b in s.split(",")],
        default=[16, 64],
        help="comma-separated batch sizes (default 16,64)",
    )
    p.add_argument("--layers", type=int, default=3, help="UT layers L (default 3)")
    p.add_argument("--seq-len", type=int, default=8, help="frames per sequence T (default 8)")
    p.add_argument("--steps", type=int, default=10, help="steps per timed block (default 10)")
    p.add_argument("--repeats", type=int, default=5, help="interleaved repetitions (default 5)")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile variant")
    p.add_argument(
        "--torch-threads",
        type=int,
        default=0,
        help="torch.set_num_threads for PyTorch's own ops; 0: one per CPU core (default 0)",
    )
    add_lapack_threads_flag(p)
    return p.parse_args(argv)


# Hyper-parameters shared by both implementations.
GAMMA, LR, DUAL_LR, EPSILON, CLIP = 0.5, 2e-3, 1e-2, 0.1, 0.95


@contextlib.contextmanager
def torch_threads(num_threads: int):
    """Runs the block with ``num_threads`` PyTorch (OpenMP and MKL) threads; 0 changes nothing."""
    if num_threads <= 0:
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


class TorchUT(torch.nn.Module):
    """cudt.models.UT (a = b = 1) in PyTorch; ``forward`` returns the states [L+1, B, T, D]."""

    def __init__(
        self, params: dict, num_layers: int, a: float = 1.0, b: float = 1.0, eigh_threads=0
    ):
        super().__init__()
        p = params["params"]
        self.attn = torch.nn.Parameter(torch.tensor(np.asarray(p["attn"])))  # W̃
        self.ffn = torch.nn.Parameter(torch.tensor(np.asarray(p["ffn"])))  # W̃_f
        self.bias = torch.nn.Parameter(torch.tensor(np.asarray(p["bias"])))  # B
        self.num_layers, self.a, self.b = num_layers, a, b
        self.eigh_threads = eigh_threads  # threads of the eigh in ``project`` (0: all)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w_attn = self.attn.T @ self.attn  # W = W̃ᵀW̃
        eye = torch.eye(self.ffn.shape[0], dtype=x.dtype, device=x.device)
        w_ffn = -0.5 * self.b * (self.ffn + self.ffn.T) + (1.0 - self.b) * eye
        y, states = x, [x]
        for _ in range(self.num_layers):
            scores = y @ w_attn @ y.transpose(-1, -2)  # [B, T, T]
            attn = torch.softmax(scores, dim=-1)
            z = (1.0 - self.a) * y + self.a * (attn @ y)
            y = torch.relu(z @ w_ffn + self.bias)
            states.append(y)
        return torch.stack(states)

    @torch.no_grad()
    def project(self, clip: float = CLIP) -> None:
        """cudt.models.ut_project: symmetrise W̃_f and clip its eigenvalues to [−clip, clip]."""
        sym = 0.5 * (self.ffn + self.ffn.T)
        with torch_threads(self.eigh_threads):
            evals, evecs = torch.linalg.eigh(sym)
        proj = (evecs * evals.clamp(-clip, clip)) @ evecs.T
        feasible = (evals.abs() <= clip).all()
        self.ffn.copy_(torch.where(feasible, sym, proj))


class TorchStep:
    """The constrained primal-dual step of ``cudt.make_train_step`` (hard constraints, no C)."""

    def __init__(
        self,
        params: dict,
        num_layers: int,
        sigma: float,
        *,
        compiled: bool = False,
        eigh_threads: int = 0,
    ):
        self.model = TorchUT(params, num_layers, eigh_threads=eigh_threads)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=LR)
        self.multipliers = torch.zeros(num_layers + 1)  # index 0: the (unused) reference one
        self.scale = float(np.float32(GAMMA) * np.float32(sigma))
        # torch.compile covers the forward and the Lagrangian (and, through AOTAutograd, their
        # backward); Adam, the projection and the dual update run eagerly.
        self.lagrangian = self._lagrangian
        if compiled:
            self.lagrangian = torch.compile(self._lagrangian, dynamic=False)

    def _lagrangian(self, clean, noise, multipliers):
        states = self.model(clean + self.scale * noise)  # [L+1, B, T, D]
        losses = ((states - clean) ** 2).mean(dim=(2, 3)).T  # [B, L+1]
        mean = losses.mean(dim=0)
        descent = mean[1:] - (1.0 - EPSILON) * mean[:-1]
        g = torch.cat([torch.zeros(1, dtype=mean.dtype), descent])
        return mean[-1] + (multipliers * g).sum(), mean, g

    def __call__(self, clean: torch.Tensor, noise: torch.Tensor | None = None) -> dict:
        if noise is None:
            noise = torch.randn_like(clean)
        lag, mean, g = self.lagrangian(clean, noise, self.multipliers)
        self.optimizer.zero_grad(set_to_none=True)
        lag.backward()
        self.optimizer.step()
        self.model.project()
        # Dual ascent on g at the pre-step parameters and multipliers, projected onto λ ≥ 0.
        self.multipliers = (self.multipliers + DUAL_LR * g.detach()).clamp(min=0.0)
        return {
            "layer_loss": mean.detach(),
            "lagrangian": lag.detach(),
            "multipliers": self.multipliers,
        }


def check_equal_work(setup, sigma, batch, key, tstep: TorchStep) -> tuple[list, Any, dict]:
    """Two steps of JAX (from a fresh state) and of ``tstep`` on the same batch and noise.

    Returns a table row (max over both steps of the layer losses' and the Lagrangian's relative
    difference and of the multipliers' absolute difference; the parameters after the two
    steps), the JAX state after the steps, and each side's first-call seconds (compilation).
    """
    state = setup.init(copy_tree(setup.params))
    clean = torch.tensor(np.asarray(batch))
    loss_rel = lag_rel = mult_abs = 0.0
    first_call = {}
    for i in range(2):
        # The noise cudt's step draws at step i: its layer losses perturb the batch with the
        # step key fold_in(key, i), and perturb(0, γ=1, σ=1, k) is that noise itself.
        noise = perturb(jnp.zeros_like(batch), 1.0, 1.0, jax.random.fold_in(key, i))
        t0 = time.perf_counter()
        state, jm = jax.block_until_ready(setup.step(state, batch, key))
        first_call.setdefault("jax", time.perf_counter() - t0)
        t0 = time.perf_counter()
        tm = tstep(clean, torch.tensor(np.asarray(noise)))
        first_call.setdefault("torch", time.perf_counter() - t0)
        jl, tl = np.asarray(jm["layer_loss"]), tm["layer_loss"].numpy()
        loss_rel = max(loss_rel, float(np.max(np.abs(jl - tl) / np.abs(jl))))
        jlag, tlag = float(jm["lagrangian"]), float(tm["lagrangian"])
        lag_rel = max(lag_rel, abs(jlag - tlag) / abs(jlag))
        jmult, tmult = np.asarray(jm["multipliers"]), tm["multipliers"].numpy()
        mult_abs = max(mult_abs, float(np.max(np.abs(jmult - tmult))))
    diffs = np.concatenate(
        [
            np.abs(np.asarray(v) - getattr(tstep.model, name).detach().numpy()).ravel()
            for name, v in state.params["params"].items()
        ]
    )
    # Adam's first steps move every parameter by about lr·sign(gradient): an element whose
    # gradient is at float32 rounding level may move the other way (a difference up to 2·lr per
    # step), so the parameters are judged by the fraction of elements that differ.
    flipped = float(np.mean(diffs > 0.1 * LR))
    ok = loss_rel < 1e-4 and lag_rel < 1e-4 and mult_abs < 1e-6 and flipped < 1e-2
    row = [loss_rel, lag_rel, mult_abs, float(diffs.max()), flipped, "yes" if ok else "NO"]
    return row, state, first_call


def time_steps(
    step: Callable[[], object], num_steps: int, sync: Callable[[], None] | None = None
) -> Callable[[], float]:
    """A measurement for ``interleave``: seconds per step over ``num_steps`` calls of ``step``.

    ``sync`` waits for asynchronously dispatched work (JAX) before the clock is read.
    """

    def run() -> float:
        t0 = time.perf_counter()
        for _ in range(num_steps):
            step()
        if sync is not None:
            sync()
        return (time.perf_counter() - t0) / num_steps

    return run


class JaxStepper:
    """Advances a cudt train state one jitted step per call (the state is donated and replaced)."""

    def __init__(self, setup, state, batch, key):
        self.setup, self.state, self.batch, self.key = setup, state, batch, key

    def __call__(self) -> None:
        self.state, _ = self.setup.step(self.state, self.batch, self.key)

    def sync(self) -> None:
        jax.block_until_ready(self.state)


def _error_line(err: BaseException, limit: int = 120) -> str:
    first = (str(err).strip().splitlines() or [""])[0]
    text = f"{type(err).__name__}: {first}" if first else type(err).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _not_run(batch_size: int, status: str, num_columns: int) -> list:
    """A table row for the torch.compile variant when it did not run: the status, then dashes."""
    return [batch_size, "torch compile", status, *["-"] * (num_columns - 3)]


def bench_batch_size(args, train_x, sigma, batch_size: int, compile_status: str | None):
    """Check, then time, one batch size.

    ``compile_status`` is None to run the torch.compile variant, or why it is not run (shown in
    its rows). Returns (check rows, first-call rows, speed rows, compile_status): the status
    becomes "unavailable: <error>" when torch.compile fails here, and later batch sizes skip it.
    """
    setup = make_ut_setup(
        train_x,
        sigma,
        layers=args.layers,
        batch_size=batch_size,
        gamma=GAMMA,
        lr=LR,
        dual_lr=DUAL_LR,
        epsilon=EPSILON,
        jit=True,
        donate=True,
        clip="eigh",  # the torch side's eigh: the same step (docs/speed.md section 1)
    )
    key = jax.random.key(0)
    batch = train_x[:batch_size]
    shape = f"{batch_size}x{args.seq_len}x{train_x.shape[-1]}"
    print(f"\nbatch {shape}: checking equal work ...", flush=True)
    make_torch_step = partial(
        TorchStep, num_layers=args.layers, sigma=sigma, eigh_threads=args.lapack_threads
    )

    # Equal work: the same two steps in JAX and in each torch variant, compared. The first of
    # them is also each implementation's compilation, timed here; the timing below continues
    # from the states these checks leave (two steps after the same initial weights).
    tstep = make_torch_step(copy_tree(setup.params))
    row, state, first_call = check_equal_work(setup, sigma, batch, key, tstep)
    checks = [[batch_size, "torch eager", *row]]
    firsts = [
        [batch_size, "jax", first_call["jax"]],
        [batch_size, "torch eager", first_call["torch"]],
    ]
    variants = {"torch eager": tstep}
    if compile_status is None:
        try:
            tstep = make_torch_step(copy_tree(setup.params), compiled=True)
            row, _, first_call = check_equal_work(setup, sigma, batch, key, tstep)
        except Exception as err:  # no C++ toolchain, unsupported op, ...: report it, go on
            compile_status = f"unavailable: {_error_line(err)}"
            print(f"NOTE: torch compile {compile_status}", flush=True)
        else:
            checks.append([batch_size, "torch compile", *row])
            firsts.append([batch_size, "torch compile", first_call["torch"]])
            variants["torch compile"] = tstep
    if compile_status is not None:
        checks.append(_not_run(batch_size, compile_status, 8))
        firsts.append(_not_run(batch_size, compile_status, 3))

    jax_step = JaxStepper(setup, state, batch, key)
    clean = torch.tensor(np.asarray(batch))
    alternatives = {
        "jax": time_steps(jax_step, args.steps, sync=jax_step.sync),
        **{name: time_steps(partial(t, clean), args.steps) for name, t in variants.items()},
    }
    ms = {name: 1e3 * s for name, s in time_alternatives(alternatives, args.repeats).items()}
    speed = [
        [batch_size, name, ms[name], ms[name] / ms["torch eager"], ms["jax"] / ms[name]]
        for name in alternatives
    ]
    if compile_status is not None:
        speed.append(_not_run(batch_size, compile_status, 5))
    return checks, firsts, speed, compile_status


def main(argv=None) -> None:
    args = parse_args(argv)
    print(f"command: {command_line('benchmarks.torch_baseline', argv)}")
    with lapack_threads(args.lapack_threads) as lapack:
        run(args, lapack)


def run(args: argparse.Namespace, lapack: str) -> None:
    threads = args.torch_threads if args.torch_threads > 0 else (os.cpu_count() or 1)
    torch.set_num_threads(threads)
    eigh = args.lapack_threads if args.lapack_threads > 0 else "all"
    print(
        f"torch_baseline: {environment()}; torch {torch.__version__}, "
        f"torch.set_num_threads({threads}) -> {torch.get_num_threads()} threads; "
        f"jax {lapack}; torch eigh threads: {eigh}"
    )
    t_total = time.perf_counter()
    train_x, sigma = video_data(seq_len=args.seq_len)
    compile_status = "skipped: --no-compile" if args.no_compile else None
    check_rows, first_rows, speed_rows = [], [], []
    for batch_size in args.batch_sizes:
        checks, first, speed, compile_status = bench_batch_size(
            args, train_x, sigma, batch_size, compile_status
        )
        check_rows += checks
        first_rows += first
        speed_rows += speed

    print(
        "\nequal work: two steps on the same batch and noise, max over both steps "
        "(relative for losses/Lagrangian, absolute for multipliers/params after the steps)"
    )
    print_table(
        [
            "batch",
            "vs jax",
            "layer loss rel",
            "lagrangian rel",
            "multipliers abs",
            "params max abs",
            f"frac params > {0.1 * LR:g}",
            "match",
        ],
        check_rows,
    )
    print("\nfirst call (tracing/compilation + one step), seconds")
    print_table(["batch", "impl", "first call s"], first_rows)
    print(
        f"\nsteady state: median ms/step over {args.repeats} interleaved repetitions of "
        f"{args.steps} steps"
    )
    print_table(["batch", "impl", "ms/step", "/ torch eager", "jax / this"], speed_rows)
    print(
        f"(jax / this < 1: the JAX step is faster); total wall {time.perf_counter() - t_total:.0f}s"
    )


if __name__ == "__main__":
    main()
