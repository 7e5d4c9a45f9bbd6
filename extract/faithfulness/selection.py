"""Which keys a removal takes: the n_remove top- or bottom-ranked candidates of each ranking row.

The rule. A *ranking row* is one (head, query) at ``head`` granularity, and one query at
``query`` (its (key, head) pairs, laid out head by head: H segments of Tk columns) and
``token`` granularity (keys scored by the head-summed score, removed from every head). Its
eligible candidates are ranked by score, higher first, ties to the lower position (key, then
head); ``n_remove = floor(p * n + 0.5)`` of the n eligible; comprehensiveness removes the
first n_remove, sufficiency the last n_remove.
:func:`stable_select` is that rule written as a stable sort: the reference, and what decides
the near rows below.

The fast path, :func:`threshold_select`, sorts score values only (numpy's SIMD sort on the
CPU; no indices, no stability) to read each row's boundary: ``hi``, the m-th highest score,
and ``lo``, the (m+1)-th, m being the number of candidates ranked above the cut (n_remove for
comprehensiveness, n - n_remove for sufficiency). The candidates >= hi are the m above the
cut: exactly the rule whenever hi > lo. A row is *near* when hi - lo <= rel (|hi| + |lo|), rel
the scores' relative rounding error (:class:`ErrorBound`; 0 for exact scores, so that a tie at
the cut is near): then a rounding error of that size could swap the two keys at the cut. In a
near row only the candidates whose own error intervals reach the cut's are decided again, from
their exact (float64) scores, which the caller supplies (``exact``, at chosen candidates:
:mod:`.near`); the same cut :func:`stable_select` gives on the row's exact scores.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from attngeom.common.errors import Refusal

from ..measurement.geometry import fill_disallowed_
from .masks import Candidates
from .near import NEAR_CHUNK, Exact, Refine, decide, decision_step, open_candidates, take
from .sorting import rank_values_

Tensor = torch.Tensor


@dataclass(frozen=True)
class ErrorBound:
    """|score - exact score| <= relative |score| + root sqrt(|score|) + absolute per (head,
    query): ``relative`` (B, H, T), ``absolute`` and ``root`` (B, H, T) or None (0); H is 1 for
    scores of keys with the heads combined (a metric of scope ``token``). ``root`` bounds a
    score computed as a squared distance of rounded vectors (value zeroing's). ``within``
    (B, H, T) or None: |score - c exact score| <= within |score| for a c > 0 common to the
    (head, query) row (the softmax normaliser's rounding), which cannot reorder the row: the
    bound for comparisons within one head's row (head granularity), where it is the smaller.
    ``magnitude`` (B, H, T) or None: ``relative`` when ranking by |score|, whose cut in
    sufficiency lies among scores near 0 (a signed metric's error there follows the key's
    size, not |score|: the case a relative bound covers least). ``refine`` or None: the
    kernel's refined scores of chosen candidates with their bounds (:data:`.near.Refine`), by
    which a head's near row is decided before its float64 scores are asked for."""

    relative: Tensor
    absolute: Tensor | None = None
    root: Tensor | None = None
    within: Tensor | None = None
    magnitude: Tensor | None = None
    refine: Refine | None = None


class Workspace:
    """Scratch tensors reused from layer to layer, one per name.

    A (B, H, T, Tk) float32 tensor is 75 MB at B = 8, T = 512: allocating it costs about as
    much as several passes over it (fresh pages), so the removal path allocates none per layer.
    The removal pass empties it after its last attention layer (:meth:`Intervener.attend`), so
    that it is not held while the model makes its logits (805 MB at T = 4,096 on SmolLM2-135M).
    """

    def __init__(self) -> None:
        self.storage: dict[str, Tensor] = {}

    def get(self, name: str, shape, dtype, device) -> Tensor:
        numel = int(np.prod(shape))
        flat = self.storage.get(name)
        if flat is None or flat.dtype != dtype or flat.device != torch.device(device) \
                or flat.numel() < numel:
            flat = torch.empty(numel, dtype=dtype, device=device)
            self.storage[name] = flat
        return flat[:numel].view(shape)

    def clear(self) -> None:
        """Free every scratch tensor (they are made again on the next :meth:`get`)."""
        self.storage.clear()


def n_remove(n_eligible: Tensor, fraction: float) -> Tensor:
    """floor(p * n + 0.5) in float64, as an integer tensor of the shape of ``n_eligible``."""
    return torch.floor(n_eligible.double() * fraction + 0.5).long()


# ------------------------------------------------------------------------------------ rows
def stable_select(key: Tensor, eligible: Tensor, k: Tensor, mode: str) -> Tensor:
    """The rule by a stable sort of each row (R, n): top (comprehensiveness) or bottom k."""
    n = eligible.sum(-1)
    key = key.masked_fill(~eligible, float("-inf"))                    # ineligible rank last
    order = torch.sort(key, dim=-1, descending=True, stable=True).indices   # ties: lower first
    r = torch.arange(key.shape[-1], device=key.device)
    if mode == "comprehensiveness":
        chosen = r < k[..., None]
    else:
        chosen = (r >= (n - k)[..., None]) & (r < n[..., None])
    return torch.zeros_like(eligible).scatter(-1, order, chosen)


def width_groups(width: Tensor, N: int) -> list[tuple[Tensor, int]]:
    """Rows grouped by how many leading columns can hold an eligible candidate: (rows, w) with
    ``width[rows] <= w``, w a multiple of about N / 8 (rows of width 0 are left out).

    Under a causal mask row i of a head has i + 1 keys: sorting each group's first w columns
    sorts about half the values (0.56 of them) a sort of every row would.
    """
    step = max(16, -(-N // 128) * 16)                     # ~N / 8, a multiple of 16
    edge = (width + step - 1) // step                    # (R,) 0 where nothing is eligible
    return [((edge == e).nonzero()[:, 0], min(e * step, N))
            for e in edge.unique().tolist() if e > 0]


def _window(key: Tensor, rows: Tensor, start: Tensor | None, w: int, out: Tensor) -> None:
    """out (r, segments, w) = key (R, segments, S) at ``rows``, columns ``start`` (r,) to
    start + w of each segment (None or all 0: the leading w)."""
    if start is None or not bool(start.any()):
        torch.index_select(key[..., :w], 0, rows, out=out)
        return
    heads = torch.arange(key.shape[1], device=key.device)
    out.copy_(key.unfold(2, w, 1)[rows[:, None], heads, start[:, None]])


@dataclass(frozen=True)
class Cut:
    """Each ranking row's cut (R,): ``hi`` the m-th highest score (+inf where m = 0, and -inf
    at sufficiency where m = n), ``lo`` the (m+1)-th, ``m`` how many candidates are above the
    cut, ``near`` whether their error intervals overlap (:func:`find_cut`)."""

    hi: Tensor
    lo: Tensor
    m: Tensor
    near: Tensor


def find_cut(key: Tensor, n: Tensor, k: Tensor, mode: str, relative: Tensor | None = None,
             work: Workspace | None = None, width: Tensor | None = None,
             absolute: Tensor | None = None, root: Tensor | None = None,
             segments: int = 1, first: Tensor | None = None) -> Cut:
    """Each row's :class:`Cut`, from the values at two ranks of each row's columns ``first``
    to ``width`` (R,) (of each segment; None: 0 and N / segments; parameters: see
    :func:`threshold_select`)."""
    R, N = key.shape
    S = N // segments
    comp = mode == "comprehensiveness"
    m = k if comp else n - k                                           # candidates above the cut
    hi, lo = key.new_zeros(R), key.new_zeros(R)
    span = width if first is None or width is None else width - first
    groups = [(None, S)] if width is None else width_groups(span, S)
    for rows, w in groups:
        shape = (R if rows is None else len(rows), w * segments)
        part = key.new_empty(shape) if work is None else work.get("sorted", shape, key.dtype,
                                                                  key.device)
        if rows is None:
            part.copy_(key)
        else:                                        # each segment's w columns from its first
            start = None if first is None else first[rows].clamp(max=S - w)
            _window(key.view(R, segments, S), rows, start, w, part.view(len(rows), segments, w))
        rows = slice(None) if rows is None else rows
        w = w * segments
        top = w if comp else n[rows]                 # sorted index just past the highest eligible
        at = top - m[rows]
        lo[rows], hi[rows] = rank_values_(part, (at - 1).clamp(0, w - 1), at.clamp(0, w - 1))
    cut = (m > 0) & (m < n)
    rel = 0.0 if relative is None else relative
    gap = rel * (hi.abs() + lo.abs()) + (0.0 if absolute is None else 2 * absolute)
    if root is not None:
        gap = gap + root * (hi.abs().sqrt() + lo.abs().sqrt())
    near = cut & (hi - lo <= gap)
    hi = hi.masked_fill(m == 0, float("inf"))
    if not comp:                                     # below the cut: < hi; +inf never is
        hi = hi.masked_fill(m == n, float("-inf"))
    return Cut(hi, lo, m, near)


def apply_cut(key: Tensor, cut: Cut, mode: str, keep: bool = False,
              work: Workspace | None = None, overwrite: bool = False) -> Tensor:
    """Chosen candidates (R, N) bool, or the kept factor with ``keep`` (see
    :func:`threshold_select`): those >= hi (comprehensiveness), < hi (sufficiency)."""
    chosen_above = (mode == "comprehensiveness") != keep     # chosen (or kept): those >= hi
    if keep and overwrite:
        out = key
    else:
        out = None if work is None else work.get("kept" if keep else "chosen", key.shape,
                                                 key.dtype if keep else torch.bool, key.device)
    return (torch.ge if chosen_above else torch.lt)(key, cut.hi[:, None], out=out)


def threshold_select(key: Tensor, n: Tensor, k: Tensor, mode: str,
                     relative: Tensor | None = None, work: Workspace | None = None,
                     keep: bool = False, width: Tensor | None = None,
                     overwrite: bool = False, absolute: Tensor | None = None,
                     root: Tensor | None = None, segments: int = 1) -> tuple[Tensor, Tensor]:
    """Chosen candidates (R, N) bool and near rows (R,) bool, from one sort of the values.

    Parameters
    ----------
    key : (R, N) scores, ineligible candidates at -inf for comprehensiveness and at +inf for
        sufficiency (eligible ones finite); n : (R,) eligible count; k : (R,) how many to
        remove; relative, absolute, root : (R,) the scores' rounding error relative to |score|,
        absolute, and in units of sqrt(|score|) (:class:`ErrorBound`; None: 0; all None: exact);
    keep : give the complement instead, in key's dtype (1 kept, 0 chosen): the factor that
        removes the chosen terms from alpha (a float comparison and product take about half
        the time of a bool one each);
    width : (R,) int, every eligible candidate of a row lies in its first ``width`` columns
        (None: N), of each of its ``segments`` (equal parts of the row) if more than one;
        only those are sorted (see :func:`width_groups`);
    overwrite : with ``keep``, the factor is written over ``key`` (no (R, N) buffer more: the
        removal pass's peak memory at long contexts).
    """
    cut = find_cut(key, n, k, mode, relative, work, width, absolute, root, segments)
    return apply_cut(key, cut, mode, keep, work, overwrite), cut.near


# ------------------------------------------------------------------------------------ granularity
def _keys(score: Tensor, c: Candidates, rank: str, granularity: str, fill: float,
          work: Workspace | None, inplace: bool) -> tuple[Tensor, Tensor]:
    """Ranking keys (..., n) with ineligible candidates at ``fill``, and eligible counts."""
    B, H, T, Tk = score.shape
    eligible, count = c.mask, c.count                                  # count: (B, 1|H, T)
    if granularity == "head":
        key = score if inplace else (score.clone() if work is None else
                                     work.get("key", score.shape, score.dtype,
                                              score.device).copy_(score))
        if rank == "magnitude":
            key.abs_()
        return key.add_(c.fill(fill, key.dtype)), count.expand(B, H, T)
    if granularity == "query":            # a query's heads' rows side by side: runs of Tk
        shape = (B, T, H, Tk)
        key = torch.empty(shape, dtype=score.dtype, device=score.device) if work is None \
            else work.get("key", shape, score.dtype, score.device)
        by_query = score.transpose(1, 2)
        bias = c.fill(fill, score.dtype).transpose(1, 2)
        if rank == "magnitude":
            torch.abs(by_query, out=key).add_(bias)
        else:
            torch.add(by_query, bias, out=key)
        return key.view(B, T, H * Tk), count.sum(1) if count.shape[1] > 1 else count[:, 0] * H
    if granularity == "token" and H == 1:                              # heads combined already
        e = eligible.any(1)
        key = torch.mul(score[:, 0], e)                                # (B, T, Tk)
        key = key.abs_() if rank == "magnitude" else key
        return fill_disallowed_(key, e, fill), torch.count_nonzero(e, -1)
    if granularity == "token":           # a mask shared by the heads: no (B, H, T, Tk) product
        key = score.sum(1) if eligible.shape[1] == 1 else torch.mul(score, eligible).sum(1)
        key = key.abs_() if rank == "magnitude" else key
        e = eligible.any(1)
        return fill_disallowed_(key, e, fill), torch.count_nonzero(e, -1)
    raise Refusal(f"unknown granularity '{granularity}'; use head, query or token")


def _widths(c: Candidates, granularity: str, H: int) -> tuple[Tensor, Tensor]:
    """(rows,) how many leading candidates of each ranking row (of each head's segment of a
    query's row at query granularity) can be eligible, and (rows,) the first that can."""
    shared = granularity == "head" or c.mask.shape[1] == 1             # c's own (made once)
    c = c if shared else Candidates(c.mask.any(1, keepdim=True))
    B, _, T = c.last.shape                                             # 0: none eligible
    if granularity == "head":
        return c.last.expand(B, H, T).reshape(-1), c.first.expand(B, H, T).reshape(-1)
    return c.last.reshape(-1), c.first.reshape(-1)


def select(score: Tensor, eligible: Tensor | Candidates, fraction: float, mode: str,
           rank: str = "signed",
           granularity: str = "head", error: ErrorBound | None = None,
           exact: Exact | None = None, work: Workspace | None = None,
           inplace: bool = False, keep: bool = False) -> Tensor:
    """Which (head, query, key) terms to remove: (B, H, T, Tk) bool.

    Parameters
    ----------
    score : (B, H, T, Tk) metric scores; eligible : (B, 1 or H, T, Tk) bool, or as
        :class:`~.masks.Candidates` (what is read of it kept from layer to layer).
    error : the scores' rounding error (None: exact); exact : exact scores of near rows at
        their open candidates (:data:`.near.Exact`; None: ``score`` itself, so only ties at
        the cut are near).
    work : scratch tensors (the result may live in it: use it before the next call);
    inplace : ``score`` may be overwritten (only with ``exact`` given);
    keep : give the factor that removes the chosen terms from alpha instead, in score's
        dtype: 0 where removed, 1 elsewhere; (B, 1, T, Tk) at token granularity (a removed
        key is dropped from every head; where it is not eligible its alpha is 0).
    """
    B, H, T, Tk = score.shape
    c = eligible if isinstance(eligible, Candidates) else Candidates(eligible)
    if H == 1 and c.mask.shape[1] > 1:                 # scores of keys, the heads combined
        c = Candidates(c.mask.any(1, keepdim=True))
    eligible = c.mask
    if exact is None:
        exact, inplace = _given(score), False
    fill = float("-inf") if mode == "comprehensiveness" else float("inf")
    key, n = _keys(score, c, rank, granularity, fill, work, inplace)
    N = key.shape[-1]
    rel = None if error is None else error.relative
    if rank == "magnitude" and error is not None and error.magnitude is not None:
        rel = error.magnitude
    if granularity == "head" and error is not None and error.within is not None:
        rel = torch.minimum(error.within, rel)             # a row is one head's
    absolute = None if error is None else _floored(error.absolute, error.relative, score.dtype)
    root = None if error is None else error.root
    own = None                          # at query granularity: each head's bound (B T, H)
    if rel is not None and granularity == "query" and root is None:
        own = tuple(None if t is None else t.expand(B, H, T).transpose(1, 2).reshape(-1, H)
                    for t in (rel, absolute))
    if rel is not None and granularity != "head":
        rel = rel.amax(1)                                  # rows mix heads: the largest bound
        absolute = None if absolute is None else absolute.amax(1)
        root = None if root is None else root.amax(1)
    flat, k = key.reshape(-1, N), n_remove(n, fraction).reshape(-1)
    bound = [None if t is None else t.reshape(-1) for t in (rel, absolute, root)]
    (width, first), segments = _widths(c, granularity, H), H if granularity == "query" else 1
    cut = find_cut(flat, n.reshape(-1), k, mode, bound[0], work, width, bound[1], bound[2],
                   segments, first)
    step = max(1, NEAR_CHUNK // N)        # the near rows' copies bounded, not (n, N)
    band = open_candidates(flat, cut.near.nonzero()[:, 0], cut.hi, cut.lo, cut.m, *bound,
                           step, width, segments, own)   # before the factor is written over
    chosen = apply_cut(flat, cut, mode, keep, work, overwrite=True)
    refine = None if error is None or granularity != "head" else error.refine
    decide(chosen, band, exact, eligible.expand(B, H, T, Tk), rank, granularity, mode, keep,
            decision_step(band, N, N // Tk), refine)
    if granularity == "head":
        return chosen.view(B, H, T, Tk)
    if granularity == "query":
        return chosen.view(B, T, H, Tk).transpose(1, 2)
    if keep:
        return chosen.view(B, 1, T, Tk)
    return chosen.view(B, 1, T, Tk) & eligible.expand(B, H, T, Tk)


def _floored(absolute: Tensor | None, relative: Tensor, dtype: torch.dtype) -> Tensor:
    """The absolute bound, at least the dtype's smallest normal number: a score below it is
    subnormal (an attention weight that underflowed, times a few factors), its error a few
    steps of 2^-149 in float32 whatever its size, which no bound relative to |score| covers."""
    tiny = torch.finfo(dtype).tiny
    if absolute is None:
        return torch.full_like(relative, tiny)
    return absolute.clamp_min(tiny)


def _given(score: Tensor) -> Exact:
    """``exact`` for scores taken as exact: the rows of ``score`` itself."""
    def rows(b: Tensor, i: Tensor, h: Tensor | None, keys: Tensor) -> Tensor:
        return take(score[b, :, i] if h is None else score[b, h, i], keys)
    return rows
