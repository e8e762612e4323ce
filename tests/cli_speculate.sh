#!/usr/bin/env bash
# `loraplex run --speculate` end to end: forecast-random writes an .lpf;
# greedy speculative output (random forecasts, prompt lookup, both; with and
# without an adapter; stop strings; JSON text lines; --streams with one file
# or one per stream's adapter; a KV prefix) is byte for byte the
# plain output, greedy and sampled (for a seed); -v and --json report the
# speculation; bad files are refused naming the file; train-forecast (smoke)
# writes files that speculate exactly as well; bench --speculate on the demo
# world checks every output against plain decoding and reports per tree.
set -u
bin="$1"; models="$2"; work="$3/cli_speculate_tmp"
mkdir -p "$work"
fail=0; pass=0
ok() { pass=$((pass+1)); }
bad() { echo "FAIL: $*" >&2; fail=$((fail+1)); }
m="$models/stories260K.gguf"; lora="$models/stories260K-lora-r4-random-f32.gguf"

"$bin" forecast-random --model "$m" -k 4 --seed 3 -o "$work/r.lpf" 2>"$work/err" && [ -s "$work/r.lpf" ] && ok \
  || { bad "forecast-random"; cat "$work/err" >&2; }

prompts=("Once upon a time" "Tom and his dog went to the park. Tom and his dog" "One day")
specs=("--speculate $work/r.lpf" "--speculate $work/r.lpf --tree 1,1,1,1" "--lookup 3" "--speculate $work/r.lpf --lookup 2:6")
for p in "${prompts[@]}"; do
  for extra in "" "--adapter $lora" "--stop park"; do
    # shellcheck disable=SC2086
    "$bin" run -m "$m" -p "$p" -n 70 --temp 0 -t 1 $extra >"$work/plain" 2>/dev/null
    for s in "${specs[@]}"; do
      # shellcheck disable=SC2086
      "$bin" run -m "$m" -p "$p" -n 70 --temp 0 -t 1 $extra $s >"$work/spec" 2>"$work/err"
      cmp -s "$work/plain" "$work/spec" && ok || { bad "'$p' $extra $s: output differs"; diff "$work/plain" "$work/spec" >&2; }
    done
  done
done

# --streams: each stream runs its own tree in the same batch; one file for
# all streams, or one per stream bound to its adapter's slot (--adapters);
# the output is the plain streams' output, greedy and sampled
"$bin" forecast-random --model "$m" -k 3 --seed 4 -o "$work/r3.lpf" 2>/dev/null
sfx='--suffixes " Tom|One day| The sun"'
for extra in "--temp 0" "--temp 0.8 --seed 9"; do
  for s in "--speculate $work/r.lpf --lookup 2" "--adapters $lora,$lora:0.5,$lora:0 --speculate $work/r.lpf,$work/r3.lpf,$work/r.lpf"; do
    base="-m $m -p \"Once upon a time\" -n 50 -t 1 --streams 3 $sfx $extra --json"
    ad=""; case "$s" in --adapters*) ad="${s%% --speculate*}";; esac
    eval "\"\$bin\" run $base $ad" >"$work/plain" 2>/dev/null
    eval "\"\$bin\" run $base $s -v" >"$work/spec" 2>"$work/err"
    same=1  # streams interleave differently: compare each stream's lines
    for i in 0 1 2; do
      cmp -s <(grep "\"stream\":$i,\"text\"" "$work/plain") <(grep "\"stream\":$i,\"text\"" "$work/spec") || same=0
    done
    [ "$(grep -c '"text"' "$work/plain")" -gt 10 ] && [ $same -eq 1 ] && [ "$(grep -c '"speculate":{' "$work/spec")" -eq 3 ] && grep -q "stream 2: speculative (forecast \[3,2\]" "$work/err" \
      && ok || { bad "streams $extra $s: output differs"; diff "$work/plain" "$work/spec" >&2; cat "$work/err" >&2; }
  done
done
out=$("$bin" run -m "$m" -p "x" -n 5 --streams 2 --speculate "$work/r.lpf,$work/r3.lpf" 2>"$work/err"); rc=$?
[ $rc -eq 2 ] && grep -q "one file per stream" "$work/err" && ok || bad "--speculate F1,F2 without --adapters: rc=$rc"

# JSON: the same text lines; the done line carries the speculation report
"$bin" run -m "$m" -p "Once upon a time" -n 40 --temp 0 -t 1 --json >"$work/pj" 2>/dev/null
"$bin" run -m "$m" -p "Once upon a time" -n 40 --temp 0 -t 1 --json --speculate "$work/r.lpf" --lookup 3 >"$work/sj" 2>/dev/null
cmp -s <(grep '"text"' "$work/pj") <(grep '"text"' "$work/sj") && ok || bad "json text lines differ"
grep -q '"done":true,"tokens":40,"stop":"length","speculate":{"forward_passes":[0-9]*,"decode_passes":[0-9]*,"tokens_per_pass":[0-9.]*' "$work/sj" \
  && grep -q '"tree":"forecast \[3,2\] + lookup 3:8"' "$work/sj" && ok || { bad "json report"; tail -1 "$work/sj" >&2; }

# -v: tokens, passes, tokens per pass, tree
"$bin" run -m "$m" -p "Once upon a time" -n 40 --temp 0 -t 1 -v --speculate "$work/r.lpf" >/dev/null 2>"$work/err"
grep -q 'speculative (forecast \[3,2\]): 40 tokens in [0-9]* passes that produced tokens ([0-9.]* tokens per pass)' "$work/err" \
  && ok || { bad "-v report"; cat "$work/err" >&2; }

# sampling speculates too: for a seed, the plain sampler's output exactly
# (different seeds must differ, or the comparison proves nothing)
for seed in 5 6 7; do
  a=$("$bin" run -m "$m" -p "One day" -n 60 --temp 0.8 --seed $seed -t 1 2>/dev/null)
  b=$("$bin" run -m "$m" -p "One day" -n 60 --temp 0.8 --seed $seed -t 1 -v --speculate "$work/r.lpf" --lookup 3 \
      2>"$work/err")
  [ -n "$a" ] && [ "$a" = "$b" ] && grep -q "speculative (forecast" "$work/err" && ok || bad "sampled, seed $seed"
  eval "s$seed=\$a"
done
[ "$s5" != "$s6" ] && [ "$s6" != "$s7" ] && ok || bad "three seeds gave the same sampled text"

# a KV prefix (random; trained below) that forecast rows alone attend to:
# still the plain output, greedy and sampled
"$bin" forecast-random --model "$m" -k 3 --prefix 6 --seed 8 -o "$work/p.lpf" 2>/dev/null && [ -s "$work/p.lpf" ] && ok \
  || bad "forecast-random --prefix"
for extra in "--temp 0" "--temp 0.8 --seed 3"; do
  # shellcheck disable=SC2086
  "$bin" run -m "$m" -p "Tom and his dog" -n 60 -t 1 $extra >"$work/plain" 2>/dev/null
  # shellcheck disable=SC2086
  "$bin" run -m "$m" -p "Tom and his dog" -n 60 -t 1 $extra --speculate "$work/p.lpf" --tree 2,2,1 >"$work/spec" 2>/dev/null
  [ -s "$work/plain" ] && cmp -s "$work/plain" "$work/spec" && ok || bad "KV prefix $extra: output differs"
done

# refusals: a damaged file, a file for another width, a bad tree
head -c 100 "$work/r.lpf" >"$work/short.lpf"
out=$("$bin" run -m "$m" -p "x" -n 5 --temp 0 --speculate "$work/short.lpf" 2>"$work/err"); rc=$?
[ $rc -ne 0 ] && [ -z "$out" ] && grep -q "short.lpf" "$work/err" && ok || { bad "damaged file: rc=$rc"; cat "$work/err" >&2; }
"$bin" synth --preset tiny -o "$work/tiny.gguf" >/dev/null 2>&1
if [ -s "$work/tiny.gguf" ]; then
  "$bin" forecast-random --model "$work/tiny.gguf" -k 2 -o "$work/tiny.lpf" 2>/dev/null
  out=$("$bin" run -m "$m" -p "x" -n 5 --temp 0 --speculate "$work/tiny.lpf" 2>"$work/err"); rc=$?
  [ $rc -ne 0 ] && grep -q "tiny.lpf" "$work/err" && ok || { bad "other model's file: rc=$rc"; cat "$work/err" >&2; }
fi
out=$("$bin" run -m "$m" -p "x" -n 5 --temp 0 --speculate "$work/r.lpf" --tree 3,x 2>"$work/err"); rc=$?
[ $rc -eq 2 ] && ok || bad "bad --tree accepted: rc=$rc"

# train-forecast smoke test: self-distillation writes a valid file whose
# speculation again prints exactly the plain output
printf '%s\n' '{"prompt":"Once upon a time"}' '{"prompt":"One day"}' '{"prompt":"Tom and his dog"}' \
  '{"prompt":"Lily wanted to"}' '{"prompt":"The sun was"}' '{"prompt":"Mom said"}' >"$work/prompts.jsonl"
"$bin" train-forecast --base "$m" --data "$work/prompts.jsonl" -k 3 --steps 12 --batch 4 --continue 24 \
  --eval 2 -t 1 -o "$work/t.lpf" 2>"$work/err" && [ -s "$work/t.lpf" ] \
  && grep -q "held-out tokens per pass" "$work/err" && ok || { bad "train-forecast"; cat "$work/err" >&2; }
"$bin" run -m "$m" -p "Lily wanted to" -n 60 --temp 0 -t 1 >"$work/plain" 2>/dev/null
"$bin" run -m "$m" -p "Lily wanted to" -n 60 --temp 0 -t 1 --speculate "$work/t.lpf" >"$work/spec" 2>/dev/null
cmp -s "$work/plain" "$work/spec" && ok || bad "trained forecast: output differs"
# resume: 5 steps, stop, continue from the checkpoint: the same file as 12
# steps in one run; a checkpoint of another k is refused
ta="--base $m --data $work/prompts.jsonl -k 3 --steps 12 --batch 4 --continue 24 --eval 2 -t 1"
# shellcheck disable=SC2086
"$bin" train-forecast $ta --checkpoint "$work/f.ckpt" --stop-after 5 -o "$work/part.lpf" 2>"$work/err" \
  && grep -q "stopped after step 5 of 12" "$work/err" && [ -s "$work/f.ckpt" ] && [ -s "$work/part.lpf" ] \
  && "$bin" train-forecast $ta --resume "$work/f.ckpt" -o "$work/resumed.lpf" 2>"$work/err" \
  && grep -q "resumed .* at step 5" "$work/err" && cmp -s "$work/t.lpf" "$work/resumed.lpf" \
  && ! cmp -s "$work/t.lpf" "$work/part.lpf" && ok || { bad "train-forecast --resume"; cat "$work/err" >&2; }
"$bin" train-forecast --base "$m" --data "$work/prompts.jsonl" -k 2 --steps 12 --resume "$work/f.ckpt" \
  -o "$work/x.lpf" 2>"$work/err"; rc=$?
[ $rc -ne 0 ] && grep -q "not a forecast checkpoint" "$work/err" && ok || bad "other k's checkpoint: rc=$rc"
"$bin" train-forecast --base "$m" --data "$work/prompts.jsonl" -k 3 --stop-after 2 -o "$work/x.lpf" 2>"$work/err"
rc=$?; [ $rc -eq 2 ] && ok || bad "--stop-after without --checkpoint: rc=$rc"

# --prefix: a learned KV prefix, stored (version 4), lossless
"$bin" train-forecast --base "$m" --data "$work/prompts.jsonl" -k 2 --prefix 4 --steps 6 --batch 2 --continue 24 \
  --eval 2 -t 1 -o "$work/tp.lpf" 2>"$work/err" && grep -q "KV prefix 4" "$work/err" \
  && [ "$(od -An -tu4 -j4 -N4 "$work/tp.lpf" | tr -d ' ')" = 4 ] && ok || { bad "train-forecast --prefix"; cat "$work/err" >&2; }
"$bin" run -m "$m" -p "Lily wanted to" -n 60 --temp 0 -t 1 >"$work/plain" 2>/dev/null
"$bin" run -m "$m" -p "Lily wanted to" -n 60 --temp 0 -t 1 --speculate "$work/tp.lpf" >"$work/spec" 2>/dev/null
cmp -s "$work/plain" "$work/spec" && ok || bad "trained KV prefix: output differs"
"$bin" train-forecast --base "$m" --data "$work/prompts.jsonl" -k 2 --prefix 65 -o "$work/x.lpf" 2>"$work/err"
rc=$?; [ $rc -eq 2 ] && ok || bad "--prefix 65 accepted: rc=$rc"
# the size limit holds the embeddings and the prefix whole
"$bin" train-forecast --base "$m" --data "$work/prompts.jsonl" -k 2 --prefix 8 --max-size 2000 -o "$work/x.lpf" \
  2>"$work/err"; rc=$?
[ $rc -ne 0 ] && grep -q "over the file size limit" "$work/err" && [ ! -e "$work/x.lpf" ] && ok \
  || { bad "--prefix over --max-size: rc=$rc"; cat "$work/err" >&2; }

# --max-size: the draft corpus keeps the first outputs that fit the limit
"$bin" train-forecast --base "$m" --data "$work/prompts.jsonl" -k 3 --steps 2 --batch 2 --continue 24 \
  --eval 0 -t 1 --max-size 900 -o "$work/small.lpf" 2>"$work/err" && [ -s "$work/small.lpf" ] \
  && [ "$(stat -c %s "$work/small.lpf")" -le 900 ] && grep -q "kept [1-3] of 6 outputs" "$work/err" \
  && ok || { bad "train-forecast --max-size"; cat "$work/err" >&2; }
for v in -1 5x 10%; do
  "$bin" train-forecast --base "$m" --data "$work/prompts.jsonl" -k 2 --max-size "$v" -o "$work/x.lpf" 2>"$work/err"
  rc=$?; [ $rc -eq 2 ] && grep -q "max-size" "$work/err" && ok || bad "--max-size $v: rc=$rc"
done
"$bin" train-forecast --base "$m" --data "$work/prompts.jsonl" --adapter "$lora" -k 2 --steps 4 --batch 2 \
  --continue 16 -t 1 -o "$work/ta.lpf" 2>"$work/err" && ok || { bad "train-forecast --adapter"; cat "$work/err" >&2; }
"$bin" run -m "$m" --adapter "$lora" -p "One day" -n 50 --temp 0 -t 1 >"$work/plain" 2>/dev/null
"$bin" run -m "$m" --adapter "$lora" -p "One day" -n 50 --temp 0 -t 1 --speculate "$work/ta.lpf" --lookup 2 >"$work/spec" 2>/dev/null
cmp -s "$work/plain" "$work/spec" && ok || bad "adapter-trained forecast: output differs"
echo '{"text":"no prompt"}' >"$work/bad.jsonl"
"$bin" train-forecast --base "$m" --data "$work/bad.jsonl" -k 2 -o "$work/x.lpf" 2>"$work/err"; rc=$?
[ $rc -ne 0 ] && grep -q "bad.jsonl:1" "$work/err" && ok || bad "bad prompts file: rc=$rc"

# bench --speculate on two demo tasks: a forecast set for one (DIR/<task>.lpf),
# lookup only for the other; every output identical to plain decoding
demo="$(dirname "$0")/../models/demo"
mkdir -p "$work/fc"
"$bin" forecast-random --model "$demo/base.gguf" -k 2 --seed 1 -o "$work/fc/correct.lpf" 2>/dev/null
"$bin" bench --speculate "$work/fc" -m "$demo/base.gguf" --data "$demo/eval/tasks" --records 3 -n 24 \
  --trees "2;2,1" --adapters correct="$demo/adapters/correct.lpa",reply="$demo/adapters/reply.lpa" \
  >"$work/bench" 2>"$work/err"; rc=$?
[ $rc -eq 0 ] && [ "$(grep -c ' 3/3 ' "$work/bench")" -eq 12 ] && grep -q "chosen" "$work/bench" \
  && grep -q "reply (3 prompts, no forecast set" "$work/bench" && grep -q "^  \[2,1\]+lookup" "$work/bench" \
  && grep -q "cost of one forward" "$work/bench" && ok || { bad "bench --speculate rc=$rc"; cat "$work/bench" "$work/err" >&2; }
"$bin" bench --speculate "$work/fc" -m "$demo/base.gguf" --data "$demo/eval/tasks" --records 2 -n 16 --json \
  --trees 2 --adapters correct="$demo/adapters/correct.lpa" >"$work/bj" 2>/dev/null \
  && [ "$(grep -c '"identical": 2, "records": 2' "$work/bj")" -eq 6 ] && ok || { bad "bench --speculate --json"; cat "$work/bj" >&2; }
"$bin" bench --speculate none -m "$demo/base.gguf" --data "$work/nowhere" 2>"$work/err"; rc=$?
[ $rc -ne 0 ] && grep -q "nowhere/base.eval.jsonl" "$work/err" && ok || bad "bench --speculate, missing data: rc=$rc"

rm -rf "$work"
echo "cli_speculate: $pass passed, $fail failed"
[ $fail -eq 0 ]
