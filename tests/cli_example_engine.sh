#!/usr/bin/env bash
# examples/engine.c end to end: every request reports its stats, the
# cancelled one says so, the repeated prompt is served from the prefix
# cache, and the greedy base request's text equals `loraplex run --temp 0`
# with the same prompt and token count.
set -u
bin="$1"; models="$2"; build="$3"; work="$build/cli_example_engine_tmp"
mkdir -p "$work"
fail=0; pass=0
ok() { pass=$((pass+1)); }
bad() { echo "FAIL: $*" >&2; fail=$((fail+1)); }

out=$("$build/example_engine" "$models/stories260K.gguf" \
      "$models/stories260K-lora-r4-random-f32.gguf" 2>"$work/err"); rc=$?
[ $rc -eq 0 ] && ok || bad "example_engine rc=$rc: $(cat "$work/err")"
for id in 0 1 2 3 4; do
  echo "$out" | grep -q "^\[$id\] stats: stop=" && ok || bad "no stats line for request $id"
done
echo "$out" | grep -q "^\[3\] stats: stop=cancelled " && ok || bad "request 3 not cancelled"
reused=$(echo "$out" | sed -n 's/^\[4\] stats: .* reused=\([0-9]*\) .*/\1/p')
[ -n "$reused" ] && [ "$reused" -gt 0 ] && ok || bad "request 4 reused '$reused'"
echo "$out" | grep -q "^step 1: 4 running" && ok || bad "no per-step lines"

# request 0: "Once upon a time", 40 tokens, greedy, base model (no adapter)
line=$(echo "$out" | grep "^\[0\] Once upon a time")
text="${line#"[0] Once upon a time"}"
cli=$("$bin" run -m "$models/stories260K.gguf" -p "Once upon a time" -n 40 --temp 0 2>"$work/err")
cli="${cli%$'\n'}"; cli="${cli//$'\n'/\\n}"   # the example writes newlines as \n
if [ -n "$line" ] && [ ${#text} -gt 20 ] && [ "$text" = "$cli" ]; then ok
else bad "greedy request text '$text' vs cli '$cli' $(cat "$work/err")"; fi
# the repeat of request 0 gives the same text
line4=$(echo "$out" | grep "^\[4\] Once upon a time")
[ -n "$line4" ] && [ "${line4#"[4]"}" = "${line#"[0]"}" ] && ok || bad "repeat differs: '$line4'"

echo "cli_example_engine: $pass passed, $fail failed"
[ $fail -eq 0 ]
