"""Intervals over seeds and items: Student-t, paired t, and (hierarchical) percentile bootstrap.

Numpy only, on the host. Every function returns an :class:`Interval` (mean, low, high, n,
method), whose ``str`` is the one line a summary prints, e.g. ``0.882 [0.861, 0.903] (t, n=3)``.

* :func:`t_interval` over seeds: ``mean ± t_{n−1, (1+level)/2} · s / √n``. With one value there is
  no spread to estimate: ``low`` and ``high`` are NaN and the line says ``no interval``.
* :func:`paired_t_interval`: the t interval of ``a − b`` paired by position (seed), which removes
  the spread the two share (same data order, same initialisation).
* :func:`bootstrap_interval`: the percentile bootstrap of a statistic. ``[items]`` resamples
  items; ``[seeds, items]`` resamples seeds, then items within each resampled seed (two-level),
  so both sources of spread enter the interval.
* :func:`paired_bootstrap_interval`: ``stat(a) − stat(b)`` with the same resampled indices for
  both, ``a`` and ``b`` aligned item by item.

Bad input (NaN or infinite values, empty or mismatched arrays, a level outside (0, 1)) raises
``ValueError`` naming what is wrong.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np

__all__ = [
    "Interval",
    "bootstrap_interval",
    "level_mark",
    "paired_bootstrap_interval",
    "paired_t_interval",
    "t_interval",
    "t_quantile",
]


def _fmt(x: float) -> str:
    return "nan" if math.isnan(x) else f"{x:.4g}"


@dataclasses.dataclass(frozen=True)
class Interval:
    """A point estimate and a two-sided interval at ``level`` from ``n`` values (seeds or items)."""

    mean: float
    low: float
    high: float
    n: int
    method: str  # "t", "paired t", "bootstrap", "paired bootstrap"
    level: float = 0.95

    def __str__(self) -> str:
        tag = self.method if self.level == 0.95 else f"{self.method} {100 * self.level:g}%"
        if math.isnan(self.low) or math.isnan(self.high):
            return f"{_fmt(self.mean)} [no interval: n={self.n}] ({tag}, n={self.n})"
        return f"{_fmt(self.mean)} [{_fmt(self.low)}, {_fmt(self.high)}] ({tag}, n={self.n})"

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def as_dict(self) -> dict:
        """JSON-ready: NaN (no interval) becomes ``None``."""

        def num(x: float):
            return None if math.isnan(x) else float(x)

        return {
            "mean": num(self.mean),
            "low": num(self.low),
            "high": num(self.high),
            "n": int(self.n),
            "method": self.method,
            "level": float(self.level),
            "text": str(self),
        }


def level_mark(iv: Interval | dict) -> str:
    """`` level`` where an interval (an :class:`Interval`, or its :meth:`Interval.as_dict`)
    spans 0, so no difference is claimed; else "" (one without bounds too). Every claim line
    marks its intervals by it."""
    low, high = (iv.low, iv.high) if isinstance(iv, Interval) else (iv["low"], iv["high"])
    return " level" if low is not None and high is not None and low <= 0 <= high else ""


def _check_level(level: float) -> float:
    level = float(level)
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    return level


def _finite(values, name: str, ndims: tuple[int, ...]) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim not in ndims:
        want = " or ".join(f"{d}-D" for d in ndims)
        raise ValueError(f"{name} must be {want}, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name} is empty")
    bad = ~np.isfinite(arr)
    if bad.any():
        raise ValueError(
            f"{name} holds {int(bad.sum())} non-finite value(s) (NaN or inf) of {arr.size}; "
            "drop or fix them before asking for an interval"
        )
    return arr


def _same_shape(a: np.ndarray, b: np.ndarray) -> None:
    if a.shape != b.shape:
        raise ValueError(f"paired values must have the same shape, got {a.shape} and {b.shape}")


# ---- Student-t quantile (no scipy): regularised incomplete beta by Lentz's continued fraction


def _betacf(a: float, b: float, x: float) -> float:
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    lbeta = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
    front = math.exp(lbeta + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def _t_sf_two_sided(t: float, df: float) -> float:
    """P(|T| > t) for T ~ Student-t(df), t >= 0."""
    return _betainc(df / 2.0, 0.5, df / (df + t * t))


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student-t with ``df`` degrees of freedom (p in (0.5, 1))."""
    if not 0.5 <= p < 1.0 or df <= 0:
        raise ValueError(f"t_quantile needs p in [0.5, 1) and df > 0, got p={p}, df={df}")
    target = 2.0 * (1.0 - p)  # two-sided tail mass beyond the quantile
    lo, hi = 0.0, 1.0
    while _t_sf_two_sided(hi, df) > target:
        hi *= 2.0
    for _ in range(200):  # bisection: the tail mass falls monotonically in t
        mid = 0.5 * (lo + hi)
        if _t_sf_two_sided(mid, df) > target:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


# ---- t intervals over seeds


def _t(values: np.ndarray, level: float, method: str) -> Interval:
    n = values.size
    mean = float(values.mean())
    if n < 2:
        return Interval(mean, math.nan, math.nan, n, method, level)
    half = t_quantile(0.5 + level / 2.0, n - 1) * float(values.std(ddof=1)) / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n, method, level)


def t_interval(values, level: float = 0.95) -> Interval:
    """Student-t interval of the mean of ``values`` (one per seed); n == 1 gives no interval."""
    return _t(_finite(values, "values", (1,)), _check_level(level), "t")


def paired_t_interval(a, b, level: float = 0.95) -> Interval:
    """Student-t interval of the mean of ``a − b``, paired by position (seed)."""
    a, b = _finite(a, "a", (1,)), _finite(b, "b", (1,))
    _same_shape(a, b)
    return _t(a - b, _check_level(level), "paired t")


# ---- percentile bootstrap, one or two levels

_CHUNK = 1 << 22  # resampled values held at once (float64: 32 MiB)


def _resample_stats(
    arrays: list[np.ndarray], statistic: Callable, resamples: int, seed: int
) -> list[np.ndarray]:
    """For each array (all the same shape, [items] or [seeds, items]): ``statistic`` of each of
    ``resamples`` resamples, the same indices for every array. Returns [resamples] per array."""
    shape = arrays[0].shape
    rng = np.random.default_rng(seed)
    per = int(np.prod(shape))
    chunk = max(1, _CHUNK // per)
    out = [np.empty(resamples) for _ in arrays]
    for start in range(0, resamples, chunk):
        r = min(chunk, resamples - start)
        if len(shape) == 1:
            idx = rng.integers(0, shape[0], (r, shape[0]))
            picks = [arr[idx] for arr in arrays]  # [r, items]
        else:
            s, i = shape
            seeds = rng.integers(0, s, (r, s))  # seeds first ...
            items = rng.integers(0, i, (r, s, i))  # ... then items within each drawn seed
            picks = [arr[seeds[..., None], items].reshape(r, s * i) for arr in arrays]
        for o, p in zip(out, picks, strict=True):
            o[start : start + r] = statistic(p, axis=-1)
    return out


def _bootstrap(arrays, stat_of, statistic, level, resamples, seed, method) -> Interval:
    level = _check_level(level)
    if int(resamples) < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    shape = arrays[0].shape
    n = shape[0]
    mean = float(stat_of([statistic(arr.reshape(-1)) for arr in arrays]))
    if arrays[0].size < 2:
        return Interval(mean, math.nan, math.nan, n, method, level)
    stats = stat_of(_resample_stats(arrays, statistic, int(resamples), int(seed)))
    low, high = np.quantile(stats, [(1 - level) / 2, (1 + level) / 2])
    return Interval(mean, float(low), float(high), n, method, level)


def bootstrap_interval(
    samples,
    *,
    level: float = 0.95,
    resamples: int = 10000,
    seed: int = 0,
    statistic: Callable = np.mean,
) -> Interval:
    """Percentile bootstrap interval of ``statistic`` over ``samples``.

    ``samples`` is ``[items]`` or ``[seeds, items]``; the latter resamples seeds, then items
    within each resampled seed. ``statistic(x, axis=-1)`` must reduce the last axis (np.mean,
    np.median, ...). ``n`` is the number of items (1-D) or seeds (2-D)."""
    arr = _finite(samples, "samples", (1, 2))
    return _bootstrap([arr], lambda s: s[0], statistic, level, resamples, seed, "bootstrap")


def paired_bootstrap_interval(
    a,
    b,
    *,
    level: float = 0.95,
    resamples: int = 10000,
    seed: int = 0,
    statistic: Callable = np.mean,
) -> Interval:
    """Percentile bootstrap interval of ``statistic(a) − statistic(b)``, ``a`` and ``b`` aligned
    ``[items]`` or ``[seeds, items]``, resampled with the same indices."""
    a, b = _finite(a, "a", (1, 2)), _finite(b, "b", (1, 2))
    _same_shape(a, b)
    return _bootstrap(
        [a, b], lambda s: s[0] - s[1], statistic, level, resamples, seed, "paired bootstrap"
    )
