"""Tolerances from rounding: the one place a test's float comparison takes its bound from.

Each function names the computation whose rounding it bounds and returns a :class:`Tol`, which
unpacks into the keywords of ``np.testing.assert_allclose`` and ``torch.testing.assert_close``
(scalar bounds) or goes to :func:`assert_close` (bounds per element, NaN patterns)::

    np.testing.assert_allclose(got, want, **tol.dot(n=d_head, size=scale, vs=tol.F64))
    tol.assert_close(got, want, tol.dot(n, size=sizes), "cosine")

The bounds (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., ch. 2-3): the unit
roundoff u is 2^-24 in float32 and 2^-53 in float64, and gamma(n) = n u / (1 - n u). In whatever
order a kernel adds (AVX2 or AVX-512 lanes, MKL or OpenBLAS blocks, one thread or two), a
computed dot product of length n differs from the exact one by at most gamma(n) sum_i |a_i||b_i|
(Higham (3.5)) and a sum of n terms by gamma(n - 1) sum_i |x_i|; a product or quotient of n
correctly rounded operations has a relative error of at most gamma(n) (Lemma 3.1). Chained
reductions of lengths n1, n2, ... are bounded, to first order, by gamma(n1 + n2 + ...) times the
sizes of their operands. These hold on every CPU; ``.ci/standins`` runs the suite under several
kernels to show it.

Every function bounds |computed - exact| for one computation in ``dtype``; ``vs`` adds the bound
of the computation it is compared with: ``vs=F64`` for a float64 reference, ``vs=F32`` for a
golden file another float32 run wrote. Where a chain is too deep to bound usefully (thirty
float32 layers, an optimizer stopping within its tolerance, LOWESS's interpolation), the bound is
the spread measured across the stand-ins with a stated margin: the constants at the end.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

F16, F32, F64 = np.float16, np.float32, np.float64


def unit(dtype=F32) -> float:
    """The unit roundoff u of ``dtype``: 2^-24 (float32), 2^-53 (float64)."""
    return float(np.finfo(dtype).eps) / 2


def gamma(n: float, dtype=F32) -> float:
    """gamma(n) = n u / (1 - n u), the bound of n accumulated roundings (n u < 1)."""
    nu = n * unit(dtype)
    if not 0 <= nu < 1:
        raise ValueError(f"gamma({n}) is undefined in {np.dtype(dtype).name}")
    return nu / (1 - nu)


def _gammas(n: float, dtype, vs) -> float:
    return gamma(n, dtype) + (0.0 if vs is None else gamma(n, vs))


@dataclass(frozen=True)
class Tol(Mapping):
    """|got - want| <= atol + rtol |want|, elementwise; ``**tol`` gives rtol= and atol=.

    ``a + b`` adds two bounds (two error sources), ``k * a`` scales one.
    """

    rtol: Any = 0.0
    atol: Any = 0.0
    what: str = ""                       # a measured spread's name, for TOLERANCE_LOG

    def __getitem__(self, key: str) -> float:
        value = {"rtol": self.rtol, "atol": self.atol}[key]
        if np.ndim(value):
            raise TypeError("an elementwise bound: compare with tolerance.assert_close")
        return float(value)

    def __iter__(self):
        return iter(("rtol", "atol"))

    def __len__(self) -> int:
        return 2

    def __add__(self, other: "Tol") -> "Tol":
        return Tol(self.rtol + other.rtol, self.atol + other.atol, self.what or other.what)

    def __mul__(self, k) -> "Tol":
        return Tol(self.rtol * k, self.atol * k, self.what)

    __rmul__ = __mul__

    def approx(self, want):
        """``pytest.approx(want)`` within this bound."""
        import pytest

        return pytest.approx(want, rel=self["rtol"], abs=self["atol"])

    def at(self, where) -> "Tol":
        """The bound at ``where`` (an index or mask) of elementwise bounds."""
        pick = lambda x: x[where] if np.ndim(x) else x                    # noqa: E731
        return Tol(pick(self.rtol), pick(self.atol), self.what)

    def limit(self, want) -> np.ndarray:
        """The largest |got - want| allowed at each element of ``want``."""
        return self.atol + self.rtol * np.abs(want)


def dot(n: float, size=1.0, dtype=F32, vs=None) -> Tol:
    """A dot product of length ``n`` (or chained reductions of total length n, to first order).

    Absolute: gamma(n) x ``size``, the sum of |a_i||b_i| (at most ||a|| ||b||, so 1 for a cosine
    of the vectors' directions). A result near zero, a cosine say, needs this absolute bound:
    its relative error is unbounded.
    """
    return Tol(atol=_gammas(n, dtype, vs) * np.asarray(size, dtype=float))


def total(n: float, size=1.0, dtype=F32, vs=None) -> Tol:
    """A sum (or mean) of ``n`` terms: gamma(n - 1) x ``size``, the sum (mean) of |terms|."""
    return Tol(atol=_gammas(max(n - 1, 0), dtype, vs) * np.asarray(size, dtype=float))


def relative(n: float, dtype=F32, vs=None) -> Tol:
    """A product or quotient of ``n`` rounded operations (exp, log, sqrt count one each, as
    correctly rounded within u; libm's are within 1 ulp = 2u, so count them twice)."""
    return Tol(rtol=_gammas(n, dtype, vs))


def mean_of(x, axis=None, dtype=F64, vs=F64) -> Tol:
    """The mean of the values ``x`` (NaN left out) along ``axis``: gamma(n) x mean |x|."""
    n = int(np.isfinite(x).sum(axis).max())
    return total(n + 1, np.nanmean(np.abs(x), axis), dtype, vs)


def sd_of(x, axis=None, dtype=F64, vs=F64) -> Tol:
    """The sample SD of ``x`` (NaN left out) along ``axis``, from the sums of x and x^2 or in
    two passes: the variance within gamma(n + 4) x n / (n - 1) mean(x^2), the SD within that
    over 2 SD."""
    n, ms = np.isfinite(x).sum(axis), np.nanmean(np.asarray(x) ** 2, axis)
    var = total(int(n.max()) + 5, n / (n - 1) * ms, dtype, vs).atol
    return Tol(atol=var / (2 * np.nanstd(x, axis, ddof=1)))


def t_interval(x, half: float, dtype=F64, vs=F64) -> Tol:
    """The ends mean -/+ half of a t interval of the values ``x`` (half = t x SD / sqrt(n)):
    the mean's and the SD's bounds, and a few roundings of t (a quantile) and the products."""
    x = np.asarray(x, dtype=float)
    return mean_of(x, None, dtype, vs) + sd_of(x, None, dtype, vs) * (half / x.std(ddof=1)) \
        + relative(8, dtype, vs)


def p_value(t: float, df: float, rel_t: float) -> Tol:
    """A p-value P(T > t) of Student's t with ``df`` degrees of freedom, t within ``rel_t``
    relative: it moves by the density at t times |t| rel_t (absolute)."""
    from scipy import stats

    return Tol(atol=float(stats.t.pdf(t, df) * abs(t) * rel_t))


def t_test(x, t: float, dtype=F64, vs=F64) -> Tol:
    """The p-value of a one-sample t statistic ``t`` of the values ``x``: t = mean / (SD /
    sqrt(n)) within gamma(2n + 8) x (mean |x| / |mean|, the mean's cancellation, + mean(x^2)
    / SD^2, the SD's), relative."""
    x = np.asarray(x, dtype=float)
    n, mean, sd = len(x), x.mean(), x.std(ddof=1)
    cond = np.abs(x).mean() / abs(mean) + (x ** 2).mean() / sd ** 2
    return p_value(t, n - 1, _gammas(2 * n + 8, dtype, vs) * cond)


def smoother(n: int, size: float, iterations: int = 1, dtype=F64, vs=F64) -> Tol:
    """LOWESS at a point: a local weighted linear fit over at most ``n`` points, sum_i l_i y_i
    with sum |l_i| <= 3 inside the data; each robustness iteration refits: gamma(2n + 10) x 3
    x ``size`` (max |y|) per fit."""
    return Tol(atol=(iterations + 1) * 3 * _gammas(2 * n + 10, dtype, vs) * size)


def covariance_share(parts) -> Tol:
    """A share cov(p_i, y) / var(y), y = sum_i p_i, of the n rows of ``parts`` (streamed moment
    sums or two passes): each covariance within gamma(2n + 8) rms(p_i) rms(y), over var(y)."""
    parts = np.asarray(parts, dtype=float)
    y = parts.sum(1)
    rms_y = np.sqrt((y ** 2).mean())
    rms = np.sqrt((parts ** 2).mean(0)).max() + rms_y
    return dot(2 * len(y) + 8, rms * rms_y / y.var(), F64, vs=F64)


def conditioned(n: float, cond=1.0, dtype=F32, vs=None) -> Tol:
    """A result of condition number ``cond`` computed with n roundings: gamma(n) x cond,
    relative (Higham 1.6: forward error <= condition x backward error). For a least-squares
    fit cond is about kappa(X)^2; for a p-value P(T > t), (1 + |t|) |t| (its log's slope in
    log t) times t's own."""
    return Tol(rtol=_gammas(n, dtype, vs) * np.asarray(cond, dtype=float))


def rounded(dtype=F32) -> Tol:
    """One rounding to ``dtype`` (a value stored or sent in it): u relative, and half the
    smallest subnormal absolute (float16's, below 6e-5, step by 6e-8)."""
    return Tol(rtol=unit(dtype), atol=float(np.finfo(dtype).smallest_subnormal) / 2)


def digits(n: int) -> Tol:
    """A number printed with ``n`` significant decimal digits: half a unit of the last one,
    at most 0.5 x 10^(1 - n) relative."""
    return Tol(rtol=0.5 * 10.0 ** (1 - n))


def sums_to_one(n: float, depth: float = 0, term=0.0, size=1.0, dtype=F32) -> Tol:
    """The computed sum of ``n`` computed terms whose exact sum is one.

    The sum adds gamma(n - 1) x ``size``, the sum of |terms|, to the terms' own errors: either
    ``term``, their bounds summed, or ``depth`` roundings relative to their size (a softmax
    row's terms come from one normaliser, n - 1 additions, and a division each, so they sum to
    one within gamma(2n - 1) however the logits were rounded).
    """
    return Tol(atol=np.asarray(term, dtype=float)
               + gamma(n - 1 + depth, dtype) * np.asarray(size, dtype=float))


def attention_terms(d: int, d_head: int, heads: int, T: int, intermediate: int = 0,
                    layer: int = 0) -> int:
    """The total length of the float32 reductions behind a stored measurement of ``layer``.

    From the attention input x: the projections x W (d), the logits q.k (d_head) and the
    softmax's normaliser (T), z = sum_j alpha v (T), the Gram matrices W_O W_O^T (d) and the
    products through them (heads x d_head, twice). Each earlier layer adds its own chain and
    its output projection and MLP (d + intermediate): its rounding reaches x (first order,
    the tiny models' blocks taken as not amplifying relative error; the stand-ins check it).
    """
    attention = 2 * d + d_head + 2 * T + 2 * heads * d_head
    return attention + layer * (attention + 2 * d + intermediate)


def _log(name: str, diff: np.ndarray, size: np.ndarray, limit: np.ndarray) -> None:
    """With TOLERANCE_LOG=<file>: one line per passing comparison, its largest |got - want|
    (absolute, relative) and the largest share of the bound used; ``.ci/standins`` prints
    them (tests that move values on purpose unset it)."""
    path = os.environ.get("TOLERANCE_LOG")
    if path and diff.size:
        with np.errstate(divide="ignore", invalid="ignore"):
            rel = np.nanmax(np.where(size > 0, diff / size, 0.0))
            used = np.nanmax(np.where(limit > 0, diff / limit, np.where(diff > 0, np.inf, 0.0)))
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{name}\t{diff.max():.3g}\t{rel:.3g}\t{used:.3g}\n")


def assert_close(got, want, bound: Tol, name: str = "") -> None:
    """Same shape, NaN at the same cells, |got - want| <= ``bound`` elsewhere (elementwise);
    a scalar ``want`` stands for every element."""
    got, want = np.asarray(got, dtype=float), np.asarray(want, dtype=float)
    want = np.broadcast_to(want, got.shape) if want.ndim == 0 else want
    assert got.shape == want.shape, (name, got.shape, want.shape)
    nan_got, nan_want = np.isnan(got), np.isnan(want)
    assert np.array_equal(nan_got, nan_want), (
        f"{name}: NaN pattern differs at {np.argwhere(nan_got != nan_want)[:5].tolist()}")
    ok = ~nan_want
    limit = np.broadcast_to(bound.limit(want), want.shape)
    diff = np.abs(got - want)
    bad = ok & ~(diff <= limit)
    if not bad.any():
        _log(bound.what or name, diff[ok], np.abs(want[ok]), limit[ok])
    assert not bad.any(), (
        f"{name}: {bad.sum()} of {ok.sum()} beyond the rounding bound, worst "
        f"{np.max(diff[bad] / np.maximum(limit[bad], 1e-300)):.3g} x it: got {got[bad][:3]} "
        f"want {want[bad][:3]}")


# Spreads measured across the stand-in configurations (.ci/standins on an AMD EPYC with
# AVX-512, torch 2.13 CPU with MKL, numpy/scipy with OpenBLAS 0.3.31; four runs: torch's
# default/avx2/avx512 kernels, MKL_CBWR AVX2/COMPATIBLE/unset, OpenBLAS Haswell/Sandybridge/
# SkylakeX cores, 1 and 2 threads; the slow SmolLM2 tests run by hand under the same four),
# for what is too deep to bound usefully. Each: what was measured, the largest value over the
# runs, the margin the constant leaves. TOLERANCE_LOG (see _log) prints these figures again.

# The real SmolLM2-135M's alpha (sink key), value and output norms at its first and last
# (30th) layer stored by attngeom (float32, sdpa) against the naive reference (float64 from
# eager's float32 inputs): 4.3e-6 relative at most (1.8e-4 absolute on norms near 60); 12x.
SMOLLM2_LAYERS = Tol(rtol=5e-5, what="SMOLLM2_LAYERS")

# The SmolLM2-135M store's per-head means over sequences (sink-value and sink-residual
# cosines, sink rates) against the naive reference's: 2.2e-7 absolute at most; 9x.
SMOLLM2_MEANS = Tol(atol=2e-6, what="SMOLLM2_MEANS")

# attngeom's faithfulness perplexities (float32 attention, removal at every layer, exp of the
# mean NLL) against the hook-free reference (float64 attention, the rest of the tiny llama in
# float32), against the same run alone or resumed, and rebuilt against the golden file:
# 9.5e-7 relative at most; 10x.
FAITHFULNESS_PPL = Tol(rtol=1e-5, what="FAITHFULNESS_PPL")

# The analysis of two stores of the same texts that differ by float32 rounding (dense against
# compact kernels: sink rates, curvature fits and p-values, mean cosines, LMG shares): 2.1e-6
# absolute, 3.6e-5 relative at most, 0.025 of this bound; 40x.
LAYOUTS_ANALYSIS = Tol(rtol=1e-3, atol=1e-5, what="LAYOUTS_ANALYSIS")

# The float64 analysis of one and the same data in another summation order (other blocks, the
# golden store analysed again; statsmodels' and scipy's fits, bootstrap percentiles of the
# vertex -beta1 / (2 beta2) with beta2 near 0): 4.6e-10 absolute at most (the convexity's
# pooled bootstrap CI, OpenBLAS Haswell against SkylakeX), 0.012 of this bound; 85x.
# Bound: times the variable's largest |value|.
ANALYSIS_FLOAT64 = Tol(atol=1e-9, what="ANALYSIS_FLOAT64")

# An interval's ends estimate -/+ q x se take the quantile q from scipy (t.ppf, norm.ppf):
# against mpmath's root of the regularized incomplete beta (df 1-199, p 0.9-0.999), scipy
# 1.17.1's t.ppf is within 7.4e-15 relative, the lowest scipy pyproject admits (1.11.1) within
# 4.6e-9; 11x. Bound: times the interval's half-width.
QUANTILE = Tol(rtol=5e-8, what="QUANTILE")

# statsmodels' MixedLM (BFGS) stops within its gradient tolerance of the REML optimum: our fit
# (closed form when balanced, else MixedLM from the ANOVA start) against MixedLM at its
# defaults or run to gtol=1e-12: 2.8e-5 relative at most, the same in every run; 3.6x.
MIXEDLM_OPTIMIZER = Tol(rtol=1e-4, what="MIXEDLM_OPTIMIZER")

# MixedLM run to gtol=1e-12 still stops short of the REML optimum (the closed form of
# tests/analysis/test_analysis_mixed.py): 5e-11 relative on the se here, 7e-10 with the lowest
# versions pyproject admits (statsmodels 0.14.0 / scipy 1.11.1); 14x. At the variance ratio's
# boundary it stops at a ratio of ~1e-9 instead of 0: 5.1e-10 here; the bound kept from the
# lowest versions' runs (not remeasured here).
MIXEDLM_TIGHT = Tol(rtol=1e-8, what="MIXEDLM_TIGHT")
MIXEDLM_TIGHT_BOUNDARY = Tol(rtol=1e-6, what="MIXEDLM_TIGHT_BOUNDARY")

# statsmodels' NormalIndPower.solve_power finds the effect size with a root finder that stops
# within its tolerance: 2.9e-6 relative at most from the closed form, the same in every run;
# 35x (kept for the lowest statsmodels).
POWER_SOLVER = Tol(rtol=1e-4, what="POWER_SOLVER")

# LOWESS (statsmodels' algorithm, analysis/lowess.py) fits points within delta = 0.01 x
# range(x) of the last fitted one by interpolation, by design: the stated bound, 0.5 % of the
# curve's range. Measured: 0 on one store in every run; 1.2e-3 absolute on curves spanning
# 0.56-2.18 when the store itself moves by float32 rounding (the golden analysis before it was
# made from the committed store): 0.15 of the bound.
# Bound: times the curve's range.
LOWESS_DELTA = Tol(atol=0.005, what="LOWESS_DELTA")
