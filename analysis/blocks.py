"""One pass over a store for the analyses: one layer and a bounded run of sequences at a time.

The layouts are hidden by the store's accessor (:mod:`attngeom.store.dataset.accessor`): each block
is read by ``ds.attngeom.load_block`` (every variable the analyses need, in one dask computation,
as float64) and its masks and key groups come from ``block.attngeom.groups(k, w)``
(:class:`attngeom.store.dataset.groups.KeyGroups`). This module only plans the blocks and feeds
them to the analyses' accumulators.
"""

from __future__ import annotations

import os
import sys
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import xarray as xr

from attngeom.store.format import schema as S
from attngeom.store.dataset.groups import KeyGroups
from attngeom.common.vocab import GROUPS
from attngeom.common.errors import Refusal

DEFAULT_BLOCK_ELEMENTS = 4_000_000  # float64 cells of one (sequence, head, query, key) block
MAX_FIT_WORKERS = 4  # processes for the per-layer fits (each holds one layer's rows)
SERIAL_SCHEDULERS = ("synchronous", "sync", "single-threaded")


@dataclass(frozen=True)
class StoreInfo:
    """The options an analysis runs with, resolved against the store."""

    k: int  # sink keys used by the analysis
    w: int  # tail window used by the analysis
    store_k: int  # sink keys the store was written with (defines residual_norm)
    layers: tuple  # layer coordinate values analysed
    heads: np.ndarray


def describe(ds: xr.Dataset, k: int | None = None, w: int | None = None,
             layers=None) -> StoreInfo:
    """Check the store and resolve the options ``k`` (sink keys), ``w`` (tail) and ``layers``."""
    if ds.sizes.get(S.SEQUENCE, 0) == 0:
        raise Refusal("the store has no sequences; run `attngeom extract` into it first")
    if S.ALPHA not in ds:
        raise Refusal("the store has no `alpha` variable; is it an attngeom store?")
    k, w = ds.attngeom.resolve(k, w)
    all_layers = list(ds[S.LAYER].values)
    if layers is None:
        layers = all_layers
    missing = [lay for lay in layers if lay not in all_layers]
    if missing:
        raise Refusal(f"layers {missing} are not in the store (it has {all_layers})")
    return StoreInfo(k=k, w=w, store_k=ds.attngeom.sink_k, layers=tuple(layers),
                     heads=ds[S.HEAD].values)


def require(ds: xr.Dataset, names: list[str], what: str) -> None:
    """Raise a one-line error when variables an analysis needs are missing."""
    missing = [n for n in dict.fromkeys(names) if n not in ds]
    if missing:
        raise Refusal(f"{what} needs store variables {missing}, missing from this store")


def valid_sequences(ds: xr.Dataset) -> np.ndarray:
    """(sequence,) bool: sequences usable for statistics (finite activations); warns on others."""
    ok = np.asarray(ds.attngeom.sequence_ok.values)
    if (~ok).any():
        warnings.warn(f"{int((~ok).sum())} sequences had non-finite activations and are "
                      "excluded from the statistics", RuntimeWarning, stacklevel=3)
    if not ok.any():
        raise Refusal("no sequence of the store has finite activations; nothing to analyse")
    return ok


def _chunk(ds: xr.Dataset, name: str) -> int | None:
    """Sequences per dask chunk (or per preferred chunk: the xarray engine hides dask's)."""
    if name not in ds:
        return None
    chunks = ds[name].chunksizes.get(S.SEQUENCE)
    if chunks:
        return int(chunks[0])
    preferred = ds[name].encoding.get("preferred_chunks", {}).get(S.SEQUENCE)
    return int(preferred) if preferred else None


def sequence_blocks(ds: xr.Dataset, width: int, elements: int) -> list[slice]:
    """Contiguous sequence ranges whose (head, query, slot) arrays hold about ``elements`` cells,
    with ``width`` key slots per query (``ds.attngeom.block_width``).

    Block sizes are multiples of the store's sequence chunk when that fits, so each chunk is read
    once per layer; otherwise blocks split each chunk evenly (dense stores read best with
    sequence chunks no larger than a block: about ``elements / (heads * T * T)`` sequences).
    """
    n_seq = ds.sizes[S.SEQUENCE]
    per_seq = max(1, ds.sizes[S.HEAD] * ds.attngeom.n_positions * width)
    size = max(1, elements // per_seq)
    chunk = _chunk(ds, S.ALPHA)
    if chunk and chunk <= size:
        size = (size // chunk) * chunk
    elif chunk:  # blocks that split chunks evenly, never straddling two (each read once per block)
        size = -(-chunk // -(-chunk // size))
        return [slice(c + a, min(c + a + size, c + chunk, n_seq))
                for c in range(0, n_seq, chunk) for a in range(0, chunk, size) if c + a < n_seq]
    return [slice(a, min(a + size, n_seq)) for a in range(0, n_seq, size)]


@dataclass(frozen=True)
class Block:
    """One layer and a contiguous run of sequences, read into memory (float64)."""

    layer: object
    sequence: np.ndarray  # (S,) positions of the block's sequences in the store
    data: xr.Dataset  # the variables read (dims sequence, head, ...)
    groups: KeyGroups  # masks and key groups of ``data`` with the analysis' k and w


class Accumulator(Protocol):
    """One analysis fed layer by layer, block by block (see :func:`run_pass`)."""

    reads: tuple[str, ...]  # quantities it loads (store variables, or "ratio"; see sources)
    groups: tuple[str, ...]  # key groups it needs key by key (a dense store then reads all keys)

    def update(self, block: Block) -> None: ...

    def end_layer(self, layer) -> None: ...

    def result(self) -> xr.Dataset: ...


def read_block(ds: xr.Dataset, info: StoreInfo, layer, seqs: slice, reads: list[str],
               groups: tuple[str, ...]) -> Block:
    """One layer and a run of sequences of the store, read in one dask computation."""
    data = ds.attngeom.load_block(reads, layer=layer, sequences=seqs, groups=groups, k=info.k)
    return Block(layer, np.arange(ds.sizes[S.SEQUENCE])[seqs], data,
                 data.attngeom.groups(info.k, info.w))


def run_pass(ds: xr.Dataset, info: StoreInfo, accumulators: list[Accumulator], *,
             elements: int = DEFAULT_BLOCK_ELEMENTS, progress: bool = True) -> None:
    """Feed every accumulator one layer at a time, in sequence blocks of bounded memory
    (one block in memory at a time)."""
    from tqdm.auto import tqdm

    groups = tuple(g for g in GROUPS if any(g in a.groups for a in accumulators))
    reads = [name for a in accumulators for name in a.reads]
    valid_sequences(ds)
    blocks = sequence_blocks(ds, ds.attngeom.block_width(groups, info.k, info.w), elements)
    with tqdm(total=len(info.layers) * len(blocks), desc="analyze", unit="block",
              disable=not progress) as bar:
        for layer in info.layers:
            for seqs in blocks:
                block = None                       # free the last block before reading
                block = read_block(ds, info, layer, seqs, reads, groups)
                for acc in accumulators:
                    acc.update(block)
                bar.update(1)
            block = None
            for acc in accumulators:
                acc.end_layer(layer)


def default_fit_workers() -> int:
    """Worker processes for the per-layer model fits, following dask's configuration: 0 (fits
    in this process) under the synchronous scheduler or with one worker, else one fewer than
    dask's workers (default: every core), at most ``MAX_FIT_WORKERS``."""
    import dask

    if dask.config.get("scheduler", None) in SERIAL_SCHEDULERS:
        return 0
    cores = dask.config.get("num_workers", None) or os.cpu_count() or 1
    return max(0, min(int(cores) - 1, MAX_FIT_WORKERS))


@contextmanager
def fit_pool(workers: int | None = None):
    """A process pool of ``workers`` (None: :func:`default_fit_workers`) for per-layer fits
    that run while the next layer is read; yields None (fit in this process) at 0.

    Processes, not threads: statsmodels' LOWESS and OLS hold the GIL. On Linux the workers are
    forked at the start of the pass (they only fit numpy arrays: no store file or dask state
    is used there); elsewhere Python's default start method (spawn), which re-imports the
    calling script, so a script there needs the ``if __name__ == "__main__":`` guard (or
    ``fit_workers=0``). The workers end with the pass: when it raises (Ctrl-C, SIGTERM) they
    are stopped at once, and on Linux they also end when this process does (a forked worker
    holds both ends of its task pipe and would otherwise wait forever).
    """
    n = default_fit_workers() if workers is None else int(workers)
    if n <= 0:
        yield None
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    method = "fork" if sys.platform == "linux" else None
    pool = ProcessPoolExecutor(n, mp_context=multiprocessing.get_context(method),
                               initializer=_fit_worker_start, initargs=(os.getpid(),))
    try:
        for _ in range(n):                 # start the workers now, not when layer 0 is due
            pool.submit(int)
        yield pool
    except BaseException:
        _stop_workers(pool)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _fit_worker_start(parent: int) -> None:
    """In a fit worker: SIGINT is the parent's to handle (a terminal sends it to the whole
    group), SIGTERM ends the worker, and (Linux) the parent's death ends it too."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if sys.platform != "linux":
        return
    import ctypes

    PR_SET_PDEATHSIG = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:             # the parent ended before prctl took effect
        os._exit(1)


def _stop_workers(pool) -> None:
    """Kill a process pool's workers now (their fits are abandoned)."""
    kill = getattr(pool, "kill_workers", None)          # Python 3.14
    if kill is not None:
        kill()
        return
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        if process.is_alive():
            process.kill()
