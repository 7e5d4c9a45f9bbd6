"""What a faithfulness step's test could detect, and whether a null result is an equivalence.

Adds to each step of :func:`attngeom.analysis.faithfulness.order_table` (one-sided Wilcoxon,
Holm, BCa CI of the mean paired improvement d, oriented so that d > 0 means the step holds):

- the **minimum detectable effect** at power 1 - beta from the observed SD of d,
  ``MDE = (z_{1-alpha_1} + z_{1-beta}) * SD_d / sqrt(n) * sqrt(pi/3)``, with
  ``alpha_1 = level / m`` the first (smallest) Holm level of the m tested steps and sqrt(pi/3)
  the Wilcoxon signed-rank test's efficiency loss against the t test under normality
  (asymptotic relative efficiency 3/pi);
- the **TOST** equivalence test against a margin delta: two one-sided paired t tests,
  H0: mean(d) <= -delta and H0: mean(d) >= delta; ``p_tost`` is the larger p; the
  (1 - 2 level) t interval of mean(d) lies inside (-delta, delta) exactly when p_tost < level;
- the **verdict**, in this order: ``holds`` (Holm p < level and the CI above 0);
  ``does not hold: equivalent within ±δ`` (p_tost < level); ``does not hold: reversed`` (the CI
  entirely below 0); else ``inconclusive at this n``; rows between identical rankings are
  ``not testable (identical ranking)``.

The primary outcome of the second study (studies/README.md) is the AOPC of log(PPL / clean PPL)
(:func:`with_log_ppl_ratio`), with delta = :data:`DELTA_LOG` nats; for AOPC of ΔPPL the margin
is :data:`DELTA_PPL_SHARE` of the run's mean clean perplexity (:func:`delta_ppl_margin`).

Output names (stable): :func:`equivalence_table` -> the order table's columns
(``analysis.faithfulness.TABLE_COLUMNS``) then :data:`EXTRA_COLUMNS`; :func:`layer_table` ->
:data:`LAYER_COLUMNS`, one row per (step, layer).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import xarray as xr
from scipy import stats
from statsmodels.stats.multitest import multipletests

from attngeom.common.vocab import COMPREHENSIVENESS, LEVEL, ORDER_RESAMPLES, SEED

from . import faithfulness as faith

DELTA_LOG = 0.05          # nats of AOPC of log(PPL ratio): the design's equivalence margin
DELTA_PPL_SHARE = 0.05    # ΔPPL margin: this share of the run's mean clean perplexity
DELTA_ACCURACY = 0.02     # accuracy-loss margin (AOPC of clean_correct - correct): 2 points
POWER = 0.80
WILCOXON_ARE = 3 / np.pi  # asymptotic relative efficiency of the signed-rank vs the t test
LOG_RATIO = faith.LOG_RATIO

HOLDS = "holds"
EQUIVALENT = "does not hold: equivalent within ±δ"
REVERSED = "does not hold: reversed"
INCONCLUSIVE = "inconclusive at this n"
NOT_TESTABLE = "not testable (identical ranking)"

EXTRA_COLUMNS = ("variable", "sd_improvement", "m_tests", "alpha_first", "mde", "mde_sd",
                 "delta", "tost_p_lower", "tost_p_upper", "p_tost", "ci90_low", "ci90_high",
                 "equivalent", "reversed", "verdict")
LAYER_COLUMNS = ("layer", "mode", "rank", "lower", "higher", "n", "aopc_lower", "aopc_higher",
                 "mean_improvement", "ci_low", "ci_high", "statistic", "p_value", "p_holm",
                 "holds") + EXTRA_COLUMNS[:-1] + ("verdict",)


# ------------------------------------------------------------------------------- outcome
log_ppl_ratio = faith.log_ppl_ratio


def with_log_ppl_ratio(ds: xr.Dataset) -> xr.Dataset:
    """``ds`` with the variable ``log_ppl_ratio`` added (a shallow copy)."""
    return ds.assign({LOG_RATIO: log_ppl_ratio(ds)})


def delta_ppl_margin(ds: xr.Dataset, share: float = DELTA_PPL_SHARE) -> float:
    """The ΔPPL equivalence margin: ``share`` of the mean clean perplexity over the units."""
    return float(share * np.nanmean(ds["clean_ppl"].values.astype(float)))


# ------------------------------------------------------------------------------- statistics
def mde(sd: float, n: int, m: int, level: float = LEVEL, power: float = POWER,
        efficiency: float = WILCOXON_ARE) -> float:
    """Minimum detectable mean improvement of a one-sided test at level/m with ``power``.

    ``(z_{1-level/m} + z_{power}) * sd / sqrt(n) / sqrt(efficiency)`` (normal approximation;
    ``efficiency`` 3/pi for the Wilcoxon signed-rank test, 1 for a z test).
    """
    if n < 2 or m < 1 or not np.isfinite(sd):
        return np.nan
    z = stats.norm.ppf(1 - level / m) + stats.norm.ppf(power)
    return float(z * sd / np.sqrt(n) / np.sqrt(efficiency))


def tost_paired(d: np.ndarray, delta: float, level: float = LEVEL) -> dict:
    """TOST on paired differences ``d`` against (-delta, delta).

    Returns ``tost_p_lower`` (H0: mean <= -delta), ``tost_p_upper`` (H0: mean >= delta),
    ``p_tost`` (their maximum) and the (1 - 2 level) t interval ``ci90_low``, ``ci90_high``.
    """
    d = np.asarray(d, dtype=float)
    d = d[np.isfinite(d)]
    n = len(d)
    nan = dict(tost_p_lower=np.nan, tost_p_upper=np.nan, p_tost=np.nan, ci90_low=np.nan,
               ci90_high=np.nan)
    if n < 2 or not np.isfinite(delta) or delta <= 0:
        return nan
    mean, se, df = d.mean(), d.std(ddof=1) / np.sqrt(n), n - 1
    if se == 0:                                    # every difference equal: no sampling error
        inside = float(-delta < mean < delta)
        return dict(tost_p_lower=float(mean <= -delta), tost_p_upper=float(mean >= delta),
                    p_tost=1.0 - inside, ci90_low=mean, ci90_high=mean)
    p_lower = stats.t.sf((mean + delta) / se, df)
    p_upper = stats.t.cdf((mean - delta) / se, df)
    half = stats.t.ppf(1 - level, df) * se
    return dict(tost_p_lower=float(p_lower), tost_p_upper=float(p_upper),
                p_tost=float(max(p_lower, p_upper)), ci90_low=float(mean - half),
                ci90_high=float(mean + half))


def verdict(p_holm: float, ci_low: float, ci_high: float, p_tost: float,
            level: float = LEVEL) -> str:
    """The design's verdict of one step (module doc); NaN p_holm = not testable."""
    if not np.isfinite(p_holm):
        return NOT_TESTABLE
    if p_holm < level and ci_low > 0:
        return HOLDS
    if np.isfinite(p_tost) and p_tost < level:
        return EQUIVALENT
    if ci_high < 0:
        return REVERSED
    return INCONCLUSIVE


def improvements(ds: xr.Dataset, mode: str, rank: str, lower: str, higher: str,
                 variable: str | None = None) -> np.ndarray:
    """Paired per-unit AOPC improvements of the step lower -> higher (> 0: the step holds),
    oriented as :func:`~attngeom.analysis.faithfulness.order_table` does; finite units only."""
    a = faith.aopc(ds, variable)
    dim = faith.unit_dim(ds)
    lo = a.sel(metric=lower, rank=rank, mode=mode).transpose(dim).values
    hi = a.sel(metric=higher, rank=rank, mode=mode).transpose(dim).values
    ok = np.isfinite(lo) & np.isfinite(hi)
    sign = 1.0 if mode == COMPREHENSIVENESS else -1.0
    return sign * (hi[ok] - lo[ok])


# ------------------------------------------------------------------------------- tables
def _distinct_tested(table: pd.DataFrame) -> np.ndarray:
    """Rows that are tests of their own: finite p, not a copy of an earlier row (a copy, e.g.
    the magnitude rank of two non-negative metrics, repeats the same numbers)."""
    key = ["mode", "lower", "higher", "n", "statistic", "p_value", "mean_improvement"]
    tested = table["p_value"].notna().to_numpy()
    first = ~table[key].round(12).duplicated().to_numpy()
    return tested & first


def _extras(d: np.ndarray, delta: float, m: int, p_holm: float, ci_low: float, ci_high: float,
            level: float, power: float, sides: int = 1) -> dict:
    testable = bool(np.isfinite(p_holm))
    sd = float(np.std(d, ddof=1)) if len(d) > 1 and testable else np.nan
    found = mde(sd, len(d), m, level / sides, power)
    tost = tost_paired(d if testable else [], delta, level)
    v = verdict(p_holm, ci_low, ci_high, tost["p_tost"], level)
    return dict(sd_improvement=sd, m_tests=m, alpha_first=level / m if m else np.nan,
                mde=found, mde_sd=found / sd if sd else np.nan, delta=delta, **tost,
                equivalent=bool(np.isfinite(tost["p_tost"]) and tost["p_tost"] < level),
                reversed=bool(np.isfinite(p_holm) and ci_high < 0), verdict=v)


def equivalence_table(ds: xr.Dataset, delta: float, variable: str | None = None,
                      order: tuple[str, ...] | dict = faith.ORDER, level: float = LEVEL,
                      power: float = POWER, n_resamples: int = ORDER_RESAMPLES, seed: int = SEED,
                      alternative: str = "greater") -> pd.DataFrame:
    """The order table of ``ds`` with each step's MDE, TOST against ``delta`` and verdict.

    ``variable``: the per-unit loss (default the file's ``loss_variable``; ``log_ppl_ratio``
    computed where asked). m, the Holm family size, counts the distinct tested steps.
    ``order`` and ``alternative``: as :func:`~attngeom.analysis.faithfulness.order_table`
    (two-sided: the MDE at level / 2m).
    """
    table = faith.order_table(ds, order=order, level=level, n_resamples=n_resamples, seed=seed,
                              variable=variable, alternative=alternative)
    m = int(_distinct_tested(table).sum())
    rows = []
    for r in table.itertuples(index=False):
        d = improvements(ds, r.mode, r.rank, r.lower, r.higher, variable)
        if len(d) and not np.isclose(d.mean(), r.mean_improvement, rtol=1e-9, atol=1e-12):
            raise RuntimeError(f"{r.mode}/{r.rank} {r.lower}->{r.higher}: paired improvements "
                               "disagree with order_table's (its orientation changed, or a "
                               "ranking recorded as a copy holds other numbers)")
        rows.append(_extras(d, delta, m, r.p_holm, r.ci_low, r.ci_high, level, power,
                            2 if alternative == "two-sided" else 1))
    extra = pd.DataFrame(rows, index=table.index, columns=list(EXTRA_COLUMNS[1:]))
    extra.insert(0, "variable", faith.loss(ds, variable).name)
    out = pd.concat([table, extra[list(EXTRA_COLUMNS)]], axis=1)
    out.attrs = dict(table.attrs, delta=delta, power=power, m_tests=m)
    return out


def layer_table(runs: dict[int, xr.Dataset], steps: tuple[tuple[str, str], ...],
                delta: float, variable: str | None = None, level: float = LEVEL,
                power: float = POWER, n_resamples: int = ORDER_RESAMPLES, seed: int = SEED
                ) -> pd.DataFrame:
    """One row per (step, layer, mode, rank) of single-layer runs ``{layer: result}``.

    Each step is tested in each run as :func:`equivalence_table` does; Holm runs over the
    layers of each (step, mode, rank), so m = the number of layers.
    """
    rows = []
    for layer, ds in sorted(runs.items()):
        for lower, higher in steps:
            t = faith.order_table(ds, order=(lower, higher), level=level,
                                  n_resamples=n_resamples, seed=seed, variable=variable)
            for r in t.to_dict("records"):
                r["layer"] = int(layer)
                r["_d"] = improvements(ds, r["mode"], r["rank"], lower, higher, variable)
                r["variable"] = faith.loss(ds, variable).name
                rows.append(r)
    frame = pd.DataFrame(rows)
    out = []
    for _, group in frame.groupby(["lower", "higher", "mode", "rank"], sort=False):
        group = group.copy()
        p = group["p_value"].to_numpy(dtype=float)
        ok = np.isfinite(p)
        p_holm = np.full(len(p), np.nan)
        if ok.any():
            p_holm[ok] = multipletests(p[ok], alpha=level, method="holm")[1]
        group["p_holm"] = p_holm
        group["holds"] = np.nan_to_num(p_holm, nan=1.0) < level
        group["holds"] &= group["ci_low"].to_numpy(dtype=float) > 0
        m = int(ok.sum())
        extra = [_extras(r["_d"], delta, m, r["p_holm"], r["ci_low"], r["ci_high"], level,
                         power) for r in group.to_dict("records")]
        for key in extra[0] if extra else ():
            group[key] = [e[key] for e in extra]
        out.append(group)
    table = pd.concat(out, ignore_index=True) if out else pd.DataFrame(columns=LAYER_COLUMNS)
    table.attrs = dict(level=level, delta=delta, power=power)
    return table[list(LAYER_COLUMNS)]
