"""Hooking through transformers' own attention registry, nothing rewritten.

We register one attention function and one mask function under the name ``attngeom``.
The mask registration matters: without it transformers skips mask creation for an unknown
implementation and the causal mask is silently dropped. Our mask function always returns
the full boolean (B, 1, Tq, Tk) mask, so the handler knows exactly which keys are allowed.

While a :class:`Handler` is active (``with attention_handler(model, handler):``) every
attention layer of the model calls ``handler.attend``; outside, the function is plain SDPA.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Protocol

import torch
from torch import nn

NAME = "attngeom"
_ACTIVE: list["Handler"] = []


class Handler(Protocol):
    def attend(self, module: nn.Module, query: torch.Tensor, key: torch.Tensor,
               value: torch.Tensor, allowed: torch.Tensor, scaling: float,
               softcap: float | None) -> torch.Tensor:
        """Return head outputs z (B, H, T, dh)."""


def _mask(*args, **kwargs):
    from transformers.masking_utils import sdpa_mask

    kwargs["allow_is_causal_skip"] = False
    kwargs["allow_is_bidirectional_skip"] = False
    return sdpa_mask(*args, **kwargs)


def _allowed(mask: torch.Tensor | None, query: torch.Tensor, key: torch.Tensor,
             causal: bool) -> torch.Tensor:
    """The boolean (B, 1|H, Tq, Tk) mask, whatever form the model passed."""
    B, _, Tq, _ = query.shape
    Tk = key.shape[2]
    if mask is None:
        full = torch.ones(Tq, Tk, dtype=torch.bool, device=query.device)
        full = full.tril(Tk - Tq) if causal else full
        return full.expand(B, 1, Tq, Tk)
    if mask.dtype == torch.bool:
        return mask[..., :Tk]
    return mask[..., :Tk] > torch.finfo(mask.dtype).min / 2


def _attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
               **kwargs):
    if kwargs.get("s_aux") is not None or kwargs.get("sinks") is not None:
        raise ValueError("learned attention sinks (s_aux) are not supported yet")
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    if not _ACTIVE:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        return sdpa_attention_forward(module, query, key, value, attention_mask,
                                      dropout=dropout, scaling=scaling, **kwargs)
    handler = _ACTIVE[-1]
    causal = bool(getattr(module, "is_causal", False))
    allowed = _allowed(attention_mask, query, key, causal)
    z = handler.attend(module, query, key, value, allowed, scale, kwargs.get("softcap"))
    return z.transpose(1, 2).contiguous(), None                 # (B, T, H, dh)


def register() -> None:
    """Register the ``attngeom`` attention and mask functions (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, _attention)
    AttentionMaskInterface.register(NAME, _mask)


def _set_impl(model: nn.Module, impl: str) -> None:
    try:
        model.set_attn_implementation(impl)
    except (AttributeError, ValueError):
        for config in [model.config, *[getattr(model.config, n) for n in
                                       getattr(model.config, "sub_configs", {})]]:
            config._attn_implementation = impl


@contextlib.contextmanager
def attention_handler(model: nn.Module, handler: Handler) -> Iterator[None]:
    """Route every attention layer of ``model`` through ``handler`` inside the block."""
    register()
    previous = model.config._attn_implementation
    _set_impl(model, NAME)
    _ACTIVE.append(handler)
    try:
        yield
    finally:
        _ACTIVE.pop()
        _set_impl(model, previous)
