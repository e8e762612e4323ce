#!/bin/sh
# Dependencies point one way: the runtime library (libloraplex.a) must not
# call into the tools library. Fails, naming the symbols, if a symbol the
# runtime leaves undefined is one the tools define.
#   usage: check_runtime_deps.sh RUNTIME.a TOOLS.a [NM]
# (The shared library's link with -Wl,--no-undefined checks the same from the
# other side: every symbol the runtime uses resolves in it or in libc,
# libm, libpthread, libpcre2-8 and libcjson.)
set -u
rt="${1:?usage: check_runtime_deps.sh RUNTIME.a TOOLS.a [NM]}"
tools="${2:?usage: check_runtime_deps.sh RUNTIME.a TOOLS.a [NM]}"
nm="${3:-nm}"
[ -n "$nm" ] || nm=nm
for f in "$rt" "$tools"; do
    [ -f "$f" ] || { echo "check_runtime_deps: no such library: $f" >&2; exit 2; }
done
tmp=$(mktemp -d) || exit 2
trap 'rm -rf "$tmp"' EXIT
# external symbols, POSIX format "name type [value size]"; archive member
# headers ("lib.a[x.o]:") have one field and are skipped
syms() { "$nm" -P -g "$1" | awk 'NF >= 2 { print $1, $2 }'; }
syms "$rt" > "$tmp/rt" || { echo "check_runtime_deps: $nm failed on $rt" >&2; exit 2; }
syms "$tools" > "$tmp/tools" || { echo "check_runtime_deps: $nm failed on $tools" >&2; exit 2; }
defined() { awk '$2 !~ /^[Uwv]$/ { print $1 }' "$1" | sort -u; }
undefined() { awk '$2 ~ /^[Uwv]$/ { print $1 }' "$1" | sort -u; }
defined "$tmp/rt" > "$tmp/rt.def"
undefined "$tmp/rt" | comm -23 - "$tmp/rt.def" > "$tmp/rt.undef"
defined "$tmp/tools" > "$tmp/tools.def"
undefined "$tmp/tools" > "$tmp/tools.undef"
# the lists must mean something: the runtime defines its API, the tools use it
grep -qx lp_model_load "$tmp/rt.def" || { echo "check_runtime_deps: lp_model_load not found in $rt" >&2; exit 2; }
[ -n "$(comm -12 "$tmp/tools.undef" "$tmp/rt.def")" ] ||
    { echo "check_runtime_deps: the tools use nothing of the runtime? ($nm output not understood)" >&2; exit 2; }
bad=$(comm -12 "$tmp/rt.undef" "$tmp/tools.def")
if [ -n "$bad" ]; then
    echo "check_runtime_deps: $rt uses symbols defined only in $tools:"
    printf '  %s\n' $bad
    exit 1
fi
echo "check_runtime_deps: $rt uses nothing from $tools ($(wc -l < "$tmp/rt.undef") external symbols, all outside the tools)"
