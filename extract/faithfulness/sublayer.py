"""What follows each attention layer in its block, run by the model's own modules on chosen rows.

Value zeroing (Mohebbi et al. 2023, :mod:`.zeroing`) compares a layer's output at query i
computed normally with the output when key j's values are zeroed. Zeroing v_j changes only the
head outputs at i, ``z_i^h - alpha_ij^h v_j^h`` (alpha is unchanged: no renormalisation), and
everything after the attention output is per position (W_O, the residual add, the
normalisations, the MLP): the block's output at i is a function ``f(x_i, z_i)`` of its input
x_i (d,) and the head outputs z_i (H dv,) alone. So each (i, j) needs one *row* of the block's
post-attention sublayer, not a rerun of the layer.

:class:`Sublayer` runs f with the model's own modules: the block's ``forward`` on the rows
(1, N, d), its attention module answering for the call (``forward`` replaced) with W_O of the
rows (W_O inside the attention module: Llama, Gemma, Qwen) or with the rows themselves (W_O
after it: BERT's ``BertSelfOutput``); the block's other arguments are those of its current call
(masks and position embeddings only reach the attention module, which does not read them).

Nothing is keyed on ``model_type``. One probe forward pass (:func:`sublayer_structure`) finds
the block of each attention layer (:func:`~.resume.decoder_stack`), records its input, its
arguments, its output and W_O's input, and checks that the rerun rebuilds the block's output,
with the rows in reverse order too (a module mixing positions after the attention would not);
a model where it does not is refused in one line.

The float64 definition runs a float64 copy of the block (:func:`float64_block`), its
normalisations replaced by their float64 formula with their own epsilon
(:func:`~.residual.as_norm`): transformers' RMSNorms compute in float32 inside; its linear layers
by :class:`RowLinear` (a row's bits whatever rows run with it).
"""

from __future__ import annotations

import copy
import time
import weakref
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from attngeom.common.errors import Refusal

from ..measurement.archs import attention_layers, decoder_stack
from .base import rowmm
from .residual import Norm, as_norm
from .taps import BlockHooks, first_tensor, per_model, probe_pass

CHUNK_BYTES = 64 << 20          # the working memory of one call of the sublayer on rows


@dataclass(frozen=True, eq=False)
class Sublayer:
    """One block's post-attention sublayer (see the module docstring).

    ``attention``, ``out``: the paths of the attention module and of W_O in ``block``;
    ``inside``: W_O is inside the attention module (the module returns W_O's output);
    ``returns``: 0 when the attention module returns a tensor, else the length of the tuple
    it returns (the output first); ``norms``: the block's normalisations outside the attention
    module whose epsilon was found, by path; ``d``, ``width``: the sizes of x and of z (H dv);
    ``row_elements``: working memory of one row, in elements; ``probe_call``: the block's
    arguments in the probe pass (what :func:`rows_per_second` times).
    """

    block: nn.Module
    attention: str
    out: str
    inside: bool
    returns: int
    norms: tuple[tuple[str, Norm], ...]
    d: int
    width: int
    row_elements: int
    probe_call: tuple = field(default=((), {}), repr=False)

    def run(self, call: tuple, x: Tensor, z: Tensor, block: nn.Module | None = None) -> Tensor:
        """The block's output (N, d) at rows x (N, d), z (N, H dv), in ``block`` (default: the
        model's own; :func:`float64_block` for the definition) with the arguments ``call``."""
        block = self.block if block is None else block
        attention = block.get_submodule(self.attention)
        m = (block.get_submodule(self.out)(z) if self.inside else z)[None]       # (1, N, .)
        answer = m if self.returns == 0 else (m,) + (None,) * (self.returns - 1)
        args, kwargs = call
        if "hidden_states" in kwargs or not args:
            kwargs = {**kwargs, "hidden_states": x[None]}
        else:
            args = (x[None],) + tuple(args[1:])
        before = attention.__dict__.get("forward")                # an instance's own forward
        attention.forward = lambda *a, **k: answer
        try:
            y = block.forward(*args, **kwargs)
        finally:
            if before is None:
                del attention.forward
            else:
                attention.forward = before
        y = y[0] if isinstance(y, (tuple, list)) else y
        return y.reshape(x.shape[0], -1)

    def chunk(self, dtype: torch.dtype) -> int:
        """Rows per call within :data:`CHUNK_BYTES`."""
        size = torch.empty((), dtype=dtype).element_size()
        return max(16, CHUNK_BYTES // (self.row_elements * size))


class ExactNorm(nn.Module):
    """A normalisation as its formula ``gamma P(y) / sqrt(mean(P(y)^2) + eps) + beta`` in the
    input's dtype (float64 in :func:`float64_block`)."""

    def __init__(self, norm: Norm):
        super().__init__()
        self.norm = norm

    def forward(self, y: Tensor) -> Tensor:
        n = self.norm
        return n.gamma.to(y) * n.center(y) / n.scale(y)[..., None] + n.beta.to(y)


class RowLinear(nn.Module):
    """A float64 linear layer (``nn.Linear``, or transformers' ``Conv1D``, which holds W as
    (in, out)) as ``x W + b`` by :func:`~.base.rowmm`: a row's bits do not depend on the rows
    computed with it (``F.linear``'s one BLAS product gives them other bits with another
    number of rows). ``weight`` stays the module's own, for code that reads it."""

    ROWS = 96        # rows per block: every block packs W (d x 4 d for an MLP) anew

    def __init__(self, linear: nn.Module):
        super().__init__()
        self.weight, self.bias = linear.weight, linear.bias
        xw = linear.weight.T if isinstance(linear, nn.Linear) else linear.weight
        self.register_buffer("xw", xw.detach().contiguous(), persistent=False)  # (in, out)

    def forward(self, x: Tensor) -> Tensor:
        y = rowmm(x.reshape(-1, x.shape[-1]), self.xw, self.ROWS).reshape(*x.shape[:-1], -1)
        return y if self.bias is None else y + self.bias


_F64: dict[str, tuple] = {}            # "last": (weakref to a block, its float64 copy)


def float64_block(sub: Sublayer) -> nn.Module:
    """A float64 copy of the sublayer's block with exact normalisations and row-stable linear
    layers (:class:`RowLinear`) (one kept: the last)."""
    held = _F64.get("last")
    if held is not None and held[0]() is sub.block:
        return held[1]
    _F64.pop("last", None)
    block = copy.deepcopy(sub.block).double().eval()
    for path, norm in sub.norms:
        _replace(block, path, ExactNorm(norm))
    for path, m in list(block.named_modules()):
        if isinstance(m, nn.Linear) or type(m).__name__ == "Conv1D":
            _replace(block, path, RowLinear(m))
    _F64["last"] = (weakref.ref(sub.block), block)
    return block


def _replace(block: nn.Module, path: str, module: nn.Module) -> None:
    owner, _, name = path.rpartition(".")
    setattr(block.get_submodule(owner) if owner else block, name, module)


# ------------------------------------------------------------------------------ discovery
_FOUND: "weakref.WeakKeyDictionary[nn.Module, tuple[Sublayer, ...]]" = \
    weakref.WeakKeyDictionary()


def sublayer_structure(model: nn.Module) -> tuple[Sublayer, ...]:
    """Each attention layer's :class:`Sublayer`, found and checked once per model (cached)."""
    return per_model(_FOUND, model, _structure)


@torch.no_grad()
def _probe(model: nn.Module, layers, blocks) -> list[dict]:
    """One forward pass recording per layer: the block's arguments and output, W_O's input
    and what the attention module returns."""
    rec = [{} for _ in layers]
    handles = []

    def keep(n, key, value):
        rec[n].setdefault(key, value)

    for n, (layer, block) in enumerate(zip(layers, blocks)):
        handles += [
            block.register_forward_pre_hook(
                lambda m, a, k, n=n: keep(n, "call", (a, k)), with_kwargs=True),
            block.register_forward_hook(lambda m, a, y, n=n: keep(
                n, "y", (y[0] if isinstance(y, (tuple, list)) else y).detach().clone())),
            layer.out.register_forward_pre_hook(
                lambda m, a, n=n: keep(n, "z", a[0].detach().clone())),
            layer.module.register_forward_hook(lambda m, a, y, n=n: keep(
                n, "returns", len(y) if isinstance(y, (tuple, list)) else 0))]
    probe_pass(model, handles)
    return rec


def _norms(block: nn.Module, attention: str) -> tuple[tuple[str, Norm], ...]:
    """The block's leaf normalisations outside the attention module whose epsilon was found."""
    found = []
    for path, m in block.named_modules():
        w = getattr(m, "weight", None)
        if next(m.children(), None) is not None or path.startswith(attention + ".") or \
                not isinstance(w, Tensor) or w.dim() != 1:
            continue
        norm = as_norm(m, w.numel())
        if norm is not None and norm.eps is not None:
            found.append((path, norm))
    return tuple(found)


def _row_elements(block: nn.Module, d: int, width: int) -> int:
    """Elements one row holds at once, about: x, z, and every linear layer's output twice."""
    outs = sum(m.out_features if isinstance(m, nn.Linear) else m.weight.shape[-1]
               for m in block.modules()
               if isinstance(m, nn.Linear) or type(m).__name__ == "Conv1D")
    return 4 * d + 2 * width + 2 * outs


@torch.no_grad()
def _structure(model: nn.Module) -> tuple[Sublayer, ...]:
    label = getattr(model.config, "model_type", type(model).__name__)
    layers, stack = attention_layers(model), decoder_stack(model)
    if stack is None:
        raise Refusal(f"'{label}': no list of blocks holds one attention layer each (shared or "
                      "nested layers), so the rest of a layer cannot be rerun; value zeroing "
                      "needs it (use another metric)")
    out = []
    for layer, block, rec in zip(layers, stack[2], _probe(model, layers, stack[2])):
        paths = {id(m): p for p, m in block.named_modules()}
        if id(layer.module) not in paths or id(layer.out) not in paths or "z" not in rec:
            raise Refusal(f"'{label}' {layer.name}: its attention module or W_O lies outside "
                          "its block; value zeroing cannot rerun the block (use another metric)")
        attention = paths[id(layer.module)]
        inside = any(m is layer.out for m in layer.module.modules())
        x, z, y = first_tensor(*rec["call"]), rec["z"], rec["y"]
        d, width = x.shape[-1], z.shape[-1]
        sub = Sublayer(block, attention, paths[id(layer.out)], inside, rec.get("returns", 0),
                       _norms(block, attention), d, width, _row_elements(block, d, width),
                       rec["call"])
        _check(label, layer.name, sub, x.reshape(-1, d), z.reshape(-1, width),
               y.reshape(-1, y.shape[-1]))
        out.append(sub)
    return tuple(out)


def _check(label: str, name: str, sub: Sublayer, x: Tensor, z: Tensor, y: Tensor) -> None:
    """Refuse unless the rerun rebuilds the block's output y, rows in order and reversed."""
    tol = 64 * torch.finfo(y.dtype).eps * max(1.0, float(y.abs().max()))
    back = torch.arange(len(x) - 1, -1, -1)
    try:
        got = sub.run(sub.probe_call, x, z)
        rev = sub.run(sub.probe_call, x[back], z[back])[back]
        ok = got.shape == y.shape and all(float((g - y).abs().max()) <= tol for g in (got, rev))
    except (RuntimeError, TypeError, ValueError, IndexError, AttributeError):
        ok = False
    if not ok:
        raise Refusal(f"'{label}' {name}: the block's output is not a function of each "
                      "position's input and attention output that its modules recompute row by "
                      "row, so value zeroing cannot rerun it (use another metric)")


# ------------------------------------------------------------------------------ passes
class SublayerCall:
    """A layer's sublayer during one forward pass: the block's current input and arguments."""

    def __init__(self, sub: Sublayer, call: tuple):
        self.sub, self.call = sub, call
        self.x = first_tensor(*call)                                     # (B, T, d)

    def outputs(self, x: Tensor, z: Tensor) -> Tensor:
        """The block's outputs (N, d) at rows x (N, d), z (N, H dv), in the model's dtype."""
        dtype = self.x.dtype
        return self.sub.run(self.call, x.to(dtype), z.to(dtype))

    def outputs64(self, x: Tensor, z: Tensor) -> Tensor:
        """The same in float64 (:func:`float64_block`), each row's bits the same however many
        rows are computed together: the float64 block's linear layers are
        :func:`~.base.rowmm` products, so a near row's float64 scores do not depend on which
        other rows are decided with it."""
        return self.sub.run(self.call, x.double(), z.double(), float64_block(self.sub))


class BlockTap(BlockHooks):
    """Keeps each block's input and arguments during a forward pass (a context manager)."""

    def __init__(self, model: nn.Module):
        super().__init__(sublayer_structure(model))
        self.calls: dict[int, tuple] = {}

    def keep(self, layer: int, args: tuple, kwargs: dict) -> None:
        self.calls[layer] = (args, kwargs)

    def at(self, layer: int) -> SublayerCall:
        return SublayerCall(self.structure[layer], self.calls[layer])


@torch.no_grad()
def rows_per_second(model: nn.Module, float64: bool = False, rows: int = 512) -> float:
    """Rows of layer 0's sublayer computed per second here (the model's dtype, or the float64
    definition): the best of three timed calls on random rows, after one untimed."""
    sub = sublayer_structure(model)[0]
    p = next(sub.block.parameters())
    dtype = torch.float64 if float64 else p.dtype
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(rows, sub.d, generator=gen).to(p.device, dtype)
    z = torch.randn(rows, sub.width, generator=gen).to(p.device, dtype)
    block = float64_block(sub) if float64 else None
    best = float("inf")
    for n in range(4):
        t0 = time.perf_counter()
        sub.run(sub.probe_call, x, z, block)
        if p.device.type == "cuda":
            torch.cuda.synchronize(p.device)
        best = best if n == 0 else min(best, time.perf_counter() - t0)
    return rows / max(best, 1e-9)
