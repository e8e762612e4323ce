#!/usr/bin/env bash
# Cross-builds loraplex for aarch64 (Debian gcc-aarch64-linux-gnu, arm64
# multiarch libraries) and runs the kernel tests under qemu-aarch64 with
# -cpu max, so the NEON dotprod kernels are the ones tested. Installs what
# is missing (needs root then); safe to run again.
#   usage: .ci/aarch64.sh            (build dir: build-aarch64, or $BUILD)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${BUILD:-build-aarch64}"
PKGS=(gcc-aarch64-linux-gnu qemu-user libpcre2-dev:arm64 libcjson-dev:arm64)

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
missing=()
for p in "${PKGS[@]}"; do installed "$p" || missing+=("$p"); done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "== installing ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then
    echo "aarch64.sh: packages missing (${missing[*]}) and not root: cannot install" >&2
    exit 1
  fi
  dpkg --print-foreign-architectures | grep -qx arm64 || dpkg --add-architecture arm64
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
fi

echo "== cross build ($BUILD)"
export PKG_CONFIG_LIBDIR=/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig
cmake -S . -B "$BUILD" -DCMAKE_TOOLCHAIN_FILE="$PWD/cmake/aarch64.cmake" -DCMAKE_BUILD_TYPE=Release
cmake --build "$BUILD" -j"$(nproc)"

echo "== tests under qemu-aarch64 -cpu max"
# The loader and libc come from libc6:arm64 (/lib/aarch64-linux-gnu, where
# libpcre2/libcjson live too), not from /usr/aarch64-linux-gnu: the cross
# toolchain's ld.so is another glibc build, and pairing it with the
# multiarch libc.so.6 hangs in pthread_create.
export QEMU_LD_PREFIX=/ QEMU_CPU=max
file "$BUILD/test_intkernels" | grep -q aarch64 || { echo "aarch64.sh: not an aarch64 binary" >&2; exit 1; }
# The whole C test suite runs through CMAKE_CROSSCOMPILING_EMULATOR; the
# shell tests drive the CLI binary directly and stay on the host build.
ctest --test-dir "$BUILD" --output-on-failure -E '^cli_' -j"$(nproc)"
# test_intkernels prints the integer level it ran; it must be the NEON one.
qemu-aarch64 "$BUILD/test_intkernels" | grep -q "integer kernel level: neon-dotprod" ||
  { echo "aarch64.sh: the NEON dotprod kernels were not selected" >&2; exit 1; }
echo "== aarch64 passed"
