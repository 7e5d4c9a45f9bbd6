"""Anti-alignment of the sink value with semantic values and with the non-sink output.

Sequences are the unit of replication. Per (layer, head) and sequence:

* value cosine: the mean of cos(v~_0, v~_j) (``sink_value_cosine``) over semantic keys j >= k
  within the sequence's length, excluding special tokens when the store has a ``special`` mask;
* residual cosine: the mean of cos(v~_0, r_i) (``sink_residual_cosine``) over queries i >= k, with
  r_i the non-sink part of the head output (as stored: it excludes the store's k sink keys).

Across sequences, per (layer, head): one-sided t-test and Wilcoxon signed-rank test (H1: mean < 0),
Cohen's d = mean / sd with a normal-approximation CI (se = sqrt(1/n + d^2 / (2n))),
Benjamini-Hochberg (``q_value``) and Benjamini-Yekutieli (``q_value_by``) over layer x head. Per
layer, a REML random-intercept model of the per-(sequence, head) means on an intercept with a
random intercept per sequence (robustness check; one-sided z-test of the intercept < 0): solved
exactly when balanced (:func:`balanced_random_intercept`), else by statsmodels MixedLM, whose
cost grows faster than linearly in the number of groups; it is fitted to a seeded random subset
of at most ``mixed_max_sequences`` sequences (default 500; the t and Wilcoxon tests use all).

Output names (stable), :func:`anti_alignment`; the residual cosine uses the same names with the
prefix ``residual_``: over (layer, head) ``mean_cos sd_cos n_sequences t_stat p_value
wilcoxon_p_value cohens_d cohens_d_ci_low cohens_d_ci_high q_value q_value_by wilcoxon_q_value
anti_aligned`` (mean < 0 and q_value < level); over (layer) ``mixed_mean_cos mixed_se
mixed_p_value mixed_converged``.
"""

from __future__ import annotations

import warnings

import numpy as np
import statsmodels.api as sm
import xarray as xr
from scipy import stats

from attngeom.store.format import schema as S
from attngeom.common.vocab import LEVEL, SEED

from ._common import fdr, shared_docs, with_provenance
from .blocks import DEFAULT_BLOCK_ELEMENTS, Block, describe, require, run_pass

HEAD_NAMES = ("mean_cos", "sd_cos", "n_sequences", "t_stat", "p_value", "wilcoxon_p_value",
              "cohens_d", "cohens_d_ci_low", "cohens_d_ci_high")
MIXED_NAMES = ("mixed_mean_cos", "mixed_se", "mixed_p_value", "mixed_converged")
PREFIXES = ("", "residual_")


def one_sample_less(values: np.ndarray, level: float = LEVEL) -> dict[str, float]:
    """One-sample tests of mean < 0 on per-sequence means (NaNs dropped)."""
    v = np.asarray(values, float)
    v = v[np.isfinite(v)]
    n = len(v)
    out = dict.fromkeys(HEAD_NAMES, np.nan)
    out["n_sequences"] = float(n)
    if n < 3:
        return out
    mean, sd = v.mean(), v.std(ddof=1)
    out.update(mean_cos=mean, sd_cos=sd)
    if sd == 0:
        return out
    t = stats.ttest_1samp(v, 0.0, alternative="less")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        w = stats.wilcoxon(v, alternative="less") if np.any(v != 0) else None
    d = mean / sd
    half = stats.norm.ppf(1 - level / 2) * np.sqrt(1 / n + d**2 / (2 * n))
    out.update(t_stat=t.statistic, p_value=t.pvalue, cohens_d=d, cohens_d_ci_low=d - half,
               cohens_d_ci_high=d + half, wilcoxon_p_value=w.pvalue if w else np.nan)
    return out


def mixed_less_than_zero(values: np.ndarray, sequence: np.ndarray) -> dict[str, float]:
    """MixedLM ``value ~ 1 + (1 | sequence)`` (REML); one-sided z-test of the intercept < 0.

    Balanced groups (every sequence with the same number of values): the REML fit is the one-way
    ANOVA solution, so the same intercept and standard error come from a statsmodels OLS on less
    redundant data (:func:`balanced_random_intercept`). Otherwise statsmodels MixedLM, started
    from the ANOVA estimate of the variance ratio.
    """
    ok = np.isfinite(values)
    y, g = values[ok], sequence[ok]
    out = dict.fromkeys(MIXED_NAMES, np.nan)
    if len(np.unique(g)) < 3:
        return out
    fit = balanced_random_intercept(y, g)
    if fit is None:
        fit = _mixedlm(y, g)
    if fit is None:
        return out
    est, se, converged = fit
    p = stats.norm.cdf(est / se) if se > 0 else np.nan
    out.update(mixed_mean_cos=est, mixed_se=se, mixed_p_value=p, mixed_converged=float(converged))
    return out


def _one_way(y: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, np.ndarray, float, float]:
    """Group sizes (G,), group means (G,), and the one-way ANOVA mean squares (between, within)."""
    _, inv, n = np.unique(g, return_inverse=True, return_counts=True)
    means = np.bincount(inv, weights=y) / n
    ssw = float(((y - means[inv]) ** 2).sum())
    ssb = float((n * (means - y.mean()) ** 2).sum())
    return n, means, ssb / (len(n) - 1), ssw / max(len(y) - len(n), 1)


def balanced_random_intercept(y: np.ndarray, g: np.ndarray) -> tuple[float, float, bool] | None:
    """(intercept, se, converged) of the REML random-intercept model for balanced groups, else None.

    With G groups of n values, REML's between variance is (MSB - MSW) / n when positive (the
    ANOVA estimate) and 0 otherwise. Positive: the intercept and its se are those of an OLS of the
    G group means on a constant (se^2 = MSB / (n G)); zero: those of an OLS of all values on a
    constant (se^2 = SST / ((N - 1) N)). Both are statsmodels OLS fits.
    """
    n, means, msb, msw = _one_way(y, g)
    if n.min() != n.max() or n[0] < 2 or not msw > 0:
        return None
    rows = means if msb > msw else y
    res = sm.OLS(rows, np.ones((len(rows), 1))).fit()
    return float(res.params[0]), float(res.bse[0]), True


def _mixedlm(y: np.ndarray, g: np.ndarray) -> tuple[float, float, bool] | None:
    """statsmodels MixedLM REML fit, started from the ANOVA variance ratio (floored at 1e-8)."""
    n, _, msb, msw = _one_way(y, g)
    n0 = (len(y) - (n**2).sum() / len(y)) / (len(n) - 1)
    ratio = max((msb - msw) / n0 / msw, 1e-8) if msw > 0 else 1.0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            res = sm.MixedLM(y, np.ones((len(y), 1)), groups=g).fit(
                reml=True, start_params=np.array([np.sqrt(ratio)]))
        except (np.linalg.LinAlgError, ValueError):
            return None
        est, se = float(res.fe_params[0]), float(res.bse_fe[0])  # bse may warn: keep inside
    converged = bool(res.converged) and not any(
        "converge" in str(w.message).lower() for w in caught)
    return est, se, converged


def _sequence_means(cos: np.ndarray, ok: np.ndarray) -> np.ndarray:
    """(S, H) mean of cos (S, H, X) over cells where ok (S, X) and cos is finite."""
    mask = ok[:, None] & np.isfinite(cos)
    n = mask.sum(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, np.where(mask, cos, 0).sum(-1) / n, np.nan)


class AntiAlignmentAccumulator:
    """Per-sequence mean cosines per head, tested across sequences at the end of each layer."""

    reads = (S.SINK_VALUE_COSINE, S.SINK_RESIDUAL_COSINE)
    groups = ()

    def __init__(self, heads, *, level: float = LEVEL, mixed: bool = True,
                 mixed_max_sequences: int = 500, seed: int = SEED):
        self.heads, self.level, self.mixed = heads, level, mixed
        self.mixed_max_sequences, self.seed = mixed_max_sequences, seed
        self.layers: list = []
        self.rows: dict[str, list] = {p: [] for p in PREFIXES}
        self.mixed_rows: dict[str, list] = {p: [] for p in PREFIXES}
        self._means: dict[str, list] = {p: [] for p in PREFIXES}
        self._seq: list[np.ndarray] = []

    def update(self, block: Block) -> None:
        g = block.groups
        keep = g.sequence_ok.values
        value = _sequence_means(g.per_key(S.SINK_VALUE_COSINE).values, g.semantic_key.values)
        resid = _sequence_means(g.per_query(S.SINK_RESIDUAL_COSINE).values, g.query_ok.values)
        self._means[""].append(value[keep])
        self._means["residual_"].append(resid[keep])
        self._seq.append(block.sequence[keep])

    def end_layer(self, layer) -> None:
        seq = np.concatenate(self._seq)
        for p in PREFIXES:
            means = np.concatenate(self._means[p])  # (S, H)
            self.rows[p].append([one_sample_less(means[:, h], self.level)
                                 for h in range(len(self.heads))])
            if self.mixed:
                pick = np.arange(len(seq))
                if len(seq) > self.mixed_max_sequences:
                    rng = np.random.default_rng([self.seed, len(self.layers)])
                    pick = np.sort(rng.choice(len(seq), self.mixed_max_sequences, replace=False))
                rows = mixed_less_than_zero(means[pick].ravel(),
                                            np.repeat(seq[pick], means.shape[1]))
            else:
                rows = dict.fromkeys(MIXED_NAMES, np.nan)
            self.mixed_rows[p].append(rows)
            self._means[p] = []
        self._seq = []
        self.layers.append(layer)

    def result(self) -> xr.Dataset:
        out = xr.Dataset(coords={S.LAYER: self.layers, S.HEAD: self.heads})
        lh = (S.LAYER, S.HEAD)
        for p in PREFIXES:
            for n in HEAD_NAMES:
                out[p + n] = (lh, np.array([[r[n] for r in rows] for rows in self.rows[p]]))
            for n in MIXED_NAMES:
                out[p + n] = ((S.LAYER,), np.array([r[n] for r in self.mixed_rows[p]]))
            out[p + "q_value"] = (lh, fdr(out[p + "p_value"].values))
            out[p + "q_value_by"] = (lh, fdr(out[p + "p_value"].values, "fdr_by"))
            out[p + "wilcoxon_q_value"] = (lh, fdr(out[p + "wilcoxon_p_value"].values))
            out[p + "anti_aligned"] = (out[p + "mean_cos"] < 0) & (out[p + "q_value"] < self.level)
        out["mean_cos"].attrs["description"] = (
            "mean over sequences of the per-sequence mean cos(v0, v_j), semantic keys j >= k")
        out["residual_mean_cos"].attrs["description"] = (
            "mean over sequences of the per-sequence mean cos(v0, r_i), queries i >= k")
        out["p_value"].attrs["description"] = "one-sided t-test, H1: mean < 0 (sequences = units)"
        return out


@shared_docs
def anti_alignment(ds: xr.Dataset, *, sink_k: int | None = None, level: float = LEVEL,
                   mixed: bool = True, mixed_max_sequences: int = 500, seed: int = SEED,
                   layers=None, progress: bool = False,
                   block_elements: int = DEFAULT_BLOCK_ELEMENTS) -> xr.Dataset:
    """Test cos(v~_0, v~_j) < 0 and cos(v~_0, r_i) < 0 per (layer, head), sequences as units.

    Parameters
    ----------
    {ds}
    sink_k : int, optional
        Semantic keys and queries start at k; default the store's k.
    level : float
        FDR level of ``anti_aligned``; Cohen's d CIs are 1 - level.
    mixed : bool
        Also fit the per-layer MixedLM robustness check.
    mixed_max_sequences : int
        Size of the MixedLM's random subset of sequences.
    seed : int
        Seed of that subset.
    {layers, progress, block_elements}

    {returns}
    """
    require(ds, [S.SINK_VALUE_COSINE, S.SINK_RESIDUAL_COSINE], "the anti-alignment analysis")
    info = describe(ds, sink_k, None, layers)
    acc = AntiAlignmentAccumulator(info.heads, level=level, mixed=mixed,
                                   mixed_max_sequences=mixed_max_sequences, seed=seed)
    run_pass(ds, info, [acc], elements=block_elements, progress=progress)
    return with_provenance(acc.result(), ds.attrs, sink_k=info.k, level=level, seed=seed,
                           mixed_max_sequences=mixed_max_sequences)
