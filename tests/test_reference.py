"""Tests of the naive reference itself (tests/reference.py) on every tiny architecture."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

try:
    from tests import reference as ref
    from tests import tiny_models as tm
    from tests import tolerance as tol
    from tests.store_helpers import measurement_bounds, model_dims, module_output_size
except ImportError:  # tests/ on sys.path (pytest rootdir-less import)
    import reference as ref
    import tiny_models as tm
    import tolerance as tol
    from store_helpers import measurement_bounds, model_dims, module_output_size

ARCHS = tm.ARCHITECTURES
PER_PAIR = ("alpha", "cosine", "cosine_layer", "contribution", "contribution_layer")
PER_KEY = ("value_norm", "sink_value_cosine")
PER_QUERY = ("output_norm", "residual_norm", "sink_residual_cosine", "head_share")


@functools.lru_cache(maxsize=None)
def _run(arch: str):
    model = tm.build(arch, seed=0)
    inputs = tm.example_inputs(arch, model, batch=2, seq_len=12, seed=0)
    caps = ref.naive_capture(model, inputs)
    res = ref.naive_measure(model, inputs, sink_k=1)
    return model, inputs, caps, res


def _lengths(arch: str, T: int) -> np.ndarray:
    return np.full(2, T) if arch == "vit" else np.array(tm.sequence_lengths(2, 12))


def _expected_valid(arch: str, layer: int, T: int) -> np.ndarray:
    """(B, Tq, Tk) written from the tiny configs, independently of reference.valid_mask."""
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    ok = np.ones((T, T), bool) if arch in ("bert", "vit") else j <= i
    if arch == "mistral":
        ok = ok & (i - j < 6)
    if arch == "gemma3" and layer == 0:
        ok = ok & (i - j < 4)
    n = _lengths(arch, T)
    inside = np.arange(T)[None] < n[:, None]
    return ok[None] & inside[:, :, None] & inside[:, None, :]


def _module_output_size(cap: ref.LayerCapture) -> np.ndarray:
    """(B, T, d): the sum of |terms| of the model's float32 chain x W_V -> alpha v -> W_O."""
    B, H, T, _ = cap.alpha.shape
    dh = cap.w_o.shape[0] // H
    v = np.abs(cap.x) @ np.abs(cap.w_v) + np.abs(cap.b_v)                 # (B, T, G*dh)
    return module_output_size(cap.alpha, v.reshape(B, T, -1, dh).transpose(0, 2, 1, 3),
                              cap.w_o, cap.b_o)


@pytest.mark.parametrize("arch", ARCHS)
def test_reconstructs_module_output(arch):
    """Σ_h Σ_j α ṽ + b_O equals the output projection's real output (validates W_O / g(h))."""
    model, _, caps, _ = _run(arch)
    dims = model_dims(model)
    for cap in caps:
        assert np.abs(cap.module_output).max() > 1e-2  # a real signal, not zeros
        # the module's float32 chain on the same float32 x and alpha: d + T + H d_head terms
        n = dims["d"] + cap.alpha.shape[-1] + dims["heads"] * dims["d_head"]
        tol.assert_close(ref.reconstructed_output(cap), cap.module_output,
                         tol.dot(n, _module_output_size(cap), vs=tol.F64), "module output")


@pytest.mark.parametrize("arch", ARCHS)
def test_reconstruction_detects_wrong_head_mapping(arch):
    """The check above can fail: swapping two heads' W_O blocks breaks it."""
    _, _, caps, _ = _run(arch)
    cap = caps[0]
    H = cap.alpha.shape[1]
    dh = cap.w_o.shape[0] // H
    w_o = cap.w_o.copy()
    w_o[:dh], w_o[dh:2 * dh] = cap.w_o[dh:2 * dh], cap.w_o[:dh]
    bad = ref.LayerCapture(**{**cap.__dict__, "w_o": w_o})
    assert np.abs(ref.reconstructed_output(bad) - cap.module_output).max() > 1e-3


@pytest.mark.parametrize("arch", ARCHS)
def test_shapes(arch):
    model, _, caps, res = _run(arch)
    B, L, H, T = 2, 2, model.config.num_attention_heads, caps[0].alpha.shape[-1]
    assert set(res) == set(ref.NAMES)
    for name in PER_PAIR:
        assert res[name].shape == (B, L, H, T, T), name
    for name in PER_KEY + PER_QUERY:
        assert res[name].shape == (B, L, H, T), name
    assert res["layer_output_norm"].shape == (B, L, T)
    assert all(v.dtype == np.float64 for v in res.values())


@pytest.mark.parametrize("arch", ARCHS)
def test_contributions_sum_to_one(arch):
    model, _, _, res = _run(arch)
    q_ok = ~np.isnan(res["output_norm"])                                  # (B, L, H, T)
    T, H = res["alpha"].shape[-1], res["alpha"].shape[2]
    # the reference's float64 terms, each within its chain's bound (attention_terms is longer)
    b = measurement_bounds(res, model_dims(model), vs=None, dtype=tol.F64)
    c, cl = res["contribution"], res["contribution_layer"]
    tol.assert_close(np.nansum(c, -1)[q_ok], 1.0, tol.sums_to_one(
        T, term=np.nansum(b["contribution"], -1), size=np.nansum(np.abs(c), -1),
        dtype=tol.F64).at(q_ok))
    layer = tol.sums_to_one(H * T, term=np.nansum(b["contribution_layer"], axis=(2, 4)),
                            size=np.nansum(np.abs(cl), axis=(2, 4)), dtype=tol.F64)
    tol.assert_close(np.nansum(cl, axis=(2, 4))[q_ok[:, :, 0]], 1.0, layer.at(q_ok[:, :, 0]))
    share = tol.Tol(atol=np.nansum(b["contribution_layer"], -1) + b["head_share"]) + tol.total(
        T, np.nansum(np.abs(cl), -1), tol.F64)
    tol.assert_close(np.nansum(cl, -1)[q_ok], res["head_share"][q_ok], share.at(q_ok))
    tol.assert_close(res["head_share"].sum(2)[q_ok[:, :, 0]], 1.0, tol.sums_to_one(
        H, term=b["head_share"].sum(2), size=np.abs(res["head_share"]).sum(2),
        dtype=tol.F64).at(q_ok[:, :, 0]))
    # alpha rows over the valid keys sum to one as well: eager's float32 softmax (a
    # normaliser, then a reciprocal and a product per term)
    np.testing.assert_allclose(np.nansum(res["alpha"], -1)[q_ok], 1.0,
                               **tol.sums_to_one(T, depth=T + 1))


@pytest.mark.parametrize("arch", ARCHS)
def test_decomposition_identities(arch):
    """c = α ‖ṽ‖ cos / ‖o‖, and ‖r‖² = ‖o‖² − 2α₀⟨o, ṽ₀⟩ + α₀²‖ṽ₀‖² (sink_k=1)."""
    model, _, _, res = _run(arch)
    a, vn, on = res["alpha"], res["value_norm"], res["output_norm"]
    # two float64 routes to one value, each within the reference's chain (+ 4 products)
    b = measurement_bounds(res, model_dims(model), vs=tol.F64, dtype=tol.F64)
    c = a * vn[:, :, :, None, :] * res["cosine"] / on[..., None]
    tol.assert_close(c, res["contribution"],
                     tol.Tol(atol=b["contribution"]) + tol.relative(4, tol.F64), "c")
    a0, v0 = a[..., 0], vn[..., :1]
    dot = on * v0 * res["cosine"][..., 0]
    r2 = on ** 2 - 2 * a0 * dot + a0 ** 2 * v0 ** 2
    ok = ~np.isnan(r2)
    # ||o||^2, the sink's term and ||r||^2 are of size (||o|| + a0 ||v0||)^2; r2 cancels them
    size = (on + a0 * v0) ** 2
    n = tol.attention_terms(T=a.shape[-1], layer=1, **model_dims(model))
    np.testing.assert_allclose(res["residual_norm"][ok] ** 2, r2[ok],
                               **tol.dot(n, np.nanmax(size), tol.F64, vs=tol.F64))
    assert np.isfinite(res["layer_output_norm"][~np.isnan(res["layer_output_norm"])]).all()
    assert (res["contribution"] < 0).any()  # contributions can be negative (NaN compares False)


@pytest.mark.parametrize("arch", ARCHS)
def test_nan_convention(arch):
    _, _, caps, res = _run(arch)
    T = caps[0].alpha.shape[-1]
    n = _lengths(arch, T)
    for layer in range(2):
        valid = _expected_valid(arch, layer, T)[:, None]                  # (B, 1, T, T)
        for name in PER_PAIR:
            arr = res[name][:, layer]
            assert np.array_equal(np.isnan(arr), np.broadcast_to(~valid, arr.shape)), name
    inside = np.arange(T)[None] < n[:, None]                              # (B, T)
    for name in PER_KEY + PER_QUERY:
        arr = res[name]
        padded = np.broadcast_to(~inside[:, None, None], arr.shape)
        assert np.isnan(arr[padded]).all(), name
    assert np.isnan(res["layer_output_norm"][np.broadcast_to(~inside[:, None], (2, 2, T))]).all()
    for name in ("value_norm", "output_norm", "residual_norm", "head_share", "sink_value_cosine"):
        assert not np.isnan(res[name][np.broadcast_to(inside[:, None, None], res[name].shape)]).any()
    if arch == "vit":
        assert not np.isnan(res["alpha"]).any()


@pytest.mark.parametrize("arch", ARCHS)
def test_mask_matches_the_model(arch):
    """The raw eager α is exactly 0 where the reference says a key is invalid for a real query."""
    _, _, caps, _ = _run(arch)
    T = caps[0].alpha.shape[-1]
    inside = np.arange(T)[None] < _lengths(arch, T)[:, None]
    for layer, cap in enumerate(caps):
        valid = _expected_valid(arch, layer, T)[:, None]
        real_q = np.broadcast_to(inside[:, None, :, None], cap.alpha.shape)
        assert (cap.alpha[real_q & ~valid] == 0).all()
        np.testing.assert_allclose((cap.alpha * valid).sum(-1)[real_q[..., 0]], 1.0,
                                   **tol.sums_to_one(T, depth=T + 1))   # eager's softmax


def test_sliding_window_bites():
    _, _, _, res = _run("gemma3")
    a = res["alpha"][0]                                                   # (L, H, T, T)
    assert np.isnan(a[0, :, 11, 7]).all() and not np.isnan(a[0, :, 11, 8]).any()
    assert not np.isnan(a[1, :, 11, 0]).any()                             # full layer
    _, _, _, res = _run("mistral")
    assert np.isnan(res["alpha"][0, :, :, 11, 5]).all()


def test_sink_k_and_residual():
    model, inputs, _, res1 = _run("llama")
    res2 = ref.naive_measure(model, inputs, sink_k=2)
    for name in ("alpha", "contribution", "value_norm", "output_norm"):
        np.testing.assert_array_equal(res1[name], res2[name])
    # query 0 sees only the sink: residual is exactly zero, its cosine undefined
    assert (res1["residual_norm"][..., 0] == 0).all()
    assert np.isnan(res1["sink_residual_cosine"][..., 0]).all()
    # query 1 with two sinks: r = o - (its two sink terms) cancels to rounding, float64
    T, d = res1["alpha"].shape[-1], model.config.hidden_size
    two = (res2["alpha"][..., 1, :2] * res2["value_norm"][..., :2]).sum(-1)   # sum alpha ||v~||
    tol.assert_close(res2["residual_norm"][..., 1], 0.0,
                     tol.dot(tol.attention_terms(T=T, **model_dims(model)), two, tol.F64), "r")
    q = ~np.isnan(res1["output_norm"][..., 3:])
    assert (res2["residual_norm"][..., 3:][q] != res1["residual_norm"][..., 3:][q]).all()
    real = ~np.isnan(res1["value_norm"][..., 0])                      # cos(v~_0, v~_0): d + 3
    np.testing.assert_allclose(res1["sink_value_cosine"][..., 0][real], 1.0,
                               **tol.dot(d + 3, 2.0, tol.F64))


def test_reference_leaves_the_model_alone():
    model = tm.build("llama", attn_implementation="sdpa")
    inputs = tm.example_inputs("llama", model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ref.naive_measure(model, inputs)
    assert model.config._attn_implementation == "sdpa"
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_tiny_model_quirks():
    llama = tm.build("llama")
    attn = llama.model.layers[0].self_attn
    assert attn.v_proj.out_features * 2 == attn.q_proj.out_features  # GQA 4 query / 2 kv heads
    qwen2 = tm.build("qwen2")
    assert qwen2.model.layers[0].self_attn.v_proj.bias.abs().min() > 0
    assert not llama.training and next(llama.parameters()).dtype == torch.float32
    a, b = tm.build("gpt2", seed=3), tm.build("gpt2", seed=3)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))


@pytest.mark.parametrize("arch", ["llama", "bert", "vit"])
def test_save_tiny_roundtrip(arch, tmp_path):
    import transformers as tf

    path = tm.save_tiny(arch, tmp_path / arch)
    model = tf.AutoModel.from_pretrained(path)
    assert model.config.model_type == arch
    if arch == "vit":
        proc = tf.ViTImageProcessor.from_pretrained(path)  # AutoImageProcessor of transformers
        # 5.17 needs torchvision (not a dependency); ViTImageProcessor falls back to PIL there
        px = proc(np.zeros((20, 20, 3), np.uint8), return_tensors="pt")["pixel_values"]
        assert px.shape == (1, 3, tm.IMAGE_SIZE, tm.IMAGE_SIZE)
        return
    tok = tf.AutoTokenizer.from_pretrained(path)
    enc = tok(["the way of people", "the"], padding=True, return_tensors="pt")
    assert enc["input_ids"][0, 0].item() == tm.BOS_ID
    expected = [1, 1, 1, 0, 0, 0] if arch == "bert" else [1, 1, 0, 0, 0]
    assert enc["attention_mask"][1].tolist() == expected
    assert enc["input_ids"].max() < model.config.vocab_size
