"""Planning the pass over a store: options, excluded sequences, block sizes (analysis/blocks.py).

The masks and key groups of each block are the store accessor's (tests/store/test_accessor.py).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import tolerance as tol
from attngeom.analysis import blocks as B
from attngeom.analysis import sinks
from synthetic_stores import geometric_store, to_compact


@pytest.fixture(scope="module")
def geo():
    return geometric_store(n_seq=8, n_layer=2, n_head=2, n_pos=14, sink_k=2, tail_w=3, seed=5)


def test_bad_options_and_empty_store(geo):
    ds = geo
    with pytest.raises(ValueError, match="no sequences"):
        B.describe(ds.isel(sequence=slice(0, 0)))
    with pytest.raises(ValueError, match="sink keys"):
        B.describe(to_compact(ds), k=3)
    with pytest.raises(ValueError, match="tail"):
        B.describe(to_compact(ds), w=5)
    with pytest.raises(ValueError, match="layers"):
        B.describe(ds, layers=[7])
    info = B.describe(ds, k=1, w=5)
    assert (info.k, info.w, info.store_k, info.layers) == (1, 5, 2, (0, 1))
    bad = ds.copy()
    bad["finite"] = bad["finite"] * 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match="finite"):
            B.valid_sequences(bad)


def test_non_finite_sequences_excluded_with_warning(geo):
    ds = geo.copy()
    ds["finite"] = ds["finite"].copy(data=np.r_[0, np.ones(ds.sizes["sequence"] - 1)])
    with pytest.warns(RuntimeWarning, match="1 sequences had non-finite"):
        out = sinks(ds)
    # sequence 0 left out: the same result as the store without it (other blocks)
    rest = geo.isel(sequence=slice(1, None))
    tol.assert_close(out["sink_rate_mean"].values, sinks(rest)["sink_rate_mean"].values,
                     tol.mean_of(rest["alpha"].values[..., 2:, 0], (0, 3)), "sink_rate_mean")


def test_blocks_cover_sequences_in_chunk_multiples(geo):
    ds = geo.chunk({"sequence": 3})
    width = ds.attngeom.block_width(("sink", "tail"), 2, 3)
    assert width == 14 and ds.attngeom.block_width(("sink",), 2, 3) == 3
    blocks = B.sequence_blocks(ds, width, elements=2 * 14 * 14 * 7)
    assert [b.start for b in blocks] == [0, 6] and blocks[-1].stop == 8
    blocks = B.sequence_blocks(ds, width, elements=1)
    assert len(blocks) == 8
    assert B.sequence_blocks(ds.compute(), width, elements=2 * 14 * 14 * 5) == [
        slice(0, 5), slice(5, 8)]


def test_block_size_does_not_change_results(geo):
    """Many small blocks (each chunk split) or one big block: the same statistics."""
    from attngeom.analysis import decomposition

    ds = geo.chunk({"sequence": 3})
    for store in (ds, to_compact(ds)):
        small, big = (decomposition(store, block_elements=e) for e in (1, 10**9))
        for name in ("cov_share", "n_pairs", "total_alpha_mean"):     # the same data, summed
            tol.assert_close(small[name].values, big[name].values,    # in other blocks
                             tol.ANALYSIS_FLOAT64 * np.nanmax(np.abs(big[name].values)), name)
