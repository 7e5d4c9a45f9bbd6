"""Causal interventions inside attention: remove ranked keys, or zero the sink's values.

Removal (faithfulness). At each intervened layer, from that layer's own clean attention
(alpha and head outputs computed from the inputs it receives, which earlier interventions have
already changed), every eligible key j of every query i gets a score of the chosen metric
(the registry, :mod:`attngeom.common.metrics`):

=============================  =====================================  ====================
``attention``                  alpha_ij^h                              >= 0
``value_weighted``             alpha_ij^h ||v~_j^h||                   >= 0 (Kobayashi 2020)
``value_weighted_normalized``  alpha_ij^h ||v~_j^h|| / ||o_i^h||       >= 0
``contribution``               c_ij^h = alpha <o_i^h, v~_j^h> / ||o_i^h||^2   signed
``contribution_layer``         C_ij^h = alpha <o_i, v~_j^h> / ||o_i||^2       signed
=============================  =====================================  ====================

all from head-space Gram identities (:mod:`..measurement.geometry`). Eligible keys: those the
model's mask allows (causal, sliding window) that are real tokens, for real queries.
``n_remove = floor(p * n_eligible + 0.5)``; ranking puts higher scores first, ties to the lower
position (``rank="magnitude"`` ranks by |score|). Comprehensiveness removes the ``n_remove``
top-ranked keys, sufficiency the ``n_remove`` bottom-ranked. Granularity: ``head`` ranks the
keys of each (head, query); ``query`` ranks all (key, head) pairs of a query jointly (ties:
lower key, then lower head); ``token`` ranks keys by the head-summed score (magnitude: |sum|)
and removes the key from every head. Removing key j deletes alpha_ij v~_j^h from o_i^h: alpha
set to zero, no renormalisation.

Precision and near-ties. Every pass (clean, sink-zeroed, removal) computes attention densely in
float32 (or the model's dtype if wider), like the model's own eager attention (the same
``torch.softmax``; masks applied as additive 0 / -inf biases and the removal as a 0 / 1 factor
of alpha, because torch's CPU ``masked_fill`` is a scalar loop; alpha @ v over blocks of query
rows that stop at their last allowed key, :func:`~.dense.row_blocks`), in scratch tensors
reused from layer to layer (:mod:`.dense`). The ranking is that of the float64 scores of the
layer's inputs (:func:`~.layer_scores.metric_scores`): the scores are computed in float32
(:func:`~.layer_scores.fast_scores`) with a bound on their relative rounding error, the cut
is read from one sort of the values (:mod:`.selection`), and where the two keys at a ranking
row's cut are closer than the bound (a tie at the cut included), the keys whose own error
intervals reach the cut's are ranked again from their float64 scores, recomputed for that row
alone (:mod:`.near`, :class:`~.layer_scores.ExactScores`). Ties, in float32 and in float64, go
to the lower position. The removal sets can differ from ranking every row in
float64 only (1) where a float32 error exceeds its bound (each metric's ``error_unit``, fitted
at ten times the largest seen), or (2) for the signed metrics, between keys whose scores lie
within float32 rounding of *zero* (keys almost orthogonal to the output: their error is not
relative to the score; this matters for rank=magnitude sufficiency and for head sums at token
granularity; benchmarks/RESULTS.md counts such rows on real text). Across layers, the inputs
of a layer carry the float32 rounding of the layers before it, as in any float32 forward pass.

Sink zeroing (semantic drift). v_j = 0 for the sink keys j < k, alpha kept.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import nn

from attngeom.common import metrics as M
from attngeom.common.errors import Refusal
from attngeom.common.vocab import (DRIFT_LOW_FRACTION, GRANULARITIES, RANKS, REMOVAL_MODES,
                                         SINK_K)

from ..measurement.archs import attention_layers
from ..measurement.geometry import Projection, norm_from_gram, repeat_kv
from ..measurement.hooks import attention_handler
from .base import exact_alpha
from .context import LayerContext
from .dense import attention_weights, weighted_values
from .kernels import kernels
from .layer_scores import ExactScores, fast_scores, metric_scores  # noqa: F401  (API)
from .masks import identity, layer_masks
from .removal_scores import logit_scale
from .residual import ResidualTap
from .selection import Workspace, n_remove, select  # noqa: F401  (n_remove: API)
from .sublayer import BlockTap

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
        for name, allowed in (("metric", M.names()), ("mode", REMOVAL_MODES), ("rank", RANKS),
                              ("granularity", GRANULARITIES)):
            if getattr(self, name) not in allowed:
                raise Refusal(f"unknown {name} '{getattr(self, name)}'; "
                                 f"use one of {', '.join(allowed)}")
        M.check_granularity((self.metric,), self.granularity)
        if not 0.0 <= self.fraction <= 1.0:
            raise Refusal(f"fraction {self.fraction} is outside [0, 1]")


def eligible_keys(allowed: Tensor, token_mask: Tensor) -> Tensor:
    """(B, 1|H, T, T) bool: allowed by the model's mask, real key, real query."""
    return allowed & token_mask[:, None, None, :] & token_mask[:, None, :, None]


# ------------------------------------------------------------------------------------ handler
class Intervener:
    """Attention handler that runs each layer densely and applies one intervention.

    With ``removal=None`` and ``sink_k=None`` it is the clean model (dense attention). A
    ``probe`` (:class:`DriftProbe`-like, with ``observe``) sees every layer's head outputs;
    ``trace`` (a list) receives per-layer tensors for tests (alpha and v there are the exact
    float64 values the ranking follows). ``projections`` and ``workspace`` may be shared by
    the handlers of several passes (W_O's Gram matrices; scratch tensors). ``rows`` (B,): the
    batch rows' content keys (:func:`~.context.row_keys`; the random ranking's), set per batch.

    After a removal pass, ``self_counts`` holds per batch row the ranking rows that removed a
    key and, of those, the rows whose removed keys include the query's own key (summed over
    the intervened layers): the share the reports give (ALTI and the norm-based method score
    that key with the residual x_i, which removing it does not remove).
    """

    def __init__(self, model: nn.Module, removal: Removal | None = None,
                 sink_k: int | None = None, probe=None, trace: list | None = None,
                 projections: dict | None = None, workspace: Workspace | None = None):
        found = attention_layers(model)
        self.found = found
        self.n_layers = len(found)
        self.projections: dict[int, Projection] = {} if projections is None else projections
        self.removal = removal
        self.kernels = None if removal is None else kernels(removal.metric)
        needs = () if removal is None else M.get(removal.metric).needs
        self.tap = ResidualTap(model) if M.RESIDUAL in needs else None
        self.blocks = BlockTap(model) if M.SUBLAYER in needs else None
        self.rows: Tensor | None = None
        self.carry: dict = {}
        self.self_counts: Tensor | None = None
        self.sink_k = sink_k
        self.probe = probe
        self.trace = trace
        self.token_mask: Tensor | None = None
        self.work = Workspace() if workspace is None else workspace
        self.masks: dict = {}           # the layers' masks, by the model's mask (masks.py)
        self.start = 0                  # layers skipped below the first call (resume.py)

    def projection(self, layer: int, dtype: torch.dtype = torch.float64) -> Projection:
        """W_O and its per-head Gram matrices in ``dtype`` (built once per layer and dtype)."""
        cached = layer if dtype == torch.float64 else (layer, dtype)
        if cached not in self.projections:
            if dtype != torch.float64:
                exact = self.projection(layer)
                self.projections[cached] = Projection(
                    weight=exact.weight.to(dtype), gram=exact.gram.to(dtype),
                    full=exact.full.to(dtype))
                return self.projections[cached]
            found = self.found[layer]
            w = found.weight.detach().double()                            # (H*dv, d)
            full = w @ w.T
            H, dv = found.n_heads, w.shape[0] // found.n_heads
            blocks = full.view(H, dv, H, dv)
            gram = torch.stack([blocks[h, :, h] for h in range(H)])
            self.projections[cached] = Projection(weight=w.contiguous(), gram=gram, full=full)
        return self.projections[cached]

    def context(self, layer: int, call, allowed: Tensor, proj: Projection) -> LayerContext:
        """The layer's :class:`~.context.LayerContext` for the removal's kernels."""
        x = residual = sublayer = None
        if self.tap is not None:
            x, residual = self.tap.x.get(layer), self.tap.structure[layer]
        if self.blocks is not None:
            sublayer = self.blocks.at(layer)
            x = sublayer.x if x is None else x
        return LayerContext(layer, call.query, call.key, call.value, allowed, call.scaling,
                            call.softcap, call.sinks, proj, rows=self.rows, x=x,
                            residual=residual, sublayer=sublayer, queries=self.token_mask,
                            carry=self.carry)

    def count_self(self, kept: Tensor, eligible: Tensor) -> None:
        """Add this layer's rows with a removal, and those removing the query's own key.

        ``kept`` (B, 1|H, T, Tk) is 0 only at removed keys, each eligible for the row (the
        factor of :func:`~.selection.select`), unless the heads differ in eligibility and
        share one factor (token granularity): then the removed mask is formed."""
        T = kept.shape[2]
        if kept.shape[1] == 1 and eligible.shape[1] > 1:
            removed = (kept == 0) & eligible                             # (B, H, T, Tk)
            has, own = removed.any(-1), removed[..., :T].diagonal(dim1=2, dim2=3)
        else:                                    # one pass over the factor, and its diagonal
            has = kept.amin(-1) == 0                                     # (B, 1|H, T)
            own = kept[..., :T].diagonal(dim1=2, dim2=3) == 0
        counts = torch.stack([has.sum((1, 2)), own.sum((1, 2))], 1).double()
        self.self_counts = counts if self.self_counts is None else self.self_counts + counts

    def real_tokens(self, B: int, T: int, device) -> Tensor:
        """The batch's real tokens (B, T) bool on ``device`` (all, without a token mask): one
        tensor for every layer of a forward pass, so that :func:`~.masks.layer_masks` finds
        the masks it made."""
        m = self.token_mask
        key = ("tokens", B, T, str(device), None if m is None else identity(m))
        if key not in self.masks:
            self.masks[key] = (m, torch.ones(B, T, dtype=torch.bool, device=device)
                               if m is None else m.to(device))
        return self.masks[key][1]

    def attend(self, call) -> Tensor:
        """Head outputs z (B, H, T, dv) of one attention call (:class:`~.hooks.Call`).

        alpha comes from the call's own logits (scale, soft-cap, learned sink logits) in
        float32 (the model's dtype if wider), the ranking from float64 where it is near (see
        the module docstring); a learned sink keeps its weight (removal zeroes real keys only)."""
        layer = call.index + self.start
        if layer >= self.n_layers or self.found[layer].module is not call.module:
            raise RuntimeError(f"attention call {layer} ({type(call.module).__name__}) is not "
                               "the layer the probe found there")
        query, key, value = call.query, call.key, call.value
        B, H, T, _ = query.shape
        dtype = torch.promote_types(query.dtype, torch.float32)          # computed in
        proj = self.projection(layer)
        mask = self.real_tokens(B, T, query.device)
        masks = layer_masks(self.masks, call.allowed, mask)        # made once per mask
        allowed, blocks = masks.allowed, masks.blocks   # blocks: rows that stop short
        scaling, softcap, sinks = call.scaling, call.softcap, call.sinks
        shape = (B, H, T, key.shape[2])
        scores = self.work.get("score", shape, dtype, query.device)   # the logits first
        alpha = attention_weights(query, key, allowed, scaling, softcap, dtype, sinks,
                                  out=self.work.get("alpha", shape, dtype, query.device),
                                  logits=scores, bias=masks.attended.fill(-torch.inf, dtype))
        weights, kept = alpha, None
        r = self.removal
        if r is not None:
            ctx = self.context(layer, call, allowed, proj)
            if self.kernels.step is not None:           # every layer, before its removal
                self.kernels.step(ctx, alpha)
        if r is not None and (r.layers is None or layer in r.layers):
            eligible = masks.eligible.mask
            by = M.get(r.metric).ranked_by(r.granularity)
            score, error = fast_scores(by, alpha, value, self.projection(layer, dtype),
                                       logit_scale(query, key, scaling, sinks), scores, blocks,
                                       ctx)
            exact = ExactScores(by, query, key, value, allowed, scaling, softcap, proj,
                                sinks, ctx)
            kept = select(score, masks.eligible, r.fraction, r.mode, r.rank, r.granularity,
                          error, exact, self.work, inplace=score is not alpha, keep=True)
            self.count_self(kept, eligible)
            weights = alpha.mul_(kept)                                   # removed terms: 0
        v_used = value
        if self.sink_k is not None:
            v_used = value.clone()
            v_used[:, :, : self.sink_k] = 0.0
        z = weighted_values(weights, v_used, blocks)                     # (B, H, T, dv)
        if self.probe is not None:
            self.probe.observe(layer, z, value, eligible_keys(allowed, mask), mask, proj)
        if self.trace is not None:                 # the exact (float64) layer, for tests
            self.trace.append({
                "layer": layer, "v": repeat_kv(value, H).double(), "z": z,
                "alpha": exact_alpha(query, repeat_kv(key, H), allowed, scaling, softcap,
                                     sinks),
                "allowed": allowed, "token_mask": mask,
                "remove": None if kept is None else
                ((kept == 0) & eligible_keys(allowed, mask)).expand(shape),
                "gram": proj.gram, "weight": proj.weight})
        if layer == self.n_layers - 1:  # the pass's scratch freed before the logits are made
            self.work.clear()
            self.masks.clear()
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

    def __init__(self, sink_k: int = SINK_K, low_fraction: float = DRIFT_LOW_FRACTION):
        self.sink_k, self.low_fraction = sink_k, low_fraction
        self.phase = "before"
        self.low: dict[int, Tensor] = {}
        self.sums: dict[str, dict[int, dict[str, Tensor]]] = {"before": {}, "after": {}}

    def observe(self, layer: int, z: Tensor, value: Tensor, eligible: Tensor, mask: Tensor,
                proj: Projection) -> None:
        """One layer: z (B, H, T, dh) head outputs, value (B, G, T, dh) per kv head."""
        B, H, T, _ = z.shape
        semantic = eligible.clone()
        semantic[..., : self.sink_k] = False
        semantic = semantic.double()                                     # (B, 1|H, T, T)
        n = semantic.sum(-1)
        v = value.double() if semantic.shape[1] == 1 else repeat_kv(value, H).double()
        m = repeat_kv((semantic @ v) / n[..., None], H)                  # (B, H, T, dh)
        z = z.double()
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
    mask = inputs.get("attention_mask")
    handler.token_mask = mask.bool() if mask is not None else None
    if hasattr(handler, "masks"):
        handler.masks.clear()                      # the masks of this pass's batch only
    with attention_handler(model, handler), watching(handler):
        out = model(**inputs, use_cache=False)
    return out.logits


@contextlib.contextmanager
def watching(handler):
    """The handler's taps (residual, blocks) during one forward pass (a fresh carry)."""
    if hasattr(handler, "carry"):
        handler.carry = {}
    with contextlib.ExitStack() as stack:
        for name in ("tap", "blocks"):
            tap = getattr(handler, name, None)
            if tap is not None:
                stack.enter_context(tap)
        yield handler
