"""A layer's scores by metric name: float32 with their error, the float64 definition, its rows.

The dispatchers above the kernels (:mod:`.kernels`, which finds each metric's by name):
:func:`fast_scores` is every (head, query, key) score of a layer in float32 and the bound of
its rounding error; :func:`metric_scores` the same in float64 from the layer's float64
attention and values (the definition); :class:`ExactScores` evaluates the definition for the
few ranking rows whose order the float32 scores leave open (:mod:`.selection`), from the layer's
inputs, with the same bits as :func:`metric_scores` (row-by-row arithmetic,
:func:`~.base.rowmm`).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from attngeom.common import metrics

from ..measurement.geometry import Projection
from .base import (exact_alpha, exact_z, key_norms, rowmm, rowmm_within, value_norms,
                   widths)
from .exact_scores import Rows64
from .field_scores import TokenRows64
from .kernels import kernels
from .removal_scores import FastLayer, within_scale
from .selection import ErrorBound

Tensor = torch.Tensor


def fast_scores(metric: str, alpha: Tensor, value: Tensor, proj: Projection, lam: Tensor,
                out: Tensor | None = None, blocks=None, context=None
                ) -> tuple[Tensor, ErrorBound]:
    """Scores (B, H, T, Tk) in alpha's dtype (into ``out``; ``alpha`` itself for attention;
    (B, 1, T, Tk) for a metric of scope ``token``) and the size of their rounding error: the
    metric's registered float32 kernel (:mod:`attngeom.common.metrics`).

    Parameters: see :class:`FastLayer`.

    Error model (each metric's ``error_unit`` is fitted in its units): alpha's relative error is
    O(u Lambda); the head output o = sum_j alpha v~ has an absolute error
    O(u Lambda sum_j alpha ||v~||), relative kappa = sum_j alpha ||v~|| / ||o|| times that, which
    every score divided by or projected on o inherits. At the layer level
    (contribution_layer) the sum over keys and heads is taken in quadrature, as the roundings
    of alpha's entries have independent signs: relative u (Lambda_w + D + sqrt(sum_h'
    (Lambda_w s_h')^2 + (D_h' ||o^h'||)^2) / ||o||), s_h = sqrt(sum_j alpha^2 ||v~||^2), D the
    softmax normaliser's rounding measured from alpha's row sums
    (:attr:`~.removal_scores.FastLayer.normaliser`) in place of Lambda's sqrt(Tk); the sum of
    |terms| overstates it by up to sqrt(Tk) where attention is diffuse, and with it the rows
    recomputed in float64.
    contribution's bound is the same in a head: relative u (Lambda_w + Lambda q / ||o||),
    q = sqrt(sum_j alpha^2 ||v~||^2) (:attr:`~.removal_scores.FastLayer.spread`), its alpha
    term without the normaliser's rounding, which it cancels (o scales alike). The
    signed scores' error is relative to |score| except near 0 (a key almost orthogonal to o).
    Within one (head, query) row alpha's error is O(u Lambda_w) once the normaliser's rounding,
    common to the row, is set aside (:func:`~.removal_scores.within_scale`): the bound
    ``within`` where a metric's registry entry has a ``within_unit`` (contribution_layer's kernel
    gives its own). With the layer's context, contribution_layer's kernel also gives ``refine``:
    chosen keys' scores without alpha's rounding (the logits in float64, o from the float32
    head outputs), bounded by o's error alone, which decide many of its near rows before their
    float64 rows are computed (:mod:`.near`).
    """
    entry, u = metrics.get(metric), torch.finfo(alpha.dtype).eps / 2
    score, error = kernels(metric).fast(FastLayer(alpha, value, proj, lam, out, blocks, context),
                                        entry.error_unit * u)
    if entry.within_unit:                                # an error of u Lambda |score|
        error = replace(error, within=entry.within_unit * u * within_scale(lam, alpha.shape[-1]))
    return score, error


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
    entry, kernel = metrics.get(metric), kernels(metric).exact
    B, H, T, Tk = alpha.shape
    if entry.scope == metrics.TOKEN:
        b, i = (t.reshape(-1) for t in torch.meshgrid(
            torch.arange(B, device=alpha.device), torch.arange(T, device=alpha.device),
            indexing="ij"))
        return kernel(TokenRows64(context, b, i)).view(B, 1, T, Tk)
    if entry.scope == metrics.LAYER:
        B, H, T, dh = z.shape
        o = rowmm(z.transpose(1, 2).reshape(B, T, H * dh), proj.weight)   # (B, T, d)
        u = rowmm(o, proj.transposed()).reshape(B, T, H, dh).transpose(1, 2)  # o_i (W_O^h)^T
        layer_sq = o.square().sum(-1)[:, None, :, None]                    # ||o_i||^2
        width = widths(alpha)
        return kernel(alpha, rowmm_within(u, vf.transpose(-1, -2), width, inner=False), layer_sq)
    at = lambda n: torch.arange(n, device=alpha.device)                 # noqa: E731
    where = (at(B)[:, None, None], at(H)[None, :, None], at(T)[None, None, :])
    rows = Rows64(alpha, vf, vf.transpose(-1, -2), proj.gram[None],
                  lambda _: value_norms(vf, proj.gram), z, where, context)
    return kernel(rows)


class ExactScores:
    """Float64 scores of chosen rows of one layer, from its inputs (see :data:`.near.Exact`).

    The same bits as :func:`metric_scores` of the whole layer (row by row arithmetic), for a
    few rows at a time (``CHUNK`` rows x keys at most; ``LAYER_CHUNK`` for every head's rows
    of contribution_layer: a float64 tensor of that size is reused from the C heap, one over
    glibc's largest mmap threshold (32 MiB) is mapped and zeroed afresh by the system, which
    at long contexts costs as much as the pass over it, while smaller chunks make more
    products of few rows). Head-local metrics compute only the rows asked for, every
    (sequence, head) pair's rows in one batch; contribution_layer needs every head's output
    at a query, so it computes those once per query and the scores of the heads asked for.
    Keys and values are converted to float64 once per layer and gathered as blocks.
    """

    CHUNK = 1 << 20        # rows x keys computed at a time (padded rows included; 8 MiB float64)
    LAYER_CHUNK = 3 << 20  # contribution_layer's: every head's (24 MiB, under glibc's 32 MiB)

    def __init__(self, metric: str, query: Tensor, key: Tensor, value: Tensor, allowed: Tensor,
                 scale: float, softcap: float | None, proj: Projection,
                 sinks: Tensor | None = None, context=None):
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

    def local(self, b: Tensor, h: Tensor, i: Tensor, keys: Tensor | None = None) -> Tensor:
        """(n, Tk): a head-local metric's scores at rows (b, h, i); (n, K) at ``keys`` (n, K).

        The rows of each (sequence, head) pair are stacked, padded to the largest pair's count
        with repeats of its first row (not multiplied: ``asked``), and all pairs computed in one
        batch (see :meth:`_heads`).
        """
        width = self.k.shape[2] if keys is None else keys.shape[1]
        out = self.q.new_empty(len(b), width, dtype=torch.float64)
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
            asked = torch.zeros(index.shape, dtype=torch.bool, device=index.device)
            asked[place, pos] = True                             # not the repeats
            at = None
            if keys is not None:                                 # (Pb, M, K) as index
                at = keys[order[start[batch]]][:, None].repeat(1, index.shape[1], 1)
                at[place, pos] = keys[rows]
            out[rows] = self._heads(pairs[batch] // H, pairs[batch] % H, index, at,
                                    asked)[place, pos]
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

    def _heads(self, b: Tensor, h: Tensor, i: Tensor, keys: Tensor | None = None,
               asked: Tensor | None = None) -> Tensor:
        """(P, M, Tk): a head-local metric at queries i (P, M) of heads h (P,) in sequences b;
        (P, M, K) at ``keys`` (P, M, K); ``asked`` (P, M): the rows wanted (the others, padding,
        are not multiplied)."""
        g = h // self.rep
        head = h if self.allowed.shape[1] > 1 else torch.zeros_like(h)
        allowed = self.allowed[b[:, None], head[:, None], i]                    # (P, M, Tk)
        sinks = None if self.sinks is None else self.sinks[b[:, None], h[:, None], i]
        kt, v, vt = (x.flatten(0, 1) for x in self.kv())       # blocks (B G, ...), not copied
        index = b * self.k.shape[1] + g                          # (P,) each pair's block
        alpha = exact_alpha(self.q[b[:, None], h[:, None], i], kt.mT, allowed,
                            self.scale, self.softcap, sinks, index, asked)      # (P, M, Tk)
        gram = None if self.proj is None else self.proj.gram[h]
        rows = Rows64(alpha, v, vt, gram, lambda r: self._norms(b, h, v, index),
                      where=(b[:, None], h[:, None], i), context=self.context,
                      keys=keys if self.entry.builtin else None, index=index, asked=asked)
        return self._at(self.kernel(rows), keys)

    def _at(self, scores: Tensor, keys: Tensor | None) -> Tensor:
        """A plugin kernel's full rows (..., Tk) at ``keys`` (..., K) (a built-in kernel's
        scores are at the keys already)."""
        return scores if keys is None or self.entry.builtin else scores.gather(-1, keys)

    def _norms(self, b: Tensor, h: Tensor, v: Tensor, index: Tensor) -> Tensor:
        """||v~_j^h|| (P, Tk) of the pairs (b, h), one pair at a time (as :func:`value_norms`),
        pair p's values the block v[index[p]]."""
        for p, key in enumerate(zip(b.tolist(), h.tolist())):
            if key not in self.norms:
                self.norms[key] = key_norms(v[int(index[p])], self.proj.gram[key[1]])
        return torch.stack([self.norms[key] for key in zip(b.tolist(), h.tolist())])

    def queries(self, b: Tensor, i: Tensor, keys: Tensor | None = None) -> Tensor:
        """(n, H, Tk): every head's scores at queries (b, i); (n, 1, Tk) for scope token;
        (n, H or 1, K) at ``keys`` (n, K)."""
        n, H = len(b), self.q.shape[1]
        if self.token_scope:
            built = keys if self.entry.builtin else None
            return self._at(self.kernel(TokenRows64(self.context, b, i, built)), keys)[:, None]
        if not self.layer_scope:
            return self.local(b.repeat_interleave(H), torch.arange(H, device=b.device).repeat(n),
                              i.repeat_interleave(H),
                              None if keys is None else keys.repeat_interleave(H, 0)
                              ).view(n, H, -1)
        width = self.k.shape[2] if keys is None else keys.shape[1]
        out = self.q.new_empty(n, H, width, dtype=torch.float64)
        for bb in b.unique().tolist():                  # one sequence's keys gathered once
            rows = (b == bb).nonzero()[:, 0]
            out[rows] = self._layer_rows(bb, i[rows], None,
                                         None if keys is None else keys[rows]).transpose(0, 1)
        return out

    def _layer_rows(self, b: int, i: Tensor, h: Tensor | None = None,
                    keys: Tensor | None = None) -> Tensor:
        """A layer-scope metric in sequence b (metric_scores' steps): every head at queries i (m,),
        (H, m, Tk); or the rows (i, h), (m, Tk), each query's heads' outputs computed once;
        at ``keys`` (m, K) only: (H, m, K) or (m, K) (the dot products of every key within a
        row's width computed, as a product's columns' bits depend on each other,
        :func:`~.base.rowmm_within`).

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
        width = widths(alpha)                                           # (G, rep * mq)
        z = exact_z(alpha, v, width).reshape(H, mq, -1)                   # (H, mq, dh)
        o = rowmm(z.transpose(0, 1).reshape(mq, -1), self.proj.weight)  # (mq, d)
        layer_sq = o.square().sum(-1)                                   # ||o_i||^2 (mq,)
        u = rowmm(o, self.proj.transposed()).reshape(mq, H, -1).transpose(0, 1)  # o_i W_O^T
        alpha, width = alpha.reshape(H, mq, -1), width.reshape(H, mq)
        if h is None:
            c = rowmm_within(u.reshape(G, -1, u.shape[-1]), vt, width.reshape(G, -1),
                             inner=False).reshape(H, mq, -1)             # <o_i, v~_j^h>
            if keys is not None:
                k3 = keys.expand(H, *keys.shape)
                alpha, c = alpha.gather(-1, k3), c.gather(-1, k3)
            return self.kernel(alpha, c, layer_sq[None, :, None])
        out = alpha.new_empty(len(i), alpha.shape[-1] if keys is None else keys.shape[1])
        for g in (h // self.rep).unique().tolist():     # only the rows asked for, by kv head
            rows = (h // self.rep == g).nonzero()[:, 0]
            hh, at = h[rows], where[rows]
            a, c = alpha[hh, at], rowmm_within(u[hh, at], vt[g], width[hh, at], inner=False)
            if keys is not None:
                a, c = a.gather(-1, keys[rows]), c.gather(-1, keys[rows])
            out[rows] = self.kernel(a, c, layer_sq[at, None])
        return out

    def __call__(self, b: Tensor, i: Tensor, h: Tensor | None = None,
                 keys: Tensor | None = None) -> Tensor:
        """Scores of rows (b, h, i): (n, Tk), or every head's at queries (b, i) with h None:
        (n, H, Tk); at ``keys`` (n, K) only: (n, K) or (n, H, K) (:data:`.near.Exact`)."""
        if h is None or not self.layer_scope:
            return self._chunked(b, i, h, keys)
        order = torch.argsort(b * self.q.shape[2] + i, stable=True)    # a query's rows together
        width = self.k.shape[2] if keys is None else keys.shape[1]
        out = self.q.new_empty(len(b), width, dtype=torch.float64)
        step = max(1, self.LAYER_CHUNK // self.k.shape[2] // self.q.shape[1])
        for lo in range(0, len(b), step):
            rows = order[lo:lo + step]
            for bb in b[rows].unique().tolist():        # one sequence's keys gathered once
                these = rows[b[rows] == bb]
                out[these] = self._layer_rows(bb, i[these], h[these],
                                              None if keys is None else keys[these])
        return out

    def _chunked(self, b: Tensor, i: Tensor, h: Tensor | None,
                 keys: Tensor | None = None) -> Tensor:
        """Rows (b, h, i), or whole queries (b, i) with h None, ``CHUNK`` entries at a time."""
        H, Tk = self.q.shape[1], self.k.shape[2]
        per_entry = H if h is None and not self.token_scope else 1
        chunk = self.LAYER_CHUNK if self.layer_scope else self.CHUNK
        step = max(1, chunk // Tk // per_entry)
        part = (lambda x, lo: None if x is None else x[lo:lo + step])       # noqa: E731
        parts = [self.queries(b[lo:lo + step], i[lo:lo + step], part(keys, lo)) if h is None
                 else self.local(b[lo:lo + step], h[lo:lo + step], i[lo:lo + step],
                                 part(keys, lo))
                 for lo in range(0, len(b), step)]
        return torch.cat(parts)
