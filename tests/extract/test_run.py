"""The extraction run (attngeom.extract.run.extract): resume, refusal of other settings.

A tiny llama saved to a directory, 3 texts in a JSONL, shards of 2 sequences (2 shard files).
Numbers of finished stores against the reference are in tests/store/test_roundtrip.py; here a
resumed store must equal, bit for bit, the store of an uninterrupted run.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import zlib
from pathlib import Path

import h5py
import numpy as np
import pytest

import attngeom.store
import tiny_models as tm
from attngeom.extract import run as run_module
from attngeom.extract.run import ExtractConfig, extract
from attngeom.store.errors import StoreError
from attngeom.store.format.shards import shard_name
from attngeom.store.io.validate import validate
from store_helpers import write_texts

N_WORDS = (3, 12, 6)
OPTIONS = dict(mode="compact", sink_k=1, tail_w=3, max_length=10, shard_size=2, batch_size=2)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    base = tmp_path_factory.mktemp("run")
    model = tm.save_tiny("llama", base / "model")
    data = write_texts(base / "texts.jsonl", N_WORDS)
    clean = base / "clean"
    extract(str(model), str(data), clean, ExtractConfig(**OPTIONS), progress=False)
    return model, data, clean


def _run(model, data, out, **changes):
    return extract(str(model), str(data), out, ExtractConfig(**{**OPTIONS, **changes}),
                   progress=False)


def _manifest(store: Path) -> dict:
    return json.loads((store / "manifest.json").read_text())


def _shard_contents(store: Path) -> dict[str, dict[str, np.ndarray]]:
    """Every dataset of every shard file, read with h5py (fast, and independent of xarray)."""
    out = {}
    for path in sorted((store / "shards").glob("*.nc")):
        with h5py.File(path, "r") as f:
            out[path.name] = {name: f[name][()] for name in f.keys()}
            out[path.name]["attrs"] = {k: f.attrs[k] for k in f.attrs if k != "_NCProperties"}
    return out


def _assert_same_store(a: Path, b: Path) -> None:
    """Same shard files holding the same values (NaN in the same cells) and attributes."""
    ca, cb = _shard_contents(a), _shard_contents(b)
    assert list(ca) == list(cb)
    for shard in ca:
        assert set(ca[shard]) == set(cb[shard]), shard
        for name, x in ca[shard].items():
            if name == "attrs":
                assert {k: str(v) for k, v in x.items()} == \
                    {k: str(v) for k, v in cb[shard][name].items()}
            else:
                np.testing.assert_array_equal(x, cb[shard][name], err_msg=f"{shard}:{name}")
    assert _manifest(a)["config_hash"] == _manifest(b)["config_hash"]


def _count_writes(monkeypatch, fail_after: int | None = None) -> list[str]:
    written: list[str] = []
    import attngeom.store.io.writer as writer_module

    real = writer_module.write_shard

    def write(ds, path, encoded=None):
        if fail_after is not None and len(written) >= fail_after:
            raise RuntimeError("simulated crash while writing a shard")
        real(ds, path, encoded)
        written.append(Path(path).name)

    real_stream = writer_module.StoreWriter.streamed_shard

    @contextlib.contextmanager
    def stream(self, ds, index, layout, *args, **kwargs):    # shards written layer by layer
        if fail_after is not None and len(written) >= fail_after:
            raise RuntimeError("simulated crash while writing a shard")
        with real_stream(self, ds, index, layout, *args, **kwargs) as shard:
            yield shard
        written.append(Path(shard_name(index)).name)

    monkeypatch.setattr(writer_module, "write_shard", write)
    monkeypatch.setattr(writer_module.StoreWriter, "streamed_shard", stream)
    return written


def test_clean_run_layout(inputs):
    _, _, clean = inputs
    m = _manifest(clean)
    assert m["complete"] and m["n_sequences"] == 3
    assert [e["sequences"] for e in m["shards"]] == [[0, 2], [2, 3]]
    assert sorted(p.name for p in (clean / "shards").iterdir()) == [
        "shard-00000.nc", "shard-00001.nc"]
    assert validate(clean) == []


def test_rerun_of_complete_store_writes_nothing(inputs, tmp_path, monkeypatch):
    model, data, clean = inputs
    store = Path(shutil.copytree(clean, tmp_path / "store"))
    written = _count_writes(monkeypatch)
    _run(model, data, store)
    assert written == []
    _assert_same_store(store, clean)


def test_resume_after_lost_last_shard(inputs, tmp_path, monkeypatch):
    model, data, clean = inputs
    store = Path(shutil.copytree(clean, tmp_path / "store"))
    (store / "shards" / "shard-00001.nc").unlink()
    m = _manifest(store)
    m["complete"] = False
    (store / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(StoreError, match="incomplete"):
        attngeom.store.open(store)
    written = _count_writes(monkeypatch)
    _run(model, data, store)
    assert written == ["shard-00001.nc"]                 # finished shards are kept
    assert _manifest(store)["complete"] and validate(store) == []
    _assert_same_store(store, clean)


def test_resume_after_crash(inputs, tmp_path, monkeypatch):
    model, data, clean = inputs
    store = tmp_path / "store"
    written = _count_writes(monkeypatch, fail_after=1)
    with pytest.raises(RuntimeError, match="simulated crash"):
        _run(model, data, store)
    assert written == ["shard-00000.nc"]
    m = _manifest(store)
    assert not m["complete"] and [e["sequences"] for e in m["shards"]] == [[0, 2]]
    assert any("incomplete" in p for p in validate(store))
    with pytest.raises(StoreError, match="incomplete"):
        attngeom.store.open(store)
    assert attngeom.store.open(store, partial=True).sizes["sequence"] == 2
    leftover = store / "shards" / ".shard-00001.nc.tmp-99999"   # a write cut short
    leftover.write_bytes(b"half a file")
    monkeypatch.undo()
    written = _count_writes(monkeypatch)
    _run(model, data, store)
    assert written == ["shard-00001.nc"]
    assert not leftover.exists()
    assert validate(store) == []
    _assert_same_store(store, clean)


def test_resume_replaces_a_damaged_shard(inputs, tmp_path, monkeypatch):
    model, data, clean = inputs
    store = Path(shutil.copytree(clean, tmp_path / "store"))
    shard = store / "shards" / "shard-00000.nc"
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    shard.write_bytes(bytes(raw))
    m = _manifest(store)
    m["complete"] = False
    (store / "manifest.json").write_text(json.dumps(m))
    written = _count_writes(monkeypatch)
    _run(model, data, store)
    assert written == ["shard-00000.nc"]
    assert validate(store) == []
    _assert_same_store(store, clean)


@pytest.mark.parametrize("change, needle", [
    ({"tail_w": 4}, "tail_w"),
    ({"mode": "dense"}, "mode"),
    ({"sink_k": 2}, "sink_k"),
    ({"max_length": 12}, "max_length"),
])
def test_other_options_refused(inputs, tmp_path, change, needle):
    model, data, clean = inputs
    store = Path(shutil.copytree(clean, tmp_path / "store"))
    before = {p.name: p.read_bytes() for p in (store / "shards").iterdir()}
    with pytest.raises(StoreError) as info:
        _run(model, data, store, **change)
    message = str(info.value)
    assert "\n" not in message and needle in message and "other settings" in message
    assert {p.name: p.read_bytes() for p in (store / "shards").iterdir()} == before


def test_other_data_or_model_refused(inputs, tmp_path):
    model, data, clean = inputs
    store = Path(shutil.copytree(clean, tmp_path / "store"))
    other = write_texts(tmp_path / "texts.jsonl", N_WORDS, seed=1)
    with pytest.raises(StoreError, match="sha256"):
        _run(model, other, store)
    other_model = tm.save_tiny("llama", tmp_path / "model", seed=1)
    with pytest.raises(StoreError, match="weight_fingerprint"):
        _run(other_model, data, store)


def test_not_a_store_refused(inputs, tmp_path):
    model, data, _ = inputs
    out = tmp_path / "busy"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(StoreError, match="not an attngeom store"):
        _run(model, data, out)
    assert (out / "notes.txt").read_text() == "mine"


def test_bad_options_refused(inputs, tmp_path):
    model, data, _ = inputs
    for change, needle in (({"mode": "sparse"}, "--mode"), ({"sink_k": 0}, "--sink-k"),
                           ({"tail_w": 0}, "--tail-w"), ({"max_length": 0}, "--max-length")):
        with pytest.raises(ValueError, match=needle):
            _run(model, data, tmp_path / "out", **change)
    assert not (tmp_path / "out").exists()
    np.testing.assert_equal(len(list(tmp_path.iterdir())), 0)


@pytest.mark.parametrize("device, cores, threads, expected", [
    ("cpu", 2, 1, (1, 2)),          # one core left free: compress while measuring
    ("cpu", 2, 2, (0, 2)),          # torch uses every core: only after the last batch
    ("cpu", 16, 4, (4, 8)),
    ("cuda", 16, 16, (4, 8)),       # a GPU measures: the CPU is free
    ("cuda", 1, 1, (1, 1)),
])
def test_encode_workers_leave_torchs_cores_alone(monkeypatch, device, cores, threads, expected):
    import torch

    monkeypatch.setattr(run_module.os, "sched_getaffinity", lambda pid: set(range(cores)),
                        raising=False)
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    assert run_module.encode_workers(device) == expected


def test_shard_written_from_encoded_chunks_equals_hdf5s_own(inputs, tmp_path):
    """The store's shards hold what HDF5's own filters give for the same arrays: the same
    shuffled bytes in each chunk's deflate stream (ISA-L's stream differs from zlib's in its
    bytes, not in what it inflates to) and a Fletcher-32 checksum HDF5 verifies on read."""
    _, _, clean = inputs
    from attngeom.store.format.chunks import fletcher32
    from attngeom.store.format.shards import encoding
    from attngeom.store.io.writer import write_netcdf

    path = sorted((clean / "shards").glob("*.nc"))[0]
    import xarray as xr

    with xr.open_dataset(path, engine="h5netcdf") as ds:
        ds = ds.load()
    for var in ds.variables.values():
        var.encoding = {}
    with h5py.File(path) as f:
        rows = f["tail_alpha"].chunks[0]
    write_netcdf(ds, tmp_path / "again.nc", encoding(ds, rows=rows))
    with h5py.File(path) as f, h5py.File(tmp_path / "again.nc") as g:
        for name in ("alpha", "tail_alpha", "value_norm", "layer_output_norm"):
            a, b = f[name], g[name]
            assert a.chunks == b.chunks and a.fletcher32 and a.compression == "gzip"
            for i in range(a.id.get_num_chunks()):
                offset = a.id.get_chunk_info(i).chunk_offset
                mine, theirs = a.id.read_direct_chunk(offset)[1], b.id.read_direct_chunk(
                    offset)[1]
                assert zlib.decompress(mine[:-4]) == zlib.decompress(theirs[:-4]), name
                assert mine[-4:] == fletcher32(mine[:-4]).to_bytes(4, "little"), name
            np.testing.assert_array_equal(a[()], b[()], err_msg=name)      # HDF5 reads both
