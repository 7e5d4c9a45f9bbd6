"""LOWESS (Cleveland 1979) with one robustness iteration, at chosen x values.

statsmodels' algorithm step for step (``statsmodels.nonparametric.smoothers_lowess.lowess``:
the k = frac * n nearest points, tricube weights, a weighted local line, bisquare robustness
weights from residuals over 6 x their median, ``delta`` as statsmodels defines it), vectorised
over the points fitted. It exists because the public function does not do what the analysis
needs: it refuses ``delta`` (statsmodels' advice for large n) together with ``xvals``, so a
curve at a grid would fit its robustness pass at every point (30-85 ms at 2,000 points by
machine, the analysis' largest fixed cost). Tested against the public function to 1e-10 of
the curve's scale, with ``delta`` on the points and without it at a grid
(tests/analysis/test_analysis_lowess.py).
"""

from __future__ import annotations

import numpy as np

CHUNK = 1 << 16     # (fitted points x neighbours) handled at a time


def n_neighbours(n: int, frac: float) -> int:
    """statsmodels' neighbourhood size: int(frac * n), at least 2, at most n."""
    return min(max(int(frac * n + 1e-10), 2), n)


def local_fit(xs: np.ndarray, ys: np.ndarray, at: np.ndarray, weights: np.ndarray, k: int,
              fallback: np.ndarray) -> np.ndarray:
    """Weighted local-line fits (m,) at ``at`` (m,), ascending, from sorted points (xs, ys) (n,).

    The neighbourhood of a value is the window of k consecutive points that statsmodels' scan
    ends on (it moves right while the value lies past the window's midpoint); ``weights`` (n,)
    multiply the tricube weights; where fewer than 2 weights exceed 1e-12, ``fallback``.
    """
    n = len(xs)
    mid = (xs[:n - k] + xs[k:]) / 2.0                 # (n - k,) window j's midpoint
    step = max(1, CHUNK // k)
    out = np.empty(len(at))
    for a in range(0, len(at), step):
        with np.errstate(divide="ignore", invalid="ignore"):    # rows not ok: replaced below
            out[a:a + step] = _fit_chunk(xs, ys, at[a:a + step], weights, k, mid,
                                         fallback[a:a + step])
    return out


def _fit_chunk(xs, ys, q, weights, k: int, mid, fallback) -> np.ndarray:
    """local_fit at q (m,): the windows (m, k), their weights and the weighted lines."""
    left = np.searchsorted(mid, q, side="left")                     # (m,) window starts
    idx = left[:, None] + np.arange(k)                              # (m, k)
    x = xs[idx]
    radius = np.maximum(q - xs[left], xs[left + k - 1] - q)[:, None]
    w = np.abs(x - q[:, None]) / radius
    w = 1.0 - w * w * w
    w = w * w * w * weights[idx]                                     # tricube x robustness
    ok = np.count_nonzero(w > 1e-12, axis=1) >= 2
    w /= w.sum(1, keepdims=True)
    centre = np.einsum("ij,ij->i", w, x)                             # weighted mean of x
    x -= centre[:, None]
    spread = np.maximum(np.einsum("ij,ij,ij->i", w, x, x), 1e-12)
    y = ys[idx]
    fit = (np.einsum("ij,ij->i", w, y)
           + (q - centre) / spread * np.einsum("ij,ij,ij->i", w, x, y))
    return np.where(ok, fit, fallback)


def fitted_points(xs: np.ndarray, delta: float) -> np.ndarray:
    """Indices of the sorted points xs that statsmodels fits when it skips those within
    ``delta`` of the last fit (ties of a fitted point share its fit; the rest interpolated)."""
    n, fit, i = len(xs), [], 0
    while True:
        fit.append(i)
        last = int(np.searchsorted(xs, xs[i], side="right")) - 1     # ties copy the fit
        if last >= n - 1:
            return np.asarray(fit)
        beyond = int(np.searchsorted(xs, xs[i] + delta, side="right"))
        i = max(min(beyond, n - 1) - 1, last + 1)


def fit_at_points(xs: np.ndarray, ys: np.ndarray, frac: float, delta: float = 0.0
                  ) -> np.ndarray:
    """LOWESS fit (n,) at the sorted points themselves (no robustness weights yet),
    statsmodels' ``delta`` applied."""
    at = fitted_points(xs, delta) if delta > 0 else np.arange(len(xs))
    fit = local_fit(xs, ys, xs[at], np.ones(len(xs)), n_neighbours(len(xs), frac), ys[at])
    return fit if delta <= 0 else np.interp(xs, xs[at], fit)


def robustness_weights(y: np.ndarray, fit: np.ndarray) -> np.ndarray:
    """Bisquare weights of the residuals over 6 x their median (all-or-none when it is 0)."""
    r = np.abs(y - fit)
    median = np.median(r)
    r = (r > 0).astype(float) if median == 0 else r / (6.0 * median)
    return (1.0 - np.minimum(r, 1.0) ** 2) ** 2


def lowess_at(x: np.ndarray, y: np.ndarray, xvals: np.ndarray, frac: float,
              delta: float = 0.0) -> np.ndarray:
    """LOWESS curve (len(xvals),) of y on x with one robustness iteration, at ``xvals``.

    The robustness weights come from a fit at the points with ``delta`` (as a share of
    range(x)); the curve from a fit at ``xvals`` with them, NaN where it cannot be fitted.
    ``delta = 0`` is statsmodels' ``lowess(y, x, frac, it=1, xvals=xvals)``.
    """
    order = np.argsort(x)                       # as statsmodels sorts (ties too)
    xs, ys = x[order], y[order]
    weights = robustness_weights(ys, fit_at_points(xs, ys, frac, delta * np.ptp(xs)))
    at = np.argsort(xvals)
    curve = np.empty(len(xvals))
    curve[at] = local_fit(xs, ys, xvals[at], weights, n_neighbours(len(xs), frac),
                          np.full(len(xvals), np.nan))
    return curve
