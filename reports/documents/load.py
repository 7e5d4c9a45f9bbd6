"""Everything a report shows, gathered in one object: store, analyses, faithfulness results.

:func:`gather` opens the store, runs the analyses when their results are missing (or stale),
reads ``<store>/<name>.nc`` of the faithfulness experiment when the manifest records it, and
its stored statistics (:mod:`attngeom.analysis.faithfulness_stats`, computed and stored first
when missing or stale). Whatever is absent is ``None``, with the reason in ``missing``.
No torch: everything here reads files written by other steps.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import xarray as xr

from attngeom.analysis import ANALYSIS_DIR, run_all
from attngeom.analysis.results import analysis_state, read_analysis
from attngeom.analysis.faithfulness_stats import (FaithStats, StatsSettings, for_store,
                                                  stats_settings)
from attngeom.store import open_store, read_manifest
from attngeom.store.format import schema as S
from attngeom.common.errors import Refusal
from attngeom.common.options.stages import AnalysisOptions
from attngeom.store.io.results import is_faith_only


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
    # the stored statistics of the faithfulness result (analysis.faithfulness_stats): every
    # table the PDF shows; aopc and order for its loss variable (the summary's sentence)
    stats: FaithStats | None = None
    aopc: pd.DataFrame | None = None
    order: pd.DataFrame | None = None
    drift: xr.Dataset | None = None
    missing: dict[str, str] = field(default_factory=dict)

    @property
    def loss_variable(self) -> str:
        return self.faith.attrs.get("loss_variable", "delta_ppl") if self.faith is not None \
            else "delta_ppl"

    @property
    def loss_label(self) -> str:
        return "ΔPPL" if self.loss_variable == "delta_ppl" else "accuracy loss"


# ----------------------------------------------------------------------------- analyses
def ensure_analysis(store: Path, ds: xr.Dataset, manifest: dict, directory: Path, *,
                    refresh_stale: bool = True, progress: bool = True, log=print,
                    options: AnalysisOptions | None = None) -> dict:
    """The analysis results in ``directory``, computed by :func:`run_all` when missing.

    Results made from another store are refused (the user's files are never overwritten);
    results older than the store's shards are recomputed when ``refresh_stale``.
    """
    state = analysis_state(store, manifest, directory)
    if state == "other":
        raise Refusal(f"{directory} holds analysis results of another store (config hash "
                         "differs); pass --analysis with another folder or delete them")
    if state == "missing" or (state == "stale" and refresh_stale):
        log(f"attngeom: running the analyses into {directory} ({state})")
        run_all(ds, directory, options, progress=progress)
    return read_analysis(directory)


# ----------------------------------------------------------------------------- faithfulness
def read_faithfulness(store: Path, manifest: dict, name: str, directory: Path | None = None,
                      settings: StatsSettings = StatsSettings(), log=print):
    """The recorded faithfulness result ``name`` and its stored statistics (computed into
    ``directory`` when missing or stale), or (None, None, why)."""
    hint = (f"run `attngeom faithfulness --model MODEL --data DATA --out {store}` to add it")
    model = manifest.get("config", {}).get("model", {})
    stats, ds, why = for_store(store, name, directory, settings, log, manifest)
    if why == "not recorded" and model.get("causal") is False:
        kind = ("a vision transformer" if model.get("inputs") == "image"
                else "a bidirectional encoder")
        return None, None, ("not applicable: it scores next-token predictions, and "
                            f"{model.get('spec', 'this model')} is {kind}")
    if why == "not recorded":
        return None, None, f"not run for this store ({hint})"
    if why == "missing":
        return None, None, f"{name}.nc is recorded in the manifest but missing ({hint})"
    if why:
        return None, None, f"{name}.nc does not match its recorded checksum ({hint})"
    return ds, stats, ""


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
    settings = stats_settings(options or AnalysisOptions())
    data.faith, stats, why = read_faithfulness(store, manifest, faithfulness, directory,
                                               settings, log)
    if data.faith is None:
        data.missing["faithfulness"] = why
        data.missing["drift"] = why
    else:
        data.stats, data.drift = stats, stats.drift
        data.aopc, data.order = stats.for_variable(stats.aopc), stats.for_variable(stats.order)
        if data.drift is None:
            data.missing["drift"] = ("the faithfulness run skipped the sink-zeroing pass "
                                     "(rerun it without --no-drift)")
    if ds is not None and S.TOKEN not in ds:
        data.missing["tokens"] = ("the store keeps no token strings (extracted with --no-text); "
                                  "token ids are shown")
    return data
