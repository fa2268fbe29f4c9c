#!/bin/sh
# profile.sh BUILD_DIR [OUT_DIR] — CPU profiles of the sidecar's call path.
#
# Starts the mock upstream and one sidecar (a chat source on the mock,
# governance on and never limiting, an HTTP listener), then, for each front
# end and client count, loads it and records the sidecar with
# `perf record --call-graph dwarf` for PROFILE_DURATION seconds:
#   http    wrk POSTing the chat request to /v1/chat/completions
#   msgpack loadgen sending the same body as a `call`
# at 1 and 64 clients. Each profile becomes OUT_DIR/<front>-<clients>.svg
# (a flame graph, tests/bench/flamegraph.py) and .txt (self and inclusive
# shares by function and object). OUT_DIR defaults to tests/bench/profiles.
#
# The sidecar is pinned to CPU 0 with the mock, generators to CPU 1, as in
# run.sh. Build with frame pointers and symbols for readable stacks:
#   make BUILD=build/prof CFLAGS="-O2 -g -fno-omit-frame-pointer" all
#   sh tests/bench/profile.sh build/prof
#
# Environment: PROFILE_DURATION (s, default 4), PROFILE_FREQ (Hz, default
# 999), PROFILE_CLIENTS (default "1 64"), PROFILE_FRONTS (default
# "http msgpack"), PROFILE_FOLDED (a directory: also write the folded
# stacks there).
set -u

BUILD=${1:-build}
OUT=${2:-tests/bench/profiles}
DUR=${PROFILE_DURATION:-4}
FREQ=${PROFILE_FREQ:-999}
CLIENTS=${PROFILE_CLIENTS:-"1 64"}
FRONTS=${PROFILE_FRONTS:-"http msgpack"}
BODY='{"model":"gpt-4o-mini","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Hello, how are you today?"}]}'
HERE=$(dirname "$0")
# shellcheck source=tests/bench/call_config.sh
. "$HERE/call_config.sh"

say() { printf 'profile: %s\n' "$*" >&2; }
for t in perf wrk python3 curl; do
    command -v "$t" >/dev/null 2>&1 || { say "needs $t (tests/deps.sh)"; exit 2; }
done
for b in "$BUILD/polygw" "$BUILD/mock_upstream" "$BUILD/bench/loadgen"; do
    [ -x "$b" ] || { say "missing $b (make BUILD=$BUILD all)"; exit 2; }
done
mkdir -p "$OUT"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/polygw-prof.XXXXXX") || exit 2
MOCK_PID=
PGW_PID=
cleanup() {
    for p in $PGW_PID $MOCK_PID; do
        kill -TERM "$p" 2>/dev/null && wait "$p" 2>/dev/null
    done
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

PIN_SRV=
PIN_LG=
if [ "$(getconf _NPROCESSORS_ONLN)" -ge 2 ] && command -v taskset >/dev/null 2>&1; then
    PIN_SRV="taskset -c 0"
    PIN_LG="taskset -c 1"
fi
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# shellcheck disable=SC2086
$PIN_SRV "$BUILD/mock_upstream" --port 0 --host 127.0.0.1 >"$TMP/mock.out" 2>"$TMP/mock.err" &
MOCK_PID=$!
MOCK_PORT=
i=0
while [ $i -lt 100 ] && [ -z "$MOCK_PORT" ]; do
    MOCK_PORT=$(sed -n 's/^LISTENING \([0-9][0-9]*\)$/\1/p' "$TMP/mock.out")
    [ -n "$MOCK_PORT" ] || sleep 0.1
    i=$((i + 1))
done
[ -n "$MOCK_PORT" ] || { say "the mock did not start"; exit 1; }
HTTP_PORT=$(free_port)
{
    call_config "$MOCK_PORT"
    printf 'http:\n  listen: 127.0.0.1:%s\n' "$HTTP_PORT"
} >"$TMP/prof.yaml"
SOCK=$TMP/polygw.sock
# shellcheck disable=SC2086
$PIN_SRV "$BUILD/polygw" --config "$TMP/prof.yaml" --socket "$SOCK" --log-level warn \
    >"$TMP/polygw.out" 2>"$TMP/polygw.err" &
PGW_PID=$!
i=0
until curl -s -o /dev/null --max-time 1 "http://127.0.0.1:$HTTP_PORT/healthz"; do
    i=$((i + 1))
    if [ $i -ge 100 ] || ! kill -0 "$PGW_PID" 2>/dev/null; then
        say "the sidecar did not start"
        cat "$TMP/polygw.err" >&2
        exit 1
    fi
    sleep 0.1
done
cat >"$TMP/wrk.lua" <<EOF
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = [==[$BODY]==]
EOF
PARAMS="[{\"capability\":\"chat\",\"body\":$BODY}]"
REV=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)

# load FRONT CLIENTS SECONDS: the generator, in the background.
load() {
    if [ "$1" = http ]; then
        # shellcheck disable=SC2086
        $PIN_LG wrk -t 1 -c "$2" -d "${3}s" -s "$TMP/wrk.lua" \
            "http://127.0.0.1:$HTTP_PORT/v1/chat/completions" >"$TMP/gen.out" 2>&1 &
    else
        # shellcheck disable=SC2086
        $PIN_LG "$BUILD/bench/loadgen" --socket "$SOCK" --method call --params-json "$PARAMS" \
            --clients "$2" --duration "$3" --timeout-ms 5000 --json >"$TMP/gen.out" 2>&1 &
    fi
    GEN_PID=$!
}

for front in $FRONTS; do
    for n in $CLIENTS; do
        say "$front, $n client(s): warm-up, then ${DUR} s recorded ..."
        load "$front" "$n" 1
        wait "$GEN_PID"
        load "$front" "$n" $((DUR + 2))
        sleep 1
        perf record -q -F "$FREQ" --call-graph dwarf,16384 -p "$PGW_PID" -o "$TMP/perf.data" \
            -- sleep "$DUR" >/dev/null 2>"$TMP/perf.err" || { say "perf record failed:"; cat "$TMP/perf.err" >&2; exit 1; }
        wait "$GEN_PID"
        title="polygw $REV: $front front, $n client(s), chat call to the mock (perf -F $FREQ, ${DUR} s)"
        perf script -i "$TMP/perf.data" 2>/dev/null |
            python3 "$HERE/flamegraph.py" --title "$title" --own polygw \
                --svg "$OUT/$front-$n.svg" --top "$OUT/$front-$n.txt" \
                ${PROFILE_FOLDED:+--folded "$PROFILE_FOLDED/$front-$n.folded"} || exit 1
        say "wrote $OUT/$front-$n.svg"
    done
done
