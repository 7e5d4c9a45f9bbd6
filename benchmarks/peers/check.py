"""Does each peer compute the numbers attngeom stores? Its results against a dense store.

``attngeom extract --mode dense`` measures SmolLM2-135M over the first ``--limit`` WikiText-2
texts cut to ``--max-length`` tokens; each peer script (``peer_*.py``) measures the same texts
in its own environment and saves its results (``--save``, an ``.npz``); this script compares
them, per variable, on every cell the store holds (the query's own and earlier keys, within
each sequence's length):

- the token ids first (a peer that measures other tokens measures something else);
- alpha where the store masks a key (a later key: NaN in the store) must be exactly 0;
- alpha, the cosines to the head output, the contribution weights, the projected value norms
  and the head output norms within the float32 rounding bound below.

The bound. Both sides run the same float32 model on the same tokens with the same eager
attention, so each layer's inputs are the same and what remains is the rounding of the
computation from a layer's input to its measurements, which each side orders differently
(attngeom in head space through W_O W_O^T, the peers in model space): the projections x W
(length d), the logits (d_head), the softmax normaliser and the head output (T each), the
products through W_O (d, and heads x d_head twice), ``tests/tolerance.py``'s
``attention_terms``. A dot product of total length n is within gamma(n) = n u / (1 - n u)
(u = 2^-24) of exact times the sum of |a_i||b_i| (Higham (3.5)); two float32 computations, so
2 gamma(n): absolute for alpha and the cosines (|cos| <= 1 and sum |a_i||b_i| <= ||a|| ||b||),
times alpha ||v~|| / ||o|| for a contribution weight (its size), relative for the norms. If a
peer's layer inputs drifted from attngeom's, alpha itself would leave the bound. At T = 128 the
bound is 3.1e-4; the differences printed say how much of it is used.

    python benchmarks/peers/check.py                       # every peer, 2 texts x 128 tokens
    python benchmarks/peers/check.py --peers plain,nnsight --limit 1 --max-length 64
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from registry import PEERS, REPO, DATA, MODEL, missing_envs, model_dir, peer_argv  # noqa: E402

sys.path.insert(0, str(REPO / "tests"))
import tolerance as tol  # noqa: E402

VARIABLES = ("alpha", "cosine", "contribution", "value_norm", "output_norm")


def dense_store(out: Path, data: Path, limit: int, max_length: int, batch_size: int) -> Path:
    """attngeom's dense store of the case (the ``attngeom`` command of this environment)."""
    cmd = [str(Path(sys.executable).with_name("attngeom")), "extract", "--model", MODEL,
           "--data", str(data), "--limit", str(limit), "--max-length", str(max_length),
           "--batch-size", str(batch_size), "--mode", "dense", "--quiet", "--no-text",
           "--out", str(out)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return out


def store_arrays(path: Path) -> dict[str, np.ndarray]:
    from attngeom.store.io.reader import open_store

    ds = open_store(path)
    return {name: ds[name].values for name in VARIABLES + ("token_id", "length")}


def bounds(want: dict, d: int, d_head: int, heads: int) -> dict[str, tol.Tol]:
    """Each variable's float32 rounding bound (see the module docstring)."""
    T = want["alpha"].shape[-1]
    n = tol.attention_terms(d, d_head, heads, T)
    with np.errstate(divide="ignore", invalid="ignore"):
        size = (want["alpha"] * want["value_norm"][..., None, :]
                / want["output_norm"][..., :, None])
    return {"alpha": tol.dot(n, 1.0, vs=tol.F32), "cosine": tol.dot(n, 1.0, vs=tol.F32),
            "contribution": tol.dot(n, size, vs=tol.F32),
            "value_norm": tol.relative(n, vs=tol.F32),
            "output_norm": tol.relative(n, vs=tol.F32)}


def compare(name: str, got: dict, want: dict, limits: dict[str, tol.Tol]) -> dict:
    """One peer's differences from the store, per variable, and whether they pass."""
    rec = {"peer": name, "passed": True, "problems": []}
    ids_equal = got["token_id"].shape == want["token_id"].shape and np.array_equal(
        got["token_id"], np.where(want["token_id"] < 0, -1, want["token_id"]))
    rec["tokens_equal"] = bool(ids_equal)
    if not ids_equal:
        rec["passed"] = False
        rec["problems"].append("other token ids than the store's")
        return rec
    masked = np.isnan(want["alpha"]) & np.isfinite(got["alpha"])
    masked_alpha = float(np.abs(got["alpha"][masked]).max()) if masked.any() else 0.0
    rec["alpha_at_masked_keys"] = masked_alpha
    if masked_alpha != 0:
        rec["passed"] = False
        rec["problems"].append(f"alpha {masked_alpha:.3g} on keys the store masks")
    for var in VARIABLES:
        if var not in got:
            continue
        w, g = want[var], got[var]
        held = np.isfinite(w)
        compared = held & ~np.isnan(g)             # inseq has no step for the last query
        diff = np.abs(g[compared] - w[compared])
        limit = np.broadcast_to(limits[var].limit(w), w.shape)[compared]
        with np.errstate(divide="ignore", invalid="ignore"):
            rel = np.nanmax(np.where(np.abs(w[compared]) > 0, diff / np.abs(w[compared]), 0))
        worst = float(np.nanmax(diff / limit)) if diff.size else 0.0
        bad = int((~(diff <= limit)).sum())
        rec[var] = {"max_abs": float(diff.max()) if diff.size else None,
                    "max_rel": float(rel) if diff.size else None,
                    "share_of_bound": worst, "cells": int(compared.sum()),
                    "not_given": int((held & np.isnan(g)).sum()), "beyond_bound": bad}
        if bad:
            rec["passed"] = False
            rec["problems"].append(f"{var}: {bad} cells beyond the bound")
        allowed = _last_query_cells(w) if PEERS[name].last_query_missing else 0
        if rec[var]["not_given"] > allowed:
            rec["passed"] = False
            rec["problems"].append(f"{var}: NaN on {rec[var]['not_given']} cells the store "
                                   "holds")
    return rec


def run(peers: list[str], limit: int, max_length: int, batch_size: int,
        work: Path) -> list[dict]:
    """Extract the dense store, run each peer with --save, compare; one record per peer."""
    from transformers import AutoConfig

    model = model_dir()
    config = AutoConfig.from_pretrained(model)
    want = store_arrays(dense_store(work / "dense", DATA, limit, max_length, batch_size))
    limits = bounds(want, config.hidden_size, config.head_dim, config.num_attention_heads)
    out = []
    for name in peers:
        save = work / f"{name}.npz"
        argv = peer_argv(name, model, DATA, limit, max_length, batch_size, 0, "keep", save)
        proc = subprocess.run(argv, capture_output=True, text=True)
        if proc.returncode:
            last = (proc.stderr.strip().splitlines() or ["?"])[-1]
            out.append({"peer": name, "passed": False, "problems": [f"failed: {last}"]})
            continue
        with np.load(save, allow_pickle=False) as f:
            got = {k: f[k] for k in f.files}
        T = want["alpha"].shape[-1]
        if got["token_id"].shape[-1] < T:         # a peer's padding ends at its longest text
            pad = T - got["token_id"].shape[-1]
            got = {k: _pad_last(v, pad, k) for k, v in got.items()}
        rec = compare(name, got, want, limits)
        rec.update(texts=limit, max_length=max_length, bound_alpha=limits["alpha"]["atol"])
        out.append(rec)
    return out


def _last_query_cells(w: np.ndarray) -> int:
    """Cells the store holds on each sequence's last query (inseq has no step for it)."""
    held = np.isfinite(w)
    if w.ndim < 5:                                    # per-token variables: none
        return 0
    last = np.zeros_like(held)
    for s in range(w.shape[0]):
        rows = np.nonzero(held[s].any(axis=(0, 1, 3)))[0]
        if rows.size:
            last[s, :, :, rows[-1]] = held[s, :, :, rows[-1]]
    return int(last.sum())


def _pad_last(x: np.ndarray, pad: int, name: str) -> np.ndarray:
    if name == "length":
        return x
    fill = -1 if name == "token_id" else np.nan
    widths = [(0, 0)] * x.ndim
    widths[-1] = (0, pad)
    if name in ("alpha", "cosine", "contribution"):
        widths[-2] = (0, pad)
    return np.pad(x, widths, constant_values=fill)


def describe(rec: dict) -> str:
    """One line per peer: passed or not, and the largest differences."""
    if "tokens_equal" not in rec or not rec["tokens_equal"]:
        return f"{rec['peer']:16s} FAILED: {'; '.join(rec['problems'])}"
    parts = []
    for var in VARIABLES:
        if var in rec:
            r = rec[var]
            kind = "rel" if var.endswith("norm") else "abs"
            parts.append(f"{var} {r['max_' + kind]:.2g} {kind} ({r['share_of_bound']:.1e} "
                         "of the bound)")
    verdict = "passed" if rec["passed"] else "FAILED: " + "; ".join(rec["problems"])
    return f"{rec['peer']:16s} {verdict}: " + ", ".join(parts)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--peers", default=",".join(PEERS))
    p.add_argument("--limit", type=int, default=2)
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--json", help="append the records (one JSON object per line) to this file")
    a = p.parse_args(argv)
    peers = a.peers.split(",")
    if missing_envs(peers):
        sys.exit(f"no environment for {', '.join(missing_envs(peers))}: run "
                 "benchmarks/peers/setup.sh")
    with tempfile.TemporaryDirectory() as tmp:
        records = run(peers, a.limit, a.max_length, a.batch_size, Path(tmp))
    for rec in records:
        print(describe(rec), flush=True)
        if a.json:
            with open(a.json, "a", encoding="utf-8") as f:
                f.write(json.dumps({"kind": "check", **rec}) + "\n")
    return 0 if all(r["passed"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
