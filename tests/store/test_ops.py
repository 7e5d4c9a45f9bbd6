"""store subset (layers, heads, sequences, variables, --no-text) and README.txt.

Uses the session stores of tests/store/conftest.py (tiny llama, 5 texts, 2 shards); subsets
are checked against selections of the original, and README.txt's plain-xarray code is run.
"""

from __future__ import annotations

import re
import textwrap

import numpy as np
import pytest
import xarray as xr

import tolerance as tol
from attngeom.cli import main
from attngeom.store import open_store
from attngeom.store.format import schema as S
from attngeom.store.format.manifest import read_manifest, write_manifest
from attngeom.store.options.ranges import parse_ranges, runs
from attngeom.store.ops.merge import merge
from attngeom.store.ops.subset import subset
from attngeom.store.io.validate import validate


@pytest.fixture(scope="module")
def full(stores, opened):
    path = stores["llama", "compact"]
    return {"path": path, "manifest": read_manifest(path),
            "ds": opened["llama", "compact"].drop_attrs()}


def loaded(path):
    return open_store(path).drop_attrs().load()


def test_parse_ranges():
    assert parse_ranges("0:4,7", range(10), "--layers") == [0, 1, 2, 3, 7]
    assert parse_ranges("7:", range(10), "--layers") == [7, 8, 9]
    assert parse_ranges(":2, 5", range(10), "--layers") == [0, 1, 5]
    assert parse_ranges(None, [3, 5], "--layers") is None          # all of them
    assert parse_ranges("5", [3, 5], "--layers") == [5]          # labels, not positions
    assert parse_ranges("1-3", range(10), "--heads") == [1, 2, 3]  # inclusive, as analyze takes
    for bad in ("a", "", ":", "0:4;7", "-3"):
        with pytest.raises(ValueError, match="half-open"):
            parse_ranges(bad, range(10), "--heads")
    with pytest.raises(ValueError, match=r"--layers 4 is not in the store \(it has 3,5\)"):
        parse_ranges("4", [3, 5], "--layers")
    assert runs([0, 1, 2, 5, 7, 8]) == [[0, 3], [5, 6], [7, 9]]


def test_subset_keeps_the_selected_numbers(full, tmp_path):
    out = tmp_path / "sub"
    m = subset(full["path"], out, layers="1", heads="0,2:4", sequences="1:3,4")
    assert validate(out) == []
    cut = m["config"]["subset"]
    assert (cut["layers"], cut["heads"], cut["sequences"]) == ([1], [0, 2, 3], [[1, 3], [4, 5]])
    assert cut["source_config_hash"] == full["manifest"]["config_hash"] != m["config_hash"]
    expect = full["ds"].sel(layer=[1], head=[0, 2, 3]).isel(sequence=[1, 2, 4])
    expect = expect.assign_coords(sequence=[0, 1, 2])
    got = loaded(out)
    xr.testing.assert_identical(got, expect)                     # incl. text_index 1, 2, 4
    assert got["text_index"].values.tolist() == [1, 2, 4]
    assert "subset" in (out / "README.txt").read_text()


def test_subset_of_a_subset_points_at_the_original_sequences(full, tmp_path):
    subset(full["path"], tmp_path / "a", sequences="1:3,4")
    m = subset(tmp_path / "a", tmp_path / "b", sequences="1:")
    assert m["config"]["subset"]["sequences"] == [[2, 3], [4, 5]]
    assert m["config"]["subset"]["source_config_hash"] == full["manifest"]["config_hash"]
    assert loaded(tmp_path / "b")["text_index"].values.tolist() == [2, 4]


def test_subset_variables_keeps_what_contributions_need(full, tmp_path):
    m = subset(full["path"], tmp_path / "v", variables="contribution,value_norm", no_text=True)
    cut = m["config"]["subset"]
    assert set(cut["added_for_derived"]) == {"cosine", "cosine_layer", "output_norm",
                                             "layer_output_norm"}
    assert "tail_alpha" in cut["dropped_variables"] and "head_share" in cut["dropped_variables"]
    assert m["config"]["options"]["store_text"] is False
    got = loaded(tmp_path / "v")
    assert "token" not in got and "head_share" not in got and "tail_contribution" not in got
    np.testing.assert_array_equal(got["contribution"].values, full["ds"]["contribution"].values)
    np.testing.assert_array_equal(got["token_id"].values, full["ds"]["token_id"].values)


def test_subset_errors_are_one_line(full, tmp_path, capsys):
    for args in (["--layers", "7"], ["--variables", "nonsense"], ["--heads", "x"]):
        try:
            rc = main(["store", "subset", str(full["path"]), "--out", str(tmp_path / "x"),
                       *args])
        except SystemExit as exc:          # --heads x: the range syntax, refused by argparse
            rc = exc.code
        err = capsys.readouterr().err.strip()
        assert rc == 2 and err.count("\n") == 0 and args[0] in err, err
    rc = main(["store", "subset", str(full["path"]), "--out", str(tmp_path / "ok"),
               "--heads", "1", "--variables", "alpha"])
    out = capsys.readouterr().out
    assert rc == 0 and "also kept" in out and "subset       of" in out


def test_readme_describes_every_stored_variable(full):
    text = (full["path"] / "README.txt").read_text()
    with xr.open_dataset(full["path"] / "shards" / "shard-00000.nc", engine="h5netcdf") as f:
        stored = list(f.data_vars)
    for name in stored + list(S.DERIVED):
        line = next((ln for ln in text.splitlines() if ln.startswith(f"  {name}  (")), None)
        assert line is not None, name
        assert S.DESCRIPTIONS[name][:40] in text.replace("\n      ", " ")
    for word in ("compact", "NaN", "sink", "lag", "sha256", full["manifest"]["config_hash"],
                 "model-llama", "units", "open_mfdataset"):
        assert word in text, word


@pytest.mark.parametrize("mode", ["dense", "compact"])
def test_readme_code_opens_the_store_with_plain_xarray(stores, opened, mode):
    """Run the README's snippet (no attngeom) and compare with attngeom's reader."""
    path, ds = stores["llama", mode], opened["llama", mode]
    text = (path / "README.txt").read_text()
    code = text.split("Opening with plain xarray\n", 1)[1].split("\n\nWith attngeom", 1)[0]
    code = textwrap.dedent(code).replace("path/to/store", str(path))
    assert "attngeom" not in code
    scope: dict = {}
    exec(compile(code, "README.txt", "exec"), scope)            # noqa: S102 (our own text)
    derived = S.DERIVED if mode == "compact" else tuple(S.DERIVED_PAIR_VARIABLES)
    for name in derived:
        # the README's formula and attngeom's on the same float32 values (4 roundings each)
        np.testing.assert_allclose(scope[name].transpose(*ds[name].dims).values,
                                   ds[name].values, equal_nan=True, err_msg=name,
                                   **tol.relative(4, vs=tol.F32))
    assert dict(scope["ds"].sizes) == dict(ds.sizes)
    assert re.search(r"content hash\s+" + ds.attrs["config_hash"], text)


@pytest.mark.parametrize("op", ["subset", "merge", "write"])
def test_a_store_made_from_another_keeps_its_provenance(copy_store, tmp_path, op):
    """versions, sources and the count of skipped empty texts travel into the new manifest."""
    import attngeom.store

    src = copy_store()
    source = read_manifest(src)
    write_manifest(src, {**source, "counts": {**source.get("counts", {}), "skipped_empty": 3},
                         "sources": {"texts": "a made-up provenance entry"}})
    out = tmp_path / "new"
    made = {"subset": lambda: subset(src, out, layers="1"),
            "merge": lambda: merge([src], out),
            "write": lambda: attngeom.store.write(attngeom.store.open(src), out)}[op]()
    assert made["versions"] == source["versions"]
    assert made["sources"] == {"texts": "a made-up provenance entry"}
    assert made["counts"]["skipped_empty"] == read_manifest(out)["counts"]["skipped_empty"] == 3
