"""Tests of the first three studies' helpers against hand-computed answers."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import export
import prepare


def test_chunk_text_keeps_whole_lines():
    text = "aaaa\nbbbb\ncc\ndddddd\ne\n"
    # chunks close once >= 8 characters; the 2-character tail is below half and dropped
    assert prepare.chunk_text(text, 8) == ["aaaa\nbbbb", "cc\ndddddd"]
    assert prepare.chunk_text("short", 100) == ["short"]


def test_round_robin_order_and_limit():
    groups = [[1, 2, 3], [10], [20, 21]]
    assert prepare.round_robin(groups, 10) == [1, 10, 20, 2, 21, 3]
    assert prepare.round_robin(groups, 4) == [1, 10, 20, 2]


def test_task_items_round_robin_over_subject(tmp_path):
    recs = [{"subject": s, "q": i} for i, s in enumerate("aaabbc")]
    prepare.write_jsonl(recs, tmp_path / "in.jsonl")
    n = prepare.task_items(tmp_path / "in.jsonl", tmp_path / "out.jsonl", 4, "subject")
    got = [r["q"] for r in prepare.read_jsonl(tmp_path / "out.jsonl")]
    assert n == 4 and got == [0, 3, 5, 1]


def test_clean_accuracy_matches_exact_binomial(tmp_path):
    correct = np.array([1] * 10 + [0] * 30)
    nc = tmp_path / "mc.nc"
    xr.Dataset({"clean_correct": ("item", correct),
                "answer": ("item", np.array([0] * 13 + [1] * 27))}).to_netcdf(nc)
    r = export.clean_accuracy(nc, chance=0.25)
    # Clopper-Pearson 95% CI of 10/40 (R: binom.test(10, 40)$conf.int)
    assert r["ci_low"] == pytest.approx(0.1269148, abs=1e-6)
    assert r["ci_high"] == pytest.approx(0.4119620, abs=1e-6)
    # one-sided P(X >= 10 | n=40, p=0.25) = 1 - P(X <= 9)
    from math import comb
    p = 1 - sum(comb(40, k) * 0.25 ** k * 0.75 ** (40 - k) for k in range(10))
    assert r["p_above_chance"] == pytest.approx(p, rel=1e-9)
    assert r["majority_rate"] == pytest.approx(27 / 40) and not r["above_chance"]


def test_drift_loss_ci_all_positive_gives_smallest_wilcoxon_p():
    x = np.arange(1.0, 11.0)
    r = export.drift_loss_ci(x)
    assert r["mean"] == pytest.approx(5.5)
    assert r["p_value"] == pytest.approx(1 / 2 ** 10)   # exact one-sided signed-rank, all positive
    assert r["ci_low"] < 5.5 < r["ci_high"]


# ----------------------------------------------------------------------- second study
import gu_sinks
import plan
import texts


@pytest.fixture(scope="module")
def tok():
    import tiny_models

    return tiny_models.make_tokenizer("llama")             # word level, adds <bos>


def words(n: int, start: int = 0) -> str:
    """n known words of the tiny tokenizer (one token each)."""
    import tiny_models

    vocab = sorted(w for w in tiny_models.make_tokenizer("llama").get_vocab() if w[0] != "<")
    return " ".join(vocab[(start + k) % 40] for k in range(n))


def test_prose_texts_keep_sections_reaching_the_length_round_robin(tmp_path, tok):
    # tokens = words + <bos>; length 6 keeps sections of >= 5 words
    recs = [{"module": "m1", "text": words(7)}, {"module": "m1", "text": words(3)},
            {"module": "m1", "text": words(5)}, {"module": "m2", "text": words(9)},
            {"module": "m3", "text": words(4)}, {"module": "m3", "text": words(6)}]
    prepare.write_jsonl(recs, tmp_path / "p.jsonl")
    n = texts.prose_texts(tok, tmp_path / "p.jsonl", tmp_path / "out.jsonl", 10, length=6)
    got = prepare.read_jsonl(tmp_path / "out.jsonl")
    # round-robin over modules: m1's first, m2's, m3's (its first is too short), m1's second
    assert n == 4 and [r["source"] for r in got] == [0, 3, 5, 2]
    assert [r["tokens"] for r in got] == [8, 10, 7, 6]
    assert texts.prose_texts(tok, tmp_path / "p.jsonl", tmp_path / "o2.jsonl", 2, 6) == 2
    # a pilot's first two left out: the rest of the same order
    assert texts.prose_texts(tok, tmp_path / "p.jsonl", tmp_path / "o3.jsonl", 10, 6, skip=2) == 2
    assert [r["source"] for r in prepare.read_jsonl(tmp_path / "o3.jsonl")] == [5, 2]


def test_gsm8k_texts_keep_items_long_enough_after_the_cut(tmp_path, tok):
    recs = [{"question": words(q), "answer": words(a, 3)} for q, a in ((2, 1), (3, 3), (9, 9))]
    prepare.write_jsonl(recs, tmp_path / "g.jsonl")
    # "Question: ...\nAnswer: ..." -> "Question", ":", "Answer", ":" + q + a words + <bos>:
    # 8, 11 and 23 tokens, 8, 11 and 12 after the cut at 12
    n = texts.gsm8k_texts(tok, tmp_path / "g.jsonl", tmp_path / "out.jsonl", 5, low=9, length=12)
    got = prepare.read_jsonl(tmp_path / "out.jsonl")
    assert n == 2 and [r["source"] for r in got] == [1, 2]
    assert got[0]["text"] == f"Question: {words(3)}\nAnswer: {words(3, 3)}"
    from attngeom.extract.loading.data import load_texts
    assert load_texts(str(tmp_path / "g.jsonl")).texts[1] == got[0]["text"]   # as the CLI forms it


def test_gu_inputs_random_repeated_and_bos(tmp_path, tok):
    special = set(tok.all_special_ids)
    r = texts.random_inputs(tok, 50, 16, seed=1)
    assert r.shape == (50, 16) and not special & set(r.ravel().tolist())
    assert len(set(r.ravel().tolist())) > 30                  # uniform over 60 words, not one
    rep = texts.repeated_inputs(tok, 5, 16, seed=2, bos_id=tok.bos_token_id)
    assert (rep[:, 0] == tok.bos_token_id).all() and (rep[:, 1:] == rep[:, 1:2]).all()
    assert texts.adds_bos(tok)
    prepare.write_jsonl([{"text": words(30)}, {"text": words(5)}], tmp_path / "w.jsonl")
    nat = texts.natural_inputs(tok, tmp_path / "w.jsonl", 10, 12, bos=True, chunk_chars=1000)
    plain = texts.natural_inputs(tok, tmp_path / "w.jsonl", 10, 12, bos=False, chunk_chars=1000)
    assert nat.shape == (1, 12) and nat[0, 0] == tok.bos_token_id      # the 5-word text is out
    assert (nat[0, 1:] == plain[0, :11]).all()


def gu_reference(alpha: np.ndarray, eps: float) -> float:
    """Gu et al.'s released formula (eval_sink_open_source.py) on full (N, L, H, T, T)
    attention: importance of key k = sum_i A_ik / (T - k); percent of (N, L, H) above eps."""
    N, L, H, T, _ = alpha.shape
    pct = 0.0
    for n in range(N):
        for layer in range(L):
            for h in range(H):
                score = sum(alpha[n, layer, h, i, 0] for i in range(T)) / T
                pct += score > eps
    return 100 * pct / (N * L * H)


def test_gu_metric_against_eager_attention_and_their_formula():
    import torch
    import tiny_models

    ids = np.asarray(texts.random_inputs(tiny_models.make_tokenizer("llama"), 6, 12, seed=3))
    model = tiny_models.build("llama")
    eager = tiny_models.build("llama", attn_implementation="eager")
    with torch.no_grad():
        att = eager(torch.as_tensor(ids), output_attentions=True).attentions
    full = torch.stack(att, 1).numpy()                          # (N, L, H, T, T)
    got = gu_sinks.measure_alpha0(model, ids, batch_size=4)     # (N, L, H, T)
    np.testing.assert_allclose(got, full[..., 0], atol=1e-5)
    for eps in (0.05, 0.1, 0.3):
        pct = gu_sinks.sink_percentages(got, eps)
        assert pct["pct_per_input_q0"] == pytest.approx(gu_reference(full, eps))
        pooled = (full[..., 1:, 0].mean(-1).mean(0) > eps).mean() * 100   # design: i >= 1
        assert pct["pct_pooled_q1"] == pytest.approx(pooled)


def test_plan_counts_the_designs_passes():
    from attngeom.extract.faithfulness.experiment import FaithConfig
    cfg = FaithConfig(task="lm", metrics=("attention", "value_weighted",
                                          "value_weighted_normalized", "contribution"),
                      modes=("comprehensiveness", "sufficiency"), ranks=("signed", "magnitude"),
                      fractions=(0.01, 0.02, 0.05, 0.1, 0.2), granularity="head", drift=False)
    # README: 4 distinct rankings x 2 modes x 5 fractions + 1 clean = 41 per batch
    assert plan.passes_per_batch(cfg) == 41
    cfg2 = FaithConfig(task="lm", metrics=("attention", "value_weighted", "contribution"),
                       modes=("comprehensiveness",), ranks=("signed",), fractions=(0.2,),
                       layers=(4,), drift=False)
    assert plan.passes_per_batch(cfg2) == 4
    row = plan.Step("d", 161, 4, 41, plan.Timed(2.0, 1.5), threads=1, runs=3).row()
    assert row["batches"] == 41 and row["batch_passes"] == 3 * 41 * 41
    assert row["cpu_hours"] == pytest.approx(round(3 * 41 * 41 * 1.5 / 3600, 3))


def test_design1_csvs_let_the_power_figures_be_recomputed(tmp_path, synthetic_result):
    from scipy import stats

    nc = synthetic_result(tmp_path / "d1.nc")
    export.export_design1(nc, tmp_path, "d1_prose")
    order = pd_read(tmp_path / "d1_prose_order_log.csv")
    units = pd_read(tmp_path / "d1_prose_units.csv")
    info = pd_read(tmp_path / "d1_prose_info.csv").iloc[0]
    assert info["m_tests"] == 6 and info["delta_log"] == 0.05
    for r in order[order["p_value"].notna()].itertuples():
        col = "aopc_log_ppl_ratio_{}_{}_" + r.mode
        d = units[col.format(r.higher, r.rank)] - units[col.format(r.lower, r.rank)]
        d = d if r.mode == "comprehensiveness" else -d
        z = stats.norm.ppf(1 - 0.05 / info["m_tests"]) + stats.norm.ppf(0.8)
        assert r.mde == pytest.approx(z * d.std(ddof=1) / np.sqrt(len(d)) * np.sqrt(np.pi / 3))
        assert r.mean_improvement == pytest.approx(d.mean())
    contrib = order[(order["higher"] == "contribution") & (order["mode"] == "comprehensiveness")]
    assert (contrib["verdict"] == "holds").all()
    curves = pd_read(tmp_path / "d1_prose_curves.csv")
    assert set(curves["variable"]) == {"log_ppl_ratio", "delta_ppl"}
    assert len(curves) == 2 * 4 * 2 * 2 * 3


def test_design2_export_and_summary_tables(tmp_path, synthetic_result):
    import summarize_faithfulness
    import tables

    runs = {layer: synthetic_result(tmp_path / f"l{layer}.nc", n=12, seed=layer)
            for layer in (0, 5)}
    for layer, nc in runs.items():       # a design-2 run: one mode, one rank, one fraction
        with xr.open_dataset(nc) as ds:
            ds = ds.load().sel(mode=["comprehensiveness"], rank=["signed"], fraction=[0.2],
                               metric=["attention", "value_weighted", "contribution"])
        ds["same_ranking_as"][:] = ""
        ds.to_netcdf(tmp_path / f"d2_{layer}.nc")
        runs[layer] = tmp_path / f"d2_{layer}.nc"
    results = tmp_path / "smollm2-135m" / "results_faithfulness"
    export.export_design2(runs, results, "d2_prose")
    t = pd_read(results / "d2_prose_layers.csv")
    assert len(t) == 2 * 3 and (t["m_tests"] == 2).all()
    text = summarize_faithfulness.layer_details(tmp_path, "smollm2-135m")
    assert text.count("\n| 0 |") == 1 and text.count("\n| 5 |") == 1
    assert "holds" in summarize_faithfulness.layers_cell(tmp_path, "smollm2-135m")
    assert tables.f(0.0001) == "1.0e-04"
    # Gemma-like kinds: each kind its own Holm family (here of one layer: Holm p = p)
    kinds = ["sliding_attention"] * 5 + ["full_attention"]
    export.export_design2(runs, results, "d2_kinds", layer_types=kinds)
    t = pd_read(results / "d2_kinds_layers.csv")
    assert dict(zip(t["layer"], t["layer_type"])) == {0: "sliding_attention", 5: "full_attention"}
    k = pd_read(results / "d2_kinds_layers_by_type.csv")
    assert (k["m_tests"] == 1).all() and len(k) == len(t)
    np.testing.assert_allclose(k["p_holm"], k["p_value"])
    m = t.merge(k, on=["layer", "lower", "higher", "mode", "rank"], suffixes=("", "_kind"))
    assert len(m) == len(t) and (m["p_holm"] > m["p_holm_kind"]).any()   # a family of 2 there


def pd_read(path):
    import pandas as pd

    return pd.read_csv(path)


@pytest.mark.slow
def test_the_study_runs_end_to_end_on_a_tiny_model_and_skips_when_rerun(tmp_path):
    """Every step of faithfulness_study.py on a tiny llama and tiny data; a rerun skips all.
    Slow: ten CLI processes (2-3 minutes on a quiet machine; -m "not slow" leaves it out)."""
    import subprocess

    import pandas as pd
    import tiny_models

    model = tiny_models.save_tiny("llama", tmp_path / "model")
    data = tmp_path / "data"
    prepare.write_jsonl([{"module": f"m{k % 3}", "text": words(12, k)} for k in range(8)],
                        data / "openstax_psychology2e.jsonl")
    prepare.write_jsonl([{"question": words(5, k), "answer": words(4, k + 1)} for k in range(6)],
                        data / "gsm8k_test.jsonl")
    prepare.write_jsonl([{"title": "t", "text": "\n".join(words(12, k) for k in range(20))}],
                        data / "wikitext2_raw_test.jsonl")
    script = Path(__file__).resolve().parent / "faithfulness_study.py"
    cmd = [sys.executable, str(script), "--model", str(model), "--data-dir", str(data),
           "--work", str(tmp_path / "work"), "--results", str(tmp_path / "results"),
           "--prose-n", "4", "--gsm8k-n", "4", "--length", "10", "--gsm8k-min", "8",
           "--fractions", "0.1,0.5", "--design2-n", "4", "--gu-n", "4", "--gu-length", "8",
           "--geo-n", "6", "--geo-max-length", "16", "--chunk-chars", "100",
           "--bootstrap", "5", "--batch-size", "2"]
    first = subprocess.run(cmd, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr[-3000:]
    results = tmp_path / "results"
    for name in ("plan", "timings", "data", "gu_sinks", "d1_prose_order_log", "d1_gsm8k_order",
                 "d1_prose_units", "d2_prose_layers", "geo_wikitext_summary"):
        assert (results / f"{name}.csv").exists(), name
    assert (results / "d2_prose_layers.png").exists()
    p = pd.read_csv(results / "plan.csv").set_index("step")
    # 4 rankings x 2 modes x 2 fractions + clean; 2 batches of 2 texts
    assert p.loc["design1-prose", "passes_per_batch"] == 17
    assert p.loc["design1-prose", "batch_passes"] == 34
    assert p.loc["design2", "runs"] == 2 and p.loc["design2", "batch_passes"] == 2 * 2 * 4
    t = pd.read_csv(results / "d2_prose_layers.csv")
    assert sorted(t["layer"].unique()) == [0, 1] and (t["m_tests"] == 2).all()
    again = subprocess.run(cmd + ["--reuse-plan"], capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("already done") == 1 + 2 + 2 + 1   # gu, d1 x2, d2 x2, analyze
    assert "attngeom faithfulness" not in again.stdout


@pytest.mark.slow
def test_a_variant_keeps_its_texts_runs_and_csvs_apart(tmp_path):
    """--variant query at query granularity with contribution_layer, the pilot's texts left
    out, and the geometry on the same texts: named d1_prose_query, the base design untouched."""
    import subprocess

    import pandas as pd
    import tiny_models

    model = tiny_models.save_tiny("llama", tmp_path / "model")
    data = tmp_path / "data"
    prepare.write_jsonl([{"module": f"m{k % 3}", "text": words(12, k)} for k in range(8)],
                        data / "openstax_psychology2e.jsonl")
    script = Path(__file__).resolve().parent / "faithfulness_study.py"
    cmd = [sys.executable, str(script), "--model", str(model), "--data-dir", str(data),
           "--work", str(tmp_path / "work"), "--results", str(tmp_path / "results"),
           "--steps", "design1-prose,geometry-prose", "--variant", "query",
           "--granularity", "query", "--modes", "comprehensiveness", "--ranks", "signed",
           "--metrics", "attention,value_weighted,value_weighted_normalized,contribution,"
           "contribution_layer", "--prose-n", "4", "--prose-skip", "2", "--design2-n", "0",
           "--length", "10", "--fractions", "0.1,0.5", "--bootstrap", "5", "--batch-size", "2"]
    run = subprocess.run(cmd, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    results = tmp_path / "results"
    info = pd.read_csv(results / "d1_prose_query_info.csv").iloc[0]
    assert info["granularity"] == "query" and info["n_units"] == 4
    order = pd.read_csv(results / "d1_prose_query_order_log.csv")
    assert "value_weighted_normalized" in set(order.to_numpy().ravel().astype(str))
    picked = [r["source"] for r in prepare.read_jsonl(tmp_path / "work/data/prose_query.jsonl")]
    assert len(picked) == 4 and 0 not in picked                 # the first two left out
    plan = pd.read_csv(results / "plan_query.csv").set_index("step")
    # 5 metrics x 1 rank x 1 mode x 2 fractions + clean, at query granularity all distinct
    assert plan.loc["design1-prose", "passes_per_batch"] == 11
    assert (results / "geo_prose_query_summary.csv").exists()
    assert not (results / "plan.csv").exists() and not (results / "d1_prose_order.csv").exists()


def test_write_jsonl_leaves_identical_file_and_uses_private_temp(tmp_path):
    path = tmp_path / "d.jsonl"
    prepare.write_jsonl([{"text": "a"}], path)
    before = path.stat().st_mtime_ns
    (tmp_path / "d.partial").write_text("another step's temporary file")
    prepare.write_jsonl([{"text": "a"}], path)
    assert path.stat().st_mtime_ns == before  # same content: not rewritten
    assert (tmp_path / "d.partial").exists()  # a concurrent writer's file is not touched
    prepare.write_jsonl([{"text": "b"}], path)
    assert prepare.read_jsonl(path) == [{"text": "b"}]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.jsonl", "d.partial"]


def test_units_done_counts_the_units_of_finished_blocks(tmp_path):
    import faithfulness_study
    from attngeom.store.io.result_files import Partial

    partial = Partial(tmp_path / "r.partial")
    partial.path.mkdir()
    for start, stop in ((16, 32), (0, 16), (32, 40)):
        partial._block(start, stop).touch()
    (partial.path / "config.json").write_text("{}")
    assert partial.finished() == [(0, 16), (16, 32), (32, 40)]
    assert faithfulness_study.units_done(partial.path) == 40
    assert faithfulness_study.units_done(tmp_path / "none.partial") == 0
