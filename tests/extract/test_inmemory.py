"""``attngeom.measure``: a model object measured in memory is the store ``attngeom extract``
writes for the same inputs, and the model is left as it was.

Tiny models saved as directories; the command line (``attngeom extract``, in process) writes
the reference stores, the same directories loaded as objects are measured in memory. Compared:
every variable (values, dims, NaN cells), the attrs and the config hash. One direct comparison
with the naive float64 reference (tests/reference.py) on left-padded token ids.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import attngeom
import attngeom.store
import reference as ref
import tiny_archs as ta
import tiny_models as tm
import tolerance as tol
from attngeom import cli
from attngeom.store.format.manifest import config_difference
from store_helpers import (PAIR, PER_TOKEN, assert_same, forward_bound, measurement_bounds,
                           model_dims, write_images, write_texts)

N_WORDS = (3, 12, 6)                 # + BOS / CLS..SEP: the second text is cut at MAX_LENGTH
MAX_LENGTH = 10
CLI_STORES = {"llama-compact": ("llama", "compact"), "llama-dense": ("llama", "dense"),
              "bert-compact": ("bert", "compact"), "vit-dense": ("vit", "dense"),
              "gpt_oss-compact": ("gpt_oss", "compact")}


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """Model directories, the texts, the images and the CLI's stores."""
    base = tmp_path_factory.mktemp("inmemory")
    texts = write_texts(base / "texts.jsonl", N_WORDS)
    images = write_images(base / "images")
    dirs = {a: tm.save_tiny(a, base / a) for a in ("llama", "bert", "vit")}
    dirs["gpt_oss"] = ta.save("gpt_oss", base / "gpt_oss")
    stores = {}
    for name, (arch, mode) in CLI_STORES.items():
        stores[name] = base / f"store-{name}"
        data = images if arch == "vit" else texts
        rc = cli.main(["extract", "--model", str(dirs[arch]), "--data", str(data), "--out",
                       str(stores[name]), "--mode", mode, "--max-length", str(MAX_LENGTH),
                       "--batch-size", "2", "--tail-w", "3", "--quiet"])
        assert rc == 0, name
    lines = texts.read_text().splitlines()
    return {"dirs": dirs, "stores": stores, "texts": [json.loads(ln)["text"] for ln in lines],
            "images": images}


def _load(made, arch: str):
    from transformers import AutoImageProcessor, AutoModel, AutoModelForCausalLM, AutoTokenizer

    where = made["dirs"][arch]
    cls = AutoModel if arch in ("bert", "vit") else AutoModelForCausalLM
    proc = AutoImageProcessor if arch == "vit" else AutoTokenizer
    return cls.from_pretrained(where, dtype=torch.float32), proc.from_pretrained(where)


def _config(ds) -> dict:
    return json.loads(ds.attrs["attngeom_manifest"])["config"]


def assert_same_as_store(ds, store, skip=()) -> None:
    """Every variable of the opened ``store`` (derived ones included) in ``ds``: same dims,
    NaN at the same cells, the same values; the same attrs."""
    want = attngeom.store.open(store).load()
    assert set(ds.data_vars) == set(want.data_vars)
    assert set(ds.attrs) == set(want.attrs) and dict(ds.sizes) == dict(want.sizes)
    for name in want.data_vars:
        if name in skip:
            continue
        got, exp = ds[name], want[name]
        assert got.dims == exp.dims, name
        if exp.dtype.kind == "f":
            assert got.dtype == exp.dtype, name
            np.testing.assert_array_equal(np.isnan(got.values), np.isnan(exp.values), name)
        np.testing.assert_array_equal(got.values, exp.values, err_msg=name)
    for dim in want.coords:
        np.testing.assert_array_equal(ds[dim].values, want[dim].values, err_msg=dim)


@pytest.mark.parametrize("mode", ["compact", "dense"])
def test_texts_with_tokenizer_equal_the_cli_store(made, mode):
    model, tok = _load(made, "llama")                    # GQA: 4 query heads, 2 kv heads
    ds = attngeom.measure(model, made["texts"], mode=mode, tail_w=3, tokenizer=tok,
                          max_length=MAX_LENGTH, batch_size=2, data="texts.jsonl")
    store = made["stores"][f"llama-{mode}"]
    assert_same_as_store(ds, store)
    assert int(ds["truncated"].sum()) == 1 and ds["length"].values.tolist() == [4, 10, 7]
    # the config a store of these inputs records, and its hash computed the same way
    assert ds.attrs["config_hash"] == attngeom.store.open(store).attrs["config_hash"]
    assert config_difference(_config(ds), _config(attngeom.store.open(store))) is None
    memory = json.loads(ds.attrs["attngeom_manifest"])
    assert memory["in_memory"]["model_class"] == "LlamaForCausalLM"
    assert memory["in_memory"]["model_config"]["num_key_value_heads"] == 2
    assert set(memory["versions"]) >= {"attngeom", "torch", "transformers", "numpy"}


def test_default_data_label_changes_only_the_data_spec(made):
    model, tok = _load(made, "llama")
    ds = attngeom.measure(model, made["texts"], tail_w=3, tokenizer=tok, max_length=MAX_LENGTH)
    store = attngeom.store.open(made["stores"]["llama-compact"])
    assert config_difference(_config(ds), _config(store)) == \
        "data.spec: 'in-memory texts' != 'texts.jsonl'"
    assert ds.attrs["data_sha256"] == store.attrs["data_sha256"]     # sha256 of the texts


@pytest.mark.parametrize("side", ["right", "left"])
def test_token_ids_right_or_left_padded_equal_the_cli_store(made, side):
    model, tok = _load(made, "llama")
    tok.padding_side = side
    batch = tok(made["texts"], padding=True, return_tensors="pt")   # not cut: measure cuts
    assert (batch["attention_mask"][:, 0 if side == "left" else -1] == 0).any()
    ds = attngeom.measure(model, batch, tail_w=3, tokenizer=tok, max_length=MAX_LENGTH,
                          batch_size=2)
    assert_same_as_store(ds, made["stores"]["llama-compact"])       # truncated flags too
    assert _config(ds)["data"]["spec"] == "in-memory token ids"


def test_token_ids_without_tokenizer(made):
    """No token strings; special tokens from the model's config; positions of the longest."""
    model, _ = _load(made, "llama")
    store = attngeom.store.open(made["stores"]["llama-compact"]).load()
    ids = store["token_id"].values.astype(np.int64)
    mask = ids >= 0
    inputs = {"input_ids": np.where(mask, ids, tm.PAD_ID), "attention_mask": mask.astype(int)}
    ds = attngeom.measure(model, inputs, tail_w=3, batch_size=2)
    assert "token" not in ds and _config(ds)["options"]["store_text"] is False
    assert ds.sizes["position"] == MAX_LENGTH                          # the longest: 10
    assert_same_as_store(ds.assign(token=store["token"]), made["stores"]["llama-compact"],
                         skip=("truncated",))
    assert int(ds["truncated"].sum()) == 0                 # ids arrive cut: nothing to see


def test_encoder_equals_the_cli_store(made):
    model, tok = _load(made, "bert")
    ds = attngeom.measure(model, made["texts"], tail_w=3, tokenizer=tok,
                          max_length=MAX_LENGTH, batch_size=2, data="texts.jsonl")
    assert ds.attrs["causal"] == 0
    assert_same_as_store(ds, made["stores"]["bert-compact"])
    assert ds.attrs["config_hash"] == attngeom.store.open(
        made["stores"]["bert-compact"]).attrs["config_hash"]


def test_vision_pixel_values_equal_the_cli_store(made):
    from PIL import Image

    model, proc = _load(made, "vit")
    files = sorted(made["images"].glob("*.png"))
    pixels = proc(images=[Image.open(f).convert("RGB") for f in files], return_tensors="pt")
    ds = attngeom.measure(model, pixels, mode="dense", tail_w=3, tokenizer=proc, batch_size=2)
    store = made["stores"]["vit-dense"]
    assert_same_as_store(ds, store)
    assert ds["token"].values[0, :2].tolist() == ["[CLS]", "p(0,0)"]
    diff = config_difference(_config(ds), _config(attngeom.store.open(store)))
    assert diff.startswith("data.sha256:")          # the pixels' hash, not the files'


def test_learned_sinks_of_gpt_oss_in_memory(made):
    model, tok = _load(made, "gpt_oss")
    ds = attngeom.measure(model, made["texts"], tail_w=3, tokenizer=tok,
                          max_length=MAX_LENGTH, batch_size=2, data="texts.jsonl")
    assert "learned_sink_alpha" in ds and float(ds["learned_sink_alpha"].max()) > 0.01
    assert_same_as_store(ds, made["stores"]["gpt_oss-compact"])
    assert ds.attrs["config_hash"] == attngeom.store.open(
        made["stores"]["gpt_oss-compact"]).attrs["config_hash"]


def test_dense_left_padded_ids_equal_the_naive_reference():
    """Independent reference: GQA llama, right-padded inputs for the reference, the same rows
    left-padded for measure (position 0 is each sequence's first real token)."""
    model = tm.build("llama")
    inputs = tm.example_inputs("llama", batch=3, seq_len=12)       # lengths 12, 9, 6
    want = ref.naive_measure(model, inputs, sink_k=1)
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    left = {"input_ids": torch.stack([r.roll(int((m == 0).sum())) for r, m in zip(ids, mask)]),
            "attention_mask": mask.flip(-1)}
    ds = attngeom.measure(model, left, mode="dense", batch_size=2)
    assert ds["length"].values.tolist() == [12, 9, 6]
    bound = measurement_bounds(want, model_dims(model))
    for name in PAIR + PER_TOKEN:                        # contributions derived as on read
        assert_same(ds[name].values, want[name], name, bound[name])


# ----------------------------------------------------------------------------- the model as it was
def _state(model) -> dict:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    configs = {id(c): c for c in [model.config] + [m.config for m in model.modules()
                                                   if hasattr(m, "config")]}
    return {"training": [m.training for m in model.modules()],
            "requires_grad": [p.requires_grad for p in model.parameters()],
            "impl": sorted((str(c._attn_implementation), type(c).__name__)
                           for c in configs.values()),
            "hooks": [len(h) for m in model.modules() for h in (
                m._forward_hooks, m._forward_pre_hooks, m._backward_hooks)],
            "registered": ("attngeom" in AttentionInterface._global_mapping,
                           "attngeom" in AttentionMaskInterface._global_mapping)}


def _users_model(monkeypatch):
    """A llama as a user may hold it: training mode, eager attention, a frozen embedding,
    a forward hook of their own; attngeom's functions not registered with transformers (an
    earlier test of this process registered them)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    for registry in (AttentionInterface, AttentionMaskInterface):
        monkeypatch.delitem(registry._global_mapping, "attngeom", raising=False)
    model = tm.build("llama", attn_implementation="eager").train()
    model.model.embed_tokens.weight.requires_grad_(False)
    seen = []
    model.model.layers[0].register_forward_hook(lambda m, a, o: seen.append(1))
    return model, seen


def test_model_unchanged_after_measure(monkeypatch):
    model, seen = _users_model(monkeypatch)
    before = _state(model)
    assert before["registered"] == (False, False) and before["training"][0]
    inputs = tm.example_inputs("llama", batch=3)
    ds = attngeom.measure(model, inputs, batch_size=2)
    assert _state(model) == before
    with torch.no_grad():
        model.eval()
        eager = model(**inputs).logits
        model.train()
    assert model.config._attn_implementation == "eager"
    assert len(seen) == 4               # the probe, 2 batches, the eager forward: still hooked
    fresh = tm.build("llama").eval()
    with torch.no_grad():                  # weights intact: the same logits (other kernels)
        logits = fresh(**inputs).logits
    np.testing.assert_allclose(eager.numpy(), logits.numpy(),
                               **forward_bound(fresh, logits.shape[1], logits))
    np.testing.assert_array_equal(ds["alpha"].values, attngeom.measure(
        fresh, inputs, batch_size=2)["alpha"].values)                        # measured in eval


def test_model_unchanged_when_a_later_batch_raises(monkeypatch):
    """A failure inside the attention handler of the second batch: everything restored."""
    from attngeom.extract.measurement import capture

    model, _ = _users_model(monkeypatch)
    before = _state(model)
    real, calls = capture.measure_layer, []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) > 2:                        # batch 1 has 2 layers; fails in batch 2
            raise RuntimeError("simulated failure in batch 2")
        return real(*args, **kwargs)

    monkeypatch.setattr(capture, "measure_layer", failing)
    with pytest.raises(RuntimeError, match="batch 2"):
        attngeom.measure(model, tm.example_inputs("llama", batch=3), batch_size=2)
    assert len(calls) == 3 and _state(model) == before


def test_model_unchanged_when_inputs_are_refused(monkeypatch):
    model, _ = _users_model(monkeypatch)
    before = _state(model)
    ids = tm.example_inputs("llama", batch=3)["input_ids"].clone()
    ids[2, 3] = tm.VOCAB_SIZE + 5                           # third row: outside the vocabulary
    with pytest.raises(ValueError, match="input_ids row 2 holds id 69, outside"):
        attngeom.measure(model, {"input_ids": ids})
    assert _state(model) == before


@pytest.mark.parametrize("inputs, kwargs, message", [
    (["a text"], {}, "texts need tokenizer="),
    ({"pixel_values": torch.zeros(1, 3, 12, 12)}, {}, "takes text inputs"),
    ({"input_ids": [[2, 5, 6]], "attention_mask": [[1, 0, 1]]}, {}, "padding between"),
    ({"input_ids": [[2, 5, 6]], "position_ids": [[0, 1, 2]]}, {}, "inputs\\['position_ids'\\]"),
    ({"input_ids": [[2, 5, 6]], "token_type_ids": [[0, 1, 1]]}, {}, "second segment"),
    ({"input_ids": [[2, 5, 6]]}, {"mode": "sparse"}, "--mode must be one of"),
    ({"input_ids": [[2]]}, {}, "every key would be a sink"),
])
def test_bad_inputs_one_line(inputs, kwargs, message):
    with pytest.raises(ValueError, match=message) as err:
        attngeom.measure(tm.build("llama"), inputs, **kwargs)
    assert "\n" not in str(err.value)


# ----------------------------------------------------------------------------- the rest accepts it
def test_analysis_and_view_accept_the_in_memory_dataset(made):
    from attngeom.analysis import run_all

    model, tok = _load(made, "llama")
    ds = attngeom.measure(model, made["texts"], tail_w=3, tokenizer=tok, max_length=MAX_LENGTH,
                          batch_size=2, data="texts.jsonl")
    store = attngeom.store.open(made["stores"]["llama-compact"])
    got = run_all(ds, progress=False, n_boot=0, mixed=False)
    want = run_all(store, progress=False, n_boot=0, mixed=False)
    for name in ("sinks", "convexity", "anti_alignment", "decomposition"):
        for var in want[name].data_vars:
            a, b = got[name][var].values, want[name][var].values
            if b.dtype.kind in "fc":
                # the same float64 analysis of bitwise-equal data, read along another path
                np.testing.assert_allclose(a, b, err_msg=f"{name}.{var}", **tol.ANALYSIS_FLOAT64
                                           * np.nanmax(np.abs(b), initial=0.0))
            else:
                np.testing.assert_array_equal(a, b, err_msg=f"{name}.{var}")
    assert got["sinks"].attrs["config_hash"] == ds.attrs["config_hash"]
    page = attngeom.view(ds, sequence=0)
    assert page.html == attngeom.view(store, sequence=0).html and "<script>" in page.html


def test_import_attngeom_stays_free_of_torch():
    import subprocess
    import sys

    code = ("import sys, attngeom, attngeom.store; f = attngeom.measure; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ----------------------------------------------------------------------------- store.write
@pytest.mark.parametrize("mode", ["compact", "dense"])
def test_store_write_round_trip(made, mode, tmp_path):
    import h5py

    from attngeom.store.io.validate import validate

    model, tok = _load(made, "llama")
    ds = attngeom.measure(model, made["texts"], mode=mode, tail_w=3, tokenizer=tok,
                          max_length=MAX_LENGTH, shard_size=2)
    manifest = attngeom.store.write(ds, tmp_path / "store")
    assert validate(tmp_path / "store") == []
    assert cli.main(["store", "validate", str(tmp_path / "store")]) == 0
    assert manifest["complete"] and [e["sequences"] for e in manifest["shards"]] == [[0, 2], [2, 3]]
    assert manifest["config_hash"] == ds.attrs["config_hash"]
    assert manifest["in_memory"]["model_class"] == "LlamaForCausalLM"
    assert "in-memory texts" in (tmp_path / "store" / "README.txt").read_text()
    with h5py.File(tmp_path / "store" / manifest["shards"][0]["file"]) as f:
        assert "alpha" in f and "contribution" not in f          # derived on read
    again = attngeom.store.open(tmp_path / "store").load()
    assert set(again.data_vars) == set(ds.data_vars) and again.attrs["config_hash"] == \
        ds.attrs["config_hash"]
    for name in ds.data_vars:
        np.testing.assert_array_equal(again[name].values, ds[name].values, err_msg=name)


def test_store_write_refuses_cuts_and_foreign_datasets(made, tmp_path):
    from attngeom.store import StoreError

    model, tok = _load(made, "llama")
    ds = attngeom.measure(model, made["texts"], tail_w=3, tokenizer=tok, max_length=MAX_LENGTH)
    with pytest.raises(StoreError, match="1 layer label"):
        attngeom.store.write(ds.isel(layer=[1]), tmp_path / "a")
    with pytest.raises(StoreError, match="sequences 2 starting at 1"):
        attngeom.store.write(ds.isel(sequence=slice(1, None)), tmp_path / "b")
    with pytest.raises(StoreError, match="no attngeom_manifest"):
        attngeom.store.write(ds.drop_attrs(), tmp_path / "c")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x").write_text("")
    with pytest.raises(StoreError, match="not empty"):
        attngeom.store.write(ds, tmp_path / "d")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
