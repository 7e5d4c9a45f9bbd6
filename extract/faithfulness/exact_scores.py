"""The float64 definition of the head-local and layer-scope metrics: their ``exact`` kernels.

:class:`Rows64` is what a ``head``-scope kernel reads (alpha and values of some rows, and what
several metrics share, made on demand); ``exact_contribution_layer`` is the ``layer``-scope
kernel. Each is registered by name in :mod:`.kernels`; :mod:`.layer_scores` evaluates them for a
whole layer (``metric_scores``) or for the rows the float32 scores leave open
(``ExactScores``). Every contraction is row by row (:func:`~.base.rowmm`).
"""

from __future__ import annotations

from functools import cached_property
from typing import Callable

import torch

from ..measurement.geometry import vecdot
from .base import exact_z, finite, rowmm, rowmm_within, widths

Tensor = torch.Tensor


class Rows64:
    """Float64 inputs of a head-scope metric at some rows, and what metrics share (on demand).

    alpha (P, M, Tk) clean attention of M queries of P (sequence, head) pairs (or (B, H, T, Tk)
    for a whole layer); v (P, Tk, dh) the pairs' values, vt their transpose (contiguous), or
    v a function returning both (vt None), called when a metric first reads them;
    gram (P, dh, dh) G_h of each pair's head (or broadcastable); value_norm: a function of
    these rows returning ||v~_j^h|| (P, Tk) (given the rows, it need not hold them: a closure
    over them would make a reference cycle, which keeps a layer's float64 rows and inputs
    until Python's cycle collector runs); z: the head outputs before W_O when the caller has them;
    where: (b, h, i) the sequence, head and query of each row, broadcastable to alpha's
    leading shape, and context the layer's :class:`~.context.LayerContext` (a metric that
    ``needs`` ``position``: random). keys (P, M, K): the keys whose scores are asked for (the
    open candidates of near rows, :mod:`.near`), or None (every key); a built-in kernel
    computes the row-level quantities in full and its per-key terms at :meth:`at` only (the
    same bits as the full row's there), a plugin's is given None and its rows are gathered.
    index (P,) or None: v and vt hold blocks (G, Tk, dh), (G, dh, Tk) of which pair p reads
    the index[p]-th (the built-in kernels multiply them in place, :meth:`blocks`; :attr:`v`
    gathers them). asked (P, M) bool or None (every row): the rows wanted, the others a
    batch's padding, whose products are not computed (:attr:`width` 0).
    """

    def __init__(self, alpha: Tensor, v: Tensor | Callable[[], tuple[Tensor, Tensor]],
                 vt: Tensor | None, gram: Tensor,
                 value_norm: Callable[["Rows64"], Tensor], z: Tensor | None = None,
                 where: tuple[Tensor, Tensor, Tensor] | None = None, context=None,
                 keys: Tensor | None = None, index: Tensor | None = None,
                 asked: Tensor | None = None):
        self.alpha, self.gram, self.index, self.asked = alpha, gram, index, asked
        self._values = (v, vt) if vt is not None else v
        self._value_norm, self._z, self._output = value_norm, z, None
        self.context, self.keys = context, keys
        self.where = None if where is None else tuple(
            torch.broadcast_to(t, alpha.shape[:-1]) for t in where)

    @property
    def v(self) -> Tensor:
        """The pairs' values (P, Tk, dh)."""
        v = self._fetched()[0]
        return v if self.index is None else v[self.index]

    @property
    def vt(self) -> Tensor:
        """Their transpose (P, dh, Tk), contiguous."""
        vt = self._fetched()[1]
        return vt if self.index is None else vt[self.index]

    def blocks(self) -> tuple[Tensor, Tensor, Tensor | None]:
        """v, vt and index as held (:func:`~.base.rowmm_within`'s operands)."""
        return *self._fetched(), self.index

    def _fetched(self) -> tuple[Tensor, Tensor]:
        if callable(self._values):
            self._values = self._values()
        return self._values

    def at(self, t: Tensor) -> Tensor:
        """t (..., Tk), broadcastable to alpha, at the asked keys: (P, M, K) (t itself when
        every key is asked)."""
        if self.keys is None:
            return t
        return t.expand(*self.alpha.shape[:-1], t.shape[-1]).gather(-1, self.keys)

    def value_norm(self) -> Tensor:
        """||v~_j^h|| (P, Tk)."""
        return self._value_norm(self)

    @cached_property
    def width(self) -> Tensor:
        """(P, M) how many leading keys each row's products run over (:func:`~.base.widths`;
        0 in the rows not asked for)."""
        width = widths(self.alpha)
        return width if self.asked is None else width.mul_(self.asked)

    def output(self) -> tuple[Tensor, Tensor]:
        """z_i G_h (P, M, dh) and ||o_i^h|| (P, M)."""
        if self._output is None:
            v, _, index = self.blocks()
            z = exact_z(self.alpha, v, self.width, index) if self._z is None else self._z
            zg = rowmm(z, self.gram)
            self._output = zg, vecdot(zg, z).clamp_min(0).sqrt()
        return self._output


def exact_attention(x: Rows64) -> Tensor:
    """alpha_ij^h."""
    return x.at(x.alpha)


def exact_value_weighted(x: Rows64) -> Tensor:
    """alpha_ij^h ||v~_j^h||."""
    return finite(x.at(x.alpha) * x.at(x.value_norm()[..., None, :]))


def exact_value_weighted_normalized(x: Rows64) -> Tensor:
    """alpha_ij^h ||v~_j^h|| / ||o_i^h||."""
    return finite(x.at(x.alpha) * x.at(x.value_norm()[..., None, :]) /
                  x.output()[1][..., None])


def exact_contribution(x: Rows64) -> Tensor:
    """c_ij^h = alpha_ij^h <o_i^h, v~_j^h> / ||o_i^h||^2.

    <o_i^h, v~_j^h> is computed for every key within the row's width even when a few are
    asked for: a column's bits in a matrix product depend on the columns beside it
    (:func:`~.base.rowmm`, :func:`~.base.rowmm_within`)."""
    zg, output_norm = x.output()
    _, vt, index = x.blocks()
    dot = rowmm_within(zg, vt, x.width, inner=False, index=index)      # 0 past a row's width
    return finite(x.at(x.alpha) * x.at(dot) / output_norm.square()[..., None])


def exact_contribution_layer(alpha: Tensor, dot: Tensor, norm_sq: Tensor) -> Tensor:
    """C_ij^h = alpha_ij^h <o_i, v~_j^h> / ||o_i||^2 from ``dot`` = <o_i, v~_j^h> and
    ``norm_sq`` = ||o_i||^2 (broadcastable)."""
    return finite(alpha * dot / norm_sq)
