"""The xarray engine: xr.open_dataset(store, engine="attngeom") is attngeom.store.open."""

from __future__ import annotations

import builtins
import io
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from attngeom.store import StoreError
from attngeom.store import open as open_store
from attngeom.store.io.backend import AttngeomBackendEntrypoint


def test_engine_is_registered_by_the_entry_point():
    assert "attngeom" in xr.backends.list_engines()
    assert isinstance(xr.backends.list_engines()["attngeom"], AttngeomBackendEntrypoint)


@pytest.mark.parametrize("kind", [("llama", "dense"), ("llama", "compact")])
def test_open_dataset_gives_what_attngeom_store_open_gives(stores, kind):
    path = stores[kind]
    ref = open_store(path)
    for ds in (xr.open_dataset(path, engine="attngeom"), xr.open_dataset(str(path))):
        assert set(ds.variables) == set(ref.variables)
        assert {"contribution", "contribution_layer"} <= set(ds.data_vars)
        assert ds.attrs == ref.attrs and dict(ds.sizes) == dict(ref.sizes)
        for name in ref.variables:                 # the same lazy dask graph, the same values
            if ref[name].chunks:
                assert ds[name].data.name == ref[name].data.name
        xr.testing.assert_identical(ds.load(), ref.load())
    bare = xr.open_dataset(path, engine="attngeom", derived=False,
                           drop_variables=["cosine_layer"])
    assert "contribution" not in bare and "cosine_layer" not in bare and "alpha" in bare


def test_analysis_of_an_engine_opened_store_is_the_same(stores):
    """xarray hides the engine's dask chunks; the block plan reads them from the encoding."""
    from attngeom.analysis import decomposition, sinks

    path = stores["llama", "compact"]
    ref, ds = open_store(path), xr.open_dataset(path, engine="attngeom")
    assert ds["alpha"].encoding["preferred_chunks"]["sequence"] == 3
    for fn in (sinks, decomposition):
        xr.testing.assert_identical(fn(ds, block_elements=1), fn(ref, block_elements=1))


def test_guess_can_open(stores, tmp_path):
    engine = AttngeomBackendEntrypoint()
    store = stores["llama", "compact"]
    assert engine.guess_can_open(store) and engine.guess_can_open(str(store))
    assert not engine.guess_can_open(store / "manifest.json")
    assert not engine.guess_can_open(tmp_path) and not engine.guess_can_open(12)
    (tmp_path / "manifest.json").write_text(json.dumps({"format": "something-else"}))
    assert not engine.guess_can_open(tmp_path)
    (tmp_path / "manifest.json").write_text("{not json")
    assert not engine.guess_can_open(tmp_path)


def test_incomplete_store_is_refused(copy_store):
    path = copy_store("llama", "compact")
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["complete"] = False
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(StoreError, match="incomplete store"):
        xr.open_dataset(path, engine="attngeom")
    assert xr.open_dataset(path, engine="attngeom", partial=True).sizes["sequence"] == 5


def test_opening_unpickles_and_runs_nothing(copy_store, monkeypatch, tmp_path):
    """Opening and reading a store reads its JSON manifest and HDF5 shards only: no file of
    the store is unpickled or opened by Python (a pickle bomb and a Python file placed in it
    stay untouched), no subprocess is started. (dask pickles its own task graph in memory to
    name it; that is allowed.)"""
    path = copy_store("llama", "dense")
    marker = tmp_path / "ran"

    class Bomb:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    bomb = pickle.dumps(Bomb())
    (path / "shards" / "extra.pkl").write_bytes(bomb)
    (path / "__init__.py").write_text(f"open({str(marker)!r}, 'w')\n")
    opened, real_open, real_loads = [], builtins.open, pickle.loads

    def spy_open(file, *args, **kwargs):
        opened.append(str(file))
        return real_open(file, *args, **kwargs)

    def loads(data, *args, **kwargs):
        assert bytes(data) != bomb, "a file of the store was unpickled"
        return real_loads(data, *args, **kwargs)

    def refuse(*args, **kwargs):
        raise AssertionError("file unpickling or a subprocess while opening a store")

    monkeypatch.setattr(builtins, "open", spy_open)
    monkeypatch.setattr(io, "open", spy_open)           # pathlib opens files through io.open
    monkeypatch.setattr(pickle, "loads", loads)
    for module, name in ((pickle, "load"), (pickle, "Unpickler"), (subprocess, "Popen"),
                         (os, "system")):
        monkeypatch.setattr(module, name, refuse)
    ds = xr.open_dataset(path, engine="attngeom").load()
    assert np.isfinite(ds["contribution"].values).any()
    assert not marker.exists()
    inside = {Path(f).resolve().relative_to(path.resolve()).as_posix() for f in opened
              if Path(f).resolve().is_relative_to(path.resolve())}
    assert inside == {"manifest.json"}, inside         # shards: HDF5, read by h5py in C


def test_opening_imports_no_torch(stores):
    code = ("import sys, xarray as xr; ds = xr.open_dataset(sys.argv[1], engine='attngeom'); "
            "ds['alpha'].values; assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code, str(stores["llama", "compact"])], check=True)
