"""Sink heads with Gu et al.'s protocol (arXiv 2410.10781, "When Attention Sink Emerges").

Per input the first token's score of head (l, h) is the mean attention to it over the queries,
``a = mean_{i >= q0} alpha_{i0}`` with q0 = 1 (the design's reading) or q0 = 0 (their formula,
which counts the first query, whose only key is itself, alpha_00 = 1). A head is a sink head when
its score exceeds epsilon = 0.3. Two aggregations over the inputs:

- ``pooled``: the score averaged over the inputs, then thresholded, as studies/README.md writes
  the design ("mean attention ... over the queries and the samples");
- ``per_input``: thresholded per input, the share then averaged over inputs, layers and heads, as
  their released code does (``eval_sink_open_source.py``: ``(importance > eps).mean((0,1,2))``);
  this is the figure their Table 1 reports.

alpha_{i0} comes from ``attngeom.extract.measurement.capture.capture`` (compact layout, sink k =
1), which reads it from the attention kernel's log-sum-exp: exact, no T x T matrix.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

# Gu et al., Table 1 (percent of sink heads, epsilon = 0.3, 64-token inputs)
GU_TABLE1 = {"GPT2-XL": (77.00, 70.29, 62.28), "Mistral-7B": (97.49, 75.21, 0.00),
             "LLaMA2-7B": (92.47, 90.13, 0.00), "LLaMA3-8B": (99.02, 91.23, 0.00)}
GU_INPUTS = ("natural", "random", "repeated")
EPSILON = 0.3
COLUMNS = ("input", "bos", "design_row", "n_inputs", "length", "n_heads", "epsilon",
           "pct_pooled_q1", "pct_pooled_q0", "pct_per_input_q0", "pct_per_input_q1",
           "mean_first_alpha_q1")


def first_token_scores(alpha0: np.ndarray, first_query: int) -> np.ndarray:
    """(N, L, H): mean of alpha_{i0} over queries i >= ``first_query``; alpha0 (N, L, H, T)."""
    return alpha0[..., first_query:].mean(axis=-1)


def sink_percentages(alpha0: np.ndarray, epsilon: float = EPSILON) -> dict:
    """Percent of sink heads under both aggregations and both query ranges (module doc)."""
    out = {}
    for q0 in (0, 1):
        score = first_token_scores(alpha0, q0)                     # (N, L, H)
        out[f"pct_pooled_q{q0}"] = float(100 * (score.mean(0) > epsilon).mean())
        out[f"pct_per_input_q{q0}"] = float(100 * (score > epsilon).mean())
    out["mean_first_alpha_q1"] = float(alpha0[..., 1:].mean())
    return out


def measure_alpha0(model, ids: np.ndarray, batch_size: int = 8) -> np.ndarray:
    """alpha_{i0} (N, L, H, T) of every input row (no padding: all rows share one length)."""
    import torch

    from attngeom.extract.measurement.capture import capture
    from attngeom.extract.measurement.layer import Options

    opts = Options("compact", sink_k=1, tail_w=1, derived=False)
    parts = []
    for start in range(0, len(ids), batch_size):
        x = torch.as_tensor(ids[start:start + batch_size])
        out = capture(model, {"input_ids": x, "attention_mask": torch.ones_like(x)}, opts)
        parts.append(out["alpha"][..., 0])                          # (B, L, H, T)
    return np.concatenate(parts)


def gu_inputs(tok, wikitext: str, n: int, length: int, seed: int = 0):
    """(input, bos, design_row, ids) of every variant: natural text as the tokenizer makes it
    (the design's row) and, when the tokenizer adds a BOS, also without it; random and repeated
    tokens without BOS (the design's rows) and, for BOS tokenizers, with it."""
    import texts

    bos_default = texts.adds_bos(tok)
    bos_id = tok.bos_token_id if bos_default else None
    yield "natural", bos_default, True, texts.natural_inputs(tok, wikitext, n, length, bos_default)
    if bos_default:
        yield "natural", False, False, texts.natural_inputs(tok, wikitext, n, length, False)
    for kind, make, s in (("random", texts.random_inputs, seed),
                          ("repeated", texts.repeated_inputs, seed + 1)):
        yield kind, False, True, make(tok, n, length, s)
        if bos_default:
            yield kind, True, False, make(tok, n, length, s, bos_id)


def gu_table(model, tok, wikitext: str, n: int = 100, length: int = 64,
             epsilon: float = EPSILON, batch_size: int = 8, seed: int = 0
             ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(one row per input variant, per-head scores) of a model; see the module doc."""
    rows, heads = [], []
    for kind, bos, design, ids in gu_inputs(tok, wikitext, n, length, seed):
        if len(ids) == 0:
            continue
        alpha0 = measure_alpha0(model, ids, batch_size)
        N, L, H, T = alpha0.shape
        rows.append(dict(input=kind, bos=bool(bos), design_row=design, n_inputs=N, length=T,
                         n_heads=L * H, epsilon=epsilon, **sink_percentages(alpha0, epsilon)))
        s1, s0 = first_token_scores(alpha0, 1).mean(0), first_token_scores(alpha0, 0).mean(0)
        for layer in range(L):
            for head in range(H):
                heads.append(dict(input=kind, bos=bool(bos), layer=layer, head=head,
                                  score_q1=float(s1[layer, head]),
                                  score_q0=float(s0[layer, head])))
    return pd.DataFrame(rows, columns=list(COLUMNS)), pd.DataFrame(heads)
