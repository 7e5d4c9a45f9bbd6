"""Measure every attention layer of a model in one forward pass.

>>> out = measure(model, {"input_ids": ids, "attention_mask": mask}, Options("dense"))
>>> out["alpha"].shape            # (B, L, H, T, T); compact: (B, L, H, T, k)
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from .archs import attention_layers
from .geometry import Projection
from .hooks import attention_handler
from .measure import Options, measure_layer


class Measurer:
    """Attention handler that measures each layer and keeps the results on device."""

    def __init__(self, model: nn.Module, opts: Options):
        self.opts = opts
        self.layers = {id(m): (i, w) for i, (m, w, _) in enumerate(attention_layers(model))}
        self.projections: dict[int, Projection] = {}
        self.token_mask: torch.Tensor | None = None
        self.results: dict[int, dict[str, torch.Tensor]] = {}

    def projection(self, module: nn.Module, n_heads: int) -> Projection:
        key = id(module)
        if key not in self.projections:           # Gram matrices once per model
            self.projections[key] = Projection.from_weight(self.layers[key][1], n_heads)
        return self.projections[key]

    def attend(self, module, query, key, value, allowed, scaling, softcap):
        if id(module) not in self.layers:
            raise RuntimeError(f"attention module {type(module).__name__} was not registered")
        layer = self.layers[id(module)][0]
        proj = self.projection(module, query.shape[1])
        token_mask = self.token_mask
        if token_mask is None:
            token_mask = torch.ones(query.shape[0], query.shape[2], dtype=torch.bool,
                                    device=query.device)
        z, out = measure_layer(query, key, value, allowed, token_mask.to(query.device),
                               scaling, proj, self.opts, softcap)
        self.results[layer] = out
        return z

    def collect(self) -> dict[str, np.ndarray]:
        """Stack layers: every array becomes (B, L, ...) float32 numpy."""
        layers = [self.results[i] for i in sorted(self.results)]
        self.results = {}
        return {name: torch.stack([r[name] for r in layers], dim=1).cpu().numpy()
                for name in layers[0]}


def model_inputs(batch: dict, device: torch.device | str) -> dict[str, torch.Tensor]:
    """Tensors for the model's forward from a batch dict (numpy or torch)."""
    keep = ("input_ids", "attention_mask", "pixel_values", "token_type_ids")
    return {k: torch.as_tensor(v).to(device) for k, v in batch.items() if k in keep}


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
    handler = Measurer(model, opts)
    mask = inputs.get("attention_mask")
    if mask is not None:
        handler.token_mask = mask.bool()
    with attention_handler(model, handler):
        model(**inputs, use_cache=False) if "input_ids" in inputs else model(**inputs)
    return handler.collect()
