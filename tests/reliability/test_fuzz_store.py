"""Damaged and adversarial stores: rejected with StoreError, or read correctly, never a crash.

A small valid store (tiny llama, 5 texts, 3 shard files) is copied and damaged by hypothesis:
truncated or byte-flipped files, deleted, renamed or retyped variables, huge or malformed
attributes, edited or replaced manifests, swapped or leftover files. Then

- ``validate`` returns a list (never raises), and reports a problem for any change to a file the
  manifest records (checksums), or to the manifest itself;
- ``open_store`` raises StoreError, or returns a Dataset; loading it either fails in h5py's own
  chunk checksum/decompression (OSError, only when validate found the damage) or gives exactly
  the pristine values where validate found nothing wrong.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attngeom.store import StoreError, open_store
from attngeom.store.io.validate import validate

SHARDS = ("shards/shard-00000.nc", "shards/shard-00001.nc", "shards/shard-00002.nc")
FILES = SHARDS + ("manifest.json",)
VARIABLES = ("alpha", "value_norm", "output_norm", "tail_alpha", "token_id", "length",
             "sequence", "layer", "middle_count")
ATTRS = ("attngeom_config_hash", "attngeom_config", "attngeom_schema_version", "model", "mode",
         "Conventions")
JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70)
                    | st.floats(allow_nan=False) | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=6)


@pytest.fixture(scope="module")
def pristine(small_store) -> tuple[Path, dict]:
    """The valid small store and its values (derived variables included), loaded."""
    assert validate(small_store) == []
    with open_store(small_store) as ds:
        values = {k: v.values.copy() for k, v in ds.load().variables.items()}
    return small_store, values


# ------------------------------------------------------------------------------ damage
def truncate(store: Path, file: str, fraction: float) -> None:
    path = store / file
    path.write_bytes(path.read_bytes()[: int(path.stat().st_size * fraction)])


def flip(store: Path, file: str, where: float, mask: int) -> None:
    data = bytearray((store / file).read_bytes())
    i = min(len(data) - 1, int(len(data) * where))
    data[i] ^= mask
    (store / file).write_bytes(bytes(data))


def delete_variable(store: Path, file: str, name: str) -> None:
    with h5py.File(store / file, "r+") as f:
        if name in f:
            del f[name]


def rename_variable(store: Path, file: str, name: str) -> None:
    with h5py.File(store / file, "r+") as f:
        if name in f and not f[name].attrs.get("CLASS") == b"DIMENSION_SCALE":
            f.move(name, name + "_renamed")


def retype_variable(store: Path, file: str, name: str, kind: str) -> None:
    with h5py.File(store / file, "r+") as f:
        if name not in f or f[name].attrs.get("CLASS") == b"DIMENSION_SCALE":
            return
        data = f[name][()]
        del f[name]
        if kind == "int8":
            f.create_dataset(name, data=np.nan_to_num(data).astype(np.int8))
        elif kind == "shape":
            f.create_dataset(name, data=np.zeros((3,) + np.shape(data)[1:], np.float32))
        else:
            f.create_dataset(name, data=np.bytes_(b"x" * 64))


def set_attribute(store: Path, file: str, name: str, value) -> None:
    with h5py.File(store / file, "r+") as f:
        f.attrs[name] = value


def _holds(node, key) -> bool:
    """``node[key]`` exists (a dict key, or an index within a list)."""
    return (isinstance(node, dict) and key in node) or (
        isinstance(node, list) and isinstance(key, int) and key < len(node))


def edit_manifest(store: Path, path: list, value) -> None:
    """Set (or delete) the manifest entry at ``path``; a missing parent, or deleting a missing
    entry, leaves the manifest as it is (the store is then checked as undamaged). A missing
    last key of a dict is added (e.g. a ``part`` a single-process store lacks)."""
    manifest = json.loads((store / "manifest.json").read_text())
    node = manifest
    for key in path[:-1]:
        if not _holds(node, key):
            return
        node = node[key]
    last = path[-1]
    if value == "<delete>" or isinstance(node, list):
        if not _holds(node, last):
            return
    elif not isinstance(node, dict):
        return
    if value == "<delete>":
        del node[last]
    else:
        node[last] = value
    (store / "manifest.json").write_text(json.dumps(manifest))


MANIFEST_PATHS = st.sampled_from([
    ["complete"], ["n_sequences"], ["shards"], ["config"], ["config_hash"], ["schema_version"],
    ["format"], ["config", "options"], ["config", "options", "mode"], ["config", "model"],
    ["config", "options", "max_length"], ["shards", 0], ["shards", 1, "file"],
    ["shards", 1, "sequences"], ["shards", 2, "sha256"], ["part"], ["faithfulness"]])
ATTR_VALUES = st.one_of(st.just("x" * 2_000_000), st.just('{"model": '), st.integers(-9, 9),
                        st.just("[]" * 10_000), st.text(max_size=30))

DAMAGE = st.one_of(
    st.tuples(st.just(truncate), st.sampled_from(FILES), st.floats(0, 0.999)),
    st.tuples(st.just(flip), st.sampled_from(FILES), st.floats(0, 1),
              st.integers(1, 255)),
    st.tuples(st.just(delete_variable), st.sampled_from(SHARDS), st.sampled_from(VARIABLES)),
    st.tuples(st.just(rename_variable), st.sampled_from(SHARDS), st.sampled_from(VARIABLES)),
    st.tuples(st.just(retype_variable), st.sampled_from(SHARDS), st.sampled_from(VARIABLES),
              st.sampled_from(["int8", "shape", "string"])),
    st.tuples(st.just(set_attribute), st.sampled_from(SHARDS), st.sampled_from(ATTRS),
              ATTR_VALUES),
    st.tuples(st.just(edit_manifest), MANIFEST_PATHS, JSON | st.just("<delete>")),
)
WHOLE_FILE = ("swap shards", "delete shard", "manifest garbage", "manifest huge",
              "leftover temporary")


def whole_file(store: Path, what: str) -> None:
    a, b = store / SHARDS[0], store / SHARDS[1]
    if what == "swap shards":
        tmp = store / "swap"
        a.rename(tmp), b.rename(a), tmp.rename(b)
    elif what == "delete shard":
        b.unlink()
    elif what == "manifest garbage":
        (store / "manifest.json").write_bytes(b"\x80\x04\x95 not json, maybe a pickle")
    elif what == "manifest huge":
        (store / "manifest.json").write_text('{"format": "attngeom-store", "x": "'
                                             + "y" * (65 * 2 ** 20) + '"}')
    else:                                   # a temporary file of a killed run: never read
        (store / "shards" / ".shard-00001.nc.tmp-999").write_bytes(b"garbage")


# ------------------------------------------------------------------------------ property
def check(store: Path, values: dict, changed_recorded: bool) -> None:
    problems = validate(store)
    assert isinstance(problems, list) and all(isinstance(p, str) for p in problems)
    if changed_recorded:
        assert problems, "validate missed a change to a recorded file"
    try:
        ds = open_store(store)
    except StoreError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    try:
        loaded = ds.load()
    except OSError:                        # h5py: chunk checksum or decompression failed
        assert problems, "a load failed although validate found nothing"
        return
    finally:
        ds.close()
    if problems:
        return                             # damage outside what was read; validate reports it
    for name, want in values.items():
        got = loaded[name].values
        assert got.shape == want.shape and (got.dtype.kind in "OU" or np.array_equal(
            got, want, equal_nan=True)), name


@settings(max_examples=20, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(damage=DAMAGE)
def test_damaged_store_is_rejected_or_read_correctly(pristine, tmp_path, damage):
    source, values = pristine
    store = tmp_path / "store"
    shutil.rmtree(store, ignore_errors=True)
    shutil.copytree(source, store)
    before = {f: (store / f).read_bytes() for f in FILES}
    act, *args = damage
    act(store, *args)                              # never raises: every example is checked
    changed = any((store / f).read_bytes() != before[f] for f in FILES)
    check(store, values, changed)


@pytest.mark.parametrize("what", WHOLE_FILE)
def test_whole_file_damage(pristine, tmp_path, what):
    source, values = pristine
    store = Path(shutil.copytree(source, tmp_path / "store"))
    whole_file(store, what)
    check(store, values, changed_recorded=what != "leftover temporary")
    if what == "leftover temporary":
        assert validate(store) == []
