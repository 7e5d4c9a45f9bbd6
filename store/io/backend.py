"""The xarray engine ``attngeom``: ``xr.open_dataset(store_dir, engine="attngeom")``.

Registered as an ``xarray.backends`` entry point (pyproject.toml), so that a store opens with
plain xarray once attngeom is installed; it returns what :func:`attngeom.store.open` returns
(same variables, values, coordinates and attributes; the contributions derived on read). Like
``attngeom.store.open`` it executes nothing from the store: the manifest is JSON, shards are
HDF5 read by h5netcdf.

xarray wraps the dask arrays an engine returns in its lazy-indexing classes (pydata/xarray
issue 8810), so ``ds.chunks`` is empty here while ``DataArray.data`` is still the same dask
array; each variable's ``encoding["preferred_chunks"]`` gives dask's chunks (what
``chunks={}`` uses), and ``attngeom.store.open`` shows them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable

import xarray as xr
from xarray.backends import BackendEntrypoint

from ..format.manifest import MANIFEST, MAX_MANIFEST_BYTES
from ..format.schema import FORMAT_NAME


def is_store(path) -> bool:
    """True for a directory holding an attngeom ``manifest.json`` (read as JSON, nothing run)."""
    try:
        manifest = Path(os.fspath(path)) / MANIFEST
        if not manifest.is_file() or manifest.stat().st_size > MAX_MANIFEST_BYTES:
            return False
        data = json.loads(manifest.read_text(encoding="utf-8"))
    except (TypeError, ValueError, OSError):
        return False
    return isinstance(data, dict) and data.get("format") == FORMAT_NAME


class AttngeomBackendEntrypoint(BackendEntrypoint):
    """Open an attngeom store directory as one lazily loaded Dataset."""

    description = "attngeom activation stores (a directory: manifest.json + netCDF shards)"
    url = "docs/guide/store.md"
    open_dataset_parameters = ("filename_or_obj", "drop_variables", "partial", "derived")

    def open_dataset(self, filename_or_obj, *, drop_variables: str | Iterable[str] | None = None,
                     partial: bool = False, derived: bool = True) -> xr.Dataset:
        """``partial``: read the finished shards of an incomplete store; ``derived``: add the
        contributions computed on read (as :func:`attngeom.store.open`)."""
        from .reader import open_store

        ds = open_store(os.fspath(filename_or_obj), partial=partial, derived=derived)
        for var in ds.variables.values():        # xarray hides dask's chunks (see above)
            if var.chunks:
                var.encoding["preferred_chunks"] = {d: c[0] for d, c in var.chunksizes.items()}
        if drop_variables is not None:
            names = [drop_variables] if isinstance(drop_variables, str) else drop_variables
            ds = ds.drop_vars(list(names), errors="ignore")
        return ds

    def guess_can_open(self, filename_or_obj) -> bool:
        if not isinstance(filename_or_obj, (str, os.PathLike)):
            return False
        return is_store(filename_or_obj)
