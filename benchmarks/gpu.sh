#!/usr/bin/env bash
# The whole GPU benchmark in one command (Llama-3.1-8B shape, random init, bf16, T=2048/4096,
# batch 1): SDPA, eager, attngeom compact/dense, naive. Figures go to $OUT as JSON:
#   $OUT/gpu_bench.jsonl (one object per case, written as it goes), $OUT/gpu_summary.json,
#   $OUT/gpu_bench.log. Needs torch with CUDA and transformers; attngeom need not be installed
#   (then this checkout is laid out as pyproject.toml's package-dir maps it, on PYTHONPATH).
#   OUT=/tmp/gpu-bench bash benchmarks/gpu.sh [--lengths 2048,4096] [--repeats 5]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-runs/gpu-bench}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 TOKENIZERS_PARALLELISM=false
PY="${PYTHON:-python3}"
command -v "$PY" >/dev/null || PY=python
if ! "$PY" -c "import attngeom.extract" 2>/dev/null; then
  SITE="$(mktemp -d)"                    # attngeom/ + extract/ store/ analysis/ reports/
  mkdir "$SITE/attngeom"
  for f in attngeom/*; do ln -s "$PWD/$f" "$SITE/attngeom/"; done
  for sub in extract store analysis reports; do ln -s "$PWD/$sub" "$SITE/attngeom/$sub"; done
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null \
  | tee "$OUT/gpu_bench.log"
# ~8 minutes in all: the script stops starting new groups after --budget-s (default 420 s)
timeout 560 "$PY" benchmarks/gpu.py --out "$OUT" "$@" 2>&1 | tee -a "$OUT/gpu_bench.log"
exit "${PIPESTATUS[0]}"
