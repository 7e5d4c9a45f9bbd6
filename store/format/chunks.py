"""HDF5 chunks compressed outside HDF5, while the next batch is being measured.

HDF5 compresses every chunk in the writing thread, holding Python's lock, after the whole
shard is measured. Here each chunk goes through the filter pipeline the shard's variables
declare (shuffle, deflate, Fletcher-32) in worker threads (the compressor releases the lock),
as soon as a batch of rows is measured; :func:`attngeom.store.format.shards.write_shard` then
stores the finished bytes with ``write_direct_chunk``. Deflate is ISA-L's (``isal``, several
times faster than zlib at level 1, a standard zlib stream) where it is installed, else zlib's,
which gives byte for byte what HDF5 itself writes. Every netCDF/HDF5 reader decodes such a
file as usual and verifies the checksums. Variables are float32, or int16 (packed stores,
:mod:`attngeom.store.format.packing`): shuffle works on the array's own item size.
"""

from __future__ import annotations

import functools
import itertools
import threading
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from . import schema as S
from .packing import FILL

LEVEL = 1                       # deflate level of every shard variable
CHUNK_BYTES = 8 * 1024 * 1024   # at most this many bytes per chunk
BLOCK = 360                     # words per Fletcher-32 block before folding (HDF5's value)
_WEIGHTS = np.arange(BLOCK, 0, -1, dtype=np.float64)   # word i of a block adds (360 - i)
SEGMENT = 4096                  # blocks of words a Fletcher-32 pass reads at a time (11 MiB)
TILE = 256                      # query and key positions per chunk of a (query, key) variable


def fletcher32(data: bytes, segment: int = SEGMENT) -> int:
    """HDF5's Fletcher-32 checksum (``H5_checksum_fletcher32``) of ``data``.

    The C code adds big-endian 16-bit words into sum1 and sum1 into sum2 after every word,
    folding both to 16 bits (which keeps them modulo 65535) after each block of 360 words;
    a last odd byte is a word of its own. A folded sum is 0 only while every word so far is 0,
    so the result is, in closed form, sum1 = S1 and sum2 = S2 modulo 65535, each in 1..65535
    (65535 where the C code's 0 mod 65535 is non-zero), or both 0 for all-zero data, with
    S1 the sum of the words and S2 = sum_i (N - i) w_i over the N words. The words are read
    ``segment`` blocks at a time, so that a chunk of hundreds of MB needs a few MB of float64
    words, not four times its own size.
    """
    b = np.frombuffer(data, dtype=np.uint8)
    n = len(b) // 2
    total = n + len(b) % 2                        # N: the words, an odd last byte one more
    s1 = s2 = 0                                   # S1 exactly; S2 modulo 65535
    step = BLOCK * max(1, segment)
    for lo in range(0, n, step):
        w1, w2 = _sums(b[2 * lo:2 * min(n, lo + step)], total - lo)
        s1, s2 = s1 + w1, (s2 + w2) % 65535
    if len(b) % 2:
        last = int(b[-1]) << 8                    # weight N - (N - 1) = 1
        s1, s2 = s1 + last, (s2 + last) % 65535
    if s1 == 0:
        return 0
    return (((s2 - 1) % 65535 + 1) << 16) | ((s1 - 1) % 65535 + 1)


def _sums(b: np.ndarray, after: int) -> tuple[int, int]:
    """S1 and S2 modulo 65535 of the words of ``b`` (an even number of bytes), the first of
    which counts ``after`` times in S2 (each later one once less): per block of 360 words its
    sum and its sum weighted 360..1 (exact in float64: at most 2^33), then each block's sum
    times the words after the block, in int64 modulo 65535. The weighted sums are einsum's own
    loop: a BLAS product would start BLAS's threads inside each compressing worker, which then
    spin beside torch's."""
    words = b.view(">u2").astype(np.float64)                           # big-endian words
    full, n = len(words) // BLOCK, len(words)
    blocks = words[:full * BLOCK].reshape(full, BLOCK)
    sums = np.append(blocks.sum(1), words[full * BLOCK:].sum()).astype(np.int64)
    weighted = np.append(np.einsum("ij,j->i", blocks, _WEIGHTS),
                         np.einsum("i,i->", words[full * BLOCK:],
                                   _WEIGHTS[BLOCK - (n - full * BLOCK):]))
    ends = np.minimum(BLOCK * np.arange(1, full + 2, dtype=np.int64), n)   # each block's end
    rest = (after - ends) % 65535                                       # the words after it
    s2 = int((rest * sums % 65535).sum() + (weighted.astype(np.int64) % 65535).sum()) % 65535
    return int(sums.sum()), s2


@functools.cache
def deflate() -> Callable[[bytes, int], bytes]:
    """The zlib-format compressor: ISA-L's where installed, else zlib's."""
    try:
        from isal import isal_zlib
    except ImportError:
        return zlib.compress
    return isal_zlib.compress


def encode_chunk(block: np.ndarray, level: int = LEVEL) -> bytes:
    """One chunk as HDF5's shuffle + deflate(level) + Fletcher-32 filters store it (any item
    size: shuffle groups byte i of every item)."""
    raw = np.ascontiguousarray(block)
    shuffled = raw.view(np.uint8).reshape(-1, raw.itemsize).T.tobytes()
    packed = deflate()(shuffled, level)
    return packed + fletcher32(packed).to_bytes(4, "little")


def fill_value(dtype) -> np.generic:
    """The fill (missing) value of a stored variable: NaN, or the packed int16 FILL."""
    dtype = np.dtype(dtype)
    if dtype == np.int16:
        return FILL
    if dtype.kind != "f":
        raise ValueError(f"chunks are float32 or packed int16, not {dtype}")
    return dtype.type(np.nan)


def chunk_rows(row_bytes: int, rows: int) -> int:
    """Sequences per chunk: at most ``rows``, at most CHUNK_BYTES per chunk, at least 1."""
    return max(1, min(rows, CHUNK_BYTES // max(row_bytes, 1)))


def tiled(cells: tuple[int, ...], dims: tuple[str, ...] = ()) -> tuple[int, ...]:
    """A chunk's extent along ``cells`` (the axes after sequence and layer, named by the last
    ``dims``): a (query, key) variable in tiles of at most TILE x TILE positions, so that a
    tile no query attends to (above the causal diagonal, outside a sliding window, padding)
    holds only the fill value and is never stored (HDF5 reads a chunk never stored as the
    fill value); the other axes whole."""
    cells = tuple(int(c) for c in cells)
    if tuple(dims[-2:]) != (S.QUERY, S.KEY):
        return cells
    return (*cells[:-2], *(min(c, TILE) for c in cells[-2:]))


def layer_chunks(cells: tuple[int, ...], itemsize: int, rows: int,
                 dims: tuple[str, ...] = ()) -> tuple[int, ...]:
    """The chunk shape of a (sequence, layer, *cells) variable on ``dims``: :func:`chunk_rows`
    sequences (at most ``rows``) of one layer, and :func:`tiled` along ``cells``."""
    cells = tiled(cells, dims)
    row_bytes = int(np.prod(cells, dtype=np.int64)) * itemsize
    return (chunk_rows(row_bytes, rows), 1, *cells)


def tiles(block: np.ndarray, chunks: tuple[int, ...]):
    """The chunks of a row block (rows, 1, *cells) along its cells: (offset along the cells,
    tile) pairs, edge tiles padded with the fill value to the full chunk (as HDF5 stores
    edge chunks)."""
    cells, step = block.shape[2:], chunks[2:]
    if tuple(cells) == tuple(step):
        yield (0,) * len(cells), block
        return
    for corner in itertools.product(*(range(0, n, c) for n, c in zip(cells, step))):
        tile = block[(slice(None), slice(None),
                      *(slice(o, o + c) for o, c in zip(corner, step)))]
        short = [(0, c - n) for n, c in zip(tile.shape[2:], step)]
        if any(w for _, w in short):
            tile = np.pad(tile, [(0, 0), (0, 0), *short], constant_values=fill_value(tile.dtype))
        yield corner, tile


def encode_stored(block: np.ndarray, level: int = LEVEL) -> bytes | None:
    """:func:`encode_chunk`, or None for a chunk whose every item is the fill value bit for bit
    (not stored: it reads back as the same bits)."""
    uint = f"u{block.itemsize}"
    fill = np.asarray(fill_value(block.dtype), block.dtype).view(uint)
    return None if (block.view(uint) == fill).all() else encode_chunk(block, level)


def cut_chunks(parts: list[np.ndarray], rows: int, final: bool
               ) -> tuple[int, list[tuple[int, np.ndarray]], list[np.ndarray]]:
    """Cut the rows of ``parts`` (arrays of rows, in order) into chunks of ``rows`` rows.

    Returns the rows cut, the chunks as (first row, block) pairs, and the rows left over: every
    row when ``final`` (the last chunk then padded with the fill value: an edge chunk is stored
    at full size), else only whole chunks.
    """
    have = sum(len(p) for p in parts)
    whole = have if final else have - have % rows
    if not whole:
        return 0, [], parts
    x = parts[0] if len(parts) == 1 else np.concatenate(parts)
    blocks = []
    for lo in range(0, whole, rows):
        block = x[lo:lo + rows]
        if len(block) < rows:
            fill = np.full((rows - len(block), *block.shape[1:]), fill_value(block.dtype),
                           block.dtype)
            block = np.concatenate([block, fill])
        blocks.append((lo, block))
    return whole, blocks, ([x[whole:]] if whole < have else [])


@dataclass
class Encoded:
    """One variable's compressed chunks: shape, dims, chunk shape, chunk offset -> bytes,
    and the stored dtype (float32, or int16 for a packed variable)."""

    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    blobs: dict[tuple[int, ...], bytes] = field(default_factory=dict)
    dims: tuple[str, ...] = ()
    dtype: np.dtype = field(default_factory=lambda: np.dtype(np.float32))
    attrs: dict = field(default_factory=dict)       # besides the description


class ChunkEncoder:
    """Compresses (sequence, layer, ...) variables chunk by chunk as rows arrive: float
    arrays as float32, int16 arrays (packed) as they are.

    Chunks hold ``chunk_rows`` sequences (``rows`` must not exceed the shard's sequences:
    HDF5 chunks are not larger than the variable) and one layer, a (query, key) variable's in
    tiles (:func:`tiled`; one holding only the fill value is not stored). ``add`` takes the
    next rows of every variable and hands each complete chunk to the workers, at most
    ``during`` at a time (0: none until ``finish``, when measuring leaves no core spare);
    ``finish`` lets ``after`` work at once, encodes the rest, padding the last row block as
    HDF5 pads edge chunks (NaN, or FILL for int16), and returns name -> Encoded (with its
    dims from ``dims`` and attributes from ``attrs``, when given).
    """

    def __init__(self, rows: int, during: int, after: int, level: int = LEVEL,
                 dims: dict[str, tuple[str, ...]] | None = None,
                 attrs: dict[str, dict] | None = None):
        self.rows, self.overlap, self.level = max(1, rows), during > 0, level
        self.dims, self.attrs = dims or {}, attrs or {}
        self.extra = max(after, during, 1) - max(during, 1)
        self.gate = threading.Semaphore(max(during, 1))
        self.pool = ThreadPoolExecutor(max(after, during, 1),
                                       thread_name_prefix="attngeom-chunks")
        self.pending: dict[str, list[np.ndarray]] = {}
        self.done_rows: dict[str, int] = {}
        self.futures: dict[str, dict[tuple[int, ...], Future]] = {}
        self.chunks: dict[str, tuple[int, ...]] = {}
        self.layout: dict[str, tuple[int, ...]] = {}      # (L, ...) of each variable
        self.dtypes: dict[str, np.dtype] = {}

    def _encode(self, block: np.ndarray) -> bytes | None:
        with self.gate:
            return encode_stored(block, self.level)

    def add(self, arrays: dict[str, np.ndarray]) -> None:
        """The next rows (b, L, ...) of each variable, in sequence order."""
        for name, x in arrays.items():
            x = np.asarray(x)
            if x.dtype.kind == "f":
                x = x.astype(np.float32, copy=False)
            if name not in self.chunks:
                self.chunks[name] = layer_chunks(x.shape[2:], x.itemsize, self.rows,
                                                 tuple(self.dims.get(name, ())))
                self.layout[name] = tuple(x.shape[1:])
                self.dtypes[name] = fill_value(x.dtype).dtype
                self.pending[name], self.done_rows[name], self.futures[name] = [], 0, {}
            if x.dtype != self.dtypes[name]:
                raise ValueError(f"rows of '{name}' are {x.dtype}, earlier ones "
                                 f"{self.dtypes[name]}")
            self.pending[name].append(x)
            if self.overlap:
                self._submit(name, final=False)

    def _submit(self, name: str, final: bool) -> None:
        whole, blocks, self.pending[name] = cut_chunks(self.pending[name],
                                                       self.chunks[name][0], final)
        for start, block in blocks:
            row0 = self.done_rows[name] + start
            for layer in range(block.shape[1]):
                for corner, tile in tiles(block[:, layer:layer + 1], self.chunks[name]):
                    self.futures[name][(row0, layer, *corner)] = self.pool.submit(
                        self._encode, tile)
        self.done_rows[name] += whole

    def finish(self) -> dict[str, Encoded]:
        """Encode what is left, wait for every chunk, and return the variables."""
        try:
            for _ in range(self.extra):             # measuring is over: every worker may run
                self.gate.release()
            self.extra = 0
            for name in self.chunks:
                self._submit(name, final=True)
            out = {}
            for name, futures in self.futures.items():
                shape = (self.done_rows[name], *self.layout[name])
                blobs = {off: f.result() for off, f in futures.items()}
                out[name] = Encoded(shape, self.chunks[name],
                                    {off: b for off, b in blobs.items() if b is not None},
                                    tuple(self.dims.get(name, ())), self.dtypes[name],
                                    dict(self.attrs.get(name, {})))
            return out
        finally:
            self.close()

    def close(self) -> None:
        """Stop the workers (pending chunks are dropped)."""
        self.pool.shutdown(wait=True, cancel_futures=True)
