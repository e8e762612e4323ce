#!/usr/bin/env bash
# QUAD for the demo adapters (docs/quad.md): shared quantization profiles of
# the eight task adapters (int8 and int4; the anchor and the fallback
# strategy), every adapter fitted to them by `quad fit` (on the f32 base and
# on the deployed W4A8 base), and the evaluation table: per adapter its QSS
# and exact match / chrF on the world's eval split for the FP32 adapter,
# independent PTQ (`adapter compile --dtype i8|i4`: per-adapter group
# scales), the shared profile without KD (`quad ptq`), shared + KD, and
# shared + KD on the W4A8 base (q4c, compiled unfused), each also relative
# to FP32 on the f32 base.
#
# Writes OUT (default models/demo/quad): shared.lpq (int8, the strategy the
# rule picks), <task>.lpa (int8 shared + KD, f32 base), shared-int4.lpq and
# <task>.int4.lpa beside them, table.md and logs/ (the AIMET encodings of
# shared.lpq: `loraplex quad export --profile shared.lpq --export-encodings F`).
#
#   scripts/make_quad.sh                      # everything (long on 2 cores)
#   TASKS="correct translate" STEPS=30 scripts/make_quad.sh   # a subset
#
# Environment: BUILD (build dir, default build), TASKS (adapters fitted and
# evaluated; the profiles always rank all eight), STEPS (quad fit steps,
# default 60), BATCH (8), SEQ (128), LR (2e-4), KD (0.5), SEED (1), CALIB_N
# (16 calibration records per adapter, from the world's train split),
# THREADS (2), WORLD_SEED (the world's seed; default: the committed world),
# EVAL_MAX (records per task, default all 300), OUT, WORK (scratch dir).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin="${BUILD:-$root/build}/loraplex"
demo="$root/models/demo"
out="${OUT:-$demo/quad}"
work="${WORK:-$(mktemp -d /tmp/make_quad.XXXXXX)}"
all="correct style-formal style-polite style-jovial style-terse summary reply translate"
tasks="${TASKS:-$all}"
steps="${STEPS:-60}"; batch="${BATCH:-8}"; seq="${SEQ:-128}"; lr="${LR:-2e-4}"; kd="${KD:-0.5}"
seed="${SEED:-1}"; calibn="${CALIB_N:-16}"; threads="${THREADS:-2}"
evalmax=${EVAL_MAX:+--max $EVAL_MAX}
mkdir -p "$out/logs" "$work"
log="$out/logs"
t_start=$(date +%s)

echo "make_quad: work in $work, output in $out" >&2
"$bin" world --out "$work/world" ${WORLD_SEED:+--seed "$WORLD_SEED"} >/dev/null
T="$work/world/tasks"
"$bin" compile "$demo/base.gguf" -o "$work/q4c.lpx" --weights q4c --no-fuse >/dev/null 2>&1
list=$(for t in $all; do printf '%s=%s,' "$t" "$demo/adapters/$t.lpa"; done); list=${list%,}

# ---- profiles: the rule's choice, and both strategies forced ----------------------------
declare -A qss chosen
for bits in 8 4; do
  for strat in auto anchor fallback; do
    p="$work/p$bits-$strat.lpq"
    extra=()
    [ "$strat" = auto ] && extra=(--export-encodings "$work/aimet-int$bits.json")
    "$bin" quad profile --base "$demo/base.gguf" --adapters "$list" --calib "$T" --calib-n "$calibn" \
      --seq "$seq" --bits "$bits" --granularity channel --strategy "$strat" --threads "$threads" -o "$p" \
      "${extra[@]}" >"$log/profile-int$bits-$strat.txt" 2>"$log/profile-int$bits-$strat.err"
    [ "$strat" = auto ] || continue
    while read -r r name q; do qss[$bits,$name]=$q; done < <(awk '$1 ~ /^[0-9]+$/ { print $1, $2, $3 }' "$log/profile-int$bits-auto.txt")
    grep -q -- "-> anchor" "$log/profile-int$bits-auto.txt" && chosen[$bits]=anchor || chosen[$bits]=fallback
  done
done
cp "$work/p8-${chosen[8]}.lpq" "$out/shared.lpq"
cp "$work/p4-${chosen[4]}.lpq" "$out/shared-int4.lpq"

# ---- evaluation ---------------------------------------------------------------------------
# em_chrf MODEL TASK ADAPTER [--profile P] -> "EM chrF"
em_chrf() {
  "$bin" eval-tasks -m "$1" --adapters "$2=$3" --data "$T" --tasks "$2" -t "$threads" $evalmax "${@:4}" 2>>"$log/eval.err" |
    awk -v t="$2" '$1 == t && $2 == "all" { print $5, $6 }'
}
rel() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.1f", 100 * a / b; else print "-" }'; }
cell() { # "EM chrF" fp_em fp_chrf -> "EM / chrF (rel EM%, rel chrF%)"
  set -- $1 $2 $3
  printf '%s / %s (%s%%, %s%%)' "$1" "$2" "$(rel "$1" "$3")" "$(rel "$2" "$4")"
}

fit() { # bits strategy task deploy-or-empty out
  local d=${4:+--deploy $4}
  local t0=$(date +%s)
  "$bin" quad fit --base "$demo/base.gguf" $d --profile "$work/p$1-$2.lpq" --adapter "$demo/adapters/$3.lpa" \
    --data "$T/$3.train.jsonl" --eval "$T/$3.eval.jsonl" --steps "$steps" --batch "$batch" --seq "$seq" \
    --lr "$lr" --kd-weight "$kd" --seed "$seed" --eval-every 20 --threads "$threads" -o "$5" \
    2>"$log/fit-$3-int$1-$2${4:+-w4a8}.log"
  echo "$3 int$1 $2${4:+ w4a8}: $(( $(date +%s) - t0 )) s" >> "$log/fit-times.txt"
}

: > "$log/fit-times.txt"
table="$out/table.md"
{
  echo "# QUAD on the demo adapters"
  echo
  echo "Made by \`scripts/make_quad.sh\` (STEPS=$steps BATCH=$batch SEQ=$seq LR=$lr KD=$kd SEED=$seed"
  echo "CALIB_N=$calibn${WORLD_SEED:+ WORLD_SEED=$WORLD_SEED}${EVAL_MAX:+ EVAL_MAX=$EVAL_MAX}). Cells: exact match % / chrF"
  echo "(relative to the FP32 adapter on the f32 base). QSS: mean JS divergence (nats), own PTQ encodings."
  echo "W4A8: the base compiled \`--weights q4c --no-fuse\`, the adapter fitted with it as the student."
  for bits in 8 4; do
    echo
    echo "int$bits profile, rule's choice: **${chosen[$bits]}** ($(grep '^rule:' "$log/profile-int$bits-auto.txt"))"
  done
} > "$table"

for bits in 8 4; do
  for strat in anchor fallback; do
    {
      echo
      echo "## int$bits, $strat"
      echo
      echo "| adapter | QSS | FP32 | independent PTQ | shared, no KD | shared + KD | shared + KD, W4A8 base |"
      echo "|---|---|---|---|---|---|---|"
    } >> "$table"
    for t in $tasks; do
      fp=$(em_chrf "$demo/base.gguf" "$t" "$demo/adapters/$t.lpa")
      "$bin" adapter compile "$demo/adapters/$t.lpa" --base "$demo/base.gguf" --dtype "i$bits" -o "$work/$t-i$bits.lpa" >/dev/null 2>&1
      ind=$(em_chrf "$demo/base.gguf" "$t" "$work/$t-i$bits.lpa")
      "$bin" quad ptq --base "$demo/base.gguf" --profile "$work/p$bits-$strat.lpq" --adapter "$demo/adapters/$t.lpa" \
        -o "$work/$t-ptq$bits-$strat.lpa" 2>/dev/null
      ptq=$(em_chrf "$demo/base.gguf" "$t" "$work/$t-ptq$bits-$strat.lpa" --profile "$work/p$bits-$strat.lpq")
      fit "$bits" "$strat" "$t" "" "$work/$t-kd$bits-$strat.lpa"
      kdr=$(em_chrf "$demo/base.gguf" "$t" "$work/$t-kd$bits-$strat.lpa" --profile "$work/p$bits-$strat.lpq")
      fit "$bits" "$strat" "$t" "$work/q4c.lpx" "$work/$t-kdw$bits-$strat.lpa"
      kdw=$(em_chrf "$work/q4c.lpx" "$t" "$work/$t-kdw$bits-$strat.lpa" --profile "$work/p$bits-$strat.lpq")
      echo "| $t | ${qss[$bits,$t]:--} | ${fp/ / \/ } | $(cell "$ind" $fp) | $(cell "$ptq" $fp) | $(cell "$kdr" $fp) | $(cell "$kdw" $fp) |" >> "$table"
      if [ "$strat" = "${chosen[$bits]}" ]; then
        [ "$bits" = 8 ] && cp "$work/$t-kd$bits-$strat.lpa" "$out/$t.lpa" || cp "$work/$t-kd$bits-$strat.lpa" "$out/$t.int4.lpa"
      fi
    done
  done
done
{
  echo
  echo "Fit wall-clock times (s), and the total: $(( $(date +%s) - t_start )) s"
  echo
  sed 's/^/    /' "$log/fit-times.txt"
} >> "$table"
cat "$table"
