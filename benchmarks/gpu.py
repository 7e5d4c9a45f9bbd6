"""The whole GPU benchmark in one command: Llama-3.1-8B shape, random init, bf16, batch 1.

Run it through ``benchmarks/gpu.sh`` (writes to ``$OUT``). No download: the model is built
from a LlamaConfig of Llama-3.1-8B's shape (32 layers, 32 heads, 8 kv heads, d 4096).

Groups (each case timed interleaved with the others, ``--repeats`` rounds after a warm-up,
``torch.cuda.synchronize`` around each call; peak memory from ``max_memory_allocated`` in a
separate call of each case):

``full``     the whole 32-layer model at T = 2048 and 4096: SDPA forward (with and without the
             LM head's logits), eager forward,
             attngeom compact (``capture.capture``, as ``attngeom extract`` runs it).
``reduced``  dense extraction and the naive per-head model-space implementation keep every
             layer's (H, T, T) arrays, so they run on a 2-layer model of the same shape with
             the LM head replaced by identity (same for every case in the group): SDPA,
             eager, attngeom compact, attngeom dense, naive. Full-model figures are
             extrapolated per layer: t_full(case) ~ t_full(eager) + 32/2 (t(case) - t(eager)),
             reported as ``est_full_*`` and labelled as estimates.

Targets (issue 6): compact >= 0.85 x SDPA throughput with peak memory within 10% of SDPA's;
dense >= 0.6 x eager throughput, >= 4 x naive, peak memory within eager's plus one layer's
attention matrix.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import LLAMA31_8B, MiB, interleaved, log, machine, summarize  # noqa: E402

T0 = time.perf_counter()
RECORDS: list[dict] = []
SHAPE = dict(LLAMA31_8B)
DEVICE = "cuda"
# --smoke: the same code paths on the CPU with a tiny shape, to check the script without a GPU
SMOKE_SHAPE = dict(LLAMA31_8B, hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
                   head_dim=32, intermediate_size=256, vocab_size=1000, num_hidden_layers=4)


def emit(out: Path, record: dict) -> None:
    record = {"elapsed_s": round(time.perf_counter() - T0, 1), **record}
    RECORDS.append(record)
    line = json.dumps(record, default=str)
    print(line, flush=True)
    with open(out / "gpu_bench.jsonl", "a") as f:
        f.write(line + "\n")


def build(layers: int, identity_head: bool):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(**dict(SHAPE, num_hidden_layers=layers))
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16 if DEVICE == "cuda" else torch.float32)
    try:
        with torch.device(DEVICE):
            model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(previous)
    if identity_head:
        model.lm_head = torch.nn.Identity()
    return model.eval()


def tokens(T: int):
    import torch

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, SHAPE["vocab_size"], (1, T), generator=g).to(DEVICE)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def sync() -> None:
    import torch

    if DEVICE == "cuda":
        torch.cuda.synchronize()


def peak(fn) -> dict:
    import torch

    if DEVICE != "cuda":
        fn()
        return {}
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    try:
        fn()
        torch.cuda.synchronize()
    except torch.cuda.OutOfMemoryError as exc:
        return {"error": f"out of memory: {str(exc).splitlines()[0]}"}
    top = torch.cuda.max_memory_allocated()
    return {"peak_mib": top / MiB, "weights_mib": base / MiB, "peak_delta_mib": (top - base) / MiB}


def run_group(out: Path, group: str, model, T: int, cases: list[str], repeats: int,
              layers: int) -> dict:
    import torch

    from bench_extract import make_cases

    batch = tokens(T)
    fns = make_cases(model, batch)
    fns = {c: fns[c] for c in cases}
    ok = {}
    for c, fn in fns.items():                     # fail a case, not the run
        try:
            fn()
            sync()
            ok[c] = fn
        except Exception as exc:                  # noqa: BLE001
            emit(out, {"group": group, "T": T, "case": c, "error":
                       f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"})
            traceback.print_exc()
            gc.collect()
            if DEVICE == "cuda":
                torch.cuda.empty_cache()
    times = interleaved(ok, repeats, warmup=0, sync=sync, log=log)
    stats = summarize(times, "sdpa", T)
    eager = summarize(times, "eager") if "eager" in ok else {}
    naive = summarize(times, "naive") if "naive" in ok else {}
    mem = {c: peak(fn) for c, fn in ok.items()}
    one_layer = SHAPE["num_attention_heads"] * T * T * 4
    res = {}
    for c in ok:
        rec = {"group": group, "T": T, "batch": 1, "layers": layers,
               "dtype": "bfloat16" if DEVICE == "cuda" else "float32",
               "case": c, **{k: stats[c][k] for k in ("wall_median_s", "wall_min_s",
                                                     "tokens_per_s", "wall_ratio_paired")},
               "throughput_vs_sdpa": 1 / stats[c]["wall_ratio_paired"], **mem[c],
               "one_layer_attention_fp32_mib": one_layer / MiB}
        if eager:
            rec["throughput_vs_eager"] = 1 / eager[c]["wall_ratio_paired"]
        if naive:
            rec["speedup_vs_naive"] = 1 / naive[c]["wall_ratio_paired"]
        res[c] = rec
    if group == "reduced" and "eager" in ok:
        full_layers = SHAPE["num_hidden_layers"]
        scale = full_layers / layers
        t_eager = stats["eager"]["wall_median_s"]
        for c, rec in res.items():
            rec["est_full_extra_s_per_forward"] = scale * (stats[c]["wall_median_s"] - t_eager)
    for rec in res.values():
        emit(out, rec)
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--lengths", default="2048,4096")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--reduced-layers", type=int, default=2)
    p.add_argument("--budget-s", type=float, default=420.0,
                   help="skip the remaining groups once this much time has passed")
    p.add_argument("--smoke", action="store_true",
                   help="check the script on the CPU with a tiny model (figures meaningless)")
    a = p.parse_args(argv)
    global DEVICE, SHAPE
    if a.smoke:
        DEVICE, SHAPE = "cpu", SMOKE_SHAPE
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    import attngeom.extract.measurement.capture  # noqa: F401  (installed, or laid out by gpu.sh)

    found = str(Path(attngeom.__file__).resolve().parent.parent)
    import torch

    if DEVICE == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu.py needs a CUDA GPU (or --smoke for a CPU check)")
    torch.backends.cuda.matmul.allow_tf32 = False
    emit(out, {"section": "machine", "attngeom": found, **machine()})
    lengths = [int(x) for x in a.lengths.split(",")]
    full, reduced = {}, {}

    model = build(SHAPE["num_hidden_layers"], identity_head=False)
    emit(out, {"section": "built", "group": "full", "layers": SHAPE["num_hidden_layers"]})
    for T in lengths:
        if time.perf_counter() - T0 > a.budget_s:
            emit(out, {"group": "full", "T": T, "skipped": "time budget"})
            continue
        full[T] = run_group(out, "full", model, T, ["sdpa", "sdpa_nologits", "eager", "compact"],
                            a.repeats, SHAPE["num_hidden_layers"])
    del model
    gc.collect()
    if DEVICE == "cuda":
        torch.cuda.empty_cache()

    model = build(a.reduced_layers, identity_head=True)
    for T in lengths:
        if time.perf_counter() - T0 > a.budget_s:
            emit(out, {"group": "reduced", "T": T, "skipped": "time budget"})
            continue
        reduced[T] = run_group(out, "reduced", model, T,
                               ["sdpa", "eager", "compact", "dense", "naive"],
                               max(2, a.repeats - 2), a.reduced_layers)
    summary = targets(full, reduced)
    emit(out, {"section": "targets", **summary})
    (out / "gpu_summary.json").write_text(json.dumps({"records": RECORDS}, indent=1,
                                                     default=str))
    return 0


def targets(full: dict, reduced: dict) -> dict:
    """Each target with the measured value (None where a case is missing)."""
    res = {}
    for T, cases in full.items():
        s, c = cases.get("sdpa"), cases.get("compact")
        if s and c:
            res[f"T{T}_compact_throughput_vs_sdpa (>=0.85)"] = c["throughput_vs_sdpa"]
            if "peak_mib" in s and "peak_mib" in c:
                res[f"T{T}_compact_peak_vs_sdpa (<=1.10)"] = c["peak_mib"] / s["peak_mib"]
    for T, cases in reduced.items():
        e, d, n = cases.get("eager"), cases.get("dense"), cases.get("naive")
        if e and d:
            res[f"T{T}_dense_throughput_vs_eager_2layer (>=0.6)"] = d["throughput_vs_eager"]
            if T in full and "eager" in full[T]:
                t_full = full[T]["eager"]["wall_median_s"] + d["est_full_extra_s_per_forward"]
                res[f"T{T}_dense_est_full_throughput_vs_eager (>=0.6)"] = (
                    full[T]["eager"]["wall_median_s"] / t_full)
            if "peak_delta_mib" in e and "peak_delta_mib" in d:
                res[f"T{T}_dense_peak_delta_minus_eager_in_layer_matrices (<=1)"] = (
                    (d["peak_delta_mib"] - e["peak_delta_mib"]) / d["one_layer_attention_fp32_mib"])
        if n and d:
            res[f"T{T}_dense_speedup_vs_naive (>=4)"] = (n["wall_median_s"] / d["wall_median_s"])
    return res


if __name__ == "__main__":
    sys.exit(main())
