"""``attngeom.scores``: every method's scores of a text, as a labeled Dataset (no removal).

For each text the model runs once with a handler that computes, at every attention layer from
the layer's own inputs, in float64 (the definitions the removal ranks by,
:mod:`.layer_scores`, :mod:`.field_scores`):

- the paper's metrics per head: ``attention``, ``value_weighted``,
  ``value_weighted_normalized``, ``contribution``, ``contribution_layer``
  (sequence, layer, head, query, key);
- the field's methods with the heads combined (sequence, layer, query, key): ``alti``
  (Ferrando et al. 2022: max(0, ||y_i||_1 - ||y_i - T_i(x_j)||_1) normalised over j),
  ``norm_residual`` (Kobayashi et al. 2021: ||T_i(x_j)||_2), their rollouts over layers
  ``alti_rollout`` (the paper's input attribution) and ``norm_residual_rollout`` (GlobEnc-style:
  rows normalised to sum 1, then multiplied; Modarressi et al. 2022 also fold in the second
  residual and normalisation, left out here), and attention ``rollout`` (Abnar and Zuidema
  2020: products of 0.5 I + 0.5 mean_h alpha over layers 0..l);
- ``value_zeroing`` (Mohebbi et al. 2023: the cosine distance between the layer's output at i
  and its output with key j's values zeroed in every head, the rest of the layer recomputed,
  :mod:`.zeroing`), normalised over keys as the authors' code does, and its rollout
  ``value_zeroing_rollout`` (their ``compute_joint_attention`` without residual). About T
  reruns of each layer's sublayer per text in float64: refused up front beyond ``max_hours``
  (:func:`~..loading.budget.check_zeroing`).

The layer's output goes on with its float64 attention (rounded to the model's dtype), so later
layers see what the model computes. Encoders (BERT) and decoders alike; the decomposition of
the block (residual, normalisations) is discovered from the model (:mod:`.residual`).
``alti_bias=True`` puts the block's biases into y_i as the authors' code does (its ``resultant``
is the block's output); the default leaves them apart, as the biases are no token's.
"""

from __future__ import annotations

import numpy as np
import torch
import xarray as xr

from attngeom.common import metrics as M
from attngeom.common.errors import Refusal
from attngeom.common.vocab import MAX_HOURS

from ..measurement.archs import attention_layers, is_causal
from ..measurement.geometry import repeat_kv
from ..measurement.hooks import attention_handler
from ..measurement.preserve import unchanged
from .base import exact_alpha, finite
from .context import LayerContext
from .field_scores import TokenRows64, alti_raw, norms, scales, step_rollout
from .interventions import Intervener, watching
from .layer_scores import metric_scores
from .residual import ResidualTap
from .sublayer import BlockTap, rows_per_second
from .zeroing import exact_value_zeroing

HEAD_METHODS = M.BUILTIN[:5]
TOKEN_METHODS = ("alti", "norm_residual", "rollout", "value_zeroing")
ROLLED = {"alti_rollout": "alti", "norm_residual_rollout": "norm_residual",
          "value_zeroing_rollout": "value_zeroing"}
ZEROING = ("value_zeroing", "value_zeroing_rollout")
METHODS = HEAD_METHODS + TOKEN_METHODS + tuple(ROLLED)


def _normalised(x: torch.Tensor) -> torch.Tensor:
    """Rows divided by their sum (0 where the sum is 0)."""
    return finite(x / x.sum(-1, keepdim=True))


class Recorder:
    """Attention handler computing the scores of ``methods`` at every layer (one sequence)."""

    def __init__(self, model, methods, alti_bias: bool = False):
        self.methods, self.alti_bias = tuple(methods), alti_bias
        self.found = attention_layers(model)
        self.projection = Intervener(model).projection
        field = any(m in methods for m in ("alti", "norm_residual", "alti_rollout",
                                            "norm_residual_rollout"))
        self.tap = ResidualTap(model) if field else None
        self.blocks = BlockTap(model) if any(m in methods for m in ZEROING) else None
        self.carry: dict = {}
        self.token_mask = None
        self.out: dict[str, list] = {m: [] for m in methods}

    def attend(self, call) -> torch.Tensor:
        layer, (B, H, T, _) = call.index, call.query.shape
        mask = (torch.ones(B, T, dtype=torch.bool, device=call.query.device)
                if self.token_mask is None else self.token_mask.to(call.query.device))
        allowed = call.allowed & mask[:, None, None, :]
        alpha = exact_alpha(call.query, repeat_kv(call.key, H), allowed, call.scaling,
                            call.softcap, call.sinks)                     # (B, H, T, Tk)
        vf = repeat_kv(call.value, H).double()
        z = alpha @ vf
        proj = self.projection(layer)
        ctx = LayerContext(layer, call.query, call.key, call.value, allowed, call.scaling,
                           call.softcap, call.sinks, proj, carry=self.carry)
        if self.tap is not None:
            ctx.x, ctx.residual = self.tap.x[layer], self.tap.structure[layer]
        for m in self.methods:
            if m in HEAD_METHODS:
                self.out[m].append(metric_scores(m, alpha, vf, z, proj))
        if "rollout" in self.methods:
            step_rollout(ctx, alpha)
            self.out["rollout"].append(self.carry["rollout64"])
        rows = TokenRows64(ctx, torch.zeros(T, dtype=torch.long), torch.arange(T))
        token = {}                                       # the token methods' (T, Tk) scores
        if self.tap is not None:
            t, _ = rows.decomposed(0, torch.arange(T))                   # (T, Tk, d)
            token = self._field(ctx, t[None], z)
        if self.blocks is not None:
            ctx.sublayer = self.blocks.at(layer)
            ctx.x = ctx.sublayer.x if ctx.x is None else ctx.x
            token["value_zeroing"] = _normalised(exact_value_zeroing(rows))
        self._record(token)
        return z.to(call.query.dtype)

    def _record(self, token: dict) -> None:
        """The token methods' scores of the layer, and their rollouts (carried)."""
        for m, x in token.items():
            if m in self.methods:
                self.out[m].append(x)
        for rolled, m in ROLLED.items():
            if rolled in self.methods:
                step = _normalised(token[m]) if m == "norm_residual" else token[m]
                before = self.carry.get(rolled)
                self.carry[rolled] = step if before is None else step @ before
                self.out[rolled].append(self.carry[rolled])

    def _field(self, ctx: LayerContext, t: torch.Tensor, z: torch.Tensor) -> dict:
        """ALTI and the norm-based scores of the layer (T, Tk)."""
        queries = torch.arange(t.shape[1])
        bias = self._bias(ctx, z) if self.alti_bias else None
        if bias is not None:                              # y_i with the biases: theirs
            y = t.sum(2) + bias
            l1 = y.abs().sum(-1)
            raw = (l1[..., None] - (y[:, :, None] - t).abs().sum(-1)).clamp_min(0)
        else:
            raw = alti_raw(t, None, queries)[0]
        return {"alti": _normalised(raw)[0], "norm_residual": norms(t, None, queries)[0][0]}

    def _bias(self, ctx: LayerContext, z: torch.Tensor) -> torch.Tensor:
        """The block output's bias part at each query: Lr(La(b_O) + beta_a) + beta_r."""
        res = ctx.residual
        s_a, s_r = scales(ctx, z, ctx.proj.weight.double())
        b = (res.bias.double() if res.bias is not None
             else torch.zeros(ctx.x.shape[-1], dtype=torch.float64))
        b = b.expand(*ctx.x.shape).clone()
        if res.after_attention is not None:
            b = res.after_attention.linear(b, s_a) + res.after_attention.beta
        if res.after_residual is not None:
            b = res.after_residual.linear(b, s_r) + res.after_residual.beta
        return b


def scores(model, texts, methods=None, *, tokenizer=None, max_length: int = 512,
           alti_bias: bool = False, max_hours: float = MAX_HOURS) -> xr.Dataset:
    """Each method's scores of each text: a labeled Dataset (module docstring).

    Parameters
    ----------
    model : transformers.PreTrainedModel
        A transformers model, decoder or encoder.
    texts : str, list of str or list of list of int
        A text or a list of texts (with ``tokenizer``), or token ids.
    methods : list of str, optional
        Names among :data:`METHODS` (default: all).
    tokenizer : transformers.PreTrainedTokenizerBase, optional
        Tokenizes ``texts`` given as strings; gives the ``token`` coordinate.
    max_length : int
        Tokens per text (longer ones are cut).
    alti_bias : bool
        Put the block's biases into ALTI's y_i, as the authors' code does.
    max_hours : float
        Refuse, before computing anything, value zeroing estimated to take longer here
        (0: no limit).

    Returns
    -------
    xarray.Dataset
        Each method over (sequence, layer, [head,] query, key), NaN beyond a text's length,
        with ``token_id`` (and ``token`` with a tokenizer) over (sequence, query).

    Raises
    ------
    attngeom.common.errors.Refusal
        For an unknown method, texts without a tokenizer, or value zeroing estimated beyond
        ``max_hours``.
    """
    methods = METHODS if methods is None else tuple(methods)
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise Refusal(f"unknown method {', '.join(unknown)}; use some of {', '.join(METHODS)}")
    ids = _ids(texts, tokenizer, max_length)
    if any(m in methods for m in ZEROING):
        _check_cost(model, ids, max_hours)
    device = next(model.parameters()).device
    per_text = []
    with unchanged(model), torch.inference_mode():
        model.eval()
        for row in ids:
            handler = Recorder(model, methods, alti_bias)
            inputs = torch.tensor([row], device=device)
            with attention_handler(model, handler), watching(handler):
                model(input_ids=inputs, attention_mask=torch.ones_like(inputs),
                      **({"use_cache": False} if _takes_cache(model) else {}))
            per_text.append(handler.out)
    return _dataset(per_text, methods, ids, tokenizer, len(attention_layers(model)))


def _check_cost(model, ids, max_hours: float) -> None:
    """Refuse value zeroing's float64 rows when estimated beyond ``max_hours`` here."""
    from ..loading.budget import check_zeroing, zeroing_rows

    L = len(attention_layers(model))
    rows = zeroing_rows(map(len, ids), L, 1, is_causal(model))
    check_zeroing(rows, rows_per_second(model, float64=True), max_hours,
                  f"{len(ids)} texts of up to {max(map(len, ids))} tokens x {L} layers, float64",
                  "fewer texts, a shorter max_length, or methods without value_zeroing",
                  limit="max_hours")


def _takes_cache(model) -> bool:
    import inspect

    params = inspect.signature(model.forward).parameters
    return "use_cache" in params


def _ids(texts, tokenizer, max_length: int) -> list[list[int]]:
    if isinstance(texts, str):
        texts = [texts]
    if all(isinstance(t, str) for t in texts):
        if tokenizer is None:
            raise Refusal("texts need a tokenizer; pass tokenizer= or token ids")
        from ..loading.data import tokenize_texts

        return [list(map(int, r)) for r in tokenize_texts(tokenizer, texts, max_length).ids]
    return [list(map(int, r))[:max_length] for r in texts]


def _dataset(per_text, methods, ids, tokenizer, n_layers: int) -> xr.Dataset:
    S, T = len(ids), max(map(len, ids))
    data = {}
    for m in methods:
        head = m in HEAD_METHODS
        shape = (S, n_layers) + ((per_text[0][m][0].shape[1],) if head else ()) + (T, T)
        x = np.full(shape, np.nan)
        for s, out in enumerate(per_text):
            n = len(ids[s])
            stacked = torch.stack([v[0] if v.dim() == 4 else v.reshape(-1, n, n)[0]
                                   for v in out[m]]).cpu().numpy()
            x[s, :, ..., :n, :n] = stacked
        dims = ("sequence", "layer") + (("head",) if head else ()) + ("query", "key")
        data[m] = (dims, x, {"description": _describe(m)})
    token_id = np.full((S, T), -1, dtype=np.int64)
    for s, row in enumerate(ids):
        token_id[s, :len(row)] = row
    coords = {"sequence": np.arange(S), "layer": np.arange(n_layers), "query": np.arange(T),
              "key": np.arange(T), "token_id": (("sequence", "query"), token_id)}
    if tokenizer is not None:
        tokens = np.full((S, T), "", dtype=object)
        for s, row in enumerate(ids):
            tokens[s, :len(row)] = tokenizer.convert_ids_to_tokens(row)
        coords["token"] = (("sequence", "query"), tokens)
    return xr.Dataset(data, coords=coords, attrs={"attngeom_scores": ",".join(methods)})


def _describe(m: str) -> str:
    if m in ROLLED:
        return (f"rollout of {m.removesuffix('_rollout')} over layers 0..l (rows normalised "
                "first for norm_residual)")
    if m == "rollout":
        return "attention rollout: products of 0.5 I + 0.5 mean_h alpha over layers 0..l"
    if m == "alti":
        return "ALTI: max(0, ||y_i||_1 - ||y_i - T_i(x_j)||_1), normalised over keys j"
    if m == "norm_residual":
        return "||T_i(x_j)||_2: attention, residual and normalisation, linearised"
    if m == "value_zeroing":
        return ("value zeroing: 1 - cos(y_i, y_i with key j's values zeroed), the layer's "
                "outputs; normalised over keys j")
    return M.get(m).paper
