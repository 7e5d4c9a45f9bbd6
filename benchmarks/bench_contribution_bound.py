"""contribution's float32 error against candidate bounds, and the rows each leaves near the cut.

The removal pass bounds a float32 contribution score s~_j = alpha_j <o, v~_j> / ||o||^2 by
u unit Lambda (1 + kappa) |s~| (extract/faithfulness/removal_scores.py, ``fast_contribution``),
kappa = sum_j alpha_j ||v~_j|| / ||o||: o's error taken as the sum of its terms' errors, and
Lambda's sqrt(Tk) for the softmax normaliser. Two bounds that follow the arithmetic more closely
are measured beside it, in units of u:

- ``present``: Lambda (1 + kappa), as the kernel has it;
- ``quad``: Lambda_w + Lambda q / ||o||, q = sqrt(sum_j alpha_j^2 ||v~_j||^2): the normaliser's
  rounding, common to a head's row, cancels in alpha and o alike (Lambda_w, :func:`within_scale`),
  and the roundings of o's terms have independent signs (in quadrature, as contribution_layer's
  bound already takes them; Lambda keeps its sqrt(Tk) there for the sum's own rounding);
- ``quad_w``: Lambda_w (1 + q / ||o||).

On a real model and WikiText-2 prose cut to T tokens, at every layer (``--layers``), this prints
for each bound the largest |s~ - s| over the bound's size (|s~| plus the key's term
alpha ||v~|| / ||o||, as tests/extract/test_selection.py bounds the signed scores), per layer and
overall, and the share of ranking rows (p = 0.1, head granularity, both modes) near the cut under
each bound with the unit of ``--units`` (the registry's rule: ten times the largest ratio measured
over every length and model). A clean forward pass: the removal pass's later layers have more
near rows with any bound.

    python benchmarks/bench_contribution_bound.py --length 128 --batch 8
    python benchmarks/bench_contribution_bound.py --length 4096 --layers 5,15,25
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import batch_of, emit, machine  # noqa: E402
from bench_row_error import RowProbe, cut, key_term, near_share  # noqa: E402

BOUNDS = ("present", "quad", "quad_w")


class BoundProbe(RowProbe):
    """Attention handler: per layer, each bound's largest error ratio and its rows at the cut."""

    def attend(self, call):
        import torch

        from attngeom.extract.faithfulness.layer_scores import fast_scores, metric_scores
        from attngeom.extract.faithfulness.removal_scores import FastLayer, within_scale

        (B, H, T, _), Tk = call.query.shape, call.key.shape[2]
        alpha, z, measured = self.inputs(call)
        if measured is None:
            return z.to(call.query.dtype)
        a64, vf, proj64, proj32, lam = measured
        allowed = call.allowed.expand(B, H, T, Tk)
        lam_w = within_scale(lam, Tk)
        x = FastLayer(alpha, call.value, proj32, lam)
        _, norm, mass = x.head_output                                   # ||o||, sum alpha ||v~||
        q = x.spread                                                    # sqrt(sum alpha^2 ||v~||^2)
        models = {"present": lam * (1 + mass / norm), "quad": lam_w + lam * q / norm,
                  "quad_w": lam_w * (1 + q / norm)}                     # (B, H, T) each
        fast, _ = fast_scores("contribution", alpha, call.value, proj32, lam,
                              torch.empty_like(alpha))
        exact = metric_scores("contribution", a64, vf, a64 @ vf, proj64)
        err = (fast.double() - exact).abs()
        size = fast.double().abs() + key_term("contribution", a64, vf, proj64)
        u = torch.finfo(torch.float32).eps / 2
        o = self.out.setdefault("contribution", {"ratio": {m: [] for m in BOUNDS}, "rows": {}})
        for m, model in models.items():
            b = (model.double()[..., None] * u * size).clamp_min(1e-300)
            o["ratio"][m].append(float(torch.where(allowed, err / b, 0).max()))
        for mode in ("comprehensiveness", "sufficiency"):
            o["rows"].setdefault(mode, []).append((*cut(fast, allowed, mode), models))
        return z.to(call.query.dtype)


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
    p.add_argument("--layers", default=None, help="comma-separated layers (default: every one)")
    p.add_argument("--units", default="10,13,15",
                   help="each bound's unit (present, quad, quad_w) for the near rows")
    a = p.parse_args(argv)
    emit({"bench": "contribution_bound", "section": "machine", **machine()})
    import torch

    from attngeom.extract.faithfulness.interventions import watching
    from attngeom.extract.loading.models import load
    from attngeom.extract.measurement.hooks import attention_handler

    loaded = load(a.model, device="cpu", dtype="float32")
    model, batch = loaded.model.eval(), batch_of(loaded.tokenizer, a.length, a.batch)
    layers = None if a.layers is None else {int(v) for v in a.layers.split(",")}
    probe = BoundProbe(model, ["contribution"], layers)
    with torch.inference_mode(), attention_handler(model, probe), watching(probe):
        model(**batch, use_cache=False)
    o, units = probe.out["contribution"], dict(zip(BOUNDS, map(float, a.units.split(","))))
    near = {mode: {m: share(o["rows"][mode], m, units[m]) for m in BOUNDS}
            for mode in o["rows"]}
    emit({"bench": "contribution_bound", "model": a.model, "length": a.length,
          "batch": a.batch, "largest": {m: max(r) for m, r in o["ratio"].items()},
          "by_layer": o["ratio"], "units": units, "near": near})
    print(f"| bound ({a.model}, T = {a.length}) | largest ratio | unit | near rows, comp | "
          "suff |\n|---|---|---|---|---|")
    for m in BOUNDS:
        print(f"| {m} | {max(o['ratio'][m]):.2f} | {units[m]:g} | "
              f"{100 * near['comprehensiveness'][m]:.2f} % | "
              f"{100 * near['sufficiency'][m]:.2f} % |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
