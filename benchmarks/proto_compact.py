"""A prototype of faster compact extraction, kept here as measured evidence for proposals.

Not used by attngeom. Same outputs as ``attngeom.extract.capture.measure(..., Options("compact"))``
(checked by :func:`check` to float32 round-off, NaN pattern included), computed with:

1. masks prepared once per forward, not per layer: the attention bias, the tail-window mask,
   the middle-key count and the query mask come from the (B, 1, T, T) mask once (never
   expanded to H heads), and a mask that is plain causal with no padding runs the fused kernel
   with ``is_causal=True`` and no bias at all;
2. one (H*dh x H*dh) Gram matrix ``W_O W_O^T`` per layer: ``u = o W_O^T = z_flat (W_O W_O^T)`` and
   ``||o||^2 = u . z_flat``, so the layer output o is never formed (one d x d matmul per layer
   instead of two);
3. per-head Gram products as batched matmuls (``x @ G[None]``) instead of einsum;
4. the tail window as block-banded batched matmuls (blocks of w queries against windows of
   2w - 1 keys) instead of gathering (B, H, T, w, dh) copies of keys and values and einsum;
5. optionally ``logits_to_keep=1``: extraction never needs the LM head's (B, T, vocab) logits.
"""

from __future__ import annotations

import numpy as np
import torch

from attngeom.extract.archs import attention_layers
from attngeom.extract.geometry import repeat_kv
from attngeom.extract.hooks import attention_handler

Tensor = torch.Tensor
NAN = float("nan")


class ProtoMeasurer:
    """Attention handler computing the compact layout (sink k keys, tail w lags, middle sums)."""

    def __init__(self, model, sink_k: int = 1, tail_w: int = 8):
        self.layers = {id(m): (i, w) for i, (m, w, _) in enumerate(attention_layers(model))}
        self.k, self.w = sink_k, tail_w
        self.grams: dict[int, tuple[Tensor, Tensor]] = {}
        self.masks: dict[tuple, dict] = {}
        self.token_mask: Tensor | None = None
        self.results: dict[int, dict[str, Tensor]] = {}

    def _gram(self, module, H: int) -> tuple[Tensor, Tensor]:
        key = id(module)
        if key not in self.grams:
            w = self.layers[key][1].detach().float()                # (H*dh, d)
            full = w @ w.T                                          # (H*dh, H*dh)
            dh = w.shape[0] // H
            heads = torch.stack([full[h * dh:(h + 1) * dh, h * dh:(h + 1) * dh]
                                 for h in range(H)])                # (H, dh, dh)
            self.grams[key] = (full, heads)
        return self.grams[key]

    def _masks(self, allowed: Tensor, token_mask: Tensor, dtype) -> dict:
        key = (allowed.data_ptr(), tuple(allowed.shape), allowed.stride(),
               token_mask.data_ptr(), dtype)
        m = self.masks.get(key)
        if m is not None:
            return m
        a = allowed & token_mask[:, None, None, :]                  # (B, 1|H, T, T)
        T = a.shape[-1]
        causal = torch.ones(T, T, dtype=torch.bool, device=a.device).tril()
        plain = a.shape[1] == 1 and bool(token_mask.all()) and bool((a == causal).all())
        bias = None
        if not plain:
            bias = torch.zeros(a.shape, dtype=dtype, device=a.device)
            bias = bias.masked_fill(~a, torch.finfo(dtype).min)
        k = min(self.k, T)
        j = torch.arange(T, device=a.device)[:, None] - torch.arange(self.w, device=a.device)
        tail_ok = a.gather(-1, j.clamp_min(0).expand(*a.shape[:-1], -1)) & (j >= self.k)
        sink_ok = a[..., :k]
        m = {"plain": plain, "bias": bias, "sink_ok": sink_ok, "tail_ok": tail_ok,
             "count": (a.sum(-1) - sink_ok.sum(-1) - tail_ok.sum(-1)).float(),
             "rest": a[..., k:].any(-1), "qv": token_mask[:, None, :],
             "nq": ~token_mask[:, None, :]}
        self.masks[key] = m
        return m

    def _attention(self, q, k, v, m, scale):
        if q.device.type == "cpu":
            if m["plain"]:
                return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                    q, k, v, 0.0, True, scale=scale)[:2]
            return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                q, k, v, 0.0, False, attn_mask=m["bias"], scale=scale)[:2]
        if m["plain"] and q.dtype in (torch.float16, torch.bfloat16):
            out = torch.ops.aten._scaled_dot_product_flash_attention(
                q, k, v, 0.0, True, False, scale=scale)
            return out[0], out[1]
        bias = m["bias"]
        if bias is None:
            T = q.shape[2]
            bias = torch.zeros(T, T, dtype=q.dtype, device=q.device).masked_fill(
                ~torch.ones(T, T, dtype=torch.bool, device=q.device).tril(),
                torch.finfo(q.dtype).min)[None, None]
        z, lse = torch.ops.aten._scaled_dot_product_efficient_attention(
            q, k, v, bias.expand(q.shape[0], q.shape[1], -1, -1), True, scale=scale)[:2]
        return z, lse[..., : q.shape[2]]

    def attend(self, module, query, key, value, allowed, scaling, softcap):
        if softcap is not None:
            raise NotImplementedError("prototype: no soft-capping")
        layer = self.layers[id(module)][0]
        B, H, T, dh = query.shape
        tm = self.token_mask
        tm = (torch.ones(B, T, dtype=torch.bool, device=query.device) if tm is None
              else tm.to(query.device))
        m = self._masks(allowed, tm, query.dtype)
        kr, vr = repeat_kv(key, H), repeat_kv(value, H)
        z, lse = self._attention(query, kr, vr, m, scaling)
        self.results[layer] = self._measure(query, kr, vr, z, lse.float(), m, scaling,
                                            *self._gram(module, H))
        return z

    def _measure(self, q, kr, vr, z, lse, m, scale, full, heads) -> dict[str, Tensor]:
        B, H, T, dh = q.shape
        k, w = m["sink_ok"].shape[-1], self.w
        zf, vf, qf, kf = z.float(), vr.float(), q.float(), kr.float()
        zg, vg = zf @ heads[None], vf @ heads[None]                   # (B, H, T, dh)
        on = (zg * zf).sum(-1).clamp_min(0).sqrt()                   # (B, H, T)
        vn = (vg * vf).sum(-1).clamp_min(0).sqrt()
        zflat = zf.transpose(1, 2).reshape(B, T, H * dh)
        uflat = zflat @ full                                         # o W_O^T, (B, T, H*dh)
        ln2 = (uflat * zflat).sum(-1)                                # ||o||^2, (B, T)
        ln = ln2.clamp_min(0).sqrt()
        u = uflat.view(B, T, H, dh).transpose(1, 2)                  # (B, H, T, dh)
        head_share = (u * zf).sum(-1) / ln2[:, None]
        # sink keys
        vs = vf[:, :, :k]
        s_alpha = torch.exp((qf @ kf[:, :, :k].transpose(-1, -2)) * scale - lse[..., None])
        s_alpha = s_alpha.masked_fill(~m["sink_ok"], 0.0)            # (B, H, T, k)
        s_dh = zg @ vs.transpose(-1, -2)
        s_dl = u @ vs.transpose(-1, -2)
        r = zf - s_alpha @ vs
        rn = ((r @ heads[None]) * r).sum(-1).clamp_min(0).sqrt()
        v0g, v0n = vg[:, :, :1], vn[:, :, :1]
        # tail window by lag, key j = i - lag, as block-banded batched matmuls
        t_qk = band(qf, kf, w)
        t_dh, t_dl = band(zg, vf, w), band(u, vf, w)
        t_vn = band_values(vn, w)
        tail_ok = m["tail_ok"]
        t_alpha = torch.exp(t_qk * scale - lse[..., None]).masked_fill(~tail_ok, 0.0)
        on4, ln4 = on[..., None], ln[:, None, :, None]
        sink = {"alpha": s_alpha, "cosine": s_dh / (on4 * vs_norm(vn, k)),
                "cosine_layer": s_dl / (ln4 * vs_norm(vn, k)),
                "contribution": s_alpha * s_dh / on4.square(),
                "contribution_layer": s_alpha * s_dl / ln4.square()}
        tail = {"alpha": t_alpha, "cosine": t_dh / (on4 * t_vn),
                "cosine_layer": t_dl / (ln4 * t_vn),
                "contribution": t_alpha * t_dh / on4.square(),
                "contribution_layer": t_alpha * t_dl / ln4.square()}
        nq4 = m["nq"][..., None]
        bad_sink = ~m["sink_ok"] | nq4
        bad_tail = ~tail_ok | nq4
        out = {n: x.masked_fill(bad_sink, NAN) for n, x in sink.items()}
        out.update({f"tail_{n}": x.masked_fill(bad_tail, NAN) for n, x in tail.items()})
        nq = m["nq"]
        totals = {"alpha": 1.0, "contribution": 1.0, "contribution_layer": head_share}
        for name, total in totals.items():
            known = sink[name].nan_to_num(0.0).sum(-1) + tail[name].masked_fill(~tail_ok, 0).sum(-1)
            out[f"middle_{name}"] = (total - known).masked_fill(nq, NAN)
        out["middle_count"] = m["count"].expand(B, H, T).masked_fill(nq, NAN)
        out["value_norm"] = vn.masked_fill(nq, NAN)
        out["sink_value_cosine"] = ((v0g * vf).sum(-1) / (v0n * vn)).masked_fill(nq, NAN)
        out["output_norm"] = on.masked_fill(nq, NAN)
        rest = m["rest"]
        out["residual_norm"] = rn.masked_fill(~rest, 0.0).masked_fill(nq, NAN)
        src = ((v0g * r).sum(-1) / (v0n * rn)).masked_fill(~rest, NAN)
        out["sink_residual_cosine"] = src.masked_fill(nq, NAN)
        out["head_share"] = head_share.masked_fill(nq, NAN)
        out["layer_output_norm"] = ln.masked_fill(~m["qv"][:, 0], NAN)
        return out

    def collect(self) -> dict[str, np.ndarray]:
        layers = [self.results[i] for i in sorted(self.results)]
        self.results = {}
        self.masks = {}
        return {name: torch.stack([r[name] for r in layers], dim=1).cpu().numpy()
                for name in layers[0]}


def band(a: Tensor, x: Tensor, w: int) -> Tensor:
    """``out[..., i, lag] = a[..., i, :] . x[..., i - lag, :]`` (0 where i - lag < 0).

    a, x : (B, H, T, dh). Queries go in blocks of w; each block meets a window of 2w - 1 keys
    in one small matmul, so no (B, H, T, w, dh) copy is made. Returns (B, H, T, w).
    """
    B, H, T, dh = a.shape
    nb = -(-T // w)
    pad = nb * w - T
    a = torch.nn.functional.pad(a, (0, 0, 0, pad)).reshape(B, H, nb, w, dh)
    xp = torch.nn.functional.pad(x, (0, 0, w - 1, pad))              # (B, H, nb*w + w-1, dh)
    win = xp.unfold(2, 2 * w - 1, w)[:, :, :nb]                      # (B, H, nb, dh, 2w-1)
    s = a @ win                                                       # (B, H, nb, w, 2w-1)
    r = torch.arange(w, device=a.device)[:, None]
    col = (r + w - 1 - torch.arange(w, device=a.device)[None]).expand(B, H, nb, w, w)
    return s.gather(-1, col).reshape(B, H, nb * w, w)[:, :, :T]


def band_values(x: Tensor, w: int) -> Tensor:
    """``out[..., i, lag] = x[..., i - lag]`` (0 where i - lag < 0); x (B, H, T)."""
    T = x.shape[-1]
    xp = torch.nn.functional.pad(x, (w - 1, 0))
    return xp.unfold(-1, w, 1).flip(-1)[..., :T, :]


def vs_norm(vn: Tensor, k: int) -> Tensor:
    """Value norms of the sink keys as (B, H, 1, k)."""
    return vn[:, :, None, :k]


@torch.inference_mode()
def proto_measure(model, batch: dict, sink_k: int = 1, tail_w: int = 8,
                  no_logits: bool = False) -> dict[str, np.ndarray]:
    """Compact measurements of every layer, as ``capture.measure`` returns them."""
    handler = ProtoMeasurer(model, sink_k, tail_w)
    mask = batch.get("attention_mask")
    if mask is not None:
        handler.token_mask = mask.bool()
    extra = {"logits_to_keep": 1} if no_logits else {}
    with attention_handler(model, handler):
        model(**batch, use_cache=False, **extra)
    return handler.collect()


def check(model, batch: dict, sink_k: int = 1, tail_w: int = 8) -> dict:
    """Largest differences between the prototype and attngeom's compact extraction."""
    from attngeom.extract.capture import measure
    from attngeom.extract.measure import Options

    ref = measure(model, batch, Options("compact", sink_k, tail_w))
    new = proto_measure(model, batch, sink_k, tail_w)
    report = {"same_names": sorted(ref) == sorted(new), "nan_pattern_equal": True,
              "max_abs_err": 0.0, "max_rel_err": 0.0, "worst": None}
    for name in ref:
        a, b = ref[name], new[name]
        if a.shape != b.shape:
            raise AssertionError(f"{name}: shape {b.shape} != {a.shape}")
        if not np.array_equal(np.isnan(a), np.isnan(b)):
            report["nan_pattern_equal"] = False
            report["worst"] = f"{name}: NaN pattern differs"
        ok = np.isfinite(a) & np.isfinite(b)
        err = np.abs(a[ok] - b[ok]) / (np.abs(a[ok]) + 1e-3)
        e = float(err.max()) if err.size else 0.0
        if err.size:
            report["max_abs_err"] = max(report["max_abs_err"], float(np.abs(a[ok] - b[ok]).max()))
        if e > report["max_rel_err"]:
            report["max_rel_err"], report["worst"] = e, name
    return report
