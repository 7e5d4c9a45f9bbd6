"""Hooking through transformers' own attention registry, nothing rewritten.

We register one attention function and one mask function under the name ``attngeom``.
The mask registration matters: without it transformers skips mask creation for an unknown
implementation and the causal mask is silently dropped. Our mask function always returns
the full boolean (B, 1, Tq, Tk) mask, so the handler knows exactly which keys are allowed.

While a :class:`Handler` is active (``with attention_handler(model, handler):``) every
attention call of the model becomes one :class:`Call` for ``handler.attend``; outside, the
function is plain SDPA. The active blocks are a context variable: blocks nest, and a thread
(or asyncio task) sees only its own, so two measurements in two threads never mix. Layers are
identified by call order (:attr:`Call.index`), not by module: ALBERT runs one module as every
layer.

Every keyword the model passes is applied, known not to enter eager attention, or refused by
name (:func:`attention_keywords`), so no model gets numbers that silently differ from its own
eager attention.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, field
from typing import Any, Iterator, Protocol

import torch
from torch import nn
from attngeom.common.errors import Refusal

NAME = "attngeom"

# keywords the attention function applies: the scale, logit soft-capping, learned sink logits
# (``s_aux`` per head, ``sinks`` per head and query), causality when no mask is passed, and
# dropout (refused unless 0: eval mode)
APPLIED = ("scaling", "softcap", "s_aux", "sinks", "is_causal", "dropout")
# keywords carried by the mask the model builds (masking_utils applies the window), or read
# only by kernels other than eager attention, or by the model around the attention call
IGNORED = {
    "sliding_window": "the mask already applies the window (eager attention ignores it)",
    "position_ids": "positions are already in q and k (rotary embeddings)",
    "cache_position": "positions are already in q and k", "use_cache": "caching only",
    "output_attentions": "what is returned, not computed", "output_router_logits": "MoE only",
    "output_hidden_states": "what is returned", "return_dict": "what is returned",
    "cu_seq_lens_q": "flash-attention packing", "cu_seq_lens_k": "flash-attention packing",
    "max_length_q": "flash-attention packing", "max_length_k": "flash-attention packing",
    "deterministic": "flash-attention kernels only", "query": "", "key": "", "value": "",
}
# keywords that must be None (a value would change the attention or make it cross-attention)
MUST_BE_NONE = {
    "encoder_hidden_states": "cross-attention (only self-attention is measured)",
    "encoder_attention_mask": "cross-attention (only self-attention is measured)",
    "head_mask": "a head mask rescales attention probabilities",
    "attention_bias": "an additive attention bias",
}
# keywords refused by name: attention these cannot reproduce exactly
REFUSED = {
    "position_bias": "relative position biases added to the logits (T5-style)",
    "indices": "sparse attention over selected keys",
    "block_indices": "block-sparse attention",
}


class Unsupported(Refusal):
    """The model cannot be decomposed exactly; the message is one line with the reason."""


class Handler(Protocol):
    def attend(self, call: "Call") -> torch.Tensor:
        """Return head outputs z (B, H, Tq, dv)."""


@dataclass
class _Block:
    """One ``attention_handler`` block: its handler and the attention calls it has seen."""

    handler: Handler
    calls: int = 0


# this thread's (or task's) active blocks, innermost last
_ACTIVE: contextvars.ContextVar[tuple[_Block, ...]] = contextvars.ContextVar(
    "attngeom_active", default=())


@dataclass
class Call:
    """One call of the attention function, with every keyword resolved.

    query (B, H, Tq, dh); key (B, G, Tk, dh); value (B, G, Tk, dv), G dividing H;
    allowed (B, 1|H, Tq, Tk) bool; sinks None or learned sink logits broadcastable to
    (B, H, Tq); ``index`` counts the attention calls of the current forward from 0.
    """

    module: nn.Module
    index: int
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    allowed: torch.Tensor
    scaling: float
    softcap: float | None = None
    sinks: torch.Tensor | None = None
    mask: torch.Tensor | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)


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


def _sink_logits(module: nn.Module, query: torch.Tensor, kwargs: dict) -> torch.Tensor | None:
    """Learned sink logits as (1|B, H, 1|Tq): ``s_aux`` (H,) or ``sinks`` (B, H, Tq, 1)."""
    B, H, Tq, _ = query.shape
    s_aux, sinks = kwargs.get("s_aux"), kwargs.get("sinks")
    if s_aux is not None and sinks is not None:
        raise Refusal(f"{type(module).__name__} passes both s_aux and sinks to attention; "
                         "not supported")
    logits = s_aux if s_aux is not None else sinks
    if logits is None:
        return None
    if logits.numel() == H:
        return logits.reshape(1, H, 1)
    if logits.dim() == 4 and logits.shape[-1] == 1 and logits.shape[1:3] == (H, Tq):
        return logits[..., 0]
    raise Refusal(f"{type(module).__name__} passes learned sink logits of shape "
                     f"{tuple(logits.shape)}; attngeom reads one logit per head (s_aux) or per "
                     "head and query (sinks)")


def attention_keywords(module: nn.Module, kwargs: dict) -> None:
    """ValueError (one line, naming the keyword) for a keyword attngeom cannot reproduce."""
    name = type(module).__name__
    for key, value in kwargs.items():
        if key in APPLIED or key in IGNORED:
            continue
        if key in MUST_BE_NONE:
            if value is not None:
                raise Unsupported(f"{name} passes {key}= to attention: {MUST_BE_NONE[key]}; "
                                 "not supported")
            continue
        if key in REFUSED:
            if value is not None:
                raise Unsupported(f"{name} passes {key}= to attention: {REFUSED[key]}, which has "
                                 "no exact decomposition here; not supported")
            continue
        raise Unsupported(f"{name} passes the attention keyword '{key}', which attngeom does not "
                         "know; it may change the attention, so the model is not supported")
    dropout = kwargs.get("dropout") or 0.0
    if dropout:
        raise Refusal(f"{name} applies attention dropout {dropout}: the model is in training "
                         "mode; call model.eval()")


def _check_mask(module: nn.Module, mask: torch.Tensor | None) -> None:
    """ValueError when an additive mask carries more than allowed (0) / masked (min)."""
    if mask is None or mask.dtype == torch.bool:
        return
    floor = torch.finfo(mask.dtype).min / 2
    if bool(((mask > floor) & (mask != 0)).any()):
        raise Unsupported(f"{type(module).__name__} adds a bias to the attention logits through "
                         "its mask (e.g. ALiBi or a dynamic mask); not supported")


def _attention(module, query, key, value, attention_mask, **kwargs):
    active = _ACTIVE.get()
    if not active:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        if kwargs.get("s_aux") is not None or kwargs.get("sinks") is not None:
            raise Refusal("learned attention sinks need attngeom's handler or eager attention")
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    attention_keywords(module, kwargs)
    _check_mask(module, attention_mask)
    block = active[-1]
    scaling = kwargs.get("scaling")
    causal = kwargs.get("is_causal")
    causal = bool(getattr(module, "is_causal", False) if causal is None else causal)
    call = Call(module=module, index=block.calls, query=query, key=key, value=value,
                allowed=_allowed(attention_mask, query, key, causal),
                scaling=scaling if scaling is not None else query.shape[-1] ** -0.5,
                softcap=kwargs.get("softcap"), sinks=_sink_logits(module, query, kwargs),
                mask=attention_mask, kwargs=kwargs)
    block.calls += 1
    z = block.handler.attend(call)
    return z.transpose(1, 2).contiguous(), None                 # (B, Tq, H, dv)


def register() -> None:
    """Register the ``attngeom`` attention and mask functions (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, _attention)
    AttentionMaskInterface.register(NAME, _mask)


def configs_of(model: nn.Module) -> list:
    """Every config object the model's modules read (the model's, its sub-configs', and any
    module built with a config of its own), each once."""
    cfg = model.config
    found = {id(cfg): cfg}
    for name in getattr(cfg, "sub_configs", {}) or {}:
        sub = getattr(cfg, name, None)
        if sub is not None:
            found.setdefault(id(sub), sub)
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "_attn_implementation"):
            found.setdefault(id(config), config)
    return list(found.values())


def _set_impl(model: nn.Module, impl: str | list) -> list:
    """Set the attention implementation of every config (``impl`` a name, or the list this
    function returned, to restore each config's own); return the previous values.

    A model that refuses the implementation raises :class:`Unsupported` with its reason; a
    module without ``set_attn_implementation`` (not a transformers model) gets its configs set.
    """
    configs = configs_of(model)
    previous = [c._attn_implementation for c in configs]
    values = impl if isinstance(impl, list) else [impl] * len(configs)
    setter = getattr(model, "set_attn_implementation", None)
    if setter is not None and not isinstance(impl, list):
        try:
            setter(impl)
        except (ValueError, KeyError, ImportError) as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise Unsupported(f"{type(model).__name__} refuses the '{impl}' attention "
                              f"implementation ({reason}); not supported") from exc
    for config, value in zip(configs, values):
        config._attn_implementation = value
    return previous


@contextlib.contextmanager
def attention_handler(model: nn.Module, handler: Handler) -> Iterator[None]:
    """Route every attention layer of ``model`` through ``handler`` inside the block.

    The calls are counted from 0 on entering the block (:attr:`Call.index`).
    """
    register()
    previous = _set_impl(model, NAME)
    token = _ACTIVE.set(_ACTIVE.get() + (_Block(handler),))
    try:
        yield
    finally:
        _ACTIVE.reset(token)
        _set_impl(model, previous)
