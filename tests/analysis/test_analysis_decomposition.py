"""Decomposition of log|c|: known variance shares, LMG against brute force, both layouts."""

from __future__ import annotations

from itertools import permutations

import numpy as np
import pytest
import statsmodels.api as sm

import tolerance as tol
from attngeom.analysis import decomposition
from attngeom.analysis.decomposition import Moments, shares
from synthetic_stores import (geometric_store, group_of_pairs, plant_factors, random_store,
                              to_compact)

# sink: ratio + cosine; tail: alpha + cosine; middle: alpha (variances width^2 / 12, sd^2)
ALPHA_WIDTH, COS_WIDTH, VN_SD, ON_SD = (0.3, 3.0, 3.0), (3.0, 3.0, 0.5), (1.0, 0.1), 0.1


def _expected_shares() -> np.ndarray:
    """(group, part) population shares of independent parts: var(part) / sum of variances."""
    var = np.array([[ALPHA_WIDTH[g] ** 2 / 12, VN_SD[0 if g == 0 else 1] ** 2 + ON_SD**2,
                     COS_WIDTH[g] ** 2 / 12] for g in range(3)])
    return var / var.sum(1, keepdims=True)


@pytest.fixture(scope="module")
def planted():
    ds = random_store(n_seq=80, n_layer=2, n_head=4, n_pos=24, seed=30, min_length=16)
    return plant_factors(ds, ALPHA_WIDTH, COS_WIDTH, VN_SD, ON_SD, negative=(0.0, 0.3, 0.1))


def _raw_parts(ds, layer=None):
    """Logs of the parts per group from the raw arrays, by the (query, key) labels."""
    T = ds.sizes["query"]
    labels = group_of_pairs(T, int(ds.attrs["sink_k"]), int(ds.attrs["tail_w"]))
    sel = ds if layer is None else ds.isel(layer=[layer])
    a, cos = sel["alpha"].values, sel["cosine"].values
    vn = sel["value_norm"].values[..., None, :]
    on = sel["output_norm"].values[..., :, None]
    la, lr, lc = np.log(a), np.log(vn / on), np.log(np.abs(cos))
    q = np.arange(T)[:, None] >= int(ds.attrs["sink_k"])
    out = {}
    for g, name in enumerate(("sink", "tail", "middle")):
        m = (labels == g) & q & np.isfinite(la) & np.isfinite(lr) & np.isfinite(lc)
        out[name] = (np.column_stack([la[m], lr[m], lc[m]]), cos[m])
    return out


def test_known_shares_and_paper_pattern(planted):
    out = decomposition(planted)
    expected = _expected_shares()
    # the population shares, within sampling error (not rounding)
    np.testing.assert_allclose(out["pooled_cov_share"].values, expected, atol=0.06)
    np.testing.assert_allclose(out["pooled_lmg_share"].values, expected, atol=0.06)
    # shares of one variance add up to 1: the three shares' bounds, and their sum's
    raw = [p for layer in (0, 1) for p, _ in _raw_parts(planted, layer).values()]
    one = 4 * max(tol.covariance_share(p).atol for p in raw)
    np.testing.assert_allclose(out["cov_share"].sum("part").values, 1.0, atol=one)
    np.testing.assert_allclose(out["lmg_share"].sum("part").values, 1.0, atol=one)
    assert list(out["pooled_top_parts"].values) == ["ratio+cosine", "alpha+cosine",
                                                     "alpha+cosine"]
    assert str(out["pooled_paper_pattern"].values) == "holds"
    assert bool(out["pooled_paper_pattern_holds"]) and out["paper_pattern_holds"].values.all()
    assert out.attrs["verdict"].startswith("As the paper expects")
    sink = out["pooled_lmg_share"].sel(group="sink")            # each share in the sentence
    for part in sink["part"].values:
        assert f"{part} {float(sink.sel(part=part)):.2f}" in out.attrs["verdict"]


def test_shares_equal_the_sample_covariance_of_the_raw_pairs(planted):
    out = decomposition(planted, block_elements=3000)  # many blocks: exercises the merging
    for layer in (0, 1, None):
        raw = _raw_parts(planted, layer)
        for g, (parts, cos) in raw.items():
            y = parts.sum(1)
            cov = np.cov(np.column_stack([parts, y]), rowvar=False)
            res = out if layer is None else out.isel(layer=layer)
            prefix = "pooled_" if layer is None else ""
            got = res[prefix + "cov_share"].sel(group=g).values
            np.testing.assert_allclose(got, cov[:3, 3] / cov[3, 3], **tol.covariance_share(parts))
            assert float(res[prefix + "n_pairs"].sel(group=g)) == len(y)
            assert float(res[prefix + "negative_fraction"].sel(group=g)) == tol.total(
                len(y), 1.0, tol.F64, vs=tol.F64).approx(np.mean(cos < 0))
    # the planted fractions, within sampling error
    np.testing.assert_allclose(out["pooled_negative_fraction"].values, [0.0, 0.3, 0.1],
                               atol=0.02)


def test_lmg_matches_brute_force_shapley_with_statsmodels():
    rng = np.random.default_rng(4)
    z = rng.normal(size=(3000, 3)) @ np.array([[1.0, 0.5, 0.0], [0.0, 1.0, 0.7],
                                                [0.0, 0.0, 1.0]])
    y = z.sum(1) + rng.normal(0, 0.5, 3000)  # correlated parts, R^2 < 1

    def r2(cols):
        return sm.OLS(y, sm.add_constant(z[:, list(cols)])).fit().rsquared if cols else 0.0

    brute = np.zeros(3)
    for order in permutations(range(3)):
        for pos, j in enumerate(order):
            brute[j] += (r2(order[: pos + 1]) - r2(order[:pos])) / 6
    m = Moments()
    data = np.column_stack([z, y])
    for chunk in np.array_split(data, 7):
        m.add(np.ascontiguousarray(chunk.T))  # columns (p, n)
    # streamed moment sums against two passes: gamma(2n + 8) rms_i rms_j
    rms = np.sqrt((data ** 2).mean(0))
    tol.assert_close(m.cov, np.cov(data, rowvar=False),
                     tol.dot(2 * len(y) + 8, np.outer(rms, rms), tol.F64, vs=tol.F64), "cov")
    got = shares(m.cov)
    # R^2 of least-squares fits from the covariance and by statsmodels: kappa(X)^2
    fit = tol.conditioned(2 * len(y) + 8, np.linalg.cond(sm.add_constant(z)) ** 2, tol.F64,
                          vs=tol.F64)
    np.testing.assert_allclose(got["lmg_share"], brute, atol=fit.rtol)   # shares of R^2 <= 1
    assert got["r2_full"] == fit.approx(r2((0, 1, 2)))


def test_other_pattern_is_reported():
    ds = random_store(n_seq=60, n_layer=1, n_head=3, n_pos=20, seed=31, min_length=14)
    ds = plant_factors(ds, (3.0, 3.0, 3.0), COS_WIDTH, (0.1, 0.1), 0.1)  # sink: alpha too
    out = decomposition(ds)
    assert str(out["pooled_top_parts"].sel(group="sink").values) == "alpha+cosine"
    assert str(out["pooled_paper_pattern"].values) == "partly"
    assert out.attrs["verdict"].startswith("Partly")


def test_compact_has_sink_and_tail_and_middle_totals(planted):
    dense = decomposition(planted)
    compact = decomposition(to_compact(planted))
    for name in ("cov_share", "lmg_share"):               # the same pairs: exact
        np.testing.assert_array_equal(compact[name].sel(group=["sink", "tail"]).values,
                                      dense[name].sel(group=["sink", "tail"]).values)
        assert np.isnan(compact[name].sel(group="middle").values).all()
    T = planted.sizes["key"]                 # the middle: stored sums, or summed here (T terms)
    for name in ("total_alpha_mean", "total_contribution_mean"):
        size = np.nanmean(np.nansum(np.abs(planted[name.split("_")[1]].values), -1))
        np.testing.assert_allclose(compact[name].values, dense[name].values,
                                   **tol.total(T, size, tol.F64, vs=tol.F64))
    assert "totals only" in compact.attrs["middle_group"]
    with pytest.raises(ValueError, match="sink_k"):
        decomposition(to_compact(planted, k=2), sink_k=1)


def test_group_totals_of_contribution_sum_to_one():
    """Sum_j c_ij = 1 for every query: the three groups' mean totals add up to one."""
    ds = geometric_store(n_seq=10, n_layer=2, n_head=2, n_pos=16, sink_k=2, tail_w=3, seed=3)
    T, d = ds.sizes["key"], 5                      # geometric_store's float64, d = 5
    size = np.nanmax(np.nansum(np.abs(ds["contribution"].values), -1))
    for store in (ds, to_compact(ds)):
        out = decomposition(store)
        # each c from a chain of d + T + 4 roundings, then the group totals and their means
        np.testing.assert_allclose(out["total_contribution_mean"].sum("group").values, 1.0,
                                   **tol.sums_to_one(T + 3, depth=d + 2 * T + 4, size=size,
                                                     dtype=tol.F64))
        np.testing.assert_allclose(out["total_alpha_mean"].sum("group").values, 1.0,
                                   **tol.sums_to_one(T + 3, depth=2 * T + 1, dtype=tol.F64))
