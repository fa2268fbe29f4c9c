#!/bin/sh
# run.sh BUILD_DIR — polygw benchmarks (see tests/bench/README.md).
#
# Six sections, each compared with a floor measured in this same run:
#
#  ping    the echo server (the floor) and the sidecar (deploy config), `ping`
#          driven by loadgen at 1, 16 and 64 clients; ratios vs echo.
#  call    the mock upstream and a second sidecar with a generated config
#          whose one chat source points at the mock (governance on, limits
#          too generous to bite). At 1 and 64 clients: curlgen sends the chat
#          request straight to the mock with libcurl (the floor), loadgen
#          sends the same body as a `call` through the sidecar; Δp50, Δp99
#          and the throughput ratio vs direct. Then the same pair streamed
#          (curlgen --stream, loadgen `call` with `stream: true`, the mock
#          pacing its events): the time to the first chunk, and its Δ.
#  memory  the same sidecar with the mock delaying every answer: 10,000 calls
#          held in flight, the sidecar's RSS before and during, KiB per call,
#          and the in-flight count from `polygwctl stats` as proof; then
#          waiting_cpu.py: the CPU of 1,000 calls waiting for a permit.
#          tracing_cpu.py: CPU per call with tracing on (ratio 1.0) / off.
#  redis   a redis-server of its own (free 127.0.0.1 port, no persistence)
#          and a third sidecar identical to the call one but with
#          `backend: {kind: redis}`; `call` through the memory sidecar (the
#          floor) and the redis one, alternately, at 1 and 64 clients: Δp50,
#          Δp99, throughput ratio, and the Redis traffic per call seen from
#          both ends (sidecar `stats`, redis-server INFO), the command RTT and
#          redis-server's CPU per call. Skipped with a note without
#          redis-server.
#  http    the same chat request sent by wrk straight to the mock (the
#          floor), through polygw's HTTP front (a sidecar with the call
#          config plus an `http` listener) and through nginx (one worker, a
#          plain reverse proxy with a keepalive upstream pool; temp config,
#          loopback ports): Δp50 and Δp99 vs direct at 1 client, req/s and
#          the proxy's CPU µs per request at 64, polygw ÷ nginx.
#  realpath the path users take: a provider by host name over HTTPS. nginx
#          terminating TLS 1.3 for `localhost` (a throwaway CA made by the
#          run) on an HTTP/1.1-only port and an h2 one, answering a fixed
#          chat completion itself or relaying the mock's paced streams; in
#          front of it nginx (proxy_ssl, verification on, keepalive) and
#          polygw (`base_url: https://localhost:PORT/v1`, `tls.ca_file`).
#          Single answers at 64 connections (wrk), polygw also to the mock
#          as http://localhost vs http://127.0.0.1; streams of 50 events
#          20 ms apart at 256, 64 and 8 (curlgen, and loadgen on the msgpack
#          front): gateway CPU per request / stream, req/s, stream p50/p99,
#          streams completed, polygw ÷ nginx.
#
# A summary table at the end puts every performance target of issue 17 next
# to its measured value, from this run's cells: value, bound, ratio, verdict.
# Tables are printed and written to BUILD_DIR/bench/results.md (one file per
# run, all sections). Only one target is loaded at a time.
#
# Environment (all optional):
#   BENCH_DURATION  seconds per run (default 2)
#   BENCH_REPS      runs per cell, alternating the order of the two targets
#                   (default 5); each table shows the fastest run of a cell,
#                   the notes every run and the medians
#   BENCH_WARMUP    untimed requests before each ping run (default 2000)
#   BENCH_CLIENTS   ping client counts (default "1 16 64")
#   BENCH_PIPELINE  ping requests in flight per client (default 1: closed loop)
#   BENCH_CONFIG    sidecar config for the ping section (default deploy/polygw.yaml)
#   BENCH_PIN       1 (default): pin servers (echo, sidecars, mock) to CPU 0 and
#                   the generators to CPU 1 when taskset exists and there are
#                   >= 2 CPUs; 0: no pinning
#   BENCH_SECTIONS  which sections to run (default "ping call memory redis http
#                   realpath")
#   BENCH_CALL_CLIENTS  call client counts (default "1 64")
#   BENCH_CALL_WARMUP   untimed requests before each call run (default 2000)
#   BENCH_BODY      the chat request body, JSON (default: a two-message chat)
#   BENCH_STREAM_CLIENTS  client counts of the streamed call cells (default 1)
#   BENCH_STREAM_INTERVAL_MS  the mock's gap between stream events (default 1)
#   BENCH_MEM_CALLS     calls held in flight (default 10000)
#   BENCH_MEM_DELAY_MS  how long the mock holds each of them (default 8000)
#   BENCH_REDIS_CLIENTS redis section client counts (default "1 64")
#   BENCH_REDIS_WARMUP  untimed calls before each redis-section run (default 500)
#   BENCH_REDIS_SERVER  the redis-server binary (default: redis-server in PATH)
#   BENCH_HTTP_CLIENTS  http section client counts (default "1 64"; the lowest
#                       gives the added latency, the highest the CPU ratio)
#   BENCH_WRK, BENCH_NGINX  the wrk and nginx binaries (default: in PATH)
#   BENCH_REDIS_CPU     the CPU redis-server is pinned to when pinning (default
#                       1, beside the generator: Redis is normally another
#                       host's work; 0 puts it with the servers)
#   BENCH_REALPATH_REPS     runs per realpath cell (default: BENCH_REPS, at
#                           most 2: the section has 24 cells)
#   BENCH_REALPATH_CLIENTS  realpath single-answer connection counts (default "1 64")
#   BENCH_REALPATH_STREAMS  realpath concurrent stream counts (default "256 64 8")
#   BENCH_PERF_DIR  a directory: record each polygw stream run of the realpath
#                   section with `perf record --call-graph dwarf` into
#                   DIR/PATH-STREAMS-REP.data (perf's own cost inflates that
#                   run's CPU column; tests/bench/profiles/README.md)
#
# Exit status: 0 when every row that ran had no errors (skipped sidecar rows
# included), 1 otherwise, 2 when a tool a requested section needs is missing
# or a setting is invalid.
set -u

BUILD=${1:-build}
DUR=${BENCH_DURATION:-2}
REPS=${BENCH_REPS:-5}
WARMUP=${BENCH_WARMUP:-2000}
CLIENTS=${BENCH_CLIENTS:-"1 16 64"}
PIPELINE=${BENCH_PIPELINE:-1}
CONFIG=${BENCH_CONFIG:-deploy/polygw.yaml}
PIN=${BENCH_PIN:-1}
SECTIONS=${BENCH_SECTIONS:-"ping call memory redis http realpath"}
CALL_CLIENTS=${BENCH_CALL_CLIENTS:-"1 64"}
CALL_WARMUP=${BENCH_CALL_WARMUP:-2000}
STREAM_CLIENTS=${BENCH_STREAM_CLIENTS:-1}
STREAM_INTERVAL_MS=${BENCH_STREAM_INTERVAL_MS:-1}
# Untimed streams before each streamed run (each takes ~5 intervals).
STREAM_WARMUP=100
BODY=${BENCH_BODY:-'{"model":"gpt-4o-mini","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Hello, how are you today?"}]}'}
MEM_CALLS=${BENCH_MEM_CALLS:-10000}
MEM_DELAY_MS=${BENCH_MEM_DELAY_MS:-8000}
REDIS_CLIENTS=${BENCH_REDIS_CLIENTS:-"1 64"}
REDIS_WARMUP=${BENCH_REDIS_WARMUP:-500}
REDIS_SERVER=${BENCH_REDIS_SERVER:-redis-server}
REDIS_CPU=${BENCH_REDIS_CPU:-1}
HTTP_CLIENTS=${BENCH_HTTP_CLIENTS:-"1 64"}
RP_REPS=${BENCH_REALPATH_REPS:-$((REPS < 2 ? REPS : 2))}
RP_CLIENTS=${BENCH_REALPATH_CLIENTS:-"1 64"}
RP_STREAMS=${BENCH_REALPATH_STREAMS:-"256 64 8"}
# A realpath stream: 50 content events, a finish and a usage event, 20 ms
# apart (a model's pace), as curlgen sends it (the HTTP fronts pass the body
# on as it came) and as a msgpack `call` (the sidecar adds `stream_options`).
RP_EVENTS=50
RP_INTERVAL_MS=20
# Streams a stream run begins at least: a run at few concurrent streams lasts
# longer than BENCH_DURATION, so that its TTFT p50 is a median of about this
# many first events, not of the 16 that 8 streams give in 2 s (each stream
# takes ~1 s).
RP_MIN_STREAMS=96
WRK=${BENCH_WRK:-wrk}
NGINX=${BENCH_NGINX:-nginx}
# wrk takes whole seconds.
WRK_DUR=$(awk -v d="$DUR" 'BEGIN { n = int(d + 0.5); print n < 1 ? 1 : n }')

LOADGEN=$BUILD/bench/loadgen
ECHO=$BUILD/bench/echo_server
CURLGEN=$BUILD/bench/curlgen
MOCK=$BUILD/mock_upstream
POLYGW=$BUILD/polygw
CTL=$BUILD/polygwctl
RESULTS=$BUILD/bench/results.md

say() { printf 'bench: %s\n' "$*" >&2; }
# shellcheck source=tests/bench/call_config.sh
. "$(dirname "$0")/call_config.sh"
# shellcheck source=tests/bench/bench_lib.sh
. "$(dirname "$0")/bench_lib.sh"

has_section() {
    case " $SECTIONS " in *" $1 "*) return 0 ;; esac
    return 1
}

for s in $SECTIONS; do
    case $s in ping|call|memory|redis|http|realpath) ;; *) say "BENCH_SECTIONS: unknown section '$s'"; exit 2 ;; esac
done
NEED="$LOADGEN"
if has_section ping; then NEED="$NEED $ECHO"; fi
if has_section call || has_section memory; then NEED="$NEED $CURLGEN $MOCK"; fi
if has_section redis; then NEED="$NEED $MOCK"; fi
if has_section http; then NEED="$NEED $MOCK"; fi
if has_section realpath; then NEED="$NEED $MOCK $CURLGEN"; fi
for b in $NEED; do
    if [ ! -x "$b" ]; then
        say "missing $b (build it with: make $b)"
        exit 2
    fi
done
case $DUR in ''|*[!0-9.]*) say "BENCH_DURATION must be a number of seconds"; exit 2 ;; esac
case $REPS in ''|*[!0-9]*|0) say "BENCH_REPS must be a positive integer"; exit 2 ;; esac
case $PIPELINE in ''|*[!0-9]*|0) say "BENCH_PIPELINE must be a positive integer"; exit 2 ;; esac
case $CALL_WARMUP in ''|*[!0-9]*) say "BENCH_CALL_WARMUP must be an integer"; exit 2 ;; esac
case $STREAM_INTERVAL_MS in ''|*[!0-9]*|0) say "BENCH_STREAM_INTERVAL_MS must be a positive integer"; exit 2 ;; esac
case $MEM_CALLS in ''|*[!0-9]*|0) say "BENCH_MEM_CALLS must be a positive integer"; exit 2 ;; esac
case $MEM_DELAY_MS in ''|*[!0-9]*) say "BENCH_MEM_DELAY_MS must be an integer"; exit 2 ;; esac
case $REDIS_WARMUP in ''|*[!0-9]*) say "BENCH_REDIS_WARMUP must be an integer"; exit 2 ;; esac
case $REDIS_CPU in ''|*[!0-9]*) say "BENCH_REDIS_CPU must be a CPU number"; exit 2 ;; esac
case $RP_REPS in ''|*[!0-9]*|0) say "BENCH_REALPATH_REPS must be a positive integer"; exit 2 ;; esac
for n in $CALL_CLIENTS $STREAM_CLIENTS $REDIS_CLIENTS $HTTP_CLIENTS $RP_CLIENTS $RP_STREAMS; do
    case $n in ''|*[!0-9]*|0) say "BENCH_CALL_CLIENTS / BENCH_STREAM_CLIENTS / BENCH_REDIS_CLIENTS / BENCH_HTTP_CLIENTS / BENCH_REALPATH_CLIENTS / BENCH_REALPATH_STREAMS: '$n' is not a positive integer"; exit 2 ;; esac
done
if has_section http; then
    for t in "$WRK" "$NGINX" curl python3; do
        if ! command -v "$t" >/dev/null 2>&1; then
            say "the http section needs $t (tests/deps.sh installs wrk, nginx-light and curl)"
            exit 2
        fi
    done
fi
if has_section realpath; then
    for t in "$WRK" "$NGINX" curl python3 openssl getent; do
        if ! command -v "$t" >/dev/null 2>&1; then
            say "the realpath section needs $t (tests/deps.sh installs wrk, nginx-light and curl)"
            exit 2
        fi
    done
fi
if [ "$MEM_DELAY_MS" -lt 1500 ]; then
    say "BENCH_MEM_DELAY_MS must be >= 1500 (the calls must stay in flight while RSS is read)"
    exit 2
fi
case $BODY in '{'*'}') ;; *) say "BENCH_BODY must be a JSON object"; exit 2 ;; esac
LOADAVG=$(cut -d ' ' -f 1-3 /proc/loadavg 2>/dev/null || echo unknown)

# Rough duration of the runs, to warn before a long wait.
EST=0
if has_section ping; then
    # shellcheck disable=SC2086
    EST=$(echo $CLIENTS | awk -v r="$REPS" -v d="$DUR" -v e="$EST" '{ printf "%d", e + r * NF * 2 * (d + 0.4) }')
fi
if has_section call; then
    # shellcheck disable=SC2086
    EST=$(echo $CALL_CLIENTS | awk -v r="$REPS" -v d="$DUR" -v e="$EST" '{ printf "%d", e + r * NF * 2 * (d + 0.9) }')
    # shellcheck disable=SC2086
    EST=$(echo $STREAM_CLIENTS | awk -v r="$REPS" -v d="$DUR" -v e="$EST" '{ printf "%d", e + r * NF * 2 * (d + 0.8) }')
fi
if has_section memory; then
    EST=$((EST + MEM_DELAY_MS / 1000 + 4))
fi
if has_section redis; then
    # shellcheck disable=SC2086
    EST=$(echo $REDIS_CLIENTS | awk -v r="$REPS" -v d="$DUR" -v e="$EST" '{ printf "%d", e + 3 + r * NF * 2 * (d + 0.8) }')
fi
if has_section http; then
    # shellcheck disable=SC2086
    EST=$(echo $HTTP_CLIENTS | awk -v r="$REPS" -v d="$WRK_DUR" -v e="$EST" '{ printf "%d", e + 2 + r * NF * 3 * (d + 1.2) }')
fi
if has_section realpath; then
    # Per repetition: single cells of wrk (warm-up + run), stream cells of
    # a run plus the end of the last streams; then the set-up and warm-up.
    # shellcheck disable=SC2086
    EST=$(echo $RP_CLIENTS | awk -v r="$RP_REPS" -v d="$WRK_DUR" -v e="$EST" '{ printf "%d", e + r * NF * 6 * (d + 1.4) }')
    # shellcheck disable=SC2086
    EST=$(echo $RP_STREAMS | awk -v r="$RP_REPS" -v d="$DUR" -v e="$EST" '{ printf "%d", e + 12 + r * NF * 6 * (d + 1.5) }')
fi
if [ "$EST" -gt 260 ]; then
    say "warning: about $EST s of runs; the default settings stay near 3 minutes"
fi

TMP=$(mktemp -d "${TMPDIR:-/tmp}/polygw-bench.XXXXXX") || exit 2
ECHO_SOCK=$TMP/echo.sock
PGW_SOCK=$TMP/polygw.sock
CALL_SOCK=$TMP/polygw-call.sock
RCALL_SOCK=$TMP/polygw-redis.sock
ECHO_PID=
PGW_PID=
MOCK_PID=
CALL_PID=
MEM_LG_PID=
RCALL_PID=
REDIS_PID=
RP_PROV_PID=
RP_REF_PID=
RP_SIDECAR_PIDS=

# Stops what we started (stop_pid, bench_lib.sh) and removes the sockets and
# scratch files. Runs on every exit path, including ^C.
# shellcheck disable=SC2317  # invoked by trap
cleanup() {
    trap - EXIT INT TERM HUP
    stop_pid "$MEM_LG_PID"
    for p in $RP_SIDECAR_PIDS; do stop_pid "$p"; done
    stop_pid "$RP_REF_PID"
    stop_pid "$RP_PROV_PID"
    stop_pid "$NGINX_PID"
    stop_pid "$HTTP_PID"
    stop_pid "$RCALL_PID"
    stop_pid "$REDIS_PID"
    stop_pid "$CALL_PID"
    stop_pid "$MOCK_PID"
    stop_pid "$PGW_PID"
    stop_pid "$ECHO_PID"
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP


# CPU placement: on a 2-core machine the generator and the server would
# otherwise fight for the same core at random; pinning makes rows comparable.
# Every server (echo, sidecars, mock) gets CPU 0, every generator CPU 1: in
# the call section the sidecar therefore shares its core with the mock, as a
# reverse proxy benchmarked on a 2-core box does.
NCPU=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)
PIN_SRV=
PIN_LG=
PIN_NOTE="none"
if [ "$PIN" = 1 ] && [ "$NCPU" -ge 2 ] && command -v taskset >/dev/null 2>&1; then
    PIN_SRV="taskset -c 0"
    PIN_LG="taskset -c 1"
    PIN_NOTE="servers (echo, sidecars, mock) on CPU 0, generators (loadgen, curlgen) on CPU 1 (taskset)"
fi
# redis-server stands for a Redis on another host: by default it gets the
# generators' core (loadgen uses little of it in the redis rows), so that
# CPU 0 carries the same processes in memory and redis rows.
PIN_REDIS=
if [ -n "$PIN_SRV" ] && has_section redis; then
    if [ "$REDIS_CPU" -ge "$NCPU" ]; then
        say "BENCH_REDIS_CPU=$REDIS_CPU: this machine has $NCPU CPU(s)"
        exit 2
    fi
    PIN_REDIS="taskset -c $REDIS_CPU"
    PIN_NOTE="$PIN_NOTE, redis-server on CPU $REDIS_CPU"
fi
# A wedged generator must not stretch the run: its own alarm is generous
# (duration + timeout + 30 s), `timeout` is tighter when available.
# --foreground keeps it in our process group, so ^C reaches it at once.
TIMEOUT=
TIMEOUT_MEM=
if timeout --foreground 1 true >/dev/null 2>&1; then
    TIMEOUT="timeout --foreground -k 1 $(awk -v d="$DUR" 'BEGIN { printf "%d", d + 12 }')"
    TIMEOUT_MEM="timeout --foreground -k 1 $((MEM_DELAY_MS / 1000 + 50))"
fi
# curl(1) is optional: it reads the mock's counters and request records
# (connections opened per row, the same-request check, in-progress calls).
HAVE_CURL=0
if command -v curl >/dev/null 2>&1; then
    HAVE_CURL=1
fi

# wait_ready PID SOCKET: until the server answers one ping (10 s at most).
wait_ready() {
    i=0
    while [ $i -lt 100 ]; do
        kill -0 "$1" 2>/dev/null || return 1
        if [ -S "$2" ] && "$LOADGEN" --socket "$2" --requests 1 --timeout-ms 1000 \
            >/dev/null 2>&1; then
            return 0
        fi
        nap
        i=$((i + 1))
    done
    return 1
}

# field JSON KEY: a scalar from a flat one-line JSON object (loadgen's,
# curlgen's, the mock's stats).
field() {
    printf '%s\n' "$1" | sed -n "s/.*\"$2\":\"\{0,1\}\([^,\"}]*\).*/\1/p"
}

# first_error JSON: the generators' first_error string (the last key of
# their line; it may hold quotes and commas, which field() would cut).
first_error() {
    printf '%s\n' "$1" | sed -n 's/.*"first_error":"\(.*\)"}$/\1/p' | sed 's/\\"/"/g'
}

# Server CPU over a row, from /proc (utime + stime of every thread; the comm
# field of our binaries has no spaces) and /proc/uptime for the wall clock.
CLK_TCK=$(getconf CLK_TCK 2>/dev/null || echo 100)
proc_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo 0; }
uptime_s() { cut -d ' ' -f 1 /proc/uptime 2>/dev/null || echo 0; }
# pct TICKS T0 T1: TICKS as % of one core over [T0, T1] seconds.
pct() {
    awk -v c="$1" -v t="$CLK_TCK" -v a="$2" -v b="$3" \
        'BEGIN { if (b > a) printf "%.0f", c / t / (b - a) * 100; else printf "0" }'
}
# us_per TICKS N: TICKS as µs of CPU per request over N requests.
us_per() {
    awk -v c="$1" -v t="$CLK_TCK" -v n="$2" \
        'BEGIN { if (n > 0) printf "%.1f", c / t * 1e6 / n; else printf "n/a" }'
}

# best FILE COLUMN: COLUMN of the run with the highest req/s. On a shared
# machine interference only ever slows a run down, so the fastest run is the
# least disturbed one; its latencies are shown with it (one coherent run).
# On the 2-vCPU VM this was written on, runs of one cell varied by ±25% and
# the medians flipped between modes; neither statistic made a single ratio
# reproducible to better than about ±0.15, so repeat runs before trusting a
# small difference.
best() {
    sort -g -r -k 1,1 "$1" | head -n 1 | cut -d ' ' -f "$2"
}

# least FILE KEY COLUMN: COLUMN of the run with the lowest KEY column (the
# streamed cells: their req/s is the mock's pacing, their time to first
# chunk what is compared; the least disturbed run has the lowest).
least() {
    sort -g -k "$2,$2" "$1" | head -n 1 | cut -d ' ' -f "$3"
}

# median FILE COLUMN
median() {
    cut -d ' ' -f "$2" "$1" | sort -n | awk '{ v[NR] = $1 }
        END { if (NR == 0) exit; if (NR % 2) print v[(NR + 1) / 2];
              else printf "%.2f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# per_run FILE COLUMN: COLUMN of every run of a cell, in run order, on one line.
per_run() {
    cut -d ' ' -f "$2" "$1" | tr '\n' ' ' | sed 's/ $//'
}

STATUS=0

# ========================================================================
# ping: sidecar vs the echo floor
# ========================================================================

# run_row TARGET SOCKET CLIENTS: prints loadgen's JSON line (empty on failure).
run_row() {
    say "rep $rep/$REPS: ping $1, $3 client(s), ${DUR} s ..."
    # shellcheck disable=SC2086
    $TIMEOUT $PIN_LG "$LOADGEN" --socket "$2" --clients "$3" --duration "$DUR" \
        --pipeline "$PIPELINE" --warmup "$WARMUP" --timeout-ms 2000 --method ping --json \
        2>>"$TMP/loadgen.err"
}

# measure TARGET SOCKET CLIENTS SERVER_PID: one run, appended to
# $TMP/raw.TARGET.CLIENTS as "rps p50 p99 p999 errors resp_bytes lg_cpu% srv_cpu%".
measure() {
    w0=$(uptime_s)
    c0=$(proc_ticks "$4")
    j=$(run_row "$1" "$2" "$3")
    c1=$(proc_ticks "$4")
    w1=$(uptime_s)
    if [ -z "$(field "$j" rps)" ]; then
        STATUS=1
        echo "- $1, clients=$3, rep $rep: loadgen failed (see its stderr)" >>"$NOTES"
        return
    fi
    srv=$(pct "$((c1 - c0))" "$w0" "$w1")
    echo "$(field "$j" rps) $(field "$j" p50_us) $(field "$j" p99_us) $(field "$j" p999_us)" \
        "$(field "$j" errors) $(field "$j" resp_bytes_avg) $(field "$j" cpu_pct) $srv" \
        >>"$TMP/raw.$1.$3"
    if [ "$(field "$j" errors)" != 0 ]; then
        STATUS=1
        echo "- $1, clients=$3, rep $rep: $(field "$j" errors) errors, first: $(first_error "$j")" \
            >>"$NOTES"
    fi
}

ping_section() {
    NOTES=$TMP/ping.notes
    : >"$NOTES"

    # shellcheck disable=SC2086
    $PIN_SRV "$ECHO" --socket "$ECHO_SOCK" >"$TMP/echo.out" 2>"$TMP/echo.err" &
    ECHO_PID=$!
    if ! wait_ready "$ECHO_PID" "$ECHO_SOCK"; then
        say "echo server did not start:"
        cat "$TMP/echo.err" >&2
        exit 1
    fi

    SIDECAR=1
    SKIP_WHY=
    if [ ! -x "$POLYGW" ]; then
        SIDECAR=0
        SKIP_WHY="$POLYGW is not built"
    elif [ ! -f "$CONFIG" ]; then
        SIDECAR=0
        SKIP_WHY="$CONFIG does not exist"
    else
        # shellcheck disable=SC2086
        $PIN_SRV "$POLYGW" --config "$CONFIG" --socket "$PGW_SOCK" --log-level warn \
            >"$TMP/polygw.out" 2>"$TMP/polygw.err" &
        PGW_PID=$!
        if ! wait_ready "$PGW_PID" "$PGW_SOCK"; then
            SIDECAR=0
            if kill -0 "$PGW_PID" 2>/dev/null; then
                SKIP_WHY="the sidecar did not answer ping within 10 s"
            else
                SKIP_WHY="the sidecar exited at start-up"
            fi
            SKIP_WHY="$SKIP_WHY: $(tail -n 3 "$TMP/polygw.err" | tr '\n' ' ' | sed 's/ $//')"
            stop_pid "$PGW_PID"
            PGW_PID=
        fi
    fi
    if [ $SIDECAR = 0 ]; then
        say "SKIPPING ping sidecar rows: $SKIP_WHY"
    fi

    # Repetitions alternate the order of the two targets so that slow drifts
    # of the machine (other load, frequency) do not favour one of them.
    rep=1
    while [ "$rep" -le "$REPS" ]; do
        for n in $CLIENTS; do
            if [ $((rep % 2)) = 1 ] || [ $SIDECAR = 0 ]; then order="echo sidecar"; else order="sidecar echo"; fi
            for target in $order; do
                if [ "$target" = echo ]; then
                    measure echo "$ECHO_SOCK" "$n" "$ECHO_PID"
                elif [ $SIDECAR = 1 ]; then
                    measure sidecar "$PGW_SOCK" "$n" "$PGW_PID"
                fi
            done
        done
        rep=$((rep + 1))
    done
    # The call section starts its own servers: free the cores and memory.
    stop_pid "$PGW_PID"
    PGW_PID=
    stop_pid "$ECHO_PID"
    ECHO_PID=

    {
        echo "## ping: sidecar vs echo floor"
        echo
        echo "- each cell: the fastest of $REPS runs of ${DUR} s (each after ${WARMUP} warm-up requests), $PIPELINE request(s) in flight per client (1 = closed loop), 1 loadgen thread; sidecar config $CONFIG"
        echo
        echo "| target | clients | req/s | p50 µs | p99 µs | p99.9 µs | ratio vs echo (req/s) | Δp50 vs echo |"
        echo "|---|---:|---:|---:|---:|---:|---:|---:|"
        for n in $CLIENTS; do
            e=$TMP/raw.echo.$n
            s=$TMP/raw.sidecar.$n
            e_rps=
            e_p50=
            if [ -s "$e" ]; then
                e_rps=$(best "$e" 1)
                e_p50=$(best "$e" 2)
                echo "| echo | $n | $e_rps | $e_p50 | $(best "$e" 3) | $(best "$e" 4) | 1.00 | — |"
            else
                echo "| echo | $n | failed | | | | | |"
            fi
            if [ $SIDECAR = 0 ]; then
                echo "| sidecar | $n | skipped | | | | | |"
            elif [ -s "$s" ]; then
                s_rps=$(best "$s" 1)
                s_p50=$(best "$s" 2)
                ratio=$(awk -v a="$s_rps" -v b="${e_rps:-0}" \
                    'BEGIN { if (b > 0) printf "%.2f", a / b; else printf "n/a" }')
                dp50=$(awk -v a="$s_p50" -v b="${e_p50:-0}" \
                    'BEGIN { if (b > 0) printf "%+.1f µs (%+.0f%%)", a - b, (a - b) * 100 / b;
                             else printf "n/a" }')
                echo "| sidecar | $n | $s_rps | $s_p50 | $(best "$s" 3) | $(best "$s" 4) | $ratio | $dp50 |"
            else
                echo "| sidecar | $n | failed | | | | | |"
            fi
        done
        echo
        if [ $SIDECAR = 0 ]; then
            echo "- sidecar rows skipped: $SKIP_WHY"
        fi
        cat "$NOTES"
        busy=0
        for n in $CLIENTS; do
            for target in echo sidecar; do
                f=$TMP/raw.$target.$n
                [ -s "$f" ] || continue
                srv=$(median "$f" 8)
                lg=$(median "$f" 7)
                echo "- $target, clients=$n: req/s per run $(per_run "$f" 1)" \
                    "(median $(median "$f" 1), p50 median $(median "$f" 2) µs) |" \
                    "median CPU: server ${srv}%, loadgen ${lg}% |" \
                    "response $(median "$f" 6) B"
                # With 16+ clients one side should saturate its core.
                if [ "$n" -ge 16 ] && awk -v a="$srv" -v b="$lg" 'BEGIN { exit !(a < 70 && b < 70) }'; then
                    busy=1
                fi
            done
        done
        if [ $busy = 1 ]; then
            echo "- **WARNING: at 16+ clients neither the server nor loadgen used 70% of"
            echo "  its core: other processes were competing for the CPUs. Treat these"
            echo "  numbers as noise and rerun on a quiet machine.**"
        fi
        echo "- ratio = sidecar req/s ÷ echo req/s at the same client count (1.00 = no overhead);"
        echo "  Δp50 = sidecar p50 − echo p50. Latencies are round trips measured by loadgen."
        echo "  CPU is % of one core over the run (server: from /proc, warm-up included)."
        echo "  A server near 100% is the bottleneck (the ratio then compares per-request"
        echo "  costs); loadgen near 100% means the generator limits the row."
        echo
    } >"$TMP/ping.md"
}

# ========================================================================
# call: sidecar vs the same request sent straight to the mock
# ========================================================================

MOCK_PORT=
MOCK_URL=
CALL_UP=0
CALL_SKIP_WHY=

# mock_get PATH: the mock's answer to GET PATH (one line), empty without curl(1).
mock_get() {
    [ $HAVE_CURL = 1 ] || return 0
    curl -s --max-time 2 "http://127.0.0.1:$MOCK_PORT$1" 2>/dev/null
}

# Starts the mock and the call sidecar (shared by the call and memory
# sections). Sets CALL_UP=1, or CALL_SKIP_WHY; exits if the mock cannot start.
start_call_servers() {
    # 1,000 held calls cost the sidecar a client slot, an upstream socket and
    # a curl handle each, and the mock a socket each: make room when allowed.
    need=$((MEM_CALLS * 2 + 256))
    # shellcheck disable=SC3045  # ulimit -n: dash and bash both have it
    nofile=$(ulimit -n 2>/dev/null || echo unlimited)
    if [ "$nofile" != unlimited ] && [ "$nofile" -lt "$need" ]; then
        # shellcheck disable=SC3045
        ulimit -n "$need" 2>/dev/null || say "cannot raise the open-file limit to $need (it is $nofile)"
    fi

    # shellcheck disable=SC2086
    $PIN_SRV "$MOCK" --port 0 --host 127.0.0.1 >"$TMP/mock.out" 2>"$TMP/mock.err" &
    MOCK_PID=$!
    i=0
    while [ $i -lt 100 ] && [ -z "$MOCK_PORT" ]; do
        kill -0 "$MOCK_PID" 2>/dev/null || break
        MOCK_PORT=$(sed -n 's/^LISTENING \([0-9][0-9]*\)$/\1/p' "$TMP/mock.out" 2>/dev/null)
        [ -n "$MOCK_PORT" ] || nap
        i=$((i + 1))
    done
    if [ -z "$MOCK_PORT" ]; then
        say "the mock upstream did not start:"
        cat "$TMP/mock.err" >&2
        exit 1
    fi
    MOCK_URL=http://127.0.0.1:$MOCK_PORT/v1/chat/completions

    if [ ! -x "$POLYGW" ]; then
        CALL_SKIP_WHY="$POLYGW is not built"
        return
    fi
    call_config "$MOCK_PORT" >"$TMP/bench.yaml"
    # shellcheck disable=SC2086
    $PIN_SRV "$POLYGW" --config "$TMP/bench.yaml" --socket "$CALL_SOCK" --log-level warn \
        >"$TMP/polygw-call.out" 2>"$TMP/polygw-call.err" &
    CALL_PID=$!
    if ! wait_ready "$CALL_PID" "$CALL_SOCK"; then
        if kill -0 "$CALL_PID" 2>/dev/null; then
            CALL_SKIP_WHY="the sidecar did not answer ping within 10 s"
        else
            CALL_SKIP_WHY="the sidecar exited at start-up"
        fi
        CALL_SKIP_WHY="$CALL_SKIP_WHY: $(tail -n 3 "$TMP/polygw-call.err" | tr '\n' ' ' | sed 's/ $//')"
        stop_pid "$CALL_PID"
        CALL_PID=
        return
    fi
    # One real call end to end before anything is timed.
    j=$("$LOADGEN" --socket "$CALL_SOCK" --method call --params-json "$PARAMS" \
        --requests 1 --timeout-ms 5000 --json 2>>"$TMP/loadgen.err")
    if [ "$(field "$j" ok)" != 1 ]; then
        CALL_SKIP_WHY="a first call through the sidecar failed: $(first_error "$j")"
        stop_pid "$CALL_PID"
        CALL_PID=
        return
    fi
    CALL_UP=1
}

PARAMS="[{\"capability\":\"chat\",\"body\":$BODY}]"
# The streamed cells: the mock paces its events STREAM_INTERVAL_MS apart, so
# the first one travels alone (as a model's first token does) and the time
# to it measures the path, not the rest of the stream. The sidecar sets
# `stream` and `stream_options.include_usage` itself; the direct body
# carries them as the sidecar sends them.
STREAM_BODY_MOCK=$(printf '%s' "$BODY" | sed "s/^{/{\"mock\":{\"stream_interval_ms\":$STREAM_INTERVAL_MS},/")
STREAM_BODY=$(printf '%s' "$STREAM_BODY_MOCK" | sed 's/}$/,"stream":true,"stream_options":{"include_usage":true}}/')
STREAM_PARAMS="[{\"capability\":\"chat\",\"stream\":true,\"body\":$STREAM_BODY_MOCK}]"

# Compares what reached the mock from each path (headers and body of the
# newest request record): the ratio is only fair if they are the same bytes.
same_request_check() {
    [ $HAVE_CURL = 1 ] && [ $CALL_UP = 1 ] || return 0
    "$CURLGEN" --url "$MOCK_URL" --body-json "$BODY" --requests 1 >/dev/null 2>&1
    d=$(mock_get /_mock/last)
    "$LOADGEN" --socket "$CALL_SOCK" --method call --params-json "$PARAMS" --requests 1 \
        >/dev/null 2>&1
    s=$(mock_get /_mock/last)
    hd=$(printf '%s\n' "$d" | sed -n 's/.*"headers":\({[^}]*}\).*/\1/p')
    hs=$(printf '%s\n' "$s" | sed -n 's/.*"headers":\({[^}]*}\).*/\1/p')
    bd=$(printf '%s\n' "$d" | sed -n 's/.*"body":\(".*"\),"body_bytes".*/\1/p')
    bs=$(printf '%s\n' "$s" | sed -n 's/.*"body":\(".*"\),"body_bytes".*/\1/p')
    if [ -n "$hd" ] && [ "$hd" = "$hs" ] && [ -n "$bd" ] && [ "$bd" = "$bs" ]; then
        echo "- same request: both paths reached the mock with identical headers and body ($(field "$d" body_bytes) bytes): $hd" \
            >>"$CNOTES"
    else
        {
            echo "- **same request check FAILED: the two paths sent different requests; the comparison is not like for like.**"
            echo "  direct: headers $hd body $bd"
            echo "  sidecar: headers $hs body $bs"
        } >>"$CNOTES"
    fi
}

# measure_call PATH CLIENTS [SOCKET PID PREFIX NOTES WARMUP]: one run,
# appended to PREFIX.PATH.CLIENTS (default $TMP/call.PATH.CLIENTS) as
# "rps p50 p99 p999 errors resp_bytes gen_cpu% mock_cpu% sidecar_cpu%
#  mock_us/req sidecar_us/req upstream_conns_opened gen_us/req
#  ttft_p50 ttft_p99" (ttft: 0 for unstreamed paths).
# PATH direct = curlgen → mock; stream-direct = the same, streamed
# (curlgen --stream, $STREAM_BODY); stream-sidecar = loadgen `call` with
# `stream: true` → the call sidecar; any other PATH = loadgen `call` → the
# sidecar at SOCKET (default the call sidecar), PID (its pid). Sets $nreq
# (calls served, warm-up included) for the redis section.
measure_call() {
    mc_sock=${3:-$CALL_SOCK}
    mc_pid=${4:-$CALL_PID}
    mc_out=${5:-$TMP/call}
    mc_notes=${6:-$CNOTES}
    mc_warm=${7:-$CALL_WARMUP}
    nreq=0
    mc_direct=0
    case $1 in direct | stream-direct) mc_direct=1 ;; esac
    say "rep $rep/$REPS: call $1, $2 client(s), ${DUR} s ..."
    a0=$(field "$(mock_get /_mock/stats)" accepted_connections)
    w0=$(uptime_s)
    m0=$(proc_ticks "$MOCK_PID")
    s0=0
    [ $mc_direct = 1 ] || s0=$(proc_ticks "$mc_pid")
    case $1 in
    direct | stream-direct)
        mc_body=$BODY
        mc_flag=
        if [ "$1" = stream-direct ]; then
            mc_body=$STREAM_BODY
            mc_flag=--stream
        fi
        # shellcheck disable=SC2086
        j=$($TIMEOUT $PIN_LG "$CURLGEN" --url "$MOCK_URL" --body-json "$mc_body" --clients "$2" \
            --duration "$DUR" --warmup "$mc_warm" --timeout-ms 5000 $mc_flag --json \
            2>>"$TMP/loadgen.err")
        ;;
    *)
        mc_params=$PARAMS
        [ "$1" != stream-sidecar ] || mc_params=$STREAM_PARAMS
        # shellcheck disable=SC2086
        j=$($TIMEOUT $PIN_LG "$LOADGEN" --socket "$mc_sock" --method call \
            --params-json "$mc_params" --clients "$2" --duration "$DUR" --warmup "$mc_warm" \
            --timeout-ms 5000 --json 2>>"$TMP/loadgen.err")
        ;;
    esac
    m1=$(proc_ticks "$MOCK_PID")
    s1=0
    [ $mc_direct = 1 ] || s1=$(proc_ticks "$mc_pid")
    w1=$(uptime_s)
    a1=$(field "$(mock_get /_mock/stats)" accepted_connections)
    if [ -z "$(field "$j" rps)" ]; then
        STATUS=1
        echo "- $1, clients=$2, rep $rep: the generator failed (see its stderr)" >>"$mc_notes"
        return
    fi
    # Shell variables are global: never reuse the callers' loop variables.
    nreq=$(($(field "$j" ok) + mc_warm))
    conns=n/a
    if [ -n "$a0" ] && [ -n "$a1" ]; then conns=$((a1 - a0)); fi
    sc=n/a
    su=n/a
    if [ $mc_direct = 0 ]; then
        sc=$(pct "$((s1 - s0))" "$w0" "$w1")
        su=$(us_per "$((s1 - s0))" "$nreq")
    fi
    echo "$(field "$j" rps) $(field "$j" p50_us) $(field "$j" p99_us) $(field "$j" p999_us)" \
        "$(field "$j" errors) $(field "$j" resp_bytes_avg) $(field "$j" cpu_pct)" \
        "$(pct "$((m1 - m0))" "$w0" "$w1") $sc $(us_per "$((m1 - m0))" "$nreq") $su $conns" \
        "$(awk -v c="$(field "$j" cpu_pct)" -v r="$(field "$j" rps)" 'BEGIN { if (r > 0) printf "%.1f", c * 1e4 / r; else printf "n/a" }')" \
        "$(field "$j" ttft_p50_us) $(field "$j" ttft_p99_us)" \
        >>"$mc_out.$1.$2"
    if [ "$(field "$j" errors)" != 0 ] || [ "$(field "$j" warmup_errors)" != 0 ]; then
        STATUS=1
        echo "- $1, clients=$2, rep $rep: $(field "$j" errors) errors ($(field "$j" warmup_errors) in warm-up), first: $(first_error "$j")" \
            >>"$mc_notes"
    fi
}

# Shared by the call and redis sections, which compare two paths of the same
# call: rows of a cell's table (its fastest run) and the start of its note.

# floor_row NAME CLIENTS FILE [CPU_COLUMN]: the table row of the cell the
# next vs_row compares with (Δ —, ratio 1.00), from FILE's fastest run; with
# CPU_COLUMN, one more cell: that column's median. Sets floor_rps, floor_p50
# and floor_p99 (empty when the cell has no run).
floor_row() {
    floor_rps=
    floor_p50=
    floor_p99=
    fr_cpu=
    if [ -s "$3" ]; then
        floor_rps=$(best "$3" 1)
        floor_p50=$(best "$3" 2)
        floor_p99=$(best "$3" 3)
        [ -z "${4:-}" ] || fr_cpu=" $(median "$3" "$4") |"
        echo "| $1 | $2 | $floor_rps | $floor_p50 | $floor_p99 | — | — | 1.00 |$fr_cpu"
    else
        [ -z "${4:-}" ] || fr_cpu=" |"
        echo "| $1 | $2 | failed | | | | | |$fr_cpu"
    fi
}

# vs_row NAME CLIENTS FILE [CPU_COLUMN]: the row of a cell against the last
# floor_row: Δp50 and Δp99 (n/a without a floor) and the throughput ratio;
# CPU_COLUMN as in floor_row.
vs_row() {
    vr_cpu=
    if [ -s "$3" ]; then
        vr_rps=$(best "$3" 1)
        vr_p50=$(best "$3" 2)
        vr_p99=$(best "$3" 3)
        [ -z "${4:-}" ] || vr_cpu=" $(median "$3" "$4") |"
        echo "| $1 | $2 | $vr_rps | $vr_p50 | $vr_p99 |" \
            "$(awk -v a="$vr_p50" -v b="${floor_p50:-}" 'BEGIN { if (b != "") printf "%+.1f", a - b; else printf "n/a" }') |" \
            "$(awk -v a="$vr_p99" -v b="${floor_p99:-}" 'BEGIN { if (b != "") printf "%+.1f", a - b; else printf "n/a" }') |" \
            "$(awk -v a="$vr_rps" -v b="${floor_rps:-0}" 'BEGIN { if (b > 0) printf "%.2f", a / b; else printf "n/a" }') |$vr_cpu"
    else
        [ -z "${4:-}" ] || vr_cpu=" |"
        echo "| $1 | $2 | failed | | | | | |$vr_cpu"
    fi
}

# cell_note PATH CLIENTS FILE GENERATOR: the start of a cell's note, without
# a newline (each section adds fields): every run's req/s, the medians of
# req/s, p50 and p99, and the median CPU of the mock, of the sidecar (every
# PATH but direct) and of the generator, labelled GENERATOR.
cell_note() {
    cn="- $1, clients=$2: req/s per run $(per_run "$3" 1)"
    cn="$cn (median $(median "$3" 1), p50 median $(median "$3" 2) µs, p99 median $(median "$3" 3) µs) |"
    cn="$cn median CPU: mock $(median "$3" 8)% ($(median "$3" 10) µs/req)"
    if [ "$1" != direct ] && [ "$1" != stream-direct ]; then
        cn="$cn, sidecar $(median "$3" 9)% ($(median "$3" 11) µs/req)"
    fi
    printf '%s' "$cn, $4 $(median "$3" 7)% ($(median "$3" 13) µs/req)"
}

call_section() {
    CNOTES=$TMP/call.notes
    : >"$CNOTES"
    if [ $CALL_UP = 1 ]; then
        same_request_check
    else
        say "SKIPPING call sidecar rows: $CALL_SKIP_WHY"
    fi
    rep=1
    while [ "$rep" -le "$REPS" ]; do
        for n in $CALL_CLIENTS; do
            if [ $((rep % 2)) = 1 ] || [ $CALL_UP = 0 ]; then order="direct sidecar"; else order="sidecar direct"; fi
            for p in $order; do
                if [ "$p" = direct ]; then
                    measure_call direct "$n"
                elif [ $CALL_UP = 1 ]; then
                    measure_call sidecar "$n"
                fi
            done
        done
        for n in $STREAM_CLIENTS; do
            if [ $((rep % 2)) = 1 ] || [ $CALL_UP = 0 ]; then order="stream-direct stream-sidecar"; else order="stream-sidecar stream-direct"; fi
            for p in $order; do
                if [ "$p" = stream-direct ] || [ $CALL_UP = 1 ]; then
                    measure_call "$p" "$n" "" "" "" "" "$STREAM_WARMUP"
                fi
            done
        done
        rep=$((rep + 1))
    done
    # Proof that governance ran and never limited: the source's counters.
    if [ $CALL_UP = 1 ]; then
        st=$(ctl_stats)
        if [ -n "$(stat "$st" sources attempts)" ]; then
            echo "- governance after the rows (polygwctl stats): source $(stat "$st" sources name):" \
                "attempts $(stat "$st" sources attempts), successes $(stat "$st" sources successes)," \
                "failures $(stat "$st" sources failures), rate_limited $(stat "$st" sources rate_limited)," \
                "breaker $(stat "$st" sources breaker) (opened $(stat "$st" sources breaker_opened) times)," \
                "limit $(stat "$st" sources limit); calls waiting now $(stat "$st" - calls_waiting)" >>"$CNOTES"
        elif [ -n "$st" ]; then
            echo "- governance: this build's stats have no per-source state to show" >>"$CNOTES"
        fi
    fi

    {
        echo "## call: sidecar vs the same request sent directly to the mock (libcurl)"
        echo
        echo "- each cell: the fastest of $REPS runs of ${DUR} s (each after ${CALL_WARMUP} warm-up requests), closed loop (1 request in flight per client)"
        echo "- direct: curlgen (libcurl multi, keep-alive) → mock; sidecar: loadgen \`call\` → polygw (governance on: 1 chat source, max_concurrency 16384, aimd initial 16384, no quotas) → its own HTTP/1.1 client (the mock is plain http at 127.0.0.1) → mock"
        echo "- request body ($(printf '%s' "$BODY" | wc -c | tr -d ' ') bytes): \`$BODY\`"
        echo
        echo "| path | clients | req/s | p50 µs | p99 µs | Δp50 vs direct µs | Δp99 vs direct µs | throughput ratio |"
        echo "|---|---:|---:|---:|---:|---:|---:|---:|"
        for n in $CALL_CLIENTS; do
            floor_row direct "$n" "$TMP/call.direct.$n"
            if [ $CALL_UP = 0 ]; then
                echo "| sidecar | $n | skipped | | | | | |"
            else
                vs_row sidecar "$n" "$TMP/call.sidecar.$n"
            fi
        done
        echo
        if [ $CALL_UP = 0 ]; then
            echo "- sidecar rows skipped: $CALL_SKIP_WHY"
        fi
        cat "$CNOTES"
        for n in $CALL_CLIENTS; do
            for p in direct sidecar; do
                f=$TMP/call.$p.$n
                [ -s "$f" ] || continue
                echo "$(cell_note "$p" "$n" "$f" generator) | upstream connections opened per run (warm-up included): $(per_run "$f" 12)" \
                    "| response $(median "$f" 6) B"
            done
        done
        # The targets of issue 3, against this run's fastest cells.
        if [ -s "$TMP/call.direct.1" ] && [ -s "$TMP/call.sidecar.1" ]; then
            dp50=$(awk -v a="$(best "$TMP/call.sidecar.1" 2)" -v b="$(best "$TMP/call.direct.1" 2)" 'BEGIN { printf "%.1f", a - b }')
            dp99=$(awk -v a="$(best "$TMP/call.sidecar.1" 3)" -v b="$(best "$TMP/call.direct.1" 3)" 'BEGIN { printf "%.1f", a - b }')
            echo "- target (issue 3), 1 client: the sidecar adds ${dp50} µs at p50 (target ≤ 30; nginx as a plain reverse proxy adds ~39, Portkey ~1200)" \
                "and ${dp99} µs at p99 (target < 100): $(awk -v a="$dp50" -v b="$dp99" 'BEGIN { print (a <= 30 && b < 100) ? "**met**" : "**not met**" }')"
        fi
        if [ -s "$TMP/call.sidecar.64" ]; then
            s64=$(best "$TMP/call.sidecar.64" 1)
            echo "- target (issue 3), 64 clients: the sidecar served $s64 req/s (nginx ~53000 on this machine class, Portkey ~650):" \
                "$(awk -v a="$s64" 'BEGIN { printf "%.0f%% of nginx", a * 100 / 53000 }')" \
                "— but read it against the direct row of this run ($( [ -s "$TMP/call.direct.64" ] && best "$TMP/call.direct.64" 1 || echo n/a) req/s):" \
                "the sidecar shares CPU 0 with the mock, and at 1e6 ÷ (sidecar µs/req) it could serve about" \
                "$(awk -v u="$(median "$TMP/call.sidecar.64" 11)" 'BEGIN { if (u + 0 > 0) printf "%.0f", 1e6 / u; else printf "n/a" }') req/s on a core of its own"
        fi
        if [ -n "$STREAM_CLIENTS" ]; then
            echo
            echo "Streamed (\`\"stream\": true\`; the mock sends 4 content events, a finish event and a usage event ${STREAM_INTERVAL_MS} ms apart):"
            echo
            echo "| path | clients | streams/s | TTFT p50 µs | TTFT p99 µs | ΔTTFT p50 vs direct µs | ΔTTFT p99 vs direct µs | whole stream p50 µs | sidecar CPU µs/stream |"
            echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
            for n in $STREAM_CLIENTS; do
                fd=$TMP/call.stream-direct.$n
                fs=$TMP/call.stream-sidecar.$n
                t50=
                t99=
                if [ -s "$fd" ]; then
                    t50=$(least "$fd" 14 14)
                    t99=$(least "$fd" 14 15)
                    echo "| direct | $n | $(least "$fd" 14 1) | $t50 | $t99 | — | — | $(least "$fd" 14 2) | |"
                else
                    echo "| direct | $n | failed | | | | | | |"
                fi
                if [ -s "$fs" ]; then
                    s50=$(least "$fs" 14 14)
                    s99=$(least "$fs" 14 15)
                    echo "| sidecar | $n | $(least "$fs" 14 1) | $s50 | $s99 |" \
                        "$(awk -v a="$s50" -v b="$t50" 'BEGIN { if (b != "") printf "%+.1f", a - b; else printf "n/a" }') |" \
                        "$(awk -v a="$s99" -v b="$t99" 'BEGIN { if (b != "") printf "%+.1f", a - b; else printf "n/a" }') |" \
                        "$(least "$fs" 14 2) | $(median "$fs" 11) |"
                elif [ $CALL_UP = 1 ]; then
                    echo "| sidecar | $n | failed | | | | | | |"
                fi
            done
            echo
            echo "- TTFT = from sending the request to the first streamed byte: curlgen --stream, the first body byte (the first"
            echo "  \`data:\` event); loadgen, the call's first \`chunk\` notification. Each cell: the run with the lowest TTFT p50"
            echo "  of $REPS (their req/s is the mock's pacing, not the path's), after $STREAM_WARMUP untimed streams."
            for n in $STREAM_CLIENTS; do
                for p in stream-direct stream-sidecar; do
                    f=$TMP/call.$p.$n
                    [ -s "$f" ] || continue
                    echo "$(cell_note "$p" "$n" "$f" generator) | TTFT p50 per run $(per_run "$f" 14) µs | response $(median "$f" 6) B"
                done
            done
        fi
        echo "- Δ = sidecar − direct at the same client count, from each cell's fastest run;"
        echo "  throughput ratio = sidecar req/s ÷ direct req/s. Both generators run on CPU 1,"
        echo "  the mock (and in sidecar rows the sidecar too) on CPU 0. µs/req = the process's"
        echo "  CPU time (/proc, warm-up included) ÷ requests it served; it does not depend on"
        echo "  which side saturated (generator µs/req: measured phase only). A generator near"
        echo "  100% limits its row: the direct floor at 64 clients is usually curlgen-bound"
        echo "  (libcurl is not cheap for its client either), so compare µs/req as well as req/s."
        echo "  Upstream connections opened: new TCP connections the mock accepted during the run;"
        echo "  a warm keep-alive pool opens none (direct: curlgen opens one per client in its warm-up)."
        echo
    } >"$TMP/call.md"
}

# ========================================================================
# memory: RSS per call in flight
# ========================================================================

rss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status" 2>/dev/null; }

# ctl_stats [SOCKET]: the call sidecar's (or SOCKET's) `polygwctl stats
# --json` (pretty-printed, two spaces per level), empty when polygwctl is
# missing or fails.
ctl_stats() {
    [ -x "$CTL" ] || return 0
    "$CTL" --socket "${1:-$CALL_SOCK}" --timeout 2 stats --json 2>/dev/null
}

# stat STATS SECTION KEY: the scalar KEY inside top-level SECTION (its first
# occurrence, nested objects included; `-` = a top-level key), quotes
# stripped; empty when absent. Keys repeat across sections (`in_flight` is in
# `requests` and in every source), hence the section.
stat() {
    printf '%s\n' "$1" | awk -v sec="$2" -v key="$3" '
        sec == "-" && index($0, "  \"" key "\": ") == 1 { insec = 1 }
        sec != "-" && index($0, "  \"" sec "\": ") == 1 { insec = 1; next }
        insec && /^  []}]/ { exit }
        insec && index($0, "\"" key "\": ") {
            v = $0; sub(/^[^:]*: */, "", v); sub(/,$/, "", v); gsub(/"/, "", v)
            print v; exit
        }'
}

memory_section() {
    MNOTES=$TMP/mem.notes
    : >"$MNOTES"
    {
        echo "## memory per call in flight"
        echo
    } >"$TMP/mem.md"
    if [ $CALL_UP = 0 ]; then
        echo "- skipped: $CALL_SKIP_WHY" >>"$TMP/mem.md"
        say "SKIPPING memory section: $CALL_SKIP_WHY"
        return
    fi
    say "memory: $MEM_CALLS calls held ${MEM_DELAY_MS} ms by the mock ..."
    # 50 connections (like 50 application processes), each with up to
    # ceil(N / 50) calls outstanding: well under the sidecar's default of
    # 1024 in flight per connection.
    mc=50
    [ "$MEM_CALLS" -ge 50 ] || mc=$MEM_CALLS
    md=$(((MEM_CALLS + mc - 1) / mc))
    # The delay rides in the body (`"mock"` key, forwarded as-is by the
    # sidecar): no mock state to set or reset.
    slow_body=$(printf '%s' "$BODY" | sed "s/^{/{\"mock\":{\"delay_ms\":$MEM_DELAY_MS},/")
    slow_params="[{\"capability\":\"chat\",\"body\":$slow_body}]"
    # How much later than the mock's delay an answer may come: 10,000 calls
    # took the sidecar 3-5 s to open and as long again to answer on the
    # shared 2-core VM (up to ~15 s when other jobs loaded it).
    MEM_SLACK_MS=40000

    sleep 0.5 2>/dev/null || sleep 1
    idle=$(rss_kib "$CALL_PID")
    idle_inflight=$(stat "$(ctl_stats)" requests in_flight)
    # shellcheck disable=SC2086
    $TIMEOUT_MEM $PIN_LG "$LOADGEN" --socket "$CALL_SOCK" --method call \
        --params-json "$slow_params" --clients "$mc" --pipeline "$md" --requests "$MEM_CALLS" \
        --duration 10 --timeout-ms $((MEM_DELAY_MS + MEM_SLACK_MS)) --json \
        >"$TMP/mem.json" 2>>"$TMP/loadgen.err" &
    MEM_LG_PID=$!

    # Wait for every call to be in flight (at most until the mock would
    # start answering), then sample RSS three times and keep the largest.
    t_start=$(uptime_s)
    t_end=$(awk -v u="$t_start" -v d="$MEM_DELAY_MS" 'BEGIN { printf "%.2f", u + d / 1000 - 0.8 }')
    inflight=
    while :; do
        inflight=$(stat "$(ctl_stats)" requests in_flight)
        [ -n "$inflight" ] && [ "$inflight" -ge "$MEM_CALLS" ] && break
        awk -v u="$(uptime_s)" -v e="$t_end" 'BEGIN { exit !(u >= e) }' && break
        kill -0 "$MEM_LG_PID" 2>/dev/null || break
        nap
    done
    ramp=$(awk -v u="$(uptime_s)" -v a="$t_start" 'BEGIN { printf "%.1f", u - a }')
    peak=0
    k=0
    while [ $k -lt 3 ]; do
        r=$(rss_kib "$CALL_PID")
        if [ -n "$r" ] && [ "$r" -gt "$peak" ]; then peak=$r; fi
        k=$((k + 1))
        [ $k -lt 3 ] && nap
    done
    st=$(ctl_stats)
    inflight2=$(stat "$st" requests in_flight)
    active=$(stat "$st" upstream attempts_active)
    at_mock=$(field "$(mock_get /_mock/stats)" in_progress)
    wait "$MEM_LG_PID" 2>/dev/null
    MEM_LG_PID=
    j=$(cat "$TMP/mem.json" 2>/dev/null)
    sleep 0.3 2>/dev/null || sleep 1
    after=$(rss_kib "$CALL_PID")
    after_inflight=$(stat "$(ctl_stats)" requests in_flight)

    per=n/a
    if [ -n "$idle" ] && [ "$peak" -gt 0 ]; then
        per=$(awk -v a="$peak" -v b="$idle" -v n="$MEM_CALLS" 'BEGIN { printf "%.1f", (a - b) / n }')
    fi
    {
        echo "- $MEM_CALLS calls through the sidecar ($mc connections × $md outstanding), each held ${MEM_DELAY_MS} ms by the mock (\`\"mock\":{\"delay_ms\":$MEM_DELAY_MS}\` in the body); RSS = VmRSS of the sidecar from /proc"
        echo
        echo "| calls opened | in flight (polygwctl stats) | upstream attempts active | in progress at the mock | RSS idle KiB | RSS in flight KiB | KiB per call | RSS after KiB |"
        echo "|---:|---:|---:|---:|---:|---:|---:|---:|"
        echo "| $MEM_CALLS | ${inflight2:-n/a} | ${active:-n/a} | ${at_mock:-n/a} | ${idle:-n/a} | $peak | $per | ${after:-n/a} |"
        echo
        echo "- KiB per call = (RSS in flight − RSS idle) ÷ $MEM_CALLS. Idle = just before the held calls (after the call rows when they ran);"
        echo "  in flight = the largest of 3 samples taken once \`requests.in_flight\` reached $MEM_CALLS (${ramp} s after the start);"
        echo "  after = 0.3 s after the last answer (in flight then: ${after_inflight:-n/a}; idle before: ${idle_inflight:-n/a})."
        echo "  It includes everything the calls cost the process: request frames, call and attempt state, the HTTP"
        echo "  client's per-request state (the own client's for this plain-http mock), and the upstream connections' user-space state (kernel socket buffers are not in RSS)."
    } >>"$TMP/mem.md"
    if [ -z "$inflight2" ] || [ "$inflight2" -lt "$MEM_CALLS" ]; then
        echo "- **WARNING: fewer than $MEM_CALLS calls were in flight when RSS was read (${inflight2:-unknown}); KiB per call overstates nothing but is not per in-flight call.**" >>"$TMP/mem.md"
    fi
    if [ "$(field "$j" ok)" != "$MEM_CALLS" ] || [ "$(field "$j" errors)" != 0 ]; then
        STATUS=1
        echo "- the held calls did not all succeed: ok $(field "$j" ok), errors $(field "$j" errors), first: $(first_error "$j")" >>"$TMP/mem.md"
    else
        echo "- all $MEM_CALLS held calls then completed ok (latency p50 $(awk -v u="$(field "$j" p50_us)" 'BEGIN { printf "%.3f", u / 1e6 }') s, max $(awk -v u="$(field "$j" max_us)" 'BEGIN { printf "%.3f", u / 1e6 }') s)." >>"$TMP/mem.md"
    fi
    echo >>"$TMP/mem.md"
    MEM_PEAK_KIB=$peak
    MEM_INFLIGHT=${inflight2:-}
    waiting_cpu
    tracing_cpu
}

# Tracing's cost: CPU per HTTP call with every call and attempt traced and
# exported (ratio 1.0) against tracing off, two sidecars in the same run
# (tests/bench/tracing_cpu.py: its own mock and OTLP sink).
TRACE_CALLS=4000
tracing_cpu() {
    say "tracing: $TRACE_CALLS calls x 3 with tracing off and on ..."
    {
        echo "### Tracing overhead (CPU per HTTP call, tracing on at ratio 1.0 / off)"
        echo
    } >>"$TMP/mem.md"
    t_to=
    [ -z "$TIMEOUT" ] || t_to="timeout --foreground -k 1 300"
    # shellcheck disable=SC2086
    if $t_to python3 "$(dirname "$0")/tracing_cpu.py" "$BUILD" "$TRACE_CALLS" 3 \
        >"$TMP/tracing.out" 2>"$TMP/tracing.err"; then
        sed 's/^/- /' "$TMP/tracing.out" >>"$TMP/mem.md"
    else
        STATUS=1
        echo "- tracing_cpu.py failed: $(tail -n 2 "$TMP/tracing.err" | tr '\n' ' ')" >>"$TMP/mem.md"
    fi
    echo >>"$TMP/mem.md"
}

# The other half of the memory target: calls waiting for a permit cost
# memory, never CPU. tests/bench/waiting_cpu.py (its own mock and sidecar,
# one permit held, WAIT_CALLS queued behind it) prints one table row.
WAIT_CALLS=1000
WAIT_S=3
waiting_cpu() {
    WAIT_PCT=
    WAIT_N=
    {
        echo "### $WAIT_CALLS calls waiting for a permit"
        echo
    } >>"$TMP/mem.md"
    # Debian's interpreter, which has python3-msgpack, before one in PATH.
    w_py=/usr/bin/python3
    [ -x "$w_py" ] || w_py=python3
    if ! "$w_py" -c 'import msgpack' >/dev/null 2>&1; then
        echo "- skipped: python3 with the msgpack module is needed (tests/deps.sh installs python3-msgpack)" >>"$TMP/mem.md"
        echo >>"$TMP/mem.md"
        return
    fi
    say "memory: $WAIT_CALLS calls waiting for a permit, ${WAIT_S} s ..."
    w_to=
    [ -z "$TIMEOUT" ] || w_to="timeout --foreground -k 1 $((WAIT_S + 30))"
    # shellcheck disable=SC2086
    $w_to "$w_py" "$(dirname "$0")/waiting_cpu.py" "$BUILD" "$WAIT_CALLS" "$WAIT_S" \
        >"$TMP/waiting.out" 2>"$TMP/waiting.err"
    w_rc=$?
    row=$(grep '^| [0-9]' "$TMP/waiting.out" | tail -n 1)
    if [ $w_rc != 0 ] || [ -z "$row" ]; then
        STATUS=1
        echo "- waiting_cpu.py failed (exit $w_rc): $(tail -n 2 "$TMP/waiting.err" | tr '\n' ' ')" >>"$TMP/mem.md"
        echo >>"$TMP/mem.md"
        return
    fi
    WAIT_N=$(printf '%s\n' "$row" | awk -F '|' '{ gsub(/ /, "", $2); print $2 }')
    WAIT_PCT=$(printf '%s\n' "$row" | awk -F '|' '{ gsub(/ /, "", $5); print $5 }')
    {
        echo "- a sidecar whose one source admits one call at a time: one call holds the permit (the mock delays it), $WAIT_CALLS more wait behind it on 10 connections; the sidecar's CPU time (/proc) over ${WAIT_S} s of waiting"
        echo
        grep '^|' "$TMP/waiting.out"
        echo
    } >>"$TMP/mem.md"
}

# ========================================================================
# redis: the same call with the shared (Redis) backend
# ========================================================================

REDIS_PORT=
REDIS_SKIP_WHY=
RCALL_SKIP_WHY=
RCLI=
RTIMEOUT=
RPREFIX=

# redis_info: our redis-server's `INFO all` (CRs stripped); empty without
# redis-cli or when it does not answer within 5 s.
redis_info() {
    [ -n "$RCLI" ] || return 0
    # shellcheck disable=SC2086
    $RTIMEOUT "$RCLI" -h 127.0.0.1 -p "$REDIS_PORT" INFO all 2>/dev/null | tr -d '\r'
}

# rinfo INFO KEY [FIELD]: an integer of INFO, `KEY:N`, or FIELD (default
# calls) of a `cmdstat_*` line (0 when the command never ran); empty
# without INFO.
rinfo() {
    [ -n "$1" ] || return 0
    case $2 in
    cmdstat_*)
        v=$(printf '%s\n' "$1" | awk -F '[:,]' -v k="$2" -v f="${3:-calls}=" '
            $1 == k { for (i = 2; i <= NF; i++) if (index($i, f) == 1) { print substr($i, length(f) + 1); exit } }')
        echo "${v:-0}"
        ;;
    *) printf '%s\n' "$1" | sed -n "s/^$2:\([0-9]*\)\$/\1/p" ;;
    esac
}

# dlt A B [MINUS]: B − A − MINUS as an integer, n/a when either is empty.
dlt() {
    if [ -n "$1" ] && [ -n "$2" ]; then
        awk -v a="$1" -v b="$2" -v m="${3:-0}" 'BEGIN { printf "%.0f", b - a - m }'
    else
        printf 'n/a'
    fi
}

# rtt_sum STATS: the sidecar's summed Redis command RTT in ms
# (rtt_avg_ms × replies), n/a without a backend section.
rtt_sum() {
    ra=$(stat "$1" backend rtt_avg_ms)
    rr=$(stat "$1" backend replies)
    if [ -n "$ra" ] && [ -n "$rr" ]; then
        awk -v a="$ra" -v r="$rr" 'BEGIN { printf "%.6f", a * r }'
    else
        printf 'n/a'
    fi
}

# xsum FILE COLUMN: COLUMN summed over the runs of a cell; n/a when a run
# lacks it.
xsum() {
    awk -v c="$2" '{ if ($c == "n/a" || $c == "") bad = 1; else s += $c }
        END { if (bad || NR == 0) print "n/a"; else printf "%.6f\n", s }' "$1"
}

# div A B [SCALE [FORMAT]]: A × SCALE ÷ B, n/a when either is n/a or B is 0.
div() {
    awk -v a="$1" -v b="$2" -v k="${3:-1}" -v f="${4:-%.2f}" 'BEGIN {
        if (a == "n/a" || b == "n/a" || a == "" || b == "" || b + 0 <= 0) print "n/a";
        else printf f "\n", a * k / b }'
}

# start_redis: a redis-server of our own on a free 127.0.0.1 port (tried
# at random in 20000-31999, below Linux's ephemeral range, until one binds),
# no RDB, no AOF, its files in $TMP/redis. Sets REDIS_PID and REDIS_PORT, or
# REDIS_SKIP_WHY and returns 1.
start_redis() {
    mkdir -p "$TMP/redis"
    try=0
    while [ $try -lt 8 ]; do
        try=$((try + 1))
        rnd=$(od -An -N2 -tu2 /dev/urandom 2>/dev/null | tr -d ' ')
        [ -n "$rnd" ] || rnd=$(($$ * 31 + try * 977))
        port=$((20000 + rnd % 12000))
        # shellcheck disable=SC2086
        $PIN_REDIS "$REDIS_SERVER" --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
            --dir "$TMP/redis" --daemonize no >"$TMP/redis.out" 2>&1 &
        REDIS_PID=$!
        i=0
        while [ $i -lt 50 ]; do
            if grep -q 'Ready to accept connections' "$TMP/redis.out" 2>/dev/null; then
                REDIS_PORT=$port
                return 0
            fi
            kill -0 "$REDIS_PID" 2>/dev/null || break
            nap
            i=$((i + 1))
        done
        stop_pid "$REDIS_PID"
        REDIS_PID=
        grep -q -i 'address already in use' "$TMP/redis.out" 2>/dev/null || break
    done
    REDIS_SKIP_WHY="redis-server did not start: $(tail -n 2 "$TMP/redis.out" 2>/dev/null | tr '\n' ' ' | sed 's/ $//')"
    return 1
}

# start_redis_sidecar: the call sidecar's config ($TMP/bench.yaml) with its
# `backend: {kind: memory}` replaced by our Redis, under a prefix of its own;
# waits for the backend to be up and one call to succeed. Sets RCALL_PID, or
# RCALL_SKIP_WHY and returns 1.
start_redis_sidecar() {
    RPREFIX="polygw-bench-$$-$REDIS_PORT"
    awk -v url="redis://127.0.0.1:$REDIS_PORT/0" -v pfx="$RPREFIX" '
        /^# Generated by/ { print "# Generated by tests/bench/run.sh: the redis section'\''s sidecar (the call one, redis backend)."; next }
        $0 == "  kind: memory" {
            print "  kind: redis"; print "  url: \"" url "\""; print "  prefix: \"" pfx "\""
            print "  command_timeout_s: 1"; print "  lease_ttl_s: 30"; next
        }
        { print }' "$TMP/bench.yaml" >"$TMP/bench-redis.yaml"
    if ! grep -q '^  kind: redis$' "$TMP/bench-redis.yaml"; then
        RCALL_SKIP_WHY="could not derive the redis config from $TMP/bench.yaml"
        return 1
    fi
    # shellcheck disable=SC2086
    $PIN_SRV "$POLYGW" --config "$TMP/bench-redis.yaml" --socket "$RCALL_SOCK" --log-level warn \
        >"$TMP/polygw-redis.out" 2>"$TMP/polygw-redis.err" &
    RCALL_PID=$!
    if ! wait_ready "$RCALL_PID" "$RCALL_SOCK"; then
        if kill -0 "$RCALL_PID" 2>/dev/null; then
            RCALL_SKIP_WHY="the redis sidecar did not answer ping within 10 s"
        else
            RCALL_SKIP_WHY="the redis sidecar exited at start-up"
        fi
        RCALL_SKIP_WHY="$RCALL_SKIP_WHY: $(tail -n 3 "$TMP/polygw-redis.err" | tr '\n' ' ' | sed 's/ $//')"
        stop_pid "$RCALL_PID"
        RCALL_PID=
        return 1
    fi
    # The backend connects in the background: give it 5 s to be up (when
    # polygwctl is there to tell), then one real call, retried for 3 s.
    i=0
    while [ -x "$CTL" ] && [ $i -lt 50 ]; do
        [ "$(stat "$(ctl_stats "$RCALL_SOCK")" backend state)" = up ] && break
        nap
        i=$((i + 1))
    done
    i=0
    while :; do
        j=$("$LOADGEN" --socket "$RCALL_SOCK" --method call --params-json "$PARAMS" \
            --requests 1 --timeout-ms 5000 --json 2>>"$TMP/loadgen.err")
        [ "$(field "$j" ok)" = 1 ] && return 0
        i=$((i + 1))
        [ $i -lt 10 ] || break
        sleep 0.3 2>/dev/null || sleep 1
    done
    RCALL_SKIP_WHY="a first call through the redis sidecar failed: $(first_error "$j") (backend state: $(stat "$(ctl_stats "$RCALL_SOCK")" backend state), last_error: $(stat "$(ctl_stats "$RCALL_SOCK")" backend last_error))"
    stop_pid "$RCALL_PID"
    RCALL_PID=
    return 1
}

# measure_redis_row BACKEND CLIENTS: one measure_call through the memory
# sidecar (the floor) or the redis one, appended to
# $TMP/redis.BACKEND.CLIENTS, and what it cost in Redis traffic to
# $TMP/redis.x.BACKEND.CLIENTS as "calls commands replies rtt_sum_ms admits
# admitted releases evalsha redis_cmds redis_reads redis_ticks
# backend_errors backend_timeouts admit_errors write_errors
# backend_unavailable pubsub_messages script_usec" (deltas over the run, warm-up
# included; the INFO read and command around it are subtracted).
measure_redis_row() {
    if [ "$1" = memory ]; then
        r_sock=$CALL_SOCK
        r_pid=$CALL_PID
    else
        r_sock=$RCALL_SOCK
        r_pid=$RCALL_PID
    fi
    r_f=$TMP/redis.$1.$2
    r_l0=0
    [ -f "$r_f" ] && r_l0=$(wc -l <"$r_f" | tr -d ' ')
    r_st0=$(ctl_stats "$r_sock")
    r_in0=$(redis_info)
    r_t0=$(proc_ticks "$REDIS_PID")
    measure_call "$1" "$2" "$r_sock" "$r_pid" "$TMP/redis" "$RNOTES" "$REDIS_WARMUP"
    r_t1=$(proc_ticks "$REDIS_PID")
    r_in1=$(redis_info)
    r_st1=$(ctl_stats "$r_sock")
    r_l1=0
    [ -f "$r_f" ] && r_l1=$(wc -l <"$r_f" | tr -d ' ')
    [ "$r_l1" -gt "$r_l0" ] || return 0
    r_line="$nreq"
    for k in commands replies; do
        r_line="$r_line $(dlt "$(stat "$r_st0" backend $k)" "$(stat "$r_st1" backend $k)")"
    done
    r_rs0=$(rtt_sum "$r_st0")
    r_rs1=$(rtt_sum "$r_st1")
    r_line="$r_line $(awk -v a="$r_rs0" -v b="$r_rs1" 'BEGIN { if (a == "n/a" || b == "n/a") print "n/a"; else printf "%.6f", b - a }')"
    for k in admits admitted releases; do
        r_line="$r_line $(dlt "$(stat "$r_st0" shared $k)" "$(stat "$r_st1" shared $k)")"
    done
    # EVALSHA, plus EVAL (what a NOSCRIPT reload sends).
    r_e0=
    r_e1=
    if [ -n "$r_in0" ] && [ -n "$r_in1" ]; then
        r_e0=$(($(rinfo "$r_in0" cmdstat_evalsha) + $(rinfo "$r_in0" cmdstat_eval)))
        r_e1=$(($(rinfo "$r_in1" cmdstat_evalsha) + $(rinfo "$r_in1" cmdstat_eval)))
    fi
    r_line="$r_line $(dlt "$r_e0" "$r_e1")"
    # One INFO (its command and its read) falls inside each delta.
    r_line="$r_line $(dlt "$(rinfo "$r_in0" total_commands_processed)" "$(rinfo "$r_in1" total_commands_processed)" 1)"
    r_line="$r_line $(dlt "$(rinfo "$r_in0" total_reads_processed)" "$(rinfo "$r_in1" total_reads_processed)" 1)"
    r_line="$r_line $((r_t1 - r_t0))"
    for k in errors timeouts; do
        r_line="$r_line $(dlt "$(stat "$r_st0" backend $k)" "$(stat "$r_st1" backend $k)")"
    done
    for k in admit_errors write_errors; do
        r_line="$r_line $(dlt "$(stat "$r_st0" shared $k)" "$(stat "$r_st1" shared $k)")"
    done
    r_line="$r_line $(dlt "$(stat "$r_st0" rejected backend_unavailable)" "$(stat "$r_st1" rejected backend_unavailable)")"
    r_line="$r_line $(dlt "$(stat "$r_st0" backend messages)" "$(stat "$r_st1" backend messages)")"
    # Time redis-server spent inside the scripts (commandstats usec).
    r_u0=
    r_u1=
    if [ -n "$r_in0" ] && [ -n "$r_in1" ]; then
        r_u0=$(($(rinfo "$r_in0" cmdstat_evalsha usec) + $(rinfo "$r_in0" cmdstat_eval usec)))
        r_u1=$(($(rinfo "$r_in1" cmdstat_evalsha usec) + $(rinfo "$r_in1" cmdstat_eval usec)))
    fi
    r_line="$r_line $(dlt "$r_u0" "$r_u1")"
    echo "$r_line" >>"$TMP/redis.x.$1.$2"
}

redis_section() {
    RNOTES=$TMP/redis.notes
    : >"$RNOTES"
    {
        echo "## redis: the same call with the shared (Redis) backend vs the memory backend"
        echo
    } >"$TMP/redis.md"
    why=
    if [ $CALL_UP = 0 ]; then
        why=$CALL_SKIP_WHY
    elif ! command -v "$REDIS_SERVER" >/dev/null 2>&1; then
        why="$REDIS_SERVER not found (install redis-server or set BENCH_REDIS_SERVER)"
    elif ! start_redis; then
        why=$REDIS_SKIP_WHY
    else
        # redis-cli (next to redis-server first) reads the server's own counters.
        RCLI=$(dirname "$(command -v "$REDIS_SERVER")")/redis-cli
        [ -x "$RCLI" ] || RCLI=$(command -v redis-cli 2>/dev/null)
        if [ -n "$TIMEOUT" ]; then RTIMEOUT="timeout --foreground -k 1 5"; fi
        if ! start_redis_sidecar; then
            why=$RCALL_SKIP_WHY
        fi
    fi
    if [ -n "$why" ]; then
        stop_pid "$REDIS_PID"
        REDIS_PID=
        {
            echo "- skipped: $why"
            echo
        } >>"$TMP/redis.md"
        say "SKIPPING redis section: $why"
        return
    fi
    RVERSION=$(redis_info | sed -n 's/^redis_version:\(.*\)$/\1/p')
    [ -n "$RVERSION" ] || RVERSION=$("$REDIS_SERVER" --version 2>/dev/null | sed -n 's/.* v=\([^ ]*\).*/\1/p')

    rep=1
    while [ "$rep" -le "$REPS" ]; do
        for n in $REDIS_CLIENTS; do
            if [ $((rep % 2)) = 1 ]; then order="memory redis"; else order="redis memory"; fi
            for p in $order; do
                measure_redis_row "$p" "$n"
            done
        done
        rep=$((rep + 1))
    done
    st=$(ctl_stats "$RCALL_SOCK")
    if [ -n "$(stat "$st" backend state)" ]; then
        echo "- redis sidecar after the rows (polygwctl stats): backend $(stat "$st" backend state), commands $(stat "$st" backend commands), replies $(stat "$st" backend replies), pending $(stat "$st" backend pending), errors $(stat "$st" backend errors), timeouts $(stat "$st" backend timeouts), noscript_reloads $(stat "$st" backend noscript_reloads), rtt_max_ms $(stat "$st" backend rtt_max_ms | awk '{ printf "%.2f", $1 }'); shared: admits $(stat "$st" shared admits), admitted $(stat "$st" shared admitted), releases $(stat "$st" shared releases), leases_live $(stat "$st" shared leases_live), leases_lost $(stat "$st" shared leases_lost), progress_fetches $(stat "$st" shared progress_fetches); source attempts $(stat "$st" sources attempts), rate_limited $(stat "$st" sources rate_limited), breaker $(stat "$st" sources breaker); calls waiting $(stat "$st" - calls_waiting)" >>"$RNOTES"
    fi
    # Free CPU 0 and the port.
    stop_pid "$RCALL_PID"
    RCALL_PID=
    stop_pid "$REDIS_PID"
    REDIS_PID=

    lo=
    for n in $REDIS_CLIENTS; do
        if [ -z "$lo" ] || [ "$n" -lt "$lo" ]; then lo=$n; fi
    done
    {
        echo "- each cell: the fastest of $REPS runs of ${DUR} s (each after ${REDIS_WARMUP} warm-up calls), closed loop, loadgen \`call\` with the call section's body; the two backends alternate"
        echo "- memory: the call section's sidecar (\`backend: {kind: memory}\`); redis: a second sidecar with the same config but \`backend: {kind: redis, url: redis://127.0.0.1:$REDIS_PORT/0, prefix: $RPREFIX, command_timeout_s: 1, lease_ttl_s: 30}\`, against a redis-server $RVERSION of this run's own (\`--save '' --appendonly no\`), same mock"
        echo
        echo "| backend | clients | req/s | p50 µs | p99 µs | Δp50 vs memory µs | Δp99 vs memory µs | throughput ratio | sidecar CPU µs/call |"
        echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
        for n in $REDIS_CLIENTS; do
            floor_row memory "$n" "$TMP/redis.memory.$n" 11
            vs_row redis "$n" "$TMP/redis.redis.$n" 11
        done
        echo
        echo "Redis traffic of the redis sidecar (all runs of a cell, warm-up included):"
        echo
        echo "| clients | calls | backend commands / call | shared admits / call | awaited round trips / admitted attempt | EVALSHA / call (redis-server) | commands run by redis-server / call | redis-server reads / call | command RTT avg ms | script time µs/call (redis-server) | redis-server CPU µs/call |"
        echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        for n in $REDIS_CLIENTS; do
            xf=$TMP/redis.x.redis.$n
            if [ ! -s "$xf" ]; then
                echo "| $n | failed | | | | | | | | | |"
                continue
            fi
            calls=$(xsum "$xf" 1)
            echo "| $n | $(printf '%.0f' "$calls") | $(div "$(xsum "$xf" 2)" "$calls") | $(div "$(xsum "$xf" 5)" "$calls")" \
                "| $(div "$(xsum "$xf" 5)" "$(xsum "$xf" 6)" 1 %.3f) | $(div "$(xsum "$xf" 8)" "$calls")" \
                "| $(div "$(xsum "$xf" 9)" "$calls" 1 %.1f) | $(div "$(xsum "$xf" 10)" "$calls")" \
                "| $(div "$(xsum "$xf" 4)" "$(xsum "$xf" 3)" 1 %.3f) | $(div "$(xsum "$xf" 18)" "$calls" 1 %.1f)" \
                "| $(div "$(xsum "$xf" 11)" "$calls" "$(awk -v t="$CLK_TCK" 'BEGIN { printf "%.6f", 1e6 / t }')" %.1f) |"
        done
        echo
        cat "$RNOTES"
        bad=0
        for n in $REDIS_CLIENTS; do
            for b in memory redis; do
                f=$TMP/redis.$b.$n
                [ -s "$f" ] || continue
                line=$(cell_note "$b" "$n" "$f" loadgen)
                xf=$TMP/redis.x.$b.$n
                if [ -s "$xf" ]; then
                    rticks=$(xsum "$xf" 11)
                    line="$line, redis-server $(div "$rticks" "$(xsum "$xf" 1)" "$(awk -v t="$CLK_TCK" 'BEGIN { printf "%.6f", 1e6 / t }')" %.1f) µs/call"
                    if [ "$b" = redis ]; then
                        e=$(awk '{ for (c = 12; c <= 16; c++) if ($c != "n/a") s[c] += $c }
                            END { printf "%d %d %d %d %d", s[12], s[13], s[14], s[15], s[16] }' "$xf")
                        line="$line | backend errors, timeouts, admit_errors, write_errors, backend_unavailable: $e"
                        line="$line | pub/sub messages received per call: $(div "$(xsum "$xf" 17)" "$(xsum "$xf" 1)")"
                        case $e in "0 0 0 0 0") ;; *) bad=1 ;; esac
                    fi
                fi
                echo "$line | upstream connections opened per run: $(per_run "$f" 12)"
            done
            # Against the call section's direct floor, when it has this client count.
            if [ -s "$TMP/call.direct.$n" ]; then
                dp=$(best "$TMP/call.direct.$n" 2)
                echo "- vs the direct floor (call section, same run), clients=$n: p50 direct $dp µs; memory $(awk -v a="$(best "$TMP/redis.memory.$n" 2 2>/dev/null)" -v b="$dp" 'BEGIN { if (a != "") printf "%+.1f", a - b; else printf "n/a" }') µs, redis $(awk -v a="$(best "$TMP/redis.redis.$n" 2 2>/dev/null)" -v b="$dp" 'BEGIN { if (a != "") printf "%+.1f", a - b; else printf "n/a" }') µs"
            fi
        done
        if [ $bad = 1 ]; then
            STATUS=1
            echo "- **WARNING: the redis sidecar counted backend errors, timeouts or failed writes during the rows (above): some calls or their releases did not go through Redis cleanly.**"
        fi
        # The target: at most two Redis round trips per admitted attempt.
        x_all=$TMP/redis.xall
        : >"$x_all"
        for n in $REDIS_CLIENTS; do
            cat "$TMP/redis.x.redis.$n" >>"$x_all" 2>/dev/null
        done
        if [ -s "$x_all" ]; then
            aw=$(div "$(xsum "$x_all" 5)" "$(xsum "$x_all" 6)" 1 %.3f)
            cpa=$(div "$(xsum "$x_all" 2)" "$(xsum "$x_all" 6)" 1 %.3f)
            after=$(awk -v a="$cpa" -v b="$aw" 'BEGIN { if (a == "n/a" || b == "n/a") print "n/a"; else printf "%.3f", a - b }')
            rd=n/a
            if [ -s "$TMP/redis.x.redis.$lo" ]; then
                rd=$(div "$(xsum "$TMP/redis.x.redis.$lo" 10)" "$(xsum "$TMP/redis.x.redis.$lo" 1)")
            fi
            verdict=$(awk -v a="$aw" -v r="$rd" 'BEGIN {
                if (a == "n/a") { print "**not measured**"; exit }
                ok = (a <= 1.01) && (r == "n/a" || r <= 2.05)
                print ok ? "**met**" : "**not met**" }')
            echo "- target: at most two Redis round trips per admitted attempt. Awaited before the upstream request: $aw (shared admits ÷ admitted: admit.lua);" \
                "sent after it without being awaited: $after command(s) per admitted attempt (backend commands ÷ admitted = $cpa in all; release.lua + progress.lua mark, written together)." \
                "From redis-server's side, at $lo client(s) it processed $rd socket reads per call (every round trip needs at least one; more concurrency batches several calls into one read): $verdict"
        fi
        echo "- Δ = redis − memory at the same client count, from each cell's fastest run; throughput ratio = redis req/s ÷ memory req/s."
        if [ -n "$PIN_REDIS" ]; then
            echo "  Both sidecars and the mock run on CPU 0, loadgen and redis-server on CPU $REDIS_CPU: CPU 0 carries the same work in both"
            echo "  rows except the sidecar's own Redis client work, while Redis stands for a service on another host (minus the network)."
        else
            echo "  Not pinned: the sidecars, the mock, loadgen and redis-server share the machine's cores as the scheduler places them."
        fi
        echo "  Traffic columns: backend commands / call = the sidecar's \`backend.commands\` delta ÷ calls (loadgen's ok + warm-up);"
        echo "  awaited round trips = \`shared.admits\` ÷ \`shared.admitted\` (every admit.lua is awaited before the upstream request);"
        echo "  EVALSHA / call, commands run / call (scripts' inner commands included) and reads / call come from redis-server's"
        echo "  \`INFO all\` (commandstats, total_commands_processed, total_reads_processed); script time = commandstats usec of EVALSHA"
        echo "  (and EVAL) ÷ calls: Redis' own time inside the Lua scripts, on the one thread every sidecar of a fleet shares."
        echo "  Command RTT = Σ RTT ÷ replies over the runs, as the sidecar measures it: from handing a command to hiredis to"
        echo "  running its reply callback (its own event-loop delays included; the pipelined release/progress commands weigh"
        echo "  as much as the awaited admits). CPU µs = /proc utime + stime ÷ calls (redis-server's includes its idle timers)."
        echo
    } >>"$TMP/redis.md"
}

# ========================================================================
# http: polygw's HTTP front vs nginx, both proxying to the mock, one generator
# ========================================================================

HTTP_PID=
NGINX_PID=
HTTP_PORT=
NGINX_PORT=

# free_port [N]: N (default 1) distinct free loopback TCP ports, one a line
# (picked by the kernel, then released), from one interpreter start.
free_port() {
    python3 -c 'import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks: s.bind(("127.0.0.1", 0))
print("\n".join(str(s.getsockname()[1]) for s in socks))' "${1:-1}"
}

# tree_ticks PID: "utime stime" of PID and of its children (nginx: master
# and worker), in clock ticks.
tree_ticks() {
    # shellcheck disable=SC2046,SC2013  # pids: one word each
    awk '{ u += $14; s += $15 } END { print u + 0, s + 0 }' "/proc/$1/stat" \
        $(for tc in $(cat "/proc/$1/task/$1/children" 2>/dev/null); do echo "/proc/$tc/stat"; done) \
        2>/dev/null
}

# wait_http PORT PID: until GET / on PORT answers at all (10 s at most).
wait_http() {
    wait_url "$2" "http://127.0.0.1:$1/"
}

# wait_url PID CURL_ARGS...: until curl(1) with CURL_ARGS (a URL and its
# options) gets any answer, while PID lives (10 s at most).
wait_url() {
    wu_pid=$1
    shift
    i=0
    while [ $i -lt 100 ]; do
        kill -0 "$wu_pid" 2>/dev/null || return 1
        curl -s -o /dev/null --max-time 1 "$@" && return 0
        nap
        i=$((i + 1))
    done
    return 1
}

# nginx_conf_head DIR WORKER_CONNECTIONS: the start of an nginx config whose
# pid file, logs and temp paths are under DIR, up to the open `http {`.
nginx_conf_head() {
    cat <<NGX
worker_processes 1;
daemon off;
pid $1/nginx.pid;
error_log $1/error.log warn;
events { worker_connections $2; }
http {
    access_log off;
    client_body_temp_path $1/body;
    proxy_temp_path $1/proxy;
    fastcgi_temp_path $1/fastcgi;
    uwsgi_temp_path $1/uwsgi;
    scgi_temp_path $1/scgi;
NGX
}

# Starts the HTTP sidecar (the call section's config plus an `http` listener)
# and nginx (one worker, keepalive upstream pool to the mock), both on the
# servers' CPU. Sets HTTP_SKIP_WHY on failure.
start_http_servers() {
    HTTP_SKIP_WHY=
    HTTP_PORT=$(free_port)
    NGINX_PORT=$(free_port)
    mkdir -p "$TMP/nginx"
    cat "$TMP/bench.yaml" >"$TMP/bench-http.yaml"
    printf 'http:\n  listen: 127.0.0.1:%s\n' "$HTTP_PORT" >>"$TMP/bench-http.yaml"
    # shellcheck disable=SC2086
    $PIN_SRV "$POLYGW" --config "$TMP/bench-http.yaml" --socket "$TMP/polygw-http.sock" \
        --log-level warn >"$TMP/polygw-http.out" 2>"$TMP/polygw-http.err" &
    HTTP_PID=$!
    if ! wait_http "$HTTP_PORT" "$HTTP_PID"; then
        HTTP_SKIP_WHY="the HTTP sidecar did not answer: $(tail -n 3 "$TMP/polygw-http.err" | tr '\n' ' ')"
        return 1
    fi
    # A plain reverse proxy: HTTP/1.1 to a keepalive pool, no buffering to
    # disk, no access log; every path under the prefix relative to $TMP.
    {
        nginx_conf_head "$TMP/nginx" 1024
        cat <<NGX
    upstream mock { server 127.0.0.1:$MOCK_PORT; keepalive 128; }
    server {
        listen 127.0.0.1:$NGINX_PORT;
        keepalive_requests 1000000;
        location / {
            proxy_pass http://mock;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
}
NGX
    } >"$TMP/nginx/nginx.conf"
    # shellcheck disable=SC2086
    $PIN_SRV "$NGINX" -p "$TMP/nginx" -c "$TMP/nginx/nginx.conf" -e "$TMP/nginx/error.log" \
        >"$TMP/nginx.out" 2>"$TMP/nginx.err" &
    NGINX_PID=$!
    if ! wait_http "$NGINX_PORT" "$NGINX_PID"; then
        HTTP_SKIP_WHY="nginx did not start: $(tail -n 3 "$TMP/nginx/error.log" "$TMP/nginx.err" 2>/dev/null | tr '\n' ' ')"
        return 1
    fi
    NGINX_VERSION=$("$NGINX" -v 2>&1 | sed 's/.*\///')
    return 0
}

# The wrk script: POST the body, print one JSON line when done (latencies in
# µs; errors = socket errors, timeouts and answers >= 400, the last two
# also apart).
write_wrk_script() {
    {
        echo "wrk.method = \"POST\""
        echo "wrk.headers[\"Content-Type\"] = \"application/json\""
        printf 'wrk.body = [==[%s]==]\n' "$BODY"
        cat <<'LUA'
done = function(summary, latency, requests)
    local e = summary.errors
    io.write(string.format('{"requests":%d,"rps":%.0f,"p50_us":%.1f,"p99_us":%.1f,"errors":%d,"timeouts":%d,"status":%d}\n',
        summary.requests, summary.requests / (summary.duration / 1e6),
        latency:percentile(50), latency:percentile(99),
        e.connect + e.read + e.write + e.status + e.timeout, e.timeout, e.status))
end
LUA
    } >"$TMP/wrk.lua"
}

# measure_http PATH CLIENTS: one wrk run against PATH (direct = the mock,
# polygw, nginx), appended to $TMP/http.PATH.CLIENTS as
# "rps p50 p99 errors proxy_us/req proxy_user_us/req proxy_sys_us/req requests".
measure_http() {
    case $1 in
        direct) mh_port=$MOCK_PORT; mh_pid= ;;
        polygw) mh_port=$HTTP_PORT; mh_pid=$HTTP_PID ;;
        nginx) mh_port=$NGINX_PORT; mh_pid=$NGINX_PID ;;
    esac
    mh_url=http://127.0.0.1:$mh_port/v1/chat/completions
    say "rep $rep/$REPS: http $1, $2 client(s), ${WRK_DUR} s ..."
    # Warm-up, untimed: connections open, caches warm.
    # shellcheck disable=SC2086
    $TIMEOUT $PIN_LG "$WRK" -t 1 -c "$2" -d 1s -s "$TMP/wrk.lua" "$mh_url" >/dev/null 2>>"$TMP/loadgen.err"
    c0="0 0"
    [ -z "$mh_pid" ] || c0=$(tree_ticks "$mh_pid")
    # shellcheck disable=SC2086
    j=$($TIMEOUT $PIN_LG "$WRK" -t 1 -c "$2" -d "${WRK_DUR}s" -s "$TMP/wrk.lua" "$mh_url" \
        2>>"$TMP/loadgen.err" | grep '^{')
    c1="0 0"
    [ -z "$mh_pid" ] || c1=$(tree_ticks "$mh_pid")
    if [ -z "$(field "$j" rps)" ]; then
        STATUS=1
        echo "- $1, clients=$2, rep $rep: wrk failed (see its stderr)" >>"$HNOTES"
        return
    fi
    mh_us="n/a n/a n/a"
    if [ -n "$mh_pid" ]; then
        mh_u=$((${c1% *} - ${c0% *}))
        mh_s=$((${c1#* } - ${c0#* }))
        mh_n=$(field "$j" requests)
        mh_us="$(us_per "$((mh_u + mh_s))" "$mh_n") $(us_per "$mh_u" "$mh_n") $(us_per "$mh_s" "$mh_n")"
    fi
    echo "$(field "$j" rps) $(field "$j" p50_us) $(field "$j" p99_us) $(field "$j" errors) $mh_us $(field "$j" requests)" \
        >>"$TMP/http.$1.$2"
    if [ "$(field "$j" errors)" != 0 ]; then
        STATUS=1
        echo "- $1, clients=$2, rep $rep: $(field "$j" errors) errors (socket errors or non-2xx)" >>"$HNOTES"
    fi
}

http_section() {
    HNOTES=$TMP/http.notes
    : >"$HNOTES"
    {
        echo "## http: polygw's HTTP front vs nginx as a reverse proxy, same mock, same generator (wrk)"
        echo
    } >"$TMP/http.md"
    why=
    if [ $CALL_UP = 0 ]; then
        why=$CALL_SKIP_WHY
    elif ! start_http_servers; then
        why=$HTTP_SKIP_WHY
    fi
    if [ -n "$why" ]; then
        stop_pid "$NGINX_PID"
        NGINX_PID=
        stop_pid "$HTTP_PID"
        HTTP_PID=
        echo "- skipped: $why" >>"$TMP/http.md"
        echo >>"$TMP/http.md"
        say "SKIPPING http section: $why"
        STATUS=1
        return
    fi
    # The call section's sidecar is idle from here on: stop it, so that
    # CPU 0 carries the mock and one proxy only.
    stop_pid "$CALL_PID"
    CALL_PID=
    write_wrk_script
    rep=1
    while [ "$rep" -le "$REPS" ]; do
        for n in $HTTP_CLIENTS; do
            case $((rep % 3)) in
                1) order="direct polygw nginx" ;;
                2) order="nginx direct polygw" ;;
                *) order="polygw nginx direct" ;;
            esac
            for p in $order; do
                measure_http "$p" "$n"
            done
        done
        rep=$((rep + 1))
    done
    stop_pid "$NGINX_PID"
    NGINX_PID=
    stop_pid "$HTTP_PID"
    HTTP_PID=

    lo=
    hi=
    for n in $HTTP_CLIENTS; do
        if [ -z "$lo" ] || [ "$n" -lt "$lo" ]; then lo=$n; fi
        if [ -z "$hi" ] || [ "$n" -gt "$hi" ]; then hi=$n; fi
    done
    {
        echo "- each cell: the fastest of $REPS runs of ${WRK_DUR} s (each after 1 s of untimed warm-up), wrk $("$WRK" -v 2>&1 | sed -n 's/^wrk \([^ ]*\).*/\1/p') with 1 thread, closed loop (1 request in flight per connection); the three paths rotate"
        echo "- direct: wrk → mock; polygw: wrk → polygw's HTTP front (\`POST /v1/chat/completions\`, governance on, the call section's config) → mock; nginx: wrk → nginx $NGINX_VERSION (1 worker, \`proxy_pass\` to an upstream with \`keepalive 128\`, HTTP/1.1, no access log) → mock"
        echo
        echo "| path | clients | req/s | p50 µs | p99 µs | Δp50 vs direct µs | Δp99 vs direct µs | throughput ratio | proxy CPU µs/req |"
        echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
        for n in $HTTP_CLIENTS; do
            floor_row direct "$n" "$TMP/http.direct.$n" 5
            vs_row polygw "$n" "$TMP/http.polygw.$n" 5
            vs_row nginx "$n" "$TMP/http.nginx.$n" 5
        done
        echo
        cat "$HNOTES"
        for n in $HTTP_CLIENTS; do
            for p in direct polygw nginx; do
                f=$TMP/http.$p.$n
                [ -s "$f" ] || continue
                echo "- $p, clients=$n: req/s per run $(per_run "$f" 1) (median $(median "$f" 1), p50 median $(median "$f" 2) µs, p99 median $(median "$f" 3) µs)$( [ "$p" = direct ] || echo ", proxy CPU µs/req per run $(per_run "$f" 5) (median user $(median "$f" 6) + system $(median "$f" 7))")"
            done
        done
        # The comparisons: added latency at the lowest client count, CPU per
        # request at the highest, polygw against nginx.
        ratio_cpu=n/a
        if [ -s "$TMP/http.polygw.$hi" ] && [ -s "$TMP/http.nginx.$hi" ]; then
            pu=$(median "$TMP/http.polygw.$hi" 5)
            nu=$(median "$TMP/http.nginx.$hi" 5)
            ratio_cpu=$(awk -v a="$pu" -v b="$nu" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }')
            echo "- $hi clients: polygw CPU/req ÷ nginx CPU/req = $pu ÷ $nu = **$ratio_cpu** (target ≤ 1.00: $(awk -v r="$ratio_cpu" 'BEGIN { print (r != "n/a" && r <= 1) ? "met" : "not met" }'));" \
                "req/s polygw ÷ nginx = $(awk -v a="$(best "$TMP/http.polygw.$hi" 1)" -v b="$(best "$TMP/http.nginx.$hi" 1)" 'BEGIN { printf "%.2f", a / b }')"
        fi
        if [ -s "$TMP/http.direct.$lo" ] && [ -s "$TMP/http.polygw.$lo" ] && [ -s "$TMP/http.nginx.$lo" ]; then
            d50=$(best "$TMP/http.direct.$lo" 2)
            d99=$(best "$TMP/http.direct.$lo" 3)
            pa=$(awk -v a="$(best "$TMP/http.polygw.$lo" 2)" -v b="$d50" 'BEGIN { printf "%.1f", a - b }')
            na=$(awk -v a="$(best "$TMP/http.nginx.$lo" 2)" -v b="$d50" 'BEGIN { printf "%.1f", a - b }')
            pb=$(awk -v a="$(best "$TMP/http.polygw.$lo" 3)" -v b="$d99" 'BEGIN { printf "%.1f", a - b }')
            nb=$(awk -v a="$(best "$TMP/http.nginx.$lo" 3)" -v b="$d99" 'BEGIN { printf "%.1f", a - b }')
            echo "- $lo client(s): added p50 polygw $pa µs, nginx $na µs (polygw ÷ nginx $(awk -v a="$pa" -v b="$na" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'), target: within nginx's: $(awk -v a="$pa" -v b="$na" 'BEGIN { print (a <= b) ? "met" : "not met" }'));" \
                "added p99 polygw $pb µs, nginx $nb µs"
        fi
        echo "- Δ = path − direct at the same client count (fastest runs); throughput ratio = path req/s ÷ direct req/s."
        echo "  proxy CPU µs/req = utime + stime of the proxy process (/proc/PID/stat; nginx: master + worker) over the timed"
        echo "  run ÷ the requests wrk completed in it, median of the runs. wrk on CPU 1; the mock and the proxy share CPU 0"
        echo "  (one proxy runs at a time; the call section's sidecar is stopped first)."
        echo
    } >>"$TMP/http.md"
}

# ========================================================================
# realpath: an HTTPS provider by host name, single answers and streams
# ========================================================================

RP_P1=
RP_P2=
RP_R1=
RP_R2=
# The sidecars, one per provider URL (NAME BASE): TLS to the HTTP/1.1-only
# and to the h2 port, for single answers (/v1: nginx answers itself) and
# for streams (/s/v1: nginx relays the mock); plain http to the mock by name
# and by address.
RP_NAMES="tls_h1 tls_h2 str_h1 str_h2 name ip"
# The rows of the two tables, in their order (rp_target names the paths).
RP_SINGLE_ROWS="nginx_h1 polygw_h1 nginx_h2 polygw_h2 polygw_name polygw_ip"
RP_STREAM_ROWS="nginx_h2 http_h2 msgpack_h2 nginx_h1 http_h1 msgpack_h1"
RP_SBODY_MOCK=$(printf '%s' "$BODY" | sed "s/^{/{\"mock\":{\"stream_events\":$RP_EVENTS,\"stream_interval_ms\":$RP_INTERVAL_MS},/")
RP_SBODY=$(printf '%s' "$RP_SBODY_MOCK" | sed 's/}$/,"stream":true,"stream_options":{"include_usage":true}}/')
RP_SPARAMS="[{\"capability\":\"chat\",\"stream\":true,\"body\":$RP_SBODY_MOCK}]"
RP_CPU_GEN="not pinned"
RP_CPU_GW="not pinned"
if [ -n "$PIN_SRV" ]; then
    RP_CPU_GEN="CPU 1"
    RP_CPU_GW="CPU 0"
fi

# rp_certs: a throwaway CA and a server certificate for localhost (SAN
# DNS:localhost, IP:127.0.0.1) signed by it, RSA 2048 as many public
# providers' are, in $TMP/rp. Returns 1 with RP_WHY when openssl fails.
rp_certs() {
    cat >"$TMP/rp/openssl.cnf" <<'CNF'
[req]
distinguished_name = dn
prompt = no
[dn]
CN = polygw bench CA
[ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
[srv]
basicConstraints = CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = DNS:localhost,IP:127.0.0.1
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
CNF
    if ! {
        openssl req -x509 -config "$TMP/rp/openssl.cnf" -extensions ca -newkey rsa:2048 -nodes \
            -keyout "$TMP/rp/ca.key" -out "$TMP/rp/ca.crt" -days 2 &&
            openssl req -new -config "$TMP/rp/openssl.cnf" -subj /CN=localhost -newkey rsa:2048 \
                -nodes -keyout "$TMP/rp/srv.key" -out "$TMP/rp/srv.csr" &&
            openssl x509 -req -in "$TMP/rp/srv.csr" -CA "$TMP/rp/ca.crt" -CAkey "$TMP/rp/ca.key" \
                -CAcreateserial -days 2 -sha256 -extfile "$TMP/rp/openssl.cnf" -extensions srv \
                -out "$TMP/rp/srv.crt" &&
            openssl verify -CAfile "$TMP/rp/ca.crt" "$TMP/rp/srv.crt"
    } >"$TMP/rp/openssl.log" 2>&1; then
        RP_WHY="openssl could not make the certificates: $(tail -n 2 "$TMP/rp/openssl.log" | tr '\n' ' ')"
        return 1
    fi
}

# rp_take VAR: VAR = the next of the free ports in rp_ports (the section
# takes them all from one free_port call: an interpreter start is slow on a
# loaded machine).
rp_take() {
    eval "$1=\${rp_ports%% *}"
    rp_ports=${rp_ports#* }
}

# rp_nginx NAME PIN: starts nginx with $TMP/rp/NAME/nginx.conf on the CPU
# placement PIN; sets rp_npid.
rp_nginx() {
    # shellcheck disable=SC2086
    $2 "$NGINX" -p "$TMP/rp/$1" -c "$TMP/rp/$1/nginx.conf" -e "$TMP/rp/$1/error.log" \
        >"$TMP/rp/$1.out" 2>"$TMP/rp/$1.err" &
    rp_npid=$!
}

# The provider's fixed chat completion (the single-answer rows).
RP_ANSWER='{"id":"chatcmpl-bench","object":"chat.completion","created":1700000000,"model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"I am fine, thank you. How can I help you today?"},"finish_reason":"stop"}],"usage":{"prompt_tokens":21,"completion_tokens":12,"total_tokens":33}}'

# rp_provider: nginx terminating TLS 1.3 on two ports of 127.0.0.1 (and
# ::1 when localhost names it): RP_P1 HTTP/1.1 only, RP_P2 offering h2 by
# ALPN. /v1/… answers RP_ANSWER itself; /s/… goes to the mock (keepalive
# pool, no buffering), whose body member `mock` paces the stream. One
# worker, on the generators' CPU: it stands for a provider on another host.
rp_provider() {
    rp_take RP_P1
    rp_take RP_P2
    v6=
    if getent ahosts localhost 2>/dev/null | grep -q '^::1 '; then v6=1; fi
    mkdir -p "$TMP/rp/prov"
    {
        nginx_conf_head "$TMP/rp/prov" 8192
        cat <<NGX
    default_type application/json;
    keepalive_requests 1000000;
    keepalive_timeout 600s;
    ssl_certificate $TMP/rp/srv.crt;
    ssl_certificate_key $TMP/rp/srv.key;
    ssl_protocols TLSv1.3;
    upstream mock { server 127.0.0.1:$MOCK_PORT; keepalive 1024; }
NGX
        for p in "$RP_P1" "$RP_P2"; do
            h2=
            [ "$p" = "$RP_P1" ] || h2=" http2"
            echo "    server {"
            echo "        listen 127.0.0.1:$p ssl$h2;"
            [ -z "$v6" ] || echo "        listen [::1]:$p ssl$h2;"
            cat <<NGX
        location /s/ {
            proxy_pass http://mock;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }
        location / { return 200 '$RP_ANSWER'; }
    }
NGX
        done
        echo "}"
    } >"$TMP/rp/prov/nginx.conf"
    rp_nginx prov "$PIN_LG"
    RP_PROV_PID=$rp_npid
    if ! wait_url "$RP_PROV_PID" --cacert "$TMP/rp/ca.crt" "https://localhost:$RP_P2/"; then
        RP_WHY="the provider nginx did not start: $(tail -n 3 "$TMP/rp/prov/error.log" "$TMP/rp/prov.err" 2>/dev/null | tr '\n' ' ')"
        return 1
    fi
}

# rp_reference: the reference gateway, nginx (one worker, on the gateways'
# CPU) as a reverse proxy to the provider by host name, verifying it:
# RP_R1 → https://localhost:RP_P1, RP_R2 → https://localhost:RP_P2. nginx's
# proxy speaks HTTP/1.1 upstream (it has no HTTP/2 client), to both ports.
rp_reference() {
    rp_take RP_R1
    rp_take RP_R2
    mkdir -p "$TMP/rp/ref"
    {
        nginx_conf_head "$TMP/rp/ref" 8192
        cat <<NGX
    keepalive_requests 1000000;
    proxy_http_version 1.1;
    proxy_set_header Connection "";
    proxy_set_header Host localhost;
    proxy_buffering off;
    proxy_ssl_verify on;
    proxy_ssl_trusted_certificate $TMP/rp/ca.crt;
    proxy_ssl_server_name on;
    proxy_ssl_name localhost;
    proxy_ssl_session_reuse on;
    proxy_ssl_protocols TLSv1.2 TLSv1.3;
    upstream prov_h1 { server localhost:$RP_P1; keepalive 1024; keepalive_requests 1000000; keepalive_timeout 600s; }
    upstream prov_h2 { server localhost:$RP_P2; keepalive 1024; keepalive_requests 1000000; keepalive_timeout 600s; }
    server { listen 127.0.0.1:$RP_R1; location / { proxy_pass https://prov_h1; } }
    server { listen 127.0.0.1:$RP_R2; location / { proxy_pass https://prov_h2; } }
}
NGX
    } >"$TMP/rp/ref/nginx.conf"
    rp_nginx ref "$PIN_SRV"
    RP_REF_PID=$rp_npid
    if ! wait_http "$RP_R1" "$RP_REF_PID"; then
        RP_WHY="the reference nginx did not start: $(tail -n 3 "$TMP/rp/ref/error.log" "$TMP/rp/ref.err" 2>/dev/null | tr '\n' ' ')"
        return 1
    fi
}

# rp_post URL FILE [CURL_ARGS...]: POSTs the chat body (a streamed one with
# `--stream`) to URL, the answer into FILE; prints "STATUS HTTP_VERSION".
rp_post() {
    rp_b=$BODY
    rp_url=$1
    rp_file=$2
    shift 2
    if [ "${1:-}" = --stream ]; then
        rp_b=$RP_SBODY
        shift
    fi
    curl -s -o "$rp_file" -w '%{http_code} %{http_version}' --max-time 10 \
        -H 'Content-Type: application/json' --data-binary "$rp_b" "$@" "$rp_url"
}

# rp_sidecar NAME BASE_URL [CA_FILE]: starts a sidecar with the call
# section's config but its source at BASE_URL (verified against CA_FILE),
# plus an HTTP listener (rp_sidecar_check waits for it). Sets RP_PID_NAME,
# RP_PORT_NAME and RP_URL_NAME.
rp_sidecar() {
    rp_take rp_port
    call_config "$MOCK_PORT" "$2" "${3:-}" >"$TMP/rp/$1.yaml"
    printf 'http:\n  listen: 127.0.0.1:%s\n' "$rp_port" >>"$TMP/rp/$1.yaml"
    # shellcheck disable=SC2086
    $PIN_SRV "$POLYGW" --config "$TMP/rp/$1.yaml" --socket "$TMP/rp/$1.sock" --log-level warn \
        >"$TMP/rp/$1.out" 2>"$TMP/rp/$1.err" &
    RP_SIDECAR_PIDS="$RP_SIDECAR_PIDS $!"
    eval "RP_PID_$1=$! RP_PORT_$1=$rp_port RP_URL_$1=$2"
}

# rp_sidecar_check NAME: until the sidecar NAME answers, then one request
# through its HTTP front must answer 200; returns 1 with RP_WHY otherwise.
rp_sidecar_check() {
    rp_u=
    eval "rp_pid=\$RP_PID_$1 rp_port=\$RP_PORT_$1 rp_u=\$RP_URL_$1"
    if ! wait_http "$rp_port" "$rp_pid"; then
        RP_WHY="the sidecar for $rp_u did not start: $(tail -n 3 "$TMP/rp/$1.err" | tr '\n' ' ')"
        return 1
    fi
    rp_s=$(rp_post "http://127.0.0.1:$rp_port/v1/chat/completions" "$TMP/rp/$1.first")
    if [ "${rp_s% *}" != 200 ]; then
        RP_WHY="a first request through the sidecar for $rp_u answered ${rp_s% *}: $(head -c 300 "$TMP/rp/$1.first" 2>/dev/null)"
        return 1
    fi
}

# rp_stop PID...: stops them together (TERM to all, then stop_pid each).
rp_stop() {
    for p in "$@"; do kill -TERM "$p" 2>/dev/null; done
    for p in "$@"; do stop_pid "$p"; done
}

# rp_target KIND PATH: sets rp_url (or rp_sock) and rp_pid of a row's path.
# KIND single: nginx_h1, nginx_h2, polygw_h1, polygw_h2, polygw_name,
# polygw_ip; KIND stream: nginx_h1, nginx_h2, http_h1, http_h2, msgpack_h1,
# msgpack_h2 (the last four: the stream sidecars' two fronts).
rp_target() {
    rp_sock=
    rp_pfx=/v1
    [ "$1" = single ] || rp_pfx=/s/v1
    case $2 in
        nginx_h1) rp_port=$RP_R1; rp_pid=$RP_REF_PID ;;
        nginx_h2) rp_port=$RP_R2; rp_pid=$RP_REF_PID ;;
        *)
            case $1.$2 in
                single.polygw_h1) rp_n=tls_h1 ;;
                single.polygw_h2) rp_n=tls_h2 ;;
                single.polygw_name) rp_n=name ;;
                single.polygw_ip) rp_n=ip ;;
                stream.*_h1) rp_n=str_h1 ;;
                stream.*_h2) rp_n=str_h2 ;;
            esac
            rp_pfx=/v1
            eval "rp_port=\$RP_PORT_$rp_n rp_pid=\$RP_PID_$rp_n"
            case $2 in msgpack_*) rp_sock=$TMP/rp/$rp_n.sock ;; esac
            ;;
    esac
    rp_url=http://127.0.0.1:$rp_port$rp_pfx/chat/completions
}

# rp_ticks PID: "utime stime run_ns" of PID and its children: tree_ticks,
# and the run time of their live threads in ns (/proc/PID/task/TID/schedstat).
rp_ticks() {
    # shellcheck disable=SC2046,SC2013  # pids: one word each
    echo "$(tree_ticks "$1") $(cat /proc/"$1"/task/*/schedstat \
        $(for tc in $(cat "/proc/$1/task/$1/children" 2>/dev/null); do echo /proc/"$tc"/task/*/schedstat; done) \
        2>/dev/null | awk '{ s += $1 } END { printf "%.0f", s }')"
}

# rp_cpu T0 T1 N: "total user system" µs of CPU per unit over N units, from
# two rp_ticks readings. The total is the threads' run time in ns (a stream
# cell of 8 streams uses a few clock ticks of CPU: ticks would be too
# coarse), unless the ticks say more by over 2 ticks: CPU of threads that
# ended during the run (libcurl's resolver threads), which only they count.
# The user/system split is the ticks'.
rp_cpu() {
    echo "$1 $2" | awk -v t="$CLK_TCK" -v n="$3" '{
        u = $4 - $1; s = $5 - $2; ns = $6 - $3
        tick_us = (u + s) * 1e6 / t; run_us = ns / 1e3
        tot = (tick_us - run_us > 2e6 / t) ? tick_us : run_us
        if (n > 0) printf "%.1f %.1f %.1f", tot / n, u * 1e6 / t / n, s * 1e6 / t / n
        else printf "n/a n/a n/a" }'
}

# rp_single PATH CLIENTS: one wrk run of single answers (after 1 s of
# untimed warm-up), appended to $TMP/rp.s.PATH.CLIENTS as
# "rps p50 p99 errors timeouts status≥400 gw_us/req gw_user gw_sys requests".
rp_single() {
    rp_target single "$1"
    say "rep $rep/$RP_REPS: realpath $1, $2 connections, ${WRK_DUR} s ..."
    # shellcheck disable=SC2086
    $TIMEOUT $PIN_LG "$WRK" -t 1 -c "$2" -d 1s --timeout 5s -s "$TMP/wrk.lua" "$rp_url" \
        >/dev/null 2>>"$TMP/loadgen.err"
    rp_c0=$(rp_ticks "$rp_pid")
    # shellcheck disable=SC2086
    j=$($TIMEOUT $PIN_LG "$WRK" -t 1 -c "$2" -d "${WRK_DUR}s" --timeout 5s -s "$TMP/wrk.lua" \
        "$rp_url" 2>>"$TMP/loadgen.err" | grep '^{')
    rp_c1=$(rp_ticks "$rp_pid")
    if [ -z "$(field "$j" rps)" ]; then
        STATUS=1
        echo "- $1, $2 connections, rep $rep: wrk failed (see its stderr)" >>"$RP_NOTES"
        return
    fi
    echo "$(field "$j" rps) $(field "$j" p50_us) $(field "$j" p99_us) $(field "$j" errors)" \
        "$(field "$j" timeouts) $(field "$j" status) $(rp_cpu "$rp_c0" "$rp_c1" "$(field "$j" requests)")" \
        "$(field "$j" requests)" >>"$TMP/rp.s.$1.$2"
    if [ "$(field "$j" errors)" != 0 ]; then
        STATUS=1
        echo "- $1, $2 connections, rep $rep: $(field "$j" errors) errors ($(field "$j" timeouts) timeouts, $(field "$j" status) answers ≥ 400)" >>"$RP_NOTES"
    fi
}

# rp_stream PATH CLIENTS [BODY]: one run of CLIENTS concurrent streams for
# BENCH_DURATION, then until every stream begun has ended (curlgen --stream
# on the HTTP paths, loadgen `call` with `stream: true` on the msgpack
# front), appended to $TMP/rp.t.PATH.CLIENTS as "streams/s p50 p99 ok
# started timeouts http_errors other_errors gw_us/stream gw_user gw_sys
# ttft_p50 gen_cpu%". With BODY (the warm-up's), nothing is recorded.
rp_stream() {
    rp_target stream "$1"
    rp_warm=${3:-}
    rp_dur=$(awk -v d="$DUR" -v n="$2" -v m="$RP_MIN_STREAMS" 'BEGIN {
        t = m / n; if (t > int(t)) t = int(t) + 1; print (t > d ? t : d) }')
    [ -z "$rp_warm" ] || rp_dur=1
    [ -n "$rp_warm" ] || say "rep $rep/$RP_REPS: realpath streams $1, $2 streams, ${rp_dur} s ..."
    rp_c0=$(rp_ticks "$rp_pid")
    rp_perf=
    case $1 in http_* | msgpack_*)
        if [ -n "${BENCH_PERF_DIR:-}" ] && [ -z "$rp_warm" ]; then
            perf record -q -F 999 --call-graph dwarf,16384 -p "$rp_pid" \
                -o "$BENCH_PERF_DIR/$1-$2-$rep.data" >/dev/null 2>&1 &
            rp_perf=$!
        fi ;;
    esac
    if [ -n "$rp_sock" ]; then
        # shellcheck disable=SC2086
        j=$($TIMEOUT $PIN_LG "$LOADGEN" --socket "$rp_sock" --method call \
            --params-json "$RP_SPARAMS" --clients "$2" --duration "$rp_dur" --timeout-ms 5000 \
            --json 2>>"$TMP/loadgen.err")
    else
        # shellcheck disable=SC2086
        j=$($TIMEOUT $PIN_LG "$CURLGEN" --url "$rp_url" --body-json "${rp_warm:-$RP_SBODY}" \
            --stream --clients "$2" --duration "$rp_dur" \
            --timeout-ms 5000 --json 2>>"$TMP/loadgen.err")
    fi
    rp_c1=$(rp_ticks "$rp_pid")
    if [ -n "$rp_perf" ]; then
        kill -INT "$rp_perf" 2>/dev/null
        wait "$rp_perf" 2>/dev/null
    fi
    [ -z "$rp_warm" ] || return 0
    if [ -z "$(field "$j" rps)" ]; then
        STATUS=1
        echo "- streams $1, $2 streams, rep $rep: the generator failed (see its stderr)" >>"$RP_NOTES"
        return
    fi
    rp_to=$(field "$j" err_timeout)
    # A wrong answer: an RPC error (loadgen), a status other than 200 or a
    # body that is not a whole stream (curlgen).
    if [ -n "$rp_sock" ]; then
        rp_http=$(field "$j" err_rpc)
    else
        rp_http=$(($(field "$j" err_http) + $(field "$j" err_body)))
    fi
    echo "$(field "$j" rps) $(field "$j" p50_us) $(field "$j" p99_us) $(field "$j" ok) $(field "$j" sent)" \
        "$rp_to $rp_http $(($(field "$j" errors) - rp_to - rp_http))" \
        "$(rp_cpu "$rp_c0" "$rp_c1" "$(field "$j" sent)") $(field "$j" ttft_p50_us) $(field "$j" cpu_pct)" \
        >>"$TMP/rp.t.$1.$2"
    if [ "$(field "$j" errors)" != 0 ]; then
        STATUS=1
        echo "- streams $1, $2 streams, rep $rep: $(field "$j" errors) of $(field "$j" sent) streams failed ($rp_to timeouts), first: $(first_error "$j")" >>"$RP_NOTES"
    fi
}

# rp_stats FILE PREFIX: shell assignments (for eval) of a cell's figures,
# from one pass over its runs, every variable PREFIX_NAME, empty when FILE
# has no run. Single-answer cells ($TMP/rp.s.*): from the fastest run rps,
# p50, p99; the medians us, user, sys (gateway CPU); the sums to
# (timeouts), st (answers ≥ 400); the per-run lists rpsruns, usruns; rpsmed.
# Stream cells ($TMP/rp.t.*): from the least disturbed run (the most streams
# completed of those begun, then the lowest p99) sps, p50, p99; the medians
# ttft (the runs' TTFT p50, ms), us, user, sys, gen (generator CPU %); the sums ok, sent, to,
# http, other; fin (ok ÷ begun, all runs); the lists p99runs (ms), usruns.
rp_stats() {
    for v in rps p50 p99 us user sys to st rpsruns usruns rpsmed sps ttft gen ok sent http other fin p99runs; do
        echo "$2_$v="
    done
    [ -s "$1" ] || return 0
    case $1 in */rp.s.*) rs_k=s ;; *) rs_k=t ;; esac
    awk -v k="$rs_k" -v p="$2" '
        function med(col,   a, i, j, t) {
            for (i = 1; i <= NR; i++) a[i] = v[i, col] + 0
            for (i = 2; i <= NR; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
            return sprintf("%.1f", NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2)
        }
        function runs(col, scale,   i, o) {
            for (i = 1; i <= NR; i++) o = o (i > 1 ? "," : "") (scale ? sprintf("%.1f", v[i, col] / scale) : v[i, col])
            return o
        }
        function out(name, val) { printf "%s_%s=\"%s\"\n", p, name, val }
        { for (i = 1; i <= NF; i++) v[NR, i] = $i; s4 += $4; s5 += $5; s6 += $6; s7 += $7; s8 += $8 }
        END {
            b = 1
            for (i = 2; i <= NR; i++) {
                if (k == "s") { if (v[i, 1] + 0 > v[b, 1] + 0) b = i; continue }
                fi = v[i, 5] > 0 ? v[i, 4] / v[i, 5] : 0; fb = v[b, 5] > 0 ? v[b, 4] / v[b, 5] : 0
                if (fi > fb || (fi == fb && v[i, 3] + 0 < v[b, 3] + 0)) b = i
            }
            if (k == "s") {
                out("rps", v[b, 1]); out("p50", v[b, 2]); out("p99", v[b, 3])
                out("us", med(7)); out("user", med(8)); out("sys", med(9))
                out("to", s5); out("st", s6); out("rpsruns", runs(1)); out("usruns", runs(7)); out("rpsmed", med(1))
            } else {
                out("sps", v[b, 1]); out("p50", sprintf("%.1f", v[b, 2] / 1000)); out("p99", sprintf("%.1f", v[b, 3] / 1000))
                out("ttft", sprintf("%.2f", med(12) / 1000))
                out("us", med(9)); out("user", med(10)); out("sys", med(11)); out("gen", med(13))
                out("ok", s4); out("sent", s5); out("to", s6); out("http", s7); out("other", s8)
                out("fin", s5 > 0 ? sprintf("%.3f", s4 / s5) : "n/a")
                out("p99runs", runs(3, 1000)); out("usruns", runs(9))
            }
        }' "$1"
}

# rp_ratio A B [FORMAT]: A ÷ B, n/a when either is missing or B is 0.
rp_ratio() {
    awk -v a="$1" -v b="$2" -v f="${3:-%.2f}" 'BEGIN {
        if (a == "" || b == "" || a == "n/a" || b == "n/a" || b + 0 <= 0) print "n/a"; else printf f, a / b }'
}

realpath_section() {
    RP_NOTES=$TMP/rp.notes
    : >"$RP_NOTES"
    mkdir -p "$TMP/rp"
    {
        echo "## realpath: an HTTPS provider by host name, single answers and streams, polygw vs nginx"
        echo
    } >"$TMP/realpath.md"
    # The other sections' sidecars are idle from here on: free CPU 0.
    stop_pid "$CALL_PID"
    CALL_PID=
    NGINX_VERSION=$("$NGINX" -v 2>&1 | sed 's/.*\///')
    RP_WHY=
    RP_PGW=1
    RP_PGW_WHY=
    # Two provider ports, two reference ones, one per sidecar.
    rp_ports="$(free_port 10 | tr '\n' ' ')"
    if ! rp_certs || ! rp_provider || ! rp_reference; then
        stop_pid "$RP_REF_PID"
        RP_REF_PID=
        stop_pid "$RP_PROV_PID"
        RP_PROV_PID=
        {
            echo "- skipped: $RP_WHY"
            echo
        } >>"$TMP/realpath.md"
        say "SKIPPING realpath section: $RP_WHY"
        STATUS=1
        return
    fi
    if [ ! -x "$POLYGW" ]; then
        RP_PGW=0
        RP_PGW_WHY="$POLYGW is not built"
    else
        for n in $RP_NAMES; do
            case $n in
                tls_h1) rp_b="https://localhost:$RP_P1/v1 $TMP/rp/ca.crt" ;;
                tls_h2) rp_b="https://localhost:$RP_P2/v1 $TMP/rp/ca.crt" ;;
                str_h1) rp_b="https://localhost:$RP_P1/s/v1 $TMP/rp/ca.crt" ;;
                str_h2) rp_b="https://localhost:$RP_P2/s/v1 $TMP/rp/ca.crt" ;;
                name) rp_b="http://localhost:$MOCK_PORT/v1" ;;
                ip) rp_b="http://127.0.0.1:$MOCK_PORT/v1" ;;
            esac
            # shellcheck disable=SC2086  # URL and CA file: one word each
            rp_sidecar "$n" $rp_b
        done
        for n in $RP_NAMES; do
            if ! rp_sidecar_check "$n"; then
                RP_PGW=0
                RP_PGW_WHY=$RP_WHY
                break
            fi
        done
    fi
    if [ $RP_PGW = 0 ]; then
        # shellcheck disable=SC2086
        rp_stop $RP_SIDECAR_PIDS
        RP_SIDECAR_PIDS=
        STATUS=1
        say "SKIPPING realpath polygw rows: $RP_PGW_WHY"
    fi
    # What each provider port negotiates, and that the reference reaches
    # both (a reference answering 502 would make every row meaningless).
    a1=$(rp_post "https://localhost:$RP_P1/v1/chat/completions" /dev/null --cacert "$TMP/rp/ca.crt")
    a2=$(rp_post "https://localhost:$RP_P2/v1/chat/completions" /dev/null --cacert "$TMP/rp/ca.crt")
    echo "- provider check (curl, ALPN h2 and http/1.1 offered): port $RP_P1 answered ${a1% *} over HTTP/${a1#* }, port $RP_P2 answered ${a2% *} over HTTP/${a2#* }" >>"$RP_NOTES"
    if [ "${a1#* }" != 1.1 ] || [ "${a2#* }" != 2 ]; then
        echo "- **WARNING: the provider's ports did not negotiate HTTP/1.1 and h2 as intended: the h1/h2 rows are not what they say.**" >>"$RP_NOTES"
    fi
    rp_bad=
    for r in "$RP_R1" "$RP_R2"; do
        s1=$(rp_post "http://127.0.0.1:$r/v1/chat/completions" /dev/null)
        s2=$(rp_post "http://127.0.0.1:$r/s/v1/chat/completions" /dev/null --stream)
        [ "${s1% *}" = 200 ] && [ "${s2% *}" = 200 ] || rp_bad="$rp_bad port $r: ${s1% *}/${s2% *}"
    done
    if [ -n "$rp_bad" ]; then
        STATUS=1
        echo "- **WARNING: the reference nginx did not answer 200 to a single and a streamed request:$rp_bad ($(tail -n 2 "$TMP/rp/ref/error.log" 2>/dev/null | tr '\n' ' '))**" >>"$RP_NOTES"
    fi
    write_wrk_script
    rp_single_paths="nginx_h1 nginx_h2"
    rp_stream_paths="nginx_h1 nginx_h2"
    if [ $RP_PGW = 1 ]; then
        rp_single_paths=$RP_SINGLE_ROWS
        rp_stream_paths=$RP_STREAM_ROWS
    fi
    # Pools warm before anything is timed: a second of instant streams on
    # every HTTP stream path at the highest stream count (the msgpack front
    # shares its sidecar's pool with the HTTP front).
    rp_fast=$(printf '%s' "$RP_SBODY" | sed 's/"stream_interval_ms":[0-9]*/"stream_interval_ms":0/')
    rp_top=$(highest "$RP_STREAMS")
    for p in $rp_stream_paths; do
        case $p in msgpack_*) continue ;; esac
        say "realpath: warming the $p pool ($rp_top instant streams, 1 s) ..."
        rp_stream "$p" "$rp_top" "$rp_fast"
    done
    rep=1
    while [ "$rep" -le "$RP_REPS" ]; do
        # Every repetition starts the rotation one path later.
        for n in $RP_CLIENTS; do
            # shellcheck disable=SC2086  # a list of words
            for p in $(rotate "$rep" $rp_single_paths); do
                rp_single "$p" "$n"
            done
        done
        for n in $RP_STREAMS; do
            # shellcheck disable=SC2086  # a list of words
            for p in $(rotate "$rep" $rp_stream_paths); do
                rp_stream "$p" "$n"
            done
        done
        rep=$((rep + 1))
    done
    # shellcheck disable=SC2086
    rp_stop "$RP_REF_PID" $RP_SIDECAR_PIDS "$RP_PROV_PID"
    RP_REF_PID=
    RP_SIDECAR_PIDS=
    RP_PROV_PID=
    rp_section_table >>"$TMP/realpath.md"
}

# rotate K WORD...: the words with the first K-1 (modulo their number)
# moved to the end: repetition K's order of a section's paths.
rotate() {
    rt_k=$1
    shift
    rt_n=$#
    rt_k=$(((rt_k - 1) % rt_n))
    rt_out=
    rt_i=0
    for w in "$@"; do
        if [ $rt_i -lt $rt_k ]; then rt_out="$rt_out $w"; else printf '%s ' "$w"; fi
        rt_i=$((rt_i + 1))
    done
    echo "$rt_out"
}

# rp_label PATH, rp_provider_label PATH: a row's path and provider, as the
# tables name them.
rp_label() {
    case $1 in
        nginx_*) echo nginx ;;
        polygw_h*) echo "polygw HTTP front" ;;
        polygw_name) echo "polygw HTTP front → http://localhost (the mock)" ;;
        polygw_ip) echo "polygw HTTP front → http://127.0.0.1 (the mock)" ;;
        http_*) echo "polygw HTTP front" ;;
        msgpack_*) echo "polygw msgpack front" ;;
    esac
}

rp_provider_label() {
    case $1 in
        *_h1) echo "HTTPS, HTTP/1.1 only" ;;
        *_h2) echo "HTTPS, h2 offered" ;;
        *) echo "plain http" ;;
    esac
}

# rp_row_head KIND PATH N BLANKS: loads the figures (c_*) of the cell
# $TMP/rp.KIND.PATH.N and sets row to the row's first cells; when the cell
# has nothing to show, prints its row as `skipped` (a polygw path, the
# sidecars did not start) or `failed`, BLANKS after, and returns 1.
rp_row_head() {
    row="| $(rp_provider_label "$2") | $(rp_label "$2") | $3 |"
    eval "$(rp_stats "$TMP/rp.$1.$2.$3" c)"
    case $2 in
        nginx_*) ;;
        *) if [ $RP_PGW = 0 ]; then echo "$row skipped$4"; return 1; fi ;;
    esac
    if [ -z "$c_us" ]; then
        echo "$row failed$4"
        return 1
    fi
}

# rp_section_table: the realpath section's tables and notes, from the runs
# in $TMP/rp.s.* and $TMP/rp.t.*.
# shellcheck disable=SC2154  # c_* and f_*: assigned by eval "$(rp_stats …)"
rp_section_table() {
    echo "- provider: nginx $NGINX_VERSION (1 worker, $RP_CPU_GEN) terminating TLS 1.3 with a certificate for \`localhost\` from a throwaway CA made by this run; port $RP_P1 HTTP/1.1 only, port $RP_P2 offering h2 by ALPN (\`http2_max_concurrent_streams\` 128, nginx's default); single answers: nginx answers a fixed chat completion itself; streams: it relays the mock (keepalive pool, \`proxy_buffering off\`), whose body member \`\"mock\":{\"stream_events\":$RP_EVENTS,\"stream_interval_ms\":$RP_INTERVAL_MS}\` makes it send $RP_EVENTS content events, a finish event and a usage event ${RP_INTERVAL_MS} ms apart"
    echo "- gateways ($RP_CPU_GW, one at a time loaded): nginx (1 worker) \`proxy_pass https://\` to \`upstream { server localhost:PORT; keepalive 1024; }\`, \`proxy_ssl_verify on\` against the CA, SNI and name \`localhost\`, TLS 1.2-1.3, session reuse, HTTP/1.1 (nginx has no HTTP/2 client), no buffering; polygw: the call section's config with \`base_url: https://localhost:PORT/v1\` and \`tls: {ca_file: <the CA>}\`, plus \`http: {listen: …}\`, one sidecar per provider URL; the msgpack front is the stream sidecar's Unix socket"
    echo "- generators ($RP_CPU_GEN) with the provider and the mock: single answers wrk (1 thread, \`--timeout 5s\`, 1 s warm-up per run); streams curlgen \`--stream\` (HTTP fronts; a stream is ok when it is a 200 ending in \`data: [DONE]\`) and loadgen \`call\` with \`stream: true\` (msgpack front), both stopping new streams after ${DUR} s and then waiting for every stream begun (5 s timeout each); the pools warmed once by 1 s of instant streams"
    echo "- each cell: $RP_REPS run(s), the paths rotating; the table shows a cell's fastest run (single answers) or the run with the most streams completed, then the lowest p99 (streams); TTFT and CPU columns: the median of the runs; a stream run lasts ${DUR} s, or long enough to begin about $RP_MIN_STREAMS streams at low stream counts"
    echo
    echo "Single answers:"
    echo
    echo "| provider | path | connections | req/s | p50 µs | p99 µs | gateway CPU µs/req | CPU ÷ nginx's | req/s ÷ nginx's | timeouts | answers ≥ 400 |"
    echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    for n in $RP_CLIENTS; do
        for p in $RP_SINGLE_ROWS; do
            rp_row_head s "$p" "$n" " | | | | | | | |" || continue
            # The floor of a polygw row: nginx on the same provider; of the
            # by-name row: the by-address one.
            case $p in
                polygw_h1) fl=$TMP/rp.s.nginx_h1.$n ;;
                polygw_h2) fl=$TMP/rp.s.nginx_h2.$n ;;
                polygw_name) fl=$TMP/rp.s.polygw_ip.$n ;;
                *) fl= ;;
            esac
            rc=—
            rr=—
            if [ -n "$fl" ]; then
                eval "$(rp_stats "$fl" f)"
                rc=$(rp_ratio "$c_us" "$f_us")
                rr=$(rp_ratio "$c_rps" "$f_rps")
                [ "$p" != polygw_name ] || { rc="$rc (÷ 127.0.0.1's)"; rr="$rr (÷ 127.0.0.1's)"; }
            fi
            echo "$row $c_rps | $c_p50 | $c_p99 | $c_us | $rc | $rr | $c_to | $c_st |"
        done
    done
    echo
    echo "Streams ($RP_EVENTS content events, a finish and a usage event, ${RP_INTERVAL_MS} ms apart: the mock takes $(awk -v e="$RP_EVENTS" -v i="$RP_INTERVAL_MS" 'BEGIN { printf "%.2f", e * i / 1000 }') s to send one):"
    echo
    echo "| provider | path | streams | streams/s | p50 ms | p99 ms | p99 ÷ nginx's | TTFT p50 ms | gateway CPU µs/stream | CPU ÷ nginx's | completed / begun | timeouts | other failures: answer / transport |"
    echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    for n in $RP_STREAMS; do
        for p in $RP_STREAM_ROWS; do
            rp_row_head t "$p" "$n" " | | | | | | | | | |" || continue
            r99=—
            rc=—
            if [ "${p%%_*}" != nginx ]; then
                eval "$(rp_stats "$TMP/rp.t.nginx_${p#*_}.$n" f)"
                r99=$(rp_ratio "$c_p99" "$f_p99")
                rc=$(rp_ratio "$c_us" "$f_us")
            fi
            echo "$row $c_sps | $c_p50 | $c_p99 | $r99 | $c_ttft | $c_us | $rc | $c_ok / $c_sent | $c_to | $c_http / $c_other |"
        done
    done
    echo
    if [ $RP_PGW = 0 ]; then
        echo "- polygw rows skipped: $RP_PGW_WHY"
    fi
    cat "$RP_NOTES"
    for k in s t; do
        if [ $k = s ]; then rt_ns=$RP_CLIENTS; rt_ps=$RP_SINGLE_ROWS; else rt_ns=$RP_STREAMS; rt_ps=$RP_STREAM_ROWS; fi
        for n in $rt_ns; do
            for p in $rt_ps; do
                eval "$(rp_stats "$TMP/rp.$k.$p.$n" c)"
                [ -n "$c_us" ] || continue
                if [ $k = s ]; then
                    echo "- single $p, $n connections: req/s per run $c_rpsruns (median $c_rpsmed), gateway CPU µs/req per run $c_usruns (median user $c_user + system $c_sys)"
                else
                    echo "- streams $p, $n streams: p99 ms per run $c_p99runs, gateway CPU µs/stream per run $c_usruns (median user $c_user + system $c_sys), generator CPU $c_gen%"
                fi
            done
        done
    done
    echo "- gateway CPU = the run time of the gateway's threads (/proc/PID/task/TID/schedstat, in ns; nginx: master + worker;"
    echo "  polygw: the one sidecar serving the row; utime + stime from /proc/PID/stat instead when they say more by over 2 clock"
    echo "  ticks: threads that ended) over the run ÷ requests completed (single answers) or streams begun (streams: every stream"
    echo "  begun has ended when the run ends, so no partial stream is counted, where a run cut by wrk's clock would charge the"
    echo "  streams still running to the finished ones). The user/system split is /proc/PID/stat's, in clock ticks."
    echo "  Stream time = from sending the request to the stream's end (curlgen: the transfer done; loadgen: the call's reply)."
    echo "  TTFT = to the first body byte (curlgen) or the first \`chunk\` notification (loadgen). Other failures: answer = a"
    echo "  status other than 200 or a body not ending in \`data: [DONE]\` (curlgen), an RPC error (loadgen); transport = the rest."
    echo "  nginx talks HTTP/1.1 to both provider ports; polygw offers h2 by ALPN (libcurl) and multiplexes where the port accepts it."
    echo
}

# ========================================================================
# summary: every performance target against this run's cells
# ========================================================================

# lowest LIST, highest LIST: of a list of client counts.
lowest() {
    # shellcheck disable=SC2086
    printf '%s\n' $1 | sort -n | head -n 1
}
highest() {
    # shellcheck disable=SC2086
    printf '%s\n' $1 | sort -n | tail -n 1
}

# sum_row TARGET VALUE OP BOUND UNIT SOURCE: one row of the summary; OP is
# ≤, < or ≥; ratio = VALUE ÷ BOUND (met: ≤ 1 for ≤ and <, ≥ 1 for ≥).
sum_row() {
    awk -v t="$1" -v v="$2" -v op="$3" -v b="$4" -v u="$5" -v src="$6" 'BEGIN {
        if (u != "") u = " " u
        if (v == "" || v == "n/a") { printf "| %s | not measured | %s %s%s | | | %s |\n", t, op, b, u, src; exit }
        # An added latency below 0: the floor run was the disturbed one.
        if (v + 0 < 0) { printf "| %s | %s%s | %s %s%s | | **noise** (floor slower than the path) | %s |\n", t, v, u, op, b, u, src; exit }
        r = (b + 0 != 0) ? sprintf("%.2f", v / b) : "n/a"
        if (op == "≥") ok = v + 0 >= b + 0; else if (op == "<") ok = v + 0 < b + 0; else ok = v + 0 <= b + 0
        printf "| %s | %s%s | %s %s%s | %s | %s | %s |\n", t, v, u, op, b, u, r, ok ? "met" : "**missed**", src }'
}

# The added latency at the lowest client count of a pair of cells (fastest
# runs): B − A of COLUMN, empty when either cell has no run.
added() {
    [ -s "$1" ] && [ -s "$2" ] || return 0
    awk -v a="$(best "$1" "$3")" -v b="$(best "$2" "$3")" 'BEGIN { printf "%.1f", b - a }'
}

summary_section() {
    c_lo=$(lowest "$CALL_CLIENTS")
    c_hi=$(highest "$CALL_CLIENTS")
    h_lo=$(lowest "$HTTP_CLIENTS")
    h_hi=$(highest "$HTTP_CLIENTS")
    s_lo=$(lowest "$STREAM_CLIENTS")
    r_hi=$(highest "$REDIS_CLIENTS")
    nginx_us=
    [ -s "$TMP/http.nginx.$h_hi" ] && nginx_us=$(median "$TMP/http.nginx.$h_hi" 5)
    call_us=
    [ -s "$TMP/call.sidecar.$c_hi" ] && call_us=$(median "$TMP/call.sidecar.$c_hi" 11)
    http_us=
    [ -s "$TMP/http.polygw.$h_hi" ] && http_us=$(median "$TMP/http.polygw.$h_hi" 5)
    {
        echo "## summary: the performance targets, this run"
        echo
        echo "| target | measured | bound | ratio (measured ÷ bound) | verdict | from |"
        echo "|---|---:|---:|---:|---|---|"
        if [ -n "$nginx_us" ]; then
            sum_row "CPU per governed call, msgpack \`call\`, $c_hi clients" "$call_us" "≤" "$nginx_us" "µs" "call: sidecar µs/req (median); bound: http, nginx µs/req at $h_hi clients"
            sum_row "CPU per governed request, HTTP front, $h_hi clients" "$http_us" "≤" "$nginx_us" "µs" "http: polygw vs nginx µs/req (medians)"
        else
            sum_row "CPU per governed call, msgpack \`call\`, $c_hi clients" "" "≤" "nginx's" "µs/req" "needs the call and http sections"
            sum_row "CPU per governed request, HTTP front, $h_hi clients" "" "≤" "nginx's" "µs/req" "needs the http section"
        fi
        sum_row "added p50, msgpack \`call\`, $c_lo client(s)" "$(added "$TMP/call.direct.$c_lo" "$TMP/call.sidecar.$c_lo" 2)" "≤" 30 "µs" "call: sidecar − direct (fastest runs)"
        sum_row "added p99, msgpack \`call\`, $c_lo client(s)" "$(added "$TMP/call.direct.$c_lo" "$TMP/call.sidecar.$c_lo" 3)" "≤" 100 "µs" "call: sidecar − direct"
        sum_row "added p50, HTTP front, $h_lo client(s)" "$(added "$TMP/http.direct.$h_lo" "$TMP/http.polygw.$h_lo" 2)" "≤" 30 "µs" "http: polygw − direct"
        sum_row "added p99, HTTP front, $h_lo client(s)" "$(added "$TMP/http.direct.$h_lo" "$TMP/http.polygw.$h_lo" 3)" "≤" 100 "µs" "http: polygw − direct"
        ttft=
        if [ -s "$TMP/call.stream-direct.$s_lo" ] && [ -s "$TMP/call.stream-sidecar.$s_lo" ]; then
            ttft=$(awk -v a="$(least "$TMP/call.stream-direct.$s_lo" 14 14)" -v b="$(least "$TMP/call.stream-sidecar.$s_lo" 14 14)" 'BEGIN { printf "%.1f", b - a }')
        fi
        sum_row "streaming TTFT added (p50), $s_lo client(s)" "$ttft" "≤" 50 "µs" "call, streamed: sidecar − direct (lowest-TTFT runs)"
        for n in $REDIS_CLIENTS; do
            xf=$TMP/redis.x.redis.$n
            dcpu=
            lua=
            rt=
            if [ -s "$TMP/redis.redis.$n" ] && [ -s "$TMP/redis.memory.$n" ] && [ -s "$xf" ]; then
                # µs per call × calls per admitted attempt (1.00 without retries).
                dcpu=$(awk -v r="$(median "$TMP/redis.redis.$n" 11)" -v m="$(median "$TMP/redis.memory.$n" 11)" \
                    -v c="$(xsum "$xf" 1)" -v a="$(xsum "$xf" 6)" 'BEGIN { if (a > 0) printf "%.1f", (r - m) * c / a; else print "n/a" }')
                lua=$(div "$(xsum "$xf" 18)" "$(xsum "$xf" 6)" 1 %.1f)
                rt=$(div "$(xsum "$xf" 8)" "$(xsum "$xf" 6)")
            fi
            sum_row "Redis: sidecar CPU per admitted attempt over the memory backend, $n client(s)" "$dcpu" "≤" 30 "µs" "redis: redis − memory sidecar µs/call (medians)"
            sum_row "Redis: Lua time per admitted attempt, $n client(s)" "$lua" "≤" 20 "µs" "redis: INFO commandstats evalsha+eval usec ÷ admitted"
            sum_row "Redis: round trips (scripts) per admitted attempt, $n client(s)" "$rt" "≤" 2 "" "redis: EVALSHA+EVAL calls ÷ admitted"
        done
        xf=$TMP/redis.x.redis.$r_hi
        cap=
        coal=
        per_read=
        if [ -s "$xf" ]; then
            per_read=$(div "$(xsum "$xf" 8)" "$(xsum "$xf" 10)")
            cap=$(awk -v u="$(xsum "$xf" 18)" -v a="$(xsum "$xf" 6)" 'BEGIN { if (u > 0 && a > 0) printf "%.0f", 1e6 * a / u; else print "n/a" }')
            coal=$(div "$(xsum "$xf" 5)" "$(xsum "$xf" 6)")
        fi
        sum_row "Redis: implied capacity of one Redis, $r_hi client(s)" "$cap" "≥" 50000 "attempts/s" "1e6 ÷ Lua µs per admitted attempt"
        sum_row "Redis: admit scripts per admitted attempt under load, $r_hi client(s)" "$coal" "<" 1 "" "shared admits ÷ admitted (1.00 = no coalescing)"
        rss=
        if [ -n "${MEM_PEAK_KIB:-}" ] && [ "${MEM_PEAK_KIB:-0}" -gt 0 ]; then
            rss=$(awk -v k="$MEM_PEAK_KIB" 'BEGIN { printf "%.1f", k / 1024 }')
        fi
        sum_row "RSS with $MEM_CALLS calls in flight (${MEM_INFLIGHT:-?} counted)" "$rss" "<" 200 "MiB" "memory: sidecar VmRSS in flight (target: 10000 calls)"
        sum_row "CPU of ${WAIT_N:-$WAIT_CALLS} calls waiting for a permit" "${WAIT_PCT:-}" "≤" 1 "% of a core" "memory: waiting_cpu.py (target: none; 1% = the bound read as none)"
        rp_summary
        echo
        echo "- One run, every cell from this run; a target \"not measured\" needs a section that did not run (BENCH_SECTIONS) or failed."
        echo "  Ratios near 1 are within this machine's run-to-run spread (see the per-run notes of each section)."
        echo "- Round trips per attempt count the script calls the sidecar sends (each is one request and one reply on the pipelined"
        echo "  connection); redis-server socket reads per call (redis traffic table) show how many of them arrive together:"
        echo "  at $r_hi client(s), ${per_read:-n/a} script calls per redis-server read (the sidecar writes what one loop iteration queued in one go)."
        echo
    } >"$TMP/summary.md"
}

# rp_summary: the realpath rows of the summary table. Each compares polygw
# with nginx on the same provider, in this run: CPU per request (medians)
# and req/s (fastest runs) at the highest single-answer connection count;
# http://localhost's CPU per request against 1.10 × http://127.0.0.1's; and
# at the highest stream count, per provider and front: streams completed ÷
# begun (all runs), p99 stream time against 1.3 × nginx's and CPU per
# stream against 2 × nginx's.
# shellcheck disable=SC2154  # c_* and f_*: assigned by eval "$(rp_stats …)"
rp_summary() {
    rs_c=$(highest "$RP_CLIENTS")
    rs_t=$(highest "$RP_STREAMS")
    rs_n="nginx's"
    for v in h1 h2; do
        if [ "$v" = h1 ]; then rs_l="HTTP/1.1-only"; else rs_l="h2-offering"; fi
        eval "$(rp_stats "$TMP/rp.s.polygw_$v.$rs_c" c)"
        eval "$(rp_stats "$TMP/rp.s.nginx_$v.$rs_c" f)"
        sum_row "real path: CPU per request, HTTP front → $rs_l HTTPS provider by name, $rs_c connections (bound: nginx's)" "$c_us" "≤" "${f_us:-$rs_n}" "µs" "realpath: polygw vs nginx µs/req (medians)"
        sum_row "real path: req/s, HTTP front → $rs_l HTTPS provider, $rs_c connections (bound: nginx's)" "$c_rps" "≥" "${f_rps:-$rs_n}" "req/s" "realpath: fastest runs"
    done
    eval "$(rp_stats "$TMP/rp.s.polygw_name.$rs_c" c)"
    eval "$(rp_stats "$TMP/rp.s.polygw_ip.$rs_c" f)"
    lb="1.10 × 127.0.0.1's"
    [ -z "$f_us" ] || lb=$(awk -v u="$f_us" 'BEGIN { printf "%.1f", 1.1 * u }')
    sum_row "real path: CPU per request to http://localhost, $rs_c connections (bound: 1.10 × to http://127.0.0.1)" "$c_us" "≤" "$lb" "µs" "realpath: polygw µs/req (medians)"
    # Added latency where nothing queues: p50 at one connection (single
    # answers) and the first event's time at the fewest streams, each
    # against nginx's on the same provider.
    if [ "$(lowest "$RP_CLIENTS")" = 1 ]; then
        for v in h1 h2; do
            if [ "$v" = h1 ]; then rs_l="HTTP/1.1-only"; else rs_l="h2-offering"; fi
            eval "$(rp_stats "$TMP/rp.s.polygw_$v.1" c)"
            eval "$(rp_stats "$TMP/rp.s.nginx_$v.1" f)"
            sum_row "real path: p50 at 1 connection, HTTP front → $rs_l HTTPS provider (bound: nginx's)" "$c_p50" "≤" "${f_p50:-$rs_n}" "µs" "realpath: fastest runs' p50"
        done
    fi
    rs_t1=$(lowest "$RP_STREAMS")
    for v in h2 h1; do
        if [ "$v" = h1 ]; then rs_l="HTTP/1.1-only"; else rs_l="h2-offering"; fi
        eval "$(rp_stats "$TMP/rp.t.nginx_$v.$rs_t1" f)"
        bt="nginx's + 50 µs"
        [ -z "$f_ttft" ] || bt=$(awk -v u="$f_ttft" 'BEGIN { printf "%.2f", u + 0.05 }')
        for fr in http msgpack; do
            eval "$(rp_stats "$TMP/rp.t.${fr}_$v.$rs_t1" c)"
            sum_row "real path: TTFT p50 at $rs_t1 streams, $fr front, $rs_l HTTPS provider (bound: nginx's + 50 µs)" "$c_ttft" "≤" "$bt" "ms" "realpath: median of the runs' TTFT p50"
        done
    done
    for v in h2 h1; do
        if [ "$v" = h1 ]; then rs_l="HTTP/1.1-only"; else rs_l="h2-offering"; fi
        eval "$(rp_stats "$TMP/rp.t.nginx_$v.$rs_t" f)"
        b99="1.3 × nginx's"
        bu="2 × nginx's"
        [ -z "$f_p99" ] || b99=$(awk -v u="$f_p99" 'BEGIN { printf "%.1f", 1.3 * u }')
        [ -z "$f_us" ] || bu=$(awk -v u="$f_us" 'BEGIN { printf "%.1f", 2 * u }')
        for fr in http msgpack; do
            eval "$(rp_stats "$TMP/rp.t.${fr}_$v.$rs_t" c)"
            sum_row "real path: $rs_t streams, $fr front, $rs_l HTTPS provider: streams completed ÷ begun" "$c_fin" "≥" 1 "" "realpath: ok ÷ begun, all runs"
            sum_row "real path: $rs_t streams, $fr front, $rs_l HTTPS provider: p99 stream time (bound: 1.3 × nginx's)" "$c_p99" "≤" "$b99" "ms" "realpath: least disturbed runs"
            sum_row "real path: $rs_t streams, $fr front, $rs_l HTTPS provider: CPU per stream (bound: 2 × nginx's)" "$c_us" "≤" "$bu" "µs" "realpath: medians"
        done
    done
}

# ========================================================================
# run
# ========================================================================

: >"$TMP/ping.md"
: >"$TMP/call.md"
: >"$TMP/mem.md"
: >"$TMP/redis.md"
: >"$TMP/http.md"
: >"$TMP/realpath.md"
MEM_PEAK_KIB=
MEM_INFLIGHT=
WAIT_PCT=
WAIT_N=
if has_section ping; then
    ping_section
fi
if has_section call || has_section memory || has_section redis || has_section http ||
    has_section realpath; then
    start_call_servers
fi
if has_section call; then
    call_section
fi
if has_section memory; then
    memory_section
fi
if has_section redis; then
    redis_section
fi
if has_section http; then
    http_section
fi
if has_section realpath; then
    realpath_section
fi
summary_section

OUT=$TMP/results.md
CPU_MODEL=$(sed -n 's/^model name[[:space:]]*:[[:space:]]*//p' /proc/cpuinfo 2>/dev/null | head -n 1)
REV=$(git rev-parse --short HEAD 2>/dev/null || echo "uncommitted")
if [ "$REV" != uncommitted ] && ! git diff --quiet HEAD -- 2>/dev/null; then
    REV="$REV+local changes"
fi
{
    echo "# polygw benchmark"
    echo
    echo "- date: $(date -u '+%Y-%m-%d %H:%M:%SZ'), revision: $REV"
    echo "- machine: $(uname -srm), ${NCPU} CPU(s), ${CPU_MODEL:-unknown CPU}, load average before the run: $LOADAVG"
    echo "- placement: $PIN_NOTE"
    echo "- command: BENCH_DURATION=$DUR BENCH_REPS=$REPS BENCH_WARMUP=$WARMUP BENCH_PIPELINE=$PIPELINE BENCH_CLIENTS=\"$CLIENTS\" BENCH_SECTIONS=\"$SECTIONS\" BENCH_CALL_CLIENTS=\"$CALL_CLIENTS\" BENCH_CALL_WARMUP=$CALL_WARMUP BENCH_MEM_CALLS=$MEM_CALLS BENCH_MEM_DELAY_MS=$MEM_DELAY_MS BENCH_REDIS_CLIENTS=\"$REDIS_CLIENTS\" BENCH_REDIS_WARMUP=$REDIS_WARMUP BENCH_HTTP_CLIENTS=\"$HTTP_CLIENTS\" BENCH_REALPATH_REPS=$RP_REPS BENCH_REALPATH_CLIENTS=\"$RP_CLIENTS\" BENCH_REALPATH_STREAMS=\"$RP_STREAMS\" sh tests/bench/run.sh $BUILD (\`make bench\` = the defaults)"
    echo
    cat "$TMP/ping.md" "$TMP/call.md" "$TMP/mem.md" "$TMP/redis.md" "$TMP/http.md" \
        "$TMP/realpath.md" "$TMP/summary.md"
} >"$OUT"

if [ -s "$TMP/loadgen.err" ]; then
    say "generator stderr:"
    cat "$TMP/loadgen.err" >&2
fi
mkdir -p "$BUILD/bench"
cp "$OUT" "$RESULTS"
cat "$OUT"
say "written to $RESULTS"
exit $STATUS
