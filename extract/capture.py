"""Measure every attention layer of a model in one forward pass.

>>> out = measure(model, {"input_ids": ids, "attention_mask": mask}, Options("dense"))
>>> out["alpha"].shape            # (B, L, H, T, T); compact: (B, L, H, T, k)
"""

from __future__ import annotations

import inspect

import numpy as np
import torch
from torch import nn

from .archs import attention_layers
from .geometry import Projection, cached_projection
from .hooks import attention_handler
from .measure import Masks, Options, measure_layer, prepare_masks


class Measurer:
    """Attention handler that measures each layer.

    Masks are prepared once per distinct attention mask of a forward pass; Gram matrices once
    per model (cached on the weight). Each layer's results are copied to host arrays
    preallocated for all layers: at ``collect`` when ``keep_on_device`` (``results`` then
    holds every layer), else as soon as the layer is done (bounded memory, one copy).
    """

    def __init__(self, model: nn.Module, opts: Options, keep_on_device: bool = True):
        self.opts = opts
        found = attention_layers(model)
        self.layers = {id(m): (i, w) for i, (m, w, _) in enumerate(found)}
        self.n_layers = len(found)
        self.token_mask: torch.Tensor | None = None
        self.keep_on_device = keep_on_device
        self.results: dict[int, dict[str, torch.Tensor]] = {}
        self.host: dict[str, np.ndarray] = {}
        self._masks: list[tuple[torch.Tensor, Masks]] = []

    def projection(self, module: nn.Module, n_heads: int) -> Projection:
        return cached_projection(self.layers[id(module)][1], n_heads)

    def masks(self, allowed: torch.Tensor, token_mask: torch.Tensor, dtype) -> Masks:
        """Masks for this mask tensor, made once (the model passes each layer the same one)."""
        for seen, masks in self._masks:
            if (seen.data_ptr() == allowed.data_ptr() and seen.shape == allowed.shape
                    and seen.stride() == allowed.stride()):
                return masks
        masks = prepare_masks(allowed, token_mask, self.opts, dtype)
        self._masks.append((allowed, masks))       # keeps the tensor (and its address) alive
        return masks

    def attend(self, module, query, key, value, allowed, scaling, softcap):
        if id(module) not in self.layers:
            raise RuntimeError(f"attention module {type(module).__name__} was not registered")
        layer = self.layers[id(module)][0]
        proj = self.projection(module, query.shape[1])
        token_mask = self.token_mask
        if token_mask is None:
            token_mask = torch.ones(query.shape[0], query.shape[2], dtype=torch.bool,
                                    device=query.device)
        masks = self.masks(allowed, token_mask.to(query.device), query.dtype)
        z, out = measure_layer(query, key, value, masks, scaling, proj, self.opts, softcap)
        if self.keep_on_device:
            self.results[layer] = out
        else:
            self._to_host(layer, out)
        return z

    def _to_host(self, layer: int, out: dict[str, torch.Tensor]) -> None:
        """Copy one layer into the (B, L, ...) host arrays, allocated at the first layer."""
        for name, x in out.items():
            if name not in self.host:
                shape = (x.shape[0], self.n_layers) + tuple(x.shape[1:])
                self.host[name] = np.empty(shape, dtype=np.float32)
            torch.from_numpy(self.host[name])[:, layer].copy_(x)

    def collect(self) -> dict[str, np.ndarray]:
        """Every array as (B, L, ...) float32 numpy."""
        for layer in sorted(self.results):
            self._to_host(layer, self.results[layer])
        host, self.host, self.results, self._masks = self.host, {}, {}, []
        return host


def model_inputs(batch: dict, device: torch.device | str) -> dict[str, torch.Tensor]:
    """Tensors for the model's forward from a batch dict (numpy or torch)."""
    keep = ("input_ids", "attention_mask", "pixel_values", "token_type_ids")
    return {k: torch.as_tensor(v).to(device) for k, v in batch.items() if k in keep}


def _forward_options(model: nn.Module, inputs: dict) -> dict:
    """No KV cache, and logits for one position only: extraction never reads the LM head."""
    if "input_ids" not in inputs:
        return {}
    params = inspect.signature(model.forward).parameters
    extra = {"use_cache": False}
    if "logits_to_keep" in params:
        extra["logits_to_keep"] = 1
    return extra


@torch.inference_mode()
def measure(model: nn.Module, batch: dict, opts: Options = Options()) -> dict[str, np.ndarray]:
    """Run the model once on ``batch`` and return every layer's measurements.

    Parameters
    ----------
    batch : ``input_ids`` and ``attention_mask`` (B, T), right-padded, or ``pixel_values``.
    opts : layout (dense/compact) and sink/tail sizes.

    Returns
    -------
    dict of float32 arrays with the batch first and the layer second, named as in
    :mod:`attngeom.store.schema`; entries outside the mask or the length are NaN.
    """
    device = next(model.parameters()).device
    inputs = model_inputs(batch, device)
    # on an accelerator, compact results stay there until the end (no host sync per layer)
    handler = Measurer(model, opts, keep_on_device=device.type != "cpu" and opts.mode == "compact")
    mask = inputs.get("attention_mask")
    if mask is not None:
        handler.token_mask = mask.bool()
    with attention_handler(model, handler):
        model(**inputs, **_forward_options(model, inputs))
    return handler.collect()
