"""What the model is given and how it is run: the probe pass's inputs, the kind of input a
model takes, and the measured pass (the model without its output head)."""

from __future__ import annotations

import inspect

import torch
from torch import nn

from .hooks import Unsupported

PROBE_TOKENS = 2


def input_kind(model: nn.Module) -> str:
    """``text`` when the forward takes input_ids, ``image`` for pixel_values only."""
    params = inspect.signature(model.forward).parameters
    if "input_ids" in params:
        return "text"
    if "pixel_values" in params:
        return "image"
    raise Unsupported(f"{type(model).__name__} takes neither input_ids nor pixel_values; "
                      "attngeom measures text and vision transformers")


def _image_config(model: nn.Module):
    cfg = model.config
    return getattr(cfg, "vision_config", None) or cfg


def probe_inputs(model: nn.Module, kind: str) -> dict[str, torch.Tensor]:
    """A two-token text (ids 1, 2) or one seeded random image of the configured size."""
    device = next(model.parameters()).device
    if kind == "text":
        vocab = int(getattr(model.config, "vocab_size", 0) or getattr(
            getattr(model.config, "text_config", None), "vocab_size", 3))
        ids = torch.tensor([[1, 2]], device=device).clamp_max(max(vocab - 1, 0))
        return {"input_ids": ids[:, :PROBE_TOKENS],
                "attention_mask": torch.ones_like(ids[:, :PROBE_TOKENS])}
    cfg = _image_config(model)
    size = getattr(cfg, "image_size", 224)
    h, w = (size, size) if isinstance(size, int) else tuple(size)[:2]
    channels = int(getattr(cfg, "num_channels", 3))
    gen = torch.Generator().manual_seed(0)
    dtype = next(model.parameters()).dtype
    return {"pixel_values": torch.randn(1, channels, h, w, generator=gen).to(device, dtype)}


def run_trunk(model: nn.Module, inputs: dict) -> None:
    """One forward pass of ``model`` without its output head, the measured pass: its base
    model (transformers' ``base_model``, the decoder stack of a ``...ForCausalLM``) where it
    has one, so the LM head's (vocabulary x d) weight is never read, and no KV cache."""
    trunk = model.base_model if isinstance(getattr(model, "base_model", None), nn.Module) \
        else model
    trunk(**inputs, **forward_options(trunk, inputs))


def forward_options(model: nn.Module, inputs: dict) -> dict:
    """No KV cache, and logits for one position only where ``model`` still has a head."""
    if "input_ids" not in inputs:
        return {}
    params = inspect.signature(model.forward).parameters
    extra = {"use_cache": False} if "use_cache" in params or _takes_kwargs(params) else {}
    if "logits_to_keep" in params:
        extra["logits_to_keep"] = 1
    return extra


def _takes_kwargs(params) -> bool:
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
