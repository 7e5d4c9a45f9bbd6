#!/usr/bin/env bash
# The whole GPU benchmark in one command (benchmarks/gpu.py says what it runs): correctness of
# bf16 and fp32 extraction and faithfulness on CUDA against the CPU float32 store, then speed and
# memory of random-init Llama-3.1-8B-shaped models in bf16 (compact vs SDPA at T = 512x8, 2048,
# 8192, 32768; dense and naive vs eager on 2 layers; a removal pass vs eager; `attngeom extract`
# end to end), versions and GPU clocks recorded; about 5 minutes on an H200. Figures go to $OUT:
#   $OUT/gpu_bench.jsonl (one object per record, written as it goes), $OUT/gpu_summary.json,
#   $OUT/gpu_bench.log (with the markdown tables at the end); exit status 0 only if every check
#   passed.
#   OUT=/tmp/gpu-bench bash benchmarks/gpu.sh [--lengths 512x8,2048] [--repeats 5]
#   bash benchmarks/gpu.sh --smoke     # every stage on the CPU, tiny models, ~30 s (no GPU)
#
# The H200 machine (Python 3.12, torch 2.11, transformers 5.17, no network) lacks some of
# attngeom's requirements: transformers below the 5.24 floor, no h5netcdf, dask or gguf. The
# session carries cp312 wheels of what is missing in `.whl/` (ignored by git: `echo /.whl/ >>
# .git/info/exclude`; fetched here with `python3 -m pip download --no-deps --only-binary=:all:
# --python-version 3.12 --implementation cp --platform manylinux_2_17_x86_64 -d .whl NAME==VER`
# for transformers>=5.24, h5netcdf, dask, partd, locket and any other floor the machine misses),
# names `.whl` in the run's `carry`, and this script installs them offline before anything else:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
#   export PYTHONPATH=/tmp/site
# (only where nvidia-smi exists, so that a CPU checkout's venv is never shadowed; WHEELS=0 skips
# it). attngeom need not be installed there: this checkout is put on PYTHONPATH as
# pyproject.toml's package-dir maps it.
set -uo pipefail
cd "$(dirname "$0")/.."
SMOKE=0
for arg in "$@"; do [ "$arg" = --smoke ] && SMOKE=1; done
OUT="${OUT:-runs/gpu-$([ $SMOKE = 1 ] && echo smoke || echo bench)}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 TOKENIZERS_PARALLELISM=false
PY="${PYTHON:-python3}"
command -v "$PY" >/dev/null || PY=python
if [ "${WHEELS:-1}" = 1 ] && command -v nvidia-smi >/dev/null && compgen -G ".whl/*.whl" >/dev/null
then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || { echo "gpu.sh: installing .whl/*.whl failed" >&2; exit 1; }
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
if ! "$PY" -c "import attngeom.extract" 2>/dev/null; then
  SITE="$(mktemp -d)"                    # attngeom/ + extract/ store/ analysis/ reports/
  mkdir "$SITE/attngeom"
  for f in attngeom/*; do ln -s "$PWD/$f" "$SITE/attngeom/"; done
  for sub in extract store analysis reports; do ln -s "$PWD/$sub" "$SITE/attngeom/$sub"; done
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem,clocks.max.sm \
  --format=csv 2>/dev/null | tee "$OUT/gpu_bench.log"
# gpu.py starts no new stage after --budget-s (default 270 s); this is the hard stop
timeout "${GPU_TIMEOUT_S:-480}" "$PY" benchmarks/gpu.py --out "$OUT" "$@" 2>&1 \
  | tee -a "$OUT/gpu_bench.log"
exit "${PIPESTATUS[0]}"
