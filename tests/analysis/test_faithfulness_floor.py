"""The floor and the order over every metric run (attngeom.analysis.faithfulness_floor) on
synthetic results with a planted order: each number against scipy/statsmodels/numpy applied to
the per-unit AOPCs written out here from the losses."""

from __future__ import annotations

import numpy as np
import xarray as xr
from scipy import stats
from statsmodels.stats.multitest import multipletests

import tolerance as tol
from attngeom.analysis import faithfulness_floor as floor
from attngeom.analysis._common import bootstrap_rng

METRICS = ("attention", "contribution", "random", "alti")
FRACTIONS = (0.1, 0.5)
# comprehensiveness: larger loss is better; sufficiency: smaller. random in between.
EFFECT = {"comprehensiveness": (2.0, 6.0, 0.0, 4.0), "sufficiency": (6.0, 2.0, 8.0, 4.0)}


def synthetic(n=25, seed=0, effect=EFFECT) -> xr.Dataset:
    rng = np.random.default_rng(seed)
    base = rng.gamma(4.0, 2.0, size=n)
    loss = np.empty((len(METRICS), 1, 2, len(FRACTIONS), n))
    for o, mode in enumerate(("comprehensiveness", "sufficiency")):
        for m in range(len(METRICS)):
            for f, p in enumerate(FRACTIONS):
                loss[m, 0, o, f] = (base + effect[mode][m]) * p + rng.normal(0, 0.4, n)
    return xr.Dataset({"delta_ppl": (("metric", "rank", "mode", "fraction", "sequence"), loss)},
                      coords={"metric": list(METRICS), "rank": ["signed"],
                              "mode": ["comprehensiveness", "sufficiency"],
                              "fraction": list(FRACTIONS), "sequence": np.arange(n)},
                      attrs={"loss_variable": "delta_ppl", "unit_dim": "sequence",
                             "granularity": "token"})


def _aopc(ds):
    return ds["delta_ppl"].values.mean(3)                  # (metric, rank, mode, unit)


def test_minmax_is_per_unit_between_the_lowest_and_highest_ranking():
    ds = synthetic()
    a = _aopc(ds)
    lo, hi = a.min(0), a.max(0)
    want = (a - lo) / (hi - lo)
    got = floor.aopc_minmax(ds).transpose("metric", "rank", "mode", "sequence").values
    # each AOPC a mean of the fractions' losses (both sides), then a difference over a
    # difference: the AOPCs' bounds over (hi - lo), and a few roundings of the quotient
    spread = (np.abs(a) + np.abs(lo) + np.abs(hi)) / (hi - lo)
    tol.assert_close(got, want, tol.dot(len(FRACTIONS) + 2, spread, tol.F64, vs=tol.F64)
                     + tol.relative(3, tol.F64, vs=tol.F64), "minmax")
    assert np.nanmin(got) == 0 and np.nanmax(got) == 1
    flat = synthetic(effect={k: (0.0,) * 4 for k in EFFECT})
    flat["delta_ppl"][:] = 1.0                           # every ranking alike: undefined
    assert np.isnan(floor.aopc_minmax(flat).values).all()


def test_versus_random_is_the_paired_difference_its_test_ci_and_the_ratio():
    ds = synthetic()
    a = _aopc(ds)
    t = floor.versus_random(ds, n_resamples=999, seed=4)
    assert list(t.columns) == list(floor.VS_RANDOM_COLUMNS) and len(t) == 6
    p = []
    for r in t.itertuples():
        o = ("comprehensiveness", "sufficiency").index(r.mode)
        x, b = a[METRICS.index(r.metric), 0, o], a[METRICS.index("random"), 0, o]
        d = (x - b) * (1 if o == 0 else -1)
        # d: two AOPCs (means over the fractions) subtracted, in either summation order
        each = tol.dot(len(FRACTIONS) + 1, np.mean(np.abs(x) + np.abs(b)), tol.F64, vs=tol.F64)
        assert r.mean_difference == (tol.mean_of(d) + each).approx(d.mean())
        # the signed-rank statistic is a sum of integer ranks: the same ranks, the same p
        assert r.p_value == stats.wilcoxon(d, alternative="greater").pvalue
        ci = stats.bootstrap((d,), np.mean, n_resamples=999, method="BCa",
                             **bootstrap_rng(np.random.default_rng(4))).confidence_interval
        ends = tol.ANALYSIS_FLOAT64 * float(np.max(np.abs((ci.low, ci.high))))
        assert (r.ci_low, r.ci_high) == ends.approx((ci.low, ci.high))
        # x / b of two means (their bounds, each AOPC's too): dx / |b| + |x / b| db / |b|, and
        # the quotient's rounding
        q = x.mean() / b.mean()
        dx, db = ((tol.mean_of(v) + tol.dot(len(FRACTIONS), np.mean(np.abs(v)), tol.F64,
                                            vs=tol.F64)).atol for v in (x, b))
        ratio = tol.Tol(atol=(dx + abs(q) * db) / abs(b.mean())) + tol.relative(1, tol.F64,
                                                                              vs=tol.F64)
        assert r.ratio_of_means == ratio.approx(q)
        assert r.ratio_ci_low < r.ratio_of_means < r.ratio_ci_high
        p.append(r.p_value)
    # Holm's adjustment of the table's own p-values: the same data, the same code
    np.testing.assert_array_equal(t["p_holm"], multipletests(p, method="holm")[1])
    # planted: every metric beats random in comprehensiveness; in sufficiency too (random's
    # effect is the largest loss)
    assert t["better"].all()


def test_versus_random_finds_nothing_when_the_metrics_are_random():
    t = floor.versus_random(synthetic(effect={k: (0.0,) * 4 for k in EFFECT}), n_resamples=499)
    assert not t["better"].any()


def test_the_ranking_recovers_the_planted_order_and_tests_it_two_sided():
    ds = synthetic()
    orders = floor.observed_orders(ds)
    assert orders[("comprehensiveness", "signed")] == ("random", "attention", "alti",
                                                       "contribution")
    assert orders[("sufficiency", "signed")] == ("random", "attention", "alti", "contribution")
    t = floor.ranking_table(ds, delta=0.5, n_resamples=999)
    assert list(t["position"]) == [1, 2, 3] * 2 and t["holds"].all()
    a = _aopc(ds)
    r = t.iloc[4]                                         # sufficiency: attention -> alti
    d = -(a[METRICS.index(r.higher), 0, 1] - a[METRICS.index(r.lower), 0, 1])
    assert r.p_value == stats.wilcoxon(d).pvalue          # two-sided; ranks: exact
