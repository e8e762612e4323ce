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

# the three tiny real-vocabulary models load and generate; chat templates apply
for m in llama3-tiny-random qwen2-tiny-random mistral-spm-tiny-random; do
  out=$("$bin" run -m "$models/arch/$m.gguf" -p "Hello" -n 8 --temp 0 2>"$work/err"); rc=$?
  [ $rc -eq 0 ] && [ -n "$out" ] && ok || bad "$m: rc=$rc $(cat "$work/err")"
  out=$("$bin" run -m "$models/arch/$m.gguf" -p "Hello" -n 4 --chat --seed 3 2>"$work/err"); rc=$?
  [ $rc -eq 0 ] && ok || bad "$m --chat: rc=$rc $(cat "$work/err")"
done

# synth writes each architecture; the result loads and runs
for arch in llama qwen2 qwen3; do
  "$bin" synth --arch $arch --dim 128 --layers 2 --heads 4 --kv-heads 2 --ffn 256 --type q8_0 \
    --vocab none -o "$work/$arch.gguf" 2>"$work/err" || bad "synth $arch: $(cat "$work/err")"
  out=$("$bin" run -m "$work/$arch.gguf" -p "abc" -n 8 --temp 0 2>"$work/err"); rc=$?
  [ $rc -eq 0 ] && ok || bad "run synth $arch: $(cat "$work/err")"
  "$bin" info "$work/$arch.gguf" | grep -q "architecture:  $arch" && ok || bad "info synth $arch"
done

# adapters: the GGUF LoRA at run time gives the merged model's greedy text
a=$("$bin" run -m "$models/stories260K.gguf" --adapter "$models/stories260K-lora-r4-random-f32.gguf" -p "Once upon a time" -n 40 --temp 0 2>"$work/err")
b=$("$bin" run -m "$models/stories260K-lora-r4-merged.gguf" -p "Once upon a time" -n 40 --temp 0 2>/dev/null)
[ -n "$a" ] && [ "$a" = "$b" ] && ok || bad "--adapter vs merged: '$a' vs '$b' $(cat "$work/err")"
"$bin" adapter compile "$models/stories260K-lora-r4-random-f32.gguf" --base "$models/stories260K.gguf" -o "$work/a.lpa" 2>"$work/err" && ok || bad "adapter compile: $(cat "$work/err")"
c=$("$bin" run -m "$models/stories260K.gguf" --adapter "$work/a.lpa" -p "Once upon a time" -n 40 --temp 0 2>/dev/null)
[ "$c" = "$b" ] && ok || bad ".lpa run differs: '$c'"
"$bin" adapter merge --base "$models/stories260K.gguf" --adapter "$work/a.lpa" -o "$work/merged.gguf" 2>"$work/err" && ok || bad "adapter merge: $(cat "$work/err")"
d=$("$bin" run -m "$work/merged.gguf" -p "Once upon a time" -n 40 --temp 0 2>/dev/null)
[ "$d" = "$b" ] && ok || bad "our merge differs: '$d'"
"$bin" adapter info "$work/a.lpa" | grep -qi "rank" && ok || bad "adapter info"
# a merge of the demo base (its byte-level BPE vocabulary names the GPT-2
# pre-tokenizer "gpt2") writes llama.cpp's name "gpt-2", and decodes as the
# base with the adapter
demo="$(dirname "$0")/../models/demo"
p=$'fix: In the evening the girl will make the the black apple.\n'
"$bin" adapter merge --base "$demo/base.gguf" --adapter "$demo/adapters/correct.lpa" -o "$work/dm.gguf" 2>"$work/err" \
  && grep -aq "gpt-2" "$work/dm.gguf" && grep -aq "gpt2" "$demo/base.gguf" && ok || bad "demo merge: $(cat "$work/err")"
e=$("$bin" run -m "$demo/base.gguf" --adapter "$demo/adapters/correct.lpa" -p "$p" -n 20 --temp 0 2>/dev/null)
f=$("$bin" run -m "$work/dm.gguf" -p "$p" -n 20 --temp 0 2>/dev/null)
[ -n "$e" ] && [ "$e" = "$f" ] && ok || bad "demo merge decodes '$f', the adapter '$e'"

# concurrent streams: JSON lines, one done record per stream; stream 0 of a
# greedy seed-top run is the plain greedy continuation
out=$("$bin" run -m "$models/stories260K.gguf" -p "Once upon a time" -n 20 --temp 0 --streams 4 --seed-top --json 2>"$work/err")
[ "$(echo "$out" | grep -c '"done":true')" = 4 ] && ok || bad "--streams --json: $out $(cat "$work/err")"
out=$("$bin" run -m "$models/stories260K.gguf" -p "Once upon a time" -n 20 --temp 0 --streams 3 --seed-top 2>/dev/null)
echo "$out" | grep -q "=== stream 2 ===" && ok || bad "--streams text: $out"
one=$("$bin" run -m "$models/stories260K.gguf" -p "Once upon a time" -n 20 --temp 0 2>/dev/null)
s0=$(echo "$out" | sed -n '/=== stream 0 ===/{n;p}')
[ "$s0" = "$one" ] && ok || bad "stream 0 '$s0' vs plain '$one'"
out=$("$bin" run -m "$models/stories260K.gguf" -p "Once upon a time" -n 20 --temp 0 --streams 2 \
  --adapters "$work/a.lpa,$work/a.lpa:0.5" --suffixes " there|, the" 2>"$work/err")
echo "$out" | grep -q "=== stream 1 (adapter" && ok || bad "--adapters/--suffixes: $out $(cat "$work/err")"

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
