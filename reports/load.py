"""Everything a report shows, gathered in one object: store, analyses, faithfulness results.

:func:`gather` opens the store, runs the analyses when their results are missing (or stale),
reads ``<store>/<name>.nc`` of the faithfulness experiment when the manifest records it, and
computes its statistics. Whatever is absent is ``None``, with the reason in ``missing``.
No torch: everything here reads files written by other steps.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import xarray as xr

from attngeom.analysis import RESULT_FILES, SUMMARY_FILE, run_all
from attngeom.store import open_store, read_manifest
from attngeom.store.format import schema as S
from attngeom.store.options.stages import AnalysisOptions
from attngeom.store.io.reader import shard_paths
from attngeom.store.io.results import is_faith_only, verified_file

ANALYSIS_DIR = "analysis"


@dataclass
class ReportData:
    """The report's inputs; optional parts are None and ``missing[section]`` says why."""

    store: Path
    ds: xr.Dataset | None                # the opened store (lazy); None: results only
    manifest: dict
    analysis_dir: Path
    analysis: dict | None = None         # sinks, convexity, anti_alignment, decomposition, summary
    faith: xr.Dataset | None = None      # <store>/faithfulness.nc
    faith_name: str = "faithfulness"
    aopc: pd.DataFrame | None = None     # metric rank mode aopc_mean aopc_sem n_units
    order: pd.DataFrame | None = None    # analysis.faithfulness.order_table
    drift: xr.Dataset | None = None      # analysis.faithfulness.drift_summary
    missing: dict[str, str] = field(default_factory=dict)

    @property
    def loss_variable(self) -> str:
        return self.faith.attrs.get("loss_variable", "delta_ppl") if self.faith is not None \
            else "delta_ppl"

    @property
    def loss_label(self) -> str:
        return "ΔPPL" if self.loss_variable == "delta_ppl" else "accuracy loss"


# ----------------------------------------------------------------------------- analyses
def _newest_shard(store: Path, manifest: dict) -> float:
    times = [p.stat().st_mtime for p in shard_paths(store, manifest) if p.is_file()]
    return max(times, default=0.0)


def analysis_state(store: Path, manifest: dict, directory: Path) -> str:
    """``"current"``, ``"missing"``, ``"stale"`` (older than the shards) or ``"other"``
    (made from another store: its ``config_hash`` differs)."""
    files = [directory / f for f in (*RESULT_FILES.values(), SUMMARY_FILE)]
    if not all(f.is_file() for f in files):
        return "missing"
    with xr.open_dataset(directory / RESULT_FILES["sinks"]) as f:
        made_from = f.attrs.get("config_hash")
    if made_from != manifest["config_hash"]:
        return "other"
    if min(f.stat().st_mtime for f in files) < _newest_shard(store, manifest):
        return "stale"
    return "current"


def read_analysis(directory: Path) -> dict:
    out = {}
    for name, filename in RESULT_FILES.items():
        with xr.open_dataset(directory / filename) as f:
            out[name] = f.load()
    out["summary"] = pd.read_csv(directory / SUMMARY_FILE, keep_default_na=True)
    return out


def ensure_analysis(store: Path, ds: xr.Dataset, manifest: dict, directory: Path, *,
                    refresh_stale: bool = True, progress: bool = True, log=print,
                    options: AnalysisOptions | None = None) -> dict:
    """The analysis results in ``directory``, computed by :func:`run_all` when missing.

    Results made from another store are refused (the user's files are never overwritten);
    results older than the store's shards are recomputed when ``refresh_stale``.
    """
    state = analysis_state(store, manifest, directory)
    if state == "other":
        raise ValueError(f"{directory} holds analysis results of another store (config hash "
                         "differs); pass --analysis with another folder or delete them")
    if state == "missing" or (state == "stale" and refresh_stale):
        log(f"attngeom: running the analyses into {directory} ({state})")
        run_all(ds, directory, options, progress=progress)
    return read_analysis(directory)


# ----------------------------------------------------------------------------- faithfulness
def read_faithfulness(store: Path, manifest: dict, name: str) -> tuple[xr.Dataset | None, str]:
    """The recorded faithfulness result ``name`` and, when absent, why."""
    hint = (f"run `attngeom faithfulness --model MODEL --data DATA --out {store}` to add it")
    path, why = verified_file(store, manifest, name)
    model = manifest.get("config", {}).get("model", {})
    if why == "not recorded" and model.get("causal") is False:
        kind = ("a vision transformer" if model.get("inputs") == "image"
                else "a bidirectional encoder")
        return None, ("not applicable: it scores next-token predictions, and "
                      f"{model.get('spec', 'this model')} is {kind}")
    if why == "not recorded":
        return None, f"not run for this store ({hint})"
    if why == "missing":
        return None, f"{path.name} is recorded in the manifest but missing ({hint})"
    if why:
        return None, f"{path.name} does not match its recorded checksum ({hint})"
    with xr.open_dataset(path, engine="h5netcdf") as f:
        return f.load(), ""


def faithfulness_stats(faith: xr.Dataset, level: float = 0.05, seed: int = 0
                       ) -> tuple[pd.DataFrame, pd.DataFrame, xr.Dataset | None]:
    """AOPC summary table, the metric-order test table and the drift summary (or None)."""
    from attngeom.analysis.faithfulness import aopc_summary, drift_summary, order_table

    aopc = aopc_summary(faith).to_dataframe().reset_index()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        order = order_table(faith, level=level, n_resamples=2000, seed=seed)
    drift = drift_summary(faith, level) if "drift_cosine_low_before" in faith else None
    return aopc[["metric", "rank", "mode", "aopc_mean", "aopc_sem", "n_units"]], order, drift


# ----------------------------------------------------------------------------- all
def gather(store: str | os.PathLike, analysis_dir: str | os.PathLike | None = None, *,
           faithfulness: str = "faithfulness", run_analysis: bool = True,
           progress: bool = True, log=print, options: AnalysisOptions | None = None
           ) -> ReportData:
    """Open the store and collect every result the report can show."""
    store = Path(store)
    manifest = read_manifest(store)
    only = is_faith_only(manifest)
    ds = None if only else open_store(store)
    directory = Path(analysis_dir) if analysis_dir is not None else store / ANALYSIS_DIR
    data = ReportData(store=store, ds=ds, manifest=manifest, analysis_dir=directory,
                      faith_name=faithfulness)
    if only:
        data.missing["analysis"] = ("the store holds faithfulness results only (run `attngeom "
                                    f"extract --model MODEL --data DATA --out {store}` to add "
                                    "the measurements)")
    elif run_analysis:
        data.analysis = ensure_analysis(store, ds, manifest, directory, progress=progress,
                                        log=log, options=options)
    elif analysis_state(store, manifest, directory) in ("current", "stale"):
        data.analysis = read_analysis(directory)
    else:
        data.missing["analysis"] = f"no analysis results in {directory} (run `attngeom analyze`)"
    data.faith, why = read_faithfulness(store, manifest, faithfulness)
    if data.faith is None:
        data.missing["faithfulness"] = why
        data.missing["drift"] = why
    else:
        level = float(data.analysis["sinks"].attrs.get("analysis_level", 0.05)) \
            if data.analysis else 0.05
        data.aopc, data.order, data.drift = faithfulness_stats(data.faith, level)
        if data.drift is None:
            data.missing["drift"] = ("the faithfulness run skipped the sink-zeroing pass "
                                     "(rerun it without --no-drift)")
    if ds is not None and S.TOKEN not in ds:
        data.missing["tokens"] = ("the store keeps no token strings (extracted with --no-text); "
                                  "token ids are shown")
    return data
