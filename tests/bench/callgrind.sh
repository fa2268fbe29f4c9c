#!/bin/sh
# callgrind.sh BUILD [memory|redis] [CALLS] — the sidecar's user-space
# instructions per governed call, counted by valgrind's callgrind.
#
# On a shared machine CPU time per call moves by ±20% from run to run, which
# hides a change of a few percent; an instruction count does not depend on the
# neighbours. Starts the mock upstream, (for `redis`) a redis-server of its own
# on a free loopback port, and the call benchmark's sidecar (call_config.sh;
# with `redis`, `backend: {kind: redis}`) under callgrind, sends CALLS
# (default 5000) `call`s with loadgen on 8 connections, stops the sidecar and
# prints the instructions per call of the whole process and of its main
# Redis-client functions (inclusive). Not part of `make bench` (about 30 s).
# The callgrind output stays in BUILD/bench/callgrind.<backend>.out for
# callgrind_annotate.
set -u

BUILD=${1:-build}
KIND=${2:-redis}
CALLS=${3:-5000}
case $KIND in memory | redis) ;; *) echo "callgrind.sh: backend must be memory or redis" >&2; exit 2 ;; esac
case $CALLS in '' | *[!0-9]* | 0) echo "callgrind.sh: CALLS must be a positive integer" >&2; exit 2 ;; esac
for t in valgrind callgrind_annotate; do
    command -v $t >/dev/null 2>&1 || { echo "callgrind.sh: needs $t (Debian: valgrind)" >&2; exit 2; }
done
if [ "$KIND" = redis ] && ! command -v redis-server >/dev/null 2>&1; then
    echo "callgrind.sh: needs redis-server" >&2
    exit 2
fi
for b in "$BUILD/polygw" "$BUILD/mock_upstream" "$BUILD/bench/loadgen"; do
    [ -x "$b" ] || { echo "callgrind.sh: missing $b (make all)" >&2; exit 2; }
done
# shellcheck source=tests/bench/call_config.sh
. "$(dirname "$0")/call_config.sh"
# shellcheck source=tests/bench/bench_lib.sh
. "$(dirname "$0")/bench_lib.sh"

TMP=$(mktemp -d "${TMPDIR:-/tmp}/polygw-cg.XXXXXX") || exit 2
MOCK_PID=
REDIS_PID=
PGW_PID=
# shellcheck disable=SC2317  # invoked by trap
cleanup() {
    trap - EXIT INT TERM
    stop_pid "$PGW_PID" 300
    stop_pid "$REDIS_PID"
    stop_pid "$MOCK_PID"
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

"$BUILD/mock_upstream" --port 0 --host 127.0.0.1 >"$TMP/mock.out" 2>"$TMP/mock.err" &
MOCK_PID=$!
PORT=
i=0
while [ -z "$PORT" ] && [ $i -lt 100 ]; do
    PORT=$(sed -n 's/^LISTENING \([0-9][0-9]*\)$/\1/p' "$TMP/mock.out")
    [ -n "$PORT" ] || sleep 0.1
    i=$((i + 1))
done
[ -n "$PORT" ] || { echo "callgrind.sh: the mock did not start" >&2; exit 1; }
call_config "$PORT" >"$TMP/c.yaml"

if [ "$KIND" = redis ]; then
    RPORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    redis-server --port "$RPORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$TMP" \
        --daemonize no >"$TMP/redis.out" 2>&1 &
    REDIS_PID=$!
    i=0
    until grep -q 'Ready to accept connections' "$TMP/redis.out" 2>/dev/null; do
        i=$((i + 1))
        if [ $i -ge 100 ] || ! kill -0 "$REDIS_PID" 2>/dev/null; then
            echo "callgrind.sh: redis-server did not start" >&2
            exit 1
        fi
        sleep 0.1
    done
    # Under callgrind the sidecar runs ~50 times slower: a generous command timeout.
    awk -v url="redis://127.0.0.1:$RPORT/0" '
        $0 == "  kind: memory" {
            print "  kind: redis"; print "  url: \"" url "\""; print "  prefix: \"polygw-cg\""
            print "  command_timeout_s: 20"; print "  lease_ttl_s: 60"; next
        }
        { print }' "$TMP/c.yaml" >"$TMP/c2.yaml" && mv "$TMP/c2.yaml" "$TMP/c.yaml"
fi

OUT=$BUILD/bench/callgrind.$KIND.out
mkdir -p "$BUILD/bench"
valgrind --tool=callgrind --callgrind-out-file="$OUT" "$BUILD/polygw" --config "$TMP/c.yaml" \
    --socket "$TMP/s.sock" --log-level warn 2>"$TMP/valgrind.err" &
PGW_PID=$!
PARAMS='[{"capability":"chat","body":{"model":"gpt-4o-mini","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Hello, how are you today?"}]}}]'
# Up when one call goes through (the Redis backend connects in the background).
i=0
until "$BUILD/bench/loadgen" --socket "$TMP/s.sock" --method call --params-json "$PARAMS" \
    --requests 1 --timeout-ms 20000 >/dev/null 2>&1; do
    i=$((i + 1))
    if [ $i -ge 60 ] || ! kill -0 "$PGW_PID" 2>/dev/null; then
        echo "callgrind.sh: the sidecar did not answer a call" >&2
        cat "$TMP/valgrind.err" >&2
        exit 1
    fi
    sleep 0.5
done
j=$("$BUILD/bench/loadgen" --socket "$TMP/s.sock" --method call --params-json "$PARAMS" \
    --clients 8 --requests "$CALLS" --timeout-ms 20000 --json)
ok=$(printf '%s\n' "$j" | sed -n 's/.*"ok":\([0-9]*\).*/\1/p')
# Callgrind writes its output at exit, slowly: give it 30 s.
stop_pid "$PGW_PID" 300
PGW_PID=
[ "$ok" = "$CALLS" ] || { echo "callgrind.sh: only ${ok:-0} of $CALLS calls succeeded" >&2; exit 1; }

# Inclusive instructions of a few functions, per call (the start-up and the
# first call are in the totals too: negligible against CALLS calls).
callgrind_annotate --inclusive=yes "$OUT" 2>/dev/null | awk -v n="$CALLS" -v kind="$KIND" '
    function show(name, v) { printf "| %s | %s | %.0f |\n", kind, name, v / n }
    { gsub(/,/, "", $1) }
    # The function list comes first; the annotated sources after it repeat
    # the names at their call sites ("=> ..."): the first match only.
    /PROGRAM TOTALS/ { tot = $1 }
    / => / { next }
    ev == "" && / [^ ]*:rds_eval / { ev = $1 }
    rd == "" && / [^ ]*:redisAsyncHandleRead / { rd = $1 }
    cb == "" && / [^ ]*:cmd_on_reply / { cb = $1 }
    END {
        print "| backend | function (inclusive) | instructions per call |"
        print "|---|---|---:|"
        show("whole sidecar", tot)
        if (kind == "redis") {
            show("rds_eval (format and queue its script calls)", ev)
            show("redisAsyncHandleRead − cmd_on_reply (read and parse the replies)", rd - cb)
        }
    }'
echo "($CALLS calls on 8 connections; callgrind output: $OUT)"
