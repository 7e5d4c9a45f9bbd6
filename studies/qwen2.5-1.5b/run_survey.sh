#!/usr/bin/env bash
# The fourth study on Qwen2.5-Coder-1.5B-Instruct, its survey part (studies/README.md, "Design of
# the fourth study"), after `make setup` and `attngeom models install qwen2.5-1.5b`: the geometry
# (sinks, convexity, anti-alignment, decomposition) on 256 WikiText-2 chunks of <= 256 tokens and
# the PDF report; no faithfulness run here (run_faithfulness.sh has the pilot), no multiple
# choice. Stores in studies/qwen2.5-1.5b/work_survey, CSVs in studies/qwen2.5-1.5b/results_survey,
# PDF in studies/qwen2.5-1.5b/report.pdf; rerun to resume.
# Usage: studies/qwen2.5-1.5b/run_survey.sh [DATA_DIR] [extra survey.py options]
set -euo pipefail
cd "$(dirname "$0")/../.."
DATA_DIR=../shared/data
if [[ $# -gt 0 && $1 != -* ]]; then DATA_DIR=$1; shift; fi
exec nice -n 10 .venv/bin/python studies/survey.py --model qwen2.5-1.5b --data-dir "$DATA_DIR" \
  --geo-limit 256 --geo-max-length 256 --faith-limit 0 --query-limit 0 --mc-limit 0 \
  --mc-sweep-limit 0 "$@"
