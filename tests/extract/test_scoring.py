"""Scoring (attngeom.extract.faithfulness.scoring) and the faithfulness run (extract.faithfulness*).

Log-probs are checked against sums written out by hand from logits (a bigram logit table whose
answers are known, or a tiny model run on each text alone, without padding).
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
from attngeom.extract.faithfulness.scoring import (encode_pair, prepare_answers, prepare_choices,
                                      prepare_texts, span_logprobs, unit_scores)
from attngeom.extract.loading.tasks import AnswerItem, ChoiceItem
from attngeom.store.format.metrics import DEFAULT as METRICS
from attngeom.store.format.vocab import RANKS
from attngeom.store.format.manifest import file_sha256, read_manifest
from attngeom.store.errors import StoreError

TEXTS = ["the one is there and it was the time of people",
         "a way to see them",
         "we can make all of the people look up and write more than one number",
         "it is", "for this one they said what was"]


@pytest.fixture(scope="module")
def tok():
    return tm.make_tokenizer("llama")


def ids_of(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


# ------------------------------------------------------------------------------ primitives
def _log_softmax_size(logits: np.ndarray) -> np.ndarray:
    """1 + |x| + max |x| per entry: what float32 log_softmax's rounding scales with (x - max,
    a normaliser of V exps, its log, the subtraction: gamma(V + 4) times this)."""
    return 1 + np.abs(logits) + np.abs(logits).max(-1, keepdims=True)


@pytest.mark.parametrize("chunk", [1024, 2])          # 2: a row's positions in several chunks
def test_span_logprobs_matches_loop(monkeypatch, chunk):
    import attngeom.extract.faithfulness.scoring as scoring

    monkeypatch.setattr(scoring, "LOGIT_CHUNK", chunk)
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 7, 11, generator=gen)
    rows, starts = np.array([0, 1, 1, 1]), np.array([1, 3, 7, 3])   # the last two share a row
    tokens = [[4, 5, 6], [1, 2], [9], [3]]                          # and a position
    got = span_logprobs(logits, rows, starts, tokens)
    lp = torch.log_softmax(logits.double(), -1)
    want = [sum(float(lp[r, s + m - 1, t]) for m, t in enumerate(tt))
            for r, s, tt in zip(rows, starts, tokens)]
    size = _log_softmax_size(logits.double().numpy())
    span = [sum(size[r, s + m - 1, t] for m, t in enumerate(tt))
            for r, s, tt in zip(rows, starts, tokens)]
    tol.assert_close(got, want, tol.dot(logits.shape[-1] + 4, span, vs=tol.F64), "span")


def test_encode_pair_keeps_bos_and_splits_the_room(tok):
    context = " ".join(["the"] * 20)
    long_cont, short_cont = " " + " ".join(["a"] * 10), " one two"
    ids, n_ctx, cut = encode_pair(tok, context, long_cont, 12)
    assert cut and len(ids) == 12 and ids[0] == tm.BOS_ID
    assert n_ctx == 1 + 6 and ids[n_ctx:] == ids_of(tok, long_cont)[:5]   # room 11: 6 + 5
    ids, n_ctx, _ = encode_pair(tok, context, short_cont, 12)
    assert ids[n_ctx:] == ids_of(tok, short_cont) and n_ctx == 10
    ids, n_ctx, _ = encode_pair(tok, "it is", long_cont, 12)                 # short context
    assert ids[:n_ctx] == [tm.BOS_ID] + ids_of(tok, "it is") and len(ids) == 12
    ids, n_ctx, cut = encode_pair(tok, "it is", short_cont, 12)
    assert not cut and ids == [tm.BOS_ID] + ids_of(tok, "it is") + ids_of(tok, short_cont)


def test_answer_spans_are_the_answer_tokens(tok):
    item = AnswerItem(question="what is the number", answer="it is one #### 1")
    prep = prepare_answers(tok, [item], 64)
    row = prep.rows[0]
    assert prep.span_tokens[0] == ids_of(tok, " it is one #### 1")
    assert row[prep.span_start[0]:] == prep.span_tokens[0]
    assert row[:prep.span_start[0]] == tok(item.context)["input_ids"]


def _bigram_logits(rows: list[list[int]], table: np.ndarray) -> torch.Tensor:
    T = max(len(r) for r in rows)
    logits = torch.zeros(len(rows), T, table.shape[1])
    for b, row in enumerate(rows):
        for t, token in enumerate(row):
            logits[b, t] = torch.as_tensor(table[token])
    return logits


def test_choice_scoring_on_a_bigram_model(tok):
    V = tm.VOCAB_SIZE
    table = np.zeros((V, V), dtype=np.float32)
    t = {w: ids_of(tok, w)[0] for w in ("is", "the", "a", "it", "people", "time", "was", "there")}
    table[t["is"], t["the"]] = 5.0                 # after "is": " the" is the likely option
    table[t["people"], t["was"]] = 4.0             # "people was" beats "time was"
    table[t["time"], t["was"]] = -2.0
    items = [ChoiceItem(["the one is"] * 3, [" a", " the", " it"], answer=1),
             ChoiceItem(["the one is"] * 3, [" a", " the", " it"], answer=2),
             ChoiceItem(["the people", "the time"], [" was there"] * 2, answer=0)]
    prep = prepare_choices(tok, items, 32)
    assert len(prep.rows) == 1 + 1 + 2                   # shared rows for the single tokens
    logits = _bigram_logits(prep.rows, table)
    lp = span_logprobs(logits, prep.span_row, prep.span_start, prep.span_tokens)
    got = unit_scores(prep, lp)
    table = table.astype(np.float64)
    ls = table - np.log(np.exp(table).sum(1, keepdims=True))       # log-softmax by hand
    size = _log_softmax_size(table)
    one = tol.dot(V + 4, size[t["is"], t["the"]], vs=tol.F64)     # one token (all sizes alike)
    first = [ls[t["is"], t[w]] for w in ("a", "the", "it")]
    np.testing.assert_allclose(got["logprob"][0], first, **one)
    np.testing.assert_allclose(got["logprob"][1], first, **one)
    wino = [ls[t[w], t["was"]] + ls[t["was"], t["there"]] for w in ("people", "time")]
    np.testing.assert_allclose(got["logprob"][2, :2], wino, **(2 * one))    # two tokens
    assert np.isnan(got["logprob"][2, 2])                          # the item has 2 options
    assert got["correct"].tolist() == [1, 0, 1]


def _manual_ppl(model, ids: list[int]) -> float:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].double()
    lp = torch.log_softmax(logits, -1)
    nll = -np.mean([float(lp[t - 1, ids[t]]) for t in range(1, len(ids))])
    return math.exp(nll)


def test_lm_perplexity_matches_each_text_alone(tok):
    model = tm.build("llama")
    prep = prepare_texts(tok, TEXTS, 64)
    cfg = F.FaithConfig(drift=False, batch_size=3)
    result = F.compute_block(model, prep, cfg, [], pad_id=tm.PAD_ID)
    ppl = unit_scores(prep, result["clean"])["ppl"]
    want = [_manual_ppl(model, tok(t)["input_ids"]) for t in TEXTS]
    tol.assert_close(ppl, want, tol.FAITHFULNESS_PPL, "ppl")


# ------------------------------------------------------------------------------ the plan
def test_plan_copies_provably_identical_rankings_and_says_why():
    plan = F.ranking_plan(METRICS, RANKS, "head")
    assert plan[("value_weighted_normalized", "signed")] == ("value_weighted", "signed")
    assert plan[("attention", "magnitude")] == ("attention", "signed")
    assert plan[("contribution", "magnitude")] == ("contribution", "magnitude")   # signed
    notes = F.plan_notes(plan, "head")
    assert any(n.startswith("value_weighted_normalized/signed") and "at head granularity "
               "value_weighted_normalized ranks keys exactly as value_weighted" in n
               for n in notes)
    query = F.ranking_plan(METRICS, RANKS, "query")
    assert query[("value_weighted_normalized", "signed")] == ("value_weighted_normalized",
                                                              "signed")
    assert F.conditions(F.FaithConfig(fractions=(0.1, 0.5)), plan)[0].rank == "signed"
    assert {(r.metric, r.rank) for r in F.conditions(F.FaithConfig(), plan)} == {
        ("attention", "signed"), ("value_weighted", "signed"), ("contribution", "signed"),
        ("contribution", "magnitude"), ("contribution_layer", "signed"),
        ("contribution_layer", "magnitude"), ("random", "signed")}


# ------------------------------------------------------------------------------ the run
@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("faith")
    tm.save_tiny("llama", root / "llama")
    tm.save_tiny("bert", root / "bert")
    (root / "texts.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    (root / "boolq.jsonl").write_text("".join(
        json.dumps({"question": "is it the one", "passage": p, "label": lab, "idx": i}) + "\n"
        for i, (p, lab) in enumerate([(TEXTS[0], "true"), (TEXTS[1], "false"),
                                      (TEXTS[2], "true")])))
    return root


SMALL = dict(metrics=("attention", "contribution"), fractions=(0.2, 0.5), block_size=2,
             batch_size=2)


def test_run_writes_a_labeled_file_and_records_it(tiny_dir, tmp_path, tok):
    out = tmp_path / "store"
    path = F.faithfulness(str(tiny_dir / "llama"), str(tiny_dir / "texts.jsonl"), out,
                          F.FaithConfig(**SMALL), progress=False, log=lambda m: None)
    ds = xr.open_dataset(path, engine="h5netcdf").load()
    assert ds["ppl"].dims == ("metric", "rank", "mode", "fraction", "sequence")
    assert ds.sizes == {"metric": 2, "rank": 2, "mode": 2, "fraction": 2, "sequence": 5,
                        "layer": 2}
    model = tm.build("llama")
    want = [_manual_ppl(model, tok(t)["input_ids"]) for t in TEXTS]
    tol.assert_close(ds["clean_ppl"].values, want, tol.FAITHFULNESS_PPL, "clean_ppl")
    # one float64 subtraction; a mean of two (fractions 0.2, 0.5)
    np.testing.assert_allclose(ds["delta_ppl"], ds["ppl"] - ds["clean_ppl"],
                               **tol.relative(1, tol.F64))
    d = ds["delta_ppl"].transpose("metric", "rank", "mode", "fraction", "sequence").values
    tol.assert_close(ds["aopc"].transpose("metric", "rank", "mode", "sequence").values,
                     (d[:, :, :, 0] + d[:, :, :, 1]) / 2,
                     tol.total(2, np.abs(d).mean(3), tol.F64, vs=tol.F64), "aopc")
    att = ds["ppl"].sel(metric="attention")
    assert (att.sel(rank="signed") == att.sel(rank="magnitude")).all()      # copied
    c = ds["ppl"].sel(metric="contribution")
    assert not (c.sel(rank="signed") == c.sel(rank="magnitude")).all()
    assert ds["same_ranking_as"].sel(metric="attention", rank="magnitude") == "attention/signed"
    assert ds.attrs["loss_variable"] == "delta_ppl" and ds.attrs["granularity"] == "head"
    assert np.isfinite(ds["drift_cosine_low_after"]).all() and (ds["drift_n_low"] > 0).all()
    manifest = read_manifest(out)
    entry = manifest["faithfulness"]["faithfulness"]
    assert entry["sha256"] == file_sha256(path) and manifest["kind"] == "faithfulness"
    from attngeom.analysis.faithfulness_stats import for_store
    from attngeom.commands.faithfulness import summarize

    stats, _, why = for_store(out, "faithfulness")
    assert why == "" and (out / "analysis" / "faithfulness_stats.nc").is_file()
    text = summarize(ds, stats)
    assert "attention/magnitude: same ranking as attention/signed" in text
    lines = text.splitlines()
    aopc_at = next(i for i, ln in enumerate(lines) if ln.startswith("AOPC"))
    side = lines[aopc_at + 1]                                          # column header
    assert [c.strip() for c in side.split("|")] == [
        "metric", "comp. signed", "min–max", "comp. magnitude", "min–max", "suff. signed",
        "min–max", "suff. magnitude", "min–max"]
    assert "The paper's order on the AOPC of ΔPPL" in text and "semantic drift" in text
    assert not (out / "faithfulness.partial").exists()


def test_killed_run_resumes_from_finished_blocks(tiny_dir, tmp_path, monkeypatch):
    out, data, model = tmp_path / "s", str(tiny_dir / "texts.jsonl"), str(tiny_dir / "llama")
    real, calls = F.compute_block, []

    def dying(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)
    monkeypatch.setattr(F, "compute_block", dying)
    with pytest.raises(KeyboardInterrupt):
        F.faithfulness(model, data, out, F.FaithConfig(**SMALL), progress=False, log=print)
    assert len(list((out / "faithfulness.partial").glob("block-*.nc"))) == 1
    calls.clear()
    monkeypatch.setattr(F, "compute_block", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    path = F.faithfulness(model, data, out, F.FaithConfig(**SMALL), progress=False,
                          log=lambda m: None)
    assert len(calls) == 2                                        # blocks [2,4) and [4,5)
    fresh = F.faithfulness(model, data, tmp_path / "fresh", F.FaithConfig(**SMALL),
                           progress=False, log=lambda m: None)
    a, b = (xr.open_dataset(p, engine="h5netcdf").load() for p in (path, fresh))
    tol.assert_close(a["ppl"].values, b["ppl"].values, tol.FAITHFULNESS_PPL, "resumed ppl")
    calls.clear()                                                 # complete: nothing rerun
    F.faithfulness(model, data, out, F.FaithConfig(**SMALL), progress=False, log=lambda m: None)
    assert not calls
    with pytest.raises(StoreError, match="other settings"):
        F.faithfulness(model, data, out, F.FaithConfig(**{**SMALL, "fractions": (0.3,)}),
                       progress=False, log=lambda m: None)


def test_multiple_choice_run(tiny_dir, tmp_path):
    cfg = F.FaithConfig(**{**SMALL, "task": "boolq", "granularity": "token"})
    path = F.faithfulness(str(tiny_dir / "llama"), str(tiny_dir / "boolq.jsonl"),
                          tmp_path / "mc", cfg, progress=False, log=lambda m: None)
    ds = xr.open_dataset(path, engine="h5netcdf").load()
    assert ds["correct"].dims == ("metric", "rank", "mode", "fraction", "item")
    assert ds["logprob"].sizes["option"] == 2 and ds.attrs["loss_variable"] == "accuracy_loss"
    np.testing.assert_allclose(ds["accuracy"], ds["correct"].mean("item"),     # a mean of 0/1
                               **tol.total(ds.sizes["item"], 1.0, tol.F64, vs=tol.F64))
    np.testing.assert_array_equal(ds["clean_correct"],
                                  ds["clean_logprob"].argmax("option") == ds["answer"])
    np.testing.assert_array_equal(ds["accuracy_loss"], ds["clean_correct"] - ds["correct"])
    lp, clean, ans = ds["logprob"].values, ds["clean_logprob"].values, ds["answer"].values
    want = np.stack([clean[u, ans[u]] - lp[..., u, ans[u]] for u in range(len(ans))], -1)
    np.testing.assert_allclose(ds["answer_logprob_loss"].transpose(*ds["correct"].dims), want,
                               **tol.relative(1, tol.F64))                    # a subtraction


def test_cli_errors_are_one_line(tiny_dir, tmp_path, capsys):
    from attngeom.cli import main

    base = ["faithfulness", "--data", str(tiny_dir / "texts.jsonl"), "--quiet"]
    def error_lines() -> list[str]:         # progress bars of weight loading aside
        err = capsys.readouterr().err.replace("\r", "\n")
        return [ln for ln in err.splitlines() if ln.startswith("attngeom:")]

    assert main(base + ["--model", str(tiny_dir / "bert"), "--out", str(tmp_path / "a")]) == 2
    lines = error_lines()
    assert len(lines) == 1 and "causal language model" in lines[0]
    assert main(base + ["--model", str(tiny_dir / "llama"), "--out", str(tmp_path / "b"),
                        "--metrics", "attention,bogus"]) == 2
    lines = error_lines()
    assert len(lines) == 1 and "--metrics" in lines[0]


def test_result_is_recorded_in_an_extracted_store(tiny_dir, tmp_path):
    from attngeom.extract.run import ExtractConfig, extract
    from attngeom.store.io.validate import validate

    out, data = tmp_path / "store", str(tiny_dir / "texts.jsonl")
    extract(str(tiny_dir / "llama"), data, out, ExtractConfig(max_length=16), progress=False)
    shards = read_manifest(out)["shards"]
    path = F.faithfulness(str(tiny_dir / "llama"), data, out,
                          F.FaithConfig(**{**SMALL, "drift": False}), progress=False,
                          log=lambda m: None)
    manifest = read_manifest(out)
    assert manifest["shards"] == shards and manifest["complete"] and "kind" not in manifest
    assert manifest["faithfulness"]["faithfulness"]["sha256"] == file_sha256(path)
    assert validate(out) == []
    tm.save_tiny("llama", tmp_path / "other", seed=5)
    with pytest.raises(StoreError, match="another model"):
        F.faithfulness(str(tmp_path / "other"), data, out, F.FaithConfig(**SMALL),
                       progress=False, log=lambda m: None)


def test_out_of_memory_halves_the_batch_and_redoes_the_block(tok, monkeypatch):
    """A forward pass that fails for batches above 1 (as CUDA would) is retried smaller; the
    perplexities equal each text scored alone."""
    model = tm.build("llama")
    prep = prepare_texts(tok, TEXTS, 64)
    real = F.forward_logits

    def forward_logits(model, inputs, handler):
        if inputs["input_ids"].shape[0] > 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 GiB")
        return real(model, inputs, handler)

    monkeypatch.setattr(F, "forward_logits", forward_logits)
    cfg, log, current = F.FaithConfig(drift=False, batch_size=4), [], F.BatchSize(4)
    result = F.compute_retrying(model, prep, cfg, [], tm.PAD_ID, log=log.append,
                                current=current)
    assert current.size == 1 and len(log) == 2 and "batch size 4" in log[0]
    assert cfg.batch_size == 4                   # the config is not changed
    want = [_manual_ppl(model, tok(t)["input_ids"]) for t in TEXTS]
    tol.assert_close(unit_scores(prep, result["clean"])["ppl"], want, tol.FAITHFULNESS_PPL, "ppl")
    monkeypatch.setattr(F, "forward_logits", lambda *a: (_ for _ in ()).throw(
        torch.cuda.OutOfMemoryError("CUDA out of memory")))
    with pytest.raises(MemoryError, match="at batch size 1"):
        F.compute_retrying(model, prep, cfg, [], tm.PAD_ID, log=log.append)
