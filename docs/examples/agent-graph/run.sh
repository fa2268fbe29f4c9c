#!/bin/sh
# Stopping and resuming an agent graph (docs/AGENT-GRAPHS.md), on this machine:
#
#   make                                  # the sidecar, polygwctl, the mock upstream
#   sh docs/examples/agent-graph/run.sh   # installs the example's npm packages once
#
# Starts the mock upstream and a sidecar in a temp dir, runs graph.mjs, stops
# both. BUILD=build/asan runs it against the sanitizer build.
set -eu
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
HERE="$ROOT/docs/examples/agent-graph"
BUILD=$(cd "$ROOT" && cd "${BUILD:-build}" 2>/dev/null && pwd) || BUILD="$ROOT/${BUILD:-build}"
for bin in polygw polygwctl mock_upstream; do
    [ -x "$BUILD/$bin" ] || { echo "run.sh: $BUILD/$bin not found: run make first" >&2; exit 2; }
done
command -v node >/dev/null 2>&1 || { echo "run.sh: node (>= 20) not found: make deps installs it" >&2; exit 2; }

# polygw's own dependency (the example links client/node), then the example's.
[ -d "$ROOT/client/node/node_modules/@msgpack/msgpack" ] ||
    (cd "$ROOT/client/node" && npm ci --no-audit --no-fund --omit=dev --prefer-offline)
[ -d "$HERE/node_modules/@langchain/langgraph" ] ||
    (cd "$HERE" && npm ci --no-audit --no-fund --prefer-offline)

TMP=$(mktemp -d /tmp/pgw-graph.XXXXXX)
MOCK_PID=""
PGW_PID=""
cleanup() {
    for p in $PGW_PID $MOCK_PID; do kill "$p" 2>/dev/null && wait "$p" 2>/dev/null; done
    rm -rf "$TMP"
    return 0
}
trap cleanup EXIT INT TERM

"$BUILD/mock_upstream" --port 0 > "$TMP/mock.out" 2> "$TMP/mock.log" &
MOCK_PID=$!
i=0
until grep -q '^LISTENING' "$TMP/mock.out" 2>/dev/null; do
    i=$((i + 1)); [ $i -lt 100 ] || { echo "run.sh: the mock did not start" >&2; exit 1; }
    sleep 0.05
done
PORT=$(sed -n 's/^LISTENING //p' "$TMP/mock.out")

cat > "$TMP/polygw.yaml" <<YAML
listen: { mode: "0600" }
server: { log_level: warn, shutdown_grace_s: 0.5 }
defaults: { max_attempts: 1, stall_window_s: 600, node_timeout_s: 600 }
sources:
  - { name: mock, capability: chat, base_url: "http://127.0.0.1:$PORT/v1",
      timeout_s: 600, ttft_timeout_s: 600, idle_timeout_s: 600 }
YAML
SOCK="$TMP/polygw.sock"
"$BUILD/polygw" --config "$TMP/polygw.yaml" --socket "$SOCK" 2> "$TMP/polygw.log" &
PGW_PID=$!
i=0
until [ -S "$SOCK" ]; do
    i=$((i + 1)); [ $i -lt 100 ] || { echo "run.sh: the sidecar did not start:" >&2; cat "$TMP/polygw.log" >&2; exit 1; }
    sleep 0.05
done

POLYGW_SOCKET="$SOCK" MOCK_URL="http://127.0.0.1:$PORT" POLYGWCTL="$BUILD/polygwctl" \
    node "$HERE/graph.mjs"
