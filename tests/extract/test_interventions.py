"""Interventions (attngeom.extract.faithfulness.interventions) against independent references.

- p = 0 gives the clean model's logits; removing every key gives the model whose attention
  output is the output bias only (o_proj input zeroed by a plain forward pre-hook).
- Metric scores equal model-space float64 values built from the traced layer inputs and the
  modules' own W_O; the removal masks equal a plain-loop selection; the intervened layer output
  equals sum over kept (head, key) of alpha * v~ (+ b_O), captured at the output projection.
- Sink zeroing equals zeroing v_proj's output at the sink positions.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch

try:
    from tests import reference as ref
    from tests import tiny_models as tm
    from tests import tolerance as tol
    from tests.store_helpers import forward_bound, model_dims, module_output_size, score_size
except ImportError:
    import reference as ref
    import tiny_models as tm
    import tolerance as tol
    from store_helpers import forward_bound, model_dims, module_output_size, score_size

from attngeom.extract.measurement.hooks import attention_handler
from attngeom.extract.faithfulness.interventions import (GRANULARITIES, MODES, RANKS,
                                                         DriftProbe, Intervener, Removal,
                                                         metric_scores, select)

CAUSAL = ("llama", "mistral", "qwen2", "gemma3", "gpt2")
METRICS = ("attention", "value_weighted", "value_weighted_normalized", "contribution",
           "contribution_layer")


@functools.lru_cache(maxsize=None)
def _model(arch: str):
    model = tm.build(arch, seed=0)
    return model, tm.example_inputs(arch, model, batch=2, seq_len=12, seed=1)


def _output(model, inputs, handler=None) -> torch.Tensor:
    """Logits (decoders) or last hidden state (bert), through ``handler`` when given."""
    def call():
        out = model(**inputs, use_cache=False) if hasattr(model, "lm_head") else model(**inputs)
        return out.logits if hasattr(out, "logits") and out.logits is not None \
            else out.last_hidden_state
    with torch.no_grad():
        if handler is None:
            return call()
        handler.token_mask = inputs["attention_mask"].bool()
        with attention_handler(model, handler):
            return call()


def _real(inputs) -> torch.Tensor:
    return inputs["attention_mask"].bool()


# ------------------------------------------------------------------------------ p = 0 / p = 1
@pytest.mark.parametrize("arch", CAUSAL + ("bert",))
def test_zero_fraction_reproduces_clean_model(arch):
    model, inputs = _model(arch)
    plain = _output(model, inputs)
    clean = _output(model, inputs, Intervener(model))
    real = _real(inputs)
    np.testing.assert_allclose(clean[real].numpy(), plain[real].numpy(),
                               **forward_bound(model, real.shape[1], plain[real]))
    for granularity in GRANULARITIES:
        for metric in METRICS:
            for mode in MODES:
                r = Removal(metric, mode, 0.0, "magnitude", granularity)
                got = _output(model, inputs, Intervener(model, removal=r))
                assert torch.equal(got, clean), (granularity, metric, mode)


def _zero_attention_output(model, inputs) -> torch.Tensor:
    """The model with every output projection's input zeroed: attention output = b_O."""
    handles = [proj["out"].register_forward_pre_hook(lambda m, a: (torch.zeros_like(a[0]),))
               for _, proj in ref._attention_modules(model)]
    try:
        return _output(model, inputs)
    finally:
        for h in handles:
            h.remove()


@pytest.mark.parametrize("arch", CAUSAL + ("bert",))
def test_removing_every_key_zeroes_attention(arch):
    model, inputs = _model(arch)
    expected = _zero_attention_output(model, inputs)
    real = _real(inputs)
    assert (expected[real] - _output(model, inputs)[real]).abs().max() > 1e-2   # it does bite
    for granularity in GRANULARITIES:
        for metric, mode in (("contribution", "comprehensiveness"),
                             ("attention", "sufficiency"), ("contribution_layer", "sufficiency")):
            r = Removal(metric, mode, 1.0, "signed", granularity)
            got = _output(model, inputs, Intervener(model, removal=r))
            np.testing.assert_allclose(got[real].numpy(), expected[real].numpy(),
                                       err_msg=f"{granularity} {metric} {mode}",
                                       **forward_bound(model, real.shape[1], expected[real]))


def test_layers_option_restricts_the_intervention():
    model, inputs = _model("llama")
    trace: list = []
    r = Removal("attention", "comprehensiveness", 0.5, layers=frozenset({1}))
    _output(model, inputs, Intervener(model, removal=r, trace=trace))
    assert trace[0]["remove"] is None and trace[1]["remove"].any()


# ------------------------------------------------------------------------------ loop reference
def loop_select(score, eligible, p, mode, rank, granularity):
    """Plain-loop selection from the definition (numpy in, bool (B, H, T, Tk) out)."""
    B, H, T, Tk = score.shape
    eligible = np.broadcast_to(eligible, score.shape)
    out = np.zeros(score.shape, dtype=bool)

    def pick(cands, value):
        ranked = sorted(cands, key=lambda c: (-value(c), c))
        n = math.floor(p * len(cands) + 0.5)
        return ranked[:n] if mode == "comprehensiveness" else ranked[len(ranked) - n:]

    mag = (lambda x: abs(x)) if rank == "magnitude" else (lambda x: x)
    for b in range(B):
        for i in range(T):
            if granularity == "head":
                for h in range(H):
                    cands = [j for j in range(Tk) if eligible[b, h, i, j]]
                    for j in pick(cands, lambda j: mag(float(score[b, h, i, j]))):
                        out[b, h, i, j] = True
            elif granularity == "query":
                cands = [(j, h) for j in range(Tk) for h in range(H) if eligible[b, h, i, j]]
                for j, h in pick(cands, lambda c: mag(float(score[b, c[1], i, c[0]]))):
                    out[b, h, i, j] = True
            else:
                cands = [j for j in range(Tk) if eligible[b, :, i, j].any()]

                def total(j):
                    return mag(sum(float(score[b, h, i, j]) for h in range(H)
                                   if eligible[b, h, i, j]))
                for j in pick(cands, total):
                    for h in range(H):
                        out[b, h, i, j] = bool(eligible[b, h, i, j])
    return out


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_selection_with_ties_matches_loops(granularity):
    gen = torch.Generator().manual_seed(3)
    B, H, T = 2, 3, 9
    score = torch.randint(-2, 3, (B, H, T, T), generator=gen).float()   # many ties, signs
    eligible = torch.ones(T, T, dtype=torch.bool).tril()[None, None].repeat(B, 1, 1, 1)
    eligible[1, :, :, 7:] = False
    eligible[1, :, 7:, :] = False
    for p in (0.0, 0.1, 0.25, 0.5, 0.7, 1.0):
        for mode in MODES:
            for rank in RANKS:
                got = select(score, eligible, p, mode, rank, granularity).numpy()
                want = loop_select(score.numpy(), eligible.numpy(), p, mode, rank, granularity)
                assert np.array_equal(got, want), (p, mode, rank)


def _score_bound(alpha, v, w_o, dims) -> np.ndarray:
    """The float32 scores' rounding bound, alpha and v given (layer 0's chain)."""
    size = score_size(alpha.double().numpy(), v.double().numpy(), w_o)
    return tol.dot(tol.attention_terms(T=alpha.shape[-1], **dims), size, vs=tol.F64).atol


def _model_space_scores(metric, alpha, v, w_o, n_heads):
    """float64 scores from model-space projected values, per the definitions in MISSION.md."""
    a, v = alpha.double().numpy(), v.double().numpy()              # (B,H,T,T), (B,H,T,dh)
    B, H, T, dh = v.shape
    vt = np.stack([v[:, h] @ w_o[h * dh:(h + 1) * dh] for h in range(H)], 1)   # (B,H,T,d)
    o_h = np.einsum("bhij,bhjd->bhid", a, vt)
    o = o_h.sum(1)
    vn = np.linalg.norm(vt, axis=-1)[:, :, None, :]
    on = np.linalg.norm(o_h, axis=-1)[..., None]
    if metric == "attention":
        return a
    if metric == "value_weighted":
        return a * vn
    if metric == "value_weighted_normalized":
        return a * vn / on
    if metric == "contribution":
        return a * np.einsum("bhid,bhjd->bhij", o_h, vt) / on ** 2
    return a * np.einsum("bid,bhjd->bhij", o, vt) / (o ** 2).sum(-1)[:, None, :, None]


@pytest.mark.parametrize("arch", ["llama", "mistral", "gpt2", "bert"])
def test_online_scores_and_selection_match_references(arch):
    model, inputs = _model(arch)
    modules = ref._attention_modules(model)
    n_heads = model.config.num_attention_heads
    outputs = {}
    hooks = [proj["out"].register_forward_hook(
        lambda m, a, o, k=k: outputs.__setitem__(k, o.detach())) for k, (_, proj) in
        enumerate(modules)]
    try:
        for granularity in GRANULARITIES:
            for metric in METRICS:
                for mode in MODES:
                    for rank in RANKS:
                        trace: list = []
                        r = Removal(metric, mode, 0.3, rank, granularity)
                        _output(model, inputs, Intervener(model, removal=r, trace=trace))
                        for t in trace:
                            _check_layer(t, modules[t["layer"]][1], outputs[t["layer"]], r,
                                         model_dims(model))
    finally:
        for h in hooks:
            h.remove()


def _check_layer(t, proj, module_output, r, dims):
    n_heads = dims["heads"]
    eligible = t["allowed"] & t["token_mask"][:, None, None, :] & t["token_mask"][:, None, :, None]
    e = eligible.expand_as(t["alpha"]).numpy()
    score = metric_scores(r.metric, t["alpha"], t["v"], t["alpha"] @ t["v"],
                          _projection(t))
    want = _model_space_scores(r.metric, t["alpha"], t["v"], proj["w_o"], n_heads)
    bound = _score_bound(t["alpha"], t["v"], proj["w_o"], dims)
    tol.assert_close(score.numpy()[e], want[e], tol.Tol(atol=bound[e]), r.metric)
    remove = loop_select(score.numpy(), eligible.numpy(), r.fraction, r.mode, r.rank,
                         r.granularity)
    assert np.array_equal(t["remove"].numpy(), remove)
    # the layer output: sum over kept (head, key) of alpha * v~, plus b_O
    a = np.where(remove, 0.0, t["alpha"].double().numpy())
    v = t["v"].double().numpy()
    dh = v.shape[-1]
    out = sum(np.einsum("bij,bjd->bid", a[:, h], v[:, h] @ proj["w_o"][h * dh:(h + 1) * dh])
              for h in range(n_heads))
    out = out if proj["b_o"] is None else out + proj["b_o"]
    real = t["token_mask"].numpy()
    # the model's float32 z over the kept keys (T terms), then W_O (H dh)
    size = module_output_size(a, v, proj["w_o"], proj["b_o"])
    n = a.shape[-1] + n_heads * dh
    tol.assert_close(module_output.double().numpy()[real], out[real],
                     tol.dot(n, size[real], vs=tol.F64), "layer output")


def _projection(t):
    from attngeom.extract.measurement.geometry import Projection
    return Projection(weight=t["weight"], gram=t["gram"])


# ------------------------------------------------------------------------------ sink zeroing
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_sink_zeroing_matches_zeroed_value_projection(arch):
    model, inputs = _model(arch)

    def zero_sink(module, args, output):
        output = output.clone()
        output[:, :1] = 0.0
        return output
    handles = [mod.v_proj.register_forward_hook(zero_sink) for mod, _ in
               ref._attention_modules(model)]
    try:
        want = _output(model, inputs)
    finally:
        for h in handles:
            h.remove()
    got = _output(model, inputs, Intervener(model, sink_k=1))
    real = _real(inputs)
    np.testing.assert_allclose(got[real].numpy(), want[real].numpy(),
                               **forward_bound(model, real.shape[1], want[real]))
    assert (got[real] - _output(model, inputs)[real]).abs().max() > 1e-2   # zeroing bites


def test_drift_probe_cosine_matches_model_space():
    model, inputs = _model("llama")
    modules = ref._attention_modules(model)
    trace: list = []
    probe = DriftProbe(sink_k=1, low_fraction=0.25)
    _output(model, inputs, Intervener(model, probe=probe, trace=trace))
    sums = probe.collect("before")
    lengths = inputs["attention_mask"].sum(1).numpy()
    T = inputs["input_ids"].shape[1]                  # a cosine's chain, and the mean over T keys
    n = tol.attention_terms(T=T, **model_dims(model)) + T
    for t in trace:
        w_o = modules[t["layer"]][1]["w_o"]
        a, v = t["alpha"].double().numpy(), t["v"].double().numpy()
        H, dh = v.shape[1], v.shape[-1]
        vt = np.stack([v[:, h] @ w_o[h * dh:(h + 1) * dh] for h in range(H)], 1)
        o_h = np.einsum("bhij,bhjd->bhid", a, vt)
        for b, n in enumerate(lengths):
            cos, norms = [], []
            for h in range(H):
                for i in range(1, n):
                    m = vt[b, h, 1:i + 1].mean(0)
                    x = o_h[b, h, i]
                    cos.append(x @ m / np.linalg.norm(x) / np.linalg.norm(m))
                    norms.append(np.linalg.norm(x))
            cos, norms = np.array(cos), np.array(norms)
            low = norms <= np.quantile(norms, 0.25)
            layer = t["layer"]
            assert sums["n_all"][b, layer] == len(cos)
            assert sums["n_low"][b, layer] == low.sum()
            for name, c in (("cosine_all", cos), ("cosine_low", cos[low])):   # sums of cosines
                bound = tol.dot(n, 2 * len(c), vs=tol.F64) + tol.total(len(c), np.abs(c).sum(),
                                                                        tol.F32)
                np.testing.assert_allclose(sums[name][b, layer], c.sum(), err_msg=name, **bound)
