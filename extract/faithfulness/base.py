"""What every score module shares: finite scores, row-by-row float64 products, float64 attention.

The kernels (:mod:`.exact_scores`, :mod:`.removal_scores`, :mod:`.field_scores`,
:mod:`.random_scores`, :mod:`.zeroing`) and the dispatchers above them (:mod:`.layer_scores`)
import these; this module imports none of them.

Every contraction over a query's vector in float64 is one padded matrix product
(:func:`rowmm`) whose rows have the same bits however many rows are computed together, so a
row's float64 scores are the same whether it is computed alone or with every other row: a
float64 tie (e.g. c = 1 at every head of a query that sees one key) is then broken by position
the same way in the fast path, in the tests and whatever the batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..measurement.geometry import softmax_masked, vecdot

Tensor = torch.Tensor
ALIGN = 8                # rowmm pads M, K and N to multiples of this (8 float64: 64 bytes)


def finite(x: Tensor) -> Tensor:
    """0/0 (a zero head output) scores 0; +-inf clipped to the largest finite float."""
    big = torch.finfo(x.dtype).max
    return torch.nan_to_num(x, nan=0.0, posinf=big, neginf=-big)


def rowmm(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` for a (..., M, K), b (..., K, N) whose rows have the same bits however many
    rows are computed together and wherever they lie in memory.

    One batched matrix product of contiguous, 64-byte aligned operands (copied where they are
    not) with M, K and N zero-padded to multiples of :data:`ALIGN`: BLAS kernels (MKL's on x86)
    compute the last M mod 4 rows, and operands that are not 64-byte aligned, with another
    summation order, so an unpadded row's last bits depend on M and on its address; padded, a
    row's result is a function of the row alone (``tests/extract/test_selection.py`` checks it
    against every M up to 600, with 1 and 2 threads). 2.5-3x faster than one matrix-vector
    product per row. A column's bits are not a function of the column alone (MKL: they change
    with the columns computed beside it), so a subset of b's columns is never multiplied alone.
    """
    M, N = a.shape[-2], b.shape[-1]
    lead = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a, b = _padded(a), _padded(b)
    (Mp, Kp), Np = a.shape[-2:], b.shape[-1]
    out = torch.bmm(a.expand(*lead, Mp, Kp).reshape(-1, Mp, Kp),
                    b.expand(*lead, Kp, Np).reshape(-1, Kp, Np))
    return out.view(*lead, Mp, Np)[..., :M, :N]


def _padded(x: Tensor) -> Tensor:
    """x (..., R, C) itself if contiguous, 64-byte aligned and R, C multiples of :data:`ALIGN`,
    else a fresh (aligned) contiguous copy zero-padded to that (a transposed operand would
    take another kernel, with other bits)."""
    R, C = x.shape[-2:]
    if R % ALIGN or C % ALIGN:
        return F.pad(x.contiguous(), (0, -C % ALIGN, 0, -R % ALIGN))   # F.pad keeps strides
    if not x.is_contiguous() or x.data_ptr() % (8 * ALIGN):
        return x.clone(memory_format=torch.contiguous_format)
    return x


def logits64(q: Tensor, k: Tensor, scale: float, softcap: float | None) -> Tensor:
    """Attention logits (..., Tq, Tk) in float64, row by row."""
    s = rowmm(q.double(), k.double().transpose(-1, -2)) * scale
    return s if softcap is None else torch.tanh(s / softcap) * softcap


def exact_alpha(q: Tensor, k: Tensor, allowed: Tensor, scale: float, softcap: float | None,
                sinks: Tensor | None = None) -> Tensor:
    """Float64 attention (..., Tq, Tk) of query rows q over keys k (per query head).

    ``sinks``: learned sink logits broadcastable to (..., Tq), or None; the sink joins the
    softmax as a virtual key with no value (its weight is left out of alpha).
    """
    logits = logits64(q, k, scale, softcap)
    if sinks is None:
        return softmax_masked(logits, allowed)
    logits = logits.masked_fill(~allowed, float("-inf"))
    column = sinks.double().expand(logits.shape[:-1])[..., None]            # (..., Tq, 1)
    return torch.softmax(torch.cat([logits, column], -1), dim=-1)[..., :-1]


def value_norms(vf: Tensor, gram: Tensor) -> Tensor:
    """||v~_j^h|| (B, H, Tk) for values per query head vf (B, H, Tk, dh), one (b, h) at a time."""
    B, H = vf.shape[:2]
    return torch.stack([torch.stack([key_norms(vf[b, h], gram[h]) for h in range(H)])
                        for b in range(B)])


def key_norms(v: Tensor, gram: Tensor) -> Tensor:
    """sqrt(v G v) (Tk,) for one head's keys v (Tk, dh) (the same bits however it is called)."""
    return vecdot(v.contiguous() @ gram, v).clamp_min(0).sqrt()
