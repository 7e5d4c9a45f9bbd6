"""Block reads without dask (store/io/blockread.py) against the dask path: the same bits.

The session's compact stores (tests/store/conftest.py: 2 shards of 3 and 2 sequences) are read
block by block both ways; a block that straddles the two shards is among them. Variables that
no longer hold what ``open_store`` made, and a distributed scheduler, go through dask.
"""

from __future__ import annotations

import numpy as np
import pytest

from attngeom.store import open as open_store
from attngeom.store.io.blockread import ENCODING_KEY

COMPACT = [("llama", "compact"), ("bert", "compact")]


def _names(ds) -> list[str]:
    return [n for n, v in ds.data_vars.items() if "sequence" in v.dims]


def _through_dask(ds, names, **where):
    reads = ds.encoding.pop(ENCODING_KEY)
    ds.attngeom._mask_cache.clear()
    try:
        return ds.attngeom.load_block(names, **where)
    finally:
        ds.encoding[ENCODING_KEY] = reads
        ds.attngeom._mask_cache.clear()


@pytest.mark.parametrize("kind", COMPACT)
def test_direct_block_is_the_dask_block(stores, kind):
    ds = open_store(stores[kind])
    names = _names(ds)
    reads = ds.encoding[ENCODING_KEY]
    assert ds["alpha"].data.numblocks[:2] == (2, ds.sizes["layer"])     # a chunk per shard, layer
    assert all(reads.readable(ds, n) for n in names)         # numbers, strings, derived too
    assert "contribution" not in reads.tokens and reads.readable(ds, "tail_contribution")
    for layer in ds["layer"].values:
        for seqs in (slice(0, 5), slice(1, 3), slice(2, 4), slice(3, 5), None):
            ds.attngeom._mask_cache.clear()
            got = ds.attngeom.load_block(names, layer=layer, sequences=seqs)
            want = _through_dask(ds, names, layer=layer, sequences=seqs)
            assert got.identical(want), (layer, seqs)
            assert got["alpha"].dtype == np.float64


def test_changed_variables_and_subsets_are_read_through_dask(stores):
    ds = open_store(stores["llama", "compact"])
    reads = ds.encoding[ENCODING_KEY]
    ds["alpha"] = ds["alpha"] * 2
    assert not reads.readable(ds, "alpha") and not reads.readable(ds, "contribution")
    assert reads.readable(ds, "tail_alpha")
    block = ds.attngeom.load_block(["alpha", "contribution"], layer=1, sequences=slice(1, 4))
    np.testing.assert_array_equal(
        block["alpha"].values, ds["alpha"].isel(sequence=slice(1, 4), layer=1).values)
    np.testing.assert_array_equal(
        block["contribution"].values,
        ds["contribution"].isel(sequence=slice(1, 4), layer=1).values)
    part = open_store(stores["llama", "compact"]).isel(sequence=slice(2, None))
    got = part.attngeom.load_block(["tail_alpha"], layer=0, sequences=slice(0, 2))
    np.testing.assert_array_equal(got["tail_alpha"].values,
                                  part["tail_alpha"].isel(sequence=slice(0, 2), layer=0).values)


def test_a_distributed_scheduler_reads_through_dask(stores, monkeypatch):
    import dask.base

    class Client:                                     # stands for distributed.Client
        def get(self, *args, **kwargs):
            return dask.get(*args, **kwargs)

    ds = open_store(stores["llama", "compact"])
    monkeypatch.setattr(dask.base, "get_scheduler", lambda *a, **k: Client().get)
    assert ds.attngeom._direct_reads(["alpha"], 0, slice(0, 2)) == {}


def test_the_store_keeps_no_chunk_cache(stores, monkeypatch):
    """HDF5 2.0 keeps 8 MiB of decompressed chunks per open dataset by default: per shard and
    variable, which at 2,000 sequences grew the analysis by ~0.4 GiB a layer. Every handle
    the store's reads open (dask's chunks and the direct blocks) asks for none."""
    import h5py

    real, opened = h5py.File, []

    def File(*args, **kwargs):                                 # noqa: N802 - h5py's name
        f = real(*args, **kwargs)
        opened.append(f.id.get_access_plist().get_cache()[2])     # rdcc_nbytes
        return f
    ds = open_store(stores[("llama", "compact")])
    monkeypatch.setattr(h5py, "File", File)
    ds["alpha"].isel(sequence=0).values
    ds.attngeom.load_block(["alpha"], layer=ds["layer"].values[0], sequences=slice(0, 5))
    assert opened and set(opened) == {0}
