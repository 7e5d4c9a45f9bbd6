"""Discover each self-attention layer, its head layout and its output projection W_O.

No table keyed on ``model_type``: one probe forward pass on a two-token input (or one small
random image) runs with the attngeom attention function registered and records

- which modules call the attention interface, in call order (= layer order), with the
  query/key/value shapes (query heads, key/value heads, head dim, value head dim), the mask
  (causal or bidirectional) and the keywords (learned sinks, soft-capping, windows);
- which ``nn.Linear`` / ``Conv1D`` receives the attention output unchanged as its input: W_O,
  wherever it lives (inside the attention module, or a sibling as in BERT and ViT);
- on the probe itself, that ``z @ W_O + b`` reproduces that projection's output, and that
  attngeom's attention reproduces the modelling file's own ``eager_attention_forward``.

A model that cannot be decomposed exactly is refused with one line naming the module and the
reason (:class:`Unsupported`): something between attention and W_O (a normalisation such as
BitNet's attention sub-norm, a gate such as Qwen3-Next's, a mixture of heads such as JetMoE's),
two attention calls per head output (differential attention), attention computed outside the
interface (BLOOM, MPT, Falcon, GPT-Neo, XGLM), cross-attention (encoder-decoder models), a head
count that varies across layers (the store has one ``head`` dimension).

No explicit per-architecture entry is needed today: every refusal above is found by the probe.
"""

from __future__ import annotations

import inspect
import sys
import weakref
from dataclasses import dataclass

import torch
from torch import nn

from .forward import input_kind, probe_inputs, run_trunk
from .geometry import attention_probs, repeat_kv
from .hooks import Call, Unsupported, attention_handler

@dataclass(frozen=True)
class Layer:
    """One self-attention layer as the probe found it.

    ``weight`` is W_O as (H * value_dim, d) in ``z @ W`` orientation (a view of the parameter).
    """

    module: nn.Module
    name: str
    out: nn.Module
    out_name: str
    weight: torch.Tensor
    has_bias: bool
    n_heads: int
    n_kv_heads: int
    head_dim: int
    value_dim: int
    causal: bool
    scaling: float
    learned_sinks: bool
    softcap: bool
    window: bool


@dataclass(frozen=True)
class Architecture:
    """What the probe found: the layers in call order and the model-wide facts."""

    layers: tuple[Layer, ...]
    inputs: str                      # "text" or "image"
    causal: bool
    notes: tuple[str, ...]
    eager_checked: bool

    @property
    def learned_sinks(self) -> bool:
        return any(layer.learned_sinks for layer in self.layers)


_FOUND: "weakref.WeakKeyDictionary[nn.Module, Architecture]" = weakref.WeakKeyDictionary()


def _linear_weight(module: nn.Module) -> torch.Tensor | None:
    """(in, out) weight of an nn.Linear or transformers Conv1D, else None."""
    if isinstance(module, nn.Linear):
        return module.weight.T
    if type(module).__name__ == "Conv1D" and getattr(module, "weight", None) is not None:
        return module.weight
    return None


class _Probe:
    """Attention handler of the probe pass: exact dense attention, with everything recorded."""

    def __init__(self):
        self.calls: list[dict] = []
        self.eager_checked = True

    def attend(self, call: Call) -> torch.Tensor:
        q, k, v = call.query, call.key, call.value
        if q.shape[2] != k.shape[2]:
            raise Unsupported(f"{type(call.module).__name__} attends from {q.shape[2]} queries to "
                              f"{k.shape[2]} keys (cross-attention); attngeom measures "
                              "self-attention only")
        H = q.shape[1]
        alpha, _ = attention_probs(q.float(), repeat_kv(k, H).float(), call.scaling,
                                   call.allowed, call.softcap, call.sinks)
        z = alpha @ repeat_kv(v, H).float()                               # (B, H, T, dv)
        self._check_eager(call, z)
        self.calls.append({"call": call, "z": z.to(q.dtype).transpose(1, 2).reshape(
            q.shape[0], q.shape[2], -1), "out": None, "out_name": None, "after": None})
        return z.to(q.dtype)

    def _check_eager(self, call: Call, z: torch.Tensor) -> None:
        """Refuse when the modelling file's own eager attention gives another output."""
        eager = getattr(sys.modules.get(type(call.module).__module__), "eager_attention_forward",
                        None)
        if eager is None:
            self.eager_checked = False
            return
        q, k, v = call.query.float(), call.key.float(), call.value.float()
        bias = torch.zeros(call.allowed.shape, dtype=torch.float32, device=q.device)
        bias = bias.masked_fill(~call.allowed, torch.finfo(torch.float32).min)
        kwargs = {n: x for n, x in call.kwargs.items() if n not in ("scaling", "dropout")}
        try:
            want = eager(call.module, q, k, v, bias, scaling=call.scaling, dropout=0.0, **kwargs)[0]
        except Exception:                                # noqa: BLE001 - no comparison possible
            self.eager_checked = False
            return
        got = z.transpose(1, 2)
        if want.shape != got.shape:
            want = want.reshape(got.shape) if want.numel() == got.numel() else want
        diff = float((want.float() - got).abs().max()) if want.shape == got.shape else float("inf")
        if not diff <= 1e-4 * max(1.0, float(got.abs().max())):
            raise Unsupported(f"{type(call.module).__name__}: attngeom's attention differs from "
                              f"the model's own eager attention (max difference {diff:.2g}); "
                              "its attention has a feature attngeom does not reproduce")


def _hook_outputs(model: nn.Module, probe: _Probe) -> list:
    """Forward hooks finding, for each attention call, the linear layer that receives its
    output unchanged, its output, and the first module that receives that output."""
    names = {id(m): n for n, m in model.named_modules()}
    handles = []

    def pre(module, args, kwargs):
        x = args[0] if args else next(iter(kwargs.values()), None)
        if not torch.is_tensor(x):
            return
        leaf = next(module.children(), None) is None
        for rec in reversed(probe.calls):
            if rec["out"] is None and _same(x, rec["z"]):
                if _linear_weight(module) is not None:
                    rec["out"], rec["out_name"] = module, names.get(id(module), "?")
                elif leaf and rec.get("first") is None:
                    rec["first"] = (names.get(id(module), "?"), type(module).__name__)
                return
            if leaf and rec["after"] is None and rec.get("y") is not None and _same(x, rec["y"]):
                rec["after"] = (names.get(id(module), "?"), type(module).__name__)
                return

    def post(module, args, output):
        for rec in probe.calls:
            if rec["out"] is module and rec.get("y") is None and torch.is_tensor(output):
                rec["y"] = output.detach().clone()

    for module in model.modules():
        handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        if _linear_weight(module) is not None:
            handles.append(module.register_forward_hook(post))
    return handles


def _same(x: torch.Tensor, z: torch.Tensor) -> bool:
    return x.numel() == z.numel() and x.shape[-1] == z.shape[-1] and torch.equal(
        x.reshape(z.shape), z)


def discover(model: nn.Module) -> Architecture:
    """The model's self-attention layers, found once per model (cached) by the probe pass."""
    found = _FOUND.get(model)
    if found is None:
        found = _discover(model)
        _FOUND[model] = found
    return found


def _discover(model: nn.Module) -> Architecture:
    cfg = model.config
    label = getattr(cfg, "model_type", type(model).__name__)
    if "decoder_input_ids" in inspect.signature(model.forward).parameters:
        raise Unsupported(f"'{label}' is an encoder-decoder model (cross-attention); attngeom "
                          "measures one stack of self-attention layers")
    kind = input_kind(model)
    inputs = probe_inputs(model, kind)
    probe = _Probe()
    handles = _hook_outputs(model, probe)
    try:
        with torch.inference_mode(), attention_handler(model, probe):
            run_trunk(model, inputs)
    finally:
        for h in handles:
            h.remove()
    if not probe.calls:
        raise Unsupported(f"'{label}' computes attention without transformers' attention "
                          "interface (no layer called it), so attngeom cannot hook it")
    layers = tuple(_layer(model, rec, probe.calls) for rec in probe.calls)
    _check_uniform(label, layers)
    causal = {layer.causal for layer in layers}
    if len(causal) > 1:
        raise Unsupported(f"'{label}' mixes causal and bidirectional attention layers; the store "
                          "records one causality")
    return Architecture(layers=layers, inputs=kind, causal=causal.pop(),
                        notes=notes(model, layers, probe.calls, kind),
                        eager_checked=probe.eager_checked)


def _layer(model: nn.Module, rec: dict, calls: list[dict]) -> Layer:
    call: Call = rec["call"]
    module = call.module
    name = type(module).__name__
    if rec["out"] is None:
        if sum(r["call"].module is module for r in calls) > 1:
            raise Unsupported(f"{name} calls attention {sum(r['call'].module is module for r in calls)}"
                              " times and combines the outputs before W_O (as differential "
                              "attention does); one head output per head cannot be decomposed")
        first = rec.get("first")
        where = (f"goes through {first[0]} ({first[1]})" if first else
                 "is changed (e.g. by an output gate or a mixture of heads)")
        raise Unsupported(f"{name}: the attention output {where} before any linear layer "
                          "receives it, so no output projection W_O sees it unchanged; "
                          "not decomposable exactly")
    out = rec["out"]
    weight = _linear_weight(out)
    H, G, dh, dv = call.query.shape[1], call.key.shape[1], call.query.shape[-1], call.value.shape[-1]
    if weight.shape[0] != H * dv:
        raise Unsupported(f"{rec['out_name']} takes {weight.shape[0]} inputs, not heads x value "
                          f"dim = {H} x {dv}; not an output projection attngeom can split")
    _check_projection(rec, weight)
    allowed = call.allowed[0, 0]
    if allowed.all():
        causal = False
    elif bool(allowed.tril().eq(allowed).all()) and bool(allowed.diagonal().all()):
        causal = True
    else:
        raise Unsupported(f"{name}: the probe's attention mask is neither causal nor full")
    return Layer(module=module, name=_name(model, module), out=out, out_name=rec["out_name"],
                 weight=weight, has_bias=getattr(out, "bias", None) is not None,
                 n_heads=H, n_kv_heads=G, head_dim=dh, value_dim=dv, causal=causal,
                 scaling=float(call.scaling), learned_sinks=call.sinks is not None,
                 softcap=call.softcap is not None,
                 window=call.kwargs.get("sliding_window") is not None)


def _check_projection(rec: dict, weight: torch.Tensor) -> None:
    """z @ W_O + b must be the projection's real output on the probe."""
    y, z = rec.get("y"), rec["z"]
    bias = getattr(rec["out"], "bias", None)
    want = z.float() @ weight.detach().float()
    if bias is not None:
        want = want + bias.detach().float()
    tol = 1e-4 if weight.dtype == torch.float32 else 3e-2
    if y is None or y.shape != want.shape or not float((y.float() - want).abs().max()) <= \
            tol * max(1.0, float(want.abs().max())):
        raise Unsupported(f"{rec['out_name']} ({type(rec['out']).__name__}) receives the attention "
                          "output but does not compute z @ W_O + b from its weight; not a plain "
                          "linear output projection")


def _check_uniform(label: str, layers: tuple[Layer, ...]) -> None:
    heads = sorted({(layer.n_heads, layer.n_kv_heads) for layer in layers})
    if len(heads) > 1:
        raise Unsupported(f"'{label}' has layers with different head counts "
                          f"({', '.join(f'{h} query/{g} kv' for h, g in heads)}); the store's "
                          "single head dimension cannot hold them")


def _name(model: nn.Module, module: nn.Module) -> str:
    return next((n for n, m in model.named_modules() if m is module), type(module).__name__)


def notes(model: nn.Module, layers: tuple[Layer, ...], calls: list[dict], kind: str) -> tuple:
    """Short descriptions of what the measurement handles for this model (coverage table)."""
    first = layers[0]
    out = []
    if kind == "image":
        out.append("vision")
    elif not first.causal:
        out.append("encoder")
    if first.n_kv_heads == 1 < first.n_heads:
        out.append("MQA")
    elif first.n_kv_heads < first.n_heads:
        out.append("GQA")
    if any(layer.value_dim != layer.head_dim for layer in layers):
        out.append("MLA (value head dim differs)")
    if any(layer.learned_sinks for layer in layers):
        out.append("learned sinks")
    if any(layer.softcap for layer in layers):
        out.append("soft-capping")
    if any(layer.window for layer in layers):
        out.append("sliding window")
    types = set(getattr(model.config, "layer_types", None) or ())
    if len(types) > 1:
        out.append("per-layer types")
    if any(abs(layer.scaling - layer.head_dim ** -0.5) > 1e-6 for layer in layers):
        out.append("scaled logits")
    if any(_has_child(layer.module, ("q_norm", "k_norm", "q_layernorm", "k_layernorm"))
           for layer in layers):
        out.append("q/k norm")
    if any(not layer.out_name.startswith(layer.name + ".") for layer in layers):
        out.append("W_O outside attention")
    if any(rec.get("after") and "norm" in rec["after"][1].lower() for rec in calls):
        out.append("norm after W_O")
    if len({id(layer.module) for layer in layers}) < len(layers):
        out.append("shared layers")
    if first.has_bias:
        out.append("output bias")
    return tuple(out)


def _has_child(module: nn.Module, names: tuple[str, ...]) -> bool:
    return any(getattr(module, n, None) is not None for n in names)


def attention_layers(model: nn.Module) -> list[Layer]:
    """The model's self-attention layers in call (= layer) order, W_O included."""
    return list(discover(model).layers)


def is_causal(model: nn.Module) -> bool:
    return discover(model).causal


def decoder_stack(model: nn.Module) -> tuple[nn.Module, str, nn.ModuleList] | None:
    """(owner, attribute, layers): the ModuleList whose i-th element contains the model's i-th
    attention layer, or None when there is no such list (shared layers, encoders' wrappers)."""
    found = [layer.module for layer in attention_layers(model)]
    for owner in model.modules():
        for name, child in owner.named_children():
            if not isinstance(child, nn.ModuleList) or len(child) != len(found):
                continue
            if all(any(m is a for m in block.modules()) for block, a in zip(child, found)):
                return owner, name, child
    return None
