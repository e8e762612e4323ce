#!/usr/bin/env bash
# `loraplex eval-tasks --speculate DIR` on the committed demo world: every
# record of every task (two each) decoded plain and speculatively (forecast
# files for two tasks, here random ones: acceptance near zero must still be
# exact; the other tasks prompt lookup alone; then the committed trained
# files for all eight), and the report says all
# outputs were identical (a differing output makes the command fail, and so
# this test), with tokens per pass and tok/s, in the table and in --json.
# Refusals: a damaged forecast file is named; --lookup without --speculate.
set -u
bin="$1"; work="$3/cli_eval_speculate_tmp"
root=$(cd "$(dirname "$0")/.." && pwd)
demo="$root/models/demo"
rm -rf "$work"; mkdir -p "$work/fc"
fail=0; pass=0
ok() { pass=$((pass+1)); }
bad() { echo "FAIL: $*" >&2; fail=$((fail+1)); }
[ -f "$demo/base.gguf" ] || { echo "FAIL: $demo/base.gguf missing" >&2; exit 1; }
tasks=(correct style-formal style-polite style-jovial style-terse summary reply translate)
adapters=$(for t in "${tasks[@]}"; do printf '%s=%s,' "$t" "$demo/adapters/$t.lpa"; done)
adapters=${adapters%,}
for t in correct summary; do
  "$bin" forecast-random --model "$demo/base.gguf" -k 4 --seed 7 -o "$work/fc/$t.lpf" 2>/dev/null || bad "forecast-random $t"
done
common=(-m "$demo/base.gguf" --adapters "$adapters" --data "$demo/eval/tasks" --max 2 --max-new 32 -t 1)

"$bin" eval-tasks "${common[@]}" --speculate "$work/fc" --lookup 3:8 --costed >"$work/table" 2>"$work/err"
rc=$?
[ $rc -eq 0 ] && ok || { bad "eval-tasks --speculate: rc=$rc"; cat "$work/err" >&2; }
grep -q "identical *tok/pass *plain t/s *spec t/s" "$work/table" && ok || bad "table header"
for t in "${tasks[@]}"; do
  line=$(grep "^$t  *all " "$work/table")
  echo "$line" | grep -q " 2/2  *[0-9.]*  *[0-9.]*  *[0-9.]* " && ok || bad "$t: not 2/2 identical: '$line'"
  case $t in
    correct|summary) want="forecast \[3,2\] + lookup 3:8" ;;
    *) want="lookup 3:8" ;;
  esac
  echo "$line" | grep -q "$want\$" && ok || bad "$t: speculated with: '$line'"
done

# the committed demo forecast files (models/demo/forecast, scripts/make_forecasts.sh)
if [ -f "$demo/forecast/correct.lpf" ]; then
  "$bin" eval-tasks "${common[@]}" --speculate "$demo/forecast" --lookup 3:8 >"$work/table2" 2>"$work/err"
  rc=$?
  [ $rc -eq 0 ] && [ "$(grep -c " all .* 2/2 .*forecast \[3,2\] + n-gram 8 + lookup 3:8\$" "$work/table2")" -eq ${#tasks[@]} ] && ok \
    || { bad "committed forecast files: rc=$rc"; cat "$work/table2" "$work/err" >&2; }
  # their draft corpora off: the embeddings alone
  "$bin" eval-tasks "${common[@]}" --speculate "$demo/forecast" --ngram 0 >"$work/table3" 2>"$work/err"
  rc=$?
  [ $rc -eq 0 ] && [ "$(grep -c " all .* 2/2 .*forecast \[3,2\]\$" "$work/table3")" -eq ${#tasks[@]} ] && ok \
    || { bad "--ngram 0: rc=$rc"; cat "$work/table3" "$work/err" >&2; }
else
  bad "$demo/forecast/correct.lpf missing"
fi

# lookup alone where a task has no file (no --lookup): the default 3:8
"$bin" eval-tasks "${common[@]}" --tasks reply,correct --speculate "$work/fc" --json >"$work/json" 2>"$work/err"
rc=$?
[ $rc -eq 0 ] && ok || { bad "--json: rc=$rc"; cat "$work/err" >&2; }
python3 - "$work/json" <<'PY' && ok || bad "json fields"
import json, sys
r = json.load(open(sys.argv[1]))["results"]
alls = [e for e in r if e["lang"] == "all"]
assert sorted(e["task"] for e in alls) == ["correct", "reply"], alls
for e in r:
    s = e["full"]["speculate"]
    assert s["identical"] == s["records"] == e["n"] > 0, e
    assert s["tokens"] > 0 and s["passes"] > 0 and abs(s["tokens_per_pass"] - s["tokens"] / s["passes"]) < 1e-9, e
    assert s["plain_tok_s"] > 0 and s["spec_tok_s"] > 0, e
    want = "forecast [3,2]" if e["task"] == "correct" else "lookup 3:8"
    assert s["tree"] == want, e
PY

# refusals
head -c 100 "$work/fc/correct.lpf" >"$work/short.lpf"
mkdir -p "$work/bad" && cp "$work/short.lpf" "$work/bad/correct.lpf"
out=$("$bin" eval-tasks "${common[@]}" --tasks correct --speculate "$work/bad" 2>"$work/err"); rc=$?
[ $rc -ne 0 ] && [ -z "$out" ] && grep -q "bad/correct.lpf" "$work/err" && ok || { bad "damaged file: rc=$rc"; cat "$work/err" >&2; }
"$bin" eval-tasks "${common[@]}" --lookup 3 >/dev/null 2>"$work/err"; rc=$?
[ $rc -eq 2 ] && grep -q "need --speculate" "$work/err" && ok || bad "--lookup without --speculate: rc=$rc"

echo "cli_eval_speculate: $pass passed, $fail failed"
[ $fail -eq 0 ]
