"""The store manifest: provenance, identity hash, and the list of finished shards.

The manifest is JSON (never pickle), written atomically, and parsed with a size limit.
``config`` holds everything that determines the numbers (model, weights, data, options);
two runs with equal ``config`` produce the same store, and resuming or merging requires it.
"""

from __future__ import annotations

import copy
import datetime as _dt
import hashlib
import json
from pathlib import Path
from typing import Any

from attngeom.common.errors import StoreError
from attngeom.common.atomic import atomic_write_bytes
from .schema import FORMAT_NAME, SCHEMA_VERSION

MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 64 * 1024 * 1024


def canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def config_hash(config: dict) -> str:
    """Content hash of the canonical config: same inputs and options, same hash."""
    return hashlib.sha256(canonical(config).encode()).hexdigest()


def spec_label(spec: str | Path) -> str:
    """A model or data spec without machine-specific folders: a local path keeps its name.

    The content is identified by hashes (weight fingerprint, data sha256), so configs (and
    their hashes) are the same on every machine and in every folder.
    """
    path = Path(str(spec)).expanduser()
    return path.resolve().name if path.exists() else str(spec)


def portable(record: dict, *keys: str) -> dict:
    """A copy of ``record`` whose specs under ``keys`` are :func:`spec_label` s (None stays)."""
    return {k: spec_label(v) if k in keys and v is not None else v for k, v in record.items()}


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def file_sha256(path: str | Path, block: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()


def new_manifest(config: dict, n_sequences: int, extra: dict | None = None,
                 complete: bool = False) -> dict:
    """A store's manifest before any shard is written (``complete``: a measurement held in
    memory, whose every sequence is already measured)."""
    return {
        "format": FORMAT_NAME,
        "schema_version": SCHEMA_VERSION,
        "config": config,
        "config_hash": config_hash(config),
        "n_sequences": n_sequences,
        "shards": [],
        "complete": complete,
        "created": now(),
        "updated": now(),
        **(extra or {}),
    }


def write_manifest(store: str | Path, manifest: dict) -> None:
    manifest = dict(manifest, updated=now())
    data = json.dumps(manifest, indent=1, sort_keys=True).encode()
    atomic_write_bytes(Path(store) / MANIFEST, data)


def read_manifest(store: str | Path) -> dict:
    """Parse and check a store's manifest.

    Parameters
    ----------
    store : str or Path
        The store directory.

    Returns
    -------
    dict
        The manifest.

    Raises
    ------
    StoreError
        With a one-line reason when it is missing, unreadable or of another format.
    """
    path = Path(store) / MANIFEST
    if not Path(store).is_dir():
        raise StoreError(f"{store}: not a store directory (expected a folder with {MANIFEST})")
    if not path.is_file():
        raise StoreError(f"{store}: no {MANIFEST}; not an attngeom store or never started")
    return parse_manifest(path, store)


def parse_manifest(path: Path, store: str | Path) -> dict:
    """Parse and check the manifest file ``path`` (of ``store``, named in errors)."""
    if path.stat().st_size > MAX_MANIFEST_BYTES:
        raise StoreError(f"{path}: manifest larger than {MAX_MANIFEST_BYTES} bytes; refusing")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StoreError(f"{path}: damaged manifest ({exc}); re-extract or restore it") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        raise StoreError(f"{path}: not an attngeom manifest")
    version = manifest.get("schema_version")
    if version != SCHEMA_VERSION:
        raise StoreError(f"{store}: schema version {version!r}, this attngeom reads "
                         f"{SCHEMA_VERSION}; use the matching attngeom release")
    for key, kind in (("config", dict), ("shards", list), ("n_sequences", int),
                      ("complete", bool), ("config_hash", str)):
        if not isinstance(manifest.get(key), kind):
            raise StoreError(f"{path}: field '{key}' missing or not a {kind.__name__}; "
                             "damaged manifest: re-extract or restore it")
    for entry in manifest["shards"]:
        check_shard_entry(path, entry)
    return manifest


def read_complete(store: str | Path) -> dict:
    """:func:`read_manifest` of a store that is complete and whose shards cover its
    sequences (StoreError otherwise)."""
    manifest = read_manifest(store)
    if not manifest["complete"]:
        raise StoreError(f"{store}: incomplete store; finish it (rerun its extract command) first")
    check_coverage(store, manifest)
    return manifest


def coverage_problems(manifest: dict, partial: bool = False) -> list[str]:
    """Where the shards' sequence ranges disagree with the manifest's sequences (its part's,
    for a part of ``extract --part I/N``): overlaps, ranges past the end and, unless
    ``partial`` (a store still being written), gaps."""
    start, stop = (manifest.get("part") or {}).get("sequences", [0, manifest["n_sequences"]])
    problems, expected = [], start
    for lo, hi in sorted(tuple(e["sequences"]) for e in manifest["shards"]):
        if lo < expected:
            problems.append(f"sequences [{lo}, {min(hi, expected)}) are in two shards or "
                            f"before the first sequence {start}")
        elif lo > expected and not partial:
            problems.append(f"sequences [{expected}, {lo}) are in no shard")
        expected = max(expected, hi)
    if expected > stop:
        problems.append(f"shards hold sequences up to {expected}, past the {stop} the "
                        "manifest records")
    elif expected < stop and not partial:
        problems.append(f"sequences [{expected}, {stop}) are in no shard")
    return problems


def check_coverage(store: str | Path, manifest: dict, partial: bool = False) -> None:
    """StoreError (one line) when the shards do not cover the manifest's sequences."""
    problems = coverage_problems(manifest, partial)
    if problems:
        raise StoreError(f"{store}: the manifest disagrees with its shards ({problems[0]}); "
                         f"run `attngeom store validate {store}`, then restore the manifest or "
                         "re-extract")


def check_shard_entry(path: Path, entry: Any) -> None:
    """StoreError unless ``entry`` is ``{"file": relative path in shards/, "sequences": [lo, hi],
    "sha256": str, ...}``: a manifest never points outside its store."""
    ok = isinstance(entry, dict) and isinstance(entry.get("file"), str) \
        and isinstance(entry.get("sha256"), str) and isinstance(entry.get("sequences"), list) \
        and len(entry["sequences"]) == 2 \
        and all(type(v) is int and v >= 0 for v in entry["sequences"]) \
        and entry["sequences"][0] < entry["sequences"][1]
    if not ok:
        raise StoreError(f"{path}: malformed shard entry {str(entry)[:80]}; damaged manifest: "
                         "re-extract or restore it")
    file = Path(entry["file"])
    if file.is_absolute() or ".." in file.parts or file.parts[:1] != ("shards",):
        raise StoreError(f"{path}: shard path {str(file)[:80]} leaves the store's shards/ folder; "
                         "refusing to read it")


def without_text(config: dict, no_text: bool = True) -> dict:
    """A copy of ``config``; with ``no_text``, of a store without token strings."""
    config = copy.deepcopy(config)
    if no_text:
        config["options"]["store_text"] = False
    return config


def carried(source: dict, *also: str) -> dict:
    """What a store made from another (merged, cut, saved, imported) keeps of that store's
    manifest ``source``: its provenance (``versions``, ``sources`` and the keys ``also``) and
    its count of the empty texts skipped."""
    kept = {k: source[k] for k in ("versions", "sources", *also) if k in source}
    kept["counts"] = {"skipped_empty": source.get("counts", {}).get("skipped_empty", 0)}
    return kept


def config_difference(a: dict, b: dict, prefix: str = "") -> str | None:
    """First differing key path between two configs, as 'path: a != b', or None."""
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key), b.get(key)
        if isinstance(va, dict) and isinstance(vb, dict):
            diff = config_difference(va, vb, f"{prefix}{key}.")
            if diff:
                return diff
        elif va != vb:
            return f"{prefix}{key}: {va!r} != {vb!r}"
    return None
