"""``ds.attngeom``: one view of a store for both layouts, registered by :mod:`attngeom.store`.

The two layouts (:mod:`attngeom.store.format.schema`) keep the same quantities under different names
and dims: a dense store holds every (query, key) pair, a compact one only the sink keys (on
``sink``), the tail window (``tail_*`` on ``lag``) and per-query totals over the middle keys
(``middle_*``). The accessor answers in one vocabulary whatever the layout:

    import attngeom.store                      # registers the accessor (and the xarray engine)
    ds = attngeom.store.open("store")          # or xr.open_dataset("store", engine="attngeom")
    ds.attngeom.layout, ds.attngeom.sink_k, ds.attngeom.tail_w
    g = ds.attngeom.groups()                   # key groups with the store's k and w (or k=, w=)
    g.sink_rate                                # alpha_i0 at valid queries  (..., head, query)
    g.group("tail", "contribution")            # (..., head, query, lag)
    g.total("middle", "alpha")                 # (..., head, query): middle_alpha or a sum
    block = ds.attngeom.load_block(["alpha", "ratio"], layer=3, sequences=slice(0, 64))

:meth:`StoreAccessor.load_block` is the I/O step (one layer and a run of sequences, every
variable in one dask computation, float64); :class:`~attngeom.store.dataset.groups.KeyGroups` the
masking and derivation, on a loaded block as on the lazy store.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
import xarray as xr

from attngeom.common.vocab import COMPACT, DENSE, GROUPS, LAYOUTS, MIDDLE, SINK, TAIL, TAIL_W

from ..format import derive
from ..format import schema as S
from ..io.blockread import ENCODING_KEY, local_scheduler
from .groups import KeyGroups, check_group
from attngeom.common.errors import Refusal

# dims in the order every block array is given: the schema's order
CANONICAL = (S.SEQUENCE, S.LAYER, S.HEAD, S.POSITION, S.QUERY, S.KEY, S.SINK, S.LAG)
MASK_VARIABLES = (S.LENGTH, S.FINITE, S.SPECIAL)      # read with every block
RATIO = "ratio"                                       # value_norm / output_norm of a key group
PAIR_QUANTITIES = tuple(S.PAIR_VARIABLES) + tuple(S.DERIVED_PAIR_VARIABLES)


@xr.register_dataset_accessor("attngeom")
class StoreAccessor:
    """Layout, options and block reads of an attngeom store (``ds.attngeom``).

    Parameters
    ----------
    ds : xarray.Dataset
        An opened store or a measurement (importing ``attngeom.store`` registers the accessor).
    """

    def __init__(self, ds: xr.Dataset):
        self._ds = ds
        self._mask_cache: dict = {}  # (names, dtype, sequences) -> mask variables (no layer)

    # ------------------------------------------------------------------ layout
    @property
    def layout(self) -> str:
        """``"dense"`` or ``"compact"`` (the ``mode`` attribute, else read from the dims)."""
        mode = self._ds.attrs.get("mode")
        if mode in LAYOUTS:
            return mode
        compact = S.SINK in self._ds.dims or S.TAIL_PREFIX + S.ALPHA in self._ds
        return COMPACT if compact else DENSE

    @property
    def all_keys(self) -> bool:
        """The store holds pair quantities for every key (dense layout)."""
        return self.layout == DENSE

    @property
    def pair_dim(self) -> str:
        """Key dimension of the pair variables: ``key`` (dense) or ``sink`` (compact)."""
        return S.KEY if self.all_keys else S.SINK

    @property
    def sink_k(self) -> int:
        """Sink keys k the store was written with (defines ``residual_norm``)."""
        if "sink_k" in self._ds.attrs:
            return int(self._ds.attrs["sink_k"])
        return 1 if self.all_keys else int(self._ds.sizes[S.SINK])

    @property
    def tail_w(self) -> int | None:
        """Tail window w the store was written with (compact: the stored lags)."""
        w = self._ds.attrs.get("tail_w")
        if w is not None:
            return int(w)
        return None if self.all_keys else self._ds.sizes.get(S.LAG)

    @property
    def n_positions(self) -> int:
        """Token positions T of the store (queries and keys 0..T-1)."""
        for dim in (S.QUERY, S.KEY, S.POSITION):
            if dim in self._ds.sizes:
                return int(self._ds.sizes[dim])
        raise Refusal("the dataset has no query, key or position dimension")

    @property
    def causal(self) -> bool:
        return bool(self._ds.attrs.get("causal", True))

    @property
    def sequence_ok(self) -> xr.DataArray:
        """(sequence,) bool: sequences usable for statistics (every activation finite)."""
        ok, dims = self.sequence_mask()
        return xr.DataArray(ok, dims=dims, coords={d: self._ds[d] for d in dims
                                                   if d in self._ds.coords})

    def sequence_mask(self) -> tuple[np.ndarray, tuple[str, ...]]:
        """:attr:`sequence_ok` as a numpy array and its dims."""
        ds = self._ds
        if S.FINITE in ds:
            finite = ds.variables[S.FINITE]
            return np.asarray(finite.values) != 0, tuple(finite.dims)
        dims = (S.SEQUENCE,) if S.SEQUENCE in ds.dims else ()
        return np.ones([ds.sizes[d] for d in dims], bool), dims

    def elementwise(self, group: str) -> bool:
        """Tell whether the store keeps the keys of ``group`` one by one (middle: dense only).

        Parameters
        ----------
        group : {"sink", "tail", "middle"}
            The key group.

        Returns
        -------
        bool
            True when the group's keys are stored one by one.
        """
        check_group(group)
        return self.all_keys or group != MIDDLE

    # ------------------------------------------------------------------ options
    def resolve(self, k: int | None = None, w: int | None = None) -> tuple[int, int]:
        """The sink keys k and tail window w an analysis uses (default: the store's), checked.

        A compact store can give at most its own k and w.
        """
        store_k, store_w = self.sink_k, self.tail_w
        k = store_k if k is None else int(k)
        w = (store_w or TAIL_W) if w is None else int(w)
        if k < 1 or w < 1:
            raise Refusal(f"sink_k and tail_w must be >= 1 (got {k}, {w})")
        if not self.all_keys and k > store_k:
            raise Refusal(f"this compact store keeps only {store_k} sink keys; use --sink-k "
                             f"<= {store_k} or a dense store")
        if not self.all_keys and w > (store_w or 0):
            raise Refusal(f"this compact store keeps a tail of {store_w} keys; use --tail-w "
                             f"<= {store_w} or a dense store")
        for dim in (S.QUERY, S.KEY, S.SINK, S.LAG):
            if dim in self._ds.indexes and not np.array_equal(
                    self._ds.indexes[dim], np.arange(self._ds.sizes[dim])):
                raise Refusal(f"the `{dim}` coordinate must be positions 0..T-1; "
                                 "open the whole store rather than a position subset")
        return k, w

    def groups(self, k: int | None = None, w: int | None = None, *,
               mask: bool = True) -> KeyGroups:
        """Make the key groups of every query with k sink keys and a tail window w.

        Parameters
        ----------
        k : int, optional
            Sink keys (default the store's).
        w : int, optional
            Tail window (default the store's).
        mask : bool
            NaN outside the analyses' cells (queries i < k or beyond the length, keys beyond the
            length, sequences with non-finite activations); False: only the store's own NaN and the
            group membership.

        Returns
        -------
        KeyGroups
            The masks (``query_ok``, ``key_ok``, ``semantic_key``), ``sink_rate``, and ``group`` and
            ``total`` of each quantity by group.
        """
        k, w = self.resolve(k, w)
        return KeyGroups(self._ds, k, w, mask=mask)

    # ------------------------------------------------------------------ reading
    def sources(self, names: Iterable[str], groups: Iterable[str] = GROUPS) -> list[str]:
        """Store variables holding the quantities ``names`` for the key ``groups``.

        Pair quantities (alpha, cosine, cosine_layer, contribution, contribution_layer) map to
        the layout's variables (compact: ``x`` for the sink, ``tail_x``, ``middle_x`` totals);
        ``"ratio"`` to value_norm and output_norm; a derived contribution absent from the
        dataset to its parts; any other name to itself.
        """
        groups = tuple(groups)
        out: list[str] = []
        for name in names:
            if name == RATIO:
                out += [S.VALUE_NORM, S.OUTPUT_NORM]
            elif name in PAIR_QUANTITIES:
                out += self._pair_sources(name, groups)
            else:
                out.append(name)
        return list(dict.fromkeys(out))

    def _pair_sources(self, name: str, groups: tuple[str, ...]) -> list[str]:
        if self.all_keys:
            stored = [name] if groups else []
        else:                          # compact: no middle_cosine etc. (totals of sums only)
            per_group = {SINK: name, TAIL: S.TAIL_PREFIX + name, MIDDLE: S.MIDDLE_PREFIX + name}
            stored = [per_group[g] for g in groups if g != MIDDLE or per_group[g] in S.DIMS]
        out = []
        for var in stored:
            if var in self._ds or name not in derive.DERIVED or var.startswith(S.MIDDLE_PREFIX):
                out.append(var)
            else:                      # derived on read, absent here: read its parts
                keys = groups if self.all_keys else [g for g in groups if g != MIDDLE]
                out += self.sources(derive.DERIVED[name].parts(), keys)
        return out

    def block_width(self, groups: Iterable[str], k: int, w: int) -> int:
        """Key slots per query that a block read for ``groups`` holds (for sizing blocks)."""
        return self.n_positions if self._reads_all_keys(groups) else max(k, w, 1)

    def _reads_all_keys(self, groups: Iterable[str]) -> bool:
        return self.all_keys and any(g != SINK for g in groups)

    def _direct_reads(self, names: list[str], layer, sequences: slice | None) -> dict:
        """The variables of a compact block read straight from the shard files
        (:mod:`attngeom.store.io.blockread`), as {name: Variable}; {} when they cannot be."""
        reads = self._ds.encoding.get(ENCODING_KEY)
        if reads is None or self.all_keys or layer is None or not local_scheduler():
            return {}
        seqs = sequences or slice(0, self._ds.sizes[S.SEQUENCE])
        start, stop, step = seqs.indices(self._ds.sizes[S.SEQUENCE])
        position = self._ds.indexes[S.LAYER].get_loc(layer)
        if step != 1 or stop <= start or not isinstance(position, (int, np.integer)):
            return {}
        names = [n for n in names if reads.readable(self._ds, n)]
        return reads.read(self._ds, names, int(position), slice(start, stop)) if names else {}

    def load_block(self, names: Iterable[str], *, layer=None, sequences: slice | None = None,
                   groups: Iterable[str] = GROUPS, k: int | None = None,
                   dtype=np.float64) -> xr.Dataset:
        """Read the quantities ``names`` of one layer and a run of sequences into memory.

        Every variable (with ``length``, ``finite`` and ``special`` for the masks) is read in one
        computation; the masks, which have no layer dim, only with the first block of a run of
        sequences (then kept on this accessor for the other layers' blocks); dims are in the
        schema's order.

        Parameters
        ----------
        names : iterable of str
            Stored or derived quantities (``alpha``, ``contribution``, ``ratio``, ...).
        layer : int, optional
            The layer label (default: every layer).
        sequences : slice, optional
            The run of sequences (default: all).
        groups : iterable of str
            The key groups needed; a dense store's pair variables are read over all keys only when
            they go beyond the sink (else keys < ``k``).
        k : int, optional
            Sink keys (default the store's k).
        dtype : numpy.dtype
            Float variables are cast to it.

        Returns
        -------
        xarray.Dataset
            The block, in memory.
        """
        import dask

        groups = tuple(groups)
        ds = self._ds
        wanted = [n for n in self.sources(names, groups) if n in ds]
        masks = [n for n in MASK_VARIABLES if n in ds and n not in wanted]
        wanted += [n for n in masks if S.LAYER in ds[n].dims]   # per layer: read with it
        masks = tuple(n for n in masks if n not in wanted)    # per sequence: read once
        key = (masks, np.dtype(dtype).str, None if sequences is None else
               (sequences.start, sequences.stop, sequences.step))
        cached = self._mask_cache.get(key)
        if cached is None:
            wanted += masks
        sub = ds[list(dict.fromkeys(wanted))]
        if sequences is not None:
            sub = sub.isel({S.SEQUENCE: sequences})
        if layer is not None:
            sub = sub.sel({S.LAYER: layer})
        variables = {}
        for name in sub.data_vars:
            var = sub.variables[name]
            variables[name] = var.transpose(*[d for d in CANONICAL if d in var.dims])
        coords = {n: sub.variables[n] for n in sub.coords}
        if self.all_keys and not self._reads_all_keys(groups):   # the sink keys only
            first = self.sink_k if k is None else int(k)
            for name, var in variables.items():
                if S.QUERY in var.dims and S.KEY in var.dims:
                    cut = var.isel({S.KEY: slice(0, first)})
                    variables[name] = xr.Variable(
                        tuple(S.SINK if d == S.KEY else d for d in cut.dims), cut.data, cut.attrs)
            coords[S.SINK] = np.arange(first)
        direct = self._direct_reads(list(variables), layer, sequences)
        lazy = [n for n in variables if n not in direct]
        arrays = dict(zip(lazy, dask.compute(*[variables[n].data for n in lazy])))
        arrays.update({n: v.transpose(*variables[n].dims).values for n, v in direct.items()})
        data = {}
        for name, var in variables.items():
            arr = np.asarray(arrays[name])
            data[name] = var.copy(deep=False, data=arr.astype(dtype, copy=False)
                                  if arr.dtype.kind == "f" else arr)
        if cached is None:      # kept for the blocks of the other layers
            self._mask_cache[key] = {n: data[n] for n in masks}
        else:
            data.update(cached)
        attrs = {**ds.attrs, "mode": self.layout, "sink_k": self.sink_k}
        if self.tail_w is not None:
            attrs["tail_w"] = self.tail_w
        return xr.Dataset(data, coords={n: c for n, c in coords.items() if n not in data},
                          attrs=attrs)

