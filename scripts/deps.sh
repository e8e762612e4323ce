#!/usr/bin/env bash
# Installs what loraplex needs to build and test, when missing: Debian
# packages (compilers, PCRE2, cJSON, libmicrohttpd for the server, libpng for
# `loraplex image`, python3 and node for the server tests, chromium for the
# page test), then the server tests' npm packages (the official openai client,
# puppeteer-core driving Debian's chromium: it downloads no browser) into
# tests/server/node_modules.
set -euo pipefail
cd "$(dirname "$0")/.."
have_all() {
  command -v cmake >/dev/null && command -v cc >/dev/null && command -v clang >/dev/null &&
    command -v pkg-config >/dev/null && pkg-config --exists libpcre2-8 libcjson libmicrohttpd libpng &&
    command -v python3 >/dev/null && command -v curl >/dev/null && command -v npm >/dev/null &&
    [ -x /usr/bin/chromium ] &&
    ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1
}
if ! have_all; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  apt_opts=(-o DPkg::Lock::Timeout=600)
  pkgs=(build-essential cmake pkg-config libpcre2-dev libcjson-dev libmicrohttpd-dev libpng-dev clang libclang-rt-14-dev
        python3 curl chromium)
  command -v npm >/dev/null || pkgs+=(nodejs npm)
  $SUDO apt-get "${apt_opts[@]}" update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get "${apt_opts[@]}" install -y -qq "${pkgs[@]}"
fi
if [ ! -d tests/server/node_modules/openai ] || [ ! -d tests/server/node_modules/puppeteer-core ]; then
  npm ci --prefix tests/server --no-audit --no-fund --loglevel=error
fi
