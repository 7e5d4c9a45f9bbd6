"""The whole GPU benchmark in one command: correctness, then speed and memory (issue 6).

Run it through ``benchmarks/gpu.sh`` (figures to ``$OUT``). ``--smoke`` runs every stage on
the CPU in seconds, with tiny random models and sizes (figures meaningless), so that the
script cannot rot between GPU sessions (``tests/test_gpu_smoke.py`` runs it). No download:
every model is built from a config with random weights.

1. Correctness, on a small random Llama (2 layers, 4 heads of 128, the tests' word-level
   tokenizer) and six texts of 8-45 tokens (batches of 4, right-padded, lengths not multiples
   of 8): ``extract`` compact and dense on the device in float32 and bfloat16 against the CPU
   float32 store of the same texts, per variable (``gpu_checks.TOLERANCES``; NaN cells identical);
   the out-of-memory path of extraction and of faithfulness (an out-of-memory error injected
   at the first batch: the batch is halved and the results still match); ``faithfulness``
   (attention and contribution, both modes, p = 0.5) in float32 and bfloat16 against the
   hook-free float64 reference of ``tests/extract/test_faithfulness_reference.py``.
2. Speed and memory, random-init Llama-3.1-8B-shaped models in bfloat16
   (max_position_embeddings 131072, Llama 3 RoPE scaling), random tokens:
   ``full``     the 32-layer model at T x batch = 512x8, 2048x1, 8192x1, 32768x1: SDPA (with
                and without the LM head's logits), eager (T <= 8192), compact (``capture`` as
                ``attngeom extract`` runs it); at T = 2048 one removal pass (contribution,
                comprehensiveness, p = 0.1, the faithfulness handler) against eager.
   ``reduced``  a 2-layer model of the same widths, LM head replaced by identity, T = 2048:
                SDPA, eager, compact, dense, naive (dense and naive keep every layer's
                (H, T, T) arrays); full-model figures extrapolated per layer, ``est_full_*``.
   ``command``  ``attngeom extract`` end to end (a subprocess) on a saved 2-layer model of the
                same widths, 16 texts of 2048 tokens, batch 4, against SDPA forwards of the
                same batches in this process.
   Cases are timed interleaved, ``--repeats`` rounds after a warm-up call, synchronized;
   peak memory (``max_memory_allocated``; on the CPU the peak RSS) in a separate call.
   T = 32768 runs last, after ``reduced`` and ``command``, so that a slow long case cannot
   push the other stages out of the ``--budget-s`` (groups are skipped once it has passed).

The ``machine`` record holds the versions (torch, CUDA, cuDNN, transformers, ...) and
nvidia-smi's clocks before the run, the ``after`` record the clocks after it.

Targets: compact >= 0.85 x SDPA throughput, peak memory within 10% of SDPA's; dense >= 0.6 x
eager, >= 4 x naive, peak within eager's plus one layer's attention matrix; removal <= 1.5 x
eager. Exit status 0 only when every stage ran and every check passed: an out-of-memory case is
a recorded result, any other exception or a check outside its tolerance fails the run.

This file is the driver and the speed stages; ``gpu_checks.py`` holds the correctness stages
and their tolerances, ``gpu_report.py`` the records, versions, targets and tables.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests"), str(HERE.parent / "tests" / "extract")]
from _common import (LLAMA31_8B, MiB, interleaved, log, machine, peak_bytes,  # noqa: E402
                     reset_peak, rss_bytes, summarize)
from gpu_checks import small_model, stage_extraction, stage_faithfulness, vocabulary  # noqa: E402
from gpu_report import (FAILURES, RECORDS, T0, emit, fail, gpu_state, tables,  # noqa: E402
                        targets)

LLAMA3_ROPE = dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                   high_freq_factor=4.0, original_max_position_embeddings=8192)
SHAPE_8B = {**{k: v for k, v in LLAMA31_8B.items() if k != "rope_theta"},
            "max_position_embeddings": 131072, "rope_parameters": LLAMA3_ROPE}
SHAPE_SMOKE = dict(SHAPE_8B, hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
                   head_dim=32, intermediate_size=256, vocab_size=1000, num_hidden_layers=4)


@dataclass(frozen=True)
class Plan:
    device: str
    shape: dict
    full: tuple                  # (T, batch) of the full group
    at: int                      # T of the removal pass and of the reduced group
    eager_max: int               # eager runs up to this T (its (B, H, T, T) weights)
    command: tuple               # texts, T, batch of the end-to-end command


REAL = Plan("cuda", SHAPE_8B, ((512, 8), (2048, 1), (8192, 1), (32768, 1)), 2048, 8192,
            (16, 2048, 4))
SMOKE = Plan("cpu", SHAPE_SMOKE, ((16, 2), (32, 1), (64, 1), (96, 1)), 32, 64, (4, 32, 2))


def is_oom(exc: BaseException) -> bool:
    from attngeom.extract.measurement.batches import is_out_of_memory

    return isinstance(exc, MemoryError) or is_out_of_memory(exc)


# ------------------------------------------------------------------------------ speed
def build(plan: Plan, layers: int, identity_head: bool):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(**dict(plan.shape, num_hidden_layers=layers))
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(plan.device):
            model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(previous)
    if identity_head:
        model.lm_head = torch.nn.Identity()
    return model.eval()


def tokens(plan: Plan, T: int, batch: int = 1, vocab: int | None = None):
    import torch

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab or plan.shape["vocab_size"], (batch, T), generator=g)
    ids = ids.to(plan.device)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def sync(plan: Plan) -> None:
    import torch

    if plan.device == "cuda":
        torch.cuda.synchronize()


def free(plan: Plan) -> None:
    import torch

    gc.collect()
    if plan.device == "cuda":
        torch.cuda.empty_cache()


def peak(plan: Plan, fn, weights: float) -> dict:
    """Peak memory of one call: the model's weights plus the call's high-water mark above
    what was allocated before it (GPU), or the peak RSS above the resident set (CPU)."""
    import torch

    if plan.device != "cuda":
        reset_peak()
        before = rss_bytes()
        fn()
        delta = (peak_bytes() - before) / MiB
        return {"peak_delta_mib": delta, "weights_mib": weights, "peak_mib": weights + delta}
    free(plan)
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    try:
        fn()
        torch.cuda.synchronize()
    except RuntimeError as exc:
        if not is_oom(exc):
            raise
        return {"error": "out of memory"}
    delta = (torch.cuda.max_memory_allocated() - base) / MiB
    return {"peak_delta_mib": delta, "weights_mib": weights, "peak_mib": weights + delta}


def removal_case(model, batch):
    import torch

    from attngeom.extract.faithfulness.interventions import Intervener, Removal, forward_logits
    from attngeom.extract.faithfulness.selection import Workspace

    shared, work = {}, Workspace()              # as compute_block shares them between passes
    removal = Removal("contribution", "comprehensiveness", 0.1)

    def run():
        with torch.inference_mode():
            forward_logits(model, batch, Intervener(model, removal=removal, projections=shared,
                                                    workspace=work))
    return run


def run_group(out: Path, plan: Plan, group: str, model, T: int, B: int, cases: list[str],
              repeats: int, layers: int) -> dict:
    from bench_extract import make_cases

    batch = tokens(plan, T, B)
    fns = make_cases(model, batch)
    fns["removal"] = removal_case(model, batch)
    weights = sum(p.numel() * p.element_size() for p in model.parameters()) / MiB
    ok, res = {}, {}
    for c in cases:                               # the warm-up call; out of memory is a result
        try:
            fns[c]()
            sync(plan)
            ok[c] = fns[c]
        except Exception as exc:                  # noqa: BLE001
            if not is_oom(exc):
                fail(out, f"{group} T={T}x{B} {c}", exc)
                continue
            res[c] = emit(out, {"group": group, "T": T, "batch": B, "case": c,
                                "error": "out of memory"})
            free(plan)
    times = interleaved(ok, repeats, warmup=0, sync=lambda: sync(plan), log=log)
    stats = summarize(times, "sdpa", T * B)
    rel = {b: summarize(times, b) for b in ("eager", "naive") if b in ok}
    one_layer = plan.shape["num_attention_heads"] * B * T * T * 4 / MiB
    for c in ok:
        rec = {"group": group, "T": T, "batch": B, "layers": layers, "dtype": "bfloat16",
               "case": c, **{k: stats[c][k] for k in ("wall_median_s", "wall_min_s",
                                                     "tokens_per_s")},
               **peak(plan, ok[c], weights), "one_layer_attention_fp32_mib": one_layer}
        if "sdpa" in ok:
            rec["throughput_vs_sdpa"] = 1 / stats[c]["wall_ratio_paired"]
        for b, s in rel.items():
            rec[f"throughput_vs_{b}"] = 1 / s[c]["wall_ratio_paired"]
        if group == "reduced" and "eager" in ok:
            rec["est_full_extra_s_per_forward"] = plan.shape["num_hidden_layers"] / layers * (
                stats[c]["wall_median_s"] - stats["eager"]["wall_median_s"])
        res[c] = emit(out, rec)
    return res


def stage_command(out: Path, root: Path, plan: Plan) -> None:
    """``attngeom extract`` as a subprocess on a saved 2-layer model of the same widths."""
    import numpy as np
    import torch

    import tiny_models as tm

    n, T, B = plan.command
    model = build(plan, 2, identity_head=False)
    model.save_pretrained(root / "wide")
    tok = tm.make_tokenizer("llama")
    tok.save_pretrained(root / "wide")
    rng = np.random.default_rng(1)
    words = vocabulary(tok)
    (root / "wide.jsonl").write_text("".join(
        json.dumps({"text": " ".join(rng.choice(words, T - 1))}) + "\n" for _ in range(n)))
    batch = tokens(plan, T, B, vocab=len(tok))

    def forward():
        model.set_attn_implementation("sdpa")
        with torch.inference_mode():
            for _ in range(-(-n // B)):
                model(**batch, use_cache=False)
    forward()
    sync(plan)
    t0 = time.perf_counter()
    forward()
    sync(plan)
    plain = time.perf_counter() - t0
    del model
    free(plan)
    argv = [sys.executable, "-m", "attngeom", "extract", "--model", str(root / "wide"),
            "--data", str(root / "wide.jsonl"), "--out", str(root / "wide-store"),
            "--device", plan.device, "--dtype", "bfloat16", "--max-length", str(T),
            "--batch-size", str(B), "--quiet"]
    t0 = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"attngeom extract exited {done.returncode}: "
                           f"{done.stderr.strip()[-400:]}")
    store = sum(p.stat().st_size for p in (root / "wide-store").rglob("*") if p.is_file())
    emit(out, {"group": "command", "case": "attngeom extract", "texts": n, "T": T, "batch": B,
               "layers": 2, "dtype": "bfloat16", "wall_s": wall, "tokens_per_s": n * T / wall,
               "sdpa_forwards_s": plain, "wall_vs_sdpa_forwards": wall / plain,
               "store_mib": store / MiB})


# ------------------------------------------------------------------------------ run
def timed(out: Path, budget: float, label: str, fn) -> None:
    """Run one stage: skipped past the budget; an exception fails the run, not the script."""
    if time.perf_counter() - T0 > budget:
        emit(out, {"section": "skipped", "stage": label, "why": "time budget"})
        FAILURES.append(f"{label}: skipped (time budget)")
        return
    try:
        fn()
    except Exception as exc:                       # noqa: BLE001
        fail(out, label, exc)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--lengths", default=None, help="T or TxB of the full group, comma-separated "
                   "(default 512x8,2048,8192,32768)")
    p.add_argument("--repeats", type=int, default=None, help="timed rounds (default 5; smoke 2)")
    p.add_argument("--budget-s", type=float, default=270.0,
                   help="skip the remaining stages once this much time has passed")
    p.add_argument("--work", default=None, help="models and stores written on the way (default: "
                   "a temporary folder, removed at the end; not under --out, which comes back)")
    p.add_argument("--smoke", action="store_true",
                   help="every stage on the CPU with tiny models, in seconds (figures meaningless)")
    a = p.parse_args(argv)
    plan = SMOKE if a.smoke else REAL
    a.repeats = a.repeats or (2 if a.smoke else 5)
    if a.smoke:                  # 2 threads on a shared 2-core machine swing by 10x
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    if a.lengths:
        full = tuple(tuple(int(x) for x in (s + "x1").split("x")[:2]) for s in a.lengths.split(","))
        plan = Plan(plan.device, plan.shape, full, plan.at, plan.eager_max, plan.command)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_bench.jsonl").write_text("")
    root = Path(a.work or tempfile.mkdtemp(prefix="attngeom-gpu-"))
    if a.work and root.exists() and any(root.iterdir()):   # its stores would be resumed
        raise SystemExit(f"gpu.py: --work {root} is not empty; pass a new or empty folder")
    root.mkdir(parents=True, exist_ok=True)
    try:
        return run_all(a, plan, out, root)
    finally:
        if a.work is None:
            shutil.rmtree(root, ignore_errors=True)


def run_all(a, plan: Plan, out: Path, root: Path) -> int:
    os.environ.setdefault("ATTNGEOM_CACHE", str(root / "cache"))   # fingerprints stay here
    import attngeom.extract.measurement.capture  # noqa: F401  (installed, or laid out by gpu.sh)
    import torch

    if a.smoke:
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    if plan.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu.py needs a CUDA GPU (or --smoke for a CPU check)")
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    import attngeom

    emit(out, {"section": "machine", "smoke": a.smoke, **machine(), **gpu_state(),
               "attngeom_path": str(Path(attngeom.__file__).resolve().parent.parent)})
    timed(out, float("inf"), "build small model", lambda: small_model(root))
    timed(out, float("inf"), "correctness: extraction", lambda: stage_extraction(out, root, plan))
    timed(out, float("inf"), "correctness: faithfulness",
          lambda: stage_faithfulness(out, root, plan))
    groups = {"full": {}, "reduced": {}}
    models = {}
    layers = plan.shape["num_hidden_layers"]
    cases = ["sdpa", "sdpa_nologits", "eager", "compact"]

    def full(T, B):
        if "full" not in models:
            models["full"] = build(plan, layers, identity_head=False)
            cfg = models["full"].config
            emit(out, {"section": "built", "group": "full", "layers": layers,
                       "max_position_embeddings": cfg.max_position_embeddings,
                       "rope_parameters": cfg.rope_parameters})
        chosen = [c for c in cases if c != "eager" or T <= plan.eager_max]
        groups["full"][T, B] = run_group(out, plan, "full", models["full"], T, B, chosen + (
            ["removal"] if (T, B) == (plan.at, 1) else []), a.repeats if T * B <= 8192 else
            max(2, a.repeats - 2), layers)

    def reduced():
        model = build(plan, 2, identity_head=True)
        groups["reduced"][plan.at, 1] = run_group(out, plan, "reduced", model, plan.at, 1, [
            "sdpa", "eager", "compact", "dense", "naive"], max(2, a.repeats - 2), 2)

    longest = max(plan.full, key=lambda tb: tb[0] * tb[1])
    for T, B in plan.full:
        if (T, B) != longest:
            timed(out, a.budget_s, f"full T={T}x{B}", lambda: full(T, B))
    timed(out, a.budget_s, "reduced", reduced)
    free(plan)
    timed(out, a.budget_s, "command", lambda: stage_command(out, root, plan))
    timed(out, a.budget_s, f"full T={longest[0]}x{longest[1]}", lambda: full(*longest))
    models.clear()
    free(plan)
    timed(out, float("inf"), "targets", lambda: emit(out, {
        "section": "targets", **targets(groups["full"], groups["reduced"])}))
    timed(out, float("inf"), "clocks after", lambda: emit(out, {"section": "after",
                                                                **gpu_state()}))
    print(tables(RECORDS), flush=True)
    (out / "gpu_summary.json").write_text(json.dumps({"records": RECORDS, "failures": FAILURES},
                                                     indent=1, default=str))
    for f in FAILURES:
        print(f"gpu.py: FAILED {f}", file=sys.stderr)
    print(f"gpu.py: {'FAILED' if FAILURES else 'ok'}: {len(FAILURES)} failure(s), "
          f"{time.perf_counter() - T0:.0f} s", file=sys.stderr, flush=True)
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
