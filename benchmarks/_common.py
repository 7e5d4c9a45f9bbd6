"""Shared helpers of the benchmark scripts: models, timing side by side, phases of a command,
memory, JSON output.

Timing: every case runs in the same process, interleaved (the order rotates each round) and
repeated, so that noise from other processes hits all cases alike. Each case reports the
median and the minimum of its wall times; ratios are given two ways, ``ratio_min`` (min/min,
the least-disturbed estimate) and ``ratio_paired`` (median over rounds of the per-round ratio).

Memory (CPU): each case runs in a fresh subprocess; the peak resident set is reset after the
model is built and the case warmed up (``/proc/self/clear_refs``), so ``peak_rss_delta`` is
the high-water mark of the measured call above the resident set just before it. GPU:
``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``.
"""

from __future__ import annotations

import importlib
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path
from statistics import median
from typing import Callable

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
MiB = 1024 * 1024
WIKITEXT = REPO.parent / "shared" / "data" / "wikitext2_raw_test.jsonl"      # ../shared/data
if not WIKITEXT.is_file():                      # a worktree: /work/wt/X -> /work/shared
    WIKITEXT = REPO.parent.parent / "shared" / "data" / "wikitext2_raw_test.jsonl"


# ------------------------------------------------------------------------------------ output
def emit(record: dict) -> dict:
    """Print one JSON object per line (flushed) and return it."""
    print(json.dumps(record, sort_keys=False, default=_json_default), flush=True)
    return record


def _json_default(x):
    try:
        return x.item()
    except AttributeError:
        return str(x)


def machine() -> dict:
    info = {"python": platform.python_version(), "cpus": os.cpu_count(),
            "platform": platform.platform()}
    try:
        import torch
        info.update(torch=torch.__version__, threads=torch.get_num_threads())
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    try:
        import transformers
        info["transformers"] = transformers.__version__
    except ImportError:
        pass
    try:
        info["load_avg_1m"] = os.getloadavg()[0]
    except OSError:
        pass
    return info


# ------------------------------------------------------------------------------------ models
SMOLLM2 = dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9,
               num_key_value_heads=3, head_dim=64, intermediate_size=1536, vocab_size=49152,
               max_position_embeddings=8192, tie_word_embeddings=True, rope_theta=100000.0)
LLAMA31_8B = dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                  num_key_value_heads=8, head_dim=128, intermediate_size=14336,
                  vocab_size=128256, max_position_embeddings=8192, tie_word_embeddings=False,
                  rope_theta=500000.0, rms_norm_eps=1e-5)


def random_llama(shape: dict, layers: int | None = None, dtype=None, device="cpu", seed=0):
    """A random-init LlamaForCausalLM of the given shape (built from a config, no download)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    kw = dict(shape)
    if layers is not None:
        kw["num_hidden_layers"] = layers
    torch.manual_seed(seed)
    cfg = LlamaConfig(**kw)
    dtype = dtype or torch.float32
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(dtype)
    return model.eval()


def batch_of(tok, length: int, size: int) -> dict:
    """``size`` WikiText-2 texts (the built-in texts where the file is missing) of at least
    ``length`` tokens of ``tok``, cut to ``length`` (no padding): a model's keyword inputs."""
    import torch

    from attngeom.extract.loading.data import load_texts

    texts = load_texts(str(WIKITEXT) if WIKITEXT.is_file() else "builtin").texts
    rows = [ids for ids in (tok(t)["input_ids"] for t in texts) if len(ids) >= length][:size]
    ids = torch.tensor([r[:length] for r in rows])
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def random_tokens(batch: int, length: int, vocab: int, device="cpu", seed=0):
    import torch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, length), generator=g).to(device)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


# ------------------------------------------------------------------------------------ timing
def interleaved(cases: dict[str, Callable[[], object]], repeats: int, warmup: int = 1,
                sync: Callable[[], None] | None = None, log=None) -> dict[str, dict[str, list]]:
    """Seconds of each case, ``repeats`` rounds, order rotated every round.

    Returns ``{"wall": {case: [s, ...]}, "cpu": {case: [s, ...]}}``; ``cpu`` is this process's
    CPU time, which other processes disturb much less than wall time when torch runs one
    thread (with several threads, OpenMP spin-waiting inflates it under contention).
    """
    names = list(cases)
    for _ in range(warmup):
        for name in names:
            cases[name]()
            if sync:
                sync()
    wall: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            if sync:
                sync()
            t0, c0 = time.perf_counter(), time.process_time()
            cases[name]()
            if sync:
                sync()
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
        if log:
            log(f"round {r + 1}/{repeats}: " + ", ".join(
                f"{n} {wall[n][-1]:.2f}s/{cpu[n][-1]:.2f}cpu" for n in names))
    return {"wall": wall, "cpu": cpu}


def summarize(times: dict[str, dict[str, list[float]]], base: str,
              tokens: int | None = None) -> dict[str, dict]:
    """Per case and clock (wall, cpu): median, min, tokens/s and ratios to ``base``.

    ``ratio_min`` is min/min (least-disturbed rounds), ``ratio_paired`` the median over rounds
    of the per-round ratio (the two cases ran back to back in each round).
    """
    out: dict[str, dict] = {}
    for clock, per_case in times.items():
        for name, t in per_case.items():
            rec = out.setdefault(name, {})
            rec[f"{clock}_median_s"] = median(t)
            rec[f"{clock}_min_s"] = min(t)
            if tokens and clock == "wall":
                rec["tokens_per_s"] = tokens / median(t)
                rec["tokens_per_s_best"] = tokens / min(t)
            if base in per_case:
                b = per_case[base]
                rec[f"{clock}_ratio_min"] = min(t) / min(b)
                rec[f"{clock}_ratio_paired"] = median(x / y for x, y in zip(t, b))
            rec["n"] = len(t)
    return out


# ------------------------------------------------------------------------------------ memory
def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def rss_bytes() -> int:
    kib = _status_kib("VmRSS")
    if kib is not None:
        return kib * 1024
    import psutil
    return psutil.Process().memory_info().rss


def reset_peak() -> bool:
    """Reset the process's peak RSS (Linux >= 4.0); False if not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_bytes() -> int:
    kib = _status_kib("VmHWM")
    if kib is not None:
        return kib * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def measure_peak(fn: Callable[[], object]) -> dict:
    """Peak RSS of one call above the resident set just before it (call fn once first)."""
    import gc

    gc.collect()
    ok = reset_peak()
    before = rss_bytes()
    t0 = time.perf_counter()
    fn()
    wall = time.perf_counter() - t0
    peak = peak_bytes()
    return {"peak_rss_delta_mib": (peak - before) / MiB, "peak_rss_mib": peak / MiB,
            "rss_before_mib": before / MiB, "wall_s": wall, "peak_reset": ok}


def run_child_rss(argv: list[str], env: dict | None = None, cwd=None,
                  rss_limit_mib: float | None = None, as_limit_bytes: int | None = None,
                  timeout_s: float | None = None) -> dict:
    """Run a command: wall and CPU seconds, exit status, output, and the child's own peak
    RSS (``os.wait4``, so earlier children do not count).

    ``rss_limit_mib``: a watchdog kills the child when its resident set outgrows this.
    ``as_limit_bytes``: the child's address space is limited (``RLIMIT_AS``), so that an
    allocation beyond it fails inside the child (alone), with the child's own error.
    ``timeout_s``: the child is killed after this many seconds (``timed_out``).
    """
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (as_limit_bytes, as_limit_bytes))

    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            cwd=cwd, preexec_fn=limit if as_limit_bytes else None)
    out_chunks, err_chunks = [], []
    import threading

    def pump(stream, sink):
        for chunk in iter(lambda: stream.read(65536), b""):
            sink.append(chunk)

    threads = [threading.Thread(target=pump, args=(proc.stdout, out_chunks)),
               threading.Thread(target=pump, args=(proc.stderr, err_chunks))]
    for t in threads:
        t.start()
    killed = timed_out = False
    watch = bool(rss_limit_mib or timeout_s)
    while True:                             # wait4 keeps this child's own rusage
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG if watch else 0)
        if pid:
            break
        if timeout_s and time.perf_counter() - t0 > timeout_s and not timed_out:
            proc.kill()
            timed_out = True
        try:                                # watchdog: stop a child that outgrows the limit
            with open(f"/proc/{proc.pid}/status") as f:
                rss = next(int(x.split()[1]) for x in f if x.startswith("VmRSS:")) / 1024
        except (OSError, StopIteration):
            rss = 0
        if rss_limit_mib and rss > rss_limit_mib and not killed:
            proc.kill()
            killed = True
        time.sleep(0.2)
    wall = time.perf_counter() - t0
    for t in threads:
        t.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {"argv": argv, "rc": proc.returncode, "wall_s": wall, "killed_over_rss_limit": killed,
            "timed_out": timed_out,
            "peak_rss_mib": usage.ru_maxrss / 1024, "cpu_s": usage.ru_utime + usage.ru_stime,
            "stdout": b"".join(out_chunks).decode(errors="replace"),
            "stderr": b"".join(err_chunks).decode(errors="replace")}


# ------------------------------------------------------------------------------------ phases
def time_phases(phases: list[tuple[str, str, str]], t0: float
                ) -> tuple[dict[str, float], dict[str, float]]:
    """Wrap each function of ``phases`` (the dotted path of its module or class, its name, a
    label; a classmethod stays one) with a timer, for a command run in this process.

    Returns ``spent`` (label -> seconds inside it, over every call) and ``ends`` (label ->
    seconds from ``t0`` to the end of its first call), filled as the calls run.
    """
    spent: dict[str, float] = {}
    ends: dict[str, float] = {}

    def timed(fn, label):
        def wrapper(*a, **kw):
            s = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                spent[label] = spent.get(label, 0.0) + time.perf_counter() - s
                ends.setdefault(label, time.perf_counter() - t0)
        return wrapper

    for path, attr, label in phases:
        owner = _resolve(path)
        raw = owner.__dict__[attr]
        method = isinstance(raw, classmethod)
        wrapped = timed(raw.__func__ if method else raw, label)
        setattr(owner, attr, classmethod(wrapped) if method else wrapped)
    return spent, ends


def _resolve(path: str):
    """The module, or the class inside a module, at the dotted ``path``."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for name in parts[i:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(path)


def json_lines(text: str) -> list[dict]:
    """The JSON objects printed one per line in ``text`` (other lines ignored)."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return out


def python() -> str:
    return sys.executable


def log(msg: str) -> None:
    print(f"# {msg}", file=sys.stderr, flush=True)
