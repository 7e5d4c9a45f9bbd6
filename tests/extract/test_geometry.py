"""attngeom.extract.measurement.capture.capture against the independent naive reference
(tests/reference.py).

Every tiny architecture (GQA, value bias, sliding window, q/k norms, Conv1D, encoder, vit), dense
and compact, sink_k 1 and 2. The expected compact arrays are built from the reference's dense
(query, key) arrays by plain indexing (tests/store_helpers.expected_compact).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

import reference as ref
import tiny_models as tm
import tolerance as tol
from store_helpers import (PER_TOKEN, assert_same, compact_bounds, expected_compact,
                           forward_bound, measurement_bounds, model_dims)
from attngeom.extract.measurement import geometry
from attngeom.extract.measurement.capture import Measurer, capture
from attngeom.extract.measurement.hooks import attention_handler
from attngeom.extract.measurement.layer import Options

ARCHS = tm.ARCHITECTURES
TAIL_W = 4


@functools.lru_cache(maxsize=None)
def _model(arch: str):
    model = tm.build(arch, seed=0)
    return model, tm.example_inputs(arch, model, batch=2, seq_len=12, seed=0)


@functools.lru_cache(maxsize=None)
def _reference(arch: str, sink_k: int) -> dict[str, np.ndarray]:
    model, inputs = _model(arch)
    return ref.naive_measure(model, inputs, sink_k=sink_k)


@functools.lru_cache(maxsize=None)
def _measured(arch: str, mode: str, sink_k: int) -> dict[str, np.ndarray]:
    model, inputs = _model(arch)
    return capture(model, inputs, Options(mode, sink_k, TAIL_W))


@pytest.mark.parametrize("sink_k", [1, 2])
@pytest.mark.parametrize("arch", ARCHS)
def test_dense_equals_reference(arch, sink_k):
    r, got = _reference(arch, sink_k), _measured(arch, "dense", sink_k)
    assert set(got) == set(ref.NAMES)
    assert all(x.dtype == np.float32 for x in got.values())
    bound = measurement_bounds(r, model_dims(_model(arch)[0]))
    for name in ref.NAMES:
        assert_same(got[name], r[name], name, bound[name])


@pytest.mark.parametrize("sink_k", [1, 2])
@pytest.mark.parametrize("arch", ARCHS)
def test_compact_equals_reference(arch, sink_k):
    r, got = _reference(arch, sink_k), _measured(arch, "compact", sink_k)
    want = expected_compact(r, sink_k, TAIL_W)
    assert set(got) == set(want) | set(PER_TOKEN)
    bound = compact_bounds(r, model_dims(_model(arch)[0]), sink_k, TAIL_W)
    for name, x in want.items():
        assert_same(got[name], x, name, bound[name])
    for name in PER_TOKEN:
        assert_same(got[name], r[name], name, bound[name])


def test_compact_parts_are_not_trivial():
    """The comparisons above exercise every group: the middle is non-empty, tails hit sinks."""
    r = expected_compact(_reference("llama", 1), 1, TAIL_W)
    assert np.nanmax(r["middle_count"]) >= 12 - 1 - TAIL_W
    assert np.nanmax(np.abs(r["middle_contribution"])) > 1e-2
    assert np.isnan(r["tail_alpha"][0, 0, 0, TAIL_W - 1]).any()     # lag reaching the sink
    mistral = _reference("mistral", 1)                              # window 6 hides the sink
    assert np.isnan(mistral["alpha"][0, 0, 0, 11, 0])


@pytest.mark.parametrize("arch", ARCHS)
def test_contributions_sum_to_one(arch):
    got = _measured(arch, "dense", 1)
    real = ~np.isnan(got["output_norm"])                                # (B, L, H, T)
    T = got["alpha"].shape[-1]
    # each term within its measurement bound (sizes from the float32 values themselves)
    term = measurement_bounds(got, model_dims(_model(arch)[0]), vs=None)
    c, cl = got["contribution"], got["contribution_layer"]
    tol.assert_close(np.nansum(c, -1)[real], 1.0, tol.sums_to_one(
        T, term=np.nansum(term["contribution"], -1), size=np.nansum(np.abs(c), -1)).at(real))
    tol.assert_close(np.nansum(cl, axis=(2, 4))[real[:, :, 0]], 1.0, tol.sums_to_one(
        c.shape[2] * T, term=np.nansum(term["contribution_layer"], axis=(2, 4)),
        size=np.nansum(np.abs(cl), axis=(2, 4))).at(real[:, :, 0]))
    # a softmax row: its normaliser (T - 1 additions) and a division per term, then the sum
    np.testing.assert_allclose(np.nansum(got["alpha"], -1)[real], 1.0,
                               **tol.sums_to_one(T, depth=T))


def _forward(model, inputs, handler=None):
    with torch.inference_mode():
        if handler is None:
            out = model(**inputs)
        else:
            with attention_handler(model, handler):
                out = model(**inputs)
    return (out.logits if hasattr(out, "logits") else out.last_hidden_state).numpy()


@pytest.mark.parametrize("mode", ["dense", "compact"])
@pytest.mark.parametrize("arch", ARCHS)
def test_measurement_leaves_forward_unchanged(arch, mode):
    model, inputs = _model(arch)
    previous = model.config._attn_implementation
    handler = Measurer(model, Options(mode, 1, TAIL_W))
    if "attention_mask" in inputs:
        handler.token_mask = inputs["attention_mask"].bool()
    measured = _forward(model, inputs, handler)
    assert len(handler.results) == model.config.num_hidden_layers      # every layer hooked
    assert model.config._attn_implementation == previous                # restored afterwards
    real = (inputs["attention_mask"].bool().numpy() if "attention_mask" in inputs
            else np.ones(measured.shape[:2], bool))                     # padded rows are free
    for impl in ("eager", "sdpa"):
        model.set_attn_implementation(impl)
        try:
            plain = _forward(model, inputs)
        finally:
            model.set_attn_implementation(previous)
        np.testing.assert_allclose(measured[real], plain[real], err_msg=impl,
                                   **forward_bound(model, measured.shape[1], plain[real]))


@pytest.mark.parametrize("shapes", [((2, 3, 50, 8), (2, 3, 50, 8)),
                                    ((1, 3, 40, 3, 8), (1, 3, 40, 1, 8)),   # broadcast heads
                                    ((5, 8), (5, 8))])
def test_vecdot_in_slices_is_the_whole_product_summed_bit_for_bit(monkeypatch, shapes):
    """Slicing the elementwise product (here to 256 bytes) changes no bit of the dot."""
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randn(s, generator=gen) for s in shapes)
    whole = (a * b).sum(-1)
    monkeypatch.setattr(geometry, "DOT_BYTES", 256)
    assert torch.equal(geometry.vecdot(a, b), whole)
    x, y = np.broadcast_arrays(a.double().numpy(), b.double().numpy())
    exact = (x * y).sum(-1)                          # float64: exact to ~1e-16 here
    # a float32 sum of d products errs by at most d * 2**-24 * sum |a_i b_i| (rounding)
    bound = x.shape[-1] * 2.0**-24 * np.abs(x * y).sum(-1)
    assert (np.abs(geometry.vecdot(a, b).double().numpy() - exact) <= bound).all()


def test_a_row_with_no_allowed_key_attends_nowhere():
    """softmax_masked: zeros where a row sees no key, the plain softmax over the allowed keys
    elsewhere (closed form exp(x_j) / sum_allowed exp(x_k)), with and without such a row."""
    softmax_masked = geometry.softmax_masked
    # float64 over 7 keys: exp, the sum and the division differ by a few u between the two
    # forms (softmax subtracts the row's max first); rtol 1e-14 is about 45 u
    x = torch.randn(2, 3, 5, 7, dtype=torch.float64)
    allowed = torch.rand(2, 1, 5, 7) < 0.6
    allowed[..., 0] = True
    want = torch.where(allowed, x.exp(), 0) / torch.where(allowed, x.exp(), 0).sum(-1, True)
    torch.testing.assert_close(softmax_masked(x, allowed), want, rtol=1e-14, atol=0)
    allowed[1, 0, 2] = False                                        # one row sees nothing
    want[1, :, 2] = 0
    got = softmax_masked(x, allowed)
    assert not got.isnan().any()
    torch.testing.assert_close(got, torch.where(allowed, want, 0.0), rtol=1e-14, atol=0)
