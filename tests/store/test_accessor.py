"""ds.attngeom: key groups, masks and block reads of both layouts against plain indexing.

Synthetic stores (tests/analysis/synthetic_stores.py) are built from explicit vectors and
converted to the compact layout with loops, independently of attngeom; the real stores are
the session's dense and compact extractions of the same texts (tests/store/conftest.py).
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import dask
import numpy as np
import pytest
import xarray as xr
from dask.callbacks import Callback

import attngeom.store  # noqa: F401  (registers ds.attngeom)
from attngeom.store.format import derive

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analysis"))
from synthetic_stores import geometric_store, group_of_pairs, to_compact  # noqa: E402

GROUPS = ("sink", "tail", "middle")
K, W, T = 2, 3, 14


@pytest.fixture(scope="module")
def geo():
    ds, _, alpha = geometric_store(n_seq=8, n_layer=2, n_head=2, n_pos=T, sink_k=K, tail_w=W,
                                   seed=5, return_vectors=True)
    return ds, alpha


def test_key_group_definitions_match_loops():
    for k, w in ((1, 1), (2, 3), (3, 8)):
        labels = group_of_pairs(T, k, w)
        key, tail = derive.tail_keys(T, k, w)
        for i in range(T):
            for lag in range(w):
                assert tail[i, lag] == (i - lag >= k)
                if tail[i, lag]:
                    assert key[i, lag] == i - lag and labels[i, i - lag] == 1
        np.testing.assert_array_equal(derive.middle_mask(T, k, w), labels == 2)


def test_layout_and_options(geo):
    ds = geo[0]
    compact = to_compact(ds)
    assert (ds.attngeom.layout, compact.attngeom.layout) == ("dense", "compact")
    assert (ds.attngeom.pair_dim, compact.attngeom.pair_dim) == ("key", "sink")
    assert compact.attngeom.sink_k == K and compact.attngeom.tail_w == W
    assert ds.attngeom.elementwise("middle") and not compact.attngeom.elementwise("middle")
    no_mode = compact.copy()
    no_mode.attrs = {}
    assert no_mode.attngeom.layout == "compact" and no_mode.attngeom.sink_k == K
    assert ds.attngeom.resolve() == (K, W) and ds.attngeom.resolve(5, 9) == (5, 9)
    for kw, match in ((dict(k=3), "sink keys"), (dict(w=5), "tail"), (dict(k=0), ">= 1")):
        with pytest.raises(ValueError, match=match):
            compact.attngeom.resolve(**kw)
    with pytest.raises(ValueError, match="positions 0..T-1"):
        ds.isel(query=slice(1, None)).attngeom.resolve()
    with pytest.raises(ValueError, match="fixed by its sink_k"):
        compact.attngeom.groups(k=1).group("tail", "alpha")
    with pytest.raises(ValueError, match="unknown key group"):
        ds.attngeom.groups().group("recent", "alpha")


def test_groups_are_alpha_at_the_named_keys(geo):
    """Every group's alpha equals alpha[s, l, h, i, j] at the keys the definitions name, and
    NaN elsewhere; the group totals of alpha add up to 1 at every valid query."""
    ds, alpha = geo
    g = ds.attngeom.groups()
    got = {name: g.group(name, "alpha").values for name in GROUPS}
    labels = group_of_pairs(T, K, W)
    length = ds["length"].values
    for s in range(ds.sizes["sequence"]):
        for i in range(T):
            valid_q = K <= i < length[s]
            for j in range(T):
                expect = alpha[s, :, :, i, j] if valid_q and j <= i and j < length[s] else np.nan
                slot = {0: ("sink", j), 1: ("tail", i - j), 2: ("middle", j)}[labels[i, j]]
                np.testing.assert_array_equal(got[slot[0]][s, :, :, i, slot[1]], expect)
            if not valid_q:
                assert np.isnan(got["sink"][s, :, :, i]).all()
    total = sum(g.total(name, "alpha") for name in GROUPS)
    ok = g.query_ok.values[:, None, None, :] & np.ones(total.shape, bool)
    np.testing.assert_allclose(total.values[ok], 1.0, atol=1e-12)
    assert np.isnan(total.values[~ok]).all()
    np.testing.assert_array_equal(g.sink_rate.values, got["sink"][..., 0])


def test_compact_matches_dense(geo):
    ds = geo[0]
    for w in (W, 2):                    # a shorter tail moves the stored lags >= w to middle
        dense, compact = ds.attngeom.groups(w=w), to_compact(ds).attngeom.groups(w=w)
        for grp in ("sink", "tail"):
            for name in ("alpha", "cosine", "cosine_layer", "contribution",
                         "contribution_layer", "value_norm", "ratio"):
                xr.testing.assert_allclose(compact.group(grp, name), dense.group(grp, name))
            assert compact.group(grp, "alpha").dims[-1] == {"sink": "sink", "tail": "lag"}[grp]
        for grp in GROUPS:
            for name in ("alpha", "contribution", "contribution_layer"):
                np.testing.assert_allclose(compact.total(grp, name).values,
                                           dense.total(grp, name).values, atol=1e-12)
            np.testing.assert_array_equal(compact.count(grp).values.astype(float),
                                          np.where(compact.query_ok.values[:, None, None],
                                                   dense.count(grp).values, np.nan)
                                          if grp == "middle" else dense.count(grp).values)
    with pytest.raises(ValueError, match="dense"):
        to_compact(ds).attngeom.groups().group("middle", "alpha")


def test_ratio_and_derived_contribution_follow_the_definition(geo):
    """alpha * ratio * cosine is the contribution computed from model-space vectors, and is
    what the accessor derives when the store does not hold the contribution."""
    ds = geo[0]
    for store in (ds, to_compact(ds)):
        g = store.attngeom.groups()
        bare = store.drop_vars([n for n in ("contribution", "tail_contribution",
                                            "contribution_layer", "tail_contribution_layer")
                                if n in store]).attngeom.groups()
        for grp in ("sink", "tail") + (("middle",) if g.elementwise("middle") else ()):
            c = g.group(grp, "contribution").values           # stored (model space)
            prod = (g.group(grp, "alpha") * g.group(grp, "ratio") * g.group(grp, "cosine"))
            assert np.array_equal(np.isfinite(prod.values), np.isfinite(c))
            np.testing.assert_allclose(prod.values[np.isfinite(c)], c[np.isfinite(c)],
                                       rtol=1e-10)
            for name in ("contribution", "contribution_layer"):
                np.testing.assert_allclose(bare.group(grp, name).values,
                                           g.group(grp, name).values, rtol=1e-10)


def test_masks(geo):
    ds = geo[0].copy()
    ds["finite"] = ds["finite"].copy(data=np.r_[0, np.ones(ds.sizes["sequence"] - 1)])
    special = np.zeros((ds.sizes["sequence"], ds.sizes["position"]), bool)
    special[:, 3] = True
    ds["special"] = (("sequence", "position"), special)
    g = ds.attngeom.groups()
    n = ds["length"].values
    q = np.arange(T)
    np.testing.assert_array_equal(g.query_ok.values,
                                  (q >= K) & (q < n[:, None]) & (np.arange(8) > 0)[:, None])
    np.testing.assert_array_equal(g.key_ok.values, (q < n[:, None]) & (np.arange(8) > 0)[:, None])
    assert not g.semantic_key.values[:, 3].any() and not g.semantic_key.values[:, :K].any()
    assert g.semantic_key.values[1, 4]
    rate = g.sink_rate.values
    assert np.isnan(rate[0]).all() and np.isfinite(rate[1, ..., K]).all()
    vn = g.per_key("value_norm").values
    assert np.isnan(vn[0]).all() and np.isnan(vn[1, ..., n[1]:]).all()
    raw = ds.attngeom.groups(mask=False)              # the stored values (query 0 included)
    np.testing.assert_array_equal(raw.sink_rate.values, ds["alpha"].values[..., 0])


def test_lazy_store_gives_the_loaded_values(geo):
    ds = geo[0]
    for store in (ds, to_compact(ds)):
        lazy, eager = store.chunk({"sequence": 3}).attngeom.groups(), store.attngeom.groups()
        for grp in ("sink", "tail"):
            out = lazy.group(grp, "ratio")
            assert isinstance(out.data, dask.array.Array)
            np.testing.assert_array_equal(out.values, eager.group(grp, "ratio").values)
            np.testing.assert_array_equal(lazy.total(grp, "contribution").values,
                                          eager.total(grp, "contribution").values)


class _Computes(Callback):
    def __init__(self):
        super().__init__()
        self.n = 0

    def _start(self, dsk):
        self.n += 1


def test_load_block_reads_once_and_only_what_is_asked(geo):
    ds = geo[0]
    for store in (ds.chunk({"sequence": 3}), to_compact(ds).chunk({"sequence": 3})):
        with _Computes() as computes:
            block = store.attngeom.load_block(["alpha", "contribution", "ratio", "cosine"],
                                              layer=1, sequences=slice(2, 7))
        assert computes.n == 1
        assert all(isinstance(v.data, np.ndarray) for v in block.data_vars.values())
        assert block["alpha"].dtype == np.float64 and block["length"].dtype.kind == "i"
        assert {"value_norm", "output_norm", "length", "finite"} <= set(block.data_vars)
        tail = {"tail_alpha", "tail_cosine", "middle_alpha", "middle_contribution"}
        assert tail <= set(block.data_vars) if store.attngeom.layout == "compact" \
            else not tail & set(block.data_vars)
        g, whole = block.attngeom.groups(), store.attngeom.groups()
        for grp in ("sink", "tail"):
            np.testing.assert_array_equal(g.group(grp, "contribution").values, whole.group(
                grp, "contribution").isel(sequence=slice(2, 7)).sel(layer=1).values)
    sink_only = ds.attngeom.load_block(["alpha"], layer=0, groups=("sink",), k=3)
    assert sink_only["alpha"].dims[-1] == "sink" and sink_only.sizes["sink"] == 3
    assert sink_only.sizes["key"] == T                 # per-key variables stay whole
    np.testing.assert_array_equal(sink_only.attngeom.groups(k=3).sink_rate.values,
                                  ds.attngeom.groups(k=3).sink_rate.sel(layer=0).values)
    with pytest.raises(ValueError, match="all keys"):
        sink_only.attngeom.groups().group("tail", "alpha")


def test_sources_name_the_layout_variables(geo):
    ds = geo[0]
    compact = to_compact(ds)
    assert ds.attngeom.sources(["alpha", "ratio"]) == ["alpha", "value_norm", "output_norm"]
    assert compact.attngeom.sources(["alpha", "cosine"]) == [
        "alpha", "tail_alpha", "middle_alpha", "cosine", "tail_cosine"]
    assert compact.attngeom.sources(["alpha"], ["sink"]) == ["alpha"]
    bare = compact.drop_vars(["tail_contribution"])
    assert bare.attngeom.sources(["contribution"], ["tail"]) == [
        "tail_alpha", "tail_cosine", "value_norm", "output_norm"]


def test_real_stores_dense_and_compact_agree(opened):
    """The session's dense and compact extractions of the same texts: the same groups."""
    dense = opened["llama", "dense"].attngeom.groups()
    compact = opened["llama", "compact"].attngeom.groups()
    assert dense.k == compact.k == 2 and dense.w == compact.w == 3
    for grp in ("sink", "tail"):
        for name in ("alpha", "contribution", "contribution_layer", "ratio"):
            a, b = compact.group(grp, name).values, dense.group(grp, name).values
            assert np.array_equal(np.isnan(a), np.isnan(b))
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, equal_nan=True)
    for grp in GROUPS:
        np.testing.assert_allclose(compact.total(grp, "contribution").values,
                                   dense.total(grp, "contribution").values, atol=1e-4)
    total = sum(compact.total(grp, "contribution") for grp in GROUPS).values
    ok = np.isfinite(total)
    assert ok.any()
    np.testing.assert_allclose(total[ok], 1.0, atol=1e-4)   # c sums to 1 over keys
    with warnings.catch_warnings():
        warnings.simplefilter("error")                         # clean stores warn nothing
        assert bool(compact.sequence_ok.all())


def test_load_block_reads_the_masks_once_per_run_of_sequences(geo):
    """The masks (no layer dim) come with the first layer's block and are reused after."""
    store = to_compact(geo[0]).chunk({"sequence": 3})
    first = store.attngeom.load_block(["alpha"], layer=0, sequences=slice(2, 7))
    with _Computes() as computes:
        second = store.attngeom.load_block(["alpha"], layer=1, sequences=slice(2, 7))
    assert computes.n == 1
    for name in ("length", "finite"):
        assert np.shares_memory(first[name].values, second[name].values)
        np.testing.assert_array_equal(second[name].values,
                                      store[name].isel(sequence=slice(2, 7)).values)
    other = store.attngeom.load_block(["alpha"], layer=1, sequences=slice(0, 2))
    np.testing.assert_array_equal(other["length"].values, store["length"].values[:2])
