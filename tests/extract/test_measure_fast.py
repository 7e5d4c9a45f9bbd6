"""The fast compact path (fused kernel + log-sum-exp, masks once per forward, block-banded
tail, Gram matrices cached per model) against independent computations: the float64
model-space reference (tests/reference.py) for any padding (left, right, none), plain indexing for the band
products, and a fresh Gram after an in-place weight change.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import reference as ref
import tiny_models as tm
import tolerance as tol
from store_helpers import (PER_TOKEN, assert_same, compact_bounds, expected_compact,
                           measurement_bounds, model_dims)
from attngeom.extract.measurement.capture import Measurer, capture
from attngeom.extract.measurement.geometry import band, band_values, cached_projection
from attngeom.extract.measurement.hooks import attention_handler
from attngeom.extract.measurement.layer import Options


def _inputs(arch: str, model, padding: str) -> dict:
    inputs = tm.example_inputs(arch, model, batch=3, seq_len=12, seed=1)
    mask, ids = inputs["attention_mask"], inputs["input_ids"]
    if padding == "none":
        mask[:] = 1
    elif padding == "left":                       # move each row's padding to the front
        for b in range(ids.shape[0]):
            n = int(mask[b].sum())
            ids[b] = torch.cat([ids[b, n:], ids[b, :n]])
            mask[b] = torch.cat([mask[b, n:], mask[b, :n]])
    return inputs


SINK_VALUE = ("sink_value_cosine", "sink_residual_cosine")


def _defined(inputs: dict, n_layers: int) -> np.ndarray:
    """(B, L): False where the sink key 0 is padding after layer 0.

    A padding token's hidden state beyond layer 0 comes from a query with no allowed key,
    which implementations define differently (eager: NaN or uniform, SDPA: all keys), so the
    cosines with its value v_0 are compared only where position 0 is a real token or at
    layer 0 (embedding only).
    """
    real0 = inputs["attention_mask"][:, 0].numpy().astype(bool)[:, None]
    return real0 | (np.arange(n_layers)[None] == 0)


def _check(got: dict, r: dict, bound: dict, defined: np.ndarray,
           names=tuple(ref.NAMES)) -> None:
    for name in names:
        if name not in r:
            continue
        g, w, b = got[name], r[name], bound[name]
        if name in SINK_VALUE:
            g, w, b = g[defined], w[defined], b[defined]
        assert_same(g, w, name, b)


def _check_compact(got: dict, r: dict, sink_k: int, tail_w: int, defined, dims) -> None:
    want = expected_compact(r, sink_k, tail_w)
    bound = compact_bounds(r, dims, sink_k, tail_w)
    assert set(got) == set(want) | set(PER_TOKEN)
    for name, x in want.items():
        assert_same(got[name], x, name, bound[name])
    _check(got, r, bound, defined, PER_TOKEN)


@pytest.mark.parametrize("arch,padding,sink_k,tail_w", [
    ("llama", "left", 1, 4), ("llama", "none", 2, 4), ("llama", "right", 3, 20),
    ("gemma3", "left", 2, 5), ("mistral", "right", 1, 7), ("mistral", "none", 1, 3),
    ("bert", "left", 2, 4), ("qwen2", "left", 1, 13), ("gpt2", "none", 1, 4)])
def test_compact_any_padding_equals_reference(arch, padding, sink_k, tail_w):
    model = tm.build(arch, seed=0)
    inputs = _inputs(arch, model, padding)
    r = ref.naive_measure(model, inputs, sink_k)
    assert np.isnan(r["output_norm"]).any() == (padding != "none")
    defined = _defined(inputs, r["alpha"].shape[1])
    assert defined.all() == (padding != "left")
    compact = capture(model, inputs, Options("compact", sink_k, tail_w))
    dims = model_dims(model)
    _check_compact(compact, r, sink_k, tail_w, defined, dims)
    _check(capture(model, inputs, Options("dense", sink_k, tail_w)), r,
           measurement_bounds(r, dims), defined)


def test_plain_causal_takes_the_is_causal_path():
    """No padding: the fused kernel runs with is_causal and no bias; padding: with a bias."""
    model = tm.build("llama", seed=0)
    for padding, plain in (("none", True), ("right", False)):
        inputs = _inputs("llama", model, padding)
        handler = Measurer(model, Options("compact"))
        handler.token_mask = inputs["attention_mask"].bool()
        with torch.inference_mode(), attention_handler(model, handler):
            model(**inputs)
        assert len(handler._masks) == 1                      # once per forward, not per layer
        assert (handler._masks[0][1].bias is None) == plain


def _masks(kind: str, B: int = 2, H: int = 1, T: int = 11) -> torch.Tensor:
    """A (B, H, T, T) boolean mask: causal, or one that differs from causal somewhere."""
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    a = causal[None, None].repeat(B, H, 1, 1)
    if kind == "window":                                   # sliding window of 4 keys
        a &= ~torch.ones(T, T, dtype=torch.bool).tril(-4)
    elif kind == "full":
        a[:] = True
    elif kind == "one future key":                         # the last query block's last row
        a[B - 1, 0, T - 2, T - 1] = True
    elif kind == "one missing key":                        # a row at a block's first query
        a[0, -1, 4, 2] = False
    elif kind == "one key moved":                          # as many keys as causal, not 0..i
        a[0, 0, 5, 5], a[0, 0, 5, 6] = False, True
    return a


@pytest.mark.parametrize("kind", ["causal", "window", "full", "one future key",
                                  "one missing key", "one key moved"])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("expanded", [False, True])
def test_masks_equal_their_definitions(kind, padded, expanded):
    """prepare_masks against the masks written out from the model's mask and the real tokens
    (the model's mask used without a copy when nothing is padded; its keys counted, and plain
    causal found, a block of queries at a time: blocks of 4 over 11 queries here)."""
    from attngeom.extract.measurement import layer as layer_module

    B, T, sink_k, tail_w = 2, 11, 2, 3
    allowed = _masks(kind, B, T=T)
    if expanded:                                           # the batch as a broadcast view
        allowed = allowed[:1].expand(B, -1, -1, -1)
    token = torch.ones(B, T, dtype=torch.bool)
    if padded:
        token[1, 8:] = False
    a = allowed & token[:, None, None, :]                  # the definitions, written out
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    exact = bool((a == causal).all()) and not padded
    lag = torch.arange(tail_w)
    key = torch.arange(T)[:, None] - lag[None, :]          # (T, w): keys i - lag
    tail = torch.stack([torch.stack([
        (key[i] >= sink_k) & a[b, 0, i, key[i].clamp_min(0)] for i in range(T)])
        for b in range(B)])[:, None]                       # (B, 1, T, w)
    rows = layer_module.MASK_ROWS
    try:
        layer_module.MASK_ROWS = 4
        got = layer_module.prepare_masks(allowed, token, Options("compact", sink_k, tail_w),
                                         torch.float32)
        for b in (1, 2):
            m = _masks(kind, b, T=T)
            assert layer_module._causal(*layer_module._key_counts(m)) == (kind == "causal")
    finally:
        layer_module.MASK_ROWS = rows
    assert (got.bias is None) == exact
    assert torch.equal(got.allowed.expand_as(a), a)
    assert torch.equal(got.sink_ok.expand(B, 1, T, sink_k), a[..., :sink_k])
    assert torch.equal(got.tail_ok.expand_as(tail), tail)
    assert torch.equal(got.count.expand(B, 1, T), (a.sum(-1) - a[..., :sink_k].sum(-1)
                                                   - tail.sum(-1)).float())
    assert torch.equal(got.rest.expand(B, 1, T), a[..., sink_k:].any(-1))


def test_without_derived_drops_only_derived():
    model = tm.build("llama", seed=0)
    inputs = _inputs("llama", model, "right")
    full = capture(model, inputs, Options("compact", 1, 4))
    lean = capture(model, inputs, Options("compact", 1, 4, derived=False))
    derived = {"contribution", "contribution_layer", "tail_contribution",
               "tail_contribution_layer"}
    assert set(full) - set(lean) == derived
    for name in lean:
        np.testing.assert_array_equal(lean[name], full[name])


@pytest.mark.parametrize("T,w,G,H", [(13, 4, 2, 4), (5, 8, 1, 3), (16, 1, 3, 3), (9, 9, 1, 2)])
def test_band_equals_plain_indexing(T, w, G, H):
    gen = torch.Generator().manual_seed(T * w)
    a, b = (torch.randn(2, H, T, 6, generator=gen) for _ in range(2))
    x = torch.randn(2, G, T, 6, generator=gen)
    got_a, got_b = band([a, b], x, w)
    vals = torch.randn(2, H, T, generator=gen)
    got_v = band_values(vals, w)
    for i in range(T):
        for lag in range(w):
            j = i - lag
            for h in range(H):
                xa = x[:, h // (H // G), j] if j >= 0 else torch.zeros(2, 6)
                for got, y in ((got_a, a), (got_b, b)):       # float32 dots of length 6
                    want = (y[:, h, i].double() * xa.double()).sum(-1).numpy()
                    size = (y[:, h, i].abs() * xa.abs()).sum(-1).double().numpy()
                    tol.assert_close(got[:, h, i, lag].numpy(), want,
                                     tol.dot(6, size, vs=tol.F64), "band")
                want_v = vals[:, h, j] if j >= 0 else torch.zeros(2)
                assert torch.equal(got_v[:, h, i, lag], want_v)   # indexing: exact


def test_gram_cache_follows_weight_changes():
    lin = torch.nn.Linear(6, 8, bias=False)
    w = lin.weight.T                                          # (6, 8) view, as archs gives it
    first = cached_projection(w, 3)
    assert cached_projection(lin.weight.T, 3) is first        # cached across views
    with torch.no_grad():
        lin.weight.mul_(2.0)
    second = cached_projection(lin.weight.T, 3)
    blocks = lin.weight.T.detach().double().view(3, 2, 8)
    full = lin.weight.T.detach().double()
    for got, want, size in ((second.gram, blocks @ blocks.transpose(1, 2),   # dots of length 8
                             blocks.abs() @ blocks.abs().transpose(1, 2)),
                            (second.full, full @ full.T, full.abs() @ full.abs().T)):
        tol.assert_close(got.numpy(), want.numpy(), tol.dot(8, size.numpy(), vs=tol.F64), "gram")
    assert not torch.allclose(second.gram, first.gram)
