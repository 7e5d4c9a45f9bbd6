"""The extraction run: texts in, a complete (or resumable) store out.

Sequences are split into shards of ``shard_size`` in data order. Each finished shard is
written atomically and recorded, with its checksum, in the manifest; a rerun of the same
command skips recorded shards whose file and checksum are intact. A shard is written layer by
layer as it is measured (:func:`stream_shard`), under a temporary name until it is complete:
dense always, compact on a CPU (:func:`streamed`); compact on an accelerator is measured a
whole batch at a time, then written (:func:`extract_shard`).
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import xarray as xr
from tqdm.auto import tqdm

from attngeom.common.options.stages import ExtractConfig, identity
from attngeom.common.vocab import DENSE, FLOAT32, MAX_SHARD_SEQUENCES, SHARD_BYTES
from attngeom.store.format import schema as S
from attngeom.store.format.chunks import ChunkEncoder
from attngeom.store.format.manifest import portable, spec_label
from attngeom.store.format.packing import stored_attrs
from attngeom.store.format.parts import check_part, parse_part, part_record
from attngeom.store.format.shards import build_shard
from attngeom.store.format.stream import measured_layout
from attngeom.store.io.writer import StoreWriter

from .loading.data import (Sequences, TextSet, Tokenized, load_texts, texts_sha256,
                           tokenize_texts)
from .loading.images import image_tokens, is_image_spec, load_images
from .loading.probes import ProbeSet, is_probe, probe_set
from .measurement.batches import BatchSize, Rows, measure_rows
from .measurement.layer import Options
from .provenance import versions
from .loading.budget import (check_budget, check_context, context_length, directory_bytes,
                             sequence_bytes)
from attngeom.common.errors import Refusal


def default_shard_size(cfg: ExtractConfig, n_layers: int, n_heads: int) -> int:
    """Sequences per shard so that a shard holds about ``SHARD_BYTES`` before compression."""
    per_seq = sequence_bytes(cfg.mode, cfg.max_length, cfg.sink_k, cfg.tail_w, n_layers, n_heads)
    return int(max(1, min(MAX_SHARD_SEQUENCES, SHARD_BYTES // per_seq)))


BUDGET_SAMPLE = 256            # texts tokenized to size the store before it is started


def check_run(loaded, cfg: ExtractConfig, texts, n: int, out: Path, beyond_context: bool
              ) -> None:
    """ValueError before anything is written: ``--max-length`` past the model's context, or a
    store or batch that will not fit (:mod:`attngeom.extract.loading.budget`)."""
    info, items = loaded.info, texts.texts
    if texts.kind == "image":
        lengths = [cfg.max_length]
    else:
        ids = items.ids[:BUDGET_SAMPLE] if isinstance(items, Tokenized) else tokenize_texts(
            loaded.tokenizer, items[:BUDGET_SAMPLE], cfg.max_length, cfg.bos).ids
        lengths = [len(i) for i in ids]
        check_context(max(lengths, default=0), context_length(loaded.model.config),
                      beyond_context, what="texts of")
    check_budget(out, n, lengths, cfg.mode, cfg.max_length, cfg.sink_k, cfg.tail_w,
                 info["n_layers"],
                 info["n_heads"], bool(info.get("causal", True)), cfg.precision != FLOAT32,
                 cfg.batch_size, have=directory_bytes(out / "shards"))


def store_config(info: dict, texts, cfg: ExtractConfig, shard_size: int) -> dict:
    model = portable(info, "spec", "id")
    data = {"spec": spec_label(texts.spec), "text_field": cfg.text_field, "sha256": texts.sha256,
            "n_texts": len(texts.texts), "limit": cfg.limit}
    data.update({name: value for name, value in identity(cfg, "data").items()
                 if name in ("bos", "min_length")})          # recorded when not the default
    if isinstance(texts, ProbeSet):
        data["tokenizer_sha256"] = texts.tokenizer_sha256
    if cfg.image_field is not None:                  # recorded only for image datasets
        data["image_field"] = cfg.image_field
    options = {"mode": cfg.mode, "sink_k": cfg.sink_k, "tail_w": cfg.tail_w,
               "max_length": cfg.max_length, "shard_size": shard_size,
               "store_text": cfg.store_text}
    if cfg.precision != FLOAT32:          # absent means float32: older stores keep their hash
        options["precision"] = cfg.precision
    return {"model": model, "data": data, "options": options}


def long_enough(texts: TextSet, tok, cfg: ExtractConfig) -> TextSet:
    """The texts of at least ``cfg.min_length`` tokens (as the run tokenizes them), then the
    first ``cfg.limit`` of those; a one-line error when none is long enough."""
    lengths = [len(ids) for ids in tokenize_texts(tok, texts.texts, 10**9, cfg.bos).ids]
    kept = [t for t, n in zip(texts.texts, lengths) if n >= cfg.min_length][:cfg.limit]
    if not kept:
        raise Refusal(f"--min-length {cfg.min_length}: no text of '{texts.spec}' has that many "
                         f"tokens (the longest has {max(lengths)}); lower --min-length")
    return TextSet(kept, texts.spec, texts_sha256(kept), texts.skipped_empty)


def extract(model: str, data: str, out: str | Path, cfg: ExtractConfig | None = None,
            trust_remote_code: bool = False, progress: bool = True,
            part: str | tuple[int, int] | None = None, texts=None,
            beyond_context: bool = False, shard: str | tuple[int, int] | None = None) -> dict:
    """Extract ``data`` through ``model`` into the store ``out``, as ``attngeom extract`` does.

    Parameters
    ----------
    model : str
        A hub id, a model directory, a ``.gguf`` file or a built-in name.
    data : str
        A data spec, as ``--data`` takes it.
    out : str or Path
        The store directory: created, or resumed when it holds a partial run of the same
        settings.
    cfg : ExtractConfig, optional
        The extraction options (default: every option's default).
    trust_remote_code : bool
        Allow model code from the hub.
    progress : bool
        Show progress bars.
    part : str or tuple of int, optional
        ``"I/N"`` or ``(I, N)``: extract only part I (0-based) of N, a contiguous block of whole
        shard files (see :mod:`attngeom.store.format.parts`); merging the N part stores with
        ``attngeom store merge`` gives exactly the single-process store.
    texts : TextSet, optional
        Texts already loaded for ``data`` (the spec is still recorded).
    beyond_context : bool
        Allow ``max_length`` past the model's configured context (refused otherwise, before the
        store is created, as a store or batch too large for the disk or memory is).
    shard : str or tuple of int, optional
        The earlier name of ``part``.

    Returns
    -------
    dict
        The finished store's manifest.
    """
    from .loading.models import load

    cfg = cfg or ExtractConfig()
    cfg.check()
    which = part if part is not None else shard        # shard=: the earlier name of part=
    which = parse_part(which) if which is not None else None   # "I/N" or (I, N): checked
    out = Path(out)
    if texts is None and not is_probe(data):   # the command line passes the texts it checked
        texts = (load_images(data, cfg.image_field, cfg.limit) if is_image_spec(
            data, cfg.image_field) else load_texts(data, text_field=cfg.text_field,
                                                   limit=None if cfg.min_length else cfg.limit))
    if texts is not None and not texts.texts:
        raise Refusal(f"data '{data}' has no non-empty texts")
    loaded = load(model, device=cfg.device, dtype=cfg.dtype, trust_remote_code=trust_remote_code,
                  tower=cfg.tower, progress=progress)
    if is_probe(data):                    # token ids drawn from this tokenizer's vocabulary
        texts = probe_set(data, loaded.tokenizer, bos=cfg.bos == "yes")
    elif cfg.min_length and texts.kind == "text":
        texts = long_enough(texts, loaded.tokenizer, cfg)
    if loaded.info.get("inputs", "text") != texts.kind:
        raise Refusal(f"--model {model} takes {loaded.info.get('inputs', 'text')} but --data "
                         f"{data} holds {texts.kind}s")
    if texts.kind == "image":       # one sequence per image, of the model's token count
        cfg = replace(cfg, max_length=image_tokens(loaded, texts.texts))
    n = len(texts.texts)
    check_run(loaded, cfg, texts, n if which is None else -(-n // which[1]), out,
              beyond_context)
    shard_size = cfg.shard_size or default_shard_size(cfg, loaded.info["n_layers"],
                                                      loaded.info["n_heads"])
    config = store_config(loaded.info, texts, cfg, shard_size)
    extra = {"versions": versions(), "counts": {"skipped_empty": texts.skipped_empty},
             "sources": {"model": str(model), "data": str(data)}}
    part = part_record(which, len(texts.texts), shard_size) if which is not None else None
    if part is not None:
        extra["part"] = part
    writer = StoreWriter.create(out, config, len(texts.texts), extra, log=tqdm.write)
    check_part(out, writer.manifest, part)
    done = writer.finished()
    current = BatchSize(cfg.batch_size)   # halved on out-of-memory for the rest of the run
    opts = Options(cfg.mode, cfg.sink_k, cfg.tail_w, derived=False)   # store derives on read
    chosen = range(*part["shards"]) if part is not None else None
    if chosen is not None and not chosen:
        tqdm.write(f"attngeom: --part {part['index']}/{part['count']} gets no shard file (the "
                   f"data makes {-(-n // shard_size)}); pass a smaller --shard-size")
    total = n if part is None else part["sequences"][1] - part["sequences"][0]
    bar = tqdm(total=total, unit="seq", desc="extract", disable=not progress)
    bar.update(writer.sequences_done)
    for index, start in enumerate(range(0, n, shard_size)):
        if start in done or (chosen is not None and index not in chosen):
            continue
        items = texts.texts[start:min(n, start + shard_size)]
        if streamed(cfg):                        # written layer by layer as it is measured
            stream_shard(writer, index, loaded, items, start, cfg, opts, bar, current)
        else:
            ds, encoded = extract_shard(loaded, items, start, cfg, opts, bar, current)
            writer.add_shard(ds, index, encoded)
    bar.close()
    return writer.finish()


def streamed(cfg: ExtractConfig) -> bool:
    """Whether shards are written layer by layer as they are measured (:func:`stream_shard`),
    so that memory holds a layer of a batch, not the shard: in dense mode, and in compact
    mode on a CPU, where each layer's measurements come to host memory as soon as the layer is
    done anyway (a text of 8,192 tokens is 10 MB a layer on SmolLM2-135M, 313 MB in all,
    which held to the end and then compressed and written beside its chunks added a third to
    the peak of a plain forward). On an accelerator, compact measurements stay on the device
    until the batch is done (no synchronisation per layer): :func:`extract_shard`."""
    return cfg.mode == DENSE or str(cfg.device).startswith("cpu")


def extract_shard(loaded, items, start: int, cfg: ExtractConfig, opts: Options, bar=None,
                  current: BatchSize | None = None) -> tuple[xr.Dataset, dict]:
    """Measure one shard's inputs (:func:`~.measurement.batches.measure_rows`); return the shard
    Dataset of everything but the measured variables, and those already compressed (for
    :meth:`attngeom.store.io.writer.StoreWriter.add_shard`). Each batch is handed to the chunk
    encoder as it is measured; no second copy of the measured arrays is made. (The run's
    compact shards on an accelerator; the others go through :func:`stream_shard`.)"""
    current = current or BatchSize(cfg.batch_size)
    stored = S.variables_for(cfg.mode, loaded.info.get("learned_sinks", False))
    encoder = ChunkEncoder(min(current.size, len(items)), *encode_workers(cfg.device),
                           dims={n: S.dims_for(n, cfg.mode, cfg.precision) for n in stored},
                           attrs={n: stored_attrs(n, cfg.precision) for n in stored})
    rows = measure_rows(loaded, items, cfg, opts, encoder, bar, current)
    return shard_dataset(rows, start, cfg), rows.arrays


def stream_shard(writer: StoreWriter, index: int, loaded, items, start: int,
                 cfg: ExtractConfig, opts: Options, bar=None,
                 current: BatchSize | None = None) -> None:
    """Measure one shard's inputs into shard file ``index`` layer by layer (dense, and compact
    on a CPU: :func:`streamed`): each layer of each batch is written as it is measured
    (:meth:`~attngeom.store.io.writer.StoreWriter.streamed_shard`), so that memory holds one
    layer of a batch, not the shard. The file is laid out first, from the model's sizes and
    placeholder per-sequence values (written when the shard is measured)."""
    current = current or BatchSize(cfg.batch_size)
    info, n = loaded.info, len(items)
    layout = measured_layout(cfg.mode, cfg.precision, info.get("learned_sinks", False), n,
                             info["n_layers"], info["n_heads"], cfg.max_length,
                             min(current.size, n), cfg.sink_k, cfg.tail_w)
    blank = Sequences(np.full((n, cfg.max_length), -1, dtype=np.int32), np.zeros(n, np.int32),
                      np.zeros((n, cfg.max_length), np.int8),
                      [[] for _ in range(n)] if cfg.store_text else None, np.zeros(n, np.int32))
    skeleton = shard_dataset(Rows(layout, blank, np.ones(n, np.int32)), start, cfg)
    with writer.streamed_shard(skeleton, index, layout, encode_workers(cfg.device)) as stream:
        rows = measure_rows(loaded, items, cfg, opts, stream, bar, current)
        stream.complete(shard_dataset(rows, start, cfg))


def shard_dataset(rows: Rows, start: int, cfg: ExtractConfig) -> xr.Dataset:
    """The shard Dataset of measured rows (sequences ``start``, ``start + 1``, ...)."""
    facts, n = rows.facts, len(rows.finite)
    index = np.arange(start, start + n)
    extra = {"truncated": facts.truncated, "finite": rows.finite, "text_index": index}
    ds = build_shard(rows.arrays, index, facts.token_ids, facts.lengths, extra, facts.tokens,
                     cfg.max_length, cfg.mode)
    ds["special"] = ((S.SEQUENCE, S.POSITION), facts.special,
                     {"description": S.DESCRIPTIONS["special"]})
    return ds


def encode_workers(device: str) -> tuple[int, int]:
    """Threads compressing shard chunks while the model measures, and after its last batch.

    On a GPU, or on a CPU with cores that torch's threads leave idle, chunks are compressed
    while the next batch is measured; when torch uses every core, only after the shard's
    last batch, so that measuring is not slowed. After it, every core (at most 8).
    """
    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cores = cores or 1
    after = min(8, cores)
    if not str(device).startswith("cpu"):
        return max(1, min(4, cores - 1)), after
    return max(0, min(4, cores - torch.get_num_threads())), after
