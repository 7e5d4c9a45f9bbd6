"""The naive per-head model-space implementation (the TransformerLens ``hook_result`` way).

Baseline for the benchmarks, written plainly and sharing no code with attngeom: eager
attention, a forward pre-hook captures each attention module's input x, a forward hook its
attention weights alpha; every head's projected values v~_j^h = (x W_V)^{g(h)} W_O^h are built
in model space (B, H, T, d), head outputs o^h = alpha v~ and layer output o = sum_h o^h, and the
dense quantities come from (T x T x d) contractions in model space. Llama-style modules
(``v_proj``/``o_proj``) only. Returns the same names and shapes as dense extraction.
"""

from __future__ import annotations

import numpy as np
import torch


def _cos(dot, a, b):
    return dot / (a * b)


def naive_layer(x: torch.Tensor, alpha: torch.Tensor, attn) -> dict[str, torch.Tensor]:
    """Dense measurements of one layer from its input x (B, T, d) and alpha (B, H, T, T)."""
    B, H, T, _ = alpha.shape
    dh = attn.head_dim
    G = attn.v_proj.weight.shape[0] // dh
    v = attn.v_proj(x).float().view(B, T, G, dh)                       # (B, T, G, dh)
    w_o = attn.o_proj.weight.float().T.reshape(H, dh, -1)              # (H, dh, d)
    v_model = torch.stack([v[:, :, h // (H // G)] @ w_o[h] for h in range(H)], 1)  # (B,H,T,d)
    a = alpha.float()
    o_head = a @ v_model                                               # (B, H, T, d)
    o = o_head.sum(1)                                                  # (B, T, d)
    value_norm = v_model.norm(dim=-1)                                  # (B, H, T)
    output_norm = o_head.norm(dim=-1)
    layer_norm = o.norm(dim=-1)                                        # (B, T)
    dot_head = o_head @ v_model.transpose(-1, -2)                      # (B, H, T, T)
    dot_layer = o[:, None] @ v_model.transpose(-1, -2)                 # (B, H, T, T)
    vn = value_norm[:, :, None, :]
    on = output_norm[..., None]
    ln = layer_norm[:, None, :, None]
    r = o_head - a[..., :1] * v_model[:, :, :1]                         # non-sink part
    v0 = v_model[:, :, :1]
    return {
        "alpha": a,
        "cosine": _cos(dot_head, on, vn),
        "cosine_layer": _cos(dot_layer, ln, vn),
        "contribution": a * dot_head / on.square(),
        "contribution_layer": a * dot_layer / ln.square(),
        "value_norm": value_norm,
        "sink_value_cosine": _cos((v_model * v0).sum(-1), value_norm, value_norm[:, :, :1]),
        "output_norm": output_norm,
        "residual_norm": r.norm(dim=-1),
        "sink_residual_cosine": _cos((r * v0).sum(-1), r.norm(dim=-1), value_norm[:, :, :1]),
        "head_share": (o_head * o[:, None]).sum(-1) / layer_norm.square()[:, None],
        "layer_output_norm": layer_norm,
    }


@torch.inference_mode()
def naive_measure(model, batch: dict) -> dict[str, np.ndarray]:
    """Run ``model`` once with eager attention and hooks; (B, L, ...) float32 numpy arrays."""
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    captured: dict[int, dict] = {}
    handles = []
    layers = [m for m in model.modules() if hasattr(m, "v_proj") and hasattr(m, "o_proj")]
    for i, attn in enumerate(layers):
        def pre(module, args, kwargs, i=i):
            captured[i] = {"x": kwargs.get("hidden_states", args[0] if args else None)}

        def post(module, args, kwargs, output, i=i):
            captured[i] = naive_layer(captured[i]["x"], output[1], module)

        handles.append(attn.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(attn.register_forward_hook(post, with_kwargs=True))
    try:
        model(**batch, use_cache=False)
    finally:
        for h in handles:
            h.remove()
        model.set_attn_implementation(previous)
    names = captured[0].keys()
    return {n: torch.stack([captured[i][n] for i in range(len(layers))], 1).cpu().numpy()
            for n in names}
