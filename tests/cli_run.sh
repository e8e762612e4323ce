#!/usr/bin/env bash
# The command-line tool end to end: greedy stories260K output equals the
# reference text for both file forms; info and tokenize work; errors go to
# stderr with a non-zero exit and nothing on stdout.
set -u
bin="$1"; models="$2"; work="$3/cli_run_tmp"
mkdir -p "$work"
fail=0; pass=0
ok() { pass=$((pass+1)); }
bad() { echo "FAIL: $*" >&2; fail=$((fail+1)); }

reference=$(sed -n '/^```$/,/^```$/p' "$models/REFERENCE.md" | sed '1d;$d')

for form in gguf bin; do
  if [ "$form" = gguf ]; then args=(-m "$models/stories260K.gguf")
  else args=(-m "$models/stories260K.bin" --tokenizer "$models/tok512.bin"); fi
  out=$("$bin" run "${args[@]}" -p "Once upon a time" -n 60 --temp 0 2>"$work/err")
  rc=$?
  text="Once upon a time$out"
  # the output is a prefix of the reference (plus the trailing newline we print)
  text="${text%$'\n'}"
  if [ $rc -eq 0 ] && [ ${#text} -gt 150 ] && [ "${reference:0:${#text}}" = "$text" ]; then ok
  else bad "run $form: rc=$rc output: $text"; cat "$work/err" >&2; fi
done

# --echo prints the prompt too; stop strings cut the output
out=$("$bin" run -m "$models/stories260K.gguf" -p "Once upon a time" -n 60 --temp 0 --stop "Lily" 2>/dev/null)
[ "$out" = ", there was a little girl named " ] && ok || bad "stop string: '$out'"

out=$("$bin" info "$models/stories260K.gguf" 2>&1)
echo "$out" | grep -q "architecture:  llama" && echo "$out" | grep -q "layers:        5" && ok || bad "info: $out"

out=$("$bin" tokenize "$models/stories260K.gguf" "Once upon a time" --ids 2>/dev/null)
[ -n "$out" ] && [ "${out%% *}" = "1" ] && ok || bad "tokenize: '$out'"

# failures: message on stderr, nothing on stdout, non-zero exit
out=$("$bin" run -m "$work/missing.gguf" -p hi 2>"$work/err"); rc=$?
[ $rc -ne 0 ] && [ -z "$out" ] && grep -q "missing.gguf" "$work/err" && ok || bad "missing model: rc=$rc"
head -c 100 "$models/stories260K.gguf" > "$work/trunc.gguf"
out=$("$bin" run -m "$work/trunc.gguf" -p hi 2>"$work/err"); rc=$?
[ $rc -ne 0 ] && [ -z "$out" ] && grep -q "trunc.gguf" "$work/err" && ok || bad "truncated model: rc=$rc $(cat "$work/err")"
out=$("$bin" run -m "$models/stories260K.gguf" -p hi --temp -1 2>"$work/err"); rc=$?
[ $rc -ne 0 ] && [ -z "$out" ] && ok || bad "bad option accepted"

echo "cli_run: $pass passed, $fail failed"
[ $fail -eq 0 ]
