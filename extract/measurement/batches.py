"""The measurement loop: inputs measured batch by batch, in order, into whatever collects them.

:func:`measure_rows` is the core that ``attngeom extract`` (the rows go to a shard file's chunk
encoder, or, dense, into the shard file itself layer by layer: :mod:`attngeom.extract.run`)
and ``attngeom.measure`` (the rows go to numpy arrays, :mod:`.inmemory`) share: it batches the
inputs by their kind (texts as token ids, images as pixels: :func:`text_batches`,
:func:`~attngeom.extract.loading.images.measure_images`), pads each batch's token axes to the
store length, flags sequences with non-finite activations and hands the stored form (packed
where asked) to ``collect``. On out of memory the batch is halved (:class:`BatchSize`) for the
rest of the run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Protocol

import numpy as np

from attngeom.common.options.stages import ExtractConfig
from attngeom.store.format import schema as S
from attngeom.store.format.packing import stored_arrays

from ..heap import bound, release
from ..loading.data import Sequences, Tokenized, batches, pad_token_id
from ..loading.images import measure_images
from .capture import capture
from .layer import Options


class Collect(Protocol):
    """Where measured rows go: a shard file's chunk encoder, or in-memory arrays (``add``: a
    batch of every layer), or a shard file being written (``add_layer`` instead: one layer of
    a batch, :class:`LayerRows`)."""

    def add(self, rows: dict[str, np.ndarray]) -> None: ...
    def finish(self) -> dict: ...
    def close(self) -> None: ...


@dataclass
class Rows:
    """What :func:`measure_rows` returns: ``collect.finish()``, the per-sequence facts and
    the finite flags (S,)."""

    arrays: dict
    facts: Sequences
    finite: np.ndarray


def measure_rows(loaded, items, cfg: ExtractConfig, opts: Options, collect: Collect,
                 bar=None, current: "BatchSize | None" = None) -> Rows:
    """Measure ``items`` (:class:`Tokenized` or a list of texts for a text model; images or a
    pixel tensor for a vision model) in order, ``cfg.batch_size`` at a time, into ``collect``
    (one batch of every layer at a time; a ``collect`` with ``add_layer``, a shard file being
    written, gets one layer of a batch at a time: :class:`LayerRows`)."""
    current = current or BatchSize(cfg.batch_size)
    stored = set(S.variables_for(cfg.mode, loaded.info.get("learned_sinks", False)))
    layers = LayerRows(collect, cfg, stored, len(items)) if hasattr(collect, "add_layer") \
        else None
    if loaded.info.get("inputs") == "image":
        measured = measure_images(loaded, items, cfg.batch_size, opts, cfg.store_text, bar,
                                  layers)
    else:
        measured = text_batches(loaded, items, cfg, opts, bar, current, layers)
    finite, facts = np.ones(len(items), dtype=np.int32), []
    try:
        for arrays, seqs in measured:
            start = sum(len(f.lengths) for f in facts)
            facts.append(seqs)
            if layers is not None:                   # already in the shard file
                continue
            rows = {k: _pad_tokens(k, v, cfg.max_length, cfg.mode) for k, v in arrays.items()
                    if k in stored}
            finite[start:start + len(seqs.lengths)] = finite_flags(rows, seqs.lengths)
            # packed (int16, head-free once) and compressed while the next batch is measured
            collect.add(stored_arrays(rows, cfg.mode, cfg.precision))
        arrays = collect.finish()
    finally:
        collect.close()
    joined = _joined(facts, cfg.store_text)
    if layers is not None:
        finite = layers.finite(joined.lengths)
    return Rows(arrays, joined, finite)


def text_batches(loaded, items, cfg: ExtractConfig, opts: Options, bar=None,
                 current: "BatchSize | None" = None, layers: "LayerRows | None" = None
                 ) -> Iterator[tuple[dict, Sequences]]:
    """Each batch's measured arrays (``{}`` with ``layers``, which got them layer by layer)
    and its :class:`Sequences` (token ids, strings, specials), tokenized as ``extract``
    tokenizes (``items``: texts or :class:`Tokenized`)."""
    from ..loading.data import tokenize_texts

    tok = loaded.tokenizer
    tokenized = items if isinstance(items, Tokenized) else tokenize_texts(
        tok, items, cfg.max_length, cfg.bos)
    done = 0
    for n, arrays in measure_batches(loaded.model, tokenized, cfg, opts, pad_token_id(tok),
                                     bar, current=current, layers=layers):
        yield arrays, token_facts(tok, tokenized[done:done + n], cfg.max_length, cfg.store_text)
        done += n


class LayerRows:
    """Each layer of each batch, as :func:`~.capture.capture` measures it, into ``stream``
    (a shard file being written, :class:`attngeom.store.format.stream.ShardStream`): padded
    to the store length and in stored form, as :func:`measure_rows` hands whole batches on.
    Which positions had finite norms is kept for the sequences' ``finite`` flags.

    ``add`` is the capture's ``each_layer``; ``commit`` after a batch, ``rollback`` when one
    was cut short (out of memory: it is measured again, smaller).
    """

    def __init__(self, stream, cfg: ExtractConfig, stored: set[str], n: int):
        self.stream, self.cfg, self.stored = stream, cfg, stored
        self.width, self.row = cfg.max_length, 0
        self.finite_at = np.ones((n, cfg.max_length), dtype=bool)      # (S, T)
        stream.mark()
        bound()                    # a long text's per-layer arrays mapped, not kept in the heap

    def add(self, layer: int, arrays: dict[str, np.ndarray]) -> None:
        rows = {k: _pad_tokens(k, v[:, None], self.width, self.cfg.mode)
                for k, v in arrays.items() if k in self.stored}        # (b, 1, ...)
        b = len(rows["value_norm"])
        self.finite_at[self.row:self.row + b] &= finite_positions(rows)
        self.stream.add_layer(layer, stored_arrays(rows, self.cfg.mode, self.cfg.precision))
        release(b * self.width)    # the layers' freed tensors given back, not kept in the heap

    def commit(self, n: int) -> None:
        self.row += n
        self.stream.mark()

    def rollback(self) -> None:
        self.finite_at[self.row:] = True
        self.stream.rollback()

    def finite(self, lengths: np.ndarray) -> np.ndarray:
        """(S,) int32: 1 where every norm within the sequence's length was finite."""
        return np.array([self.finite_at[i, :n].all() for i, n in enumerate(lengths)],
                        dtype=np.int32)


def token_facts(tok, tokenized: Tokenized, T: int, store_text: bool) -> Sequences:
    """Token ids (S, T) (-1 beyond length), lengths, special-token flags, token strings."""
    lengths = np.array([len(ids) for ids in tokenized.ids])
    token_ids = np.full((len(tokenized), T), -1, dtype=np.int32)
    special = np.zeros((len(tokenized), T), dtype=np.int8)
    special_ids = set(getattr(tok, "all_special_ids", []) or [])
    for i, ids in enumerate(tokenized.ids):
        token_ids[i, : len(ids)] = ids
        special[i, : len(ids)] = [t in special_ids for t in ids]
    tokens = [tok.convert_ids_to_tokens(ids) for ids in tokenized.ids] if store_text else None
    return Sequences(token_ids, lengths, special, tokens,
                     np.array(tokenized.truncated, dtype=np.int32))


def _joined(facts: list[Sequences], store_text: bool) -> Sequences:
    return Sequences(
        token_ids=np.concatenate([f.token_ids for f in facts]).astype(np.int32),
        lengths=np.concatenate([f.lengths for f in facts]),
        special=np.concatenate([f.special for f in facts]),
        tokens=sum((f.tokens for f in facts), []) if store_text else None,
        truncated=np.concatenate([f.truncated for f in facts]).astype(np.int32))


def _pad_tokens(name: str, x: np.ndarray, T: int, mode: str) -> np.ndarray:
    """Pad a batch's token axes (query/key) to the store length with NaN (``x`` itself when
    they have it already)."""
    dims = S.dims_for(name, mode)
    widths = [(0, T - x.shape[i]) if d in (S.QUERY, S.KEY) else (0, 0)
              for i, d in enumerate(dims)]
    return np.pad(x, widths, constant_values=np.nan) if any(w for _, w in widths) else x


def finite_positions(arrays: dict[str, np.ndarray]) -> np.ndarray:
    """(b, T) bool: where every norm of the position (value, head output and layer output
    norms; every layer and head given) is finite."""
    ok = None
    for name in ("value_norm", "output_norm", "layer_output_norm"):
        x = np.isfinite(arrays[name])
        x = x.reshape(len(x), -1, x.shape[-1]).all(1)                   # (b, T)
        ok = x if ok is None else ok & x
    return ok


def finite_flags(arrays: dict[str, np.ndarray], lengths: np.ndarray) -> np.ndarray:
    """1 per sequence when every norm within its length is finite."""
    ok = finite_positions(arrays)
    return np.array([ok[i, :n].all() for i, n in enumerate(lengths)], dtype=np.int32)


# ------------------------------------------------------------------ out of memory
def is_out_of_memory(exc: BaseException) -> bool:
    """torch.cuda.OutOfMemoryError, or a RuntimeError saying 'out of memory' (other backends)."""
    import torch

    return isinstance(exc, torch.cuda.OutOfMemoryError) or (
        isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower())


@dataclass
class BatchSize:
    """The batch size in use: the configured one, halved on out-of-memory and kept smaller for
    the rest of the run (the config itself is never changed)."""

    size: int


def measure_batches(model, tokenized, cfg: ExtractConfig, opts: Options, pad_id: int,
                    bar=None, log=None, current: BatchSize | None = None,
                    layers: LayerRows | None = None) -> Iterator[tuple[int, dict]]:
    """Measure ``tokenized`` in data order; on out-of-memory halve the batch and retry.

    Yields each batch's size and arrays (``{}`` with ``layers``, which gets each layer as it
    is measured). The smaller batch size is kept in ``current`` (default: a new one at
    ``cfg.batch_size``) for the rest of the run; out of memory at batch size 1 raises
    MemoryError with the fix.
    """
    from tqdm.auto import tqdm

    current, log = current or BatchSize(cfg.batch_size), log or tqdm.write
    start, n = 0, len(tokenized)
    while start < n:
        size = current.size
        rows = tokenized[start:start + size]
        batch = next(batches(rows, size, pad_id=pad_id))
        try:
            arrays = capture(model, batch, opts) if layers is None else capture(
                model, batch, opts, each_layer=layers.add)
        except RuntimeError as exc:
            current.size = halved_batch(exc, size, cfg.device, log, "continuing",
                                        "--max-length, --dtype bfloat16")
            if layers is not None:
                layers.rollback()
            continue
        if layers is not None:
            layers.commit(len(rows))
        if bar is not None:
            bar.update(len(rows))
        start += len(rows)
        yield len(rows), arrays


def halved_batch(exc: RuntimeError, size: int, device: str, log, doing: str,
                 fix: str) -> int:
    """The batch size to retry with after ``exc`` (re-raised unless it is out of memory).

    Frees cached memory and logs; at batch size 1 raises MemoryError naming ``fix``.
    """
    if not is_out_of_memory(exc):
        raise exc
    free_memory()
    if size == 1:
        raise MemoryError(f"out of memory on {device} at batch size 1; use a smaller {fix} "
                          "or a larger device") from None
    log(f"attngeom: out of memory on {device} at batch size {size}; {doing} with batch size "
        f"{size // 2}")
    return size // 2


def free_memory() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
