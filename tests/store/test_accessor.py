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
import tiny_models as tm
import tolerance as tol
from attngeom.store.format import derive
from store_helpers import compact_bounds, model_dims

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
    # the synthetic float64 softmax row, then its group totals and their sum
    np.testing.assert_allclose(total.values[ok], 1.0, **tol.sums_to_one(T + 3, depth=T + 1,
                                                                         dtype=tol.F64))
    assert np.isnan(total.values[~ok]).all()
    np.testing.assert_array_equal(g.sink_rate.values, got["sink"][..., 0])


def test_compact_matches_dense(geo):
    ds = geo[0]
    for w in (W, 2):                    # a shorter tail moves the stored lags >= w to middle
        dense, compact = ds.attngeom.groups(w=w), to_compact(ds).attngeom.groups(w=w)
        for grp in ("sink", "tail"):
            for name in ("alpha", "cosine", "cosine_layer", "contribution",
                         "contribution_layer", "value_norm", "ratio"):
                # the same stored values, indexed: exact
                xr.testing.assert_identical(compact.group(grp, name), dense.group(grp, name))
            assert compact.group(grp, "alpha").dims[-1] == {"sink": "sink", "tail": "lag"}[grp]
        for grp in GROUPS:
            for name in ("alpha", "contribution", "contribution_layer"):
                # two float64 sums of at most T terms (stored middles: to_compact's)
                size = np.nansum(np.abs(ds[name].values), -1)
                tol.assert_close(compact.total(grp, name).values, dense.total(grp, name).values,
                                 tol.total(T, size, tol.F64, vs=tol.F64), f"{grp} {name}")
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
    # model space (a float64 dot of d, two norms, a division) against alpha x ratio x cosine
    # (the cosine's dot and norms, two products): gamma(d + 6) x 2 alpha ||v~|| / ||o||
    d = 5                                                        # geometric_store's default
    with np.errstate(invalid="ignore", divide="ignore"):
        o = np.fmin(ds["output_norm"], ds["layer_output_norm"])
        size = float(np.nanmax(2 * ds["alpha"] * ds["value_norm"] / o))
    bound = tol.dot(d + 6, size, tol.F64, vs=tol.F64)
    for store in (ds, to_compact(ds)):
        g = store.attngeom.groups()
        bare = store.drop_vars([n for n in ("contribution", "tail_contribution",
                                            "contribution_layer", "tail_contribution_layer")
                                if n in store]).attngeom.groups()
        for grp in ("sink", "tail") + (("middle",) if g.elementwise("middle") else ()):
            c = g.group(grp, "contribution").values           # stored (model space)
            prod = (g.group(grp, "alpha") * g.group(grp, "ratio") * g.group(grp, "cosine"))
            assert np.array_equal(np.isfinite(prod.values), np.isfinite(c))
            np.testing.assert_allclose(prod.values[np.isfinite(c)], c[np.isfinite(c)], **bound)
            for name in ("contribution", "contribution_layer"):
                np.testing.assert_allclose(bare.group(grp, name).values,
                                           g.group(grp, name).values, **bound)


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
    ds = opened["llama", "dense"]
    dense = ds.attngeom.groups()
    compact = opened["llama", "compact"].attngeom.groups()
    assert dense.k == compact.k == 2 and dense.w == compact.w == 3
    # two float32 measurements: each within its bound (store_helpers), sizes from dense's
    r = {n: ds[n].values.astype(float) for n in ds.data_vars if ds[n].dims[:2] == (
        "sequence", "layer")}
    dims = model_dims(tm.make_config("llama"))
    bound = compact_bounds(r, dims, 2, 3, vs=tol.F32)
    n = tol.attention_terms(T=ds.sizes["key"], layer=ds.sizes["layer"] - 1, **dims)
    for grp in ("sink", "tail"):
        for name in ("alpha", "contribution", "contribution_layer", "ratio"):
            a, b = compact.group(grp, name).values, dense.group(grp, name).values
            prefix = "tail_" if grp == "tail" else ""
            found = (tol.relative(2 * n + 1, vs=tol.F32) if name == "ratio"     # ||v~|| / ||o||
                     else tol.Tol(atol=bound[prefix + name]))
            tol.assert_close(a, b, found, f"{grp} {name}")
    totals = {"sink": np.nansum(bound["contribution"], -1),
              "tail": np.nansum(bound["tail_contribution"], -1),
              "middle": bound["middle_contribution"]}
    for grp in GROUPS:
        tol.assert_close(compact.total(grp, "contribution").values,
                         dense.total(grp, "contribution").values, tol.Tol(atol=totals[grp]),
                         f"{grp} total")
    total = sum(compact.total(grp, "contribution") for grp in GROUPS).values
    ok = np.isfinite(total)
    assert ok.any()
    size = sum(np.abs(compact.total(grp, "contribution").values) for grp in GROUPS)
    one_run = sum(totals.values()) / 2                       # compact alone against exact 1
    tol.assert_close(total[ok], 1.0, tol.sums_to_one(3, term=one_run, size=size).at(ok),
                     "c sums to 1 over keys")
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
