"""Result files of a store (``attngeom faithfulness``): computed in blocks under
``<name>.partial/``, then recorded as ``<name>.nc`` with its sha256 in the manifest.

    partial = open_partial(out, name, config, force=force)   # None: already complete
    partial.write_block(ds, start, stop) / partial.read_block(start, stop)
    record_result(out, name, ds, config, versions, partial)
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import xarray as xr

from ..format.manifest import (MANIFEST, canonical, config_difference, config_hash, file_sha256,
                               now, read_manifest, write_manifest)
from attngeom.common.errors import StoreError
from .readme import write_readme
from .results import entries
from attngeom.common.atomic import atomic_write_bytes
from .writer import Log, remove_temporaries, results_manifest, write_netcdf


# ------------------------------------------------------------------ result files
RESULT_ENCODING = {"zlib": True, "complevel": 4}


def result_path(out: str | Path, name: str) -> Path:
    return Path(out) / f"{name}.nc"


def _write_result(ds: xr.Dataset, path: Path) -> None:
    write_netcdf(ds, path, {n: dict(RESULT_ENCODING) for n, v in ds.data_vars.items()
                            if v.dtype != object and v.ndim > 0})


class Partial:
    """The finished blocks of a result being computed: ``<out>/<name>.partial/``.

    Each block of units ``[start, stop)`` is one netCDF file written atomically; the run's
    config is kept in ``config.json``. A block that cannot be read is recomputed.
    """

    def __init__(self, path: Path):
        self.path = Path(path)

    def _block(self, start: int, stop: int) -> Path:
        return self.path / f"block-{start:07d}-{stop:07d}.nc"

    def finished(self) -> list[tuple[int, int]]:
        """(start, stop) of the blocks written so far, in order."""
        return sorted(tuple(int(x) for x in p.stem.split("-")[1:])
                      for p in self.path.glob("block-*-*.nc"))

    def write_block(self, ds: xr.Dataset, start: int, stop: int) -> None:
        _write_result(ds, self._block(start, stop))

    def read_block(self, start: int, stop: int) -> xr.Dataset | None:
        """A finished block, or None (missing or unreadable: it is recomputed)."""
        path = self._block(start, stop)
        if not path.is_file():
            return None
        try:
            with xr.open_dataset(path, engine="h5netcdf") as f:
                return f.load()
        except (OSError, ValueError):
            path.unlink(missing_ok=True)
            return None

    def discard(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def open_partial(out: str | Path, name: str, config: dict, force: bool = False,
                 log: Log = print) -> Partial | None:
    """Where to compute the result ``<out>/<name>.nc`` of ``config``: the blocks an
    interrupted run of the same config left, or a new partial folder; None when the result
    is complete already (recorded with this config and checksum).

    Raises StoreError for a store of another model, a result of other settings (unless
    ``force``), an interrupted run of other settings (unless ``force``), or a folder that is
    neither a store nor empty.
    """
    out = Path(out)
    final, partial = result_path(out, name), Partial(out / f"{name}.partial")
    if out.is_dir():
        remove_temporaries(out)
    if (out / MANIFEST).exists():
        if _complete(out, name, config, force, log):
            partial.discard()                     # a run killed after its manifest left it
            return None
    elif out.exists() and set(p.name for p in out.iterdir()) - {final.name, partial.path.name}:
        raise StoreError(f"{out} exists and is not an attngeom store; choose an empty --out")
    saved = partial.path / "config.json"
    if partial.path.exists():
        try:
            old = json.loads(saved.read_text()) if saved.is_file() else None
        except (OSError, UnicodeDecodeError, ValueError):
            old = None                             # damaged: start the partial run over
        if old is not None and canonical(old) == canonical(config) and not force:
            done = partial.finished()
            log(f"attngeom: resuming an interrupted run ({len(done)} block(s) done, "
                f"{sum(b - a for a, b in done)} unit(s))")
        elif old is None or force:
            partial.discard()
        else:
            raise StoreError(f"{partial.path}: an interrupted run with other settings "
                             f"({config_difference(old, config)}); rerun it with its options, "
                             "or pass --force to discard it")
    if not saved.is_file():
        atomic_write_bytes(saved, json.dumps(config, sort_keys=True).encode())
    return partial


def _complete(out: Path, name: str, config: dict, force: bool, log: Log) -> bool:
    """True when ``out``'s manifest records result ``name`` of ``config`` and its file is intact."""
    manifest = read_manifest(out)
    had = manifest["config"].get("model", {}).get("weight_fingerprint")
    if had and had != config["model"]["weight_fingerprint"]:
        other = manifest["config"]["model"].get("id")
        raise StoreError(f"{out} holds results of another model ({other}); use another --out")
    entry = entries(manifest).get(name)
    final = result_path(out, name)
    if not entry or not final.is_file() or force:
        return False
    if canonical(entry["config"]) == canonical(config) and file_sha256(final) == entry["sha256"]:
        log(f"attngeom: {final} is already complete with these settings")
        return True
    diff = config_difference(entry["config"], config) or "checksum"
    raise StoreError(f"{final} exists with other settings ({diff}); pass --force to "
                     "replace it, or --name to keep both")


def record_result(out: str | Path, name: str, ds: xr.Dataset, config: dict, versions: dict,
                  partial: Partial | None = None) -> Path:
    """Write the result ``<out>/<name>.nc``, record it in the manifest (a results-only store
    is made when ``out`` is not a store yet), rewrite README.txt, discard ``partial``."""
    out = Path(out)
    final = result_path(out, name)
    _write_result(ds, final)
    entry = {"file": final.name, "sha256": file_sha256(final), "config": config,
             "config_hash": config_hash(config), "created": now(),
             "versions": versions}
    if (out / MANIFEST).exists():
        manifest = read_manifest(out)
    else:
        manifest = results_manifest(config["model"], config["data"], config["options"],
                                     {"versions": versions})
        manifest["complete"] = True             # holds no extraction shards, by design
    manifest.setdefault("faithfulness", {})[name] = entry
    write_manifest(out, manifest)
    write_readme(out, manifest)                 # README.txt now lists this result too
    if partial is not None:
        partial.discard()
    return final
