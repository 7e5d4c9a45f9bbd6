"""What a score kernel may read besides the layer's attention: :class:`LayerContext`.

The handler of a removal pass (:class:`~.interventions.Intervener`) or of the scores API
(:mod:`.attribution`) makes one per attention layer and hands it to the kernels as
``FastLayer.context`` and ``Rows64.context``: the layer's index and call (queries, keys, mask:
float64 attention of any row), the rows' content keys and the seed (a metric that ``needs``
``position``: random), the residual input x and the normalisations around the layer
(``residual``: ALTI, the norm-based method), the rest of the layer after its attention, run on
rows by the model's own modules (``sublayer``: value zeroing; its block's input is ``x`` too)
and ``carry``, a dict that lives for the whole forward pass, in which a kernel keeps what it
needs from the layers below (``below``: rollout). :mod:`attngeom.common.metrics` says which
metric needs what.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np
import torch

from attngeom.common.vocab import SEED

from ..measurement.geometry import Projection

Tensor = torch.Tensor


@dataclass
class LayerContext:
    """One attention layer's context (see the module docstring); shapes as :class:`~.hooks.Call`.

    query (B, H, T, dh); key, value (B, G, Tk, dh); allowed (B, 1|H, T, Tk); proj W_O (float64);
    rows (B,) int64 content keys of the batch rows; x (B, T, d) the residual input; residual
    the layer's :class:`~.residual.Residual`; sublayer its :class:`~.sublayer.SublayerCall`;
    queries (B, T) bool the real queries (None: all); carry the pass's dict (shared by its
    layers).
    """

    layer: int
    query: Tensor
    key: Tensor
    value: Tensor
    allowed: Tensor
    scaling: float
    softcap: float | None
    sinks: Tensor | None
    proj: Projection
    rows: Tensor | None = None
    seed: int = SEED
    x: Tensor | None = None
    residual: object = None
    sublayer: object = None
    queries: Tensor | None = None
    carry: dict = field(default_factory=dict)
    cache: dict = field(default_factory=dict)          # per layer, for the exact rows

    def content_rows(self) -> Tensor:
        """``rows``, or 0, 1, ... when the caller gave none."""
        if self.rows is None:
            return torch.arange(self.query.shape[0], device=self.query.device)
        return self.rows.to(self.query.device)


def row_keys(ids, mask=None) -> np.ndarray:
    """A 31-bit key of each row's real token ids (B, T) (``mask`` 1 where real; CRC-32 of
    their int64 bytes): what the random ranking of a row depends on besides the seed and the
    layer, so that it does not depend on the batch a row runs in (nor on its padding)."""
    ids = np.asarray(ids, dtype=np.int64)
    mask = np.ones(ids.shape, dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
    return np.array([zlib.crc32(np.ascontiguousarray(row[m]).tobytes()) & 0x7FFFFFFF
                     for row, m in zip(ids, mask)], dtype=np.int64)
