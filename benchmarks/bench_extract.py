"""Extraction speed and memory, side by side in one run; one JSON object per line.

Sections (``--sections``, default all):

``time``      in-process, random-init SmolLM2-135M-shaped Llama (fp32), T x batch tokens:
              SDPA forward (also without the LM head's logits), eager forward,
              ``attngeom.extract.measurement.capture.capture`` compact and dense as ``attngeom
              extract`` runs them (``derived=False``: no contributions the store derives on read),
              compact returning every name (``compact_derived``), and the naive per-head
              model-space implementation (``naive.py``), interleaved and repeated.
``memory``    peak RSS of one call of each case, each in a fresh subprocess.
``command``   the whole ``attngeom extract --model smollm2-135m --data builtin ...`` command
              (load, tokenize, extract, write) against a plain eager forward over the same
              tokens (``--child plain``), both as subprocesses, interleaved and repeated.
``phases``    where the whole command's time goes (the command run in-process with timers).

One torch thread by default (``--threads``): on a shared 2-core machine two OpenMP threads made
single forwards swing by 10x. Results and proposals: ``benchmarks/RESULTS.md``.

    python benchmarks/bench_extract.py                    # everything (~15 min on 2 cores)
    python benchmarks/bench_extract.py --sections time --cases sdpa,compact --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (SMOLLM2, emit, interleaved, json_lines, log, machine,  # noqa: E402
                     measure_peak, random_llama, random_tokens, run_child_rss, summarize,
                     time_phases)

CASES = ("sdpa", "sdpa_nologits", "eager", "compact", "compact_derived", "dense", "naive")
SECTIONS = ("time", "memory", "command", "phases")
COMMAND_ARGS = ["--model", "smollm2-135m", "--data", "builtin", "--limit", "8",
                "--max-length", "512", "--quiet"]


# ------------------------------------------------------------------------------------ cases
def make_cases(model, batch) -> dict:
    """Zero-argument callables, one per case name."""
    import torch

    from attngeom.extract.measurement.capture import capture
    from attngeom.extract.measurement.layer import Options
    from naive import naive_measure

    def forward(impl, **kw):
        def run():
            model.set_attn_implementation(impl)
            with torch.inference_mode():
                model(**batch, use_cache=False, **kw)
        return run

    return {
        "sdpa": forward("sdpa"),
        "sdpa_nologits": forward("sdpa", logits_to_keep=1),
        "eager": forward("eager"),
        "compact": lambda: capture(model, batch, Options("compact", derived=False)),
        "compact_derived": lambda: capture(model, batch, Options("compact")),
        "dense": lambda: capture(model, batch, Options("dense", derived=False)),
        "naive": lambda: naive_measure(model, batch),
    }


def setup(args):
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    model = random_llama(SMOLLM2, layers=args.layers)
    batch = random_tokens(args.batch, args.length, SMOLLM2["vocab_size"])
    return model, batch


def shape_of(args) -> dict:
    import torch

    return {"model": "SmolLM2-135M-shaped Llama, random init", "layers": args.layers,
            "length": args.length, "batch": args.batch, "dtype": "float32",
            "threads": torch.get_num_threads()}


# ------------------------------------------------------------------------------------ sections
def section_time(args, cases: list[str]) -> None:
    model, batch = setup(args)
    fns = make_cases(model, batch)
    tokens = args.length * args.batch
    times = interleaved({c: fns[c] for c in cases}, args.repeats, warmup=1, log=log)
    stats = summarize(times, "sdpa", tokens)
    eager = summarize(times, "eager") if "eager" in cases else {}
    naive = summarize(times, "naive") if "naive" in cases else {}
    for case in cases:
        rec = {"bench": "extract", "section": "time", "case": case, **shape_of(args),
               "tokens": tokens, **{k: v for k, v in stats[case].items()}}
        if eager:
            rec["vs_eager_wall_ratio_paired"] = eager[case]["wall_ratio_paired"]
            rec["vs_eager_cpu_ratio_paired"] = eager[case]["cpu_ratio_paired"]
        if naive:
            rec["naive_over_this_cpu_paired"] = 1 / naive[case]["cpu_ratio_paired"]
        rec["wall_s"] = times["wall"][case]
        rec["cpu_s"] = times["cpu"][case]
        emit(rec)


def child_memory(args) -> None:
    """Internal: peak RSS of one call of ``args.child_case`` after a warm-up call."""
    model, batch = setup(args)
    fn = make_cases(model, batch)[args.child_case]
    fn()
    print(json.dumps(measure_peak(fn)), flush=True)


def section_memory(args, cases: list[str]) -> None:
    for case in cases:
        argv = [sys.executable, __file__, "--child", "memory", "--child-case", case,
                "--layers", str(args.layers), "--length", str(args.length),
                "--batch", str(args.batch)] + (["--threads", str(args.threads)]
                                               if args.threads else [])
        env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072")   # freed buffers leave RSS
        res = run_child_rss(argv, env=env)
        rec = (json_lines(res["stdout"]) or [{"error": res["stderr"][-500:]}])[-1]
        emit({"bench": "extract", "section": "memory", "case": case, **shape_of(args), **rec})


def _plain_main(args) -> None:
    """Internal: a plain eager forward over the tokens ``attngeom extract`` would see."""
    t0 = time.perf_counter()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from attngeom.extract.loading.data import batches, load_texts, pad_token_id, tokenize_texts
    from attngeom.extract.loading.models import cache_dir
    t_import = time.perf_counter() - t0
    found = sorted((cache_dir() / "models").glob("SmolLM2-135M-Instruct*/config.json"))
    if not found:
        raise SystemExit("no cached smollm2-135m: run `attngeom extract --model smollm2-135m` once")
    where = found[0].parent
    t1 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(where, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    tok = AutoTokenizer.from_pretrained(where)
    t2 = time.perf_counter()
    texts = load_texts("builtin", limit=args.limit)
    tokenized = tokenize_texts(tok, texts.texts, args.max_length)
    t3 = time.perf_counter()
    with torch.inference_mode():
        for b in batches(tokenized, 4, pad_id=pad_token_id(tok)):
            model(input_ids=torch.as_tensor(b["input_ids"]),
                  attention_mask=torch.as_tensor(b["attention_mask"]), use_cache=False)
    t4 = time.perf_counter()
    print(json.dumps({"import_s": t_import, "load_s": t2 - t1, "tokenize_s": t3 - t2,
                      "forward_s": t4 - t3, "inner_total_s": t4 - t0,
                      "tokens": sum(len(x) for x in tokenized.ids)}), flush=True)


def _attngeom_argv(out: str) -> list[str]:
    exe = shutil.which("attngeom", path=str(Path(sys.executable).parent)) or shutil.which(
        "attngeom")
    base = [exe] if exe else [sys.executable, "-m", "attngeom"]
    return base + ["extract", *COMMAND_ARGS, "--out", out]


def section_command(args) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="attngeom-bench-"))
    plain = [sys.executable, __file__, "--child", "plain"]
    env = dict(os.environ)
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    try:
        warm = run_child_rss(_attngeom_argv(str(tmp / "warm")), env=env)   # caches the GGUF
        if warm["rc"] != 0:
            emit({"bench": "extract", "section": "command", "skipped":
                  "attngeom extract failed: " + warm["stderr"].strip()[-300:]})
            return
        rows = []
        for r in range(args.command_repeats):
            pair = [("attngeom_extract", _attngeom_argv(str(tmp / f"run{r}"))), ("plain_eager", plain)]
            if r % 2:
                pair.reverse()
            got = {}
            for name, argv in pair:
                got[name] = run_child_rss(argv, env=env)
            inner = (json_lines(got["plain_eager"]["stdout"]) or [{}])[-1]
            store = tmp / f"run{r}"
            nbytes = sum(p.stat().st_size for p in store.rglob("*") if p.is_file())
            rows.append({"extract_wall_s": got["attngeom_extract"]["wall_s"],
                         "extract_cpu_s": got["attngeom_extract"]["cpu_s"],
                         "extract_peak_rss_mib": got["attngeom_extract"]["peak_rss_mib"],
                         "plain_wall_s": got["plain_eager"]["wall_s"],
                         "plain_cpu_s": got["plain_eager"]["cpu_s"],
                         "plain_peak_rss_mib": got["plain_eager"]["peak_rss_mib"],
                         "store_bytes": nbytes, **{f"plain_{k}": v for k, v in inner.items()}})
            log(f"command round {r + 1}: extract {rows[-1]['extract_wall_s']:.1f}s, plain "
                f"{rows[-1]['plain_wall_s']:.1f}s (forward {inner.get('forward_s', 0):.1f}s)")
        from statistics import median
        med = {k: median(row[k] for row in rows) for k in rows[0]}
        emit({"bench": "extract", "section": "command", "command": "attngeom extract "
              + " ".join(COMMAND_ARGS), "repeats": len(rows), "median": med,
              "ratio_extract_over_plain_forward_only": median(
                  row["extract_wall_s"] / row["plain_forward_s"] for row in rows),
              "ratio_extract_over_plain_script": median(
                  row["extract_wall_s"] / row["plain_wall_s"] for row in rows),
              "ratio_extract_over_plain_script_cpu": median(
                  row["extract_cpu_s"] / row["plain_cpu_s"] for row in rows),
              "target": "extract <= 1.25 x plain eager forward", "rounds": rows})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# phases of the whole command: (module or class, function, label), timed by time_phases
PHASES = [
    ("attngeom.extract.run", "load_texts", "load texts"),
    ("attngeom.extract.loading.models", "load", "load model (incl. fingerprint)"),
    ("attngeom.extract.loading.models", "weight_fingerprint", "  weight fingerprint"),
    ("attngeom.extract.loading.data", "tokenize_texts", "tokenize"),
    ("attngeom.extract.measurement.batches", "capture", "capture (forward + geometry + to numpy)"),
    ("attngeom.extract.measurement.batches", "_pad_tokens", "pad to max_length"),
    ("attngeom.extract.measurement.batches", "finite_flags", "finite flags"),
    ("attngeom.extract.run", "build_shard", "build shard (xarray)"),
    ("attngeom.store.io.writer", "write_shard", "write shard (netCDF/gzip/fsync)"),
    ("attngeom.store.io.writer", "file_sha256", "sha256 of shard"),
    ("attngeom.store.io.writer", "write_manifest", "write manifest"),
    ("attngeom.store.io.writer", "read_manifest", "read manifest (resume)"),
    ("attngeom.store.ops.info", "summary", "summary"),
    # inside capture: the model call vs collecting to numpy
    ("attngeom.extract.measurement.capture.Measurer", "collect", "  collect (stack, to numpy)"),
]


def _child_phases(args) -> None:
    """Internal: run ``attngeom extract`` in-process with a timer around each phase."""
    t0 = time.perf_counter()
    import torch  # noqa: F401  (import cost is part of the command)
    import attngeom.extract.run  # noqa: F401
    from attngeom.cli import main
    t_import = time.perf_counter() - t0
    spent, _ = time_phases(PHASES, t0)
    import io
    from contextlib import redirect_stdout
    t1 = time.perf_counter()
    with redirect_stdout(io.StringIO()):
        rc = main(["extract", *COMMAND_ARGS, "--out", args.child_out])
    total = time.perf_counter() - t0
    print(json.dumps({"rc": rc, "import_s": t_import, "run_s": time.perf_counter() - t1,
                      "total_s": total, "phases_s": spent}), flush=True)


def section_phases(args) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="attngeom-bench-"))
    try:
        env = dict(os.environ)
        if args.threads:
            env["OMP_NUM_THREADS"] = str(args.threads)
        res = run_child_rss([sys.executable, __file__, "--child", "phases", "--child-out",
                             str(tmp / "store")], env=env)
        rec = (json_lines(res["stdout"]) or [{"error": res["stderr"][-500:]}])[-1]
        rec["process_wall_s"] = res["wall_s"]
        if "phases_s" in rec:
            rec["share"] = {k: v / rec["process_wall_s"] for k, v in rec["phases_s"].items()}
        emit({"bench": "extract", "section": "phases", "command": "attngeom extract "
              + " ".join(COMMAND_ARGS), **rec})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ------------------------------------------------------------------------------------ main
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sections", default=",".join(SECTIONS))
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--length", type=int, default=512)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--command-repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (default 1: with several, OpenMP spin-waiting makes "
                        "timings on a shared machine swing by 10x; 0 = torch's default)")
    p.add_argument("--child", choices=["memory", "plain", "phases"], help=argparse.SUPPRESS)
    p.add_argument("--child-case", help=argparse.SUPPRESS)
    p.add_argument("--child-out", help=argparse.SUPPRESS)
    p.add_argument("--limit", type=int, default=8, help=argparse.SUPPRESS)
    p.add_argument("--max-length", type=int, default=512, help=argparse.SUPPRESS)
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if args.child == "memory":
        child_memory(args)
        return 0
    if args.child == "plain":
        _plain_main(args)
        return 0
    if args.child == "phases":
        _child_phases(args)
        return 0
    sections = [s for s in args.sections.split(",") if s]
    cases = [c for c in args.cases.split(",") if c]
    bad = [x for x in sections if x not in SECTIONS] + [c for c in cases if c not in CASES]
    if bad:
        raise SystemExit(f"unknown section/case {bad}; sections: {SECTIONS}, cases: {CASES}")
    emit({"bench": "extract", "section": "machine", **machine()})
    for section in sections:
        log(f"extract: {section}")
        if section == "time":
            section_time(args, cases)
        elif section == "memory":
            section_memory(args, cases)
        elif section == "command":
            section_command(args)
        elif section == "phases":
            section_phases(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
