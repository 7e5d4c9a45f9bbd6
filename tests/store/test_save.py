"""``attngeom.store.write`` of an opened store: a new store with the same config, hash and
numbers, that ``store validate`` accepts (the in-memory round trip is in
tests/extract/test_inmemory.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import attngeom.store
from attngeom.store.io.validate import validate


@pytest.mark.parametrize("kind", [("llama", "dense"), ("bert", "compact")])
def test_an_opened_store_written_again(stores, kind, tmp_path):
    src = stores[kind]
    ds = attngeom.store.open(src)
    manifest = attngeom.store.write(ds, tmp_path / "copy")
    assert validate(tmp_path / "copy") == []
    old = json.loads((src / "manifest.json").read_text())
    assert manifest["config"] == old["config"] and manifest["config_hash"] == old["config_hash"]
    assert [e["sequences"] for e in manifest["shards"]] == [e["sequences"] for e in old["shards"]]
    again, want = attngeom.store.open(tmp_path / "copy").load(), ds.load()
    assert set(again.data_vars) == set(want.data_vars)
    for name in want.data_vars:
        np.testing.assert_array_equal(again[name].values, want[name].values, err_msg=name)


def test_no_text_leaves_token_strings_out(stores, tmp_path):
    ds = attngeom.store.open(stores["llama", "dense"])
    manifest = attngeom.store.write(ds, tmp_path / "copy", no_text=True)
    assert manifest["config"]["options"]["store_text"] is False
    assert validate(tmp_path / "copy") == []
    assert "token" not in attngeom.store.open(tmp_path / "copy")
