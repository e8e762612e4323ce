#!/usr/bin/env bash
# Builds loraplex with ThreadSanitizer (-DLP_TSAN=ON, gcc's libtsan) and runs
# the whole test suite under it: every test that starts a thread pool or
# threads of its own (test_threads, test_forward, test_streams,
# test_lora_forward, test_intkernels, test_kernels, ...) and the CLI tests,
# whose binary is instrumented too. Any TSan report fails, including one from
# a process whose exit status a shell test does not look at: reports go to
# files under the build dir, and any such file fails the stage.
#   usage: .ci/tsan.sh            (build dir: build-tsan, or $BUILD)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${BUILD:-build-tsan}"

echo "== ThreadSanitizer build ($BUILD)"
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Debug -DLP_TSAN=ON -DCMAKE_C_FLAGS="-O1 -g"
cmake --build "$BUILD" -j"$(nproc)"

echo "== tests under ThreadSanitizer"
reports="$PWD/$BUILD/tsan-reports"
rm -rf "$reports"
mkdir -p "$reports"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:log_path=$reports/tsan"
# TSan's fixed shadow layout does not fit the wider mmap randomization of
# some newer kernels (vm.mmap_rnd_bits > 28: "unexpected memory mapping");
# run without address randomization there.
run=()
if [ "$(cat /proc/sys/vm/mmap_rnd_bits 2>/dev/null || echo 28)" -gt 28 ]; then
  run=(setarch "$(uname -m)" -R)
fi
rc=0
"${run[@]}" ctest --test-dir "$BUILD" --output-on-failure -j"$(nproc)" || rc=$?
if compgen -G "$reports/tsan*" >/dev/null; then
  for f in "$reports"/tsan*; do
    echo "---- $f"
    cat "$f"
  done
  echo "tsan.sh: ThreadSanitizer reported the problems above" >&2
  exit 1
fi
[ "$rc" -eq 0 ] || { echo "tsan.sh: tests failed under ThreadSanitizer" >&2; exit 1; }
echo "== ThreadSanitizer passed"
