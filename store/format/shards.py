"""Shard files: one netCDF4/HDF5 file (written through h5netcdf) per block of sequences.

Every shard holds the same dims padded to the store's ``max_length``, float32 (packed stores:
the bounded variables CF-packed int16, :mod:`attngeom.store.format.packing`) with gzip and shuffle,
chunked by sequence block and layer, and the attributes of :func:`shard_attrs`.
:func:`write_shard` builds the file in memory and writes it atomically; extraction hands its
measured variables over already compressed (:mod:`attngeom.store.format.chunks`: HDF5's filter
pipeline, run in worker threads while the next batch is measured); a dense shard is laid out
the same way, and its measured variables filled layer by layer as they are measured
(:mod:`attngeom.store.format.stream`). :func:`layout_problem`
is the one check that a shard has the layout its manifest describes (used when writing,
opening and validating).
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Callable, Mapping

import numpy as np
import xarray as xr

from ..format import schema as S
from .chunks import LEVEL, Encoded, chunk_rows, fill_value, tiled
from attngeom.common.atomic import atomic_write_bytes
from .packing import FILL, cf_attrs, is_packed, precision_of

SHARD_DIR = "shards"


def shard_name(index: int) -> str:
    return f"{SHARD_DIR}/shard-{index:05d}.nc"


def _pad(x: np.ndarray, axes: tuple[int, ...], size: int, fill) -> np.ndarray:
    widths = [(0, 0)] * x.ndim
    for a in axes:
        widths[a] = (0, size - x.shape[a])
    return np.pad(x, widths, constant_values=fill) if any(w[1] for w in widths) else x


def build_shard(arrays: Mapping[str, np.ndarray | Encoded], sequences: np.ndarray,
                token_ids: np.ndarray, lengths: np.ndarray, extra: dict[str, np.ndarray],
                tokens: list[list[str]] | None, max_length: int, mode: str,
                attrs: dict | None = None) -> xr.Dataset:
    """Assemble one shard as a labeled Dataset, padding token axes to ``max_length``.

    Parameters
    ----------
    arrays : measurement name -> (S, L, H, ...) float32, or its already compressed chunks
        (:class:`attngeom.store.format.chunks.Encoded`, padded already): those stay out of the
        Dataset (pass them to :func:`write_shard`); their shapes size the coordinates.
    sequences : (S,) global sequence indices; token_ids : (S, T) with -1 beyond length.
    extra : per-sequence int arrays (``truncated``, ``finite``, ``text_index``).
    """
    T = max_length
    data = {}
    for name, x in arrays.items():
        if isinstance(x, Encoded):
            continue
        dims = S.dims_for(name, mode)
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
    return xr.Dataset(data, coords=coords, attrs=attrs or {})


def encoding(ds: xr.Dataset, rows: int | None = None) -> dict[str, dict]:
    """gzip + shuffle + Fletcher-32 checksums, chunks of one layer and ~8 MiB of sequences
    (a (query, key) variable's also in tiles: :func:`attngeom.store.format.chunks.tiled`).

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
        shape[-2:] = tiled(tuple(shape[-2:]), var.dims)     # (query, key) tiles
        per_seq = int(np.prod(shape[1:])) * var.dtype.itemsize
        shape[0] = chunk_rows(per_seq, min(shape[0], rows or shape[0]))
        enc[name] = {"zlib": True, "complevel": LEVEL, "shuffle": True, "chunksizes": tuple(shape),
                     "fletcher32": True}       # a damaged chunk fails to read, never misreads
        if var.dtype.kind == "f":
            enc[name]["_FillValue"] = np.float32(np.nan)
        elif is_packed(name, var.dtype):
            enc[name]["_FillValue"] = FILL
    return enc


def netcdf_bytes(ds: xr.Dataset, encoding: Mapping[str, dict] | None = None) -> memoryview:
    """``ds.to_netcdf(None, engine="h5netcdf", encoding=encoding)``: the same bytes, without
    the dask import xarray does to pick a file lock (it asks dask which scheduler runs, which
    imports dask.distributed: about 2 s of a short ``attngeom extract``). A file built in
    memory needs no file lock; HDF5's own lock is kept. Falls back to ``to_netcdf`` where
    this xarray lays its backends out otherwise."""
    try:
        from xarray.backends import H5NetCDFStore
        from xarray.backends.common import ArrayWriter
        from xarray.backends.locks import HDF5_LOCK
        from xarray.backends.writers import dump_to_store
    except ImportError:
        return memoryview(ds.to_netcdf(None, engine="h5netcdf", encoding=dict(encoding or {}),
                                       invalid_netcdf=False))
    buffer = io.BytesIO()
    store = H5NetCDFStore.open(buffer, mode="w", lock=HDF5_LOCK, invalid_netcdf=False)
    try:
        writer = ArrayWriter()                       # dask-backed variables: written by sync
        dump_to_store(ds, store, writer, encoding=dict(encoding or {}))
        writer.sync()
    finally:
        store.close()
    return buffer.getbuffer()


def write_shard(ds: xr.Dataset, path: str | Path,
                encoded: Mapping[str, Encoded] | None = None) -> None:
    """Write a shard atomically with the store's compression and chunking.

    The file is built in memory and written by
    :func:`attngeom.common.atomic.atomic_write_bytes`: a file with the final name is always
    complete, a failed write (disk full, read-only folder) raises StoreWriteError naming
    ``path``. (HDF5 writing straight to a full disk can crash the process on close.)

    ``encoded``: variables whose chunks are already compressed
    (:class:`attngeom.store.format.chunks.ChunkEncoder`, which records their dims); they are stored
    as they are. ``ds`` need not hold them (when it does, they must have the same shape).
    """
    with memoryview(shard_bytes(ds, encoded)) as view:     # no copy of the file's bytes
        atomic_write_bytes(path, view)


def shard_bytes(ds: xr.Dataset, encoded: Mapping[str, Encoded] | None = None) -> memoryview:
    """The bytes of the shard file :func:`write_shard` writes (an ``Encoded`` without chunks
    gives a variable that :mod:`attngeom.store.format.stream` fills later)."""
    encoded = dict(encoded or {})
    rest = ds.drop_vars([n for n in encoded if n in ds])
    data = netcdf_bytes(rest, encoding(rest))
    return _with_encoded(data, ds, encoded) if encoded else data


def _with_encoded(data: bytes | memoryview, ds: xr.Dataset,
                  encoded: dict[str, Encoded]) -> memoryview:
    """The netCDF file ``data`` with the encoded variables added (h5netcdf creates them with
    their dimension scales; h5py stores each compressed chunk with write_direct_chunk)."""
    import h5netcdf
    import h5py

    buffer = io.BytesIO(data)
    with h5netcdf.File(buffer, "r+") as f:
        for name, enc in encoded.items():
            dims = enc.dims or (ds[name].dims if name in ds else ())
            if len(dims) != len(enc.shape) or (name in ds and ds[name].shape != enc.shape):
                raise ValueError(f"encoded '{name}' is {enc.shape} on {dims}, the shard's "
                                 f"{ds[name].shape if name in ds else 'dims unknown'}")
            for dim, size in zip(dims, enc.shape):   # a dim only the encoded variables use
                if dim not in f.dimensions:
                    f.dimensions[dim] = size
            var = f.create_variable(name, dims, enc.dtype, chunks=enc.chunks,
                                    compression="gzip", compression_opts=LEVEL, shuffle=True,
                                    fletcher32=True, fillvalue=fill_value(enc.dtype))
            var.attrs.update(ds[name].attrs if name in ds
                             else {"description": S.DESCRIPTIONS[name]})
            var.attrs.update(enc.attrs)
            if is_packed(name, enc.dtype):              # int16 decodes only with these
                var.attrs.update(cf_attrs(name))
    with h5py.File(buffer, "r+") as f:
        for name, enc in encoded.items():
            dataset = f[name]
            while enc.blobs:                         # each chunk's bytes freed once stored
                offset, blob = enc.blobs.popitem()
                dataset.id.write_direct_chunk(offset, blob)
    return buffer.getbuffer()


def read_shard(path: str | Path,
               select: Callable[[xr.Dataset], xr.Dataset] | None = None) -> xr.Dataset:
    """Read one shard (only what ``select`` keeps) into memory, encodings cleared."""
    with xr.open_dataset(path, engine="h5netcdf") as ds:
        ds = (select(ds) if select else ds).load()
    for var in ds.variables.values():
        var.encoding = {}
    ds.encoding = {}
    return ds


def renumbered(ds: xr.Dataset, start: int, no_text: bool = False) -> xr.Dataset:
    """``ds`` with sequences numbered from ``start`` (and, with ``no_text``, no token strings)."""
    if no_text and "token" in ds:
        ds = ds.drop_vars("token")
    return ds.assign_coords({S.SEQUENCE: np.arange(start, start + ds.sizes[S.SEQUENCE])})


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
        "precision": precision_of(opts),
        "Conventions": "CF-1.8",
    }


# ------------------------------------------------------------------ the layout of a shard
def expected_variables(manifest: dict) -> set[str]:
    """Variables every shard of the store must hold (what ``store subset`` kept)."""
    cut = manifest["config"].get("subset") or {}
    dropped = set(cut.get("dropped_variables", []))
    learned = manifest["config"].get("model", {}).get("learned_sinks", False)
    return set(S.variables_for(manifest["config"]["options"]["mode"], learned)) - dropped \
        | {"token_id", "length"}


def expected_labels(manifest: dict) -> dict[str, list[int]]:
    """Dim -> the coordinate values every shard has (all dims but ``sequence``)."""
    cfg = manifest["config"]
    opts, model, cut = cfg["options"], cfg["model"], cfg.get("subset") or {}
    T = int(opts["max_length"])
    labels = {S.LAYER: list(cut["layers"]) if cut else list(range(int(model["n_layers"]))),
              S.HEAD: list(cut["heads"]) if cut else list(range(int(model["n_heads"]))),
              S.POSITION: list(range(T)), S.QUERY: list(range(T)), S.KEY: list(range(T))}
    if opts["mode"] == "compact":
        labels[S.SINK] = list(range(min(int(opts["sink_k"]), T)))
        labels[S.LAG] = list(range(int(opts["tail_w"])))
    return labels


def layout_problem(manifest: dict, dims: Mapping[str, tuple[str, ...]],
                   labels: Mapping[str, np.ndarray]) -> str | None:
    """What in a shard differs from the layout its manifest describes, or None.

    Parameters
    ----------
    dims : variable name -> its dims, for every variable of the shard.
    labels : dim -> its coordinate values (a missing coordinate counts as missing dim).

    Checks the variables the store must hold, each schema variable's dims in the store's
    layout (``mode``; ``precision`` for head-free ones), and every dim's size and labels:
    layers and heads of the model (or of the subset), ``max_length`` positions, ``sink_k``
    sink keys and ``tail_w`` lags.
    """
    missing = expected_variables(manifest) - set(dims)
    if missing:
        return f"missing variables {sorted(missing)[:5]}"
    mode = manifest["config"]["options"]["mode"]
    precision = precision_of(manifest["config"]["options"])
    for name, have in dims.items():
        want = S.dims_for(name, mode, precision) if name in S.DIMS else None
        if want and name not in S.DERIVED and tuple(have) != want:
            return (f"variable {name} has dims {tuple(have)}, not the {mode} layout's "
                    f"{want}" + (f" ({precision})" if name in S.HEAD_FREE else ""))
    used = {d for have in dims.values() for d in have}
    for dim, want in expected_labels(manifest).items():
        if dim not in used:
            continue
        got = labels.get(dim)
        if got is None:
            return f"no coordinate '{dim}'"
        got = [int(v) for v in np.asarray(got).ravel()]
        if got != want:
            return (f"{len(got)} {dim} label(s) {_short(got)}, the manifest says {len(want)} "
                    f"({_short(want)})")
    return None


def _short(values: list[int]) -> str:
    text = ",".join(map(str, values[:8]))
    return text + (",..." if len(values) > 8 else "")
