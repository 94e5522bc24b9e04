"""The PyTorch peer: the video models in PyTorch and the constrained step in the Cooper library.

The other side of every "cudt vs PyTorch + Cooper" comparison (``step``, ``llm``, ``gpu``):

* :class:`TorchUT` and :class:`TorchDUST` mirror :class:`cudt.models.UT` and
  :class:`cudt.models.DUST` (the same products; weights copied from cudt's);
* :class:`DescentCMP` is the descent problem as a ``cooper.ConstrainedMinimizationProblem``:
  objective ``mean ℓ_L``, an optional reference bound ``mean ℓ_0 ≤ C`` and the L descent
  constraints ``mean ℓ_l − (1−ε)·mean ℓ_{l−1} ≤ 0`` (``DenseMultiplier``, ``Lagrangian``);
* :func:`cooper_optimizer` wires Cooper the way a task's config wires cudt's step
  (:func:`cudt.runner.groups.make_group_step`): ``torch.optim.Adam`` on the parameters, the
  dual optimiser of ``--dual-optimizer`` (``sgd``: ``torch.optim.SGD(maximize=True)``;
  ``adam``: ``torch.optim.Adam(maximize=True)``; ``nupi``: Cooper's ``nuPI`` with K_P =
  ``--nupi-kp``, K_I = 1, ν = ``--nupi-ema``, SGD initialisation, as :func:`cudt.nupi`), and
  the update order of ``--update`` (``simultaneous``: Cooper's ``SimultaneousOptimizer``;
  ``alternating``: its ``AlternatingDualPrimalOptimizer``, dual first, then the primal step
  with the new multipliers from the same forward, as cudt's "alternating"). Cooper projects
  the multipliers onto λ ≥ 0 after its dual step, as cudt does.

Cooper's nuPI (cooper-optim 1.0.x, ``_nupi_sgd_init``) stores ξ_0 = 0 after its first step
instead of ξ_0 = e_0, so its second step's proportional term is K_P·e_1 instead of
K_P·(e_1 − e_0) (cooper-org/cooper issue 107, open; its own docstring gives the rule cudt
follows). :class:`NuPI` is Cooper's optimiser with that one line fixed (ξ_0 = e_0 after the
first step); every later step is Cooper's own code. The equal-work checks compare the first
steps' multipliers, so without the fix they fail at step 2.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import cooper
import numpy as np
import torch

from cudt.descent import RATIO_FLOOR, SCALE_FLOOR

__all__ = [
    "TORCH_DEFAULT_THREADS",
    "CooperStep",
    "DescentCMP",
    "NuPI",
    "TorchDUST",
    "TorchUT",
    "cooper_optimizer",
    "relative_diff",
    "torch_device",
    "torch_threads",
    "torch_video_model",
    "video_layer_losses",
    "video_peer",
]

# torch's own choice of intra-op threads, read before anything here changes it.
TORCH_DEFAULT_THREADS = torch.get_num_threads()


@contextlib.contextmanager
def torch_threads(num_threads: int) -> Iterator[None]:
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


# --------------------------------------------------------------------------------------------------
# The video models
# --------------------------------------------------------------------------------------------------


class TorchUT(torch.nn.Module):
    """:class:`cudt.models.UT` (dot or distance attention, no re-injection, any ``tying`` and
    ``skip``) in PyTorch; ``forward`` returns the states ``[L+1, B, T, D]``; ``project`` is ``ut_project``
    (``lower`` as the video task passes it) by ``torch.linalg.eigh``, per layer's matrix."""

    def __init__(
        self,
        params: dict,
        num_layers: int,
        a: float,
        b: float,
        clip: float = 0.95,
        *,
        skip: bool = False,
        lower: float | None = None,
        attention: str = "dot",
    ):
        super().__init__()
        p = params["params"]
        self.attn = torch.nn.Parameter(torch.tensor(np.asarray(p["attn"])))  # W̃ ([L,] D, D)
        self.ffn = torch.nn.Parameter(torch.tensor(np.asarray(p["ffn"])))  # W̃_f ([L,] D, D)
        self.bias = torch.nn.Parameter(torch.tensor(np.asarray(p["bias"])))  # B ([L,] D)
        self.num_layers, self.a, self.b, self.clip = num_layers, a, b, clip
        self.skip, self.lower = skip, (-clip if lower is None else lower)
        if attention not in ("dot", "distance"):
            raise ValueError(f"attention must be 'dot' or 'distance', got {attention!r}")
        self.attention = attention

    @staticmethod
    def _at(w: torch.Tensor, layer: int, ndim: int) -> torch.Tensor:
        return w[layer] if w.ndim > ndim else w

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w_attn = self.attn.transpose(-1, -2) @ self.attn  # W = W̃ᵀW̃
        eye = torch.eye(self.ffn.shape[-1], dtype=x.dtype, device=x.device)
        sym = 0.5 * (self.ffn + self.ffn.transpose(-1, -2))
        w_ffn = -self.b * sym + (1.0 - self.b + float(self.skip)) * eye
        y, states = x, [x]
        for layer in range(self.num_layers):
            wa = self._at(w_attn, layer, 2)
            scores = y @ wa @ y.transpose(-1, -2)  # [B, T, T]
            if self.attention == "distance":  # −½‖y_t − y_s‖²_W up to the row's own term
                scores = scores - 0.5 * torch.diagonal(scores, dim1=-2, dim2=-1).unsqueeze(-2)
            attn = torch.softmax(scores, dim=-1)
            z = (1.0 - self.a) * y + self.a * (attn @ y)
            y = torch.relu(z @ self._at(w_ffn, layer, 2) + self._at(self.bias, layer, 1))
            states.append(y)
        return torch.stack(states)

    @torch.no_grad()
    def project(self) -> None:
        """Symmetrise each W̃_f and clip its eigenvalues to [lower, clip] (``ut_project``)."""
        sym = 0.5 * (self.ffn + self.ffn.transpose(-1, -2))
        evals, evecs = torch.linalg.eigh(sym)
        proj = (evecs * evals.clamp(self.lower, self.clip).unsqueeze(-2)) @ evecs.transpose(-1, -2)
        feasible = ((evals >= self.lower) & (evals <= self.clip)).all(-1)[..., None, None]
        self.ffn.copy_(torch.where(feasible, sym, proj))


class TorchDUST(torch.nn.Module):
    """:class:`cudt.models.DUST` (``initial_code="dual"``) in PyTorch; ``forward`` returns
    ``[L+1, B, T, P]``.

    The only parameter is the dictionary (``[P, K]`` tied or ``[L, P, K]`` per layer). The LISTA
    step sizes 1/μ_l with μ_l = ‖D_l‖₂² come from ``eigvalsh`` of the Gram matrix with no
    gradient (cudt: Lanczos, a lower bound within 3e-7), and the initial code is
    Z_0 = X (D_0 D_0ᵀ)⁻¹ D_0 (differentiated through the solve). The same matrix products as
    cudt's layers (three per layer, two when tied).
    """

    def __init__(self, params: dict, num_layers: int, *, a: float, tau: float):
        super().__init__()
        d = np.asarray(params["params"]["dictionary"])
        self.dictionary = torch.nn.Parameter(torch.tensor(d))
        self.per_layer = d.ndim == 3
        self.num_layers, self.a, self.tau = num_layers, a, tau
        self.temperature = 1.0 / float(np.sqrt(d.shape[-2]))

    def _layer_dict(self, layer: int) -> torch.Tensor:
        return self.dictionary[layer] if self.per_layer else self.dictionary

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            d = self.dictionary.detach()
            mu = torch.linalg.eigvalsh(d @ d.transpose(-1, -2))[..., -1]  # [] or [L]
        d0 = self._layer_dict(0)
        z = x @ torch.linalg.solve(d0 @ d0.T, d0)  # [B, T, K]
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


def torch_video_model(setup, params) -> torch.nn.Module:
    """The PyTorch mirror of ``setup``'s model (a :class:`benchmarks.setting.VideoSetup`) with
    cudt's ``params``; the model's hyperparameters are read from its flax module."""
    m, cfg = setup.module, setup.cfg
    if setup.model_name == "ut":
        if m.reinject != 0.0 or m.sublayer:
            raise ValueError("the PyTorch UT mirrors the UT without re-injection only")
        # the video task's projection, functools.partial(ut_project, clip=..., lower=...) or None
        keywords = getattr(setup.model.project, "keywords", None)
        if setup.model.project is not None and keywords is None:
            raise ValueError("the PyTorch UT mirrors the video task's ut_project partial only")
        lower = (keywords or {}).get("lower")
        clip = (keywords or {}).get("clip", 0.95) if keywords is not None else float("inf")
        return TorchUT(
            params,
            m.num_layers,
            a=m.a,
            b=m.b,
            clip=clip,
            skip=m.skip,
            lower=lower,
            attention=m.attention,
        )
    if setup.model_name == "dust":
        if m.initial_code != "dual":
            raise ValueError("the PyTorch DUST mirrors initial_code='dual' only")
        return TorchDUST(params, cfg.layers, a=m.attention_weight, tau=m.threshold)
    raise ValueError(f"no PyTorch mirror of {setup.model_name!r}")


def video_layer_losses(model) -> Callable[..., torch.Tensor]:
    """``(clean, noise, scale) -> [B, L+1]``: per-sample MSE of every state of ``model`` on
    ``clean + scale·noise`` (the video task's ``layer_losses``); ``noise`` None draws it."""

    def layer_losses(clean: torch.Tensor, noise: torch.Tensor | None, scale: float):
        if noise is None:
            noise = torch.randn_like(clean)
        states = model(clean + scale * noise)  # [L+1, B, T, P]
        return ((states - clean) ** 2).mean(dim=(2, 3)).T

    return layer_losses


# --------------------------------------------------------------------------------------------------
# The problem and Cooper's optimisers
# --------------------------------------------------------------------------------------------------


class DescentCMP(cooper.ConstrainedMinimizationProblem):
    """min mean ℓ_L  s.t.  mean ℓ_0 − C ≤ 0 (when ``reference`` is given) and
    mean ℓ_l − (1−ε)·mean ℓ_{l−1} ≤ 0, l = 1..L.

    ``layer_losses(**kwargs) -> [B, L+1]`` computes the per-sample losses of a batch (the
    keyword arguments of ``roll``'s ``compute_cmp_state_kwargs``).
    """

    def __init__(
        self,
        layer_losses: Callable[..., torch.Tensor],
        num_layers: int,
        epsilon: float,
        reference: float | None = None,
        device=None,
        relative: bool = False,
    ):
        super().__init__()
        self.layer_losses, self.epsilon, self.reference = layer_losses, epsilon, reference
        self.relative = relative  # cudt's dual_scale="relative": the dual step on g / scale

        def constraint(n: int) -> cooper.Constraint:
            return cooper.Constraint(
                constraint_type=cooper.ConstraintType.INEQUALITY,
                formulation_type=cooper.formulations.Lagrangian,
                multiplier=cooper.multipliers.DenseMultiplier(num_constraints=n, device=device),
            )

        self.bound = constraint(1) if reference is not None else None
        self.descent = constraint(num_layers)

    def compute_cmp_state(self, **kwargs) -> cooper.CMPState:
        mean = self.layer_losses(**kwargs).mean(dim=0)  # [L+1]
        g = mean[1:] - (1.0 - self.epsilon) * mean[:-1]
        # cudt.descent.scales: the dual step ascends g / mean ℓ_{l−1} (Cooper's strict
        # violation drives the multipliers; the Lagrangian keeps g)
        strict = None
        if self.relative:  # on the device, as cudt's: no host sync in the middle of a step
            floor = (SCALE_FLOOR * mean.detach().max()).clamp_min(RATIO_FLOOR)
            strict = (g / torch.maximum(mean.detach()[:-1], floor)).detach()
        observed = {self.descent: cooper.ConstraintState(violation=g, strict_violation=strict)}
        g0 = torch.zeros_like(mean[:1])
        if self.bound is not None:
            g0 = mean[:1] - self.reference
            bound = abs(self.reference) if self.reference else 1.0
            strict0 = (g0 / bound).detach() if self.relative else None
            observed[self.bound] = cooper.ConstraintState(violation=g0, strict_violation=strict0)
        return cooper.CMPState(
            loss=mean[-1],
            observed_constraints=observed,
            misc={"layer_loss": mean.detach(), "constraint": torch.cat([g0, g]).detach()},
        )

    def multiplier_values(self) -> torch.Tensor:
        """``[L+1]``: the reference multiplier (0 without a bound), then the descent ones."""
        descent = self.descent.multiplier.weight.detach()
        bound = (
            self.bound.multiplier.weight.detach()
            if self.bound is not None
            else torch.zeros_like(descent[:1])
        )
        return torch.cat([bound, descent])


class NuPI(cooper.optim.nuPI):
    """Cooper's ``nuPI`` with ξ_0 = e_0 after the first step (cooper-org/cooper issue 107: the
    released ``_nupi_sgd_init`` stores 0); every step is Cooper's own update."""

    @torch.no_grad()
    def step(self, closure=None):
        first = {
            p: p.grad.detach().clone()
            for group in self.param_groups
            for p in group["params"]
            if p.grad is not None and "xi" not in self.state[p]
        }
        loss = super().step(closure)
        for p, error in first.items():
            if "xi" in self.state[p]:  # the K_P term is on: ξ_0 = ν·e_0 + (1 − ν)·e_0 = e_0
                self.state[p]["xi"] = error
        return loss


def cooper_optimizer(
    cfg, cmp: DescentCMP, primal_params, lr: float, *, fused: bool = False
) -> cooper.optim.ConstrainedOptimizer:
    """Cooper's constrained optimiser for ``cfg``'s dual optimiser and update order (see the
    module docstring); ``fused``: torch's one-kernel Adam (CUDA, or large models)."""
    primal = torch.optim.Adam(primal_params, lr=lr, fused=fused or None)
    duals = list(cmp.dual_parameters())
    if cfg.dual_optimizer == "sgd":
        dual = torch.optim.SGD(duals, lr=cfg.dual_lr, maximize=True)
    elif cfg.dual_optimizer == "adam":
        dual = torch.optim.Adam(duals, lr=cfg.dual_lr, maximize=True)
    elif cfg.dual_optimizer == "nupi":
        dual = NuPI(
            duals, lr=cfg.dual_lr, Kp=cfg.nupi_kp, Ki=1.0, ema_nu=cfg.nupi_ema, maximize=True
        )
    else:
        raise ValueError(f"no Cooper dual optimiser for {cfg.dual_optimizer!r}")
    kinds = {
        "simultaneous": cooper.optim.SimultaneousOptimizer,
        "alternating": cooper.optim.AlternatingDualPrimalOptimizer,
    }
    if cfg.update not in kinds:
        raise ValueError(f"no Cooper optimiser for --update {cfg.update}")
    return kinds[cfg.update](cmp=cmp, primal_optimizers=primal, dual_optimizers=dual)


class CooperStep:
    """One Cooper ``roll`` per call, then the model's projection; returns the step's layer
    losses and constraint values (before the step) and multipliers (after it), as tensors on
    the model's device (the work may still be queued there: :meth:`wait` waits for it)."""

    def __init__(self, model, cmp: DescentCMP, optimizer, *, sync: Callable[[], None] = None):
        self.model, self.cmp, self.optimizer = model, cmp, optimizer
        self.sync = sync

    def wait(self) -> None:
        """Waits for the device's queued work (CUDA); nothing on a CPU."""
        if self.sync is not None:
            self.sync()

    def __call__(self, **kwargs) -> dict:
        rollout = self.optimizer.roll(compute_cmp_state_kwargs=kwargs)
        self.model.project()
        misc = rollout.cmp_state.misc
        return {
            "layer_loss": misc["layer_loss"],
            "constraint": misc["constraint"],
            "multipliers": self.cmp.multiplier_values(),
        }


def torch_device() -> torch.device:
    """CUDA when torch has it (the GPU jax runs on, on a lent machine), else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def video_peer(setup, params, epsilon: float | None = None) -> tuple[CooperStep, Callable]:
    """``(step, batch_kwargs)`` of the PyTorch + Cooper mirror of ``setup`` from cudt's
    ``params``, on :func:`torch_device`: ``step(clean=..., noise=..., scale=...)``;
    ``batch_kwargs(clean [B, T, P], noise or None)`` builds its arguments (None: every call
    draws fresh noise by ``torch.randn``, as cudt's step draws its own)."""
    device = torch_device()
    model = torch_video_model(setup, params).to(device)
    cfg = setup.cfg
    cmp = DescentCMP(
        video_layer_losses(model),
        cfg.layers,
        cfg.epsilon if epsilon is None else epsilon,
        device=device,
        relative=cfg.dual_scale == "relative",
    )
    lr = float(setup.program.per_run["lr"][0])
    sync = torch.cuda.synchronize if device.type == "cuda" else None
    optimizer = cooper_optimizer(cfg, cmp, model.parameters(), lr, fused=device.type == "cuda")
    step = CooperStep(model, cmp, optimizer, sync=sync)
    scale = setup.noise_scale

    def batch_kwargs(clean, noise=None) -> dict:
        c = torch.tensor(np.array(clean), device=device)
        n = None if noise is None else torch.tensor(np.array(noise), device=device)
        return {"clean": c, "noise": n, "scale": scale}

    return step, batch_kwargs


def relative_diff(a, b, *, normwise: bool) -> float:
    """max |a − b| / |a| elementwise, or / max |a| (``normwise``: for values that may be 0)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if normwise:
        return float(np.max(np.abs(a - b)) / max(np.max(np.abs(a)), 1e-30))
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(a), 1e-30)))
