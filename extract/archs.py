"""Where each architecture keeps its attention modules and output projection W_O.

Each finder returns, in layer order, ``(attention_module, W_O, has_bias)`` where
``attention_module`` is the module whose forward calls the attention interface and
``W_O`` is (H*dh, d) in ``x @ W`` orientation. Adding an architecture is one entry.
"""

from __future__ import annotations

from typing import Callable, Iterator

import torch
from torch import nn

Found = tuple[nn.Module, torch.Tensor, bool]


def _o_proj(model: nn.Module) -> Iterator[Found]:
    """llama, mistral, qwen2, qwen3, gemma3: ``self_attn.o_proj`` is an nn.Linear."""
    for module in model.modules():
        o_proj = getattr(module, "o_proj", None)
        if isinstance(o_proj, nn.Linear) and hasattr(module, "v_proj"):
            yield module, o_proj.weight.T, o_proj.bias is not None


def _gpt2(model: nn.Module) -> Iterator[Found]:
    """gpt2: ``attn.c_proj`` is a Conv1D whose weight is already (in, out)."""
    for module in model.modules():
        if type(module).__name__ == "GPT2Attention" and not module.is_cross_attention:
            yield module, module.c_proj.weight, module.c_proj.bias is not None


def _outside(self_attr: str) -> Callable[[nn.Module], Iterator[Found]]:
    """bert, vit: the output projection lives in a sibling ``output.dense`` module."""

    def find(model: nn.Module) -> Iterator[Found]:
        for module in model.modules():
            inner = getattr(module, self_attr, None)
            output = getattr(module, "output", None)
            dense = getattr(output, "dense", None)
            if inner is not None and isinstance(dense, nn.Linear) and hasattr(inner, "value"):
                yield inner, dense.weight.T, dense.bias is not None
    return find


FINDERS: dict[str, Callable[[nn.Module], Iterator[Found]]] = {
    "llama": _o_proj, "mistral": _o_proj, "qwen2": _o_proj, "qwen3": _o_proj,
    "gemma3": _o_proj, "gemma3_text": _o_proj,
    "gpt2": _gpt2,
    "bert": _outside("self"),
    "vit": lambda model: list(_o_proj(model)) or list(_outside("attention")(model)),
}
CAUSAL = {"llama", "mistral", "qwen2", "qwen3", "gemma3", "gemma3_text", "gpt2"}


def supported() -> str:
    return ", ".join(sorted(FINDERS))


def attention_layers(model: nn.Module) -> list[Found]:
    """The model's self-attention layers with their output projections, in order."""
    model_type = getattr(model.config, "model_type", "?")
    if model_type not in FINDERS:
        raise ValueError(
            f"unsupported architecture '{model_type}'; supported: {supported()} "
            "(add a finder to extract/archs.py for another one)")
    found = list(FINDERS[model_type](model))
    if not found:
        raise ValueError(f"no attention layers found in this '{model_type}' model")
    return found


def is_causal(model: nn.Module) -> bool:
    return getattr(model.config, "model_type", "") in CAUSAL
