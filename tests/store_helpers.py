"""Helpers shared by the store and extraction-run tests: texts, tiny models, expected arrays.

Expected compact arrays are built from the naive reference's dense (query, key) arrays by plain
indexing: sink = first k keys, tail = key query - lag, middle = sum over the other allowed keys.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

import reference as ref
import tiny_models as tm

PAIR = ("alpha", "cosine", "cosine_layer", "contribution", "contribution_layer")
PER_TOKEN = ("value_norm", "sink_value_cosine", "output_norm", "residual_norm",
             "sink_residual_cosine", "head_share", "layer_output_norm")
RTOL, ATOL = 1e-5, 1e-5


def write_texts(path: Path, n_words=(3, 12, 6, 1, 8), seed: int = 0) -> Path:
    """A JSONL of texts made of the tiny tokenizer's words, one per line (field ``text``)."""
    rng = np.random.default_rng(seed)
    words = tm._WORDS[: tm.VOCAB_SIZE - tm.N_SPECIAL]
    texts = [" ".join(rng.choice(words, n)) for n in n_words]
    path.write_text("".join(json.dumps({"id": i, "text": t}) + "\n"
                            for i, t in enumerate(texts)), encoding="utf-8")
    return path


def load_tiny(directory: Path, arch: str) -> torch.nn.Module:
    from transformers import AutoModel, AutoModelForCausalLM

    cls = AutoModelForCausalLM if arch in tm.DECODERS else AutoModel
    return cls.from_pretrained(directory, dtype=torch.float32).eval()


def reference_on_ids(model: torch.nn.Module, token_ids: np.ndarray, sink_k: int) -> dict:
    """Naive reference on right-padded inputs rebuilt from stored ids (-1 beyond length)."""
    ids = np.asarray(token_ids, dtype=np.int64)
    mask = ids >= 0
    inputs = {"input_ids": torch.as_tensor(np.where(mask, ids, tm.PAD_ID)),
              "attention_mask": torch.as_tensor(mask.astype(np.int64))}
    return ref.naive_measure(model, inputs, sink_k=sink_k)


def cancellation(r: dict[str, np.ndarray]) -> np.ndarray:
    """||o|| / ||r||, at least 1: how much the sink residual's cosine amplifies roundoff."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.fmax(1.0, np.nan_to_num(r["output_norm"] / r["residual_norm"], nan=1.0))


def assert_same(got, want, name: str, scale=1.0, rtol: float = RTOL, atol: float = ATOL) -> None:
    """Same shape, NaN at exactly the same cells, values close elsewhere (tolerance x scale)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (name, got.shape, want.shape)
    nan_got, nan_want = np.isnan(got), np.isnan(want)
    assert np.array_equal(nan_got, nan_want), (
        f"{name}: NaN pattern differs at {np.argwhere(nan_got != nan_want)[:5].tolist()}")
    ok = ~nan_want
    assert ok.any(), f"{name}: nothing to compare"
    tol = (atol + rtol * np.abs(want)) * np.broadcast_to(scale, want.shape)
    bad = np.abs(got - want)[ok] > tol[ok]
    assert not bad.any(), (f"{name}: {bad.sum()} of {ok.sum()} differ, e.g. got "
                           f"{got[ok][bad][:3]} want {want[ok][bad][:3]}")


def expected_compact(r: dict[str, np.ndarray], k: int, w: int) -> dict[str, np.ndarray]:
    """Compact layout (sink, tail_*, middle_*) from dense (..., query, key) arrays."""
    T = r["alpha"].shape[-1]
    q = np.arange(T)[:, None]
    key = q - np.arange(w)[None, :]                                    # (T, w)
    in_tail = key >= k                                                  # also key >= 0
    keys = np.arange(T)[None, :]
    lag = q - keys                                                      # (Tq, Tk)
    middle_key = (keys >= k) & ~((lag >= 0) & (lag < w))                # encoders: keys > query
    allowed = ~np.isnan(r["alpha"])                                     # (..., Tq, Tk)
    real_query = ~np.isnan(r["output_norm"])                            # (..., Tq)
    out = {}
    for name in PAIR:
        out[name] = r[name][..., :k]
        index = np.broadcast_to(np.clip(key, 0, None), r[name].shape[:-1] + (w,))
        out[f"tail_{name}"] = np.where(in_tail, np.take_along_axis(r[name], index, -1), np.nan)
    middle = allowed & middle_key
    for name in ("alpha", "contribution", "contribution_layer"):
        total = np.where(middle, r[name], 0.0).sum(-1)
        out[f"middle_{name}"] = np.where(real_query, total, np.nan)
    out["middle_count"] = np.where(real_query, middle.sum(-1), np.nan)
    return out
