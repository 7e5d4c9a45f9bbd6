"""Synthetic stores for the analysis tests, built from explicit vectors (independent of attngeom).

:func:`geometric_store` draws real projected value vectors and attention weights and computes every
store variable from its definition in model space; :func:`to_compact` converts a dense store to
the compact layout with plain loops. Tests then overwrite variables with planted effects.
"""

from __future__ import annotations

import numpy as np
import xarray as xr


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    num = (a * b).sum(-1)
    return num / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def geometric_store(n_seq: int = 12, n_layer: int = 2, n_head: int = 3, n_pos: int = 16,
                    d: int = 5, sink_k: int = 1, tail_w: int = 4, causal: bool = True,
                    seed: int = 0, min_length: int | None = None) -> xr.Dataset:
    """A dense store whose variables follow the definitions exactly."""
    rng = np.random.default_rng(seed)
    np.seterr(invalid="ignore", divide="ignore")
    S, L, H, T = n_seq, n_layer, n_head, n_pos
    length = rng.integers(min_length or T // 2, T + 1, size=S)
    length[0] = T
    v = rng.normal(size=(S, L, H, T, d))  # projected values v~_j^h
    v[..., 0, :] = rng.normal(size=(S, L, H, d)) * 3.0  # a larger sink value
    scores = rng.normal(size=(S, L, H, T, T))
    scores[..., 0] += rng.normal(2.0, 1.5, size=(S, L, H, T))  # sink preference, varied
    q = np.arange(T)[:, None]
    j = np.arange(T)[None]
    valid_q = q < length[:, None, None, None, None]
    valid = (j < length[:, None, None, None, None]) & valid_q
    if causal:
        valid = valid & (j <= q)
    scores = np.where(valid, scores, -np.inf)
    with np.errstate(invalid="ignore"):
        alpha = np.exp(scores - scores.max(-1, keepdims=True))
        alpha = alpha / alpha.sum(-1, keepdims=True)
    alpha = np.where(valid, alpha, 0.0)
    o = np.einsum("slhqk,slhkd->slhqd", alpha, v)  # head outputs
    o_layer = o.sum(2)  # (S, L, T, d)
    o_n = np.linalg.norm(o, axis=-1)
    ol_n = np.linalg.norm(o_layer, axis=-1)
    av = alpha[..., None] * v[:, :, :, None, :, :]  # (S, L, H, Q, K, d)
    cosine = _cos(o[..., :, None, :], v[:, :, :, None, :, :])
    cosine_layer = _cos(o_layer[:, :, None, :, None, :], v[:, :, :, None, :, :])
    contribution = (o[..., :, None, :] * av).sum(-1) / o_n[..., None] ** 2
    contribution_layer = (o_layer[:, :, None, :, None, :] * av).sum(-1) / ol_n[:, :, None, :,
                                                                              None] ** 2
    r = o - av[..., :sink_k, :].sum(-2)  # non-sink part
    nanq = ~valid_q[..., 0]  # (S, 1, 1, T)
    pair = lambda a: np.where(valid, a, np.nan)  # noqa: E731
    perq = lambda a: np.where(nanq, np.nan, a)  # noqa: E731
    key_ok = (np.arange(T)[None] < length[:, None])[:, None, None, :]
    perk = lambda a: np.where(key_ok, a, np.nan)  # noqa: E731
    dims_pair = ("sequence", "layer", "head", "query", "key")
    dims_q = ("sequence", "layer", "head", "query")
    dims_k = ("sequence", "layer", "head", "key")
    head_share = (o_layer[:, :, None] * o).sum(-1) / ol_n[:, :, None] ** 2
    ds = xr.Dataset(
        {
            "alpha": (dims_pair, pair(alpha)),
            "cosine": (dims_pair, pair(cosine)),
            "cosine_layer": (dims_pair, pair(cosine_layer)),
            "contribution": (dims_pair, pair(contribution)),
            "contribution_layer": (dims_pair, pair(contribution_layer)),
            "value_norm": (dims_k, perk(np.linalg.norm(v, axis=-1))),
            "sink_value_cosine": (dims_k, perk(_cos(v[..., :1, :], v))),
            "output_norm": (dims_q, perq(o_n)),
            "residual_norm": (dims_q, perq(np.linalg.norm(r, axis=-1))),
            "sink_residual_cosine": (dims_q, perq(_cos(v[..., :1, :], r))),
            "head_share": (dims_q, perq(head_share)),
            "layer_output_norm": (("sequence", "layer", "query"),
                                  np.where(nanq[:, :, 0], np.nan, ol_n)),
            "length": (("sequence",), length),
            "finite": (("sequence",), np.ones(S, np.int8)),
            "token_id": (("sequence", "position"),
                         np.where(np.arange(T)[None] < length[:, None],
                                  rng.integers(5, 100, size=(S, T)), -1)),
        },
        coords={"sequence": np.arange(S), "layer": np.arange(L), "head": np.arange(H),
                "query": np.arange(T), "key": np.arange(T), "position": np.arange(T)},
        attrs={"mode": "dense", "sink_k": sink_k, "tail_w": tail_w, "causal": int(causal),
               "model": "synthetic", "schema_version": 1},
    )
    return ds


def to_compact(ds: xr.Dataset, k: int | None = None, w: int | None = None) -> xr.Dataset:
    """The compact layout of a dense store: sink keys on ``sink``, tail on ``lag``, middle sums."""
    k = int(ds.attrs["sink_k"]) if k is None else k
    w = int(ds.attrs["tail_w"]) if w is None else w
    T = ds.sizes["query"]
    out = ds.drop_vars(["alpha", "cosine", "cosine_layer", "contribution",
                        "contribution_layer"])
    middle_mask = np.zeros((T, T), bool)
    for i in range(T):
        for j in range(k, T):
            middle_mask[i, j] = not (i - w < j <= i)
    for name in ("alpha", "cosine", "cosine_layer", "contribution", "contribution_layer"):
        full = ds[name].values
        out[name] = (("sequence", "layer", "head", "query", "sink"), full[..., :k])
        tail = np.full(full.shape[:-1] + (w,), np.nan)
        for i in range(T):
            for lag in range(w):
                if i - lag >= k:
                    tail[..., i, lag] = full[..., i, i - lag]
        out[f"tail_{name}"] = (("sequence", "layer", "head", "query", "lag"), tail)
        if name in ("alpha", "contribution", "contribution_layer"):
            mid = np.where(middle_mask, np.nan_to_num(full), 0.0).sum(-1)
            mid = np.where(np.isnan(ds["output_norm"].values), np.nan, mid)
            out[f"middle_{name}"] = (("sequence", "layer", "head", "query"), mid)
    valid = np.isfinite(ds["alpha"].values) & middle_mask
    cnt = valid.sum(-1).astype(float)
    out["middle_count"] = (("sequence", "layer", "head", "query"),
                           np.where(np.isnan(ds["output_norm"].values), np.nan, cnt))
    out = out.assign_coords(sink=np.arange(k), lag=np.arange(w))
    out.attrs.update(mode="compact", sink_k=k, tail_w=w)
    return out
