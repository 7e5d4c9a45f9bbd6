"""Power, equivalence and verdicts of faithfulness steps (attngeom.analysis.equivalence).

Reference values: statsmodels' power solvers (NormalIndPower, one-sample) and ``ttost_paired``,
scipy's one-sample t interval and Wilcoxon test, statsmodels' Holm, numpy for AOPC and SDs.
"""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr
from scipy import stats
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.power import NormalIndPower
from statsmodels.stats.weightstats import ttost_paired

import tolerance as tol
from attngeom.analysis import equivalence as eq

METRICS = ("attention", "value_weighted", "value_weighted_normalized", "contribution")
FRACTIONS = (0.01, 0.05, 0.2)
RANKS = ("signed", "magnitude")
MODES = ("comprehensiveness", "sufficiency")
# as a head-granularity run records them (extract/faithfulness/experiment.py ranking_plan)
HEAD_COPIES = {("attention", "magnitude"): "attention/signed",
               ("value_weighted", "magnitude"): "value_weighted/signed",
               ("value_weighted_normalized", "signed"): "value_weighted/signed",
               ("value_weighted_normalized", "magnitude"): "value_weighted/signed"}


def synthetic(effect, n=40, noise=0.05, seed=0, copies=None) -> xr.Dataset:
    """ppl = clean * exp(p * (base_u + effect[metric]) + noise): log ratios are linear in the
    effect; copies share the numbers of their source (metric, rank)."""
    rng = np.random.default_rng(seed)
    clean = rng.uniform(10, 30, n)
    base = rng.gamma(2.0, 0.5, n)
    log_ratio = np.empty((len(METRICS), 2, 2, len(FRACTIONS), n))
    for mi in range(len(METRICS)):
        for ri in range(2):
            for oi, sign in enumerate((1.0, -1.0)):
                for fi, p in enumerate(FRACTIONS):
                    log_ratio[mi, ri, oi, fi] = (p * 10 * (base + sign * effect[mi])
                                                 + rng.normal(0, noise, n))
    same = np.full((len(METRICS), 2), "", dtype=object)
    for (m, r), src in (copies or {}).items():
        sm, sr = src.split("/")
        log_ratio[METRICS.index(m), RANKS.index(r)] = log_ratio[METRICS.index(sm),
                                                                RANKS.index(sr)]
        same[METRICS.index(m), RANKS.index(r)] = src
    ppl = clean * np.exp(log_ratio)
    return xr.Dataset(
        {"ppl": (("metric", "rank", "mode", "fraction", "sequence"), ppl),
         "clean_ppl": (("sequence",), clean),
         "delta_ppl": (("metric", "rank", "mode", "fraction", "sequence"), ppl - clean),
         "same_ranking_as": (("metric", "rank"), same)},
        coords={"metric": list(METRICS), "rank": list(RANKS), "mode": list(MODES),
                "fraction": list(FRACTIONS), "sequence": np.arange(n)},
        attrs={"loss_variable": "delta_ppl", "unit_dim": "sequence", "granularity": "head"})


def manual_d(ds, mode, rank, lower, higher) -> np.ndarray:
    """Paired improvement of AOPC of log(ppl/clean) computed with numpy from the raw arrays."""
    x = np.log(ds["ppl"].values / ds["clean_ppl"].values)          # (M, R, O, F, S)
    a = x.mean(axis=3)
    mi, ri, oi = METRICS.index, RANKS.index(rank), MODES.index(mode)
    d = a[mi(higher), ri, oi] - a[mi(lower), ri, oi]
    return d if mode == "comprehensiveness" else -d


@pytest.mark.parametrize("n, m, sd", [(160, 6, 1.0), (96, 6, 2.5), (64, 30, 0.3), (20, 1, 1)])
def test_mde_matches_statsmodels_power_solver(n, m, sd):
    # one-sample one-sided z test: effect size (in SDs) detected with 80% power at level/m
    es = NormalIndPower().solve_power(effect_size=None, nobs1=n, alpha=0.05 / m, power=0.8,
                                      ratio=0, alternative="larger")
    # statsmodels' root finder stops within its tolerance: a measured spread
    tol.assert_close(eq.mde(sd, n, m), es * sd * np.sqrt(np.pi / 3), tol.POWER_SOLVER, "mde")
    tol.assert_close(eq.mde(sd, n, m, efficiency=1.0), es * sd, tol.POWER_SOLVER, "mde")
    # and exactly: a z test of the MDE (in SDs, efficiency 1) has 80% power; its argument
    # z_power = MDE sqrt(n) - z_alpha within a few ulp of each, Phi moves by its density
    power = NormalIndPower().power(eq.mde(sd, n, m, efficiency=1.0) / sd, nobs1=n,
                                   alpha=0.05 / m, ratio=0, alternative="larger")
    z = stats.norm.ppf(0.8)
    arg = tol.dot(16, abs(z) + stats.norm.isf(0.05 / m), tol.F64, vs=tol.F64).atol
    assert power == tol.Tol(atol=stats.norm.pdf(z) * arg).approx(0.8)


def test_mde_reproduces_the_designs_figures():
    # studies/README.md: at n = 160 and m = 6 about 0.26 paired SDs, at n = 96 about 0.34
    # (figures printed to two decimals: not a rounding-error bound)
    assert eq.mde(1.0, 160, 6) == pytest.approx(0.26, abs=0.005)
    assert eq.mde(1.0, 96, 6) == pytest.approx(0.34, abs=0.005)
    assert np.isnan(eq.mde(1.0, 1, 6)) and np.isnan(eq.mde(np.nan, 50, 6))


@pytest.mark.parametrize("shift, delta", [(0.0, 0.05), (0.03, 0.05), (-0.2, 0.1), (0.5, 0.2)])
def test_tost_matches_statsmodels_and_scipy(shift, delta):
    rng = np.random.default_rng(1)
    x2 = rng.normal(1, 1, 50)
    x1 = x2 + shift + rng.normal(0, 0.1, 50)
    d = x1 - x2
    got = eq.tost_paired(d, delta)
    p, lower, upper = ttost_paired(x1, x2, -delta, delta)
    # two one-sample t tests, of d + delta and of d - delta (upper: P(T < t) = P(T > -t))
    low, up = tol.t_test(d + delta, lower[0]), tol.t_test(d - delta, upper[0])
    assert got["tost_p_lower"] == low.approx(lower[1])
    assert got["tost_p_upper"] == up.approx(upper[1])
    assert got["p_tost"] == (low + up).approx(p)
    ci = stats.ttest_1samp(d, 0).confidence_interval(0.90)
    ends = tol.t_interval(d, (ci.high - ci.low) / 2)
    assert (got["ci90_low"], got["ci90_high"]) == ends.approx((ci.low, ci.high))
    inside = -delta < ci.low and ci.high < delta
    assert (got["p_tost"] < 0.05) == inside


def test_tost_without_spread_and_without_data():
    assert eq.tost_paired(np.full(5, 0.01), 0.05)["p_tost"] == 0.0
    assert eq.tost_paired(np.full(5, 0.2), 0.05)["p_tost"] == 1.0
    assert np.isnan(eq.tost_paired(np.array([0.1]), 0.05)["p_tost"])


def test_verdict_rules_in_the_designs_order():
    assert eq.verdict(0.01, 0.1, 0.5, 0.9) == eq.HOLDS
    assert eq.verdict(0.01, -0.1, 0.5, 0.9) == eq.INCONCLUSIVE      # CI not above 0
    assert eq.verdict(0.5, -0.01, 0.01, 0.01) == eq.EQUIVALENT
    assert eq.verdict(1.0, -0.5, -0.1, 0.9) == eq.REVERSED
    assert eq.verdict(1.0, -0.04, -0.01, 0.01) == eq.EQUIVALENT     # within ±δ comes first
    assert eq.verdict(np.nan, np.nan, np.nan, np.nan) == eq.NOT_TESTABLE


def test_log_ratio_and_margin():
    ds = synthetic([0, 0.1, 0.1, 0.2], n=12)
    got = eq.with_log_ppl_ratio(ds)[eq.LOG_RATIO]
    want = np.log(ds["ppl"].values / ds["clean_ppl"].values)     # a division, a log: u |log| + 2u
    tol.assert_close(got.values, want, tol.dot(2, 1 + np.abs(want), tol.F64, vs=tol.F64), "log")
    clean = ds["clean_ppl"].values
    assert eq.delta_ppl_margin(ds) == (tol.mean_of(clean) * 0.05 + tol.relative(
        1, tol.F64, vs=tol.F64)).approx(0.05 * clean.mean())
    with pytest.raises(ValueError, match="clean_ppl"):
        eq.log_ppl_ratio(ds.drop_vars("clean_ppl"))


def test_equivalence_table_on_a_head_granularity_run():
    # planted: attention << value_weighted (= vwn, copied) ~ contribution (no difference)
    ds = eq.with_log_ppl_ratio(synthetic([0.0, 0.5, 0.5, 0.5], n=60, noise=0.02,
                                         copies=HEAD_COPIES))
    t = eq.equivalence_table(ds, eq.DELTA_LOG, variable=eq.LOG_RATIO, n_resamples=999)
    assert list(t.columns[-len(eq.EXTRA_COLUMNS):]) == list(eq.EXTRA_COLUMNS)
    # distinct tests: per mode raw->vw once (both ranks copies), vwn->contrib per rank: 6
    assert (t["m_tests"] == 6).all()
    assert t.attrs["m_tests"] == 6
    for r in t.itertuples():
        d = manual_d(ds, r.mode, r.rank, r.lower, r.higher)
        if r.verdict == eq.NOT_TESTABLE:
            assert r.lower == "value_weighted" and r.higher == "value_weighted_normalized"
            assert np.isnan(r.mde) and np.isnan(r.p_tost) and not r.equivalent
            continue
        assert r.sd_improvement == tol.sd_of(d).approx(d.std(ddof=1))
        z = stats.norm.ppf(1 - 0.05 / 6) + stats.norm.ppf(0.8)
        c = z / np.sqrt(60) * np.sqrt(np.pi / 3)                     # the MDE: c x SD
        assert r.mde == (tol.sd_of(d) * c + tol.relative(8, tol.F64, vs=tol.F64)).approx(
            c * d.std(ddof=1))
        p, lower, upper = ttost_paired(d, np.zeros_like(d), -0.05, 0.05)
        assert r.p_tost == (tol.t_test(d + 0.05, lower[0]) + tol.t_test(d - 0.05, upper[0])
                            ).approx(p)
        if r.lower == "attention":
            assert r.verdict == eq.HOLDS
        else:                                         # vwn -> contribution: no difference
            assert r.verdict == eq.EQUIVALENT and abs(r.mean_improvement) < 0.05


def test_reversed_and_inconclusive_steps():
    ds = eq.with_log_ppl_ratio(synthetic([0.5, 0.0, 0.0, 0.0], n=40, noise=0.02))
    t = eq.equivalence_table(ds, eq.DELTA_LOG, variable=eq.LOG_RATIO, n_resamples=999)
    first = t[t["lower"] == "attention"]
    assert (first["verdict"] == eq.REVERSED).all() and first["reversed"].all()
    noisy = eq.with_log_ppl_ratio(synthetic([0.0, 0.02, 0.02, 0.04], n=6, noise=0.5, seed=3))
    t = eq.equivalence_table(noisy, eq.DELTA_LOG, variable=eq.LOG_RATIO, n_resamples=999)
    assert (t["verdict"] == eq.INCONCLUSIVE).all()
    assert (t["mde"] > 0.05).all()                    # what n = 6 could not have detected


def test_layer_table_holm_over_layers_matches_scipy_and_statsmodels():
    effects = {0: [0, 0.3, 0.3, 0.6], 3: [0, 0, 0, 0], 7: [0, 0.01, 0.01, -0.4]}
    runs = {layer: eq.with_log_ppl_ratio(synthetic(e, n=30, seed=layer, noise=0.1))
            for layer, e in effects.items()}
    steps = (("attention", "value_weighted"), ("value_weighted", "contribution"),
             ("attention", "contribution"))
    t = eq.layer_table(runs, steps, eq.DELTA_LOG, variable=eq.LOG_RATIO, n_resamples=199)
    assert list(t.columns) == list(eq.LAYER_COLUMNS)
    sub = t[(t["mode"] == "comprehensiveness") & (t["rank"] == "signed")]
    assert len(sub) == 9
    for lower, higher in steps:
        rows = sub[(sub["lower"] == lower) & (sub["higher"] == higher)].sort_values("layer")
        p = [stats.wilcoxon(manual_d(runs[L], "comprehensiveness", "signed", lower, higher),
                            alternative="greater").pvalue for L in rows["layer"]]
        # signed ranks (no ties here) and scipy's own p-values of them: exact; Holm's on them
        np.testing.assert_array_equal(rows["p_value"], p)
        np.testing.assert_array_equal(rows["p_holm"], multipletests(p, method="holm")[1])
        assert (rows["m_tests"] == 3).all()
    v = sub.set_index(["layer", "lower", "higher"])["verdict"]
    assert v[(0, "attention", "contribution")] == eq.HOLDS
    assert v[(3, "attention", "value_weighted")] == eq.EQUIVALENT
    assert v[(7, "value_weighted", "contribution")] == eq.REVERSED
