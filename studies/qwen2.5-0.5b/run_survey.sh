#!/usr/bin/env bash
# The fourth study on Qwen2.5-Coder-0.5B-Instruct, its survey part (studies/README.md, "Design of
# the fourth study"), after `make setup` and `attngeom models install qwen2.5-0.5b`: the geometry
# (sinks, convexity, anti-alignment, decomposition) on 256 WikiText-2 chunks of <= 256 tokens,
# semantic drift with the first study's faithfulness run on 16 prose texts and 16 GSM8K items, the
# PDF report; no multiple choice (not among the claims, and outside the budget). Stores in
# studies/qwen2.5-0.5b/work_survey, CSVs in studies/qwen2.5-0.5b/results_survey, PDF in
# studies/qwen2.5-0.5b/report.pdf; rerun to resume. Run it before run_faithfulness.sh: its CPU
# time counts against the study's budget there.
# Usage: studies/qwen2.5-0.5b/run_survey.sh [DATA_DIR] [extra survey.py options]
set -euo pipefail
cd "$(dirname "$0")/../.."
DATA_DIR=../shared/data
if [[ $# -gt 0 && $1 != -* ]]; then DATA_DIR=$1; shift; fi
exec nice -n 10 .venv/bin/python studies/survey.py --model qwen2.5-0.5b --data-dir "$DATA_DIR" \
  --geo-limit 256 --geo-max-length 256 --faith-limit 16 --faith-max-length 128 \
  --fractions 0.1,0.3 --query-limit 0 --mc-limit 0 --mc-sweep-limit 0 "$@"
