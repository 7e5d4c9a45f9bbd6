"""The faithfulness result format: per-unit arrays of each block in, ``<name>.nc``'s contents out.

extract/ computes each block's per-unit arrays
(:func:`attngeom.extract.faithfulness.output.unit_arrays`); :func:`block_dataset` lays them out and
:func:`assemble` adds the derived variables and provenance. Writing it (atomically, recorded in the
store manifest) and the resumable partial blocks are :mod:`attngeom.store.io.result_files`'
(``open_partial``, ``record_result``).

``<name>.nc`` (netCDF4/HDF5, plain xarray) holds, with ``U`` = ``sequence`` (language
modelling, GSM8K answers) or ``item`` (multiple choice):

language modelling: ``ppl``, ``delta_ppl`` (metric, rank, mode, fraction, sequence);
``clean_ppl``, ``n_scored``, ``length``, ``truncated`` (sequence).
multiple choice: ``logprob`` (metric, rank, mode, fraction, item, option), ``correct``,
``accuracy_loss`` (= clean_correct - correct), ``answer_logprob_loss`` (clean - intervened
log-prob of the correct option) (metric, rank, mode, fraction, item), ``accuracy``
(metric, rank, mode, fraction); ``clean_logprob`` (item, option), ``clean_correct``, ``answer``,
``n_options``, ``truncated``, ``item_id``, ``group`` (item); ``clean_accuracy`` ().
both: ``aopc`` (metric, rank, mode, U), the per-unit mean of the loss over the swept
fractions; ``self_key_removed`` (metric, rank, mode, fraction, U), the share of removal sets
that include the query's own key; ``computed`` and ``same_ranking_as`` (metric, rank); semantic drift (sink values zeroed):
``drift_ppl``/``drift_delta_ppl`` or ``drift_logprob``/``drift_correct``/``drift_accuracy``, and
per (U, layer) ``drift_cosine_low_before``, ``drift_cosine_low_after``,
``drift_cosine_all_before``, ``drift_cosine_all_after``, ``drift_output_norm_low_before``,
``drift_output_norm_low_after``, ``drift_n_low``. Attribute ``loss_variable`` names the per-unit
loss (larger = more damage) the statistics use: ``delta_ppl`` or ``accuracy_loss``.
"""

from __future__ import annotations

import json

import numpy as np
import xarray as xr

from attngeom import __version__

from .derive import AOPC_NOTE, aopc
from .manifest import config_hash, now
from . import metrics as M
from .vocab import RANKS

DESCRIPTIONS = {
    "ppl": "perplexity exp(mean next-token NLL over the scored positions) under the intervention",
    "clean_ppl": "perplexity of the unmodified model",
    "delta_ppl": "ppl - clean_ppl (larger: the removed keys mattered more)",
    "n_scored": "number of scored (predicted) tokens",
    "length": "tokens in the model row",
    "truncated": "1 when the text was cut to max_length",
    "logprob": "log P(continuation | context) of each option under the intervention",
    "correct": "1 when the arg-max option is the answer under the intervention",
    "accuracy": "mean of correct over items",
    "accuracy_loss": "clean_correct - correct (larger: the removed keys mattered more)",
    "answer_logprob_loss": "clean - intervened log P of the correct option (a graded loss; "
                           "pass it as variable= to the statistics)",
    "clean_logprob": "log P(continuation | context) of each option, unmodified model",
    "clean_correct": "1 when the unmodified model's arg-max option is the answer",
    "clean_accuracy": "accuracy of the unmodified model",
    "answer": "index of the correct option",
    "n_options": "number of options of the item",
    "item_id": "item id in the source data",
    "group": "sub-task (MMLU subject) or empty",
    "computed": "1 when this (metric, rank) was run; 0 when copied from same_ranking_as",
    "same_ranking_as": "metric/rank whose ranking (hence results) this pair provably equals",
    "drift_ppl": "perplexity with the sink keys' value vectors zeroed (alpha kept)",
    "drift_delta_ppl": "drift_ppl - clean_ppl",
    "drift_logprob": "option log-probs with the sink keys' value vectors zeroed",
    "drift_correct": "correct with the sink keys' value vectors zeroed",
    "drift_accuracy": "accuracy with the sink keys' value vectors zeroed",
    "drift_accuracy_loss": "clean_correct - drift_correct",
    "drift_cosine_low_before": "mean cos(o_i^h, m_i^h) over the lowest-norm head outputs, clean "
                               "(m_i^h: mean projected value of the non-sink keys query i sees)",
    "drift_cosine_low_after": "the same cells' cos(o_i^h, m_i^h) with the sink values zeroed",
    "drift_cosine_all_before": "mean cos(o_i^h, m_i^h) over all head outputs (queries i >= k)",
    "drift_cosine_all_after": "the same with the sink values zeroed",
    "drift_output_norm_low_before": "mean ||o_i^h|| of the lowest-norm head outputs, clean",
    "drift_output_norm_low_after": "mean ||o_i^h|| of the same cells with the sink values zeroed",
    "drift_n_low": "number of (head, query) cells in the lowest-norm selection",
    "aopc": "per-unit AOPC: mean over the swept fractions of the loss (loss_variable)",
    "self_key_removed": "of the ranking rows (head and query; query at token granularity) that "
                        "removed keys, over the intervened layers, the share whose removed keys "
                        "include the query's own key",
}

# per-unit arrays of a block (``unit_arrays``) that have one row per computed removal (C, U, ...)
PER_REMOVAL = ("ppl", "logprob", "correct", "self_key_removed")
# trailing dimensions after the unit dimension; the rest are (U,)
TRAILING = {"logprob": ("option",), "clean_logprob": ("option",), "drift_logprob": ("option",),
            **{name: ("layer",) for name in DESCRIPTIONS if name.startswith(
                ("drift_cosine", "drift_output_norm", "drift_n_low"))}}


def unit_dim(kind: str) -> str:
    """The unit dimension: ``sequence`` (language modelling) or ``item`` (multiple choice)."""
    return "sequence" if kind == "lm" else "item"


def _expand(values: np.ndarray, cfg, plan: dict, removals) -> np.ndarray:
    """(C, ...) per computed removal -> (metric, rank, mode, fraction, ...) by the plan."""
    index = {(r.metric, r.rank, r.mode, r.fraction): c for c, r in enumerate(removals)}
    shape = (len(cfg.metrics), len(cfg.ranks), len(cfg.modes), len(cfg.fractions))
    out = np.empty(shape + values.shape[1:], dtype=values.dtype)
    for a, metric in enumerate(cfg.metrics):
        for b, rank in enumerate(cfg.ranks):
            m, r = plan[(metric, rank)]
            for c, mode in enumerate(cfg.modes):
                for d, p in enumerate(cfg.fractions):
                    out[a, b, c, d] = values[index[(m, r, mode, p)]]
    return out


def block_dataset(kind: str, arrays: dict[str, np.ndarray], cfg, plan: dict, removals,
                  start: int, n_layers: int) -> xr.Dataset:
    """One block of units as a Dataset (no derived variables).

    ``arrays``: name -> per-unit array, (C, U, ...) for :data:`PER_REMOVAL` (one row per
    computed removal in ``removals``), else (U, ...); ``plan``: (metric, rank) -> the
    (metric, rank) whose results it copies.
    """
    U = unit_dim(kind)
    grid = ("metric", "rank", "mode", "fraction", U)
    data = {}
    for name, x in arrays.items():
        if name in PER_REMOVAL:
            data[name] = (grid + TRAILING.get(name, ()), _expand(x, cfg, plan, removals))
        else:
            data[name] = ((U,) + TRAILING.get(name, ()), x)
    n_units = len(arrays["truncated"])
    coords = {"metric": list(cfg.metrics), "rank": list(cfg.ranks), "mode": list(cfg.modes),
              "fraction": np.asarray(cfg.fractions, dtype=float),
              U: np.arange(start, start + n_units)}
    if cfg.drift:
        coords["layer"] = np.arange(n_layers)
    return xr.Dataset(data, coords=coords)


def assemble(parts: list[xr.Dataset], kind: str, cfg, config: dict, plan: dict,
             notes: list[str]) -> xr.Dataset:
    """Concatenate blocks, add derived variables, descriptions and provenance.

    ``plan``: (metric, rank) -> the (metric, rank) whose results it copies
    (:func:`attngeom.extract.faithfulness.experiment.ranking_plan`).
    """
    U = unit_dim(kind)
    ds = xr.concat(parts, dim=U, data_vars="minimal", coords="minimal", compat="override",
                   join="override") if len(parts) > 1 else parts[0]
    if kind == "lm":
        ds["delta_ppl"] = ds["ppl"] - ds["clean_ppl"]
        if cfg.drift:
            ds["drift_delta_ppl"] = ds["drift_ppl"] - ds["clean_ppl"]
        loss = "delta_ppl"
    else:
        ds["accuracy"] = ds["correct"].astype(float).mean(U)
        ds["clean_accuracy"] = ds["clean_correct"].astype(float).mean(U)
        ds["accuracy_loss"] = (ds["clean_correct"] - ds["correct"]).astype(np.int8)
        answer = ds["answer"]
        ds["answer_logprob_loss"] = (ds["clean_logprob"].isel(option=answer)
                                     - ds["logprob"].isel(option=answer))
        if cfg.drift:
            ds["drift_accuracy"] = ds["drift_correct"].astype(float).mean(U)
            ds["drift_accuracy_loss"] = (ds["clean_correct"] - ds["drift_correct"]).astype(np.int8)
        loss = "accuracy_loss"
    ds["aopc"] = aopc(ds[loss])                                         # (metric, rank, mode, U)
    same = np.array([[f"{plan[(m, r)][0]}/{plan[(m, r)][1]}" if plan[(m, r)] != (m, r) else ""
                      for r in cfg.ranks] for m in cfg.metrics], dtype=object)
    ds["same_ranking_as"] = (("metric", "rank"), same)
    ds["computed"] = (("metric", "rank"), (same == "").astype(np.int8))
    for name, var in ds.data_vars.items():
        var.attrs["description"] = DESCRIPTIONS.get(name, "")
    ds.attrs = {
        "attngeom_format": "attngeom-faithfulness", "attngeom_version": __version__,
        "task": cfg.task, "model": config["model"]["id"], "data": config["data"]["spec"],
        "data_sha256": config["data"]["sha256"], "granularity": cfg.granularity,
        "layers": "all" if cfg.layers is None else ",".join(map(str, cfg.layers)),
        "sink_k": cfg.sink_k, "drift_low_fraction": cfg.drift_low_fraction,
        "loss_variable": loss, "unit_dim": U, "aopc": AOPC_NOTE,
        "notes": "\n".join(notes), "config_hash": config_hash(config),
        "attngeom_config": json.dumps(config, sort_keys=True), "created": now(),
        "metric_order": ",".join(M.order(cfg.metrics)),
        "ranks": ",".join(r for r in RANKS if r in cfg.ranks),
    }
    return ds
