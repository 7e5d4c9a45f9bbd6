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


def valid_mask(tokens: np.ndarray, causal: bool, window: int | None) -> np.ndarray:
    """(B, T_query, T_key) bool: query and key real tokens (``tokens`` (B, T), any padding),
    causal and window respected."""
    T = tokens.shape[1]
    i = np.arange(T)[:, None]
    j = np.arange(T)[None, :]
    ok = np.ones((T, T), bool)
    if causal:
        ok &= j <= i
    if window is not None:
        ok &= (i - j) < window
        if not causal:
            ok &= (j - i) < window
    return ok[None] & tokens[:, :, None] & tokens[:, None, :]


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


def _layer(cap: LayerCapture, tokens: np.ndarray, sink_k: int) -> dict[str, np.ndarray]:
    B, H, T, _ = cap.alpha.shape
    valid = valid_mask(tokens, cap.causal, cap.window)[:, None]           # (B, 1, T, T)
    q_in = tokens[:, None]                                                # (B, 1, T)
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


def token_mask(inputs: dict, T: int) -> np.ndarray:
    """(B, T) bool: the real tokens, from ``attention_mask`` (left, right or no padding); every
    position without one."""
    mask = inputs.get("attention_mask")
    if mask is None:
        batch = next(v for v in inputs.values() if torch.is_tensor(v)).shape[0]
        return np.ones((batch, T), bool)
    return mask.cpu().numpy().astype(bool)


def naive_measure(model: torch.nn.Module, inputs: dict, sink_k: int = 1) -> dict[str, np.ndarray]:
    """Every MISSION.md quantity, float64, batch first, NaN outside the real tokens (any
    padding), the causal mask and the window.

    Shapes: alpha, cosine, cosine_layer, contribution, contribution_layer (B, L, H, Tq, Tk);
    value_norm, sink_value_cosine (B, L, H, Tk); output_norm, residual_norm,
    sink_residual_cosine, head_share (B, L, H, Tq); layer_output_norm (B, L, Tq).
    ``residual`` is r_i^h = o_i^h - sum_{j<sink_k} alpha_ij ṽ_j^h (zero, so its cosine NaN,
    where the query sees only sink keys). The output bias b_O is left out of o_i.
    """
    caps = naive_capture(model, inputs)
    tokens = token_mask(inputs, caps[0].alpha.shape[-1])
    per_layer = [_layer(c, tokens, sink_k) for c in caps]
    return {name: np.stack([p[name] for p in per_layer], axis=1) for name in NAMES}


def reconstructed_output(cap: LayerCapture) -> np.ndarray:
    """Σ_h Σ_j α_ij ṽ_j^h + b_O from the raw α (no NaN masking): (B, T, d)."""
    vt = projected_values(cap, cap.alpha.shape[1])
    total = np.einsum("bhij,bhjd->bid", cap.alpha, vt)
    return total if cap.b_o is None else total + cap.b_o


# ---------------------------------------------------------------------------------------------
# Any architecture: the modelling file's own eager attention, captured call by call.
#
# The model runs with attn_implementation="eager"; every module-level eager_attention_forward of
# the modelling files involved is wrapped to record the query/key/value it receives, the mask, and
# the probabilities and head outputs it returns. W_O is named per architecture by the test
# (``w_o``: a path relative to the attention module, "^" for its parent), never found by
# attngeom's discovery; the reconstruction sum_h sum_j alpha v~ + b_O is checked against that
# projection's real output.
# ---------------------------------------------------------------------------------------------

@dataclass
class EagerCall:
    """One eager attention call, float64 numpy (batch first)."""

    alpha: np.ndarray          # (B, H, Tq, Tk) probabilities eager returned (real keys only)
    v: np.ndarray              # (B, G, Tk, dv) values as eager received them
    z: np.ndarray              # (B, Tq, H, dv) eager's attention output
    allowed: np.ndarray        # (B, 1|H, Tq, Tk) keys eager's mask lets through
    w_o: np.ndarray            # (H*dv, d)
    b_o: np.ndarray | None
    module_output: np.ndarray  # (B, Tq, d) the output projection's real output


def _resolve(model: torch.nn.Module, name: str, path: str) -> torch.nn.Module:
    base = name
    while path.startswith("^"):
        base, path = base.rsplit(".", 1)[0] if "." in base else "", path[1:]
    full = f"{base}.{path}" if base else path
    return model.get_submodule(full)


def _weight_in_out(module: torch.nn.Module) -> torch.Tensor:
    """(in, out): nn.Linear stores (out, in), transformers' Conv1D (in, out)."""
    return module.weight if type(module).__name__ == "Conv1D" else module.weight.T


def eager_capture(model: torch.nn.Module, inputs: dict, w_o: str) -> list[EagerCall]:
    """Run a deep copy of ``model`` with eager attention; one :class:`EagerCall` per call."""
    import sys

    model = copy.deepcopy(model).eval()
    model.set_attn_implementation("eager")
    names = {id(m): n for n, m in model.named_modules()}
    files = {sys.modules[type(m).__module__] for m in model.modules()}
    files = [f for f in files if hasattr(f, "eager_attention_forward")]
    calls: list[dict] = []

    saved = {f: f.eager_attention_forward for f in files}
    outputs: dict[int, list] = {}
    handles = []

    def hook(m, args, output):
        outputs.setdefault(id(m), []).append(output)

    def wrap(original):
        def eager(module, query, key, value, attention_mask, *args, **kwargs):
            out, weights = original(module, query, key, value, attention_mask, *args, **kwargs)
            proj = _resolve(model, names[id(module)], w_o)
            if not any(c["proj"] is proj for c in calls):  # W_O runs after this call returns
                handles.append(proj.register_forward_hook(hook))
            calls.append({"module": module, "proj": proj, "alpha": weights, "v": value,
                          "z": out, "mask": attention_mask})
            return out, weights
        return eager

    try:
        for f in files:
            f.eager_attention_forward = wrap(saved[f])
        with torch.no_grad():
            model(**inputs, output_attentions=True)
    finally:
        for f, fn in saved.items():
            f.eager_attention_forward = fn
        for h in handles:
            h.remove()
    result, taken = [], {}
    for c in calls:
        proj = c["proj"]
        i = taken.get(id(proj), 0)
        taken[id(proj)] = i + 1
        mask = c["mask"]
        B, H, Tq, Tk = c["alpha"].shape
        if mask is None:
            allowed = np.ones((B, 1, Tq, Tk), bool)
        else:
            mask = mask[..., :Tk]
            allowed = (mask > torch.finfo(mask.dtype).min / 2).cpu().numpy() \
                if mask.dtype != torch.bool else mask.cpu().numpy()
        result.append(EagerCall(
            alpha=_f64(c["alpha"]), v=_f64(c["v"]), z=_f64(c["z"]), allowed=allowed,
            w_o=_f64(_weight_in_out(proj)), b_o=_f64(proj.bias),
            module_output=_f64(outputs[id(proj)][i])))
    return result


def eager_projected_values(call: EagerCall) -> np.ndarray:
    """ṽ_j^h = v_j^{g(h)} W_O^h, g(h) = h // (H/G) (transformers' repeat_kv): (B, H, Tk, d)."""
    B, G, Tk, dv = call.v.shape
    H = call.alpha.shape[1]
    vt = np.empty((B, H, Tk, call.w_o.shape[1]))
    for h in range(H):
        vt[:, h] = call.v[:, h // (H // G)] @ call.w_o[h * dv:(h + 1) * dv]
    return vt


def eager_measure(model: torch.nn.Module, inputs: dict, w_o: str,
                  sink_k: int = 1) -> tuple[dict[str, np.ndarray], list[EagerCall]]:
    """Every MISSION.md quantity from the model's own eager attention, float64, batch first.

    Valid (query, key): the key passes eager's mask and both are real tokens (``attention_mask``);
    NaN elsewhere. Also ``learned_sink_alpha`` = 1 - sum_j alpha_ij over the real keys (the
    weight eager's softmax gave a learned sink, zero without one).
    """
    calls = eager_capture(model, inputs, w_o)
    B, H, T, _ = calls[0].alpha.shape
    mask = inputs.get("attention_mask")
    tok = np.ones((B, T), bool) if mask is None else mask.cpu().numpy().astype(bool)
    layers = []
    for call in calls:
        valid = call.allowed & tok[:, None, None, :] & tok[:, None, :, None]   # (B, 1|H, T, T)
        valid = np.broadcast_to(valid, call.alpha.shape)
        q_in = tok[:, None]                                                  # (B, 1, T)
        a = np.where(valid, call.alpha, 0.0)
        vt = eager_projected_values(call)
        o_h = np.einsum("bhij,bhjd->bhid", a, vt)
        o = o_h.sum(1)
        r_h = o_h - np.einsum("bhij,bhjd->bhid", a[..., :sink_k], vt[:, :, :sink_k])
        vj, oi_h, oi = vt[:, :, None], o_h[:, :, :, None], o[:, None, :, None]
        with np.errstate(invalid="ignore", divide="ignore"):
            contrib = a * (oi_h * vj).sum(-1) / (o_h ** 2).sum(-1)[..., None]
            contrib_layer = a * (oi * vj).sum(-1) / (o ** 2).sum(-1)[:, None, :, None]
            head_share = (o[:, None] * o_h).sum(-1) / (o ** 2).sum(-1)[:, None]
        pair = {"alpha": call.alpha, "cosine": _cos(oi_h, vj), "cosine_layer": _cos(oi, vj),
                "contribution": contrib, "contribution_layer": contrib_layer}
        token = {"value_norm": np.linalg.norm(vt, axis=-1),
                 "sink_value_cosine": _cos(vt[:, :, :1], vt),
                 "output_norm": np.linalg.norm(o_h, axis=-1),
                 "residual_norm": np.linalg.norm(r_h, axis=-1),
                 "sink_residual_cosine": _cos(vt[:, :, :1], r_h), "head_share": head_share,
                 "learned_sink_alpha": 1.0 - a.sum(-1)}
        out = {n: np.where(valid, x, np.nan) for n, x in pair.items()}
        out.update({n: np.where(q_in, x, np.nan) for n, x in token.items()})
        out["layer_output_norm"] = np.where(tok, np.linalg.norm(o, axis=-1), np.nan)
        layers.append(out)
    return {n: np.stack([p[n] for p in layers], axis=1) for n in layers[0]}, calls


def eager_reconstruction(call: EagerCall) -> np.ndarray:
    """sum_h sum_j alpha ṽ + b_O (B, Tq, d): the projection's real output, if v, g(h) and W_O
    are right."""
    total = np.einsum("bhij,bhjd->bid", call.alpha, eager_projected_values(call))
    return total if call.b_o is None else total + call.b_o
