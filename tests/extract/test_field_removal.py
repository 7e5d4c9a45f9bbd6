"""Removal by the field's methods and by the random floor, against a hook-free reference.

ALTI, ALTI-sa, the norm-based method (and its -sa variant) and rollout rank keys at token
granularity. The reference shares no code with attngeom: transformers' llama (GQA, pre-LN)
runs each text alone with ``eager_attention_forward`` replaced by a float64 function that
builds v~_j^h = v_j W_O^h in model space from ``o_proj``'s weight, takes the layer's residual
input x from a plain forward pre-hook on the decoder layer, scores each causal key of each
query from the equations (the rollout from the attention of the layers below, kept across the
calls of one forward), ranks with ``sorted`` (higher first, ties to the lower position),
removes floor(p n + 0.5) keys from every head, and the perplexity is exp(mean NLL). The share
of removed sets holding the query's own key is counted there too. The random floor cannot be
recomputed independently (it is a hash); its removal counts, its independence from the batch
and its spread over key positions are checked instead.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import xarray as xr

import tiny_models as tm
import tolerance as tol
from attngeom.extract.faithfulness import experiment as F

TEXTS = ["we can make all of the people look up and write more than one number",
         "the one is there and it was the time of people who said",
         "a way to see them", "it is what they said for this one", "there was a time"]

METRICS = ("alti", "alti_sa", "norm_residual", "norm_residual_sa", "rollout")
MODES = ("comprehensiveness", "sufficiency")
FRACTION = 0.5


def _token_scores(metric: str, a: np.ndarray, vt: np.ndarray, x: np.ndarray,
                  state: dict) -> np.ndarray:
    """(T, T) float64 score of key j for query i; a (H, T, T), vt (H, T, d), x (T, d)."""
    T = a.shape[-1]
    if metric == "rollout":
        step = 0.5 * np.eye(T) + 0.5 * a.mean(0)
        state["R"] = step if "R" not in state else step @ state["R"]
        return state["R"]
    t = np.einsum("hij,hjd->ijd", a, vt)                               # attention parts
    own = t[np.arange(T), np.arange(T)].copy()
    t[np.arange(T), np.arange(T)] += x                                 # the residual at j = i
    y = t.sum(1)
    if metric.startswith("alti"):
        score = np.maximum(0, np.abs(y).sum(-1)[:, None] - np.abs(y[:, None] - t).sum(-1))
        if metric.endswith("_sa"):
            score[np.arange(T), np.arange(T)] = np.maximum(
                0, np.abs(y).sum(-1) - np.abs(y - own).sum(-1))
        return score
    score = np.linalg.norm(t, axis=-1)
    if metric.endswith("_sa"):
        score[np.arange(T), np.arange(T)] = np.linalg.norm(own, axis=-1)
    return score


def _reference_ppl(model, ids: list[int]) -> float:
    """exp(mean NLL of ids[1:]), each token predicted from the logits before it."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].double()
    lp = torch.log_softmax(logits, -1)
    return math.exp(-np.mean([float(lp[t - 1, ids[t]]) for t in range(1, len(ids))]))


def _removed(score: np.ndarray, mode: str) -> np.ndarray:
    T = score.shape[0]
    out = np.zeros(score.shape, dtype=bool)
    for i in range(T):
        ranked = sorted(range(i + 1), key=lambda j: (-score[i, j], j))
        n = math.floor(FRACTION * (i + 1) + 0.5)
        out[i, ranked[:n] if mode == "comprehensiveness" else ranked[i + 1 - n:]] = True
    return out


def _intervened(model, metric: str, mode: str, counts: list):
    state: dict = {}
    residual: dict = {}
    def keep(n):
        def hook(module, args, kwargs):
            residual[n] = kwargs.get("hidden_states", args[0] if args else None)
        return hook

    for n, layer in enumerate(model.model.layers):
        layer.register_forward_pre_hook(keep(n), with_kwargs=True)
    order = {id(layer.self_attn): n for n, layer in enumerate(model.model.layers)}

    def attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        B, H, T, dh = query.shape
        rep = H // key.shape[1]
        k = key.double().repeat_interleave(rep, dim=1)[0].numpy()
        v = value.double().repeat_interleave(rep, dim=1)[0].numpy()
        logits = np.where(np.tril(np.ones((T, T), dtype=bool)),
                          query.double()[0].numpy() @ k.transpose(0, 2, 1) * scaling, -np.inf)
        a = np.exp(logits - logits.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        w_o = module.o_proj.weight.double().detach().numpy()                # (d, H*dh)
        vt = np.stack([v[h] @ w_o[:, h * dh:(h + 1) * dh].T for h in range(H)])
        x = residual[order[id(module)]][0].double().detach().numpy()
        removed = _removed(_token_scores(metric, a, vt, x, state), mode)
        counts.append((removed.any(-1).sum(), np.diagonal(removed).sum()))
        a = np.where(removed[None], 0.0, a)
        return torch.as_tensor(a @ v, dtype=query.dtype)[None].transpose(1, 2).contiguous(), None
    return attention


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("field-ref")
    tm.save_tiny("llama", root / "llama")
    (root / "texts.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    cfg = F.FaithConfig(metrics=METRICS + ("random",), ranks=("signed",), fractions=(FRACTION,),
                        granularity="token", drift=False, batch_size=2, block_size=3)
    path = F.faithfulness(str(root / "llama"), str(root / "texts.jsonl"), root / "out", cfg,
                          progress=False, log=lambda m: None)
    with xr.open_dataset(path, engine="h5netcdf") as f:
        return root, cfg, f.load()


def test_perplexities_and_self_key_shares_equal_the_hook_free_reference(run, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.models.llama import modeling_llama

    root, _, ds = run
    tok = AutoTokenizer.from_pretrained(root / "llama")
    ids = [tok(t)["input_ids"] for t in TEXTS]
    moved = 0
    for metric in METRICS:
        for mode in MODES:
            model = AutoModelForCausalLM.from_pretrained(
                root / "llama", attn_implementation="eager", dtype=torch.float32).eval()
            want, share = [], []
            for x in ids:
                counts: list = []
                monkeypatch.setattr(modeling_llama, "eager_attention_forward",
                                    _intervened(model, metric, mode, counts))
                want.append(_reference_ppl(model, x))
                rows, own = np.sum(counts, 0)
                share.append(own / rows)
            at = dict(metric=metric, rank="signed", mode=mode, fraction=FRACTION)
            tol.assert_close(ds["ppl"].sel(at).values, want, tol.FAITHFULNESS_PPL,
                             f"{metric} {mode}")
            np.testing.assert_array_equal(ds["self_key_removed"].sel(at).values, share)
            clean = ds["clean_ppl"].values
            moved += int(np.abs(np.array(want) / clean - 1).max() > 1e-2)
    assert moved >= len(METRICS)                        # the interventions change perplexity
    # as published the self key carries the residual: ALTI removes it in most top sets
    top = dict(rank="signed", mode="comprehensiveness", fraction=FRACTION)
    assert float(ds["self_key_removed"].sel(metric="alti", **top).mean()) > \
        float(ds["self_key_removed"].sel(metric="alti_sa", **top).mean())


def test_random_floor_is_seeded_batch_free_and_spread_over_positions(run, tmp_path):
    from attngeom.extract.faithfulness.context import LayerContext
    from attngeom.extract.faithfulness.random_scores import scores

    root, cfg, ds = run
    again = F.faithfulness(str(root / "llama"), str(root / "texts.jsonl"), tmp_path,
                           F.FaithConfig(**{**cfg.__dict__, "metrics": ("random",),
                                            "batch_size": 1}),
                           progress=False, log=lambda m: None)
    with xr.open_dataset(again, engine="h5netcdf") as f:          # the same keys removed:
        tol.assert_close(f["ppl"].values[0], ds["ppl"].sel(metric="random").values,  # padding
                         tol.FAITHFULNESS_PPL, "random, batch 1 vs 2")    # moves float32 bits
    # independent layers and rows: a uniform permutation per (layer, row, head, query)
    q = torch.zeros(2, 4, 64, 8)
    ctx = [LayerContext(n, q, q, q, None, 1.0, None, None, None, rows=torch.tensor([5, 9]))
           for n in range(2)]
    s = [scores(c, (2, 4, 64, 64)).numpy() for c in ctx]
    assert not np.array_equal(s[0], s[1]) and not np.array_equal(s[0][0], s[0][1])
    assert np.array_equal(s[0], scores(ctx[0], (2, 4, 64, 64)).numpy())        # seeded
    assert ((s[0] >= 0) & (s[0] < 1)).all() and np.all(s[0] * (1 << 24) % 1 == 0)
    top = s[0].reshape(-1, 64).argmax(-1)                      # where each row's top key lies
    counts = np.bincount(top, minlength=64)
    from scipy import stats
    assert stats.chisquare(counts).pvalue > 1e-3               # no favoured position
