"""The faithfulness experiment: remove the keys each metric ranks first (or last), measure the loss.

One forward pass per (metric, rank, mode, fraction) and batch, plus a clean pass and, with
``drift``, a sink-zeroed pass (:mod:`.interventions`); with ``layers`` above 0 the removal
passes start at the lowest intervened layer from the clean pass's hidden states there
(:mod:`.resume`: the same numbers, fewer layers run). Units (texts or items) are processed in
blocks; each finished block is written atomically to ``<out>/<name>.partial/`` so a killed run
resumes where it stopped (:func:`attngeom.store.io.result_files.open_partial`). The result,
``<out>/<name>.nc``, is described in :mod:`attngeom.store.format.faithfulness`;
:func:`attngeom.store.io.result_files.record_result` writes it and records its file, checksum and
config in the store manifest (a manifest is created when ``out`` is not yet a store).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from attngeom.store.format.manifest import portable
from attngeom.store.io.result_files import open_partial, record_result, result_path
from attngeom.common.options.stages import FaithConfig
from attngeom.common.options.ranges import parse_ranges
from attngeom.common import metrics as M
from attngeom.common import tasks as T
from attngeom.common.vocab import MAGNITUDE, RANKS, SIGNED

from ..loading.data import Tokenized, batches, pad_token_id
from .interventions import DriftProbe, Intervener, Removal, forward_logits
from ..measurement.archs import decoder_stack
from .resume import HiddenAt, logits_from, lowest_layer
from ..measurement.batches import BatchSize
from .scoring import PREPARE, Prepared, items_sha256, span_logprobs
from .context import row_keys
from .selection import Workspace
from attngeom.common.errors import Refusal


# ------------------------------------------------------------------------------------ plan
def ranking_plan(metrics, ranks, granularity: str) -> dict[tuple[str, str], tuple[str, str]]:
    """(metric, rank) -> the (metric, rank) whose forward passes give its results.

    From the metric registry (:mod:`attngeom.common.metrics`): a metric that provably
    ranks keys like another one run at this granularity takes its results, and a non-negative
    metric ranks the same by |score| as by score. Such pairs are copied, not recomputed.
    """
    plan = {}
    for metric in metrics:
        for rank in ranks:
            same = M.get(metric).same_ranking(granularity, metrics)
            m = metric if same is None else same[0]
            r = SIGNED if rank == MAGNITUDE and M.get(m).nonnegative and SIGNED in ranks \
                else rank
            plan[(metric, rank)] = (m, r)
    return plan


def plan_notes(plan: dict, granularity: str) -> list[str]:
    """One note per copied (metric, rank): what it copies and why."""
    notes = []
    for (metric, rank), (m, r) in plan.items():
        if (m, r) == (metric, rank):
            continue
        why = []
        if m != metric:
            why.append(M.get(metric).same_ranking(granularity, [m])[1])
        if r != rank:
            why.append(M.NONNEGATIVE_REASON)
        notes.append(f"{metric}/{rank}: same ranking as {m}/{r}, results copied, not "
                     f"recomputed ({'; '.join(why)})")
    return notes


# ------------------------------------------------------------------------------------ tasks
def load_task(cfg: FaithConfig, data: str, tok) -> tuple[Prepared, dict]:
    """Prepared rows/spans and the data's provenance (the task table:
    :mod:`attngeom.common.tasks`; its loaders: :data:`..loading.tasks.LOADERS`)."""
    from ..loading.tasks import load

    task = T.get(cfg.task)
    units, recorded = load(cfg.task, data, cfg)
    if not units:
        raise Refusal(f"data '{data}' has no non-empty texts" if task.data == T.TEXTS
                         else f"data '{data}' has no {cfg.task} items")
    info = {"spec": str(data), "task": cfg.task, "limit": cfg.limit, **recorded,
            "n_units": len(units)}
    if "sha256" not in info:                        # texts record theirs
        info["sha256"] = items_sha256(units)
    prepared = PREPARE[task.data](tok, units, cfg.max_length)
    if prepared.kind == "choice":
        prepared.unit["item_id"] = np.array([it.id for it in units], dtype=object)
        prepared.unit["group"] = np.array([it.group for it in units], dtype=object)
    return prepared, info


# ------------------------------------------------------------------------------------ compute
def _batches(prepared: Prepared, batch_size: int, pad_id: int, device):
    tokenized = Tokenized(ids=prepared.rows, truncated=[False] * len(prepared.rows))
    for batch in batches(tokenized, batch_size, pad_id=pad_id):
        index = batch["index"]
        inputs = {k: torch.as_tensor(batch[k]).to(device)
                  for k in ("input_ids", "attention_mask")}
        yield index, inputs


def conditions(cfg: FaithConfig, plan: dict) -> list[Removal]:
    names = M.names()
    computed = sorted(set(plan.values()), key=lambda mr: (names.index(mr[0]),
                                                           RANKS.index(mr[1])))
    layers = None if cfg.layers is None else frozenset(cfg.layers)
    return [Removal(m, mode, p, r, cfg.granularity, layers)
            for m, r in computed for mode in cfg.modes for p in cfg.fractions]


def compute_block(model, prepared: Prepared, cfg: FaithConfig, removals: list[Removal],
                  pad_id: int, bar=None, log=print) -> dict:
    """Span log-probs for the clean, drift and every removal pass, and drift probe sums.

    Returns ``{"clean": (S,), "drift": (S,), "removal": (C, S), "self": (C, R, 2), "probe":
    {phase: {stat: (R, L)}}}`` with R the rows of the block; ``self``: per removal and row, the
    ranking rows that removed keys and those whose removed keys include the query's own.
    """
    device = next(model.parameters()).device
    S, R = len(prepared.span_row), len(prepared.rows)
    out = {"clean": np.zeros(S), "drift": np.zeros(S), "removal": np.zeros((len(removals), S)),
           "self": np.zeros((len(removals), R, 2))}
    probe_rows: dict[str, dict[str, np.ndarray]] = {}
    shared: dict = {}                                  # Gram matrices, once per model
    work = Workspace()                                 # scratch tensors, reused by every pass
    start = 0 if cfg.drift else lowest_layer(cfg.layers)      # removal passes begin here
    stack = decoder_stack(model) if start and removals else None
    if start and removals and stack is None:
        log("faithfulness: no decoder layer list found; every removal pass runs in full")
    verified = False
    for index, inputs in _batches(prepared, cfg.batch_size, pad_id, device):
        where = {int(r): b for b, r in enumerate(index)}
        spans = np.flatnonzero(np.isin(prepared.span_row, index))
        local = np.array([where[int(r)] for r in prepared.span_row[spans]], dtype=np.int64)
        tokens = [prepared.span_tokens[s] for s in spans]

        keys = torch.as_tensor(row_keys(inputs["input_ids"].cpu().numpy(),
                                        inputs["attention_mask"].cpu().numpy()))

        def score(handler, hidden=None) -> np.ndarray:
            logits = (forward_logits(model, inputs, handler) if hidden is None else
                      logits_from(model, stack, start, hidden, inputs, handler))
            if bar is not None:
                bar.update(1)
            return span_logprobs(logits, local, prepared.span_start[spans], tokens)

        probe = DriftProbe(cfg.sink_k, cfg.drift_low_fraction) if cfg.drift else None
        clean = lambda: Intervener(model, probe=probe, projections=shared, workspace=work)
        if stack is None:
            out["clean"][spans] = score(clean())
            hidden = None
        else:
            with HiddenAt(stack[2], start).watching() as at:
                logits = forward_logits(model, inputs, clean())
            if bar is not None:
                bar.update(1)
            out["clean"][spans] = span_logprobs(logits, local, prepared.span_start[spans], tokens)
            hidden, verified = at.hidden, verified or torch.equal(
                logits_from(model, stack, start, at.hidden, inputs, clean()), logits)
            if not verified:                              # checked on the block's first batch
                log(f"faithfulness: this model's forward from layer {start} differs from its "
                    "full pass; every removal pass runs in full")
                stack = hidden = None
        if cfg.drift:
            probe.phase = "after"
            out["drift"][spans] = score(Intervener(model, sink_k=cfg.sink_k, probe=probe,
                                                       projections=shared, workspace=work))
            for phase in ("before", "after"):
                for name, x in probe.collect(phase).items():
                    arr = probe_rows.setdefault(phase, {}).setdefault(
                        name, np.zeros((R, x.shape[1])))
                    arr[index] = x.numpy()
        for c, removal in enumerate(removals):
            handler = Intervener(model, removal=removal, projections=shared, workspace=work)
            handler.rows = keys
            below = M.BELOW in M.get(removal.metric).needs    # the layers below: run them
            out["removal"][c, spans] = score(handler, None if below else hidden)
            if handler.self_counts is not None:
                out["self"][c, index] = handler.self_counts.cpu().numpy()
    out["probe"] = probe_rows
    return out


def compute_retrying(model, prepared: Prepared, cfg: FaithConfig, removals: list[Removal],
                     pad_id: int, bar=None, log=print, current: BatchSize | None = None
                     ) -> dict:
    """:func:`compute_block`; on out-of-memory halve the batch size and redo the block.

    The smaller size is kept in ``current`` (default: a new one at ``cfg.batch_size``) for the
    rest of the run; at batch size 1 it raises MemoryError. Batch size does not shape the
    numbers (it is not part of the options hash).
    """
    from ..measurement.batches import halved_batch

    current = current or BatchSize(cfg.batch_size)
    while True:
        try:
            return compute_block(model, prepared, replace(cfg, batch_size=current.size),
                                 removals, pad_id, bar, log)
        except RuntimeError as exc:
            current.size = halved_batch(exc, current.size, cfg.device, log, "redoing the block",
                                      "--max-length, fewer --layers")


def check_cost(model, prepared: Prepared, removals: list[Removal], cfg: FaithConfig,
               n_layers: int, causal: bool, log=print) -> None:
    """Refuse, before anything runs or is written, a run whose passes of a metric that reruns
    the layer after its attention (``sublayer``: value zeroing) would take longer than
    ``cfg.max_hours`` here (:func:`..loading.budget.check_zeroing`)."""
    from ..loading.budget import check_zeroing, zeroing_rows
    from .sublayer import rows_per_second

    passes = sum(M.SUBLAYER in M.get(r.metric).needs for r in removals)
    if not passes:
        return
    layers = n_layers if cfg.layers is None else len(cfg.layers)
    lengths = [len(r) for r in prepared.rows]
    rows = zeroing_rows(lengths, layers, passes, causal)
    what = (f"{passes} removal passes x {len(lengths)} texts of up to "
            f"{max(lengths, default=0)} tokens x {layers} layers")
    seconds = check_zeroing(rows, rows_per_second(model), cfg.max_hours, what,
                            "fewer texts (--limit), a shorter --max-length or fewer --layers")
    log(f"faithfulness: value zeroing's passes estimated here at {seconds / 60:.3g} minutes at "
        f"least ({what})")


# ------------------------------------------------------------------------------------ run
def faithfulness(model: str, data: str, out: str | Path, cfg: FaithConfig | None = None,
                 trust_remote_code: bool = False, progress: bool = True, force: bool = False,
                 log=print, beyond_context: bool = False) -> Path:
    """Run the faithfulness experiment into ``out/<name>.nc``, as ``attngeom faithfulness`` does.

    Parameters
    ----------
    model : str
        A hub id, a model directory, a ``.gguf`` file or a built-in name: a causal language
        model with its language-modelling head.
    data : str
        Texts, or the task's records (``.jsonl``, ``hf:...``), as ``--data`` takes them.
    out : str or Path
        A store, whose manifest records the result, or a new or empty folder (a results-only
        store is made there). An interrupted run of the same settings is resumed.
    cfg : FaithConfig, optional
        The experiment's options (default: every option's default).
    trust_remote_code : bool
        Allow model code from the hub.
    progress : bool
        Show a progress bar.
    force : bool
        Replace a result, or discard an interrupted run, of other settings (refused otherwise).
    log : callable
        Called with each message line (default: :func:`print`).
    beyond_context : bool
        Allow ``max_length`` past the model's configured context (refused otherwise).

    Returns
    -------
    Path
        The result file, ``out/<name>.nc``; an existing complete result of the same settings
        is kept, not recomputed.

    Raises
    ------
    attngeom.common.errors.Refusal
        For a model that is not a causal language model, bad options or data, or value
        zeroing estimated beyond ``cfg.max_hours``.
    attngeom.common.errors.StoreError
        For an ``out`` holding another model's results, a result or interrupted run of other
        settings (without ``force``), or a folder that is neither a store nor empty.
    """
    from attngeom.store.format.faithfulness import assemble, block_dataset

    from ..loading.budget import check_context, context_length
    from ..loading.models import load
    from ..provenance import versions
    from .output import unit_arrays

    cfg = cfg or FaithConfig()
    cfg.check()
    out = Path(out)
    loaded = load(model, device=cfg.device, dtype=cfg.dtype, trust_remote_code=trust_remote_code,
                  progress=progress)
    if not loaded.info["causal"] or loaded.tokenizer is None:
        raise Refusal(f"faithfulness scores next-token predictions, so it needs a causal "
                         f"language model; '{model}' is a {loaded.info['model_type']} encoder")
    if loaded.model.get_output_embeddings() is None:
        raise Refusal(f"faithfulness scores next-token predictions, but '{model}' loaded "
                         "without a language-modelling head (its config.json names no causal-LM "
                         "class in 'architectures'); save it with its LM head")
    n_layers = loaded.info["n_layers"]
    layers = parse_ranges(cfg.layers, range(n_layers), "--layers", "this model's layers")
    cfg = replace(cfg, layers=None if layers is None else tuple(layers))
    prepared, data_info = load_task(cfg, data, loaded.tokenizer)
    check_context(max(map(len, prepared.rows), default=0), context_length(loaded.model.config),
                  beyond_context, what="texts of")
    # specs as labels, as extraction records them: the same inputs anywhere, the same config
    config = {"model": portable(loaded.info, "spec", "id"),
              "data": portable(data_info, "spec", "dev"), "options": cfg.options()}
    plan = ranking_plan(cfg.metrics, cfg.ranks, cfg.granularity)
    notes = plan_notes(plan, cfg.granularity)
    for note in notes:
        log(f"attngeom: note: {note}")
    removals = conditions(cfg, plan)
    check_cost(loaded.model, prepared, removals, cfg, n_layers, loaded.info["causal"], log)
    partial = open_partial(out, cfg.name, config, force, log)
    if partial is None:                                   # complete with these settings
        return result_path(out, cfg.name)
    n = prepared.n_units
    blocks = [(a, min(n, a + cfg.block_size)) for a in range(0, n, cfg.block_size)]
    per_batch = len(removals) + 1 + int(cfg.drift)                  # forward passes
    subsets = [prepared.subset(start, stop) for start, stop in blocks]
    n_batches = [-(-len(b.rows) // cfg.batch_size) for b in subsets]
    bar = tqdm(total=sum(n_batches) * per_batch, unit="pass", desc="faithfulness",
               disable=not progress)
    parts, current = [], BatchSize(cfg.batch_size)
    for (start, stop), block, nb in zip(blocks, subsets, n_batches):
        ds = partial.read_block(start, stop)
        if ds is None:
            result = compute_retrying(loaded.model, block, cfg, removals,
                                      pad_token_id(loaded.tokenizer), bar, log, current)
            ds = block_dataset(block.kind, unit_arrays(block, result, cfg.drift), cfg, plan,
                               removals, start, n_layers)
            partial.write_block(ds, start, stop)
        else:
            bar.update(nb * per_batch)
        parts.append(ds)
    bar.close()
    ds = assemble(parts, prepared.kind, cfg, config, plan, notes)
    return record_result(out, cfg.name, ds, config, versions(), partial)
