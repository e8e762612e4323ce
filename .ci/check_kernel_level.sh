#!/usr/bin/env bash
# Fails unless the kernels the tests ran are the best ones this host has:
# derives the expected integer and float kernel levels from /proc/cpuinfo
# with the rules of lp_cpu_detect (src/base/cpu.c), lp_kernels_init
# (src/kernels/matmul.c) and lp_amx_available (src/kernels/intmatmul_amx.c),
# then compares them with what test_intkernels and test_kernels print.
#   usage: .ci/check_kernel_level.sh [build dir, default build (Release)]
#   ($CPUINFO: another cpuinfo file, to try the rules)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${1:-build}"
CPUINFO="${CPUINFO:-/proc/cpuinfo}"
die() { echo "check_kernel_level: $*" >&2; exit 1; }
for t in test_intkernels test_kernels; do
  [ -x "$BUILD/$t" ] || die "$BUILD/$t is missing (build $BUILD first)"
done

# The first processor's flags (x86: "flags", Arm: "Features"), one per line.
flags=$(awk -F': *' '/^(flags|Features)[[:space:]]*:/ { print $2; exit }' "$CPUINFO" | tr ' ' '\n')
[ -n "$flags" ] || die "no flags/Features line in $CPUINFO"
has() { grep -qx -- "$1" <<<"$flags"; }

# Linux's AMX rule as the code applies it: CPUID amx-tile + amx-int8, and the
# kernel grants the tile data state (arch_prctl ARCH_REQ_XCOMP_PERM,
# XFEATURE_XTILEDATA; fails before Linux 5.16 or when the kernel refuses).
amx_permitted() {
  local dir rc
  command -v cc >/dev/null || die "cc is needed to probe arch_prctl for AMX"
  dir=$(mktemp -d)
  cat >"$dir/probe.c" <<'EOF'
#include <sys/syscall.h>
#include <unistd.h>
int main(void) { return syscall(SYS_arch_prctl, 0x1023L, 18L) == 0 ? 0 : 1; }
EOF
  cc -o "$dir/probe" "$dir/probe.c" || { rm -rf "$dir"; die "cannot build the AMX permission probe"; }
  rc=0
  "$dir/probe" || rc=$?
  rm -rf "$dir"
  return "$rc"
}

arch=$(uname -m)
case "$arch" in
x86_64)
  # cpuinfo lists only what the kernel enabled (XCR0 saves the ymm/zmm state),
  # as cpu.c's xgetbv checks do.
  base=0 avx512=0 vnni=0 vbmi=0
  has avx2 && has fma && has f16c && base=1
  [ "$base" = 1 ] && has avx512f && has avx512bw && has avx512vl && avx512=1
  [ "$avx512" = 1 ] && has avx512_vnni && vnni=1
  has avx512vbmi && vbmi=1
  if [ "$vnni" = 1 ]; then
    if [ "$vbmi" = 1 ] && has amx_tile && has amx_int8 && amx_permitted; then
      want_int="amx-int8 (vbmi)"
    elif [ "$vbmi" = 1 ]; then
      want_int="avx512-vnni (vbmi)"
    else
      want_int="avx512-vnni"
    fi
  elif [ "$base" = 1 ] && has avx_vnni; then
    want_int="avx-vnni"
  elif [ "$base" = 1 ]; then
    want_int="avx2"
  else
    want_int="reference"
  fi
  if [ "$avx512" = 1 ]; then want_float="avx512"
  elif [ "$base" = 1 ]; then want_float="avx2"
  else want_float="reference"; fi
  ;;
aarch64)
  # lp_kernels_init picks the dotprod kernels on HWCAP_ASIMDDP; test_kernels
  # lists them last (float paths are the reference ones on Arm).
  if has asimddp; then want_int="neon-dotprod" want_float="neon-dotprod"
  else want_int="reference" want_float="reference"; fi
  ;;
*)
  want_int="reference" want_float="reference"
  ;;
esac

# Integer level: test_intkernels prints every level it tests, best last.
out=$("$BUILD/test_intkernels") || { echo "$out"; die "test_intkernels failed"; }
got_int=$(grep '^integer kernel level: ' <<<"$out" | tail -n 1 | sed 's/^integer kernel level: //')
[ -n "$got_int" ] || die "test_intkernels printed no 'integer kernel level:' line"
echo "integer kernel levels tested: $(grep '^integer kernel level: ' <<<"$out" |
  sed 's/^integer kernel level: //' | paste -sd, -)"
[ "$got_int" = "$want_int" ] ||
  die "integer kernel level is '$got_int' but this host's CPU flags call for '$want_int'"

# Float level: test_kernels prints "kernels: testing N dispatch level(s): ..."
# (on AMX hosts with an extra "avx512 (vnni integer kernels)"), best last.
out=$("$BUILD/test_kernels") || { echo "$out"; die "test_kernels failed"; }
line=$(grep '^kernels: testing ' <<<"$out" | head -n 1)
[ -n "$line" ] || die "test_kernels printed no 'kernels: testing' line"
echo "$line"
levels=${line#*: }
levels=${levels% avx512 (vnni integer kernels)}
got_float=${levels##* }
[ "$got_float" = "$want_float" ] ||
  die "float kernel level is '$got_float' but this host's CPU flags call for '$want_float'"

echo "kernel levels as expected for this host: integer $want_int, float $want_float"
