"""Faithfulness sweep cost per (metric, fraction); one JSON object per line.

One forward pass of a random-init SmolLM2-135M-shaped Llama per condition, through
``attngeom.extract.interventions.Intervener`` (the handler the sweep uses), interleaved and
repeated against a plain SDPA and eager forward and the clean and sink-zeroed (drift) passes.
A sweep costs, per batch, one clean pass, one drift pass and one pass per (metric, rank, mode,
fraction), so ``ratio_paired`` to eager is the price of each condition.

    python benchmarks/bench_faithfulness.py --fractions 0.1,0.5 --length 256
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (SMOLLM2, emit, interleaved, log, machine, random_llama,  # noqa: E402
                     random_tokens, summarize)


def available() -> str | None:
    try:
        from attngeom.extract.interventions import (METRICS, Intervener,  # noqa: F401
                                                    Removal, forward_logits)  # noqa: F401
    except ImportError as exc:
        return f"attngeom.extract.interventions is not available yet ({exc})"
    return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--length", type=int, default=256)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--fractions", default="0.1,0.5")
    p.add_argument("--metrics", default=None, help="default: every metric")
    p.add_argument("--mode", default="comprehensiveness")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    a = p.parse_args(argv)
    emit({"bench": "faithfulness", "section": "machine", **machine()})
    why = available()
    if why:
        emit({"bench": "faithfulness", "skipped": why})
        return 0
    import torch

    from attngeom.extract.interventions import METRICS, Intervener, Removal, forward_logits

    if a.threads:
        torch.set_num_threads(a.threads)
    model = random_llama(SMOLLM2, layers=a.layers)
    batch = random_tokens(a.batch, a.length, SMOLLM2["vocab_size"])

    def plain(impl):
        def run():
            model.set_attn_implementation(impl)
            with torch.inference_mode():
                model(**batch, use_cache=False)
        return run

    def through(**kw):
        return lambda: forward_logits(model, batch, Intervener(model, **kw))

    cases = {"sdpa": plain("sdpa"), "eager": plain("eager"), "clean": through(),
             "drift": through(sink_k=1)}
    metrics = a.metrics.split(",") if a.metrics else list(METRICS)
    for metric in metrics:
        for fraction in (float(x) for x in a.fractions.split(",")):
            cases[f"{metric}@{fraction:g}"] = through(
                removal=Removal(metric, a.mode, fraction))
    times = interleaved(cases, a.repeats, warmup=1, log=log)
    stats = summarize(times, "eager", a.length * a.batch)
    for name, rec in stats.items():
        metric, _, fraction = name.partition("@")
        emit({"bench": "faithfulness", "case": name, "metric": metric if fraction else None,
              "fraction": float(fraction) if fraction else None, "mode": a.mode,
              "layers": a.layers, "length": a.length, "batch": a.batch,
              "threads": torch.get_num_threads(), "baseline": "eager", **rec})
    return 0


if __name__ == "__main__":
    sys.exit(main())
