"""The store manifest: provenance, identity hash, and the list of finished shards.

The manifest is JSON (never pickle), written atomically, and parsed with a size limit.
``config`` holds everything that determines the numbers (model, weights, data, options);
two runs with equal ``config`` produce the same store, and resuming or merging requires it.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from .schema import FORMAT_NAME, SCHEMA_VERSION

MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 64 * 1024 * 1024


class StoreError(ValueError):
    """A store that cannot be used as asked: the message names the problem and the fix."""


def canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def config_hash(config: dict) -> str:
    """Content hash of the canonical config: same inputs and options, same hash."""
    return hashlib.sha256(canonical(config).encode()).hexdigest()


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def file_sha256(path: str | Path, block: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write via a temporary file, fsync, rename: readers see the old or the new file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(path: str | Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def new_manifest(config: dict, n_sequences: int, extra: dict | None = None) -> dict:
    return {
        "format": FORMAT_NAME,
        "schema_version": SCHEMA_VERSION,
        "config": config,
        "config_hash": config_hash(config),
        "n_sequences": n_sequences,
        "shards": [],
        "complete": False,
        "created": now(),
        "updated": now(),
        **(extra or {}),
    }


def write_manifest(store: str | Path, manifest: dict) -> None:
    manifest = dict(manifest, updated=now())
    data = json.dumps(manifest, indent=1, sort_keys=True).encode()
    atomic_write_bytes(Path(store) / MANIFEST, data)


def read_manifest(store: str | Path) -> dict:
    """Parse and check a store's manifest; raise StoreError with a one-line reason."""
    path = Path(store) / MANIFEST
    if not Path(store).is_dir():
        raise StoreError(f"{store}: not a store directory (expected a folder with {MANIFEST})")
    if not path.is_file():
        raise StoreError(f"{store}: no {MANIFEST}; not an attngeom store or never started")
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
    for key, kind in (("config", dict), ("shards", list), ("n_sequences", int)):
        if not isinstance(manifest.get(key), kind):
            raise StoreError(f"{path}: field '{key}' missing or not a {kind.__name__}")
    return manifest


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
