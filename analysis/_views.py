"""Layout-independent views of a store for the analyses: one layer, a run of sequences at a time.

Both store layouts (``dense`` and ``compact``, see :mod:`attngeom.store.schema`) are read through
:class:`Block`, which loads only what an analysis asks for, as float64 numpy arrays with NaN at
invalid cells (beyond a sequence's length, outside the mask, excluded sequences, queries i < k).

Groups of keys of a query i (k sink keys, tail window w):

``sink``    keys j < k.
``tail``    the w most recent non-sink keys up to the query: j = i - lag, lag = 0..w-1, j >= k.
``middle``  every other valid key (k <= j <= i - w, and for encoders also j > i).

Group arrays are (sequence, head, query, slot) where slot is the key (sink), the lag (tail) or the
key (middle). The middle group is available elementwise in dense stores only; a compact store
keeps just its per-query totals (``middle_alpha``, ``middle_contribution``), so analyses that need
elements (the variance decomposition) compute the middle group in dense stores only and report
NaN for it in compact stores, while per-query totals are available in both layouts.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from functools import cached_property
from typing import Iterator, Protocol

import dask
import numpy as np
import xarray as xr

GROUPS = ("sink", "tail", "middle")
DEFAULT_TAIL_W = 8  # the extract default
DEFAULT_BLOCK_ELEMENTS = 4_000_000  # float64 cells of one (sequence, head, query, key) block


@dataclass(frozen=True)
class StoreInfo:
    """What the analyses need to know about a store's layout."""

    mode: str  # "dense" or "compact"
    causal: bool
    store_k: int  # sink keys the store was written with (defines residual_norm)
    store_w: int | None  # tail window of a compact store
    k: int  # sink keys used by the analysis
    w: int  # tail window used by the analysis
    pair_dim: str  # key dimension of the pair variables: "key" (dense) or "sink" (compact)
    layers: tuple  # layer coordinate values analysed
    heads: np.ndarray
    n_positions: int


def describe(ds: xr.Dataset, k: int | None = None, w: int | None = None,
             layers=None) -> StoreInfo:
    """Check the store and resolve the options ``k`` (sink keys), ``w`` (tail) and ``layers``."""
    if ds.sizes.get("sequence", 0) == 0:
        raise ValueError("the store has no sequences; run `attngeom extract` into it first")
    if "alpha" not in ds:
        raise ValueError("the store has no `alpha` variable; is it an attngeom store?")
    pair_dim = next(d for d in ds["alpha"].dims
                    if d not in ("sequence", "layer", "head", "query"))
    mode = ds.attrs.get("mode") or ("compact" if "tail_alpha" in ds else "dense")
    store_k = int(ds.attrs.get("sink_k", ds.sizes[pair_dim] if mode == "compact" else 1))
    store_w = ds.attrs.get("tail_w")
    store_w = int(store_w) if store_w is not None else (
        ds.sizes.get("lag") if mode == "compact" else None)
    k = store_k if k is None else int(k)
    w = (store_w or DEFAULT_TAIL_W) if w is None else int(w)
    if k < 1 or w < 1:
        raise ValueError(f"sink_k and tail_w must be >= 1 (got {k}, {w})")
    if mode == "compact" and k > store_k:
        raise ValueError(f"this compact store keeps only {store_k} sink keys; use --sink-k "
                         f"<= {store_k} or a dense store")
    if mode == "compact" and w > (store_w or 0):
        raise ValueError(f"this compact store keeps a tail of {store_w} keys; use --tail-w "
                         f"<= {store_w} or a dense store")
    for dim in ("query", "key", "sink", "lag"):
        if dim in ds.coords and not np.array_equal(ds[dim].values, np.arange(ds.sizes[dim])):
            raise ValueError(f"the `{dim}` coordinate must be positions 0..T-1; "
                             "open the whole store rather than a position subset")
    all_layers = list(ds["layer"].values)
    if layers is None:
        layers = all_layers
    missing = [lay for lay in layers if lay not in all_layers]
    if missing:
        raise ValueError(f"layers {missing} are not in the store (it has {all_layers})")
    return StoreInfo(mode=mode, causal=bool(ds.attrs.get("causal", True)), store_k=store_k,
                     store_w=store_w, k=k, w=w, pair_dim=pair_dim, layers=tuple(layers),
                     heads=ds["head"].values, n_positions=int(ds.sizes["query"]))


def require(ds: xr.Dataset, names: list[str], what: str) -> None:
    """Raise a one-line error when variables an analysis needs are missing."""
    missing = [n for n in names if n not in ds]
    if missing:
        raise ValueError(f"{what} needs store variables {missing}, missing from this store")


def valid_sequences(ds: xr.Dataset) -> np.ndarray:
    """(sequence,) bool: sequences usable for statistics (finite activations); warns on others."""
    ok = np.ones(ds.sizes["sequence"], bool)
    if "finite" in ds:
        ok &= np.asarray(ds["finite"].values) != 0
        if (~ok).any():
            warnings.warn(f"{int((~ok).sum())} sequences had non-finite activations and are "
                          "excluded from the statistics", RuntimeWarning, stacklevel=3)
    if not ok.any():
        raise ValueError("no sequence of the store has finite activations; nothing to analyse")
    return ok


def _chunk(ds: xr.Dataset, name: str) -> int | None:
    chunks = ds[name].chunksizes.get("sequence") if name in ds else None
    return int(chunks[0]) if chunks else None


def sequence_blocks(ds: xr.Dataset, info: StoreInfo, elements: int, pairs: bool) -> list[slice]:
    """Contiguous sequence ranges whose (head, query, key) arrays hold about ``elements`` cells.

    Block sizes are multiples of the store's sequence chunk when that fits, so each chunk is read
    once per layer; otherwise blocks split each chunk evenly (dense stores read best with
    sequence chunks no larger than a block: about ``elements / (heads * T * T)`` sequences).
    """
    n_seq = ds.sizes["sequence"]
    width = info.n_positions if (pairs and info.mode == "dense") else max(info.k, info.w, 1)
    per_seq = max(1, len(info.heads) * info.n_positions * width)
    size = max(1, elements // per_seq)
    chunk = _chunk(ds, "alpha")
    if chunk and chunk <= size:
        size = (size // chunk) * chunk
    elif chunk:  # blocks that split chunks evenly, never straddling two (each read once per block)
        size = -(-chunk // -(-chunk // size))
        return [slice(c + a, min(c + a + size, c + chunk, n_seq))
                for c in range(0, n_seq, chunk) for a in range(0, chunk, size) if c + a < n_seq]
    return [slice(a, min(a + size, n_seq)) for a in range(0, n_seq, size)]


class Block:
    """One layer and a contiguous run of sequences, loaded lazily as float64 numpy arrays."""

    def __init__(self, ds: xr.Dataset, info: StoreInfo, layer, seqs: slice, ok: np.ndarray,
                 pairs: bool = False):
        self.info = info
        self.pairs = pairs and info.mode == "dense"  # read whole (query, key) arrays once
        self.layer = layer
        self.sequence = np.arange(ds.sizes["sequence"])[seqs]  # global positions (S,)
        self._ds = ds.isel(sequence=seqs).sel(layer=layer)
        self.ok = ok[seqs]
        self._cache: dict[str, np.ndarray] = {}

    # ------------------------------------------------------------------ masks
    @cached_property
    def length(self) -> np.ndarray:  # (S,)
        if "length" in self._ds:
            return np.asarray(self._ds["length"].values, dtype=np.int64)
        return np.full(len(self.sequence), self.info.n_positions)

    @cached_property
    def query_ok(self) -> np.ndarray:  # (S, Q): i >= k, within length, usable sequence
        q = np.arange(self.info.n_positions)
        return (q[None] >= self.info.k) & (q[None] < self.length[:, None]) & self.ok[:, None]

    @cached_property
    def key_ok(self) -> np.ndarray:  # (S, K): within length, usable sequence
        j = np.arange(self.info.n_positions)
        return (j[None] < self.length[:, None]) & self.ok[:, None]

    @cached_property
    def semantic_key(self) -> np.ndarray:  # (S, K): j >= k, within length, not special
        j = np.arange(self.info.n_positions)
        out = self.key_ok & (j[None] >= self.info.k)
        if "special" in self._ds:
            special = self._ds["special"]
            pos = "position" if "position" in special.dims else "key"
            out &= ~np.asarray(special.transpose("sequence", pos).values, dtype=bool)
        return out

    # ------------------------------------------------------------------ loading
    def _lazy(self, name: str) -> xr.DataArray:
        """The block's view of a store variable, dims (sequence, head, [query], rest).

        Pair variables of a dense store are read whole only when the block needs all keys
        (``pairs``); otherwise just the sink keys. Compact sink and tail arrays are sliced later.
        """
        da = self._ds[name]
        if self.info.mode == "dense" and not self.pairs and self.info.pair_dim in da.dims \
                and "query" in da.dims:
            da = da.isel({self.info.pair_dim: slice(0, self.info.k)})
        lead = [d for d in ("sequence", "head", "query") if d in da.dims]
        return da.transpose(*lead, *[d for d in da.dims if d not in lead])

    def prefetch(self, names) -> None:
        """Read the store variables ``names`` (those present) in one dask computation."""
        todo = [n for n in dict.fromkeys(names) if n in self._ds and n not in self._cache]
        if todo:
            arrays = dask.compute(*[self._lazy(n).data for n in todo])
            for name, arr in zip(todo, arrays):
                self._cache[name] = np.asarray(arr, dtype=np.float64)

    def _load(self, name: str) -> np.ndarray:
        if name not in self._cache:
            self.prefetch([name])
        return self._cache[name]

    def per_query(self, name: str) -> np.ndarray:
        """(S, H, Q) per-query variable, NaN where the query is not valid."""
        return np.where(self.query_ok[:, None], self._load(name), np.nan)

    def per_key(self, name: str) -> np.ndarray:
        """(S, H, K) per-key variable over all positions, NaN beyond length."""
        return np.where(self.key_ok[:, None], self._load(name), np.nan)

    def full(self, name: str) -> np.ndarray:
        """(S, H, Q, K) pair variable of a dense store, NaN at invalid (query, key) cells."""
        if not self.pairs:
            raise ValueError(f"`{name}` over all keys needs a dense store read with pairs=True")
        key = f"full:{name}"
        if key not in self._cache:
            if name == "contribution" and name not in self._ds:  # c = alpha * ratio * cosine
                arr = self.full("alpha") * self.ratio_for("key") * self.full("cosine")
            else:
                arr = self._load(name)
            mask = self.query_ok[:, None, :, None] & self.key_ok[:, None, None, :]
            self._cache[key] = np.where(mask, arr, np.nan)
        return self._cache[key]

    # ------------------------------------------------------------------ sink rate
    @cached_property
    def sink_alpha(self) -> np.ndarray:
        """(S, H, Q, k) alpha to the sink keys j < k, NaN at invalid queries."""
        return self.group("sink", "alpha")

    @cached_property
    def sink_rate(self) -> np.ndarray:
        """(S, H, Q) alpha_i0, NaN at invalid queries (i < k, beyond length)."""
        return self.sink_alpha[..., 0]

    # ------------------------------------------------------------------ groups
    def tail_keys(self) -> tuple[np.ndarray, np.ndarray]:
        """(Q, w) key index j = i - lag (clipped to 0) and whether it is a tail key (j >= k)."""
        q = np.arange(self.info.n_positions)[:, None]
        j = q - np.arange(self.info.w)[None]
        return np.clip(j, 0, None), j >= self.info.k

    def ratio_for(self, group: str) -> np.ndarray:
        """value_norm / output_norm per (query, key) of a group: (S, H, Q, slot)."""
        vn = self.per_key("value_norm")  # (S, H, K)
        on = self.per_query("output_norm")[..., None]  # (S, H, Q, 1)
        if group == "sink":
            return vn[:, :, None, : self.info.k] / on
        if group == "tail":
            idx, ok = self.tail_keys()
            return np.where(ok, vn[:, :, idx] / on, np.nan)
        return vn[:, :, None, :] / on  # "key"/"middle": all keys (dense)

    def _middle_mask(self) -> np.ndarray:  # (Q, K) middle keys of each query
        q = np.arange(self.info.n_positions)[:, None]
        j = np.arange(self.info.n_positions)[None]
        tail = (j <= q) & (j > q - self.info.w)
        return (j >= self.info.k) & ~tail

    def group(self, group: str, name: str) -> np.ndarray:
        """(S, H, Q, slot) ``name`` in {alpha, cosine, contribution, ratio} for a key group."""
        key = f"group:{group}:{name}"
        if key in self._cache:
            return self._cache[key]
        k, info = self.info.k, self.info
        if name == "ratio":
            out = self.ratio_for(group)
            if group == "middle":
                out = np.where(self._middle_mask(), out, np.nan)
        elif info.mode == "dense" and (group != "sink" or self.pairs):
            full = self.full(name)
            if group == "sink":
                out = full[..., :k]
            elif group == "tail":
                idx, ok = self.tail_keys()
                out = np.take_along_axis(full, np.broadcast_to(idx, full.shape[:2] + idx.shape),
                                         axis=3)
                out = np.where(ok, out, np.nan)
            else:
                out = np.where(self._middle_mask(), full, np.nan)
        elif group == "sink":
            if name not in self._ds:
                if name != "contribution":
                    raise ValueError(f"the store lacks `{name}`")
                out = self._sink_from_parts()
            else:  # sink keys are the first k positions of the pair dimension
                out = self._load(name)[..., :k]
            out = np.where(self.query_ok[:, None, :, None], out, np.nan)
        elif group == "tail":
            out = self._tail_compact(name)
        else:
            raise ValueError("the middle group is stored elementwise only in dense stores")
        self._cache[key] = out
        return out

    def _sink_from_parts(self) -> np.ndarray:
        return self.group("sink", "alpha") * self.group("sink", "ratio") * self.group(
            "sink", "cosine")

    def _tail_compact(self, name: str) -> np.ndarray:
        var = f"tail_{name}"
        if var in self._ds:
            out = self._load(var)[..., : self.info.w]
        elif name == "contribution":
            out = (self.group("tail", "alpha") * self.group("tail", "ratio")
                   * self.group("tail", "cosine"))
        else:
            raise ValueError(f"the compact store lacks `{var}`")
        _, ok = self.tail_keys()
        return np.where(ok & self.query_ok[:, None, :, None], out, np.nan)

    def group_total(self, group: str, name: str) -> np.ndarray:
        """(S, H, Q) sum of ``name`` (alpha or contribution) over the group's keys."""
        if group == "middle" and self.info.mode == "compact":
            total = self.per_query(f"middle_{name}")
            if self.info.w < (self.info.store_w or 0):  # stored tail lags >= w are middle keys
                extra = self._load(f"tail_{name}")[..., self.info.w:]
                total = total + np.nansum(extra, axis=-1)
            return total
        arr = self.group(group, name)
        total = np.nansum(arr, axis=-1)
        return np.where(self.query_ok[:, None], total, np.nan)


class Accumulator(Protocol):
    """One analysis fed layer by layer, block by block (see :func:`run_pass`)."""

    needs_pairs: bool  # elementwise pair arrays over all keys (dense middle/tail groups)
    reads: tuple[str, ...]  # store variables it loads (read together, once per block)

    def update(self, block: Block) -> None: ...

    def end_layer(self, layer) -> None: ...

    def result(self) -> xr.Dataset: ...


def iter_blocks(ds: xr.Dataset, info: StoreInfo, pairs: bool, elements: int,
                progress: bool) -> Iterator[tuple[object, Block | None]]:
    """Yield (layer, block) for each block, then (layer, None) when the layer is done."""
    from tqdm.auto import tqdm

    ok = valid_sequences(ds)
    blocks = sequence_blocks(ds, info, elements, pairs)
    with tqdm(total=len(info.layers) * len(blocks), desc="analyze", unit="block",
              disable=not progress) as bar:
        for layer in info.layers:
            for seqs in blocks:
                yield layer, Block(ds, info, layer, seqs, ok, pairs)
                bar.update(1)
            yield layer, None


def run_pass(ds: xr.Dataset, info: StoreInfo, accumulators: list[Accumulator], *,
             elements: int = DEFAULT_BLOCK_ELEMENTS, progress: bool = True) -> None:
    """Feed every accumulator one layer at a time, in sequence blocks of bounded memory."""
    pairs = any(a.needs_pairs for a in accumulators)
    reads = [name for a in accumulators for name in a.reads]
    for layer, block in iter_blocks(ds, info, pairs, elements, progress):
        if block is not None:
            block.prefetch(reads)
        for acc in accumulators:
            if block is None:
                acc.end_layer(layer)
            else:
                acc.update(block)
