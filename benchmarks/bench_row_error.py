"""The float32 scores' error within one (head, query) row, and the near rows its bound leaves.

Within one (head, query) row the float32 softmax's normaliser rounds once for every key: alpha~_j
= alpha_j (1 + e_j)(1 + d), d common to the row. Ranking a row compares its keys only, so d
cannot reorder them; the error model of the removal (extract/faithfulness/removal_scores.py)
still counts it, as the sqrt(Tk) term of Lambda. On a real model (``--model``, SmolLM2-135M by
default) and WikiText-2 prose cut to T tokens, every layer, for each head-local metric this
prints:

- ``whole``: the largest |s~ - s| in units of the present error model (the registry's
  ``error_unit`` is ten times the largest seen), relative to |s~| (keys within 1 % of their
  row's largest |s| of zero left out) or, for the signed metrics, to |s~| plus the key's term,
  as tests/extract/test_selection.py bounds them;
- ``within``: the largest |s~ - c s| with c the row's median ratio s~ / s over its keys,
  in units of the model with Lambda_w = Lambda - sqrt(Tk) + 1 in place of Lambda's first term
  (contribution's model has it there already);
- the share of ranking rows near the cut (p = 0.1, both modes) under the present bound and
  under the within-row one (its unit: ``--within-unit``, else the registry's ``within_unit``,
  else ten times the largest within ratio of the run, as the registry's units are fitted).

    python benchmarks/bench_row_error.py --length 4096 --batch 1
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import batch_of, emit, machine  # noqa: E402

METRICS = ("attention", "value_weighted", "contribution", "contribution_layer")
P = 0.1


def within_ratio(fast, exact, rel_w, allowed, term=None):
    """Largest |s~ - c s| / (rel_w size), c the row's median s~ / s over keys away from zero;
    size |s~|, plus the key's term for a signed metric (``term``, as the tests bound it)."""
    import torch

    f, e = fast.double(), exact.double()
    ok = away_from_zero(e, allowed) & (f.abs() > 0)
    ratio = torch.where(ok, f / torch.where(ok, e, 1.0), torch.nan)
    c = ratio.nanmedian(-1).values.nan_to_num(1.0)                       # (B, H, T)
    return _largest(f - c[..., None] * e, f, rel_w, allowed if term is not None else ok, term)


def away_from_zero(exact, allowed):
    """Keys whose score is not within 1e-2 of its row's largest |score| of zero."""
    a = exact.abs().masked_fill(~allowed, 0)
    return allowed & (a > 1e-2 * a.amax(-1, keepdim=True))


def whole_ratio(fast, exact, rel, allowed, term=None):
    """Largest |s~ - s| / (rel size) (size as in :func:`within_ratio`)."""
    where = allowed if term is not None else away_from_zero(exact, allowed)
    return _largest(fast.double() - exact, fast.double(), rel, where, term)


def _largest(d, f, rel, where, term):
    import torch

    size = f.abs() if term is None else f.abs() + term
    bound = (rel[..., None].double() * size).clamp_min(1e-300)
    return float(torch.where(where, d.abs() / bound, 0).max())


def key_term(metric, a64, vf, proj64):
    """A signed metric's key term (the size its error follows where the key is almost
    orthogonal to the output, as tests/extract/test_selection.py bounds it), else None."""
    from attngeom.extract.faithfulness.base import rowmm
    from attngeom.extract.faithfulness.layer_scores import metric_scores

    if metric == "contribution":
        return metric_scores("value_weighted_normalized", a64, vf, rowmm(a64, vf), proj64)
    if metric == "contribution_layer":
        B, H, T, dh = vf.shape[0], vf.shape[1], a64.shape[2], vf.shape[-1]
        o = rowmm(rowmm(a64, vf).transpose(1, 2).reshape(B, T, H * dh), proj64.weight)
        return metric_scores("value_weighted", a64, vf, None, proj64) / \
            o.norm(dim=-1)[:, None, :, None]
    return None


def cut(fast, allowed, mode: str):
    """hi, lo (the m-th and (m+1)-th highest float32 score of each (head, query) row) and
    which rows have a cut (0 < m < n), p = 0.1."""
    import torch

    key = fast.float().masked_fill(~allowed, -torch.inf)
    n = allowed.sum(-1)                                                  # (B, H, T)
    k = torch.floor(n.double() * P + 0.5).long()
    m = k if mode == "comprehensiveness" else n - k
    s = key.sort(-1, descending=True).values
    hi = s.gather(-1, (m - 1).clamp_min(0)[..., None])[..., 0]
    lo = s.gather(-1, m.clamp_max(s.shape[-1] - 1)[..., None])[..., 0]
    return hi, lo, (m >= 1) & (m < n)


def near_share(rows, scale: float | None) -> float:
    """Share of the rows with a cut whose two scores lie within the bound: the present one
    (``scale`` None) or the within-row model times ``scale``."""
    near = valid = 0
    for hi, lo, ok, rel, model in rows:
        r = rel if scale is None else model * scale
        near += int((ok & (hi - lo <= r * (hi.abs() + lo.abs()))).sum())
        valid += int(ok.sum())
    return near / max(1, valid)


class RowProbe:
    """Attention handler collecting, per metric, the ratios and the fast scores' near rows."""

    def __init__(self, model, metrics=METRICS, layers=None):
        from attngeom.extract.faithfulness.interventions import Intervener

        self.inner, self.out, self.metrics, self.layers = Intervener(model), {}, metrics, layers

    def inputs(self, call):
        """The layer's float32 attention and head outputs; then, for a layer measured (else
        None), its float64 attention and values, both projections and Lambda."""
        import torch

        from attngeom.extract.faithfulness.base import exact_alpha
        from attngeom.extract.faithfulness.dense import attention_weights
        from attngeom.extract.faithfulness.removal_scores import logit_scale
        from attngeom.extract.measurement.geometry import repeat_kv

        layer, H = call.index, call.query.shape[1]
        alpha = attention_weights(call.query, call.key, call.allowed, call.scaling,
                                  call.softcap, torch.float32, call.sinks)
        z = alpha @ repeat_kv(call.value, H).float()
        if self.layers is not None and layer not in self.layers:
            return alpha, z, None
        a64 = exact_alpha(call.query.double(), repeat_kv(call.key, H).double(), call.allowed,
                          call.scaling, call.softcap, call.sinks)
        vf = repeat_kv(call.value, H).double()
        proj64, proj32 = self.inner.projection(layer), self.inner.projection(layer, torch.float32)
        return alpha, z, (a64, vf, proj64, proj32,
                          logit_scale(call.query, call.key, call.scaling, call.sinks))

    def attend(self, call):
        import torch

        from attngeom.common import metrics as M
        from attngeom.extract.faithfulness.layer_scores import fast_scores, metric_scores
        from attngeom.extract.faithfulness.removal_scores import within_scale

        (B, H, T, _), Tk = call.query.shape, call.key.shape[2]
        allowed = call.allowed.expand(B, H, T, Tk)
        alpha, z, measured = self.inputs(call)
        if measured is None:
            return z.to(call.query.dtype)
        a64, vf, proj64, proj32, lam = measured
        for m in self.metrics:
            fast, err = fast_scores(m, alpha, call.value, proj32, lam, torch.empty_like(alpha))
            exact = metric_scores(m, a64, vf, a64 @ vf, proj64)
            unit = M.get(m).error_unit * torch.finfo(torch.float32).eps / 2
            rel = err.relative.expand(B, H, T)
            model_w = rel / unit                   # contribution's counts Lambda_w already
            if m != "contribution":
                model_w = model_w - lam + within_scale(lam, Tk)  # Lambda -> Lambda_w
            u = torch.finfo(torch.float32).eps / 2
            o = self.out.setdefault(m, {"whole": 0.0, "within": 0.0})
            term = key_term(m, a64, vf, proj64)
            o["whole"] = max(o["whole"], whole_ratio(fast, exact, rel, allowed, term)
                             * M.get(m).error_unit)
            o["within"] = max(o["within"], within_ratio(fast, exact, model_w * u, allowed,
                                                        term))
            for mode in ("comprehensiveness", "sufficiency"):
                o.setdefault(mode, []).append((*cut(fast, allowed, mode), rel, model_w))
        return z.to(call.query.dtype)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m", help="a built-in model's name")
    p.add_argument("--length", type=int, default=2048)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--metrics", default=",".join(METRICS))
    p.add_argument("--within-unit", type=float, default=0.0,
                   help="the within-row bound's unit (default: the registry's, else ten times "
                        "the largest within ratio of this run)")
    p.add_argument("--layers", default=None, help="comma-separated layers (default: every one)")
    a = p.parse_args(argv)
    emit({"bench": "row_error", "section": "machine", **machine()})
    import torch

    from attngeom.common import metrics as M
    from attngeom.extract.faithfulness.interventions import watching
    from attngeom.extract.loading.models import load
    from attngeom.extract.measurement.hooks import attention_handler

    loaded = load(a.model, device="cpu", dtype="float32")
    model, batch = loaded.model.eval(), batch_of(loaded.tokenizer, a.length, a.batch)
    layers = None if a.layers is None else {int(x) for x in a.layers.split(",")}
    probe = RowProbe(model, a.metrics.split(","), layers)
    with torch.inference_mode(), attention_handler(model, probe), watching(probe):
        model(**batch, use_cache=False)
    print(f"| metric ({a.model}, T = {a.length}) | whole (units) | within (units of Lambda_w) | "
          "near rows, comp: present / within | suff: present / within |\n|---|---|---|---|---|")
    for m, o in probe.out.items():
        unit_w = a.within_unit or M.get(m).within_unit or 10 * o["within"]
        scale = unit_w * torch.finfo(torch.float32).eps / 2
        shares = {mode: [near_share(o[mode], None), near_share(o[mode], scale)]
                  for mode in ("comprehensiveness", "sufficiency")}
        c, s = ([f"{100 * x:.2f} %" for x in shares[k]] for k in shares)
        emit({"bench": "row_error", "model": a.model, "metric": m, "length": a.length, "whole": o["whole"],
              "within": o["within"], "within_unit": unit_w, "near": shares})
        print(f"| {m} | {o['whole']:.2f} | {o['within']:.2f} | {c[0]} / {c[1]} | "
              f"{s[0]} / {s[1]} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
