"""Tests of the study helpers against hand-computed answers: ``pytest -q studies/test_studies.py``."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

sys.path.insert(0, str(Path(__file__).resolve().parent))
import export  # noqa: E402
import prepare  # noqa: E402


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
