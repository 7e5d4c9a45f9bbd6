#!/usr/bin/env bash
# Reproduce the all-MiniLM-L6-v2 study (after `make setup`): geometry and sink analyses only (an
# encoder without a language-modelling head): WikiText-2 chunks and BoolQ passages.
# Usage: studies/minilm-l6/run_survey.sh [DATA_DIR] [extra survey.py options]
set -euo pipefail
cd "$(dirname "$0")/../.."
DATA_DIR=../shared/data
if [[ $# -gt 0 && $1 != -* ]]; then DATA_DIR=$1; shift; fi
exec nice -n 10 .venv/bin/python studies/survey.py --model minilm-l6 --data-dir "$DATA_DIR" \
  --geo-limit 96 --geo-max-length 256 --geo-boolq "$@"
