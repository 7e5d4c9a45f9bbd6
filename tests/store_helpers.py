"""Helpers shared by the store and extraction-run tests: texts, tiny models, expected arrays.

Expected compact arrays are built from the naive reference's dense (query, key) arrays by plain
indexing: sink = first k keys, tail = key query - lag, middle = sum over the other allowed keys.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

import reference as ref
import tiny_models as tm
import tolerance as tol

PAIR = ("alpha", "cosine", "cosine_layer", "contribution", "contribution_layer")
PER_TOKEN = ("value_norm", "sink_value_cosine", "output_norm", "residual_norm",
             "sink_residual_cosine", "head_share", "layer_output_norm")


def write_texts(path: Path, n_words=(3, 12, 6, 1, 8), seed: int = 0) -> Path:
    """A JSONL of texts made of the tiny tokenizer's words, one per line (field ``text``)."""
    rng = np.random.default_rng(seed)
    words = tm._WORDS[: tm.VOCAB_SIZE - tm.N_SPECIAL]
    texts = [" ".join(rng.choice(words, n)) for n in n_words]
    path.write_text("".join(json.dumps({"id": i, "text": t}) + "\n"
                            for i, t in enumerate(texts)), encoding="utf-8")
    return path


def write_images(folder: Path) -> Path:
    """A new folder of three random RGB PNGs of different sizes (0.png, 1.png, 2.png)."""
    from PIL import Image

    folder.mkdir()
    rng = np.random.default_rng(0)
    for i, (h, w) in enumerate([(12, 12), (20, 16), (9, 30)]):
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    return folder


def load_tiny(directory: Path, arch: str) -> torch.nn.Module:
    from transformers import AutoModel, AutoModelForCausalLM

    cls = AutoModelForCausalLM if arch in tm.DECODERS else AutoModel
    return cls.from_pretrained(directory, dtype=torch.float32).eval()


def reference_on_ids(model: torch.nn.Module, token_ids: np.ndarray, sink_k: int) -> dict:
    """Naive reference on right-padded inputs rebuilt from stored ids (-1 beyond length)."""
    ids = np.asarray(token_ids, dtype=np.int64)
    mask = ids >= 0
    inputs = {"input_ids": torch.as_tensor(np.where(mask, ids, tm.PAD_ID)),
              "attention_mask": torch.as_tensor(mask.astype(np.int64))}
    return ref.naive_measure(model, inputs, sink_k=sink_k)


def cancellation(r: dict[str, np.ndarray]) -> np.ndarray:
    """||o|| / ||r||, at least 1: how much the sink residual's cosine amplifies roundoff."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.fmax(1.0, np.nan_to_num(r["output_norm"] / r["residual_norm"], nan=1.0))


def model_dims(model) -> dict[str, int]:
    """d, d_head, heads and intermediate of a transformers model (or config), for
    tol.attention_terms."""
    c = getattr(model, "config", model)
    c = c.get_text_config() if hasattr(c, "get_text_config") else c

    def first(*names):
        return next((getattr(c, n) for n in names if getattr(c, n, None)), None)

    d = first("hidden_size", "n_embd", "d_model", "dim")
    heads = first("num_attention_heads", "n_head", "n_heads", "num_heads")
    head = [getattr(c, n, None) for n in ("head_dim", "d_kv", "v_head_dim", "qk_head_dim")]
    return {"d": d, "heads": heads, "d_head": max([h for h in head if h] or [d // heads]),
            "intermediate": first("intermediate_size", "n_inner", "ffn_dim", "d_ff",
                                  "hidden_dim") or 4 * d}


def module_output_size(alpha: np.ndarray, v: np.ndarray, w_o: np.ndarray,
                       b_o: np.ndarray | None) -> np.ndarray:
    """(B, T, d): the sum of |terms| of o = sum_h (sum_j alpha_ij v_j) W_O^h + b_O.

    alpha (B, H, T, Tk); v (B, G, Tk, dv) (its sizes, when it is itself a product); w_o
    (H*dv, d), head h reading kv head h // (H / G).
    """
    B, H, T, _ = alpha.shape
    z = np.abs(alpha) @ np.repeat(np.abs(v), H // v.shape[1], axis=1)      # (B, H, T, dv)
    z = z.transpose(0, 2, 1, 3).reshape(B, T, -1)
    return z @ np.abs(w_o) + (0.0 if b_o is None else np.abs(b_o))


def forward_bound(model, T: int, logits) -> tol.Tol:
    """Two float32 forwards of ``model`` (T tokens) to its logits by other kernels: every
    layer's chain (tol.attention_terms) and the head's d terms, sized by the largest |logit|."""
    dims = model_dims(model)
    layers = getattr(model.config.get_text_config(), "num_hidden_layers", 2)
    n = tol.attention_terms(T=T, layer=layers, **dims) + dims["d"]
    return tol.dot(n, float(np.abs(np.asarray(logits, dtype=float)).max()), vs=tol.F32)


def compact_identity(ds, n_queries: int) -> tol.Tol:
    """A compact store's contributions over keys (sink + tail + 1 - sink - tail: rounding only,
    sized by the largest sum of |terms|) averaged over ``n_queries`` queries, in float32."""
    k, w = ds.sizes["sink"], ds.sizes["lag"]
    size = (np.abs(ds["contribution"]).sum("sink") + np.abs(ds["tail_contribution"]).sum("lag")
            + np.abs(ds["middle_contribution"])).max()
    return tol.sums_to_one(k + w + 2 + n_queries, depth=k + w + 2, size=float(size))


def score_size(alpha: np.ndarray, v: np.ndarray, w_o: np.ndarray) -> np.ndarray:
    """(B, H, T, Tk): the size every removal score's rounding scales with: 2 alpha ||v~|| /
    ||o|| (the smaller of the head's and the layer's ||o||: the contributions' operands), at
    least alpha. v (B, H, Tk, dh) per query head, w_o (H*dh, d); float64."""
    H, dh = v.shape[1], v.shape[-1]
    vt = np.stack([v[:, h] @ w_o[h * dh:(h + 1) * dh] for h in range(H)], 1)   # (B,H,Tk,d)
    o_h = np.einsum("bhij,bhjd->bhid", alpha, vt)
    on = np.fmin(np.linalg.norm(o_h, axis=-1), np.linalg.norm(o_h.sum(1), axis=-1)[:, None])
    with np.errstate(invalid="ignore", divide="ignore"):
        size = 2 * alpha * np.linalg.norm(vt, axis=-1)[:, :, None, :] / on[..., None]
    return np.fmax(size, alpha)


def measurement_bounds(r: dict[str, np.ndarray], dims: dict[str, int], vs=tol.F64,
                       dtype=tol.F32, layers=None) -> dict[str, np.ndarray]:
    """Rounding bounds (absolute, per element) of attngeom's float32 measurements of ``r``.

    ``r``: dense (batch, layer, ...) arrays (the float64 reference); ``dims``: :func:`model_dims`;
    ``dtype``: the measurement's (float64 for the reference's own, whose chain is shorter);
    ``layers``: the model layers r's layer axis holds (all of them by default).
    Each stored quantity comes out of the chain :func:`tolerance.attention_terms` counts, of
    total length N at its layer; its bound is gamma(N) (+ the reference's, ``vs``) times its
    size: 1 for a probability (its error is alpha times the logits', and the tiny models'
    logits are below N / d_head in size), 2 for a cosine (its numerator and its norms), the
    value for a norm, 2 ||o^h|| / ||o|| for head_share, 2 alpha ||v~|| / ||o|| for the
    contributions, and the cancellation ||o|| / ||r|| more for the sink-residual cosine.
    """
    T, L = r["alpha"].shape[-1], r["alpha"].shape[1]
    n = [tol.attention_terms(T=T, layer=layer, **dims)
         for layer in (range(L) if layers is None else layers)]
    g = np.array([tol.dot(n_layer, 1.0, dtype, vs).atol for n_layer in n])
    per_layer = lambda x: x * g.reshape((1, L) + (1,) * (x.ndim - 2))        # noqa: E731
    one = lambda name: np.where(np.isnan(r[name]), np.nan, 1.0)            # noqa: E731
    vn, on, lon = r["value_norm"], r["output_norm"], r["layer_output_norm"]
    with np.errstate(invalid="ignore", divide="ignore"):
        size = {"alpha": one("alpha"), "cosine": 2 * one("cosine"),
                "cosine_layer": 2 * one("cosine_layer"),
                "sink_value_cosine": 2 * one("sink_value_cosine"),
                "sink_residual_cosine": 2 * one("sink_residual_cosine") * cancellation(r),
                "value_norm": np.abs(vn), "output_norm": np.abs(on),
                "residual_norm": np.abs(r["residual_norm"]), "layer_output_norm": np.abs(lon),
                "head_share": 2 * on / lon[:, :, None],
                "contribution": 2 * r["alpha"] * vn[..., None, :] / on[..., None],
                "contribution_layer": 2 * r["alpha"] * vn[..., None, :] / lon[:, :, None, :, None]}
    if "learned_sink_alpha" in r:
        size["learned_sink_alpha"] = one("learned_sink_alpha")
    return {name: per_layer(x) for name, x in size.items()}


def compact_bounds(r: dict[str, np.ndarray], dims: dict[str, int], k: int, w: int,
                   vs=tol.F64) -> dict[str, np.ndarray]:
    """:func:`measurement_bounds` in the compact layout: the sink and tail cells' own bounds;
    a middle total, which attngeom takes as its exact total (1, or head_share for
    contribution_layer) less the sink and tail terms, within the bounds of every term of its
    row (and head_share's); middle_count is exact."""
    dense = measurement_bounds(r, dims, vs)
    bounds = expected_compact({**dense, "output_norm": r["output_norm"]}, k, w)
    real = ~np.isnan(r["output_norm"])
    for name in ("alpha", "contribution", "contribution_layer"):
        row = np.nansum(dense[name], -1) + (dense["head_share"] if name.endswith("layer") else 0)
        bounds[f"middle_{name}"] = np.where(real, row, np.nan)
    bounds["middle_count"] = np.where(real, 0.0, np.nan)
    return {**bounds, **{name: dense[name] for name in PER_TOKEN}}


def assert_same(got, want, name: str, bound) -> None:
    """Same shape, NaN at exactly the same cells, values within ``bound`` (a Tol, or an
    absolute bound per element) elsewhere; something is compared."""
    want = np.asarray(want)
    assert (~np.isnan(want)).any(), f"{name}: nothing to compare"
    tol.assert_close(got, want, bound if isinstance(bound, tol.Tol) else tol.Tol(atol=bound),
                     name)


def expected_compact(r: dict[str, np.ndarray], k: int, w: int) -> dict[str, np.ndarray]:
    """Compact layout (sink, tail_*, middle_*) from dense (..., query, key) arrays."""
    T = r["alpha"].shape[-1]
    q = np.arange(T)[:, None]
    key = q - np.arange(w)[None, :]                                    # (T, w)
    in_tail = key >= k                                                  # also key >= 0
    keys = np.arange(T)[None, :]
    lag = q - keys                                                      # (Tq, Tk)
    middle_key = (keys >= k) & ~((lag >= 0) & (lag < w))                # encoders: keys > query
    allowed = ~np.isnan(r["alpha"])                                     # (..., Tq, Tk)
    real_query = ~np.isnan(r["output_norm"])                            # (..., Tq)
    out = {}
    for name in PAIR:
        out[name] = r[name][..., :k]
        index = np.broadcast_to(np.clip(key, 0, None), r[name].shape[:-1] + (w,))
        out[f"tail_{name}"] = np.where(in_tail, np.take_along_axis(r[name], index, -1), np.nan)
    middle = allowed & middle_key
    for name in ("alpha", "contribution", "contribution_layer"):
        total = np.where(middle, r[name], 0.0).sum(-1)
        out[f"middle_{name}"] = np.where(real_query, total, np.nan)
    out["middle_count"] = np.where(real_query, middle.sum(-1), np.nan)
    return out
