"""The stored precision of a store: float32, or bounded variables packed as int16.

``--precision packed`` stores the variables of :data:`PACKED_VARIABLES` (attention weights in
[0, 1], cosines in [-1, 1]: 30 of the 37 values per head and token of a compact store with
k = 1, w = 8) as CF-packed int16::

    value = add_offset + scale_factor * q,   q in [-32767, 32767] spanning [low, high]
    q = -32768 (_FillValue)                  NaN

which every netCDF reader decodes (xarray's default ``mask_and_scale`` gives float32).
Values are clipped to [low, high] first (roundoff puts a cosine at 1 + 1e-7 or a middle mass
at -1e-8); non-finite values are stored as NaN. A decoded value is within
:attr:`Packing.max_error` of the float32 measurement: half a step plus the float32 rounding
of ``add_offset + scale_factor * q``. The other variables (norms, head_share, middle
contributions) stay float32, and packed stores keep the variables of
:data:`attngeom.store.schema.HEAD_FREE` once per layer instead of per head.

Contributions derived on read from packed alpha and cosines (``alpha * value_norm * cosine /
output_norm``, the norms exact) differ from the float32 store's by at most
:func:`contribution_bound`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np
import xarray as xr

from . import schema as S
from .vocab import FLOAT32, PACKED, PRECISIONS

FILL = np.int16(-32768)        # _FillValue of a packed variable: NaN
QMAX = 32767                   # q in [-QMAX, QMAX] spans [low, high]
ROUNDOFF = 2.0 ** -23          # float32 rounding of a decoded value of magnitude <= 1


@dataclass(frozen=True)
class Packing:
    """The int16 packing of a variable bounded to [low, high]."""

    low: float
    high: float

    @property
    def scale_factor(self) -> np.float32:
        return np.float32((self.high - self.low) / (2 * QMAX))

    @property
    def add_offset(self) -> np.float32:
        return np.float32((self.high + self.low) / 2)

    @property
    def max_error(self) -> float:
        """Largest |decoded - measured| of a value inside [low, high]: half a step + roundoff."""
        return float(self.scale_factor) / 2 + ROUNDOFF


PROBABILITY = Packing(0.0, 1.0)        # step 1/65534 = 1.53e-5
COSINE = Packing(-1.0, 1.0)            # step 1/32767 = 3.05e-5
PACKED_VARIABLES: dict[str, Packing] = {
    "alpha": PROBABILITY, "tail_alpha": PROBABILITY, "middle_alpha": PROBABILITY,
    "cosine": COSINE, "cosine_layer": COSINE, "tail_cosine": COSINE,
    "tail_cosine_layer": COSINE, "sink_value_cosine": COSINE, "sink_residual_cosine": COSINE,
}


def precision_of(options: Mapping) -> str:
    """The precision recorded in a store's config options (absent: float32, the default)."""
    return options.get("precision", FLOAT32)


def check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"--precision must be one of {', '.join(PRECISIONS)}, "
                         f"not '{precision}'")


def cf_attrs(name: str) -> dict[str, np.float32]:
    """The CF attributes that tell a netCDF reader how to decode packed ``name``."""
    p = PACKED_VARIABLES[name]
    return {"scale_factor": p.scale_factor, "add_offset": p.add_offset}


def is_packed(name: str, dtype) -> bool:
    return name in PACKED_VARIABLES and np.dtype(dtype) == np.int16


def pack(name: str, x: np.ndarray) -> np.ndarray:
    """Float values of ``name`` as int16 q: nearest of the grid, clipped; NaN -> FILL."""
    p = PACKED_VARIABLES[name]
    x = np.asarray(x, dtype=np.float64)
    finite = np.isfinite(x)
    q = np.rint((np.clip(x, p.low, p.high) - float(p.add_offset)) / float(p.scale_factor))
    return np.where(finite, np.clip(q, -QMAX, QMAX), FILL).astype(np.int16)


def unpack(name: str, q: np.ndarray) -> np.ndarray:
    """int16 q of ``name`` decoded as a CF reader does (float32; FILL -> NaN)."""
    p = PACKED_VARIABLES[name]
    x = np.asarray(q).astype(np.float32) * p.scale_factor + p.add_offset
    return np.where(np.asarray(q) == FILL, np.float32(np.nan), x)


def once_per_head(name: str, x: np.ndarray, axis: int) -> np.ndarray:
    """``x`` without its head ``axis``; ValueError when its heads differ (NaN equal to NaN)."""
    first = np.take(x, [0], axis=axis)
    if not np.array_equal(np.broadcast_to(first, x.shape), x, equal_nan=True):
        raise ValueError(f"{name} differs between heads (a per-head attention mask?), so it "
                         "cannot be stored once per layer; extract with --precision float32")
    return np.squeeze(first, axis=axis)


def stored_arrays(arrays: Mapping[str, np.ndarray], mode: str,
                  precision: str) -> dict[str, np.ndarray]:
    """Measured float arrays (dims of :func:`attngeom.store.schema.dims_for` in float32) in
    the form a store of ``precision`` keeps them (packed: int16, head-free variables once)."""
    if precision == FLOAT32:
        return dict(arrays)
    out = {}
    for name, x in arrays.items():
        if name in S.HEAD_FREE and len(x.shape) == len(S.dims_for(name, mode)):
            x = once_per_head(name, x, S.dims_for(name, mode).index(S.HEAD))
        if name in PACKED_VARIABLES and np.asarray(x).dtype.kind == "f":
            x = pack(name, x)
        out[name] = x
    return out


def stored_dataset(ds: xr.Dataset, precision: str) -> xr.Dataset:
    """``ds`` (float variables, as read back or measured) as a shard of ``precision`` stores
    it: packed variables int16 with their CF attributes, head-free ones once per layer."""
    if precision != PACKED:
        return ds
    ds = ds.copy(deep=False)
    for name in S.HEAD_FREE:
        if name in ds and S.HEAD in ds[name].dims:
            axis = ds[name].dims.index(S.HEAD)
            ds[name] = xr.Variable(tuple(d for d in ds[name].dims if d != S.HEAD),
                                   once_per_head(name, ds[name].values, axis), ds[name].attrs)
    for name in PACKED_VARIABLES:
        if name in ds and ds[name].dtype.kind == "f":
            var = ds[name]
            ds[name] = xr.Variable(var.dims, pack(name, var.values), {**var.attrs,
                                                                     **cf_attrs(name)})
    return ds


def packing_problem(precision: str, name: str, dtype, attrs: Mapping) -> str | None:
    """Why a stored variable is not in the form ``precision`` stores it, or None."""
    if name not in PACKED_VARIABLES:
        return None
    if precision == FLOAT32:
        return None if np.dtype(dtype) == np.float32 else f"{name} is {dtype}, not float32"
    if np.dtype(dtype) != np.int16:
        return f"{name} is {dtype}, not int16 (packed store)"
    want = cf_attrs(name)
    for key, value in want.items():
        got = np.asarray(attrs.get(key, np.nan)).ravel()
        if got.size != 1 or np.float32(got[0]) != value:
            return f"{name} has {key} {got.tolist()}, the packing's {float(value)!r}"
    fill = np.asarray(attrs.get("_FillValue", 0)).ravel()
    if fill.size != 1 or int(fill[0]) != int(FILL):
        return f"{name} has _FillValue {fill.tolist()}, not {int(FILL)}"
    return None


def contribution_bound(alpha, value_norm, cosine, norm, alpha_error: float,
                       cosine_error: float):
    """Largest |c_packed - c_float32| of c = alpha * value_norm * cosine / norm when alpha and
    the cosine are each off by at most their error and the norms are exact (any array type):
    (value_norm / norm) * (|cosine| e_a + alpha e_c + e_a e_c), plus float32 rounding of c."""
    c = abs(alpha * value_norm * cosine / norm)
    return (value_norm / norm) * (abs(cosine) * alpha_error + alpha * cosine_error
                                  + alpha_error * cosine_error) + 8 * 2.0 ** -24 * c
