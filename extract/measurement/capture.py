"""The whole-model capture: every attention layer of a model measured in one forward pass.

Each layer's measurement is :func:`attngeom.extract.measurement.layer.measure_layer`; the
public, in-memory ``attngeom.measure`` (:mod:`.inmemory`) builds a labeled Dataset on top.

>>> out = capture(model, {"input_ids": ids, "attention_mask": mask}, Options("dense"))
>>> out["alpha"].shape            # (B, L, H, T, T); compact: (B, L, H, T, k)
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch
from torch import nn

from .archs import Layer, discover
from .forward import run_trunk
from .geometry import Projection, cached_projection
from .hooks import Call, attention_handler
from .layer import Masks, Options, measure_layer, prepare_masks

EachLayer = Callable[[int, dict[str, np.ndarray]], None]    # (layer, its (B, ...) arrays)


class Measurer:
    """Attention handler that measures each layer.

    Masks are prepared once per distinct attention mask of a forward pass; Gram matrices once
    per model (cached on the weight). Each layer's results are copied to host arrays
    preallocated for all layers: at ``collect`` when ``keep_on_device`` (``results`` then
    holds every layer), else as soon as the layer is done (bounded memory, one copy). With
    ``each_layer``, each layer's results are handed to it instead, as (B, ...) float32 numpy
    arrays, as soon as the layer is done, and nothing is kept (``collect`` returns ``{}``).
    """

    def __init__(self, model: nn.Module, opts: Options, keep_on_device: bool = True,
                 each_layer: EachLayer | None = None):
        self.opts, self.each_layer = opts, each_layer
        arch = discover(model)
        self.found: tuple[Layer, ...] = arch.layers
        self.learned_sinks = arch.learned_sinks
        self.n_layers = len(self.found)
        self.token_mask: torch.Tensor | None = None
        self.keep_on_device = keep_on_device
        self.results: dict[int, dict[str, torch.Tensor]] = {}
        self.host: dict[str, np.ndarray] = {}
        self._masks: list[tuple[torch.Tensor, Masks]] = []

    def layer(self, call: Call) -> Layer:
        """The layer of this call (calls come in layer order), checked against the probe."""
        found = self.found[call.index] if call.index < self.n_layers else None
        if found is None or found.module is not call.module:
            raise RuntimeError(f"attention call {call.index} ({type(call.module).__name__}) is "
                               "not the layer the probe found there")
        return found

    def projection(self, layer: Layer) -> Projection:
        return cached_projection(layer.weight, layer.n_heads)

    def masks(self, allowed: torch.Tensor, token_mask: torch.Tensor, dtype) -> Masks:
        """Masks for this mask tensor, made once (the model passes each layer the same one)."""
        for seen, masks in self._masks:
            if (seen.data_ptr() == allowed.data_ptr() and seen.shape == allowed.shape
                    and seen.stride() == allowed.stride()):
                return masks
        masks = prepare_masks(allowed, token_mask, self.opts, dtype)
        self._masks.append((allowed, masks))       # keeps the tensor (and its address) alive
        return masks

    def attend(self, call: Call) -> torch.Tensor:
        layer = self.layer(call)
        query = call.query
        token_mask = self.token_mask
        if token_mask is None:
            token_mask = torch.ones(query.shape[0], query.shape[2], dtype=torch.bool,
                                    device=query.device)
        masks = self.masks(call.allowed, token_mask.to(query.device), query.dtype)
        z, out = measure_layer(query, call.key, call.value, masks, call.scaling,
                               self.projection(layer), self.opts, call.softcap, call.sinks)
        if self.learned_sinks and "learned_sink_alpha" not in out:   # a layer without sinks
            out["learned_sink_alpha"] = torch.zeros_like(out["output_norm"]).masked_fill(
                ~masks.query, float("nan"))
        if self.each_layer is not None:
            self.each_layer(call.index, {n: x.to("cpu", torch.float32).numpy()
                                         for n, x in out.items()})
        elif self.keep_on_device:
            self.results[call.index] = out
        else:
            self._to_host(call.index, out)
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


@torch.inference_mode()
def capture(model: nn.Module, batch: dict, opts: Options = Options(),
            each_layer: EachLayer | None = None) -> dict[str, np.ndarray]:
    """Run the model once on ``batch`` and return every layer's measurements.

    Parameters
    ----------
    batch : ``input_ids`` and ``attention_mask`` (B, T), right-padded, or ``pixel_values``.
    opts : layout (dense/compact) and sink/tail sizes.
    each_layer : called with (layer, its arrays) as each layer is measured, the arrays as
        below without the layer axis; nothing is returned then (one layer held at a time).

    Returns
    -------
    dict of float32 arrays with the batch first and the layer second, named as in
    :mod:`attngeom.store.format.schema`; entries outside the mask or the length are NaN.
    """
    device = next(model.parameters()).device
    inputs = model_inputs(batch, device)
    # on an accelerator, compact results stay there until the end (no host sync per layer)
    handler = Measurer(model, opts, keep_on_device=device.type != "cpu" and opts.mode == "compact",
                       each_layer=each_layer)
    mask = inputs.get("attention_mask")
    if mask is not None:
        handler.token_mask = mask.bool()
    with attention_handler(model, handler):
        run_trunk(model, inputs)
    return handler.collect()
