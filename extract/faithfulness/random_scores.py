"""The ``random`` metric: a seeded random ranking of the keys of each query, the floor.

Each (layer, row, head, query, key) gets a uniform score in [0, 1) on a 2^-24 grid, a hash of
the seed, the layer, the row's content key (:func:`~.context.row_keys`), the head, the query
and the key: the same in float32 and float64 (so the fast path is exact: error 0, and a tie
is broken by position as everywhere), the same in whatever batch a row runs, independent from
layer to layer and from row to row. At ``query`` granularity the (key, head) pairs of a query
are ranked by these scores, at ``token`` granularity keys by their sum over heads: both are
uniformly random orders of the candidates (the scores are independent and identically
distributed, so their order, and that of sums of equally many, is exchangeable).
"""

from __future__ import annotations

import torch

from .context import LayerContext
from .selection import ErrorBound

Tensor = torch.Tensor
MASK = 0xFFFFFFFF
MIX = 0x45D9F3B              # the multiplier of a 32-bit integer hash (< 2^27: no overflow)


def mix(x: Tensor) -> Tensor:
    """A 32-bit integer hash of each entry of x (int64 holding 32-bit values)."""
    x = ((x >> 16) ^ x) * MIX & MASK
    x = ((x >> 16) ^ x) * MIX & MASK
    return (x >> 16) ^ x


def uniform(ctx: LayerContext, b: Tensor, h: Tensor, i: Tensor, keys: int) -> Tensor:
    """Scores (n, keys) float64 in [0, 1) of rows (batch row b, head h, query i), n = len(b)."""
    rows = ctx.content_rows().long()[b]
    base = mix(mix(mix(torch.full_like(rows, ctx.seed & MASK) ^ ctx.layer) ^ rows) ^ h)
    base = mix(base ^ i.long())                                         # (n,)
    j = torch.arange(keys, device=b.device, dtype=torch.int64)
    return (mix(base[:, None] ^ mix(j + 0x9E3779B9 & MASK)[None]) >> 8).double() / (1 << 24)


def scores(ctx: LayerContext, shape) -> Tensor:
    """Scores (B, H, T, Tk) float64 of every (row, head, query, key) of the layer."""
    B, H, T, Tk = shape
    dev = ctx.query.device
    b, h, i = torch.meshgrid(torch.arange(B, device=dev), torch.arange(H, device=dev),
                             torch.arange(T, device=dev), indexing="ij")
    return uniform(ctx, b.reshape(-1), h.reshape(-1), i.reshape(-1), Tk).view(B, H, T, Tk)


def fast_random(x, unit: float) -> tuple[Tensor, ErrorBound]:
    """The layer's random scores in alpha's dtype (exact: 24-bit values), error 0."""
    s = scores(x.context, x.alpha.shape)
    out = x.out.copy_(s)
    return out, ErrorBound(torch.zeros(x.alpha.shape[:-1], dtype=out.dtype, device=out.device))


def exact_random(x) -> Tensor:
    """The random scores of the rows ``x.where`` = (b, h, i): (..., Tk) as alpha's shape (at
    ``x.at``'s keys)."""
    b, h, i = (t.reshape(-1) for t in x.where)
    return x.at(uniform(x.context, b, h, i, x.alpha.shape[-1]).view(x.alpha.shape))
