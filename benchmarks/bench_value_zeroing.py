"""Value zeroing's removal pass against an eager forward, T = 64, 128 and 512 (issue 44).

On the real SmolLM2-135M (built-in ``smollm2-135m``) and WikiText-2 prose (shared/data, else
the built-in corpus) cut to T tokens: one removal pass ranked by ``value_zeroing`` at
``--granularity token`` (comprehensiveness and sufficiency, p = 0.1), and the clean pass,
against a plain eager forward of the same batch, interleaved and repeated
(benchmarks/_common.py), with torch's default threads and with 1 thread. Beside the times:
the rows of the post-attention sublayer a pass computes (T (T + 1) / 2 per text and layer), the
ranking rows decided again in float64 (near the cut: each costs T float64 rows), and the
up-front estimate the run's refusal uses (extract/loading/budget.py: rows over the rows per
second measured on layer 0) against the measured pass.

    python benchmarks/bench_value_zeroing.py --lengths 64,128,512 --batches 4,4,1 \\
        --repeats 2,2,1 --threads 0,1
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import batch_of, emit, interleaved, log, machine, summarize  # noqa: E402

MODES = ("comprehensiveness", "sufficiency")


class Counted:
    """Counts the ranking rows (queries) value zeroing's float64 kernel decides again."""

    def __init__(self):
        from attngeom.extract.faithfulness import kernels as K

        self.K, self.kept, self.rows = K, K.BUILTIN["value_zeroing"], 0

        def exact(rows):
            self.rows += len(rows.b)
            return self.kept.exact(rows)
        K.BUILTIN["value_zeroing"] = K.Kernels(self.kept.fast, exact)

    def restore(self) -> None:
        self.K.BUILTIN["value_zeroing"] = self.kept


def cases_for(model, batch, counted: Counted) -> dict:
    import torch

    from attngeom.extract.faithfulness.interventions import Intervener, Removal, forward_logits
    from attngeom.extract.faithfulness.selection import Workspace

    shared, work, near = {}, Workspace(), {}

    def eager():
        model.set_attn_implementation("eager")
        with torch.inference_mode():
            model(**batch, use_cache=False)

    def through(removal=None, name=None):
        def run():
            before = counted.rows
            forward_logits(model, batch, Intervener(model, removal=removal, projections=shared,
                                                    workspace=work))
            if name:
                near[name] = counted.rows - before
        return run

    cases = {"eager": eager, "clean": through()}
    for mode in MODES:
        name = f"value_zeroing/{mode}"
        cases[name] = through(Removal("value_zeroing", mode, 0.1, granularity="token"), name)
    return cases, near


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", default="64,128,512")
    p.add_argument("--batches", default="4,4,1", help="texts per length")
    p.add_argument("--repeats", default="2,2,1", help="rounds per length")
    p.add_argument("--threads", default="0,1", help="torch threads to time (0: the default)")
    a = p.parse_args(argv)
    emit({"bench": "value_zeroing", "section": "machine", **machine()})
    import torch

    from attngeom.extract.faithfulness.sublayer import rows_per_second
    from attngeom.extract.loading.budget import zeroing_rows
    from attngeom.extract.loading.models import load

    default = torch.get_num_threads()
    loaded = load("smollm2-135m", device="cpu", dtype="float32")
    model, tok = loaded.model.eval(), loaded.tokenizer
    L = len(model.model.layers)
    counted = Counted()
    head = ["\n### value zeroing on SmolLM2-135M: one removal pass (p = 0.1, token granularity) "
            "against an eager forward (wall, median of rounds; ratio: paired median)\n",
            "| T | texts | threads | eager s | clean / eager | comprehensiveness s (/ eager) | "
            "sufficiency s (/ eager) | rows / pass | float64 queries (comp / suff) | "
            "estimate s (/ measured) |", "|---|---|---|---|---|---|---|---|---|---|"]
    per_text = {}
    lengths = [int(x) for x in a.lengths.split(",")]
    for length, size, repeats in zip(lengths, map(int, a.batches.split(",")),
                                     map(int, a.repeats.split(","))):
        batch = batch_of(tok, length, size)
        rows = zeroing_rows([length] * size, L, 1, True)
        for threads in map(int, a.threads.split(",")):
            torch.set_num_threads(threads or default)
            rate = rows_per_second(model)
            cases, near = cases_for(model, batch, counted)
            cases["eager"](), cases["clean"]()                     # warm the cheap cases
            stats = summarize(interleaved(cases, repeats, warmup=0, log=log), "eager",
                              length * size)
            for name, rec in stats.items():
                emit({"bench": "value_zeroing", "case": name, "length": length, "batch": size,
                      "threads": torch.get_num_threads(), "sublayer_rows": rows,
                      "rows_per_s_layer0": rate, "float64_queries": near.get(name),
                      **rec})
            s = {n: stats[n]["wall_median_s"] for n in stats}
            r = {n: stats[n]["wall_ratio_paired"] for n in stats}
            comp, suff = (f"value_zeroing/{m}" for m in MODES)
            per_text[(length, torch.get_num_threads())] = s[comp] / size
            head.append(
                f"| {length} | {size} | {torch.get_num_threads()} | {s['eager']:.3f} | "
                f"{r['clean']:.2f} | {s[comp]:.1f} ({r[comp]:.0f}x) | {s[suff]:.1f} "
                f"({r[suff]:.0f}x) | {rows:,} | {near[comp]} / {near[suff]} | "
                f"{rows / rate:.1f} ({rows / rate / s[comp]:.2f}) |")
    counted.restore()
    torch.set_num_threads(default)
    head += ["\n| growth of one text's comprehensiveness pass | threads | measured | "
             "T (T + 1) / 2 rows |", "|---|---|---|---|"]
    for (t0, th), v0 in per_text.items():
        for (t1, th1), v1 in per_text.items():
            if th1 == th and t1 == next((t for t in lengths if t > t0), None):
                head.append(f"| T = {t0} -> {t1} | {th} | {v1 / v0:.1f}x | "
                            f"{t1 * (t1 + 1) / (t0 * (t0 + 1)):.1f}x |")
    print("\n".join(head), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
