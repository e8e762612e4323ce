#!/usr/bin/env bash
# The installed tree works for a program outside this build: `cmake --install`
# into a temporary prefix, then examples/generate.c compiled against it with
# the flags pkg-config gives, once against libloraplex.so (rpath) and once
# against libloraplex.a (pkg-config --static), and run on stories260K. Both
# print the same non-empty greedy text as the installed `loraplex run`. The
# shared library exports the functions include/loraplex.h declares, no more.
#   usage: cli_install.sh LORAPLEX MODELS BUILD_DIR CC [EXTRA_CFLAGS]
# (EXTRA_CFLAGS: the sanitizer flags of an LP_SANITIZE build, which its
# libraries need at link time.)
set -u
bin="$1"; models="$2"; build="$3"; cc="${4:-cc}"; extra="${5:-}"
src="$(cd "$(dirname "$0")/.." && pwd)"
work="$build/cli_install_tmp"; prefix="$work/prefix"
rm -rf "$work"; mkdir -p "$work"
fail=0; pass=0
ok() { pass=$((pass+1)); }
bad() { echo "FAIL: $*" >&2; fail=$((fail+1)); }
die() { echo "FAIL: $*" >&2; echo "cli_install: $pass passed, $((fail+1)) failed"; exit 1; }
m="$models/stories260K.gguf"; prompt="Once upon a time"; n=40

command -v pkg-config >/dev/null || die "pkg-config not found"
cmake --install "$build" --prefix "$prefix" >"$work/install.log" 2>&1 ||
  die "cmake --install: $(cat "$work/install.log")"

# what was installed
pcs=$(find "$prefix" -name loraplex.pc)
[ "$(printf '%s\n' "$pcs" | grep -c .)" = 1 ] || die "expected one loraplex.pc under $prefix, got: '$pcs'"
pcdir=$(dirname "$pcs"); libdir=$(dirname "$pcdir")
[ -f "$prefix/include/loraplex.h" ] && ok || bad "include/loraplex.h not installed"
[ -f "$libdir/libloraplex.a" ] && ok || bad "libloraplex.a not installed in $libdir"
[ -L "$libdir/libloraplex.so" ] && [ -L "$libdir/libloraplex.so.0" ] && ok ||
  bad "libloraplex.so / libloraplex.so.0 links not installed: $(ls "$libdir")"
real=$(ls "$libdir"/libloraplex.so.*.*.* 2>/dev/null)
[ -f "$real" ] && [ ! -L "$real" ] && ok || bad "libloraplex.so.X.Y.Z not installed: $(ls "$libdir")"
[ -x "$prefix/bin/loraplex" ] && ok || bad "bin/loraplex not installed"
if command -v readelf >/dev/null; then
  readelf -d "$real" | grep -q 'SONAME.*\[libloraplex\.so\.0\]' && ok || bad "SONAME: $(readelf -d "$real" | grep SONAME)"
fi

export PKG_CONFIG_PATH="$pcdir"
pc() { pkg-config "$@" loraplex; }
[ "$(pc --variable=prefix)" = "$prefix" ] && ok || bad "loraplex.pc prefix is '$(pc --variable=prefix)', not $prefix"
cflags=$(pc --cflags) || die "pkg-config --cflags loraplex failed"
libs=$(pc --libs) || die "pkg-config --libs loraplex failed"
slibs=$(pc --static --libs) || die "pkg-config --static --libs loraplex failed"
echo "cflags: $cflags"; echo "libs: $libs"; echo "static libs: $slibs"

# the shared library's exports are exactly the functions the header declares
if command -v nm >/dev/null; then
  nm -D --defined-only "$real" | awk '{ print $NF }' | sort -u > "$work/exported"
  sed 's|/\*.*\*/||g' "$prefix/include/loraplex.h" | grep -v '^[[:space:]]*\*\|^[[:space:]]*/\*\|typedef' |
    grep -o '\blp_[a-z0-9_]*[[:space:]]*(' | tr -d ' (' | sort -u > "$work/declared"
  if [ -s "$work/declared" ] && cmp -s "$work/exported" "$work/declared"; then ok
  else bad "exports differ from loraplex.h's functions (< exported, > declared):
$(diff "$work/exported" "$work/declared")"; fi
fi

# build the example both ways, with nothing but the installed tree
# shellcheck disable=SC2086
"$cc" -std=c11 -Wall -Wextra -Werror $extra "$src/examples/generate.c" $cflags $libs \
  -Wl,-rpath,"$libdir" -o "$work/gen_shared" 2>"$work/err" || die "shared build: $(cat "$work/err")"
ok
static_libs=""
for f in $slibs; do
  if [ "$f" = "-lloraplex" ]; then static_libs="$static_libs -Wl,-Bstatic -lloraplex -Wl,-Bdynamic"
  else static_libs="$static_libs $f"; fi
done
case " $slibs " in *" -lloraplex "*) ok ;; *) bad "pkg-config --static --libs lacks -lloraplex: $slibs" ;; esac
# shellcheck disable=SC2086
"$cc" -std=c11 -Wall -Wextra -Werror $extra "$src/examples/generate.c" $cflags $static_libs \
  -o "$work/gen_static" 2>"$work/err" || die "static build: $(cat "$work/err")"
ok
if command -v readelf >/dev/null; then
  readelf -d "$work/gen_shared" | grep -q 'NEEDED.*\[libloraplex\.so\.0\]' && ok ||
    bad "gen_shared does not load libloraplex.so.0"
  readelf -d "$work/gen_static" | grep -q 'NEEDED.*libloraplex' && bad "gen_static loads libloraplex.so" || ok
fi

# run them: the same greedy text, and the installed CLI's
a=$("$work/gen_shared" "$m" "$prompt" $n 2>"$work/err"); rc=$?
[ $rc -eq 0 ] && [ -n "${a//[[:space:]]/}" ] && ok || bad "gen_shared: rc=$rc '$a' $(cat "$work/err")"
b=$("$work/gen_static" "$m" "$prompt" $n 2>"$work/err"); rc=$?
[ $rc -eq 0 ] && [ -n "${b//[[:space:]]/}" ] && ok || bad "gen_static: rc=$rc '$b' $(cat "$work/err")"
[ "$a" = "$b" ] && ok || bad "shared and static builds differ: '$a' vs '$b'"
c=$("$prefix/bin/loraplex" run -m "$m" -p "$prompt" -n $n --temp 0 2>"$work/err"); rc=$?
[ $rc -eq 0 ] && [ "$a" = "$c" ] && ok || bad "example '$a' vs loraplex run '$c' (rc=$rc) $(cat "$work/err")"
echo "generated: $prompt$a"

echo "cli_install: $pass passed, $fail failed"
[ $fail -eq 0 ]
