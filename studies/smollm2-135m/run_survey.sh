#!/usr/bin/env bash
# Reproduce the SmolLM2-135M study (after `make setup`): stores in studies/smollm2-135m/work,
# CSVs in studies/smollm2-135m/results, PDF in studies/smollm2-135m/report.pdf.
# Usage: studies/smollm2-135m/run_survey.sh [DATA_DIR] [extra survey.py options, e.g. --faith-limit 48]
set -euo pipefail
cd "$(dirname "$0")/../.."
DATA_DIR=../shared/data
if [[ $# -gt 0 && $1 != -* ]]; then DATA_DIR=$1; shift; fi
exec nice -n 10 .venv/bin/python studies/survey.py --model smollm2-135m --data-dir "$DATA_DIR" \
  --geo-limit 64 --geo-max-length 256 --faith-limit 16 --faith-max-length 128 \
  --fractions 0.1,0.3 --query-limit 8 --mc-limit 40 --mc-sweep-limit 24 --k-shot 1 "$@"
