#!/usr/bin/env bash
# The version-1 world stays reproducible bit for bit, so that the figures
# made from it can be rerun: `loraplex world --out w1 --seed 1` (the default
# version) and `--version 1` write exactly the files whose SHA-256 sums
# tests/data/world_v1_seed1.sha256 records (computed from the generator as
# it was before version 2 existed). The README records the command line, so
# with --version 1 every file but the README is compared.
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

echo "cli_world: $pass passed, $fail failed"
rm -rf "$work"
[ $fail -eq 0 ]
