"""Faithfulness perplexities against an independent, hook-free implementation of the rule.

The reference shares no code with attngeom: transformers' own llama runs each text alone (no
padding) with its module-level ``eager_attention_forward`` replaced by a float64 function that
builds the projected values v~_j^h = v_j W_O^h in model space from ``o_proj``'s weight, scores every
causal key with the metric's definition (MISSION.md), ranks each (head, query)'s keys with a plain
``sorted`` (higher first, ties to the lower position), removes floor(p * n + 0.5) of them (top for
comprehensiveness, bottom for sufficiency) by zeroing their alpha without renormalising, at every
layer, and the per-sequence perplexity is exp(mean next-token NLL). attngeom runs the same texts
batched with padding through ``attngeom.extract.faithfulness.experiment``; head granularity, signed
rank.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import xarray as xr

try:
    from tests import tiny_models as tm
    from tests import tolerance as tol
except ImportError:
    import tiny_models as tm
    import tolerance as tol

from attngeom.extract.faithfulness import experiment as F

TEXTS = ["we can make all of the people look up and write more than one number",
         "the one is there and it was the time of people who said",
         "a way to see them", "it is what they said for this one", "there was a time"]
METRICS = ("attention", "value_weighted_normalized", "contribution", "contribution_layer")
FRACTIONS = (0.25, 0.5)


def _scores(metric: str, a: np.ndarray, vt: np.ndarray) -> np.ndarray:
    """(H, T, T) float64 score of key j for query i in head h; a (H, T, T), vt (H, T, d)."""
    o_h = np.einsum("hij,hjd->hid", a, vt)
    if metric == "attention":
        return a
    if metric == "value_weighted":
        return a * np.linalg.norm(vt, axis=-1)[:, None, :]
    if metric == "value_weighted_normalized":
        return a * np.linalg.norm(vt, axis=-1)[:, None, :] / np.linalg.norm(o_h, axis=-1)[..., None]
    if metric == "contribution":
        return a * np.einsum("hid,hjd->hij", o_h, vt) / (o_h ** 2).sum(-1)[..., None]
    o = o_h.sum(0)
    return a * np.einsum("id,hjd->hij", o, vt) / (o ** 2).sum(-1)[None, :, None]


def _removed(score: np.ndarray, p: float, mode: str) -> np.ndarray:
    """(H, T, T) bool, the rule written as loops over heads and queries (causal keys j <= i)."""
    H, T, _ = score.shape
    out = np.zeros(score.shape, dtype=bool)
    for h in range(H):
        for i in range(T):
            ranked = sorted(range(i + 1), key=lambda j: (-score[h, i, j], j))
            n = math.floor(p * (i + 1) + 0.5)
            chosen = ranked[:n] if mode == "comprehensiveness" else ranked[i + 1 - n:]
            out[h, i, chosen] = True
    return out


def _intervened_eager(metric: str, mode: str, p: float):
    def attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        B, H, T, dh = query.shape
        rep = H // key.shape[1]
        k = key.double().repeat_interleave(rep, dim=1)[0].numpy()            # (H, T, dh)
        v = value.double().repeat_interleave(rep, dim=1)[0].numpy()
        q = query.double()[0].numpy()
        causal = np.tril(np.ones((T, T), dtype=bool))
        logits = np.where(causal, q @ k.transpose(0, 2, 1) * scaling, -np.inf)
        a = np.exp(logits - logits.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        w_o = module.o_proj.weight.double().detach().numpy()                    # (d, H*dh)
        vt = np.stack([v[h] @ w_o[:, h * dh:(h + 1) * dh].T for h in range(H)])   # (H, T, d)
        a = np.where(_removed(_scores(metric, a, vt), p, mode), 0.0, a)
        z = torch.as_tensor(a @ v, dtype=query.dtype)[None]                    # (1, H, T, dh)
        return z.transpose(1, 2).contiguous(), None
    return attention


def _reference_ppl(model, ids: list[int], start: int = 1) -> float:
    """exp(mean NLL of ids[start:]), each token predicted from the logits before it."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].double()
    lp = torch.log_softmax(logits, -1)
    return math.exp(-np.mean([float(lp[t - 1, ids[t]]) for t in range(start, len(ids))]))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("faith-ref")
    tm.save_tiny("llama", root / "llama")
    (root / "texts.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    cfg = F.FaithConfig(metrics=METRICS, ranks=("signed",), fractions=FRACTIONS,
                        granularity="head", drift=False, batch_size=2, block_size=3)
    path = F.faithfulness(str(root / "llama"), str(root / "texts.jsonl"), root / "out", cfg,
                          progress=False, log=lambda m: None)
    with xr.open_dataset(path, engine="h5netcdf") as f:
        return root, f.load()


def test_perplexities_equal_the_hook_free_reference(run, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.models.llama import modeling_llama

    root, ds = run
    model = AutoModelForCausalLM.from_pretrained(root / "llama", attn_implementation="eager",
                                                 dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(root / "llama")
    ids = [tok(t)["input_ids"] for t in TEXTS]
    clean = [_reference_ppl(model, x) for x in ids]
    tol.assert_close(ds["clean_ppl"].values, clean, tol.FAITHFULNESS_PPL, "clean_ppl")
    moved = 0
    for metric in METRICS:
        for mode in ("comprehensiveness", "sufficiency"):
            for p in FRACTIONS:
                monkeypatch.setattr(modeling_llama, "eager_attention_forward",
                                    _intervened_eager(metric, mode, p))
                want = [_reference_ppl(model, x) for x in ids]
                got = ds["ppl"].sel(metric=metric, rank="signed", mode=mode, fraction=p)
                tol.assert_close(got.values, want, tol.FAITHFULNESS_PPL, f"{metric} {mode} {p}")
                moved += int(np.abs(np.array(want) / clean - 1).max() > 1e-2)
    assert moved >= len(METRICS)            # the interventions change the perplexity


GSM8K = [("what is the one number", "it is one #### 1"),
         ("they said there was a time for people", "a way to see them #### 2"),
         ("can we write more than one number", "we can make all of the people look up #### 3")]


def test_gsm8k_answer_only_scores_the_answer_tokens(run, monkeypatch):
    """--task gsm8k-answer: perplexity over the answer tokens given "Question: ...\nAnswer:"."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.models.llama import modeling_llama

    root, _ = run
    data = root / "gsm8k.jsonl"
    data.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in GSM8K))
    cfg = F.FaithConfig(task="gsm8k-answer", metrics=("contribution",), ranks=("signed",),
                        fractions=(0.5,), drift=False, batch_size=2)
    path = F.faithfulness(str(root / "llama"), str(data), root / "gsm", cfg, progress=False,
                          log=lambda m: None)
    with xr.open_dataset(path, engine="h5netcdf") as f:
        ds = f.load()
    model = AutoModelForCausalLM.from_pretrained(root / "llama", attn_implementation="eager",
                                                 dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(root / "llama")
    rows = [(tok(f"Question: {q}\nAnswer:")["input_ids"],
             tok(" " + a, add_special_tokens=False)["input_ids"]) for q, a in GSM8K]
    clean = [_reference_ppl(model, c + a, start=len(c)) for c, a in rows]
    tol.assert_close(ds["clean_ppl"].values, clean, tol.FAITHFULNESS_PPL, "clean_ppl")
    np.testing.assert_array_equal(ds["n_scored"].values, [len(a) for _, a in rows])
    monkeypatch.setattr(modeling_llama, "eager_attention_forward",
                        _intervened_eager("contribution", "comprehensiveness", 0.5))
    want = [_reference_ppl(model, c + a, start=len(c)) for c, a in rows]
    got = ds["ppl"].sel(metric="contribution", rank="signed", mode="comprehensiveness")
    tol.assert_close(got.values[0], want, tol.FAITHFULNESS_PPL, "ppl")
