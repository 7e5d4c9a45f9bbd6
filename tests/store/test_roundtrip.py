"""Stores written by ``attngeom.extract.run.extract`` read back equal to the naive reference.

Dense and compact stores of a tiny GQA decoder (llama), a compact store of a tiny encoder (bert),
opened with
``attngeom.store.open`` and with plain xarray, against tests/reference.py run on the token ids
read back from the store (padded to max_length, NaN beyond each sequence's length).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import xarray as xr
from transformers import AutoTokenizer

import attngeom.store
import tiny_models as tm
import tolerance as tol
from store_helpers import (PAIR, PER_TOKEN, assert_same, compact_bounds, expected_compact,
                           measurement_bounds, model_dims)

ONE_LINER = dict(engine="h5netcdf", combine="nested", concat_dim="sequence")


def _bounds(arch: str, r: dict, vs=tol.F64) -> dict[str, np.ndarray]:
    """The float32 measurements' rounding bounds (store_helpers.measurement_bounds)."""
    return measurement_bounds(r, model_dims(tm.make_config(arch)), vs)


def _values(ds, name: str) -> np.ndarray:
    return np.asarray(ds[name].values)


def test_dense_store_equals_reference(opened, reference_for, layout):
    ds = opened["llama", "dense"]
    r = reference_for("llama", ds)
    assert ds.sizes["query"] == ds.sizes["key"] == layout["max_length"]
    bound = _bounds("llama", r)
    for name in PAIR + PER_TOKEN:        # contribution, contribution_layer: derived on read
        assert ds[name].dtype == np.float32, name
        assert_same(_values(ds, name), r[name], name, bound[name])


@pytest.mark.parametrize("arch", ["llama", "bert"])
def test_compact_store_equals_reference(arch, opened, reference_for, layout):
    ds = opened[arch, "compact"]
    r = reference_for(arch, ds)
    k, w = layout["sink_k"], layout["tail_w"]
    assert ds.sizes["sink"] == k and ds.sizes["lag"] == w
    assert ds["alpha"].dims[-1] == "sink" and ds["tail_alpha"].dims[-1] == "lag"
    bound = compact_bounds(r, model_dims(tm.make_config(arch)), k, w)
    for name, want in expected_compact(r, k, w).items():   # sink, tail_*, middle_* (+ derived)
        assert_same(_values(ds, name), want, name, bound[name])
    for name in PER_TOKEN:
        assert_same(_values(ds, name), r[name], name, bound[name])


@pytest.mark.parametrize("kind", [("llama", "dense"), ("llama", "compact"), ("bert", "compact")])
def test_sequence_metadata(kind, opened, model_dirs, texts_file, layout):
    """token ids, lengths, truncation and special flags match the tokenizer's own output."""
    arch, ds = kind[0], opened[kind]
    tok = AutoTokenizer.from_pretrained(model_dirs[arch])
    texts = [json.loads(line)["text"] for line in texts_file.read_text().splitlines()]
    T = layout["max_length"]
    full = tok(texts)["input_ids"]
    assert ds.sizes["sequence"] == len(texts)
    np.testing.assert_array_equal(ds["sequence"].values, np.arange(len(texts)))
    np.testing.assert_array_equal(ds["text_index"].values, np.arange(len(texts)))
    np.testing.assert_array_equal(ds["length"].values, [min(len(f), T) for f in full])
    np.testing.assert_array_equal(ds["truncated"].values, [len(f) > T for f in full])
    assert ds["truncated"].values.sum() == 1
    np.testing.assert_array_equal(ds["finite"].values, 1)
    ids = ds["token_id"].values
    for i, f in enumerate(full):
        n = min(len(f), T)
        assert ids[i, 0] == tok.convert_tokens_to_ids(tok.cls_token if arch == "bert"
                                                      else tok.bos_token)
        np.testing.assert_array_equal(ids[i, :n - 1], f[:n - 1])      # bert keeps [SEP]
        assert (ids[i, n:] == -1).all()
        assert ds["special"].values[i, 0] == 1 and ds["special"].values[i, 1] == 0
        assert list(ds["token"].values[i, :n]) == tok.convert_ids_to_tokens(ids[i, :n])


def test_dense_and_compact_stores_agree(opened, layout):
    """What both layouts hold is the same: sinks, per-token, tails and middles from dense."""
    dense, compact = opened["llama", "dense"], opened["llama", "compact"]
    k, w = layout["sink_k"], layout["tail_w"]
    names = PAIR + PER_TOKEN
    full = {name: _values(dense, name).astype(np.float64) for name in names}
    # two float32 measurements (dense, compact): each within its bound, sizes from dense's
    bound = compact_bounds(full, model_dims(tm.make_config("llama")), k, w, vs=tol.F32)
    for name, want in expected_compact(full, k, w).items():
        assert_same(_values(compact, name), want, name, bound[name])
    for name in PER_TOKEN:
        assert_same(_values(compact, name), full[name], name, bound[name])
    for name in ("token_id", "length", "truncated", "special"):
        np.testing.assert_array_equal(_values(compact, name), _values(dense, name), name)


def test_derived_contributions_on_open(opened, stores, reference_for):
    """contribution / contribution_layer computed on read equal the reference; sums are 1."""
    ds = opened["llama", "dense"]
    r = reference_for("llama", ds)
    # derived from the stored float32 alpha, norms and cosine: their bounds, 4 more roundings
    bound = _bounds("llama", r)
    for name in ("contribution", "contribution_layer"):
        assert "derived" in ds[name].attrs["description"]
        assert_same(_values(ds, name), r[name], name,
                    tol.Tol(atol=bound[name]) + tol.relative(4, tol.F32))
    real = ~np.isnan(_values(ds, "output_norm"))
    T, H = ds.sizes["key"], ds.sizes["head"]
    c, cl = _values(ds, "contribution"), _values(ds, "contribution_layer")
    term = {n: bound[n] + tol.relative(4, tol.F32).rtol * np.abs(r[n]) for n in bound}
    tol.assert_close(ds["contribution"].sum("key").values[real], 1.0, tol.sums_to_one(
        T, term=np.nansum(term["contribution"], -1), size=np.nansum(np.abs(c), -1)).at(real))
    layer_total = ds["contribution_layer"].sum(["head", "key"]).values
    tol.assert_close(layer_total[real[:, :, 0]], 1.0, tol.sums_to_one(
        H * T, term=np.nansum(term["contribution_layer"], axis=(2, 4)),
        size=np.nansum(np.abs(cl), axis=(2, 4))).at(real[:, :, 0]))
    bare = attngeom.store.open(stores["llama", "dense"], derived=False)
    assert "contribution" not in bare and "contribution_layer" not in bare


@pytest.mark.parametrize("mode", ["dense", "compact"])
def test_plain_xarray_one_liner(mode, stores, opened, reference_for):
    """A collaborator without attngeom reads the same numbers with xarray alone."""
    path = stores["llama", mode]
    plain = xr.open_mfdataset(f"{path}/shards/*.nc", **ONE_LINER).load()
    r = reference_for("llama", plain)
    assert plain.sizes["sequence"] == 5
    names = ("alpha", "cosine", "value_norm", "output_norm", "head_share", "layer_output_norm")
    bound = _bounds("llama", r)
    for name in names:
        sinks = mode == "compact" and name in PAIR
        want = r[name][..., :plain.sizes["sink"]] if sinks else r[name]
        assert_same(_values(plain, name), want, name,
                    bound[name][..., :plain.sizes["sink"]] if sinks else bound[name])
    ours = opened["llama", mode]
    for name in plain.data_vars:
        np.testing.assert_array_equal(plain[name].values, ours[name].values, err_msg=name)
    assert set(ours.data_vars) - set(plain.data_vars) == {
        p + n for p in (("", "tail_") if mode == "compact" else ("",))
        for n in ("contribution", "contribution_layer")}
    assert plain.attrs["mode"] == mode and plain.attrs["sink_k"] == 2
    assert "description" in plain["alpha"].attrs
