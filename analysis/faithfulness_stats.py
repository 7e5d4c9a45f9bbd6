"""A faithfulness result's statistics, computed once and stored: every output reads them.

For a result ``<name>.nc`` the statistics are the AOPC table (per outcome: mean, s.e. and the
t interval at the level), the loss curves (mean and t band per fraction), the order test with
each step's MDE, TOST and verdict (:func:`attngeom.analysis.equivalence.equivalence_table`),
for the file's loss (ΔPPL or accuracy loss) and, for language modelling, the log PPL ratio,
and the semantic-drift summary. They are written to ``<analysis>/<name>_stats.nc`` by
``attngeom faithfulness`` (into ``<store>/analysis``), ``attngeom analyze`` and ``attngeom
report``, with the settings they used (:class:`StatsSettings`) and the sha256 of the result
file they came from. :func:`ensure` reads them when both match and recomputes them otherwise:
never a stale table. Settings other than the defaults are stored beside the default file
(``<name>_stats.level-0.1.nc``), so the command's printout, the PDF, ``summary.csv`` and the
figures show the numbers of one stored table.

Output names (stable): tables ``aopc`` (columns :data:`AOPC_COLUMNS`), ``order``
(``analysis.faithfulness.TABLE_COLUMNS`` then ``analysis.equivalence.EXTRA_COLUMNS``), the
Dataset ``curves`` (``curve_mean curve_low curve_high curve_n`` over metric, rank, mode,
fraction; attribute ``curve_variable``) and ``drift`` (``analysis.faithfulness.drift_summary``).
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr
from scipy import stats as sps

from attngeom import __version__
from attngeom.store import read_manifest
from attngeom.common.vocab import LEVEL, ORDER_RESAMPLES, SEED
from attngeom.common.atomic import atomic_write_bytes
from attngeom.store.io.results import recorded_sha256, verified_file
from attngeom.store.io.writer import write_netcdf

from . import ANALYSIS_DIR
from . import equivalence as eq
from . import faithfulness as faith

AOPC_COLUMNS = ("variable", "metric", "rank", "mode", "aopc_mean", "aopc_sem", "ci_low",
                "ci_high", "n_units")
ORDER_PREFIX, AOPC_PREFIX, DRIFT_PREFIX = "order_", "aopc_", "drift_"


@dataclass(frozen=True)
class StatsSettings:
    """What the statistics depend on besides the result file (all recorded in the file)."""

    level: float = LEVEL                    # tests, CIs (1 - level) and Holm
    n_resamples: int = ORDER_RESAMPLES      # bootstrap resamples of each step's CI
    seed: int = SEED
    power: float = eq.POWER                 # of the MDE
    delta_log: float = eq.DELTA_LOG         # TOST margins, see analysis/equivalence.py
    delta_ppl_share: float = eq.DELTA_PPL_SHARE
    delta_accuracy: float = eq.DELTA_ACCURACY

    def suffix(self) -> str:
        """``""`` for the defaults, else ``.name-value`` for each setting that differs."""
        base = StatsSettings()
        return "".join(f".{f.name.replace('_', '-')}-{getattr(self, f.name):g}"
                       for f in dataclasses.fields(self)
                       if getattr(self, f.name) != getattr(base, f.name))


def stats_settings(options) -> StatsSettings:
    """The statistics' settings from an :class:`~attngeom.common.options.stages.AnalysisOptions`
    (its level, seed and order resamples; the margins are the declared ones)."""
    return StatsSettings(level=options.level, seed=options.seed,
                         n_resamples=options.order_resamples)


@dataclass
class FaithStats:
    """The stored statistics of one faithfulness result (see the module docstring)."""

    aopc: pd.DataFrame
    order: pd.DataFrame
    curves: xr.Dataset
    drift: xr.Dataset | None
    attrs: dict

    def for_variable(self, table: pd.DataFrame, variable: str | None = None) -> pd.DataFrame:
        """Rows of ``table`` for ``variable`` (default: the result's loss variable)."""
        variable = variable or self.attrs["loss_variable"]
        out = table[table["variable"] == variable].reset_index(drop=True)
        out.attrs = dict(self.attrs)
        return out


# ----------------------------------------------------------------------------- compute
def outcomes(ds: xr.Dataset, settings: StatsSettings) -> list[tuple[str, float]]:
    """(per-unit loss variable, TOST margin) the order test is run on."""
    loss = ds.attrs.get("loss_variable", "delta_ppl")
    if loss == "delta_ppl":
        return [(loss, eq.delta_ppl_margin(ds, settings.delta_ppl_share)),
                (eq.LOG_RATIO, settings.delta_log)]
    return [(loss, settings.delta_accuracy)]


def _aopc(ds: xr.Dataset, variable: str, level: float) -> pd.DataFrame:
    s = faith.aopc_summary(ds, variable)
    n = s["n_units"]
    half = xr.apply_ufunc(lambda k: sps.t.ppf(1 - level / 2, np.maximum(k - 1, 1)), n) \
        * s["aopc_sem"]
    s["ci_low"], s["ci_high"] = s["aopc_mean"] - half, s["aopc_mean"] + half
    t = s.to_dataframe().reset_index()
    t.insert(0, "variable", variable)
    return t[list(AOPC_COLUMNS)]


def _curves(ds: xr.Dataset, level: float) -> xr.Dataset:
    """Mean and t band over units of the loss (ΔPPL) or of accuracy, per fraction."""
    lm = ds.attrs.get("loss_variable", "delta_ppl") == "delta_ppl"
    name = "delta_ppl" if lm else "correct"
    x = ds[name].astype(float)
    dim = faith.unit_dim(ds)
    n = x.notnull().sum(dim)
    sd = x.std(dim, ddof=1) if x.sizes[dim] > 1 else xr.zeros_like(x.mean(dim))
    half = xr.apply_ufunc(lambda k: sps.t.ppf(1 - level / 2, np.maximum(k - 1, 1)), n) \
        * sd / np.sqrt(np.maximum(n, 1))
    mean = x.mean(dim)
    out = xr.Dataset({"curve_mean": mean, "curve_low": mean - half, "curve_high": mean + half,
                      "curve_n": n})
    out.attrs["curve_variable"] = name
    return out


def compute(ds: xr.Dataset, settings: StatsSettings = StatsSettings(), *,
            source_sha256: str = "", name: str = "faithfulness") -> FaithStats:
    """Every statistic of the faithfulness result ``ds`` with ``settings``."""
    lm = "ppl" in ds
    data = eq.with_log_ppl_ratio(ds) if lm else ds
    aopc, order = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for variable, delta in outcomes(ds, settings):
            aopc.append(_aopc(data, variable, settings.level))
            order.append(eq.equivalence_table(
                data, delta, variable=variable, level=settings.level, power=settings.power,
                n_resamples=settings.n_resamples, seed=settings.seed))
    drift = faith.drift_summary(ds, settings.level) if "drift_cosine_low_before" in ds else None
    attrs = {**dataclasses.asdict(settings), "source": name, "source_sha256": source_sha256,
             "loss_variable": ds.attrs.get("loss_variable", "delta_ppl"),
             "order": order[0].attrs.get("order", ""), "attngeom_version": __version__}
    return FaithStats(pd.concat(aopc, ignore_index=True), pd.concat(order, ignore_index=True),
                      _curves(ds, settings.level), drift, attrs)


# ----------------------------------------------------------------------------- the file
def _table_vars(table: pd.DataFrame, prefix: str, dim: str) -> dict:
    out = {}
    for column in table.columns:
        values = table[column].to_numpy()
        if values.dtype == object:
            values = values.astype(str)
        out[prefix + column] = ((dim,), values)
    return out


def to_dataset(s: FaithStats) -> xr.Dataset:
    """The statistics as one netCDF-ready Dataset (tables along ``order_step``/``aopc_row``)."""
    parts = [xr.Dataset(_table_vars(s.order, ORDER_PREFIX, "order_step")),
             xr.Dataset(_table_vars(s.aopc, AOPC_PREFIX, "aopc_row")), s.curves.drop_attrs()]
    if s.drift is not None:
        parts.append(s.drift.drop_attrs().rename(
            {k: DRIFT_PREFIX + k for k in s.drift.data_vars}))
    out = xr.merge(parts, combine_attrs="drop")
    drift_attrs = {} if s.drift is None else {DRIFT_PREFIX + k: v for k, v in
                                              s.drift.attrs.items()}
    out.attrs = {**s.attrs, **drift_attrs, "curve_variable": s.curves.attrs["curve_variable"],
                 "order_columns": ",".join(s.order.columns),
                 "attngeom_format": "attngeom-faithfulness-stats"}
    return out


def _table(ds: xr.Dataset, prefix: str, columns) -> pd.DataFrame:
    return pd.DataFrame({c: ds[prefix + c].values for c in columns})


def from_dataset(ds: xr.Dataset) -> FaithStats:
    """Inverse of :func:`to_dataset`."""
    attrs = {k: v for k, v in ds.attrs.items()
             if not k.startswith(DRIFT_PREFIX) and k not in ("order_columns", "curve_variable")}
    for key in ("n_resamples", "seed"):
        attrs[key] = int(attrs[key])
    order = _table(ds, ORDER_PREFIX, str(ds.attrs["order_columns"]).split(","))
    for column in ("holds", "equivalent", "reversed"):
        order[column] = order[column].astype(bool)
    order["n"] = order["n"].astype(int)
    aopc = _table(ds, AOPC_PREFIX, AOPC_COLUMNS)
    curves = ds[["curve_mean", "curve_low", "curve_high", "curve_n"]]
    curves.attrs["curve_variable"] = ds.attrs["curve_variable"]
    drift = None
    names = [k for k in ds.data_vars if k.startswith(DRIFT_PREFIX)]
    if names:
        drift = ds[names].rename({k: k.removeprefix(DRIFT_PREFIX) for k in names})
        drift.attrs = {k.removeprefix(DRIFT_PREFIX): v for k, v in ds.attrs.items()
                       if k.startswith(DRIFT_PREFIX)}
    return FaithStats(aopc, order, curves, drift, attrs)


def stats_path(directory: str | Path, name: str, settings: StatsSettings) -> Path:
    """``<directory>/<name>_stats<suffix>.nc``."""
    return Path(directory) / f"{name}_stats{settings.suffix()}.nc"


def read(path: Path) -> FaithStats:
    with xr.open_dataset(path, engine="h5netcdf") as f:
        return from_dataset(f.load())


def state(path: Path, source_sha256: str, settings: StatsSettings) -> str:
    """``"current"``, ``"missing"`` or why the stored statistics are stale."""
    if not path.is_file():
        return "missing"
    with xr.open_dataset(path, engine="h5netcdf") as f:
        attrs = dict(f.attrs)
    if attrs.get("source_sha256") != source_sha256:
        return "stale: made from another version of the result file (checksum differs)"
    for field in dataclasses.fields(settings):
        if not np.isclose(float(attrs.get(field.name, np.nan)), getattr(settings, field.name)):
            return f"stale: made with {field.name} {attrs.get(field.name)}"
    return "current"


def ensure(faith_ds: xr.Dataset, source_sha256: str, directory: str | Path, name: str,
           settings: StatsSettings = StatsSettings(), log=print) -> FaithStats:
    """The stored statistics of result ``name``, computed and written when missing or stale."""
    path = stats_path(directory, name, settings)
    why = state(path, source_sha256, settings)
    if why == "current":
        return read(path)
    if why != "missing":
        log(f"attngeom: recomputing {path.name} ({why})")
    s = compute(faith_ds, settings, source_sha256=source_sha256, name=name)
    write_netcdf(to_dataset(s), path)
    stored = read(path)
    for table in ("order", "aopc"):                  # the same numbers, for spreadsheets
        atomic_write_bytes(path.with_suffix(f".{table}.csv"),
                           getattr(stored, table).to_csv(index=False).encode())
    return stored


def for_store(store: str | Path, name: str, directory: str | Path | None = None,
              settings: StatsSettings = StatsSettings(), log=print, manifest: dict | None = None
              ) -> tuple[FaithStats | None, xr.Dataset | None, str]:
    """(statistics, result, "") of the faithfulness result ``name`` recorded in ``store``,
    stored in ``directory`` (default ``<store>/analysis``); (None, None, why) when the result is
    not recorded, missing or does not match its checksum."""
    store = Path(store)
    manifest = read_manifest(store) if manifest is None else manifest
    path, why = verified_file(store, manifest, name)
    if why:
        return None, None, why
    with xr.open_dataset(path, engine="h5netcdf") as f:
        ds = f.load()
    directory = store / ANALYSIS_DIR if directory is None else Path(directory)
    return ensure(ds, recorded_sha256(manifest, name), directory, name, settings, log), ds, ""
