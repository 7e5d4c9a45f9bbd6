"""The weight fingerprint: its fixed definition (computed naively here) and its cache."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tiny_models  # noqa: E402

from attngeom.extract.loading import fingerprint as fp# noqa: E402
from attngeom.extract.loading.models import load  # noqa: E402


def naive_fingerprint(model) -> str:
    """The definition every store records, written the plain way (a float64 copy per weight)."""
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        flat = p.detach().reshape(-1)
        step = max(1, flat.numel() // 4096)
        h.update(f"{name}:{tuple(p.shape)}:{p.dtype}:".encode()
                 + flat[::step].float().cpu().numpy().tobytes())
        h.update(repr(float(flat.double().sum())).encode())
    return h.hexdigest()


@pytest.mark.parametrize("arch", ["llama", "gemma3", "gpt2"])   # gemma3: tied embeddings
def test_fingerprint_is_the_naive_definition(arch):
    model = tiny_models.build(arch)
    assert fp.weight_fingerprint(model) == naive_fingerprint(model)


def test_fingerprint_of_large_weights_and_other_dtypes():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(700, 900), torch.nn.Linear(900, 3))
    model.register_buffer("steps", torch.arange(5))          # an integer buffer
    assert fp.weight_fingerprint(model) == naive_fingerprint(model)
    half = model.to(torch.bfloat16)
    assert fp.weight_fingerprint(half) == naive_fingerprint(half)


def test_fingerprint_is_cached_per_directory_and_recomputed_on_change(tmp_path, monkeypatch):
    where = tiny_models.save_tiny("llama", tmp_path / "m")
    monkeypatch.setenv("ATTNGEOM_CACHE", str(tmp_path / "cache"))
    first = load(str(where)).info["weight_fingerprint"]
    assert first == naive_fingerprint(load(str(where)).model)
    assert list((tmp_path / "cache" / "fingerprints").glob("*.json"))

    def computing(model):
        raise AssertionError("the remembered fingerprint should have been used")

    monkeypatch.setattr(fp, "weight_fingerprint", computing)
    assert load(str(where)).info["weight_fingerprint"] == first
    weights = next(where.glob("*.safetensors"))
    st = weights.stat()
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    with pytest.raises(AssertionError, match="remembered"):
        load(str(where))
