"""Contribution geometry of one attention layer, computed in head space.

Everything here works on the tensors an attention function receives (queries, keys and
values per head) plus the output projection. Projected values are never built in model
space per (query, key, head): with the Gram matrices ``G_h = W_O^h (W_O^h)^T`` and
``G = W_O W_O^T`` (all heads, ``H*dh x H*dh``)

    ||v~_j^h||^2      = v_j G_h v_j^T
    <o_i^h, v~_j^h>   = z_i^h G_h v_j^T        (z_i^h = sum_j alpha_ij v_j, before W_O)
    <o_i,   v~_j^h>   = u_i^h v_j^T            (u_i = z_i G, the layer output o_i W_O^T)
    ||o_i||^2         = u_i . z_i

so the layer output o itself is never formed and the whole measurement costs about what
attention costs. All reductions run in float32.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from attngeom.store.format import derive

Tensor = torch.Tensor


@dataclass(frozen=True)
class Projection:
    """The output projection of one attention layer, in ``x @ W`` orientation.

    Attributes
    ----------
    weight : (H*dh, d) float32, so that the layer output is ``z.flatten(heads) @ weight``.
    gram : (H, dh, dh) float32, ``W_O^h (W_O^h)^T`` per head.
    full : (H*dh, H*dh) float32, ``W_O W_O^T`` (its diagonal blocks are ``gram``).
    """

    weight: Tensor
    gram: Tensor
    full: Tensor | None = None
    _transposed: Tensor | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.full is None:                           # built from weight and gram only
            object.__setattr__(self, "full", self.weight @ self.weight.T)

    def transposed(self) -> Tensor:
        """``weight.T`` (d, H*dh), contiguous (made on first use, then kept)."""
        if self._transposed is None:
            object.__setattr__(self, "_transposed", self.weight.T.contiguous())
        return self._transposed

    @classmethod
    def from_weight(cls, weight: Tensor, n_heads: int) -> "Projection":
        w = weight.detach().float()                      # (H*dh, d)
        full = w @ w.T                                   # (H*dh, H*dh)
        dh = w.shape[0] // n_heads
        blocks = full.view(n_heads, dh, n_heads, dh)
        gram = torch.stack([blocks[h, :, h] for h in range(n_heads)])  # (H, dh, dh)
        return cls(weight=w, gram=gram, full=full)


_CACHE: dict[tuple, tuple] = {}


def cached_projection(weight: Tensor, n_heads: int) -> Projection:
    """``Projection.from_weight`` computed once per weight (recomputed if it changes).

    ``weight`` may be a view (``o_proj.weight.T``); the entry is tied to the tensor it views
    (by weak reference, so a freed model's address reused by another is not mistaken for it)
    and to its version counter (bumped by any in-place change).
    """
    base = weight if weight._base is None else weight._base
    key = (id(base), weight.data_ptr(), tuple(weight.shape), weight.stride(), n_heads)
    hit = _CACHE.get(key)
    if hit is None or hit[0]() is not base or hit[1] != weight._version:
        for stale in [k for k, v in _CACHE.items() if v[0]() is None]:
            del _CACHE[stale]
        hit = (weakref.ref(base), weight._version, Projection.from_weight(weight, n_heads))
        _CACHE[key] = hit
    return hit[2]


def repeat_kv(x: Tensor, n_heads: int) -> Tensor:
    """(B, G, T, dh) -> (B, H, T, dh): query head h reads kv head h // (H / G)."""
    groups = n_heads // x.shape[1]
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


def scores(q: Tensor, k: Tensor, scale: float, softcap: float | None,
           dtype: torch.dtype = torch.float32) -> Tensor:
    """Attention logits (B, H, Tq, Tk) in ``dtype``, soft-capped where the model does it."""
    s = (q.to(dtype) @ k.to(dtype).transpose(-1, -2)) * scale
    return s if softcap is None else torch.tanh(s / softcap) * softcap


def fill_disallowed_(x: Tensor, allowed: Tensor, fill: float) -> Tensor:
    """``x.masked_fill_(~allowed, fill)`` for finite x and fill = +-inf, as one vectorised add.

    On the CPU torch's masked_fill is a scalar loop with a branch per element (up to ~5 ns each
    on an irregular mask, ten times an add): on (B, H, T, Tk) attention it cost more than the
    softmax. The bias has the mask's shape ((B, 1, T, Tk) for a mask shared by the heads).
    x + 0 is x, bit for bit; an infinite x would give NaN where it is masked.
    """
    return x.add_(disallowed_bias(allowed, fill, x.dtype))


def disallowed_bias(allowed: Tensor, fill: float, dtype: torch.dtype) -> Tensor:
    """The additive bias of :func:`fill_disallowed_`: 0 where allowed, ``fill`` elsewhere."""
    bias = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return bias.masked_fill_(~allowed, fill)


def softmax_masked(logits: Tensor, allowed: Tensor, inplace: bool = False) -> Tensor:
    """Softmax over keys; rows with no allowed key give zeros instead of NaN (looked for in
    ``allowed`` first: a pass over NaNs costs more than the softmax itself); ``inplace``:
    the disallowed logits are set to -inf in ``logits`` itself."""
    fill = logits.masked_fill_ if inplace else logits.masked_fill
    alpha = torch.softmax(fill(~allowed, float("-inf")), dim=-1)
    return alpha if bool(allowed.any(-1).all()) else alpha.nan_to_num_(0.0)


def attention_probs(q: Tensor, k: Tensor, scale: float, allowed: Tensor,
                    softcap: float | None = None, sinks: Tensor | None = None,
                    dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor | None]:
    """alpha (B, H, Tq, Tk) over the real keys and the learned sink's weight (B, H, Tq).

    q, k : (B, H, T, dh) (keys repeated to the query heads); allowed (B, 1|H, Tq, Tk).
    ``sinks``: learned sink logits broadcastable to (B, H, Tq), or None (weight None). The
    sink joins the softmax as a virtual key with no value, so sum_j alpha_ij + sink_i = 1.
    """
    logits = scores(q, k, scale, softcap, dtype)
    if sinks is None:
        return softmax_masked(logits, allowed), None
    logits = logits.masked_fill(~allowed, float("-inf"))
    column = sinks.to(dtype).expand(logits.shape[:-1])[..., None]            # (B, H, Tq, 1)
    p = torch.softmax(torch.cat([logits, column], -1), dim=-1)
    return p[..., :-1], p[..., -1]


def attention_bias(allowed: Tensor, dtype: torch.dtype) -> Tensor:
    """Additive bias from a boolean mask: 0 where allowed, the dtype's minimum elsewhere.

    finfo.min, not -inf: a row with no allowed key (padding) must not produce NaN.
    """
    bias = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return bias.masked_fill(~allowed, torch.finfo(dtype).min)


def fused_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None,
                    scale: float) -> tuple[Tensor, Tensor]:
    """Head outputs z (B, H, T, dv) and log-sum-exp (B, H, T) from a fused SDPA kernel.

    ``bias`` None means plain causal attention (``is_causal``, no mask read at all). No
    (T, T) probability matrix is materialised; ``alpha_ij = exp(q_i k_j scale - lse_i)``.
    A value head dim dv other than the query head dim dh (MLA) is padded with zeros to the
    larger one (q and k: the logits are unchanged; v: z is cut back to dv).
    """
    dh, dv = q.shape[-1], v.shape[-1]
    if dv < dh:
        v = F.pad(v, (0, dh - dv))
    elif dv > dh:
        q, k = F.pad(q, (0, dv - dh)), F.pad(k, (0, dv - dh))
    z, lse = _fused(q, k, v, bias, scale)
    return z[..., :dv], lse


def _fused(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None,
           scale: float) -> tuple[Tensor, Tensor]:
    if q.device.type == "cpu":
        if bias is None:
            out = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                q, k, v, 0.0, True, scale=scale)
        else:
            out = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                q, k, v, 0.0, False, attn_mask=bias.to(q.dtype), scale=scale)
        return out[0], out[1]
    if bias is None and q.dtype in (torch.float16, torch.bfloat16):
        out = torch.ops.aten._scaled_dot_product_flash_attention(
            q, k, v, 0.0, True, False, scale=scale)
        return out[0], out[1]
    if bias is None:
        T = q.shape[2]
        causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
        bias = attention_bias(causal, q.dtype)[None, None]
    bias = bias.to(q.dtype).expand(q.shape[0], q.shape[1], -1, -1)
    z, lse = torch.ops.aten._scaled_dot_product_efficient_attention(
        q, k, v, bias, True, scale=scale)[:2]
    return z, lse[..., : q.shape[2]]


DOT_BYTES = 4 << 20        # the most bytes of the elementwise product vecdot forms at once


def vecdot(a: Tensor, b: Tensor) -> Tensor:
    """Dot product over the last axis (broadcast), ``(a * b).sum(-1)`` bit for bit.

    The product is formed in slices of at most :data:`DOT_BYTES` along the longest other axis:
    whole, it is as large as the inputs (19 MB for one layer's (1, 9, 8192, 64) float32 heads)
    and would be held beside them at the layer's peak.
    """
    shape = torch.broadcast_shapes(a.shape, b.shape)
    nbytes = math.prod(shape) * torch.result_type(a, b).itemsize
    if nbytes <= DOT_BYTES or len(shape) < 2:
        return (a * b).sum(-1)
    dim = max(range(len(shape) - 1), key=lambda d: shape[d])
    step = max(1, shape[dim] * DOT_BYTES // nbytes)
    a, b = a.expand(shape), b.expand(shape)
    return torch.cat([(a.narrow(dim, lo, min(step, shape[dim] - lo))
                       * b.narrow(dim, lo, min(step, shape[dim] - lo))).sum(-1)
                      for lo in range(0, shape[dim], step)], dim)


def norm_from_gram(x: Tensor, gram: Tensor) -> tuple[Tensor, Tensor]:
    """``x G`` (B, H, T, dh) and ``sqrt(x G x)`` (B, H, T) for head-space vectors x."""
    xg = x @ gram[None]
    return xg, vecdot(xg, x).clamp_min(0).sqrt()


def per_token(z: Tensor, v: Tensor, r: Tensor, k: int, proj: Projection) -> dict[str, Tensor]:
    """Per-key and per-query quantities of one layer (no masks applied).

    Parameters
    ----------
    z : (B, H, T, dh) head outputs before W_O, float32.
    v : (B, G, T, dh) values per kv head (G divides H), float32.
    r : (B, H, T, dh) the non-sink part sum_{j >= k} alpha_ij v_j, float32, computed from the
        non-sink keys (never as z - alpha_i0 v_0, which cancels when alpha_i0 is near 1).
    k : the number of sink keys.

    Returns
    -------
    dict with the stored per-token names and, for pair terms, ``_zg`` = z G_h and
    ``_u`` = o (W_O^h)^T (both (B, H, T, dh)) and ``_sink_dot`` = <o_i^h, v~_s^h> and
    ``_sink_dot_layer`` = <o_i, v~_s^h> for the sink keys s (both (B, H, T, k)).
    """
    B, H, T, dh = z.shape
    G = v.shape[1]
    R = H // G
    # Ordered, and each (B, H, T, dh) temporary dropped once used, so that about five such
    # arrays are held at a time, not ten (19 MB each at 8,192 tokens on SmolLM2-135M).
    # keys: values per kv head against the Gram matrices of the R query heads reading it
    gcat = proj.gram.view(G, R, dh, dh).transpose(1, 2).reshape(G, dh, R * dh)
    vg = (v @ gcat[None]).view(B, G, T, R, dh)                        # v_j G_h
    value_norm = _per_head(vecdot(vg, v[..., None, :]).clamp_min(0).sqrt())  # (B, H, T)
    vs = repeat_kv(v[:, :, :k], H)                                    # sink values (B,H,k,dh)
    vsg = vg[:, :, :k].permute(0, 1, 3, 2, 4).reshape(B, H, k, dh)
    del vg
    v0_norm = value_norm[:, :, :1]                                    # (B, H, 1)
    v0g = vsg[:, :, 0].view(B, G, R, dh).transpose(-1, -2)            # (B, G, dh, R)
    v_v0 = _per_head(v @ v0g)                                         # <v~_j, v~_0>, (B, H, T)
    # the non-sink part of each head output
    rg = r @ proj.gram[None]                                          # r G_h
    residual_norm = vecdot(rg, r).clamp_min(0).sqrt()
    del rg
    r_v0 = (r @ vsg[:, :, :1].transpose(-1, -2))[..., 0]              # <r~_i, v~_0>
    # head outputs and the layer output
    zg = z @ proj.gram[None]                                          # (B, H, T, dh)
    output_norm = vecdot(zg, z).clamp_min(0).sqrt()                  # (B, H, T)
    sink_dot = zg @ vs.transpose(-1, -2)                              # (B, H, T, k)
    zflat = z.transpose(1, 2).reshape(B, T, H * dh)
    uflat = zflat @ proj.full                                         # o W_O^T, (B, T, H*dh)
    parts = vecdot(uflat.view(B, T, H, dh), zflat.view(B, T, H, dh))  # <o, o^h>, (B, T, H)
    sink_dot_layer = _dot_layer_keys(zflat, proj.full, vs)
    del zflat
    layer_sq = parts.sum(-1)                                          # ||o||^2, (B, T)
    u = uflat.view(B, T, H, dh).transpose(1, 2)                       # (B, H, T, dh)
    return {
        "value_norm": value_norm,
        "sink_value_cosine": v_v0 / (v0_norm * value_norm),
        "output_norm": output_norm,
        "residual_norm": residual_norm,
        "sink_residual_cosine": r_v0 / (v0_norm * residual_norm),
        "head_share": parts.transpose(1, 2) / layer_sq[:, None],
        "layer_output_norm": layer_sq.clamp_min(0).sqrt(),
        "_zg": zg, "_u": u, "_sink_dot": sink_dot, "_sink_dot_layer": sink_dot_layer,
    }


def _per_head(x: Tensor) -> Tensor:
    """(B, G, T, R) -> (B, H, T) with head h = g R + r."""
    B, G, T, R = x.shape
    return x.permute(0, 1, 3, 2).reshape(B, G * R, T)


def _dot_layer_keys(zflat: Tensor, full: Tensor, keys: Tensor) -> Tensor:
    """<o_i, v~_s^h> = z_i . (G[:, h] v_s^h) for a few keys: (B, H, T, k).

    zflat (B, T, H*dh), full (H*dh, H*dh), keys (B, H, k, dh); one matmul with k*H columns,
    so the layer output o (or u) is not re-read per head.
    """
    B, H, k, dh = keys.shape
    cols = torch.einsum("ahd,bhkd->bahk", full.view(-1, H, dh), keys)  # (B, H*dh, H, k)
    return (zflat @ cols.reshape(B, H * dh, H * k)).view(B, -1, H, k).transpose(1, 2)


def band(queries: list[Tensor], x: Tensor, w: int) -> list[Tensor]:
    """``out[..., i, lag] = a[..., i, :] . x[..., i - lag, :]`` for each a in ``queries``.

    a : (B, H, T, dh); x : (B, G, T, dh), G dividing H (head h reads x head h // (H/G)).
    Queries go in blocks of w; each block of every head sharing x, and of every a, meets a
    window of 2w - 1 keys in one small matmul, so no (B, H, T, w, dh) copy is made.
    Entries with i - lag < 0 are 0. Returns (B, H, T, w) per a.
    """
    B, H, T, dh = queries[0].shape
    G, n = x.shape[1], len(queries)
    R, nb = H // G, -(-T // w)
    rows = queries[0].new_empty(B, G, nb, n, R, w, dh)              # every a, blocked
    if nb * w != T:
        rows[:, :, -1].zero_()
    blocked = rows.view(B, G, nb * n * R * w, dh)
    for i, a in enumerate(queries):
        a = a if nb * w == T else F.pad(a, (0, 0, 0, nb * w - T))
        rows[:, :, :, i].copy_(a.view(B, G, R, nb, w, dh).transpose(2, 3))
    xp = F.pad(x, (0, 0, w - 1, nb * w - T))                          # (B, G, nb*w + w-1, dh)
    win = xp.unfold(2, 2 * w - 1, w)[:, :, :nb]                       # (B, G, nb, dh, 2w-1)
    s = (blocked.view(B, G, nb, n * R * w, dh) @ win).contiguous()    # (B, G, nb, nRw, 2w-1)
    # row r of a block needs columns r + w - 1 - lag: a skewed (strided) view, then flip lag
    st = s.stride()
    diag = s.as_strided((B, G, nb, n * R, w, w),
                        (st[0], st[1], st[2], w * st[3], 2 * w, 1), s.storage_offset())
    diag = diag.flip(-1).view(B, G, nb, n, R, w, w)
    out = diag.permute(3, 0, 1, 4, 2, 5, 6).reshape(n, B, H, nb * w, w)[:, :, :, :T]
    return list(out.unbind(0))


def band_values(x: Tensor, w: int) -> Tensor:
    """``out[..., i, lag] = x[..., i - lag]`` (0 where i - lag < 0); x (B, H, T)."""
    T = x.shape[-1]
    xp = F.pad(x, (w - 1, 0))
    return xp.unfold(-1, w, 1).flip(-1)[..., :T, :]


def tail_index(T: int, k: int, w: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Key index (T, w) = query - lag clipped at 0, and whether it is a tail key (j >= k):
    :func:`attngeom.store.format.derive.tail_keys`, on ``device``."""
    key, ok = derive.tail_keys(T, k, w)
    return torch.from_numpy(key).to(device), torch.from_numpy(ok).to(device)
