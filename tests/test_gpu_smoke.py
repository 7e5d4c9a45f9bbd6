"""``benchmarks/gpu.sh --smoke``: every stage of the GPU benchmark on the CPU, so it cannot rot.

The real run needs an H200 that most sessions are not lent; the smoke run takes the same code
path with tiny random models on the CPU (~30 s on 2 cores) and must exit 0 with every stage's
table filled in. A stage that raises, or a check outside its tolerance, exits non-zero.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEADERS = (
    "### correctness: extraction against the CPU float32 store",
    "### correctness: out-of-memory halving",
    "### correctness: faithfulness against the hook-free reference",
    "### speed: compact against SDPA (full model)",
    "### speed: removal pass against eager",
    "### speed: dense and naive against eager (2-layer model)",
    "### speed: attngeom extract end to end",
    "### targets",
)


def test_gpu_benchmark_smoke_runs_every_stage(tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, PYTHON=sys.executable, OUT=str(out), WHEELS="0",
               ATTNGEOM_CACHE=str(tmp_path / "cache"))
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu.sh"), "--smoke", "--work",
                           str(tmp_path / "work")], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    for header in HEADERS:                  # each table has its column header and rows
        assert header in done.stdout, header
        section = done.stdout.split(header, 1)[1].split("\n###", 1)[0]
        rows = [line for line in section.splitlines() if line.startswith("| ")]
        assert len(rows) >= 2, (header, section)
        assert "FAIL" not in section, section
    records = [json.loads(line) for line in (out / "gpu_bench.jsonl").read_text().splitlines()]
    summary = json.loads((out / "gpu_summary.json").read_text())
    assert summary["failures"] == []
    checks = [r for r in records if r.get("section") == "correctness"]
    assert {(r["mode"], r["dtype"]) for r in checks} == {
        (m, d) for m in ("compact", "dense") for d in ("float32", "bfloat16")}
    assert all(r["pass"] and r["compared"] > 0 for r in checks)
    # bfloat16 really ran in bfloat16: it differs from the float32 store, within tolerance
    assert max(r["max_error"] for r in checks if r["dtype"] == "bfloat16"
               and r["variable"] == "alpha") > 1e-4
    assert [r["injected_at_batch"] for r in records if r.get("section") == "oom"] == [[4]] * 3
    cases = {(r["group"], r["case"]) for r in records if "wall_median_s" in r or "wall_s" in r}
    assert cases >= {("full", c) for c in ("sdpa", "sdpa_nologits", "eager", "compact",
                                           "removal")} | {
        ("reduced", c) for c in ("sdpa", "eager", "compact", "dense", "naive")} | {
        ("command", "attngeom extract")}
