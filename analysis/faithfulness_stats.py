"""A faithfulness result's statistics, computed once and stored: every output reads them.

For a result ``<name>.nc`` the statistics are, for each of its losses (the file's loss, ΔPPL
or accuracy loss, and for language modelling the log PPL ratio in nats,
:func:`attngeom.analysis.faithfulness.outcomes`): the AOPC table and the loss curves (mean,
s.e. and the t interval at the level over units), the order test with each step's MDE, TOST
and verdict (:func:`attngeom.analysis.equivalence.equivalence_table`); and the semantic-drift
summary; and the floor and the order over every metric run
(:mod:`attngeom.analysis.faithfulness_floor`): each metric against random, the AOPC min-max over
the rankings run beside the raw AOPC, the ranking with its adjacent steps tested, and the share
of removed sets that hold the query's own key. They are written to
``<analysis>/<name>_stats.nc`` by ``attngeom faithfulness`` (into
``<store>/analysis``), ``attngeom analyze`` and ``attngeom report``, with the settings they
used (:class:`StatsSettings`) and the sha256 of the result file they came from. :func:`ensure`
reads them when both match and recomputes them otherwise: never a stale table. Settings other
than the defaults are stored beside the default file (``<name>_stats.level-0.1.nc``), so the
command's printout, the PDF, ``compare``, ``summary.csv`` and the figures show the numbers of
one stored table (:mod:`attngeom.reports.faithfulness_tables` formats them for the printout
and the PDF alike).

Output names (stable), tables with a ``variable`` column: ``aopc``
(``analysis.faithfulness.AOPC_COLUMNS`` then ``analysis.faithfulness_floor.MINMAX_COLUMNS``),
``curves`` (``analysis.faithfulness.CURVE_COLUMNS``), ``order`` (``analysis.faithfulness.
TABLE_COLUMNS`` then ``analysis.equivalence.EXTRA_COLUMNS``), ``ranking`` (``position`` then the
order's columns), ``vs_random`` (``analysis.faithfulness_floor.VS_RANDOM_COLUMNS``); ``self_key``
(:data:`SELF_KEY_COLUMNS`); and the Dataset ``drift`` (``analysis.faithfulness.drift_summary``).
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

from attngeom import __version__
from attngeom.store import read_manifest
from attngeom.common.vocab import LEVEL, ORDER_RESAMPLES, SEED
from attngeom.common.atomic import atomic_write_bytes
from attngeom.store.io.results import recorded_sha256, verified_file
from attngeom.store.io.writer import write_netcdf

from . import ANALYSIS_DIR
from . import equivalence as eq
from . import faithfulness as faith
from . import faithfulness_floor as floor

ORDER_PREFIX, AOPC_PREFIX, CURVE_PREFIX, DRIFT_PREFIX = "order_", "aopc_", "curve_", "drift_"
TABLES = {"order": (ORDER_PREFIX, "order_step"), "aopc": (AOPC_PREFIX, "aopc_row"),
          "curves": (CURVE_PREFIX, "curve_row"), "ranking": ("ranking_", "ranking_step"),
          "vs_random": ("random_", "random_row"),
          "self_key": ("self_", "self_row")}                  # table -> (prefix, row dim)
FORMAT = 3               # of the stored file: 3 = with the floor, the ranking, the self key
SELF_KEY_COLUMNS = ("metric", "rank", "mode", "fraction", "n_units", "share_mean")
BOOLEAN = ("holds", "equivalent", "reversed", "better")


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
    curves: pd.DataFrame
    drift: xr.Dataset | None
    attrs: dict
    ranking: pd.DataFrame = dataclasses.field(default_factory=pd.DataFrame)
    vs_random: pd.DataFrame = dataclasses.field(default_factory=pd.DataFrame)
    self_key: pd.DataFrame = dataclasses.field(default_factory=pd.DataFrame)

    @property
    def variables(self) -> list[str]:
        """The losses the tables hold, the result's own first."""
        return list(dict.fromkeys(self.aopc["variable"]))

    def for_variable(self, table: pd.DataFrame, variable: str | None = None) -> pd.DataFrame:
        """Rows of ``table`` for ``variable`` (default: the result's loss variable)."""
        variable = variable or self.attrs["loss_variable"]
        out = table[table["variable"] == variable].reset_index(drop=True)
        out.attrs = dict(self.attrs)
        return out


# ----------------------------------------------------------------------------- compute
def outcomes(ds: xr.Dataset, settings: StatsSettings) -> list[tuple[str, float]]:
    """(per-unit loss variable, TOST margin) the statistics are computed on."""
    margins = {"delta_ppl": lambda: eq.delta_ppl_margin(ds, settings.delta_ppl_share),
               eq.LOG_RATIO: lambda: settings.delta_log}
    return [(v, margins.get(v, lambda: settings.delta_accuracy)()) for v in faith.outcomes(ds)]


def compute(ds: xr.Dataset, settings: StatsSettings = StatsSettings(), *,
            source_sha256: str = "", name: str = "faithfulness") -> FaithStats:
    """Every statistic of the faithfulness result ``ds`` with ``settings``."""
    tables: dict[str, list] = {"aopc": [], "curves": [], "order": [], "ranking": [],
                               "vs_random": []}
    common = dict(level=settings.level, n_resamples=settings.n_resamples, seed=settings.seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for variable, delta in outcomes(ds, settings):
            aopc = faith.aopc_summary(ds, variable, settings.level)
            tables["aopc"].append(aopc.merge(floor.minmax_summary(ds, variable, settings.level),
                                             on=["metric", "rank", "mode"], how="left"))
            tables["curves"].append(faith.loss_curves(ds, variable, settings.level))
            tables["order"].append(eq.equivalence_table(
                ds, delta, variable=variable, power=settings.power, **common))
            tables["ranking"].append(floor.ranking_table(ds, delta, variable,
                                                         power=settings.power, **common))
            tables["vs_random"].append(floor.versus_random(ds, variable, **common))
    drift = faith.drift_summary(ds, settings.level) if "drift_cosine_low_before" in ds else None
    attrs = {**dataclasses.asdict(settings), "source": name, "source_sha256": source_sha256,
             "loss_variable": faith.outcomes(ds)[0], "granularity": ds.attrs.get("granularity", ""),
             "order": tables["order"][0].attrs.get("order", ""), "attngeom_version": __version__}
    joined = {k: pd.concat(v, ignore_index=True) for k, v in tables.items()}
    return FaithStats(joined["aopc"], joined["order"], joined["curves"], drift, attrs,
                      joined["ranking"], joined["vs_random"], self_key_table(ds))


def self_key_table(ds: xr.Dataset) -> pd.DataFrame:
    """Mean share of removed sets holding the query's own key, per (metric, rank, mode,
    fraction), over units; empty for a result without it."""
    if "self_key_removed" not in ds:
        return pd.DataFrame(columns=SELF_KEY_COLUMNS)
    x = ds["self_key_removed"].astype(float)
    dim = faith.unit_dim(ds)
    out = xr.Dataset({"share_mean": x.mean(dim), "n_units": x.notnull().sum(dim)})
    table = out.to_dataframe().reset_index()
    return table[list(SELF_KEY_COLUMNS)]


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
    """The statistics as one netCDF-ready Dataset (each table along its row dimension)."""
    parts = [xr.Dataset(_table_vars(getattr(s, table), prefix, dim))
             for table, (prefix, dim) in TABLES.items()]
    if s.drift is not None:
        parts.append(s.drift.drop_attrs().rename(
            {k: DRIFT_PREFIX + k for k in s.drift.data_vars}))
    out = xr.merge(parts, combine_attrs="drop")
    drift_attrs = {} if s.drift is None else {DRIFT_PREFIX + k: v for k, v in
                                              s.drift.attrs.items()}
    columns = {f"{table}_columns": ",".join(getattr(s, table).columns) for table in TABLES}
    out.attrs = {**s.attrs, **drift_attrs, **columns, "stats_format": FORMAT,
                 "attngeom_format": "attngeom-faithfulness-stats"}
    return out


def _table(ds: xr.Dataset, prefix: str, columns) -> pd.DataFrame:
    return pd.DataFrame({c: ds[prefix + c].values for c in columns})


def from_dataset(ds: xr.Dataset) -> FaithStats:
    """Inverse of :func:`to_dataset`."""
    attrs = {k: v for k, v in ds.attrs.items() if not k.startswith(DRIFT_PREFIX)
             and not k.endswith("_columns") and k != "stats_format"}
    for key in ("n_resamples", "seed"):
        attrs[key] = int(attrs[key])
    tables = {table: _table(ds, prefix, [c for c in str(ds.attrs[f"{table}_columns"]).split(",")
                                         if c]) for table, (prefix, _) in TABLES.items()}
    for t in tables.values():
        for column in BOOLEAN:
            if column in t:
                t[column] = t[column].astype(bool)
    for t in ("order", "ranking"):
        tables[t]["n"] = tables[t]["n"].astype(int)
    drift = None
    names = [k for k in ds.data_vars if k.startswith(DRIFT_PREFIX)]
    if names:
        drift = ds[names].rename({k: k.removeprefix(DRIFT_PREFIX) for k in names})
        drift.attrs = {k.removeprefix(DRIFT_PREFIX): v for k, v in ds.attrs.items()
                       if k.startswith(DRIFT_PREFIX)}
    return FaithStats(tables["aopc"], tables["order"], tables["curves"], drift, attrs,
                      tables["ranking"], tables["vs_random"], tables["self_key"])


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
    if int(attrs.get("stats_format", 1)) != FORMAT:
        return "stale: stored by an earlier attngeom in another layout"
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
