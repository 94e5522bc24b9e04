"""Descent and feasibility metrics computed from per-sample layer losses [N, L+1], and the
scores of generated text against a reference answer (exact match, ROUGE-L).

These run on the host (numpy / Python) on held-out outputs gathered by an evaluation pass.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

__all__ = [
    "DescentStats",
    "FeasibilityVerdict",
    "descent_stats",
    "exact_match",
    "feasibility",
    "rmse_255",
    "rouge_l",
    "text_tokens",
    "trapezoid_auc",
]


@dataclasses.dataclass(frozen=True)
class DescentStats:
    """Per-sample descent behaviour: r_l = ℓ_l / ℓ_{l−1} over every sample and layer 1..L."""

    descent_rate: float  # fraction of (sample, layer) steps with ℓ_l < ℓ_{l−1}
    mean_ratio: float
    median_ratio: float
    ratios: np.ndarray  # [N, L]


def descent_stats(per_sample_losses: np.ndarray, tiny: float = 1e-12) -> DescentStats:
    """Descent statistics from per-sample losses [N, L+1] (the paper's 70.8% / 0.87 / 0.82)."""
    losses = np.asarray(per_sample_losses, np.float64)
    if losses.ndim != 2 or losses.shape[1] < 2:
        raise ValueError(f"per-sample losses must be [N, L+1] with L >= 1, got {losses.shape}")
    prev, curr = losses[:, :-1], losses[:, 1:]
    # A step from an exact-zero loss has no meaningful ratio; guard the division only.
    ratios = curr / np.maximum(prev, tiny)
    return DescentStats(
        descent_rate=float(np.mean(curr < prev)),
        mean_ratio=float(np.mean(ratios)),
        median_ratio=float(np.median(ratios)),
        ratios=ratios,
    )


@dataclasses.dataclass(frozen=True)
class FeasibilityVerdict:
    feasible: bool
    constraint: list[float]  # g_l on held-out data, [L+1] (index 0: reference, 0 if none)
    relative_violation: list[float]  # g_l / scale_l, compared with the tolerance
    tolerance: float


def feasibility(
    mean_losses: np.ndarray,
    epsilon: np.ndarray | float,
    reference: float | None = None,
    tolerance: float = 0.01,
) -> FeasibilityVerdict:
    """End-of-training verdict from held-out mean losses [L+1].

    Constraint l holds within tolerance when g_l ≤ tolerance · mean ℓ_{l−1} (relative, so the
    verdict does not depend on the loss scale); the reference one when g_0 ≤ tolerance · C.
    """
    m = np.asarray(mean_losses, np.float64)
    num_layers = m.shape[0] - 1
    eps = np.broadcast_to(np.asarray(epsilon, np.float64), (num_layers,))
    g = np.zeros(num_layers + 1)
    scale = np.ones(num_layers + 1)
    g[1:] = m[1:] - (1.0 - eps) * m[:-1]
    scale[1:] = np.maximum(np.abs(m[:-1]), 1e-12)
    if reference is not None:
        g[0] = m[0] - reference
        scale[0] = max(abs(reference), 1e-12)
    rel = g / scale
    ok = bool(np.all(np.isfinite(m)) and np.all(rel <= tolerance))
    return FeasibilityVerdict(ok, g.tolist(), rel.tolist(), tolerance)


def rmse_255(mse: np.ndarray | float) -> np.ndarray | float:
    """RMSE on the 0–255 pixel scale from an MSE of [0, 1] pixels."""
    return 255.0 * np.sqrt(mse)


def trapezoid_auc(xs, ys) -> float:
    """Area under ys(xs) by the trapezoid rule (the paper's accuracy AUC)."""
    xs, ys = np.asarray(xs, np.float64), np.asarray(ys, np.float64)
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
