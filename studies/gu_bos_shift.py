"""Where the sink goes when a BOS the model was not trained with is prepended (Qwen2.5).

Gu et al.'s count (studies/gu_sinks.py) looks at the first token only. Qwen2.5's tokenizer adds
no BOS, so with one prepended the first token is a token the model rarely saw first, and the
count at position 0 may fall because the sink moved to the first text token, not because the
model has no sink. This script measures both: each BOS variant of the Gu protocol (natural,
random and repeated inputs, the same specs and texts as ``gu_sinks.gu_table``) extracted with
two sink keys (compact, k = 2: alpha_{i0} and alpha_{i1} exact), then the share of heads whose
mean attention to key j over the queries after it (i > j) exceeds epsilon, for j = 0 (the BOS)
and j = 1 (the first text token), and for their sum. Without a BOS, key 0 is the first text
token; those rows are the same stores' no-BOS twins, read with the same formula.

Usage (from the repository root)::

    python studies/gu_bos_shift.py --model qwen2.5-0.5b \\
        --work studies/qwen2.5-0.5b/work_faithfulness/gu \\
        --out studies/qwen2.5-0.5b/results_faithfulness/gu_bos_shift.csv
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gu_sinks  # noqa: E402

COLUMNS = ("model", "input", "bos", "n_inputs", "length", "n_heads", "epsilon",
           "pct_sink_key0", "pct_sink_key1", "pct_sink_key01", "mean_alpha_key0",
           "mean_alpha_key1")


def key_scores(alpha: np.ndarray, key: int) -> np.ndarray:
    """(N, L, H): mean of alpha_{i,key} over the queries after the key (i > key); alpha
    (N, L, H, T)."""
    return alpha[..., key + 1:].mean(axis=-1)


def shift_row(alpha0: np.ndarray, alpha1: np.ndarray, epsilon: float) -> dict:
    """Per-input shares (percent, Gu's released aggregation) of heads whose mean attention to
    key 0, to key 1 and to the two together exceeds ``epsilon``; alpha0/alpha1 (N, L, H, T)."""
    s0, s1 = key_scores(alpha0, 0), key_scores(alpha1, 1)
    both = (alpha0 + alpha1)[..., 2:].mean(axis=-1)
    return dict(pct_sink_key0=float(100 * (s0 > epsilon).mean()),
                pct_sink_key1=float(100 * (s1 > epsilon).mean()),
                pct_sink_key01=float(100 * (both > epsilon).mean()),
                mean_alpha_key0=float(alpha0[..., 1:].mean()),
                mean_alpha_key1=float(alpha1[..., 2:].mean()))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--work", type=Path, required=True, help="the study's gu/ folder")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--n", type=int, default=100)
    p.add_argument("--length", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=8)
    a = p.parse_args(argv)

    from attngeom.extract.run import ExtractConfig, extract
    from attngeom.store import open_store

    natural = a.work / "gu_natural.jsonl"           # written by gu_sinks.gu_table
    rows = []
    for kind, bos, _, spec, bos_option in gu_sinks.gu_variants(False, a.n, a.length,
                                                                both=True):
        store = a.work / f"gu_{kind}_{'bos' if bos else 'nobos'}_k2"
        cfg = ExtractConfig(max_length=a.length, sink_k=2, bos=bos_option,
                            batch_size=a.batch_size, limit=None if spec else a.n,
                            min_length=None if spec else a.length)
        if not (store / "manifest.json").exists():
            extract(a.model, spec or str(natural), store, cfg, progress=False)
        alpha = open_store(store)["alpha"].transpose("sequence", "layer", "head", "sink",
                                                     "query").values   # (N, L, H, 2, T)
        N, L, H, _, T = alpha.shape
        rows.append(dict(model=a.model, input=kind, bos=bool(bos), n_inputs=N, length=T,
                         n_heads=L * H, epsilon=gu_sinks.EPSILON,
                         **shift_row(alpha[..., 0, :], alpha[..., 1, :], gu_sinks.EPSILON)))
    out = pd.DataFrame(rows, columns=list(COLUMNS))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    out.to_csv(a.out, index=False)
    print(out.to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
