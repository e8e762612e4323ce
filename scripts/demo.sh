#!/usr/bin/env bash
# Builds loraplex and runs it on the built-in default.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh >&2
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >&2
cmake --build build -j"$(nproc)" >&2
exec ./build/loraplex demo "$@"
