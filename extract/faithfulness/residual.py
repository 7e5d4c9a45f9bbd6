"""What surrounds each attention layer: the residual stream it adds to and the normalisations.

ALTI (Ferrando et al. 2022) and the norm-based method with residual (Kobayashi et al. 2021)
decompose the attention *block*'s output into one vector per key:
``T_i(x_j) = Lr_i( La_i(sum_h alpha_ij^h v~_j^h) + [i = j] x_i )`` (the biases apart), with x
the block's residual input, ``La_i`` the linearised normalisation of the attention output where
one follows W_O (Gemma 2/3, OLMo 2) and ``Lr_i`` that of the residual sum where one follows the
add (post-LN encoders such as BERT); each is the identity where there is none (pre-LN decoders:
Llama, Qwen, SmolLM2). A normalisation ``N(y) = gamma * P(y) / s(y) + beta`` (P centres y for a
LayerNorm, is the identity for an RMSNorm) is linearised at the vector it normalises, as in the
paper: ``L_i(u) = gamma * P(u) / s(y_i)``.

Nothing is keyed on ``model_type``: one probe forward pass (two tokens) finds, for each
attention layer (:func:`~..measurement.archs.attention_layers`), the block whose input is the
residual stream (:func:`~.resume.decoder_stack`), the module that receives W_O's output and the
one that receives ``x + attention``; a module is a normalisation when probing it in float64
shows that form (:func:`as_norm`), and the probe checks that the pieces rebuild the block's own
vectors. :func:`residual_structure` refuses, in one line, a model where they do not.
"""

from __future__ import annotations

import copy
import weakref
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attngeom.common.errors import Refusal

from ..measurement.archs import Layer, attention_layers, decoder_stack
from .taps import BlockHooks, first_tensor, per_model, probe_pass

SCALE = 1e4                 # probe vectors this large make a norm's epsilon negligible


@dataclass(frozen=True)
class Norm:
    """A normalisation ``gamma * P(y) / s(y) + beta`` of the last dimension (see module doc)."""

    module: nn.Module
    centered: bool                  # P subtracts the mean (LayerNorm); else identity (RMSNorm)
    gamma: Tensor                   # (d,) float64
    beta: Tensor                    # (d,) float64
    eps: float | None = None        # s(y) = sqrt(mean(P(y)^2) + eps), when the module's own

    def center(self, u: Tensor) -> Tensor:
        return u - u.mean(-1, keepdim=True) if self.centered else u

    def scale(self, y: Tensor) -> Tensor:
        """s(y) (...,) of the vectors y the module normalises, in y's dtype: sqrt(mean(P(y)^2)
        + eps) where the module's epsilon was found (and checked), else read from the module's
        output: <g, g> / <g, N(y) - beta> with g = gamma * P(y) (float64: the module run on a
        float64 copy, which may compute in float32 inside, as Gemma's RMSNorm does)."""
        if self.eps is not None:
            return (self.center(y).square().mean(-1) + self.eps).sqrt()
        module = self.module if y.dtype != torch.float64 else float64_copy(self.module)
        g = self.gamma.to(y) * self.center(y)
        out = module(y) - self.beta.to(y)
        return (g * g).sum(-1) / (g * out).sum(-1)

    def linear(self, u: Tensor, scale: Tensor) -> Tensor:
        """``gamma * P(u) / s``: u (..., d) with s broadcastable to u's leading dims."""
        return self.gamma.to(u) * self.center(u) / scale[..., None]


@dataclass(frozen=True)
class Residual:
    """What follows one attention layer: the block whose input x is the residual stream, the
    normalisation of the attention output before the add, of the sum after it (or None)."""

    block: nn.Module
    after_attention: Norm | None
    after_residual: Norm | None
    bias: Tensor | None             # W_O's bias b_O (d,), or None


_F64: "weakref.WeakKeyDictionary[nn.Module, nn.Module]" = weakref.WeakKeyDictionary()
_FOUND: "weakref.WeakKeyDictionary[nn.Module, tuple[Residual, ...]]" = weakref.WeakKeyDictionary()


def float64_copy(module: nn.Module) -> nn.Module:
    """A float64 copy of a (small) normalisation module, made once."""
    return per_model(_F64, module, lambda m: copy.deepcopy(m).double().eval())


def _snap(gamma: Tensor, module: nn.Module) -> Tensor:
    """gamma exactly, where probing computed it to the module's internal precision only:
    ``weight`` or ``1 + weight`` (Gemma's RMSNorm) when either is within float32 rounding."""
    w = getattr(module, "weight", None)
    if not isinstance(w, Tensor) or w.shape != gamma.shape:
        return gamma
    for candidate in (w.detach().double(), 1.0 + w.detach().double()):
        if torch.allclose(gamma, candidate, rtol=1e-5, atol=1e-6):
            return candidate
    return gamma


@torch.no_grad()
def as_norm(module: nn.Module, d: int) -> Norm | None:
    """The module as a :class:`Norm` of vectors of size ``d``, or None when it is not one
    (probed on a float64 copy: N(7 y) = N(y); beta = N(0); centred when N(y + c) = N(y);
    gamma from a large +-1 vector; then N(y) = gamma P(y) / s + beta checked on random
    vectors)."""
    try:
        m = float64_copy(module)
        zero = torch.zeros(1, d, dtype=torch.float64)
        beta = m(zero)[0]
        y = torch.randn(4, d, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
        if m(y).shape != y.shape:
            return None
        if not torch.allclose(m(7.0 * y), m(y), rtol=1e-4, atol=1e-5):
            return None                              # not scale-invariant: no normalisation
        centered = bool(torch.allclose(m(y + 3.0), m(y), rtol=1e-4, atol=1e-5))
        u = torch.ones(d, dtype=torch.float64)
        u[1::2] = -1.0
        pu = u - u.mean() if centered else u
        gamma = (m(SCALE * u[None])[0] - beta) * pu.square().mean().sqrt() / pu
        norm = Norm(module, centered, _snap(gamma, module), beta)
        g = norm.gamma * norm.center(y)
        s = (g * g).sum(-1) / (g * (m(y) - beta)).sum(-1)
        rebuilt = g / s[:, None] + beta
    except (RuntimeError, TypeError, ValueError, IndexError, ZeroDivisionError):
        return None
    ok = torch.allclose(rebuilt, m(y), rtol=1e-4, atol=1e-5 * float(m(y).abs().max()))
    if not ok or not bool(torch.isfinite(gamma).all()):
        return None
    return Norm(module, centered, norm.gamma, beta, _epsilon(module, norm, m))


def _epsilon(module: nn.Module, norm: Norm, m: nn.Module) -> float | None:
    """The module's epsilon (an attribute ``eps``, ``variance_epsilon`` or ``epsilon``) when
    sqrt(mean(P(y)^2) + eps) is its scale on small vectors, where eps matters; else None."""
    for name in ("eps", "variance_epsilon", "epsilon"):
        eps = getattr(module, name, None)
        if isinstance(eps, (int, float)) and eps >= 0:
            y = torch.randn(3, len(norm.gamma), dtype=torch.float64,
                            generator=torch.Generator().manual_seed(1))
            y = y * (max(eps, 1e-12) ** 0.5 / y.square().mean(-1, keepdim=True).sqrt())
            want = norm.gamma * norm.center(y) / (norm.center(y).square().mean(-1, keepdim=True)
                                                  + eps).sqrt() + norm.beta
            if torch.allclose(m(y), want, rtol=1e-4, atol=1e-6 * float(want.abs().max())):
                return float(eps)
    return None


@torch.no_grad()
def _probe(model: nn.Module, layers: list[Layer], blocks) -> list[dict]:
    """One forward pass recording, per layer: x, the attention module's input, W_O's output,
    and every leaf module's first input (in call order) inside the block."""
    rec = [{"inputs": []} for _ in layers]
    where = {}
    for n, (layer, block) in enumerate(zip(layers, blocks)):
        where[id(block)] = (n, "x")
        where[id(layer.module)] = (n, "attention_input")
    handles = []

    def pre(module, args, kwargs):
        n, key = where[id(module)]
        rec[n].setdefault(key, first_tensor(args, kwargs))

    def out(n):
        return lambda module, args, output: rec[n].setdefault("o", output.detach().clone())

    def leaf(n):
        def hook(module, args, kwargs):
            x = first_tensor(args, kwargs)
            if x is not None:
                rec[n]["inputs"].append((module, x.detach().clone()))
        return hook

    for n, (layer, block) in enumerate(zip(layers, blocks)):
        handles.append(block.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(layer.module.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(layer.out.register_forward_hook(out(n)))
        for m in block.modules():
            if next(m.children(), None) is None and m is not layer.out:
                handles.append(m.register_forward_pre_hook(leaf(n), with_kwargs=True))
    probe_pass(model, handles)
    return rec


def _receiver(rec: dict, value: Tensor, after: nn.Module | None = None):
    """The first leaf module whose input equals ``value`` (after ``after``'s turn)."""
    seen = after is None
    for module, x in rec["inputs"]:
        if not seen:
            seen = module is after
            continue
        if x.shape == value.shape and torch.allclose(x.float(), value.float(), rtol=1e-5,
                                                     atol=1e-6 * float(value.abs().max())):
            return module, x
    return None, None


@torch.no_grad()
def _structure(model: nn.Module) -> tuple[Residual, ...]:
    layers = attention_layers(model)
    stack = decoder_stack(model)
    label = getattr(model.config, "model_type", type(model).__name__)
    if stack is None:
        raise Refusal(f"'{label}': no list of blocks holds one attention layer each (shared "
                      "or nested layers), so the residual stream of a layer cannot be found; "
                      "ALTI and the norm-based method need it (use another metric)")
    out = []
    for layer, rec in zip(layers, _probe(model, layers, stack[2])):
        x, o = rec.get("x"), rec.get("o")
        if x is None or o is None or x.shape != o.shape:
            raise Refusal(f"'{label}' {layer.name}: the block's input and W_O's output differ "
                          "in shape; ALTI and the norm-based method need them added (use "
                          "another metric)")
        d = x.shape[-1]
        first, _ = _receiver(rec, o)
        after_attention = as_norm(first, d) if first is not None else None
        o2 = after_attention.module(o) if after_attention is not None else o
        receiver, _ = _receiver(rec, x + o2, first if after_attention is not None else None)
        reads_stream = torch.equal(rec.get("attention_input"), x)
        after_residual = (as_norm(receiver, d) if receiver is not None and reads_stream
                          else None)
        if receiver is None and reads_stream:
            raise Refusal(f"'{label}' {layer.name}: no module receives the residual sum x + "
                          "attention, so the block's output cannot be decomposed; ALTI and "
                          "the norm-based method are not available for it")
        bias = getattr(layer.out, "bias", None)
        out.append(Residual(stack[2][len(out)], after_attention, after_residual,
                            None if bias is None else bias.detach()))
    return tuple(out)


def residual_structure(model: nn.Module) -> tuple[Residual, ...]:
    """Each attention layer's :class:`Residual`, found once per model (cached)."""
    return per_model(_FOUND, model, _structure)


class ResidualTap(BlockHooks):
    """Keeps the residual input x (B, T, d) of each block during a forward pass."""

    def __init__(self, model: nn.Module):
        super().__init__(residual_structure(model))
        self.x: dict[int, Tensor] = {}

    def keep(self, layer: int, args: tuple, kwargs: dict) -> None:
        self.x[layer] = first_tensor(args, kwargs)
