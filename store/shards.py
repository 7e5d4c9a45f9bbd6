"""Shard files: one netCDF4/HDF5 file (written through h5netcdf) per block of sequences.

Every shard holds the same dims padded to the store's ``max_length``, float32 with gzip and
shuffle, chunked by sequence block and layer. A shard is written to a temporary name,
fsynced and renamed, so a file with the final name is always complete. Extraction hands
its measured variables over already compressed (:mod:`attngeom.store.chunks`: the same
bytes HDF5 would write, made in worker threads while the next batch is measured).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import xarray as xr

from . import schema as S
from .chunks import LEVEL, Encoded, chunk_rows
from .manifest import atomic_write_bytes, write_error

SHARD_DIR = "shards"


def shard_name(index: int) -> str:
    return f"{SHARD_DIR}/shard-{index:05d}.nc"


def _pad(x: np.ndarray, axes: tuple[int, ...], size: int, fill) -> np.ndarray:
    widths = [(0, 0)] * x.ndim
    for a in axes:
        widths[a] = (0, size - x.shape[a])
    return np.pad(x, widths, constant_values=fill) if any(w[1] for w in widths) else x


def _dims(name: str, mode: str) -> tuple[str, ...]:
    dims = S.DIMS[name]
    if mode == "compact" and dims == S.PAIR:
        return S.SINK_PAIR
    return dims


def build_shard(arrays: dict[str, np.ndarray], sequences: np.ndarray, token_ids: np.ndarray,
                lengths: np.ndarray, extra: dict[str, np.ndarray], tokens: list[list[str]] | None,
                max_length: int, mode: str, attrs: dict) -> xr.Dataset:
    """Assemble one shard as a labeled Dataset, padding token axes to ``max_length``.

    Parameters
    ----------
    arrays : measurement name -> (S, L, H, ...) float32 as returned by extraction.
    sequences : (S,) global sequence indices; token_ids : (S, T) with -1 beyond length.
    extra : per-sequence int arrays (``truncated``, ``finite``, ``text_index``).
    """
    T = max_length
    data = {}
    for name, x in arrays.items():
        dims = _dims(name, mode)
        axes = tuple(i for i, d in enumerate(dims) if d in (S.QUERY, S.KEY, S.POSITION))
        data[name] = (dims, _pad(x.astype(np.float32, copy=False), axes, T, np.nan),
                      {"description": S.DESCRIPTIONS[name]})
    data["token_id"] = ((S.SEQUENCE, S.POSITION), _pad(token_ids.astype(np.int32), (1,), T, -1),
                        {"description": S.DESCRIPTIONS["token_id"]})
    data["length"] = ((S.SEQUENCE,), lengths.astype(np.int32),
                      {"description": S.DESCRIPTIONS["length"]})
    for name, x in extra.items():
        data[name] = ((S.SEQUENCE,), np.asarray(x, dtype=np.int32),
                      {"description": S.DESCRIPTIONS[name]})
    if tokens is not None:
        strings = np.full((len(tokens), T), "", dtype=object)
        for i, row in enumerate(tokens):
            strings[i, : len(row)] = row
        data["token"] = ((S.SEQUENCE, S.POSITION), strings,
                         {"description": S.DESCRIPTIONS["token"]})
    L, H = arrays["value_norm"].shape[1:3]
    coords = {S.SEQUENCE: sequences.astype(np.int64), S.LAYER: np.arange(L),
              S.HEAD: np.arange(H), S.POSITION: np.arange(T), S.QUERY: np.arange(T),
              S.KEY: np.arange(T)}
    if mode == "compact":
        coords[S.SINK] = np.arange(arrays["alpha"].shape[-1])
        coords[S.LAG] = np.arange(arrays["tail_alpha"].shape[-1])
    return xr.Dataset(data, coords=coords, attrs=attrs)


def encoding(ds: xr.Dataset, rows: int | None = None) -> dict[str, dict]:
    """gzip + shuffle + Fletcher-32 checksums, chunks of one layer and ~8 MiB of sequences.

    ``rows`` caps the sequences per chunk (extraction uses its batch size, so that chunks
    are complete after each batch). gzip level 1: level 4 wrote 1.15x slower for 1.2% fewer
    bytes (benchmarks/RESULTS.md).
    """
    enc = {}
    for name, var in ds.data_vars.items():
        if var.dtype == object or var.dtype.kind in "US":   # strings: no filters (HDF5 vlen)
            continue
        shape = list(var.shape)
        if S.LAYER in var.dims:
            shape[var.dims.index(S.LAYER)] = 1
        per_seq = int(np.prod(shape[1:])) * var.dtype.itemsize
        shape[0] = chunk_rows(per_seq, min(shape[0], rows or shape[0]))
        enc[name] = {"zlib": True, "complevel": LEVEL, "shuffle": True, "chunksizes": tuple(shape),
                     "fletcher32": True}       # a damaged chunk fails to read, never misreads
        if var.dtype.kind == "f":
            enc[name]["_FillValue"] = np.float32(np.nan)
    return enc


def write_netcdf_atomic(ds: xr.Dataset, path: str | Path, enc: dict | None = None) -> None:
    """Write ``ds`` to ``path`` via a temporary file, fsync and rename.

    The file is built in memory and written by :func:`atomic_write_bytes`: a file with the
    final name is always complete, a failed write (disk full, read-only folder) raises
    StoreWriteError naming ``path`` and leaves nothing behind. (HDF5 writing straight to a
    full disk can crash the process when the half-written file is closed.)
    """
    _write_file(path, ds.to_netcdf(None, engine="h5netcdf", encoding=enc or {},
                                   invalid_netcdf=False))


def _write_file(path: str | Path, data: bytes | memoryview) -> None:
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise write_error(path.parent, exc) from exc
    atomic_write_bytes(path, data)


def write_shard(ds: xr.Dataset, path: str | Path,
                encoded: dict[str, Encoded] | None = None) -> None:
    """Write a shard atomically with the store's compression and chunking.

    ``encoded``: variables of ``ds`` whose chunks are already compressed
    (:class:`attngeom.store.chunks.ChunkEncoder`); they are stored as they are.
    """
    if not encoded:
        write_netcdf_atomic(ds, path, encoding(ds))
        return
    import h5netcdf

    rest = ds.drop_vars(list(encoded))
    data = rest.to_netcdf(None, engine="h5netcdf", encoding=encoding(rest), invalid_netcdf=False)
    buffer = io.BytesIO(data)
    with h5netcdf.File(buffer, "r+") as f:
        for name, enc in encoded.items():
            _put_encoded(f, ds, name, enc)
    with buffer.getbuffer() as view:                 # no copy of the file's bytes
        _write_file(path, view)


def _put_encoded(f, ds: xr.Dataset, name: str, enc: Encoded) -> None:
    """Create ``name`` in the open h5netcdf file and store its compressed chunks."""
    var = ds[name]
    if tuple(var.shape) != enc.shape or var.dtype != np.float32:
        raise ValueError(f"encoded '{name}' is {enc.shape}, the shard's {var.shape}")
    for dim in var.dims:                             # a dim only the encoded variables use
        if dim not in f.dimensions:
            f.dimensions[dim] = ds.sizes[dim]
    h5 = f.create_variable(name, var.dims, np.float32, chunks=enc.chunks, compression="gzip",
                           compression_opts=LEVEL, shuffle=True, fletcher32=True,
                           fillvalue=np.float32(np.nan))
    h5.attrs.update(var.attrs)
    while enc.blobs:                                 # each chunk's bytes freed once stored
        offset, blob = enc.blobs.popitem()
        h5._h5ds.id.write_direct_chunk(offset, blob)


def remove_temporaries(store: str | Path) -> int:
    """Delete leftover temporary files of an interrupted run; return how many."""
    n = 0
    for pattern in (f"{SHARD_DIR}/.*.tmp-*", ".*.tmp-*"):
        for tmp in Path(store).glob(pattern):
            tmp.unlink(missing_ok=True)
            n += 1
    return n


def shard_attrs(manifest: dict) -> dict:
    """Attributes every shard carries so that a single file is self-describing."""
    cfg = manifest["config"]
    opts = cfg["options"]
    return {
        "attngeom_format": S.FORMAT_NAME,
        "attngeom_schema_version": S.SCHEMA_VERSION,
        "attngeom_config_hash": manifest["config_hash"],
        "attngeom_config": json.dumps(cfg, sort_keys=True),
        "model": cfg["model"]["id"],
        "mode": opts["mode"],
        "sink_k": opts["sink_k"],
        "tail_w": opts["tail_w"],
        "max_length": opts["max_length"],
        "causal": int(cfg["model"]["causal"]),
        "Conventions": "CF-1.8",
    }
