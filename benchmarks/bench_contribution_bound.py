"""contribution's, value_weighted_normalized's and contribution_layer's float32 error against
candidate bounds, and the rows each leaves near the cut.

The removal pass bounds a float32 contribution score s~_j = alpha_j <o, v~_j> / ||o||^2 by
u unit (Lambda_w + Lambda q / ||o||) |s~| (extract/faithfulness/removal_scores.py,
``fast_contribution``), q = sqrt(sum_j alpha_j^2 ||v~_j||^2) (``FastLayer.spread``): o's error
from alpha's roundings, which have independent signs, in quadrature; alpha's own without the
softmax normaliser's sqrt(Tk) (Lambda_w, :func:`within_scale`), a factor common to a head's row
that scales o alike. Bounds measured for ``--metric contribution``, in units of u:

- ``present``: Lambda (1 + kappa), kappa = sum_j alpha_j ||v~_j|| / ||o||, the bound before
  2026-12-06 (o's error as the sum of its terms' errors);
- ``quad``: Lambda_w + Lambda q / ||o||, the kernel's;
- ``quad_w``: Lambda_w (1 + q / ||o||).

``--metric value_weighted_normalized`` (s~_j = alpha_j ||v~_j|| / ||o||) the same three, its
kernel's ``quad`` since 2026-12-07 (``present`` before), for the same reason: the normaliser's
rounding scales alpha and o alike.

``--metric contribution_layer`` (s~_j = alpha_j^h <o_i, v~_j^h> / ||o_i||^2, o_i the layer's
output, every head's; the heads' errors in quadrature, q_h as above):

- ``present``: Lambda + Q / ||o||, Q = sqrt(sum_h (Lambda_h q_h)^2), the bound before
  2026-12-06 night (Lambda's sqrt(Tk) the model of the softmax normaliser's rounding);
- ``within``: Lambda_w + Q / ||o||, the same within one (head, query) row;
- ``measured``: Lambda_w + D + Q_D / ||o||, Q_D = sqrt(sum_h (Lambda_w,h q_h)^2 + (D_h
  ||o^h||)^2), D the normaliser's rounding measured from alpha's row sums
  (``FastLayer.normaliser``), a factor on head h's output: the kernel's ``relative``;
- ``measured_within``: Lambda_w + Q_D / ||o||, the kernel's ``within`` (head granularity: the
  row's own normaliser scales its alpha alike);
- ``keyed``: ``measured`` with each key's logit scale in q_h (scale |q_i| |k_j| + 1 inside the
  sum, in place of Lambda_w's largest key): what a bound per key would add;
- ``refined``: the kernel's refined scores t_j = exp(l_j - max l) <o'_i, v~_j> / ||o'_i||^2
  (``ErrorBound.refine``: logits in float64, o' from the float32 head outputs) against their
  bound Q_D / ||o|| (2 |t| + exp(l_j - max l) ||v~_j|| / ||o'||), up to the row's factor
  (no near rows: it decides only the near rows' open keys).

Every ratio is of the whole error, a row's common factor included; scores whose exact value
is subnormal in float32 are left out (the removal's absolute floor covers them:
``selection._floored``).

On a real model and WikiText-2 prose cut to T tokens, at every layer (``--layers``), this prints
for each bound the largest |s~ - s| over the bound's size (|s~| plus the key's term, as
tests/extract/test_selection.py bounds the signed scores), per layer and overall, and the share
of ranking rows (p = 0.1, head granularity, both modes) near the cut under each bound with the
unit of ``--units`` (the registry's rule: ten times the largest ratio measured over every length
and model). A clean forward pass: the removal pass's later layers have more near rows with any
bound.

    python benchmarks/bench_contribution_bound.py --length 128 --batch 8
    python benchmarks/bench_contribution_bound.py --length 4096 --layers 5,15,25
    python benchmarks/bench_contribution_bound.py --metric contribution_layer --length 4096 --layers 5,15,25
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import batch_of, emit, machine  # noqa: E402
from bench_row_error import RowProbe, cut, key_term, near_share  # noqa: E402

BOUNDS = {"contribution": ("present", "quad", "quad_w"),
          "value_weighted_normalized": ("present", "quad", "quad_w"),
          "contribution_layer": ("present", "within", "measured", "measured_within", "keyed")}
REFINE_ROWS = 1 << 22    # rows x keys x dh of the refined scores computed at a time


def bound_models(metric: str, x, lam_w, kernel):
    """Each bound's model (B, H, T), in units of u, from the layer's :class:`FastLayer` x; the
    kernel's own (``kernel``: its :class:`ErrorBound` over its unit u) as it gives them."""
    import torch

    from attngeom.extract.measurement.geometry import vecdot

    lam, q = x.lam, x.spread                                        # q = sqrt(sum alpha^2 ||v~||^2)
    if metric in ("contribution", "value_weighted_normalized"):
        _, norm, mass = x.head_output                               # ||o||, sum alpha ||v~||
        return {"present": lam * (1 + mass / norm), "quad": kernel.relative,
                "quad_w": lam_w * (1 + q / norm)}
    B, H, T, _ = x.alpha.shape
    zf = (x.alpha @ x.vf).transpose(1, 2).reshape(B, T, -1)         # z_i (B, T, H dh)
    norm = vecdot(zf @ x.proj.full, zf).clamp_min(0).sqrt()          # ||o_i|| (B, T)
    _, head_norm, _ = x.head_output                                 # ||o_i^h|| (B, H, T)
    d = x.normaliser                                                # D (B, H, T), measured
    k_norm = x.context.key.float().norm(dim=-1).repeat_interleave(H // x.value.shape[1], 1)
    per_key = x.context.scaling * x.context.query.float().norm(dim=-1)[..., None] * \
        k_norm[:, :, None, :] + 1                                   # (B, H, T, Tk)
    keyed = torch.linalg.vector_norm(x.alpha * x.value_norm[:, :, None, :] * per_key, dim=-1)
    keyed = (keyed.square() + (d * head_norm).square()).sum(1).sqrt() / norm   # Q_D keyed
    heads = ((lam * q).square().sum(1).sqrt() / norm)[:, None]      # Q / ||o_i|| (B, 1, T)
    return {"present": lam + heads, "within": torch.broadcast_to(lam_w + heads, lam.shape),
            "measured": kernel.relative, "measured_within": kernel.within,
            "keyed": lam_w + d + keyed[:, None]}


class BoundProbe(RowProbe):
    """Attention handler: per layer, each bound's largest error ratio and its rows at the cut."""

    def __init__(self, model, metric: str, layers=None):
        super().__init__(model, [metric], layers)
        self.metric = metric

    def attend(self, call):
        import torch

        from attngeom.common import metrics as M
        from attngeom.extract.faithfulness.context import LayerContext
        from attngeom.extract.faithfulness.layer_scores import fast_scores, metric_scores
        from attngeom.extract.faithfulness.removal_scores import FastLayer, within_scale
        from attngeom.extract.faithfulness.selection import ErrorBound

        (B, H, T, _), Tk = call.query.shape, call.key.shape[2]
        alpha, z, measured = self.inputs(call)
        if measured is None:
            return z.to(call.query.dtype)
        a64, vf, proj64, proj32, lam = measured
        allowed = call.allowed.expand(B, H, T, Tk)
        lam_w = within_scale(lam, Tk)
        x = FastLayer(alpha, call.value, proj32, lam, context=call)
        context = LayerContext(call.index, call.query, call.key, call.value, call.allowed,
                               call.scaling, call.softcap, call.sinks, proj64)
        fast, bound = fast_scores(self.metric, alpha, call.value, proj32, lam,
                                  torch.empty_like(alpha), context=context)
        unit = M.get(self.metric).error_unit * torch.finfo(torch.float32).eps / 2
        kernel = ErrorBound(bound.relative / unit,
                            within=None if bound.within is None else bound.within / unit)
        models = bound_models(self.metric, x, lam_w, kernel)             # (B, H, T) each
        exact = metric_scores(self.metric, a64, vf, a64 @ vf, proj64)
        err = (fast.double() - exact).abs()
        normal = exact.abs() >= torch.finfo(torch.float32).tiny    # below: the absolute floor
        term = key_term(self.metric, a64, vf, proj64)
        size = fast.double().abs() + (0.0 if term is None else term)
        u = torch.finfo(torch.float32).eps / 2
        o = self.out.setdefault(self.metric, {"ratio": {m: [] for m in models}, "rows": {}})
        for m, model in models.items():
            b = (model.double()[..., None] * u * size).clamp_min(1e-300)
            o["ratio"][m].append(float(torch.where(allowed & normal, err / b, 0).max()))
        if self.metric == "contribution_layer":
            o["ratio"].setdefault("refined", []).append(
                refined_ratio(call, bound.refine, exact, allowed))
        for mode in ("comprehensiveness", "sufficiency"):
            o["rows"].setdefault(mode, []).append((*cut(fast, allowed, mode), models))
        return z.to(call.query.dtype)


def refined_ratio(call, refine, exact, allowed) -> float:
    """The largest |t - C s| of the kernel's ``refine`` over its bound, in units of the
    registry's unit (C the row's factor: the sum of exp(l_j - max l) over its keys, the sink's
    included)."""
    import torch

    from attngeom.common import metrics as M
    from attngeom.extract.faithfulness.base import logits64
    from attngeom.extract.measurement.geometry import repeat_kv

    (B, H, T, dh), Tk = call.query.shape, call.key.shape[2]
    logits = logits64(call.query, repeat_kv(call.key, H), call.scaling, call.softcap)
    top = logits.amax(-1, keepdim=True)
    C = (logits - top).exp().masked_fill(~allowed, 0).sum(-1)                # (B, H, T)
    if call.sinks is not None:
        C = C + (call.sinks.double().expand(B, H, T) - top[..., 0]).exp()
    rows, worst = torch.arange(B * H * T), 0.0
    for chunk in rows.split(max(1, REFINE_ROWS // (Tk * dh))):
        b, h, i = chunk // (H * T), chunk // T % H, chunk % T
        t, bound = refine(b, i, h, torch.arange(Tk).expand(len(chunk), Tk))
        err = (t - C[b, h, i, None] * exact[b, h, i]).abs()
        ratio = torch.where(allowed[b, h, i], err / bound.clamp_min(1e-300), 0)
        worst = max(worst, float(ratio.max()))
    return worst * M.get("contribution_layer").error_unit


def share(rows, bound: str, unit: float) -> float:
    """Share of the rows with a cut whose two scores lie within ``unit`` u times the bound
    (:func:`bench_row_error.near_share` on that bound's rows)."""
    import torch

    scale = unit * torch.finfo(torch.float32).eps / 2
    return near_share([(hi, lo, ok, None, models[bound]) for hi, lo, ok, models in rows], scale)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m", help="a built-in model's name")
    p.add_argument("--length", type=int, default=128)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--metric", default="contribution", choices=sorted(BOUNDS))
    p.add_argument("--layers", default=None, help="comma-separated layers (default: every one)")
    p.add_argument("--units", default=None,
                   help="each bound's unit for the near rows (contribution: present, quad, "
                        "quad_w, default 10,13,15; value_weighted_normalized: the same, "
                        "16,34,45; contribution_layer: present, within, "
                        "measured, measured_within, keyed, default 10,10,12,12,12)")
    a = p.parse_args(argv)
    emit({"bench": "contribution_bound", "section": "machine", **machine()})
    import torch

    from attngeom.common import metrics as M
    from attngeom.extract.faithfulness.interventions import watching
    from attngeom.extract.loading.models import load
    from attngeom.extract.measurement.hooks import attention_handler

    loaded = load(a.model, device="cpu", dtype="float32")
    model, batch = loaded.model.eval(), batch_of(loaded.tokenizer, a.length, a.batch)
    layers = None if a.layers is None else {int(v) for v in a.layers.split(",")}
    probe = BoundProbe(model, a.metric, layers)
    with torch.inference_mode(), attention_handler(model, probe), watching(probe):
        model(**batch, use_cache=False)
    bounds = BOUNDS[a.metric]
    given = a.units or {"contribution": "10,13,15", "value_weighted_normalized": "16,34,45"
                        }.get(a.metric, "10,10,12,12,12")
    o, units = probe.out[a.metric], dict(zip(bounds, map(float, given.split(","))))
    near = {mode: {m: share(o["rows"][mode], m, units[m]) for m in bounds}
            for mode in o["rows"]}
    if "refined" in o["ratio"]:
        units["refined"] = M.get(a.metric).error_unit
    emit({"bench": "contribution_bound", "metric": a.metric, "model": a.model, "length": a.length,
          "batch": a.batch, "largest": {m: max(r) for m, r in o["ratio"].items()},
          "by_layer": o["ratio"], "units": units, "near": near})
    print(f"| {a.metric} bound ({a.model}, T = {a.length}) | largest ratio | unit | near rows, comp | "
          "suff |\n|---|---|---|---|---|")
    for m in bounds:
        print(f"| {m} | {max(o['ratio'][m]):.2f} | {units[m]:g} | "
              f"{100 * near['comprehensiveness'][m]:.2f} % | "
              f"{100 * near['sufficiency'][m]:.2f} % |")
    if "refined" in o["ratio"]:
        print(f"| refined | {max(o['ratio']['refined']):.2f} | {units['refined']:g} | - | - |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
