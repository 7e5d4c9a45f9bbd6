"""The main job as a library (attngeom.pipeline): called from Python as `attngeom run` runs it,
and one staleness rule for every step."""

from __future__ import annotations

import os

import pytest

import tiny_models as tm
from attngeom.pipeline import job, run_job, stale
from store_helpers import write_texts


def test_the_staleness_rule(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    assert stale([a], [], True) == "missing"
    a.write_text("x")
    b.write_text("y")
    os.utime(a, (1, 1))
    assert stale([a], [b], True) == "older than its inputs"
    assert stale([b], [a], True) is None
    assert stale([b], [a], False) == "made with other settings"
    assert stale([], [a], True) == "missing"


@pytest.mark.parametrize("bad, words", [(dict(faith_limit=9, limit=4), "--faith-limit"),
                                         (dict(n_boot=-1), "--n-boot")])
def test_a_job_is_checked_before_anything_runs(tmp_path, bad, words):
    with pytest.raises(ValueError, match=words):
        job(out=str(tmp_path), **bad)


def test_run_from_python_then_nothing_is_redone(tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.setenv(var, "1")                 # run_job sets them; restored afterwards
    model = tm.save_tiny("llama", tmp_path / "model")
    data = write_texts(tmp_path / "texts.jsonl", (5, 9, 7, 11))
    made = job(out=str(tmp_path / "run"), model=str(model), data=str(data), limit=4,
               max_length=12, faith_limit=0, n_boot=0, quiet=True)
    lines: list[str] = []
    report = run_job(made, log=lines.append)
    assert report.is_file() and "faithfulness: skipped (--faith-limit 0)" in " ".join(lines)
    assert "extract: done (missing)" in " ".join(lines)
    again: list[str] = []
    run_job(made, log=again.append)
    assert all(f"{s}: up to date" in " ".join(again) for s in ("extract", "analyze", "report"))
