"""What a run needs before it starts: the model's context, disk for the store, memory a batch
(dense: a layer of a batch).

Checked in one line before anything is written (the context against the tokenized texts), so
that an impossible run fails in a second with
the fix, instead of after loading with numpy's "Unable to allocate 101. GiB" and a manifest
left behind.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from attngeom.common.vocab import DENSE, FLOAT32, PACKED
from attngeom.store.format import schema as S
from attngeom.store.format.packing import PACKED_VARIABLES
from attngeom.common.errors import Refusal

# config fields transformers models use for their position limit, most common first
CONTEXT_FIELDS = ("max_position_embeddings", "n_positions", "max_sequence_length", "n_ctx",
                  "seq_length")
GIB = float(1 << 30)


def context_length(config) -> int | None:
    """The position limit of a transformers config (its text config), or None."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for name in CONTEXT_FIELDS:
        value = getattr(text, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def check_context(max_length: int, limit: int | None, beyond: bool, what: str = "--max-length"
                  ) -> None:
    """ValueError when ``max_length`` exceeds the model's position limit (unless ``beyond``)."""
    if limit is not None and max_length > limit and not beyond:
        raise Refusal(f"{what} {max_length} is beyond the model's context of {limit} tokens "
                         f"(its configured position limit); use --max-length {limit} or less, "
                         "or --beyond-context to go past it on purpose")


# ------------------------------------------------------------------ disk and memory
FLOAT32_BYTES = 4


def _sizes(T: int, sink_k: int, tail_w: int, n_layers: int, n_heads: int) -> dict[str, int]:
    return {S.LAYER: n_layers, S.HEAD: n_heads, S.POSITION: T, S.QUERY: T, S.KEY: T,
            S.SINK: min(sink_k, T), S.LAG: tail_w}


def sequence_bytes(mode: str, T: int, sink_k: int, tail_w: int, n_layers: int,
                   n_heads: int) -> int:
    """Float32 bytes one sequence's measurements take before compression: every cell of
    every float variable a shard of the layout holds (:func:`attngeom.store.format.schema.
    variables_for`)."""
    sizes = _sizes(T, sink_k, tail_w, n_layers, n_heads)
    return FLOAT32_BYTES * sum(S.cells(n, mode, sizes) for n in S.variables_for(mode))


def stored_bytes(mode: str, T: int, sink_k: int, tail_w: int, n_layers: int, n_heads: int,
                 causal: bool, packed: bool) -> float:
    """Bytes one sequence's finite values take in the store (gzip stores NaN padding for
    almost nothing; finite float32 values compress little): the estimate of the store.

    A (query, key) variable of a causal model is finite on its T(T+1)/2 allowed cells; packed
    variables take 2 bytes a value (:data:`attngeom.store.format.packing.PACKED_VARIABLES`).
    """
    precision = PACKED if packed else FLOAT32
    sizes = _sizes(T, sink_k, tail_w, n_layers, n_heads)
    total = 0.0
    for name in S.variables_for(mode):
        n = S.cells(name, mode, sizes, precision)
        if causal and S.dims_for(name, mode)[-2:] == (S.QUERY, S.KEY):
            n *= (T + 1) / (2 * T)
        total += n * (2 if packed and name in PACKED_VARIABLES else FLOAT32_BYTES)
    return total


def batch_bytes(mode: str, T: int, longest: int, sink_k: int, tail_w: int, n_layers: int,
                n_heads: int, batch: int) -> float:
    """Working memory of one batch: its measurements, padded to ``T`` positions, held until
    written (twice: measured and encoded), and one layer's attention workspace over the
    ``longest`` text (scores, weights and their products: four float32 (head, T, T) arrays).

    Compact measurements are counted for every layer (a batch's are held on an accelerator;
    on a CPU they are written layer by layer too, so this is an upper bound there); dense
    ones are written layer by layer as they are measured (:mod:`attngeom.store.format.
    stream`), so one layer's are held."""
    held = 2 * sequence_bytes(mode, T, sink_k, tail_w, 1 if mode == DENSE else n_layers,
                              n_heads)
    return batch * (held + 4 * FLOAT32_BYTES * n_heads * longest * longest)


def available_memory() -> float | None:
    """Bytes of memory available (Linux MemAvailable), or None where unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def free_disk(out: Path) -> float:
    """Free bytes on the file system ``out`` will be created on."""
    path = Path(out).expanduser().absolute()
    while not path.exists():
        path = path.parent
    return float(shutil.disk_usage(path).free)


def check_budget(out: Path, n: int, lengths, mode: str, T: int, sink_k: int, tail_w: int,
                 n_layers: int, n_heads: int, causal: bool, packed: bool, batch: int,
                 have: int = 0) -> None:
    """ValueError, with the estimate and the fix, when the store will not fit on the disk at
    ``out`` (``have``: bytes already there, a resumed run) or one batch not in memory.

    ``lengths``: token counts of a sample of the texts (their mean sizes the store, their
    maximum a padded batch); stores keep ``T`` positions, but padding compresses to nothing.
    """
    per_text = [stored_bytes(mode, int(t), sink_k, tail_w, n_layers, n_heads, causal, packed)
                for t in lengths]
    need = n * sum(per_text) / max(1, len(per_text)) - have
    free = free_disk(out)
    fix = "--mode compact, " if mode == "dense" else ""
    if need > free:
        raise Refusal(f"the store needs about {need / GIB:.3g} GiB ({n} texts, {mode}, "
                         f"{n_layers} layers x {n_heads} heads, up to {T} tokens) but {out} has "
                         f"{free / GIB:.3g} GiB free; use {fix}fewer texts (--limit) or a "
                         "shorter --max-length")
    longest = int(max(lengths, default=T))
    ram = batch_bytes(mode, T, longest, sink_k, tail_w, n_layers, n_heads, min(batch, n))
    memory = available_memory()
    if memory is not None and ram > memory:
        raise Refusal(f"a batch of {min(batch, n)} x {T} tokens ({mode}) needs about "
                         f"{ram / GIB:.3g} GiB of memory, {memory / GIB:.3g} GiB are available; "
                         f"use {fix}a smaller --batch-size or a shorter --max-length")


def directory_bytes(path: Path) -> int:
    """Bytes of the files under ``path`` (0 when absent)."""
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file()) \
        if Path(path).is_dir() else 0


# ------------------------------------------------------------------ value zeroing's time
HOUR = 3600.0


def zeroing_rows(lengths, n_layers: int, passes: int, causal: bool) -> int:
    """Rows of the post-attention sublayer value zeroing computes (:mod:`attngeom.extract.
    faithfulness.zeroing`): one per (query, key) pair a query attends to, T (T + 1) / 2 per
    causal text of T tokens (T^2 bidirectional), at each of ``n_layers`` layers of each of
    ``passes`` forward passes."""
    pairs = sum(t * (t + 1) // 2 if causal else t * t for t in map(int, lengths))
    return pairs * n_layers * passes


def check_zeroing(rows: int, rate: float, max_hours: float, what: str, fix: str,
                  limit: str = "--max-hours") -> float:
    """The estimated seconds of ``rows`` sublayer rows at ``rate`` rows/s (measured on this
    machine: :func:`attngeom.extract.faithfulness.sublayer.rows_per_second`); a Refusal with
    the estimate and the fix (``fix``) when it exceeds ``max_hours`` (0: no limit; ``limit``
    names the setting). A lower bound: the rows re-ranked in float64 near the cut come on top
    (benchmarks/RESULTS.md: 1.1x the estimate in comprehensiveness, up to 2.4x in sufficiency,
    whose disturbed layers put more rows near the cut)."""
    seconds = rows / max(rate, 1e-9)
    if max_hours and seconds > max_hours * HOUR:
        raise Refusal(f"value zeroing would take at least {seconds / HOUR:.3g} hours here "
                      f"({what}: {rows:.3g} rows of a layer's post-attention sublayer at the "
                      f"{rate:.3g} a second measured), more than {limit} {max_hours:g}; use "
                      f"{fix}, or a larger {limit}")
    return seconds
