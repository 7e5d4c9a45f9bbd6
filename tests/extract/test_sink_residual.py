"""The non-sink part r_i = sum_{j>=k} alpha_ij v~_j stays exact when the sink takes almost all
the attention (alpha_i0 -> 1), where z - alpha_i0 v_0 would cancel in float32.

Reference: float64 numpy, r summed over the non-sink keys directly.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tolerance as tol
from attngeom.extract.measurement.geometry import Projection
from attngeom.extract.measurement.layer import Options, measure_layer, prepare_masks


def _layer(sink_logit: float, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    B, H, T, dh, d = 2, 3, 24, 8, 16
    q = torch.randn(B, H, T, dh, generator=g)
    k = torch.randn(B, H, T, dh, generator=g) * 0.3
    v = torch.randn(B, H, T, dh, generator=g)
    v[:, :, 0] *= 20.0                                   # a large sink value, as in real sinks
    # a key direction every query aligns with, on the sink only: alpha_i0 -> 1
    k[:, :, 0] = q.mean(2) / q.mean(2).norm(dim=-1, keepdim=True) * sink_logit
    q = q + q.mean(2, keepdim=True) * 3.0
    w_o = torch.randn(H * dh, d, generator=g) / dh ** 0.5
    return q, k, v, Projection.from_weight(w_o, H)


def _reference(q, k, v, w_o, H, scale):
    q, k, v, w = (x.double().numpy() for x in (q, k, v, w_o))
    T = q.shape[2]
    s = np.einsum("bhid,bhjd->bhij", q, k) * scale
    s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
    a = np.exp(s - s.max(-1, keepdims=True))
    a /= a.sum(-1, keepdims=True)
    dh = q.shape[-1]
    vt = np.einsum("bhjd,hde->bhje", v, w.reshape(H, dh, -1))          # v~ (B, H, T, d)
    r = np.einsum("bhij,bhje->bhie", a[..., 1:], vt[:, :, 1:])           # non-sink part
    r_norm = np.linalg.norm(r, axis=-1)
    with np.errstate(invalid="ignore"):              # query 0 has no non-sink key
        cos = (r * vt[:, :, :1]).sum(-1) / (r_norm * np.linalg.norm(vt[:, :, :1], axis=-1))
    return a[..., 0], r_norm, cos


@pytest.mark.parametrize("mode", ["compact", "dense"])
@pytest.mark.parametrize("sink_logit", [14.0, 22.0])
def test_residual_exact_when_sink_takes_almost_all(mode, sink_logit):
    q, k, v, proj = _layer(sink_logit)
    B, H, T, _ = q.shape
    scale = q.shape[-1] ** -0.5
    allowed = torch.ones(T, T, dtype=torch.bool).tril()[None, None].expand(B, 1, T, T)
    token = torch.ones(B, T, dtype=torch.bool)
    opts = Options(mode=mode)
    masks = prepare_masks(allowed, token, opts, q.dtype)
    _, out = measure_layer(q, k, v, masks, scale, proj, opts)
    alpha0, r_norm, cos = _reference(q, k, v, proj.weight, H, scale)
    assert np.median(1 - alpha0[..., 1:]) < 1e-3            # the regime that cancels
    got_norm = out["residual_norm"].double().numpy()[..., 1:]
    got_cos = out["sink_residual_cosine"].double().numpy()[..., 1:]
    # r's terms are alpha_ij v~_j with alpha_ij = exp(s_ij - lse_i) tiny: relative error
    # (|s| + |lse|) u each, so the chain's gamma(N) times 1 + the largest |logit| (relative for
    # the norm, twice that absolute for the cosine); N: this layer's chain
    logits = np.abs(np.einsum("bhid,bhjd->bhij", q.double().numpy(), k.double().numpy()))
    size = 1 + 2 * scale * logits.max()
    n = tol.attention_terms(d=proj.weight.shape[1], d_head=q.shape[-1], heads=H, T=T)
    np.testing.assert_allclose(got_norm, r_norm[..., 1:],
                               **(tol.relative(n, vs=tol.F64) * size))
    np.testing.assert_allclose(got_cos, cos[..., 1:], **tol.dot(n, 2 * size, vs=tol.F64))
