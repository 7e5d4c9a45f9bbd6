"""Faithfulness results kept inside a store (``<name>.nc`` next to ``shards/``).

``attngeom faithfulness --out STORE`` writes one netCDF file per experiment and records it
under ``manifest["faithfulness"][name]`` (file, sha256, config, config_hash). A store may
hold only such results (``manifest["kind"] == "faithfulness"``: no shards, no extraction
options). This module lets info, validate, subset, merge and export carry them: they are
whole-experiment results (their own sequences and data), never cut or re-indexed.
"""

from __future__ import annotations

from pathlib import Path

from ..format.manifest import file_sha256
from attngeom.common.errors import StoreError

FAITH_ONLY = "faithfulness"


def entries(manifest: dict) -> dict[str, dict]:
    """The store's faithfulness results by name (empty when none)."""
    found = manifest.get("faithfulness") or {}
    return {str(k): v for k, v in found.items() if isinstance(v, dict)}


def is_faith_only(manifest: dict) -> bool:
    """True for a store that holds faithfulness results and no extraction."""
    return manifest.get("kind") == FAITH_ONLY or "mode" not in manifest["config"].get(
        "options", {})


def result_entry(manifest: dict, name: str) -> dict | None:
    """The manifest's record of result ``name`` (file, sha256, config, ...), or None."""
    return entries(manifest).get(name)


def recorded_sha256(manifest: dict, name: str) -> str | None:
    """The sha256 the manifest records for result ``name`` (None when not recorded)."""
    found = result_entry(manifest, name)
    return None if found is None else found.get("sha256")


def result_file(store: str | Path, entry: dict) -> Path:
    """The path of a recorded result file; StoreError when the record points outside."""
    name = Path(str(entry.get("file", "")))
    if name.is_absolute() or ".." in name.parts or not name.parts:
        raise StoreError(f"{store}: faithfulness file {name} leaves the store; refusing")
    return Path(store) / name


def verified_file(store: str | Path, manifest: dict, name: str) -> tuple[Path | None, str]:
    """The file of result ``name`` and ``""`` when it is recorded, present and matches its
    checksum; otherwise why: ``"not recorded"`` (the path is None then), ``"missing"`` or
    ``"checksum mismatch"``."""
    found = result_entry(manifest, name)
    if found is None:
        return None, "not recorded"
    path = result_file(store, found)
    if not path.is_file():
        return path, "missing"
    if file_sha256(path) != found.get("sha256"):
        return path, "checksum mismatch"
    return path, ""


def check(store: str | Path, manifest: dict) -> list[str]:
    """Problems of the recorded faithfulness files: missing, or checksum mismatch."""
    store, problems = Path(store), []
    for name, entry in entries(manifest).items():
        try:
            path = result_file(store, entry)
        except StoreError as exc:
            problems.append(str(exc))
            continue
        if not path.is_file():
            problems.append(f"faithfulness result '{name}': {path.name} missing")
        elif file_sha256(path) != entry.get("sha256"):
            problems.append(f"faithfulness result '{name}': {path.name} checksum mismatch "
                            "(damaged or altered); rerun attngeom faithfulness with --force")
    return problems


def describe(entry: dict) -> str:
    """One line: file, task, granularity, metrics, fractions, units."""
    cfg = entry.get("config") or {}
    o, d = cfg.get("options") or {}, cfg.get("data") or {}
    fractions = ",".join(f"{f:g}" for f in o.get("fractions") or [])
    return (f"{entry.get('file')}: task {d.get('task', o.get('task', '?'))}, granularity "
            f"{o.get('granularity', '?')}, {len(o.get('metrics') or [])} metrics, fractions "
            f"{fractions}, {d.get('n_units', '?')} units of {Path(str(d.get('spec'))).name}"
            f"{', drift pass' if o.get('drift') else ''}, sha256 {str(entry.get('sha256'))[:16]}")


def conflict(sources: list[tuple[Path, dict]]) -> str | None:
    """A one-line reason when two inputs hold different results under one name, else None."""
    seen: dict[str, tuple[Path, dict]] = {}
    for store, manifest in sources:
        for name, entry in entries(manifest).items():
            if name in seen and seen[name][1].get("sha256") != entry.get("sha256"):
                return (f"{seen[name][0]} and {store} hold different faithfulness results "
                        f"named '{name}'; keep one (rerun attngeom faithfulness with another "
                        "--name) before merging")
            seen.setdefault(name, (store, entry))
    return None


def readme_lines(store: str | Path | None, manifest: dict) -> list[str]:
    """README.txt section: each result file, and its variables read from the file itself."""
    found = entries(manifest)
    if not found:
        return []
    lines = ["Faithfulness results (attngeom faithfulness: keys ranked by each metric are",
             "removed from the head outputs, alpha_ij v~_j left out without renormalizing;",
             "comprehensiveness removes the top fraction p, sufficiency the bottom one)"]
    for entry in found.values():
        lines.append(f"  {describe(entry)}")
        lines += [f"      {line}" for line in _file_variables(store, entry)]
    lines += ["  Open one with: xr.open_dataset('path/to/store/<file>.nc', engine='h5netcdf');",
              "  its attribute loss_variable names the per-unit loss (larger = more damage)."]
    return lines


def _file_variables(store, entry: dict) -> list[str]:
    """'name (dims): description' for every variable of a result file (empty if unreadable)."""
    import h5netcdf

    if store is None:
        return []
    try:
        with h5netcdf.File(result_file(store, entry), "r") as f:
            return [f"{n} ({', '.join(v.dimensions)}): {v.attrs['description']}"
                    for n, v in f.variables.items()
                    if n not in f.dimensions and v.attrs.get("description")]
    except (OSError, StoreError, ValueError):
        return []
