"""Sink rates and sink heads.

The sink rate of head h at query i is alpha_i0^h, the attention to position 0. Only queries
i >= k count (the sink token attends to itself with alpha = 1), within each sequence's length, in
sequences with finite activations. A head is a sink head (Gu et al., ICLR 2025) when its mean sink
rate over all such queries (pooled over sequences) exceeds ``epsilon``.

Output names (stable), :func:`sinks`:

``sink_rate_mean``, ``sink_rate_sd``, ``sink_mass_mean`` (sum of alpha over the k sink keys),
``n_queries``, ``is_sink_head``                          over (layer, head)
``sink_head_count``, ``sink_head_fraction``, ``layer_sink_rate_mean``   over (layer)
``learned_sink_rate_mean`` over (layer, head): the mean weight of a learned sink logit
(``learned_sink_alpha``, gpt-oss) over the same queries; only for stores that have one

Gu et al.'s per-input count (their Table 1 and released code): per input, the first token's
score of a head is the mean of alpha_i0 over *every* query i >= 0 (the first query's
alpha_00 = 1 included), always on key 0 whatever k is; the head is a sink head on that input
when the score exceeds ``epsilon``. ``gu_sink_share`` (layer, head) is the share of inputs on
which it is one, ``gu_layer_sink_share`` (layer) its mean over heads, ``gu_sink_head_share``
() the mean over inputs, layers and heads: the percentage their Table 1 reports, divided by
100. ``gu_n_inputs`` counts the inputs (finite sequences) per layer. The pooled count above
(``sink_head_fraction``) thresholds the score pooled over sequences, over queries i >= k.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from attngeom.store.format import schema as S
from attngeom.common.vocab import EPSILON, SINK

from ._common import shared_docs, with_provenance
from .blocks import DEFAULT_BLOCK_ELEMENTS, Block, describe, require, run_pass


class SinkAccumulator:
    """Streaming token-pooled moments of the sink rate per (layer, head)."""

    reads = (S.ALPHA,)
    groups = (SINK,)

    def __init__(self, heads: np.ndarray, epsilon: float = EPSILON):
        self.heads = heads
        self.epsilon = epsilon
        self.layers: list = []
        self.rows: list[dict[str, np.ndarray]] = []
        self._reset()

    def _reset(self) -> None:
        h = len(self.heads)
        self._n, self._s, self._ss, self._mass, self._gu = (np.zeros(h) for _ in range(5))
        self._inputs = 0

    def update(self, block: Block) -> None:
        g = block.groups
        rate = g.sink_rate.values  # (S, H, Q)
        ok = np.isfinite(rate)
        self._n += ok.sum((0, 2))
        self._s += np.where(ok, rate, 0).sum((0, 2))
        self._ss += np.where(ok, rate**2, 0).sum((0, 2))
        self._mass += np.nan_to_num(g.group(SINK, S.ALPHA).values.sum(-1)).sum((0, 2))
        first = g.first_key_rate.values                       # (S, H, Q), every query i >= 0
        seen = np.isfinite(first).any((1, 2))                 # inputs with finite activations
        with np.errstate(invalid="ignore"):
            score = np.nanmean(np.where(seen[:, None, None], first, 0.0), axis=2)   # (S, H)
        self._gu += (score[seen] > self.epsilon).sum(0)
        self._inputs += int(seen.sum())

    def end_layer(self, layer) -> None:
        n = np.where(self._n > 0, self._n, np.nan)
        mean = self._s / n
        var = (self._ss - n * mean**2) / (n - 1)
        self.rows.append({"sink_rate_mean": mean,
                          "sink_rate_sd": np.sqrt(np.clip(var, 0, None)),
                          "sink_mass_mean": self._mass / n, "n_queries": self._n.copy(),
                          "gu_sink_share": self._gu / max(self._inputs, 1) if self._inputs
                          else np.full(len(self.heads), np.nan),
                          "gu_n_inputs": np.full(len(self.heads), self._inputs)})
        self.layers.append(layer)
        self._reset()

    def result(self) -> xr.Dataset:
        data = {name: ((S.LAYER, S.HEAD), np.stack([r[name] for r in self.rows]))
                for name in self.rows[0]}
        out = xr.Dataset(data, coords={S.LAYER: self.layers, S.HEAD: self.heads})
        out["is_sink_head"] = out["sink_rate_mean"] > self.epsilon
        out["sink_head_count"] = out["is_sink_head"].sum(S.HEAD)
        out["sink_head_fraction"] = out["is_sink_head"].mean(S.HEAD)
        out["layer_sink_rate_mean"] = out["sink_rate_mean"].mean(S.HEAD)
        out["gu_n_inputs"] = out["gu_n_inputs"].max(S.HEAD)
        out["gu_layer_sink_share"] = out["gu_sink_share"].mean(S.HEAD)
        out["gu_sink_head_share"] = out["gu_sink_share"].mean()
        out["gu_sink_share"].attrs["description"] = (
            f"share of inputs whose mean alpha_i0 over all queries i >= 0 exceeds epsilon = "
            f"{self.epsilon} (Gu et al.'s per-input count)")
        out["sink_rate_mean"].attrs["description"] = (
            "mean of alpha_i0 over queries i >= k of all sequences (token-pooled)")
        out["is_sink_head"].attrs["description"] = f"sink_rate_mean > epsilon = {self.epsilon}"
        out["sink_mass_mean"].attrs["description"] = "mean of sum_{j<k} alpha_ij"
        out.attrs["epsilon"] = self.epsilon
        return out


@shared_docs
def sinks(ds: xr.Dataset, *, sink_k: int | None = None, epsilon: float = EPSILON,
          layers=None, progress: bool = False,
          block_elements: int = DEFAULT_BLOCK_ELEMENTS) -> xr.Dataset:
    """Compute sink rates per (layer, head) and Gu et al.'s sink heads (mean sink rate > ``epsilon``).

    Parameters
    ----------
    {ds}
    sink_k : int, optional
        Number of sink keys k (queries i < k are excluded); default the store's.
    epsilon : float
        Sink-head threshold on the mean sink rate.
    {layers, progress, block_elements}

    {returns}
    """
    require(ds, [S.ALPHA], "the sink analysis")
    info = describe(ds, sink_k, None, layers)
    acc = SinkAccumulator(info.heads, epsilon)
    run_pass(ds, info, [acc], elements=block_elements, progress=progress)
    out = add_learned_sinks(acc.result(), ds, info.k)
    return with_provenance(out, ds.attrs, sink_k=info.k, epsilon=epsilon)


def add_learned_sinks(out: xr.Dataset, ds: xr.Dataset, k: int) -> xr.Dataset:
    """``out`` with ``learned_sink_rate_mean`` (layer, head) when the store has learned sinks."""
    if "learned_sink_alpha" in ds:
        out["learned_sink_rate_mean"] = learned_sink_rate(ds, k).sel(
            layer=out["layer"]).transpose("layer", "head")
    return out


def learned_sink_rate(ds: xr.Dataset, k: int) -> xr.DataArray:
    """Mean ``learned_sink_alpha`` per (layer, head) over queries i >= k of finite sequences."""
    x = ds["learned_sink_alpha"]
    keep = (ds["query"] >= k) & (ds["finite"] != 0) if "finite" in ds else ds["query"] >= k
    rate = x.where(keep).mean(("sequence", "query")).compute()
    rate.attrs["description"] = ("mean weight of the learned sink logit (a virtual key with no "
                                 "value) over queries i >= k")
    return rate
