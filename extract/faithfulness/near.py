"""The near rows of a removal: which candidates their float32 scores leave open, decided in float64.

A ranking row is *near* (:mod:`.selection`) when the error intervals of the two candidates at
its cut overlap. Only the candidates whose own intervals reach the cut's can change sides. With
s~_j a float32 score, e_j its error bound (:class:`~.selection.ErrorBound`: ``rel |s~_j| + abs +
root sqrt|s~_j|``) and the interval [L_j, U_j] = [s~_j - e_j, s~_j + e_j] holding the exact
score, let hi and lo be the m-th and (m+1)-th highest float32 scores of the row (m candidates
above the cut), X the largest U_j of the candidates <= lo and Y the smallest L_j of those >= hi.
At least n - m candidates have exact scores <= X and at least m have scores >= Y, so

- a candidate with L_j > X is above the cut in float64 too (at most m - 1 others can reach it),
- one with U_j < Y is below it (m others are surely above it),
- and the rest are *open*: the cut passes among them.

The float32 decision (``>= hi``) is already right for the first two kinds (L_j > X >= lo puts
s~_j >= hi; U_j < Y <= hi puts it below), so only the open candidates are ranked again: from
their float64 scores, higher first, ties to the lower position, the first ``m - #above`` of them
go above the cut. The float64 work of a near row is its row-level quantities (the normaliser,
the head output) and the open candidates' scores, not the row's every score and a sort of them.
Where a kernel refines the scores of chosen candidates (``refine``,
:class:`~.selection.ErrorBound`; :data:`Refine`: contribution_layer's from the keys' logits in
float64 and the float32 head outputs, without the logits' rounding, the largest term of a
row's bound at long contexts), the open candidates are first ranked by those, in the same way,
and only the rows they leave open cost their float64 row (:func:`settled`).
The result is the float64 rule's wherever the float32 scores are within their bound, the
condition on which every row that is not near is decided in float32. Where the bound is
``rel |s~| + abs`` (every metric but value zeroing) L and U increase with s~, so X = U(lo),
Y = L(hi), and the open candidates are those between two thresholds of s~ (:func:`reach`):
two comparisons per candidate, no scan of its interval.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

Tensor = torch.Tensor
NEAR_CHUNK = 1 << 20     # near rows x candidates decided at a time (float64: 8 MiB a tensor)
# exact(b, i, h, keys) -> float64 scores of rows (b, h, i) at keys (n, K): (n, K); with h None
# every head's: (n, H, K)
Exact = Callable[[Tensor, Tensor, "Tensor | None", Tensor], Tensor]
# An Exact with ``layer_scope`` true computes every head of a query at once: its rows are asked
# for by query (:func:`~.selection.select`).
# refine(b, i, h, keys) -> (t, e), (n, K) float64 each: refined scores of rows (b, h, i) at
# keys, up to a positive factor common to the row, and their error bounds
Refine = Callable[[Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]


@dataclass(frozen=True)
class Band:
    """The open candidates of near rows: ``rows`` (r,) the near rows; for each open candidate
    ``row`` (P,) its row's place in ``rows`` and ``col`` (P,) its column, in row-major order;
    ``need`` (r,) how many of each row's open candidates rank above the cut."""

    rows: Tensor
    row: Tensor
    col: Tensor
    need: Tensor


def take(rows: Tensor, keys: Tensor) -> Tensor:
    """``rows`` (n, Tk) or (n, H, Tk) at ``keys`` (n, K): (n, K) or (n, H, K)."""
    if rows.dim() == 2:
        return rows.gather(-1, keys)
    return rows.gather(-1, keys[:, None, :].expand(-1, rows.shape[1], -1))


def error_size(s: Tensor, relative: Tensor | None, absolute: Tensor | None,
               root: Tensor | None) -> Tensor:
    """e = rel |s| + abs + root sqrt|s| (s (r, N), the bounds (r,) or None)."""
    a = s.abs()
    e = torch.zeros_like(s) if relative is None else a * relative.to(s)[:, None]
    if absolute is not None:
        e = e + absolute.to(s)[:, None]
    if root is not None:
        e = e + root.to(s)[:, None] * a.sqrt()
    return e


def open_candidates(key: Tensor, rows: Tensor, hi: Tensor, lo: Tensor, m: Tensor,
                    relative: Tensor | None, absolute: Tensor | None, root: Tensor | None,
                    step: int, width: Tensor | None = None, segments: int = 1,
                    own: tuple[Tensor, Tensor | None] | None = None) -> Band:
    """The open candidates of the near ``rows`` (see the module docstring), about ``step`` rows
    at a time, in order of width (the band keeps the rows' order: a query's rows of one head
    together, as :class:`~.layer_scores.ExactScores` computes them); key (R, N) the float32
    ranking keys (ineligible ones infinite), hi, lo, m (R,) the cut, the bounds (R,) or None,
    and width (R,) how many leading columns can hold an eligible candidate (None: N), of
    each of the row's ``segments`` (equal parts: a query's heads' rows) if more than one. The
    intervals are computed in the keys' dtype, as the near rows are found (their ends'
    rounding is far inside a bound fitted at ten times the largest error seen).

    ``own``: each segment's own relative and absolute bound (R, segments) (a query's heads'),
    of which the row's bounds are the largest: the candidates the row's bounds open are
    decided again with their own (:func:`own_bounds`), and a row left with none leaves the band.
    """
    order = None if width is None else torch.argsort(width[rows], stable=True)
    by_width = rows if order is None else rows[order]
    S = key.shape[1] // segments
    parts, need = [], []
    for start in range(0, len(rows), step):
        r = by_width[start:start + step]
        w = S if width is None else max(1, int(width[r].max()))
        s = key.view(len(key), segments, S)[r, :, :w].reshape(len(r), -1)   # (c, segments w)
        bound = [None if t is None else t[r] for t in (relative, absolute, root)]
        if root is None:                                 # the ends monotone in s~: thresholds
            t0, t1 = reach(hi[r], lo[r], *bound[:2])
            above = (s > t1[:, None]) & (s < torch.inf)
            is_open = (s >= t0[:, None]) & (s <= t1[:, None])
        else:
            above, is_open = _scanned(s, hi[r], lo[r], *bound)
        row, col = is_open.nonzero(as_tuple=True)
        above = above.sum(-1)
        if own is not None:
            kept, more = own_bounds(s, row, col, w, t0, t1, hi[r], lo[r],
                                    *(None if t is None else t[r] for t in own))
            row, col, above = row[kept], col[kept], above + more
        parts.append((row + start, col // w * S + col % w))            # the row's columns
        need.append(m[r] - above)
    if not parts:
        empty = rows.new_zeros(0)
        return Band(rows, empty, empty, empty)
    row, col, need = (torch.cat(x) for x in ([p[0] for p in parts], [p[1] for p in parts], need))
    if order is not None:                                # back to the rows' order
        row, need = order[row], need.clone().scatter_(0, order, need)
        at = torch.argsort(row * key.shape[1] + col)
        row, col = row[at], col[at]
    if own is not None:                                  # rows left with no open candidate
        kept = torch.bincount(row, minlength=len(rows)) > 0
        row, rows, need = (torch.cumsum(kept, 0) - 1)[row], rows[kept], need[kept]
    return Band(rows, row, col, need)


def own_bounds(s: Tensor, row: Tensor, col: Tensor, w: int, t0: Tensor, t1: Tensor,
               hi: Tensor, lo: Tensor, relative: Tensor, absolute: Tensor | None
               ) -> tuple[Tensor, Tensor]:
    """The open candidates (row, col) of rows s (c, segments w), found with each row's largest
    bound (thresholds t0, t1 (c,)), decided again with their segments' own bounds (c,
    segments): which stay open (P,) bool, and how many more of each row are above the cut (c,).

    X is the largest U_j of the candidates <= lo, Y the smallest L_j of those >= hi, each
    interval its segment's: of the candidates here exactly, of those below t0 (above t1) at
    most U (at least L) of t0 (t1) at the segment's bound (U, L increase with s~). Those
    bounds lie below Y's smallest value (above X's largest), which the row's bounds give at t0
    (t1), so the row is near iff the candidates here overlap, and every candidate these
    thresholds open the row's open too. The ends are computed in float64, widened by 2^-40 of
    their size (their rounding is near 2^-52); a row with a bound that is not finite keeps
    every candidate open."""
    c = len(s)
    seg, v = col // w, s[row, col].double()
    rel, err = relative.double(), 0.0 if absolute is None else absolute.double()
    bad = ~(rel + err).isfinite().all(-1)                                # (c,)
    rel_j, err_j = rel[row, seg], 0.0 if absolute is None else err[row, seg]
    up, low = v + rel_j * v.abs() + err_j, v - rel_j * v.abs() - err_j
    f0, f1 = t0.double()[:, None], t1.double()[:, None]
    below, over = v <= lo.double()[row], v >= hi.double()[row]          # of the cut's ends
    x = (f0 + rel * f0.abs() + err).amax(-1).scatter_reduce(0, row[below], up[below], "amax")
    y = (f1 - rel * f1.abs() - err).amin(-1).scatter_reduce(0, row[over], low[over], "amin")
    x, y = x[row], y[row]
    slack = 2.0 ** -40 * (v.abs() + x.abs() + y.abs())
    above = (low > x + slack) & ~bad[row]
    return ~above & ((up >= y - slack) | bad[row]), torch.bincount(row[above], minlength=c)


def reach(hi: Tensor, lo: Tensor, relative: Tensor | None, absolute: Tensor | None
          ) -> tuple[Tensor, Tensor]:
    """(t0, t1) (r,) in the scores' dtype: the candidates with t0 <= s~_j <= t1 are open, those
    above t1 above the cut, for error intervals s~ -+ (rel |s~| + abs), whose ends L and U are
    increasing in s~ (rel < 1): X = U(lo), Y = L(hi), t1 = L^-1(X), t0 = U^-1(Y), in float64
    and widened by 2^-22 of their size (four times the rounding to the scores' dtype; more
    open candidates, never fewer: each is decided in float64); a row with rel >= 1/2 has
    every finite candidate open."""
    f = hi.double()
    rel = torch.zeros_like(f) if relative is None else relative.double().expand_as(f)
    err = torch.zeros_like(f) if absolute is None else absolute.double().expand_as(f)
    x = lo.double() + rel * lo.double().abs() + err                     # U(lo)
    y = f - rel * f.abs() - err                                          # L(hi)
    t1 = torch.where(x + err >= 0, (x + err) / (1 - rel), (x + err) / (1 + rel))
    t0 = torch.where(y - err >= 0, (y - err) / (1 + rel), (y - err) / (1 - rel))
    tiny, big = torch.finfo(hi.dtype).tiny, torch.finfo(hi.dtype).max
    t1 = t1 + 2.0 ** -22 * (t1.abs() + x.abs()) + tiny
    t0 = t0 - 2.0 ** -22 * (t0.abs() + y.abs()) - tiny
    wide = ~(rel < 0.5)                                                  # NaN too
    t1 = t1.masked_fill(wide, big).clamp(-big, big)
    t0 = t0.masked_fill(wide, -big).clamp(-big, big)
    return t0.to(hi.dtype), t1.to(hi.dtype)


def _scanned(s: Tensor, hi: Tensor, lo: Tensor, relative: Tensor | None,
             absolute: Tensor | None, root: Tensor | None) -> tuple[Tensor, Tensor]:
    """Above and open (c, w) bool from each candidate's interval (a root term: s~ + root
    sqrt|s~| is not increasing near 0, so X and Y are found by a scan of the row)."""
    real = s.isfinite()
    e = error_size(s, relative, absolute, root)
    low, high = s - e, s + e
    x = high.masked_fill(~(real & (s <= lo[:, None])), -torch.inf).amax(-1)
    y = low.masked_fill(~(real & (s >= hi[:, None])), torch.inf).amin(-1)
    above = real & (low > x[:, None])
    return above, real & ~above & (high >= y[:, None])


def padded(band: Band, at: Tensor) -> tuple[Tensor, Tensor]:
    """Near rows ``at`` (c,) (places in ``band.rows``): their open columns (c, K) in column
    order, padded with each row's first (column 0 for a row with none), and which entries are
    real (c, K)."""
    start = torch.searchsorted(band.row, at)
    count = torch.searchsorted(band.row, at, right=True) - start
    K = max(1, int(count.max())) if len(at) else 1
    real = torch.arange(K, device=at.device) < count[:, None]
    last = max(len(band.col) - 1, 0)
    cols = band.col[(start[:, None] + torch.arange(K, device=at.device)).clamp_(max=last)] \
        if len(band.col) else torch.zeros(len(at), K, dtype=torch.long, device=at.device)
    first = torch.where(count > 0, cols[:, 0], 0)
    return torch.where(real, cols, first[:, None]), real


def above_cut(scores: Tensor, real: Tensor, need: Tensor) -> Tensor:
    """(c, K) bool: the ``need`` real entries of each row ranked first by ``scores`` (c, K),
    higher first, ties to the lower column (the entries lie in column order)."""
    key = scores.masked_fill(~real, -torch.inf)
    order = torch.sort(key, dim=-1, descending=True, stable=True).indices
    rank = torch.empty_like(order).scatter_(
        -1, order, torch.arange(key.shape[-1], device=key.device).expand_as(order))
    return (rank < need[:, None]) & real


def settled(refined: Tensor, error: Tensor, real: Tensor, need: Tensor) -> tuple[Tensor, Tensor]:
    """The rows whose ``need`` highest refined scores (c, K) are certain: (c,) bool, and those
    entries (c, K) bool (:func:`above_cut`). Certain when the lowest end t - e of the entries
    above the cut lies above the highest end t + e of the rest, ``error`` (c, K) the bound e;
    a row with a score or bound that is not finite is not."""
    top = above_cut(refined, real, need)
    low = (refined - error).masked_fill(~top, torch.inf).amin(-1)
    high = (refined + error).masked_fill(~real | top, -torch.inf).amax(-1)
    finite = torch.where(real, refined.isfinite() & error.isfinite(), True).all(-1)
    return finite & (low > high), top


def exact_keys(exact: Exact, idx: Tensor, cols: Tensor, e: Tensor, rank: str,
                granularity: str) -> Tensor:
    """Exact keys (n, K) of the near rows ``idx`` (row indices) at candidates ``cols`` (n, K)."""
    B, H, T, Tk = e.shape
    if granularity == "head":
        b, h, i = idx // (H * T), idx // T % H, idx % T
        s = exact(b, i, h, cols)                                        # (n, K)
        return s.abs() if rank == "magnitude" else s
    b, i = idx // T, idx % T
    if granularity == "query":            # candidate h * Tk + j: only the heads of open ones
        n, K = cols.shape
        pair, key = torch.arange(n, device=cols.device)[:, None] * H + cols // Tk, cols % Tk
        pairs, which = torch.unique(pair, return_inverse=True)          # (U,), (n, K)
        r, h = pairs // H, pairs % H       # asked head by head: many queries per float64 block
        order = torch.argsort((b[r] * H + h) * T + i[r], stable=True)
        got = exact(b[r[order]], i[r[order]], h[order], key[r[order]])     # (U, K) in order
        s = torch.empty_like(got).index_copy_(0, order, got)
        s = s[which, torch.arange(K, device=cols.device)]
        return s.abs() if rank == "magnitude" else s
    s = exact(b, i, None, cols)                                         # (n, H, K)
    s = s.masked_fill(~take(e[b, :, i], cols), 0.0).sum(1)
    return s.abs() if rank == "magnitude" else s


def decision_step(band: Band, N: int, heads: int) -> int:
    """Near rows decided at a time, at least one: NEAR_CHUNK entries of a head's row of keys
    (N / heads; ``heads``: H at query granularity, else 1), or of their open candidates'
    float64 scores, one row per head a candidate may be of, if wider. At query granularity a
    row is H heads' rows of keys, but its float64 work is only that of its open candidates'
    heads (the kernels chunk it): steps of NEAR_CHUNK / N rows would leave a few queries per
    (head, query) block of the float64 products."""
    widest = int(torch.bincount(band.row).max()) if len(band.row) else 1
    return max(1, NEAR_CHUNK // max(N // heads, widest * heads))


def decide(chosen: Tensor, band: Band, exact: Exact, e: Tensor, rank: str, granularity: str,
            mode: str, keep: bool, step: int, refine: Refine | None = None) -> None:
    """Write the near rows' open candidates into ``chosen`` (R, N), decided from their exact
    scores (this module), ``step`` rows at a time (by query where ``exact`` computes every
    head of a query at once: its ``layer_scope``); first, with ``refine`` (head granularity),
    from their refined scores where those settle the row."""
    comp, (B, H, T, Tk) = mode == "comprehensiveness", e.shape
    order = torch.arange(len(band.rows), device=band.rows.device)
    if granularity == "head" and getattr(exact, "layer_scope", False):
        order = torch.argsort(band.rows // (H * T) * T + band.rows % T, stable=True)  # b T + i
    for lo in range(0, len(band.rows), step):
        at = order[lo:lo + step]
        cols, real = padded(band, at)
        if not real.any():
            continue
        if granularity == "query":                 # ties go to the lower key, then head
            cols, real = key_major(cols, real, Tk, H)
        idx, need = band.rows[at], band.need[at]
        top = torch.zeros_like(real)
        ask = torch.ones(len(idx), dtype=torch.bool, device=idx.device)
        if refine is not None:
            t, bound = refine(idx // (H * T), idx % T, idx // T % H, cols)
            done, above = settled(t.abs() if rank == "magnitude" else t, bound, real, need)
            top[done], ask = above[done], ~done
        if ask.any():
            top[ask] = above_cut(exact_keys(exact, idx[ask], cols[ask], e, rank, granularity),
                                 real[ask], need[ask])
        removed = top if comp else ~top
        value = removed.logical_not().to(chosen.dtype) if keep else removed
        chosen[idx[:, None].expand_as(cols)[real], cols[real]] = value[real]


def key_major(cols: Tensor, real: Tensor, Tk: int, H: int) -> tuple[Tensor, Tensor]:
    """A query row's open candidates (c, K), columns h * Tk + j, in the rule's order: by key
    j, then head h (the padding last)."""
    order = torch.where(real, cols % Tk * H + cols // Tk, H * Tk).argsort(dim=-1, stable=True)
    return cols.gather(-1, order), real.gather(-1, order)
