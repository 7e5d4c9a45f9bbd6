"""The field's methods in the removal pass: cost against an eager forward, and float32 error.

On the real SmolLM2-135M (built-in ``smollm2-135m``) and WikiText-2 prose (shared/data, else
the built-in corpus) cut to T tokens, one removal pass per metric at ``--granularity token``
(comprehensiveness, p = 0.1; the head-granularity contribution pass beside them) against a
plain eager forward of the same batch, interleaved and repeated (benchmarks/_common.py), with
torch's default threads and with 1 thread. Then, on the same texts, every layer's float32
scores of each new metric against its float64 definition: the largest |fast - exact| in units
of the kernel's error model (extract/faithfulness/field_scores.py, random_scores.py), which the
registry's ``error_unit`` must exceed (it is set at ten times the largest measured).

Value zeroing (extract/faithfulness/zeroing.py) reruns the layer's sublayer for every (query,
key) pair, about T / 2 forward passes' worth per pass: it is timed and probed on its own
smaller batch (``--zeroing-batch`` texts, the first of the batch's, ``--zeroing-repeats``
rounds; ``--no-zeroing`` leaves it out). Its bound ``sqrt(2 s) e + e^2 / 2`` is not linear in
the unit (e is): its ratio is the unit whose bound just covers each difference.

    python benchmarks/bench_field.py --length 128 --batch 4 --repeats 3
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import batch_of, emit, interleaved, log, machine, summarize  # noqa: E402

NEW = ("random", "alti", "alti_sa", "norm_residual", "norm_residual_sa", "rollout")
ZEROING = "value_zeroing"


def cases_for(model, batch, metrics=NEW, base: bool = True) -> dict:
    """The timed passes: eager, and (``base``) the clean and contribution passes, then one
    token-granularity removal pass per metric of ``metrics``."""
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

    cases = {"eager": eager}
    if base:
        cases.update({
            "clean": through(),
            "contribution/head": through(Removal("contribution", "comprehensiveness", 0.1)),
            "contribution/token": through(Removal("contribution", "comprehensiveness", 0.1,
                                                  granularity="token"))})
    for metric in metrics:
        cases[f"{metric}/token"] = through(Removal(metric, "comprehensiveness", 0.1,
                                                   granularity="token"))
    return cases


def ratio(fast, exact, err, error_unit: float) -> float:
    """The largest |fast - exact| in units of the error model: the smallest error_unit whose
    bound covers every score. The bound is linear in the unit (relative |s| + absolute), or,
    with a ``root`` term (value zeroing: root = sqrt(2) e, absolute = e^2 / 2, e linear in the
    unit), covers |d| once e >= sqrt(2 s + 2 |d|) - sqrt(2 s) = 2 |d| / (sqrt(2 s) + ...)."""
    d, f = (fast.double() - exact).abs(), fast.double().abs()
    if err.root is None:
        bound = err.relative[..., None].double() * f + (
            0 if err.absolute is None else err.absolute[..., None].double())
        return float((d / bound.clamp_min(1e-300)).max()) * error_unit
    e = err.root[..., None].double() / 2 ** 0.5                       # e at error_unit
    need = 2 * d / ((2 * f).sqrt() + (2 * f + 2 * d).sqrt()).clamp_min(1e-300)
    return float((need / e.clamp_min(1e-300)).max()) * error_unit


class ErrorProbe:
    """Attention handler: at each layer, each metric's float32 scores (of ``metrics``) against
    float64, in units of its error model (:func:`ratio`)."""

    def __init__(self, model, metrics=NEW[1:]):
        from attngeom.common import metrics as M
        from attngeom.extract.faithfulness.interventions import Intervener
        from attngeom.extract.faithfulness.residual import ResidualTap
        from attngeom.extract.faithfulness.sublayer import BlockTap

        needs = {n for m in metrics for n in M.get(m).needs}
        self.metrics, self.inner, self.carry, self.token_mask = metrics, Intervener(model), \
            {}, None
        self.tap = ResidualTap(model) if M.RESIDUAL in needs else None
        self.blocks = BlockTap(model) if M.SUBLAYER in needs else None
        self.units: dict[str, float] = {}

    def context(self, layer: int, call):
        from attngeom.extract.faithfulness.context import LayerContext

        x = residual = sublayer = None               # as Intervener.context
        if self.tap is not None:
            x, residual = self.tap.x[layer], self.tap.structure[layer]
        if self.blocks is not None:
            sublayer = self.blocks.at(layer)
            x = sublayer.x if x is None else x
        return LayerContext(layer, call.query, call.key, call.value, call.allowed, call.scaling,
                            call.softcap, call.sinks, self.inner.projection(layer), x=x,
                            residual=residual, sublayer=sublayer, carry=self.carry)

    def attend(self, call):
        import torch

        from attngeom.common import metrics as M
        from attngeom.extract.faithfulness.dense import attention_weights
        from attngeom.extract.faithfulness.field_scores import TokenRows64, step_rollout
        from attngeom.extract.faithfulness.kernels import kernels
        from attngeom.extract.faithfulness.layer_scores import fast_scores
        from attngeom.extract.faithfulness.removal_scores import logit_scale

        layer, (B, H, T, _) = call.index, call.query.shape
        alpha = attention_weights(call.query, call.key, call.allowed, call.scaling,
                                  call.softcap, torch.float32, call.sinks)
        ctx = self.context(layer, call)
        step_rollout(ctx, alpha)
        lam = logit_scale(call.query, call.key, call.scaling, call.sinks)
        b, i = (t.reshape(-1) for t in torch.meshgrid(torch.arange(B), torch.arange(T),
                                                       indexing="ij"))
        for m in self.metrics:
            fast, err = fast_scores(m, alpha, call.value, self.inner.projection(
                layer, torch.float32), lam, torch.empty_like(alpha), None, ctx)
            exact = kernels(m).exact(TokenRows64(ctx, b, i)).view(B, 1, T, -1)
            self.units[m] = max(self.units.get(m, 0.0),
                                ratio(fast, exact, err, M.get(m).error_unit))
        z = alpha @ call.value.repeat_interleave(H // call.value.shape[1], 1).float()
        return z.to(call.query.dtype)


def error_units(model, batch, metrics=NEW[1:]) -> dict:
    import torch

    from attngeom.extract.faithfulness.interventions import watching
    from attngeom.extract.measurement.hooks import attention_handler

    probe = ErrorProbe(model, metrics)
    with torch.inference_mode(), attention_handler(model, probe), watching(probe):
        model(**batch, use_cache=False)
    return probe.units


def timed(cases: dict, repeats: int, tokens: int, per: dict, suffix: str = "") -> None:
    """Time ``cases`` (interleaved, against eager) at the current threads; table cells to
    ``per`` (case name + ``suffix``: list of cells), one JSON line per case."""
    import torch

    stats = summarize(interleaved(cases, repeats, log=log), "eager", tokens)
    for name, rec in stats.items():
        emit({"bench": "field", "case": name + suffix, "threads": torch.get_num_threads(),
              **rec})
        per.setdefault(name + suffix, []).append(
            f"{rec['cpu_ratio_paired']:.2f} ({rec['wall_ratio_paired']:.2f}); "
            f"{rec['wall_median_s']:.2f} s")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--length", type=int, default=128)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", default="0,1", help="torch threads to time (0: the default)")
    p.add_argument("--zeroing-batch", type=int, default=1,
                   help="texts of value zeroing's pass and error probe (the batch's first)")
    p.add_argument("--zeroing-repeats", type=int, default=1)
    p.add_argument("--no-zeroing", action="store_true", help="leave value zeroing out")
    a = p.parse_args(argv)
    emit({"bench": "field", "section": "machine", **machine()})
    import torch

    from attngeom.common import metrics as M
    from attngeom.extract.loading.models import load

    default = torch.get_num_threads()
    loaded = load("smollm2-135m", device="cpu", dtype="float32")
    model, batch = loaded.model.eval(), batch_of(loaded.tokenizer, a.length, a.batch)
    zb = None if a.no_zeroing else {k: v[:a.zeroing_batch] for k, v in batch.items()}
    threads = [int(t) for t in a.threads.split(",")]
    rows = [f"\n### SmolLM2-135M, T = {a.length}, batch {a.batch}: one pass / eager forward "
            "(CPU time, paired median; wall in brackets)\n",
            "| case | " + " | ".join(f"{t or default} thread(s)" for t in threads) + " |",
            "|---|" + "---|" * len(threads)]
    per: dict[str, list] = {}
    for t in threads:
        torch.set_num_threads(t or default)
        timed(cases_for(model, batch), a.repeats, a.length * a.batch, per)
        if zb is not None:
            n = len(zb["input_ids"])
            timed(cases_for(model, zb, (ZEROING,), base=False), a.zeroing_repeats,
                  a.length * n, per, f", batch {n}, {a.zeroing_repeats} round(s)")
    rows += [f"| {name} | " + " | ".join(cells) + " |" for name, cells in per.items()]
    torch.set_num_threads(default)
    units = error_units(model, batch)
    if zb is not None:
        units.update(error_units(model, zb, (ZEROING,)))
    emit({"bench": "field", "section": "error_units", **units})
    rows += ["\n| metric | largest float32 error, in units of its model | error_unit |",
             "|---|---|---|"]
    rows += [f"| {m} | {u:.3g} | {M.get(m).error_unit:g} |" for m, u in units.items()]
    print("\n".join(rows), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
