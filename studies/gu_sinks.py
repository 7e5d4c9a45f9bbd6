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

The inputs are the package's: probe specs ``probe:random:T:N:SEED`` / ``probe:repeated:...``
(extract/loading/probes.py) and natural text with ``--min-length T``; each variant is an
``attngeom extract`` store (compact, k = 1: alpha_{i0} from the attention kernel's
log-sum-exp, exact), and the per-input and pooled counts are ``attngeom.analysis.sinks``'.
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


def gu_variants(bos_default: bool, n: int, length: int, seed: int = 0, both: bool = False):
    """(input, bos, design_row, data spec or None for natural text, --bos) of every variant:
    natural text as the tokenizer makes it (the design's row) and, when the tokenizer adds a
    BOS, also without it; random and repeated tokens without BOS (the design's rows) and, for
    BOS tokenizers, with it. ``both``: the BOS rows also for a tokenizer that has a BOS token
    but does not add it (Qwen2.5: natural text too, with its BOS prepended). Probe specs are
    the package's (extract/loading/probes.py)."""
    yield "natural", bos_default, True, None, "auto"
    if bos_default:
        yield "natural", False, False, None, "no"
    elif both:
        yield "natural", True, False, None, "yes"
    for kind, s in (("random", seed), ("repeated", seed + 1)):
        spec = f"probe:{kind}:{length}:{n}:{s}"
        yield kind, False, True, spec, "auto"
        if bos_default or both:
            yield kind, True, False, spec, "yes"


def natural_file(wikitext: str | Path, out: Path, chunk_chars: int = 1400) -> Path:
    """WikiText-2 chunks, round-robin over the articles, as a .jsonl for ``attngeom extract``."""
    import json

    import prepare

    groups = [prepare.chunk_text(prepare.text_of(r, "text"), chunk_chars)
              for r in prepare.read_jsonl(wikitext)]
    chunks = prepare.round_robin(groups, sum(len(g) for g in groups))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps({"text": t}) + "\n" for t in chunks))
    return out


def gu_table(model: str, tok, wikitext: str, work: Path, n: int = 100, length: int = 64,
             epsilon: float = EPSILON, batch_size: int = 8, seed: int = 0, both: bool = False
             ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(one row per input variant, per-head scores) of ``model``: each variant is an
    ``attngeom extract`` store (probe specs, or natural text with ``--min-length``) read by
    ``attngeom.analysis.sinks`` (the per-input count and the pooled one); the two other
    aggregations of :func:`sink_percentages` come from the same store's alpha_i0. ``both``:
    as :func:`gu_variants`."""
    import texts

    from attngeom.analysis import sinks
    from attngeom.extract.run import ExtractConfig, extract
    from attngeom.store import open_store

    natural = natural_file(wikitext, work / "gu_natural.jsonl")
    rows, heads = [], []
    for kind, bos, design, spec, bos_option in gu_variants(texts.adds_bos(tok), n, length, seed,
                                                          both):
        store = work / f"gu_{kind}_{'bos' if bos else 'nobos'}"
        cfg = ExtractConfig(max_length=length, sink_k=1, bos=bos_option, batch_size=batch_size,
                            limit=None if spec else n, min_length=None if spec else length)
        if not (store / "manifest.json").exists():
            extract(model, spec or str(natural), store, cfg, progress=False)
        ds = open_store(store)
        out = sinks(ds, epsilon=epsilon, sink_k=1)
        alpha0 = ds["alpha"].isel(sink=0).transpose("sequence", "layer", "head",
                                                    "query").values          # (N, L, H, T)
        N, L, H, T = alpha0.shape
        pct = sink_percentages(alpha0, epsilon)
        pct["pct_per_input_q0"] = 100 * float(out["gu_sink_head_share"])      # the package's
        pct["pct_pooled_q1"] = 100 * float(out["is_sink_head"].mean())
        rows.append(dict(input=kind, bos=bool(bos), design_row=design, n_inputs=N, length=T,
                         n_heads=L * H, epsilon=epsilon, **pct))
        s1, s0 = first_token_scores(alpha0, 1).mean(0), first_token_scores(alpha0, 0).mean(0)
        for layer in range(L):
            for head in range(H):
                heads.append(dict(input=kind, bos=bool(bos), layer=layer, head=head,
                                  score_q1=float(s1[layer, head]),
                                  score_q0=float(s0[layer, head])))
    return pd.DataFrame(rows, columns=list(COLUMNS)), pd.DataFrame(heads)
