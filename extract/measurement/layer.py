"""One attention layer in, its attention output and every stored measurement out.

``dense`` computes the full (query, key) probability matrix (eager attention).
``compact`` runs the fused SDPA kernel, which also returns each query's log-sum-exp, and
evaluates alpha only for the sink keys and the tail window; totals over the middle keys
follow from the exact sums (sum_j alpha = 1, sum_j c = 1, sum_j C^h = head_share).

Masks are prepared once per forward pass (:func:`prepare_masks`), never per layer, and never
expanded to the heads.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attngeom.common.vocab import COMPACT, DENSE, SINK_K, TAIL_W

from .geometry import (Projection, attention_bias, attention_probs, band, band_values,
                       fused_attention, per_token, repeat_kv, tail_index)

Tensor = torch.Tensor
PAIR_NAMES = ("alpha", "cosine", "cosine_layer", "contribution", "contribution_layer")
MASK_ROWS = 256                # queries of a (T, T) mask checked or summed at a time
NAN = float("nan")


@dataclass(frozen=True)
class Options:
    """What to measure: the layout, the sink/tail group sizes, and whether to return the
    contributions that a store derives on read (``derived=False`` skips them)."""

    mode: str = COMPACT
    sink_k: int = SINK_K
    tail_w: int = TAIL_W
    derived: bool = True


@dataclass
class Masks:
    """Everything one layer needs from the attention mask, made once per forward.

    Shapes: allowed (B, 1|H, T, T); sink_ok (B, 1|H, T, k); tail_ok (B, 1|H, T, w);
    count, rest (B, 1|H, T); query (B, 1, T) real queries; token (B, T).
    """

    allowed: Tensor
    bias: Tensor | None          # None: plain causal, no padding (fused kernel's is_causal)
    sink_ok: Tensor
    tail_ok: Tensor
    tail_key: Tensor             # (T, w) key index of each (query, lag), clamped at 0
    count: Tensor
    rest: Tensor
    query: Tensor
    token: Tensor


def prepare_masks(allowed: Tensor, token_mask: Tensor, opts: Options,
                  dtype: torch.dtype) -> Masks:
    """Masks of one forward pass from the model's boolean mask and the real tokens.

    Without padding the model's mask is used as it is (no (B, 1, T, T) copy held through the
    forward: 64 MB at 8,192 tokens); each query's allowed keys, and whether the mask is plain
    causal, come from one pass over it, :data:`MASK_ROWS` queries at a time (summing a boolean
    (T, T) mask makes an int64 copy of it: 512 MB at 8,192 tokens)."""
    whole = bool(token_mask.all())
    a = allowed if whole and allowed.shape[0] == token_mask.shape[0] else (
        allowed & token_mask[:, None, None, :])                          # key must be real
    T = a.shape[-1]
    k = min(opts.sink_k, T)
    allowed_keys, index_sum = _key_counts(a)                            # (B, 1|H, T)
    plain = a.shape[1] == 1 and a.shape[-2] == T and whole and _causal(allowed_keys, index_sum)
    key, non_sink = tail_index(T, opts.sink_k, opts.tail_w, a.device)   # (T, w)
    tail_ok = a.gather(-1, key.expand(*a.shape[:-1], -1)) & non_sink
    sink_ok = a[..., :k]
    count = allowed_keys - sink_ok.sum(-1) - tail_ok.sum(-1)
    # a query with no allowed key (left padding) attends to every key in the kernel, as
    # transformers' SDPA does: an all-masked row gives NaN, which would reach later layers
    kernel = None if plain else attention_bias(a | ~a.any(-1, keepdim=True), dtype)
    return Masks(allowed=a, bias=kernel, sink_ok=sink_ok,
                 tail_ok=tail_ok, tail_key=key, count=count.float(), rest=a[..., k:].any(-1),
                 query=token_mask[:, None, :], token=token_mask)


def _key_counts(a: Tensor) -> tuple[Tensor, Tensor]:
    """(B, 1|H, Tq) int64 each: the allowed keys of each query of the boolean mask ``a`` and
    the sum of their indices, :data:`MASK_ROWS` queries at a time in one int64 buffer (a
    boolean block's own sum would make an int64 copy of each block, which the C heap does not
    reuse for the next)."""
    Tq, Tk = a.shape[-2:]
    keys = torch.arange(Tk, device=a.device)
    buf = a.new_empty((*a.shape[:-2], min(MASK_ROWS, Tq), Tk), dtype=torch.int64)
    counts, sums = [], []
    for lo in range(0, Tq, MASK_ROWS):
        block = buf[..., :min(MASK_ROWS, Tq - lo), :].copy_(a[..., lo:lo + MASK_ROWS, :])
        counts.append(block.sum(-1))
        sums.append(block.mul_(keys).sum(-1))
    return torch.cat(counts, -1), torch.cat(sums, -1)


def _causal(count: Tensor, index_sum: Tensor) -> bool:
    """Whether a mask whose queries have these allowed keys (``count``) and key indices
    (``index_sum``) is exactly causal: query i has i + 1 keys whose indices sum to
    i (i + 1) / 2, the least that i + 1 distinct indices sum to, so they are keys 0..i."""
    i = torch.arange(count.shape[-1], device=count.device)
    return bool((count == i + 1).all()) and bool((index_sum == i * (i + 1) // 2).all())


def measure_layer(q: Tensor, k: Tensor, v: Tensor, masks: Masks, scale: float,
                  proj: Projection, opts: Options, softcap: float | None = None,
                  sinks: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """Attention output and measurements of one layer.

    Parameters
    ----------
    q : (B, H, T, dh) queries; k : (B, G, T, dh) keys; v : (B, G, T, dv) values (G divides H;
        dv may differ from dh, as in MLA).
    masks : from :func:`prepare_masks` for this layer's attention mask.
    softcap : the model's logit soft-cap, or None.
    sinks : learned sink logits broadcastable to (B, H, T) (gpt-oss ``s_aux``), or None: a
        virtual key with no value; its weight is returned as ``learned_sink_alpha``.

    Returns
    -------
    z : (B, H, T, dv) head outputs before W_O, in the dtype of ``q``.
    out : dict of float32 tensors named as in ``attngeom.store.format.schema`` (layer dim absent).
    """
    H = q.shape[1]
    kk = masks.sink_ok.shape[-1]
    if opts.mode == DENSE or softcap is not None:
        alpha, learned = attention_probs(q, repeat_kv(k, H), scale, masks.allowed, softcap,
                                         sinks)
        vf = repeat_kv(v, H).float()
        z, zf, lse = None, alpha @ vf, None
        sink_alpha, r = alpha[..., :kk], alpha[..., kk:] @ vf[:, :, kk:]
    else:
        alpha, z = None, None
        # the repeated keys and values are freed on return, before the per-token terms
        zf, lse, sink_alpha, r, learned = split_attention(q, repeat_kv(k, H), repeat_kv(v, H),
                                                          masks, scale, sinks)
    tok = per_token(zf, v.float(), r, kk, proj)
    del r
    zg, u = tok.pop("_zg"), tok.pop("_u")
    sink_dots = tok.pop("_sink_dot"), tok.pop("_sink_dot_layer")
    if opts.mode == DENSE:
        out = _dense(alpha, zg, u, vf, tok, masks, opts)
    else:
        out = _compact(q, k, v, alpha, lse, sink_alpha, sink_dots, zg, u, tok, masks, scale,
                       opts, learned)
    out.update(_per_token_out(tok, masks))
    if learned is not None:
        out["learned_sink_alpha"] = learned.masked_fill(~masks.query, NAN)
    return (z if z is not None else zf).to(q.dtype), out


def split_attention(q: Tensor, k: Tensor, v: Tensor, masks: Masks, scale: float,
                    sinks: Tensor | None = None) -> tuple[Tensor, ...]:
    """Fused attention over the non-sink keys, combined with the sink keys by log-sum-exp.

    Returns z, lse, sink_alpha (B, H, T, k), the non-sink part r = sum_{j>=k} alpha_ij v_j,
    and the learned sink's weight (B, H, T) (None without ``sinks``), all float32; r comes
    from its own keys, so it stays exact when alpha_i0 is near 1.
    q, k : (B, H, T, dh), v : (B, H, T, dv) (keys and values repeated to the query heads);
    sinks : learned sink logits broadcastable to (B, H, T), a virtual key with no value.
    """
    kk, T = masks.sink_ok.shape[-1], q.shape[2]
    none = ~(masks.rest | masks.sink_ok.any(-1))      # no allowed key at all (padding query)
    rest = masks.rest | none
    lse_r = q.new_empty(q.shape[:3], dtype=torch.float32)                 # (B, H, T)
    z_r = v.new_empty(v.shape, dtype=torch.float32)                       # (B, H, T, dv)
    if kk >= T:                                       # every key is a sink key
        z_r.zero_()
    elif masks.bias is None:                          # causal, no padding: queries i >= k
        z, lse = fused_attention(q[:, :, kk:], k[:, :, kk:], v[:, :, kk:], None, scale)
        z_r[:, :, :kk], z_r[:, :, kk:], lse_r[:, :, kk:] = 0.0, z, lse
    else:
        z, lse = fused_attention(q, k[:, :, kk:], v[:, :, kk:], masks.bias[..., kk:], scale)
        z_r.copy_(z), lse_r.copy_(lse)
    lse_r.masked_fill_(~rest, float("-inf"))
    logits = (q.float() @ k[:, :, :kk].float().transpose(-1, -2)) * scale  # (B, H, T, k)
    logits = logits.masked_fill(~masks.sink_ok, float("-inf"))
    lse = torch.logaddexp(lse_r, torch.logsumexp(logits, -1))            # (B, H, T)
    learned = None
    if sinks is not None:                             # the virtual key joins the softmax
        virtual = sinks.float().expand(lse.shape)
        lse = torch.logaddexp(lse, virtual)
        learned = torch.exp(virtual - lse)
    sink_alpha = torch.exp(logits - lse[..., None])
    r = z_r.mul_(torch.exp(lse_r - lse)[..., None])
    v_sink = v[:, :, :kk].float()                                        # (B, H, k, dv)
    if kk == 1:                                       # z = r + alpha_i0 v_0, one fused pass
        z = torch.addcmul(r, sink_alpha, v_sink)
    else:                                             # z = r + sum_s alpha_is v_s (sink_k >= 1)
        z = torch.baddbmm(r.flatten(0, 1), sink_alpha.flatten(0, 1),
                          v_sink.flatten(0, 1)).view_as(r)
    return z, lse, sink_alpha, r.masked_fill_(~masks.rest[..., None], 0.0), learned


def _per_token_out(tok: dict[str, Tensor], masks: Masks) -> dict[str, Tensor]:
    """Per-token names with NaN outside the real tokens (residual 0 when only sinks)."""
    nq = ~masks.query                                                   # (B, 1, T)
    rest = masks.rest
    tok["residual_norm"] = tok["residual_norm"].masked_fill(~rest, 0.0)  # not roundoff
    tok["sink_residual_cosine"] = tok["sink_residual_cosine"].masked_fill(~rest, NAN)
    out = {n: x.masked_fill(nq, NAN) for n, x in tok.items() if n != "layer_output_norm"}
    out["layer_output_norm"] = tok["layer_output_norm"].masked_fill(~masks.token, NAN)
    return out


def _pairs(alpha: Tensor, dot_head: Tensor, dot_layer: Tensor, on: Tensor, ln: Tensor,
           vn: Tensor) -> dict[str, Tensor]:
    """alpha, cosine, cosine_layer, contribution, contribution_layer (B, H, T, K).

    on (B, H, T, 1), ln (B, 1, T, 1), vn broadcastable to (B, H, T, K)."""
    return {"alpha": alpha, "cosine": _cosine(dot_head, on, vn),
            "cosine_layer": _cosine(dot_layer, ln, vn),
            "contribution": _contribution(alpha, dot_head, on),
            "contribution_layer": _contribution(alpha, dot_layer, ln)}


def _cosine(dot: Tensor, norm: Tensor, vn: Tensor, in_place: bool = False) -> Tensor:
    """cos(o, v~) = <o, v~> / (||o|| ||v~||); ``in_place``: in ``dot``."""
    return dot.div_(norm * vn) if in_place else dot / (norm * vn)


def _contribution(alpha: Tensor, dot: Tensor, norm: Tensor) -> Tensor:
    """alpha <o, v~> / ||o||^2 (c with the head output, C with the layer output)."""
    return alpha * dot / norm.square()


def _dense(alpha, zg, u, vf, tok, masks: Masks, opts: Options) -> dict[str, Tensor]:
    """Every (query, key) pair; NaN where the key is not allowed or the query is padding.

    The values of :func:`_pairs`, each (B, H, T, T) array made once and then changed in place
    (``alpha`` too), and the contributions only when asked for: a layer of a long text holds
    about four such arrays at a time, not ten."""
    on = tok["output_norm"][..., None]
    ln = tok["layer_output_norm"][:, None, :, None]
    vn = tok["value_norm"][:, :, None, :]
    bad = ~(masks.allowed & masks.query[..., None])
    vt = vf.transpose(-1, -2)
    cosines, contributions = {}, {}
    for name, x, norm in (("cosine", zg, on), ("cosine_layer", u, ln)):
        dot = x @ vt                                                    # (B, H, T, T)
        if opts.derived:
            contributions[name.replace("cosine", "contribution")] = _contribution(
                alpha, dot, norm).masked_fill_(bad, NAN)
        cosines[name] = _cosine(dot, norm, vn, in_place=True).masked_fill_(bad, NAN)
    return {"alpha": alpha.masked_fill_(bad, NAN), **cosines, **contributions}


def _compact(q, k, v, alpha, lse, sink_alpha, sink_dots, zg, u, tok, masks: Masks, scale,
             opts: Options, learned: Tensor | None = None) -> dict[str, Tensor]:
    """Sink pairs, tail pairs (on lag) and middle totals; alpha is None on the fused path.

    k : (B, G, T, dh), v : (B, G, T, dv) per kv head; ``learned`` (B, H, T) the learned sink's
    weight, which the real keys' alpha do not hold (middle_alpha = 1 - learned - sink - tail).
    """
    kk, w = sink_alpha.shape[-1], opts.tail_w
    H = q.shape[1]
    on = tok["output_norm"][..., None]
    ln = tok["layer_output_norm"][:, None, :, None]
    vn = tok["value_norm"]
    sink = _pairs(sink_alpha, *sink_dots, on, ln, vn[:, :, None, :kk])
    t_dh, t_dl = band([zg, u], v.float(), w)                            # (B, H, T, w)
    if alpha is None:
        t_qk = band([q.float()], k.float(), w)[0]
        t_alpha = torch.exp(t_qk * scale - lse[..., None]).masked_fill(~masks.tail_ok, 0.0)
    else:
        idx = masks.tail_key.expand(*alpha.shape[:-1], -1)
        t_alpha = alpha.gather(-1, idx).masked_fill(~masks.tail_ok, 0.0)
    tail = _pairs(t_alpha, t_dh, t_dl, on, ln, band_values(vn, w))
    nq = ~masks.query[..., None]                                        # (B, 1, T, 1)
    keep = PAIR_NAMES if opts.derived else ("alpha", "cosine", "cosine_layer")
    out = {n: sink[n].masked_fill(~masks.sink_ok | nq, NAN) for n in keep}
    out.update({f"tail_{n}": tail[n].masked_fill(~masks.tail_ok | nq, NAN) for n in keep})
    totals = {"alpha": 1.0 if learned is None else 1.0 - learned, "contribution": 1.0,
              "contribution_layer": tok["head_share"]}
    for name, total in totals.items():
        known = (sink[name].masked_fill(~masks.sink_ok, 0.0).sum(-1)
                 + tail[name].masked_fill(~masks.tail_ok, 0.0).sum(-1))
        out[f"middle_{name}"] = (total - known).masked_fill(nq[..., 0], NAN)
    B, _, T = tok["value_norm"].shape
    out["middle_count"] = masks.count.expand(B, H, T).masked_fill(nq[..., 0], NAN)
    return out
