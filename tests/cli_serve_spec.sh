#!/usr/bin/env bash
# `loraplex serve` with speculative decoding per request (docs/server.md):
# one server with --speculate on (every candidate placed), a
# random forecast set (forecast-random) bound to the adapter "correct",
# prompt lookup for the others. Every request is sent twice at once, with
# "speculate": true and false, all of them concurrently (so batches mix
# speculating and plain rows, with and without forecast sets): greedy and
# seeded sampling, streamed and not, completions and chat, three adapters
# and the base. Each speculative response must equal its plain twin byte for
# byte (the stream's text too), and the greedy completion `loraplex run`.
# /metrics must count drafted tokens for the adapters that speculated and
# none for logprobs requests (those decode plainly). The openai client runs
# the same comparison (tests/server/speculate.mjs), when it is installed,
# against a second server with --speculate auto (the cost model).
set -u
bin="$1"; work="$3/cli_serve_spec_tmp"
src="$(cd "$(dirname "$0")/.." && pwd)"
. "$src/tests/serve_wait.sh"
demo="$src/models/demo"
rm -rf "$work"; mkdir -p "$work"
fail=0; pass=0
ok() { pass=$((pass+1)); }
bad() { echo "FAIL: $*" >&2; fail=$((fail+1)); }

if "$bin" serve --help 2>&1 | grep -q "no server"; then
  echo "FAIL: this build has no server (libmicrohttpd-dev missing)" >&2; exit 1
fi
"$bin" forecast-random --model "$demo/base.gguf" -k 4 --seed 3 --adapter-name correct -o "$work/correct.lpf" \
  >/dev/null 2>&1 || { echo "FAIL: forecast-random"; exit 1; }

# startup errors: an unknown adapter name, a file for another base
"$bin" serve -m "$demo/base.gguf" --adapter-dir "$demo/adapters" --port 0 --forecast nosuch="$work/correct.lpf" \
  >/dev/null 2>"$work/err1" && bad "unknown forecast name accepted" ||
  { grep -q "no adapter named 'nosuch'" "$work/err1" && ok || bad "unknown name: $(cat "$work/err1")"; }
"$bin" serve -m "$demo/base.gguf" --adapter-dir "$demo/adapters" --port 0 --speculate sometimes \
  >/dev/null 2>&1 && bad "--speculate sometimes accepted" || ok

"$bin" serve -m "$demo/base.gguf" --adapter-dir "$demo/adapters" --port 0 -t 2 --parallel 8 --max-queue 256 \
  --forecast correct="$work/correct.lpf" --speculate on --lookup 2:6 --tree 3,2 -q >"$work/out" 2>"$work/log" &
pid=$!
port=$(wait_port "$work/log" $pid)
if [ -z "$port" ]; then echo "FAIL: the server did not start:"; cat "$work/log"; kill $pid 2>/dev/null; exit 1; fi
url="http://127.0.0.1:$port"

code=$(curl -s -o "$work/bad" -w '%{http_code}' "$url/v1/completions" -d '{"prompt":"hi","speculate":"yes"}')
[ "$code" = 400 ] && grep -q "'speculate' must be true or false" "$work/bad" && ok || bad "speculate: \"yes\": $code $(cat "$work/bad")"

prompts=()
while IFS= read -r line; do
  prompts+=("$(printf '%s' "$line" | sed 's/.*"prompt":"\([^"]*\)".*/\1/')")
done < <(head -2 "$demo/eval/tasks/correct.eval.jsonl"; head -1 "$demo/eval/tasks/summary.eval.jsonl")

# the request matrix: NAME BODY (without "speculate"); sent as NAME.on / NAME.off
cases=()
bodies=()
i=0
for model in correct summary style-terse base; do
  for p in "${prompts[@]}"; do
    for samp in '"temperature":0' '"temperature":0.9,"seed":7,"top_k":40'; do
      for stream in false true; do
        i=$((i+1))
        if [ $((i % 2)) = 0 ]; then
          b="{\"model\":\"$model\",\"messages\":[{\"role\":\"user\",\"content\":\"$p\"}],\"max_tokens\":40,$samp,\"stream\":$stream"
          cases+=("chat$i"); bodies+=("$b")
        else
          b="{\"model\":\"$model\",\"prompt\":\"$p\",\"max_tokens\":40,$samp,\"stream\":$stream"
          cases+=("cmpl$i"); bodies+=("$b")
        fi
      done
    done
  done
done
pids=()
for k in "${!cases[@]}"; do
  name=${cases[$k]}
  ep=/v1/completions; case $name in chat*) ep=/v1/chat/completions;; esac
  for sp in true false; do
    curl -sN -o "$work/$name.$sp" -w '%{http_code}' "$url$ep" -d "${bodies[$k]},\"speculate\":$sp}" >"$work/$name.$sp.code" &
    pids+=($!)
  done
done
# a logprobs request asking for speculation: decoded plainly
curl -s -o "$work/lp" -w '%{http_code}' "$url/v1/completions" \
  -d "{\"model\":\"style-polite\",\"prompt\":\"${prompts[0]}\",\"max_tokens\":8,\"temperature\":0,\"logprobs\":2,\"speculate\":true}" \
  >"$work/lp.code" &
pids+=($!)
for p in "${pids[@]}"; do wait "$p"; done

# the text of a response or of a stream
text_of() {
  python3 - "$1" <<'EOF'
import json, sys
# (sampled byte tokens can make text that is not UTF-8: compared as bytes)
raw = open(sys.argv[1], "rb").read().decode("utf-8", "surrogateescape")
out_ = lambda t: sys.stdout.buffer.write(t.encode("utf-8", "surrogateescape"))
if raw.startswith("data: "):
    out = []
    for e in raw.split("\n\n"):
        if not e or e == "data: [DONE]": continue
        for c in json.loads(e[6:])["choices"]:
            d = c.get("delta", {})
            out.append(d.get("content") or c.get("text") or "")
    out_("".join(out))
else:
    c = json.loads(raw)["choices"][0]
    out_(c["message"]["content"] if "message" in c else c["text"])
EOF
}
same=0
for name in "${cases[@]}"; do
  if [ "$(cat "$work/$name.true.code")" != 200 ] || [ "$(cat "$work/$name.false.code")" != 200 ]; then
    bad "$name: HTTP $(cat "$work/$name.true.code") / $(cat "$work/$name.false.code")"; continue
  fi
  text_of "$work/$name.true" >"$work/$name.true.txt"; text_of "$work/$name.false" >"$work/$name.false.txt"
  if ! [ -s "$work/$name.false.txt" ]; then bad "$name: empty text"; continue; fi
  cmp -s "$work/$name.true.txt" "$work/$name.false.txt" && same=$((same+1)) ||
    bad "$name: speculative != plain: '$(cat "$work/$name.true.txt")' vs '$(cat "$work/$name.false.txt")'"
done
[ "$same" = "${#cases[@]}" ] && ok
echo "cli_serve_spec: $same of ${#cases[@]} speculative responses equal the plain ones"
# non-streamed bodies differ only in id and created
for name in "${cases[@]}"; do
  head -c 5 "$work/$name.true" | grep -q '^data:' && continue
  a=$(sed 's/"id":"[^"]*"//; s/"created":[0-9]*//' "$work/$name.true")
  b=$(sed 's/"id":"[^"]*"//; s/"created":[0-9]*//' "$work/$name.false")
  [ "$a" = "$b" ] || bad "$name: bodies differ beyond id and created"
done

# the greedy completion equals `loraplex run`
printf '%b' "${prompts[0]}" >"$work/prompt.txt"
"$bin" run -m "$demo/base.gguf" --adapter "$demo/adapters/correct.lpa" -f "$work/prompt.txt" -n 40 --temp 0 \
  >"$work/run.txt" 2>/dev/null
printf '%s\n' "$(cat "$work/cmpl1.true.txt")" >"$work/server.txt"
cmp -s "$work/server.txt" "$work/run.txt" && ok || bad "speculative server != run: $(cat "$work/server.txt") vs $(cat "$work/run.txt")"

[ "$(cat "$work/lp.code")" = 200 ] && grep -q '"top_logprobs"' "$work/lp" && ok || bad "logprobs + speculate: $(cat "$work/lp")"

curl -s "$url/metrics" >"$work/metrics"
metric() { sed -n "s/^$1{adapter=\"$2\"} \([0-9]*\)$/\1/p" "$work/metrics"; }
# 3 prompts x 2 samplings x 2 streams speculated per adapter
for a in correct summary style-terse ""; do
  [ "$(metric loraplex_spec_requests_total "$a")" = 12 ] && ok || bad "spec requests of '$a': $(metric loraplex_spec_requests_total "$a")"
  d=$(metric loraplex_spec_drafted_tokens_total "$a"); [ "${d:-0}" -gt 0 ] && ok || bad "nothing drafted for '$a'"
  acc=$(metric loraplex_spec_accepted_tokens_total "$a"); [ -n "$acc" ] && [ "$acc" -le "$d" ] && ok || bad "accepted of '$a': $acc of $d"
done
[ "$(metric loraplex_spec_requests_total style-polite)" = 0 ] && ok || bad "a logprobs request speculated"

kill -INT $pid
wait $pid; rc=$?
[ "$rc" = 0 ] && ok || bad "exit status $rc after SIGINT: $(tail -3 "$work/log")"

# --speculate auto: the cost model measured at startup (it may prune every
# candidate on a busy machine; the output stays the plain output), and the
# openai client
if [ -d "$src/tests/server/node_modules/openai" ] && command -v node >/dev/null; then
  "$bin" serve -m "$demo/base.gguf" --adapter-dir "$demo/adapters" --port 0 -t 2 --parallel 8 \
    --forecast correct="$work/correct.lpf" --speculate auto -q >"$work/out2" 2>"$work/log2" &
  pid=$!
    port=$(wait_port "$work/log2" $pid)
  if [ -z "$port" ]; then bad "the auto server did not start: $(cat "$work/log2")"; kill $pid 2>/dev/null
  else
    node "$src/tests/server/speculate.mjs" "$port" && ok || bad "openai client: speculative != plain"
    kill -INT $pid
    wait $pid && ok || bad "auto server: exit status after SIGINT"
  fi
elif [ "${LORAPLEX_REQUIRE_NODE:-0}" = 1 ]; then
  bad "the openai client is not installed (npm ci --prefix tests/server)"
else
  echo "cli_serve_spec: SKIP the openai client part (npm ci --prefix tests/server)"
fi

echo "cli_serve_spec: $pass passed, $fail failed"
[ "$fail" = 0 ]
