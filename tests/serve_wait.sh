# Sourced by the server tests: wait_port LOG PID prints the port a
# `loraplex serve --port 0` started in the background says it listens on.
# It waits for as long as the server lives (startup can take minutes under
# ThreadSanitizer on a busy 2-core machine: --speculate auto measures its
# cost model first), up to 10 minutes, and prints nothing if it died first.
wait_port() {
  local log="$1" pid="$2" port="" deadline=$((SECONDS + 600))
  while [ $SECONDS -lt $deadline ]; do
    port=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\)/.*|\1|p' "$log")
    [ -n "$port" ] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  printf '%s' "$port"
}
