#!/usr/bin/env bash
# bench and eval end to end on the tiny model: JSON lines with the required
# keys, KL 0 against itself, KL > 0 against a different model, the streams
# mode and its chart, and clear errors for bad input.
set -u
bin="$1"; models="$2"; work="$3/cli_tools_tmp"
mkdir -p "$work"
fail=0; pass=0
ok() { pass=$((pass+1)); }
bad() { echo "FAIL: $*" >&2; fail=$((fail+1)); }
m="$models/stories260K.gguf"

# bench: one JSON object per thread count with every required key
out=$("$bin" bench -m "$m" -p 16 -n 8 -t 1 -r 1 --bw-mib 16 --json 2>"$work/err"); rc=$?
lines=$(printf '%s\n' "$out" | grep -c '^{.*}$')
if [ $rc -eq 0 ] && [ "$lines" = 1 ]; then ok; else bad "bench json: rc=$rc $out $(cat "$work/err")"; fi
for key in threads prefill_tok_s decode_tok_s model_bytes weight_bytes_per_token load_ms \
           peak_rss_bytes machine_read_GBps decode_tok_s_min decode_tok_s_max \
           roofline_fraction roofline_fraction_min roofline_fraction_max; do
  printf '%s\n' "$out" | grep -q "\"$key\":[0-9]" && ok || bad "bench json lacks $key: $out"
done
# each repetition's decode is paired with a read test, so the fraction is set
printf '%s\n' "$out" | grep -q '"roofline_fraction":0[,}]' && bad "bench roofline not measured: $out" || ok
printf '%s\n' "$out" | grep -q '"threads":1,' && ok || bad "bench threads: $out"
out=$("$bin" bench -m "$m" -p 8 -n 4 -t 1,2 -r 2 --bw-mib 16 --json 2>/dev/null)
[ "$(printf '%s\n' "$out" | grep -c '"threads":')" = 2 ] && ok || bad "two thread counts: $out"
out=$("$bin" bench -m "$m" -p 8 -n 4 -t 1 -r 1 --bw-mib 0 2>/dev/null)
printf '%s\n' "$out" | grep -q "decode tok/s" && ok || bad "bench table: $out"

# eval: the model against itself gives KL 0 and the same top token everywhere
text="$work/text.txt"
sed -n '/^```$/,/^```$/p' "$models/REFERENCE.md" | sed '1d;$d' > "$text"
out=$("$bin" eval -m "$m" --ref "$m" -f "$text" -c 32 --json 2>"$work/err"); rc=$?
if [ $rc -eq 0 ] && printf '%s' "$out" | grep -q '"kl_mean":0,' &&
   printf '%s' "$out" | grep -q '"same_top_pct":100.0000'; then ok
else bad "eval self: rc=$rc $out $(cat "$work/err")"; fi
out=$("$bin" eval -m "$m" --ref "$m" -f "$text" -c 32 2>/dev/null)
printf '%s\n' "$out" | grep -q "KL(ref || model) : mean 0.000000" && ok || bad "eval table: $out"
# ... and against the merged LoRA model KL > 0
out=$("$bin" eval -m "$models/stories260K-lora-r4-merged.gguf" --ref "$m" -f "$text" -c 32 --json 2>"$work/err"); rc=$?
kl=$(printf '%s' "$out" | sed -n 's/.*"kl_mean":\([0-9.e+-]*\),.*/\1/p')
if [ $rc -eq 0 ] && [ -n "$kl" ] && awk "BEGIN{exit !($kl > 0.001)}"; then ok
else bad "eval merged: rc=$rc kl='$kl' $out $(cat "$work/err")"; fi
# --no-repack / --ref-no-repack: a Q4_0 file on its stored values (float
# kernels) matches itself exactly, and differs from its repacked integer load
"$bin" quantize "$m" "$work/s-q4_0.gguf" --type q4_0 >/dev/null 2>"$work/err" || bad "quantize q4_0: $(cat "$work/err")"
out=$("$bin" eval -m "$work/s-q4_0.gguf" --no-repack --ref "$work/s-q4_0.gguf" --ref-no-repack -f "$text" -c 32 --json 2>"$work/err")
printf '%s' "$out" | grep -q '"kl_mean":0,' && ok || bad "eval no-repack both sides: $out $(cat "$work/err")"
out=$("$bin" eval -m "$work/s-q4_0.gguf" --ref "$work/s-q4_0.gguf" --ref-no-repack -f "$text" -c 32 --json 2>"$work/err")
kl=$(printf '%s' "$out" | sed -n 's/.*"kl_mean":\([0-9.e+-]*\),.*/\1/p')
if [ -n "$kl" ] && awk "BEGIN{exit !($kl > 0 && $kl < 0.05)}"; then ok
else bad "eval repacked vs stored: kl='$kl' $out $(cat "$work/err")"; fi
# perplexity only
out=$("$bin" eval -m "$m" -f "$text" -c 32 2>/dev/null)
printf '%s\n' "$out" | grep -q "PPL(model)" && ok || bad "eval ppl: $out"

# compile: the default is q4c (the codebook format), and the file runs
out=$("$bin" compile "$m" -o "$work/s-default.lpx" --quiet 2>"$work/err"); rc=$?
if [ $rc -eq 0 ] && printf '%s' "$out" | grep -q "weights q4c group 32"; then ok
else bad "compile default: rc=$rc $out $(cat "$work/err")"; fi
out=$("$bin" eval -m "$work/s-default.lpx" --ref "$m" -f "$text" -c 32 --json 2>"$work/err"); rc=$?
kl=$(printf '%s' "$out" | sed -n 's/.*"kl_mean":\([0-9.e+-]*\),.*/\1/p')
if [ $rc -eq 0 ] && [ -n "$kl" ] && awk "BEGIN{exit !($kl > 0 && $kl < 0.5)}"; then ok
else bad "eval q4c: rc=$rc kl='$kl' $out $(cat "$work/err")"; fi
out=$("$bin" compile "$m" -o "$work/s-q4.lpx" --weights q4 --quiet 2>"$work/err"); rc=$?
[ $rc -eq 0 ] && printf '%s' "$out" | grep -q "weights q4 group 32" && ok || bad "compile q4: rc=$rc $out"
"$bin" compile "$m" -o "$work/bad.lpx" --weights q5 >/dev/null 2>"$work/err"; rc=$?
[ $rc -ne 0 ] && grep -q "q4c" "$work/err" && ok || bad "compile --weights q5: rc=$rc $(cat "$work/err")"

# streams: one line per N, concurrent and sequential timings, a chart
out=$("$bin" bench -m "$m" --streams 1,2 -p 8 -n 4 -r 1 --json --svg "$work/ctg.svg" 2>"$work/err"); rc=$?
if [ $rc -eq 0 ] && [ "$(printf '%s\n' "$out" | grep -c '"concurrent_ms":[0-9]')" = 2 ] &&
   printf '%s' "$out" | grep -q '"sequential_ms":[0-9]' && printf '%s' "$out" | grep -q '"kv_bytes":[1-9]'; then ok
else bad "bench streams: rc=$rc $out $(cat "$work/err")"; fi
head -c 5 "$work/ctg.svg" | grep -q "<svg" && tail -n 1 "$work/ctg.svg" | grep -q "</svg>" && ok || bad "streams svg"

# adapter modes with the tiny LoRA bound to several slots
a="$models/stories260K-lora-r4-random-f32.gguf"
out=$("$bin" bench -m "$m" --adapter-modes --adapters "$a,$a,$a" --counts 1,3 -p 8 -n 4 -r 1 --json 2>"$work/err"); rc=$?
if [ $rc -eq 0 ] && [ "$(printf '%s\n' "$out" | grep -c '"onehot_tok_s":[0-9]')" = 2 ] &&
   printf '%s' "$out" | grep -q '"own_adapters_tok_s":[0-9]'; then ok
else bad "adapter modes: rc=$rc $out $(cat "$work/err")"; fi

# errors: message on stderr, nothing on stdout, non-zero exit
out=$("$bin" bench -m "$work/missing.gguf" -r 1 2>"$work/err"); rc=$?
[ $rc -ne 0 ] && [ -z "$out" ] && grep -q "missing.gguf" "$work/err" && ok || bad "bench missing model: rc=$rc"
out=$("$bin" bench -m "$m" -t 0 2>"$work/err"); rc=$?
[ $rc -ne 0 ] && [ -z "$out" ] && ok || bad "bench -t 0 accepted"
out=$("$bin" eval -m "$m" -f "$text" -c 100000 2>"$work/err"); rc=$?
[ $rc -ne 0 ] && [ -z "$out" ] && grep -q "chunk" "$work/err" && ok || bad "eval short text: rc=$rc $(cat "$work/err")"
out=$("$bin" eval -m "$m" --ref "$models/arch/llama3-tiny-random.gguf" -f "$text" 2>"$work/err"); rc=$?
[ $rc -ne 0 ] && [ -z "$out" ] && grep -q "vocabular\|tokeniz" "$work/err" && ok || bad "eval different vocab: rc=$rc $(cat "$work/err")"

echo "cli_tools: $pass passed, $fail failed"
[ $fail -eq 0 ]
