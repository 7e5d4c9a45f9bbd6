"""Holes found with bad inputs (issue 14): a shard of another shape, a shard that is a symbolic
link out of the store, and warnings when opening a store attngeom wrote.

Each test works on a private copy of the session's llama compact store (2 layers x 4 heads,
max_length 10, sink_k 2, tail_w 3; tests/store/conftest.py).
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest

import attngeom.store
from attngeom.cli import main
from attngeom.store.format.manifest import file_sha256
from attngeom.store.errors import StoreError
from attngeom.store.ops.merge import merge
from attngeom.store.format.shards import read_shard, write_shard
from attngeom.store.io.validate import validate

SHARD0 = "shards/shard-00000.nc"


def one_shard(store: Path) -> Path:
    """Keep only the first shard (sequences 0..2): a valid store of one shard file."""
    path = store / "manifest.json"
    m = json.loads(path.read_text())
    m["shards"] = m["shards"][:1]
    m["n_sequences"] = m["shards"][0]["sequences"][1]
    path.write_text(json.dumps(m))
    (store / "shards" / "shard-00001.nc").unlink()
    assert validate(store) == [] and attngeom.store.open(store).sizes["layer"] == 2
    return store


# what is cut out of the shard -> words the refusal must contain
CUTS = {
    "layers": ({"layer": [0]}, "1 layer label(s)"),
    "heads": ({"head": [0, 1, 2]}, "3 head label(s)"),
    "positions": ({"position": range(5), "query": range(5), "key": range(5)}, "5 "),
    "sink keys": ({"sink": [0]}, "1 sink label(s)"),
    "tail lags": ({"lag": [0, 1]}, "2 lag label(s)"),
}


@pytest.mark.parametrize("cut", list(CUTS))
@pytest.mark.parametrize("checksum", ["stale", "updated"])
def test_shard_of_another_shape_is_refused(copy_store, cut, checksum):
    """A valid netCDF file of another shape in place of the only shard: never read as the store
    (before, opening compared shards only with each other and read it as a smaller store)."""
    store = one_shard(copy_store())
    select, words = CUTS[cut]
    path = store / SHARD0
    ds = read_shard(path).isel({dim: list(index) for dim, index in select.items()})
    write_shard(ds, path)                          # same attributes and config hash
    if checksum == "updated":
        m = json.loads((store / "manifest.json").read_text())
        m["shards"][0]["sha256"] = file_sha256(path)
        (store / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(StoreError) as info:
        attngeom.store.open(store)
    message = str(info.value)
    assert message.startswith(f"{SHARD0}: ") and words in message and "\n" not in message
    assert "manifest" in message
    problems = validate(store)
    assert problems and any(p.startswith(SHARD0) for p in problems)


def test_analyze_exits_2_on_a_shard_of_another_shape(copy_store, tmp_path, capsys):
    store = one_shard(copy_store())
    path = store / SHARD0
    write_shard(read_shard(path).isel(layer=[0]), path)
    rc = main(["analyze", str(store), "--out", str(tmp_path / "results"), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and SHARD0 in err[0] and "layer" in err[0]
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").iterdir())


def test_a_shard_of_the_other_layout_is_refused(copy_store, stores):
    store = one_shard(copy_store("llama", "dense"))
    compact = read_shard(stores["llama", "compact"] / SHARD0)
    compact.attrs = read_shard(store / SHARD0).attrs
    write_shard(compact, store / SHARD0)
    with pytest.raises(StoreError, match=r"^shards/shard-00000\.nc: variable alpha has dims "
                                         r".*'sink'\), not the dense layout's"):
        attngeom.store.open(store)
    assert any(p.startswith(SHARD0) for p in validate(store))


def test_symlinked_shard_fails_validate_and_merge_copies_the_file(copy_store, tmp_path, capsys):
    store = copy_store()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shard = store / "shards" / "shard-00001.nc"
    shutil.move(shard, elsewhere / shard.name)
    shard.symlink_to(elsewhere / shard.name)
    assert attngeom.store.open(store).sizes["sequence"] == 5     # it still reads here
    problems = validate(store)
    assert len(problems) == 1 and "symbolic link" in problems[0] \
        and "outside the store" in problems[0] and problems[0].startswith("shards/shard-00001.nc")
    assert main(["store", "validate", str(store)]) == 1
    assert "symbolic link" in capsys.readouterr().err
    merge([store], tmp_path / "merged")                        # the file itself, not the link
    merged = tmp_path / "merged" / "shards" / "shard-00001.nc"
    assert merged.is_file() and not merged.is_symlink()
    assert validate(tmp_path / "merged") == []


def test_symlink_inside_the_store_is_fine(copy_store):
    store = copy_store()
    shard = store / "shards" / "shard-00001.nc"
    shutil.move(shard, store / "kept.nc")
    shard.symlink_to(Path("..") / "kept.nc")
    assert validate(store) == []


def test_opening_stores_attngeom_wrote_warns_nothing(stores, tmp_path):
    """Merged (linked and rewritten), subset and plain stores open and load with warnings as
    errors (xarray warned about dask chunks separating the stored chunks)."""
    from attngeom.store.ops.subset import subset

    made = [stores["llama", "compact"], stores["llama", "dense"]]
    made.append(tmp_path / "linked")
    merge([stores["llama", "compact"]], made[-1])
    made.append(tmp_path / "rewritten")
    merge([stores["llama", "compact"]], made[-1], no_text=True)
    made.append(tmp_path / "subset")
    subset(stores["llama", "compact"], made[-1], layers="1", heads="0:3", sequences="1:4")
    for path in made:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            attngeom.store.open(path).load()


def test_writer_writes_an_opened_store_again(stores, tmp_path):
    """StoreWriter.new + add_shard + finish: a Dataset of the store's layout (here the lazily
    opened session store) written through the public API is a valid store with the same numbers
    and config hash (what ``attngeom.store.write`` will build on)."""
    from attngeom.store import read_manifest
    from attngeom.store.io.writer import StoreWriter

    src = stores["llama", "compact"]
    m = read_manifest(src)
    ds = attngeom.store.open(src, derived=False)
    writer = StoreWriter.new(tmp_path / "again", m["config"], m["n_sequences"],
                             {"counts": {"skipped_empty": 0}})
    for index, entry in enumerate(m["shards"]):
        writer.add_shard(ds.isel(sequence=slice(*entry["sequences"])), index)
    again = writer.finish()
    assert validate(tmp_path / "again") == [] and again["config_hash"] == m["config_hash"]
    assert [e["sequences"] for e in again["shards"]] == [e["sequences"] for e in m["shards"]]
    want = attngeom.store.open(src).load()
    got = attngeom.store.open(tmp_path / "again").load()
    for name in want.data_vars:
        assert got[name].equals(want[name]), name
    with pytest.raises(ValueError, match="does not fit the store.*layer"):
        writer.add_shard(ds.isel(sequence=slice(0, 3), layer=[0]), 9)
