"""Writing stores: the one module that creates, fills and finishes a store folder.

A store folder holds ``manifest.json``, ``shards/shard-NNNNN.nc``, ``README.txt`` and result
files ``<name>.nc`` (faithfulness) with, while one is computed, ``<name>.partial/``. Every
file is written under a temporary name, fsynced and renamed, so a file with its final name is
always whole; each shard and result file is recorded in the manifest with its sha256 after
it is written. A rerun removes the temporaries an interrupted run left.

Extraction, merge and subset::

    writer = StoreWriter.create(out, config, n_sequences, extra)   # new, or resumed
    done = writer.finished()             # first sequence of every verified shard
    writer.add_shard(ds, index)          # one block of sequences as a Dataset
    with writer.streamed_shard(ds, index, layout) as stream:   # or written as it is measured
        ...; stream.complete(ds)
    writer.finish()                      # counts, complete, manifest.json, README.txt

Result files (``attngeom faithfulness``): :mod:`attngeom.store.io.result_files`.

Files outside a store (analysis results, exports): :func:`write_netcdf` here, and the atomic
files of :mod:`attngeom.common.atomic` (``atomic_write_bytes``, ``copy_file``, ``atomic_file``
for a writer that streams into a file of its own).
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np
import xarray as xr

from ..format import schema as S
from ..format.chunks import Encoded
from ..format.manifest import (MANIFEST, config_difference, file_sha256, new_manifest,
                               read_manifest, write_manifest)
from attngeom.common.errors import Refusal, StoreError, write_error
from attngeom.common.atomic import (atomic_file, atomic_write_bytes, copy_file, fsync_dir,
                                    temporary_name)
from ..format.packing import precision_of, stored_dataset
from .readme import write_readme
from .results import FAITH_ONLY, entries, result_file
from ..format.shards import (SHARD_DIR, layout_problem, netcdf_bytes, shard_attrs, shard_name,
                     write_shard)
from ..format.stream import ShardStream

Log = Callable[[str], None]


# ------------------------------------------------------------------ files
def write_netcdf(ds: xr.Dataset, path: str | Path, encoding: dict | None = None) -> None:
    """Write ``ds`` as netCDF4/HDF5 (h5netcdf) to ``path`` atomically and fsynced.

    Built in memory first: a failed write (disk full, read-only folder) raises
    StoreWriteError naming ``path`` and leaves nothing behind.
    """
    atomic_write_bytes(path, netcdf_bytes(ds, encoding))


def remove_temporaries(folder: str | Path) -> int:
    """Delete the temporary files (``.NAME.tmp-PID``) an interrupted run left; return how many."""
    n = 0
    for pattern in (f"{SHARD_DIR}/.*.tmp-*", ".*.tmp-*", "*.partial/.*.tmp-*"):
        for tmp in Path(folder).glob(pattern):
            tmp.unlink(missing_ok=True)
            n += 1
    return n


def _check_new(path: Path, inputs: Iterable[str | Path], config: dict) -> None:
    """Refuse an output that is an input or a folder of something else; clear what an
    interrupted run of the same operation (same config, never completed) left there."""
    if any(path.resolve() == Path(s).resolve() for s in inputs):
        raise StoreError(f"--out {path} is one of the input stores; choose a new directory")
    if not path.exists() or (path.is_dir() and _only_temporaries(path)):
        return
    if path.is_dir() and _interrupted(path, config):
        shutil.rmtree(path)
        return
    raise StoreError(f"--out {path} exists and is not empty; choose a new directory")


def _interrupted(path: Path, config: dict) -> bool:
    """``path`` holds a store of ``config`` whose writing never completed."""
    try:
        manifest = read_manifest(path)
    except (StoreError, OSError, ValueError):
        return False
    return not manifest.get("complete") and not config_difference(manifest["config"], config)


def _only_temporaries(folder: Path) -> bool:
    return all(p.name.startswith(".") and ".tmp-" in p.name for p in folder.iterdir())


# ------------------------------------------------------------------ stores
class StoreWriter:
    """A store being written; its manifest is rewritten after every shard.

    Make one with :meth:`create` (extraction: a new store, or the one an interrupted run of the
    same config left) or :meth:`new` (merge, subset, import: a new, empty folder, or one an interrupted run of the same
    operation left, started over).
    """

    def __init__(self, path: Path, manifest: dict):
        self.path, self.manifest = Path(path), manifest
        self.attrs = shard_attrs(manifest) if "mode" in manifest["config"]["options"] else {}
        self.precision = precision_of(manifest["config"]["options"])

    @classmethod
    def create(cls, path: str | Path, config: dict, n_sequences: int, extra: dict | None = None,
               log: Log | None = None) -> "StoreWriter":
        """Resume the store at ``path`` made with ``config``, or start it there.

        Raises StoreError when ``path`` is a store of another config, or a folder that is not a
        store and not empty.
        """
        path = Path(path)
        if (path / MANIFEST).exists():
            manifest = read_manifest(path)
            diff = config_difference(manifest["config"], config)
            if diff:
                raise StoreError(f"{path} was made with other settings ({diff}); "
                                 "use another --out or the original options")
            removed = remove_temporaries(path)
            if removed and log:
                log(f"attngeom: removed {removed} temporary file(s) of an interrupted run")
            return cls(path, manifest)
        if path.exists() and not path.is_dir():
            raise StoreError(f"{path} is a file; choose a folder for --out")
        if path.exists() and not _only_temporaries(path):
            raise StoreError(f"{path} exists and is not an attngeom store; choose an empty --out")
        return cls._start(path, new_manifest(config, n_sequences, extra))

    @classmethod
    def new(cls, path: str | Path, config: dict, n_sequences: int, extra: dict | None = None,
            inputs: Iterable[str | Path] = ()) -> "StoreWriter":
        """Start a store in the new or empty folder ``path`` (never one of ``inputs``)."""
        _check_new(Path(path), inputs, config)
        return cls._start(Path(path), new_manifest(config, n_sequences, extra))

    @classmethod
    def _start(cls, path: Path, manifest: dict) -> "StoreWriter":
        if path.exists():
            remove_temporaries(path)                 # of a run killed while creating it
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise write_error(path, exc) from exc
        write_manifest(path, manifest)
        return cls(path, manifest)

    @property
    def config_hash(self) -> str:
        return self.manifest["config_hash"]

    @property
    def sequences_done(self) -> int:
        """Sequences in the recorded shards."""
        return sum(hi - lo for lo, hi in (e["sequences"] for e in self.manifest["shards"]))

    def finished(self) -> set[int]:
        """First sequence of every recorded shard whose file exists with its checksum; the
        others are forgotten (their sequences are extracted again)."""
        done = set()
        for entry in self.manifest["shards"]:
            path = self.path / entry["file"]
            if path.is_file() and file_sha256(path) == entry["sha256"]:
                done.add(entry["sequences"][0])
        self.manifest["shards"] = [e for e in self.manifest["shards"]
                                   if e["sequences"][0] in done]
        return done

    def add_shard(self, ds: xr.Dataset, index: int,
                  encoded: Mapping[str, Encoded] | None = None) -> dict:
        """Write ``ds`` (one block of sequences, numbered as in the store) as shard ``index``.

        The shard gets the store's attributes and precision (:func:`attngeom.store.format.packing.
        stored_dataset`); its layout is checked against the manifest first (ValueError naming
        the difference). ``encoded``: variables whose chunks are compressed already, stored
        form (:func:`attngeom.store.format.shards.write_shard`). Returns the entry.
        """
        encoded = dict(encoded or {})
        ds = self._prepared(ds, index, encoded)
        name = shard_name(index)
        write_shard(ds, self.path / name, encoded)
        return self._record_shard(ds, name)

    @contextlib.contextmanager
    def streamed_shard(self, ds: xr.Dataset, index: int, layout: Mapping[str, Encoded],
                       workers: tuple[int, int] = (0, 1)) -> Iterator[ShardStream]:
        """Shard ``index`` written while it is measured: a
        :class:`~attngeom.store.format.stream.ShardStream` laid out from ``ds`` (the shard's
        Dataset with placeholder per-sequence values, checked as :meth:`add_shard` checks)
        and ``layout`` (the measured variables, :func:`~attngeom.store.format.stream.
        measured_layout`), under its temporary name. The block must end with the stream's
        ``complete(ds)``; then the file is renamed into place and recorded. A block that
        raises leaves no file and no entry. ``workers``: (threads compressing while the model
        measures, threads otherwise), as :class:`~attngeom.store.format.chunks.ChunkEncoder`
        takes them."""
        ds = self._prepared(ds, index, layout)
        name = shard_name(index)
        during, after = workers
        with atomic_file(self.path / name) as tmp:
            with ShardStream(tmp, ds, layout, during or after, during > 0) as stream:
                yield stream
            if stream.result is None:
                raise ValueError(f"shard {index}: the stream ended before it was complete")
        self._record_shard(stream.result, name)

    def _prepared(self, ds: xr.Dataset, index: int, encoded: Mapping[str, Encoded]
                  ) -> xr.Dataset:
        """``ds`` in the store's precision with its attributes, after its layout (with the
        ``encoded`` variables) is checked against the manifest."""
        ds = stored_dataset(ds, self.precision)
        dims = {n: v.dims for n, v in ds.data_vars.items()} | {n: e.dims
                                                               for n, e in encoded.items()}
        labels = {d: ds[d].values for d in ds.dims if d in ds.coords}
        why = layout_problem(self.manifest, dims, labels)
        if why:
            raise Refusal(f"shard {index} does not fit the store {self.path}: {why}")
        seq = np.asarray(ds[S.SEQUENCE].values)
        if not np.array_equal(seq, np.arange(int(seq[0]), int(seq[0]) + len(seq))):
            raise Refusal(f"shard {index}: sequences must be consecutive, got {seq[:5]}...")
        ds = ds.copy(deep=False)
        ds.attrs = dict(self.attrs)
        return ds

    def _record_shard(self, ds: xr.Dataset, name: str) -> dict:
        """Record the shard file ``name`` holding ``ds`` (its checksum, its counts)."""
        seq = np.asarray(ds[S.SEQUENCE].values)
        lo = int(seq[0])
        return self._record({"file": name, "sequences": [lo, lo + len(seq)],
                             "sha256": file_sha256(self.path / name),
                             "truncated": int(ds["truncated"].sum()),
                             "nonfinite": int((ds["finite"] == 0).sum())})

    def add_file(self, src: str | Path, entry: dict, index: int, copy: bool = False) -> dict:
        """Shard ``index`` is the file ``src`` of another store of the same config (recorded
        there as ``entry``), hard-linked (``copy``: copied) after its checksum is verified."""
        src = Path(src)
        if file_sha256(src) != entry["sha256"]:
            raise StoreError(f"{src}: checksum mismatch (damaged); run `attngeom store "
                             "validate` and re-extract that shard")
        name = shard_name(index)
        copy_file(src, self.path / name, link=not copy)
        return self._record(dict(entry, file=name))

    def _record(self, entry: dict) -> dict:
        self.manifest["shards"].append(entry)
        self.manifest["shards"].sort(key=lambda e: e["sequences"][0])
        write_manifest(self.path, self.manifest)
        return entry

    def finish(self, results: Sequence[tuple[Path, dict]] = ()) -> dict:
        """Copy the faithfulness results of ``results`` (store, manifest), count, mark the
        store complete, write manifest.json and README.txt; return the manifest."""
        found = _copy_results(self.path, results)
        if found:
            self.manifest["faithfulness"] = found
        shards = self.manifest["shards"]
        counts = self.manifest.setdefault("counts", {})
        counts["truncated"] = sum(e["truncated"] for e in shards)
        counts["nonfinite"] = sum(e["nonfinite"] for e in shards)
        self.manifest["complete"] = True
        write_manifest(self.path, self.manifest)
        write_readme(self.path, self.manifest)
        return self.manifest


def _copy_results(out: Path, sources: Sequence[tuple[Path, dict]]) -> dict[str, dict]:
    """Copy the result files of ``sources`` into ``out`` (checksums verified); a name held by
    several inputs is kept once (:func:`attngeom.store.io.results.conflict` refuses others)."""
    kept: dict[str, dict] = {}
    for store, manifest in sources:
        for name, entry in entries(manifest).items():
            if name in kept:
                continue
            src = result_file(store, entry)
            if not src.is_file() or file_sha256(src) != entry.get("sha256"):
                raise StoreError(f"{src}: faithfulness result missing or damaged; run "
                                 f"`attngeom store validate {store}`")
            copy_file(src, out / src.name)
            kept[name] = dict(entry)
    return kept


def results_only(path: str | Path, model: dict, data: dict, options: dict,
                 extra: dict | None = None, inputs: Iterable[str | Path] = ()) -> StoreWriter:
    """A new store for result files only (no shards; merge of results-only stores)."""
    manifest = results_manifest(model, data, options, extra)
    _check_new(Path(path), inputs, manifest["config"])
    return StoreWriter._start(Path(path), manifest)


def results_manifest(model: dict, data: dict, options: dict, extra: dict | None) -> dict:
    """The manifest of a store holding result files only: ``options`` identify them."""
    return new_manifest({"model": model, "data": data, "options": {"faithfulness": options}}, 0,
                        {"counts": {}, **(extra or {}), "kind": FAITH_ONLY})
