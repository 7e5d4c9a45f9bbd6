"""Which keys a removal takes: the n_remove top- or bottom-ranked candidates of each ranking row.

The rule. A *ranking row* is one (head, query) at ``head`` granularity, and one query at
``query`` (its (key, head) pairs, key-major) and ``token`` granularity (keys scored by the
head-summed score, removed from every head). Its eligible candidates are ranked by score,
higher first, ties to the lower position (key, then head); ``n_remove = floor(p * n + 0.5)``
of the n eligible; comprehensiveness removes the first n_remove, sufficiency the last n_remove.
:func:`stable_select` is that rule written as a stable sort: the reference, and what the code
did for every row before the fast path.

The fast path, :func:`threshold_select`, sorts score values only (numpy's SIMD sort on the
CPU; no indices, no stability) to read each row's boundary: ``hi``, the m-th highest score,
and ``lo``, the (m+1)-th, m being the number of candidates ranked above the cut (n_remove for
comprehensiveness, n - n_remove for sufficiency). Every candidate >= hi is above the cut:
exactly the rule whenever hi > lo. A row is *near* when hi == lo (a tie at the cut) or when
the scores' rounding error, bounded by an :class:`ErrorBound`, could put a candidate on the
other side of the cut; near rows alone are decided again by :func:`stable_select` on exact
(float64) scores of those rows, which the caller supplies (``exact``). Given exact scores for
near rows, the result is the rule applied to exact scores, whenever the bound holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

Tensor = torch.Tensor
# exact(b, i, h) -> float64 scores of the rows (b, h, i): (n, Tk); with h None every head: (n, H, Tk)
Exact = Callable[[Tensor, Tensor, "Tensor | None"], Tensor]


@dataclass(frozen=True)
class ErrorBound:
    """A bound on |score - exact score|, for every candidate of a (head, query) row.

    ``relative`` (B, H, T): at most ``relative * |score|``; or ``absolute`` (B, H, T, Tk): at
    most that, candidate by candidate. Neither: the scores are exact.
    """

    relative: Tensor | None = None
    absolute: Tensor | None = None


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


def sorted_values(key: Tensor) -> Tensor:
    """Each row's values in ascending order (numpy's vectorised sort on the CPU)."""
    if key.device.type == "cpu" and key.dtype in (torch.float32, torch.float64):
        return torch.from_numpy(np.sort(key.numpy(), axis=-1))
    return torch.sort(key, dim=-1).values


def threshold_select(key: Tensor, eligible: Tensor, k: Tensor, mode: str,
                     relative: Tensor | None = None, absolute: Tensor | None = None
                     ) -> tuple[Tensor, Tensor]:
    """Chosen candidates (R, n) bool and near rows (R,) bool, from one sort of the values.

    Parameters
    ----------
    key : (R, n) scores with ineligible candidates at -inf (eligible ones finite);
    k : (R,) how many to remove; relative (R,) or absolute (R, n): see :class:`ErrorBound`.
    """
    N = key.shape[-1]
    n = eligible.sum(-1)
    m = k if mode == "comprehensiveness" else n - k                   # candidates above the cut
    sv = sorted_values(key)
    hi = sv.gather(-1, (N - m).clamp(max=N - 1)[:, None])[:, 0]
    hi = hi.masked_fill(m == 0, float("inf"))
    lo = sv.gather(-1, (N - m - 1).clamp(min=0)[:, None])[:, 0]
    above = key >= hi[:, None]
    chosen = above if mode == "comprehensiveness" else eligible & ~above
    cut = (m > 0) & (m < n)
    if absolute is None:
        rel = 0.0 if relative is None else relative
        near = cut & (hi - lo <= rel * (hi.abs() + lo.abs()))
    else:
        theta = (hi + lo) / 2                # every candidate off by more than its bound: safe
        close = (key - theta.masked_fill(~cut, 0.0)[:, None]).abs_() <= absolute
        near = cut & (close & eligible).any(-1)
    return chosen, near


# ------------------------------------------------------------------------------------ granularity
def _flat(x: Tensor) -> Tensor:
    """(B, H, T, Tk) -> (B, T, Tk*H), key-major (the query granularity's candidate order)."""
    B, H, T, Tk = x.shape
    return x.permute(0, 2, 3, 1).reshape(B, T, Tk * H)


def _rows(score: Tensor, e: Tensor, rank: str, granularity: str, error: ErrorBound | None):
    """Keys (R, n), eligibility and the error bound, per ranking row of a granularity."""
    s = score.abs() if rank == "magnitude" and granularity != "token" else score
    rel = None if error is None else error.relative
    err = None if error is None else error.absolute
    if granularity == "head":
        return s, e, rel, err
    if granularity == "query":
        return (_flat(s), _flat(e), None if rel is None else rel.amax(1),
                None if err is None else _flat(err))
    if granularity == "token":
        s = score.masked_fill(~e, 0.0).sum(1)                          # (B, T, Tk)
        s = s.abs() if rank == "magnitude" else s
        return (s, e.any(1), None if rel is None else rel.amax(1),
                None if err is None else err.masked_fill(~e, 0.0).sum(1))
    raise ValueError(f"unknown granularity '{granularity}'; use head, query or token")


def _exact_rows(exact: Exact, idx: Tensor, e: Tensor, rank: str, granularity: str):
    """Exact keys (n, Tk or Tk*H) and eligibility of the near rows ``idx`` (row indices)."""
    B, H, T, Tk = e.shape
    if granularity == "head":
        b, h, i = idx // (H * T), idx // T % H, idx % T
        s = exact(b, i, h)                                              # (n, Tk)
        return (s.abs() if rank == "magnitude" else s), e[b, h, i]
    b, i = idx // T, idx % T
    s, eb = exact(b, i, None), e[b, :, i]                               # (n, H, Tk)
    if granularity == "query":
        flat = lambda x: x.transpose(1, 2).reshape(len(idx), Tk * H)    # noqa: E731
        s = flat(s)
        return (s.abs() if rank == "magnitude" else s), flat(eb)
    s = s.masked_fill(~eb, 0.0).sum(1)
    return (s.abs() if rank == "magnitude" else s), eb.any(1)


def select(score: Tensor, eligible: Tensor, fraction: float, mode: str, rank: str = "signed",
           granularity: str = "head", error: ErrorBound | None = None,
           exact: Exact | None = None) -> Tensor:
    """Which (head, query, key) terms to remove: (B, H, T, Tk) bool.

    Parameters
    ----------
    score : (B, H, T, Tk) metric scores; eligible : (B, 1 or H, T, Tk) bool.
    error : the scores' rounding error (None: exact); exact : exact scores of near rows
        (None: ``score`` itself, so only ties at the cut are near).
    """
    B, H, T, Tk = score.shape
    e = eligible.expand(B, H, T, Tk)
    s, es, rel, err = _rows(score, e, rank, granularity, error)
    n = s.shape[-1]
    key = s.masked_fill(~es, float("-inf")).reshape(-1, n)
    es = es.reshape(-1, n)
    k = n_remove(es.sum(-1), fraction)
    chosen, near = threshold_select(key, es, k, mode,
                                    None if rel is None else rel.reshape(-1),
                                    None if err is None else err.reshape(-1, n))
    idx = near.nonzero()[:, 0]
    if len(idx):
        if exact is None:
            exact = _given(score)
        s64, e64 = _exact_rows(exact, idx, e, rank, granularity)
        chosen[idx] = stable_select(s64, e64, k[idx], mode)
    if granularity == "head":
        return chosen.view(B, H, T, Tk)
    if granularity == "query":
        return chosen.view(B, T, Tk, H).permute(0, 3, 1, 2)
    return chosen.view(B, 1, T, Tk) & e


def _given(score: Tensor) -> Exact:
    """``exact`` for scores taken as exact: the rows of ``score`` itself."""
    def rows(b: Tensor, i: Tensor, h: Tensor | None) -> Tensor:
        return score[b, :, i] if h is None else score[b, h, i]
    return rows
