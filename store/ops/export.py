"""Exporting a store for people and places without attngeom.

``zarr``    the whole store, contributions included, as one Zarr (format 2, consolidated
            metadata: the most widely read) through ``xarray.Dataset.to_zarr``, chunked by
            sequences and one layer, for cloud object storage; open with ``xr.open_zarr``.
``parquet`` long tables for R or pandas, one row per cell inside each sequence's length:
            ``per_query`` (sequence, layer, head, query, output_norm, ..., layer_output_norm),
            ``per_key`` (sequence, layer, head, key, value_norm, sink_value_cosine),
            ``pairs`` (sequence, layer, head, query, key, alpha, cosine, cosine_layer,
            contribution, contribution_layer; compact stores add ``group`` sink/tail and
            ``lag``, -1 on sink rows; masked cells are left out), ``sequences`` (one row
            per sequence) and ``tokens`` (sequence, position, token_id, special, token).
``hf``      the same Parquet tables laid out as a Hugging Face dataset repository: one file per
            store shard under ``data/<table>/`` (and ``data/<result>.<dims>/``), a ``README.md``
            dataset card (YAML configs with data_files per table, license, tags; the columns'
            definitions, :mod:`attngeom.store.ops.hub_card`) and the manifest; it loads with
            ``datasets.load_dataset(DIR, "per_query")`` and uploads with ``hf upload``.
All carry the manifest (as attrs / parquet metadata and a copy) and a description (README.txt,
or the dataset card). ``no_text`` leaves token strings out.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path

import numpy as np

from ..format import schema as S
from ..format.manifest import MANIFEST, file_sha256, read_manifest
from attngeom.common.errors import Refusal, StoreError
from ..io.readme import README, readme_text
from ..io.results import entries as result_entries
from ..io.results import is_faith_only
from attngeom.common.atomic import atomic_file, atomic_write_bytes, copy_file

FORMATS = ("zarr", "parquet", "hf")
SOURCE_MANIFEST = MANIFEST.replace(".json", ".source.json")   # the source manifest, copied
INCOMPLETE = ".attngeom-export-incomplete"   # in an export being written; removed when done
EXPORT_RECORD = "export"       # its key for what the export holds: tables, no_text, sha256s
TABLES = ("per_query", "per_key", "pairs", "sequences", "tokens")
ZARR_CHUNK_BYTES = 16 << 20


def export(store: str | Path, out: str | Path, fmt: str, tables=None, no_text: bool = False,
           license: str | None = None) -> Path:
    """Export ``store`` to ``out`` as ``fmt`` (zarr, parquet or hf); return ``out``.

    ``tables``: the long tables to write (parquet, hf; default all); ``no_text``: leave token
    strings out; ``license``: the dataset card's license (hf; default ``unknown``).
    """
    from ..io.reader import open_store

    store, out = Path(store), Path(out)
    if fmt not in FORMATS:
        raise Refusal(f"--format must be one of {', '.join(FORMATS)}, not '{fmt}'")
    tables = _tables(tables)
    manifest = read_manifest(store)
    ds = None if is_faith_only(manifest) else open_store(store)
    if ds is not None and no_text and "token" in ds:
        ds = ds.drop_vars("token")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        if not (out / INCOMPLETE).is_file():
            raise StoreError(f"--out {out} exists and is not empty; choose a new path")
        shutil.rmtree(out)                  # what an interrupted export left: start over
    out.mkdir(parents=True, exist_ok=True)
    (out / INCOMPLETE).touch()
    written: dict[str, str] = {}                      # hf: config name -> data_files pattern
    if fmt == "zarr":
        _zarr(ds, out)
    elif ds is not None:
        written = _parquet(ds, out, manifest, tables, hub=fmt == "hf")
    written = {**{t: written[t] for t in TABLES if t in written},
               **_results(store, manifest, out, fmt)}
    copy = dict(manifest)
    if fmt != "zarr":                        # what `store import` checks before reading
        copy[EXPORT_RECORD] = export_record(out, fmt, tables, no_text)
    atomic_write_bytes(out / SOURCE_MANIFEST, json.dumps(copy, indent=1, sort_keys=True).encode())
    if fmt == "hf":
        from .hub_card import dataset_card

        card = dataset_card(manifest, out, written, license=license, no_text=no_text,
                            store=store)
        atomic_write_bytes(out / "README.md", card.encode())
    else:
        atomic_write_bytes(out / README, _export_readme(manifest, fmt, store, no_text).encode())
    (out / INCOMPLETE).unlink()
    return out


def export_record(out: Path, fmt: str, tables: list[str], no_text: bool) -> dict:
    """The format, the tables asked for, ``no_text`` and the sha256 of every data file under
    ``out`` (the prose, README and dataset card, is left out: the Hub edits cards)."""
    prose = {README, "README.md", SOURCE_MANIFEST}
    files = sorted(p for p in out.rglob("*") if p.is_file() and p.name not in prose
                   and not p.name.startswith("."))
    return {"format": fmt, "tables": list(tables), "no_text": bool(no_text),
            "sha256": {p.relative_to(out).as_posix(): file_sha256(p) for p in files}}


def _tables(spec) -> list[str]:
    if spec is None:
        return list(TABLES)
    names = [t.strip() for t in (spec.split(",") if isinstance(spec, str) else spec) if t.strip()]
    bad = [t for t in names if t not in TABLES]
    if bad or not names:
        raise Refusal(f"--tables {bad[0] if bad else repr(spec)}: choose from "
                         f"{', '.join(TABLES)}")
    return names


# ---------------------------------------------------------------------------- zarr
def zarr_chunks(ds) -> dict[str, int]:
    """One layer and as many sequences as keep the largest variable's chunk ~16 MiB."""
    per = max(int(np.prod([ds.sizes[d] for d in v.dims if d not in (S.SEQUENCE, S.LAYER)]))
              * v.dtype.itemsize for v in ds.data_vars.values())
    return {**{d: -1 for d in ds.dims},
            S.SEQUENCE: int(max(1, min(ds.sizes[S.SEQUENCE], ZARR_CHUNK_BYTES // per))),
            S.LAYER: 1}


def _zarr(ds, out: Path) -> None:
    if ds is None:                                        # results only: groups added later
        import xarray as xr

        ds = xr.Dataset()
    for var in ds.variables.values():
        var.encoding = {}
    ds = ds.chunk(zarr_chunks(ds)) if ds.sizes else ds
    try:
        ds.to_zarr(out, mode="a", consolidated=True, zarr_format=2)   # out: new, or cleared
    except ImportError:
        raise Refusal("--format zarr needs the zarr package; pip install zarr") from None


# ---------------------------------------------------------------------------- results
def _results(store: Path, manifest: dict, out: Path, fmt: str) -> dict[str, str]:
    """Faithfulness results: Zarr groups ``faithfulness/<name>``, or Parquet tables
    ``<name>.<dims>.parquet`` (one per set of dims, e.g. ``faithfulness.metric_rank_mode_
    fraction_sequence.parquet``; hf: ``data/<name>.<dims>/train-00000-of-00001.parquet``);
    the netCDF file itself is copied next to them too. Returns the hf configs written."""
    import xarray as xr

    found = result_entries(manifest)
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, str] = {}
    for name, entry in found.items():
        with xr.open_dataset(store / entry["file"], engine="h5netcdf") as f:
            res = f.load()
        for var in res.variables.values():
            var.encoding = {}
        if fmt == "zarr":
            res.to_zarr(out, group=f"faithfulness/{name}", mode="w-", consolidated=False,
                        zarr_format=2)
            continue
        copy_file(store / entry["file"], out / Path(entry["file"]).name)
        by_dims: dict[tuple, list[str]] = {}
        for v, da in res.data_vars.items():
            if da.dims:
                by_dims.setdefault(tuple(sorted(da.dims, key=_dim_rank)), []).append(v)
        for dims, names in by_dims.items():
            table = f"{name}.{'_'.join(dims)}"
            path = out / (hub_path(table, 0, 1) if fmt == "hf" else f"{table}.parquet")
            with atomic_file(path) as tmp:
                res[names].transpose(*dims).to_dataframe().reset_index().to_parquet(
                    tmp, index=False)
            written[table] = hub_pattern(table)
    if fmt == "zarr" and found:
        import zarr

        zarr.consolidate_metadata(str(out), zarr_format=2)
    return written if fmt == "hf" else {}


def hub_path(table: str, index: int, count: int) -> str:
    """Where shard ``index`` of ``count`` of a table goes in a Hub dataset repository."""
    return f"data/{table}/train-{index:05d}-of-{count:05d}.parquet"


def hub_pattern(table: str) -> str:
    """The data_files pattern of a table's shards (the dataset card's configs)."""
    return f"data/{table}/*.parquet"


def _dim_rank(dim: str) -> tuple[int, str]:
    """Canonical order of a result's dims: the removal grid, the unit, then the rest."""
    order = ("metric", "rank", "mode", "fraction", "sequence", "item", "layer", "option")
    return (order.index(dim) if dim in order else len(order), dim)


# ---------------------------------------------------------------------------- parquet
def _columns(block, names: list[str], dims: tuple[str, ...], mask: np.ndarray,
             rename=lambda n: n) -> dict[str, np.ndarray]:
    """Long columns: one entry per True cell of ``mask`` (shaped like ``dims``)."""
    where = np.nonzero(mask)
    cols = {d: block[d].values[w].astype(np.int64 if d == S.SEQUENCE else np.int32)
            for d, w in zip(dims, where)}
    for n in names:
        cols[rename(n)] = block[n].broadcast_like(block[names[0]]).transpose(*dims).values[mask]
    return cols


def _within(block, dims: tuple[str, ...], axis: str) -> np.ndarray:
    """Mask of cells whose ``axis`` position lies inside the sequence's length."""
    inside = block[axis] < block["length"]                       # (sequence, axis)
    return inside.broadcast_like(block[S.LAYER] + block[S.HEAD]).transpose(*dims).values


def _present(block, names) -> list[str]:
    return [n for n in names if n in block]


def _pair_columns(block) -> list[dict[str, np.ndarray]]:
    names = _present(block, list(S.PAIR_VARIABLES) + list(S.DERIVED_PAIR_VARIABLES))
    if not names:
        return []
    if S.SINK not in block[names[0]].dims:                         # dense
        mask = np.any([np.isfinite(block[n].transpose(*S.PAIR).values) for n in names], 0)
        return [_columns(block, names, S.PAIR, mask)]
    out = []
    mask = np.any([np.isfinite(block[n].transpose(*S.SINK_PAIR).values) for n in names], 0)
    cols = _columns(block, names, S.SINK_PAIR, mask)
    cols[S.KEY] = cols.pop(S.SINK)
    out.append(_pair_order(dict(cols, group=np.full(len(cols[S.KEY]), "sink"),
                                lag=np.full(len(cols[S.KEY]), -1, dtype=np.int32))))
    tail = _present(block, ["tail_" + n for n in names])
    if tail:
        mask = np.any([np.isfinite(block[n].transpose(*S.TAIL).values) for n in tail], 0)
        cols = _columns(block, tail, S.TAIL, mask, rename=lambda n: n.removeprefix("tail_"))
        cols[S.KEY] = (cols[S.QUERY] - cols[S.LAG]).astype(np.int32)
        out.append(_pair_order(dict(cols, group=np.full(len(cols[S.KEY]), "tail"))))
    return out


def _pair_order(cols: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Sink and tail rows share one column order (one parquet schema)."""
    first = [S.SEQUENCE, S.LAYER, S.HEAD, S.QUERY, S.KEY, "group", S.LAG]
    return {**{k: cols[k] for k in first}, **{k: v for k, v in cols.items() if k not in first}}


def _block_tables(block) -> dict[str, list[dict[str, np.ndarray]]]:
    """Columns of every table for one loaded block (one shard, one layer)."""
    per_query = _present(block, list(S.PER_QUERY_VARIABLES) + list(S.LEARNED_SINK_VARIABLES)
                         + list(S.MIDDLE_VARIABLES)
                         + list(S.PER_LAYER_QUERY_VARIABLES))
    per_key = _present(block, list(S.PER_KEY_VARIABLES))
    out = {"per_query": [], "per_key": [], "pairs": _pair_columns(block)}
    if per_query:
        ref = next(n for n in per_query if S.HEAD in block[n].dims)
        names = [ref] + [n for n in per_query if n != ref]
        out["per_query"].append(_columns(block, names, S.PER_QUERY,
                                         _within(block, S.PER_QUERY, S.QUERY)))
    if per_key:
        out["per_key"].append(_columns(block, per_key, S.PER_KEY, _within(block, S.PER_KEY, S.KEY)))
    return out


def _sequence_tables(block) -> dict[str, list[dict[str, np.ndarray]]]:
    seq = block[S.SEQUENCE].values.astype(np.int64)
    rows = {S.SEQUENCE: seq}
    rows.update({n: block[n].values for n in ("length", "truncated", "finite", "text_index")
                 if n in block})
    inside = (block[S.POSITION] < block["length"]).transpose(S.SEQUENCE, S.POSITION).values
    names = _present(block, ["token_id", "special", "token"])
    tokens = _columns(block, names, (S.SEQUENCE, S.POSITION), inside)
    if "token" in tokens:
        tokens["token"] = tokens["token"].astype(str).astype(object)
    return {"sequences": [rows], "tokens": [tokens]}


def _parquet(ds, out: Path, manifest: dict, tables: list[str], hub: bool = False
             ) -> dict[str, str]:
    """Write the long tables: one file per table, or (``hub``) one per table and store shard
    under ``data/<table>/``. Returns the hub configs written (table -> data_files pattern)."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise Refusal("--format parquet/hf needs pyarrow; pip install pyarrow") from None
    out.mkdir(parents=True, exist_ok=True)
    meta = {b"attngeom_config_hash": manifest["config_hash"].encode(),
            b"attngeom_manifest": json.dumps(manifest, sort_keys=True).encode()}
    bounds = np.cumsum([0] + [e["sequences"][1] - e["sequences"][0]
                              for e in sorted(manifest["shards"], key=lambda e: e["sequences"][0])])
    count = len(bounds) - 1
    writers: dict[Path, tuple] = {}              # path -> (ParquetWriter, its ExitStack)
    written: dict[str, str] = {}

    def write(name: str, cols: dict[str, np.ndarray], index: int) -> None:
        if name not in tables or not cols or not len(next(iter(cols.values()))):
            return
        path = out / (hub_path(name, index, count) if hub else f"{name}.parquet")
        table = pa.table(cols)
        if path not in writers:
            stack = contextlib.ExitStack()                 # closed whole: renamed to path
            tmp = stack.enter_context(atomic_file(path))
            writer = pq.ParquetWriter(str(tmp), table.schema.with_metadata(meta))
            stack.callback(writer.close)
            writers[path] = (writer, stack)
            written[name] = hub_pattern(name)
        writers[path][0].write_table(table.replace_schema_metadata(meta))

    def close(failed: BaseException | None = None) -> None:
        for _, stack in writers.values():                  # failed: temporaries removed
            if failed is None:
                stack.close()
            else:
                stack.__exit__(type(failed), failed, failed.__traceback__)
        writers.clear()

    try:
        for index, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
            rows = ds.isel({S.SEQUENCE: slice(int(lo), int(hi))})
            for name, parts in _sequence_tables(rows.load()).items():
                for cols in parts:
                    write(name, cols, index)
            if {"per_query", "per_key", "pairs"} & set(tables):
                for layer in range(rows.sizes[S.LAYER]):
                    block = rows.isel({S.LAYER: [layer]}).load()
                    for name, parts in _block_tables(block).items():
                        for cols in parts:
                            write(name, cols, index)
            if hub:
                close()
        close()
    except BaseException as exc:
        close(exc)
        raise
    return written if hub else {}


def _export_readme(manifest: dict, fmt: str, store: Path | None = None,
                   no_text: bool = False) -> str:
    if fmt == "zarr":
        head = ("Zarr export of an attngeom store (Zarr format 2, consolidated metadata).\n"
                "Open it with:  import xarray as xr; ds = xr.open_zarr('path/to/export')\n"
                "It holds every variable described below, the derived contribution variables\n"
                "included (already computed), chunked by sequences and one layer. The source\n"
                "manifest is in the attribute 'attngeom_manifest' and manifest.source.json.\n")
    else:
        head = ("Parquet export of an attngeom store: long tables, one row per cell inside\n"
                "each sequence's length (masked pairs left out). Open with\n"
                "pandas.read_parquet('per_query.parquet') or arrow::read_parquet() in R.\n"
                "  per_query.parquet  sequence, layer, head, query + per-query variables\n"
                "                     (layer_output_norm repeated over heads)\n"
                "  per_key.parquet    sequence, layer, head, key + per-key variables\n"
                "  pairs.parquet      sequence, layer, head, query, key + pair variables\n"
                "                     (compact: group sink/tail, lag = query - key, -1 on sink)\n"
                "  sequences.parquet  sequence, length, truncated, finite, text_index\n"
                "  tokens.parquet     sequence, position, token_id, special, token\n"
                "Each file's metadata holds 'attngeom_manifest'; see manifest.source.json.\n")
    if result_entries(manifest):
        head += ("\nFaithfulness results: " + (
            "Zarr groups faithfulness/<name>; open one with\n"
            "xr.open_zarr('path/to/export', group='faithfulness/faithfulness').\n"
            if fmt == "zarr" else
            "<name>.nc (the result file itself) and one table per set of\n"
            "dims, <name>.<dims>.parquet (e.g. faithfulness.metric_rank_mode_fraction_sequence"
            ".parquet:\nthe loss of every removal condition per sequence).\n"))
    if is_faith_only(manifest):
        head += "This store holds faithfulness results only (no extracted sequences).\n"
    if no_text:
        head += "Token strings were left out of this export (--no-text); token ids remain.\n"
    return (head + "\nThe source store's description follows.\n\n"
            + readme_text(manifest, store))
