#!/usr/bin/env bash
# The second study of Gemma 3 270M (studies/README.md, "Design of the second faithfulness study"),
# after `make setup`: inputs and results in studies/gemma3-270m/work_faithfulness, CSVs and figures in
# studies/gemma3-270m/results_faithfulness. Prints and writes the plan (passes, CPU-hours) first; rerun to resume.
# Usage: studies/gemma3-270m/run_faithfulness.sh [DATA_DIR] [extra options, e.g. --plan or --steps design1-prose]
set -euo pipefail
DATA_DIR=
if [[ $# -gt 0 && $1 != -* ]]; then DATA_DIR=$(realpath "$1"); shift; fi  # relative to the caller
cd "$(dirname "$0")/../.."
DATA_DIR=${DATA_DIR:-../shared/data}
exec nice -n 10 .venv/bin/python studies/faithfulness_study.py --model gemma3-270m --data-dir "$DATA_DIR" \
  --prose-n 96 --gsm8k-n 96 --design2-n 0 --geo-n 0 --gu-n 100 \
  --fractions 0.01,0.02,0.05,0.1,0.2 --design2-fraction 0.2 --length 128 --gsm8k-min 96 "$@"
