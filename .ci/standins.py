"""Stand-ins for other CPUs: the tests that carry correctness, under other kernels and threads.

A newcomer's CPU picks other vectorised kernels (torch's ATEN_CPU_CAPABILITY), other MKL and
OpenBLAS code paths and another thread count than the machine the tests were written on, so
its float32 and float64 sums come out in another order. Every float comparison of the tests
takes its bound from the rounding of the computation (tests/tolerance.py), so they must pass
under each configuration below. Not every cross product: every value of every factor at least
once. Each run prints its configuration (and the kernels torch and OpenBLAS report), its time,
and, from TOLERANCE_LOG, the largest share of a rounding bound any comparison used and the
largest difference each measured spread (tolerance.py's constants) saw: the figures those
constants' comments record.

    .venv/bin/python .ci/standins.py [pytest args...]     # e.g. -x, -k golden, more test paths

Extra arguments go to every pytest run (after TESTS). Tests listed in ONCE run once, after the
configurations, in the environment as it is (e.g. slow signal tests that do not depend on the
kernels). CI runs it as its own step of .ci/run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The tests run under every configuration: the golden files and the references. Add more here
# (e.g. signal tests under tests/reliability/) or pass them as arguments.
TESTS = [
    "tests/test_tolerance.py",
    "tests/golden",
    "tests/test_reference.py",
    "tests/extract/test_geometry.py",
    "tests/extract/test_measure_fast.py",
    "tests/extract/test_dense.py",
    "tests/extract/test_inmemory.py",
    "tests/extract/test_faithfulness_reference.py",
    "tests/reliability/test_invariants.py",
    "tests/store/test_roundtrip.py",
    "tests/analysis/test_analysis_sinks.py",
    "tests/analysis/test_analysis_anti_alignment.py",
    "tests/analysis/test_analysis_convexity.py",
    "tests/analysis/test_analysis_decomposition.py",
    "tests/analysis/test_analysis_mixed.py",
    "tests/analysis/test_analysis_lowess.py",
    "tests/analysis/test_analysis_real_store.py",
    "tests/analysis/test_analysis_run_all.py",
    "tests/analysis/test_equivalence.py",
]
# Run once, not per configuration (and not with -m "not slow").
ONCE: list[str] = []
PYTEST = ["-q", "-p", "no:cacheprovider"]
NOT_SLOW = ["-m", "not slow"]

# name -> environment; None removes a variable (the library's own choice)
CONFIGS: dict[str, dict[str, str | None]] = {
    "scalar kernels, 1 thread": dict(
        ATEN_CPU_CAPABILITY="default", MKL_CBWR=None, OPENBLAS_CORETYPE=None, threads="1"),
    "AVX2, MKL AVX2 branch, OpenBLAS Haswell, 2 threads": dict(
        ATEN_CPU_CAPABILITY="avx2", MKL_CBWR="AVX2", OPENBLAS_CORETYPE="Haswell", threads="2"),
    "AVX-512, MKL compatible branch, OpenBLAS Sandybridge, 1 thread": dict(
        ATEN_CPU_CAPABILITY="avx512", MKL_CBWR="COMPATIBLE", OPENBLAS_CORETYPE="Sandybridge",
        threads="1"),
    "AVX-512, the libraries' own branches, 2 threads": dict(
        ATEN_CPU_CAPABILITY="avx512", MKL_CBWR=None, OPENBLAS_CORETYPE=None, threads="2"),
}
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
PROBE = ("import numpy, torch; print('torch', torch.backends.cpu.get_cpu_capability(), "
         "torch.get_num_threads(), 'threads')")


def environment(config: dict[str, str | None], log: Path) -> dict[str, str]:
    env = {**os.environ, "TOLERANCE_LOG": str(log), "TQDM_DISABLE": "1"}
    for key, value in config.items():
        for name in THREAD_VARS if key == "threads" else (key,):
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value
    return env


def kernels(env: dict[str, str]) -> str:
    """What torch and OpenBLAS report they run under ``env``."""
    probe = subprocess.run([sys.executable, "-c", PROBE], env={**env, "OPENBLAS_VERBOSE": "2"},
                           capture_output=True, text=True, cwd=ROOT)
    core = [line for line in probe.stderr.splitlines() + probe.stdout.splitlines()
            if line.startswith("Core:")]
    return " ".join([probe.stdout.strip().splitlines()[-1] if probe.stdout.strip() else "?",
                     "| OpenBLAS", core[0].split(":", 1)[1].strip() if core else "?"])


def summary(log: Path) -> list[str]:
    """The tolerance log's figures: each measured spread's largest differences, and the
    comparison that came closest to its rounding bound."""
    spreads: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    closest = (0.0, "")
    for line in log.read_text(encoding="utf-8").splitlines() if log.exists() else []:
        name, diff, rel, used = line.split("\t")
        if name.isupper():                            # a tolerance.py constant
            s = spreads[name]
            spreads[name] = [max(s[0], float(diff)), max(s[1], float(rel)), max(s[2], float(used))]
        elif float(used) > closest[0] and float(used) <= 1:
            closest = (float(used), name)
    lines = [f"    {n}: largest |diff| {s[0]:.3g}, relative {s[1]:.3g} ({s[2]:.2g} of the bound)"
             for n, s in sorted(spreads.items())]
    return lines + [f"    closest to a rounding bound: {closest[0]:.2g} of it ({closest[1]})"]


def main(extra: list[str]) -> int:
    failed = []
    for name, config in CONFIGS.items():
        with tempfile.TemporaryDirectory() as tmp:
            log = Path(tmp) / "tolerance.log"
            env = environment(config, log)
            shown = " ".join(f"{k}={'unset' if v is None else v}" for k, v in config.items())
            print(f"== {name}: {shown}\n   {kernels(env)}", flush=True)
            start = time.monotonic()
            run = subprocess.run([sys.executable, "-m", "pytest", *PYTEST, *NOT_SLOW, *TESTS,
                                  *extra], env=env, cwd=ROOT, capture_output=True, text=True)
            tail = (run.stdout.strip().splitlines() or ["(no output)"])[-1]
            print(f"   {tail} [{time.monotonic() - start:.0f} s]")
            print("\n".join(summary(log)), flush=True)
            if run.returncode:
                failed.append(name)
                print(run.stdout[-6000:] + run.stderr[-2000:])
    if ONCE:
        print(f"== once: {' '.join(ONCE)}", flush=True)
        start = time.monotonic()
        run = subprocess.run([sys.executable, "-m", "pytest", *PYTEST, *ONCE, *extra],
                             cwd=ROOT, capture_output=True, text=True)
        print(f"   {(run.stdout.strip().splitlines() or ['?'])[-1]} "
              f"[{time.monotonic() - start:.0f} s]")
        if run.returncode:
            failed.append("once")
            print(run.stdout[-6000:] + run.stderr[-2000:])
    passed = sum(name not in failed for name in CONFIGS)
    print(f"stand-ins: {passed} of {len(CONFIGS)} configurations pass"
          + (f"; failed: {'; '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
