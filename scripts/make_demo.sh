#!/usr/bin/env bash
# Reproduces models/demo from nothing: the procedural world, the base model
# trained from scratch, one LoRA adapter per task (PEFT + .lpa), Q8_0/Q4_0
# copies of the base, and the eval tables. Deterministic for a given seed,
# thread count and CPU kernel level (the trainer's matrix kernels: plain C,
# AVX2+FMA or AVX-512; LORAPLEX_TRAIN_GEMM=0|1|2 caps it).
#
# usage: scripts/make_demo.sh [STAGE...]
#   stages: world base adapters extend extend2 quantize eval   (default: all, in order;
#           adapters = shared shared2 tasks, which can also run one by one)
# environment:
#   LORAPLEX  the loraplex binary (default: build/loraplex)
#   WORK      scratch folder for the world and quantized models
#             (default: /tmp/loraplex-demo)
#   OUT       where the committed artifacts go (default: models/demo)
#   THREADS   training/eval threads (default 2; the recorded run used 2)
#   TASKS     the tasks the tasks stage trains (default: all eight)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
LP=$(realpath "${LORAPLEX:-$ROOT/build/loraplex}")
WORK=${WORK:-/tmp/loraplex-demo}
OUT=${OUT:-$ROOT/models/demo}
THREADS=${THREADS:-2}
SEED=1
# TASKS may name a subset for the adapter stages (e.g. TASKS=correct ... tasks);
# the shared warm start and the eval always use all eight
ALL_TASKS="correct style-formal style-polite style-jovial style-terse summary reply translate"
TASKS=${TASKS:-$ALL_TASKS}

mkdir -p "$WORK" "$OUT/adapters" "$OUT/logs" "$OUT/eval"
OUT=$(realpath "$OUT")
WORK=$(realpath "$WORK")

# Seconds of wall clock a command took, appended to logs/times.txt.
timed() {
    local name=$1
    shift
    local t0 t1
    t0=$(date +%s.%N)
    "$@"
    t1=$(date +%s.%N)
    awk -v n="$name" -v a="$t0" -v b="$t1" 'BEGIN { printf "%s %.1f s\n", n, b - a }' \
        >> "$OUT/logs/times.txt"
}

# The world, its vocabulary, and the first 24 eval records of each task (for
# the tests).
stage_world() {
    local t
    "$LP" world --out "$WORK/world" --seed $SEED
    cp "$WORK/world/vocab.gguf" "$OUT/vocab.gguf"
    mkdir -p "$OUT/eval/tasks"
    for t in $ALL_TASKS; do
        head -n 24 "$WORK/world/tasks/$t.eval.jsonl" > "$OUT/eval/tasks/$t.eval.jsonl"
    done
}

# The base: 0.89M parameters (dim 128, 4 layers, 4 query / 2 KV heads, FFN
# 384, tied embeddings, context 256) on pretrain.txt (1.22M tokens), 1800
# steps of 16 x 128 tokens (3 epochs).
stage_base() {
    cd "$OUT"
    timed base "$LP" train --vocab vocab.gguf --text "$WORK/world/pretrain.txt" \
        --dim 128 --layers 4 --heads 4 --kv-heads 2 --ffn 384 --ctx 256 --tied \
        --steps 1800 --batch 16 --seq 128 --lr 3e-3 --min-lr 3e-4 --warmup 100 \
        --wd 0.1 --clip 1.0 --seed $SEED --threads "$THREADS" --log-every 50 \
        --checkpoint "$WORK/base.ckpt" --checkpoint-every 200 \
        -o base.gguf 2> >(tee logs/base.log >&2)
}

# One LoRA per task on the frozen base: rank 16, alpha 32, all seven
# projections, loss on the completion (+ EOS) only, several records packed
# per 128-token row (each seeing only itself).
# The tiny base copies text poorly, and every task needs copying, so the
# adapters share a warm start: phase 1 trains one LoRA on all tasks' train
# records together (SHARED_STEPS at lr 5e-3, then a fresh schedule of
# SHARED2_STEPS at lr 8e-3 from those weights), phase 2 continues it on each
# task's own records alone (TASK_STEPS more, resuming optimizer and LR
# schedule), giving one adapter per task. The base itself is never changed.
# The correction task has ten times the train records (30,000: each
# misspelling is learnt word by word) and trains CORRECT_STEPS instead.
SHARED_STEPS=900
SHARED2_STEPS=1600
TASK_STEPS=400
CORRECT_STEPS=1200
LORA_OPTS=(--rank 16 --alpha 32 --targets q,k,v,o,gate,up,down --batch 16 --seq 128 --pack
           --wd 0 --clip 1.0 --seed $SEED --threads "$THREADS" --eval-every 0 --log-every 50)

stage_adapters() {
    stage_shared
    stage_shared2
    stage_tasks
}

# The warm start learns from 3,000 train records of each task; for the
# correction task those of the world's first version (correct.v1.train.jsonl,
# see the world's README), as when the committed adapters were made.
stage_shared() {
    cd "$OUT"
    local t f
    : > "$WORK/all.train.jsonl"
    for t in $ALL_TASKS; do
        f="$WORK/world/tasks/$t.train.jsonl"
        [ "$t" = correct ] && f="$WORK/world/tasks/correct.v1.train.jsonl"
        cat "$f" >> "$WORK/all.train.jsonl"
    done
    timed adapters-shared "$LP" train-lora --base base.gguf --data "$WORK/all.train.jsonl" \
        "${LORA_OPTS[@]}" --lr 5e-3 --min-lr 5e-4 --warmup 30 --steps $SHARED_STEPS \
        --checkpoint "$WORK/shared.ckpt" \
        -o "$WORK/shared-adapter" 2> >(tee logs/adapters-shared.log >&2)
}

stage_shared2() {
    cd "$OUT"
    timed adapters-shared2 "$LP" train-lora --base base.gguf --data "$WORK/all.train.jsonl" \
        "${LORA_OPTS[@]}" --lr 8e-3 --min-lr 8e-4 --warmup 20 --steps $SHARED2_STEPS \
        --init-from "$WORK/shared.ckpt" --checkpoint "$WORK/shared2.ckpt" \
        --checkpoint-every 400 \
        -o "$WORK/shared2-adapter" 2> >(tee logs/adapters-shared2.log >&2)
}

# Trains task $1's adapter from checkpoint $3 up to step $4 (the LR schedule's
# length), logging as logs/adapter-$2.log and timing as adapter-$2, then
# writes its PEFT directory and .lpa.
train_task() {
    local t=$1 name=$2 resume=$3 steps=$4
    timed "adapter-$name" "$LP" train-lora --base base.gguf \
        --data "$WORK/world/tasks/$t.train.jsonl" "${LORA_OPTS[@]}" \
        --resume "$resume" --steps "$steps" \
        --checkpoint "$WORK/task-$t.ckpt" \
        -o "adapters/$t" 2> >(tee "logs/adapter-$name.log" >&2)
    "$LP" adapter compile "adapters/$t" --base base.gguf -o "adapters/$t.lpa"
}

stage_tasks() {
    cd "$OUT"
    local t steps
    for t in $TASKS; do
        steps=$TASK_STEPS
        [ "$t" = correct ] && steps=$CORRECT_STEPS
        train_task "$t" "$t" "$WORK/shared2.ckpt" $((SHARED2_STEPS + steps))
    done
}

# Phase 3: the task short of 90% after phase 2 (translate, 51%) trains
# EXTRA_STEPS more from its phase-2 checkpoint (the LR schedule stretched to
# the new length). (correct was extended here too, 67% -> 67%, before its
# records were made unambiguous and ten times as many.)
EXTRA_STEPS=300
EXTEND_TASKS="translate"

stage_extend() {
    cd "$OUT"
    local t
    for t in $EXTEND_TASKS; do
        train_task "$t" "$t-extend" "$WORK/task-$t.ckpt" $((SHARED2_STEPS + TASK_STEPS + EXTRA_STEPS))
    done
}

# Phase 4: translate, still improving (85% after phase 3), EXTRA2_STEPS more.
EXTRA2_STEPS=600
EXTEND2_TASKS="translate"

stage_extend2() {
    cd "$OUT"
    local t
    for t in $EXTEND2_TASKS; do
        train_task "$t" "$t-extend2" "$WORK/task-$t.ckpt" \
            $((SHARED2_STEPS + TASK_STEPS + EXTRA_STEPS + EXTRA2_STEPS))
    done
}

stage_quantize() {
    "$LP" quantize "$OUT/base.gguf" "$WORK/base-q8_0.gguf" --type q8_0
    "$LP" quantize "$OUT/base.gguf" "$WORK/base-q4_0.gguf" --type q4_0
}

adapter_list() {
    local list="" t
    # PEFT directories: an .lpa is bound to the exact base it was compiled
    # for (fingerprint), and the same adapter must run on every base here
    for t in $ALL_TASKS; do list="$list${list:+,}$t=$OUT/adapters/$t"; done
    echo "$list"
}

# Full eval splits (300 records per task), greedy, f32 vs each quantized base;
# --base adds the base-alone rows.
stage_eval() {
    local q
    for q in q8_0 q4_0; do
        "$LP" eval-tasks -m "$OUT/base.gguf" --quantized "$WORK/base-$q.gguf" \
            --adapters "$(adapter_list)" --data "$WORK/world/tasks" --base \
            -t "$THREADS" > "$OUT/eval/f32-vs-$q.txt"
        cat "$OUT/eval/f32-vs-$q.txt"
    done
}

STAGES=${*:-world base adapters extend extend2 quantize eval}
for s in $STAGES; do
    echo "== make_demo: $s" >&2
    "stage_$s"
done
