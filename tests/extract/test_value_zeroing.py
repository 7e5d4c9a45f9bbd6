"""Value zeroing (issue 44; Mohebbi, Zuidema, Chrupała and Alishahi, EACL 2023) against
reimplementations written here from the paper, sharing no code with attngeom.

Scores: the tiny model runs in float64 with transformers' own forward, its eager attention
replaced by a float64 softmax that zeroes key j's value vectors (every kv head) at layer l only,
and its RMSNorms computed in float64; the output of layer l is read with a forward hook on the
layer. One forward pass per (layer, zeroed key): the whole layer recomputed, no shortcut. The
score is 1 - cos(y_i, y'_ij) of the clean and zeroed outputs at every query i, normalised over
keys as the authors' code does; the rollout multiplies them over layers. Architectures: GQA
pre-LN (llama), q/k/v biases (qwen2), normalisations after the attention and the MLP and a
sliding window (gemma3), a post-LN encoder with an output bias (bert).

Removal: a hook-free reference in the style of test_field_removal.py. Inside the tiny llama's
eager attention, in numpy float64 from the modules' weights by name: alpha, then for each
(query i, key j <= i) the llama block written out (h = x + o_proj(z'), y = h + down(silu(
gate(n)) * up(n)), n = RMSNorm(h)) with v_j zeroed, 1 - cos against the clean block output;
keys ranked with ``sorted`` and removed from every head.
"""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import pytest
import torch
import xarray as xr

import tiny_models as tm
import tolerance as tol
import attngeom
from attngeom.common.errors import Refusal
from attngeom.extract.faithfulness import experiment as F

ARCHS = ("llama", "qwen2", "gemma3", "bert")
IDS = [2, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19]
TEXTS = ["we can make all of the people look up and write more than one number",
         "the one is there and it was the time of people who said",
         "a way to see them", "it is what they said for this one"]
FRACTION = 0.5


# ------------------------------------------------------------------------------ scores
def _eager64(order: dict, zero: dict):
    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                  **kwargs):
        if zero.get("layer") == order[id(module)]:
            value = value.clone()
            value[:, :, zero["key"]] = 0.0                   # key j's values, every kv head
        rep = query.shape[1] // key.shape[1]
        logits = query @ key.repeat_interleave(rep, 1).transpose(-1, -2) * scaling
        if attention_mask is not None:
            logits = logits + attention_mask[..., : key.shape[-2]]
        a = torch.softmax(logits, -1)
        return (a @ value.repeat_interleave(rep, 1)).transpose(1, 2).contiguous(), a
    return attention


def _rms64(self, x):
    eps = getattr(self, "variance_epsilon", getattr(self, "eps", None))
    w = (1.0 + self.weight) if type(self).__name__.startswith("Gemma") else self.weight
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _layer_outputs(model, layers, ids, zero: dict, state: dict) -> list[torch.Tensor]:
    """Each layer's output (T, d) of one float64 forward pass (zeroing as ``zero`` says)."""
    state.clear()
    state.update(zero)
    outs = {}
    handles = [layer.register_forward_hook(lambda m, a, y, n=n: outs.__setitem__(
        n, (y[0] if isinstance(y, tuple) else y)[0])) for n, layer in enumerate(layers)]
    inputs = torch.tensor([ids])
    try:
        with torch.no_grad():
            model(input_ids=inputs, attention_mask=torch.ones_like(inputs))
    finally:
        for h in handles:
            h.remove()
    return [outs[n] for n in range(len(layers))]


def reference(arch, monkeypatch, ids):
    """Raw distances s (L, T, T), their normalisation and rollout, and the bound's sizes."""
    model = tm.build(arch, attn_implementation="eager").double()
    layers = model.encoder.layer if arch == "bert" else model.model.layers
    attention = [layer.attention.self if arch == "bert" else layer.self_attn for layer in layers]
    order, zero = {id(a): n for n, a in enumerate(attention)}, {}
    monkeypatch.setattr(sys.modules[type(attention[0]).__module__], "eager_attention_forward",
                        _eager64(order, zero))
    for m in model.modules():
        if type(m).__name__.endswith("RMSNorm"):
            monkeypatch.setattr(type(m), "forward", _rms64)
    xs = {}
    for n, layer in enumerate(layers):
        layer.register_forward_pre_hook(lambda m, a, k, n=n: xs.__setitem__(
            n, k.get("hidden_states", a[0] if a else None)[0]), with_kwargs=True)
    clean = _layer_outputs(model, layers, ids, {}, zero)
    x = [xs[n] for n in range(len(layers))]
    L, T = len(layers), len(ids)
    s, size = np.zeros((L, T, T)), np.zeros((L, T, T))
    for n in range(L):
        for j in range(T):
            y2 = _layer_outputs(model, layers, ids, {"layer": n, "key": j}, zero)[n]
            y = clean[n]
            cos = (y * y2).sum(-1) / (y.norm(dim=-1) * y2.norm(dim=-1))
            s[n, :, j] = (1 - cos).numpy()
            xn = x[n].norm(dim=-1)
            size[n, :, j] = ((xn + y.norm(dim=-1)) / y.norm(dim=-1)
                             + (xn + y2.norm(dim=-1)) / y2.norm(dim=-1)).numpy()
    zero.clear()                                      # attngeom's own passes: no zeroing
    normalised = s / s.sum(-1, keepdims=True)
    rolled, r = [], None
    for n in range(L):
        r = normalised[n] if r is None else normalised[n] @ r
        rolled.append(r)
    return model, {"s": s, "size": size, "value_zeroing": normalised,
                   "value_zeroing_rollout": np.stack(rolled)}


@pytest.mark.parametrize("arch", ARCHS)
def test_scores_equal_the_float64_one_key_at_a_time_reference(arch, monkeypatch):
    ids = IDS[:-1] + [3] if arch == "bert" else IDS
    model, ref = reference(arch, monkeypatch, ids)
    ds = attngeom.scores(model, [ids], methods=("value_zeroing", "value_zeroing_rollout"))
    cfg, L, T = model.config, len(ref["s"]), len(ids)
    d, H = cfg.hidden_size, cfg.num_attention_heads
    dh = getattr(cfg, "head_dim", None) or d // H
    # float64 both: the layer's chain (attention, W_O, the norms, the MLP) to y and y'; a
    # distance of unit vectors each within gamma(n) size of exact moves by sqrt(2 s) times
    # that; and the reference's 1 - cos, a dot product of unit vectors (d terms, 3 roundings)
    n = tol.attention_terms(d, dh, H, T, cfg.intermediate_size, layer=L - 1) \
        + 2 * d + cfg.intermediate_size
    raw = tol.dot(n, np.sqrt(2 * np.abs(ref["s"])) * ref["size"], tol.F64, vs=tol.F64) \
        + tol.dot(d + 3, 1.0, tol.F64)
    total = ref["s"].sum(-1, keepdims=True)
    spread = raw.limit(ref["s"])
    bound = tol.Tol(atol=(spread + ref["value_zeroing"] * spread.sum(-1, keepdims=True))
                    / total)
    tol.assert_close(ds["value_zeroing"].values[0], ref["value_zeroing"], bound,
                     f"{arch} value_zeroing")
    want = ref["value_zeroing_rollout"]
    size = L * (T + 1) * want.max(-1, keepdims=True)
    tol.assert_close(ds["value_zeroing_rollout"].values[0], want,
                     tol.Tol(atol=bound.atol.max() * size), f"{arch} value_zeroing_rollout")
    assert (ref["s"] > 1e-6).sum() > T
    # a normalised row (its normaliser: T - 1 additions; a division per term), then its sum
    zeroing = ds["value_zeroing"].values[0]
    tol.assert_close(zeroing.sum(-1), 1.0, tol.sums_to_one(T, depth=T, dtype=zeroing.dtype),
                     f"{arch} value_zeroing rows")
    if arch == "gemma3":                         # the sliding window: keys beyond it score 0
        assert (ds["value_zeroing"].values[0, 0][np.tril(np.ones((T, T)), -4) > 0] == 0).all()


# ------------------------------------------------------------------------------ float32
class _FastAndExact:
    """Handler comparing the float32 kernel with the float64 one at every layer: value
    zeroing's float32 scores and their bound, and the float64 scores of every query, are
    handed to :meth:`compare` (test_removal_near.py compares its removals)."""

    def __init__(self, model):
        from attngeom.extract.faithfulness.interventions import Intervener
        from attngeom.extract.faithfulness.sublayer import BlockTap

        self.inner, self.blocks, self.token_mask, self.worst = Intervener(model), \
            BlockTap(model), None, 0.0

    def attend(self, call):
        from attngeom.extract.faithfulness.context import LayerContext
        from attngeom.extract.faithfulness.dense import attention_weights
        from attngeom.extract.faithfulness.field_scores import TokenRows64
        from attngeom.extract.faithfulness.layer_scores import fast_scores
        from attngeom.extract.faithfulness.removal_scores import logit_scale
        from attngeom.extract.faithfulness.zeroing import exact_value_zeroing

        layer = call.index
        alpha = attention_weights(call.query, call.key, call.allowed, call.scaling,
                                  call.softcap, torch.float32, call.sinks)
        sub = self.blocks.at(layer)
        ctx = LayerContext(layer, call.query, call.key, call.value, call.allowed, call.scaling,
                           call.softcap, call.sinks, self.inner.projection(layer), x=sub.x,
                           sublayer=sub)
        lam = logit_scale(call.query, call.key, call.scaling, call.sinks)
        fast, err = fast_scores("value_zeroing", alpha, call.value,
                                self.inner.projection(layer, torch.float32), lam,
                                torch.empty_like(alpha), None, ctx)
        B, _, T, Tk = alpha.shape
        b, i = (t.reshape(-1) for t in torch.meshgrid(torch.arange(B), torch.arange(T),
                                                       indexing="ij"))
        exact = exact_value_zeroing(TokenRows64(ctx, b, i)).view(B, 1, T, Tk)
        self.compare(call, ctx, fast, err, exact)
        return (alpha @ call.value.repeat_interleave(alpha.shape[1] // call.value.shape[1],
                                                     1).float()).to(call.query.dtype)

    def compare(self, call, ctx, fast, err, exact) -> None:
        """The float32 scores (B, 1, T, Tk) within their bound ``err`` of the float64 ones."""
        from attngeom.common.metrics import get

        bound = err.root[..., None].double() * fast.double().abs().sqrt() \
            + err.absolute[..., None].double()
        ratio = float(((fast.double() - exact).abs() / bound).max())
        self.worst = max(self.worst, ratio * get("value_zeroing").error_unit)   # in units of u
        assert ratio <= 1.0, (call.index, ratio)
        assert exact.max() > 1e-4 and (exact >= 0).all()


@pytest.mark.parametrize("arch", ("llama", "gemma3", "bert"))
def test_float32_kernel_is_within_its_error_bound(arch):
    from attngeom.extract.faithfulness.interventions import watching
    from attngeom.extract.measurement.hooks import attention_handler

    model = tm.build(arch)
    handler = _FastAndExact(model)
    with torch.inference_mode(), attention_handler(model, handler), watching(handler):
        model(**tm.example_inputs(arch, batch=2, seq_len=14))
    assert handler.worst > 0.0                      # float32 differs, within the bound


# ------------------------------------------------------------------------------ discovery
@pytest.mark.parametrize("name", ("gpt2", "olmo2", "mixtral", "distilbert", "falcon"))
def test_the_sublayer_is_found_and_rebuilds_the_block(name):
    """The rest of the layer, rerun row by row, rebuilds the block's output on the tiny
    architectures' own inputs (other orders of norms, MoE, parallel attention and MLP)."""
    import tiny_archs as ta
    from attngeom.extract.faithfulness.sublayer import BlockTap
    from attngeom.extract.measurement.archs import attention_layers

    model = ta.build(name)
    layers, tap, outs = attention_layers(model), BlockTap(model), {}
    handles = [s.block.register_forward_hook(lambda m, a, y, n=n: outs.__setitem__(
        n, y[0] if isinstance(y, tuple) else y)) for n, s in enumerate(tap.structure)]
    zs = {}
    handles += [layer.out.register_forward_pre_hook(lambda m, a, n=n: zs.__setitem__(n, a[0]))
                for n, layer in enumerate(layers)]
    with torch.no_grad(), tap:
        model(**ta.inputs(name, batch=1))
        for n in range(len(layers)):
            at = tap.at(n)
            d, y = at.x.shape[-1], outs[n]
            got = at.outputs(at.x.reshape(-1, d), zs[n].reshape(-1, zs[n].shape[-1]))
            np.testing.assert_allclose(got.reshape(y.shape), y, **tol.dot(
                4 * d, float(y.abs().max()), vs=tol.F32))
    for h in handles:
        h.remove()


def test_a_model_without_a_block_per_layer_is_refused():
    import tiny_archs as ta
    from attngeom.extract.faithfulness.sublayer import sublayer_structure

    with pytest.raises(Refusal, match="value zeroing needs it"):
        sublayer_structure(ta.build("albert"))             # one module is every layer


# ------------------------------------------------------------------------------ removal
def _rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _block(layer, x, zf):
    """The tiny llama's block output at rows x (n, d), head outputs zf (n, H dh), float64."""
    f = lambda t: t.detach().double().numpy()                      # noqa: E731
    att, mlp, post = layer.self_attn, layer.mlp, layer.post_attention_layernorm
    h = x + zf @ f(att.o_proj.weight).T
    n = _rms(h, f(post.weight), post.variance_epsilon)
    g = n @ f(mlp.gate_proj.weight).T
    return h + ((g / (1 + np.exp(-g))) * (n @ f(mlp.up_proj.weight).T)) @ f(mlp.down_proj.weight).T


def _intervened(model, mode: str, counts: list):
    residual, order = {}, {id(layer.self_attn): n for n, layer in enumerate(model.model.layers)}
    for n, layer in enumerate(model.model.layers):
        layer.register_forward_pre_hook(lambda m, a, k, n=n: residual.__setitem__(
            n, k.get("hidden_states", a[0] if a else None)), with_kwargs=True)

    def attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        B, H, T, dh = query.shape
        rep = H // key.shape[1]
        k = key.double().repeat_interleave(rep, dim=1)[0].numpy()
        v = value.double().repeat_interleave(rep, dim=1)[0].numpy()
        logits = np.where(np.tril(np.ones((T, T), dtype=bool)),
                          query.double()[0].numpy() @ k.transpose(0, 2, 1) * scaling, -np.inf)
        a = np.exp(logits - logits.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        layer = model.model.layers[order[id(module)]]
        x = residual[order[id(module)]][0].double().detach().numpy()
        z = np.einsum("hij,hjd->ihd", a, v)                                  # (T, H, dh)
        y = _block(layer, x, z.reshape(T, -1))
        removed = np.zeros((T, T), dtype=bool)
        for i in range(T):
            s = []
            for j in range(i + 1):
                y2 = _block(layer, x[i][None], (z[i] - a[:, i, j, None] * v[:, j])
                            .reshape(1, -1))[0]
                s.append(1 - y[i] @ y2 / (np.linalg.norm(y[i]) * np.linalg.norm(y2)))
            ranked = sorted(range(i + 1), key=lambda j: (-s[j], j))
            m = math.floor(FRACTION * (i + 1) + 0.5)
            removed[i, ranked[:m] if mode == "comprehensiveness" else ranked[i + 1 - m:]] = True
        counts.append((removed.any(-1).sum(), np.diagonal(removed).sum()))
        a = np.where(removed[None], 0.0, a)
        return torch.as_tensor(a @ v, dtype=query.dtype)[None].transpose(1, 2).contiguous(), None
    return attention


def _reference_ppl(model, ids: list[int]) -> float:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].double()
    lp = torch.log_softmax(logits, -1)
    return math.exp(-np.mean([float(lp[t - 1, ids[t]]) for t in range(1, len(ids))]))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("value-zeroing")
    tm.save_tiny("llama", root / "llama")
    (root / "texts.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    return root


def test_removal_equals_the_hook_free_reference(saved, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.models.llama import modeling_llama

    cfg = F.FaithConfig(metrics=("value_zeroing",), ranks=("signed",), fractions=(FRACTION,),
                        granularity="token", drift=False, batch_size=2, block_size=4)
    path = F.faithfulness(str(saved / "llama"), str(saved / "texts.jsonl"), saved / "out", cfg,
                          progress=False, log=lambda m: None)
    with xr.open_dataset(path, engine="h5netcdf") as f:
        ds = f.load()
    tok = AutoTokenizer.from_pretrained(saved / "llama")
    moved = 0
    for mode in ("comprehensiveness", "sufficiency"):
        want, share = [], []
        for text in TEXTS:
            ids = tok(text)["input_ids"]
            model = AutoModelForCausalLM.from_pretrained(
                saved / "llama", attn_implementation="eager", dtype=torch.float32).eval()
            counts: list = []
            monkeypatch.setattr(modeling_llama, "eager_attention_forward",
                                _intervened(model, mode, counts))
            want.append(_reference_ppl(model, ids))
            rows, own = np.sum(counts, 0)
            share.append(own / rows)
        at = dict(metric="value_zeroing", rank="signed", mode=mode, fraction=FRACTION)
        tol.assert_close(ds["ppl"].sel(at).values, want, tol.FAITHFULNESS_PPL, mode)
        np.testing.assert_array_equal(ds["self_key_removed"].sel(at).values, share)
        moved += int(np.abs(np.array(want) / ds["clean_ppl"].values - 1).max() > 1e-2)
    assert moved == 2                                     # both removals change perplexity


def test_a_run_out_of_reach_is_refused_before_it_starts(saved, tmp_path):
    cfg = F.FaithConfig(metrics=("value_zeroing",), granularity="token", drift=False,
                        max_hours=1e-9)
    with pytest.raises(Refusal) as refused:
        F.faithfulness(str(saved / "llama"), str(saved / "texts.jsonl"), tmp_path / "out", cfg,
                       progress=False, log=lambda m: None)
    message = str(refused.value)
    for words in ("value zeroing would take at least", "hours", "--limit", "--max-length",
                  "--layers", "--max-hours 1e-09"):
        assert words in message, (words, message)
    assert not (tmp_path / "out").exists()
    with pytest.raises(Refusal, match="max_hours"):
        attngeom.scores(tm.build("llama"), [IDS], methods=("value_zeroing",), max_hours=1e-9)
