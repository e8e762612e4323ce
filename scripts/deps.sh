#!/usr/bin/env bash
# Installs the Debian packages loraplex needs to build and test, when missing.
set -euo pipefail
have_all() {
  command -v cmake >/dev/null && command -v cc >/dev/null && command -v clang >/dev/null &&
    command -v pkg-config >/dev/null && pkg-config --exists libpcre2-8 libcjson &&
    ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1
}
if ! have_all; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  apt_opts=(-o DPkg::Lock::Timeout=600)
  $SUDO apt-get "${apt_opts[@]}" update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get "${apt_opts[@]}" install -y -qq \
    build-essential cmake pkg-config libpcre2-dev libcjson-dev clang libclang-rt-14-dev
fi
