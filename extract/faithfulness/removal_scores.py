"""The scores a removal ranks keys by, fast: the head-local metrics' float32 kernels.

Each ``fast`` kernel (registered by name in :mod:`.kernels`; called by
:func:`~.layer_scores.fast_scores`, whose docstring gives the error model) computes every
(head, query, key) score of a layer in float32 (the dtype of the layer's attention) from a
:class:`FastLayer` and bounds its rounding error (:class:`~.selection.ErrorBound`); the rows
whose order the bound leaves open are ranked again from refined scores where a kernel gives
them (contribution_layer's), else from float64 ones (:class:`~.layer_scores.ExactScores`,
:mod:`.selection`, :mod:`.near`).
"""

from __future__ import annotations

from functools import cached_property

import torch

from ..measurement.geometry import Projection, repeat_kv, vecdot
from .base import finite
from .dense import grouped, weighted_values
from .near import Refine
from .selection import ErrorBound

Tensor = torch.Tensor
SPREAD_BYTES = 4 << 20   # the temporary of :attr:`FastLayer.spread`, a block of rows at a time


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


def within_scale(lam: Tensor, n_keys: int) -> Tensor:
    """Lambda_w (B, H, T): :func:`logit_scale` without the softmax normaliser's sqrt(Tk),
    whose rounding scales a whole (head, query) row alike; 1 for the exponential's and the
    division's own rounding."""
    return lam - (n_keys ** 0.5 - 1)


class FastLayer:
    """One layer's float32 inputs to the fast scores, and what several metrics share (each
    computed once, on first use).

    alpha (B, H, T, Tk) clean attention; value (B, G, Tk, dh) values per kv head; proj the
    output projection in alpha's dtype; lam (B, H, T) :func:`logit_scale`; out the scores'
    buffer; blocks :func:`~.dense.row_blocks` of the layer's mask (None: every row, every key);
    context the layer's :class:`~.context.LayerContext` (what a metric ``needs``: its index,
    the rows' content keys, the residual input, the pass's carry) or None.
    """

    def __init__(self, alpha: Tensor, value: Tensor, proj: Projection, lam: Tensor,
                 out: Tensor | None = None, blocks=None, context=None):
        self.alpha, self.value, self.proj, self.lam, self.blocks = alpha, value, proj, lam, blocks
        self._out, self.context = out, context

    @cached_property
    def out(self) -> Tensor:
        return torch.empty_like(self.alpha) if self._out is None else self._out

    @cached_property
    def vf(self) -> Tensor:
        """Values per query head (B, H, Tk, dh) in alpha's dtype."""
        return repeat_kv(self.value, self.alpha.shape[1]).to(self.alpha.dtype)

    @cached_property
    def value_norm(self) -> Tensor:
        """||v~_j^h|| (B, H, Tk)."""
        return vecdot(self.vf @ self.proj.gram[None], self.vf).clamp_min(0).sqrt()

    @cached_property
    def spread(self) -> Tensor:
        """q (B, H, T) = sqrt(sum_j alpha^2 ||v~_j||^2): the size of the head output's error
        from alpha's, whose roundings have independent signs."""
        n = self.value_norm.reshape(-1, 1, self.alpha.shape[-1]).to(self.alpha.dtype)
        return self._by_rows(lambda a, w, out: torch.linalg.vector_norm(
            a * n[..., :w], dim=-1, out=out), self.alpha.dtype)

    @cached_property
    def normaliser(self) -> Tensor:
        """D (B, H, T) = |sum_j alpha_j - 1| / u + 1, the float32 softmax normaliser's rounding
        in units of u, measured: a factor common to the row, which the row sum shows to within
        the division's own rounding (u; the sum is taken in float64). Where a learned sink takes
        part of the row's weight (the context's ``sinks``) or alpha is float64 already, the
        model's sqrt(Tk) instead."""
        Tk = self.alpha.shape[-1]
        sinks = self.context is not None and self.context.sinks is not None
        if sinks or self.alpha.dtype == torch.float64:     # no wider sum to measure it with
            return torch.full_like(self.lam, Tk ** 0.5)
        u = torch.finfo(self.alpha.dtype).eps / 2
        total = self._by_rows(lambda a, w, out: out.copy_(a.sum(-1, dtype=torch.float64)),
                              torch.float64)
        return total.sub_(1).abs_().div_(u).add_(1).to(self.lam.dtype)

    def _by_rows(self, fn, dtype) -> Tensor:
        """(B, H, T) of ``fn(alpha rows (B H, r, w), w, out (B H, r))``, a block of rows at a
        time over its leading keys (:func:`~.dense.row_blocks`; w: how many), so that no
        (B, H, T, Tk) temporary is made."""
        B, H, T, Tk = self.alpha.shape
        a = self.alpha.reshape(B * H, T, Tk)
        out = a.new_empty(B * H, T, dtype=dtype)
        for t0, t1, w in self.blocks or ((0, T, Tk),):
            rows = max(1, SPREAD_BYTES // (a.element_size() * B * H * max(1, w)))
            for r in range(t0, t1, rows):
                e = min(r + rows, t1)
                fn(a[:, r:e, :w], w, out[:, r:e])
        return out.view(B, H, T)

    @cached_property
    def head_output(self) -> tuple[Tensor, Tensor, Tensor]:
        """z_i^h (B, H, T, dh), z_i G_h and ||o_i^h|| (B, H, T), and the mass
        sum_j alpha ||v~_j|| (B, H, T), from one pass of alpha over [v, ||v~||]."""
        dh = self.vf.shape[-1]
        zs = weighted_values(self.alpha, torch.cat([self.vf, self.value_norm[..., None]], -1),
                             self.blocks)
        z, mass = zs[..., :dh], zs[..., dh]
        zg = z @ self.proj.gram[None]
        return zg, vecdot(zg, z).clamp_min(0).sqrt(), mass


def fast_attention(x: FastLayer, unit: float) -> tuple[Tensor, ErrorBound]:
    """alpha itself; error u Lambda alpha."""
    return x.alpha, ErrorBound(unit * x.lam)


def fast_value_weighted(x: FastLayer, unit: float) -> tuple[Tensor, ErrorBound]:
    """alpha ||v~||; error u Lambda |score|."""
    return (torch.mul(x.alpha, x.value_norm[:, :, None, :], out=x.out),
            ErrorBound(unit * x.lam))


def fast_value_weighted_normalized(x: FastLayer, unit: float) -> tuple[Tensor, ErrorBound]:
    """alpha ||v~|| / ||o||; error u (Lambda_w + Lambda q / ||o||) |score|, contribution's
    model (:func:`fast_contribution`): the softmax normaliser's rounding scales alpha's row and
    o alike and cancels, so that scores of different heads compare within it (query and token
    granularity, where each row's bound is its heads' largest)."""
    _, output_norm, _ = x.head_output
    torch.mul(x.alpha, x.value_norm[:, :, None, :], out=x.out).div_(output_norm[..., None])
    lam_w = within_scale(x.lam, x.alpha.shape[-1])
    rel = unit * (lam_w + x.lam * x.spread / output_norm)
    return _finite_(x.out, output_norm), ErrorBound(finite(rel))


def fast_contribution(x: FastLayer, unit: float) -> tuple[Tensor, ErrorBound]:
    """alpha <o, v~> / ||o||^2; error u (Lambda_w + Lambda q / ||o||) alpha ||v~|| / ||o||.

    The score is unchanged by a factor common to alpha's row (the normaliser's rounding scales
    o alike): alpha's own error counts Lambda_w (:func:`within_scale`); o's error from alpha's
    is taken in quadrature (q, :attr:`FastLayer.spread`), with Lambda's sqrt(Tk) for the sum's
    own rounding. Ranked by |score| it is summed, u Lambda (1 + kappa) (``magnitude``).
    """
    zg, output_norm, mass = x.head_output
    g = zg / output_norm.square()[..., None]                            # o_i^h / ||o_i^h||^2
    lam_w = within_scale(x.lam, x.alpha.shape[-1])
    rel = unit * (lam_w + x.lam * x.spread / output_norm)
    summed = unit * x.lam * (1 + mass / output_norm)
    return (_project(x.alpha, g, x.value, output_norm, x.out),
            ErrorBound(finite(rel), magnitude=finite(summed)))


def fast_contribution_layer(x: FastLayer, unit: float) -> tuple[Tensor, ErrorBound]:
    """alpha <o_i, v~_j^h> / ||o_i||^2; error u (Lambda_w + D + Q / ||o_i||) |score|, Q =
    sqrt(sum_h (Lambda_w q_h)^2 + (D_h ||o_i^h||)^2): alpha's error per key (Lambda_w) and its
    row's normaliser (D, :attr:`FastLayer.normaliser`, a factor on head h's output), the heads'
    in quadrature (see fast_scores). Within one (head, query) row (``within``) the row's own
    normaliser scales its alpha alike: Lambda_w + Q / ||o_i||. With the layer's context, the
    scores of chosen keys refined (``refine``, :func:`_refiner`).
    """
    alpha, value, lam = x.alpha, x.value, x.lam
    B, H, T, Tk = alpha.shape
    dh = value.shape[-1]
    zf = weighted_values(alpha, value, x.blocks).transpose(1, 2).reshape(B, T, H * dh)  # z_i
    u = zf @ x.proj.full                                                # o_i W_O^T = z_i W_O W_O^T
    layer_norm = vecdot(u, zf).clamp_min(0).sqrt()                      # ||o_i|| (B, T)
    u = u.view(B, T, H, dh).transpose(1, 2)                             # o_i (W_O^h)^T per head
    g = u / layer_norm.square()[:, None, :, None]
    lam_w, d = within_scale(lam, Tk), x.normaliser
    zh = zf.view(B, T, H, dh).transpose(1, 2)                           # z_i^h (B, H, T, dh)
    head_norm = vecdot(zh @ x.proj.gram[None], zh).clamp_min(0).sqrt()  # ||o_i^h|| (B, H, T)
    heads = (lam_w * x.spread).square_().add_((d * head_norm).square_()).sum(1).sqrt_()
    heads = (heads / layer_norm)[:, None]                               # Q / ||o_i|| (B, 1, T)
    rel, within = unit * (lam_w + d + heads), unit * (lam_w + heads)
    refine = None if x.context is None else _refiner(x.context, zf, unit * heads[:, 0])
    return (_project(alpha, g, value, layer_norm, x.out),
            ErrorBound(finite(rel), within=finite(within), refine=refine))


def _refiner(context, zf: Tensor, error: Tensor) -> Refine:
    """contribution_layer's refined scores t_j = exp(l_j - max l) <o'_i, v~_j^h> / ||o'_i||^2
    (:data:`.near.Refine`) of a few keys: l their logits in float64, o'_i = z~_i W_O in
    float64 from the float32 head outputs zf (B, T, H dh), so that alpha's rounding in this
    row (the logits', the normaliser's, a factor common to the row) is out, and o's remains:
    |do| <= ``error`` (B, T) ||o||, whence |dt| <= error (2 |t| + exp(l_j - max l) ||v~_j|| /
    ||o'||) to first order (the key's size: a key almost orthogonal to o has an error larger
    than its score)."""
    q, k, v, proj = context.query, context.key, context.value, context.proj
    H, rep, dh = q.shape[1], q.shape[1] // k.shape[1], v.shape[-1]

    def refine(b: Tensor, i: Tensor, h: Tensor, keys: Tensor) -> tuple[Tensor, Tensor]:
        g = (h // rep)[:, None]
        logits = torch.einsum("nd,nkd->nk", q[b, h, i].double(),
                              k[b[:, None], g, keys].double()).mul_(context.scaling)
        if context.softcap is not None:
            logits = logits.div_(context.softcap).tanh_().mul_(context.softcap)
        weight = logits.sub_(logits.amax(-1, keepdim=True)).exp_()            # (n, K)
        o = zf[b, i].double() @ proj.weight                                  # o'_i (n, d)
        norm = o.norm(dim=-1)[:, None]
        u = (o @ proj.weight.T).view(-1, H, dh)[torch.arange(len(h), device=h.device), h]
        vk = v[b[:, None], g, keys].double()                                 # (n, K, dh)
        t = weight * torch.einsum("ne,nke->nk", u, vk) / norm.square()
        size = weight * torch.einsum("nkd,nde,nke->nk", vk, proj.gram[h], vk).clamp_min(0).sqrt()
        size = size / norm
        return t, error[b, i].double()[:, None] * (2 * t.abs() + size)
    return refine


def _project(alpha: Tensor, g: Tensor, value: Tensor, norm: Tensor, out: Tensor) -> Tensor:
    """alpha_ij (g_i . v_j) into ``out`` (B, H, T, Tk): g (B, H, T, dh), value (B, G, Tk, dh)."""
    G = value.shape[1]
    torch.matmul(grouped(g.contiguous(), G), value.to(alpha.dtype).transpose(-1, -2),
                 out=grouped(out, G))
    return _finite_(out.mul_(alpha), norm)


def _finite_(s: Tensor, norm: Tensor) -> Tensor:
    """:func:`~.base.finite` in place, only where an output norm of 0 can have made inf or NaN."""
    return s.nan_to_num_(nan=0.0, posinf=torch.finfo(s.dtype).max,
                         neginf=-torch.finfo(s.dtype).max) if (norm == 0).any() else s
