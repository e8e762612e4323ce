#!/usr/bin/env bash
# The chat page in a headless Chromium (tests/server/page.mjs through
# puppeteer-core, Debian's chromium at /usr/bin/chromium; scripts/deps.sh
# installs both): a chat answer, another adapter, side-by-side variants, each
# equal to `loraplex run`. Without chromium or puppeteer-core it fails when
# LORAPLEX_REQUIRE_NODE=1 (CI), else skips and says so.
set -u
bin="$1"; work="$3/cli_page_tmp"
src="$(cd "$(dirname "$0")/.." && pwd)"
. "$src/tests/serve_wait.sh"
demo="$src/models/demo"
chromium="${LORAPLEX_CHROMIUM:-/usr/bin/chromium}"
mkdir -p "$work"
if ! [ -x "$chromium" ] || ! [ -d "$src/tests/server/node_modules/puppeteer-core" ] || ! command -v node >/dev/null; then
  if [ "${LORAPLEX_REQUIRE_NODE:-0}" = 1 ]; then
    echo "FAIL: the page test needs $chromium, node and puppeteer-core (scripts/deps.sh installs them)" >&2
    exit 1
  fi
  echo "cli_page: SKIPPED (no $chromium, node or tests/server/node_modules/puppeteer-core)"
  exit 0
fi
if "$bin" serve --help 2>&1 | grep -q "no server"; then
  echo "FAIL: this build has no server (libmicrohttpd-dev missing)" >&2; exit 1
fi
"$bin" serve -m "$demo/base.gguf" --adapter-dir "$demo/adapters" --port 0 -t 2 >"$work/out" 2>"$work/log" &
pid=$!
port=$(wait_port "$work/log" $pid)
if [ -z "$port" ]; then echo "FAIL: the server did not start:"; cat "$work/log"; kill $pid; exit 1; fi
node "$src/tests/server/page.mjs" "$port" "$bin" "$demo" "$chromium"
rc=$?
kill -INT $pid
wait $pid || rc=1
exit $rc
