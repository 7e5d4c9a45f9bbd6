"""Removal passes that start at the lowest intervened layer.

When a removal touches only layers ``>= start`` (``--layers``), everything below ``start`` is
the clean pass's computation: same inputs, same dense handler, same float32 operations. So the
clean pass keeps the hidden states entering decoder layer ``start`` (a forward pre-hook), and
each removal pass runs the model on them with its decoder stack cut to ``layers[start:]``
(``inputs_embeds``; the handler's call index is offset by ``start``). The model's own forward
still builds the masks and the position embeddings; nothing is reimplemented.

Whether a model runs this way is discovered, not assumed: ``measurement.archs.decoder_stack``
finds the ModuleList whose i-th element holds the i-th attention layer, and the first batch's clean
logits computed from ``start`` must equal the full pass's bit for bit; otherwise every pass
runs in full (and the log says why).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import Tensor, nn

from ..measurement.hooks import attention_handler
from .interventions import watching



def lowest_layer(layers) -> int:
    """The first layer a removal touches (0: every layer, or ``layers`` includes 0)."""
    return 0 if layers is None else min(layers)


class HiddenAt:
    """Keeps the hidden states entering ``layers[start]`` during one forward pass."""

    def __init__(self, stack: nn.ModuleList, start: int):
        self.block, self.hidden = stack[start], None

    @contextlib.contextmanager
    def watching(self) -> Iterator["HiddenAt"]:
        def keep(module, args, kwargs):
            self.hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]

        handle = self.block.register_forward_pre_hook(keep, with_kwargs=True)
        try:
            yield self
        finally:
            handle.remove()


PER_LAYER_CONFIG = "layer_types"   # transformers' per-layer list a stack's forward indexes by i


@contextlib.contextmanager
def cut_below(stack: tuple[nn.Module, str, nn.ModuleList], start: int) -> Iterator[None]:
    """The decoder stack is ``layers[start:]`` inside the block, and so is the config's
    ``layer_types`` (Gemma 3 picks layer i's mask and rotary table by ``layer_types[i]``)."""
    owner, name, layers = stack
    config = getattr(owner, "config", None)
    types = getattr(config, PER_LAYER_CONFIG, None)
    cut_types = isinstance(types, (list, tuple)) and len(types) == len(layers)
    setattr(owner, name, nn.ModuleList(list(layers)[start:]))
    if cut_types:
        setattr(config, PER_LAYER_CONFIG, type(types)(types[start:]))
    try:
        yield
    finally:
        setattr(owner, name, layers)
        if cut_types:
            setattr(config, PER_LAYER_CONFIG, types)


@torch.inference_mode()
def logits_from(model: nn.Module, stack, start: int, hidden: Tensor,
                inputs: dict[str, Tensor], handler) -> Tensor:
    """Logits (B, T, V) of the model run from layer ``start`` on ``hidden`` (B, T, d), with
    ``handler`` seeing the calls of layers ``start, start + 1, ...``."""
    mask = inputs.get("attention_mask")
    handler.token_mask = mask.bool() if mask is not None else None
    handler.start = start
    with cut_below(stack, start), attention_handler(model, handler), watching(handler):
        out = model(inputs_embeds=hidden, attention_mask=mask, use_cache=False)
    return out.logits
