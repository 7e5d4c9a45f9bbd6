"""The key groups of every query, and the analyses' validity masks, for both store layouts.

:class:`KeyGroups` (made by ``ds.attngeom.groups(k, w)``) gives any pair quantity of a key
group as one DataArray, whatever the layout keeps:

``group(g, name)``  (..., head, query, slot): slot is ``sink`` (keys j < k), ``lag`` (tail: key
                    j = query - lag) or ``key`` (middle; elementwise in dense stores only).
                    ``name``: alpha, cosine, cosine_layer, contribution, contribution_layer,
                    value_norm, or ``ratio`` = value_norm / output_norm.
``total(g, name)``  (..., head, query): the sum over the group's keys (compact middle: the
                    stored ``middle_*`` total, plus stored tail lags >= w).
``sink_rate``       (..., head, query): alpha_i0.

The key groups are defined in :mod:`attngeom.store.derive`. With ``mask=True`` (the default)
cells outside the analyses are NaN: queries i < k or beyond the sequence's length, keys beyond
it, sequences with non-finite activations. Arrays keep the dataset's leading dims (a whole lazy
store: sequence, layer, ...; a loaded block: sequence); numpy-backed results are C-contiguous
in the schema's dim order, so that reductions over them are reproducible bit for bit.
Results are memoized on the object: make a new one after changing the dataset.
"""

from __future__ import annotations

import functools

import numpy as np
import xarray as xr

from . import derive
from . import schema as S
from .vocab import GROUPS, MIDDLE, SINK, TAIL

SLOT = {SINK: S.SINK, TAIL: S.LAG, MIDDLE: S.KEY}    # the slot dimension of each group
RATIO = "ratio"
DERIVED = {S.CONTRIBUTION: (S.COSINE, S.OUTPUT_NORM, derive.contribution),
           S.CONTRIBUTION_LAYER: (S.COSINE_LAYER, S.LAYER_OUTPUT_NORM,
                                  derive.contribution_layer)}


def _memo(fn):
    @functools.wraps(fn)
    def wrapper(self, *args):
        key = (fn.__name__, *args)
        if key not in self._memo:
            self._memo[key] = fn(self, *args)
        return self._memo[key]
    return wrapper


def _contiguous(da: xr.DataArray) -> xr.DataArray:
    if isinstance(da.data, np.ndarray) and not da.data.flags.c_contiguous:
        return da.copy(data=np.ascontiguousarray(da.data))
    return da


class KeyGroups:
    """Sink, tail and middle keys of every query (k sink keys, tail window w) of a dataset."""

    def __init__(self, ds: xr.Dataset, k: int, w: int, *, mask: bool = True):
        self._ds, self.k, self.w, self.mask = ds, int(k), int(w), mask
        acc = ds.attngeom
        self.layout, self.store_k, self.store_w = acc.layout, acc.sink_k, acc.tail_w
        self.all_keys, self.n_positions = acc.all_keys, acc.n_positions
        self._memo: dict = {}

    # ------------------------------------------------------------------ masks
    def _coords(self, dims) -> dict:
        return {d: self._ds[d] for d in dims if d in self._ds.coords}

    @property
    @_memo
    def sequence_ok(self) -> xr.DataArray:
        """(sequence,) bool: usable sequences (finite activations)."""
        return self._ds.attngeom.sequence_ok

    @property
    @_memo
    def _length(self) -> xr.DataArray:
        ok = self.sequence_ok
        if S.LENGTH in self._ds:
            length = self._ds[S.LENGTH]
            return xr.DataArray(np.asarray(length.values, dtype=np.int64), dims=length.dims,
                                coords=self._coords(length.dims))
        return xr.full_like(ok, self.n_positions, dtype=np.int64)

    def _positions_ok(self, dim: str, first: int) -> xr.DataArray:
        length, ok = self._length, self.sequence_ok
        pos = np.arange(self.n_positions)
        out = ((pos >= first) & (pos < length.values[..., None]) & ok.values[..., None])
        dims = length.dims + (dim,)
        return xr.DataArray(out, dims=dims, coords=self._coords(dims))

    @property
    @_memo
    def query_ok(self) -> xr.DataArray:
        """(sequence, query) bool: i >= k, within the length, usable sequence."""
        return self._positions_ok(S.QUERY, self.k)

    @property
    @_memo
    def key_ok(self) -> xr.DataArray:
        """(sequence, key) bool: within the length, usable sequence."""
        return self._positions_ok(S.KEY, 0)

    @property
    @_memo
    def semantic_key(self) -> xr.DataArray:
        """(sequence, key) bool: j >= k, within the length, not a special token."""
        out = self._positions_ok(S.KEY, self.k)
        if S.SPECIAL in self._ds:
            special = self._ds[S.SPECIAL]
            pos = S.POSITION if S.POSITION in special.dims else S.KEY
            lead = [d for d in special.dims if d != pos]
            flag = np.asarray(special.transpose(*lead, pos).values, dtype=bool)
            out = out.copy(data=out.values & ~flag)
        return out

    @property
    @_memo
    def tail_key(self) -> xr.DataArray:
        """(query, lag) int: the key j = query - lag of each tail slot, -1 where it is none."""
        key, ok = derive.tail_keys(self.n_positions, self.k, self.w)
        return xr.DataArray(np.where(ok, key, -1), dims=(S.QUERY, S.LAG))

    @_memo
    def member(self, group: str) -> xr.DataArray | None:
        """Bool over (query, slot) (with the masks: (sequence, query, slot)): the group's
        cells; None when every cell is one (sink, unmasked)."""
        T, k, w = self.n_positions, self.k, self.w
        if group == SINK:
            out = None
        elif group == TAIL:
            out = xr.DataArray(derive.tail_keys(T, k, w)[1], dims=(S.QUERY, S.LAG))
        else:
            out = xr.DataArray(derive.middle_mask(T, k, w), dims=(S.QUERY, S.KEY))
        if not self.mask:
            return out
        keys = self.key_ok
        if group == SINK:
            keys = keys.isel({S.KEY: slice(0, k)}).rename({S.KEY: S.SINK})
            return self.query_ok & keys
        if group == TAIL:              # the key i - lag <= i is within the length
            return self.query_ok & out
        return self.query_ok & keys & out

    # ------------------------------------------------------------------ per query / key
    @_memo
    def per_query(self, name: str) -> xr.DataArray:
        """A per-query variable, NaN where the query is not valid."""
        da = self._ds[name]
        return _contiguous(da.where(self.query_ok)) if self.mask else da

    @_memo
    def per_key(self, name: str) -> xr.DataArray:
        """A per-key variable over all positions, NaN beyond the length."""
        da = self._ds[name]
        return _contiguous(da.where(self.key_ok)) if self.mask else da

    # ------------------------------------------------------------------ groups
    def elementwise(self, group: str) -> bool:
        """Whether :meth:`group` can give ``group`` key by key (middle: dense stores only)."""
        return self._ds.attngeom.elementwise(group)

    def _check(self, group: str) -> None:
        if group not in GROUPS:
            raise ValueError(f"unknown key group {group!r}; one of {', '.join(GROUPS)}")
        if group != SINK and not self.all_keys and self.k != self.store_k:
            raise ValueError(f"a compact store's groups are fixed by its sink_k = "
                             f"{self.store_k}; use --sink-k {self.store_k} or a dense store")

    def require_groups(self) -> "KeyGroups":
        """Raise unless every key group (sink, tail, middle totals) can be formed."""
        self._check(TAIL)
        return self

    def _full(self, name: str) -> xr.DataArray:
        """A dense store's pair variable over every key (…, query, key)."""
        da = self._ds[name]
        if not self.all_keys:
            raise ValueError("the middle group is stored elementwise only in dense stores")
        if S.KEY not in da.dims:
            raise ValueError(f"`{name}` over all keys: read the block with the tail or middle "
                             "group (load_block(groups=...))")
        return da

    def _stored(self, group: str, name: str) -> xr.DataArray:
        """The store's values of pair variable ``name`` at the group's slots (unmasked)."""
        if group == SINK:
            da = self._ds[name]
            dim = S.SINK if S.SINK in da.dims else S.KEY
            return da.isel({dim: slice(0, self.k)}).rename({dim: S.SINK})
        if group == TAIL and not self.all_keys:
            var = S.TAIL_PREFIX + name
            if var not in self._ds:
                raise ValueError(f"the compact store lacks `{var}`")
            return self._ds[var].isel({S.LAG: slice(0, self.w)})
        full = self._full(name)
        if group == MIDDLE:
            return full
        flat = (np.arange(self.n_positions)[:, None] * self.n_positions
                + derive.tail_keys(self.n_positions, self.k, self.w)[0]).ravel()
        shape = (self.n_positions, self.w)

        def gather(a):                 # (..., Q, K) -> (..., Q, w): a[..., i, i - lag]
            lead = a.shape[:-2]
            return a.reshape(lead + (-1,))[..., flat].reshape(lead + shape)
        return xr.apply_ufunc(gather, full, input_core_dims=[[S.QUERY, S.KEY]],
                              output_core_dims=[[S.QUERY, S.LAG]], dask="allowed")

    def _value_norm(self, group: str) -> xr.DataArray:
        """value_norm of each slot's key, (..., head, query, slot) (unmasked)."""
        vn = self._ds[S.VALUE_NORM]
        if group == TAIL:
            idx = derive.tail_keys(self.n_positions, self.k, self.w)[0]
            shape = idx.shape

            def gather(a):             # (..., K) -> (..., Q, w): a[..., i - lag]
                return a[..., idx.ravel()].reshape(a.shape[:-1] + shape)
            return xr.apply_ufunc(gather, vn, input_core_dims=[[S.KEY]],
                                  output_core_dims=[[S.QUERY, S.LAG]], dask="allowed")
        if group == SINK:
            vn = vn.isel({S.KEY: slice(0, self.k)}).rename({S.KEY: S.SINK})
        return vn.expand_dims({S.QUERY: self.n_positions}, axis=-2)

    @_memo
    def group(self, group: str, name: str) -> xr.DataArray:
        """Pair quantity ``name`` at the keys of ``group``: (..., head, query, slot)."""
        self._check(group)
        if name == RATIO:
            on = self.per_query(S.OUTPUT_NORM)
            return _contiguous(self.group(group, S.VALUE_NORM) / on)
        if name == S.VALUE_NORM:
            out = self._value_norm(group)
        elif name in DERIVED and not self._has(group, name):
            cosine, norm, formula = DERIVED[name]
            return _contiguous(formula(self.group(group, S.ALPHA),
                                       self.group(group, S.VALUE_NORM),
                                       self.group(group, cosine), self.per_query(norm)))
        else:
            out = self._stored(group, name)
        cells = self.member(group)
        return _contiguous(out if cells is None else out.where(cells))

    def _has(self, group: str, name: str) -> bool:
        compact_tail = group == TAIL and not self.all_keys
        return (S.TAIL_PREFIX + name if compact_tail else name) in self._ds

    @_memo
    def total(self, group: str, name: str) -> xr.DataArray:
        """Sum of ``name`` (alpha, contribution, contribution_layer) over the group's keys:
        (..., head, query), NaN at invalid queries."""
        self._check(group)
        if group == MIDDLE and not self.all_keys:
            var = S.MIDDLE_PREFIX + name
            if var not in self._ds:
                raise ValueError(f"the compact store lacks `{var}`")
            out = self.per_query(var)
            if self.w < (self.store_w or 0):    # stored tail lags >= w are middle keys
                extra = self._ds[S.TAIL_PREFIX + name].isel({S.LAG: slice(self.w, None)})
                out = out + extra.reduce(np.nansum, S.LAG)
            return _contiguous(out)
        out = self.group(group, name).reduce(np.nansum, SLOT[group])
        return _contiguous(out.where(self.query_ok)) if self.mask else out

    @_memo
    def count(self, group: str) -> xr.DataArray:
        """Number of keys of the group per query: (..., head, query)."""
        self._check(group)
        if group == MIDDLE and not self.all_keys:
            return self.per_query(S.MIDDLE_COUNT)
        return np.isfinite(self.group(group, S.ALPHA)).sum(SLOT[group])

    @property
    @_memo
    def sink_rate(self) -> xr.DataArray:
        """alpha_i0: attention to the first key, (..., head, query)."""
        return self.group(SINK, S.ALPHA).isel({S.SINK: 0}, drop=True)

    @_memo
    def pairs(self, name: str) -> xr.DataArray:
        """Pair quantity ``name`` over every key, (..., head, query, key): dense stores only."""
        full = self._full(name)
        if not self.mask:
            return full
        return _contiguous(full.where(self.query_ok & self.key_ok))
