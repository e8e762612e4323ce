#!/usr/bin/env bash
# Trains one forecast file per demo task (issue 21, docs/speculate.md):
#   models/demo/forecast/<task>.lpf  by `loraplex train-forecast`
# self-distillation (no labels): prompts from the train split of the demo's
# world (`loraplex world`, version 1, seed 1, as scripts/make_demo.sh), the
# task's adapter, k 4, 200 steps, one thread (~30 s a task on 2 cores).
# Then scores them: `eval-tasks --speculate ... --lookup 3:8 --costed`.
#
#   scripts/make_forecasts.sh [TASK ...]       (default: all eight tasks)
# environment:
#   LORAPLEX  the binary (default build/loraplex)
#   DEMO      the model folder (default models/demo: base.gguf, adapters/<task>.lpa)
#   WORLD     a world folder to take prompts from (default: written into WORK)
#   WORLD_ARGS  arguments of `loraplex world` (default "--seed 1"; e.g.
#             "--version 2" for the second world, with DEMO=models/demo-v2)
#   WORK      scratch folder (default /tmp/loraplex-forecast)
#   PROMPTS   prompts per task (default 1000: the first of the train split;
#             train-forecast holds out the last 16 to measure tokens per pass)
#   PREFIX    entries of a learned KV prefix (default 0: none; with the draft
#             corpus it measured no gain, docs/speculate.md)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
LP=$(realpath "${LORAPLEX:-$ROOT/build/loraplex}")
DEMO=$(realpath "${DEMO:-$ROOT/models/demo}")
WORK=${WORK:-/tmp/loraplex-forecast}
WORLD_ARGS=${WORLD_ARGS:---seed 1}
PROMPTS=${PROMPTS:-1000}
PREFIX=${PREFIX:-0}
SEED=1
K=4
STEPS=200
mkdir -p "$WORK" "$DEMO/forecast" "$DEMO/logs"
WORK=$(realpath "$WORK")

if [ -z "${WORLD:-}" ]; then
    WORLD="$WORK/world"
    # shellcheck disable=SC2086
    [ -f "$WORLD/tasks/correct.train.jsonl" ] || "$LP" world --out "$WORLD" $WORLD_ARGS
fi

tasks=("$@")
if [ ${#tasks[@]} -eq 0 ]; then
    tasks=()
    for a in "$DEMO"/adapters/*.lpa; do tasks+=("$(basename "$a" .lpa)"); done
fi

for t in "${tasks[@]}"; do
    head -n "$PROMPTS" "$WORLD/tasks/$t.train.jsonl" >"$WORK/$t.prompts.jsonl"
    "$LP" train-forecast --base "$DEMO/base.gguf" --adapter "$DEMO/adapters/$t.lpa" \
        --data "$WORK/$t.prompts.jsonl" -k $K --prefix "$PREFIX" --steps $STEPS --eval 16 --tree 3,2 \
        -s $SEED -t 1 -o "$DEMO/forecast/$t.lpf" 2>&1 | tee "$DEMO/logs/forecast-$t.log"
done

adapters=$(for a in "$DEMO"/adapters/*.lpa; do printf '%s=%s,' "$(basename "$a" .lpa)" "$a"; done)
"$LP" eval-tasks -m "$DEMO/base.gguf" --adapters "${adapters%,}" --data "$DEMO/eval/tasks" \
    --speculate "$DEMO/forecast" --lookup 3:8 --costed -t 1 | tee "$DEMO/logs/forecast-eval.txt"
