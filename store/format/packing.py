"""The stored precision of a store: float32, or packed (about 15 significant bits a value).

``--precision packed`` stores

- the variables of :data:`PACKED_VARIABLES` (attention weights in [0, 1], cosines in
  [-1, 1]: 30 of the 37 values per head and token of a compact store with k = 1, w = 8) as
  CF-packed int16::

      value = add_offset + scale_factor * q,   q in [-qmax, qmax] spanning [low, high]
      q = -32768 (_FillValue)                  NaN

  which every netCDF reader decodes (xarray's default ``mask_and_scale`` gives float32);
  alphas with qmax = 32767 (step 1/65534), cosines with qmax = 16383 (step 1/16383). Values
  are clipped to [low, high] first (roundoff puts a cosine at 1 + 1e-7 or a middle mass at
  -1e-8); non-finite values are stored as NaN. A decoded value is within
  :attr:`Packing.max_error` of the float32 measurement: half a step plus the float32
  rounding of ``add_offset + scale_factor * q``.
- the other float variables of :data:`ROUNDED_VARIABLES` (norms, head_share, middle
  contributions) as float32 whose mantissas are rounded to :data:`KEEP_BITS` bits (netCDF-C's
  BitRound, Klöwer et al. 2021): plain float32 for every reader, relative error at most
  :data:`NORM_ERROR` = 2**-15, and their low bits zero so that deflate compresses them.
- the variables of :data:`attngeom.store.format.schema.HEAD_FREE` once per layer instead of per
  head (``middle_count`` exactly).

Contributions derived on read (``alpha * value_norm * cosine / output_norm``) then differ
from the float32 store's by at most :func:`contribution_bound`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np
import xarray as xr

from ..format import schema as S
from .vocab import FLOAT32, PACKED
from attngeom.common.errors import Refusal

FILL = np.int16(-32768)        # _FillValue of a packed variable: NaN
ROUNDOFF = 2.0 ** -23          # float32 rounding of a decoded value of magnitude <= 1
KEEP_BITS = 14                 # mantissa bits (of float32's 23) kept by the rounded variables
NORM_ERROR = 2.0 ** -(KEEP_BITS + 1)   # their relative error: half a unit in the last kept bit
BITROUND_ATTR = "_QuantizeBitRoundNumberOfSignificantBits"   # netCDF-C's name for it


@dataclass(frozen=True)
class Packing:
    """The int16 packing of a variable bounded to [low, high]: q in [-qmax, qmax]."""

    low: float
    high: float
    qmax: int

    @property
    def scale_factor(self) -> np.float32:
        return np.float32((self.high - self.low) / (2 * self.qmax))

    @property
    def add_offset(self) -> np.float32:
        return np.float32((self.high + self.low) / 2)

    @property
    def max_error(self) -> float:
        """Largest |decoded - measured| of a value inside [low, high]: half a step + roundoff."""
        return float(self.scale_factor) / 2 + ROUNDOFF


# alphas at the full 16 bits (small weights of long contexts need the absolute resolution);
# cosines at 15 (benchmarks/RESULTS.md: bytes of each choice)
PROBABILITY = Packing(0.0, 1.0, 32767)       # step 1/65534 = 1.53e-5, error <= 7.7e-6
COSINE = Packing(-1.0, 1.0, 16383)           # step 1/16383 = 6.10e-5, error <= 3.1e-5
PACKED_VARIABLES: dict[str, Packing] = {
    "alpha": PROBABILITY, "tail_alpha": PROBABILITY, "middle_alpha": PROBABILITY,
    "cosine": COSINE, "cosine_layer": COSINE, "tail_cosine": COSINE,
    "tail_cosine_layer": COSINE, "sink_value_cosine": COSINE, "sink_residual_cosine": COSINE,
}
ROUNDED_VARIABLES = ("value_norm", "output_norm", "residual_norm", "layer_output_norm",
                     "head_share", "middle_contribution", "middle_contribution_layer")


def precision_of(options: Mapping) -> str:
    """The precision recorded in a store's config options (absent: float32, the default)."""
    return options.get("precision", FLOAT32)


def cf_attrs(name: str) -> dict[str, np.float32]:
    """The CF attributes that tell a netCDF reader how to decode packed ``name``."""
    p = PACKED_VARIABLES[name]
    return {"scale_factor": p.scale_factor, "add_offset": p.add_offset}


def is_packed(name: str, dtype) -> bool:
    return name in PACKED_VARIABLES and np.dtype(dtype) == np.int16


PACK_BLOCK = 1 << 20             # values packed at a time (their float64 steps: a few MB)


def pack(name: str, x: np.ndarray) -> np.ndarray:
    """Float values of ``name`` as int16 q: nearest of the grid, clipped; NaN -> FILL
    (computed in float64, :data:`PACK_BLOCK` values at a time)."""
    p = PACKED_VARIABLES[name]
    x = np.asarray(x)
    out = np.empty(x.shape, dtype=np.int16)
    flat, packed = x.reshape(-1), out.reshape(-1)
    for lo in range(0, flat.size, PACK_BLOCK):
        block = flat[lo:lo + PACK_BLOCK].astype(np.float64)
        q = np.rint((np.clip(block, p.low, p.high) - float(p.add_offset))
                    / float(p.scale_factor))
        packed[lo:lo + PACK_BLOCK] = np.where(np.isfinite(block), np.clip(q, -p.qmax, p.qmax),
                                              FILL)
    return out


def bitround(x: np.ndarray, keep: int = KEEP_BITS) -> np.ndarray:
    """float32 ``x`` with mantissas rounded to ``keep`` bits (to nearest, ties to even);
    NaN and infinities unchanged. Relative error at most 2**-(keep + 1); idempotent."""
    x = np.asarray(x, dtype=np.float32)
    drop = np.uint32(23 - keep)
    bits = x.view(np.uint32)
    half = np.uint32((1 << (23 - keep - 1)) - 1)
    rounded = (bits + half + ((bits >> drop) & np.uint32(1))) >> drop << drop
    return np.where(np.isfinite(x), rounded.view(np.float32), x)


def once_per_head(name: str, x: np.ndarray, axis: int) -> np.ndarray:
    """``x`` without its head ``axis``; ValueError when its heads differ (NaN equal to NaN)."""
    first = np.take(x, [0], axis=axis)
    if not np.array_equal(np.broadcast_to(first, x.shape), x, equal_nan=True):
        raise Refusal(f"{name} differs between heads (a per-head attention mask?), so it "
                         "cannot be stored once per layer; extract with --precision float32")
    return np.squeeze(first, axis=axis)


def stored_arrays(arrays: Mapping[str, np.ndarray], mode: str,
                  precision: str) -> dict[str, np.ndarray]:
    """Measured float arrays (dims of :func:`attngeom.store.format.schema.dims_for` in float32) in
    the form a store of ``precision`` keeps them (packed: int16, head-free variables once)."""
    if precision == FLOAT32:
        return dict(arrays)
    out = {}
    for name, x in arrays.items():
        if name in S.HEAD_FREE and len(x.shape) == len(S.dims_for(name, mode)):
            x = once_per_head(name, x, S.dims_for(name, mode).index(S.HEAD))
        if name in PACKED_VARIABLES and np.asarray(x).dtype.kind == "f":
            x = pack(name, x)
        elif name in ROUNDED_VARIABLES:
            x = bitround(x)
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
    for name in ROUNDED_VARIABLES:
        if name in ds:
            var = ds[name]
            ds[name] = xr.Variable(var.dims, bitround(var.values), {**var.attrs,
                                                                   **rounded_attrs()})
    return ds


def rounded_attrs() -> dict[str, np.int32]:
    """The attribute netCDF-C writes on a BitRound-quantised variable (information only)."""
    return {BITROUND_ATTR: np.int32(KEEP_BITS)}


def stored_attrs(name: str, precision: str) -> dict:
    """Attributes a variable carries in a store of ``precision`` besides its description."""
    if precision != PACKED:
        return {}
    if name in PACKED_VARIABLES:
        return cf_attrs(name)
    return rounded_attrs() if name in ROUNDED_VARIABLES else {}


def packing_problem(precision: str, name: str, dtype, attrs: Mapping) -> str | None:
    """Why a stored bounded variable is not in the form ``precision`` stores it, or None."""
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


def contribution_bound(alpha, value_norm, cosine, norm,
                       alpha_error: float = PROBABILITY.max_error,
                       cosine_error: float = COSINE.max_error, norm_error: float = NORM_ERROR):
    """Largest |c_packed - c_float32| of c = alpha * value_norm * cosine / norm (float32
    values; any array type) when alpha and the cosine are each off by at most their absolute
    error and both norms by at most ``norm_error`` relative::

        (value_norm / norm) (|cosine| e_a + alpha e_c + e_a e_c) (1 + 3 e_n) + |c| 2.01 e_n

    plus the float32 rounding of c (8 units of 2**-24 relative)."""
    c = abs(alpha * value_norm * cosine / norm)
    grid = abs(cosine) * alpha_error + alpha * cosine_error + alpha_error * cosine_error
    return ((value_norm / norm) * grid * (1 + 3 * norm_error)
            + c * (2.01 * norm_error + 8 * 2.0 ** -24))
