"""The field's attribution methods as removal scores: ALTI, the norm-based method, rollout.

Each scores the keys of a query with the heads combined (scope ``token``, so they rank keys at
``--granularity token``), from the layer's own clean attention in the pass:

- ``alti``: ``max(0, ||y_i||_1 - ||y_i - T_i(x_j)||_1)`` (Ferrando et al. 2022) with
  ``T_i(x_j) = Lr_i(La_i(sum_h alpha_ij^h v~_j^h) + [i = j] x_i)`` and ``y_i = sum_j T_i(x_j)``,
  the biases apart (:mod:`.residual`). The paper normalises over j; a query's scores divided by
  one positive number rank alike, so the removal ranks the unnormalised scores (the scores API,
  :mod:`.attribution`, gives the normalised ones);
- ``norm_residual``: ``||T_i(x_j)||_2`` (Kobayashi et al. 2021, attention + residual + LN);
- ``alti_sa``, ``norm_residual_sa``: the same, except the self key j = i, which they score with
  the residual x_i in T_i(x_i): these score it by its attention part ``Lr_i(La_i(sum_h alpha_ii^h
  v~_i^h))`` only, what removing the key removes (the removal deletes alpha_ij v~_j^h, never x_i);
- ``rollout``: ``[A~^l A~^(l-1) ... A~^0]_ij`` with ``A~ = 0.5 I + 0.5 mean_h alpha`` (Abnar and
  Zuidema 2020), from the attention each layer computes in the same pass before its removal
  (a product kept in the pass's ``carry``, in float32 and float64 from the same weights).

Float32 error. ALTI and the norm-based scores take differences and norms of d-vectors, so
their error is absolute: ``unit * (Lambda_i + Tk + d) * M_i`` with Lambda alpha's error scale
(:func:`~.removal_scores.logit_scale`, largest over heads), Tk and d the lengths of the sums
over keys and over the model dimension, and M_i the size of the sums involved
(``2 ||y_i||_1 + max_j ||y_i - T_i(x_j)||_1``, or ``max_j ||T_i(x_j)||_2``). Rollout's product
of non-negative matrices has a relative error of u (H + T + 2) per layer, summed over layers.
"""

from __future__ import annotations

import torch

from ..measurement.geometry import repeat_kv
from .base import ROWS, exact_alpha, finite, rowmm
from .context import LayerContext
from .dense import weighted_values
from .residual import float64_copy
from .selection import ErrorBound

Tensor = torch.Tensor
CHUNK_BYTES = 8 << 20         # the (B, queries, keys, d) terms of a chunk of queries (cached)


# ------------------------------------------------------------------------------ decomposition
def value_vectors(value: Tensor, weight: Tensor, n_heads: int) -> Tensor:
    """v~_j^h = v_j^g(h) W_O^h (B, H, Tk, d) from values per kv head (B, G, Tk, dh)."""
    H = n_heads
    w = weight.view(H, -1, weight.shape[-1])                           # (H, dh, d)
    return repeat_kv(value, H).to(weight.dtype) @ w[None]


def by_key(vt: Tensor) -> Tensor:
    """v~ (B, H, Tk, d) as (B, Tk, H, d), contiguous: each key's heads together, the layout in
    which the sum over heads of every (query, key) is one batched matrix product."""
    return vt.permute(0, 2, 1, 3).contiguous()


def scales(ctx: LayerContext, z: Tensor, weight: Tensor) -> tuple[Tensor | None, Tensor | None]:
    """(s_a, s_r) (B, T): the scales of the normalisations after the attention output and after
    the residual sum at this layer's own vectors (None where there is none), in z's dtype.

    z (B, H, T, dh) the head outputs before W_O; the attention output is ``o_i + b_O``."""
    B, H, T, dh = z.shape
    res = ctx.residual
    o = _rows(z.transpose(1, 2).reshape(B, T, H * dh), weight)             # (B, T, d)
    if res.bias is not None:
        o = o + res.bias.to(o)
    s_a = s_r = None
    if res.after_attention is not None:
        s_a = res.after_attention.scale(o)
        o = _module(res.after_attention, o)(o)
    if res.after_residual is not None:
        s_r = res.after_residual.scale(ctx.x.to(o) + o)
    return s_a, s_r


def _rows(a: Tensor, b: Tensor, rows: int = ROWS) -> Tensor:
    """``a @ b``; in float64 (the exact scores) by :func:`~.base.rowmm`, a query row's bits then
    the same whichever rows are computed with it (blocks of 4 rows for the sum over heads:
    one product per key, b only H x d)."""
    return rowmm(a, b, rows) if a.dtype == torch.float64 else a @ b


def _module(norm, y: Tensor):
    return float64_copy(norm.module) if y.dtype == torch.float64 else norm.module


def terms(alpha: Tensor, vt: Tensor, x: Tensor, queries: Tensor, res,
          s_a: Tensor | None, s_r: Tensor | None) -> tuple[Tensor, Tensor]:
    """T_i(x_j) (B, m, Tk, d) and the self key's attention part (B, m, d) of queries (m,).

    alpha (B, H, m, Tk) of those queries; vt (B, Tk, H, d) contiguous (:func:`by_key`); x
    (B, m, d) their residual input; s_a, s_r (B, m) or None."""
    t = _rows(alpha.permute(0, 3, 2, 1), vt, 4)                           # (B, Tk, m, d)
    t = t.transpose(1, 2).contiguous()                                   # (B, m, Tk, d)
    if res.after_attention is not None:
        t = res.after_attention.linear(t, s_a[..., None])
    m = torch.arange(len(queries), device=t.device)
    own = t[:, m, queries]                                                # (B, m, d)
    t[:, m, queries] = own + x
    if res.after_residual is not None:
        t = res.after_residual.linear(t, s_r[..., None])
        own = res.after_residual.linear(own, s_r)
    return t, own


def alti_raw(t: Tensor, own: Tensor | None, queries: Tensor) -> tuple[Tensor, Tensor]:
    """max(0, ||y||_1 - ||y - T_j||_1) (B, m, Tk), the self key by ``own`` when given; and
    2 ||y||_1 + max_j ||y - T_j||_1 (B, m), at least ||y||_1 + max_j ||T_j||_1: the size of the
    error. Float32 distances by ``torch.cdist`` (no (B, m, Tk, d) temporary); float64 ones
    term by term, so that a key with T_j = 0 scores exactly 0."""
    B, m, Tk, d = t.shape
    y = t.sum(2)                                                          # (B, m, d)
    l1 = y.abs().sum(-1)
    if t.dtype == torch.float64:
        dist = (y[:, :, None] - t).abs().sum(-1)
    else:
        dist = torch.cdist(t.reshape(B * m, Tk, d), y.reshape(B * m, 1, d), p=1).view(B, m, Tk)
    raw = (l1[..., None] - dist).clamp_min(0)
    if own is not None:
        at = torch.arange(len(queries), device=t.device)
        raw[:, at, queries] = (l1 - (y - own).abs().sum(-1)).clamp_min(0)
    return raw, 2 * l1 + dist.amax(-1)


def norms(t: Tensor, own: Tensor | None, queries: Tensor) -> tuple[Tensor, Tensor]:
    """||T_j||_2 (B, m, Tk), the self key by ``own`` when given; and max_j ||T_j||_2 (B, m)."""
    n = torch.linalg.vector_norm(t, dim=-1)
    size = n.amax(-1)
    if own is not None:
        m = torch.arange(len(queries), device=t.device)
        n[:, m, queries] = torch.linalg.vector_norm(own, dim=-1)
    return n, size


SCORE = {"alti": (alti_raw, False), "alti_sa": (alti_raw, True),
         "norm_residual": (norms, False), "norm_residual_sa": (norms, True)}


# ------------------------------------------------------------------------------ float32
def _fast_decomposed(name: str, x, unit: float) -> tuple[Tensor, ErrorBound]:
    ctx: LayerContext = x.context
    score, attention_part = SCORE[name]
    alpha = x.alpha
    B, H, T, Tk = alpha.shape
    weight = ctx.proj.weight.to(alpha.dtype)
    vt = by_key(value_vectors(x.value, weight, H))                        # (B, Tk, H, d)
    s_a, s_r = scales(ctx, weighted_values(alpha, x.value, x.blocks), weight)
    xs = ctx.x.to(alpha.dtype)
    out, size = x.out[:, :1], alpha.new_empty(B, T)
    step = max(1, CHUNK_BYTES // (B * Tk * vt.shape[-1] * alpha.element_size()))
    for t0 in range(0, T, step):
        q = torch.arange(t0, min(T, t0 + step), device=alpha.device)
        t, own = terms(alpha[:, :, t0:t0 + step], vt, xs[:, t0:t0 + step], q, ctx.residual,
                       None if s_a is None else s_a[:, t0:t0 + step],
                       None if s_r is None else s_r[:, t0:t0 + step])
        out[:, 0, t0:t0 + step], size[:, t0:t0 + step] = score(
            t, own if attention_part else None, q)
    absolute = unit * (x.lam.amax(1) + Tk + vt.shape[-1]) * size          # (B, T)
    return (finite(out), ErrorBound(torch.zeros_like(absolute)[:, None],
                                    absolute=finite(absolute)[:, None]))


def fast_alti(x, unit):
    return _fast_decomposed("alti", x, unit)


def fast_alti_sa(x, unit):
    return _fast_decomposed("alti_sa", x, unit)


def fast_norm_residual(x, unit):
    return _fast_decomposed("norm_residual", x, unit)


def fast_norm_residual_sa(x, unit):
    return _fast_decomposed("norm_residual_sa", x, unit)


# ------------------------------------------------------------------------------ float64
class TokenRows64:
    """Float64 inputs of a token-scope metric at rows (b, i) of one layer: ``alpha(b)`` (H, m,
    Tk) at queries ``i[b == b]``; per sequence, made once: ``vt`` (H, Tk, d), ``x`` (T, d).
    ``keys`` (n, K): the keys whose scores are asked for, or None (every key): a kernel gives
    (n, K) scores, computing what it can at those keys only (value zeroing: a sublayer row per
    key), the rest in full and :meth:`at` them."""

    def __init__(self, ctx: LayerContext, b: Tensor, i: Tensor, keys: Tensor | None = None):
        self.context, self.b, self.i, self.keys = ctx, b, i, keys

    def at(self, t: Tensor) -> Tensor:
        """Scores (n, Tk) at the asked keys: (n, K) (t itself when every key is asked)."""
        return t if self.keys is None else t.gather(-1, self.keys)

    def alpha(self, b: int, i: Tensor) -> Tensor:
        ctx = self.context
        H = ctx.query.shape[1]
        allowed = ctx.allowed[b]
        allowed = allowed[:, i] if allowed.shape[0] > 1 else allowed[0, i][None]
        sinks = None if ctx.sinks is None else ctx.sinks.expand(ctx.query.shape[:-1])[b][:, i]
        return exact_alpha(ctx.query[b][:, i], repeat_kv(ctx.key[b][None], H)[0],
                           allowed.expand(H, len(i), -1), ctx.scaling, ctx.softcap, sinks)

    def sequence(self, b: int) -> tuple[Tensor, Tensor]:
        """vt (H, Tk, d) and x (T, d) of sequence b in float64 (cached in the layer's context)."""
        key = ("field64", b)
        if key not in self.context.cache:
            ctx = self.context
            vt = value_vectors(ctx.value[b][None].double(), ctx.proj.weight.double(),
                               ctx.query.shape[1])[0]
            self.context.cache[key] = (vt, ctx.x[b].double())
        return self.context.cache[key]

    def decomposed(self, b: int, i: Tensor) -> tuple[Tensor, Tensor]:
        """T_i(x_j) (m, Tk, d) and the self keys' attention parts (m, d) at queries i of b."""
        ctx, alpha = self.context, self.alpha(b, i)                      # (H, m, Tk)
        vt, x = self.sequence(b)
        z = rowmm(alpha, repeat_kv(ctx.value[b][None].double(), alpha.shape[0])[0])  # (H, m, dh)
        one = LayerContext(ctx.layer, ctx.query, ctx.key, ctx.value, ctx.allowed, ctx.scaling,
                           ctx.softcap, ctx.sinks, ctx.proj, x=x[i][None],
                           residual=ctx.residual)
        s_a, s_r = scales(one, z[None], ctx.proj.weight.double())
        t, own = terms(alpha[None], by_key(vt[None]), x[i][None], i, ctx.residual, s_a, s_r)
        return t[0], own[0]


def _exact_decomposed(name: str, rows: TokenRows64) -> Tensor:
    score, attention_part = SCORE[name]
    out = None
    for b in rows.b.unique().tolist():
        at = (rows.b == b).nonzero()[:, 0]
        t, own = rows.decomposed(b, rows.i[at])
        s = score(t[None], own[None] if attention_part else None, rows.i[at])[0][0]
        out = s.new_empty(len(rows.b), s.shape[-1]) if out is None else out
        out[at] = s
    return rows.at(finite(out))


def exact_alti(rows):
    return _exact_decomposed("alti", rows)


def exact_alti_sa(rows):
    return _exact_decomposed("alti_sa", rows)


def exact_norm_residual(rows):
    return _exact_decomposed("norm_residual", rows)


def exact_norm_residual_sa(rows):
    return _exact_decomposed("norm_residual_sa", rows)


# ------------------------------------------------------------------------------ rollout
def step_rollout(ctx: LayerContext, alpha: Tensor) -> None:
    """R <- (0.5 I + 0.5 mean_h alpha) R in float32 and float64, from this layer's attention
    (B, H, T, T) before its removal; the accumulated error size u (H + T + 2) per layer."""
    B, H, T, Tk = alpha.shape
    if T != Tk:
        raise RuntimeError(f"rollout needs self-attention over the same {T} positions; this "
                           f"layer attends from {T} queries to {Tk} keys")
    c = ctx.carry
    for name, dtype in (("rollout32", torch.float32), ("rollout64", torch.float64)):
        eye = torch.eye(T, dtype=dtype, device=alpha.device)
        a = 0.5 * eye + 0.5 * alpha.to(dtype).mean(1)                   # (B, T, T)
        c[name] = a if name not in c else a @ c[name]
    c["rollout_error"] = c.get("rollout_error", 0.0) + (H + T + 2)


def fast_rollout(x, unit: float) -> tuple[Tensor, ErrorBound]:
    """The pass's float32 rollout at this layer, error u (H + T + 2) summed over layers."""
    c = x.context.carry
    out = x.out[:, :1]
    out[:, 0] = c["rollout32"]
    rel = torch.full(out.shape[:-1], unit * c["rollout_error"], dtype=out.dtype,
                     device=out.device)
    return out, ErrorBound(rel)


def exact_rollout(rows: TokenRows64) -> Tensor:
    """The float64 rollout's rows (b, i)."""
    return rows.at(rows.context.carry["rollout64"][rows.b, rows.i])
