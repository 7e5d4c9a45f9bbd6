"""A store's variables as lazily indexed arrays over every shard file: the one read path.

:class:`ShardsArray` is an xarray ``BackendArray`` (as xarray's own ``H5NetCDFArrayWrapper``):
one variable over every shard, concatenated along ``sequence``, each index read as a hyperslab
of the shards it touches with h5py, as stored. :func:`lazy_store` assembles the store from
them, as raw variables that ``xarray.decode_cf`` decodes lazily (CF-packed int16 included);
:func:`attngeom.store.io.reader.open_store` lets xarray chunk that Dataset with dask (one chunk
per shard and layer), and the analyses' block reads (:mod:`.blockread`) index the same lazy
variables without dask.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import xarray as xr
from xarray.backends import BackendArray
from xarray.core import indexing

from ..format import schema as S

# No HDF5 chunk cache, here and in the checks' handles: every read takes whole stored chunks
# once per layer. HDF5 2.0's default, 8 MiB per open dataset, kept each shard's last chunks of
# every variable: it grew by ~0.4 GiB per layer at 2,000 sequences and scaled with the number
# of shards (20 shards x ~20 variables x 8 MiB).
CHUNK_CACHE_BYTES = 0
# HDF5 serialises its calls; one lock per process keeps h5py's file opens and reads in order
# when dask reads chunks from several threads
HDF5_LOCK = threading.Lock()


class ShardsArray(BackendArray):
    """Variable ``name`` of every shard in ``shards`` ((file, first, stop) positions along
    ``sequence``, the first axis), read lazily as stored."""

    def __init__(self, shards: tuple[tuple[str, int, int], ...], name: str,
                 shape: tuple[int, ...], dtype: np.dtype):
        self.shards, self.name = shards, name
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)

    def __getitem__(self, key: indexing.ExplicitIndexer) -> np.ndarray:
        return indexing.explicit_indexing_adapter(key, self.shape,
                                                  indexing.IndexingSupport.BASIC, self._read)

    def __dask_tokenize__(self):
        return (type(self).__name__, self.shards, self.name, self.shape, self.dtype.str)

    def _read(self, key: tuple) -> np.ndarray:
        """The hyperslab ``key`` (ints and slices) of the concatenated variable."""
        first, rest = key[0], key[1:]
        drop = isinstance(first, (int, np.integer))
        start, stop, step = (slice(first, first + 1) if drop else first).indices(self.shape[0])
        pieces = []
        for path, lo, hi in self.shards:
            a, b = max(start, lo), min(stop, hi)
            if a >= b:
                continue
            a += (start - a) % step                 # the first position the step hits here
            if a < b:
                pieces.append(self._slab(path, (slice(a - lo, b - lo, step),) + rest))
        if not pieces:
            empty = np.empty((0,) + self.shape[1:], self.dtype)
            return empty[(slice(None),) + rest]
        out = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
        return out[0] if drop else out

    def _slab(self, path: str, key: tuple) -> np.ndarray:
        import h5py

        with HDF5_LOCK, h5py.File(path, "r", rdcc_nbytes=CHUNK_CACHE_BYTES) as f:
            var = f[self.name]
            if self.dtype.kind == "U":                   # stored as variable-length strings
                return np.asarray(var.asstr()[key], dtype=self.dtype)
            return np.asarray(var[key])


def lazy_store(files: list[Path], sizes: list[int], strings: dict[str, np.dtype] | None = None
               ) -> xr.Dataset:
    """The store's shards as one raw (undecoded) Dataset: the first shard's variables, dims,
    attributes and encodings, the variables along ``sequence`` as :class:`ShardsArray` over
    every file (the ``sequence`` coordinate read whole). ``strings``: the widest unicode dtype
    of each string variable over the shards (default: the first shard's)."""
    starts = np.concatenate([[0], np.cumsum(sizes)])
    shards = tuple((str(Path(f).resolve()), int(a), int(b))   # a later chdir is harmless
                   for f, a, b in zip(files, starts, starts[1:]))
    total = int(starts[-1])
    with xr.open_dataset(files[0], engine="h5netcdf", decode_cf=False,
                         driver_kwds={"rdcc_nbytes": CHUNK_CACHE_BYTES}) as first:
        variables = {}
        for name, var in first.variables.items():
            if S.SEQUENCE not in var.dims or name == S.SEQUENCE:
                continue
            shape = (total,) + var.shape[1:]
            dtype = (strings or {}).get(name, var.dtype)
            data = indexing.LazilyIndexedArray(ShardsArray(shards, name, shape, dtype))
            encoding = {**var.encoding, "original_shape": shape}
            variables[name] = xr.Variable(var.dims, data, dict(var.attrs), encoding)
        fixed = {n: v.load() for n, v in first.variables.items() if S.SEQUENCE not in v.dims}
        sequence = first.variables[S.SEQUENCE]
        attrs = dict(first.attrs)
    positions = np.concatenate([_sequence_labels(f) for f in files]) if len(files) > 1 \
        else sequence.values
    variables[S.SEQUENCE] = xr.Variable((S.SEQUENCE,), positions, dict(sequence.attrs),
                                        dict(sequence.encoding))
    return xr.Dataset({**fixed, **variables}, attrs=attrs)


def _sequence_labels(path: Path) -> np.ndarray:
    import h5py

    with HDF5_LOCK, h5py.File(path, "r", rdcc_nbytes=CHUNK_CACHE_BYTES) as f:
        return np.asarray(f[S.SEQUENCE][()])
