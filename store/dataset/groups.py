"""The key groups of every query, and the analyses' validity masks, for both store layouts.

:class:`KeyGroups` (made by ``ds.attngeom.groups(k, w)``) gives any pair quantity of a key
group as one DataArray, whatever the layout keeps:

``group(g, name)``  (..., head, query, slot): slot is ``sink`` (keys j < k), ``lag`` (tail: key
                    j = query - lag) or ``key`` (middle; elementwise in dense stores only).
                    ``name``: alpha, cosine, cosine_layer, contribution, contribution_layer,
                    value_norm, or ``ratio`` = value_norm / output_norm.
``total(g, name)``  (..., head, query): the sum over the group's keys (compact middle: the
                    stored ``middle_*`` total, plus stored tail lags >= w).
``sink_rate``       (..., head, query): alpha_i0 (queries i >= k).
``first_key_rate``  (..., head, query): alpha_i0 at every query i >= 0 (Gu et al.'s score).

The key groups are defined in :mod:`attngeom.store.format.derive`. With ``mask=True`` (the default)
cells outside the analyses are NaN: queries i < k or beyond the sequence's length, keys beyond
it, sequences with non-finite activations. Arrays keep the dataset's leading dims (a whole lazy
store: sequence, layer, ...; a loaded block: sequence) in the schema's order, and its dask
arrays stay lazy. The arithmetic runs on the arrays themselves (numpy or dask), each result is
wrapped once as a DataArray, so a loaded block costs what numpy costs. Results are memoized on
the object: make a new one after changing the dataset.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
import pandas as pd
import xarray as xr
from xarray.indexes import PandasIndex

from ..format import derive
from ..format import schema as S
from attngeom.common.vocab import GROUPS, MIDDLE, SINK, TAIL
from attngeom.common.errors import Refusal

SLOT = {SINK: S.SINK, TAIL: S.LAG, MIDDLE: S.KEY}    # the slot dimension of each group
RATIO = "ratio"


class _A(NamedTuple):
    """An array (numpy or dask) with its dim names."""

    data: object
    dims: tuple[str, ...]


def check_group(group: str) -> None:
    """ValueError unless ``group`` is one of the key groups."""
    if group not in GROUPS:
        raise Refusal(f"unknown key group {group!r}; one of {', '.join(GROUPS)}")


def _memo(fn):
    @functools.wraps(fn)
    def wrapper(self, *args):
        key = (fn.__name__, *args)
        if key not in self._memo:
            self._memo[key] = fn(self, *args)
        return self._memo[key]
    return wrapper


def _expand(a: _A, dims: tuple[str, ...]):
    """``a``'s data with size-1 axes inserted so that it broadcasts against ``dims``."""
    if a.dims == dims:
        return a.data
    if [d for d in dims if d in a.dims] != list(a.dims):
        raise ValueError(f"dims {a.dims} are not in the schema's order of {dims}")
    return a.data[tuple(slice(None) if d in a.dims else None for d in dims)]


def _where(mask: _A | None, a: _A) -> _A:
    return a if mask is None else _A(np.where(_expand(mask, a.dims), a.data, np.nan), a.dims)


class KeyGroups:
    """Sink, tail and middle keys of every query (k sink keys, tail window w) of a dataset."""

    def __init__(self, ds: xr.Dataset, k: int, w: int, *, mask: bool = True):
        self._ds, self.k, self.w, self.mask = ds, int(k), int(w), mask
        acc = ds.attngeom
        self.layout, self.store_k, self.store_w = acc.layout, acc.sink_k, acc.tail_w
        self.all_keys, self.n_positions = acc.all_keys, acc.n_positions
        self._sizes = {**ds.sizes, S.SINK: self.k, S.LAG: self.w}
        self._memo: dict = {}

    # ------------------------------------------------------------------ arrays
    def _var(self, name: str) -> _A:
        var = self._ds.variables[name]
        return _A(var.data, tuple(var.dims))

    def _wrap(self, a: _A) -> xr.DataArray:
        """``a`` as a DataArray with the dataset's index coordinates (a few microseconds: the
        coordinates of each dims tuple are built once)."""
        shape = tuple(self._sizes[d] for d in a.dims)
        if tuple(np.shape(a.data)) != shape:
            raise ValueError(f"shape {np.shape(a.data)} does not match dims {a.dims}")
        coords, indexes = self._coords(a.dims)
        return xr.DataArray(xr.Variable(a.dims, a.data), coords=coords, indexes=indexes,
                            fastpath=True)

    @_memo
    def _coords(self, dims: tuple[str, ...]) -> tuple[dict, dict]:
        coords, indexes = {}, {}
        for d in dims:
            n = self._sizes[d]
            if d in self._ds.xindexes and self._ds.sizes[d] == n:
                indexes[d], coords[d] = self._ds.xindexes[d], self._ds.variables[d]
            elif d in (S.SINK, S.LAG):          # slots 0..n-1
                index = PandasIndex(pd.Index(np.arange(n)), d)
                indexes[d] = index
                coords.update(index.create_variables())
        return coords, indexes

    # ------------------------------------------------------------------ masks
    @_memo
    def _sequence_ok(self) -> _A:
        return _A(*self._ds.attngeom.sequence_mask())

    @_memo
    def _positions_ok(self, dim: str, first: int) -> _A:
        """(sequence, dim) bool: first <= position < length, usable sequence."""
        ok = self._sequence_ok()
        if S.LENGTH in self._ds:
            length = np.asarray(self._ds.variables[S.LENGTH].values, dtype=np.int64)
        else:
            length = np.full(ok.data.shape, self.n_positions, dtype=np.int64)
        pos = np.arange(self.n_positions)
        out = (pos >= first) & (pos < length[..., None]) & ok.data[..., None]
        return _A(out, ok.dims + (dim,))

    def _query_ok(self) -> _A:
        return self._positions_ok(S.QUERY, self.k)

    def _key_ok(self) -> _A:
        return self._positions_ok(S.KEY, 0)

    @_memo
    def _semantic_key(self) -> _A:
        out = self._positions_ok(S.KEY, self.k)
        if S.SPECIAL not in self._ds:
            return out
        special = self._ds[S.SPECIAL]
        pos = S.POSITION if S.POSITION in special.dims else S.KEY
        lead = [d for d in special.dims if d != pos]
        flag = np.asarray(special.transpose(*lead, pos).values, dtype=bool)
        return _A(out.data & ~flag, out.dims)

    @property
    def sequence_ok(self) -> xr.DataArray:
        """(sequence,) bool: usable sequences (finite activations)."""
        return self._wrap(self._sequence_ok())

    @property
    def query_ok(self) -> xr.DataArray:
        """(sequence, query) bool: i >= k, within the length, usable sequence."""
        return self._wrap(self._query_ok())

    @property
    def key_ok(self) -> xr.DataArray:
        """(sequence, key) bool: within the length, usable sequence."""
        return self._wrap(self._key_ok())

    @property
    def semantic_key(self) -> xr.DataArray:
        """(sequence, key) bool: j >= k, within the length, not a special token."""
        return self._wrap(self._semantic_key())

    @property
    def tail_key(self) -> xr.DataArray:
        """(query, lag) int: the key j = query - lag of each tail slot, -1 where it is none."""
        key, ok = derive.tail_keys(self.n_positions, self.k, self.w)
        return self._wrap(_A(np.where(ok, key, -1), (S.QUERY, S.LAG)))

    @_memo
    def _member(self, group: str) -> _A | None:
        """The group's cells over (query, slot) (with the masks: (sequence, query, slot));
        None when every cell is one (the sink, unmasked)."""
        T, k, w = self.n_positions, self.k, self.w
        if group == SINK:
            out = None
        elif group == TAIL:
            out = _A(derive.tail_keys(T, k, w)[1], (S.QUERY, S.LAG))
        else:
            out = _A(derive.middle_mask(T, k, w), (S.QUERY, S.KEY))
        if not self.mask:
            return out
        q = self._query_ok()
        lead = q.dims[:-1]
        if group == SINK:
            keys = self._key_ok().data[..., None, :k]
            return _A(q.data[..., None] & keys, lead + (S.QUERY, S.SINK))
        if group == TAIL:              # the key i - lag <= i is within the length
            return _A(q.data[..., None] & out.data, lead + out.dims)
        return _A(q.data[..., None] & self._key_ok().data[..., None, :] & out.data,
                  lead + out.dims)

    def member(self, group: str) -> xr.DataArray | None:
        """Bool DataArray of the group's cells (see :meth:`group`); None: all cells."""
        cells = self._member(group)
        return None if cells is None else self._wrap(cells)

    # ------------------------------------------------------------------ per query / key
    @_memo
    def _per(self, name: str, dim: str) -> _A:
        a = self._var(name)
        if not self.mask:
            return a
        return _where(self._query_ok() if dim == S.QUERY else self._key_ok(), a)

    @_memo
    def per_query(self, name: str) -> xr.DataArray:
        """A per-query variable, NaN where the query is not valid."""
        return self._wrap(self._per(name, S.QUERY))

    @_memo
    def per_key(self, name: str) -> xr.DataArray:
        """A per-key variable over all positions, NaN beyond the length."""
        return self._wrap(self._per(name, S.KEY))

    # ------------------------------------------------------------------ groups
    def elementwise(self, group: str) -> bool:
        """Whether :meth:`group` can give ``group`` key by key (middle: dense stores only)."""
        return self._ds.attngeom.elementwise(group)

    def _check(self, group: str) -> None:
        check_group(group)
        if group != SINK and not self.all_keys and self.k != self.store_k:
            raise Refusal(f"a compact store's groups are fixed by its sink_k = "
                             f"{self.store_k}; use --sink-k {self.store_k} or a dense store")

    def require_groups(self) -> "KeyGroups":
        """Raise unless every key group (sink, tail, middle totals) can be formed."""
        self._check(TAIL)
        return self

    def _full(self, name: str) -> _A:
        """A dense store's pair variable over every key (..., query, key)."""
        if not self.all_keys:
            raise Refusal("the middle group is stored elementwise only in dense stores")
        a = self._var(name)
        if a.dims[-1] != S.KEY:
            raise Refusal(f"`{name}` over all keys: read the block with the tail or middle "
                             "group (load_block(groups=...))")
        return a

    def _shape(self, lead: tuple[str, ...], slot: str) -> tuple[int, ...]:
        return tuple(self._sizes[d] for d in lead) + (self.n_positions, self._sizes[slot])

    def _stored(self, group: str, name: str) -> _A:
        """The store's values of pair variable ``name`` at the group's slots (unmasked)."""
        if group == SINK:
            a = self._var(name)              # (..., query, key | sink): the first k keys
            return _A(a.data[..., : self.k], a.dims[:-1] + (S.SINK,))
        if group == TAIL and not self.all_keys:
            var = S.TAIL_PREFIX + name
            if var not in self._ds:
                raise Refusal(f"the compact store lacks `{var}`")
            a = self._var(var)
            return _A(a.data[..., : self.w], a.dims)
        full = self._full(name)
        if group == MIDDLE:
            return full
        T, w = self.n_positions, self.w                  # a[..., i, i - lag]
        flat = (np.arange(T)[:, None] * T + derive.tail_keys(T, self.k, w)[0]).ravel()
        lead = full.data.shape[:-2]
        out = full.data.reshape(lead + (T * T,))[..., flat].reshape(lead + (T, w))
        return _A(out, full.dims[:-1] + (S.LAG,))

    def _value_norm(self, group: str) -> _A:
        """value_norm of each slot's key, (..., head, query, slot) (unmasked)."""
        vn = self._var(S.VALUE_NORM)                     # (..., head, key)
        slot = SLOT[group]
        n = {SINK: self.k, TAIL: self.w, MIDDLE: self.n_positions}[group]
        return _A(derive.slot_value_norm(vn.data, slot, self.n_positions, n),
                  vn.dims[:-1] + (S.QUERY, slot))

    @_memo
    def _group(self, group: str, name: str) -> _A:
        self._check(group)
        if name == RATIO:
            vn = self._group(group, S.VALUE_NORM)
            on = self._per(S.OUTPUT_NORM, S.QUERY)
            return _A(vn.data / _expand(on, vn.dims), vn.dims)
        if name in derive.DERIVED and not self._has(group, name):
            alpha, cosine, vn, norm = derive.DERIVED[name].parts()
            parts = [self._group(group, n) for n in (alpha, vn, cosine)]
            dims = parts[0].dims
            out = derive.DERIVED[name].formula(*(p.data for p in parts),
                                               _expand(self._per(norm, S.QUERY), dims))
            return _A(out, dims)
        out = self._value_norm(group) if name == S.VALUE_NORM else self._stored(group, name)
        return _where(self._member(group), out)

    @_memo
    def group(self, group: str, name: str) -> xr.DataArray:
        """Pair quantity ``name`` at the keys of ``group``: (..., head, query, slot)."""
        return self._wrap(self._group(group, name))

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
                raise Refusal(f"the compact store lacks `{var}`")
            out = self._per(var, S.QUERY)
            if self.w < (self.store_w or 0):    # stored tail lags >= w are middle keys
                extra = self._var(S.TAIL_PREFIX + name)
                out = _A(out.data + np.nansum(extra.data[..., self.w:], axis=-1), out.dims)
            return self._wrap(out)
        a = self._group(group, name)
        out = _A(np.nansum(a.data, axis=-1), a.dims[:-1])
        return self._wrap(_where(self._query_ok(), out) if self.mask else out)

    @_memo
    def count(self, group: str) -> xr.DataArray:
        """Number of keys of the group per query: (..., head, query)."""
        self._check(group)
        if group == MIDDLE and not self.all_keys:
            out = self._per(S.MIDDLE_COUNT, S.QUERY)
            if self.w < (self.store_w or 0):    # stored tail lags >= w are middle keys
                extra = self._var(S.TAIL_PREFIX + S.ALPHA).data[..., self.w:]
                out = _A(out.data + np.isfinite(extra).sum(-1), out.dims)
            return self._wrap(out)
        a = self._group(group, S.ALPHA)
        return self._wrap(_A(np.isfinite(a.data).sum(-1), a.dims[:-1]))

    @property
    @_memo
    def sink_rate(self) -> xr.DataArray:
        """alpha_i0: attention to the first key, (..., head, query)."""
        a = self._group(SINK, S.ALPHA)
        return self._wrap(_A(a.data[..., 0], a.dims[:-1]))

    @property
    @_memo
    def first_key_rate(self) -> xr.DataArray:
        """alpha_i0 at every query 0 <= i < length, (..., head, query), NaN elsewhere: the score
        of Gu et al.'s count, which includes the first query (alpha_00 = 1 in a decoder) and
        reads key 0 whatever k is."""
        a = self._stored(SINK, S.ALPHA)
        return self._wrap(_where(self._positions_ok(S.QUERY, 0), _A(a.data[..., 0],
                                                                     a.dims[:-1])))

    @_memo
    def pairs(self, name: str) -> xr.DataArray:
        """Pair quantity ``name`` over every key, (..., head, query, key): dense stores only."""
        full = self._full(name)
        if not self.mask:
            return self._wrap(full)
        q, keys = self._query_ok(), self._key_ok()
        cells = _A(q.data[..., None] & keys.data[..., None, :], q.dims + (S.KEY,))
        return self._wrap(_where(cells, full))
