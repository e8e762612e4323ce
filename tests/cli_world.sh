#!/usr/bin/env bash
# The version-1 world stays reproducible bit for bit, so that the figures
# made from it can be rerun: `loraplex world --out w1 --seed 1` (the default
# version) and `--version 1` write exactly the files whose SHA-256 sums
# tests/data/world_v1_seed1.sha256 records (computed from the generator as
# it was before version 2 existed; the README's and the style-curious files'
# sums since that task was added, the others unchanged). The README records
# the command line, so with --version 1 every file but the README is compared.
set -u
bin="$1"; work="$3/cli_world_tmp"
root=$(cd "$(dirname "$0")/.." && pwd)
sums="$root/tests/data/world_v1_seed1.sha256"
rm -rf "$work"; mkdir -p "$work"
fail=0; pass=0
ok() { pass=$((pass+1)); }
bad() { echo "FAIL: $*" >&2; fail=$((fail+1)); }

(cd "$work" && "$bin" world --out w1 --seed 1 2>/dev/null) && ok || bad "world --seed 1"
(cd "$work/w1" && sha256sum --quiet -c "$sums") && ok || bad "v1 seed 1 differs from the pinned sums"
[ "$(cd "$work/w1" && find . -type f | wc -l)" -eq "$(wc -l < "$sums")" ] && ok ||
  bad "v1 wrote other files than the pinned ones"

if "$bin" world --help | grep -q -- --version; then
  (cd "$work" && "$bin" world --out w1b --seed 1 --version 1 2>/dev/null) && ok || bad "--version 1"
  (cd "$work/w1b" && grep -v ' README.md$' "$sums" | sha256sum --quiet -c -) && ok ||
    bad "--version 1 differs from the pinned sums"
fi

# version 2 from the command line: the files, its README, a bad version refused
(cd "$work" && "$bin" world --version 2 --out w2 --stories 50 --per-task 20 --eval 5 \
   --correct-factor 2 --vocab 600 2>"$work/w2.err") && ok || { bad "--version 2"; cat "$work/w2.err" >&2; }
for f in README.md pretrain.txt vocab.gguf tasks/compose.train.jsonl tasks/compose.eval.jsonl \
         tasks/style-curious.eval.jsonl tasks/translate.train.jsonl; do
  [ -s "$work/w2/$f" ] && ok || bad "version 2 lacks $f"
done
[ ! -e "$work/w2/tasks/correct.v1.train.jsonl" ] && ok || bad "version 2 wrote version 1's file"
grep -q "version 2" "$work/w2/README.md" && grep -q "Hanmal" "$work/w2/README.md" && ok ||
  bad "version 2 README"
[ "$(wc -l < "$work/w2/tasks/correct.train.jsonl")" -eq 40 ] && ok || bad "correct factor"
grep -q "tokens *pretrain" "$work/w2.err" && ok || bad "no token counts"
"$bin" world --version 3 --out "$work/w3" 2>/dev/null && bad "--version 3 accepted" || ok

echo "cli_world: $pass passed, $fail failed"
rm -rf "$work"
[ $fail -eq 0 ]
