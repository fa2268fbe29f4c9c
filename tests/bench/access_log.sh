#!/bin/sh
# access_log.sh BUILD_DIR — what the access log costs: two sidecars, one with
# server.access_log on, one off, the same chat source on one mock upstream;
# loadgen sends `call` to each in turn (16 clients, BENCH_DURATION seconds,
# ROUNDS rounds, alternated so drift hits both). Prints calls/s and latency
# per run, and the log volume of the "on" sidecar.
set -eu
B=${1:-build}
DUR=${BENCH_DURATION:-3}
ROUNDS=${ROUNDS:-2}
T=$(mktemp -d /tmp/pgw-al.XXXXXX)
PIDS=""
cleanup() {
    for p in $PIDS; do kill "$p" 2>/dev/null || true; done
    for p in $PIDS; do wait "$p" 2>/dev/null || true; done
    rm -rf "$T"
}
trap cleanup EXIT INT TERM

"$B/mock_upstream" --port 0 > "$T/mock.out" 2>&1 &
PIDS="$PIDS $!"
for i in $(seq 50); do grep -q LISTENING "$T/mock.out" 2>/dev/null && break; sleep 0.1; done
PORT=$(sed -n 's/^LISTENING //p' "$T/mock.out")
for al in true false; do
    cat > "$T/cfg-$al.yaml" <<EOC
listen: {mode: "0660"}
server: {log_level: info, access_log: $al}
sources:
  - {name: s1, capability: chat, base_url: "http://127.0.0.1:$PORT/v1", max_concurrency: 256,
     aimd: {initial: 256, min: 256}}
EOC
    "$B/polygw" --config "$T/cfg-$al.yaml" --socket "$T/$al.sock" 2> "$T/log-$al.txt" &
    PIDS="$PIDS $!"
done
for i in $(seq 50); do [ -S "$T/true.sock" ] && [ -S "$T/false.sock" ] && break; sleep 0.1; done
PARAMS='[{"capability":"chat","body":{"model":"m","messages":[{"role":"user","content":"hello"}]}}]'
for r in $(seq "$ROUNDS"); do
    for al in true false; do
        printf 'access_log=%-5s round %s: ' "$al" "$r"
        "$B/bench/loadgen" --socket "$T/$al.sock" --clients 16 --duration "$DUR" --method call \
            --params-json "$PARAMS" --json | /usr/bin/python3 -c '
import json, sys
d = json.load(sys.stdin)
print("%.0f calls/s, p50 %.0f us, p99 %.0f us, errors %s" % (d["rps"], d["p50_us"], d["p99_us"], d["errors"]))'
    done
done
n=$(grep -c '"msg":"call"' "$T/log-true.txt" || true)
bytes=$(grep '"msg":"call"' "$T/log-true.txt" | wc -c)
echo "access log (on): $n lines, $((bytes / (n > 0 ? n : 1))) bytes a line"
