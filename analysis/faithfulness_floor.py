"""The floor and the order over every metric run: AOPC against random, a normalised AOPC, the
ranking of the methods (issue 43).

- **Against random** (:func:`versus_random`): per (mode, rank) and metric, the paired per-unit
  difference d_u = AOPC(metric) - AOPC(random), oriented so that d > 0 means better than random
  (comprehensiveness: larger loss; sufficiency: smaller), with a one-sided Wilcoxon signed-rank
  test (H1: d > 0), Holm over the metrics, modes and ranks of the loss, and a BCa bootstrap CI
  of its mean (the primary statistic); and the ratio of the means AOPC(metric) / AOPC(random)
  with a paired percentile bootstrap CI (a per-unit ratio is unstable where random's AOPC is
  near 0; above 1 is better for comprehensiveness, below 1 for sufficiency).
- **AOPC min-max over the rankings run** (:func:`aopc_minmax`): per unit, mode and rank,
  (AOPC - the lowest AOPC of the rankings run on that unit) / (highest - lowest), random
  included: 0 is the lowest AOPC any ranking run reached on that input, 1 the highest. It is
  computable where the exact limits of Edin et al. (ACL 2025; best and worst over every
  ordering) are out of reach with keys removed in every layer at once, and, like theirs, it
  takes away what varies from input to input and model to model (the loss's scale); unlike
  theirs it depends on the set of rankings run, so stores are compared on it only when they
  ran the same metrics (``compare`` flags a difference).
- **The ranking** (:func:`observed_orders`, :func:`ranking_table`): per (loss, mode, rank) the
  metrics ordered from the least to the most faithful by their mean AOPC, and each adjacent step
  tested as the paper's order is (paired Wilcoxon, Holm, BCa CI, MDE, TOST), two-sided: the
  order is read from the same data.

Output names (stable): :data:`VS_RANDOM_COLUMNS`; :data:`MINMAX_COLUMNS` (joined to the AOPC
table); the ranking table has the order table's columns plus ``position``.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import xarray as xr
from scipy import stats
from statsmodels.stats.multitest import multipletests

from attngeom.common.metrics import RANDOM
from attngeom.common.vocab import COMPREHENSIVENESS, LEVEL, ORDER_RESAMPLES, SEED

from . import equivalence as eq
from . import faithfulness as faith
from ._common import bootstrap_rng

VS_RANDOM_COLUMNS = ("variable", "mode", "rank", "metric", "n", "aopc_metric", "aopc_random",
                     "mean_difference", "ci_low", "ci_high", "statistic", "p_value", "p_holm",
                     "better", "ratio_of_means", "ratio_ci_low", "ratio_ci_high", "note")
MINMAX_COLUMNS = ("minmax_mean", "minmax_sem", "minmax_ci_low", "minmax_ci_high", "minmax_n")


# ------------------------------------------------------------------------------ normalised
def aopc_minmax(ds: xr.Dataset, variable: str | None = None) -> xr.DataArray:
    """AOPC min-max over the rankings run, per (metric, rank, mode, unit) (module docstring);
    NaN where every ranking run gave the unit the same AOPC."""
    a = faith.aopc(ds, variable)
    lo, hi = a.min("metric"), a.max("metric")
    with np.errstate(invalid="ignore", divide="ignore"):
        out = ((a - lo) / (hi - lo)).where(hi > lo)
    out.name = "aopc_minmax"
    out.attrs["description"] = ("(AOPC - lowest AOPC of the rankings run on the unit) / "
                                "(highest - lowest), per unit, mode and rank")
    return out


def minmax_summary(ds: xr.Dataset, variable: str | None = None, level: float = LEVEL
                   ) -> pd.DataFrame:
    """Mean, s.e. and t interval of :func:`aopc_minmax` per (metric, rank, mode), long."""
    s = faith.t_interval(aopc_minmax(ds, variable), faith.unit_dim(ds), level)
    s = s.rename({k: f"minmax_{k}" for k in s.data_vars})
    table = s.to_dataframe().reset_index()
    table["minmax_n"] = table["minmax_n"].astype(int)
    return table[["metric", "rank", "mode"] + list(MINMAX_COLUMNS)]


# ------------------------------------------------------------------------------ ranking
def observed_orders(ds: xr.Dataset, variable: str | None = None) -> dict:
    """(mode, rank) -> the metrics from the least to the most faithful by mean AOPC
    (comprehensiveness: ascending, sufficiency: descending; ties in the registry's order)."""
    mean = faith.aopc(ds, variable).mean(faith.unit_dim(ds))
    out = {}
    for mode in mean["mode"].values:
        for rank in mean["rank"].values:
            m = mean.sel(mode=mode, rank=rank)
            metrics = [str(x) for x in m["metric"].values]
            sign = 1.0 if mode == COMPREHENSIVENESS else -1.0
            key = {x: sign * float(v) for x, v in zip(metrics, m.values)}
            out[(str(mode), str(rank))] = tuple(sorted(
                metrics, key=lambda x: (np.nan_to_num(key[x], nan=-np.inf), metrics.index(x))))
    return out


def ranking_table(ds: xr.Dataset, delta: float, variable: str | None = None,
                  level: float = LEVEL, power: float = eq.POWER,
                  n_resamples: int = ORDER_RESAMPLES, seed: int = SEED) -> pd.DataFrame:
    """The ranking's adjacent steps, tested two-sided (module docstring); ``position`` 1 is the
    least faithful metric of its (mode, rank)."""
    orders = observed_orders(ds, variable)
    table = eq.equivalence_table(ds, delta, variable=variable, order=orders, level=level,
                                 power=power, n_resamples=n_resamples, seed=seed,
                                 alternative="two-sided")
    table.insert(0, "position", [orders[(r.mode, r.rank)].index(r.lower) + 1
                                 for r in table.itertuples()])
    table.attrs["orders"] = {f"{m}/{r}": ",".join(o) for (m, r), o in orders.items()}
    return table


# ------------------------------------------------------------------------------ vs random
def _ratio_ci(a: np.ndarray, b: np.ndarray, level: float, n_resamples: int, seed: int):
    if len(a) < 2:
        return np.nan, np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = stats.bootstrap((a, b), lambda x, y: np.mean(x) / np.mean(y), paired=True,
                              vectorized=False, n_resamples=n_resamples, method="percentile",
                              confidence_level=1 - level,
                              **bootstrap_rng(np.random.default_rng(seed)))
    lo, hi = res.confidence_interval
    return float(lo), float(hi)


def versus_random(ds: xr.Dataset, variable: str | None = None, level: float = LEVEL,
                  n_resamples: int = ORDER_RESAMPLES, seed: int = SEED) -> pd.DataFrame:
    """Each metric's AOPC against random's, per unit (module docstring); empty when random
    was not run."""
    a = faith.aopc(ds, variable)
    name = faith.loss(ds, variable).name
    if RANDOM not in a["metric"].values:
        return pd.DataFrame(columns=VS_RANDOM_COLUMNS)
    dim, rows, first, copy_of = faith.unit_dim(ds), [], {}, []
    for mode in map(str, a["mode"].values):
        sign = 1.0 if mode == COMPREHENSIVENESS else -1.0
        for rank in map(str, a["rank"].values):
            base = a.sel(metric=RANDOM, rank=rank, mode=mode).transpose(dim).values
            for metric in (str(m) for m in a["metric"].values if m != RANDOM):
                key = (mode, faith._source(ds, metric, rank), faith._source(ds, RANDOM, rank))
                if key in first:
                    rows.append(dict(rows[first[key]], rank=rank, metric=metric))
                    copy_of.append(first[key])
                    continue
                x = a.sel(metric=metric, rank=rank, mode=mode).transpose(dim).values
                ok = np.isfinite(x) & np.isfinite(base)
                d = sign * (x[ok] - base[ok])
                row = dict(variable=name, mode=mode, rank=rank, metric=metric, n=int(ok.sum()),
                           aopc_metric=float(np.mean(x[ok])) if ok.any() else np.nan,
                           aopc_random=float(np.mean(base[ok])) if ok.any() else np.nan,
                           mean_difference=float(d.mean()) if len(d) else np.nan)
                row.update(faith._step(d, level, n_resamples, seed))
                lo, hi = _ratio_ci(x[ok], base[ok], level, n_resamples, seed)
                row.update(ratio_of_means=row["aopc_metric"] / row["aopc_random"]
                           if row["aopc_random"] else np.nan, ratio_ci_low=lo, ratio_ci_high=hi)
                if ok.sum() > 1 and abs(row["aopc_random"]) < stats.sem(base[ok]):
                    row["note"] = "random's mean AOPC is within a s.e. of 0: the ratio is unstable"
                first[key] = len(rows)
                rows.append(row)
                copy_of.append(first[key])
    table = pd.DataFrame(rows)
    if table.empty:
        return pd.DataFrame(columns=VS_RANDOM_COLUMNS)
    p = table["p_value"].to_numpy(dtype=float)
    originals = np.array(sorted(set(copy_of)), dtype=int)
    tested = originals[np.isfinite(p[originals])]
    p_holm = np.full(len(p), np.nan)
    if len(tested):
        p_holm[tested] = multipletests(p[tested], alpha=level, method="holm")[1]
    table["p_holm"] = p_holm = p_holm[copy_of]
    table["better"] = (np.nan_to_num(p_holm, nan=1.0) < level) & (table["ci_low"] > 0)
    table["note"] = table["note"].fillna("")
    table.attrs = {"level": level, "n_resamples": n_resamples}
    return table[list(VS_RANDOM_COLUMNS)]
