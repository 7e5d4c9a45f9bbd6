"""Turn a study's stores and analysis files into the committed CSVs (no torch here).

Geometry (``attngeom analyze`` output): every ``<question>.nc`` is split by the dimensions of its
variables, one CSV per dimension set, e.g. ``geo_wikitext_convexity_layer_head.csv``; the LOWESS
grids are left out. Faithfulness (``<store>/<name>.nc``): AOPC summary, loss curves, the order
table (:func:`attngeom.analysis.faithfulness.order_table`), the semantic-drift summary per layer and
one row per unit (sequence or item) with its clean score, drift loss and AOPCs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr
from scipy import stats

from attngeom.analysis import equivalence as eq
from attngeom.analysis import faithfulness as faith

QUESTIONS = ("sinks", "convexity", "anti_alignment", "decomposition")


def _frame(ds: xr.Dataset, names: list[str]) -> pd.DataFrame:
    sub = ds[names]
    if not sub.dims:
        return pd.DataFrame([{n: sub[n].item() for n in names}])
    return sub.to_dataframe().reset_index()


def export_analysis(directory: Path, results: Path, prefix: str) -> list[Path]:
    """One CSV per (question, dimension set) and the summary table; return the paths."""
    written = []
    for q in QUESTIONS:
        with xr.open_dataset(directory / f"{q}.nc") as ds:
            ds = ds.load()
        by_dims: dict[tuple, list[str]] = {}
        for name, var in ds.data_vars.items():
            if "grid" not in var.dims:
                by_dims.setdefault(var.dims, []).append(name)
        for dims, names in by_dims.items():
            path = results / f"{prefix}_{q}_{'_'.join(dims) or 'scalar'}.csv"
            _frame(ds, names).to_csv(path, index=False)
            written.append(path)
    summary = results / f"{prefix}_summary.csv"
    pd.read_csv(directory / "summary.csv").to_csv(summary, index=False)
    return written + [summary]


def _units(ds: xr.Dataset) -> pd.DataFrame:
    dim = faith.unit_dim(ds)
    out = pd.DataFrame({dim: ds[dim].values})
    for name in ("clean_ppl", "clean_correct", "answer", "drift_delta_ppl", "drift_accuracy_loss",
                 "length", "truncated"):
        if name in ds and ds[name].dims == (dim,):
            out[name] = ds[name].values
    a = faith.aopc(ds)
    for m in a["metric"].values:
        for r in a["rank"].values:
            for mode in a["mode"].values:
                out[f"aopc_{m}_{r}_{mode}"] = a.sel(metric=m, rank=r, mode=mode).transpose(dim).values
    return out


def drift_loss_ci(x: np.ndarray, level: float = 0.05, seed: int = 0) -> dict:
    """Mean drift loss with a BCa bootstrap CI and a one-sided Wilcoxon p (H1: loss > 0)."""
    x = x[np.isfinite(x)]
    if len(x) < 2 or np.ptp(x) == 0:
        return dict(n=len(x), mean=float(x.mean()) if len(x) else np.nan,
                    ci_low=np.nan, ci_high=np.nan, p_value=np.nan)
    ci = stats.bootstrap((x,), np.mean, n_resamples=9999, method="BCa", confidence_level=1 - level,
                         random_state=np.random.default_rng(seed)).confidence_interval
    return dict(n=len(x), mean=float(x.mean()), median=float(np.median(x)),
                ci_low=float(ci.low), ci_high=float(ci.high),
                p_value=float(stats.wilcoxon(x, alternative="greater").pvalue))


def export_faithfulness(nc: Path, results: Path, prefix: str, level: float = 0.05) -> list[Path]:
    """CSVs of one faithfulness result; return the paths."""
    with xr.open_dataset(nc) as ds:
        ds = ds.load()
    files = {"aopc": faith.aopc_summary(ds, level=level),
             "curves": faith.loss_curves(ds, level=level),
             "order": faith.order_table(ds, level=level),
             "units": _units(ds)}
    if "ppl" in ds and "clean_ppl" in ds:
        # robustness check: comprehensiveness losses are heavy-tailed (ΔPPL up to 1e4), so the
        # order is also tested on log(ppl / clean_ppl), which no single exploding text dominates
        ds = eq.with_log_ppl_ratio(ds)
        files["order_log"] = faith.order_table(ds, level=level, variable=eq.LOG_RATIO)
    info = dict(task=ds.attrs.get("task"), granularity=ds.attrs.get("granularity"),
                loss_variable=ds.attrs.get("loss_variable"), n_units=ds.sizes[faith.unit_dim(ds)])
    if "clean_accuracy" in ds:
        info["clean_accuracy"] = float(ds["clean_accuracy"])
    if "drift_cosine_low_before" in ds:
        drift = faith.drift_summary(ds, level=level)
        files["drift_layers"] = drift.to_dataframe().reset_index()
        name = drift.attrs["loss_variable"]
        info.update({f"drift_{k}": v for k, v in drift_loss_ci(ds[name].values.astype(float),
                                                                  level).items()})
        info["drift_loss_variable"] = name
    files["info"] = pd.DataFrame([info])
    written = []
    for key, frame in files.items():
        path = results / f"{prefix}_{key}.csv"
        frame.to_csv(path, index=False)
        written.append(path)
    return written


def clean_accuracy(nc: Path, chance: float, level: float = 0.05) -> dict:
    """Clean accuracy of a multiple-choice run with a Clopper-Pearson CI and one-sided exact
    binomial tests (H1: accuracy above) against ``chance`` and against ``baseline`` = the larger of
    chance and the sample's majority-answer rate (a model that always gives the most common answer
    scores that). ``above_chance`` requires beating the baseline: only then does an accuracy loss
    under intervention measure anything the model knows."""
    with xr.open_dataset(nc) as ds:
        correct = ds["clean_correct"].values.astype(int)
        answer = ds["answer"].values.astype(int)
    k, n = int(correct.sum()), len(correct)
    ci = stats.binomtest(k, n).proportion_ci(confidence_level=1 - level, method="exact")
    majority = float(np.bincount(answer).max() / n)
    baseline = max(chance, majority)
    p_chance = stats.binomtest(k, n, chance, alternative="greater").pvalue
    p_base = stats.binomtest(k, n, baseline, alternative="greater").pvalue if baseline < 1 else 1.0
    return dict(n=n, correct=k, accuracy=k / n, ci_low=ci.low, ci_high=ci.high, chance=chance,
                majority_rate=majority, p_above_chance=p_chance, baseline=baseline,
                p_above_baseline=p_base, above_chance=bool(p_base < level and ci.low > baseline))


# ---------------------------------------------------------------------- second study
D2_STEPS = (("attention", "value_weighted"), ("value_weighted", "contribution"),
            ("attention", "contribution"))


def _load(nc: Path) -> xr.Dataset:
    with xr.open_dataset(nc) as ds:
        return eq.with_log_ppl_ratio(ds.load())


def _long(ds: xr.Dataset, names: list[str]) -> pd.DataFrame:
    return ds[names].to_dataframe().reset_index()


def curves_and_aopc(ds: xr.Dataset) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Loss per fraction and AOPC (mean, s.e., median over units) of both outcomes, long."""
    curves, aopcs = [], []
    dim = faith.unit_dim(ds)
    for var in (eq.LOG_RATIO, "delta_ppl"):
        keys = ["metric", "rank", "mode"]
        median = faith.loss(ds, var).median(dim).rename("loss_median").to_dataframe()
        curves.append(faith.loss_curves(ds, var).merge(
            median.reset_index()[keys + ["fraction", "loss_median"]], on=keys + ["fraction"]))
        median = faith.aopc(ds, var).median(dim).rename("aopc_median").to_dataframe()
        aopcs.append(faith.aopc_summary(ds, var).merge(
            median.reset_index()[keys + ["aopc_median"]], on=keys))
    return pd.concat(curves, ignore_index=True), pd.concat(aopcs, ignore_index=True)


def design1_units(ds: xr.Dataset) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(one row per unit: clean PPL, length and every AOPC of both outcomes; one row per
    (unit, metric, rank, mode, fraction): ppl, log_ppl_ratio, delta_ppl): the paired data
    every test and power figure can be recomputed from."""
    dim = faith.unit_dim(ds)
    units = pd.DataFrame({dim: ds[dim].values})
    for name in ("clean_ppl", "length", "truncated", "n_scored"):
        if name in ds and ds[name].dims == (dim,):
            units[name] = ds[name].values
    for var in (eq.LOG_RATIO, "delta_ppl"):
        a = faith.aopc(ds, var)
        for m in a["metric"].values:
            for r in a["rank"].values:
                for mode in a["mode"].values:
                    units[f"aopc_{var}_{m}_{r}_{mode}"] = a.sel(
                        metric=m, rank=r, mode=mode).transpose(dim).values
    fractions = _long(ds, ["ppl", eq.LOG_RATIO, "delta_ppl"])
    return units, fractions


def export_design1(nc: Path, results: Path, prefix: str, level: float = 0.05) -> list[Path]:
    """CSVs of a design-1 run: the order with MDE/TOST/verdicts on the primary outcome (AOPC
    of log PPL ratio, ``_order_log``) and on ΔPPL (``_order``), curves, AOPCs, units, info."""
    ds = _load(nc)
    primary = eq.equivalence_table(ds, eq.DELTA_LOG, variable=eq.LOG_RATIO, level=level)
    margin = eq.delta_ppl_margin(ds)
    secondary = eq.equivalence_table(ds, margin, variable="delta_ppl", level=level)
    curves, aopcs = curves_and_aopc(ds)
    units, fractions = design1_units(ds)
    info = dict(task=ds.attrs.get("task"), granularity=ds.attrs.get("granularity"),
                layers=ds.attrs.get("layers"), n_units=ds.sizes[faith.unit_dim(ds)],
                fractions=",".join(map(str, ds["fraction"].values)),
                clean_ppl_mean=float(ds["clean_ppl"].mean()), delta_log=eq.DELTA_LOG,
                delta_ppl=margin, m_tests=primary.attrs["m_tests"], level=level,
                power=eq.POWER, model=ds.attrs.get("model"), data=ds.attrs.get("data"))
    files = {"order_log": primary, "order": secondary, "curves": curves, "aopc": aopcs,
             "units": units, "units_fraction": fractions, "info": pd.DataFrame([info])}
    return _write(files, results, prefix)


def export_stats(stats, results: Path, prefix: str) -> list[Path]:
    """CSVs of a run's stored statistics (:class:`attngeom.analysis.faithfulness_stats.
    FaithStats`, the numbers ``attngeom compare`` shows), both losses in each: the ranking of
    every metric with its adjacent steps tested (``_ranking``), each metric against the random
    floor (``_vs_random``) and the AOPC with its min-max over the rankings run (``_minmax``)."""
    return _write({"ranking": stats.ranking, "vs_random": stats.vs_random,
                   "minmax": stats.aopc}, results, prefix)


def export_design2(runs: dict[int, Path], results: Path, prefix: str,
                   level: float = 0.05, layer_types: list[str] | None = None) -> list[Path]:
    """CSVs of the single-layer runs ``{layer: result file}``: per (step, layer) tests with
    Holm over layers on the log PPL ratio (``_layers``) and on ΔPPL (``_layers_dppl``), the
    mean outcome per (layer, metric) and one row per (layer, unit, metric).

    ``layer_types`` (the config's, e.g. Gemma 3's sliding_attention / full_attention): a
    ``layer_type`` column, and ``_layers_by_type``: the same tests with Holm over the layers of
    each kind alone (a kind's family is its own, not pooled with the others)."""
    data = {layer: _load(nc) for layer, nc in runs.items()}
    files = _design2_files(data, level)
    if layer_types:
        kind = {layer: layer_types[layer] for layer in data}
        for frame in files.values():
            frame.insert(1, "layer_type", frame["layer"].map(kind))
        parts = [eq.layer_table({k: v for k, v in data.items() if kind[k] == t}, D2_STEPS,
                                eq.DELTA_LOG, variable=eq.LOG_RATIO, level=level)
                 .assign(layer_type=t) for t in sorted(set(kind.values()))]
        files["layers_by_type"] = pd.concat(parts, ignore_index=True)
    return _write(files, results, prefix)


def _design2_files(data: dict, level: float) -> dict[str, pd.DataFrame]:
    """The design-2 tables of :func:`export_design2` (one family: every layer run)."""
    primary = eq.layer_table(data, D2_STEPS, eq.DELTA_LOG, variable=eq.LOG_RATIO, level=level)
    margin = eq.delta_ppl_margin(next(iter(data.values())))
    secondary = eq.layer_table(data, D2_STEPS, margin, variable="delta_ppl", level=level)
    means, units = [], []
    for layer, ds in sorted(data.items()):
        dim = faith.unit_dim(ds)
        x = ds[[eq.LOG_RATIO, "delta_ppl", "ppl"]].squeeze(["fraction", "mode", "rank"])
        u = x.to_dataframe().reset_index().assign(layer=layer)
        u["clean_ppl"] = ds["clean_ppl"].sel({dim: u[dim].values}).values
        units.append(u)
        g = u.groupby("metric")
        means.append(pd.DataFrame({
            "layer": layer, "n": g[eq.LOG_RATIO].count(),
            "log_ppl_ratio_mean": g[eq.LOG_RATIO].mean(),
            "log_ppl_ratio_sem": g[eq.LOG_RATIO].sem(),
            "log_ppl_ratio_median": g[eq.LOG_RATIO].median(),
            "delta_ppl_mean": g["delta_ppl"].mean()}).reset_index())
    return {"layers": primary, "layers_dppl": secondary,
            "layer_means": pd.concat(means, ignore_index=True),
            "units": pd.concat(units, ignore_index=True)}


def _write(files: dict[str, pd.DataFrame], results: Path, prefix: str) -> list[Path]:
    results.mkdir(parents=True, exist_ok=True)
    written = []
    for key, frame in files.items():
        path = results / f"{prefix}_{key}.csv"
        frame.to_csv(path, index=False)
        written.append(path)
    return written
