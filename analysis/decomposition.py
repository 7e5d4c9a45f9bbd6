"""Variance decomposition of log|contribution| for sink, tail and middle keys.

Each contribution factors as c = alpha * (value_norm / output_norm) * cosine, so
log|c| = log alpha + log ratio + log|cos| exactly (``part`` = alpha, ratio, cosine). Per key group
(sink: j < k; tail: the w most recent non-sink keys j = i - lag; middle: the rest; queries i >= k)
and per layer, pooled over heads, queries and sequences, and pooled over all layers:

* ``cov_share``: Cov(part, log|c|) / Var(log|c|); the three sum to one;
* ``lmg_share``: LMG / Shapley R^2 shares, the marginal R^2 gain of each part averaged over the
  orders of entering the regression of log|c| on the parts (they sum to the full R^2 = 1).

Both come from the exact covariance matrix of (log alpha, log ratio, log|cos|, log|c|), streamed
block by block (pairwise merge of means and co-moments); R^2 of a subset S is
c_S' Sigma_SS^-1 c_S / Var(log|c|). log|c| is taken as the sum of the three logs (equal to the
log of the stored contribution up to rounding). Pairs where a part is zero or non-finite (alpha
underflowing to 0, cos = 0) are left out and not counted in ``n_pairs``.

Middle group: elementwise only in dense stores. In compact stores only its per-query totals are
stored, so its shares, ``n_pairs`` and ``negative_fraction`` are NaN/0 there; ``total_alpha_mean``
and ``total_contribution_mean`` (per-query sums over the group's keys, averaged over queries) are
given for all groups in both layouts.

The paper expects sink contributions driven by the norm ratio and the cosine, tail contributions
by alpha and the cosine. ``top_parts`` names the two parts with the largest LMG shares;
``paper_pattern`` is "holds" when sink -> ratio+cosine and tail -> alpha+cosine, "partly" when one
of the two groups matches, "fails" when neither does, "undetermined" when a group has no data.

Output names (stable), :func:`decomposition`, over (layer, group, part): ``cov_share lmg_share``;
over (layer, group): ``var_log_contribution r2_full n_pairs negative_fraction total_alpha_mean
total_contribution_mean top_parts``; over (layer): ``paper_pattern paper_pattern_holds``; the same
with a ``pooled_`` prefix without the layer dimension; attribute ``verdict`` (a sentence).
"""

from __future__ import annotations

from itertools import combinations
from math import factorial

import numpy as np
import xarray as xr

from attngeom.store.format import schema as S
from attngeom.store.dataset.accessor import RATIO
from attngeom.common.vocab import GROUPS, MIDDLE, SINK, TAIL

from ._common import shared_docs, with_provenance
from .blocks import DEFAULT_BLOCK_ELEMENTS, Block, describe, require, run_pass

PARTS = (S.ALPHA, RATIO, S.COSINE)
EXPECTED = {SINK: {RATIO, S.COSINE}, TAIL: {S.ALPHA, S.COSINE}}
GROUP, PART = "group", "part"  # result dimensions: key group, factor of the contribution


class Moments:
    """Count, mean and co-moment matrix of rows, merged exactly block by block (Chan et al.)."""

    def __init__(self, p: int = 4):
        self.n = 0
        self.mean = np.zeros(p)
        self.comoment = np.zeros((p, p))

    def add(self, cols: np.ndarray) -> None:
        """Merge the observations of a block, given as columns (p, n); centred in place."""
        other = Moments(cols.shape[0])
        if cols.shape[1]:
            other.n, other.mean = cols.shape[1], cols.mean(1)
            cols -= other.mean[:, None]
            other.comoment = cols @ cols.T
        self.merge(other)

    def merge(self, other: "Moments") -> "Moments":
        n = self.n + other.n
        if other.n:
            delta = other.mean - self.mean
            self.comoment = (self.comoment + other.comoment
                             + np.outer(delta, delta) * self.n * other.n / n)
            self.mean = self.mean + delta * other.n / n
            self.n = n
        return self

    @property
    def cov(self) -> np.ndarray:
        return self.comoment / (self.n - 1) if self.n > 1 else np.full_like(self.comoment, np.nan)


def shares(cov: np.ndarray) -> dict[str, np.ndarray | float]:
    """Covariance shares and LMG R^2 shares from the 4 x 4 covariance of (parts..., y)."""
    p = cov.shape[0] - 1
    var_y = cov[p, p]
    nan = {"cov_share": np.full(p, np.nan), "lmg_share": np.full(p, np.nan), "r2_full": np.nan,
           "var_log_contribution": var_y}
    if not np.isfinite(var_y) or var_y <= 0:
        return nan

    def r2(subset: tuple[int, ...]) -> float:
        if not subset:
            return 0.0
        s = list(subset)
        c = cov[s, p]
        return float(c @ np.linalg.pinv(cov[np.ix_(s, s)]) @ c / var_y)

    lmg = np.zeros(p)
    for j in range(p):
        others = [i for i in range(p) if i != j]
        for size in range(p):
            weight = factorial(size) * factorial(p - size - 1) / factorial(p)
            for subset in combinations(others, size):
                lmg[j] += weight * (r2(tuple(sorted(subset + (j,)))) - r2(subset))
    return {"cov_share": cov[:p, p] / var_y, "lmg_share": lmg, "r2_full": r2(tuple(range(p))),
            "var_log_contribution": var_y}


def _top_parts(lmg: np.ndarray) -> str:
    if not np.all(np.isfinite(lmg)):
        return ""
    top = set(np.argsort(lmg)[::-1][:2])
    return "+".join(PARTS[i] for i in sorted(top))


def _pattern(top: dict[str, str]) -> str:
    if not top.get(SINK) or not top.get(TAIL):
        return "undetermined"
    hits = sum(set(top[g].split("+")) == EXPECTED[g] for g in EXPECTED)
    return {2: "holds", 1: "partly", 0: "fails"}[hits]


class DecompositionAccumulator:
    """Streams moments of the log parts per (layer, group); pooled over layers at the end."""

    reads = (S.ALPHA, S.COSINE, S.CONTRIBUTION, RATIO)
    groups = GROUPS

    def __init__(self, elementwise: tuple[str, ...] = GROUPS):
        self.elementwise = tuple(elementwise)  # groups with key-by-key values (compact: no middle)
        self.layers: list = []
        self.per_layer: list[dict] = []
        self._pooled = {g: self._empty() for g in GROUPS}
        self._cur = {g: self._empty() for g in GROUPS}

    @staticmethod
    def _empty() -> dict:
        return {"m": Moments(), "neg": 0, "tot_n": 0, "tot_a": 0.0, "tot_c": 0.0}

    def update(self, block: Block) -> None:
        keys = block.groups
        for g in GROUPS:
            cur = self._cur[g]
            a = keys.total(g, S.ALPHA).values
            c = keys.total(g, S.CONTRIBUTION).values
            ok = np.isfinite(a) & np.isfinite(c)
            cur["tot_n"] += int(ok.sum())
            cur["tot_a"] += float(a[ok].sum())
            cur["tot_c"] += float(c[ok].sum())
            if g not in self.elementwise:
                continue
            raw = [keys.group(g, S.ALPHA).values, keys.group(g, RATIO).values,
                   np.abs(keys.group(g, S.COSINE).values)]
            ok = np.ones(raw[0].shape, bool)
            for x in raw:  # positive and finite, so that the log is finite
                ok &= (x > 0) & (x < np.inf)
            cols = np.empty((4, int(ok.sum())))  # (part..., log|c|) x pairs, contiguous rows
            for col, x in enumerate(raw):
                np.log(x[ok], out=cols[col])
            np.add(cols[0] + cols[1], cols[2], out=cols[3])
            cur["m"].add(cols)
            cur["neg"] += int((keys.group(g, S.CONTRIBUTION).values[ok] < 0).sum())

    @staticmethod
    def _summarize(acc: dict) -> dict:
        out = shares(acc["m"].cov)
        n = acc["m"].n
        out.update(n_pairs=float(n), negative_fraction=acc["neg"] / n if n else np.nan)
        tn = acc["tot_n"] or np.nan
        out.update(total_alpha_mean=acc["tot_a"] / tn, total_contribution_mean=acc["tot_c"] / tn)
        return out

    def end_layer(self, layer) -> None:
        self.per_layer.append({g: self._summarize(self._cur[g]) for g in GROUPS})
        for g in GROUPS:
            pooled, cur = self._pooled[g], self._cur[g]
            pooled["m"].merge(cur["m"])
            for key in ("neg", "tot_n", "tot_a", "tot_c"):
                pooled[key] += cur[key]
        self._cur = {g: self._empty() for g in GROUPS}
        self.layers.append(layer)

    def result(self) -> xr.Dataset:
        pooled = {g: self._summarize(self._pooled[g]) for g in GROUPS}
        out = xr.Dataset(coords={S.LAYER: self.layers, GROUP: list(GROUPS),
                                 PART: list(PARTS)})
        for name in ("cov_share", "lmg_share"):
            out[name] = ((S.LAYER, GROUP, PART),
                         np.array([[row[g][name] for g in GROUPS] for row in self.per_layer]))
            out[f"pooled_{name}"] = ((GROUP, PART), np.array([pooled[g][name] for g in GROUPS]))
        for name in ("var_log_contribution", "r2_full", "n_pairs", "negative_fraction",
                     "total_alpha_mean", "total_contribution_mean"):
            out[name] = ((S.LAYER, GROUP),
                         np.array([[row[g][name] for g in GROUPS] for row in self.per_layer]))
            out[f"pooled_{name}"] = ((GROUP,), np.array([pooled[g][name] for g in GROUPS]))
        tops = [{g: _top_parts(row[g]["lmg_share"]) for g in GROUPS} for row in self.per_layer]
        ptop = {g: _top_parts(pooled[g]["lmg_share"]) for g in GROUPS}
        out["top_parts"] = ((S.LAYER, GROUP), np.array([[t[g] for g in GROUPS] for t in tops],
                                                       dtype=object).astype(str))
        out["pooled_top_parts"] = ((GROUP,), np.array([ptop[g] for g in GROUPS], dtype=str))
        out["paper_pattern"] = ((S.LAYER,), np.array([_pattern(t) for t in tops], dtype=str))
        out["paper_pattern_holds"] = out["paper_pattern"] == "holds"
        out["pooled_paper_pattern"] = ((), _pattern(ptop))
        out["pooled_paper_pattern_holds"] = ((), _pattern(ptop) == "holds")
        out.attrs["verdict"] = verdict(ptop, {g: pooled[g]["lmg_share"] for g in GROUPS})
        out.attrs["middle_group"] = (
            "elementwise (dense store)" if MIDDLE in self.elementwise else
            "totals only (compact store): shares NaN, total_*_mean from middle_* variables")
        out["lmg_share"].attrs["description"] = "LMG/Shapley share of R^2 of log|c| on the parts"
        out["cov_share"].attrs["description"] = "Cov(log part, log|c|) / Var(log|c|)"
        return out


def verdict(top: dict[str, str], shares: dict[str, np.ndarray] | None = None) -> str:
    """One sentence: does the paper's sink/tail pattern hold for these top parts?

    ``shares`` (group -> LMG shares over PARTS), when given, puts each share in the sentence,
    so a second part with a small share is not read as a driver.
    """
    pattern = _pattern(top)

    def drivers(group: str) -> str:
        if not top.get(group):
            return "n/a"
        if shares is None:
            return top[group]
        lmg = np.asarray(shares[group])
        order = np.argsort(lmg)[::-1]
        return ", ".join(f"{PARTS[i]} {lmg[i]:.2f}" for i in order)
    found = (f"sink contributions are driven most by {drivers(SINK)} and tail contributions "
             f"by {drivers(TAIL)} (LMG shares of Var log|c|)")
    if pattern == "undetermined":
        return f"Undetermined: {found}; a group had no usable pairs."
    words = {"holds": "As the paper expects", "partly": "Partly as the paper expects",
             "fails": "Unlike the paper's expectation (sink: ratio+cosine, tail: alpha+cosine)"}
    return f"{words[pattern]}, {found}."


def needs(ds: xr.Dataset) -> list[str]:
    """Store variables the decomposition needs in this store's layout."""
    return (ds.attngeom.sources([S.ALPHA, S.CONTRIBUTION])
            + ds.attngeom.sources([S.COSINE, RATIO], [SINK, TAIL]))


def elementwise_groups(ds: xr.Dataset) -> tuple[str, ...]:
    """The key groups whose pairs this store keeps one by one (compact: no middle)."""
    return tuple(g for g in GROUPS if ds.attngeom.elementwise(g))


@shared_docs
def decomposition(ds: xr.Dataset, *, sink_k: int | None = None, tail_w: int | None = None,
                  layers=None, progress: bool = False,
                  block_elements: int = DEFAULT_BLOCK_ELEMENTS) -> xr.Dataset:
    """Split Var(log|c|) into alpha, norm-ratio and cosine parts for sink, tail and middle keys.

    Parameters
    ----------
    {ds}
    sink_k : int, optional
        Sink keys k; a compact store needs its own k.
    tail_w : int, optional
        Tail window w; default the store's ``tail_w`` attribute, else ``vocab.TAIL_W``.
    {layers, progress, block_elements}

    {returns}
    """
    info = describe(ds, sink_k, tail_w, layers)
    require(ds, needs(ds), "the decomposition")
    ds.attngeom.groups(info.k, info.w).require_groups()
    acc = DecompositionAccumulator(elementwise_groups(ds))
    run_pass(ds, info, [acc], elements=block_elements, progress=progress)
    return with_provenance(acc.result(), ds.attrs, sink_k=info.k, tail_w=info.w)
