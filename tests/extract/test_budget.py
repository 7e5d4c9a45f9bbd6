"""What a run needs, checked before it starts: the context, the disk, the memory; --threads.

A tiny llama whose config says 128 positions: a text longer than that at --max-length 200 is
refused by extract and faithfulness once tokenized, before anything is written (nothing is left
on disk); --beyond-context measures past it; attngeom.measure warns. Disk and memory refusals
are driven by shrinking what the machine reports (free_disk, available_memory); the estimates
are checked against the bytes of a real store. A dense batch's memory is one layer's (dense
shards are written layer by layer): one long text of SmolLM2-135M's sizes fits 24 GiB.
"""

from __future__ import annotations

import json

import pytest
import torch

import tiny_models as tm
from attngeom.cli import main
from attngeom.common.errors import Refusal
from attngeom.extract.loading import budget
from store_helpers import write_texts


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("budget")
    model = tm.save_tiny("llama", root / "model")
    assert json.loads((model / "config.json").read_text())["max_position_embeddings"] == 128
    long = " ".join(tm._WORDS[:40] * 6)                       # 240 words: past 128 tokens
    data = root / "texts.jsonl"
    write_texts(data)
    with data.open("a") as f:
        f.write(json.dumps({"text": long}) + "\n")
    return {"model": model, "data": data}


def _refused(capsys, argv, out, *words) -> None:
    assert main(argv) != 0
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err, err
    assert all(w in err for w in words), err
    assert not out.exists()                                   # nothing left on disk


def test_texts_beyond_the_context_are_refused_before_the_store_exists(tiny, tmp_path, capsys):
    out = tmp_path / "out"
    _refused(capsys, ["extract", "--model", str(tiny["model"]), "--data", str(tiny["data"]),
                      "--max-length", "200", "--out", str(out), "--quiet"], out,
             "texts of 200 is beyond the model's context of 128 tokens", "--beyond-context")


def test_faithfulness_refuses_texts_beyond_the_context_before_the_result_exists(
        tiny, tmp_path, capsys):
    out = tmp_path / "faith"
    _refused(capsys, ["faithfulness", "--model", str(tiny["model"]), "--data", str(tiny["data"]),
                      "--max-length", "200", "--metrics", "attention", "--fractions", "0.1",
                      "--no-drift", "--out", str(out), "--quiet"], out,
             "texts of 200 is beyond the model's context of 128 tokens", "--beyond-context")


def test_beyond_context_measures_past_it_and_measure_warns(tiny, tmp_path):
    from attngeom import measure
    from attngeom.store import open_store

    out = tmp_path / "store"
    assert main(["extract", "--model", str(tiny["model"]), "--data", str(tiny["data"]),
                 "--max-length", "200", "--beyond-context", "--out", str(out), "--quiet"]) == 0
    ds = open_store(out)
    assert int(ds["length"].max()) > 128                      # the long text went past it
    model, tok = _pair(tiny["model"])
    with pytest.warns(UserWarning, match="beyond the model's context of 128"):
        measure(model, [" ".join(tm._WORDS[:40] * 6)], tokenizer=tok, max_length=200)


def _pair(directory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(directory), AutoTokenizer.from_pretrained(directory)


def _finite_bytes(store) -> tuple[float, float, int]:
    """(bytes of the finite float values in a store's shards, every float cell's bytes,
    sequences), counted with h5py: the independent side of the estimates."""
    import h5py
    import numpy as np

    finite = every = n = 0
    for path in sorted((store / "shards").glob("*.nc")):
        with h5py.File(path, "r") as f:
            n += f["length"].shape[0]
            for name, var in f.items():
                if isinstance(var, h5py.Dataset) and var.dtype.kind == "f" and var.ndim > 1:
                    values = var[()]
                    finite += np.isfinite(values).sum() * var.dtype.itemsize
                    every += values.size * 4
    return float(finite), float(every), n


@pytest.mark.parametrize("mode", ["dense", "compact"])
def test_the_store_estimates_count_every_variable_the_schema_stores(tiny, tmp_path, mode):
    """A store of texts that all fill --max-length (no padding): the estimates of its bytes
    (finite values, and every cell before compression) against the shards' own, every float
    variable counted. Within 10 %: the estimate counts a cell finite wherever the layout has
    one (position 0's NaN residual cosines and the sink key's tail cells are not subtracted)."""
    T, L, H = 12, 2, 4
    data = write_texts(tmp_path / "long.jsonl", (40, 30, 50))          # each cut at T
    out = tmp_path / mode
    assert main(["extract", "--model", str(tiny["model"]), "--data", str(data), "--mode", mode,
                 "--max-length", str(T), "--sink-k", "1", "--tail-w", "3", "--out", str(out),
                 "--quiet"]) == 0
    finite, every, n = _finite_bytes(out)
    est = budget.stored_bytes(mode, T, 1, 3, L, H, True, False)
    assert est * n == pytest.approx(finite, rel=0.1)     # an estimate (not a rounding bound)
    assert budget.sequence_bytes(mode, T, 1, 3, L, H) * n == every


def test_a_store_larger_than_the_free_disk_is_refused(tiny, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(budget, "free_disk", lambda out: 1000.0)
    out = tmp_path / "out"
    _refused(capsys, ["extract", "--model", str(tiny["model"]), "--data", str(tiny["data"]),
                      "--mode", "dense", "--max-length", "64", "--out", str(out), "--quiet"],
             out, "the store needs about", "GiB free", "--mode compact")


def test_a_batch_larger_than_the_memory_is_refused(tiny, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(budget, "available_memory", lambda: 1e5)
    out = tmp_path / "out"
    _refused(capsys, ["extract", "--model", str(tiny["model"]), "--data", str(tiny["data"]),
                      "--max-length", "64", "--out", str(out), "--quiet"], out,
             "needs about", "GiB of memory", "a smaller --batch-size")


def test_threads_sets_torch_s_threads_and_not_the_content_hash(tiny, tmp_path, monkeypatch):
    from attngeom.store import read_manifest

    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)                 # restored afterwards
    before = torch.get_num_threads()
    hashes = []
    try:
        for n in (1, 2):
            out = tmp_path / f"t{n}"
            assert main(["extract", "--model", str(tiny["model"]), "--data", str(tiny["data"]),
                         "--max-length", "16", "--threads", str(n), "--out", str(out),
                         "--quiet"]) == 0
            assert torch.get_num_threads() == n
            hashes.append(read_manifest(out)["config_hash"])
    finally:
        torch.set_num_threads(before)
    assert hashes[0] == hashes[1]


def test_the_dense_estimate_counts_one_layer():
    """A dense batch's estimate: one layer's measurements, whatever the depth; compact's: all
    of them. Twice the measured arrays and the workspace of four (head, T, T) arrays."""
    args = dict(T=64, longest=64, sink_k=1, tail_w=8, n_heads=9)
    dense = [budget.batch_bytes("dense", n_layers=n, batch=1, **args) for n in (1, 30)]
    compact = [budget.batch_bytes("compact", n_layers=n, batch=1, **args) for n in (1, 30)]
    assert dense[0] == dense[1]
    assert compact[1] - compact[0] == 2 * 29 * budget.sequence_bytes("compact", 64, 1, 8, 1, 9)
    assert budget.batch_bytes("dense", n_layers=30, batch=4, **args) == 4 * dense[0]
    pairs = (3 * 9 * 64 + 6 * 9 + 1) * 64 * 4      # alpha, the cosines; 7 per-token variables
    assert dense[0] == 2 * pairs + 4 * 4 * 9 * 64 * 64


@pytest.mark.parametrize("T, refused", [(2048, False), (4096, False), (8192, True)])
def test_one_long_text_fits_24_gib_in_dense_mode(tmp_path, monkeypatch, T, refused):
    """SmolLM2-135M's sizes (30 layers, 9 heads), one text of T tokens, batch 1, the 22.1 GiB
    a 24 GiB machine has available: 2,048 tokens needed 25.9 GiB before streaming (and 4,096
    104 GiB); now 1.4 and 5.6 GiB. 8,192 (22.5 GiB) is still refused, with the estimate."""
    monkeypatch.setattr(budget, "available_memory", lambda: 22.1 * budget.GIB)
    monkeypatch.setattr(budget, "free_disk", lambda out: 1e15)
    args = (tmp_path / "out", 1, [T], "dense", T, 1, 8, 30, 9, True, False, 1)
    if not refused:
        budget.check_budget(*args)
        return
    with pytest.raises(Refusal, match=r"a batch of 1 x 8192 tokens \(dense\) needs about "
                                      r"22.5 GiB of memory"):
        budget.check_budget(*args)


def test_a_dense_run_the_earlier_estimate_refused_runs(tiny, tmp_path, monkeypatch, capsys):
    """Memory between the dense estimate and the earlier one (every layer of the batch held
    twice): the run is not refused, and with a little less than the estimate it is."""
    T, L, H, batch = 64, 2, 4, 2
    new = budget.batch_bytes("dense", T, T, 1, 8, L, H, batch)
    old = new + 2 * batch * (L - 1) * budget.sequence_bytes("dense", T, 1, 8, 1, H)
    data = write_texts(tmp_path / "long.jsonl", (80, 70, 90))         # each cut at T
    argv = ["extract", "--model", str(tiny["model"]), "--data", str(data), "--mode", "dense",
            "--max-length", str(T), "--batch-size", str(batch), "--quiet", "--out"]
    monkeypatch.setattr(budget, "available_memory", lambda: (new + old) / 2)
    assert main(argv + [str(tmp_path / "fits")]) == 0
    monkeypatch.setattr(budget, "available_memory", lambda: new * 0.9)
    _refused(capsys, argv + [str(tmp_path / "refused")], tmp_path / "refused",
             "a batch of 2 x 64 tokens (dense) needs about", "GiB of memory")
