#!/usr/bin/env bash
# Reproduce the Gemma 3 270M study (after `make setup`): stores in studies/gemma3-270m/work,
# CSVs in studies/gemma3-270m/results, PDF in studies/gemma3-270m/report.pdf.
# Usage: studies/gemma3-270m/run_survey.sh [DATA_DIR] [extra survey.py options]
set -euo pipefail
cd "$(dirname "$0")/../.."
DATA_DIR=../shared/data
if [[ $# -gt 0 && $1 != -* ]]; then DATA_DIR=$1; shift; fi
exec nice -n 10 .venv/bin/python studies/survey.py --model gemma3-270m --data-dir "$DATA_DIR" \
  --geo-limit 32 --geo-max-length 256 --faith-limit 10 --faith-max-length 128 \
  --fractions 0.1,0.3 --query-limit 0 --mc-limit 30 --mc-sweep-limit 16 --k-shot 1 "$@"
