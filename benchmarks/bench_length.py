"""Cost against sequence length: SDPA and eager forwards, compact extraction, one removal pass.

For each model and length T, each case runs in its own process on one WikiText-2 text cut to T
tokens (``--padded``: also a batch of two, T and T/2 tokens, the shorter one padded):

- ``sdpa``, ``eager``: load the model, one forward with full logits (the baselines), after an
  untimed one over the first 32 tokens (first-call costs; the removal pass's projections);
- ``compact``: the whole ``attngeom extract --mode compact`` command (loading and writing
  included), against the ``sdpa`` process, which loads the same model;
- ``removal``: one removal pass (contribution, comprehensiveness, signed, p = 0.1, head
  granularity), through the handler ``attngeom faithfulness`` uses, against ``eager``;
- ``removals``: every (metric, mode) of ``--removals`` (default: the paper's four metrics,
  ``contribution_layer`` and ``random``, both modes) in one process that loads the model once,
  each pass and an eager forward alternating for ``--rounds`` rounds: each pass's time against
  the eager forward of its round (paired), and its peak resident set against the eager one's.

Printed per case: the process's wall and CPU seconds and peak resident set (``wait4``), the
forward's own wall seconds (in-process cases), the ratios the targets name, and each case's growth
exponent in T (the slope of log time and of log peak above the loaded model on log T).

    python benchmarks/bench_length.py --models smollm2-135m,gemma3-270m \\
        --lengths 512,1024,2048,4096,8192 --threads 0 [--padded]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (emit, json_lines, machine, measure_peak,  # noqa: E402
                     run_child_rss)
from bench_command import DATA as WIKITEXT, child_env  # noqa: E402

CASES = ("sdpa", "eager", "compact", "removal")
REMOVALS = tuple(f"{m}/{mode}" for m in ("attention", "value_weighted",
                                         "value_weighted_normalized", "contribution",
                                         "contribution_layer", "random")
                 for mode in ("comprehensiveness", "sufficiency"))


# ------------------------------------------------------------------------------------- child
def tokens(tok, length: int, padded: bool) -> list[list[int]]:
    """One text of ``length`` tokens from WikiText-2's articles joined (and one of half)."""
    text = "\n".join(json.loads(line)["text"] for line in WIKITEXT.open())
    ids = tok(text[: 12 * length])["input_ids"][:length]
    if len(ids) < length:
        raise SystemExit(f"WikiText-2 gives only {len(ids)} tokens")
    return [ids, ids[: length // 2]] if padded else [ids]


def batch(rows: list[list[int]], pad: int) -> dict:
    """The rows as one right-padded batch, as attngeom's own batches (torch tensors)."""
    import torch

    from attngeom.extract.loading.data import Tokenized, batches

    b = next(batches(Tokenized(rows, [False] * len(rows)), len(rows), pad_id=pad))
    return {k: torch.as_tensor(b[k]) for k in ("input_ids", "attention_mask")}


def child(a) -> None:
    import torch

    from attngeom.extract.faithfulness.interventions import Intervener, Removal, forward_logits
    from attngeom.extract.faithfulness.selection import Workspace
    from attngeom.extract.loading.data import pad_token_id
    from attngeom.extract.loading.models import load

    if a.threads:
        torch.set_num_threads(a.threads)
    t0 = time.perf_counter()
    loaded = load(a.model)
    model, loaded_s = loaded.model, time.perf_counter() - t0
    rows = tokens(loaded.tokenizer, a.length, a.padded)
    pad = pad_token_id(loaded.tokenizer)
    inputs, warm = batch(rows, pad), batch([r[:32] for r in rows], pad)
    if a.child == "removals":
        return removals_child(a, model, inputs, warm, loaded_s)
    if a.child == "removal":
        handler = Intervener(model, removal=Removal("contribution", "comprehensiveness", 0.1),
                             projections={}, workspace=Workspace())
        run = lambda x: forward_logits(model, x, handler)             # noqa: E731
    else:
        model.set_attn_implementation(a.child)
        run = lambda x: model(**x, use_cache=False).logits            # noqa: E731
    with torch.inference_mode():
        run(warm)                          # first-call costs and the layers' projections
        c0 = time.process_time()
        rec = measure_peak(lambda: run(inputs))
        rec["forward_cpu_s"] = time.process_time() - c0
    emit({"child": a.child, "load_s": loaded_s, **rec})


def removals_child(a, model, inputs: dict, warm: dict, loaded_s: float) -> None:
    """Each removal of ``a.removals`` and an eager forward, alternating for ``a.rounds``
    rounds in this process (the model loaded once); one record per pass and round."""
    import torch

    from attngeom.extract.faithfulness.interventions import Intervener, Removal, forward_logits
    from attngeom.extract.faithfulness.selection import Workspace

    model.set_attn_implementation("eager")
    runs = {"eager": lambda x: model(**x, use_cache=False).logits}
    for spec in a.removals.split(","):
        metric, mode = spec.split("/")
        handler = Intervener(model, removal=Removal(metric, mode, a.fraction,
                                                    granularity=a.granularity),
                             projections={}, workspace=Workspace())
        runs[spec] = lambda x, h=handler: forward_logits(model, x, h)
    with torch.inference_mode():
        for run in runs.values():
            run(warm)                      # first-call costs and the layers' projections
        for r in range(a.rounds):
            for name, run in runs.items():
                c0 = time.process_time()
                rec = measure_peak(lambda: run(inputs))
                emit({"child": "removals", "pass": name, "round": r, "load_s": loaded_s,
                      "forward_cpu_s": time.process_time() - c0, **rec})


def removals_table(rows: list[dict]) -> list[str]:
    """Per model and T, each pass's median paired time ratio to the eager forward of its
    round (CPU and wall) and its peak resident set's ratio to the eager forward's."""
    import pandas as pd

    df = pd.DataFrame([r for r in rows if r.get("child") == "removals"])
    if df.empty:
        return []
    out = []
    for (model, T), g in df.groupby(["model", "length"]):
        eager = g[g["pass"] == "eager"].set_index("round")
        out += [f"\n### {model}, one text of {T} tokens, {g['rounds'].iloc[0]} rounds, "
                f"{g['granularity'].iloc[0]} granularity, p = {g['fraction'].iloc[0]}: one "
                "removal pass against the eager forward of its round (paired medians)\n",
                "| pass | CPU / eager | wall / eager | peak / eager | wall s |",
                "|---|---|---|---|---|"]
        for name, h in g[g["pass"] != "eager"].groupby("pass", sort=False):
            h = h.set_index("round")
            cpu = (h["forward_cpu_s"] / eager["forward_cpu_s"]).median()
            wall = (h["wall_s"] / eager["wall_s"]).median()
            peak = (h["peak_rss_mib"] / eager["peak_rss_mib"]).median()
            out.append(f"| {name} | {cpu:.2f}x | {wall:.2f}x | {peak:.2f}x | "
                       f"{h['wall_s'].median():.1f} |")
        out.append(f"| eager forward | 1 | 1 | 1 ({eager['peak_rss_mib'].median():.0f} MiB) | "
                   f"{eager['wall_s'].median():.1f} |")
    return out


# ------------------------------------------------------------------------------------ parent
def texts_file(tmp: Path, model: str, length: int, padded: bool) -> Path:
    """The texts the ``compact`` command reads: the child's token rows, decoded."""
    tok = load_tokenizer(model)
    path = tmp / f"{model}-{length}-{int(padded)}.jsonl"
    with path.open("w") as f:
        for row in tokens(tok, length, padded):
            f.write(json.dumps({"text": tok.decode(row, skip_special_tokens=True)}) + "\n")
    return path


_TOKENIZERS: dict = {}


def load_tokenizer(model: str):
    """The model's tokenizer (the model itself is dropped: the children load their own)."""
    import gc

    from attngeom.extract.loading.models import load

    if model not in _TOKENIZERS:
        _TOKENIZERS[model] = load(model).tokenizer
        gc.collect()
    return _TOKENIZERS[model]


def run_case(case: str, model: str, length: int, padded: bool, threads: int, tmp: Path,
             limit_mib: float, removals: dict | None = None) -> dict:
    env = child_env(threads)
    if case == "compact":
        data = texts_file(tmp, model, length, padded)
        out = Path(tempfile.mkdtemp(dir=tmp)) / "store"
        argv = [str(Path(sys.executable).with_name("attngeom")), "extract", "--model", model,
                "--data", str(data), "--max-length", str(length), "--mode", "compact",
                "--batch-size", "2", "--out", str(out), "--quiet"]
        argv += ["--threads", str(threads)] if threads else []
    else:
        argv = [sys.executable, __file__, "--child", case, "--model", model, "--length",
                str(length), "--threads", str(threads)] + (["--padded"] if padded else [])
        argv += [f"--{k.replace('_', '-')}={v}" for k, v in (removals or {}).items()]
    got = run_child_rss(argv, env=env, rss_limit_mib=limit_mib)
    rec = {"case": case, "model": model, "length": length, "padded": padded, "rc": got["rc"],
           "wall_s": got["wall_s"], "cpu_s": got["cpu_s"], "peak_rss_mib": got["peak_rss_mib"],
           "killed_over_rss_limit": got["killed_over_rss_limit"]}
    inner = [r for r in json_lines(got["stdout"]) if "child" in r]
    if case == "removals":                      # one record per pass and round
        rec["passes"] = [{**r, **(removals or {}), "model": model, "length": length}
                         for r in inner]
    elif inner:
        rec.update(forward_s=inner[0]["wall_s"], forward_cpu_s=inner[0]["forward_cpu_s"],
                   load_s=inner[0]["load_s"], rss_before_mib=inner[0]["rss_before_mib"],
                   peak_delta_mib=inner[0]["peak_rss_delta_mib"])
    if got["rc"]:
        rec["error"] = got["stderr"].strip().splitlines()[-1:] or ["?"]
    return rec


def removal_options(a) -> dict:
    """The removals case's options, handed to its child and kept in its records."""
    return {"removals": a.removals, "rounds": a.rounds, "fraction": a.fraction,
            "granularity": a.granularity}


def exponent(T, y) -> float:
    """Slope of log y on log T, the least-squares moment formula (nan with fewer than two
    positive points)."""
    from scipy import stats

    T, y = np.asarray(T, float), np.asarray(y, float)
    ok = np.isfinite(y) & (y > 0)
    return float(stats.linregress(np.log(T[ok]), np.log(y[ok])).slope) if ok.sum() > 1 else np.nan


def table(rows: list[dict], model: str, padded: bool) -> list[str]:
    import pandas as pd

    df = pd.DataFrame([r for r in rows if r["model"] == model and r["padded"] == padded])
    if df.empty:
        return []
    w = df.pivot(index="length", columns="case", values="wall_s")
    p = df.pivot(index="length", columns="case", values="peak_rss_mib")
    f = df.pivot(index="length", columns="case", values="forward_s") if "forward_s" in df else w
    out = [f"\n### {model}, {'a padded batch of 2 (T and T/2)' if padded else 'one text'}: "
           "seconds (process wall; forward alone in brackets) and peak RSS (MiB)\n",
           "| T | sdpa | eager | compact | removal | compact / sdpa time, peak | "
           "removal / eager forward, peak |", "|---|---|---|---|---|---|---|"]
    cell = lambda c, T: (f"{w.at[T, c]:.1f} s" + (f" [{f.at[T, c]:.1f}]" if c in f and  # noqa
                         np.isfinite(f.at[T, c]) else "") + f", {p.at[T, c]:.0f}")
    for T in w.index:
        ratios = []
        for a, b, fw in (("compact", "sdpa", w), ("removal", "eager", f)):
            ok = a in w and b in w
            ratios.append(f"{fw.at[T, a] / fw.at[T, b]:.2f}x, {p.at[T, a] / p.at[T, b]:.2f}x"
                          if ok else "")
        out.append(f"| {T} | " + " | ".join(cell(c, T) if c in w else "" for c in CASES)
                   + f" | {ratios[0]} | {ratios[1]} |")
    grow = []
    for c in CASES:
        if c in w:
            t = f[c] if c != "compact" else w[c]
            grow.append(f"{c} {exponent(w.index, t):.2f}")
    out.append(f"\nGrowth exponents of time (slope of log s on log T): {', '.join(grow)}.")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="smollm2-135m,gemma3-270m")
    p.add_argument("--lengths", default="512,1024,2048,4096,8192")
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--padded", action="store_true", help="also a padded batch of two")
    p.add_argument("--rss-limit-mib", type=float, default=20000)
    p.add_argument("--removals", default=",".join(REMOVALS),
                   help="METRIC/MODE,... of the removals case")
    p.add_argument("--rounds", type=int, default=3, help="rounds of the removals case")
    p.add_argument("--fraction", type=float, default=0.1, help="p of the removals case")
    p.add_argument("--granularity", default="head", help="of the removals case")
    p.add_argument("--child", choices=("sdpa", "eager", "removal", "removals"))
    p.add_argument("--model"), p.add_argument("--length", type=int)
    a = p.parse_args(argv)
    if a.child:
        child(a)
        return 0
    emit({"bench": "length", "section": "machine", **machine(),
          "load_avg": os.getloadavg()})
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in a.models.split(","):
            for padded in (False, True) if a.padded else (False,):
                for T in map(int, a.lengths.split(",")):
                    for case in a.cases.split(","):
                        rec = run_case(case, model, T, padded, a.threads, Path(tmp),
                                       a.rss_limit_mib, removal_options(a))
                        passes = rec.pop("passes", [])
                        rows.append(emit({"bench": "length", **rec,
                                          "load_avg": os.getloadavg()[0]}))
                        rows += [emit({"bench": "length", **r}) for r in passes]
    for model in a.models.split(","):
        for padded in (False, True):
            print("\n".join(table([r for r in rows if r.get("case") in CASES], model, padded)),
                  flush=True)
    print("\n".join(removals_table(rows)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
