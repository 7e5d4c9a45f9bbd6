"""store export: Zarr and Parquet see the store's numbers.

Uses the session stores of tests/store/conftest.py (tiny llama, causal, dense and compact with
sink k = 2, tail w = 3). The Parquet tables are checked against the store cell by cell, against
closed-form row counts (a causal query i sees keys 0..i), and contributions rebuilt from the
per-key and per-query tables alone sum to 1.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import xarray as xr

import tiny_models as tm
import tolerance as tol
from attngeom.cli import main
from store_helpers import model_dims
from attngeom.store.ops.export import export
from attngeom.store.errors import StoreError


@pytest.fixture(scope="module")
def made(stores, opened):
    return {mode: (stores["llama", mode], opened["llama", mode]) for mode in ("dense", "compact")}


def values_at(da: xr.DataArray, df: pd.DataFrame, dims: tuple[str, ...]) -> np.ndarray:
    """``da`` at the rows' coordinates (positions equal labels in these stores)."""
    return da.transpose(*dims).values[tuple(df[d].to_numpy() for d in dims)]


def test_zarr_round_trip(made, tmp_path):
    path, ds = made["compact"]
    export(path, tmp_path / "s.zarr", "zarr")
    z = xr.open_zarr(tmp_path / "s.zarr")
    assert z.attrs["config_hash"] == ds.attrs["config_hash"]
    xr.testing.assert_equal(z.load(), ds)                       # derived variables included
    import zarr                                                  # the zarr library alone

    group = zarr.open_group(str(tmp_path / "s.zarr"), mode="r")
    for name in ("alpha", "value_norm", "tail_contribution"):
        raw = np.asarray(group[name][:])
        dims = group[name].attrs["_ARRAY_DIMENSIONS"]
        np.testing.assert_array_equal(raw, ds[name].transpose(*dims).values, err_msg=name)
    assert "xr.open_zarr" in (tmp_path / "s.zarr" / "README.txt").read_text()
    with pytest.raises(StoreError, match="not empty"):
        export(path, tmp_path / "s.zarr", "zarr")


def test_parquet_dense_tables(made, tmp_path):
    path, ds = made["dense"]
    export(path, tmp_path / "pq", "parquet")
    L, H = ds.sizes["layer"], ds.sizes["head"]
    n = ds["length"].values.astype(int)
    q = pd.read_parquet(tmp_path / "pq" / "per_query.parquet")
    k = pd.read_parquet(tmp_path / "pq" / "per_key.parquet")
    p = pd.read_parquet(tmp_path / "pq" / "pairs.parquet")
    assert len(q) == len(k) == L * H * n.sum()
    assert len(p) == L * H * (n * (n + 1) // 2).sum()            # causal: keys 0..i
    assert (p["key"] <= p["query"]).all()
    import pyarrow.parquet as pq                     # every table carries the store's identity

    manifest = json.loads((path / "manifest.json").read_text())
    for table in ("per_query", "per_key", "pairs", "sequences", "tokens"):
        meta = pq.read_schema(tmp_path / "pq" / f"{table}.parquet").metadata
        assert meta[b"attngeom_config_hash"].decode() == manifest["config_hash"], table
        assert json.loads(meta[b"attngeom_manifest"])["shards"] == manifest["shards"], table
    qd, kd, pd_ = ("sequence", "layer", "head", "query"), ("sequence", "layer", "head", "key"), \
        ("sequence", "layer", "head", "query", "key")
    for name in ("output_norm", "head_share", "residual_norm"):
        np.testing.assert_array_equal(q[name].to_numpy(), values_at(ds[name], q, qd))
    np.testing.assert_array_equal(q["layer_output_norm"].to_numpy(),
                                  values_at(ds["layer_output_norm"], q, ("sequence", "layer",
                                                                         "query")))
    np.testing.assert_array_equal(k["value_norm"].to_numpy(), values_at(ds["value_norm"], k, kd))
    for name in ("alpha", "cosine", "contribution", "contribution_layer"):
        np.testing.assert_array_equal(p[name].to_numpy(), values_at(ds[name], p, pd_))
    # contributions rebuilt from the three tables alone sum to 1 over keys (closed form)
    j = p.merge(k, on=["sequence", "layer", "head", "key"]).merge(
        q, on=["sequence", "layer", "head", "query"])
    c = j["alpha"] * j["value_norm"] * j["cosine"] / j["output_norm"]
    # the same float32 factors multiplied in another order: 3 roundings each way
    np.testing.assert_allclose(c, j["contribution"], **tol.relative(3, vs=tol.F32))
    # each stored factor within its measurement's bound (alpha, the norms gamma(N) relative,
    # the cosine 2 gamma(N) absolute: 5 gamma(N) alpha ||v~|| / ||o||), then the sum
    n = tol.attention_terms(T=ds.sizes["key"], layer=L - 1, **model_dims(tm.make_config("llama")))
    size = (j["alpha"] * j["value_norm"] / j["output_norm"]).astype(float)
    keys = [j["sequence"], j["layer"], j["head"], j["query"]]
    sums = c.astype(float).groupby(keys).sum()
    term = tol.dot(n, 5 * size.groupby(keys).sum().to_numpy(), vs=tol.F64) + tol.total(
        n=ds.sizes["key"], size=c.abs().astype(float).groupby(keys).sum().to_numpy())
    tol.assert_close(sums.to_numpy(), 1.0, term, "sum_j c")


def test_parquet_compact_pairs_and_tokens(made, tmp_path):
    path, ds = made["compact"]
    assert main(["store", "export", str(path), "--format", "parquet", "--out",
                 str(tmp_path / "pq")]) == 0
    p = pd.read_parquet(tmp_path / "pq" / "pairs.parquet")
    n = ds["length"].values.astype(int)
    L, H = ds.sizes["layer"], ds.sizes["head"]
    sink, tail = p[p["group"] == "sink"], p[p["group"] == "tail"]
    k, w = ds.sizes["sink"], ds.sizes["lag"]
    assert len(sink) == L * H * sum(min(k, i + 1) for m in n for i in range(m))
    assert (sink["key"] < k).all() and (sink["lag"] == -1).all()
    # tail: keys max(k, i - w + 1) .. i of a causal query i
    assert len(tail) == L * H * sum(max(0, min(w, i + 1 - k)) for m in n for i in range(m))
    assert ((tail["key"] == tail["query"] - tail["lag"]) & (tail["key"] >= k)).all()
    dims = ("sequence", "layer", "head", "query")
    for name in ("alpha", "cosine_layer", "contribution"):
        np.testing.assert_array_equal(sink[name].to_numpy(),
                                      values_at(ds[name].rename(sink="key"), sink, dims + ("key",)))
        np.testing.assert_array_equal(tail[name].to_numpy(),
                                      values_at(ds["tail_" + name], tail, dims + ("lag",)))
    t = pd.read_parquet(tmp_path / "pq" / "tokens.parquet")
    s = pd.read_parquet(tmp_path / "pq" / "sequences.parquet")
    assert len(t) == n.sum() and s["length"].tolist() == n.tolist()
    assert t["token"].tolist() == [str(x) for i, m in enumerate(n)
                                   for x in ds["token"].values[i, :m]]
    assert (t["token_id"] == values_at(ds["token_id"], t, ("sequence", "position"))).all()


def test_export_errors(made, tmp_path, capsys):
    path, _ = made["dense"]
    assert main(["store", "export", str(path), "--format", "parquet", "--tables", "bogus",
                 "--out", str(tmp_path / "x")]) == 2
    assert "--tables bogus" in capsys.readouterr().err
    assert main(["store", "export", str(path), "--format", "zarr", "--tables", "pairs",
                 "--out", str(tmp_path / "y")]) == 2


@pytest.mark.parametrize("fmt", ["parquet", "hf"])
def test_a_failed_export_leaves_no_partial_table(made, tmp_path, monkeypatch, fmt):
    """Tables go through the writer API (temporary name, fsync, rename): an export that fails
    midway leaves no file with a final name that is not whole, no temporaries, and a marker
    by which the same export, run again, starts the folder over."""
    import attngeom.store.ops.export as export_module

    path, _ = made["dense"]
    real, calls = export_module._block_tables, []

    def failing(block):
        calls.append(1)
        if len(calls) == 2:                              # the second layer of the first shard
            raise RuntimeError("simulated failure")
        return real(block)

    monkeypatch.setattr(export_module, "_block_tables", failing)
    with pytest.raises(RuntimeError, match="simulated"):
        export(path, tmp_path / "out", fmt)
    left = [p.name for p in (tmp_path / "out").rglob("*") if p.is_file()]
    assert left == [".attngeom-export-incomplete"]   # no table was whole; marked incomplete
    monkeypatch.setattr(export_module, "_block_tables", real)
    export(path, tmp_path / "out", fmt)              # the same export again: starts over
    assert not (tmp_path / "out" / ".attngeom-export-incomplete").exists()
