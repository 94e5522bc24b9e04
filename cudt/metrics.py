"""Descent and feasibility metrics computed from per-sample layer losses [N, L+1], and the
scores of generated text against a reference answer (exact match, ROUGE-L).

These run on the host (numpy / Python) on held-out outputs gathered by an evaluation pass.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

__all__ = [
    "RELATIVE_FLOOR",
    "DescentStats",
    "FeasibilityVerdict",
    "applicable_steps",
    "constraint_scales",
    "descent_stats",
    "exact_match",
    "feasibility",
    "loss_floor",
    "rmse_255",
    "rouge_l",
    "text_tokens",
    "trapezoid_auc",
]


# A per-sample ratio ℓ_l / ℓ_{l−1} is only meaningful when its denominator is on the scale of the
# data's losses: a denominator of 1e-9 turns any loss into a ratio of 1e6+ and one sample can own
# the mean. The floor is RELATIVE_FLOOR times the loss scale: by default the largest mean loss of
# any state over the evaluated samples (the scale the model works at: at γ_train = 0 the input
# state's loss is ~0 but the later states' are not). Ratios below it are excluded and counted; a
# descent constraint whose previous state's mean loss is at or below it is "not applicable".
RELATIVE_FLOOR = 1e-3


def loss_floor(mean_losses, scale: float | None = None) -> float:
    """The floor of a ratio's denominator: ``RELATIVE_FLOOR · scale``, ``scale`` by default the
    largest finite mean loss among the states ``mean_losses [L+1]`` (1e-12 at the least)."""
    if scale is None:
        m = np.asarray(mean_losses, np.float64)
        m = m[np.isfinite(m)]
        scale = float(np.max(np.abs(m))) if m.size else 0.0
    return max(RELATIVE_FLOOR * float(scale), 1e-12)


@dataclasses.dataclass(frozen=True)
class DescentStats:
    """Per-sample descent behaviour: r_l = ℓ_l / ℓ_{l−1} over every sample and layer 1..L whose
    denominator ℓ_{l−1} is above ``floor`` (the others are excluded, counted in ``excluded``)."""

    descent_rate: float  # fraction of (sample, layer) steps with ℓ_l < ℓ_{l−1}, of those kept
    mean_ratio: float  # NaN when every ratio is excluded
    median_ratio: float
    ratios: np.ndarray  # [N, L], NaN where excluded
    floor: float = 0.0  # the denominator floor used
    excluded: int = 0  # (sample, layer) ratios whose denominator was below the floor
    total: int = 0  # N · L
    non_finite: int = 0  # (sample, layer) steps with a NaN or infinite loss: excluded too

    @property
    def kept(self) -> np.ndarray:
        """The ratios that count, flat."""
        return self.ratios[np.isfinite(self.ratios)]

    def excluded_text(self) -> str:
        """``excluded: 12 of 640 (denominator below 1.2e-05)``, or empty when none was."""
        parts = [f"denominator below {self.floor:.3g}"] if self.excluded else []
        parts += [f"{self.non_finite} with a non-finite loss"] if self.non_finite else []
        if not parts:
            return ""
        return f"excluded: {self.excluded + self.non_finite} of {self.total} ({'; '.join(parts)})"


def descent_stats(per_sample_losses: np.ndarray, floor: float | None = None) -> DescentStats:
    """Descent statistics from per-sample losses [N, L+1] (the paper's 70.8% / 0.87 / 0.82).

    ``floor``: the smallest denominator ℓ_{l−1} a ratio may have (default :func:`loss_floor` of
    the per-state means of the finite losses, RELATIVE_FLOOR of the largest). Excluded ratios
    are NaN in ``ratios``, counted in ``excluded`` and left out of every statistic; so are the
    steps with a NaN or infinite loss on either side (a sample poisoned by a bad label),
    counted in ``non_finite``."""
    losses = np.asarray(per_sample_losses, np.float64)
    if losses.ndim != 2 or losses.shape[1] < 2:
        raise ValueError(f"per-sample losses must be [N, L+1] with L >= 1, got {losses.shape}")
    if floor is None:  # the scale of the finite losses: one NaN sample leaves every mean NaN
        finite_mean = np.where(np.isfinite(losses), losses, 0.0).sum(0) / np.maximum(
            np.isfinite(losses).sum(0), 1
        )
        floor = loss_floor(np.where(np.isfinite(losses).any(0), finite_mean, np.nan))
    prev, curr = losses[:, :-1], losses[:, 1:]
    finite = np.isfinite(prev) & np.isfinite(curr)
    keep = finite & (prev > floor)
    ratios = np.where(keep, curr / np.where(keep, prev, 1.0), np.nan)
    kept = ratios[keep]
    return DescentStats(
        descent_rate=float(np.mean(curr[keep] < prev[keep])) if kept.size else float("nan"),
        mean_ratio=float(np.mean(kept)) if kept.size else float("nan"),
        median_ratio=float(np.median(kept)) if kept.size else float("nan"),
        ratios=ratios,
        floor=float(floor),
        excluded=int(finite.sum() - keep.sum()),
        total=int(keep.size),
        non_finite=int(finite.size - finite.sum()),
    )


@dataclasses.dataclass(frozen=True)
class FeasibilityVerdict:
    feasible: bool
    constraint: list[float]  # g_l on held-out data, [L+1] (index 0: reference, 0 if none)
    relative_violation: list[float]  # g_l / scale_l, compared with the tolerance
    tolerance: float
    # [L+1]: False where a descent constraint's previous state's mean loss is at the floor (it
    # asks ℓ_l ≤ (1 − ε)·~0: infeasible by construction); left out of the verdict. Index 0 True.
    applicable: list[bool] = dataclasses.field(default_factory=list)

    @property
    def not_applicable(self) -> list[int]:
        """The layers l whose descent constraint is not applicable."""
        return [i for i, a in enumerate(self.applicable) if not a]


def constraint_scales(mean_losses: np.ndarray, reference: float | None = None) -> np.ndarray:
    """What each constraint's violation is measured against, ``[L+1]``: ``|mean ℓ_{l−1}|`` for
    descent constraint l and ``|C|`` for the reference (1 without one), each at least 1e-12."""
    m = np.asarray(mean_losses, np.float64)
    scale = np.ones(m.shape[0])
    scale[1:] = np.maximum(np.abs(m[:-1]), 1e-12)
    if reference is not None:
        scale[0] = max(abs(float(reference)), 1e-12)
    return scale


def applicable_steps(mean_losses, floor: float | None = None) -> np.ndarray:
    """``[L]``: the descent steps ``l−1 -> l`` that are judged, those whose earlier state's
    mean loss is above ``floor`` (default :func:`loss_floor` of ``mean_losses``): a state at
    the floor cannot be undercut. NaN stays applicable (and fails the judgment)."""
    m = np.asarray(mean_losses, np.float64)
    return ~(m[:-1] <= (loss_floor(m) if floor is None else floor))


def feasibility(
    mean_losses: np.ndarray,
    epsilon: np.ndarray | float,
    reference: float | None = None,
    tolerance: float = 0.01,
    floor: float | None = None,
    relaxation=None,
) -> FeasibilityVerdict:
    """End-of-training verdict from held-out mean losses [L+1].

    Constraint l holds within tolerance when g_l ≤ tolerance · mean ℓ_{l−1} (relative, so the
    verdict does not depend on the loss scale); the reference one when g_0 ≤ tolerance · C.
    A descent constraint whose mean ℓ_{l−1} is at or below ``floor`` (default
    :func:`loss_floor` of ``mean_losses``) is not applicable: reported, not judged.
    ``relaxation [L+1]`` (None: 0, the hard problem): a resilient run's own slacks in the same
    relative units (``u_l`` of ``mean ℓ_{l−1}``, ``u_0`` of C): constraint l then holds when
    g_l ≤ (u_l + tolerance) · mean ℓ_{l−1}, the relaxed problem the run solved.
    """
    m = np.asarray(mean_losses, np.float64)
    num_layers = m.shape[0] - 1
    eps = np.broadcast_to(np.asarray(epsilon, np.float64), (num_layers,))
    if floor is None:
        floor = loss_floor(m)
    g = np.zeros(num_layers + 1)
    g[1:] = m[1:] - (1.0 - eps) * m[:-1]
    if reference is not None:
        g[0] = m[0] - reference
    rel = g / constraint_scales(m, reference)
    applicable = np.ones(num_layers + 1, bool)
    applicable[1:] = applicable_steps(m, floor)
    bound = tolerance + (0.0 if relaxation is None else np.asarray(relaxation, np.float64))
    bound = np.broadcast_to(bound, rel.shape)
    ok = bool(np.all(np.isfinite(m)) and np.all(rel[applicable] <= bound[applicable]))
    return FeasibilityVerdict(ok, g.tolist(), rel.tolist(), tolerance, applicable.tolist())


def rmse_255(mse: np.ndarray | float) -> np.ndarray | float:
    """RMSE on the 0–255 pixel scale from an MSE of [0, 1] pixels."""
    return 255.0 * np.sqrt(mse)


def trapezoid_auc(xs, ys) -> float:
    """Area under ys(xs) by the trapezoid rule (the paper's accuracy AUC); NaN over fewer than
    two points, where there is no area (not 0, which reads as a measured one)."""
    xs, ys = np.asarray(xs, np.float64), np.asarray(ys, np.float64)
    if xs.size < 2:
        return float("nan")
    return float(np.sum(0.5 * (ys[1:] + ys[:-1]) * np.diff(xs)))


def text_tokens(text: str) -> list[str]:
    """Lower-cased alphanumeric words: the tokenization of Google's ``rouge_score`` (without
    stemming), so that punctuation and case do not count against an answer."""
    return re.sub(r"[^a-z0-9]+", " ", text.lower()).split()


def exact_match(candidate: str, reference: str) -> bool:
    """Whether two texts have the same words (case and punctuation ignored)."""
    return text_tokens(candidate) == text_tokens(reference)


def rouge_l(candidate: str, reference: str) -> float:
    """ROUGE-L F1 (Lin 2004): ``2PR / (P + R)`` with ``P = LCS / |candidate|`` and
    ``R = LCS / |reference|`` over :func:`text_tokens`, LCS the longest common subsequence.
    0 when either text has no words."""
    a, b = text_tokens(candidate), text_tokens(reference)
    if not a or not b:
        return 0.0
    row = [0] * (len(b) + 1)  # one row of the LCS table at a time
    for x in a:
        prev_diag = 0
        for j, y in enumerate(b, 1):
            prev_diag, row[j] = row[j], prev_diag + 1 if x == y else max(row[j], row[j - 1])
    lcs = row[-1]
    if lcs == 0:
        return 0.0
    p, r = lcs / len(a), lcs / len(b)
    return 2 * p * r / (p + r)
