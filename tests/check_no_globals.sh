#!/bin/sh
# The library must have no global mutable state. Lists every data symbol of
# the static library (nm classes B b D d C G g S s V v) and fails, naming the
# object and the symbol, if one lives in a writable section.
#   usage: check_no_globals.sh LIB [NM]     (NM: default nm; ctest passes
#          CMAKE_NM, so the aarch64 cross build uses aarch64-linux-gnu-nm)
#
# The section decides, not the nm class alone: nm prints "d" for
# .data.rel.ro too. A position-independent build (Debian's gcc defaults to
# PIE) puts a const table that holds pointers, such as
# `static const char *const names[] = {...}`, in .data.rel.ro: the dynamic
# loader fills in the addresses, then RELRO maps it read-only. Those pass;
# `static const char *names[]` (writable pointers) lands in .data.rel(.local)
# and fails, like any .data/.bss/COMMON/TLS object.
#
# AddressSanitizer builds (LP_SANITIZE) add writable objects of their own,
# which its runtime writes, not the library. Only when the library calls
# into the ASan runtime (references __asan_*), these names also pass:
#   __odr_asan.NAME, __odr_asan_gen_NAME  the one-byte ODR-violation
#                     indicator ASan emits per exported global (gcc, clang)
#   __unnamed_N       clang's array of ASan global descriptors, handed to
#                     __asan_register_globals (LLVM leaves it unnamed)
#   ___asan_gen_*, ___asan_globals_registered  clang ASan bookkeeping
#   __sancov_gen_*    coverage counters (LP_FUZZ builds)
# UBSan adds none (its records are local .L labels, not symbols).
set -u
lib="${1:?usage: check_no_globals.sh LIB [NM]}"
nm="${2:-nm}"
[ -n "$nm" ] || nm=nm
[ -f "$lib" ] || { echo "check_no_globals: no such library: $lib" >&2; exit 2; }

out=$("$nm" -f sysv "$lib") || { echo "check_no_globals: $nm -f sysv $lib failed" >&2; exit 2; }
san=0
case $out in *__asan_*) san=1 ;; esac
bad=$(printf '%s\n' "$out" | awk -F'|' -v san="$san" '
    function trim(s) { gsub(/^[ \t]+|[ \t]+$/, "", s); return s }
    # Object headers: GNU "Symbols from lib.a[obj.o]:", llvm-nm "obj.o:".
    /^Symbols from / || (index($0, "|") == 0 && /:$/) {
        o = $0; sub(/^Symbols from /, "", o); sub(/:$/, "", o)
        if (match(o, /\[[^]]*\]$/)) o = substr(o, RSTART + 1, RLENGTH - 2)
        next
    }
    NF >= 7 {
        name = trim($1); cls = trim($3); sec = trim($7)
        if (cls !~ /^[BbDdCGgSsVv]$/ || sec == "*UND*") next
        if (sec ~ /^\.data\.rel\.ro(\.|$)/) next
        if (san && name ~ /^(__odr_asan[._]|___asan_gen_|___asan_globals_registered$|__unnamed_[0-9]+$|__sancov_gen_)/) next
        printf "%s: %s %s (%s)\n", o, cls, name, sec
    }')
if [ -n "$bad" ]; then
    echo "check_no_globals: writable global data in $lib (make it const, or state per call/handle):"
    printf '%s\n' "$bad"
    exit 1
fi
echo "check_no_globals: $lib has no writable global data"
