"""Faithfulness sweep cost: one pass per (metric, mode) against a plain eager forward, before/after.

One forward pass of a random-init SmolLM2-135M-shaped Llama per case, through
``attngeom.extract.faithfulness.interventions.Intervener`` (the handler the sweep uses),
interleaved and repeated against a plain eager and SDPA forward of the same batch, at each length
and each torch thread count (``--threads 0,1``: the default and one). Every registered metric
runs, at ``--granularity head`` where it can and ``token`` for the methods that score keys with
the heads combined (ALTI, the norm-based method, rollout, value zeroing). Value zeroing reruns
each layer's sublayer once per (query, key) pair (about T / 2 forward passes' worth), so it runs
on its own smaller batch (``--zeroing-batches``) against an eager forward of that batch.
``after`` is the current code; ``before`` (``--before``) the code until 2026-12 kept here as
:class:`SortedFloat64` (the paper's metrics only): attention, scores and head outputs in float64
and a full stable sort of every ranking row at every layer. A sweep costs, per batch, one clean
pass, one drift pass and one pass per (metric, rank, mode, fraction), so ``ratio_paired`` to
eager is the price of each. The last table gives every metric's pass, one row each, at every
length and thread count.

    python benchmarks/bench_faithfulness.py --lengths 128,512 --batches 8,4 --threads 0,1 \
        --zeroing-batches 1,1 --before 128
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (SMOLLM2, emit, interleaved, log, machine, random_llama,  # noqa: E402
                     random_tokens, summarize)

MODES = ("comprehensiveness", "sufficiency")


def available() -> str | None:
    try:
        from attngeom.extract.faithfulness.interventions import (  # noqa: F401
            Intervener, Removal, forward_logits)
        from attngeom.extract.faithfulness.selection import Workspace  # noqa: F401
    except ImportError as exc:
        return f"attngeom.extract.faithfulness.interventions is not available yet ({exc})"
    return None


def sorted_float64():
    """The handler as it was before the fast path (main at the merge into wip-f: git babccdb plus
    learned sinks, extract/faithfulness/interventions.py)."""
    import torch

    from attngeom.extract.measurement.geometry import attention_probs, norm_from_gram, repeat_kv
    from attngeom.extract.faithfulness.interventions import Intervener, eligible_keys
    from attngeom.extract.faithfulness.selection import n_remove, stable_select

    def finite(x):
        big = torch.finfo(x.dtype).max
        return torch.nan_to_num(x, nan=0.0, posinf=big, neginf=-big)

    def scores(metric, alpha, vf, z, proj):
        if metric == "attention":
            return alpha
        if metric in ("value_weighted", "value_weighted_normalized"):
            s = alpha * norm_from_gram(vf, proj.gram)[1][:, :, None, :]
            if metric == "value_weighted_normalized":
                s = s / norm_from_gram(z, proj.gram)[1][..., None]
            return finite(s)
        if metric == "contribution":
            zg, on = norm_from_gram(z, proj.gram)
            return finite(alpha * (zg @ vf.transpose(-1, -2)) / on.square()[..., None])
        B, H, T, dh = z.shape
        o = z.transpose(1, 2).reshape(B, T, H * dh) @ proj.weight
        u = (o @ proj.weight.T).view(B, T, H, dh).transpose(1, 2)
        return finite(alpha * (u @ vf.transpose(-1, -2)) / o.square().sum(-1)[:, None, :, None])

    def last(s, e, fraction, mode):
        return stable_select(s, e, n_remove(e.sum(-1), fraction), mode)

    def select(score, eligible, fraction, mode, rank, granularity):
        B, H, T, Tk = score.shape
        e = eligible.expand(B, H, T, Tk)
        if granularity == "token":
            s = score.masked_fill(~e, 0.0).sum(1)
            s = s.abs() if rank == "magnitude" else s
            return last(s, e.any(1), fraction, mode)[:, None] & e
        s = score.abs() if rank == "magnitude" else score
        if granularity == "head":
            return last(s, e, fraction, mode)
        flat = lambda x: x.permute(0, 2, 3, 1).reshape(B, T, Tk * H)    # noqa: E731
        return last(flat(s), flat(e), fraction, mode).view(B, T, Tk, H).permute(0, 3, 1, 2)

    class SortedFloat64(Intervener):
        def attend(self, call):
            layer, query, key, value = call.index, call.query, call.key, call.value
            B, H, T, _ = query.shape
            proj = self.projection(layer)
            mask = self.token_mask
            mask = (torch.ones(B, T, dtype=torch.bool) if mask is None else mask)
            allowed = call.allowed & mask[:, None, None, :]
            alpha, _ = attention_probs(query, repeat_kv(key, H), call.scaling, allowed,
                                       call.softcap, call.sinks, dtype=torch.float64)
            vf = repeat_kv(value, H).double()
            weights, r = alpha, self.removal
            if r is not None and (r.layers is None or layer in r.layers):
                score = scores(r.metric, alpha, vf, alpha @ vf, proj)
                remove = select(score, eligible_keys(allowed, mask), r.fraction, r.mode,
                                r.rank, r.granularity)
                weights = alpha.masked_fill(remove, 0.0)
            v_used = vf
            if self.sink_k is not None:
                v_used = vf.clone()
                v_used[:, :, : self.sink_k] = 0.0
            return (weights @ v_used).to(query.dtype)

    return SortedFloat64


def cases_for(model, batch, metrics, fractions, before: bool, modes=MODES) -> dict:
    import torch

    from attngeom.common import metrics as M
    from attngeom.extract.faithfulness.interventions import Intervener, Removal, forward_logits
    from attngeom.extract.faithfulness.selection import Workspace

    shared, work = {}, Workspace()          # as compute_block shares them between passes
    old = sorted_float64() if before else None

    def plain(impl):
        def run():
            model.set_attn_implementation(impl)
            with torch.inference_mode():
                model(**batch, use_cache=False)
        return run

    def through(cls=Intervener, **kw):
        extra = {"workspace": work} if cls is Intervener else {}
        return lambda: forward_logits(model, batch, cls(model, projections=shared, **extra, **kw))

    cases = {"eager": plain("eager"), "sdpa": plain("sdpa")}
    if metrics is None:
        return cases
    cases.update({"clean/after": through(), "drift/after": through(sink_k=1)})
    if before:
        cases.update({"clean/before": through(old), "drift/before": through(old, sink_k=1)})
    for metric in metrics:
        granularity = M.get(metric).granularities[0]          # head, or token only
        for mode in modes:
            for p in fractions:
                removal = Removal(metric, mode, p, granularity=granularity)
                cases[f"{metric}@{p:g}/{mode}/after"] = through(removal=removal)
                if before and metric in M.BUILTIN[:5]:
                    cases[f"{metric}@{p:g}/{mode}/before"] = through(old, removal=removal)
    return cases


def table(stats: dict, length: int, batch: int) -> list[str]:
    """Markdown rows: case, after and before median CPU s and paired CPU ratio to eager."""
    rows = [f"\n### T = {length}, batch {batch} (CPU time; ratio = paired median vs eager; "
            "wall: the wall-clock ratio)\n",
            "| case | after s | after / eager | wall / eager | before s | before / eager |",
            "|---|---|---|---|---|---|"]
    names = sorted({n.rsplit("/", 1)[0] for n in stats if "/" in n},
                   key=lambda n: (n not in ("clean", "drift"), n))
    for base in ("eager", "sdpa"):
        r = stats[base]
        rows.append(f"| {base} | {r['cpu_median_s']:.2f} | {r.get('cpu_ratio_paired', 1):.2f} | "
                    f"{r.get('wall_ratio_paired', 1):.2f} | | |")
    for n in names:
        cells = []
        for which in ("after", "before"):
            r = stats.get(f"{n}/{which}")
            cells += ["", ""] if r is None else [f"{r['cpu_median_s']:.2f}",
                                                 f"**{r['cpu_ratio_paired']:.2f}**"]
            if which == "after":
                cells.append("" if r is None else f"{r['wall_ratio_paired']:.2f}")
        rows.append(f"| {n} | " + " | ".join(cells) + " |")
    return rows


def cost_table(cells: dict, columns: list, metrics, modes) -> list[str]:
    """One row per metric (and the clean, drift and SDPA passes): its pass against eager at
    every (length, threads, batch), CPU-time ratio with the wall-clock ratio in brackets."""
    head = " | ".join(f"T = {t}, {n} thread{'s' * (n > 1)} (batch {b})" for t, n, b in columns)
    rows = ["\n### Every metric's removal pass against an eager forward of the same batch "
            "(paired median ratio of CPU time; wall clock in brackets)\n",
            f"| pass | {head} |", "|---|" + "---|" * len(columns)]
    names = ["sdpa", "clean/after", "drift/after"] + [
        f"{m}@{p}/{mode}/after" for m in metrics for mode in modes for p in ("0.1",)]
    for name in names:
        got = [cells.get((c, name)) for c in columns]
        if not any(got):
            continue
        label = name.removesuffix("/after").replace("@0.1/", ", p = 0.1, ")
        rows.append(f"| {label} | " + " | ".join(
            "" if r is None else f"{r['cpu_ratio_paired']:.2f} ({r['wall_ratio_paired']:.2f})"
            + ("" if r["batch"] == c[2] else f", batch {r['batch']}")
            for r, c in zip(got, columns)) + " |")
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--lengths", default="128,512")
    p.add_argument("--batches", default="8,4", help="batch size per length")
    p.add_argument("--zeroing-batches", default="1,1",
                   help="value zeroing's batch size per length (0: leave it out)")
    p.add_argument("--fractions", default="0.1")
    p.add_argument("--modes", default="comprehensiveness,sufficiency")
    p.add_argument("--metrics", default=None, help="default: every metric")
    p.add_argument("--before", default="", help="lengths at which to time the code before the "
                   "fast path too (comma list, or 'all')")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--zeroing-repeats", type=int, default=1)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", default="0", help="torch threads, comma list (0: the default)")
    a = p.parse_args(argv)
    emit({"bench": "faithfulness", "section": "machine", **machine()})
    why = available()
    if why:
        emit({"bench": "faithfulness", "skipped": why})
        return 0
    import torch

    from attngeom.common.metrics import BUILTIN, get

    default = torch.get_num_threads()
    model = random_llama(SMOLLM2, layers=a.layers)
    metrics = a.metrics.split(",") if a.metrics else list(BUILTIN)
    heavy = [m for m in metrics if "sublayer" in get(m).needs]        # value zeroing
    light = [m for m in metrics if m not in heavy]
    fractions = [float(x) for x in a.fractions.split(",")]
    modes = a.modes.split(",")
    lengths = [int(x) for x in a.lengths.split(",")]
    batches = [int(x) for x in a.batches.split(",")]
    zeroing = [int(x) for x in a.zeroing_batches.split(",")]
    out, cells, columns = [], {}, []
    for threads in (int(x) for x in a.threads.split(",")):
        torch.set_num_threads(threads or default)
        n = torch.get_num_threads()
        for length, size, small in zip(lengths, batches, zeroing):
            runs = [(light, size, a.repeats, a.warmup)]
            if heavy and small:
                runs.append((heavy, small, a.zeroing_repeats, 0))
            for which, batch_size, repeats, warmup in runs:
                batch = random_tokens(batch_size, length, SMOLLM2["vocab_size"])
                before = which is light and (a.before == "all"
                                             or str(length) in a.before.split(","))
                cases = cases_for(model, batch, which, fractions, before, modes)
                if which is heavy:                 # no clean, drift, SDPA: the light run's
                    cases = {k: v for k, v in cases.items()
                             if k == "eager" or k.split("@")[0] in heavy}
                cases["eager"]()
                times = interleaved(cases, repeats, warmup=warmup, log=log)
                stats = summarize(times, "eager", length * batch_size)
                for name, rec in stats.items():
                    emit({"bench": "faithfulness", "case": name, "layers": a.layers,
                          "length": length, "batch": batch_size, "threads": n,
                          "baseline": "eager", **rec})
                    cells[((length, n, size), name)] = {**rec, "batch": batch_size}
                if which is light:
                    out += table(stats, length, batch_size)
            columns.append((length, n, size))
    print("\n".join(out + cost_table(cells, columns, metrics, modes)), flush=True)
    torch.set_num_threads(default)
    return 0


if __name__ == "__main__":
    sys.exit(main())
