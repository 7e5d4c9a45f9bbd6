"""Causal interventions inside attention: remove ranked keys, or zero the sink's values.

Removal (faithfulness). At each intervened layer, from that layer's own clean attention
(alpha and head outputs computed from the inputs it receives, which earlier interventions have
already changed), every eligible key j of every query i gets a score (see :data:`METRICS`):

=============================  =====================================  ====================
``attention``                  alpha_ij^h                              >= 0
``value_weighted``             alpha_ij^h ||v~_j^h||                   >= 0 (Kobayashi 2020)
``value_weighted_normalized``  alpha_ij^h ||v~_j^h|| / ||o_i^h||       >= 0
``contribution``               c_ij^h = alpha <o_i^h, v~_j^h> / ||o_i^h||^2   signed
``contribution_layer``         C_ij^h = alpha <o_i, v~_j^h> / ||o_i||^2       signed
=============================  =====================================  ====================

all from head-space Gram identities (:mod:`.geometry`), in float64 whatever the model's dtype
(so that float32 roundoff does not decide near-ties of the ranking). Eligible keys: those the model's mask
allows (causal, sliding window) that are real tokens, for real queries. ``n_remove =
floor(p * n_eligible + 0.5)``; ranking puts higher scores first, ties to the lower position
(``rank="magnitude"`` ranks by |score|). Comprehensiveness removes the ``n_remove`` top-ranked
keys, sufficiency the ``n_remove`` bottom-ranked. Granularity: ``head`` ranks the keys of each
(head, query); ``query`` ranks all (key, head) pairs of a query jointly (ties: lower key, then
lower head); ``token`` ranks keys by the head-summed score (magnitude: |sum|) and removes the key
from every head. Removing key j deletes alpha_ij v~_j^h from o_i^h: alpha set to zero, no
renormalisation.

Sink zeroing (semantic drift). v_j = 0 for the sink keys j < k, alpha kept.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from attngeom.store.vocab import GRANULARITIES, METRICS, RANKS, REMOVAL_MODES

from .archs import attention_layers
from .geometry import Projection, attention_probs, norm_from_gram, repeat_kv

Tensor = torch.Tensor
MODES = REMOVAL_MODES                    # the name tests and scripts import


@dataclass(frozen=True)
class Removal:
    """One removal condition; ``layers`` None means every attention layer."""

    metric: str
    mode: str
    fraction: float
    rank: str = "signed"
    granularity: str = "head"
    layers: frozenset[int] | None = None

    def __post_init__(self) -> None:
        for name, allowed in (("metric", METRICS), ("mode", REMOVAL_MODES), ("rank", RANKS),
                              ("granularity", GRANULARITIES)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"unknown {name} '{getattr(self, name)}'; "
                                 f"use one of {', '.join(allowed)}")
        if not 0.0 <= self.fraction <= 1.0:
            raise ValueError(f"fraction {self.fraction} is outside [0, 1]")


# ------------------------------------------------------------------------------------ scores
def _finite(x: Tensor) -> Tensor:
    """0/0 (a zero head output) scores 0; +-inf clipped to the largest finite float."""
    big = torch.finfo(x.dtype).max
    return torch.nan_to_num(x, nan=0.0, posinf=big, neginf=-big)


def metric_scores(metric: str, alpha: Tensor, vf: Tensor, z: Tensor, proj: Projection) -> Tensor:
    """Score of every (head, query, key): (B, H, T, T), in the inputs' dtype.

    Parameters
    ----------
    alpha : (B, H, T, T) clean attention; vf : (B, H, T, dh) values per query head;
    z : (B, H, T, dh) clean head outputs before W_O (``alpha @ vf``).
    """
    if metric == "attention":
        return alpha
    if metric in ("value_weighted", "value_weighted_normalized"):
        _, value_norm = norm_from_gram(vf, proj.gram)                  # (B, H, T)
        s = alpha * value_norm[:, :, None, :]
        if metric == "value_weighted_normalized":
            _, output_norm = norm_from_gram(z, proj.gram)
            s = s / output_norm[..., None]
        return _finite(s)
    if metric == "contribution":
        zg, output_norm = norm_from_gram(z, proj.gram)                 # z_i G_h, ||o_i^h||
        return _finite(alpha * (zg @ vf.transpose(-1, -2)) / output_norm.square()[..., None])
    if metric == "contribution_layer":
        B, H, T, dh = z.shape
        o = z.transpose(1, 2).reshape(B, T, H * dh) @ proj.weight      # (B, T, d) layer output
        u = (o @ proj.weight.T).view(B, T, H, dh).transpose(1, 2)      # o_i (W_O^h)^T
        layer_sq = o.square().sum(-1)[:, None, :, None]                 # ||o_i||^2
        return _finite(alpha * (u @ vf.transpose(-1, -2)) / layer_sq)
    raise ValueError(f"unknown metric '{metric}'; use one of {', '.join(METRICS)}")


# ------------------------------------------------------------------------------------ selection
def n_remove(n_eligible: Tensor, fraction: float) -> Tensor:
    """floor(p * n + 0.5) in float64, as an integer tensor of the shape of ``n_eligible``."""
    return torch.floor(n_eligible.double() * fraction + 0.5).long()


def _select_last(s: Tensor, eligible: Tensor, fraction: float, mode: str) -> Tensor:
    """Removed entries along the last axis: top (comprehensiveness) or bottom n_remove."""
    n = eligible.sum(-1)                                               # (...)
    k = n_remove(n, fraction)
    key = s.masked_fill(~eligible, float("-inf"))                      # ineligible rank last
    order = torch.sort(key, dim=-1, descending=True, stable=True).indices   # ties: lower first
    r = torch.arange(s.shape[-1], device=s.device)
    if mode == "comprehensiveness":
        chosen = r < k[..., None]
    else:
        chosen = (r >= (n - k)[..., None]) & (r < n[..., None])
    return torch.zeros_like(eligible).scatter(-1, order, chosen)


def select(score: Tensor, eligible: Tensor, fraction: float, mode: str, rank: str = "signed",
           granularity: str = "head") -> Tensor:
    """Which (head, query, key) terms to remove: (B, H, T, T) bool.

    Parameters
    ----------
    score : (B, H, T, T) metric scores; eligible : (B, 1 or H, T, T) bool.
    """
    B, H, T, Tk = score.shape
    e = eligible.expand(B, H, T, Tk)
    if granularity == "token":
        s = score.masked_fill(~e, 0.0).sum(1)                          # (B, T, Tk)
        s = s.abs() if rank == "magnitude" else s
        e_tok = e.any(1)
        return _select_last(s, e_tok, fraction, mode)[:, None] & e
    s = score.abs() if rank == "magnitude" else score
    if granularity == "head":
        return _select_last(s, e, fraction, mode)
    if granularity == "query":                                         # (B, T, Tk*H), key-major
        flat = lambda x: x.permute(0, 2, 3, 1).reshape(B, T, Tk * H)    # noqa: E731
        chosen = _select_last(flat(s), flat(e), fraction, mode)
        return chosen.view(B, T, Tk, H).permute(0, 3, 1, 2)
    raise ValueError(f"unknown granularity '{granularity}'; use one of {', '.join(GRANULARITIES)}")


def eligible_keys(allowed: Tensor, token_mask: Tensor) -> Tensor:
    """(B, 1|H, T, T) bool: allowed by the model's mask, real key, real query."""
    return allowed & token_mask[:, None, None, :] & token_mask[:, None, :, None]


# ------------------------------------------------------------------------------------ handler
class Intervener:
    """Attention handler that runs each layer densely and applies one intervention.

    With ``removal=None`` and ``sink_k=None`` it is the clean model (dense attention). A
    ``probe`` (:class:`~.faithfulness_drift.DriftProbe`-like, with ``observe``) sees every
    layer's head outputs; ``trace`` (a list) receives per-layer tensors for tests.
    """

    def __init__(self, model: nn.Module, removal: Removal | None = None,
                 sink_k: int | None = None, probe=None, trace: list | None = None,
                 projections: dict | None = None):
        found = attention_layers(model)
        self.found = found
        self.n_layers = len(found)
        self.projections: dict[int, Projection] = {} if projections is None else projections
        self.removal = removal
        self.sink_k = sink_k
        self.probe = probe
        self.trace = trace
        self.token_mask: Tensor | None = None

    def projection(self, layer: int) -> Projection:
        """W_O and its per-head Gram matrices in float64 (built once per layer)."""
        if layer not in self.projections:
            found = self.found[layer]
            w = found.weight.detach().double()                            # (H*dv, d)
            full = w @ w.T
            H, dv = found.n_heads, w.shape[0] // found.n_heads
            blocks = full.view(H, dv, H, dv)
            gram = torch.stack([blocks[h, :, h] for h in range(H)])
            self.projections[layer] = Projection(weight=w, gram=gram, full=full)
        return self.projections[layer]

    def attend(self, call) -> Tensor:
        """Head outputs z (B, H, T, dv) of one attention call (:class:`~.hooks.Call`).

        alpha comes from the call's own logits (scale, soft-cap, learned sink logits) in
        float64; a learned sink keeps its weight (removal zeroes real keys only)."""
        layer = call.index
        if layer >= self.n_layers or self.found[layer].module is not call.module:
            raise RuntimeError(f"attention call {layer} ({type(call.module).__name__}) is not "
                               "the layer the probe found there")
        query, key, value = call.query, call.key, call.value
        B, H, T, _ = query.shape
        proj = self.projection(layer)
        mask = self.token_mask
        mask = (torch.ones(B, T, dtype=torch.bool, device=query.device) if mask is None
                else mask.to(query.device))
        allowed = call.allowed & mask[:, None, None, :]
        alpha, _ = attention_probs(query, repeat_kv(key, H), call.scaling, allowed,
                                   call.softcap, call.sinks, dtype=torch.float64)
        vf = repeat_kv(value, H).double()                                # (B, H, T, dv)
        weights, remove = alpha, None
        r = self.removal
        if r is not None and (r.layers is None or layer in r.layers):
            eligible = eligible_keys(allowed, mask)
            score = metric_scores(r.metric, alpha, vf, alpha @ vf, proj)
            remove = select(score, eligible, r.fraction, r.mode, r.rank, r.granularity)
            weights = alpha.masked_fill(remove, 0.0)
        v_used = vf
        if self.sink_k is not None:
            v_used = vf.clone()
            v_used[:, :, : self.sink_k] = 0.0
        z = weights @ v_used                                             # (B, H, T, dh)
        if self.probe is not None:
            self.probe.observe(layer, z, vf, eligible_keys(allowed, mask), mask, proj)
        if self.trace is not None:
            self.trace.append({"layer": layer, "alpha": alpha, "v": vf, "z": z,
                               "allowed": allowed, "token_mask": mask, "remove": remove,
                               "gram": proj.gram, "weight": proj.weight})
        return z.to(query.dtype)


class DriftProbe:
    """Alignment of head outputs with the semantic cone, before and after sink zeroing.

    m_i^h is the mean of the projected values v~_j^h over the non-sink keys j >= k that query i
    may attend to; the probe records cos(o_i^h, m_i^h) = z G m / (||z||_G ||m||_G) in head space.
    In the ``before`` phase (the clean pass) it picks, per sequence and layer, the lowest-norm
    head outputs (norm <= the ``low_fraction`` quantile over heads and queries i >= k); the
    ``after`` phase (the sink-zeroed pass) reads the same (head, query) cells.
    """

    STATS = ("cosine_low", "cosine_all", "output_norm_low", "n_low", "n_all")

    def __init__(self, sink_k: int = 1, low_fraction: float = 0.1):
        self.sink_k, self.low_fraction = sink_k, low_fraction
        self.phase = "before"
        self.low: dict[int, Tensor] = {}
        self.sums: dict[str, dict[int, dict[str, Tensor]]] = {"before": {}, "after": {}}

    def observe(self, layer: int, z: Tensor, vf: Tensor, eligible: Tensor, mask: Tensor,
                proj: Projection) -> None:
        B, H, T, _ = z.shape
        semantic = eligible.clone()
        semantic[..., : self.sink_k] = False
        semantic = semantic.to(vf.dtype)                                 # (B, 1|H, T, T)
        n = semantic.sum(-1)
        m = (semantic @ vf) / n[..., None]                               # (B, H, T, dh)
        zg, output_norm = norm_from_gram(z, proj.gram)
        _, m_norm = norm_from_gram(m, proj.gram)
        cos = (zg * m).sum(-1) / (output_norm * m_norm)                  # (B, H, T)
        query = torch.arange(T, device=z.device) >= self.sink_k
        valid = (mask[:, None, :] & query & (n > 0)).expand(B, H, T) & cos.isfinite()
        if self.phase == "before":
            x = output_norm.masked_fill(~valid, float("nan")).flatten(1)
            threshold = torch.nanquantile(x, self.low_fraction, dim=1)    # (B,)
            self.low[layer] = valid & (output_norm <= threshold[:, None, None])
        low = self.low[layer] & valid
        c = cos.nan_to_num(0.0)
        self.sums[self.phase][layer] = {
            "cosine_low": (c * low).sum((1, 2)), "cosine_all": (c * valid).sum((1, 2)),
            "output_norm_low": (output_norm * low).sum((1, 2)),
            "n_low": low.sum((1, 2)).float(), "n_all": valid.sum((1, 2)).float()}

    def collect(self, phase: str) -> dict[str, Tensor]:
        """Sums per row and layer, (B, L) float64, for each name in :attr:`STATS`."""
        layers = self.sums[phase]
        return {name: torch.stack([layers[i][name] for i in sorted(layers)], 1).double().cpu()
                for name in self.STATS}


@torch.inference_mode()
def forward_logits(model: nn.Module, inputs: dict[str, Tensor], handler) -> Tensor:
    """Logits (B, T, V) of ``model`` with every attention layer routed through ``handler``."""
    from .hooks import attention_handler

    mask = inputs.get("attention_mask")
    handler.token_mask = mask.bool() if mask is not None else None
    with attention_handler(model, handler):
        out = model(**inputs, use_cache=False)
    return out.logits
