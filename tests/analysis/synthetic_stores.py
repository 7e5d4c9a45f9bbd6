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
                    seed: int = 0, min_length: int | None = None, return_vectors: bool = False):
    """A dense store whose variables follow the definitions exactly.

    With ``return_vectors`` also returns (values v~ (S, L, H, T, d), alpha (S, L, H, T, T)).
    """
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
    return (ds, v, alpha) if return_vectors else ds


def to_compact(ds: xr.Dataset, k: int | None = None, w: int | None = None) -> xr.Dataset:
    """The compact layout of a dense store: sink keys on ``sink``, tail on ``lag``, middle sums."""
    k = int(ds.attrs["sink_k"]) if k is None else k
    w = int(ds.attrs["tail_w"]) if w is None else w
    T = ds.sizes["query"]
    names = [n for n in ("alpha", "cosine", "cosine_layer", "contribution",
                         "contribution_layer") if n in ds]
    out = ds.drop_vars(names)
    middle_mask = np.zeros((T, T), bool)
    for i in range(T):
        for j in range(k, T):
            middle_mask[i, j] = not (i - w < j <= i)
    for name in names:
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


# ---------------------------------------------------------------------------- planted effects
PAIR_DIMS = ("sequence", "layer", "head", "query", "key")
Q_DIMS = ("sequence", "layer", "head", "query")
K_DIMS = ("sequence", "layer", "head", "key")


def masks(ds: xr.Dataset) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(S, 1, 1, T) query-valid, (S, 1, 1, T) key-valid and (S, 1, 1, T, T) causal pair masks."""
    T = ds.sizes["query"]
    length = ds["length"].values[:, None, None, None]
    pos = np.arange(T)
    qv = pos < length
    pair = qv[..., :, None] & qv[..., None, :] & (pos[None, :] <= pos[:, None])
    return qv, qv, pair


def random_store(n_seq=40, n_layer=2, n_head=4, n_pos=24, sink_k=1, tail_w=4, seed=0,
                 min_length=None) -> xr.Dataset:
    """A cheap dense store with random values that respect the definitions' algebra.

    alpha is row-normalized random attention, cosines uniform in (-1, 1), norms log-normal,
    contribution = alpha * value_norm / output_norm * cosine. Tests overwrite what they plant.
    """
    rng = np.random.default_rng(seed)
    S, L, H, T = n_seq, n_layer, n_head, n_pos
    length = rng.integers(min_length or T // 2, T + 1, size=S)
    length[0] = T
    base = xr.Dataset(
        {"length": (("sequence",), length), "finite": (("sequence",), np.ones(S, np.int8))},
        coords={"sequence": np.arange(S), "layer": np.arange(L), "head": np.arange(H),
                "query": np.arange(T), "key": np.arange(T), "position": np.arange(T)},
        attrs={"mode": "dense", "sink_k": sink_k, "tail_w": tail_w, "causal": 1})
    qv, kv, pair = masks(base)
    shape = (S, L, H, T)
    alpha = np.where(pair, rng.exponential(size=shape + (T,)), 0.0)
    alpha = alpha / np.where(alpha.sum(-1, keepdims=True) > 0, alpha.sum(-1, keepdims=True), 1)
    ds = base.assign(
        alpha=(PAIR_DIMS, np.where(pair, alpha, np.nan)),
        cosine=(PAIR_DIMS, np.where(pair, rng.uniform(-1, 1, shape + (T,)), np.nan)),
        value_norm=(K_DIMS, np.where(kv, rng.lognormal(0, 0.3, shape), np.nan)),
        sink_value_cosine=(K_DIMS, np.where(kv, rng.uniform(-1, 1, shape), np.nan)),
        output_norm=(Q_DIMS, np.where(qv, rng.lognormal(0, 0.3, shape), np.nan)),
        residual_norm=(Q_DIMS, np.where(qv, rng.lognormal(0, 0.3, shape), np.nan)),
        sink_residual_cosine=(Q_DIMS, np.where(qv, rng.uniform(-1, 1, shape), np.nan)),
    )
    return with_contribution(ds)


def with_contribution(ds: xr.Dataset) -> xr.Dataset:
    """Recompute contribution = alpha * value_norm / output_norm * cosine."""
    c = ds["alpha"] * ds["value_norm"] / ds["output_norm"] * ds["cosine"]
    return ds.assign(contribution=c.transpose(*PAIR_DIMS))


def plant_quadratic(ds: xr.Dataset, beta_by_head: np.ndarray, noise_sd=0.3, seq_sd=0.3,
                    seed=1) -> xr.Dataset:
    """alpha_i0 ~ U(0, 1) and output_norm = b0 + b1 a + b2 a^2 + u_sequence + e.

    ``beta_by_head``: (L, H, 3) true coefficients.
    """
    rng = np.random.default_rng(seed)
    qv, _, _ = masks(ds)
    S, L, H, T = (ds.sizes[d] for d in ("sequence", "layer", "head", "query"))
    a = rng.uniform(0, 1, (S, L, H, T))
    alpha = ds["alpha"].values.copy()
    alpha[..., 1:, 0] = np.where(qv[..., 1:], a[..., 1:], np.nan)
    b = np.asarray(beta_by_head)[None, :, :, None, :]
    u = rng.normal(0, seq_sd, (S, 1, 1, 1))  # shared by all heads of a sequence
    y = b[..., 0] + b[..., 1] * a + b[..., 2] * a**2 + u + rng.normal(0, noise_sd, a.shape)
    out = ds.assign(alpha=(PAIR_DIMS, alpha), output_norm=(Q_DIMS, np.where(qv, y, np.nan)))
    return with_contribution(out)


def plant_cosines(ds: xr.Dataset, value_mean: np.ndarray, residual_mean: np.ndarray,
                  seq_sd=0.1, noise_sd=0.3, seed=2, shared: bool = True) -> xr.Dataset:
    """sink_value_cosine (j >= 1) and sink_residual_cosine (i >= 1) = mean + u_s + e, clipped.

    ``value_mean`` and ``residual_mean``: (L, H) planted means. The sequence effect u_s is shared
    by the heads of a layer when ``shared`` (else independent per head).
    """
    rng = np.random.default_rng(seed)
    qv, kv, _ = masks(ds)
    S, L, H, T = (ds.sizes[d] for d in ("sequence", "layer", "head", "query"))

    def draw(mean):
        m = np.asarray(mean)[None, :, :, None]
        u = rng.normal(0, seq_sd, (S, L, 1 if shared else H, 1))
        x = m + u + rng.normal(0, noise_sd, (S, L, H, T))
        return np.clip(x, -1, 1)

    v = draw(value_mean)
    v[..., 0] = 1.0
    return ds.assign(sink_value_cosine=(K_DIMS, np.where(kv, v, np.nan)),
                     sink_residual_cosine=(Q_DIMS, np.where(qv, draw(residual_mean), np.nan)))


def group_of_pairs(T: int, k: int, w: int) -> np.ndarray:
    """(T, T) group label per (query, key): 0 sink, 1 tail, 2 middle (by the definitions)."""
    g = np.full((T, T), 2)
    for i in range(T):
        for j in range(T):
            if j < k:
                g[i, j] = 0
            elif i - w < j <= i:
                g[i, j] = 1
    return g


def plant_factors(ds: xr.Dataset, alpha_width, cos_width, vn_sd, on_sd: float,
                  negative=(0.0, 0.0, 0.0), seed=3) -> xr.Dataset:
    """Independent factors with known variances per group (sink, tail, middle).

    log alpha = -U(0.1, 0.1 + alpha_width[g]), log|cos| = -U(0, cos_width[g]) (variances
    width^2 / 12), log value_norm ~ N(0, vn_sd[0]) at sink keys and N(0, vn_sd[1]) elsewhere,
    log output_norm ~ N(0, on_sd); cos < 0 with probability ``negative[g]``.
    """
    rng = np.random.default_rng(seed)
    qv, kv, pair = masks(ds)
    S, L, H, T = (ds.sizes[d] for d in ("sequence", "layer", "head", "query"))
    k, w = int(ds.attrs["sink_k"]), int(ds.attrs["tail_w"])
    g = group_of_pairs(T, k, w)
    shape = (S, L, H, T, T)
    la = -(0.1 + rng.uniform(0, 1, shape) * np.asarray(alpha_width)[g])
    lc = -rng.uniform(0, 1, shape) * np.asarray(cos_width)[g]
    sign = np.where(rng.uniform(size=shape) < np.asarray(negative)[g], -1.0, 1.0)
    lvn = rng.normal(0, 1, (S, L, H, T)) * np.where(np.arange(T) < k, vn_sd[0], vn_sd[1])
    lon = rng.normal(0, on_sd, (S, L, H, T))
    out = ds.assign(
        alpha=(PAIR_DIMS, np.where(pair, np.exp(la), np.nan)),
        cosine=(PAIR_DIMS, np.where(pair, sign * np.exp(lc), np.nan)),
        value_norm=(K_DIMS, np.where(kv, np.exp(lvn), np.nan)),
        output_norm=(Q_DIMS, np.where(qv, np.exp(lon), np.nan)))
    return with_contribution(out)
