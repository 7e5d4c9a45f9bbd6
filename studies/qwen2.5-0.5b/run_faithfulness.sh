#!/usr/bin/env bash
# The fourth study on Qwen2.5-Coder-0.5B-Instruct (studies/README.md, "Design of the fourth
# study"), after `make setup`, `attngeom models install qwen2.5-0.5b` and this model's
# run_survey.sh (its CPU time counts against the budget), in stages, each skipped once its CSVs
# exist (an interrupted one resumes from its finished blocks): rerun the script to resume.
#   1. Gu et al.'s count, natural / random / repeated tokens, with and without the BOS prepended;
#   2. the pilot: design 1 (head granularity) on the first 16 OpenStax texts;
#   3. n from the pilot (studies/sample_size.py): the MDE of SmolLM2's design 1 if the 6
#      CPU-hours pay for it, else all they pay for (at least 32), saying whether Gemma's MDE is
#      met; kept in results_faithfulness/sample_size.csv (delete it to decide again);
#   4. design 1 on the n texts after the pilot's;
#   5. the same texts at token granularity with every metric (the ranking; variant "token");
#   6. value zeroing on 8 of the pilot's texts (variant "vz_pilot", refused beyond 1 hour).
# Inputs and results in studies/qwen2.5-0.5b/work_faithfulness, CSVs and figures in
# studies/qwen2.5-0.5b/results_faithfulness. Each stage prints and writes its plan first.
# Usage: studies/qwen2.5-0.5b/run_faithfulness.sh [DATA_DIR] [options for every stage, e.g. --plan]
set -euo pipefail
DATA_DIR=
if [[ $# -gt 0 && $1 != -* ]]; then DATA_DIR=$(realpath "$1"); shift; fi  # relative to the caller
cd "$(dirname "$0")/../.."
DATA_DIR=${DATA_DIR:-../shared/data}
MODEL=qwen2.5-0.5b
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

done_ gu_sinks.csv || study --steps gu "$@"
done_ d1_prose_pilot_info.csv || study --steps design1-prose --variant pilot --prose-n 16 "$@"
# what one text of the token variant costs, timed on one batch of it (a plan, nothing run)
done_ plan_token_cost.csv || study --steps design1-prose --variant token_cost "${TOKEN[@]}" \
  --prose-skip 16 --prose-n 16 --plan "$@"
if [[ -f $R/d1_prose_pilot_order_log.csv ]]; then
  N=$(nice -n 10 .venv/bin/python studies/sample_size.py --pilot $R/d1_prose_pilot_order_log.csv \
    --reference studies/smollm2-135m/results_faithfulness/d1_prose_order_log.csv \
    --reference studies/gemma3-270m/results_faithfulness/d1_prose_order_log.csv \
    --plans $R/plan_pilot.csv $R/plan_token_cost.csv \
    --spent $R/timings.csv studies/$MODEL/results_survey/timings.csv \
    --budget-hours 6 --reserve-hours 0.75 --floor 32 --out $R/sample_size.csv)
else
  N=56; echo "[study] no pilot yet: the sample planned at the design's estimate, n = $N"
fi
echo "[study] sample: n = $N prose texts after the pilot's 16"
done_ d1_prose_info.csv || study --steps design1-prose --prose-skip 16 --prose-n "$N" "$@"
done_ d1_prose_token_info.csv || study --steps design1-prose --variant token "${TOKEN[@]}" \
  --prose-skip 16 --prose-n "$N" "$@"
done_ d1_prose_vz_pilot_info.csv || study --steps design1-prose --variant vz_pilot \
  --granularity token --metrics value_zeroing,contribution_layer,alti,random \
  --modes comprehensiveness --ranks signed --fractions 0.05,0.2 --prose-n 8 --max-hours 1 "$@"
