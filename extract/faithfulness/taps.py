"""What a forward pass keeps of each attention layer's block (forward pre-hooks), the probe
pass that discovers what surrounds each attention layer, and the cache of what it found.

:class:`~.residual.ResidualTap` (the block's residual input) and :class:`~.sublayer.BlockTap`
(the block's whole call, to rerun its sublayer on rows) are both a :class:`BlockHooks`.
"""

from __future__ import annotations

import weakref
from typing import Callable, Sequence, TypeVar

import torch
from torch import Tensor, nn

from ..measurement.forward import probe_inputs, run_trunk

S = TypeVar("S")


def first_tensor(args: tuple, kwargs: dict) -> Tensor | None:
    """The block's input: ``hidden_states`` or its first positional argument (None if neither
    is a tensor)."""
    x = kwargs.get("hidden_states", args[0] if args else None)
    return x if torch.is_tensor(x) else None


def per_model(found: "weakref.WeakKeyDictionary[nn.Module, S]", model: nn.Module,
              build: Callable[[nn.Module], S]) -> S:
    """``build(model)``, made once per model and kept in ``found`` while the model lives."""
    if model not in found:
        found[model] = build(model)
    return found[model]


def probe_pass(model: nn.Module, handles: list) -> None:
    """One probe forward pass (:func:`~..measurement.forward.probe_inputs`, text) through the
    hooks ``handles`` registered, which are removed after it."""
    inputs = probe_inputs(model, "text")
    try:
        run_trunk(model, inputs)
    finally:
        for h in handles:
            h.remove()


class BlockHooks:
    """A context manager that hands each block's call to :meth:`keep` during a forward pass.

    ``structure``: one entry per attention layer, each with its ``block`` (the module whose
    input is the residual stream); the layer is told by the block's place in it.
    """

    def __init__(self, structure: Sequence) -> None:
        self.structure = structure
        self._index = {id(s.block): n for n, s in enumerate(structure)}
        self._handles: list = []

    def keep(self, layer: int, args: tuple, kwargs: dict) -> None:
        """What to keep of layer ``layer``'s block call."""
        raise NotImplementedError

    def __enter__(self):
        def hook(module, args, kwargs):
            self.keep(self._index[id(module)], args, kwargs)

        self._handles = [s.block.register_forward_pre_hook(hook, with_kwargs=True)
                         for s in self.structure]
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
