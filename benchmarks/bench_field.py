"""The field's methods in the removal pass: cost against an eager forward, and float32 error.

On the real SmolLM2-135M (built-in ``smollm2-135m``) and WikiText-2 prose (shared/data, else
the built-in corpus) cut to T tokens, one removal pass per metric at ``--granularity token``
(comprehensiveness, p = 0.1; the head-granularity contribution pass beside them) against a
plain eager forward of the same batch, interleaved and repeated (benchmarks/_common.py), with
torch's default threads and with 1 thread. Then, on the same texts, every layer's float32
scores of each new metric against its float64 definition: the largest |fast - exact| in units
of the kernel's error model (extract/faithfulness/field_scores.py, random_scores.py), which the
registry's ``error_unit`` must exceed (it is set at ten times the largest measured).

    python benchmarks/bench_field.py --length 128 --batch 4 --repeats 3
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, emit, interleaved, log, machine, summarize  # noqa: E402

NEW = ("random", "alti", "alti_sa", "norm_residual", "norm_residual_sa", "rollout")


def batch_of(tok, length: int, size: int):
    import torch

    from attngeom.extract.loading.data import load_texts

    wiki = REPO.parent / "shared" / "data" / "wikitext2_raw_test.jsonl"
    texts = load_texts(str(wiki) if wiki.is_file() else "builtin").texts
    rows = [ids for ids in (tok(t)["input_ids"] for t in texts) if len(ids) >= length][:size]
    ids = torch.tensor([r[:length] for r in rows])
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def cases_for(model, batch) -> dict:
    import torch

    from attngeom.extract.faithfulness.interventions import Intervener, Removal, forward_logits
    from attngeom.extract.faithfulness.selection import Workspace

    shared, work = {}, Workspace()

    def eager():
        model.set_attn_implementation("eager")
        with torch.inference_mode():
            model(**batch, use_cache=False)

    def through(removal=None):
        return lambda: forward_logits(model, batch, Intervener(
            model, removal=removal, projections=shared, workspace=work))

    cases = {"eager": eager, "clean": through(),
             "contribution/head": through(Removal("contribution", "comprehensiveness", 0.1)),
             "contribution/token": through(Removal("contribution", "comprehensiveness", 0.1,
                                                   granularity="token"))}
    for metric in NEW:
        cases[f"{metric}/token"] = through(Removal(metric, "comprehensiveness", 0.1,
                                                   granularity="token"))
    return cases


class ErrorProbe:
    """Attention handler: at each layer, each new metric's float32 scores against float64, in
    units of its error model (the bound divided by the registered error_unit)."""

    def __init__(self, model):
        from attngeom.extract.faithfulness.interventions import Intervener
        from attngeom.extract.faithfulness.residual import ResidualTap

        self.inner, self.tap, self.carry, self.token_mask = Intervener(model), \
            ResidualTap(model), {}, None
        self.units: dict[str, float] = {}

    def attend(self, call):
        import torch

        from attngeom.common import metrics as M
        from attngeom.extract.faithfulness.context import LayerContext
        from attngeom.extract.faithfulness.dense import attention_weights
        from attngeom.extract.faithfulness.field_scores import TokenRows64, step_rollout
        from attngeom.extract.faithfulness.kernels import kernels
        from attngeom.extract.faithfulness.removal_scores import fast_scores, logit_scale

        layer, (B, H, T, _) = call.index, call.query.shape
        alpha = attention_weights(call.query, call.key, call.allowed, call.scaling,
                                  call.softcap, torch.float32, call.sinks)
        ctx = LayerContext(layer, call.query, call.key, call.value, call.allowed, call.scaling,
                           call.softcap, call.sinks, self.inner.projection(layer),
                           x=self.tap.x[layer], residual=self.tap.structure[layer],
                           carry=self.carry)
        step_rollout(ctx, alpha)
        lam = logit_scale(call.query, call.key, call.scaling, call.sinks)
        b, i = (t.reshape(-1) for t in torch.meshgrid(torch.arange(B), torch.arange(T),
                                                       indexing="ij"))
        for m in NEW[1:]:
            fast, err = fast_scores(m, alpha, call.value, self.inner.projection(
                layer, torch.float32), lam, torch.empty_like(alpha), None, ctx)
            exact = kernels(m).exact(TokenRows64(ctx, b, i)).view(B, 1, T, -1)
            bound = err.relative[..., None] * fast.abs() + (
                0 if err.absolute is None else err.absolute[..., None])
            ratio = float(((fast.double() - exact).abs() / bound.double().clamp_min(1e-300))
                          .max()) * M.get(m).error_unit
            self.units[m] = max(self.units.get(m, 0.0), ratio)
        z = alpha @ call.value.repeat_interleave(H // call.value.shape[1], 1).float()
        return z.to(call.query.dtype)


def error_units(model, batch) -> dict:
    import torch

    from attngeom.extract.faithfulness.interventions import watching
    from attngeom.extract.measurement.hooks import attention_handler

    probe = ErrorProbe(model)
    with torch.inference_mode(), attention_handler(model, probe), watching(probe):
        model(**batch, use_cache=False)
    return probe.units


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--length", type=int, default=128)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", default="0,1", help="torch threads to time (0: the default)")
    a = p.parse_args(argv)
    emit({"bench": "field", "section": "machine", **machine()})
    import torch

    from attngeom.common import metrics as M
    from attngeom.extract.loading.models import load

    default = torch.get_num_threads()
    loaded = load("smollm2-135m", device="cpu", dtype="float32")
    model, batch = loaded.model.eval(), batch_of(loaded.tokenizer, a.length, a.batch)
    rows = [f"\n### SmolLM2-135M, T = {a.length}, batch {a.batch}: one pass / eager forward "
            "(CPU time, paired median; wall in brackets)\n",
            "| case | " + " | ".join(f"{t or default} thread(s)" for t in
                                      map(int, a.threads.split(","))) + " |",
            "|---|" + "---|" * len(a.threads.split(","))]
    per = {}
    for threads in map(int, a.threads.split(",")):
        torch.set_num_threads(threads or default)
        stats = summarize(interleaved(cases_for(model, batch), a.repeats, log=log), "eager",
                          a.length * a.batch)
        for name, rec in stats.items():
            emit({"bench": "field", "case": name, "threads": torch.get_num_threads(), **rec})
            per.setdefault(name, []).append(
                f"{rec['cpu_ratio_paired']:.2f} ({rec['wall_ratio_paired']:.2f}); "
                f"{rec['wall_median_s']:.2f} s")
    rows += [f"| {name} | " + " | ".join(cells) + " |" for name, cells in per.items()]
    torch.set_num_threads(default)
    units = error_units(model, batch)
    emit({"bench": "field", "section": "error_units", **units})
    rows += ["\n| metric | largest float32 error, in units of its model | error_unit |",
             "|---|---|---|"]
    rows += [f"| {m} | {u:.3g} | {M.get(m).error_unit:g} |" for m, u in units.items()]
    print("\n".join(rows), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
