"""The field's methods (ALTI, the norm-based method with residual, rollout) through
``attngeom.scores``, against a float64 model-space reimplementation written here from the
equations (issue 43; Ferrando et al. 2022, Kobayashi et al. 2021, Abnar and Zuidema 2020).

The reference runs the same tiny model in float64 with transformers' own forward, its
attention replaced by a float64 softmax that records alpha and the values it receives, and the
RMSNorms computed in float64 (transformers' compute in float32 inside); it reads each layer's
residual input x from ``output_hidden_states``, W_O, b_O and the normalisations' weights and
epsilon from the modules and the config by name, builds the projected values v~_j^h = v_j W_O^h
and the block's vectors T_i(x_j) in model space, and takes the L1 distances and L2 norms
directly. Architectures: GQA pre-LN (llama), q/k/v biases (qwen2), a normalisation after the
attention output and a sliding window (gemma3), a post-LN encoder with an output bias (bert).
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

import tiny_models as tm
import tolerance as tol
import attngeom

ARCHS = ("llama", "qwen2", "gemma3", "bert")
IDS = [2, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19]


def _eager64(record: list):
    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                  **kwargs):
        rep = query.shape[1] // key.shape[1]
        logits = query @ key.repeat_interleave(rep, 1).transpose(-1, -2) * scaling
        if attention_mask is not None:
            logits = logits + attention_mask[..., : key.shape[-2]]
        a = torch.softmax(logits, -1)
        record.append((a[0], value[0]))                  # (H, T, T), per kv head (G, T, dh)
        return (a @ value.repeat_interleave(rep, 1)).transpose(1, 2).contiguous(), a
    return attention


def _rms64(self, x):
    eps = getattr(self, "variance_epsilon", getattr(self, "eps", None))
    w = (1.0 + self.weight) if type(self).__name__.startswith("Gemma") else self.weight
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


@pytest.fixture
def float64_model(monkeypatch):
    def build(arch):
        model = tm.build(arch, attn_implementation="eager").double()
        layers = model.encoder.layer if arch == "bert" else model.model.layers
        attention = layers[0].attention.self if arch == "bert" else layers[0].self_attn
        record: list = []
        monkeypatch.setattr(sys.modules[type(attention).__module__], "eager_attention_forward",
                            _eager64(record))
        for m in model.modules():
            if type(m).__name__.endswith("RMSNorm"):
                monkeypatch.setattr(type(m), "forward", _rms64)
        return model, layers, record
    return build


def _block(arch, layer):
    """W_O (d, H dh), b_O, and (gamma, beta, eps, centred) of the normalisation after the
    attention output and after the residual sum, by the modelling files' names."""
    if arch == "bert":
        out = layer.attention.output
        ln = out.LayerNorm
        return out.dense.weight, out.dense.bias, None, (ln.weight, ln.bias, ln.eps)
    att = layer.self_attn
    post = None
    if arch == "gemma3":
        n = layer.post_attention_layernorm
        post = (1.0 + n.weight, n.eps)
    return att.o_proj.weight, att.o_proj.bias, post, None


def reference(arch, model, layers, record, ids):
    """Per layer (L, T, T): alti, norm_residual, rollout and the rollouts; and the sizes of
    the terms behind each T_i(x_j) (their absolute values summed), for the bounds."""
    inputs = torch.tensor([ids])
    record.clear()
    with torch.no_grad():
        hidden = model(input_ids=inputs, attention_mask=torch.ones_like(inputs),
                       output_hidden_states=True).hidden_states
    H, out = model.config.num_attention_heads, {}
    rolled = {"rollout": None, "alti_rollout": None, "norm_residual_rollout": None}
    for n, (alpha, v) in enumerate(record):
        x = hidden[n][0]                                                # (T, d)
        w, b, after_attention, after_residual = _block(arch, layers[n])
        T, dh = x.shape[0], v.shape[-1]
        G = v.shape[0]
        vt = torch.stack([v[h // (H // G)] @ w[:, h * dh:(h + 1) * dh].T for h in range(H)])
        a = torch.einsum("hij,hjd->ijd", alpha, vt)                    # sum_h alpha v~ (i, j, d)
        size = torch.einsum("hij,hjd->ijd", alpha, vt.abs())
        o = a.sum(1) + (0 if b is None else b)
        if after_attention is not None:                                # RMSNorm of o + b
            g, eps = after_attention
            s = torch.sqrt(o.square().mean(-1) + eps)
            a, size = g * a / s[:, None, None], g.abs() * size / s[:, None, None]
            o = g * o / s[:, None]
        eye = torch.eye(T, dtype=torch.float64)[:, :, None]
        t, size = a + eye * x[:, None], size + eye * x.abs()[:, None]
        if after_residual is not None:                                 # LayerNorm of x + o
            g, beta, eps = after_residual
            y = x + o
            sigma = torch.sqrt(y.var(-1, unbiased=False) + eps)
            t = g * (t - t.mean(-1, keepdim=True)) / sigma[:, None, None]
            size = 2 * g.abs() * size / sigma[:, None, None]
        y = t.sum(1)
        raw = (y.abs().sum(-1)[:, None] - (y[:, None] - t).abs().sum(-1)).clamp(min=0)
        layer = {"alti": raw / raw.sum(-1, keepdim=True), "norm_residual": t.norm(dim=-1),
                 "size": size, "raw_sum": raw.sum(-1), "t": t}
        step = {"rollout": 0.5 * torch.eye(T, dtype=torch.float64) + 0.5 * alpha.mean(0),
                "alti_rollout": layer["alti"],
                "norm_residual_rollout": layer["norm_residual"]
                / layer["norm_residual"].sum(-1, keepdim=True)}
        for k in rolled:
            rolled[k] = step[k] if rolled[k] is None else step[k] @ rolled[k]
            layer[k] = rolled[k]
        for k, v in layer.items():
            out.setdefault(k, []).append(v)
    return {k: torch.stack(v).detach().numpy() for k, v in out.items()}


def _bounds(arch, model, ref, n_layers):
    """The float64 bounds: the deepest layer's chain of ``attention_terms`` plus the block's
    sums (the norm's mean and scale, the L1 distances, the sum over keys), times the size of
    the terms: sum_j ||T_j|| + ||T_j|| for ALTI's difference of L1 norms, over its row sum,
    (T + 1) for the normalisation; the L2 norm of the absolute terms for ||T_j||."""
    cfg = model.config
    d, H = cfg.hidden_size, cfg.num_attention_heads
    dh = getattr(cfg, "head_dim", None) or d // H
    T = ref["alti"].shape[-1]
    n = tol.attention_terms(d, dh, H, T, layer=n_layers - 1) + 3 * d + 2 * T   # the deepest
    size = ref["size"]                                    # (L, i, j, d)
    l1 = size.sum(-1)
    alti = (l1.sum(-1, keepdims=True) + l1) * (T + 1) / ref["raw_sum"][..., None]
    norm = np.sqrt(np.square(size).sum(-1))
    return {"alti": tol.dot(n, 2 * alti, tol.F64, vs=tol.F64),
            "norm_residual": tol.dot(n, norm, tol.F64, vs=tol.F64), "n": n}


@pytest.mark.parametrize("arch", ARCHS)
def test_scores_equal_the_float64_model_space_reference(arch, float64_model):
    model, layers, record = float64_model(arch)
    ids = IDS[:-1] + [3] if arch == "bert" else IDS
    ref = reference(arch, model, layers, record, ids)
    ds = attngeom.scores(model, [ids])
    L = len(layers)
    bounds = _bounds(arch, model, ref, L)
    for name, bound in bounds.items():
        if name == "n":
            continue
        tol.assert_close(ds[name].values[0], ref[name], bound, f"{arch} {name}")
    # rollouts: products of L matrices of non-negative entries whose rows sum to (about) one,
    # each entry within the bound of its layer's chain; a product's entry adds up to T such
    # errors per layer: the chain's bound times L (T + 1) times the row's largest entry
    T = len(ids)
    for name in ("rollout", "alti_rollout", "norm_residual_rollout"):
        want = ref[name]
        size = L * (T + 1) * want.max(-1, keepdims=True)
        tol.assert_close(ds[name].values[0], want, tol.dot(bounds["n"], size, tol.F64,
                                                           vs=tol.F64), f"{arch} {name}")
    # a normalised row (its normaliser: T - 1 additions; a division per term), then its sum
    alti = ds["alti"].values[0]
    tol.assert_close(alti.sum(-1), 1.0, tol.sums_to_one(T, depth=T, dtype=alti.dtype),
                     f"{arch} alti rows")
    assert (ds["alti"].values >= 0).all() and (ds["rollout"].values > 0).any()


class _FastAndExact:
    """Attention handler comparing each field metric's float32 kernel with its float64 one at
    every layer of a float32 forward (the contexts a removal pass builds)."""

    def __init__(self, model, metrics):
        from attngeom.extract.faithfulness.interventions import Intervener
        from attngeom.extract.faithfulness.residual import ResidualTap

        self.inner, self.metrics = Intervener(model), metrics
        self.tap, self.carry, self.token_mask, self.worst = ResidualTap(model), {}, None, {}

    def attend(self, call):
        from attngeom.extract.faithfulness.context import LayerContext
        from attngeom.extract.faithfulness.dense import attention_weights
        from attngeom.extract.faithfulness.field_scores import step_rollout
        from attngeom.extract.faithfulness.layer_scores import fast_scores
        from attngeom.extract.faithfulness.removal_scores import logit_scale

        layer, allowed = call.index, call.allowed
        alpha = attention_weights(call.query, call.key, allowed, call.scaling, call.softcap,
                                  torch.float32, call.sinks)
        proj = self.inner.projection(layer)
        ctx = LayerContext(layer, call.query, call.key, call.value, allowed, call.scaling,
                           call.softcap, call.sinks, proj, x=self.tap.x[layer],
                           residual=self.tap.structure[layer], carry=self.carry)
        step_rollout(ctx, alpha)
        lam = logit_scale(call.query, call.key, call.scaling, call.sinks)
        for m in self.metrics:
            fast, err = fast_scores(m, alpha, call.value, self.inner.projection(layer,
                                                                                torch.float32),
                                    lam, torch.empty_like(alpha), None, ctx)
            exact = _exact(m, alpha, ctx)
            bound = err.relative[..., None] * fast.abs() + (
                0 if err.absolute is None else err.absolute[..., None])
            ratio = ((fast.double() - exact).abs() / bound.double().clamp_min(1e-300)).max()
            self.worst[m] = max(self.worst.get(m, 0.0), float(ratio))
        return (alpha @ repeat(call.value, alpha.shape[1])).to(call.query.dtype)


def repeat(value, H):
    return value.repeat_interleave(H // value.shape[1], 1).float()


def _exact(metric, alpha, ctx):
    from attngeom.extract.faithfulness.kernels import kernels
    from attngeom.extract.faithfulness.field_scores import TokenRows64

    B, _, T, Tk = alpha.shape
    b, i = (t.reshape(-1) for t in torch.meshgrid(torch.arange(B), torch.arange(T),
                                                   indexing="ij"))
    return kernels(metric).exact(TokenRows64(ctx, b, i)).view(B, 1, T, Tk)


@pytest.mark.parametrize("arch", ("llama", "gemma3", "bert"))
def test_float32_kernels_are_within_their_error_bound(arch):
    """Each field metric's float32 scores differ from its float64 definition by less than the
    error bound the removal trusts (which decides the rows recomputed in float64)."""
    from attngeom.extract.measurement.hooks import attention_handler
    from attngeom.extract.faithfulness.interventions import watching

    model = tm.build(arch)
    handler = _FastAndExact(model, ("alti", "alti_sa", "norm_residual", "norm_residual_sa",
                                    "rollout"))
    inputs = tm.example_inputs(arch, batch=1, seq_len=14)
    with torch.inference_mode(), attention_handler(model, handler), watching(handler):
        model(**inputs)
    assert handler.worst and all(r <= 1.0 for r in handler.worst.values()), handler.worst


class _RowSubsets(_FastAndExact):
    """Attention handler: each token-scope metric's float64 rows at every layer, computed for
    every query at once and for subsets of the queries; counts the rows whose bits differ."""

    def attend(self, call):
        from attngeom.extract.faithfulness.context import LayerContext
        from attngeom.extract.faithfulness.dense import attention_weights
        from attngeom.extract.faithfulness.field_scores import TokenRows64
        from attngeom.extract.faithfulness.kernels import kernels

        alpha = attention_weights(call.query, call.key, call.allowed, call.scaling,
                                  call.softcap, torch.float32, call.sinks)
        ctx = LayerContext(call.index, call.query, call.key, call.value, call.allowed,
                           call.scaling, call.softcap, call.sinks,
                           self.inner.projection(call.index), x=self.tap.x[call.index],
                           residual=self.tap.structure[call.index], carry=self.carry)
        T = alpha.shape[2]
        b, i = torch.zeros(T, dtype=torch.long), torch.arange(T)
        for m in self.metrics:
            full = kernels(m).exact(TokenRows64(ctx, b, i))
            for rows in ([5], [3, 4, 5, 6, 7], list(range(1, T, 2))):
                r = torch.tensor(rows)
                got = kernels(m).exact(TokenRows64(ctx, b[r], i[r]))
                self.worst[m] = self.worst.get(m, 0) + int((got != full[r]).any(-1).sum())
        return (alpha @ repeat(call.value, alpha.shape[1])).to(call.query.dtype)


@pytest.mark.parametrize("arch", ("llama", "bert"))
def test_float64_rows_have_the_same_bits_whichever_rows_run_together(arch):
    """A near row's float64 scores (ALTI, the residual norms) do not depend on the rows decided
    with it: every product over a query's row is :func:`~.base.rowmm`'s."""
    from attngeom.extract.measurement.hooks import attention_handler
    from attngeom.extract.faithfulness.interventions import watching

    model = tm.build(arch)
    handler = _RowSubsets(model, ("alti", "norm_residual"))
    inputs = tm.example_inputs(arch, batch=1, seq_len=40)
    with torch.inference_mode(), attention_handler(model, handler), watching(handler):
        model(**inputs)
    assert handler.worst == {"alti": 0, "norm_residual": 0}, handler.worst
