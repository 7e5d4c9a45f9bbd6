"""Sink rates and Gu et al. sink heads against a direct numpy computation and planted rates."""

from __future__ import annotations

import numpy as np

import tolerance as tol
from attngeom.analysis import sinks
from synthetic_stores import random_store, to_compact


def _planted():
    ds = random_store(n_seq=30, n_layer=2, n_head=4, n_pos=16, seed=11)
    rng = np.random.default_rng(0)
    means = np.array([[0.05, 0.25, 0.35, 0.9], [0.6, 0.1, 0.45, 0.2]])  # (L, H)
    alpha = ds["alpha"].values.copy()
    S, L, H, T, _ = alpha.shape
    concentration = 20.0
    draw = rng.beta(means[None, :, :, None] * concentration,
                    (1 - means[None, :, :, None]) * concentration, size=(S, L, H, T))
    ok = ~np.isnan(alpha[..., 0])
    alpha[..., 0] = np.where(ok, draw, np.nan)
    alpha[..., 0, 0] = np.where(ok[..., 0], 1.0, np.nan)  # the sink attends to itself
    return ds.assign(alpha=(ds["alpha"].dims, alpha)), means


def test_sink_rate_matches_direct_mean_over_queries_from_k():
    ds, means = _planted()
    out = sinks(ds, epsilon=0.3)
    a0 = ds["alpha"].values[..., 0]  # (S, L, H, Q)
    a0 = a0[:, :, :, 1:]  # queries i >= k = 1
    direct = np.nanmean(a0, axis=(0, 3))
    tol.assert_close(out["sink_rate_mean"].values, direct, tol.mean_of(a0, (0, 3)), "mean")
    pooled = a0.transpose(1, 2, 0, 3).reshape(2, 4, -1)
    tol.assert_close(out["sink_rate_sd"].values, np.nanstd(pooled, axis=-1, ddof=1),
                     tol.sd_of(pooled, -1), "sd")
    assert (out["n_queries"].values == np.isfinite(a0).sum((0, 3))).all()
    # the planted means are recovered within sampling error (not a rounding bound), the heads
    # above epsilon are sink heads
    np.testing.assert_allclose(out["sink_rate_mean"].values, means, atol=0.03)
    assert (out["is_sink_head"].values == (means > 0.3)).all()
    np.testing.assert_array_equal(out["sink_head_fraction"].values, [0.5, 0.5])   # 2 of 4
    assert list(out["sink_head_count"].values) == [2, 2]


def test_epsilon_and_k_options():
    ds, means = _planted()
    assert int(sinks(ds, epsilon=0.5)["sink_head_count"].sum()) == 2
    out = sinks(ds, sink_k=3)
    a0 = ds["alpha"].values[..., 3:, 0]
    tol.assert_close(out["sink_rate_mean"].values, np.nanmean(a0, axis=(0, 3)),
                     tol.mean_of(a0, (0, 3)), "mean")
    three = ds["alpha"].values[..., 3:, :3].sum(-1)              # + 2 additions per term
    tol.assert_close(out["sink_mass_mean"].values, np.nanmean(three, axis=(0, 3)),
                     tol.mean_of(three, (0, 3)) + tol.relative(2, tol.F64, vs=tol.F64), "mass")


def test_compact_dense_and_dask_agree():
    ds, _ = _planted()
    ref = sinks(ds)
    bound = tol.mean_of(ds["alpha"].values[..., 1:, 0], (0, 3))  # other blocks, another order
    for store in (to_compact(ds), ds.chunk({"sequence": 7})):
        out = sinks(store, block_elements=5000)
        tol.assert_close(out["sink_rate_mean"].values, ref["sink_rate_mean"].values, bound,
                         store.attrs["mode"])
        assert out.attrs["mode"] == store.attrs["mode"]


def _gu_reference(alpha0: np.ndarray, eps: float) -> np.ndarray:
    """Gu et al.'s released code, eval_sink_open_source.py: importance = mean of alpha_i0 over
    all queries i >= 0 per input (here NaN-padded rows), (importance > eps).mean over inputs."""
    importance = np.nanmean(alpha0, axis=-1)             # (S, L, H)
    return (importance > eps).mean(0)                    # (L, H)


def test_gu_per_input_count_matches_their_formula_whatever_k_is():
    ds, _ = _planted()
    a0 = ds["alpha"].values[..., 0]                      # (S, L, H, Q), NaN past each length
    for eps in (0.2, 0.3, 0.5):
        want = _gu_reference(a0, eps)
        for k in (1, 2):
            out = sinks(ds, epsilon=eps, sink_k=k)
            # a share of S inputs (one division), its mean over heads
            share = tol.total(ds.sizes["sequence"], 1.0, tol.F64, vs=tol.F64)
            np.testing.assert_allclose(out["gu_sink_share"].values, want, **share)
            assert out["gu_sink_head_share"].item() == np.mean(want)
            np.testing.assert_allclose(out["gu_layer_sink_share"].values, want.mean(1), **share)
            assert (out["gu_n_inputs"].values == ds.sizes["sequence"]).all()
    # per input it is not the pooled count: thresholding the pooled mean gives 0 or 1 per head
    out = sinks(ds, epsilon=0.3)
    per_input = out["gu_sink_share"].values
    assert ((per_input > 0) & (per_input < 1)).any()
