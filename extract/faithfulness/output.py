"""A faithfulness block's per-unit results: the spans' log-probs in, per-unit arrays out.

The result format these arrays fill (dimensions, descriptions, derived variables, provenance)
is the store's: :mod:`attngeom.store.format.faithfulness`.
"""

from __future__ import annotations

import numpy as np

from .scoring import Prepared, unit_scores


def _probe_units(block: Prepared, probe: dict) -> dict[str, np.ndarray]:
    """Drift probe sums per row (R, L) -> per-unit means (U, L)."""
    row_unit = np.zeros(len(block.rows), dtype=np.int64)
    row_unit[block.span_row] = block.span_unit
    out = {}
    for phase, stats in probe.items():
        sums = {}
        for name, x in stats.items():
            s = np.zeros((block.n_units, x.shape[1]))
            np.add.at(s, row_unit, x)
            sums[name] = s
        with np.errstate(invalid="ignore", divide="ignore"):
            out[f"drift_cosine_low_{phase}"] = sums["cosine_low"] / sums["n_low"]
            out[f"drift_cosine_all_{phase}"] = sums["cosine_all"] / sums["n_all"]
            out[f"drift_output_norm_low_{phase}"] = sums["output_norm_low"] / sums["n_low"]
        if phase == "before":
            out["drift_n_low"] = sums["n_low"]
    return out


def _self_key(block: Prepared, counts: np.ndarray) -> np.ndarray:
    """Per removal and unit (C, U): of the ranking rows that removed keys, the share whose
    removed keys include the query's own key (rows of a unit pooled; NaN where none)."""
    row_unit = np.zeros(len(block.rows), dtype=np.int64)
    row_unit[block.span_row] = block.span_unit
    sums = np.zeros((counts.shape[0], block.n_units, 2))
    np.add.at(sums, (slice(None), row_unit), counts)
    with np.errstate(invalid="ignore", divide="ignore"):
        return sums[..., 1] / sums[..., 0]


def unit_arrays(block: Prepared, result: dict, drift: bool) -> dict[str, np.ndarray]:
    """Per-unit arrays of one block, as :func:`attngeom.store.format.faithfulness.block_dataset`
    takes them: ``ppl`` / ``logprob`` / ``correct`` (C, U, ...) per computed removal, the rest
    (U, ...)."""
    removal = unit_scores(block, result["removal"])
    clean = unit_scores(block, result["clean"])
    data = {}
    if block.kind == "lm":
        data["ppl"] = removal["ppl"]
        data["clean_ppl"] = clean["ppl"]
        n_tok = np.zeros(block.n_units, dtype=np.int64)
        np.add.at(n_tok, block.span_unit, [len(t) for t in block.span_tokens])
        data["n_scored"] = n_tok
        data["length"] = block.unit["length"].astype(np.int64)
    else:
        data["logprob"] = removal["logprob"]
        data["correct"] = removal["correct"]
        data["clean_logprob"] = clean["logprob"]
        data["clean_correct"] = clean["correct"]
        data["answer"] = block.answer
        for name in ("n_options", "item_id", "group"):
            data[name] = block.unit[name]
    data["truncated"] = block.unit["truncated"].astype(np.int8)
    data["self_key_removed"] = _self_key(block, result["self"])
    if drift:
        scores = unit_scores(block, result["drift"])
        if block.kind == "lm":
            data["drift_ppl"] = scores["ppl"]
        else:
            data["drift_logprob"] = scores["logprob"]
            data["drift_correct"] = scores["correct"]
        data.update(_probe_units(block, result["probe"]))
    return data
