"""Out-of-memory batch halving, non-finite sequences, truncation and empty-text counts.

The forward pass (``attngeom.extract.measurement.batches.capture``) is replaced by one that raises CUDA's
out-of-memory error for batches above a size, or writes inf into one sequence's activations.
"""

from __future__ import annotations

import json
import warnings

import h5py
import numpy as np
import pytest

from attngeom.extract.measurement import batches as run_module
from attngeom.extract.run import ExtractConfig, extract
from store_helpers import write_texts

N_WORDS = (3, 9, 5, 1, 7)            # + BOS: text 1 (10 tokens) is cut at max_length 8
OPTIONS = dict(mode="compact", sink_k=1, tail_w=3, max_length=8, shard_size=2)


def shard_values(store) -> dict[str, np.ndarray]:
    """Every float variable of every shard file, concatenated along sequences (h5py)."""
    out: dict[str, list] = {}
    for path in sorted((store / "shards").glob("*.nc")):
        with h5py.File(path, "r") as f:
            for name, obj in f.items():
                if obj.dtype.kind in "fi" and obj.ndim and obj.shape[0] == f["sequence"].size:
                    out.setdefault(name, []).append(obj[()])
    return {k: np.concatenate(v) for k, v in out.items()}


@pytest.fixture(scope="module")
def data(rel_dir):
    return write_texts(rel_dir / "flags.jsonl", N_WORDS)


@pytest.fixture(scope="module")
def batch_one(tiny_model, data, rel_dir):
    """Shard values of a run at batch size 1 (no out-of-memory)."""
    extract(str(tiny_model), str(data), rel_dir / "batch-one",
            ExtractConfig(**OPTIONS, batch_size=1), progress=False)
    return shard_values(rel_dir / "batch-one")


def oom_above(limit: int, error):
    real = run_module.capture

    def measure(model, batch, opts, **kwargs):
        if len(batch["index"]) > limit:
            raise error
        return real(model, batch, opts, **kwargs)

    return measure


def test_what_counts_as_out_of_memory():
    import torch

    assert run_module.is_out_of_memory(torch.cuda.OutOfMemoryError("CUDA out of memory."))
    assert run_module.is_out_of_memory(RuntimeError("[enforce fail] out of memory on device"))
    assert not run_module.is_out_of_memory(RuntimeError("shape mismatch"))
    assert not run_module.is_out_of_memory(ValueError("out of memory"))


def test_out_of_memory_halves_the_batch(tiny_model, data, batch_one, tmp_path, monkeypatch,
                                        capsys):
    import torch

    exc = torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    monkeypatch.setattr(run_module, "capture", oom_above(1, exc))
    cfg = ExtractConfig(**OPTIONS, batch_size=4)
    extract(str(tiny_model), str(data), tmp_path / "halved", cfg, progress=False)
    log = capsys.readouterr().out
    assert "out of memory on cpu at batch size 4; continuing with batch size 2" in log
    assert "at batch size 2; continuing with batch size 1" in log
    assert log.count("out of memory") == 2       # batch size 1 kept for the later shards
    assert cfg.batch_size == 4                   # the config is not changed
    got, want = shard_values(tmp_path / "halved"), batch_one
    assert got.keys() == want.keys() and "alpha" in got
    for name in got:                               # every row measured exactly once, in order
        assert np.array_equal(got[name], want[name], equal_nan=True), name


def test_out_of_memory_at_batch_one_and_other_errors(tiny_model, data, tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(run_module, "capture", oom_above(0, torch.cuda.OutOfMemoryError("x")))
    with pytest.raises(MemoryError, match="at batch size 1; use a smaller --max-length"):
        extract(str(tiny_model), str(data), tmp_path / "a", ExtractConfig(**OPTIONS),
                progress=False)
    monkeypatch.setattr(run_module, "capture", oom_above(0, RuntimeError("shape mismatch")))
    with pytest.raises(RuntimeError, match="shape mismatch"):     # not retried
        extract(str(tiny_model), str(data), tmp_path / "b", ExtractConfig(**OPTIONS),
                progress=False)


def test_non_finite_sequence_is_flagged_and_excluded(tiny_model, data, tmp_path, monkeypatch):
    real, calls = run_module.capture, []

    def measure(model, batch, opts, each_layer=None):   # inf in the 2nd batch's first row
        calls.append(1)
        hit = len(calls) == 2
        if each_layer is None:                      # a batch measured whole (accelerators)
            arrays = real(model, batch, opts)
            if hit:
                arrays["value_norm"][0, 1, 2, 1] = np.inf
            return arrays

        def add(layer, rows):                       # layer by layer (a CPU): rows (B, ...)
            if hit and layer == 1:
                rows["value_norm"][0, 2, 1] = np.inf
            each_layer(layer, rows)

        return real(model, batch, opts, each_layer=add)

    monkeypatch.setattr(run_module, "capture", measure)
    store = tmp_path / "store"
    extract(str(tiny_model), str(data), store, ExtractConfig(**OPTIONS, batch_size=2),
            progress=False)
    manifest = json.loads((store / "manifest.json").read_text())
    assert manifest["counts"]["nonfinite"] == 1
    from attngeom.analysis.blocks import valid_sequences
    from attngeom.store import open_store

    ds = open_store(store)
    assert ds["finite"].values.tolist() == [1, 1, 0, 1, 1]
    with pytest.warns(RuntimeWarning, match="1 sequences had non-finite activations"):
        ok = valid_sequences(ds)
    assert ok.tolist() == [True, True, False, True, True]
    with warnings.catch_warnings():
        warnings.simplefilter("error")              # a clean store warns nothing
        clean = ds.assign(finite=ds["finite"] * 0 + 1)
        assert valid_sequences(clean).all()


def test_truncated_and_empty_counted(tiny_model, rel_dir, tmp_path):
    """Blank texts are skipped and counted, long ones cut, flagged and counted."""
    path = write_texts(tmp_path / "t.jsonl", N_WORDS)
    lines = path.read_text().splitlines()
    lines[2:2] = ['{"text": ""}', '{"text": " \\t "}', '{"text": null}']
    path.write_text("\n".join(lines) + "\n")
    store = tmp_path / "store"
    manifest = extract(str(tiny_model), str(path), store, ExtractConfig(**OPTIONS),
                       progress=False)
    want_truncated = [int(n + 1 > 8) for n in N_WORDS]
    assert manifest["counts"] == {"skipped_empty": 3, "truncated": sum(want_truncated),
                                  "nonfinite": 0}
    values = shard_values(store)
    assert values["truncated"].tolist() == want_truncated
    assert values["length"].tolist() == [min(n + 1, 8) for n in N_WORDS]
