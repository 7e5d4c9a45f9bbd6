"""benchmarks/bench_length.py's arithmetic: growth exponents and the ratios its table prints."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

import tolerance as tol

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import bench_length as bl  # noqa: E402


def _slope_bound(T: np.ndarray, y: np.ndarray) -> tol.Tol:
    """A float64 least-squares slope sum (x - mean) y / sum (x - mean)^2 of n = len(T) points
    (scipy's linregress: the means, then the centred moments): the logs, the means and both
    sums, gamma(3n + 4) x sum |x - mean| |log y| / sum (x - mean)^2; and the data itself, k T^p
    rounded within gamma(3) relative (pow within 1 ulp, the product), so log y within gamma(3)
    absolute: gamma(3) x sum |x - mean| / sum (x - mean)^2."""
    x, y = np.log(T), np.log(y)
    c = np.abs(x - x.mean())
    return (tol.dot(3 * len(T) + 4, (c * np.abs(y)).sum() / (c ** 2).sum(), tol.F64)
            + tol.dot(3, c.sum() / (c ** 2).sum(), tol.F64))


def test_exponent_is_the_log_log_slope():
    T = np.array([512, 1024, 2048, 4096])
    for k, p in ((3e-6, 2.0), (7.0, 1.25)):
        y = k * T ** p
        np.testing.assert_allclose(bl.exponent(T, y), p, **_slope_bound(T, y))
    assert np.isnan(bl.exponent(T, [np.nan, np.nan, np.nan, 1.0]))   # one point: no slope


def test_table_ratios_compare_the_cases_the_targets_name():
    rows = []
    for T, k in ((512, 1), (1024, 4)):               # every time x4 when T doubles: exponent 2
        for case, wall, fwd, peak in (("sdpa", 10, 2, 1000), ("eager", 12, 3, 1100),
                                      ("compact", 11, np.nan, 900), ("removal", 15, 6, 1650)):
            rows.append(dict(model="m", padded=False, length=T, case=case, wall_s=wall * k,
                             forward_s=fwd * k, peak_rss_mib=peak))
    text = "\n".join(bl.table(rows, "m", False))
    assert "| 512 |" in text and "1.10x, 0.90x" in text     # compact / sdpa: 11/10, 900/1000
    assert "2.00x, 1.50x" in text                          # removal / eager forward: 6/3, 1650/1100
    assert "sdpa 2.00, eager 2.00, compact 2.00, removal 2.00" in text


def test_removals_table_pairs_each_pass_with_the_eager_forward_of_its_round():
    opts = dict(model="m", length=512, rounds=2, granularity="head", fraction=0.1,
                child="removals")
    rows = []
    for r, (eager, slow) in enumerate(((2.0, 3.0), (4.0, 5.0))):  # the 2nd round twice as slow
        rows.append(dict(opts, **{"pass": "eager", "round": r, "wall_s": eager,
                                  "forward_cpu_s": 2 * eager, "peak_rss_mib": 1000.0}))
        rows.append(dict(opts, **{"pass": "contribution/sufficiency", "round": r,
                                  "wall_s": slow, "forward_cpu_s": 2 * slow,
                                  "peak_rss_mib": 1200.0}))
    text = "\n".join(bl.removals_table(rows))
    # paired: median(3/2, 5/4) = 1.375, not the ratio of medians 4/3
    assert "| contribution/sufficiency | 1.38x | 1.38x | 1.20x | 4.0 |" in text, text
    assert "one text of 512 tokens, 2 rounds, head granularity, p = 0.1" in text
