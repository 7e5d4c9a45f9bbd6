"""Shard files: one netCDF4/HDF5 file (written through h5netcdf) per block of sequences.

Every shard holds the same dims padded to the store's ``max_length``, float32 with gzip and
shuffle, chunked by sequence block and layer, and the attributes of :func:`shard_attrs`.
:func:`write_shard` builds the file in memory and writes it atomically; extraction hands its
measured variables over already compressed (:mod:`attngeom.store.chunks`: the same bytes HDF5
would write, made in worker threads while the next batch is measured). :func:`layout_problem`
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


def build_shard(arrays: Mapping[str, np.ndarray | Encoded], sequences: np.ndarray,
                token_ids: np.ndarray, lengths: np.ndarray, extra: dict[str, np.ndarray],
                tokens: list[list[str]] | None, max_length: int, mode: str,
                attrs: dict | None = None) -> xr.Dataset:
    """Assemble one shard as a labeled Dataset, padding token axes to ``max_length``.

    Parameters
    ----------
    arrays : measurement name -> (S, L, H, ...) float32, or its already compressed chunks
        (:class:`attngeom.store.chunks.Encoded`, padded already): those stay out of the
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


def write_file(path: str | Path, data: bytes | memoryview) -> None:
    """:func:`attngeom.store.manifest.atomic_write_bytes`, creating the folder first."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise write_error(path.parent, exc) from exc
    atomic_write_bytes(path, data)


def write_shard(ds: xr.Dataset, path: str | Path,
                encoded: Mapping[str, Encoded] | None = None) -> None:
    """Write a shard atomically with the store's compression and chunking.

    The file is built in memory and written by
    :func:`attngeom.store.manifest.atomic_write_bytes`: a file with the final name is always
    complete, a failed write (disk full, read-only folder) raises StoreWriteError naming
    ``path``. (HDF5 writing straight to a full disk can crash the process on close.)

    ``encoded``: variables whose chunks are already compressed
    (:class:`attngeom.store.chunks.ChunkEncoder`, which records their dims); they are stored
    as they are. ``ds`` need not hold them (when it does, they must have the same shape).
    """
    encoded = dict(encoded or {})
    rest = ds.drop_vars([n for n in encoded if n in ds])
    data = rest.to_netcdf(None, engine="h5netcdf", encoding=encoding(rest), invalid_netcdf=False)
    if encoded:
        data = _with_encoded(data, ds, encoded)
    with memoryview(data) as view:                   # no copy of the file's bytes
        write_file(path, view)


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
            var = f.create_variable(name, dims, np.float32, chunks=enc.chunks,
                                    compression="gzip", compression_opts=LEVEL, shuffle=True,
                                    fletcher32=True, fillvalue=np.float32(np.nan))
            var.attrs.update(ds[name].attrs if name in ds
                             else {"description": S.DESCRIPTIONS[name]})
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
    layout (``mode``), and every dim's size and labels: layers and heads of the model (or of
    the subset), ``max_length`` positions, ``sink_k`` sink keys and ``tail_w`` lags.
    """
    missing = expected_variables(manifest) - set(dims)
    if missing:
        return f"missing variables {sorted(missing)[:5]}"
    mode = manifest["config"]["options"]["mode"]
    for name, have in dims.items():
        if name in S.DIMS and name not in S.DERIVED and tuple(have) != S.dims_for(name, mode):
            return (f"variable {name} has dims {tuple(have)}, not the {mode} layout's "
                    f"{S.dims_for(name, mode)}")
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
