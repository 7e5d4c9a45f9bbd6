"""Where a store's analysis results live, and whether a folder of them is one complete result.

``attngeom analyze`` writes one netCDF file per analysis and ``summary.csv``; the summary is
removed first and written last (:func:`attngeom.analysis.run_all`), so a folder whose writing
was stopped part-way has none and reads as ``"missing"`` here, never as a result.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import xarray as xr

from attngeom.store.io.reader import shard_paths

RESULT_FILES = {"sinks": "sinks.nc", "convexity": "convexity.nc",
                "anti_alignment": "anti_alignment.nc", "decomposition": "decomposition.nc"}
SUMMARY_FILE = "summary.csv"
ANALYSIS_DIR = "analysis"       # where a store keeps its analysis results by default


def _newest_shard(store: Path, manifest: dict) -> float:
    times = [p.stat().st_mtime for p in shard_paths(store, manifest) if p.is_file()]
    return max(times, default=0.0)


def analysis_state(store: Path, manifest: dict, directory: Path) -> str:
    """``"current"``, ``"missing"`` (absent or incomplete), ``"stale"`` (older than the
    shards) or ``"other"`` (made from another store: its ``config_hash`` differs)."""
    files = [directory / f for f in (*RESULT_FILES.values(), SUMMARY_FILE)]
    if not all(f.is_file() for f in files):
        return "missing"
    with xr.open_dataset(directory / RESULT_FILES["sinks"], engine="h5netcdf") as f:
        made_from = f.attrs.get("config_hash")
    if made_from != manifest["config_hash"]:
        return "other"
    if min(f.stat().st_mtime for f in files) < _newest_shard(store, manifest):
        return "stale"
    return "current"


def read_analysis(directory: Path) -> dict:
    """The analysis results in ``directory``: one Dataset per analysis, and ``summary``."""
    out = {}
    for name, filename in RESULT_FILES.items():
        with xr.open_dataset(directory / filename, engine="h5netcdf") as f:
            out[name] = f.load()
    out["summary"] = pd.read_csv(directory / SUMMARY_FILE, keep_default_na=True)
    return out
