"""Convexity of the head output norm in the sink rate.

Per (layer, head), and pooled over the heads of a layer, ``output_norm ~ b0 + b1 a + b2 a^2`` with
a = alpha_i0 (queries i >= k), fitted by statsmodels OLS with standard errors clustered by
sequence (t reference with G - 1 degrees of freedom). Curvature is tested one-sided (H1: b2 > 0),
with Benjamini-Hochberg q-values over all (layer, head) fits (and separately over layers for the
pooled fits). The vertex a* = -b1 / (2 b2) gets a delta-method CI (cluster covariance) and a
percentile CI from a sequence-cluster bootstrap (scipy.stats.bootstrap resampling sequences; each
resample's OLS fit is solved from per-sequence sums of the normal equations, which equals the OLS
fit to the resampled rows). The geometry gives each query's own minimizer, with
r_bar = r / (1 - alpha_0):  a*_i = (|r_bar|^2 - <v_0, r_bar>) / |v_0 - r_bar|^2, computed from
value_norm (key 0), residual_norm, sink_residual_cosine and alpha_0; it needs a store written with
k = 1 (``residual_norm`` excludes the k store sink keys) and is NaN otherwise.

Output names (stable), :func:`convexity`, over (layer, head) and with a ``pooled_`` prefix over
(layer): ``beta0 beta1 beta2 beta2_se p_value q_value vertex vertex_se vertex_ci_low
vertex_ci_high vertex_boot_ci_low vertex_boot_ci_high convex interior_minimum
interior_minimum_boot n_obs n_sequences analytic_vertex_median analytic_vertex_iqr_low
analytic_vertex_iqr_high``; ``lowess`` over (layer, head, grid) and ``pooled_lowess`` over
(layer, grid). ``convex`` = b2 > 0 and q < level; ``interior_minimum`` = convex and the delta CI
of the vertex inside (0, 1); ``interior_minimum_boot`` the same with the bootstrap CI.
"""

from __future__ import annotations

import warnings
from concurrent.futures import FIRST_COMPLETED, Future, wait

import numpy as np
import statsmodels.api as sm
import xarray as xr
from scipy import stats

from attngeom.store.format import schema as S
from attngeom.common.vocab import LEVEL, N_BOOT, SEED, SINK

from ._common import bootstrap_rng, fdr, one_sided_from_two, shared_docs, with_provenance
from .blocks import DEFAULT_BLOCK_ELEMENTS, Block, describe, require, run_pass
from .lowess import lowess_at

FIT_NAMES = ("beta0", "beta1", "beta2", "beta2_se", "p_value", "vertex", "vertex_se",
             "vertex_ci_low", "vertex_ci_high", "vertex_boot_ci_low", "vertex_boot_ci_high",
             "n_obs", "n_sequences", "analytic_vertex_median", "analytic_vertex_iqr_low",
             "analytic_vertex_iqr_high")
DEFAULT_GRID = np.linspace(0.0, 1.0, 21)
GRID = "grid"  # result dimension: sink rates at which the LOWESS curve is given
LOWESS_DELTA = 0.01  # LOWESS robustness pass: points within this share of range(x) interpolated
LOWESS_POINTS = 2000  # LOWESS curve: at most this many (x, y) points, a random subsample beyond


def _cluster_sums(x: np.ndarray, y: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """(G, 8) per-cluster sums [n, x, x^2, x^3, x^4, y, xy, x^2 y] of the normal equations."""
    _, g = np.unique(groups, return_inverse=True)
    cols = [np.ones_like(x), x, x**2, x**3, x**4, y, x * y, x**2 * y]
    return np.stack([np.bincount(g, weights=c) for c in cols], axis=1)


def _vertex_from_sums(tot: np.ndarray) -> np.ndarray:
    """Vertex -b1/(2 b2) of the OLS fit whose normal-equation sums are ``tot`` (..., 8)."""
    n, s1, s2, s3, s4, t0, t1, t2 = np.moveaxis(tot, -1, 0)
    xtx = np.stack([np.stack([n, s1, s2], -1), np.stack([s1, s2, s3], -1),
                    np.stack([s2, s3, s4], -1)], -2)
    xty = np.stack([t0, t1, t2], -1)[..., None]
    beta = (np.linalg.pinv(xtx) @ xty)[..., 0]
    with np.errstate(divide="ignore", invalid="ignore"):
        return -beta[..., 1] / (2 * beta[..., 2])


def bootstrap_vertex_ci(x, y, groups, n_boot: int, rng, level: float = LEVEL):
    """Percentile CI of the vertex from a bootstrap that resamples whole clusters (sequences)."""
    sums = _cluster_sums(x, y, groups)
    if n_boot <= 0 or len(sums) < 3:
        return np.nan, np.nan

    def statistic(idx, axis=-1):
        return _vertex_from_sums(sums[np.asarray(idx, dtype=np.int64)].sum(axis=-2))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = stats.bootstrap((np.arange(len(sums)),), statistic, n_resamples=n_boot,
                              vectorized=True, batch=64, method="percentile",
                              confidence_level=1 - level, **bootstrap_rng(rng))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def fit_quadratic(x: np.ndarray, y: np.ndarray, groups: np.ndarray, *, n_boot: int = N_BOOT,
                  rng=None, level: float = LEVEL) -> dict[str, float]:
    """OLS of y on (1, x, x^2), sequence-clustered; one-sided curvature test and vertex CIs."""
    out = dict.fromkeys(FIT_NAMES, np.nan)
    n_groups = len(np.unique(groups))
    out.update(n_obs=float(len(x)), n_sequences=float(n_groups))
    if n_groups < 3 or len(x) < 5 or np.ptp(x) == 0:
        return out
    X = np.column_stack([np.ones_like(x), x, x**2])
    with warnings.catch_warnings():     # few clusters: a cluster covariance may be singular
        warnings.simplefilter("ignore")
        res = sm.OLS(y, X).fit(cov_type="cluster", cov_kwds={"groups": groups}, use_t=True)
        bse, pvalues, tvalues, cov = res.bse, res.pvalues, res.tvalues, res.cov_params()
    b0, b1, b2 = res.params
    vertex = -b1 / (2 * b2) if b2 != 0 else np.nan
    grad = np.array([0.0, -1 / (2 * b2), b1 / (2 * b2**2)]) if b2 != 0 else np.full(3, np.nan)
    with np.errstate(invalid="ignore"):
        se = float(np.sqrt(grad @ cov @ grad))            # NaN when not positive
    crit = stats.t.ppf(1 - level / 2, n_groups - 1)
    out.update(beta0=b0, beta1=b1, beta2=b2, beta2_se=bse[2], vertex=vertex, vertex_se=se,
               vertex_ci_low=vertex - crit * se, vertex_ci_high=vertex + crit * se,
               p_value=one_sided_from_two(pvalues[2], tvalues[2], greater=True))
    out["vertex_boot_ci_low"], out["vertex_boot_ci_high"] = bootstrap_vertex_ci(
        x, y, groups, n_boot, rng, level)
    return out


def analytic_vertex(alpha0, value_norm0, residual_norm, sink_residual_cosine) -> np.ndarray:
    """Per-query minimizer of |a v_0 + (1 - a) r_bar|^2 over a, r_bar = r / (1 - alpha_0)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        rbar = residual_norm / (1 - alpha0)
        dot = value_norm0 * rbar * sink_residual_cosine
        denom = value_norm0**2 + rbar**2 - 2 * dot
        out = (rbar**2 - dot) / denom
    return np.where((alpha0 < 1) & (denom > 0), out, np.nan)


def lowess_curve(x, y, grid=DEFAULT_GRID, max_points: int = LOWESS_POINTS, rng=None,
                 frac: float = 0.3, delta: float = LOWESS_DELTA) -> np.ndarray:
    """LOWESS of y on x (one robustness iteration) at ``grid``, NaN outside the observed x range.

    statsmodels' ``lowess(y, x, frac, it=1, xvals=grid)`` gets the robustness weights from a
    local fit at every point (80 ms at 2,000 points, the analysis' largest fixed cost). Here that
    pass skips points within ``delta * range(x)`` of the last fitted one and interpolates them
    (statsmodels' ``delta``, which it advises at 0.01); the curve is then fitted at ``grid`` with
    those weights, as statsmodels does (:func:`.lowess.lowess_at`). ``delta = 0`` gives
    statsmodels' curve.
    """
    if len(x) < 10 or np.ptp(x) == 0:
        return np.full(len(grid), np.nan)
    if len(x) > max_points:
        pick = np.random.default_rng(rng).choice(len(x), max_points, replace=False)
        x, y = x[pick], y[pick]
    grid = np.asarray(grid, float)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        curve = lowess_at(np.asarray(x, float), np.asarray(y, float), grid, frac, delta)
    return np.where((grid >= x.min()) & (grid <= x.max()), curve, np.nan)


def _fit_rows(rows, rng, n_boot, level, grid, lowess_points) -> tuple[dict, np.ndarray]:
    """Quadratic fit, analytic-vertex quartiles and LOWESS curve of one head's (or the pooled)
    rows (x, y, sequence, analytic vertex) gathered block by block."""
    x, y, g, star = (np.concatenate(c) for c in zip(*rows))
    fit = fit_quadratic(x, y, g, n_boot=n_boot, rng=rng, level=level)
    star = star[np.isfinite(star)]
    if star.size:
        lo, med, hi = np.percentile(star, [25, 50, 75])
        fit.update(analytic_vertex_median=med, analytic_vertex_iqr_low=lo,
                   analytic_vertex_iqr_high=hi)
    return fit, lowess_curve(x, y, grid, lowess_points, rng)


def fit_layer(rows: list[list[tuple]], layer_pos: int, seed: int, n_boot: int, level: float,
              grid: np.ndarray, lowess_points: int
              ) -> tuple[list[dict], np.ndarray, dict, np.ndarray]:
    """Fits of one layer: per head (``rows[h]``) and pooled over heads, each with its own
    generator ``default_rng([seed, layer_pos, head_pos])`` (pooled: head_pos = H).

    Returns (fits per head, curves (H, grid), pooled fit, pooled curve); a module-level
    function so that a process pool can run it.
    """
    def rng(h):
        return np.random.default_rng([seed, layer_pos, h])
    fits, curves = zip(*(_fit_rows(r, rng(h), n_boot, level, grid, lowess_points)
                         for h, r in enumerate(rows)))
    pooled, curve = _fit_rows([r for head in rows for r in head], rng(len(rows)), n_boot,
                              level, grid, lowess_points)
    return list(fits), np.stack(curves), pooled, curve


class ConvexityAccumulator:
    """Collects (sink rate, output norm, sequence, analytic vertex) rows per head of a layer."""

    reads = (S.ALPHA, S.OUTPUT_NORM, S.VALUE_NORM, S.RESIDUAL_NORM, S.SINK_RESIDUAL_COSINE)
    groups = (SINK,)

    def __init__(self, heads, *, n_boot=N_BOOT, seed=SEED, level=LEVEL, grid=DEFAULT_GRID,
                 analytic=True, lowess_points=LOWESS_POINTS, executor=None, max_pending: int = 1):
        self.heads, self.n_boot, self.seed, self.level = heads, n_boot, seed, level
        self.executor, self.max_pending = executor, max(1, int(max_pending))
        self._layer_fits: list[Future] = []  # per layer: fit_layer's result
        self.grid, self.analytic, self.lowess_points = np.asarray(grid), analytic, lowess_points
        self.layers: list = []
        self.fits: list[list[dict]] = []
        self.pooled: list[dict] = []
        self.curves: list[np.ndarray] = []
        self.pooled_curves: list[np.ndarray] = []
        self._rows: list[list[tuple]] = [[] for _ in heads]

    def update(self, block: Block) -> None:
        g = block.groups
        x = g.sink_rate.values  # (S, H, Q)
        y = g.per_query(S.OUTPUT_NORM).values
        seq = np.broadcast_to(block.sequence[:, None], x.shape[::2])  # (S, Q)
        if self.analytic:
            vn0 = g.per_key(S.VALUE_NORM).values[..., :1]  # (S, H, 1)
            star = analytic_vertex(x, vn0, g.per_query(S.RESIDUAL_NORM).values,
                                   g.per_query(S.SINK_RESIDUAL_COSINE).values)
        else:
            star = np.full(x.shape, np.nan)
        for h in range(len(self.heads)):
            ok = np.isfinite(x[:, h]) & np.isfinite(y[:, h])
            self._rows[h].append((x[:, h][ok], y[:, h][ok], seq[ok], star[:, h][ok]))

    def end_layer(self, layer) -> None:
        """Fit the layer's heads and pooled rows: here, or in ``executor``'s worker processes
        while the next layer is read (at most ``max_pending`` layers' rows in flight)."""
        args = (self._rows, len(self.layers), self.seed, self.n_boot, self.level, self.grid,
                self.lowess_points)
        if self.executor is None:
            done = Future()
            done.set_result(fit_layer(*args))
            self._layer_fits.append(done)
        else:
            pending = [f for f in self._layer_fits if not f.done()]
            while len(pending) >= self.max_pending:      # bound the rows held in flight
                wait(pending, return_when=FIRST_COMPLETED)
                pending = [f for f in pending if not f.done()]
            self._layer_fits.append(self.executor.submit(fit_layer, *args))
        self.layers.append(layer)
        self._rows = [[] for _ in self.heads]

    def _collect(self) -> None:
        for fl in self._layer_fits:
            fits, curves, pooled, curve = fl.result()
            self.fits.append(fits)
            self.curves.append(curves)
            self.pooled.append(pooled)
            self.pooled_curves.append(curve)
        self._layer_fits = []

    def _flags(self, out: xr.Dataset, prefix: str) -> None:
        convex = (out[f"{prefix}beta2"] > 0) & (out[f"{prefix}q_value"] < self.level)
        out[f"{prefix}convex"] = convex
        for suffix, ci in (("", "vertex_ci"), ("_boot", "vertex_boot_ci")):
            out[f"{prefix}interior_minimum{suffix}"] = (
                convex & (out[f"{prefix}{ci}_low"] > 0) & (out[f"{prefix}{ci}_high"] < 1))

    def result(self) -> xr.Dataset:
        self._collect()
        coords = {S.LAYER: self.layers, S.HEAD: self.heads, GRID: self.grid}
        data = {n: ((S.LAYER, S.HEAD), np.array([[f[n] for f in fl] for fl in self.fits]))
                for n in FIT_NAMES}
        data.update({f"pooled_{n}": ((S.LAYER,), np.array([f[n] for f in self.pooled]))
                     for n in FIT_NAMES})
        data["lowess"] = ((S.LAYER, S.HEAD, GRID), np.stack(self.curves))
        data["pooled_lowess"] = ((S.LAYER, GRID), np.stack(self.pooled_curves))
        out = xr.Dataset(data, coords=coords)
        out["q_value"] = ((S.LAYER, S.HEAD), fdr(out["p_value"].values))
        out["pooled_q_value"] = ((S.LAYER,), fdr(out["pooled_p_value"].values))
        self._flags(out, "")
        self._flags(out, "pooled_")
        out["p_value"].attrs["description"] = "one-sided p-value of beta2 > 0 (cluster-robust t)"
        out["q_value"].attrs["description"] = "Benjamini-Hochberg over all (layer, head)"
        out["vertex"].attrs["description"] = "-beta1 / (2 beta2), the fitted extremum"
        out["lowess"].attrs["description"] = "LOWESS of output_norm on sink rate at grid"
        out.attrs["analytic_vertex"] = ("per-query (|r_bar|^2 - <v0, r_bar>) / |v0 - r_bar|^2"
                                        if self.analytic else "unavailable: store sink_k != 1")
        return out


@shared_docs
def convexity(ds: xr.Dataset, *, sink_k: int | None = None, n_boot: int = N_BOOT,
              seed: int = SEED, level: float = LEVEL, layers=None, grid=DEFAULT_GRID,
              lowess_points: int = LOWESS_POINTS, progress: bool = False,
              block_elements: int = DEFAULT_BLOCK_ELEMENTS) -> xr.Dataset:
    """Fit output_norm on the sink rate, a quadratic per (layer, head) and pooled per layer.

    Parameters
    ----------
    {ds}
    sink_k : int, optional
        Queries i < k are excluded; default the store's k.
    n_boot : int
        Sequence-cluster bootstrap resamples of the vertex (0 disables the bootstrap CI).
    seed : int
        Seed of the bootstrap and the LOWESS subsample.
    level : float
        Test level (FDR level for ``convex``; CIs are 1 - level).
    {layers}
    grid : numpy.ndarray
        Sink rates at which the pooled fit and the LOWESS curve are evaluated.
    lowess_points : int
        Points of the seeded subsample the LOWESS curve is fitted on, per layer.
    {progress, block_elements}

    {returns}
    """
    require(ds, [S.ALPHA, S.OUTPUT_NORM], "the convexity analysis")
    info = describe(ds, sink_k, None, layers)
    analytic = info.store_k == 1 and all(
        n in ds for n in (S.VALUE_NORM, S.RESIDUAL_NORM, S.SINK_RESIDUAL_COSINE))
    acc = ConvexityAccumulator(info.heads, n_boot=n_boot, seed=seed, level=level, grid=grid,
                               analytic=analytic, lowess_points=lowess_points)
    run_pass(ds, info, [acc], elements=block_elements, progress=progress)
    return with_provenance(acc.result(), ds.attrs, sink_k=info.k, n_boot=n_boot, seed=seed,
                           level=level)
