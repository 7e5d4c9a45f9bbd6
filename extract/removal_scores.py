"""The scores a removal ranks keys by: fast float32 scores with an error bound, exact float64 rows.

:func:`fast_scores` computes every (head, query, key) score of a layer in float32 (the dtype of
the layer's attention) and bounds its rounding error (:class:`~.selection.ErrorBound`);
:func:`metric_scores` is the definition in float64, and :class:`ExactScores` evaluates it for the
few ranking rows whose order the bound leaves open (see :mod:`.selection`).

The float64 scores are computed query row by query row (each contraction over a query's vector
is one matrix-vector product, :func:`rowmm`), so a row's float64 scores have the same bits
whether it is computed alone or with every other row: a float64 tie (e.g. c = 1 at every head of
a query that sees one key) is then broken by position the same way in the fast path, in the
tests and whatever the batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .geometry import Projection, fill_disallowed_, repeat_kv, softmax_masked, vecdot
from .selection import ErrorBound

Tensor = torch.Tensor
ALIGN = 8                # rowmm pads M, K and N to multiples of this (8 float64: 64 bytes)
# The float32 rounding error of each metric's fast scores, in units of u * Lambda * |score|
# (attention, value_weighted), u * Lambda * (1 + kappa) * |score| (value_weighted_normalized) and
# u * Lambda * (1 + kappa) * alpha ||v~|| / ||o|| (contribution; u the unit roundoff, Lambda =
# logit_scale, kappa = sum_j alpha ||v~|| / ||o||), u * (Lambda_h + sqrt(sum_h' (Lambda_h'
# s_h')^2) / ||o||) times the same size (contribution_layer, see fast_scores): ten times the
# largest ratio measured on SmolLM2-135M prose (8 texts, every layer at T = 128, 7 layers at
# T = 512): 3.2, 3.2, 1.5, 1.0; contribution_layer 1.0 (8 texts, every layer at T = 128 and 512;
# 0.14 on the random model of benchmarks/bench_faithfulness.py). At the cut the signed metrics
# use it relative to |score| (see fast_scores).
ERROR_UNITS = {"attention": 32.0, "value_weighted": 32.0, "value_weighted_normalized": 16.0,
               "contribution": 10.0, "contribution_layer": 10.0}


def _finite(x: Tensor) -> Tensor:
    """0/0 (a zero head output) scores 0; +-inf clipped to the largest finite float."""
    big = torch.finfo(x.dtype).max
    return torch.nan_to_num(x, nan=0.0, posinf=big, neginf=-big)


def _unknown(metric: str) -> ValueError:
    return ValueError(f"unknown metric '{metric}'; use one of {', '.join(ERROR_UNITS)}")


# ------------------------------------------------------------------------------------ exact
def rowmm(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` for a (..., M, K), b (..., K, N) whose rows have the same bits however many
    rows are computed together and wherever they lie in memory.

    One batched matrix product of fresh (64-byte aligned) copies with M, K and N zero-padded to
    multiples of :data:`ALIGN`: BLAS kernels (MKL's on x86) compute the last M mod 4 rows, and
    operands that are not 64-byte aligned, with another summation order, so an unpadded row's
    last bits depend on M and on its address; padded, a row's result is a function of the row
    alone (``tests/extract/test_selection.py`` checks it against every M up to 600, with 1 and
    2 threads). 2.5-3x faster than one matrix-vector product per row.
    """
    (M, K), N = a.shape[-2:], b.shape[-1]
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


def gram_norm(x: Tensor, gram: Tensor) -> tuple[Tensor, Tensor]:
    """``x G`` (B, H, T, dh) and ``sqrt(x G x)`` (B, H, T), row by row (see :func:`rowmm`)."""
    xg = rowmm(x, gram[None])
    return xg, vecdot(xg, x).clamp_min(0).sqrt()


def logits64(q: Tensor, k: Tensor, scale: float, softcap: float | None) -> Tensor:
    """Attention logits (..., Tq, Tk) in float64, row by row."""
    s = rowmm(q.double(), k.double().transpose(-1, -2)) * scale
    return s if softcap is None else torch.tanh(s / softcap) * softcap


def value_norms(vf: Tensor, gram: Tensor) -> Tensor:
    """||v~_j^h|| (B, H, Tk) for values per query head vf (B, H, Tk, dh), one (b, h) at a time."""
    B, H = vf.shape[:2]
    return torch.stack([torch.stack([key_norms(vf[b, h], gram[h]) for h in range(H)])
                        for b in range(B)])


def key_norms(v: Tensor, gram: Tensor) -> Tensor:
    """sqrt(v G v) (Tk,) for one head's keys v (Tk, dh) (the same bits however it is called)."""
    return vecdot(v.contiguous() @ gram, v).clamp_min(0).sqrt()


def metric_scores(metric: str, alpha: Tensor, vf: Tensor, z: Tensor, proj: Projection) -> Tensor:
    """Score of every (head, query, key): (B, H, T, Tk), in the inputs' dtype (the definition).

    Parameters
    ----------
    alpha : (B, H, T, Tk) clean attention; vf : (B, H, Tk, dh) values per query head;
    z : (B, H, T, dh) clean head outputs before W_O (``alpha @ vf``).
    """
    if metric == "attention":
        return alpha
    if metric in ("value_weighted", "value_weighted_normalized"):
        s = alpha * value_norms(vf, proj.gram)[:, :, None, :]
        if metric == "value_weighted_normalized":
            _, output_norm = gram_norm(z, proj.gram)
            s = s / output_norm[..., None]
        return _finite(s)
    if metric == "contribution":
        zg, output_norm = gram_norm(z, proj.gram)                      # z_i G_h, ||o_i^h||
        return _finite(alpha * rowmm(zg, vf.transpose(-1, -2)) / output_norm.square()[..., None])
    if metric == "contribution_layer":
        B, H, T, dh = z.shape
        o = rowmm(z.transpose(1, 2).reshape(B, T, H * dh), proj.weight)   # (B, T, d)
        u = rowmm(o, proj.transposed()).reshape(B, T, H, dh).transpose(1, 2)  # o_i (W_O^h)^T
        layer_sq = o.square().sum(-1)[:, None, :, None]                    # ||o_i||^2
        return _finite(alpha * rowmm(u, vf.transpose(-1, -2)) / layer_sq)
    raise _unknown(metric)


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


class ExactScores:
    """Float64 scores of chosen rows of one layer, from its inputs (see :data:`.selection.Exact`).

    The same bits as :func:`metric_scores` of the whole layer (row by row arithmetic), for a
    few rows at a time (``CHUNK`` rows x keys at most). Head-local metrics gather each row's
    keys and values and compute only the rows asked for; contribution_layer needs every head's
    output at a query, so it computes those once per query and the scores of the heads asked
    for, with the keys and values of a sequence gathered once for all its queries.
    """

    CHUNK = 65536          # rows x keys computed at a time (temporaries: x dh float64 each)

    def __init__(self, metric: str, query: Tensor, key: Tensor, value: Tensor, allowed: Tensor,
                 scale: float, softcap: float | None, proj: Projection,
                 sinks: Tensor | None = None):
        self.metric, self.q, self.k, self.v, self.allowed = metric, query, key, value, allowed
        self.scale, self.softcap, self.proj = scale, softcap, proj
        self.sinks = None if sinks is None else sinks.expand(query.shape[:-1])   # (B, H, T)
        self.rep = query.shape[1] // key.shape[1]
        self.norms: dict[tuple[int, int], Tensor] = {}
        self._kv: tuple[Tensor, Tensor, Tensor] | None = None

    def kv(self) -> tuple[Tensor, Tensor, Tensor]:
        """k^T (B, G, dh, Tk), v (B, G, Tk, dh) and v^T in float64, contiguous (made once):
        gathered from these, the operands of :func:`rowmm` need no copy."""
        if self._kv is None:
            f64 = dict(dtype=torch.float64, memory_format=torch.contiguous_format)
            v = self.v.to(**f64)
            self._kv = (self.k.transpose(-1, -2).to(**f64), v, v.transpose(-1, -2).contiguous())
        return self._kv

    def take(self, x: Tensor, b: Tensor, g: Tensor) -> Tensor:
        """``x[b, g]`` for x (B, G, ...) contiguous and b, g (P,): whole blocks copied (advanced
        indexing gathers element by element, ~5x slower)."""
        return x.flatten(0, 1).index_select(0, b * x.shape[1] + g)

    def local(self, b: Tensor, h: Tensor, i: Tensor) -> Tensor:
        """(n, Tk): a head-local metric's scores at rows (b, h, i).

        The rows of each (sequence, head) pair are stacked, padded to the largest pair's count
        with repeats of its first row, and all pairs computed in one batch (see :meth:`_heads`).
        """
        out = self.q.new_empty(len(b), self.k.shape[2], dtype=torch.float64)
        H = self.q.shape[1]
        pairs, where = torch.unique(b * H + h, return_inverse=True)       # (P,) b * H + h
        order = torch.argsort(where, stable=True)                # rows grouped by pair
        count = torch.bincount(where, minlength=len(pairs))      # (P,)
        start = torch.cumsum(count, 0) - count
        slot = torch.arange(len(b), device=b.device) - start[where[order]]
        for batch in self._batches(count):                       # pairs of similar count
            at = torch.isin(where[order], batch)
            rows, pos = order[at], slot[at]
            index = i[order[start[batch]]][:, None].repeat(1, int(count[batch].max()))
            place = torch.searchsorted(batch, where[rows])       # (r,) pair within the batch
            index[place, pos] = i[rows]                          # (Pb, M) query positions
            out[rows] = self._heads(pairs[batch] // H, pairs[batch] % H, index)[place, pos]
        return out

    def _batches(self, count: Tensor) -> list[Tensor]:
        """Pair indices in batches of at most ``CHUNK`` padded rows x keys (at least one pair)."""
        step, batches, batch = max(1, self.CHUNK // self.k.shape[2]), [], []
        for p in torch.argsort(count, descending=True, stable=True).tolist():
            if batch and (len(batch) + 1) * int(count[batch[0]]) > step:
                batches.append(torch.tensor(sorted(batch)))
                batch = []
            batch.append(p)
        return batches + [torch.tensor(sorted(batch))]

    def _heads(self, b: Tensor, h: Tensor, i: Tensor) -> Tensor:
        """(P, M, Tk): a head-local metric at queries i (P, M) of heads h (P,) in sequences b."""
        g = h // self.rep
        head = h if self.allowed.shape[1] > 1 else torch.zeros_like(h)
        allowed = self.allowed[b[:, None], head[:, None], i]                    # (P, M, Tk)
        sinks = None if self.sinks is None else self.sinks[b[:, None], h[:, None], i]
        kt, v, vt = self.kv()
        alpha = exact_alpha(self.q[b[:, None], h[:, None], i], self.take(kt, b, g).mT, allowed,
                            self.scale, self.softcap, sinks)                    # (P, M, Tk)
        if self.metric == "attention":
            return alpha
        v, vt = self.take(v, b, g), self.take(vt, b, g)                         # (P, Tk, dh)
        if self.metric == "value_weighted":
            return _finite(alpha * self._norms(b, h, v)[:, None])
        z = rowmm(alpha, v)                                                     # (P, M, dh)
        zg = rowmm(z, self.proj.gram[h])                                        # z_i G_h
        output_norm = vecdot(zg, z).clamp_min(0).sqrt()                         # ||o_i^h||
        if self.metric == "value_weighted_normalized":
            return _finite(alpha * self._norms(b, h, v)[:, None] / output_norm[..., None])
        return _finite(alpha * rowmm(zg, vt) / output_norm.square()[..., None])

    def _norms(self, b: Tensor, h: Tensor, v: Tensor) -> Tensor:
        """||v~_j^h|| (P, Tk) of the pairs (b, h), one pair at a time (as :func:`value_norms`)."""
        for p, key in enumerate(zip(b.tolist(), h.tolist())):
            if key not in self.norms:
                self.norms[key] = key_norms(v[p], self.proj.gram[key[1]])
        return torch.stack([self.norms[key] for key in zip(b.tolist(), h.tolist())])

    def queries(self, b: Tensor, i: Tensor) -> Tensor:
        """(n, H, Tk): every head's scores at queries (b, i)."""
        n, H = len(b), self.q.shape[1]
        if self.metric != "contribution_layer":
            return self.local(b.repeat_interleave(H), torch.arange(H, device=b.device).repeat(n),
                              i.repeat_interleave(H)).view(n, H, -1)
        out = self.q.new_empty(n, H, self.k.shape[2], dtype=torch.float64)
        for bb in b.unique().tolist():                  # one sequence's keys gathered once
            rows = (b == bb).nonzero()[:, 0]
            out[rows] = self._layer_rows(bb, i[rows]).transpose(0, 1)
        return out

    def _layer_rows(self, b: int, i: Tensor, h: Tensor | None = None) -> Tensor:
        """contribution_layer in sequence b (metric_scores' steps): every head at queries i (m,),
        (H, m, Tk); or the rows (i, h), (m, Tk), each query's heads' outputs computed once.

        The query heads that read one kv head are stacked ((G, rep * mq, ...)), as in
        :func:`_grouped`, so that keys and values are never repeated per head."""
        H, G = self.q.shape[1], self.k.shape[1]
        query, where = (i, None) if h is None else i.unique(return_inverse=True)
        mq = len(query)
        kt, v, vt = (x[b] for x in self.kv())                          # (G, dh, Tk), (G, Tk, dh)
        by_kv = lambda x: x.expand(H, *x.shape[1:]).reshape(G, -1, *x.shape[2:])  # noqa: E731
        allowed = by_kv(self.allowed[b][:, query])                      # (G, rep * mq, Tk)
        sinks = None if self.sinks is None else by_kv(self.sinks[b][:, query])
        alpha = exact_alpha(by_kv(self.q[b][:, query]), kt.mT, allowed, self.scale,
                            self.softcap, sinks)                        # (G, rep * mq, Tk)
        z = rowmm(alpha, v).reshape(H, mq, -1)                            # (H, mq, dh)
        o = rowmm(z.transpose(0, 1).reshape(mq, -1), self.proj.weight)  # (mq, d)
        layer_sq = o.square().sum(-1)                                   # ||o_i||^2 (mq,)
        u = rowmm(o, self.proj.transposed()).reshape(mq, H, -1).transpose(0, 1)  # o_i W_O^T
        alpha = alpha.reshape(H, mq, -1)
        if h is None:
            c = rowmm(u.reshape(G, -1, u.shape[-1]), vt).reshape(H, mq, -1)  # <o_i, v~_j^h>
            return _finite(alpha * c / layer_sq[None, :, None])
        out = alpha.new_empty(len(i), alpha.shape[-1])
        for g in (h // self.rep).unique().tolist():     # only the rows asked for, by kv head
            rows = (h // self.rep == g).nonzero()[:, 0]
            hh, at = h[rows], where[rows]
            c = rowmm(u[hh, at], vt[g])                                 # (r, Tk)
            out[rows] = _finite(alpha[hh, at] * c / layer_sq[at, None])
        return out

    def __call__(self, b: Tensor, i: Tensor, h: Tensor | None = None) -> Tensor:
        if h is None or self.metric != "contribution_layer":
            return self._chunked(b, i, h)
        order = torch.argsort(b * self.q.shape[2] + i, stable=True)    # a query's rows together
        out = self.q.new_empty(len(b), self.k.shape[2], dtype=torch.float64)
        step = max(1, self.CHUNK // self.k.shape[2])
        for lo in range(0, len(b), step):
            rows = order[lo:lo + step]
            for bb in b[rows].unique().tolist():        # one sequence's keys gathered once
                these = rows[b[rows] == bb]
                out[these] = self._layer_rows(bb, i[these], h[these])
        return out

    def _chunked(self, b: Tensor, i: Tensor, h: Tensor | None) -> Tensor:
        """Rows (b, h, i), or whole queries (b, i) with h None, ``CHUNK`` entries at a time."""
        H, Tk = self.q.shape[1], self.k.shape[2]
        per_entry = H if h is None and self.metric != "contribution_layer" else 1   # rows each
        step = max(1, self.CHUNK // Tk // per_entry)
        parts = [self.queries(b[lo:lo + step], i[lo:lo + step]) if h is None
                 else self.local(b[lo:lo + step], h[lo:lo + step], i[lo:lo + step])
                 for lo in range(0, len(b), step)]
        return torch.cat(parts)


# ------------------------------------------------------------------------------------ fast
def _grouped(x: Tensor, groups: int) -> Tensor:
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
    q = _grouped((query * scale).to(dtype), G)                          # scale folded into q
    s = logits if logits is not None else query.new_empty(B, H, T, Tk, dtype=dtype)
    out = out if out is not None else query.new_empty(B, H, T, Tk, dtype=dtype)
    torch.matmul(q, key.to(dtype).transpose(-1, -2), out=_grouped(s, G))
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
    return (_grouped(alpha, G) @ value.to(alpha.dtype)).view(B, H, T, dh)


def logit_scale(query: Tensor, key: Tensor, scale: float,
                sinks: Tensor | None = None) -> Tensor:
    """Lambda (B, H, T) = scale |q_i| max_j |k_j| (+ |sink_i|) + sqrt(Tk), the size of alpha's
    rounding error.

    A logit's rounding error grows with |q_i| |k_j| scale, the softmax's with the number of
    keys (and with a learned sink logit, subtracted from every logit when it is the largest);
    alpha's relative error is a few u * Lambda.
    """
    H, G = query.shape[1], key.shape[1]
    k_max = key.float().norm(dim=-1).amax(-1).repeat_interleave(H // G, dim=1)     # (B, H)
    lam = scale * query.float().norm(dim=-1) * k_max[..., None] + key.shape[2] ** 0.5
    return lam if sinks is None else lam + sinks.float().abs()


def fast_scores(metric: str, alpha: Tensor, value: Tensor, proj: Projection, lam: Tensor,
                out: Tensor | None = None) -> tuple[Tensor, ErrorBound]:
    """Scores (B, H, T, Tk) in alpha's dtype (into ``out``; ``alpha`` itself for attention)
    and the relative size of their rounding error.

    Parameters
    ----------
    alpha : (B, H, T, Tk) clean attention; value : (B, G, Tk, dh) values per kv head; proj : the
    output projection in alpha's dtype; lam : (B, H, T) :func:`logit_scale`.

    Error model (fitted, see :data:`ERROR_UNITS`): alpha's relative error is O(u Lambda); the
    head output o = sum_j alpha v~ has an absolute error O(u Lambda sum_j alpha ||v~||),
    relative kappa = sum_j alpha ||v~|| / ||o|| times that, which every score divided by or
    projected on o inherits. At the layer level (contribution_layer) the sum over keys and heads
    is taken in quadrature, as the roundings of alpha's entries have independent signs: relative
    u (Lambda_h + sqrt(sum_h' (Lambda_h' s_h')^2) / ||o||), s_h = sqrt(sum_j alpha^2 ||v~||^2);
    the sum of |terms| overstated it by up to sqrt(Tk) where attention is diffuse, and with it
    the rows recomputed in float64. The signed scores' error is relative to |score| except
    near 0 (a key almost orthogonal to o).
    """
    if metric not in ERROR_UNITS:
        raise _unknown(metric)
    unit = ERROR_UNITS[metric] * torch.finfo(alpha.dtype).eps / 2
    if metric == "attention":
        return alpha, ErrorBound(unit * lam)
    H, dh = alpha.shape[1], value.shape[-1]
    vf = repeat_kv(value, H).to(alpha.dtype)                            # (B, H, Tk, dh)
    value_norm = vecdot(vf @ proj.gram[None], vf).clamp_min(0).sqrt()   # ||v~_j|| (B, H, Tk)
    out = torch.empty_like(alpha) if out is None else out
    if metric == "value_weighted":
        return torch.mul(alpha, value_norm[:, :, None, :], out=out), ErrorBound(unit * lam)
    if metric == "contribution_layer":
        return _layer_scores(alpha, vf, value, value_norm, proj, lam, unit, out)
    zs = alpha @ torch.cat([vf, value_norm[..., None]], -1)             # z and sum_j alpha||v~||
    z, mass = zs[..., :dh], zs[..., dh]
    zg = z @ proj.gram[None]
    output_norm = vecdot(zg, z).clamp_min(0).sqrt()                     # ||o_i^h|| (B, H, T)
    if metric == "value_weighted_normalized":
        torch.mul(alpha, value_norm[:, :, None, :], out=out).div_(output_norm[..., None])
        rel = unit * lam * (1 + mass / output_norm)
        return _finite_(out, output_norm), ErrorBound(_finite(rel))
    g = zg / output_norm.square()[..., None]                            # o_i^h / ||o_i^h||^2
    rel = unit * lam * (1 + mass / output_norm)
    return _project(alpha, g, value, output_norm, out), ErrorBound(_finite(rel))


def _layer_scores(alpha: Tensor, vf: Tensor, value: Tensor, value_norm: Tensor,
                  proj: Projection, lam: Tensor, unit: float, out: Tensor
                  ) -> tuple[Tensor, ErrorBound]:
    """contribution_layer's fast scores (see :func:`fast_scores`); vf (B, H, Tk, dh)."""
    B, H, T, _ = alpha.shape
    dh = vf.shape[-1]
    zf = (alpha @ vf).transpose(1, 2).reshape(B, T, H * dh)             # z_i, heads side by side
    u = zf @ proj.full                                                  # o_i W_O^T = z_i W_O W_O^T
    layer_norm = vecdot(u, zf).clamp_min(0).sqrt()                      # ||o_i|| (B, T)
    u = u.view(B, T, H, dh).transpose(1, 2)                             # o_i (W_O^h)^T per head
    g = u / layer_norm.square()[:, None, :, None]
    # s_h = sqrt(sum_j alpha^2 ||v~||^2): the norm of the value-weighted scores (B, H, T)
    weighted = torch.mul(alpha, value_norm[:, :, None, :], out=out)
    spread = torch.linalg.vector_norm(weighted, dim=-1)
    heads = (lam * spread).square().sum(1).sqrt()                       # (B, T) in quadrature
    rel = unit * (lam + (heads / layer_norm)[:, None])
    return _project(alpha, g, value, layer_norm, out), ErrorBound(_finite(rel))


def _project(alpha: Tensor, g: Tensor, value: Tensor, norm: Tensor, out: Tensor) -> Tensor:
    """alpha_ij (g_i . v_j) into ``out`` (B, H, T, Tk): g (B, H, T, dh), value (B, G, Tk, dh)."""
    G = value.shape[1]
    torch.matmul(_grouped(g.contiguous(), G), value.to(alpha.dtype).transpose(-1, -2),
                 out=_grouped(out, G))
    return _finite_(out.mul_(alpha), norm)


def _finite_(s: Tensor, norm: Tensor) -> Tensor:
    """:func:`_finite` in place, only where an output norm of 0 can have made inf or NaN."""
    return s.nan_to_num_(nan=0.0, posinf=torch.finfo(s.dtype).max,
                         neginf=-torch.finfo(s.dtype).max) if (norm == 0).any() else s
