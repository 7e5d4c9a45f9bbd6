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


def close(a, b, name, rtol=2e-5, atol=2e-6):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.array_equal(np.isnan(a), np.isnan(b)), name
    np.testing.assert_allclose(a[~np.isnan(a)], b[~np.isnan(b)], rtol=rtol, atol=atol,
                               err_msg=name)


def test_contributions_sum_to_one(small_dense_store):
    from attngeom.store import open_store

    ds = open_store(small_dense_store).load()
    real = ds["output_norm"].notnull()                            # (seq, layer, head, query)
    c = ds["contribution"].sum("key", skipna=True).where(real)
    assert int(real.sum()) > 100
    close(c.values[real.values], np.ones(int(real.sum())), "sum_j c_ij^h")
    layer_real = ds["layer_output_norm"].notnull()
    C = ds["contribution_layer"].sum(["head", "key"], skipna=True).where(layer_real)
    close(C.values[layer_real.values], np.ones(int(layer_real.sum())), "sum_h sum_j C_ij^h")
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
    for name in ("alpha", "cosine", "contribution", "contribution_layer", "head_share"):
        close(got[name][:, L], base[name][:, L], f"{name} with W_O x {c}", atol=2e-5)
    for name in ("value_norm", "output_norm", "residual_norm"):
        close(got[name][:, L], abs(c) * base[name][:, L], f"{name} with W_O x {c}")
    close(got["layer_output_norm"][:, L], abs(c) * base["layer_output_norm"][:, L], "||o_i||")
    for name in PER_HEAD:                                      # earlier layers untouched
        close(got[name][:, 0], base[name][:, 0], f"{name} layer 0", rtol=0, atol=0)


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
    for name in PER_HEAD:
        close(got[name], base[name][:, :, perm], f"{name} permuted {perm}", atol=2e-5)
    close(got["layer_output_norm"], base["layer_output_norm"], "layer_output_norm")
    assert not np.allclose(np.nan_to_num(base["alpha"][:, :, perm]), np.nan_to_num(base["alpha"]))
