"""The scores a removal ranks keys by, in float64: the definition, and rows of it on demand.

:func:`metric_scores` is every (head, query, key) score of a layer from its float64 attention
and values; :class:`ExactScores` evaluates it for the few ranking rows whose order the float32
scores leave open (:mod:`.removal_scores`, :mod:`.selection`), from the layer's inputs.

Every contraction over a query's vector is one padded matrix product (:func:`rowmm`) whose rows
have the same bits however many rows are computed together, so a row's float64 scores are the
same whether it is computed alone or with every other row: a float64 tie (e.g. c = 1 at every
head of a query that sees one key) is then broken by position the same way in the fast path, in
the tests and whatever the batch.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from attngeom.common import metrics

from ..measurement.geometry import Projection, softmax_masked, vecdot

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
    not) with M, K and N zero-padded to multiples of :data:`ALIGN`: BLAS kernels (MKL's on x86) compute the last M mod 4 rows, and
    operands that are not 64-byte aligned, with another summation order, so an unpadded row's
    last bits depend on M and on its address; padded, a row's result is a function of the row
    alone (``tests/extract/test_selection.py`` checks it against every M up to 600, with 1 and
    2 threads). 2.5-3x faster than one matrix-vector product per row.
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


class Rows64:
    """Float64 inputs of a head-scope metric at some rows, and what metrics share (on demand).

    alpha (P, M, Tk) clean attention of M queries of P (sequence, head) pairs (or (B, H, T, Tk)
    for a whole layer); v (P, Tk, dh) the pairs' values, vt their transpose (contiguous);
    gram (P, dh, dh) G_h of each pair's head (or broadcastable); value_norm: a function
    returning ||v~_j^h|| (P, Tk); z: the head outputs before W_O when the caller has them;
    where: (b, h, i) the sequence, head and query of each row, broadcastable to alpha's
    leading shape, and context the layer's :class:`~.context.LayerContext` (a metric that
    ``needs`` ``position``: random).
    """

    def __init__(self, alpha: Tensor, v: Tensor, vt: Tensor, gram: Tensor,
                 value_norm: Callable[[], Tensor], z: Tensor | None = None,
                 where: tuple[Tensor, Tensor, Tensor] | None = None, context=None):
        self.alpha, self.v, self.vt, self.gram = alpha, v, vt, gram
        self._value_norm, self._z, self._output = value_norm, z, None
        self.context = context
        self.where = None if where is None else tuple(
            torch.broadcast_to(t, alpha.shape[:-1]) for t in where)

    def value_norm(self) -> Tensor:
        """||v~_j^h|| (P, Tk)."""
        return self._value_norm()

    def output(self) -> tuple[Tensor, Tensor]:
        """z_i G_h (P, M, dh) and ||o_i^h|| (P, M)."""
        if self._output is None:
            z = rowmm(self.alpha, self.v) if self._z is None else self._z
            zg = rowmm(z, self.gram)
            self._output = zg, vecdot(zg, z).clamp_min(0).sqrt()
        return self._output


def exact_attention(x: Rows64) -> Tensor:
    """alpha_ij^h."""
    return x.alpha


def exact_value_weighted(x: Rows64) -> Tensor:
    """alpha_ij^h ||v~_j^h||."""
    return finite(x.alpha * x.value_norm()[..., None, :])


def exact_value_weighted_normalized(x: Rows64) -> Tensor:
    """alpha_ij^h ||v~_j^h|| / ||o_i^h||."""
    return finite(x.alpha * x.value_norm()[..., None, :] / x.output()[1][..., None])


def exact_contribution(x: Rows64) -> Tensor:
    """c_ij^h = alpha_ij^h <o_i^h, v~_j^h> / ||o_i^h||^2."""
    zg, output_norm = x.output()
    return finite(x.alpha * rowmm(zg, x.vt) / output_norm.square()[..., None])


def exact_contribution_layer(alpha: Tensor, dot: Tensor, norm_sq: Tensor) -> Tensor:
    """C_ij^h = alpha_ij^h <o_i, v~_j^h> / ||o_i||^2 from ``dot`` = <o_i, v~_j^h> and
    ``norm_sq`` = ||o_i||^2 (broadcastable)."""
    return finite(alpha * dot / norm_sq)


def metric_scores(metric: str, alpha: Tensor, vf: Tensor, z: Tensor, proj: Projection,
                  context=None) -> Tensor:
    """Score of every (head, query, key): (B, H, T, Tk), in the inputs' dtype (the definition:
    the metric's registered float64 kernel over the whole layer); (B, 1, T, Tk) for a metric
    of scope ``token``.

    Parameters
    ----------
    alpha : (B, H, T, Tk) clean attention; vf : (B, H, Tk, dh) values per query head;
    z : (B, H, T, dh) clean head outputs before W_O (``alpha @ vf``); context : the layer's
    :class:`~.context.LayerContext` (a metric that needs one).
    """
    from .kernels import kernels

    entry, kernel = metrics.get(metric), kernels(metric).exact
    B, H, T, Tk = alpha.shape
    if entry.scope == metrics.TOKEN:
        from .field_scores import TokenRows64

        b, i = (t.reshape(-1) for t in torch.meshgrid(
            torch.arange(B, device=alpha.device), torch.arange(T, device=alpha.device),
            indexing="ij"))
        return kernel(TokenRows64(context, b, i)).view(B, 1, T, Tk)
    if entry.scope == metrics.LAYER:
        B, H, T, dh = z.shape
        o = rowmm(z.transpose(1, 2).reshape(B, T, H * dh), proj.weight)   # (B, T, d)
        u = rowmm(o, proj.transposed()).reshape(B, T, H, dh).transpose(1, 2)  # o_i (W_O^h)^T
        layer_sq = o.square().sum(-1)[:, None, :, None]                    # ||o_i||^2
        return kernel(alpha, rowmm(u, vf.transpose(-1, -2)), layer_sq)
    at = lambda n: torch.arange(n, device=alpha.device)                 # noqa: E731
    where = (at(B)[:, None, None], at(H)[None, :, None], at(T)[None, None, :])
    rows = Rows64(alpha, vf, vf.transpose(-1, -2), proj.gram[None],
                  lambda: value_norms(vf, proj.gram), z, where, context)
    return kernel(rows)


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
    few rows at a time (``CHUNK`` rows x keys at most). Head-local metrics compute only the rows
    asked for, every (sequence, head) pair's rows in one batch; contribution_layer needs every
    head's output at a query, so it computes those once per query and the scores of the heads
    asked for. Keys and values are converted to float64 once per layer and gathered as blocks.
    """

    CHUNK = 65536          # rows x keys computed at a time (padded rows included)

    def __init__(self, metric: str, query: Tensor, key: Tensor, value: Tensor, allowed: Tensor,
                 scale: float, softcap: float | None, proj: Projection,
                 sinks: Tensor | None = None, context=None):
        from .kernels import kernels

        self.entry, self.kernel = metrics.get(metric), kernels(metric).exact
        self.layer_scope = self.entry.scope == metrics.LAYER
        self.token_scope, self.context = self.entry.scope == metrics.TOKEN, context
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
        v, vt = self.take(v, b, g), self.take(vt, b, g)                         # (P, Tk, dh)
        gram = None if self.proj is None else self.proj.gram[h]
        return self.kernel(Rows64(alpha, v, vt, gram, lambda: self._norms(b, h, v),
                                  where=(b[:, None], h[:, None], i), context=self.context))

    def _norms(self, b: Tensor, h: Tensor, v: Tensor) -> Tensor:
        """||v~_j^h|| (P, Tk) of the pairs (b, h), one pair at a time (as :func:`value_norms`)."""
        for p, key in enumerate(zip(b.tolist(), h.tolist())):
            if key not in self.norms:
                self.norms[key] = key_norms(v[p], self.proj.gram[key[1]])
        return torch.stack([self.norms[key] for key in zip(b.tolist(), h.tolist())])

    def queries(self, b: Tensor, i: Tensor) -> Tensor:
        """(n, H, Tk): every head's scores at queries (b, i); (n, 1, Tk) for scope token."""
        n, H = len(b), self.q.shape[1]
        if self.token_scope:
            from .field_scores import TokenRows64

            return self.kernel(TokenRows64(self.context, b, i))[:, None]
        if not self.layer_scope:
            return self.local(b.repeat_interleave(H), torch.arange(H, device=b.device).repeat(n),
                              i.repeat_interleave(H)).view(n, H, -1)
        out = self.q.new_empty(n, H, self.k.shape[2], dtype=torch.float64)
        for bb in b.unique().tolist():                  # one sequence's keys gathered once
            rows = (b == bb).nonzero()[:, 0]
            out[rows] = self._layer_rows(bb, i[rows]).transpose(0, 1)
        return out

    def _layer_rows(self, b: int, i: Tensor, h: Tensor | None = None) -> Tensor:
        """A layer-scope metric in sequence b (metric_scores' steps): every head at queries i (m,),
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
            return self.kernel(alpha, c, layer_sq[None, :, None])
        out = alpha.new_empty(len(i), alpha.shape[-1])
        for g in (h // self.rep).unique().tolist():     # only the rows asked for, by kv head
            rows = (h // self.rep == g).nonzero()[:, 0]
            hh, at = h[rows], where[rows]
            c = rowmm(u[hh, at], vt[g])                                 # (r, Tk)
            out[rows] = self.kernel(alpha[hh, at], c, layer_sq[at, None])
        return out

    def __call__(self, b: Tensor, i: Tensor, h: Tensor | None = None) -> Tensor:
        if h is None or not self.layer_scope:
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
        per_entry = H if h is None and not (self.layer_scope or self.token_scope) else 1
        step = max(1, self.CHUNK // Tk // per_entry)
        parts = [self.queries(b[lo:lo + step], i[lo:lo + step]) if h is None
                 else self.local(b[lo:lo + step], h[lo:lo + step], i[lo:lo + step])
                 for lo in range(0, len(b), step)]
        return torch.cat(parts)
