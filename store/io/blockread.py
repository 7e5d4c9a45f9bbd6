"""Block reads without dask, for the analyses' one pass: the store's lazy variables indexed directly.

``ds.attngeom.load_block`` reads one layer and a run of sequences. Through dask that costs
about twice the decompression itself at 2,000 sequences (a graph per block over every shard);
for a store opened by :func:`attngeom.store.io.reader.open_store` the block is read from the
same lazily indexed, lazily decoded variables the dask chunks read
(:mod:`attngeom.store.io.lazy`), with no graph, and the contributions derived on read formed
from their parts by :func:`attngeom.store.format.derive.derive_pair`: the same bits as the dask
path (tested). Read so is only what is certain to be the same (:meth:`DirectReads.readable`):
a variable that still holds the dask array ``open_store`` made (not replaced, subset or
recomputed since), under a local dask scheduler (a dask.distributed cluster reads on its
workers). Everything else goes through dask.
"""

from __future__ import annotations

from dataclasses import dataclass

import xarray as xr

from ..format import derive
from ..format import schema as S

ENCODING_KEY = "attngeom_direct_reads"   # ds.encoding entry set by open_store


def local_scheduler() -> bool:
    """Whether dask computes in this process (not on a dask.distributed cluster)."""
    import dask.base

    get = dask.base.get_scheduler()
    return type(getattr(get, "__self__", None)).__name__ != "Client"


@dataclass(frozen=True)
class DirectReads:
    """The store's lazy variables (not dask), and which ones the opened Dataset still holds."""

    lazy: dict  # variable -> its lazily indexed, lazily decoded xarray.Variable
    tokens: dict  # variable -> the name of the dask array open_store made for it

    @classmethod
    def record(cls, ds: xr.Dataset, lazy: xr.Dataset) -> "DirectReads":
        """The variables of ``lazy`` that ``ds`` (``lazy`` chunked by dask) holds along
        ``sequence``, recorded before any variable is derived or broadcast."""
        tokens = {n: v.data.name for n, v in ds.data_vars.items()
                  if S.SEQUENCE in v.dims and hasattr(v.data, "dask")}
        return cls({n: lazy.variables[n] for n in tokens}, tokens)

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
        out = {}
        for n in stored:
            var = self.lazy[n]
            where = {d: i for d, i in ((S.SEQUENCE, sequences), (S.LAYER, layer))
                     if d in var.dims}
            out[n] = var.isel(where).load()
        for name in names:
            if name not in out:
                out[name] = derive.derive_pair(name, out.__getitem__, ds.sizes[S.QUERY])
        return {n: out[n] for n in names}

    def _parts(self, name: str) -> tuple[str, ...]:
        if name in self.tokens:
            return (name,)
        base, prefix = derive.split(name)
        return derive.DERIVED[base].parts(prefix)
