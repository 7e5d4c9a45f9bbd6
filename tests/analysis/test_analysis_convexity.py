"""Convexity: planted quadratics, CI coverage, null calibration, the analytic vertex."""

from __future__ import annotations

import numpy as np
import pytest
import statsmodels.api as sm
from scipy import optimize, stats

import tolerance as tol
from attngeom.analysis import convexity
from attngeom.analysis.convexity import (_cluster_sums, _vertex_from_sums, analytic_vertex,
                                         fit_quadratic, lowess_curve)
from synthetic_stores import geometric_store, plant_quadratic, random_store, to_compact

TRUE = (2.0, -3.0, 5.0)  # vertex 0.3
NULL = (2.0, 0.5, 0.0)


def _clustered(rng, n_seq=60, per_seq=20, beta=TRUE, seq_sd=0.3, noise_sd=0.3):
    g = np.repeat(np.arange(n_seq), per_seq)
    x = rng.uniform(0, 1, g.size)
    u = rng.normal(0, seq_sd, n_seq)[g]
    y = beta[0] + beta[1] * x + beta[2] * x**2 + u + rng.normal(0, noise_sd, g.size)
    return x, y, g


def test_planted_quadratic_recovered_in_both_layouts():
    betas = np.array([[TRUE, TRUE, NULL], [NULL, TRUE, (1.0, -1.6, 1.0)]])  # (L, H, 3)
    ds = plant_quadratic(random_store(n_seq=50, n_layer=2, n_head=3, n_pos=20, seed=4), betas)
    out = convexity(ds, n_boot=100, seed=1)
    # the planted curves, within sampling error (not rounding)
    np.testing.assert_allclose(out["beta2"].values, betas[..., 2], atol=0.6)
    np.testing.assert_allclose(out["beta1"].values, betas[..., 1], atol=0.6)
    planted = betas[..., 2] > 0
    vertex = np.where(planted, -betas[..., 1] / (2 * np.where(planted, betas[..., 2], 1)), 0)
    np.testing.assert_allclose(out["vertex"].values[planted], vertex[planted], atol=0.05)
    assert (out["q_value"].values[planted] < 1e-3).all()
    assert (out["p_value"].values[~planted] > 0.01).all()
    assert (out["interior_minimum"].values == planted).all()
    assert (out["interior_minimum_boot"].values == planted).all()
    lo, hi = out["vertex_boot_ci_low"].values, out["vertex_boot_ci_high"].values
    assert ((lo < vertex) & (vertex < hi))[planted].all()
    # the pooled fit of layer 0 mixes 2 convex heads and one linear head: still convex
    assert out["pooled_convex"].values[0] and out["pooled_n_obs"].values[0] == out[
        "n_obs"].values[0].sum()
    compact = convexity(to_compact(ds), n_boot=100, seed=1)
    for name in ("beta2", "vertex", "vertex_boot_ci_low", "q_value", "lowess"):
        np.testing.assert_array_equal(compact[name].values, out[name].values)   # same data
    # LOWESS follows the planted curve on the grid (sampling error)
    grid = out["grid"].values
    truth = TRUE[0] + TRUE[1] * grid + TRUE[2] * grid**2
    inner = (grid >= 0.1) & (grid <= 0.9)
    np.testing.assert_allclose(out["lowess"].values[0, 0][inner], truth[inner], atol=0.25)


def test_fit_matches_statsmodels_and_cluster_bootstrap_solution():
    rng = np.random.default_rng(3)
    x, y, g = _clustered(rng)
    fit = fit_quadratic(x, y, g, n_boot=0)
    X = sm.add_constant(np.column_stack([x, x**2]))
    ref = sm.OLS(y, X).fit(cov_type="cluster", cov_kwds={"groups": g}, use_t=True)
    # two float64 least-squares solutions (ours from sums, statsmodels' by pinv): kappa(X)^2
    fit_tol = tol.conditioned(len(y), np.linalg.cond(X) ** 2, tol.F64, vs=tol.F64)
    np.testing.assert_allclose([fit["beta0"], fit["beta1"], fit["beta2"]], ref.params,
                               atol=fit_tol.rtol * np.abs(ref.params).max())
    t = ref.tvalues[2]                   # its cluster-robust SE: the same kappa^2 once more
    assert fit["p_value"] == tol.p_value(t, 59, 2 * fit_tol.rtol).approx(stats.t.sf(t, 59))
    # a bootstrap resample solved from per-sequence sums = OLS on the resampled rows
    pick = rng.integers(0, 60, 60)
    rows = np.concatenate([np.flatnonzero(g == s) for s in pick])
    ols = sm.OLS(y[rows], X[rows]).fit().params
    got = _vertex_from_sums(_cluster_sums(x, y, g)[pick].sum(0))
    # -b1 / (2 b2): b1's and b2's relative errors add (each kappa^2 of the largest |b|)
    cond = np.linalg.cond(X[rows]) ** 2 * np.abs(ols).max() * (1 / abs(ols[1]) + 1 / abs(ols[2]))
    assert got == tol.conditioned(len(rows), cond, tol.F64, vs=tol.F64).approx(
        -ols[1] / (2 * ols[2]))


def test_vertex_ci_coverage():
    rng = np.random.default_rng(7)
    true = -TRUE[1] / (2 * TRUE[2])
    delta = boot = 0
    n_rep, n_boot_rep = 200, 40
    for rep in range(n_rep):
        x, y, g = _clustered(rng, n_seq=40, per_seq=10, noise_sd=0.6)
        fit = fit_quadratic(x, y, g, n_boot=200 if rep < n_boot_rep else 0, rng=rng)
        delta += fit["vertex_ci_low"] < true < fit["vertex_ci_high"]
        if rep < n_boot_rep:
            boot += fit["vertex_boot_ci_low"] < true < fit["vertex_boot_ci_high"]
    assert 0.89 <= delta / n_rep <= 0.99
    assert 0.8 <= boot / n_boot_rep <= 1.0


def test_null_curvature_is_calibrated():
    """No curvature: one-sided p-values are uniform and BH finds (almost) nothing."""
    betas = np.broadcast_to(np.array(NULL), (4, 8, 3))
    ds = plant_quadratic(random_store(n_seq=30, n_layer=4, n_head=8, n_pos=16, seed=8), betas,
                         seed=9)
    out = convexity(ds, n_boot=0)
    p = out["p_value"].values.ravel()
    assert stats.kstest(p, "uniform").pvalue > 0.01
    assert int((out["q_value"].values < 0.05).sum()) <= 1
    assert not out["interior_minimum"].values.any()


def test_analytic_vertex_minimizes_the_output_norm():
    """Against a numerical minimization of |a v0 + (1 - a) r_bar| built from the vectors."""
    ds, v, alpha = geometric_store(n_seq=4, n_layer=1, n_head=2, n_pos=10, d=4, seed=2,
                                   return_vectors=True)
    s = 0  # full length
    for h in range(2):
        for i in range(1, 10):
            a0 = alpha[s, 0, h, i, 0]
            r = np.einsum("k,kd->d", alpha[s, 0, h, i, 1:], v[s, 0, h, 1:])
            rbar, v0 = r / (1 - a0), v[s, 0, h, 0]
            f = lambda a: np.sum((a * v0 + (1 - a) * rbar) ** 2)              # noqa: E731
            brute = optimize.minimize_scalar(f, bracket=(-1, 2), options={"xtol": 1e-12}).x
            # near its minimum f moves by (a - a*)^2 |v0 - rbar|^2, its rounding by gamma(2d)
            # f(a*): the minimizer cannot tell a's closer than sqrt of their ratio (Brent)
            curvature = np.sum((v0 - rbar) ** 2)
            flat = np.sqrt(2 * tol.dot(2 * v0.size + 4, f(brute) + curvature, tol.F64).atol
                           / curvature)
            sel = dict(sequence=s, layer=0, head=h)
            got = analytic_vertex(a0, float(ds["value_norm"].sel(sel).sel(key=0)),
                                  float(ds["residual_norm"].sel(sel).sel(query=i)),
                                  float(ds["sink_residual_cosine"].sel(sel).sel(query=i)))
            assert got == tol.Tol(atol=2 * flat).approx(brute)
    out = convexity(ds, n_boot=0)
    assert np.isfinite(out["analytic_vertex_median"].values).all()
    assert (out["analytic_vertex_iqr_low"] <= out["analytic_vertex_median"]).all()


def test_analytic_vertex_needs_store_k_one():
    ds = geometric_store(n_seq=6, n_layer=1, n_head=2, n_pos=10, sink_k=2, seed=1)
    out = convexity(ds, n_boot=0)
    assert np.isnan(out["analytic_vertex_median"].values).all()
    assert "unavailable" in out.attrs["analytic_vertex"]


def test_lowess_is_nan_outside_the_data():
    rng = np.random.default_rng(0)
    x = rng.uniform(0.2, 0.6, 500)
    curve = lowess_curve(x, x**2, grid=np.linspace(0, 1, 11), rng=rng)
    assert np.isnan(curve[[0, 1, 7, 10]]).all()
    # a local linear fit of x^2: its bias (not rounding) is below 0.01 here
    np.testing.assert_allclose(curve[3:6], np.linspace(0, 1, 11)[3:6] ** 2, atol=0.01)


def _skewed_rows(n=5000, seed=0):
    """Sink rates crowded near 0 (as in real heads), a quadratic output norm, heavy-tailed noise."""
    rng = np.random.default_rng(seed)
    x = rng.beta(0.5, 2.0, n)
    return x, 20 + 30 * (x - 0.4) ** 2 + rng.standard_t(3, n)


def test_lowess_with_delta_zero_is_statsmodels_curve():
    from statsmodels.nonparametric.smoothers_lowess import lowess

    x, y = _skewed_rows(n=800)
    grid = np.linspace(0, 1, 21)[::-1]             # unsorted grid: returned in its order
    want = lowess(y, x, frac=0.3, it=1, xvals=grid)
    got = lowess_curve(x, y, grid=grid, delta=0.0)
    inside = (grid >= x.min()) & (grid <= x.max())
    np.testing.assert_allclose(got[inside], want[inside],                 # it=1: one refit
                               **tol.smoother(len(x), np.abs(y).max(), iterations=1))


def test_lowess_robustness_pass_with_delta_moves_the_curve_little():
    x, y = _skewed_rows()
    exact = lowess_curve(x, y, rng=1, delta=0.0)
    fast = lowess_curve(x, y, rng=1)
    span = np.nanmax(exact) - np.nanmin(exact)
    assert np.array_equal(np.isnan(fast), np.isnan(exact))
    assert np.nanmax(np.abs(fast - exact)) < tol.LOWESS_DELTA.atol * span   # the stated one
    other_subsample = lowess_curve(x, y, rng=2, delta=0.0)      # the subsample's own noise
    assert np.nanmax(np.abs(fast - exact)) < 0.2 * np.nanmax(np.abs(other_subsample - exact))
