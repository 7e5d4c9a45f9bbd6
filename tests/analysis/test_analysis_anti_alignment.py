"""Anti-alignment: planted negative cosines are found, null heads are calibrated."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

import tolerance as tol
from attngeom.analysis import anti_alignment
from attngeom.analysis.anti_alignment import one_sample_less
from synthetic_stores import plant_cosines, random_store, to_compact

EFFECT = -0.1


def _planted(n_layer=2, n_head=4, seed=0):
    value = np.zeros((n_layer, n_head))
    value[0, :2] = EFFECT
    residual = np.zeros((n_layer, n_head))
    residual[1, 1:3] = EFFECT
    ds = random_store(n_seq=40, n_layer=n_layer, n_head=n_head, n_pos=16, seed=seed)
    return plant_cosines(ds, value, residual, seed=seed + 1), value, residual


def test_statistics_use_per_sequence_means():
    ds, _, _ = _planted()
    out = anti_alignment(ds, mixed=False)
    cos = ds["sink_value_cosine"].values[:, 0, 2, 1:]  # layer 0, head 2, keys j >= 1
    per_seq = np.nanmean(cos, axis=-1)
    ref = stats.ttest_1samp(per_seq, 0, alternative="less")
    sel = dict(layer=0, head=2)
    # means of per-sequence means: gamma(keys + sequences) x mean |cos|
    mean = tol.total(cos.shape[-1] + len(per_seq), np.nanmean(np.abs(cos)), tol.F64, vs=tol.F64)
    assert float(out["mean_cos"].sel(sel)) == mean.approx(np.mean(per_seq))
    np.testing.assert_allclose(float(out["p_value"].sel(sel)), ref.pvalue,
                               **tol.t_test(per_seq, ref.statistic))
    # ranks and their exact null distribution (scipy's, on the same means): exact
    assert float(out["wilcoxon_p_value"].sel(sel)) == stats.wilcoxon(
        per_seq, alternative="less").pvalue
    assert float(out["n_sequences"].sel(sel)) == 40
    res = ds["sink_residual_cosine"].values[:, 1, 3, 1:]
    mean = tol.total(res.shape[-1] + len(res), np.nanmean(np.abs(res)), tol.F64, vs=tol.F64)
    np.testing.assert_allclose(float(out["residual_mean_cos"].sel(layer=1, head=3)),
                               np.mean(np.nanmean(res, -1)), **mean)


def test_planted_effects_are_detected_with_power():
    ds, value, residual = _planted()
    out = anti_alignment(ds)
    assert (out["anti_aligned"].values == (value < 0)).all()
    assert (out["residual_anti_aligned"].values == (residual < 0)).all()
    np.testing.assert_allclose(out["mean_cos"].values, value, atol=0.05)   # sampling, planted
    assert (out["q_value_by"].values[value < 0] < 0.05).all()
    assert (out["wilcoxon_q_value"].values[value < 0] < 0.05).all()
    # Cohen's d: per-sequence means have sd sqrt(0.1^2 + 0.3^2 / n_keys) ~ 0.11
    d = out["cohens_d"].values[value < 0]
    assert (d < -0.5).all()
    assert (out["cohens_d_ci_low"] < out["cohens_d"]).all()
    assert (out["cohens_d_ci_high"].values[value < 0] < 0).all()
    # the per-layer mixed model sees layer 0's value and layer 1's residual effects
    assert out["mixed_mean_cos"].values[0] < 0 and out["mixed_p_value"].values[0] < 0.05
    assert out["residual_mixed_p_value"].values[1] < 0.05
    assert abs(out["mixed_mean_cos"].values[1]) < 0.03  # null layer: estimate near 0
    sub = anti_alignment(ds, mixed_max_sequences=20, seed=3)
    assert sub["mixed_p_value"].values[0] < 0.05 and sub.attrs["analysis_seed"] == 3
    compact = anti_alignment(to_compact(ds))          # the same per-token values: exact
    np.testing.assert_array_equal(compact["p_value"].values, out["p_value"].values)


def test_cohens_d_ci_coverage():
    rng = np.random.default_rng(1)
    true_d, hits, n_rep = -0.4, 0, 300
    for _ in range(n_rep):
        r = one_sample_less(rng.normal(true_d, 1.0, 50))
        hits += r["cohens_d_ci_low"] < true_d < r["cohens_d_ci_high"]
    assert 0.9 <= hits / n_rep <= 0.99


def test_null_is_calibrated():
    """No effect, independent heads: p-values uniform (3 stores pooled), no BH/BY discoveries."""
    outs = []
    for seed in (21, 41, 61):
        ds = random_store(n_seq=30, n_layer=4, n_head=8, n_pos=12, seed=seed)
        ds = plant_cosines(ds, np.zeros((4, 8)), np.zeros((4, 8)), seed=seed + 1, shared=False)
        outs.append(anti_alignment(ds, mixed=False))
    for prefix in ("", "residual_"):
        p = np.concatenate([o[prefix + "p_value"].values.ravel() for o in outs])
        assert stats.kstest(p, "uniform").pvalue > 0.01
        for o in outs:
            assert int((o[prefix + "q_value"].values < 0.05).sum()) <= 1
            assert int((o[prefix + "q_value_by"].values < 0.05).sum()) <= 1


def test_special_tokens_are_excluded():
    ds, _, _ = _planted()
    cos = ds["sink_value_cosine"].values.copy()
    cos[:, :, :, 5] = 1.0  # a special token aligned with the sink in every head
    special = np.zeros((ds.sizes["sequence"], ds.sizes["position"]), bool)
    special[:, 5] = True
    marked = ds.assign(sink_value_cosine=(ds["sink_value_cosine"].dims, cos),
                       special=(("sequence", "position"), special))
    unmarked = marked.drop_vars("special")
    a = anti_alignment(marked, mixed=False)["mean_cos"].values
    b = anti_alignment(unmarked, mixed=False)["mean_cos"].values
    ref = anti_alignment(ds.assign(special=(("sequence", "position"), special)),
                         mixed=False)["mean_cos"].values
    np.testing.assert_array_equal(a, ref)             # the special token left out: the same data
    assert (b > a).all()
