"""The layerwise-descent problem's configuration: its static structure, and defaults for ``init``.

    minimise_θ   E ℓ_L
    subject to   E ℓ_l ≤ (1 − ε_l) · E ℓ_{l−1}      l = 1..L      (descent constraints)
                 E ℓ_0 ≤ C                                           (reference, optional)

Multipliers and constraint values are vectors of length ``L+1``: index 0 is the reference
constraint (identically 0 when ``reference=None``), index ``l ≥ 1`` the descent constraint of
layer ``l`` (:func:`cudt.descent.constraint_values`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Literal

import numpy as np

from cudt.constrained import RESILIENCE_MODES

__all__ = ["DUAL_SCALES", "PREVIOUS_LOSSES", "DescentConfig"]

DUAL_SCALES = ("absolute", "relative")
#: How a descent constraint reads the loss it must improve on (``DescentConfig.previous_loss``).
PREVIOUS_LOSSES = ("differentiable", "stop_gradient")


@dataclasses.dataclass(frozen=True)
class DescentConfig:
    """What the constrained step enforces. Hashable, so it can be a static argument.

    The static structure, fixed for every run of one compiled step: ``num_layers``,
    ``resilience_mode`` (``"slack"``: a slack u per constraint in the state), ``slack_lr``,
    ``slack_restart_steps``, ``warmup_steps`` and ``dual_scale``. ``epsilon``, ``reference``,
    ``resilience``, ``tail_beta`` and ``constrained`` are per-run values (the knobs of
    :mod:`cudt.knobs`, arrays in the state): here only the defaults ``init`` uses where a run
    gives none (the runner gives every run its own). α is a run's with explicit slacks too
    (their cost (α/2)‖u‖² reads it), finite there, as this default must be.

    Attributes:
      num_layers: L, the number of layers (per-layer losses have L+1 columns).
      epsilon: the descent factor ε_l ∈ [0, 1): a scalar, or L values (layer 1..L).
      reference: C of the reference constraint E ℓ_0 ≤ C, or None for no reference constraint.
      resilience: α of the resilient relaxation (cost (α/2)‖u‖²), or None for hard constraints.
      resilience_mode: "decay" — the dual update decays λ by λ/α (the optimal-slack form); or
        "slack" — explicit slacks u ≥ 0, updated by projected gradient descent on
        (α/2)‖u‖² − λ·u with learning rate ``slack_lr`` (the paper's video setting).
      slack_lr: learning rate of the explicit slacks.
      slack_restart_steps: with explicit slacks, reset u to 0 every this many steps (the
        paper's "resilience restarts" after every epoch); None for never.
      warmup_steps: primal warm-up: the multipliers stay frozen (at 0) for this many steps.
      constrained: False gives the ERM baseline through the same step: λ ≡ 0, no dual update.
      tail_beta: β of the tail constraint (:mod:`cudt.descent`, ``constraint="tail"``): the
        worst β-fraction of a batch's per-sample ratios must descend on average.
      dual_scale: ``"absolute"`` — the dual optimiser ascends the constraint values in the
        loss's units (the paper's; a dual rate then depends on the loss's scale); or
        ``"relative"`` — each in units of the loss it bounds (a stop-gradient of the batch's
        mean ℓ_{l−1}, of C for the reference): the dual step ascends the relative violation
        ``mean ℓ_l / mean ℓ_{l−1} − (1 − ε_l)``, so multipliers, dual rates, ρ and α are
        dimensionless and one dual rate means the same on pixel MSE and cross-entropy
        (:class:`cudt.Constraint`'s ``scale``). The Lagrangian, and so ERM, is the same in both.
      previous_loss: ``"differentiable"`` — ``ℓ_{l−1}`` enters ``ℓ_l − (1 − ε_l) ℓ_{l−1}`` as it
        is, so the constraint's gradient also raises the earlier state's loss with weight
        ``−(1 − ε_l) λ_l`` (the paper's); or ``"stop_gradient"`` — ``ℓ_{l−1}`` is a target
        (stop-gradient): the same constraint values, but no multiplier rewards a state for
        being worse than the next one, so the Lagrangian's gradient only lowers losses. ERM is
        the same in both (λ ≡ 0).
    """

    num_layers: int
    epsilon: float | Sequence[float] | np.ndarray = 0.1
    reference: float | None = None
    resilience: float | None = None
    resilience_mode: Literal["decay", "slack"] = "decay"
    slack_lr: float = 1e-2
    slack_restart_steps: int | None = None
    warmup_steps: int = 0
    constrained: bool = True
    tail_beta: float = 0.1
    dual_scale: Literal["absolute", "relative"] = "absolute"
    previous_loss: Literal["differentiable", "stop_gradient"] = "differentiable"

    def __post_init__(self):
        # the numbers as Python floats, so the config is hashable and one spelling: a numpy or
        # JAX scalar (a 0-d array) made it unhashable (no static jit argument, no JSON)
        for name in ("reference", "resilience", "tail_beta", "slack_lr"):
            optional = name in ("reference", "resilience")
            object.__setattr__(self, name, _number(name, getattr(self, name), optional))
        L = self.num_layers
        if isinstance(L, bool) or not isinstance(L, (int, np.integer)) or L < 1:
            raise ValueError(f"num_layers must be an integer >= 1, got {L!r}")
        eps = np.asarray(self.epsilon, dtype=np.float64)
        if eps.ndim == 0:
            eps = np.full((L,), float(eps))
        if eps.shape != (L,):
            raise ValueError(
                f"epsilon must be a scalar or {L} values (one per layer 1..{L}), "
                f"got shape {eps.shape}"
            )
        if not np.all((eps >= 0.0) & (eps < 1.0)):
            raise ValueError(f"epsilon must lie in [0, 1), got {eps.tolist()}")
        # Stored as a tuple so the config stays hashable (usable as a static jit argument).
        object.__setattr__(self, "epsilon", tuple(float(e) for e in eps))
        if self.reference is not None and not math.isfinite(float(self.reference)):
            raise ValueError(f"reference must be a finite number or None, got {self.reference}")
        if self.resilience is not None and not float(self.resilience) > 0:
            raise ValueError(f"resilience (alpha) must be > 0 or None, got {self.resilience}")
        if self.resilience_mode not in RESILIENCE_MODES:
            raise ValueError(
                f"resilience_mode must be 'decay' or 'slack', got {self.resilience_mode!r}"
            )
        if self.resilience_mode == "slack" and (
            self.resilience is None or not math.isfinite(float(self.resilience))
        ):
            raise ValueError(
                f"resilience_mode='slack' needs resilience=alpha > 0 and finite, got "
                f"{self.resilience}: pass a finite alpha, or resilience_mode='decay'"
            )
        if not self.slack_lr > 0:
            raise ValueError(f"slack_lr must be > 0, got {self.slack_lr}")
        if self.slack_restart_steps is not None and self.slack_restart_steps < 1:
            raise ValueError(
                f"slack_restart_steps must be >= 1 or None, got {self.slack_restart_steps}"
            )
        if not 0.0 < float(self.tail_beta) <= 1.0:
            raise ValueError(f"tail_beta must lie in (0, 1], got {self.tail_beta}")
        if self.dual_scale not in DUAL_SCALES:
            raise ValueError(
                f"dual_scale must be one of {', '.join(DUAL_SCALES)}, got {self.dual_scale!r}"
            )
        if self.previous_loss not in PREVIOUS_LOSSES:
            raise ValueError(
                f"previous_loss must be one of {', '.join(PREVIOUS_LOSSES)}, "
                f"got {self.previous_loss!r}"
            )
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {self.warmup_steps}")

    @property
    def epsilon_array(self) -> np.ndarray:
        """ε as float32 [L]."""
        return np.asarray(self.epsilon, dtype=np.float32)

    @property
    def uses_slacks(self) -> bool:
        # Static: an ERM run in a slack-mode group keeps u = 0 (its duals are frozen).
        return self.resilience is not None and self.resilience_mode == "slack"


def _number(name: str, value, optional: bool) -> float | None:
    """``value`` as a Python float (None stays None where ``optional``), or one ``ValueError``
    naming ``name``."""
    if value is None and optional:
        return None
    says = f"{name} must be a number{' or None' if optional else ''}, got {value!r}"
    if value is None or isinstance(value, (str, bytes)) or np.ndim(value) != 0:
        raise ValueError(says)
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(says) from None
