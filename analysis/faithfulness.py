"""Statistics of a faithfulness result (``<store>/faithfulness.nc``, see ``extract/faithfulness``).

The per-unit loss is the variable named by the file's ``loss_variable`` attribute: ``delta_ppl``
(intervened - clean perplexity) or ``accuracy_loss`` (clean_correct - correct); larger means the
removed keys mattered more. Units (sequences or items) are the replicates.

AOPC (area over the perturbation curve) of a (metric, rank, mode) for one unit is the mean of the
loss over the swept removal fractions P: AOPC = (1/|P|) sum_{p in P} loss(p)
(:func:`attngeom.store.format.derive.aopc`). ERASER (DeYoung et al. 2020) writes 1/(|P|+1) and
counts the trivial p = 0 term (loss 0); the two differ by the constant factor |P|/(|P|+1), which
changes no comparison.

The paper's order attention < value_weighted < value_weighted_normalized < contribution is tested
step by step, per (mode, rank), on paired per-unit AOPC differences oriented so that a positive
*improvement* means the step holds: AOPC(higher) - AOPC(lower) for comprehensiveness (a more
faithful metric removes more important keys first: larger loss), AOPC(lower) - AOPC(higher) for
sufficiency (it keeps the important keys: smaller loss). Each step: one-sided Wilcoxon
signed-rank test (H1: improvement > 0), a bootstrap CI of the mean improvement
(scipy.stats.bootstrap, BCa), Holm correction over all tested steps (statsmodels). A step
*holds* when its Holm-adjusted p < level and the CI lies above 0. Steps between metrics whose
rankings are provably identical (``same_ranking_as``, e.g. value_weighted and
value_weighted_normalized at head granularity) are reported, not tested.

These functions compute; :mod:`.faithfulness_stats` runs them once per result and stores the
tables that every output (the command's printout, the PDF, ``compare``, the studies' CSVs)
reads. The loss is the file's ``loss_variable`` or, for language modelling, the log perplexity
ratio ``log_ppl_ratio`` = log(PPL / clean PPL) in nats (:func:`log_ppl_ratio`; the second
study's primary outcome): :func:`outcomes` lists those a result has.

Output names (stable): :func:`aopc` -> DataArray ``aopc`` (metric, rank, mode, unit);
:func:`aopc_summary` -> DataFrame :data:`AOPC_COLUMNS`, one row per (metric, rank, mode);
:func:`loss_curves` -> DataFrame :data:`CURVE_COLUMNS`, one row per (metric, rank, mode,
fraction); both give the mean, its standard error and the t interval at the level over units
(:func:`t_interval`); :func:`order_table` -> DataFrame columns :data:`TABLE_COLUMNS`;
:func:`drift_summary` -> ``cosine_low_before_mean cosine_low_after_mean cosine_low_change_mean
cosine_low_p_value cosine_low_p_holm cosine_all_before_mean cosine_all_after_mean
output_norm_low_before_mean output_norm_low_after_mean n_units`` over (layer), attrs
``loss_variable loss_mean loss_p_value``.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import xarray as xr
from scipy import stats
from statsmodels.stats.multitest import multipletests

from attngeom.store.format import derive
from attngeom.common.errors import Refusal
from attngeom.common.metrics import PAPER_ORDER
from attngeom.common.vocab import COMPREHENSIVENESS, LEVEL, ORDER_RESAMPLES, SEED

from ._common import bootstrap_rng

ORDER = PAPER_ORDER                  # the order tested step by step
TABLE_COLUMNS = ("mode", "rank", "lower", "higher", "n", "aopc_lower", "aopc_higher",
                 "mean_improvement", "ci_low", "ci_high", "statistic", "p_value", "p_holm",
                 "holds", "note")
CELL = ("variable", "metric", "rank", "mode")
AOPC_COLUMNS = CELL + ("n_units", "aopc_mean", "aopc_sem", "ci_low", "ci_high")
CURVE_COLUMNS = CELL + ("fraction", "n_units", "loss_mean", "loss_sem", "ci_low", "ci_high")
LOG_RATIO = "log_ppl_ratio"


def unit_dim(ds: xr.Dataset) -> str:
    dim = ds.attrs.get("unit_dim") or ("sequence" if "sequence" in ds.dims else "item")
    if dim not in ds.dims:
        raise Refusal(f"faithfulness data has no '{dim}' dimension; is it a faithfulness file?")
    return dim


def log_ppl_ratio(ds: xr.Dataset) -> xr.DataArray:
    """log(ppl / clean_ppl) per (metric, rank, mode, fraction, unit); > 0: the removal hurt."""
    for name in ("ppl", "clean_ppl"):
        if name not in ds:
            raise Refusal(f"faithfulness data has no '{name}': the log PPL ratio needs a "
                             "language-modelling run (--task lm or gsm8k-answer)")
    out = np.log(ds["ppl"].astype(float) / ds["clean_ppl"].astype(float))
    out.name = LOG_RATIO
    out.attrs["description"] = "log(PPL under the removal / clean PPL), nats"
    return out


def outcomes(ds: xr.Dataset) -> tuple[str, ...]:
    """The losses a result's statistics use: its loss variable, then for language modelling
    the log PPL ratio."""
    first = ds.attrs.get("loss_variable") or ("delta_ppl" if "delta_ppl" in ds
                                              else "accuracy_loss")
    return (first, LOG_RATIO) if first == "delta_ppl" and "ppl" in ds else (first,)


def loss(ds: xr.Dataset, variable: str | None = None) -> xr.DataArray:
    """The per-unit loss (metric, rank, mode, fraction, unit), larger = more damage."""
    name = variable or outcomes(ds)[0]
    if name == LOG_RATIO and name not in ds:
        return log_ppl_ratio(ds)
    if name not in ds:
        raise Refusal(f"faithfulness data has no variable '{name}'")
    return ds[name].astype(float)


def aopc(ds: xr.Dataset, variable: str | None = None) -> xr.DataArray:
    """AOPC per (metric, rank, mode, unit): mean of the loss over the swept fractions."""
    out = derive.aopc(loss(ds, variable))
    out.name = "aopc"
    out.attrs["description"] = "mean over the swept removal fractions of the per-unit loss"
    return out


def t_interval(x: xr.DataArray, dim: str, level: float) -> xr.Dataset:
    """Mean, standard error, t interval at ``level`` and count of ``x`` over ``dim`` (NaN left
    out; the interval is NaN below two values): ``mean sem ci_low ci_high n``."""
    n = x.notnull().sum(dim)
    mean = x.mean(dim)
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        sem = x.std(dim, ddof=1) / np.sqrt(n)
    t = xr.apply_ufunc(lambda k: stats.t.ppf(1 - level / 2, np.maximum(k - 1, 1)), n)
    return xr.Dataset({"mean": mean, "sem": sem, "ci_low": mean - t * sem,
                       "ci_high": mean + t * sem, "n": n})


def _long(summary: xr.Dataset, names: dict[str, str], variable: str, columns) -> pd.DataFrame:
    table = summary.rename(names).to_dataframe().reset_index()
    table.insert(0, "variable", variable)
    table["n_units"] = table["n_units"].astype(int)
    return table[list(columns)]


def aopc_summary(ds: xr.Dataset, variable: str | None = None, level: float = LEVEL
                 ) -> pd.DataFrame:
    """The per-unit AOPC's mean, s.e., t interval and count per (metric, rank, mode), long."""
    s = t_interval(aopc(ds, variable), unit_dim(ds), level)
    return _long(s, {"mean": "aopc_mean", "sem": "aopc_sem", "n": "n_units"},
                 loss(ds, variable).name, AOPC_COLUMNS)


def loss_curves(ds: xr.Dataset, variable: str | None = None, level: float = LEVEL
                ) -> pd.DataFrame:
    """The loss's mean, s.e., t interval and count per (metric, rank, mode, fraction), long."""
    x = loss(ds, variable)
    s = t_interval(x, unit_dim(ds), level)
    return _long(s, {"mean": "loss_mean", "sem": "loss_sem", "n": "n_units"}, x.name,
                 CURVE_COLUMNS)


def _source(ds: xr.Dataset, metric: str, rank: str) -> str:
    """The computed ranking ``metric/rank`` uses (itself unless the file records a copy)."""
    if "same_ranking_as" not in ds:
        return f"{metric}/{rank}"
    return str(ds["same_ranking_as"].sel(metric=metric, rank=rank).item()) or f"{metric}/{rank}"


def _same_ranking(ds: xr.Dataset, a: str, b: str, rank: str) -> bool:
    """True when metrics a and b share one computed ranking (recorded in the file)."""
    return _source(ds, a, rank) == _source(ds, b, rank)


def _bootstrap_ci(d: np.ndarray, level: float, n_resamples: int, seed: int) -> tuple[float, float]:
    if len(d) < 2 or np.ptp(d) == 0:
        return float(d.mean()), float(d.mean())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for method in ("BCa", "percentile"):
            res = stats.bootstrap((d,), np.mean, n_resamples=n_resamples, method=method,
                                  confidence_level=1 - level,
                                  **bootstrap_rng(np.random.default_rng(seed)))
            lo, hi = res.confidence_interval
            if np.isfinite(lo) and np.isfinite(hi):
                return float(lo), float(hi)
    return np.nan, np.nan


def _step(d: np.ndarray, level: float, n_resamples: int, seed: int,
          alternative: str = "greater") -> dict:
    if len(d) == 0:
        return dict(statistic=np.nan, p_value=np.nan, ci_low=np.nan, ci_high=np.nan,
                    note="no units with finite values")
    ci_low, ci_high = _bootstrap_ci(d, level, n_resamples, seed)
    if np.all(d == 0):
        return dict(statistic=0.0, p_value=1.0, ci_low=ci_low, ci_high=ci_high,
                    note="no difference in any unit")
    res = stats.wilcoxon(d, alternative=alternative)
    return dict(statistic=float(res.statistic), p_value=float(res.pvalue), ci_low=ci_low,
                ci_high=ci_high, note="")


def order_table(ds: xr.Dataset, order: tuple[str, ...] | dict = ORDER, level: float = LEVEL,
                n_resamples: int = ORDER_RESAMPLES, seed: int = SEED, variable: str | None = None,
                alternative: str = "greater") -> pd.DataFrame:
    """Does each step of ``order`` hold, per (mode, rank)? One row per step (see module doc).

    ``order``: one order for every (mode, rank), or one per (mode, rank) (a dict, as
    :func:`attngeom.analysis.faithfulness_floor.observed_orders` gives); ``alternative``: of the
    Wilcoxon test (``"two-sided"`` for an order read from the same data).
    """
    a = aopc(ds, variable)
    dim = unit_dim(ds)
    known = set(map(str, a["metric"].values))
    orders = order if isinstance(order, dict) else {
        (str(m), str(r)): order for m in a["mode"].values for r in a["rank"].values}
    rows, first, copy_of = [], {}, []     # first: (mode, rankings compared) -> row index
    for mode in a["mode"].values:
        for rank in a["rank"].values:
            metrics = [m for m in orders.get((str(mode), str(rank)), ()) if m in known]
            for lower, higher in zip(metrics[:-1], metrics[1:]):
                key = (str(mode), _source(ds, lower, str(rank)), _source(ds, higher, str(rank)))
                if key in first:                  # e.g. magnitude = signed for non-negative
                    source = rows[first[key]]
                    row = dict(source, rank=str(rank), note=source["note"] or (
                        f"same rankings as rank={source['rank']}: the same test, counted "
                        "once in Holm"))
                else:
                    first[key] = len(rows)
                    row = _order_row(ds, a, dim, str(mode), str(rank), lower, higher, level,
                                     n_resamples, seed, alternative)
                rows.append(row)
                copy_of.append(first[key])
    table = pd.DataFrame(rows, columns=[c for c in TABLE_COLUMNS if c not in ("p_holm", "holds")])
    p = table["p_value"].to_numpy(dtype=float)
    originals = np.array(sorted(first.values()), dtype=int)
    tested = originals[np.isfinite(p[originals])]
    p_holm = np.full(len(p), np.nan)
    if len(tested):
        p_holm[tested] = multipletests(p[tested], alpha=level, method="holm")[1]
    table["p_holm"] = p_holm = p_holm[copy_of]
    table["holds"] = (np.isfinite(p_holm) & (np.nan_to_num(p_holm, nan=1.0) < level)
                      & (table["ci_low"].to_numpy(dtype=float) > 0))
    first_order = next(iter(orders.values()), ())
    table.attrs = {"level": level, "order": ",".join(m for m in first_order if m in known),
                   "n_resamples": n_resamples, "loss_variable": loss(ds, variable).name,
                   "alternative": alternative}
    return table[list(TABLE_COLUMNS)]


def _order_row(ds, a, dim, mode: str, rank: str, lower: str, higher: str, level: float,
               n_resamples: int, seed: int, alternative: str = "greater") -> dict:
    """One step of the order: paired AOPC differences over units, oriented so > 0 = holds."""
    lo = a.sel(metric=lower, rank=rank, mode=mode).transpose(dim).values
    hi = a.sel(metric=higher, rank=rank, mode=mode).transpose(dim).values
    ok = np.isfinite(lo) & np.isfinite(hi)
    sign = 1.0 if mode == COMPREHENSIVENESS else -1.0
    d = sign * (hi[ok] - lo[ok])
    row = dict(mode=mode, rank=rank, lower=lower, higher=higher, n=int(ok.sum()),
               aopc_lower=float(np.mean(lo[ok])) if ok.any() else np.nan,
               aopc_higher=float(np.mean(hi[ok])) if ok.any() else np.nan,
               mean_improvement=float(d.mean()) if len(d) else np.nan, note="")
    if _same_ranking(ds, lower, higher, rank):
        row.update(statistic=np.nan, p_value=np.nan, ci_low=np.nan, ci_high=np.nan,
                   note=f"identical ranking at {ds.attrs.get('granularity', 'this')} "
                        "granularity: not testable")
    else:
        row.update(_step(d, level, n_resamples, seed, alternative))
    return row


def drift_summary(ds: xr.Dataset, level: float = LEVEL) -> xr.Dataset:
    """Semantic drift: loss of zeroing the sink values, and the cone cosine per layer.

    ``cosine_low_p_value``: one-sided Wilcoxon over units, H1: the low-norm outputs' cosine to
    the semantic mean direction grows when the sink values are zeroed; Holm over layers.
    """
    if "drift_cosine_low_before" not in ds:
        raise Refusal("this faithfulness file has no drift results (run without --no-drift)")
    dim = unit_dim(ds)
    before, after = ds["drift_cosine_low_before"], ds["drift_cosine_low_after"]
    change = after - before
    p = []
    for layer in ds["layer"].values:
        d = change.sel(layer=layer).values
        d = d[np.isfinite(d)]
        p.append(np.nan if len(d) == 0 or np.all(d == 0) else
                 float(stats.wilcoxon(d, alternative="greater").pvalue))
    p = np.asarray(p)
    p_holm = np.full(len(p), np.nan)
    if np.isfinite(p).any():
        p_holm[np.isfinite(p)] = multipletests(p[np.isfinite(p)], method="holm")[1]
    out = xr.Dataset({
        "cosine_low_before_mean": before.mean(dim), "cosine_low_after_mean": after.mean(dim),
        "cosine_low_change_mean": change.mean(dim),
        "cosine_low_p_value": ("layer", p), "cosine_low_p_holm": ("layer", p_holm),
        "cosine_all_before_mean": ds["drift_cosine_all_before"].mean(dim),
        "cosine_all_after_mean": ds["drift_cosine_all_after"].mean(dim),
        "output_norm_low_before_mean": ds["drift_output_norm_low_before"].mean(dim),
        "output_norm_low_after_mean": ds["drift_output_norm_low_after"].mean(dim),
        "n_units": change.notnull().sum(dim)})
    name = "drift_delta_ppl" if "drift_delta_ppl" in ds else "drift_accuracy_loss"
    x = ds[name].values.astype(float)
    x = x[np.isfinite(x)]
    loss_p = (np.nan if len(x) == 0 or np.all(x == 0)
              else float(stats.wilcoxon(x, alternative="greater").pvalue))
    out.attrs = {"loss_variable": name, "loss_mean": float(x.mean()) if len(x) else np.nan,
                 "loss_p_value": loss_p, "level": level}
    return out
