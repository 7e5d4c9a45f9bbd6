"""store import: a --format hf export becomes the store it was made from.

Stores: copies of the session llama stores (tests/store/conftest.py: dense and compact, two
shards each) with a faithfulness result added, and a packed compact store. Each is exported,
imported and compared with the source shard file by shard file, read raw (packed variables
as their int16 codes), so "equal" means the stored bits; analyses of the two stores are
compared variable by variable. Damaged and incomplete exports are refused in one line.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import xarray as xr

from attngeom.cli import main
from attngeom.store import import_export
from attngeom.store.format.manifest import read_manifest



def _faithfulness(model, texts, store, max_length: int) -> None:
    from attngeom.extract.faithfulness.experiment import FaithConfig, faithfulness

    cfg = FaithConfig(metrics=("attention", "contribution"), ranks=("signed",),
                      fractions=(0.2, 0.5), max_length=max_length, block_size=5, batch_size=5)
    faithfulness(str(model), str(texts), store, cfg, progress=False, log=lambda m: None)


@pytest.fixture(scope="module")
def sources(stores, model_dirs, texts_file, tmp_path_factory):
    """name -> source store: dense and compact with a faithfulness result, packed compact."""
    from attngeom.extract.run import ExtractConfig, extract

    root = tmp_path_factory.mktemp("import")
    opts = read_manifest(stores["llama", "compact"])["config"]["options"]
    out = {}
    for mode in ("dense", "compact"):
        out[mode] = root / mode
        shutil.copytree(stores["llama", mode], out[mode])
        _faithfulness(model_dirs["llama"], texts_file, out[mode], opts["max_length"])
    out["packed"] = root / "packed"
    extract(str(model_dirs["llama"]), str(texts_file), out["packed"], ExtractConfig(
        mode="compact", sink_k=opts["sink_k"], tail_w=opts["tail_w"],
        max_length=opts["max_length"], shard_size=3, precision="packed"), progress=False)
    return out


def _export(store, out, *extra) -> None:
    assert main(["store", "export", str(store), "--format", "hf", "--out", str(out),
                 *extra]) == 0


def _raw(path) -> xr.Dataset:
    with xr.open_dataset(path, engine="h5netcdf", mask_and_scale=False) as f:
        return f.load()


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal dtype and values; floats bit for bit wherever they are not NaN."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.kind != "f":
        return np.array_equal(a, b)
    nan = np.isnan(a)
    return np.array_equal(nan, np.isnan(b)) and np.array_equal(
        a[~nan].view(np.uint32), b[~nan].view(np.uint32))


@pytest.mark.parametrize("name", ["dense", "compact", "packed"])
def test_round_trip_gives_the_source_store(sources, tmp_path, name, capsys):
    src = sources[name]
    _export(src, tmp_path / "hf")
    assert "attngeom store import" in (tmp_path / "hf" / "README.md").read_text()
    assert main(["store", "import", str(tmp_path / "hf"), "--out", str(tmp_path / "back")]) == 0
    assert "(the source's)" in capsys.readouterr().out
    assert main(["store", "validate", str(tmp_path / "back")]) == 0
    a, b = read_manifest(src), read_manifest(tmp_path / "back")
    assert b["config"] == a["config"] and b["config_hash"] == a["config_hash"]
    assert [e["sequences"] for e in b["shards"]] == [e["sequences"] for e in a["shards"]]
    for ea, eb in zip(a["shards"], b["shards"]):
        x, y = _raw(src / ea["file"]), _raw(tmp_path / "back" / eb["file"])
        assert set(x.variables) == set(y.variables)
        for v in x.variables:
            assert _same_bits(x[v].values, y[v].values) or (
                x[v].dtype.kind in "OU" and (x[v].values == y[v].values).all()), v
        assert x.attrs == y.attrs
    for result, entry in (a.get("faithfulness") or {}).items():      # the file itself
        assert b["faithfulness"][result]["sha256"] == entry["sha256"]
    if name == "packed":
        assert (x["alpha"].dtype, y["alpha"].dtype) == (np.int16, np.int16)


def test_analyses_of_the_imported_store_equal_the_source_s(sources, tmp_path):
    src = sources["compact"]
    _export(src, tmp_path / "hf")
    import_export(tmp_path / "hf", tmp_path / "back")
    for store in (src, tmp_path / "back"):
        assert main(["analyze", str(store), "--out", str(store / "analysis"), "--no-progress",
                     "--bootstrap", "20", "--order-resamples", "99"]) == 0
    files = sorted(p.name for p in (src / "analysis").glob("*.nc"))
    assert {"sinks.nc", "convexity.nc"} <= set(files)
    assert any(f.startswith("faithfulness_stats") for f in files)
    for file in files:
        with xr.open_dataset(src / "analysis" / file, engine="h5netcdf") as x, \
                xr.open_dataset(tmp_path / "back" / "analysis" / file, engine="h5netcdf") as y:
            xr.testing.assert_equal(x.load(), y.load())


def test_no_text_export_imports_without_token_strings(sources, tmp_path, capsys):
    src = sources["dense"]
    _export(src, tmp_path / "hf", "--no-text")
    assert main(["store", "import", str(tmp_path / "hf"), "--out", str(tmp_path / "back")]) == 0
    assert "without token strings" in capsys.readouterr().out
    m = read_manifest(tmp_path / "back")
    assert m["config"]["options"]["store_text"] is False and m["imported"]["no_text"]
    assert m["config_hash"] != read_manifest(src)["config_hash"]
    y = _raw(tmp_path / "back" / m["shards"][0]["file"])
    x = _raw(src / read_manifest(src)["shards"][0]["file"])
    assert "token" in x and "token" not in y
    assert all(_same_bits(x[v].values, y[v].values) for v in y.data_vars)


def _refused(capsys, export, out, *words) -> None:
    assert main(["store", "import", str(export), "--out", str(out)]) != 0
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err, err
    assert all(w in err for w in words), err
    assert not out.exists()                                  # nothing half-written left


def test_damaged_and_partial_exports_are_refused(sources, tmp_path, capsys):
    src = sources["compact"]
    _export(src, tmp_path / "subset", "--tables", "per_query,sequences,tokens")
    _refused(capsys, tmp_path / "subset", tmp_path / "o1", "lacks table(s) pairs, per_key",
             "--tables")
    hf = tmp_path / "hf"
    _export(src, hf)
    table = sorted(hf.glob("data/pairs/*.parquet"))[1]
    good = table.read_bytes()
    table.write_bytes(good[:-40] + bytes(40))                  # its footer zeroed
    _refused(capsys, hf, tmp_path / "o2", "checksum mismatch", table.name)
    table.unlink()
    _refused(capsys, hf, tmp_path / "o3", "missing from the export")
    table.write_bytes(good)
    shutil.copy(table, table.with_name("train-00009-of-00009.parquet"))
    _refused(capsys, hf, tmp_path / "o4", "not part of the export")
    table.with_name("train-00009-of-00009.parquet").unlink()
    copy = hf / "manifest.source.json"
    manifest = json.loads(copy.read_text())
    manifest["config"]["options"]["tail_w"] += 1                # a quiet edit of the settings
    copy.write_text(json.dumps(manifest))
    _refused(capsys, hf, tmp_path / "o5", "does not match its config_hash")
    del manifest["export"]
    manifest["config"]["options"]["tail_w"] -= 1
    copy.write_text(json.dumps(manifest))
    _refused(capsys, hf, tmp_path / "o6", "no checksums", "export the store again")
    _refused(capsys, tmp_path / "nothing", tmp_path / "o7", "not an attngeom export")
