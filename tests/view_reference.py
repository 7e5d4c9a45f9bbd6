"""What the browser view should show, computed from the shards with plain xarray and numpy.

No attngeom code: the shards are opened with ``xr.open_mfdataset`` as README.txt says, and
contributions come from the paper's formula c = α‖ṽ‖cos/‖o‖ written out here.
"""

from __future__ import annotations

import glob
import json
import re
from pathlib import Path

import numpy as np
import xarray as xr

import tolerance as tol

# a value the view shows: float16, then 3 significant digits; below float16's normal range
# (2^-14) fewer, none finer than 10 float16 steps (2^-24): half a unit of the last <= 50 steps
SHOWN = tol.rounded(tol.F16) + tol.digits(3) + tol.Tol(atol=50 * 2.0 ** -24)


def plain(store: Path) -> xr.Dataset:
    files = sorted(glob.glob(str(Path(store) / "shards" / "*.nc")))
    return xr.open_mfdataset(files, engine="h5netcdf", combine="nested", concat_dim="sequence",
                             data_vars="minimal", coords="minimal", compat="override",
                             join="override").load()


def arr(raw: xr.Dataset, name: str, dims: tuple[str, ...]) -> np.ndarray:
    return raw[name].transpose(*dims).values.astype(np.float64)


PAIR_DIMS = ("sequence", "layer", "head", "query")


def where(raw: xr.Dataset, i: int, j: int) -> tuple[str, str, int] | None:
    """(prefix, dim, index) of (query i, key j) in the store; None for a compact middle key."""
    if "sink" not in raw["alpha"].dims:
        return "", "key", j
    if j < raw.sizes["sink"]:
        return "", "sink", j
    if 0 <= i - j < raw.sizes["lag"]:
        return "tail_", "lag", i - j
    return None


def pair(raw: xr.Dataset, name: str, at: tuple[str, str, int], s: int, l: int, h, i: int):
    prefix, dim, slot = at
    return arr(raw, prefix + name, PAIR_DIMS + (dim,))[s, l, h, i, slot]


def key_values(raw: xr.Dataset, s: int, l: int, h: int, i: int, j: int) -> dict:
    """metric -> value at (sequence s, layer l, head h, query i, key j); positions.

    None: the store keeps no value (a middle key of a compact store); NaN: masked."""
    vn = arr(raw, "value_norm", ("sequence", "layer", "head", "key"))[s, l, h, j]
    at = where(raw, i, j)
    if at is None:
        return {"value_norm": vn, "alpha": None, "contribution": None, "cosine": None,
                "value_weighted": None}
    on = arr(raw, "output_norm", PAIR_DIMS)[s, l, h, i]
    a, cos = pair(raw, "alpha", at, s, l, h, i), pair(raw, "cosine", at, s, l, h, i)
    return {"value_norm": vn, "alpha": a, "cosine": cos, "contribution": a * vn * cos / on,
            "value_weighted": a * vn}


def layer_values(raw: xr.Dataset, s: int, l: int, i: int, j: int) -> dict:
    """α averaged over heads and C = Σ_h α‖ṽ‖cos(o, ṽ)/‖o‖ at (s, l, i, j)."""
    at = where(raw, i, j)
    if at is None:
        return {"alpha": None, "contribution": None}
    heads = slice(None)
    a = pair(raw, "alpha", at, s, l, heads, i)                                   # (H,)
    vn = arr(raw, "value_norm", ("sequence", "layer", "head", "key"))[s, l, :, j]
    lon = arr(raw, "layer_output_norm", ("sequence", "layer", "query"))[s, l, i]
    c = a * vn * pair(raw, "cosine_layer", at, s, l, heads, i) / lon
    return {"alpha": np.nanmean(a) if np.isfinite(a).any() else np.nan,
            "contribution": np.nansum(c) if np.isfinite(c).any() else np.nan}


def sink_map(raw: xr.Dataset, metric: str, k: int, pooled: bool = False) -> np.ndarray:
    """(sequence, layer, head) mean over queries k <= i < length of key 0's metric; pooled:
    (layer, head) mean over every such query of every sequence."""
    compact = "sink" in raw["alpha"].dims
    slot = ("sink" if compact else "key")
    a = arr(raw, "alpha", PAIR_DIMS + (slot,))[..., 0]
    if metric == "sink_rate":
        x = a
    else:
        vn = arr(raw, "value_norm", ("sequence", "layer", "head", "key"))[..., 0][..., None]
        if metric == "sink_contribution":
            x = a * vn * arr(raw, "cosine", PAIR_DIMS + (slot,))[..., 0] / arr(
                raw, "output_norm", PAIR_DIMS)
        else:
            lon = arr(raw, "layer_output_norm", ("sequence", "layer", "query"))[:, :, None]
            x = a * vn * arr(raw, "cosine_layer", PAIR_DIMS + (slot,))[..., 0] / lon
    q = np.arange(x.shape[-1])
    n = raw["length"].values[:, None, None, None]
    x = np.where((q >= k) & (q < n), x, np.nan)
    if pooled:
        return np.nanmean(np.moveaxis(x, 0, -2).reshape(x.shape[1], x.shape[2], -1), -1)
    return np.nanmean(x, -1)


def shown_close(shown: str, want) -> bool:
    """The number a view shows agrees with the store's value at float16 and 3 digits."""
    if want is None:
        return shown == "not stored"
    if np.isnan(want):
        return shown == "masked"
    digits = re.sub(r"e.*$", "", shown.lstrip("-")).replace(".", "").lstrip("0")
    assert len(digits) <= 3, f"{shown}: more digits than float16 keeps"
    return abs(float(shown) - want) <= SHOWN.limit(want)


def page_parts(html: str) -> tuple[dict, list[str]]:
    """The JSON metadata and the base64 blobs embedded in a view page."""
    meta = json.loads(re.search(r'<script type="application/json" class="ag-meta">(.*?)</script>',
                                html, re.S).group(1))
    blobs = re.findall(r'<script type="application/octet-stream" class="ag-blob">(.*?)</script>',
                       html, re.S)
    return meta, blobs
