"""Contribution geometry of one attention layer, computed in head space.

Everything here works on the tensors an attention function receives (queries, keys and
values per head) plus the output projection. Projected values are never built in model
space per (query, key, head): with the Gram matrix ``G_h = W_O^h (W_O^h)^T``

    ||v~_j^h||^2      = v_j G_h v_j^T
    <o_i^h, v~_j^h>   = z_i^h G_h v_j^T        (z_i^h = sum_j alpha_ij v_j, before W_O)
    <o_i,   v~_j^h>   = (o_i (W_O^h)^T) . v_j

so the whole measurement costs what attention costs. All reductions run in float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

Tensor = torch.Tensor


@dataclass(frozen=True)
class Projection:
    """The output projection of one attention layer, in ``x @ W`` orientation.

    Attributes
    ----------
    weight : (H*dh, d) float32, so that the layer output is ``z.flatten(heads) @ weight``.
    gram : (H, dh, dh) float32, ``W_O^h (W_O^h)^T`` per head.
    """

    weight: Tensor
    gram: Tensor

    @classmethod
    def from_weight(cls, weight: Tensor, n_heads: int) -> "Projection":
        w = weight.detach().float()                      # (H*dh, d)
        blocks = w.view(n_heads, -1, w.shape[-1])        # (H, dh, d)
        return cls(weight=w, gram=blocks @ blocks.transpose(1, 2))


def repeat_kv(x: Tensor, n_heads: int) -> Tensor:
    """(B, G, T, dh) -> (B, H, T, dh): query head h reads kv head h // (H / G)."""
    groups = n_heads // x.shape[1]
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


def scores(q: Tensor, k: Tensor, scale: float, softcap: float | None) -> Tensor:
    """Attention logits (B, H, Tq, Tk) in float32, soft-capped where the model does it."""
    s = (q.float() @ k.float().transpose(-1, -2)) * scale
    return s if softcap is None else torch.tanh(s / softcap) * softcap


def softmax_masked(logits: Tensor, allowed: Tensor) -> Tensor:
    """Softmax over keys; rows with no allowed key give zeros instead of NaN."""
    logits = logits.masked_fill(~allowed, float("-inf"))
    alpha = torch.softmax(logits, dim=-1)
    return alpha.nan_to_num(0.0)


def fused_attention(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor,
                    scale: float) -> tuple[Tensor, Tensor]:
    """Head outputs z (B, H, T, dh) and log-sum-exp (B, H, T) from a fused SDPA kernel.

    No (T, T) probability matrix is materialised; ``alpha_ij = exp(q_i k_j scale - lse_i)``.
    """
    # finfo.min, not -inf: a row with no allowed key (padding) must not produce NaN
    bias = torch.zeros(allowed.shape, dtype=q.dtype, device=q.device)
    bias = bias.masked_fill(~allowed, torch.finfo(q.dtype).min)
    if q.device.type == "cpu":
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, False, attn_mask=bias, scale=scale)
    bias = bias.expand(q.shape[0], q.shape[1], -1, -1)
    z, lse = torch.ops.aten._scaled_dot_product_efficient_attention(
        q, k, v, bias, True, scale=scale)[:2]
    return z, lse[..., : q.shape[2]]


def norm_from_gram(x: Tensor, gram: Tensor) -> tuple[Tensor, Tensor]:
    """``x G`` (B, H, T, dh) and ``sqrt(x G x)`` (B, H, T) for head-space vectors x."""
    xg = torch.einsum("bhtd,hde->bhte", x, gram)
    return xg, (xg * x).sum(-1).clamp_min(0).sqrt()


def per_token(z: Tensor, v: Tensor, sink_alpha: Tensor, proj: Projection) -> dict[str, Tensor]:
    """Per-key and per-query quantities of one layer.

    Parameters
    ----------
    z : (B, H, T, dh) head outputs before W_O.
    v : (B, H, T, dh) values per query head (float32).
    sink_alpha : (B, H, T, k) attention to the sink keys.
    """
    B, H, T, dh = z.shape
    k = sink_alpha.shape[-1]
    vg, value_norm = norm_from_gram(v, proj.gram)                     # (B,H,T,dh), (B,H,T)
    zg, output_norm = norm_from_gram(z, proj.gram)
    o = z.transpose(1, 2).reshape(B, T, H * dh) @ proj.weight         # (B, T, d) layer output
    layer_norm = o.norm(dim=-1)                                       # (B, T)
    u = (o @ proj.weight.T).view(B, T, H, dh).transpose(1, 2)         # o_i (W_O^h)^T
    r = z - sink_alpha @ v[:, :, :k]                                  # non-sink part, head space
    rg, residual_norm = norm_from_gram(r, proj.gram)
    v0g, v0_norm = vg[:, :, :1], value_norm[:, :, :1]                 # sink value (B,H,1,·)
    return {
        "value_norm": value_norm,
        "sink_value_cosine": (v0g * v).sum(-1) / (v0_norm * value_norm),
        "output_norm": output_norm,
        "residual_norm": residual_norm,
        "sink_residual_cosine": (v0g * r).sum(-1) / (v0_norm * residual_norm),
        "head_share": (u * z).sum(-1) / layer_norm.square()[:, None],
        "layer_output_norm": layer_norm,
        "_zg": zg, "_u": u,
    }


def pair_terms(alpha: Tensor, zg: Tensor, u: Tensor, v_keys: Tensor, tok: dict[str, Tensor],
               value_norm_keys: Tensor) -> dict[str, Tensor]:
    """alpha, cosine, cosine_layer, contribution, contribution_layer for chosen keys.

    ``v_keys`` is (B, H, T, K, dh) or (B, H, K, dh) (keys shared by all queries); every
    output is (B, H, T, K).
    """
    if v_keys.dim() == 4:
        dot_head = zg @ v_keys.transpose(-1, -2)                       # <o_i^h, v~_j>
        dot_layer = u @ v_keys.transpose(-1, -2)                       # <o_i, v~_j^h>
        vn = value_norm_keys[:, :, None, :]
    else:
        dot_head = torch.einsum("bhtd,bhtkd->bhtk", zg, v_keys)
        dot_layer = torch.einsum("bhtd,bhtkd->bhtk", u, v_keys)
        vn = value_norm_keys
    on = tok["output_norm"][..., None]
    ln = tok["layer_output_norm"][:, None, :, None]
    return {
        "alpha": alpha,
        "cosine": dot_head / (on * vn),
        "cosine_layer": dot_layer / (ln * vn),
        "contribution": alpha * dot_head / on.square(),
        "contribution_layer": alpha * dot_layer / ln.square(),
    }


def tail_index(T: int, k: int, w: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Key index (T, w) = query - lag, and whether it is a non-sink key >= 0."""
    q = torch.arange(T, device=device)[:, None]
    lag = torch.arange(w, device=device)[None, :]
    key = q - lag
    return key.clamp_min(0), key >= k
