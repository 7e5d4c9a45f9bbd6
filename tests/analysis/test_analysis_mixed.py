"""The per-layer mixed model: the balanced closed-form path against statsmodels MixedLM itself."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import statsmodels.api as sm

import tolerance as tol
from attngeom.analysis.anti_alignment import balanced_random_intercept, mixed_less_than_zero


def mixedlm(y, g, **fit):
    """The estimator as it was: statsmodels MixedLM, REML, default or tightened optimizer."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = sm.MixedLM(y, np.ones((len(y), 1)), groups=g).fit(reml=True, **fit)
    return float(res.fe_params[0]), float(res.bse_fe[0]), float(res.cov_re[0, 0] / res.scale)


def draw(rng, n_groups, n_per, sd_between, mean=-0.1, sd_within=0.3):
    g = np.repeat(np.arange(n_groups) * 7 + 3, n_per)        # sequence ids, not 0..G-1
    y = mean + rng.normal(0, sd_between, n_groups)[g // 7] + rng.normal(0, sd_within, len(g))
    return y, g


@pytest.mark.parametrize("n_groups,n_per,sd_between", [
    (50, 9, 0.3), (80, 9, 0.05), (30, 4, 1.0),                # interior REML optimum
    (40, 6, 0.0), (60, 9, 0.001)])                             # at or near the boundary
def test_balanced_fit_is_the_reml_optimum(n_groups, n_per, sd_between):
    rng = np.random.default_rng(n_groups + n_per)
    y, g = draw(rng, n_groups, n_per, sd_between)
    est, se, converged = balanced_random_intercept(y, g)
    assert converged
    tight = mixedlm(y, g, gtol=1e-12, maxiter=500)
    default = mixedlm(y, g)
    # balanced: the GLS mean is the grand mean whatever the variance ratio, so rounding only
    assert est == tol.mean_of(y).approx(tight[0])
    # BFGS stops within its gradient tolerance, not at the optimum (the exact se: the closed
    # form below); at the boundary MixedLM stops at a variance ratio of ~1e-9 instead of 0
    tol.assert_close(se, tight[1], tol.MIXEDLM_TIGHT if tight[2] > 1e-6
                     else tol.MIXEDLM_TIGHT_BOUNDARY, "se")
    tol.assert_close(np.array([est, se]), default[:2], tol.MIXEDLM_OPTIMIZER, "est, se")
    # independent closed form: se^2 = MSB / N inside, SST / ((N - 1) N) at the boundary
    means = np.array([y[g == u].mean() for u in np.unique(g)])
    msb = n_per * means.var(ddof=1)
    msw = sum(((y[g == u] - y[g == u].mean()) ** 2).sum() for u in np.unique(g)) / (
        len(y) - n_groups)
    want = np.sqrt(msb / len(y)) if msb > msw else y.std(ddof=1) / np.sqrt(len(y))
    # two float64 routes to a variance of n values (of means, or of y): gamma(2n + 8) x
    # mean(x^2) / var(x), relative; the SD half of it
    cond = max((means ** 2).mean() / means.var(), (y ** 2).mean() / y.var())
    np.testing.assert_allclose(se, want, **tol.conditioned(2 * len(y) + 8, cond, tol.F64,
                                                           vs=tol.F64))


def test_unbalanced_uses_mixedlm_from_anova_start():
    rng = np.random.default_rng(5)
    y, g = draw(rng, 40, 6, 0.2)
    keep = rng.random(len(y)) > 0.15
    y, g = y[keep], g[keep]
    assert balanced_random_intercept(y, g) is None
    out = mixed_less_than_zero(y, g)
    tight = mixedlm(y, g, gtol=1e-12, maxiter=500)
    tol.assert_close(np.array([out["mixed_mean_cos"], out["mixed_se"]]), tight[:2],
                     tol.MIXEDLM_OPTIMIZER, "est, se")
    assert out["mixed_converged"] == 1.0


def test_p_value_and_nan_handling():
    rng = np.random.default_rng(9)
    y, g = draw(rng, 30, 5, 0.1, mean=-0.2)
    y[:5] = np.nan                                             # one whole group missing
    out = mixed_less_than_zero(y, g)
    ok = np.isfinite(y)
    est, se, _ = mixedlm(y[ok], g[ok], gtol=1e-12, maxiter=500)
    from scipy import stats
    # z = est / se within the optimizer's spread (twice: est and se): P(Z < z) moves by the
    # normal density (Student's with df = inf) at z times |z| times that
    z = est / se
    np.testing.assert_allclose(out["mixed_p_value"], stats.norm.cdf(z), **tol.p_value(
        z, np.inf, 2 * tol.MIXEDLM_OPTIMIZER.rtol))
    assert out["mixed_p_value"] < 0.05
    few = mixed_less_than_zero(y[:15], g[:15])                 # 2 finite groups: no fit
    assert np.isnan(few["mixed_mean_cos"]) and np.isnan(few["mixed_converged"])
