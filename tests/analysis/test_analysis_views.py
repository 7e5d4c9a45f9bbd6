"""Layout views: dense and compact stores give the same groups; masks and exclusions."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from attngeom.analysis import _views as V
from synthetic_stores import geometric_store, group_of_pairs, to_compact


@pytest.fixture(scope="module")
def geo():
    ds, v, alpha = geometric_store(n_seq=8, n_layer=2, n_head=2, n_pos=14, sink_k=2, tail_w=3,
                                   seed=5, return_vectors=True)
    return ds, v, alpha


def _block(ds, k=None, w=None, layer=1, pairs=True):
    info = V.describe(ds, k, w)
    return V.Block(ds, info, layer, slice(0, ds.sizes["sequence"]), V.valid_sequences(ds),
                   pairs)


def test_groups_follow_definitions(geo):
    """Each group's alpha equals alpha at the keys the definitions name (loop reference)."""
    ds, _, alpha = geo
    b = _block(ds)
    T, k, w = ds.sizes["query"], 2, 3
    labels = group_of_pairs(T, k, w)
    a = alpha[:, 1]  # (S, H, Q, K)
    length = ds["length"].values
    for s in range(ds.sizes["sequence"]):
        for i in range(k, length[s]):
            for j in range(length[s]):
                if j > i:
                    continue
                got = {0: b.group("sink", "alpha")[s, :, i, j] if j < k else None,
                       1: b.group("tail", "alpha")[s, :, i, i - j] if i - j < w else None,
                       2: b.group("middle", "alpha")[s, :, i, j]}[labels[i, j]]
                np.testing.assert_allclose(got, a[s, :, i, j])
    # every valid key is in exactly one group: group totals of alpha add up to 1
    total = sum(b.group_total(g, "alpha") for g in V.GROUPS)
    ok = b.query_ok[:, None] & np.ones_like(total, bool)
    np.testing.assert_allclose(total[ok], 1.0, atol=1e-12)


def test_compact_matches_dense(geo):
    ds = geo[0]
    dense, compact = _block(ds), _block(to_compact(ds))
    assert compact.info.pair_dim == "sink" and compact.info.mode == "compact"
    for g in ("sink", "tail"):
        for name in ("alpha", "cosine", "contribution", "ratio"):
            np.testing.assert_allclose(compact.group(g, name), dense.group(g, name))
    for g in V.GROUPS:
        for name in ("alpha", "contribution"):
            np.testing.assert_allclose(compact.group_total(g, name), dense.group_total(g, name),
                                       atol=1e-12)
    with pytest.raises(ValueError, match="dense"):
        compact.group("middle", "alpha")


def test_compact_with_shorter_tail_moves_lags_to_middle(geo):
    ds = geo[0]
    dense, compact = _block(ds, w=2), _block(to_compact(ds), w=2)
    np.testing.assert_allclose(compact.group("tail", "alpha"), dense.group("tail", "alpha"))
    np.testing.assert_allclose(compact.group_total("middle", "alpha"),
                               dense.group_total("middle", "alpha"), atol=1e-12)


def test_ratio_times_alpha_times_cosine_is_contribution(geo):
    b = _block(geo[0])
    for g in V.GROUPS:
        prod = b.group(g, "alpha") * b.group(g, "ratio") * b.group(g, "cosine")
        c = b.group(g, "contribution")
        assert np.array_equal(np.isfinite(prod), np.isfinite(c))
        np.testing.assert_allclose(prod[np.isfinite(c)], c[np.isfinite(c)], atol=1e-12)


def test_contribution_derived_when_not_stored(geo):
    ds = geo[0]
    for store in (ds, to_compact(ds)):
        full, derived = _block(store), _block(store.drop_vars(
            [n for n in ("contribution", "tail_contribution") if n in store]))
        for g in ("sink", "tail"):
            np.testing.assert_allclose(derived.group(g, "contribution"),
                                       full.group(g, "contribution"), atol=1e-12)


def test_non_finite_sequences_excluded_with_warning(geo):
    ds = geo[0].copy()
    ds["finite"] = ds["finite"].copy(data=np.r_[0, np.ones(ds.sizes["sequence"] - 1)])
    with pytest.warns(RuntimeWarning, match="1 sequences had non-finite"):
        b = _block(ds)
    assert np.isnan(b.sink_rate[0]).all() and np.isfinite(b.sink_rate[1]).any()


def test_queries_below_k_and_beyond_length_are_invalid(geo):
    ds = geo[0]
    b = _block(ds)
    n = ds["length"].values
    assert np.isnan(b.sink_rate[:, :, :2]).all()
    for s in range(len(n)):
        assert np.isnan(b.sink_rate[s, :, n[s]:]).all()
        assert np.isfinite(b.sink_rate[s, :, 2:n[s]]).all()


def test_special_mask_excludes_keys(geo):
    ds = geo[0].copy()
    special = np.zeros((ds.sizes["sequence"], ds.sizes["position"]), bool)
    special[:, 3] = True
    ds["special"] = (("sequence", "position"), special)
    b = _block(ds)
    assert not b.semantic_key[:, 3].any() and not b.semantic_key[:, :2].any()
    assert b.semantic_key[0, 4]


def test_bad_options_and_empty_store(geo):
    ds = geo[0]
    with pytest.raises(ValueError, match="no sequences"):
        V.describe(ds.isel(sequence=slice(0, 0)))
    with pytest.raises(ValueError, match="sink keys"):
        V.describe(to_compact(ds), k=3)
    with pytest.raises(ValueError, match="tail"):
        V.describe(to_compact(ds), w=5)
    with pytest.raises(ValueError, match="layers"):
        V.describe(ds, layers=[7])
    bad = ds.copy()
    bad["finite"] = bad["finite"] * 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match="finite"):
            V.valid_sequences(bad)


def test_blocks_cover_sequences_in_chunk_multiples(geo):
    ds = geo[0].chunk({"sequence": 3})
    info = V.describe(ds)
    blocks = V.sequence_blocks(ds, info, elements=2 * 14 * 14 * 7, pairs=True)
    assert [b.start for b in blocks] == [0, 6] and blocks[-1].stop == 8
    blocks = V.sequence_blocks(ds, info, elements=1, pairs=True)
    assert len(blocks) == 8
