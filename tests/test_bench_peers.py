"""benchmarks/bench_peers.py's bookkeeping and benchmarks/peers/check.py's verdicts.

The harness resumes from its JSONL file and stops a tool where it failed; its table divides by
attngeom's processes; the check fails a peer that measures other tokens, puts weight on masked
keys, leaves the rounding bound or leaves cells empty. No peer environment is needed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

import tolerance as tol

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path[:0] = [str(BENCH), str(BENCH / "peers")]
import bench_peers as bp  # noqa: E402
import check  # noqa: E402


def _cell(case, tool, mode, status="ok", r=0, threads=0, wall=10.0, peak=1024.0):
    return {"kind": "cell", "case": case, "tool": tool, "mode": mode, "threads": threads,
            "round": r, "batch_size": 4, "status": status, "wall_s": wall,
            "peak_rss_mib": peak}


def test_status_names_what_stopped_a_process():
    base = {"rc": 1, "stderr": "", "timed_out": False}
    assert bp.status_of({**base, "rc": 0}) == "ok"
    assert bp.status_of({**base, "timed_out": True, "rc": -9}) == "timed out"
    assert bp.status_of({**base, "rc": 2, "stderr": "attngeom: error: dense extraction "
                         "needs about 25.9 GiB of memory, 22.1 GiB are available"}) == "refused"
    assert bp.status_of({**base, "stderr": "RuntimeError: DefaultCPUAllocator: can't "
                         "allocate memory: you tried to allocate 123 bytes"}) == "out of memory"
    assert bp.status_of({**base, "stderr": "MemoryError"}) == "out of memory"
    assert bp.status_of({**base, "stderr": "ValueError: something else"}) == "failed"


def test_a_failed_tool_is_not_run_again_on_that_case_nor_a_longer_text():
    records = [_cell("1x2048", "plain", "keep", "out of memory"),
               _cell("16x512", "nnsight", "keep", "out of memory"),
               _cell("1x2048", "nnsight", "discard")]
    assert bp.stopped(records, "plain", "keep", 0, "1x4096", 0) == "out of memory at 1x2048"
    assert bp.stopped(records, "plain", "keep", 0, "1x2048", 1) == "out of memory at 1x2048"
    assert bp.stopped(records, "plain", "keep", 1, "1x4096", 0) is None     # other threads
    assert bp.stopped(records, "plain", "discard", 0, "1x4096", 0) is None  # other mode
    assert bp.stopped(records, "nnsight", "keep", 0, "1x2048", 0) is None   # many texts
    assert bp.stopped(records, "nnsight", "discard", 0, "1x4096", 0) is None


def test_resume_skips_the_cells_already_recorded(tmp_path, monkeypatch):
    results = tmp_path / "r.jsonl"
    bp.append(results, _cell("2x128", "attngeom", "compact"))
    ran = []
    monkeypatch.setattr(bp, "run_cell", lambda tool, mode, *a: ran.append((tool, mode))
                        or {"status": "ok", "wall_s": 1.0, "peak_rss_mib": 1.0})
    monkeypatch.setattr(bp, "model_dir", lambda: tmp_path)
    monkeypatch.setattr(bp, "case_data", lambda case, tok, work, longest: (tmp_path, 2, 128,
                                                                       "texts"))
    monkeypatch.setattr("transformers.AutoTokenizer.from_pretrained", lambda path: None)
    args = bp.argparse.Namespace(cases="2x128", tools="attngeom", modes="keep,discard",
                                 threads="0", rounds=1, batch_size=4, limit_gib=16,
                                 timeout=60, no_check=True)
    bp.run_matrix(args, results)
    assert ran == [("attngeom", "dense")]                   # compact was already there
    bp.run_matrix(args, results)
    assert ran == [("attngeom", "dense")]                   # and now both are
    cells = [r for r in bp.load(results) if r["kind"] == "cell"]
    assert sorted(r["mode"] for r in cells) == ["compact", "dense"]


def test_table_gives_each_tool_against_attngeom():
    records = [_cell("16x512", "attngeom", "compact", wall=20, peak=1800),
               _cell("16x512", "attngeom", "dense", wall=100, peak=3600),
               _cell("16x512", "plain", "discard", wall=30, peak=2700),
               _cell("16x512", "plain", "discard", r=1, wall=50, peak=2700),
               _cell("16x512", "plain", "keep", "out of memory", peak=16000)]
    text = "\n".join(bp.table(records))
    # plain discard: median 40 s of two rounds; 40/20 and 2700/1800; 40/100 and 2700/3600
    assert "| plain | discard | 40.0 s | 2.64 GiB |  | 2.00x, 1.50x | 0.40x, 0.75x | 2 |" in text
    assert "| plain | keep | out of memory | 15.6 GiB at the end |" in text


def _store(S=1, L=2, H=3, T=4, seed=0):
    """A dense store's arrays: causal alpha (NaN above the diagonal), positive norms."""
    rng = np.random.default_rng(seed)
    causal = np.tril(np.ones((T, T), bool))
    alpha = rng.random((S, L, H, T, T)).astype(np.float32)
    alpha = np.where(causal, alpha / np.where(causal, alpha, 0).sum(-1, keepdims=True), np.nan)
    cosine = np.where(causal, rng.uniform(-1, 1, alpha.shape), np.nan).astype(np.float32)
    vn = rng.uniform(1, 5, (S, L, H, T)).astype(np.float32)
    on = rng.uniform(1, 5, (S, L, H, T)).astype(np.float32)
    contribution = (alpha * vn[..., None, :] * cosine / on[..., :, None]).astype(np.float32)
    return {"alpha": alpha, "cosine": cosine, "contribution": contribution,
            "value_norm": vn, "output_norm": on, "token_id": np.arange(S * T).reshape(S, T),
            "length": np.full(S, T)}


def _peer_of(want):
    got = {k: v.copy() for k, v in want.items()}
    got["alpha"] = np.nan_to_num(got["alpha"], nan=0.0)     # a peer's alpha: 0 on later keys
    return got


def test_check_passes_a_peer_within_rounding_and_fails_one_that_is_not():
    want = _store()
    limits = check.bounds(want, d=576, d_head=64, heads=3)
    n = tol.attention_terms(576, 64, 3, 4)
    assert limits["cosine"]["atol"] == tol.dot(n, 1.0, vs=tol.F32)["atol"]
    got = _peer_of(want)
    got["cosine"] = got["cosine"] + 0.5 * limits["cosine"]["atol"]
    assert check.compare("plain", got, want, limits)["passed"]

    beyond = _peer_of(want)
    beyond["cosine"] = beyond["cosine"] + 2 * limits["cosine"]["atol"]
    rec = check.compare("plain", beyond, want, limits)
    assert not rec["passed"] and rec["cosine"]["beyond_bound"] == np.isfinite(want["cosine"]).sum()

    tokens = _peer_of(want)
    tokens["token_id"] = tokens["token_id"] + 1                 # e.g. a BOS token prepended
    assert check.compare("plain", tokens, want, limits)["problems"] == [
        "other token ids than the store's"]

    leak = _peer_of(want)
    leak["alpha"][0, 0, 0, 0, 1] = 0.25                         # weight on a masked key
    assert not check.compare("plain", leak, want, limits)["passed"]

    holes = _peer_of(want)
    holes["value_norm"][0, 0, 0, 0] = np.nan
    assert not check.compare("plain", holes, want, limits)["passed"]


def test_check_lets_inseq_leave_out_only_the_last_query():
    want = _store()
    got = {k: want[k].copy() for k in ("alpha", "token_id", "length")}
    got["alpha"] = np.nan_to_num(got["alpha"], nan=0.0)
    got["alpha"][..., -1, :] = np.nan                            # no step for the last query
    limits = check.bounds(want, d=576, d_head=64, heads=3)
    assert check.compare("inseq", got, want, limits)["passed"]
    got["alpha"][..., -2, :] = np.nan
    assert not check.compare("inseq", got, want, limits)["passed"]
    assert not check.compare("plain", _peer_of(want) | {"alpha": got["alpha"]}, want,
                             limits)["passed"]
