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

import numpy as np
import torch

from .context import LayerContext
from .selection import ErrorBound

Tensor = torch.Tensor
MASK = 0xFFFFFFFF
MIX = 0x45D9F3B              # the multiplier of a 32-bit integer hash (< 2^27: no overflow)
GOLDEN = 0x9E3779B9          # added to a key index before it is hashed
CHUNK = 1 << 22              # (row, key) hashes made at a time (two work buffers of that size)


def mix(x: Tensor) -> Tensor:
    """A 32-bit integer hash of each entry of x (int64 holding 32-bit values)."""
    x = ((x >> 16) ^ x) * MIX & MASK
    x = ((x >> 16) ^ x) * MIX & MASK
    return (x >> 16) ^ x


def row_bases(ctx: LayerContext, b: Tensor, h: Tensor, i: Tensor) -> Tensor:
    """(n,) int64: the hash of the seed, the layer, the row's content, the head and the
    query of rows (batch row b, head h, query i)."""
    rows = ctx.content_rows().long()[b]
    base = mix(mix(mix(torch.full_like(rows, ctx.seed & MASK) ^ ctx.layer) ^ rows) ^ h)
    return mix(base ^ i.long())


def fill(out: Tensor, base: Tensor) -> Tensor:
    """Scores into ``out`` (n, keys), floating, in [0, 1) on a 2^-24 grid (exact in float32
    and float64): :func:`mix` of each row's ``base`` xor each key's hash, shifted to 24 bits,
    :data:`CHUNK` (row, key) pairs at a time. On a CPU in numpy's uint32 (multiplication wraps
    modulo 2^32, so no mask; torch's int64 shifts are 3x slower), elsewhere by :func:`mix`;
    the two are the same numbers (tests/extract/test_random_scores.py)."""
    n, keys = out.shape
    key_hash = mix(torch.arange(keys, device=out.device, dtype=torch.int64) + GOLDEN & MASK)
    step = max(1, CHUNK // max(keys, 1))
    cut = [(lo, min(n, lo + step)) for lo in range(0, n, step)]
    if out.device.type == "cpu" and out.is_contiguous():
        _fill_numpy(out.numpy(), base.numpy().astype(np.uint32),
                    key_hash.numpy().astype(np.uint32), cut)
    else:
        _fill_torch(out, base, key_hash, cut)
    return out.mul_(1.0 / (1 << 24))


def _fill_torch(out: Tensor, base: Tensor, key_hash: Tensor, cut) -> None:
    for lo, hi in cut:
        out[lo:hi].copy_(mix(base[lo:hi, None] ^ key_hash[None]) >> 8)    # 24-bit: exact


def _fill_numpy(out: np.ndarray, base: np.ndarray, key_hash: np.ndarray, cut) -> None:
    x = np.empty((cut[0][1] - cut[0][0], len(key_hash)), np.uint32) if cut else None
    tmp = np.empty_like(x) if cut else None
    mul = np.uint32(MIX)
    for lo, hi in cut:
        xs, ts = x[:hi - lo], tmp[:hi - lo]
        np.bitwise_xor(base[lo:hi, None], key_hash[None], out=xs)
        for _ in range(2):
            np.right_shift(xs, 16, out=ts)
            np.bitwise_xor(xs, ts, out=xs)
            np.multiply(xs, mul, out=xs)                               # modulo 2^32
        np.right_shift(xs, 16, out=ts)
        np.bitwise_xor(xs, ts, out=xs)
        out[lo:hi] = np.right_shift(xs, 8, out=xs)                     # 24-bit: exact


def uniform(ctx: LayerContext, b: Tensor, h: Tensor, i: Tensor, keys: int) -> Tensor:
    """Scores (n, keys) float64 in [0, 1) of rows (batch row b, head h, query i), n = len(b)."""
    out = torch.empty((len(b), keys), dtype=torch.float64, device=b.device)
    return fill(out, row_bases(ctx, b, h, i))


def scores(ctx: LayerContext, shape, out: Tensor | None = None) -> Tensor:
    """Scores (B, H, T, Tk) of every (row, head, query, key) of the layer: float64, or into
    ``out`` (any floating dtype: the values are exact in float32)."""
    B, H, T, Tk = shape
    dev = ctx.query.device
    b, h, i = torch.meshgrid(torch.arange(B, device=dev), torch.arange(H, device=dev),
                             torch.arange(T, device=dev), indexing="ij")
    base = row_bases(ctx, b.reshape(-1), h.reshape(-1), i.reshape(-1))
    if out is None or not out.is_contiguous():
        s = fill(torch.empty((B * H * T, Tk), dtype=torch.float64, device=dev), base)
        return s.view(shape) if out is None else out.copy_(s.view(shape))
    fill(out.view(-1, Tk), base)
    return out


def fast_random(x, unit: float) -> tuple[Tensor, ErrorBound]:
    """The layer's random scores in alpha's dtype (exact: 24-bit values), error 0."""
    out = scores(x.context, x.alpha.shape, out=x.out)
    return out, ErrorBound(torch.zeros(x.alpha.shape[:-1], dtype=out.dtype, device=out.device))


def exact_random(x) -> Tensor:
    """The random scores of the rows ``x.where`` = (b, h, i): (..., Tk) as alpha's shape (at
    ``x.at``'s keys)."""
    b, h, i = (t.reshape(-1) for t in x.where)
    return x.at(uniform(x.context, b, h, i, x.alpha.shape[-1]).view(x.alpha.shape))
