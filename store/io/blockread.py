"""Block reads straight from a store's shard files (h5py), for the analyses' one pass.

``ds.attngeom.load_block`` reads one layer and a run of sequences. Through xarray and dask that
costs about twice the decompression itself at 2,000 sequences (a graph per block over every
shard, h5netcdf's dimension lookups on every read). For a compact store opened by
:func:`attngeom.store.io.reader.open_store` the block is read here instead: each shard overlapping
the sequences opened with h5py, each variable's hyperslab read as stored, and the
contributions derived on read formed from their parts with the formulas of
:mod:`attngeom.store.format.derive` in float32, as on the lazy store: the same bits as the dask path
(tested). Read here is only what is certain to be the same (:meth:`DirectReads.readable`): a
variable that still holds the dask array ``open_store`` made (not replaced, subset or
recomputed since), stored without CF packing and with no fill value but NaN, under a local dask
scheduler (a dask.distributed cluster reads on its workers). Everything else goes through dask.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import xarray as xr

from ..format import derive
from ..format import schema as S

ENCODING_KEY = "attngeom_direct_reads"   # ds.encoding entry set by open_store
# No HDF5 chunk cache, here and in the store's own handles (store/io/reader.py): every read takes
# whole stored chunks once per layer. HDF5 2.0's default, 8 MiB per open dataset, kept each
# shard's last chunks of every variable: it grew by ~0.4 GiB per layer at 2,000 sequences and
# scaled with the number of shards (20 shards x ~20 variables x 8 MiB). HDF5 shares a file opened
# twice in one process, with the settings of the first open: the store's handle decides.
CHUNK_CACHE_BYTES = 0


def local_scheduler() -> bool:
    """Whether dask computes in this process (not on a dask.distributed cluster)."""
    import dask.base

    get = dask.base.get_scheduler()
    return type(getattr(get, "__self__", None)).__name__ != "Client"


def _plain(var: xr.Variable) -> bool:
    """Stored as decoded: numbers, no CF packing, no fill value but NaN, the same dtype."""
    enc = var.encoding
    if var.dtype.kind not in "fiub" or "scale_factor" in enc or "add_offset" in enc or "dtype" not in enc:
        return False
    fill = enc.get("_FillValue")
    if fill is not None and not (np.asarray(fill).dtype.kind == "f" and np.isnan(fill)):
        return False
    return np.dtype(enc["dtype"]) == var.dtype


@dataclass(frozen=True)
class DirectReads:
    """Where each sequence of a store lives, and the variables readable from the files."""

    shards: tuple[tuple[str, int, int], ...]  # (file, first, stop) positions along sequence
    tokens: dict  # variable -> the name of the dask array open_store made for it

    @classmethod
    def record(cls, ds: xr.Dataset, files: list, sizes: list[int]) -> "DirectReads":
        """The shard table of ``ds`` as ``open_mfdataset`` concatenated ``files`` (``sizes``
        sequences each), before any variable is derived or broadcast."""
        starts = np.concatenate([[0], np.cumsum(sizes)])
        shards = tuple((str(Path(f).resolve()), int(a), int(b))   # a later chdir is harmless
                       for f, a, b in zip(files, starts, starts[1:]))
        tokens = {n: v.data.name for n, v in ds.data_vars.items()
                  if S.SEQUENCE in v.dims and hasattr(v.data, "dask") and _plain(v.variable)}
        return cls(shards, tokens)

    def readable(self, ds: xr.Dataset, name: str) -> bool:
        """Whether ``name`` reads from the files as it would through dask."""
        if name in self.tokens:
            return getattr(ds.variables[name].data, "name", None) == self.tokens[name]
        if derive.split(name)[0] not in derive.DERIVED or name not in ds:
            return False
        return all(self.readable(ds, n) for n in self._parts(name))

    def read(self, ds: xr.Dataset, names: list[str], layer: int, sequences: slice
             ) -> dict[str, xr.Variable]:
        """``names`` (readable) at layer position ``layer`` and ``sequences`` (positions),
        each with its store dims less ``layer``."""
        stored = list(dict.fromkeys(n for name in names for n in self._parts(name)))
        out: dict[str, xr.Variable] = {}
        pieces: dict[str, list] = {n: [] for n in stored}
        import h5py

        for path, first, stop in self.shards:
            lo, hi = max(sequences.start, first), min(sequences.stop, stop)
            if lo >= hi:
                continue
            with h5py.File(path, "r", rdcc_nbytes=CHUNK_CACHE_BYTES) as f:
                for n in stored:
                    dims = ds.variables[n].dims
                    key = tuple(slice(lo - first, hi - first) if d == S.SEQUENCE
                                else layer if d == S.LAYER else slice(None) for d in dims)
                    pieces[n].append(f[n][key])
        for n in stored:
            dims = tuple(d for d in ds.variables[n].dims if d != S.LAYER)
            out[n] = xr.Variable(dims, np.concatenate(pieces[n]))
        for name in names:
            if name not in out:
                out[name] = derive.derive_pair(name, out.__getitem__, ds.sizes[S.QUERY])
        return {n: out[n] for n in names}

    def _parts(self, name: str) -> tuple[str, ...]:
        if name in self.tokens:
            return (name,)
        base, prefix = derive.split(name)
        return derive.DERIVED[base].parts(prefix)
