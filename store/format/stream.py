"""A shard file written layer by layer, while extraction measures it (dense mode; compact on a
CPU).

A dense shard is mostly its (query, key) variables: one layer of one 2,048-token sequence of a
9-head model is 150 MB a variable. :class:`ShardStream` never holds more than the layers being
compressed. The file is laid out in memory first, as
:func:`attngeom.store.format.shards.write_shard` lays it out (coordinates and per-sequence
variables by xarray, placeholders until the shard is measured; every measured variable created
empty with the same chunks, filters, fill values and attributes), and written under its
temporary name (:func:`attngeom.common.atomic.atomic_file`). Each layer's rows are then cut
into those chunks, compressed (:func:`~attngeom.store.format.chunks.encode_stored`, in worker
threads) and stored with h5py's ``write_direct_chunk``, in order, as soon as a chunk is whole
(a chunk holding only the fill value, such as a (query, key) tile above the causal diagonal,
is not stored: HDF5 reads it as the fill value);
:meth:`ShardStream.complete` writes the per-sequence values last. Until the writer renames it,
the file has its temporary name and the manifest does not list it: a shard cut short is never
read, and a rerun deletes it. Only h5py writes to the file on disk (a full disk is an OSError,
:func:`hdf5_errors`; xarray's file handles retry a failed close when collected, and crash).

>>> with ShardStream(tmp, skeleton, layout, workers=2) as stream:
...     stream.add_layer(0, rows)        # (b, 1, ...) of every measured variable
...     stream.mark()                    # after each batch (rollback() forgets a batch)
...     stream.finish()                  # the last chunks; then complete(ds)
"""

from __future__ import annotations

import contextlib
import re
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Iterator, Mapping

import numpy as np
import xarray as xr

from attngeom.common.vocab import PACKED

from ..format import schema as S
from .chunks import Encoded, cut_chunks, encode_stored, layer_chunks, tiles
from .packing import PACKED_VARIABLES, stored_attrs
from .shards import shard_bytes


def measured_layout(mode: str, precision: str, learned_sinks: bool, sequences: int,
                    n_layers: int, n_heads: int, T: int, rows: int, sink_k: int = 0,
                    tail_w: int = 0) -> dict[str, Encoded]:
    """The measured variables of a shard (no chunk yet): shape, dims, chunks of at most
    ``rows`` sequences and one layer (as :class:`~attngeom.store.format.chunks.ChunkEncoder`
    makes them), stored dtype (int16 where packed) and attributes. ``sink_k``, ``tail_w``:
    the compact layout's sink keys (at most ``T``) and tail window. In the order the
    measurement hands them over (pairs, compact's tail and middle, then per token), which is
    the order of a shard measured whole and then written."""
    sizes = {S.SEQUENCE: sequences, S.LAYER: n_layers, S.HEAD: n_heads, S.POSITION: T,
             S.QUERY: T, S.KEY: T, S.SINK: min(sink_k, T), S.LAG: tail_w}
    pairs = {*S.PAIR_VARIABLES, *S.TAIL_VARIABLES, *S.MIDDLE_VARIABLES}
    out = {}
    for name in sorted(S.variables_for(mode, learned_sinks), key=lambda n: n not in pairs):
        dims = S.dims_for(name, mode, precision)
        dtype = np.dtype(np.int16 if precision == PACKED and name in PACKED_VARIABLES
                         else np.float32)
        shape = tuple(sizes[d] for d in dims)
        out[name] = Encoded(shape, layer_chunks(shape[2:], dtype.itemsize, rows, dims), {},
                            dims, dtype, stored_attrs(name, precision))
    return out


class ShardStream:
    """One shard file filled as it is measured (see the module's docstring).

    ``workers`` threads compress chunks; ``overlap``: a layer's chunks are compressed while
    the next layer is measured (two layers held), else before it (one layer held).
    """

    def __init__(self, path: str | Path, ds: xr.Dataset, layout: Mapping[str, Encoded],
                 workers: int = 1, overlap: bool = False):
        import h5py

        self.path, self.layout, self.overlap = Path(path), dict(layout), overlap
        rest = ds.drop_vars([n for n in layout if n in ds])
        self.skeleton = {n: (v.dims, v.shape, v.dtype) for n, v in rest.variables.items()}
        self.coords = {n: rest[n].values for n in rest.coords}
        self.path.write_bytes(shard_bytes(ds, self.layout))     # laid out in memory: small
        with hdf5_errors():
            self.file = h5py.File(self.path, "r+")
        self.datasets = {name: self.file[name] for name in self.layout}
        self.pending: dict[tuple[str, int], tuple[int, list[np.ndarray]]] = {}
        self.saved: dict[tuple[str, int], tuple[int, list[np.ndarray]]] = {}
        self.pool = ThreadPoolExecutor(max(1, workers), thread_name_prefix="attngeom-stream")
        self.queue: deque[tuple[str, tuple[int, ...], Future, int]] = deque()
        self.cut = {name: set() for name in self.layout}      # chunk offsets measured
        self.stored = {name: set() for name in self.layout}   # those not only fill
        self.calls, self.finished, self.result = 0, False, None

    # ---------------------------------------------------------------- measured rows
    def add_layer(self, layer: int, rows: Mapping[str, np.ndarray]) -> None:
        """The next rows (b, 1, ...) of layer ``layer`` of every measured variable."""
        self.calls += 1
        for name, x in rows.items():
            x = np.asarray(x)
            x = x.astype(np.float32, copy=False) if x.dtype.kind == "f" else x
            enc = self.layout[name]
            if x.shape[1:] != (1, *enc.shape[2:]) or x.dtype != enc.dtype:
                raise ValueError(f"rows of '{name}' are {x.dtype} {x.shape}, the shard's "
                                 f"{enc.dtype} (b, 1, {enc.shape[2:]})")
            start, parts = self.pending.get((name, layer), (0, []))
            self.pending[name, layer] = self._submit(name, layer, start, parts + [x], False)
        self._write(keep=self.calls if self.overlap else None)

    def mark(self) -> None:
        """The rows added so far are final (a batch is done)."""
        self.saved = {key: (start, list(parts)) for key, (start, parts) in self.pending.items()}

    def rollback(self) -> None:
        """Forget the rows added since :meth:`mark` (a batch cut short: it comes again).
        Chunks of them already stored are stored again, over, when their rows come again."""
        self.pending = {key: (start, list(parts)) for key, (start, parts) in self.saved.items()}

    def finish(self) -> dict[str, Encoded]:
        """Store the last chunks (padded as HDF5 pads edge chunks) and wait for every chunk;
        return the measured variables (shape, dims, ...: no chunk bytes). ValueError when a
        chunk is missing (a layer never measured)."""
        for (name, layer), (start, parts) in list(self.pending.items()):
            if parts:
                self.pending[name, layer] = self._submit(name, layer, start, parts, True)
        self._write(keep=None)
        for name, enc in self.layout.items():
            grid = [-(-n // c) for n, c in zip(enc.shape, enc.chunks)]
            want, have = int(np.prod(grid)), self.datasets[name].id.get_num_chunks()
            if len(self.cut[name]) != want or have != len(self.stored[name]):
                raise ValueError(f"shard stream: {len(self.cut[name])} of the {want} chunks "
                                 f"of '{name}' were measured, {have} of "
                                 f"{len(self.stored[name])} stored")
        self.finished = True
        return {name: Encoded(enc.shape, enc.chunks, {}, enc.dims, enc.dtype, dict(enc.attrs))
                for name, enc in self.layout.items()}

    def _submit(self, name: str, layer: int, start: int, parts: list[np.ndarray],
                final: bool) -> tuple[int, list[np.ndarray]]:
        """Hand the whole chunks of ``parts`` (rows from ``start``) to the workers; return the
        rows left over (all of them, padded, when ``final``)."""
        chunks = self.layout[name].chunks
        whole, blocks, rest = cut_chunks(parts, chunks[0], final)
        for lo, block in blocks:
            for corner, tile in tiles(block, chunks):
                offset = (start + lo, layer, *corner)
                self.cut[name].add(offset)
                self.queue.append((name, offset, self.pool.submit(encode_stored, tile),
                                   self.calls))
        return start + whole, rest

    def _write(self, keep: int | None) -> None:
        """Store the compressed chunks in the order they were cut (a file of the same bytes
        every run), waiting for each; ``keep``: leave those of that call in flight."""
        while self.queue and (keep is None or self.queue[0][3] != keep):
            name, offset, future, _ = self.queue.popleft()
            blob = future.result()
            if blob is None:                     # only the fill value: read as such
                continue
            with hdf5_errors():
                self.datasets[name].id.write_direct_chunk(offset, blob)
            self.stored[name].add(offset)

    # ---------------------------------------------------------------- the rest, the file
    def complete(self, ds: xr.Dataset) -> None:
        """Write the per-sequence variables of ``ds`` (the shard's Dataset: the layout of the
        one the file was laid out from) and close the file; after :meth:`finish`."""
        if not self.finished:
            raise ValueError("shard stream: complete() before finish(), chunks may be missing")
        for name, (dims, shape, dtype) in self.skeleton.items():
            var = ds.variables.get(name)
            if var is None or (var.dims, var.shape, var.dtype) != (dims, shape, dtype):
                raise ValueError(f"shard stream: '{name}' of the finished shard is not laid "
                                 f"out as its file ({dims}, {shape}, {dtype})")
            if name in self.coords:
                if not np.array_equal(var.values, self.coords[name]):
                    raise ValueError(f"shard stream: coordinate '{name}' changed")
                continue
            with hdf5_errors():
                self.file[name][...] = var.values
        self.close()
        with hdf5_errors():
            self.file.close()
        self.result = ds

    def close(self) -> None:
        """Stop the workers (chunks not yet stored are dropped; the file stays open)."""
        self.pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> "ShardStream":
        return self

    def __exit__(self, kind, *exc) -> None:
        self.close()
        if self.file.id.valid:
            try:
                with hdf5_errors():
                    self.file.close()
            except (OSError, RuntimeError):
                if kind is None:                     # a file that failed is dropped anyway
                    raise


@contextlib.contextmanager
def hdf5_errors() -> Iterator[None]:
    """HDF5's failures to write (a full disk, a read-only folder) as the OSError it reports:
    errno and reason parsed from its message (h5py raises some as RuntimeError, and others
    with the whole of HDF5's message as the reason), so that the writer names the file and
    the fix (:func:`attngeom.common.errors.write_error`)."""
    try:
        yield
    except (OSError, RuntimeError) as exc:
        found = re.search(r"errno = (\d+), error message = '([^']*)'", str(exc))
        if found is None:
            raise
        raise OSError(int(found[1]), found[2]) from exc
