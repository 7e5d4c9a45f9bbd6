"""The dense attention every intervention pass runs: alpha in float32 and alpha @ v.

Like the model's own eager attention (the same ``torch.softmax``), with masks applied as an
additive 0 / -inf bias (torch's CPU ``masked_fill`` is a scalar loop), into scratch tensors the
caller reuses from layer to layer, and without a repeated copy of grouped keys and values.
"""

from __future__ import annotations

import torch

from .geometry import fill_disallowed_

Tensor = torch.Tensor


def grouped(x: Tensor, groups: int) -> Tensor:
    """(B, H, T, n) -> (B, G, (H/G) T, n): the query heads that read one kv head, stacked."""
    B, H, T, n = x.shape
    return x.reshape(B, groups, (H // groups) * T, n)


def attention_weights(query: Tensor, key: Tensor, allowed: Tensor, scale: float,
                      softcap: float | None, dtype, sinks: Tensor | None = None,
                      out: Tensor | None = None, logits: Tensor | None = None) -> Tensor:
    """Dense attention alpha (B, H, T, Tk) in ``dtype``, written into ``out``.

    ``logits``: scratch (B, H, T, Tk) for the logits (dead once alpha is made). ``sinks``:
    learned sink logits broadcastable to (B, H, T), or None; the sink joins the softmax as a
    virtual key with no value. Without sinks it is ``torch.softmax`` (the eager attention's).
    A query with no allowed key (and no sink) gets zeros (no NaN).
    """
    B, H, T, dh = query.shape
    G, Tk = key.shape[1], key.shape[2]
    q = grouped((query * scale).to(dtype), G)                          # scale folded into q
    s = logits if logits is not None else query.new_empty(B, H, T, Tk, dtype=dtype)
    out = out if out is not None else query.new_empty(B, H, T, Tk, dtype=dtype)
    torch.matmul(q, key.to(dtype).transpose(-1, -2), out=grouped(s, G))
    if softcap is not None:
        s.div_(softcap).tanh_().mul_(softcap)
    fill_disallowed_(s, allowed, float("-inf"))
    if sinks is None:
        torch.softmax(s, -1, out=out)
        return out.nan_to_num_(nan=0.0) if not allowed.any(-1).all() else out
    sink = sinks.to(dtype)[..., None]                                    # (1|B, H, 1|T, 1)
    top = torch.maximum(s.amax(-1, keepdim=True), sink)                  # (B, H, T, 1)
    s.sub_(top).exp_()
    return torch.div(s, s.sum(-1, keepdim=True).add_((sink - top).exp()), out=out)


def weighted_values(alpha: Tensor, value: Tensor) -> Tensor:
    """``alpha @ v`` (B, H, T, dh) with v per kv head (B, G, Tk, dh), no repeated copy of v."""
    B, H, T, _ = alpha.shape
    G, dh = value.shape[1], value.shape[-1]
    return (grouped(alpha, G) @ value.to(alpha.dtype)).view(B, H, T, dh)
