"""The scores a removal ranks keys by, fast: float32 scores of a whole layer and their error.

:func:`fast_scores` computes every (head, query, key) score of a layer in float32 (the dtype of
the layer's attention) and bounds its rounding error (:class:`~.selection.ErrorBound`); the rows
whose order the bound leaves open are ranked again from float64 scores
(:class:`~.exact_scores.ExactScores`, :mod:`.selection`).
"""

from __future__ import annotations

import torch

from .dense import grouped, weighted_values
from .exact_scores import finite, unknown_metric
from ..measurement.geometry import Projection, repeat_kv, vecdot
from .selection import ErrorBound

Tensor = torch.Tensor
# The float32 rounding error of each metric's fast scores, in units of u * Lambda * |score|
# (attention, value_weighted), u * Lambda * (1 + kappa) * |score| (value_weighted_normalized) and
# u * Lambda * (1 + kappa) * alpha ||v~|| / ||o|| (contribution; u the unit roundoff, Lambda =
# logit_scale, kappa = sum_j alpha ||v~|| / ||o||), u * (Lambda_h + sqrt(sum_h' (Lambda_h'
# s_h')^2) / ||o||) times the same size (contribution_layer, see fast_scores): ten times the
# largest ratio measured on SmolLM2-135M prose (8 texts, every layer at T = 128, 7 layers at
# T = 512): 3.2, 3.2, 1.5, 1.0; contribution_layer 1.0 (8 texts, every layer at T = 128 and 512;
# 0.14 on the random model of benchmarks/bench_faithfulness.py). At the cut the signed metrics
# use it relative to |score| (see fast_scores).
ERROR_UNITS = {"attention": 32.0, "value_weighted": 32.0, "value_weighted_normalized": 16.0,
               "contribution": 10.0, "contribution_layer": 10.0}


def logit_scale(query: Tensor, key: Tensor, scale: float,
                sinks: Tensor | None = None) -> Tensor:
    """Lambda (B, H, T) = scale |q_i| max_j |k_j| (+ |sink_i|) + sqrt(Tk), the size of alpha's
    rounding error.

    A logit's rounding error grows with |q_i| |k_j| scale, the softmax's with the number of
    keys (and with a learned sink logit, subtracted from every logit when it is the largest);
    alpha's relative error is a few u * Lambda.
    """
    H, G = query.shape[1], key.shape[1]
    k_max = key.float().norm(dim=-1).amax(-1).repeat_interleave(H // G, dim=1)     # (B, H)
    lam = scale * query.float().norm(dim=-1) * k_max[..., None] + key.shape[2] ** 0.5
    return lam if sinks is None else lam + sinks.float().abs()


def fast_scores(metric: str, alpha: Tensor, value: Tensor, proj: Projection, lam: Tensor,
                out: Tensor | None = None, blocks=None) -> tuple[Tensor, ErrorBound]:
    """Scores (B, H, T, Tk) in alpha's dtype (into ``out``; ``alpha`` itself for attention)
    and the relative size of their rounding error.

    Parameters
    ----------
    alpha : (B, H, T, Tk) clean attention; value : (B, G, Tk, dh) values per kv head; proj : the
    output projection in alpha's dtype; lam : (B, H, T) :func:`logit_scale`; blocks :
    :func:`~.dense.row_blocks` of the layer's mask (None: every row over every key).

    Error model (fitted, see :data:`ERROR_UNITS`): alpha's relative error is O(u Lambda); the
    head output o = sum_j alpha v~ has an absolute error O(u Lambda sum_j alpha ||v~||),
    relative kappa = sum_j alpha ||v~|| / ||o|| times that, which every score divided by or
    projected on o inherits. At the layer level (contribution_layer) the sum over keys and heads
    is taken in quadrature, as the roundings of alpha's entries have independent signs: relative
    u (Lambda_h + sqrt(sum_h' (Lambda_h' s_h')^2) / ||o||), s_h = sqrt(sum_j alpha^2 ||v~||^2);
    the sum of |terms| overstated it by up to sqrt(Tk) where attention is diffuse, and with it
    the rows recomputed in float64. The signed scores' error is relative to |score| except
    near 0 (a key almost orthogonal to o).
    """
    if metric not in ERROR_UNITS:
        raise unknown_metric(metric)
    unit = ERROR_UNITS[metric] * torch.finfo(alpha.dtype).eps / 2
    if metric == "attention":
        return alpha, ErrorBound(unit * lam)
    H, dh = alpha.shape[1], value.shape[-1]
    vf = repeat_kv(value, H).to(alpha.dtype)                            # (B, H, Tk, dh)
    value_norm = vecdot(vf @ proj.gram[None], vf).clamp_min(0).sqrt()   # ||v~_j|| (B, H, Tk)
    out = torch.empty_like(alpha) if out is None else out
    if metric == "value_weighted":
        return torch.mul(alpha, value_norm[:, :, None, :], out=out), ErrorBound(unit * lam)
    if metric == "contribution_layer":
        return _layer_scores(alpha, value, value_norm, proj, lam, unit, out, blocks)
    zs = weighted_values(alpha, torch.cat([vf, value_norm[..., None]], -1), blocks)   # z, mass
    z, mass = zs[..., :dh], zs[..., dh]
    zg = z @ proj.gram[None]
    output_norm = vecdot(zg, z).clamp_min(0).sqrt()                     # ||o_i^h|| (B, H, T)
    if metric == "value_weighted_normalized":
        torch.mul(alpha, value_norm[:, :, None, :], out=out).div_(output_norm[..., None])
        rel = unit * lam * (1 + mass / output_norm)
        return _finite_(out, output_norm), ErrorBound(finite(rel))
    g = zg / output_norm.square()[..., None]                            # o_i^h / ||o_i^h||^2
    rel = unit * lam * (1 + mass / output_norm)
    return _project(alpha, g, value, output_norm, out), ErrorBound(finite(rel))


def _layer_scores(alpha: Tensor, value: Tensor, value_norm: Tensor, proj: Projection,
                  lam: Tensor, unit: float, out: Tensor, blocks) -> tuple[Tensor, ErrorBound]:
    """contribution_layer's fast scores (see :func:`fast_scores`)."""
    B, H, T, _ = alpha.shape
    dh = value.shape[-1]
    zf = weighted_values(alpha, value, blocks).transpose(1, 2).reshape(B, T, H * dh)   # z_i
    u = zf @ proj.full                                                  # o_i W_O^T = z_i W_O W_O^T
    layer_norm = vecdot(u, zf).clamp_min(0).sqrt()                      # ||o_i|| (B, T)
    u = u.view(B, T, H, dh).transpose(1, 2)                             # o_i (W_O^h)^T per head
    g = u / layer_norm.square()[:, None, :, None]
    # s_h = sqrt(sum_j alpha^2 ||v~||^2): the norm of the value-weighted scores (B, H, T)
    weighted = torch.mul(alpha, value_norm[:, :, None, :], out=out)
    spread = torch.linalg.vector_norm(weighted, dim=-1)
    heads = (lam * spread).square().sum(1).sqrt()                       # (B, T) in quadrature
    rel = unit * (lam + (heads / layer_norm)[:, None])
    return _project(alpha, g, value, layer_norm, out), ErrorBound(finite(rel))


def _project(alpha: Tensor, g: Tensor, value: Tensor, norm: Tensor, out: Tensor) -> Tensor:
    """alpha_ij (g_i . v_j) into ``out`` (B, H, T, Tk): g (B, H, T, dh), value (B, G, Tk, dh)."""
    G = value.shape[1]
    torch.matmul(grouped(g.contiguous(), G), value.to(alpha.dtype).transpose(-1, -2),
                 out=grouped(out, G))
    return _finite_(out.mul_(alpha), norm)


def _finite_(s: Tensor, norm: Tensor) -> Tensor:
    """:func:`~.exact_scores.finite` in place, only where an output norm of 0 can have made inf or NaN."""
    return s.nan_to_num_(nan=0.0, posinf=torch.finfo(s.dtype).max,
                         neginf=-torch.finfo(s.dtype).max) if (norm == 0).any() else s
