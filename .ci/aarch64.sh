#!/usr/bin/env bash
# Cross-builds loraplex for aarch64 twice, with gcc (Debian
# gcc-aarch64-linux-gnu) and with clang (--target=aarch64-linux-gnu on that
# toolchain's headers, crt files and libgcc: the Android NDK has only clang),
# both on the arm64 multiarch libraries, and runs the C test suite of each
# under qemu-aarch64 with -cpu max, so the NEON dotprod kernels and their
# i8mm (smmla) copy are the ones tested. Installs what is missing (needs root then); safe to run again.
#   usage: .ci/aarch64.sh   (build dirs: build-aarch64 and build-aarch64-clang,
#                            or $BUILD and $BUILD_CLANG; $COMPILERS: "gcc clang")
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${BUILD:-build-aarch64}"
BUILD_CLANG="${BUILD_CLANG:-build-aarch64-clang}"
COMPILERS="${COMPILERS:-gcc clang}"
PKGS=(gcc-aarch64-linux-gnu clang qemu-user libpcre2-dev:arm64 libcjson-dev:arm64 libpng-dev:arm64)

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

export PKG_CONFIG_LIBDIR=/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig
# The loader and libc come from libc6:arm64 (/lib/aarch64-linux-gnu, where
# libpcre2/libcjson/libpng live too), not from /usr/aarch64-linux-gnu: the cross
# toolchain's ld.so is another glibc build, and pairing it with the
# multiarch libc.so.6 hangs in pthread_create.
export QEMU_LD_PREFIX=/ QEMU_CPU=max

# build_and_test NAME BUILD_DIR TOOLCHAIN_FILE [EXCLUDE]
build_and_test() {
  local name=$1 build=$2 toolchain=$3 exclude=${4:-}
  echo "== cross build, $name ($build)"
  cmake -S . -B "$build" -DCMAKE_TOOLCHAIN_FILE="$PWD/$toolchain" -DCMAKE_BUILD_TYPE=Release
  cmake --build "$build" -j"$(nproc)"

  echo "== tests under qemu-aarch64 -cpu max, $name"
  file "$build/test_intkernels" | grep -q aarch64 ||
    { echo "aarch64.sh: $build: not an aarch64 binary" >&2; exit 1; }
  # The whole C test suite runs through CMAKE_CROSSCOMPILING_EMULATOR; the
  # shell tests drive the CLI binary directly and stay on the host build.
  ctest --test-dir "$build" --output-on-failure -E "^cli_$exclude" -j"$(nproc)"
  # test_intkernels prints the integer levels it ran; they must include the
  # NEON dotprod kernels and their i8mm (smmla) copy, which -cpu max has.
  # (Output captured first: grep -q closing the pipe early must not fail it.)
  local out
  out=$(qemu-aarch64 "$build/test_intkernels")
  grep -qx "integer kernel level: neon-dotprod" <<<"$out" ||
    { echo "aarch64.sh: $name: the NEON dotprod kernels were not selected" >&2; exit 1; }
  grep -qx "integer kernel level: neon-dotprod (i8mm)" <<<"$out" ||
    { echo "aarch64.sh: $name: the NEON i8mm kernels were not selected" >&2; exit 1; }
  echo "$name: $(grep "integer kernel level: " <<<"$out" | tail -n 1)"
}

for cc in $COMPILERS; do
  case "$cc" in
  gcc) build_and_test gcc "$BUILD" cmake/aarch64.cmake ;;
  # test_speculate (the engine's speculation logic, compiler-independent C
  # over kernels test_kernels and test_intkernels cover for both compilers)
  # takes 8-10 minutes under qemu: the gcc pass runs it, the clang pass
  # leaves it out to keep the whole CI inside its 90 minutes.
  clang) build_and_test clang "$BUILD_CLANG" cmake/aarch64-clang.cmake '|^test_speculate$' ;;
  *) echo "aarch64.sh: unknown compiler '$cc' in COMPILERS" >&2; exit 1 ;;
  esac
done
echo "== aarch64 passed"
