"""The numbers a browser view (:mod:`.view`) embeds, from any Dataset with the store's names.

The input is an ``xarray.Dataset`` with the variable names, dims and NaN conventions of an
opened store (``attngeom.store.open``; contributions derived), lazy or in memory. For each
sequence the view embeds, cropped to its length:

per head      ``alpha``, ``contribution``, ``cosine`` (dense: on (layer, head, query, key);
              compact: on the sink keys, plus ``tail_*`` on lag and ``middle_alpha``,
              ``middle_contribution``, ``middle_count``), ``value_norm`` (layer, head, key) and,
              where the model has a learned sink, ``learned_sink_alpha`` (layer, head, query)
layer total   ``total:alpha`` (alpha averaged over heads), ``total:contribution``
              (C_ij = sum_h C_ij^h), and in compact stores their ``tail``/``middle`` versions

Floats travel as float16 (float32 for an array with values beyond its range), counts as
uint16, byte-shuffled and deflated, one blob per sequence. The layer x head maps are means over
queries i >= k (the sink rate's convention, :mod:`attngeom.analysis.sinks`) of the sink key
0's alpha, contribution and layer contribution (and the learned sink's weight), per sequence
and token-pooled over the finite sequences of the view.
"""

from __future__ import annotations

import warnings
import zlib
from dataclasses import dataclass, field

import numpy as np
import xarray as xr

from attngeom.store.format import schema as S
from attngeom.common.options.ranges import parse_ranges

from ..tokens import clean_token

LEARNED_SINK = "learned_sink_alpha"        # (sequence, layer, head, query), models with one
F16_MAX = 65504.0                          # float16's largest; float32 beyond it
COUNT_NAN = 65535                          # uint16 code of a missing count
MAP_METRICS = {                            # map name -> (variable, label)
    "sink_rate": ("alpha", "sink rate α_i0"),
    "sink_contribution": ("contribution", "sink contribution c_i0^h"),
    "sink_contribution_layer": ("contribution_layer", "sink's layer contribution C_i0^h"),
    "learned_sink": (LEARNED_SINK, "learned sink weight"),
}
BLOCK_SEQUENCES = 16                       # sequences loaded at a time


@dataclass
class SequenceBlob:
    """One sequence's arrays: the deflated bytes and the index that decodes them."""

    label: int
    length: int
    tokens: list[str]
    raw_tokens: list[str]
    special: list[int]
    finite: bool
    index: list[dict]
    data: bytes


@dataclass
class MapSums:
    """Per-sequence means and pooled sums of the map metrics, per (layer, head)."""

    per_sequence: dict[str, list[np.ndarray]] = field(default_factory=dict)
    total: dict[str, np.ndarray] = field(default_factory=dict)
    count: dict[str, np.ndarray] = field(default_factory=dict)

    def pooled(self) -> dict[str, np.ndarray]:
        with np.errstate(invalid="ignore", divide="ignore"):
            return {n: self.total[n] / np.where(self.count[n] > 0, self.count[n], np.nan)
                    for n in self.total}


def select(ds: xr.Dataset, sequences=None, layers=None, heads=None,
           prefix: str = "--") -> xr.Dataset:
    """``ds`` cut to the labels chosen in the range syntax of
    :mod:`attngeom.common.options.ranges`."""
    chosen = {}
    for dim, spec in ((S.SEQUENCE, sequences), (S.LAYER, layers), (S.HEAD, heads)):
        values = parse_ranges(spec, ds[dim].values.tolist(), what=f"{prefix}{dim}s")
        if values is not None:
            chosen[dim] = values
    return ds.sel(chosen) if chosen else ds


def is_compact(ds: xr.Dataset) -> bool:
    return S.SINK in ds["alpha"].dims


def sink_k(ds: xr.Dataset) -> int:
    """k of the sink keys: the ``sink`` dim of a compact store, else the attrs' (default 1)."""
    return int(ds.sizes[S.SINK]) if is_compact(ds) else int(ds.attrs.get("sink_k", 1))


def _mean_heads(da: xr.DataArray) -> xr.DataArray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)           # all-NaN cells stay NaN
        return da.mean(S.HEAD, skipna=True)


def _sum_heads(da: xr.DataArray) -> xr.DataArray:
    return da.sum(S.HEAD, skipna=True, min_count=1)


def view_arrays(x: xr.Dataset, compact: bool) -> dict[str, xr.DataArray]:
    """The arrays of one loaded sequence (no sequence dim, cropped): name -> DataArray."""
    L, H, Q, K = S.LAYER, S.HEAD, S.QUERY, S.KEY
    out: dict[str, xr.DataArray] = {}
    slots = [("", S.SINK if compact else K)] + ([("tail_", S.LAG)] if compact else [])
    for prefix, slot in slots:
        for name in ("alpha", "contribution", "cosine"):
            if prefix + name in x:
                out[prefix + name] = x[prefix + name].transpose(L, H, Q, slot)
        if prefix + "alpha" in x:
            out[f"total:{prefix}alpha"] = _mean_heads(x[prefix + "alpha"]).transpose(L, Q, slot)
        if prefix + "contribution_layer" in x:
            out[f"total:{prefix}contribution"] = _sum_heads(
                x[prefix + "contribution_layer"]).transpose(L, Q, slot)
    if compact:
        for name in ("middle_alpha", "middle_contribution", "middle_count"):
            if name in x:
                out[name] = x[name].transpose(L, H, Q)
        if "middle_alpha" in x:
            out["total:middle_alpha"] = _mean_heads(x["middle_alpha"]).transpose(L, Q)
        if "middle_contribution_layer" in x:
            out["total:middle_contribution"] = _sum_heads(
                x["middle_contribution_layer"]).transpose(L, Q)
    if "value_norm" in x:
        out["value_norm"] = x["value_norm"].transpose(L, H, K)
    if LEARNED_SINK in x:
        out[LEARNED_SINK] = x[LEARNED_SINK].transpose(L, H, Q)
        out[f"total:{LEARNED_SINK}"] = _mean_heads(x[LEARNED_SINK]).transpose(L, Q)
    return out


def encode(arrays: dict[str, np.ndarray]) -> tuple[list[dict], bytes]:
    """Arrays to (index, deflated bytes): float16, or float32 for an array beyond float16's
    range, or uint16 counts; each byte-shuffled (every value's first byte, then every second
    byte, ...) so that deflate finds the runs."""
    index, parts, offset = [], [], 0
    for name, values in arrays.items():
        values = np.asarray(values, dtype=np.float64)
        finite = np.abs(values[np.isfinite(values)])
        if name.endswith("_count"):
            raw, dtype = np.where(np.isfinite(values), values, COUNT_NAN).astype("<u2"), "u16"
        elif finite.size and finite.max() > F16_MAX:
            raw, dtype = values.astype("<f4"), "f32"
        else:
            raw, dtype = values.astype("<f2"), "f16"
        width = raw.dtype.itemsize
        parts.append(raw.view(np.uint8).reshape(-1, width).T.tobytes())
        index.append({"name": name, "shape": list(values.shape), "dtype": dtype,
                      "offset": offset, "size": int(values.size)})
        offset += len(parts[-1])
    return index, zlib.compress(b"".join(parts), 6)


DTYPES = {"u16": "<u2", "f16": "<f2", "f32": "<f4"}


def decode(index: list[dict], data: bytes) -> dict[str, np.ndarray]:
    """Inverse of :func:`encode` (float64 arrays, NaN for missing counts)."""
    raw = zlib.decompress(data)
    out = {}
    for e in index:
        dtype = np.dtype(DTYPES[e["dtype"]])
        chunk = np.frombuffer(raw[e["offset"]: e["offset"] + dtype.itemsize * e["size"]],
                              np.uint8)
        words = chunk.reshape(dtype.itemsize, -1).T.copy().view(dtype)
        values = words.ravel().astype(np.float64).reshape(e["shape"])
        if e["dtype"] == "u16":
            values[values == COUNT_NAN] = np.nan
        out[e["name"]] = values
    return out


def _labels(x: xr.Dataset, n: int) -> tuple[list[str], list[str]]:
    if "token" in x:
        raw = [str(t) for t in x["token"].values[:n]]
        return [clean_token(t) for t in raw], raw
    ids = [f"#{int(t)}" for t in x["token_id"].values[:n]]
    return ids, ids


def sequence_blob(x: xr.Dataset, compact: bool) -> SequenceBlob:
    """Encode one loaded sequence of ``ds`` (dims without ``sequence``)."""
    n = int(x["length"].values)
    crop = {d: slice(0, n) for d in (S.QUERY, S.KEY, S.POSITION) if d in x.dims}
    x = x.isel(crop)
    arrays = {name: da.values for name, da in view_arrays(x, compact).items()}
    index, data = encode(arrays)
    tokens, raw = _labels(x, n)
    special = ([int(v) for v in x["special"].values[:n]] if "special" in x else [0] * n)
    finite = bool(int(x["finite"].values)) if "finite" in x else True
    return SequenceBlob(int(x[S.SEQUENCE].values), n, tokens, raw, special, finite, index, data)


def add_maps(block: xr.Dataset, k: int, sums: MapSums) -> None:
    """Accumulate the map metrics of a loaded block of sequences (see module doc)."""
    valid = (block[S.QUERY] >= k) & (block[S.QUERY] < block["length"])    # (sequence, query)
    finite = block["finite"] != 0 if "finite" in block else xr.ones_like(block["length"]) > 0
    for name, (var, _) in MAP_METRICS.items():
        if var not in block:
            continue
        da = block[var]
        if S.SINK in da.dims:
            da = da.isel({S.SINK: 0})
        elif S.KEY in da.dims:
            da = da.isel({S.KEY: 0})
        da = da.where(valid)
        ok = np.isfinite(da)
        total = da.where(ok, 0).sum(S.QUERY).transpose(S.SEQUENCE, S.LAYER, S.HEAD).values
        count = ok.sum(S.QUERY).transpose(S.SEQUENCE, S.LAYER, S.HEAD).values
        with np.errstate(invalid="ignore", divide="ignore"):
            means = total / np.where(count > 0, count, np.nan)
        sums.per_sequence.setdefault(name, []).extend(means)
        keep = finite.values.astype(bool)
        sums.total[name] = sums.total.get(name, 0) + total[keep].sum(0)
        sums.count[name] = sums.count.get(name, 0) + count[keep].sum(0)


def needed_variables(ds: xr.Dataset) -> list[str]:
    """Variables of ``ds`` the view reads (the others are never loaded)."""
    names = ["alpha", "contribution", "contribution_layer", "cosine", "value_norm",
             "tail_alpha", "tail_contribution", "tail_contribution_layer", "tail_cosine",
             "middle_alpha", "middle_contribution", "middle_contribution_layer",
             "middle_count", LEARNED_SINK, "token", "token_id", "special", "length", "finite"]
    return [n for n in names if n in ds]


def blocks(ds: xr.Dataset, size: int = BLOCK_SEQUENCES):
    """Loaded blocks of at most ``size`` sequences of the view's variables."""
    sub = ds[needed_variables(ds)]
    for lo in range(0, ds.sizes[S.SEQUENCE], size):
        yield sub.isel({S.SEQUENCE: slice(lo, lo + size)}).load()
