"""Checking a store: manifest, schema, checksums and completeness.

``validate(path)`` returns a list of problems (empty when the store is sound); it reads
every shard's bytes once for the checksum and opens each shard to check its layout.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..format.manifest import config_hash, coverage_problems, file_sha256, read_manifest
from attngeom.common.errors import StoreError
from ..format.packing import packing_problem, precision_of
from .results import check as check_results
from .results import entries as result_entries
from .results import result_file
from ..format.shards import layout_problem


def check_shard(path: Path, entry: dict, manifest: dict) -> list[str]:
    """Problems of one shard file: checksum, readability, layout (and the packing of its
    bounded variables), sequence range."""
    import h5netcdf

    if not path.is_file():
        return [f"{entry['file']}: missing"]
    if file_sha256(path) != entry.get("sha256"):
        return [f"{entry['file']}: checksum mismatch (damaged or altered)"]
    problems = []
    try:
        with h5netcdf.File(path, "r") as f:
            names = set(f.variables)
            why = layout_problem(manifest, {n: tuple(f.variables[n].dimensions) for n in names
                                            if n not in f.dimensions},
                                 {d: np.asarray(f.variables[d][:]) for d in f.dimensions
                                  if d in names})
            precision = precision_of(manifest["config"]["options"])
            why = why or next(filter(None, (packing_problem(
                precision, n, f.variables[n].dtype, f.variables[n].attrs) for n in names)), None)
            if why:
                problems.append(f"{entry['file']}: {why}")
            seq = np.asarray(f.variables["sequence"][:]) if "sequence" in names else None
            if f.attrs.get("attngeom_config_hash") != manifest["config_hash"]:
                problems.append(f"{entry['file']}: made with other settings (config hash)")
    except Exception as exc:  # noqa: BLE001 - any failure to parse the file means damage
        text = " ".join(str(exc).split())[:200] or type(exc).__name__
        return [f"{entry['file']}: unreadable ({text})"]
    lo, hi = entry["sequences"]
    if seq is None or not np.array_equal(seq, np.arange(lo, hi)):
        problems.append(f"{entry['file']}: sequence coordinate does not match [{lo}, {hi})")
    return problems


def outside(store: Path, path: Path) -> str | None:
    """Why ``path`` in ``store`` is not part of it (a symbolic link out of the store), or None.

    Such a store breaks when it is copied or sent: its files are elsewhere.
    """
    if not path.exists():
        return None
    target = path.resolve()
    if target.is_relative_to(store.resolve()):
        return None
    return (f"{path.relative_to(store)}: a symbolic link to {target}, outside the store; the "
            "store is not self-contained (a copy or archive of it lacks that file): replace "
            "the link by the file itself (cp --remove-destination TARGET LINK)")


def validate(path: str | Path) -> list[str]:
    """All problems found in the store at ``path`` (an empty list means valid)."""
    path = Path(path)
    try:
        manifest = read_manifest(path)
    except StoreError as exc:
        return [str(exc)]
    try:
        return _problems(path, manifest)
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        return [f"manifest: damaged ({type(exc).__name__}: {str(exc)[:80]}); restore it or "
                "re-extract"]


def _problems(path: Path, manifest: dict) -> list[str]:
    problems = []
    if config_hash(manifest["config"]) != manifest.get("config_hash"):
        problems.append("manifest: config does not match its config_hash (edited by hand?)")
    for entry in manifest["shards"]:
        if not isinstance(entry, dict) or not {"file", "sequences", "sha256"} <= set(entry):
            problems.append(f"manifest: malformed shard entry {str(entry)[:80]}")
            continue
        file = Path(str(entry["file"]))
        if file.is_absolute() or ".." in file.parts:
            problems.append(f"manifest: shard path {file} leaves the store; refusing")
            continue
        problems += filter(None, [outside(path, path / file)])
        problems += check_shard(path / file, entry, manifest)
    problems += coverage_problems(manifest, partial=not manifest["complete"])
    problems += check_results(path, manifest)          # faithfulness result files
    for entry in result_entries(manifest).values():
        try:
            problems += filter(None, [outside(path, result_file(path, entry))])
        except StoreError:
            pass                                       # reported by check_results
    if not manifest["complete"]:
        problems.append("store is incomplete (the extraction did not finish); rerun it to resume")
    return problems
