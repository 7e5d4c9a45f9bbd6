"""One attention layer in, its attention output and every stored measurement out.

``dense`` computes the full (query, key) probability matrix (eager attention).
``compact`` runs the fused SDPA kernel, which also returns each query's log-sum-exp, and
evaluates alpha only for the sink keys and the tail window; totals over the middle keys
follow from the exact sums (sum_j alpha = 1, sum_j c = 1, sum_j C^h = head_share).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .geometry import (Projection, fused_attention, pair_terms, per_token, repeat_kv, scores,
                       softmax_masked, tail_index)

Tensor = torch.Tensor
PAIR_NAMES = ("alpha", "cosine", "cosine_layer", "contribution", "contribution_layer")


@dataclass(frozen=True)
class Options:
    """What to measure: the layout and the sink/tail group sizes."""

    mode: str = "compact"
    sink_k: int = 1
    tail_w: int = 8


def _nan_where(x: Tensor, keep: Tensor) -> Tensor:
    return x.masked_fill(~keep, float("nan"))


def measure_layer(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor, token_mask: Tensor,
                  scale: float, proj: Projection, opts: Options,
                  softcap: float | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """Attention output and measurements of one layer.

    Parameters
    ----------
    q : (B, H, T, dh) queries; k, v : (B, G, T, dh) keys and values (G divides H).
    allowed : (B, 1 or H, T, T) bool, the model's attention mask (True = attends).
    token_mask : (B, T) bool, real (non-padding) tokens.

    Returns
    -------
    z : (B, H, T, dh) head outputs before W_O, in the dtype of ``q``.
    out : dict of float32 tensors named as in ``attngeom.store.schema`` (layer dim absent).
    """
    H = q.shape[1]
    allowed = allowed & token_mask[:, None, None, :]
    vf = repeat_kv(v, H).float()
    if opts.mode == "dense" or softcap is not None:
        alpha = softmax_masked(scores(q, repeat_kv(k, H), scale, softcap), allowed)
        z = alpha @ vf
        lse = None
    else:
        z, lse = fused_attention(q, repeat_kv(k, H), repeat_kv(v, H), allowed, scale)
        alpha = None
    zf = z.float()
    kk = min(opts.sink_k, q.shape[2])
    sink_alpha = alpha[..., :kk] if alpha is not None else _alpha_at(
        q, repeat_kv(k, H)[:, :, :kk], lse, allowed[..., :kk], scale)
    tok = per_token(zf, vf, sink_alpha, proj)
    rest = allowed[..., kk:].any(-1)                                    # any non-sink key
    tok["residual_norm"] = tok["residual_norm"].masked_fill(~rest, 0.0)  # not roundoff
    tok["sink_residual_cosine"] = tok["sink_residual_cosine"].masked_fill(~rest, float("nan"))
    zg, u = tok.pop("_zg"), tok.pop("_u")
    qv = token_mask[:, None, :]                                         # (B, 1, T)
    if opts.mode == "dense":
        pairs = pair_terms(alpha, zg, u, vf, tok, tok["value_norm"])
        keep = allowed & qv[..., None]
        out = {n: _nan_where(x, keep) for n, x in pairs.items()}
    else:
        out = _compact(q, repeat_kv(k, H), vf, alpha, lse, allowed, sink_alpha, zg, u, tok,
                       scale, opts)
        out = {n: _nan_where(x, qv[..., None] if x.dim() == 4 else qv) for n, x in out.items()}
    out["value_norm"] = _nan_where(tok["value_norm"], qv)
    out["sink_value_cosine"] = _nan_where(tok["sink_value_cosine"], qv)
    for name in ("output_norm", "residual_norm", "sink_residual_cosine", "head_share"):
        out[name] = _nan_where(tok[name], qv)
    out["layer_output_norm"] = _nan_where(tok["layer_output_norm"], token_mask)
    return z.to(q.dtype), out


def _alpha_at(q: Tensor, keys: Tensor, lse: Tensor, allowed: Tensor, scale: float) -> Tensor:
    """alpha for chosen keys from the log-sum-exp: keys (B,H,K,dh) or (B,H,T,K,dh)."""
    if keys.dim() == 4:
        logits = scores(q, keys, scale, None)                           # (B, H, T, K)
    else:
        logits = torch.einsum("bhtd,bhtkd->bhtk", q.float(), keys.float()) * scale
    alpha = torch.exp(logits - lse.float()[..., None])
    return alpha.masked_fill(~allowed, 0.0)


def _compact(q, kf, vf, alpha, lse, allowed, sink_alpha, zg, u, tok, scale, opts):
    """Sink pairs, tail pairs (on lag) and middle totals; alpha may be None (fused path)."""
    B, H, T, _ = q.shape
    kk = sink_alpha.shape[-1]
    allowed = allowed.expand(B, H, T, T)
    sink = pair_terms(sink_alpha, zg, u, vf[:, :, :kk], tok, tok["value_norm"][..., :kk])
    sink = {n: x.masked_fill(~allowed[..., :kk], float("nan")) for n, x in sink.items()}
    idx, non_sink = tail_index(T, opts.sink_k, opts.tail_w, q.device)     # (T, w)
    tail_ok = allowed.gather(-1, idx.expand(B, H, T, -1)) & non_sink
    if alpha is not None:
        tail_alpha = alpha.gather(-1, idx.expand(B, H, T, -1)).masked_fill(~tail_ok, 0.0)
    else:
        tail_alpha = _alpha_at(q, kf[:, :, idx], lse, tail_ok, scale)
    tail = pair_terms(tail_alpha, zg, u, vf[:, :, idx], tok, tok["value_norm"][:, :, idx])
    out = {n: x for n, x in sink.items()}
    out.update({f"tail_{n}": x.masked_fill(~tail_ok, float("nan")) for n, x in tail.items()})
    totals = {"alpha": 1.0, "contribution": 1.0, "contribution_layer": tok["head_share"]}
    for name, total in totals.items():
        known = sink[name].nan_to_num(0.0).sum(-1) + tail[name].masked_fill(~tail_ok, 0).sum(-1)
        out[f"middle_{name}"] = total - known
    count = allowed.sum(-1) - allowed[..., :kk].sum(-1) - tail_ok.sum(-1)
    out["middle_count"] = count.float()
    return out
