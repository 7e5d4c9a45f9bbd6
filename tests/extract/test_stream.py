"""Extraction written layer by layer (store/format/stream.py, extract/run.py stream_shard): dense
mode, and compact mode on a CPU.

A tiny llama saved as a directory; five texts (one cut at --max-length 10, one of a single
word: padding in every batch). The streamed store is checked against

- the naive float64 reference (tests/reference.py), within the float32 chain's bounds;
- the same shards written the earlier way, the whole shard measured in memory and then written
  (``extract_shard`` and ``StoreWriter.add_shard``, compact's path on an accelerator), dense and
  compact: the same variables in the same order, dims, chunks, filters, fill values and
  attributes, and the same values bit for bit (the computation is the same), float32 and
  packed;
- itself after an out-of-memory error half-way through a batch's layers (the batch is measured
  again, smaller, over the chunks already stored) and after SIGKILL while a shard is being
  written (rejected as incomplete, then resumed to the uninterrupted run's files); a full disk
  while a shard is written is one line naming the file.

The memory estimate of a dense batch (one layer) is tested in test_budget.py.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

import attngeom.store
import tiny_models as tm
from attngeom.extract import run as run_module
from attngeom.extract.measurement import batches as batches_module
from attngeom.extract.run import ExtractConfig, extract
from attngeom.common.errors import StoreError
from attngeom.store.io.validate import validate
from reliability.rel_helpers import (assert_bitwise_equal, cli_main, cli_start, manifest,
                                     netcdf_contents, temporaries)
from store_helpers import (assert_same, measurement_bounds, model_dims, reference_on_ids,
                           write_texts)

N_WORDS = (3, 12, 6, 1, 8)
OPTIONS = dict(mode="dense", max_length=10, shard_size=3, batch_size=2)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    base = tmp_path_factory.mktemp("stream")
    model = tm.save_tiny("llama", base / "model")
    return model, write_texts(base / "texts.jsonl", N_WORDS), base


def _extract(model, data, out, in_memory: bool = False, **changes) -> Path:
    """A store of ``data`` (dense unless ``changes`` say otherwise): streamed, or
    (``in_memory``) each shard measured whole and then written, as before streaming."""
    real = run_module.stream_shard

    def whole(writer, index, loaded, items, start, cfg, opts, bar=None, current=None):
        ds, encoded = run_module.extract_shard(loaded, items, start, cfg, opts, bar, current)
        writer.add_shard(ds, index, encoded)

    run_module.stream_shard = whole if in_memory else real
    try:
        extract(str(model), str(data), out, ExtractConfig(**{**OPTIONS, **changes}),
                progress=False)
    finally:
        run_module.stream_shard = real
    return out


def _layout(path: Path) -> list[tuple]:
    """Every variable of a shard file in file order: name, dtype, shape, chunks, filters,
    fill value (NaN as a string) and attributes, read with h5py."""
    out = []
    with h5py.File(path, "r") as f:
        for name, d in f.items():
            out.append((name, str(d.dtype), d.shape, d.chunks, d.compression, d.compression_opts,
                        d.shuffle, d.fletcher32, str(d.fillvalue),
                        {k: str(v) for k, v in d.attrs.items()}))
        out.append({k: str(v) for k, v in f.attrs.items() if k != "_NCProperties"})
    return out


@pytest.mark.parametrize("mode", ["dense", "compact"])
@pytest.mark.parametrize("precision", ["float32", "packed"])
def test_streamed_shards_equal_the_shards_measured_in_memory(inputs, tmp_path, precision,
                                                             mode):
    model, data, _ = inputs
    streamed = _extract(model, data, tmp_path / "streamed", precision=precision, mode=mode)
    whole = _extract(model, data, tmp_path / "whole", in_memory=True, precision=precision,
                     mode=mode)
    names = sorted(p.name for p in (streamed / "shards").iterdir())
    assert names == sorted(p.name for p in (whole / "shards").iterdir()) == [
        "shard-00000.nc", "shard-00001.nc"]
    for name in names:
        a, b = streamed / "shards" / name, whole / "shards" / name
        assert _layout(a) == _layout(b), name
        assert_bitwise_equal(netcdf_contents(a), netcdf_contents(b), name)
    got, want = manifest(streamed), manifest(whole)      # without checksums: another layout
    got.pop("sources"), want.pop("sources")
    assert got == want and got["complete"] and got["counts"]["truncated"] == 1
    assert validate(streamed) == []


def test_streamed_store_equals_the_reference(inputs, tmp_path):
    model, data, _ = inputs
    ds = attngeom.store.open(_extract(model, data, tmp_path / "s", batch_size=3)).load()
    from store_helpers import load_tiny

    tiny = load_tiny(model, "llama")
    r = reference_on_ids(tiny, ds["token_id"].values, sink_k=1)
    bound = measurement_bounds(r, model_dims(tiny))
    for name in ("alpha", "cosine", "cosine_layer", "contribution", "contribution_layer",
                 "value_norm", "output_norm", "layer_output_norm", "head_share"):
        assert_same(ds[name].values, r[name], name, bound[name])
    assert ds["finite"].values.tolist() == [1] * len(N_WORDS)


def _failing_capture(fail_above: int, poison=None):
    """batches.capture raising CUDA's out-of-memory error at layer 1 of batches larger than
    ``fail_above`` (layer 0's rows already streamed); ``poison(call, layer, arrays)`` may
    change the arrays of a batch that goes through."""
    import torch

    real, calls = batches_module.capture, []

    def capture(model, batch, opts, each_layer=None):
        calls.append(len(batch["index"]))

        def layer(index, arrays):
            if len(batch["index"]) > fail_above and index == 1:
                raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 GiB")
            if poison is not None:
                poison(len(calls), index, arrays)
            each_layer(index, arrays)

        return real(model, batch, opts, each_layer=layer)

    return capture, calls


def test_out_of_memory_half_way_through_a_batch_measures_it_again(inputs, tmp_path,
                                                                   monkeypatch, capsys):
    model, data, _ = inputs
    one = _extract(model, data, tmp_path / "one", batch_size=1, shard_size=5)
    capture, calls = _failing_capture(1)
    monkeypatch.setattr(batches_module, "capture", capture)
    halved = _extract(model, data, tmp_path / "halved", batch_size=4, shard_size=5)
    assert calls == [4, 2, 1, 1, 1, 1, 1]        # chunks of 4 rows, written over by batches of 1
    assert "continuing with batch size 1" in capsys.readouterr().out
    with h5py.File(halved / "shards" / "shard-00000.nc") as f:
        assert f["alpha"].chunks[0] == 4
    a, b = netcdf_contents(one / "shards" / "shard-00000.nc"), netcdf_contents(
        halved / "shards" / "shard-00000.nc")
    assert_bitwise_equal(a, b, "after out of memory")
    assert validate(halved) == []


def test_a_non_finite_layer_flags_its_sequence(inputs, tmp_path, monkeypatch):
    model, data, _ = inputs

    def poison(call, layer, arrays):              # the 2nd batch's first row, layer 1
        if call == 2 and layer == 1:
            arrays["value_norm"][0, 2, 1] = np.inf

    monkeypatch.setattr(batches_module, "capture", _failing_capture(99, poison)[0])
    store = _extract(model, data, tmp_path / "s")
    assert json.loads((store / "manifest.json").read_text())["counts"]["nonfinite"] == 1
    assert attngeom.store.open(store)["finite"].values.tolist() == [1, 1, 0, 1, 1]


def test_killed_while_a_shard_is_written_is_rejected_then_resumed(inputs, tmp_path):
    model, _, base = inputs
    data = write_texts(tmp_path / "texts.jsonl", tuple(1 + (5 * i) % 14 for i in range(16)))
    args = ("extract", "--model", model, "--data", data, "--mode", "dense", "--max-length",
            "10", "--shard-size", "2", "--batch-size", "1", "--quiet")
    out, clean = tmp_path / "killed", tmp_path / "clean"
    proc = cli_start(*args, "--out", out)
    shards, deadline = out / "shards", time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        if shards.is_dir() and any(".tmp-" in p.name and p.stat().st_size
                                   for p in shards.iterdir()):
            os.kill(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.001)
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL, "the run ended before it was killed"
    assert temporaries(out)                        # the shard being written, cut short
    done = json.loads((out / "manifest.json").read_text())
    assert not done["complete"] and len(done["shards"]) < 8
    with pytest.raises(StoreError, match="incomplete"):
        attngeom.store.open(out)
    assert any("incomplete" in p for p in validate(out))
    if done["shards"]:                             # what is recorded reads; nothing else
        n = sum(hi - lo for lo, hi in (e["sequences"] for e in done["shards"]))
        assert attngeom.store.open(out, partial=True).sizes["sequence"] == n
    for store in (out, clean):                     # the same command again; uninterrupted
        rc, _, err = cli_main(*args, "--out", store)
        assert rc == 0, err
    assert temporaries(out) == []
    names = sorted(p.name for p in (clean / "shards").iterdir())
    assert names == sorted(p.name for p in shards.iterdir()) and len(names) == 8
    for name in names:
        assert_bitwise_equal(netcdf_contents(shards / name),
                             netcdf_contents(clean / "shards" / name), name)
    got, want = manifest(out), manifest(clean)
    assert got == want and validate(out) == []


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                    reason="needs root to mount a small tmpfs")
def test_a_full_disk_while_a_shard_is_written_is_one_line(inputs, tmp_path):
    """HDF5 writing the shard file itself meets the full disk: exit 2 with one line naming the
    file and the fix, no crash on exit, no temporary file, the manifest tells the truth. Two
    disk sizes: full while a shard's chunks are written, and while one is laid out."""
    import subprocess

    model, _, _ = inputs
    data = write_texts(tmp_path / "texts.jsonl", tuple(1 + (5 * i) % 14 for i in range(16)))
    for size in ("150k", "330k"):
        place = tmp_path / f"disk-{size}"
        place.mkdir()
        mount = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                                str(place)], capture_output=True)
        if mount.returncode:
            pytest.skip(f"cannot mount a tmpfs here: {mount.stderr.decode().strip()}")
        try:
            out = place / "store"
            proc = cli_start("extract", "--model", model, "--data", data, "--mode", "dense",
                             "--max-length", "10", "--shard-size", "2", "--batch-size", "1",
                             "--quiet", "--out", out)
            _, err = proc.communicate(timeout=300)
            lines = [x for x in err.strip().splitlines() if not x.startswith("[transformers]")]
            assert proc.returncode == 2 and len(lines) == 1, (size, proc.returncode, err)
            assert lines[0].startswith(f"attngeom: error: cannot write {out}/"), lines
            assert "No space left on device; free disk space" in lines[0], lines
            assert temporaries(out) == []
            recorded = [Path(e["file"]).name for e in json.loads(
                (out / "manifest.json").read_text())["shards"]]
            assert set(recorded) <= {p.name for p in (out / "shards").iterdir()}
        finally:
            subprocess.run(["umount", "-l", str(place)], capture_output=True)


@pytest.mark.parametrize("precision", ["float32", "packed"])
def test_pair_tiles_only_fill_are_not_stored_and_read_as_fill(inputs, tmp_path, precision,
                                                              monkeypatch):
    """(query, key) variables in tiles of 4 x 4 positions (TILE lowered from 256 so that the
    tiny texts are tiled, with edge tiles): the tiles above the causal diagonal (and of padding)
    are never stored, and the store reads bit for bit as the untiled one, streamed and
    measured in memory alike."""
    from attngeom.store.format import chunks as chunks_module

    model, data, _ = inputs
    untiled = _extract(model, data, tmp_path / "untiled", precision=precision)
    monkeypatch.setattr(chunks_module, "TILE", 4)
    streamed = _extract(model, data, tmp_path / "streamed", precision=precision)
    whole = _extract(model, data, tmp_path / "whole", in_memory=True, precision=precision)
    fill = np.asarray(chunks_module.fill_value(np.int16 if precision == "packed"
                                               else np.float32))
    for name in ("shard-00000.nc", "shard-00001.nc"):
        a, b = streamed / "shards" / name, whole / "shards" / name
        assert _layout(a) == _layout(b), name
        contents = netcdf_contents(a)
        assert_bitwise_equal(contents, netcdf_contents(untiled / "shards" / name), name)
        with h5py.File(a, "r") as f:
            d = f["alpha"]
            assert d.chunks[-2:] == (4, 4) and d.shape[-2:] == (10, 10)
            r = d.chunks[0]                                 # sequences per chunk
            x = np.pad(d[()], [(0, -d.shape[0] % r)] + [(0, 0)] * 2 + [(0, 2), (0, 2)],
                       constant_values=fill)                # edge chunks, as HDF5 pads them
            # (row blocks, rows, layers, heads, 3 query tiles of 4, 3 key tiles of 4)
            t = x.reshape(-1, r, *x.shape[1:3], 3, 4, 3, 4)
            bits = t.view(f"u{x.itemsize}") != fill.view(f"u{x.itemsize}")
            want = int(bits.any(axis=(1, 3, 5, 7)).sum())   # tiles holding any value
            grid = np.prod([-(-n // c) for n, c in zip(d.shape, d.chunks)])
            assert d.id.get_num_chunks() == want < grid     # above the diagonal: not stored
    assert validate(streamed) == [] and validate(whole) == []
