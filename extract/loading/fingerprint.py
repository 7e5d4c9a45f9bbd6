"""The weight fingerprint recorded in a store's config, and a cache of it per model directory.

The fingerprint (its definition is fixed: every store records it, and it is part of the store's
content hash) hashes each state-dict entry's name, shape, dtype, a strided sample of its values
and the float64 sum of its values. Computing it is the slowest step of loading a small model
after the weights themselves, so it is

- computed without a fresh float64 copy per weight: each weight is copied into one reused
  float64 buffer and summed there (the same values in the same order as ``p.double().sum()``,
  so the same bits), and once per shared tensor (tied embeddings);
- remembered, for a model loaded from a local directory, in the attngeom cache
  (``fingerprints/``) under a key naming every file of the directory with its size and
  modification time, the dtype, the device, torch's thread count and the torch and
  transformers versions (everything the value can depend on); any change recomputes it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

from attngeom.common.errors import StoreWriteError
from attngeom.common.atomic import atomic_write_bytes

if TYPE_CHECKING:
    import torch


def weight_fingerprint(model: "torch.nn.Module") -> str:
    """Hash of every parameter's name, shape and a strided sample of its values."""
    import torch

    h = hashlib.sha256()
    state = model.state_dict()
    buffers: dict = {}                                 # device -> reused float64 buffer
    sums: dict = {}                                    # one sum per shared tensor
    biggest = max((p.numel() for p in state.values()), default=0)
    for name, p in sorted(state.items()):
        flat = p.detach().reshape(-1)
        step = max(1, flat.numel() // 4096)
        sample = flat[::step].float().cpu().numpy().tobytes()
        h.update(f"{name}:{tuple(p.shape)}:{p.dtype}:".encode() + sample)
        key = (p.data_ptr(), p.dtype, tuple(p.shape), p.stride(), str(p.device))
        if key not in sums:
            sums[key] = repr(float(_double_sum(flat, buffers, biggest, torch)))
        h.update(sums[key].encode())
    return h.hexdigest()


def _double_sum(flat: "torch.Tensor", buffers: dict, size: int, torch) -> "torch.Tensor":
    """``flat.double().sum()``, computed in a reused float64 buffer (same values, same order)."""
    if flat.dtype == torch.float64 or flat.is_complex() or flat.dtype == torch.bool:
        return flat.double().sum()
    buf = buffers.get(flat.device)
    if buf is None:
        buf = buffers[flat.device] = torch.empty(size, dtype=torch.float64, device=flat.device)
    out = buf[: flat.numel()]
    out.copy_(flat)
    return out.sum()


def cache_key(directory: Path, dtype: str, device: str, tower: str | None) -> dict | None:
    """What a directory's fingerprint depends on; None when it cannot be listed."""
    import torch
    import transformers

    try:
        files = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns)
                       for p in Path(directory).iterdir() if p.is_file())
    except OSError:
        return None
    return {"directory": str(Path(directory).resolve()), "files": files, "dtype": dtype,
            "device": str(device), "tower": tower, "threads": torch.get_num_threads(),
            "torch": torch.__version__, "transformers": transformers.__version__}


def cached_fingerprint(model: "torch.nn.Module", directory: Path | None, cache: Path,
                       dtype: str, device: str, tower: str | None = None) -> str:
    """The model's fingerprint, remembered under ``cache`` for a model loaded from
    ``directory`` (None: a hub id, never cached)."""
    key = cache_key(directory, dtype, device, tower) if directory is not None else None
    if key is None:
        return weight_fingerprint(model)
    key = json.loads(json.dumps(key))                  # tuples -> lists, as read back
    note = cache / "fingerprints" / (hashlib.sha256(json.dumps(
        key, sort_keys=True).encode()).hexdigest()[:32] + ".json")
    try:
        saved = json.loads(note.read_text(encoding="utf-8"))
        if saved.get("key") == key and isinstance(saved.get("weight_fingerprint"), str):
            return saved["weight_fingerprint"]
    except (OSError, ValueError, AttributeError):
        pass
    digest = weight_fingerprint(model)
    try:
        atomic_write_bytes(note, json.dumps({"key": key, "weight_fingerprint": digest}).encode())
    except StoreWriteError:                            # a read-only cache still loads
        pass
    return digest
