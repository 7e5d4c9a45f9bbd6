"""analysis/lowess.py against statsmodels' public lowess: the curve at chosen x values, and the
fit at the points with ``delta`` (its robustness pass)."""

from __future__ import annotations

import numpy as np
import pytest
from statsmodels.nonparametric.smoothers_lowess import lowess

import tolerance as tol
from attngeom.analysis.lowess import fit_at_points, lowess_at


def _data(kind: str, n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.beta(0.5, 2.0, n)                        # skewed, like sink rates: sparse on the right
    if kind == "ties":
        x = np.round(x, 2)                           # many tied x values
    y = 20 + 30 * (x - 0.4) ** 2 + rng.standard_t(3, n)  # heavy tails: robustness matters
    if kind == "outliers":
        y[rng.choice(n, n // 20, replace=False)] += 200.0
    return x, y


CASES = [("smooth", 2000, 0.3), ("ties", 800, 0.3), ("outliers", 500, 0.5), ("smooth", 37, 0.3),
         ("smooth", 12, 0.3)]                        # the last: k = int(3.6) -> 3 neighbours


@pytest.mark.parametrize("kind,n,frac", CASES)
def test_curve_at_xvals_is_statsmodels(kind, n, frac):
    x, y = _data(kind, n)
    xvals = np.concatenate([np.linspace(0, 1, 41)[::-1], x[:5]])   # unsorted, with data points
    want = lowess(y, x, frac=frac, it=1, xvals=xvals)
    got = lowess_at(x, y, xvals, frac)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, **tol.smoother(n, np.abs(y).max(), iterations=1))


@pytest.mark.parametrize("kind,n,frac", CASES)
@pytest.mark.parametrize("delta", [0.0, 0.01, 0.1])
def test_fit_at_points_with_delta_is_statsmodels(kind, n, frac, delta):
    x, y = _data(kind, n, seed=1)
    d = delta * np.ptp(x)
    want = lowess(y, x, frac=frac, it=0, delta=d)          # (n, 2) sorted by x
    order = np.argsort(x)
    got = fit_at_points(x[order], y[order], frac, d)
    np.testing.assert_array_equal(want[:, 0], x[order])
    np.testing.assert_allclose(got, want[:, 1], **tol.smoother(n, np.abs(y).max(), iterations=0))


def test_delta_skips_fits_and_the_curve_moves_little():
    x, y = _data("smooth", 2000)
    grid = np.linspace(0.0, 1.0, 21)
    exact, fast = lowess_at(x, y, grid, 0.3), lowess_at(x, y, grid, 0.3, delta=0.01)
    span = np.nanmax(exact) - np.nanmin(exact)
    assert 0 < np.nanmax(np.abs(fast - exact)) < tol.LOWESS_DELTA.atol * span
