"""The jitted cudt constrained step vs PyTorch with the Cooper library (``cooper-optim``).

Run from the repository root (needs the ``bench`` extra: torch 2.13 and cooper-optim 1.x):

    .venv/bin/python -m benchmarks.cooper_baseline    # UT-5, DUST-5 at K = 400, 576; ~6 min

One training step of the video denoising setting (``VIDEO`` in ``benchmarks/_common.py``, the
defaults of ``experiments/video_denoise.py``): clean sequences [B=32, T=8, 256] (16x16 patches of
synthetic surveillance video), noise x̃ = x + γ·σ·n, every layer's state, per-layer MSE to the
clean patches, the L descent constraints E ℓ_l ≤ (1−ε)·E ℓ_{l−1}, primal Adam and projected
SGD dual ascent λ ← max(0, λ + η·g) at the pre-step point (simultaneous descent-ascent); the UT
also clips the eigenvalues of W̃_f after every step. Three implementations:

* ``cudt``: ``cudt.make_train_step`` with ``cudt.models.UT`` / ``DUST``, jitted, state donated;
* ``torch + Cooper``: the same models in PyTorch (``TorchUT`` from ``torch_baseline.py``,
  ``TorchDUST`` here), the problem as a ``cooper.ConstrainedMinimizationProblem`` with one
  inequality ``cooper.Constraint`` of L entries (``DenseMultiplier``, ``Lagrangian``
  formulation), trained by ``cooper.optim.SimultaneousOptimizer`` with ``torch.optim.Adam``
  (primal) and ``torch.optim.SGD(maximize=True)`` (dual; Cooper projects λ ≥ 0);
* ``torch hand-written``: the same PyTorch models with the dual step written by hand (one
  backward of the Lagrangian, Adam, λ ← max(0, λ + η·g)): what Cooper's machinery costs.

Each PyTorch variant is timed with 1 thread and with torch's default number of threads
(``--torch-threads``), and cudt with the same thread count: for n threads every thread of the
process (XLA's pool, torch's, OpenBLAS's) runs on n cores (``cpu_cores`` in ``_common.py``), so
each comparison is n against n. DUST runs at K = 400 and 576 atoms (``--dust-atoms 20,24``).
The eigendecompositions (UT's clipping, torch's DUST step sizes) use ``--lapack-threads`` on
both sides; cudt's DUST uses its default matmul-only linear algebra (``cudt.linalg``). The UT
has a fourth row, ``cudt, default clip``: cudt with ``ut_project``'s default clipping (Lanczos
deflation, no LAPACK) instead of ``eigh``, what a user of the defaults runs; the torch side
keeps ``torch.linalg.eigh``. Before timing, the script checks that the implementations do the
same work: per-sample layer losses on the same parameters, batch and noise (max abs
difference), two training steps from the same parameters and multipliers λ_l = 1 (so the dual
step is exercised) compared after each step, and for the UT's default clipping 20 steps of
cudt with it against cudt with ``eigh`` (the clip is active after the first few). The two-step
check's verdict rests on what rounding cannot move far: the first step's losses and Lagrangian
(1e-4 relative), the gradient of the Lagrangian at that point (cudt's ``cudt.lagrangian_terms``
differentiated; 1e-2 in relative L2 norm) and the multipliers after both steps (1e-6). DUST's
gradient is discontinuous where a code crosses the soft threshold, and a code within rounding
of it lands on either side: on DUST-1 at batch 8 one code of 25600, 2e-8 from the threshold,
does so between float32 and float64 and moves the gradient by 4.3 % (JAX and torch agree to
3e-14 in float64). The parameters after the two Adam steps are printed, not judged: Adam's
first steps move an element by about lr·sign(gradient), so such differences, and gradients at
rounding level, move elements the other way (1–3 % of DUST-5's K = 576 dictionary). Then all
alternatives are interleaved over ``--repeats`` repetitions of ``--steps`` steps and the median
ms/step and their ratios printed.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import cooper
import jax
import jax.numpy as jnp
import numpy as np
import torch

import cudt
from benchmarks._common import (
    VIDEO,
    JaxSteps,
    copy_tree,
    cpu_cores,
    make_video_setup,
    parse_video_args,
    print_table,
    run_main,
    time_alternatives,
    video_data,
    video_parser,
)
from benchmarks.torch_baseline import TorchUT, torch_threads
from cudt.data.video import perturb

# the row of cudt with the UT's default clipping (the other cudt row clips by eigh, as torch)
DEFAULT_CLIP = "cudt, default clip"

# torch's own choice of intra-op threads, read before anything here changes it.
TORCH_DEFAULT_THREADS = torch.get_num_threads()


def parse_args(argv=None) -> argparse.Namespace:
    p = video_parser(__doc__, steps=10, repeats=7, quick_help="L=3, batch 4, 1 repeat")
    p.add_argument(
        "--torch-threads",
        default="1,0",
        type=lambda s: [int(t) for t in s.split(",")],
        help="comma-separated torch thread counts to time; 0 is torch's default "
        f"({TORCH_DEFAULT_THREADS} here); cudt is timed with its threads on as many cores "
        "(default 1,0)",
    )
    p.add_argument(
        "--dust-atoms",
        default="20,24",
        type=lambda s: [int(t) for t in s.split(",")],
        help="comma-separated DUST atoms per axis, K = atoms² (default 20,24: K = 400, 576)",
    )
    # L = 3: at L = 1 the two-step check marks DUST "NO" at batch 8 and 32 (12-19 % of the
    # dictionary moved differently after two Adam steps), with DUST's four-product layer as with
    # its three-product one; it passed at batch 4 by chance. L = 3, batch 4: 0.4 %.
    quick = dict(layers=3, batch_size=4, steps=2, repeats=1, dust_atoms=[20])
    return parse_video_args(p, argv, quick=quick)


# --------------------------------------------------------------------------------------------------
# DUST in PyTorch (UT is torch_baseline.TorchUT)
# --------------------------------------------------------------------------------------------------


class TorchDUST(torch.nn.Module):
    """cudt.models.DUST (initial_code="dual") in PyTorch; ``forward`` returns [L+1, B, T, P].

    The only parameter is the dictionary ([P, K] tied or [L, P, K] per layer). As in cudt, the
    LISTA step sizes 1/μ_l with μ_l = ‖D_l‖₂² come from ``eigvalsh`` of the Gram matrix with no
    gradient, and the initial code is Z_0 = X (D_0 D_0ᵀ)⁻¹ D_0 (differentiated through the solve).
    The same matrix products as cudt's layers (three per layer, two when tied: see
    ``cudt.models.dust``), so both sides do equal work.
    """

    def __init__(self, params: dict, num_layers: int, *, a: float, tau: float, eigh_threads=0):
        super().__init__()
        d = np.asarray(params["params"]["dictionary"])
        self.dictionary = torch.nn.Parameter(torch.tensor(d))
        self.per_layer = d.ndim == 3
        self.num_layers, self.a, self.tau = num_layers, a, tau
        self.temperature = 1.0 / float(np.sqrt(d.shape[-2]))
        self.eigh_threads = eigh_threads

    def _layer_dict(self, layer: int) -> torch.Tensor:
        return self.dictionary[layer] if self.per_layer else self.dictionary

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            d = self.dictionary.detach()
            with torch_threads(self.eigh_threads):
                mu = torch.linalg.eigvalsh(d @ d.transpose(-1, -2))[..., -1]  # [] or [L]
        d0 = self._layer_dict(0)
        enc = torch.linalg.solve(d0 @ d0.T, d0)  # [P, K]
        z = x @ enc  # [B, T, K]
        states = [z @ d0.T]
        for layer in range(self.num_layers):
            dl = self._layer_dict(layer)
            step = 1.0 / (mu[layer] if self.per_layer else mu)
            # cudt's product reuse: tied, the input reconstruction is the last state; the
            # attended code's reconstruction by linearity, (1 − a)·R + a·A R.
            recon = z @ dl.T if self.per_layer else states[-1]
            attn = torch.softmax(self.temperature * (recon @ recon.transpose(-1, -2)), dim=-1)
            z = (1.0 - self.a) * z + self.a * (attn @ z)
            resid = x - ((1.0 - self.a) * recon + self.a * (attn @ recon))
            u = z + step * (resid @ dl)
            z = torch.sign(u) * torch.clamp(u.abs() - self.tau * step, min=0.0)
            states.append(z @ dl.T)
        return torch.stack(states)

    def project(self) -> None:
        """DUST has no parameter projection."""


def build_torch_model(setup, params, eigh_threads: int) -> torch.nn.Module:
    L = setup.config.num_layers
    if setup.name.startswith("UT"):
        return TorchUT(params, L, a=VIDEO["ut_a"], eigh_threads=eigh_threads)
    return TorchDUST(
        params,
        L,
        a=setup.model.attention_weight,
        tau=setup.model.threshold,
        eigh_threads=eigh_threads,
    )


def torch_layer_losses(model, clean: torch.Tensor, noisy: torch.Tensor) -> torch.Tensor:
    """Per-sample MSE of every layer's state: [B, L+1] (cudt's layer_losses)."""
    states = model(noisy)  # [L+1, B, T, P]
    return ((states - clean) ** 2).mean(dim=(2, 3)).T


# --------------------------------------------------------------------------------------------------
# The two PyTorch steps
# --------------------------------------------------------------------------------------------------


class DescentCMP(cooper.ConstrainedMinimizationProblem):
    """min E ℓ_L  s.t.  E ℓ_l − (1−ε) E ℓ_{l−1} ≤ 0, l = 1..L (one constraint of L entries)."""

    def __init__(self, model, num_layers: int, scale: float, multipliers: torch.Tensor):
        super().__init__()
        self.model, self.scale = model, scale
        self.descent = cooper.Constraint(
            constraint_type=cooper.ConstraintType.INEQUALITY,
            formulation_type=cooper.formulations.Lagrangian,
            multiplier=cooper.multipliers.DenseMultiplier(init=multipliers.clone()),
        )

    def compute_cmp_state(self, clean: torch.Tensor, noise: torch.Tensor) -> cooper.CMPState:
        mean = torch_layer_losses(self.model, clean, clean + self.scale * noise).mean(dim=0)
        g = mean[1:] - (1.0 - VIDEO["epsilon"]) * mean[:-1]
        return cooper.CMPState(
            loss=mean[-1],
            observed_constraints={self.descent: cooper.ConstraintState(violation=g)},
            misc={"layer_loss": mean.detach()},
        )


class CooperStep:
    """One ``SimultaneousOptimizer.roll`` (Adam on θ, SGD ascent on λ, λ ≥ 0), then the projection."""

    def __init__(self, model, num_layers: int, scale: float, multipliers: torch.Tensor):
        self.model = model
        self.cmp = DescentCMP(model, num_layers, scale, multipliers)
        self.optimizer = cooper.optim.SimultaneousOptimizer(
            cmp=self.cmp,
            primal_optimizers=torch.optim.Adam(model.parameters(), lr=VIDEO["lr"]),
            dual_optimizers=torch.optim.SGD(
                self.cmp.dual_parameters(), lr=VIDEO["dual_lr"], maximize=True
            ),
        )

    def __call__(self, clean: torch.Tensor, noise: torch.Tensor | None = None) -> dict:
        if noise is None:
            noise = torch.randn_like(clean)
        rollout = self.optimizer.roll(compute_cmp_state_kwargs={"clean": clean, "noise": noise})
        self.model.project()
        return {
            "layer_loss": rollout.cmp_state.misc["layer_loss"],
            "lagrangian": rollout.primal_lagrangian_store.lagrangian.detach(),
            "multipliers": self.cmp.descent.multiplier.weight.detach().clone(),
        }


class HandStep:
    """The same step with the dual update written by hand (as in ``torch_baseline.TorchStep``)."""

    def __init__(self, model, num_layers: int, scale: float, multipliers: torch.Tensor):
        self.model, self.scale = model, scale
        self.optimizer = torch.optim.Adam(model.parameters(), lr=VIDEO["lr"])
        self.multipliers = multipliers.clone()

    def __call__(self, clean: torch.Tensor, noise: torch.Tensor | None = None) -> dict:
        if noise is None:
            noise = torch.randn_like(clean)
        mean = torch_layer_losses(self.model, clean, clean + self.scale * noise).mean(dim=0)
        g = mean[1:] - (1.0 - VIDEO["epsilon"]) * mean[:-1]
        lag = mean[-1] + (self.multipliers * g).sum()
        self.optimizer.zero_grad(set_to_none=True)
        lag.backward()
        self.optimizer.step()
        self.model.project()
        self.multipliers = (self.multipliers + VIDEO["dual_lr"] * g.detach()).clamp(min=0.0)
        return {
            "layer_loss": mean.detach(),
            "lagrangian": lag.detach(),
            "multipliers": self.multipliers,
        }


IMPLS: dict[str, type] = {"torch + Cooper": CooperStep, "torch hand-written": HandStep}


# --------------------------------------------------------------------------------------------------
# Equal work
# --------------------------------------------------------------------------------------------------


def check_losses(setup, batch, key, eigh_threads: int) -> list:
    """Per-sample layer losses [B, L+1] of cudt and PyTorch on the same params, batch and noise."""
    jl = np.asarray(setup.layer_losses(setup.params, batch, key))
    noise = perturb(jnp.zeros_like(batch), 1.0, 1.0, key)  # the noise layer_losses drew
    scale = float(np.float32(VIDEO["gamma"]) * np.float32(setup.sigma))
    clean = torch.tensor(np.asarray(batch))
    model = build_torch_model(setup, setup.params, eigh_threads)
    with torch.no_grad():
        tl = torch_layer_losses(model, clean, clean + scale * torch.tensor(np.asarray(noise)))
    diff = float(np.max(np.abs(jl - tl.numpy())))
    return [setup.name, f"{jl.shape[0]}x{jl.shape[1]}", diff, diff / float(np.max(np.abs(jl)))]


def check_steps(setup, batch, key, eigh_threads: int, multipliers0: np.ndarray):
    """Two steps of cudt and of each PyTorch step from the same params and multipliers.

    Returns the table rows and each implementation's first-call seconds (cudt's includes its
    tracing and compilation).
    """
    L = setup.config.num_layers
    state = setup.init(copy_tree(setup.params))
    state = state.replace(
        multipliers=jnp.asarray(np.concatenate([[0.0], multipliers0]), jnp.float32)
    )
    scale = float(np.float32(VIDEO["gamma"]) * np.float32(setup.sigma))
    clean = torch.tensor(np.asarray(batch))
    steps = {
        name: impl(
            build_torch_model(setup, setup.params, eigh_threads),
            L,
            scale,
            torch.tensor(multipliers0, dtype=torch.float32),
        )
        for name, impl in IMPLS.items()
    }
    worst = {name: [0.0, 0.0, 0.0] for name in steps}  # layer loss rel, lagrangian rel, λ abs
    first = {}  # the first step's layer loss rel and lagrangian rel, per implementation
    grad_rel = {}  # the first step's gradient of the Lagrangian, ‖torch − cudt‖₂ / ‖cudt‖₂
    cudt_grad = lagrangian_grad(setup, state, batch, jax.random.fold_in(key, 0))
    first_call: dict[str, float] = {}
    for i in range(2):
        # The noise cudt's step draws at step i: its layer losses perturb the batch with the
        # step key fold_in(key, i), and perturb(0, γ=1, σ=1, k) is that noise itself.
        noise = perturb(jnp.zeros_like(batch), 1.0, 1.0, jax.random.fold_in(key, i))
        t0 = time.perf_counter()
        state, jm = jax.block_until_ready(setup.step(state, batch, key))
        first_call.setdefault("cudt", time.perf_counter() - t0)
        jl, jlag = np.asarray(jm["layer_loss"]), float(jm["lagrangian"])
        jmult = np.asarray(jm["multipliers"])[1:]
        for name, tstep in steps.items():
            t0 = time.perf_counter()
            tm = tstep(clean, torch.tensor(np.asarray(noise)))
            first_call.setdefault(name, time.perf_counter() - t0)
            w = worst[name]
            loss_rel = float(np.max(np.abs(jl - tm["layer_loss"].numpy()) / np.abs(jl)))
            lag_rel = abs(jlag - float(tm["lagrangian"])) / abs(jlag)
            w[0], w[1] = max(w[0], loss_rel), max(w[1], lag_rel)
            w[2] = max(w[2], float(np.max(np.abs(jmult - tm["multipliers"].numpy()))))
            if i == 0:
                first[name] = (loss_rel, lag_rel)
                grads = {k: p.grad.numpy() for k, p in tstep.model.named_parameters()}
                diff = sum(float(np.sum((g - grads[k]) ** 2)) for k, g in cudt_grad.items())
                norm = sum(float(np.sum(g**2)) for g in cudt_grad.values())
                grad_rel[name] = (diff / norm) ** 0.5
    moved = float(np.max(np.abs(jmult - multipliers0)))  # the dual steps did something
    jparams = jax.tree.map(np.asarray, state.params["params"])
    rows = []
    for name, tstep in steps.items():
        tparams = dict(tstep.model.named_parameters())  # the same names as cudt's
        diffs = np.concatenate(
            [np.abs(v - tparams[k].detach().numpy()).ravel() for k, v in jparams.items()]
        )
        # Adam's first steps move every parameter by about lr·sign(gradient): an element whose
        # gradient is at rounding level may move the other way, so count the elements that
        # differ (shown, not judged: see the module docstring).
        flipped = float(np.mean(diffs > 0.1 * VIDEO["lr"]))
        ok = max(first[name]) < 1e-4 and grad_rel[name] < 1e-2 and worst[name][2] < 1e-6
        rows.append(
            [
                setup.name,
                name,
                *worst[name],
                grad_rel[name],
                moved,
                float(diffs.max()),
                flipped,
                "yes" if ok else "NO",
            ]
        )
    return rows, first_call


def lagrangian_grad(setup, state, batch, key) -> dict[str, np.ndarray]:
    """cudt's gradient of the Lagrangian at ``state`` (its params and multipliers) for the noise
    of ``key``, by parameter name: what its step computes, through ``cudt.lagrangian_terms``."""

    def lagrangian(params):
        losses = setup.layer_losses(params, batch, key).astype(jnp.float32)
        lag, _, _ = cudt.lagrangian_terms(
            losses, state.multipliers, state.slacks, state.epsilon, state.reference, None,
            reference_active=state.has_reference,
        )  # fmt: skip
        return lag

    grads = jax.grad(lagrangian)(state.params)["params"]
    return {k: np.asarray(v) for k, v in grads.items()}


def check_default_clip(setup, default, batch, key, num_steps: int = 20) -> list:
    """cudt with the UT's default clipping vs with ``eigh``: ``num_steps`` steps from the same
    state, the worst relative layer-loss difference over the steps, the largest parameter
    difference at the end, and how many eigenvalues ``eigh`` clipped at the last step."""
    states = [s.init(copy_tree(s.params)) for s in (setup, default)]
    worst = 0.0
    for _ in range(num_steps):
        (states[0], m_exact), (states[1], m_default) = (
            s.step(state, batch, key) for s, state in zip((setup, default), states, strict=True)
        )
        exact, ours = np.asarray(m_exact["layer_loss"]), np.asarray(m_default["layer_loss"])
        worst = max(worst, float(np.max(np.abs(ours - exact) / np.abs(exact))))
    params = [jax.tree.map(np.asarray, s.params["params"]) for s in states]
    diff = max(float(np.abs(params[0][k] - params[1][k]).max()) for k in params[0])
    evals = np.linalg.eigvalsh(np.asarray(params[0]["ffn"], np.float64))
    at_clip = int(np.sum(np.abs(np.abs(evals) - 0.95) < 1e-6))
    ok = worst < 2e-3 and at_clip > 0
    return [setup.name, num_steps, worst, diff, at_clip, "yes" if ok else "NO"]


# --------------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------------


def on_cores(num_cores: int, measure: Callable[[], float]) -> Callable[[], float]:
    """``measure`` run with every thread of the process on ``num_cores`` cores."""

    def run() -> float:
        with cpu_cores(num_cores):
            return measure()

    return run


def torch_block(step: Callable, clean: torch.Tensor, num_steps: int, threads: int):
    """A measurement for ``interleave``: s/step of ``num_steps`` steps with ``threads`` threads."""

    def run() -> float:
        with torch_threads(threads):
            t0 = time.perf_counter()
            for _ in range(num_steps):
                step(clean)
            return (time.perf_counter() - t0) / num_steps

    return run


def bench_model(
    args, model_name: str, train_x, sigma, atoms: int | None = None
) -> tuple[list, list, list, list, list]:
    # the UT's exact clipping, as the torch side's eigh: the same step on both sides; and the
    # UT with its default clipping (Lanczos deflation), what a user of the defaults runs
    setup = make_video_setup(
        model_name, train_x, sigma, layers=args.layers, atoms_per_dim=atoms, ut_clip="eigh"
    )
    default = None
    if model_name == "ut":
        default = make_video_setup(model_name, train_x, sigma, layers=args.layers)
    L = setup.config.num_layers
    batch = train_x[: args.batch_size]
    key = jax.random.key(0)
    print(f"\n{setup.name}: checking equal work ...", flush=True)
    multipliers0 = np.ones(L, np.float32)
    loss_row = check_losses(setup, batch, key, args.lapack_threads)
    step_rows, first_call = check_steps(setup, batch, key, args.lapack_threads, multipliers0)
    clip_rows = [] if default is None else [check_default_clip(setup, default, batch, key)]
    print(
        "  first call: "
        + "; ".join(f"{name} {seconds:.3g}s" for name, seconds in first_call.items())
        + " (cudt's: tracing + XLA compilation + one step)",
        flush=True,
    )

    # Timed instances: each starts from the initial params and λ_l = 1; one untimed block each
    # first (compilation for cudt; W̃_f leaves its diagonal init, so eigh costs what it does
    # mid-training).
    scale = float(np.float32(VIDEO["gamma"]) * np.float32(sigma))
    clean = torch.tensor(np.asarray(batch))
    state = setup.init(copy_tree(setup.params))
    state = state.replace(
        multipliers=jnp.asarray(np.concatenate([[0.0], multipliers0]), jnp.float32)
    )
    alternatives = {}
    for threads in args.torch_threads:
        n = threads if threads > 0 else TORCH_DEFAULT_THREADS
        label = f"{n}" if threads > 0 else f"{n} (default)"
        # cudt with its threads on n cores: the same thread count as torch's n threads
        jax_steps = JaxSteps(setup.step, copy_tree(state), batch, key)
        alternatives[("cudt (jax.jit)", label)] = on_cores(
            n, lambda s=jax_steps: s.block(args.steps)
        )
        if default is not None:
            default_steps = JaxSteps(default.step, copy_tree(state), batch, key)
            alternatives[(DEFAULT_CLIP, label)] = on_cores(
                n, lambda s=default_steps: s.block(args.steps)
            )
        for impl_name, impl in IMPLS.items():
            tstep = impl(
                build_torch_model(setup, setup.params, args.lapack_threads),
                L,
                scale,
                torch.tensor(multipliers0),
            )
            alternatives[(impl_name, label)] = on_cores(n, torch_block(tstep, clean, args.steps, n))
    ms = {name: 1e3 * s for name, s in time_alternatives(alternatives, args.repeats).items()}
    speed = []
    for (impl_name, threads), value in ms.items():
        hand = ms.get(("torch hand-written", threads))
        over_hand = value / hand if impl_name == "torch + Cooper" and hand else "-"
        jax_ms = ms[("cudt (jax.jit)", threads)]
        speed.append([setup.name, impl_name, threads, value, value / jax_ms, over_hand])
    return [loss_row], step_rows, clip_rows, speed, ms


def main(argv=None) -> None:
    run_main("benchmarks.cooper_baseline", argv, parse_args, run)


def run(args: argparse.Namespace, lapack: str) -> None:
    eigh = args.lapack_threads if args.lapack_threads > 0 else "library default"
    print(
        f"torch {torch.__version__} (default {TORCH_DEFAULT_THREADS} threads), cooper-optim "
        f"{cooper.__version__}; jax {lapack}; torch eigh/eigvalsh threads: {eigh}"
    )
    t_total = time.perf_counter()
    train_x, sigma = video_data(seq_len=args.seq_len)
    print(
        f"video denoising: batch {args.batch_size}x{args.seq_len}x{train_x.shape[-1]}, "
        f"L = {args.layers}, γ = {VIDEO['gamma']}, ε = {VIDEO['epsilon']}, Adam lr "
        f"{VIDEO['lr']}, dual ascent lr {VIDEO['dual_lr']}; UT a = {VIDEO['ut_a']} with "
        f"eigenvalue clipping; DUST K = {', '.join(str(a * a) for a in args.dust_atoms)} atoms, one "
        "dictionary per layer"
    )
    loss_rows, step_rows, clip_rows, speed_rows, all_ms = [], [], [], [], {}
    runs = [(m, a) for m in args.models for a in (args.dust_atoms if m == "dust" else [None])]
    for model_name, atoms in runs:
        losses, steps, clips, speed, ms = bench_model(args, model_name, train_x, sigma, atoms)
        loss_rows += losses
        step_rows += steps
        clip_rows += clips
        speed_rows += speed
        all_ms[speed[0][0]] = ms

    print("\nequal work 1: per-sample layer losses, same params, batch and noise, cudt vs torch")
    print_table(["model", "losses [B, L+1]", "max abs diff", "max rel to max loss"], loss_rows)
    print(
        "\nequal work 2: two steps from the same params and λ_l = 1, vs cudt; max over both "
        "steps (relative for losses/Lagrangian, absolute for λ; params after the steps); grad rel:"
        " the first step's gradient of the Lagrangian, ‖torch − cudt‖₂ / ‖cudt‖₂; match: the first "
        "step's losses and Lagrangian within 1e-4, its gradient within 1e-2, λ within 1e-6 (the "
        "params after two Adam steps are shown, not judged: see the module docstring)"
    )
    print_table(
        [
            "model",
            "impl",
            "layer loss rel",
            "lagrangian rel",
            "multipliers abs",
            "grad rel",
            "cudt λ moved",
            "params max abs",
            f"frac params > {0.1 * VIDEO['lr']:g}",
            "match",
        ],
        step_rows,
    )
    if clip_rows:
        print(
            "\nequal work 3: cudt with the UT's default clipping (Lanczos deflation) vs with "
            "eigh, the same steps from the same state (layer losses relative, max over the "
            "steps; params after them; eigenvalues eigh left at ±0.95, i.e. the clip was active)"
        )
        print_table(
            ["model", "steps", "layer loss rel", "params max abs", "at the clip", "match"],
            clip_rows,
        )
    print(
        f"\nsteady state: median ms/step over {args.repeats} interleaved repetitions of "
        f"{args.steps} steps (after one untimed block each)"
    )
    print_table(
        ["model", "impl", "threads", "ms/step", "this / cudt", "Cooper / hand"],
        speed_rows,
    )
    for model, ms in all_ms.items():
        for (impl_name, threads), value in ms.items():
            if impl_name != "cudt (jax.jit)":
                jax_ms = ms[("cudt (jax.jit)", threads)]
                print(
                    f"ratio {model}: {impl_name} [torch threads {threads}] / cudt = {value / jax_ms:.3g}"
                )
            default_ms = ms.get((DEFAULT_CLIP, threads))
            if impl_name.startswith("torch") and default_ms:
                print(
                    f"ratio {model}: {impl_name} [torch threads {threads}] / {DEFAULT_CLIP} = "
                    f"{value / default_ms:.3g}"
                )
        for (impl_name, threads), value in ms.items():
            hand = ms.get(("torch hand-written", threads))
            if impl_name == "torch + Cooper" and hand:
                print(
                    f"ratio {model}: torch + Cooper / torch hand-written [torch threads {threads}] "
                    f"= {value / hand:.3g}"
                )
    print(
        f"(this / cudt > 1: the cudt step is faster); total wall {time.perf_counter() - t_total:.0f}s"
    )


if __name__ == "__main__":
    main()
