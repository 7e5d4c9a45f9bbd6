"""A layer's masks as an intervention pass reads them, made once for the layers that share them.

Every layer of a forward pass gets the same mask from the model (one per attention type: full,
sliding window), and every pass reads the same things of it: the keys allowed to real queries,
the row blocks of :func:`~.dense.row_blocks`, the eligible candidates, their count and last
position per row, and the additive 0 / -inf biases that mask the attention and the ranking
keys (:func:`~attngeom.extract.measurement.geometry.disallowed_bias`). Each is a pass over a
T x Tk mask; :func:`layer_masks` makes them once per mask and forward pass, not at every layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from ..measurement.geometry import disallowed_bias
from .dense import row_blocks

Tensor = torch.Tensor


class Candidates:
    """Eligible candidates ``mask`` (B, 1|H, T, Tk) bool and what a ranking reads of them, each
    made on first use."""

    def __init__(self, mask: Tensor):
        self.mask = mask
        self._fill: dict[tuple[float, torch.dtype], Tensor] = {}

    @cached_property
    def count(self) -> Tensor:
        """(B, 1|H, T) eligible candidates of each row."""
        return torch.count_nonzero(self.mask, -1)

    @cached_property
    def last(self) -> Tensor:
        """(B, 1|H, T) int32: one past each row's last eligible candidate (0: none)."""
        Tk = self.mask.shape[-1]
        position = torch.arange(1, Tk + 1, dtype=torch.int32, device=self.mask.device)
        return torch.mul(self.mask, position).amax(-1)

    @cached_property
    def first(self) -> Tensor:
        """(B, 1|H, T) int32: each row's first eligible candidate (0: none; a sliding window's
        rows start late)."""
        Tk = self.mask.shape[-1]
        before = torch.arange(Tk, 0, -1, dtype=torch.int32, device=self.mask.device)
        reach = torch.mul(self.mask, before).amax(-1)                  # Tk - first; 0: none
        return (Tk - reach).masked_fill_(reach == 0, 0)

    def fill(self, value: float, dtype: torch.dtype) -> Tensor:
        """The bias (B, 1|H, T, Tk) that puts ``value`` at the ineligible candidates."""
        if (value, dtype) not in self._fill:
            self._fill[value, dtype] = disallowed_bias(self.mask, value, dtype)
        return self._fill[value, dtype]


@dataclass(frozen=True)
class LayerMasks:
    """``allowed`` (B, 1|H, T, Tk): the model's mask at real keys; ``blocks`` its row blocks;
    ``eligible`` the candidates of a removal (real queries too), and ``attended`` the allowed
    keys as :class:`Candidates` (their -inf bias is the attention's mask)."""

    allowed: Tensor
    blocks: tuple[tuple[int, int, int], ...]
    attended: Candidates
    eligible: Candidates


def layer_masks(memo: dict, model_mask: Tensor, tokens: Tensor) -> LayerMasks:
    """The :class:`LayerMasks` of a layer given the model's boolean mask (B, 1|H, T, Tk) and
    the real tokens (B, T), from ``memo`` where a layer before passed the same tensors
    (:func:`identity`; the memo holds them, so their memory is not reused while it lives)."""
    key = tuple(identity(t) for t in (model_mask, tokens))
    if key not in memo:
        allowed = model_mask & tokens[:, None, None, :]
        attended = Candidates(allowed)
        eligible = attended if bool(tokens.all()) else \
            Candidates(allowed & tokens[:, None, :, None])
        memo[key] = (model_mask, tokens, LayerMasks(allowed, row_blocks(allowed), attended,
                                                     eligible))
    return memo[key][2]


def identity(t: Tensor) -> tuple:
    """What tells two views of a tensor apart: memory, shape, strides, dtype, device and the
    in-place version (an inference tensor has none: it cannot change outside inference mode,
    and the memo lives for one forward pass)."""
    version = None if t.is_inference() else t._version
    return t.data_ptr(), tuple(t.shape), t.stride(), version, t.dtype, str(t.device)
