"""Rebuilding a store from a Hugging Face dataset export (``store export --format hf``).

The export holds one Parquet file per table and store shard (``data/<table>/train-NNNNN-of-
NNNNN.parquet``), the faithfulness result files as written, and ``manifest.source.json``: the
source store's manifest plus what the export holds (its tables, ``no_text`` and the sha256 of
every data file). :func:`import_export` checks those checksums first (a changed or missing
file is refused), then writes shard ``i`` of the new store from file ``i`` of every table:
each measured variable scattered back onto the store's padded grid (cells the export left
out are the NaNs and fills they were), the derived contributions left to be derived on read.
The manifest keeps the source's config, so the store has the source's content hash; a
packed store is packed again (decoding gives the same floats). An export without token
strings (``--no-text``) gives a store without them, recorded as ``store_text: false``.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable

import numpy as np
import xarray as xr

from attngeom.common.errors import StoreError
from ..format import schema as S
from ..format.manifest import carried, config_hash, file_sha256, parse_manifest, without_text
from ..format.shards import expected_labels, expected_variables
from ..io.results import FAITH_ONLY, entries, is_faith_only
from ..io.writer import StoreWriter
from .export import EXPORT_RECORD, SOURCE_MANIFEST, hub_path

# the table that holds each measured variable (compact tail variables: rows of group "tail")
TABLE_OF = {**{n: "pairs" for n in S.PAIR_VARIABLES}, **{n: "pairs" for n in S.TAIL_VARIABLES},
            **{n: "per_key" for n in S.PER_KEY_VARIABLES},
            **{n: "per_query" for n in (*S.PER_QUERY_VARIABLES, *S.LEARNED_SINK_VARIABLES,
                                        *S.MIDDLE_VARIABLES, *S.PER_LAYER_QUERY_VARIABLES)},
            "token_id": "tokens", "special": "tokens", "token": "tokens",
            **{n: "sequences" for n in ("length", "truncated", "finite", "text_index")}}
FILLS = {"token_id": -1, "special": 0, "token": ""}        # beyond a sequence's length


def import_export(export: str | Path, out: str | Path,
                  log: Callable[[str], None] | None = None) -> dict:
    """Rebuild the store an hf export was made from, at ``out``.

    Parameters
    ----------
    export : str or Path
        The export's folder (as ``store export --format hf`` wrote it, or ``hf download`` left
        it), with its ``manifest.source.json``.
    out : str or Path
        The new store directory.
    log : callable, optional
        Receives one line when the store is written.

    Returns
    -------
    dict
        The new store's manifest.

    Raises
    ------
    StoreError
        In one line, when the export is not an attngeom hf export, a file is missing or does not
        match its recorded sha256, or a table the store needs was left out.
    """
    export, out = Path(export), Path(out)
    source, record = _checked(export)
    no_text = bool(record.get("no_text")) and source["config"]["options"].get("store_text",
                                                                              False)
    config = without_text(source["config"], no_text)
    extra = carried(source)
    extra["imported"] = {"from": "hf export", "source_config_hash": source["config_hash"],
                         "no_text": no_text}
    if is_faith_only(source):
        extra.update(kind=FAITH_ONLY, counts={})
        writer = StoreWriter.new(out, config, 0, extra, inputs=[export])
        return writer.finish([(export, source)])
    _needed_tables(source, record, export)
    writer = StoreWriter.new(out, config, source["n_sequences"], extra, inputs=[export])
    shards = sorted(source["shards"], key=lambda e: e["sequences"][0])
    try:
        for index, entry in enumerate(shards):
            writer.add_shard(_shard(export, source, entry, index, len(shards), no_text), index)
        manifest = writer.finish([(export, source)])
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)     # a folder this call made: never half a store
        raise
    if no_text and log:
        log("attngeom: the export has no token strings (--no-text); the store is imported "
            "without them (store_text false, so its content hash differs from the source's)")
    return manifest


# ------------------------------------------------------------------ checks
def _checked(export: Path) -> tuple[dict, dict]:
    """The source manifest and the export record, after every recorded file's sha256."""
    path = export / SOURCE_MANIFEST
    if not export.is_dir() or not path.is_file():
        raise StoreError(f"{export}: no {SOURCE_MANIFEST}; not an attngeom export (make one "
                         "with `attngeom store export STORE --format hf --out DIR`)")
    source = parse_manifest(path, export)
    record = source.pop(EXPORT_RECORD, None)
    if config_hash(source["config"]) != source["config_hash"]:
        raise StoreError(f"{path}: the config does not match its config_hash (edited or "
                         "damaged); download the export again")
    if not isinstance(record, dict) or not isinstance(record.get("sha256"), dict):
        raise StoreError(f"{path}: no checksums of the export's files (an export made before "
                         "attngeom could import); export the store again")
    if record.get("format") != "hf":
        raise StoreError(f"{export}: a --format {record.get('format')} export; store import "
                         "reads --format hf exports")
    for rel, sha in sorted(record["sha256"].items()):
        file = export / rel
        if Path(rel).is_absolute() or ".." in Path(rel).parts:
            raise StoreError(f"{path}: file {rel[:80]} leaves the export; refusing")
        if not file.is_file():
            raise StoreError(f"{file}: missing from the export; download it again")
        if file_sha256(file) != sha:
            raise StoreError(f"{file}: checksum mismatch (damaged or altered); download the "
                             "export again")
    extra = sorted(p.relative_to(export).as_posix() for p in export.glob("data/**/*.parquet")
                   if p.relative_to(export).as_posix() not in record["sha256"])
    if extra:
        raise StoreError(f"{export / extra[0]}: not part of the export as it was made (no "
                         "recorded checksum); remove it or download the export again")
    return source, record


def _needed_tables(source: dict, record: dict, export: Path) -> None:
    """StoreError naming the tables the store's variables need that the export lacks."""
    want = sorted({TABLE_OF[n] for n in expected_variables(source)})
    missing = [t for t in want if not (export / "data" / t).is_dir()]
    if missing:
        asked = ",".join(record.get("tables") or [])
        raise StoreError(f"{export}: the export lacks table(s) {', '.join(missing)} (exported "
                         f"with --tables {asked}); a store needs every table: export it again "
                         "without --tables")


# ------------------------------------------------------------------ one shard
def _read(export: Path, table: str, index: int, count: int) -> dict[str, np.ndarray]:
    import pyarrow.parquet as pq

    path = export / hub_path(table, index, count)
    if not path.is_file():
        return {}
    t = pq.read_table(path)
    return {name: t.column(name).to_numpy(zero_copy_only=False) for name in t.column_names}


def _shard(export: Path, source: dict, entry: dict, index: int, count: int,
           no_text: bool) -> xr.Dataset:
    """Shard ``index`` as a Dataset of stored (float32, unpacked) variables."""
    mode = source["config"]["options"]["mode"]
    labels = expected_labels(source)
    lo, hi = entry["sequences"]
    labels[S.SEQUENCE] = list(range(lo, hi))
    where = {d: {int(v): i for i, v in enumerate(vals)} for d, vals in labels.items()}
    want = expected_variables(source) | {"text_index", "special", "truncated", "finite"} \
        | (set() if no_text or not source["config"]["options"].get("store_text") else {"token"})
    data: dict[str, tuple] = {}
    for table in ("sequences", "tokens", "per_query", "per_key"):
        cols = _read(export, table, index, count)
        for name in sorted(set(cols) & want):
            data[name] = (S.DIMS[name], _scatter(cols, name, S.DIMS[name], labels, where),
                          {"description": S.DESCRIPTIONS[name]})
    pairs = _read(export, "pairs", index, count)
    if pairs:
        data.update(_pairs(pairs, mode, labels, where, want))
    coords = {d: np.asarray(v, dtype=np.int64) for d, v in labels.items()}
    return xr.Dataset(data, coords=coords)


def _scatter(cols: dict[str, np.ndarray], name: str, dims: tuple[str, ...],
             labels: dict, where: dict) -> np.ndarray:
    """The variable ``name`` on ``dims``: the table's rows at their cells, the rest filled."""
    values = cols[name]
    if name == "token":
        values = values.astype(str)
        out = np.full([len(labels[d]) for d in dims], FILLS[name], dtype=values.dtype)
    elif values.dtype.kind == "f":
        out = np.full([len(labels[d]) for d in dims], np.nan, dtype=np.float32)
    else:
        out = np.full([len(labels[d]) for d in dims], FILLS.get(name, 0), dtype=values.dtype)
    index = tuple(_positions(cols[d], where[d], d) for d in dims)
    out[index] = values
    return out


def _positions(column: np.ndarray, where: dict[int, int], dim: str) -> np.ndarray:
    """Row labels of ``dim`` as positions on the store's grid (StoreError when off it)."""
    keys = np.fromiter(where, dtype=np.int64, count=len(where))
    pos = np.fromiter(where.values(), dtype=np.int64, count=len(where))
    order = np.argsort(keys)
    found = np.searchsorted(keys[order], column)
    found = np.clip(found, 0, len(keys) - 1)
    if len(column) and not np.array_equal(keys[order][found], column):
        raise StoreError(f"a table row has {dim} label(s) the store's manifest does not have; "
                         "the export does not match its manifest")
    return pos[order][found]


def _pairs(cols: dict[str, np.ndarray], mode: str, labels: dict, where: dict,
           want: set[str]) -> dict[str, tuple]:
    """Pair variables of the dense or compact layout from the ``pairs`` rows."""
    names = [n for n in S.PAIR_VARIABLES if n in cols]
    out: dict[str, tuple] = {}
    if mode != "compact":
        for n in names:
            if n in want:
                out[n] = (S.PAIR, _scatter(cols, n, S.PAIR, labels, where),
                          {"description": S.DESCRIPTIONS[n]})
        return out
    groups = cols.pop("group").astype(str)
    for group, dims, prefix in (("sink", S.SINK_PAIR, ""), ("tail", S.TAIL, S.TAIL_PREFIX)):
        rows = {k: v[groups == group] for k, v in cols.items()}
        if group == "sink":
            rows[S.SINK] = rows[S.KEY]
        for n in names:
            if prefix + n in want:
                out[prefix + n] = (dims, _scatter({**rows, prefix + n: rows[n]}, prefix + n,
                                                  dims, labels, where),
                                   {"description": S.DESCRIPTIONS[prefix + n]})
    return out


def describe_import(manifest: dict) -> str:
    """One line for the CLI: what was imported."""
    rec = manifest.get("imported", {})
    n = len(entries(manifest))
    return (f"imported {manifest['n_sequences']} sequences in {len(manifest['shards'])} "
            f"shard(s), {n} faithfulness result(s); content hash {manifest['config_hash'][:16]}"
            + (" (without token strings)" if rec.get("no_text") else " (the source's)"))

