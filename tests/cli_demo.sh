#!/usr/bin/env bash
# The committed demo world artifacts work: `loraplex demo` runs on
# models/demo and shows every task and the four concurrent styles; the
# committed base with a committed adapter reaches high exact match on
# committed eval records (and the base alone does not); every adapter loads
# in both its forms (.lpa and PEFT directory).
set -u
bin="$1"; work="$3/cli_demo_tmp"
root=$(cd "$(dirname "$0")/.." && pwd)
demo="$root/models/demo"
mkdir -p "$work"
fail=0; pass=0
ok() { pass=$((pass+1)); }
bad() { echo "FAIL: $*" >&2; fail=$((fail+1)); }

if [ ! -f "$demo/base.gguf" ]; then
  echo "cli_demo: no $demo/base.gguf; nothing to check" >&2
  exit 0
fi

tasks="correct style-formal style-polite style-jovial style-terse summary reply translate"

# the demo: every task section, the styles section, no error
out=$(LORAPLEX_DEMO_DIR="$demo" "$bin" demo -t 2 2>"$work/demo.err")
rc=$?
[ $rc -eq 0 ] && ok || { bad "demo exit $rc"; cat "$work/demo.err" >&2; }
for t in $tasks; do
  grep -q "^\[$t\]" <<<"$out" && ok || bad "demo output lacks task $t"
done
for s in formal polite jovial terse; do
  grep -Eq "^  $s +[^ ]" <<<"$out" && ok || bad "demo output lacks style $s"
done
grep -q "swap" <<<"$out" && ok || bad "demo output lacks the swap time"
# found without the environment variable too (walking up from the binary
# finds it when the build folder is inside the source tree; else the cwd)
out2=$(cd "$root" && "$bin" demo -t 2 2>/dev/null)
grep -q "^\[translate\]" <<<"$out2" && ok || bad "demo without LORAPLEX_DEMO_DIR"

# exact match of committed adapters on committed eval records
em() { # task, adapter-or-empty -> exact match % over all languages
  local task=$1 spec=$2 want=${2%%=*} json
  json=$("$bin" eval-tasks -m "$demo/base.gguf" ${spec:+--adapters "$spec"} \
         --data "$demo/eval/tasks" --tasks "$task" --max 24 -t 2 --json 2>"$work/eval.err")
  python3 -c '
import json, sys
d = json.loads(sys.stdin.read())
want = sys.argv[1] or "base"
rows = [g for g in d["results"] if g["lang"] == "all" and g["adapter"] == want]
print(int(round(rows[0]["full"]["exact_match"])))' "$want" <<<"$json" 2>>"$work/eval.err" || echo -1
}
for t in summary reply style-polite; do
  e=$(em "$t" "$t=$demo/adapters/$t.lpa")
  [ "$e" -ge 80 ] && ok || { bad "$t adapter exact match $e% < 80%"; cat "$work/eval.err" >&2; }
done
e=$(em correct "")
[ "$e" -ge 0 ] && [ "$e" -le 30 ] && ok || bad "base alone on correct: $e% (expected low)"

# every adapter loads in both forms against the base
for t in $tasks; do
  for form in "$demo/adapters/$t.lpa" "$demo/adapters/$t"; do
    "$bin" adapter info "$form" -m "$demo/base.gguf" >/dev/null 2>"$work/info.err" && ok ||
      { bad "adapter info $form"; cat "$work/info.err" >&2; }
  done
done

echo "cli_demo: $pass passed, $fail failed"
[ $fail -eq 0 ]
