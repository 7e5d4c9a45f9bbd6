"""The CSV summary of the four analyses: one row per layer and a final row ``all``.

Columns (stable): ``layer n_heads sink_head_count sink_head_fraction sink_rate_mean
convex_heads interior_minimum_heads pooled_beta2 pooled_p_value pooled_q_value pooled_vertex
pooled_vertex_ci_low pooled_vertex_ci_high pooled_analytic_vertex_median anti_aligned_heads
mean_cos residual_anti_aligned_heads residual_mean_cos mixed_mean_cos mixed_p_value
residual_mixed_mean_cos residual_mixed_p_value sink_top_parts tail_top_parts middle_top_parts
paper_pattern verdict``. In row ``all`` counts are summed over layers, means are over all heads,
per-layer fits (convexity pooled fits, mixed models) are empty, and the decomposition columns are
the fit pooled over layers.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import xarray as xr

from attngeom.store.format import schema as S
from attngeom.common.vocab import GROUPS

from .decomposition import GROUP, verdict

COLUMNS = ("layer", "n_heads", "sink_head_count", "sink_head_fraction", "sink_rate_mean",
           "convex_heads", "interior_minimum_heads", "pooled_beta2", "pooled_p_value",
           "pooled_q_value", "pooled_vertex", "pooled_vertex_ci_low", "pooled_vertex_ci_high",
           "pooled_analytic_vertex_median", "anti_aligned_heads", "mean_cos",
           "residual_anti_aligned_heads", "residual_mean_cos", "mixed_mean_cos", "mixed_p_value",
           "residual_mixed_mean_cos", "residual_mixed_p_value", "sink_top_parts",
           "tail_top_parts", "middle_top_parts", "paper_pattern", "verdict")
CONVEXITY_COLUMNS = ("pooled_beta2", "pooled_p_value", "pooled_q_value", "pooled_vertex",
                     "pooled_vertex_ci_low", "pooled_vertex_ci_high",
                     "pooled_analytic_vertex_median")
MIXED_COLUMNS = ("mixed_mean_cos", "mixed_p_value", "residual_mixed_mean_cos",
                 "residual_mixed_p_value")


def _row(layer, sinks, convex, anti, tops: dict, pattern: str) -> dict:
    row = {"layer": layer, "n_heads": int(sinks.sizes[S.HEAD]),
           "sink_head_count": int(sinks["is_sink_head"].sum()),
           "sink_head_fraction": float(sinks["is_sink_head"].mean()),
           "sink_rate_mean": float(sinks["sink_rate_mean"].mean()),
           "convex_heads": int(convex["convex"].sum()),
           "interior_minimum_heads": int(convex["interior_minimum"].sum()),
           "anti_aligned_heads": int(anti["anti_aligned"].sum()),
           "mean_cos": float(anti["mean_cos"].mean()),
           "residual_anti_aligned_heads": int(anti["residual_anti_aligned"].sum()),
           "residual_mean_cos": float(anti["residual_mean_cos"].mean())}
    for name in CONVEXITY_COLUMNS:
        row[name] = float(convex[name]) if S.LAYER not in convex.dims else np.nan
    for name in MIXED_COLUMNS:
        row[name] = float(anti[name]) if S.LAYER not in anti.dims else np.nan
    for g in GROUPS:
        row[f"{g}_top_parts"] = tops[g]
    row["paper_pattern"] = pattern
    row["verdict"] = verdict(tops)
    return row


def summary_table(sinks: xr.Dataset, convexity: xr.Dataset, anti_alignment: xr.Dataset,
                  decomposition: xr.Dataset) -> pd.DataFrame:
    """One row per layer plus ``all``, from the four result datasets."""
    rows = []
    for layer in sinks[S.LAYER].values:
        sel = {S.LAYER: layer}
        d = decomposition.sel(sel)
        tops = {g: str(d["top_parts"].sel({GROUP: g}).values) for g in d[GROUP].values}
        rows.append(_row(layer, sinks.sel(sel), convexity.sel(sel), anti_alignment.sel(sel),
                         tops, str(d["paper_pattern"].values)))
    d = decomposition
    tops = {g: str(d["pooled_top_parts"].sel({GROUP: g}).values) for g in d[GROUP].values}
    rows.append(_row("all", sinks, convexity, anti_alignment, tops,
                     str(d["pooled_paper_pattern"].values)))
    return pd.DataFrame(rows, columns=list(COLUMNS))
