"""Independent naive reference for every quantity in MISSION.md's table.

Written the slow, obvious way and on purpose sharing no code with attngeom: run the model with
eager attention, read alpha from each attention module's own output, capture each attention
module's input x with a pre-hook, rebuild v = x W_V + b_V from the module's weights, project every
(head, key) value into model space (ṽ_j^h = v_j^{g(h)} W_O^h) and do all the geometry in float64
numpy on those model-space vectors.

Layouts handled (checked against each module's real output in test_reference.py):
- llama / mistral / qwen2 / qwen3 / gemma3 / vit: ``v_proj`` and ``o_proj`` (nn.Linear,
  weight (out, in)); W_O^h = ``o_proj.weight[:, h*dh:(h+1)*dh].T``; head h reads kv head h // (H/G).
- gpt2: Conv1D ``c_attn`` (weight (in, 3d), columns q | k | v) and ``c_proj`` (weight (in, out)).
- bert: ``BertAttention.self.value`` and ``BertAttention.output.dense`` (the LayerNorm and the
  residual inside ``BertSelfOutput`` come after the attention output and are not part of it).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch

NAMES = ("alpha", "cosine", "cosine_layer", "contribution", "contribution_layer", "value_norm",
         "sink_value_cosine", "output_norm", "residual_norm", "sink_residual_cosine",
         "head_share", "layer_output_norm")


@dataclass
class LayerCapture:
    """What one attention layer saw and did, as float64 numpy (batch first)."""

    alpha: np.ndarray          # (B, H, T, T) raw eager probabilities, masks included
    x: np.ndarray              # (B, T, d) attention input
    w_v: np.ndarray            # (d, G*dh)
    b_v: np.ndarray            # (G*dh,)
    w_o: np.ndarray            # (H*dh, d)
    b_o: np.ndarray | None     # (d,) or None
    module_output: np.ndarray  # (B, T, d) the output projection's real output (b_O included)
    causal: bool
    window: int | None         # key j visible to query i iff i - window < j (when not None)


def _f64(t: torch.Tensor | None) -> np.ndarray | None:
    return None if t is None else t.detach().to(torch.float64).cpu().numpy()


def _attention_modules(model: torch.nn.Module) -> list[tuple[torch.nn.Module, dict]]:
    """Find attention modules in layer order; return (module, projections) pairs."""
    found = []
    for mod in model.modules():
        name = type(mod).__name__
        if not name.endswith("Attention"):
            continue
        if hasattr(mod, "v_proj") and hasattr(mod, "o_proj"):  # llama-like and vit
            w_v, b_v = mod.v_proj.weight.T, mod.v_proj.bias
            out = mod.o_proj
            w_o, b_o = out.weight.T, out.bias
            causal = bool(getattr(mod, "is_causal", False))
            if hasattr(mod, "sliding_window"):
                window = mod.sliding_window
            else:  # mistral passes config.sliding_window to every layer
                window = getattr(model.config, "sliding_window", None)
        elif hasattr(mod, "c_attn") and hasattr(mod, "c_proj"):  # gpt2, Conv1D (in, out)
            d = mod.c_attn.weight.shape[0]
            w_v, b_v = mod.c_attn.weight[:, 2 * d:3 * d], mod.c_attn.bias[2 * d:3 * d]
            out = mod.c_proj
            w_o, b_o = out.weight, out.bias
            causal, window = bool(mod.is_causal), None
        elif hasattr(mod, "self") and hasattr(mod, "output") and hasattr(mod.self, "value"):
            w_v, b_v = mod.self.value.weight.T, mod.self.value.bias  # bert
            out = mod.output.dense
            w_o, b_o = out.weight.T, out.bias
            causal, window = bool(mod.self.is_causal), None
        else:
            continue
        if b_v is None:
            b_v = torch.zeros(w_v.shape[1])
        found.append((mod, dict(w_v=_f64(w_v), b_v=_f64(b_v), w_o=_f64(w_o), b_o=_f64(b_o),
                                out=out, causal=causal, window=window)))
    if not found:
        raise ValueError(f"no attention module recognised in {type(model).__name__}")
    return found


def naive_capture(model: torch.nn.Module, inputs: dict) -> list[LayerCapture]:
    """Run a deep copy of ``model`` with eager attention and capture every attention layer."""
    model = copy.deepcopy(model).eval()
    model.set_attn_implementation("eager")
    layers = _attention_modules(model)
    store: list[dict] = [{} for _ in layers]
    handles = []
    for k, (mod, proj) in enumerate(layers):
        def pre(m, args, kwargs, k=k):
            store[k]["x"] = args[0] if args else kwargs["hidden_states"]

        def post(m, args, output, k=k):
            store[k]["alpha"] = output[1]

        def out_hook(m, args, output, k=k):
            store[k]["module_output"] = output

        handles.append(mod.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(mod.register_forward_hook(post))
        handles.append(proj["out"].register_forward_hook(out_hook))
    try:
        with torch.no_grad():
            model(**inputs, output_attentions=True)
    finally:
        for h in handles:
            h.remove()
    caps = []
    for (mod, proj), got in zip(layers, store):
        if got.get("alpha") is None:
            raise RuntimeError(f"{type(mod).__name__} returned no attention weights under eager")
        caps.append(LayerCapture(alpha=_f64(got["alpha"]), x=_f64(got["x"]),
                                 w_v=proj["w_v"], b_v=proj["b_v"], w_o=proj["w_o"],
                                 b_o=proj["b_o"], module_output=_f64(got["module_output"]),
                                 causal=proj["causal"], window=proj["window"]))
    return caps


def valid_mask(lengths: np.ndarray, T: int, causal: bool, window: int | None) -> np.ndarray:
    """(B, T_query, T_key) bool: query and key inside the sequence, causal and window respected."""
    i = np.arange(T)[:, None]
    j = np.arange(T)[None, :]
    ok = np.ones((T, T), bool)
    if causal:
        ok &= j <= i
    if window is not None:
        ok &= (i - j) < window
        if not causal:
            ok &= (j - i) < window
    inside = np.arange(T)[None, :] < lengths[:, None]  # (B, T)
    return ok[None] & inside[:, :, None] & inside[:, None, :]


def projected_values(cap: LayerCapture, n_heads: int) -> np.ndarray:
    """ṽ_j^h = (x_j W_V + b_V)[kv head g(h)] W_O^h in model space: (B, H, T, d)."""
    B, T, d = cap.x.shape
    dh = cap.w_o.shape[0] // n_heads
    n_kv = cap.w_v.shape[1] // dh
    v = cap.x @ cap.w_v + cap.b_v                      # (B, T, G*dh)
    vt = np.empty((B, n_heads, T, cap.w_o.shape[1]))
    for h in range(n_heads):
        g = h // (n_heads // n_kv)
        v_h = v[:, :, g * dh:(g + 1) * dh]             # (B, T, dh)
        w_o_h = cap.w_o[h * dh:(h + 1) * dh, :]        # (dh, d)
        vt[:, h] = v_h @ w_o_h
    return vt


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine along the last axis with broadcasting; 0/0 gives NaN."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def _layer(cap: LayerCapture, lengths: np.ndarray, sink_k: int) -> dict[str, np.ndarray]:
    B, H, T, _ = cap.alpha.shape
    valid = valid_mask(lengths, T, cap.causal, cap.window)[:, None]       # (B, 1, T, T)
    q_in = (np.arange(T)[None, :] < lengths[:, None])[:, None]            # (B, 1, T)
    a = np.where(valid, cap.alpha, 0.0)                                   # (B, H, T, T)
    vt = projected_values(cap, H)                                         # (B, H, T, d)
    o_h = np.einsum("bhij,bhjd->bhid", a, vt)                             # (B, H, T, d)
    o = o_h.sum(1)                                                        # (B, T, d)
    vj = vt[:, :, None, :, :]                                             # (B, H, 1, Tk, d)
    oi_h = o_h[:, :, :, None, :]                                          # (B, H, Tq, 1, d)
    oi = o[:, None, :, None, :]                                           # (B, 1, Tq, 1, d)
    with np.errstate(invalid="ignore", divide="ignore"):
        contrib = a * (oi_h * vj).sum(-1) / (o_h ** 2).sum(-1)[..., None]
        contrib_layer = a * (oi * vj).sum(-1) / (o ** 2).sum(-1)[:, None, :, None]
        head_share = (o[:, None] * o_h).sum(-1) / (o ** 2).sum(-1)[:, None]
    r_h = o_h - np.einsum("bhij,bhjd->bhid", a[..., :sink_k], vt[:, :, :sink_k])
    nan = np.nan
    out = {
        "alpha": np.where(valid, cap.alpha, nan),
        "cosine": np.where(valid, _cos(oi_h, vj), nan),
        "cosine_layer": np.where(valid, _cos(oi, vj), nan),
        "contribution": np.where(valid, contrib, nan),
        "contribution_layer": np.where(valid, contrib_layer, nan),
        "value_norm": np.where(q_in, np.linalg.norm(vt, axis=-1), nan),
        "sink_value_cosine": np.where(q_in, _cos(vt[:, :, :1], vt), nan),
        "output_norm": np.where(q_in, np.linalg.norm(o_h, axis=-1), nan),
        "residual_norm": np.where(q_in, np.linalg.norm(r_h, axis=-1), nan),
        "sink_residual_cosine": np.where(q_in, _cos(vt[:, :, :1], r_h), nan),
        "head_share": np.where(q_in, head_share, nan),
        "layer_output_norm": np.where(q_in[:, 0], np.linalg.norm(o, axis=-1), nan),
    }
    return out


def sequence_lengths(inputs: dict, T: int) -> np.ndarray:
    """Valid length per sequence from a right-padded ``attention_mask`` (all T without one)."""
    mask = inputs.get("attention_mask")
    if mask is None:
        batch = next(v for v in inputs.values() if torch.is_tensor(v)).shape[0]
        return np.full(batch, T)
    mask = mask.cpu().numpy()
    lengths = mask.sum(1)
    if not all(mask[b, :n].all() for b, n in enumerate(lengths)):
        raise ValueError("the naive reference expects right padding (ones then zeros)")
    return lengths


def naive_measure(model: torch.nn.Module, inputs: dict, sink_k: int = 1) -> dict[str, np.ndarray]:
    """Every MISSION.md quantity, float64, batch first, NaN outside sequence/causal/window.

    Shapes: alpha, cosine, cosine_layer, contribution, contribution_layer (B, L, H, Tq, Tk);
    value_norm, sink_value_cosine (B, L, H, Tk); output_norm, residual_norm,
    sink_residual_cosine, head_share (B, L, H, Tq); layer_output_norm (B, L, Tq).
    ``residual`` is r_i^h = o_i^h - sum_{j<sink_k} alpha_ij ṽ_j^h (zero, so its cosine NaN,
    where the query sees only sink keys). The output bias b_O is left out of o_i.
    """
    caps = naive_capture(model, inputs)
    T = caps[0].alpha.shape[-1]
    lengths = sequence_lengths(inputs, T)
    per_layer = [_layer(c, lengths, sink_k) for c in caps]
    return {name: np.stack([p[name] for p in per_layer], axis=1) for name in NAMES}


def reconstructed_output(cap: LayerCapture) -> np.ndarray:
    """Σ_h Σ_j α_ij ṽ_j^h + b_O from the raw α (no NaN masking): (B, T, d)."""
    vt = projected_values(cap, cap.alpha.shape[1])
    total = np.einsum("bhij,bhjd->bid", cap.alpha, vt)
    return total if cap.b_o is None else total + cap.b_o
