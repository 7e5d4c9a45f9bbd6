"""The dense attention every intervention pass runs: alpha in float32 and alpha @ v.

Like the model's own eager attention (the same ``torch.softmax``), with masks applied as an
additive 0 / -inf bias (torch's CPU ``masked_fill`` is a scalar loop), into scratch tensors the
caller reuses from layer to layer, and without a repeated copy of grouped keys and values.
"""

from __future__ import annotations

import torch

from ..measurement.geometry import fill_disallowed_

Tensor = torch.Tensor


def grouped(x: Tensor, groups: int) -> Tensor:
    """(B, H, T, n) -> (B, G, (H/G) T, n): the query heads that read one kv head, stacked."""
    B, H, T, n = x.shape
    return x.reshape(B, groups, (H // groups) * T, n)


def attention_weights(query: Tensor, key: Tensor, allowed: Tensor, scale: float,
                      softcap: float | None, dtype, sinks: Tensor | None = None,
                      out: Tensor | None = None, logits: Tensor | None = None,
                      bias: Tensor | None = None) -> Tensor:
    """Dense attention alpha (B, H, T, Tk) in ``dtype``, written into ``out``.

    ``logits``: scratch (B, H, T, Tk) for the logits (dead once alpha is made); ``bias``:
    ``allowed``'s -inf bias where the caller keeps it (:mod:`.masks`; made here otherwise).
    ``sinks``: learned sink logits broadcastable to (B, H, T), or None; the sink joins the
    softmax as a virtual key with no value. Without sinks it is ``torch.softmax`` (the eager
    attention's). A query with no allowed key (and no sink) gets zeros (no NaN).
    """
    B, H, T, dh = query.shape
    G, Tk = key.shape[1], key.shape[2]
    q = grouped((query * scale).to(dtype), G)                          # scale folded into q
    s = logits if logits is not None else query.new_empty(B, H, T, Tk, dtype=dtype)
    out = out if out is not None else query.new_empty(B, H, T, Tk, dtype=dtype)
    torch.matmul(q, key.to(dtype).transpose(-1, -2), out=grouped(s, G))
    if softcap is not None:
        s.div_(softcap).tanh_().mul_(softcap)
    if bias is None:
        fill_disallowed_(s, allowed, float("-inf"))
    else:
        s.add_(bias)
    if sinks is None:
        torch.softmax(s, -1, out=out)
        return out.nan_to_num_(nan=0.0) if not allowed.any(-1).all() else out
    sink = sinks.to(dtype)[..., None]                                    # (1|B, H, 1|T, 1)
    top = torch.maximum(s.amax(-1, keepdim=True), sink)                  # (B, H, T, 1)
    s.sub_(top).exp_()
    return torch.div(s, s.sum(-1, keepdim=True).add_((sink - top).exp()), out=out)


def row_blocks(allowed: Tensor, parts: int = 4) -> tuple[tuple[int, int, int], ...]:
    """(t0, t1, w): query rows t0 <= i < t1 attend to keys j < w only, in every sequence and
    head of ``allowed`` (B, 1|H, T, Tk); one block (0, T, Tk) when no rows stop short.

    Under a causal mask four blocks of T / 4 rows need 5/8 of the keys on average: a product
    over the keys (alpha @ v) skips 3/8 of its terms, all of them 0.
    """
    T, Tk = allowed.shape[-2:]
    seen = allowed.any(0).any(0)                                          # (T, Tk)
    last = torch.mul(seen, torch.arange(1, Tk + 1, dtype=torch.int32, device=seen.device))
    step = -(-T // parts)
    ends = [(t0, min(t0 + step, T)) for t0 in range(0, T, step)]
    widths = torch.stack([last[t0:t1].amax() for t0, t1 in ends]).tolist()
    if min(widths) == Tk:
        return ((0, T, Tk),)
    return tuple((t0, t1, w) for (t0, t1), w in zip(ends, widths))


def weighted_values(alpha: Tensor, value: Tensor,
                    blocks: tuple[tuple[int, int, int], ...] | None = None) -> Tensor:
    """``alpha @ v`` (B, H, T, n) with v per kv head (B, G, Tk, n), no repeated copy of v;
    ``blocks`` (:func:`row_blocks`): each block of rows over its leading keys only."""
    B, H, T, Tk = alpha.shape
    G, n = value.shape[1], value.shape[-1]
    value = value.to(alpha.dtype)
    if blocks is None or len(blocks) == 1:
        return (grouped(alpha, G) @ value).view(B, H, T, n)
    a = alpha.reshape(B * H, T, Tk)
    v = value[:, :, None].expand(B, G, H // G, Tk, n).reshape(B * H, Tk, n)
    out = alpha.new_empty(B * H, T, n)
    for t0, t1, w in blocks:
        if w == 0:
            out[:, t0:t1] = 0.0
        else:
            torch.bmm(a[:, t0:t1, :w], v[:, :w], out=out[:, t0:t1])
    return out.view(B, H, T, n)
