"""What ``gpu.py`` records and reports: the records and failures, versions and clocks, the
targets against their measured values, and the markdown tables printed at the end.
"""

from __future__ import annotations

import json
import subprocess
import time
import traceback
from pathlib import Path

T0 = time.perf_counter()
RECORDS: list[dict] = []
FAILURES: list[str] = []


def emit(out: Path, record: dict) -> dict:
    record = {"elapsed_s": round(time.perf_counter() - T0, 1), **record}
    RECORDS.append(record)
    line = json.dumps(record, default=str)
    print(line, flush=True)
    with open(out / "gpu_bench.jsonl", "a") as f:
        f.write(line + "\n")
    return record


def fail(out: Path, where: str, exc: BaseException | str) -> None:
    """A stage that raised or a check outside its tolerance: recorded, the exit status 1."""
    text = exc if isinstance(exc, str) else (
        f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:300]}")
    FAILURES.append(f"{where}: {text}")
    emit(out, {"section": "failure", "where": where, "error": text})
    if not isinstance(exc, str):
        traceback.print_exception(exc)


# ------------------------------------------------------------------------------ versions
def gpu_state() -> dict:
    """Versions and the GPU's clocks now (nvidia-smi), or why they are unavailable."""
    import torch

    from attngeom.extract.provenance import versions

    info = {**versions(), "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version()}
    query = "name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,temperature.gpu,power.draw"
    try:
        got = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        info["nvidia_smi"] = dict(zip(query.split(","), (x.strip() for x in
                                                         got.stdout.split(","))))
    except (OSError, subprocess.SubprocessError) as exc:
        info["nvidia_smi"] = f"unavailable ({type(exc).__name__})"
    return info


# ------------------------------------------------------------------------------ targets
def targets(full: dict, reduced: dict) -> dict:
    """Each target with the measured value (None where a case is missing)."""
    res = {}
    for (T, B), cases in full.items():
        s, c, e, r = (cases.get(k, {}) for k in ("sdpa", "compact", "eager", "removal"))
        res[f"T{T}x{B}_compact_throughput_vs_sdpa (>=0.85)"] = c.get("throughput_vs_sdpa")
        if "peak_mib" in s and "peak_mib" in c:
            res[f"T{T}x{B}_compact_peak_vs_sdpa (<=1.10)"] = c["peak_mib"] / s["peak_mib"]
        if r.get("throughput_vs_eager"):
            res[f"T{T}x{B}_removal_wall_vs_eager (<=1.5)"] = 1 / r["throughput_vs_eager"]
    for (T, B), cases in reduced.items():
        e, d, n = (cases.get(k, {}) for k in ("eager", "dense", "naive"))
        if "throughput_vs_eager" in d:
            res[f"T{T}_dense_throughput_vs_eager_2layer (>=0.6)"] = d["throughput_vs_eager"]
            f = full.get((T, 1), {}).get("eager")
            if f and "wall_median_s" in f:
                res[f"T{T}_dense_est_full_throughput_vs_eager (>=0.6)"] = f["wall_median_s"] / (
                    f["wall_median_s"] + d["est_full_extra_s_per_forward"])
        if "peak_delta_mib" in e and "peak_delta_mib" in d:
            res[f"T{T}_dense_peak_delta_minus_eager_in_layer_matrices (<=1)"] = (
                (d["peak_delta_mib"] - e["peak_delta_mib"]) / d["one_layer_attention_fp32_mib"])
        if "throughput_vs_naive" in d:
            res[f"T{T}_dense_speedup_vs_naive (>=4)"] = d["throughput_vs_naive"]
    return res


# ------------------------------------------------------------------------------ tables
HEADERS = {
    "correctness": "### correctness: extraction against the CPU float32 store",
    "oom": "### correctness: out-of-memory halving",
    "faithfulness": "### correctness: faithfulness against the hook-free reference",
    "full": "### speed: compact against SDPA (full model)",
    "removal": "### speed: removal pass against eager",
    "reduced": "### speed: dense and naive against eager (2-layer model)",
    "command": "### speed: attngeom extract end to end",
    "targets": "### targets",
}


def _f(x, spec: str = ".3g") -> str:
    return "" if x is None else x if isinstance(x, str) else format(x, spec)


def _md(key: str, head: list[str], rows: list[list]) -> str:
    lines = [f"\n{HEADERS[key]}\n"]
    if not rows:
        return lines[0] + "\n(no rows: the stage failed or was skipped)"
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(_f(c) for c in r) + " |" for r in rows])


def tables(records: list[dict]) -> str:
    """The markdown tables of every stage, from the emitted records."""
    from gpu_checks import TOLERANCES            # here: gpu_checks imports this module

    by = lambda **kw: [r for r in records if all(r.get(k) == v for k, v in kw.items())]  # noqa
    verdict = lambda ok: "ok" if ok else "**FAIL**"  # noqa: E731
    runs = sorted({(r["mode"], r["dtype"]) for r in by(section="correctness")}, reverse=True)
    cells = {(r["variable"], r["mode"], r["dtype"]): r for r in by(section="correctness")}
    rows = [[v, f"{kind} {bf:g} / {fp:g}"] + [
        "" if (v, m, d) not in cells else _f(cells[v, m, d]["max_error"], ".1e") + (
            "" if cells[v, m, d]["pass"] else " **FAIL**") for m, d in runs]
        for v, (kind, bf, fp) in TOLERANCES.items() if any((v, m, d) in cells for m, d in runs)]
    out = [_md("correctness", ["variable", "tolerance bf16 / fp32"] + [
        f"{m} {d}" for m, d in runs], rows)]
    out.append(_md("oom", ["stage", "injected at batch", "worst variable", "max error", "verdict"],
                   [[r["stage"], str(r["injected_at_batch"]), r.get("worst_variable"),
                     r.get("max_error"), verdict(r["pass"])] for r in by(section="oom")]))
    out.append(_md("faithfulness", ["dtype", "condition", "max relative ppl error",
                                    "tolerance", "reference ppl moved", "verdict"],
                   [[r["dtype"], r["metric"] if r["fraction"] is None else
                     f"{r['metric']} {r['mode']} p={r['fraction']:g}", r["max_rel_error"],
                     r["tolerance"], r["reference_moved"], verdict(r["pass"])]
                    for r in by(section="faithfulness")]))
    speed = [r for r in records if r.get("group") in ("full", "reduced") and "case" in r]
    row = lambda r, *ks: [f"{r['T']}x{r['batch']}", r["case"]] + (  # noqa: E731
        ["out of memory"] + [""] * (len(ks) - 1) if "error" in r else [r.get(k) for k in ks])
    out.append(_md("full", ["T x batch", "case", "median s", "tokens/s", "throughput vs SDPA",
                            "peak MiB", "peak delta MiB"],
                   [row(r, "wall_median_s", "tokens_per_s", "throughput_vs_sdpa", "peak_mib",
                        "peak_delta_mib") for r in speed if r["group"] == "full"]))
    out.append(_md("removal", ["T x batch", "case", "median s", "throughput vs eager",
                               "peak delta MiB"],
                   [row(r, "wall_median_s", "throughput_vs_eager", "peak_delta_mib")
                    for r in speed if r["group"] == "full" and r["case"] in ("eager", "removal")
                    and any(x["case"] == "removal" and x["T"] == r["T"] for x in speed)]))
    out.append(_md("reduced", ["T x batch", "case", "median s", "throughput vs eager",
                               "speedup vs naive", "peak delta MiB", "est. full extra s"],
                   [row(r, "wall_median_s", "throughput_vs_eager", "throughput_vs_naive",
                        "peak_delta_mib", "est_full_extra_s_per_forward")
                    for r in speed if r["group"] == "reduced"]))
    out.append(_md("command", ["texts x T", "batch", "wall s", "tokens/s", "SDPA forwards s",
                               "wall / forwards", "store MiB"],
                   [[f"{r['texts']}x{r['T']}", r["batch"], r["wall_s"], r["tokens_per_s"],
                     r["sdpa_forwards_s"], r["wall_vs_sdpa_forwards"], r["store_mib"]]
                    for r in by(group="command")]))
    target = (by(section="targets") or [{}])[-1]
    out.append(_md("targets", ["target", "measured"], [
        [k, v] for k, v in target.items() if k not in ("section", "elapsed_s")]))
    return "\n".join(out)
