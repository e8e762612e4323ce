#!/usr/bin/env bash
# QUAD for the demo adapters (docs/quad.md): shared quantization profiles of
# the demo's task adapters (int8 and int4; the anchor and the fallback
# strategy), every adapter fitted to them by `quad fit` (on the f32 base and
# on the deployed W4A8 base), and the evaluation table: per adapter its QSS
# and exact match / chrF on the world's eval split for the FP32 adapter,
# independent PTQ (`adapter compile --dtype i8|i4`: per-adapter group
# scales), the shared profile without KD (`quad ptq`), shared + KD, and
# shared + KD on the W4A8 base (q4c, compiled unfused), each also relative
# to FP32 on the f32 base; on the committed world's eval split and on the
# eval split of a world drawn with another seed (EVAL_SEED2: the same
# held-out meanings, other sentences). Then the over-the-air case: one more
# adapter (style-curious, a style none of the others saw) trained after the
# profiles were fixed, fitted to them unchanged, scored against its FP32 self.
#
# Writes OUT (default DEMO/quad): shared.lpq (int8, the strategy the
# rule picks), <task>.lpa (int8 shared + KD, f32 base), shared-int4.lpq and
# <task>.int4.lpa beside them, ota/ (the over-the-air adapter: FP32, and fitted to
# both profiles), table.md and logs/ (the AIMET encodings of shared.lpq:
# `loraplex quad export --profile shared.lpq --export-encodings F`).
#
#   scripts/make_quad.sh                      # everything (long on 2 cores)
#   TASKS="correct translate" STEPS=30 scripts/make_quad.sh   # a subset
#   BITS=4 STEPS4=300 scripts/make_quad.sh    # redo the int4 half only
#   DEMO=models/demo-v2 WORLD_ARGS="--version 2" scripts/make_quad.sh   # the nine-language demo
#
# Each bit width's half of the table (its profile choice, sections, over-the-air
# rows and fit times) is kept in logs/ with the settings that made it; table.md is
# assembled from the halves there, so a run over one width keeps the other's.
#
# Environment: BUILD (build dir, default build), DEMO (the model folder: base.gguf,
# adapters/<task>.lpa; default models/demo), WORLD_ARGS (`loraplex world` options
# that make DEMO's world, e.g. "--version 2"; default none: version 1), BITS (profile widths made,
# fitted and evaluated, default "8 4"), TASKS (adapters fitted and
# evaluated; the profiles always rank all of DEMO/adapters/*.lpa), STEPS (quad fit steps,
# default 60), STEPS4 (the int4 fits' steps, default STEPS: at int4 the
# held-out loss still falls past 100 steps), BATCH (8), SEQ (128), LR (2e-4), KD (0.5), SEED (1), CALIB_N
# (16 calibration records per adapter, from the world's train split),
# THREADS (2), WORLD_SEED (the world's seed; default: the committed world),
# EVAL_SEED2 (the second eval split's world seed, default 2), HOLDOUT (32
# train records held out of each fit to pick its best step), ACT_CALIB
# (mse|minmax activation ranges, default mse), OTA_STEPS (the over-the-air
# adapter's LoRA steps, default 300; made once: delete OUT/ota to redo), EVAL_MAX (records per task,
# default all 300), OUT, WORK (scratch dir).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin="${BUILD:-$root/build}/loraplex"
demo=$(realpath "${DEMO:-$root/models/demo}")
out="${OUT:-$demo/quad}"
work="${WORK:-$(mktemp -d /tmp/make_quad.XXXXXX)}"
# DEMO's adapters, in the order the profiles always took them
all=$(for t in correct style-formal style-polite style-jovial style-terse summary reply translate compose; do
  if [ -f "$demo/adapters/$t.lpa" ]; then printf '%s ' "$t"; fi
done)
tasks="${TASKS:-$all}"
steps="${STEPS:-60}"; steps4="${STEPS4:-$steps}"; batch="${BATCH:-8}"; seq="${SEQ:-128}"; lr="${LR:-2e-4}"; kd="${KD:-0.5}"
seed="${SEED:-1}"; calibn="${CALIB_N:-16}"; threads="${THREADS:-2}"
bitset="${BITS:-8 4}"; seed2="${EVAL_SEED2:-2}"; holdout="${HOLDOUT:-32}"; actcalib="${ACT_CALIB:-mse}"; ota_steps="${OTA_STEPS:-300}"
evalmax=${EVAL_MAX:+--max $EVAL_MAX}
mkdir -p "$out/logs" "$out/ota" "$work"
log="$out/logs"
t_start=$(date +%s)

echo "make_quad: work in $work, output in $out" >&2
# shellcheck disable=SC2086
"$bin" world --out "$work/world" ${WORLD_ARGS:-} ${WORLD_SEED:+--seed "$WORLD_SEED"} >/dev/null
T="$work/world/tasks"
# shellcheck disable=SC2086
"$bin" world --out "$work/world2" ${WORLD_ARGS:-} --seed "$seed2" --stories 0 >/dev/null
T2="$work/world2/tasks"
"$bin" compile "$demo/base.gguf" -o "$work/q4c.lpx" --weights q4c --no-fuse >/dev/null 2>&1
list=$(for t in $all; do printf '%s=%s,' "$t" "$demo/adapters/$t.lpa"; done); list=${list%,}

# ---- profiles: the rule's choice, and both strategies forced ----------------------------
declare -A qss chosen
for bits in $bitset; do
  for strat in auto anchor fallback; do
    p="$work/p$bits-$strat.lpq"
    extra=()
    [ "$strat" = auto ] && extra=(--export-encodings "$work/aimet-int$bits.json")
    "$bin" quad profile --base "$demo/base.gguf" --adapters "$list" --calib "$T" --calib-n "$calibn" \
      --seq "$seq" --bits "$bits" --granularity channel --strategy "$strat" --act-calib "$actcalib" \
      --threads "$threads" -o "$p" \
      "${extra[@]}" >"$log/profile-int$bits-$strat.txt" 2>"$log/profile-int$bits-$strat.err"
    [ "$strat" = auto ] || continue
    while read -r r name q; do qss[$bits,$name]=$q; done < <(awk '$1 ~ /^[0-9]+$/ { print $1, $2, $3 }' "$log/profile-int$bits-auto.txt")
    grep -q -- "-> anchor" "$log/profile-int$bits-auto.txt" && chosen[$bits]=anchor || chosen[$bits]=fallback
  done
done
for bits in $bitset; do
  cp "$work/p$bits-${chosen[$bits]}.lpq" "$out/$([ "$bits" = 8 ] && echo shared || echo shared-int$bits).lpq"
done

# ---- evaluation ---------------------------------------------------------------------------
# em_chrf MODEL TASK ADAPTER [--profile P] -> "EM chrF" on both splits (4 numbers)
em_chrf() {
  local d
  for d in "$T" "$T2"; do
    "$bin" eval-tasks -m "$1" --adapters "$2=$3" --data "$d" --tasks "$2" -t "$threads" $evalmax "${@:4}" 2>>"$log/eval.err" |
      awk -v t="$2" '$1 == t && $2 == "all" { printf "%s %s ", $5, $6 }'
  done
}
rel() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.1f", 100 * a / b; else print "-" }'; }
# cell "EM chrF EM2 chrF2" "fpEM fpChrF fpEM2 fpChrF2" SPLIT(0|1) -> "EM / chrF (rel EM%, rel chrF%)"
cell() {
  local a=($1) f=($2) i=$((2 * $3))
  printf '%s / %s (%s%%, %s%%)' "${a[$i]}" "${a[$((i + 1))]}" "$(rel "${a[$i]}" "${f[$i]}")" \
    "$(rel "${a[$((i + 1))]}" "${f[$((i + 1))]}")"
}

fit() { # bits strategy task deploy-or-empty out [train.jsonl [adapter]]
  local d=${4:+--deploy $4}
  local t0=$(date +%s)
  "$bin" quad fit --base "$demo/base.gguf" $d --profile "$work/p$1-$2.lpq" --adapter "${7:-$demo/adapters/$3.lpa}" \
    --data "${6:-$T/$3.train.jsonl}" --holdout "$holdout" --steps "$([ "$1" = 4 ] && echo "$steps4" || echo "$steps")" --batch "$batch" --seq "$seq" \
    --lr "$lr" --kd-weight "$kd" --seed "$seed" --eval-every 20 --threads "$threads" -o "$5" \
    2>"$log/fit-$3-int$1-$2${4:+-w4a8}.log"
  echo "$3 int$1 $2${4:+ w4a8}: $(( $(date +%s) - t0 )) s" >> "$log/fit-times-int$1.txt"
}

header() { # title
  echo
  echo "## $1"
  echo
  echo "| adapter | QSS | FP32 | independent PTQ | shared, no KD | shared + KD | shared + KD, W4A8 base |"
  echo "|---|---|---|---|---|---|---|"
}
for bits in $bitset; do
  part="$log/table-int$bits.md"
  : > "$log/fit-times-int$bits.txt"
  {
    echo
    echo "int$bits: made by \`scripts/make_quad.sh\` (STEPS=$([ "$bits" = 4 ] && echo "$steps4" || echo "$steps") BATCH=$batch SEQ=$seq LR=$lr KD=$kd SEED=$seed"
    echo "CALIB_N=$calibn HOLDOUT=$holdout ACT_CALIB=$actcalib EVAL_SEED2=$seed2${WORLD_ARGS:+ WORLD_ARGS='$WORLD_ARGS'}${WORLD_SEED:+ WORLD_SEED=$WORLD_SEED}${EVAL_MAX:+ EVAL_MAX=$EVAL_MAX});"
    echo "profile, rule's choice: **${chosen[$bits]}** ($(grep '^rule:' "$log/profile-int$bits-auto.txt"))"
  } > "$part"
  for strat in anchor fallback; do
    rows1="$work/rows1"; rows2="$work/rows2"; : > "$rows1"; : > "$rows2"
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
      f=($fp)
      for sp in 0 1; do
        echo "| $t | ${qss[$bits,$t]:--} | ${f[$((2 * sp))]} / ${f[$((2 * sp + 1))]} | $(cell "$ind" "$fp" $sp) | $(cell "$ptq" "$fp" $sp) | $(cell "$kdr" "$fp" $sp) | $(cell "$kdw" "$fp" $sp) |" \
          >> "$work/rows$((sp + 1))"
      done
      if [ "$strat" = "${chosen[$bits]}" ]; then
        [ "$bits" = 8 ] && cp "$work/$t-kd$bits-$strat.lpa" "$out/$t.lpa" || cp "$work/$t-kd$bits-$strat.lpa" "$out/$t.int4.lpa"
      fi
    done
    { header "int$bits, $strat (eval split: committed world)"; cat "$rows1";
      header "int$bits, $strat (eval split: world seed $seed2)"; cat "$rows2"; } >> "$part"
  done
done

# ---- over the air: one more adapter made after the profiles were fixed ---------------------
# style-curious: a style none of the other adapters (nor the profiles' calibration) saw;
# trained on the frozen base from the jovial adapter's weights (its PEFT folder where
# DEMO has one), then fitted to the committed profiles as they are (nothing else is
# re-quantized or recompiled).
ota="style-curious"
if [ ! -f "$out/ota/$ota.lpa" ]; then
  t0=$(date +%s)
  init="$demo/adapters/style-jovial"
  [ -d "$init" ] || init="$init.lpa"
  "$bin" train-lora --base "$demo/base.gguf" --data "$T/$ota.train.jsonl" --init-adapter "$init" \
    --batch 16 --seq 128 --pack --lr 2e-3 --min-lr 2e-4 --warmup 20 --wd 0 --clip 1.0 --seed "$seed" \
    --threads "$threads" --eval-every 0 --log-every 50 --steps "$ota_steps" -o "$work/$ota" 2>"$log/ota-train.log"
  "$bin" adapter compile "$work/$ota" --base "$demo/base.gguf" -o "$out/ota/$ota.lpa" >/dev/null 2>&1
  echo "$ota FP32 training ($ota_steps steps): $(( $(date +%s) - t0 )) s" >> "$log/ota-time.txt"
fi
for bits in $bitset; do
  strat=${chosen[$bits]}
  a="$out/ota/$ota.lpa"
  fp=$(em_chrf "$demo/base.gguf" "$ota" "$a")
  "$bin" adapter compile "$a" --base "$demo/base.gguf" --dtype "i$bits" -o "$work/$ota-i$bits.lpa" >/dev/null 2>&1
  ind=$(em_chrf "$demo/base.gguf" "$ota" "$work/$ota-i$bits.lpa")
  "$bin" quad ptq --base "$demo/base.gguf" --profile "$work/p$bits-$strat.lpq" --adapter "$a" -o "$work/$ota-ptq$bits.lpa" 2>/dev/null
  ptq=$(em_chrf "$demo/base.gguf" "$ota" "$work/$ota-ptq$bits.lpa" --profile "$work/p$bits-$strat.lpq")
  sfx=$([ "$bits" = 8 ] && echo "" || echo ".int$bits")
  fit "$bits" "$strat" "$ota" "" "$out/ota/$ota$sfx.quad.lpa" "$T/$ota.train.jsonl" "$a"
  kdr=$(em_chrf "$demo/base.gguf" "$ota" "$out/ota/$ota$sfx.quad.lpa" --profile "$work/p$bits-$strat.lpq")
  fit "$bits" "$strat" "$ota" "$work/q4c.lpx" "$work/$ota-kdw$bits.lpa" "$T/$ota.train.jsonl" "$a"
  kdw=$(em_chrf "$work/q4c.lpx" "$ota" "$work/$ota-kdw$bits.lpa" --profile "$work/p$bits-$strat.lpq")
  f=($fp)
  for sp in 0 1; do
    echo "| int$bits $strat (split $((sp ? seed2 : 1))) | ${f[$((2 * sp))]} / ${f[$((2 * sp + 1))]} | $(cell "$ind" "$fp" $sp) | $(cell "$ptq" "$fp" $sp) | $(cell "$kdr" "$fp" $sp) | $(cell "$kdw" "$fp" $sp) |"
  done > "$log/table-ota-int$bits.md"
done

# ---- table.md from both halves (this run's, and the other width's last run) ---------------
table="$out/table.md"
{
  echo "# QUAD on the demo adapters"
  echo
  echo "Made by \`scripts/make_quad.sh\`, one half per bit width (settings below)."
  echo "Cells: exact match % / chrF (relative to the FP32 adapter on the f32 base), on the committed"
  echo "world's eval split and on the eval split of the world drawn with seed $seed2 (same held-out"
  echo "meanings, other sentences). QSS: mean JS divergence (nats), own PTQ encodings."
  echo "W4A8: the base compiled \`--weights q4c --no-fuse\`, the adapter fitted with it as the student."
  echo "Each fit keeps its step of least held-out loss (the last $holdout train records, never trained on)."
  for bits in 8 4; do if [ -f "$log/table-int$bits.md" ]; then cat "$log/table-int$bits.md"; fi; done
  echo
  echo "## Over the air: \`$ota\`, fitted to the committed profiles"
  echo
  echo "One more adapter, trained after the profiles were fixed ($ota_steps LoRA steps on the frozen base,"
  echo "starting from the jovial adapter's weights), then fitted to shared.lpq / shared-int4.lpq as"
  echo "they are. Cells: committed split; world seed $seed2 split."
  echo
  echo "| profile | FP32 | independent PTQ | shared, no KD | shared + KD | shared + KD, W4A8 base |"
  echo "|---|---|---|---|---|---|"
  for bits in 8 4; do if [ -f "$log/table-ota-int$bits.md" ]; then cat "$log/table-ota-int$bits.md"; fi; done
  echo
  echo "Fit wall-clock times (s); this run's total: $(( $(date +%s) - t_start )) s"
  echo
  cat "$log/ota-time.txt" "$log"/fit-times-int[0-9]*.txt 2>/dev/null | sed 's/^/    /'
} > "$table"
cat "$table"
