"""store.shards.netcdf_bytes writes the very bytes xarray's to_netcdf writes (in memory); for
dask-backed data a file that decodes to the same dataset with the same encoding."""

from __future__ import annotations

import io

import numpy as np
import pytest
import xarray as xr

from attngeom.store.format.shards import netcdf_bytes


def _dataset() -> xr.Dataset:
    rng = np.random.default_rng(0)
    return xr.Dataset(
        {"alpha": (("sequence", "query"), rng.random((4, 8), dtype=np.float32),
                   {"description": "attention"}),
         "text_index": (("sequence",), np.arange(4, dtype=np.int32)),
         "token": (("sequence",), np.array(["a", "bc", "", "d"], dtype=object))},
        coords={"sequence": np.arange(4)}, attrs={"store": "x", "n": 3})


ENCODING = {"alpha": {"zlib": True, "complevel": 1, "shuffle": True, "chunksizes": (2, 8),
                      "fletcher32": True, "_FillValue": np.float32(np.nan)}}


@pytest.mark.parametrize("chunked", [False, True])
def test_netcdf_bytes_equal_to_netcdf(chunked):
    ds = _dataset()
    if not chunked:
        want = bytes(ds.to_netcdf(None, engine="h5netcdf", encoding=ENCODING))
        assert bytes(netcdf_bytes(ds, ENCODING)) == want
        return
    ds = ds.chunk({"sequence": 2})                       # dask-backed: written on sync
    # the bytes of dask-backed data with an object-dtype variable differ from call to call (seen
    # here, and in a CI run against to_netcdf), so the file is compared decoded
    with xr.open_dataset(io.BytesIO(bytes(netcdf_bytes(ds, ENCODING))), engine="h5netcdf") as back:
        xr.testing.assert_identical(back.load(), ds.compute())
        enc = back["alpha"].encoding
        assert (enc["chunksizes"], enc["zlib"], enc["shuffle"], enc["fletcher32"]) == \
            ((2, 8), True, True, True)
