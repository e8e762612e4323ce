#!/usr/bin/env bash
# QUAD end to end in seconds on the committed demo world: `quad profile`
# ranks two adapters by QSS and states its rule and decision, writes a
# profile and its AIMET encodings; `quad ptq` and `quad fit` (a few steps,
# on the f32 base and on a W4A8 base compiled unfused) write adapters as
# codes under it; eval-tasks runs them with the profile bound and refuses
# them without it; fit is deterministic with a seed, holds records out and
# keeps its step of least held-out loss; activation encodings are clipped by
# the calibration histograms unless --act-calib minmax; bad input fails
# clearly.
set -u
bin="$1"; work="$3/cli_quad_tmp"
root=$(cd "$(dirname "$0")/.." && pwd)
demo="$root/models/demo"
rm -rf "$work"; mkdir -p "$work"
fail=0; pass=0
ok() { pass=$((pass+1)); }
bad() { echo "FAIL: $*" >&2; fail=$((fail+1)); }
if [ ! -f "$demo/base.gguf" ]; then
  echo "cli_quad: no $demo/base.gguf; nothing to check" >&2
  exit 0
fi
A="$demo/adapters"; T="$demo/eval/tasks"

out=$("$bin" quad profile --base "$demo/base.gguf" --adapters "correct=$A/correct.lpa,translate=$A/translate.lpa" \
      --calib "$T" --calib-n 3 --seq 64 --bits 8 -t 2 -o "$work/s.lpq" --export-encodings "$work/aimet.json" \
      --threads 2 2>"$work/p.err"); rc=$?
[ $rc -eq 2 ] && ok || bad "-t is not a quad profile option (rc $rc)"
out=$("$bin" quad profile --base "$demo/base.gguf" --adapters "correct=$A/correct.lpa,translate=$A/translate.lpa" \
      --calib "$T" --calib-n 3 --seq 64 --bits 8 -o "$work/s.lpq" --export-encodings "$work/aimet.json" \
      --threads 2 2>"$work/p.err"); rc=$?
[ $rc -eq 0 ] && ok || { bad "quad profile rc $rc"; cat "$work/p.err" >&2; }
grep -Eq "^1 +(correct|translate) +[0-9.]+" <<<"$out" && ok || bad "no ranking: $out"
grep -q "^rule: anchor if the top QSS >= 1.50 x the runner-up" <<<"$out" && ok || bad "no rule: $out"
grep -Eq -- "-> (anchor (correct|translate)|fallback)" <<<"$out" && ok || bad "no decision: $out"
[ -s "$work/s.lpq" ] && ok || bad "no profile written"
grep -q '"param_encodings"' "$work/aimet.json" && grep -q '"blk.0.attn_q.lora_A"' "$work/aimet.json" &&
  grep -q '"blk.3.ffn_down.lora_t"' "$work/aimet.json" && ok || bad "AIMET encodings incomplete"
"$bin" quad profile --base "$demo/base.gguf" --adapters "correct=$A/correct.lpa,translate=$A/translate.lpa" \
  --calib "$T" --calib-n 3 --seq 64 --bits 8 --act-calib minmax -o "$work/mm.lpq" --threads 2 >/dev/null 2>"$work/mm.err" &&
  grep -q "(min / max ranges)" "$work/mm.err" && grep -q "(least-squared-error clipped ranges)" "$work/p.err" && ok ||
  bad "--act-calib minmax / the default not stated: $(cat "$work/mm.err")"
cmp -s "$work/s.lpq" "$work/mm.lpq" && bad "min/max and histogram-clipped profiles are the same file" || ok
"$bin" quad profile --base "$demo/base.gguf" --adapters "correct=$A/correct.lpa" --calib "$T" --act-calib p99 \
  -o "$work/p99.lpq" >/dev/null 2>&1; rc=$?
[ $rc -eq 2 ] && ok || bad "--act-calib p99 accepted (rc $rc)"
"$bin" quad profile --base "$demo/base.gguf" --adapters "x=$A/correct.lpa" --calib "$T" -o "$work/x.lpq" \
  --threads 2 >/dev/null 2>"$work/x.err"
grep -q "x.train.jsonl\|x.eval.jsonl" "$work/x.err" && ok || bad "missing calibration file not named: $(cat "$work/x.err")"

"$bin" quad ptq --base "$demo/base.gguf" --profile "$work/s.lpq" --adapter "$A/correct.lpa" -o "$work/c-ptq.lpa" \
  2>"$work/ptq.err" && ok || { bad "quad ptq"; cat "$work/ptq.err" >&2; }

# bench --adapter-cost: the profiled adapter and the per-group one take turns with the base
out=$("$bin" bench -m "$demo/base.gguf" --adapter-cost --adapters "$work/c-ptq.lpa,$A/correct.lpa" \
      --profile "$work/s.lpq" -p 8 -n 3 -r 1 -t 2 --json 2>"$work/cost.err"); rc=$?
if [ $rc -eq 0 ] && [ "$(printf '%s\n' "$out" | grep -c '"mode":"adapter_cost".*"added_ms":-*[0-9]')" = 3 ] &&
   printf '%s' "$out" | grep -q '"adapter":"[^"]*c-ptq.lpa"'; then ok
else bad "bench --adapter-cost: rc=$rc $out $(cat "$work/cost.err")"; fi
out=$("$bin" bench -m "$demo/base.gguf" --adapter-cost --adapters "$work/c-ptq.lpa" -p 8 -n 3 -r 1 2>"$work/cost.err"); rc=$?
[ $rc -ne 0 ] && [ -z "$out" ] && grep -q "profile" "$work/cost.err" && ok ||
  bad "bench --adapter-cost without the profile: rc=$rc $(cat "$work/cost.err")"
fit() { "$bin" quad fit --base "$demo/base.gguf" --profile "$work/s.lpq" --adapter "$A/correct.lpa" \
        --data "$T/correct.eval.jsonl" --holdout 4 --steps 2 --batch 2 --seq 64 --eval-every 2 --lr 2e-4 --seed 3 \
        --threads 2 "$@"; }
fit -o "$work/c-kd.lpa" 2>"$work/fit.err" && ok || { bad "quad fit"; cat "$work/fit.err" >&2; }
grep -q "^step 2/2 | loss" "$work/fit.err" && ok || bad "no progress line: $(cat "$work/fit.err")"
grep -q "^eval step 2: KL" "$work/fit.err" && ok || bad "no periodic eval"
grep -q "^eval step 0: .*(4 held-out records of .*correct.eval.jsonl; 20 trained on)" "$work/fit.err" && ok ||
  bad "held-out records not stated: $(grep 'eval step 0' "$work/fit.err")"
# the kept step is the one whose held-out loss is least (step 0 included)
want=$(awk '/^eval step/ { s = $3; sub(":", "", s); for (i = 1; i < NF; i++) if ($i == "loss") l = $(i + 1);
            if (best == "" || l + 0 < best + 0) { best = l; bs = s } } END { print bs }' "$work/fit.err")
grep -q "^kept step $want (lowest held-out loss" "$work/fit.err" && ok || bad "kept step is not the least-loss one ($want): $(grep kept "$work/fit.err")"
fit --select last -o "$work/c-last.lpa" 2>"$work/last.err" && ! grep -q "^kept step" "$work/last.err" && ok ||
  bad "--select last"
fit --holdout 24 -o "$work/c-ho.lpa" 2>"$work/ho.err"; rc=$?
[ $rc -ne 0 ] && grep -q "not more than --holdout 24" "$work/ho.err" && ok || bad "holding out every record was not refused"
fit -o "$work/c-kd2.lpa" 2>/dev/null
cmp -s "$work/c-kd.lpa" "$work/c-kd2.lpa" && ok || bad "quad fit is not deterministic"
"$bin" compile "$demo/base.gguf" -o "$work/q4c.lpx" --weights q4c --no-fuse >/dev/null 2>&1
fit --deploy "$work/q4c.lpx" -o "$work/c-kd-w4.lpa" 2>"$work/fitw.err" && ok || { bad "quad fit --deploy"; cat "$work/fitw.err" >&2; }
grep -q "q8 inputs" "$work/fitw.err" && ok || bad "the W4A8 student is not named"

em() { # model adapter [--profile P] -> exact match % of correct over 6 records
  "$bin" eval-tasks -m "$1" --adapters "correct=$2" --data "$T" --tasks correct --max 6 -t 2 "${@:3}" 2>/dev/null |
    awk '$1 == "correct" && $2 == "all" { print $5 }'
}
for a in c-ptq c-kd; do
  e=$(em "$demo/base.gguf" "$work/$a.lpa" --profile "$work/s.lpq")
  [ -n "$e" ] && awk -v e="$e" 'BEGIN { exit !(e >= 50) }' && ok || bad "$a exact match '$e'"
done
e=$(em "$work/q4c.lpx" "$work/c-kd-w4.lpa" --profile "$work/s.lpq")
[ -n "$e" ] && awk -v e="$e" 'BEGIN { exit !(e >= 50) }' && ok || bad "c-kd-w4 exact match '$e'"
"$bin" eval-tasks -m "$demo/base.gguf" --adapters "correct=$work/c-kd.lpa" --data "$T" --tasks correct --max 2 \
  -t 2 >/dev/null 2>"$work/np.err"
grep -q "no profile is bound" "$work/np.err" && ok || bad "a profiled adapter ran without its profile: $(cat "$work/np.err")"
"$bin" adapter info "$work/c-kd.lpa" | grep -q "^profile: " && ok || bad "adapter info does not show the profile"

"$bin" quad export --profile "$work/s.lpq" --export-encodings "$work/aimet2.json" && cmp -s "$work/aimet.json" \
  "$work/aimet2.json" && ok || bad "quad export differs from profile --export-encodings"
printf 'LPQ1garbage' > "$work/bad.lpq"
"$bin" quad export --profile "$work/bad.lpq" --export-encodings "$work/b.json" 2>"$work/bad.err"
[ $? -ne 0 ] && grep -q "bad.lpq" "$work/bad.err" && ok || bad "a malformed profile was not refused by name"

echo "cli_quad: $pass passed, $fail failed"
[ $fail -eq 0 ]
