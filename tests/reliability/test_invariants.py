"""Invariants of the mathematics on tiny random models, through the extraction code.

- Contributions sum to one over keys per (head, query) and, at layer level, over heads and keys
  (dense store, derived on read).
- Scaling a layer's output projection W_O by a constant c (negative too) leaves alpha and the
  contribution weights of that layer unchanged and multiplies value and output norms by |c|.
- Permuting heads (q/k/v/o projection blocks permuted consistently, whole GQA groups and heads
  within a group) permutes every per-head result and leaves layer-level results unchanged.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tiny_models as tm
import tolerance as tol
from store_helpers import measurement_bounds, model_dims
from attngeom.extract.measurement.capture import capture
from attngeom.extract.measurement.layer import Options

OPTS = Options(mode="dense", sink_k=1, tail_w=3)
PER_HEAD = ("alpha", "value_norm", "output_norm", "cosine", "cosine_layer", "contribution",
            "contribution_layer", "residual_norm", "head_share")


def batch(model) -> dict[str, np.ndarray]:
    inputs = tm.example_inputs("llama", model, batch=2, seq_len=12)
    return {"input_ids": inputs["input_ids"].numpy(),
            "attention_mask": inputs["attention_mask"].numpy(), "index": np.arange(2)}


@pytest.fixture(scope="module")
def clean():
    torch.manual_seed(0)
    model = tm.build("llama", seed=3)
    return model, capture(model, batch(model), OPTS)


def bounds(base: dict) -> dict[str, np.ndarray]:
    """Two float32 measurements of one quantity: each within its chain's bound (store_helpers)
    of the exact value, sizes from ``base``'s values."""
    return measurement_bounds(base, model_dims(tm.make_config("llama")), vs=tol.F32)


def test_contributions_sum_to_one(small_dense_store):
    from attngeom.store import open_store

    ds = open_store(small_dense_store).load()
    real = ds["output_norm"].notnull().values                     # (seq, layer, head, query)
    assert int(real.sum()) > 100
    r = {n: ds[n].values.astype(float) for n in PER_HEAD + ("sink_value_cosine",
                                                           "sink_residual_cosine",
                                                           "layer_output_norm")}
    term = measurement_bounds(r, model_dims(tm.make_config("llama")), vs=None)
    T, H = ds.sizes["key"], ds.sizes["head"]
    c, C = r["contribution"], r["contribution_layer"]
    tol.assert_close(ds["contribution"].sum("key", skipna=True).values[real], 1.0,
                     tol.sums_to_one(T, term=np.nansum(term["contribution"], -1),
                                     size=np.nansum(np.abs(c), -1)).at(real), "sum_j c_ij^h")
    layer_real = ds["layer_output_norm"].notnull().values
    tol.assert_close(ds["contribution_layer"].sum(["head", "key"], skipna=True).values[layer_real],
                     1.0, tol.sums_to_one(H * T, term=np.nansum(term["contribution_layer"],
                                                                axis=(2, 4)),
                                          size=np.nansum(np.abs(C), axis=(2, 4))).at(layer_real),
                     "sum_h sum_j C_ij^h")
    assert float(ds["contribution"].min()) < 0          # really signed, not a trivial 1/n


@pytest.mark.parametrize("c", [3.0, -0.4])
def test_scaling_w_o_leaves_contributions(clean, c):
    model, base = clean
    scaled = tm.build("llama", seed=3)
    last = scaled.model.layers[-1].self_attn.o_proj           # later layers see nothing new
    with torch.no_grad():
        last.weight.mul_(c)
    got = capture(scaled, batch(scaled), OPTS)
    L = -1
    bound = bounds(base)                        # (+ W_O x c rounded: one more u, relative)
    for name in ("alpha", "cosine", "contribution", "contribution_layer", "head_share"):
        tol.assert_close(got[name][:, L], base[name][:, L],
                         tol.Tol(atol=bound[name][:, L]) + tol.relative(1),
                         f"{name} with W_O x {c}")
    for name in ("value_norm", "output_norm", "residual_norm", "layer_output_norm"):
        tol.assert_close(got[name][:, L], abs(c) * base[name][:, L],
                         tol.Tol(atol=abs(c) * bound[name][:, L]) + tol.relative(2),
                         f"{name} with W_O x {c}")
    for name in PER_HEAD:                                      # earlier layers untouched
        np.testing.assert_array_equal(got[name][:, 0], base[name][:, 0], f"{name} layer 0")


def permuted_model(perm: list[int], groups: list[int]) -> torch.nn.Module:
    """The seed-3 llama with head h of the new model = head perm[h] of the old one."""
    model = tm.build("llama", seed=3)
    d = model.config.head_dim
    q_rows = torch.cat([torch.arange(p * d, (p + 1) * d) for p in perm])
    kv_rows = torch.cat([torch.arange(g * d, (g + 1) * d) for g in groups])
    with torch.no_grad():
        for layer in model.model.layers:
            attn = layer.self_attn
            attn.q_proj.weight.copy_(attn.q_proj.weight[q_rows])
            attn.k_proj.weight.copy_(attn.k_proj.weight[kv_rows])
            attn.v_proj.weight.copy_(attn.v_proj.weight[kv_rows])
            attn.o_proj.weight.copy_(attn.o_proj.weight[:, q_rows])
    return model


@pytest.mark.parametrize("perm, groups", [([1, 0, 2, 3], [0, 1]),       # within a group
                                          ([3, 2, 0, 1], [1, 0])])      # groups swapped too
def test_permuting_heads_permutes_results(clean, perm, groups):
    model, base = clean
    assert model.config.num_attention_heads == 4 and model.config.num_key_value_heads == 2
    assert all(perm[h] // 2 == groups[h // 2] for h in range(4))         # a valid GQA permutation
    new = permuted_model(perm, groups)
    got = capture(new, batch(new), OPTS)
    bound = bounds(base)
    for name in PER_HEAD:
        tol.assert_close(got[name], base[name][:, :, perm], tol.Tol(atol=bound[name][:, :, perm]),
                         f"{name} permuted {perm}")
    tol.assert_close(got["layer_output_norm"], base["layer_output_norm"],
                     tol.Tol(atol=bound["layer_output_norm"]), "layer_output_norm")
    # the permutation is not the identity (a difference far beyond rounding, not a tolerance)
    assert not np.allclose(np.nan_to_num(base["alpha"][:, :, perm]), np.nan_to_num(base["alpha"]))
