"""cudt.stats: t and bootstrap intervals over seeds and items, paired differences, bad input."""

import json
import math

import numpy as np
import pytest
import scipy.stats

from cudt import stats


@pytest.mark.parametrize("df", [1, 2, 3, 4, 9, 30])
@pytest.mark.parametrize("p", [0.9, 0.975, 0.995])
def test_t_quantile_matches_scipy(df, p):
    assert stats.t_quantile(p, df) == pytest.approx(scipy.stats.t.ppf(p, df), rel=1e-8)


def test_t_interval_values():
    v = np.array([0.86, 0.88, 0.905])
    iv = stats.t_interval(v)
    half = scipy.stats.t.ppf(0.975, 2) * v.std(ddof=1) / math.sqrt(3)
    assert iv.mean == pytest.approx(v.mean())
    assert (iv.low, iv.high) == pytest.approx((v.mean() - half, v.mean() + half))
    assert iv.n == 3 and iv.method == "t"
    assert str(iv) == f"{v.mean():.4g} [{iv.low:.4g}, {iv.high:.4g}] (t, n=3)"
    assert str(stats.t_interval(v, 0.975)).endswith("(t 97.5%, n=3)")  # not rounded to 98%
    assert json.loads(json.dumps(iv.as_dict()))["high"] == pytest.approx(iv.high)


def test_t_interval_covers_true_mean_about_95_percent():
    rng = np.random.default_rng(0)
    draws = rng.normal(1.5, 0.7, (200, 4))  # 200 experiments of 4 seeds
    covered = [stats.t_interval(d).low <= 1.5 <= stats.t_interval(d).high for d in draws]
    assert 0.90 <= np.mean(covered) <= 0.99


def test_bootstrap_covers_true_mean():
    rng = np.random.default_rng(1)
    draws = rng.normal(-2.0, 1.0, (200, 40))
    covered = [
        (lambda iv: iv.low <= -2.0 <= iv.high)(stats.bootstrap_interval(d, resamples=400, seed=i))
        for i, d in enumerate(draws)
    ]
    # the percentile bootstrap undercovers a little at n = 40
    assert 0.88 <= np.mean(covered) <= 0.99


def test_hierarchical_bootstrap_sees_seed_spread():
    # 3 seeds whose means differ a lot, little spread within a seed: resampling items alone
    # would give a narrow interval; resampling seeds first must widen it.
    rng = np.random.default_rng(2)
    seeds = np.array([0.0, 1.0, 2.0])[:, None] + 0.01 * rng.normal(size=(3, 200))
    two_level = stats.bootstrap_interval(seeds, resamples=2000)
    flat = stats.bootstrap_interval(seeds.reshape(-1), resamples=2000)
    assert two_level.n == 3 and flat.n == 600
    assert two_level.half_width > 10 * flat.half_width
    assert two_level.low <= 1.0 <= two_level.high


def test_bootstrap_is_deterministic_and_takes_a_statistic():
    x = np.random.default_rng(3).exponential(size=101)
    a = stats.bootstrap_interval(x, resamples=500, seed=7, statistic=np.median)
    b = stats.bootstrap_interval(x, resamples=500, seed=7, statistic=np.median)
    assert a == b
    assert a.mean == pytest.approx(np.median(x))
    assert a.low < a.mean < a.high


def test_pairing_narrows_correlated_differences():
    rng = np.random.default_rng(4)
    shared = rng.normal(0.0, 1.0, 5)  # per-seed effect that a and b share
    a = shared + 0.3 + 0.05 * rng.normal(size=5)
    b = shared + 0.05 * rng.normal(size=5)
    paired = stats.paired_t_interval(a, b)
    unpaired_half = stats.t_interval(a).half_width + stats.t_interval(b).half_width
    assert paired.method == "paired t"
    assert paired.mean == pytest.approx(np.mean(a - b))
    assert paired.half_width < 0.2 * unpaired_half
    assert paired.low > 0.0  # the shift is found once the shared spread is removed

    items_shared = rng.normal(0.0, 1.0, (3, 300))
    pa = items_shared + 0.1 + 0.02 * rng.normal(size=(3, 300))
    pb = items_shared + 0.02 * rng.normal(size=(3, 300))
    pboot = stats.paired_bootstrap_interval(pa, pb, resamples=1000)
    alone = stats.bootstrap_interval(pa, resamples=1000)
    assert pboot.mean == pytest.approx(pa.mean() - pb.mean())
    assert pboot.half_width < 0.2 * alone.half_width
    assert pboot.low > 0.0


def test_one_value_gives_no_interval():
    iv = stats.t_interval([0.7])
    assert iv.mean == 0.7 and iv.n == 1
    assert math.isnan(iv.low) and math.isnan(iv.high)
    assert str(iv) == "0.7 [no interval: n=1] (t, n=1)"
    assert iv.as_dict()["low"] is None
    assert math.isnan(stats.paired_t_interval([1.0], [0.5]).low)
    assert math.isnan(stats.bootstrap_interval([3.0]).high)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: stats.t_interval([1.0, float("nan")]), "non-finite"),
        (lambda: stats.t_interval([]), "empty"),
        (lambda: stats.t_interval(np.ones((2, 2))), "1-D"),
        (lambda: stats.t_interval([1.0, 2.0], level=1.5), "level"),
        (lambda: stats.paired_t_interval([1.0, 2.0], [1.0]), "same shape"),
        (lambda: stats.paired_t_interval([1.0, np.inf], [1.0, 2.0]), "non-finite"),
        (lambda: stats.bootstrap_interval(np.ones((2, 2, 2))), "1-D or 2-D"),
        (lambda: stats.bootstrap_interval([1.0, 2.0], resamples=0), "resamples"),
        (lambda: stats.paired_bootstrap_interval(np.ones((2, 3)), np.ones((3, 2))), "same shape"),
    ],
)
def test_bad_input_raises_value_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_level_mark_reads_an_interval_or_its_record_and_marks_only_those_spanning_zero():
    spans, above = stats.t_interval([-1.0, 1.0, 0.5]), stats.t_interval([1.0, 1.1, 1.2])
    assert stats.level_mark(spans) == stats.level_mark(spans.as_dict()) == " level"
    assert stats.level_mark(above) == stats.level_mark(above.as_dict()) == ""
    assert stats.level_mark({"low": None, "high": None}) == ""  # one value: no bounds, no claim
