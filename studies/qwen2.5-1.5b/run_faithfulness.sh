#!/usr/bin/env bash
# The fourth study on Qwen2.5-Coder-1.5B-Instruct (studies/README.md, "Design of the fourth
# study"): a pilot only, after `make setup` and `attngeom models install qwen2.5-1.5b`, in
# stages, each skipped once its CSVs exist (an interrupted one resumes from its finished blocks):
# rerun the script to resume.
#   1. the cost: extraction, one removal pass and a plain forward timed at 2 threads (the
#      machine's cores, torch's default there) and at 1 (plan_cost.csv, plan_cost1.csv: plans,
#      nothing run);
#   2. Gu et al.'s count, natural / random / repeated tokens, with and without the BOS prepended;
#   3. design 1 (head granularity) on the first 16 OpenStax texts (variant "pilot");
#   4. the same 16 texts at token granularity with every metric (variant "token": the ranking's
#      fourth model, a pilot);
#   5. what a powered design 1 would need: n and CPU per text (sample_size_if_run.csv).
# Inputs and results in studies/qwen2.5-1.5b/work_faithfulness, CSVs and figures in
# studies/qwen2.5-1.5b/results_faithfulness.
# Usage: studies/qwen2.5-1.5b/run_faithfulness.sh [DATA_DIR] [options for every stage, e.g. --plan]
set -euo pipefail
DATA_DIR=
if [[ $# -gt 0 && $1 != -* ]]; then DATA_DIR=$(realpath "$1"); shift; fi  # relative to the caller
cd "$(dirname "$0")/../.."
DATA_DIR=${DATA_DIR:-../shared/data}
MODEL=qwen2.5-1.5b
R=studies/$MODEL/results_faithfulness
ALL=attention,value_weighted,value_weighted_normalized,contribution,contribution_layer
ALL+=,random,alti,norm_residual,rollout   # the paper's four, C, the floor, the field's three
TOKEN=(--granularity token --metrics $ALL --ranks signed --fractions 0.01,0.05,0.2)
study() {       # the design's fixed options; each stage adds its own
  nice -n 10 .venv/bin/python studies/faithfulness_study.py --model $MODEL --data-dir "$DATA_DIR" \
    --length 128 --gsm8k-n 0 --design2-n 0 --geo-n 0 --gu-n 100 --gu-bos both \
    --fractions 0.01,0.02,0.05,0.1,0.2 "$@"
}
done_() { [[ -f $R/$1 ]] && echo "[study] $1 exists: stage done"; }

done_ plan_cost.csv || study --steps design1-prose,geometry --variant cost --prose-n 16 \
  --geo-n 256 --threads 2 --plan "$@"
done_ plan_cost1.csv || study --steps design1-prose,geometry --variant cost1 --prose-n 16 \
  --geo-n 256 --threads 1 --plan "$@"
done_ gu_sinks.csv || study --steps gu "$@"
# where the sink goes with the BOS prepended (the count above looks at position 0 only)
[[ " $* " == *" --plan "* ]] || done_ gu_bos_shift.csv || nice -n 10 .venv/bin/python studies/gu_bos_shift.py --model $MODEL \
  --work studies/$MODEL/work_faithfulness/gu --out $R/gu_bos_shift.csv
done_ d1_prose_pilot_info.csv || study --steps design1-prose --variant pilot --prose-n 16 "$@"
done_ d1_prose_token_info.csv || study --steps design1-prose --variant token "${TOKEN[@]}" \
  --prose-n 16 "$@"
if [[ -f $R/d1_prose_pilot_order_log.csv && -f $R/plan_token.csv ]]; then
  done_ sample_size_if_run.csv || nice -n 10 .venv/bin/python studies/sample_size.py \
    --pilot $R/d1_prose_pilot_order_log.csv \
    --reference studies/smollm2-135m/results_faithfulness/d1_prose_order_log.csv \
    --reference studies/gemma3-270m/results_faithfulness/d1_prose_order_log.csv \
    --plans $R/plan_pilot.csv $R/plan_token.csv --budget-hours 1000 --floor 32 \
    --out $R/sample_size_if_run.csv
fi
