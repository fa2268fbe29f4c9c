#!/bin/sh
# run.sh BUILD_DIR — polygw benchmark seed (see tests/bench/README.md).
#
# Starts the echo server (the floor) and the sidecar, drives `ping` against
# both with loadgen at 1, 16 and 64 clients, and prints a Markdown table whose
# ratio columns compare each sidecar row with the echo row of the same client
# count in this same run. The table also goes to BUILD_DIR/bench/results.md.
# Both servers run for the whole script; only one is loaded at a time.
#
# Environment (all optional):
#   BENCH_DURATION  seconds per run (default 2)
#   BENCH_REPS      runs per cell, alternating echo/sidecar order (default 5:
#                   30 runs of 2 s, about 75 s); the table shows each cell's
#                   fastest run, the notes every run and the medians
#   BENCH_WARMUP    untimed requests before each run (default 2000)
#   BENCH_CLIENTS   client counts (default "1 16 64")
#   BENCH_PIPELINE  requests in flight per client (default 1: closed loop);
#                   e.g. 16 amortises syscalls, so the server's per-request
#                   work dominates
#   BENCH_CONFIG    sidecar config (default deploy/polygw.yaml)
#   BENCH_PIN       1 (default): pin servers to CPU 0 and loadgen to CPU 1 when
#                   taskset exists and there are >= 2 CPUs; 0: no pinning
#
# Exit status: 0 when every row that ran had no errors (skipped sidecar rows
# included), 1 otherwise, 2 when the echo server or loadgen is missing.
set -u

BUILD=${1:-build}
DUR=${BENCH_DURATION:-2}
REPS=${BENCH_REPS:-5}
WARMUP=${BENCH_WARMUP:-2000}
CLIENTS=${BENCH_CLIENTS:-"1 16 64"}
PIPELINE=${BENCH_PIPELINE:-1}
CONFIG=${BENCH_CONFIG:-deploy/polygw.yaml}
PIN=${BENCH_PIN:-1}

LOADGEN=$BUILD/bench/loadgen
ECHO=$BUILD/bench/echo_server
POLYGW=$BUILD/polygw
RESULTS=$BUILD/bench/results.md

say() { printf 'bench: %s\n' "$*" >&2; }

for b in "$LOADGEN" "$ECHO"; do
    if [ ! -x "$b" ]; then
        say "missing $b (build it with: make $b)"
        exit 2
    fi
done
case $DUR in ''|*[!0-9.]*) say "BENCH_DURATION must be a number of seconds"; exit 2 ;; esac
case $REPS in ''|*[!0-9]*|0) say "BENCH_REPS must be a positive integer"; exit 2 ;; esac
case $PIPELINE in ''|*[!0-9]*|0) say "BENCH_PIPELINE must be a positive integer"; exit 2 ;; esac
LOADAVG=$(cut -d ' ' -f 1-3 /proc/loadavg 2>/dev/null || echo unknown)
# shellcheck disable=SC2086
EST=$(echo $CLIENTS | awk -v r="$REPS" -v d="$DUR" '{ printf "%d", r * NF * 2 * (d + 0.4) }')
if [ "$EST" -gt 110 ]; then
    say "warning: about $EST s of runs; the default settings stay under 2 minutes"
fi

TMP=$(mktemp -d "${TMPDIR:-/tmp}/polygw-bench.XXXXXX") || exit 2
ECHO_SOCK=$TMP/echo.sock
PGW_SOCK=$TMP/polygw.sock
ECHO_PID=
PGW_PID=

# Stops what we started (by pid: TERM, then KILL after ~3 s) and removes the
# sockets and scratch files. Runs on every exit path, including ^C.
stop_pid() {
    [ -n "$1" ] || return 0
    kill -TERM "$1" 2>/dev/null || return 0
    i=0
    while kill -0 "$1" 2>/dev/null && [ $i -lt 30 ]; do
        nap
        i=$((i + 1))
    done
    kill -KILL "$1" 2>/dev/null
    wait "$1" 2>/dev/null
    return 0
}
# shellcheck disable=SC2317  # invoked by trap
cleanup() {
    trap - EXIT INT TERM HUP
    stop_pid "$PGW_PID"
    stop_pid "$ECHO_PID"
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

nap() { sleep 0.1 2>/dev/null || sleep 1; }

# CPU placement: on a 2-core machine the generator and the server would
# otherwise fight for the same core at random; pinning makes rows comparable.
NCPU=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)
PIN_SRV=
PIN_LG=
PIN_NOTE="none"
if [ "$PIN" = 1 ] && [ "$NCPU" -ge 2 ] && command -v taskset >/dev/null 2>&1; then
    PIN_SRV="taskset -c 0"
    PIN_LG="taskset -c 1"
    PIN_NOTE="servers on CPU 0, loadgen on CPU 1 (taskset)"
fi
# A wedged loadgen must not stretch the run: its own alarm is generous
# (duration + 40 s), `timeout` is tighter when available.
# --foreground keeps loadgen in our process group, so ^C reaches it at once.
TIMEOUT=
if timeout --foreground 1 true >/dev/null 2>&1; then
    TIMEOUT="timeout --foreground -k 1 $(awk -v d="$DUR" 'BEGIN { printf "%d", d + 12 }')"
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

# field JSON KEY: a scalar from loadgen's flat one-line JSON.
field() {
    printf '%s\n' "$1" | sed -n "s/.*\"$2\":\"\{0,1\}\([^,\"}]*\).*/\1/p"
}

# --- servers -------------------------------------------------------------

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
    say "SKIPPING sidecar rows: $SKIP_WHY"
fi

# --- rows ----------------------------------------------------------------

# run_row TARGET SOCKET CLIENTS: prints loadgen's JSON line (empty on failure).
run_row() {
    say "rep $rep/$REPS: $1, $3 client(s), ${DUR} s ..."
    # shellcheck disable=SC2086
    $TIMEOUT $PIN_LG "$LOADGEN" --socket "$2" --clients "$3" --duration "$DUR" \
        --pipeline "$PIPELINE" --warmup "$WARMUP" --timeout-ms 2000 --method ping --json \
        2>>"$TMP/loadgen.err"
}

# Server CPU over a row, from /proc (utime + stime; the comm field of our
# binaries has no spaces) and /proc/uptime for the wall clock.
CLK_TCK=$(getconf CLK_TCK 2>/dev/null || echo 100)
proc_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo 0; }
uptime_s() { cut -d ' ' -f 1 /proc/uptime 2>/dev/null || echo 0; }

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
    srv=$(awk -v c="$((c1 - c0))" -v t="$CLK_TCK" -v a="$w0" -v b="$w1" \
        'BEGIN { if (b > a) printf "%.0f", c / t / (b - a) * 100; else printf "0" }')
    echo "$(field "$j" rps) $(field "$j" p50_us) $(field "$j" p99_us) $(field "$j" p999_us)" \
        "$(field "$j" errors) $(field "$j" resp_bytes_avg) $(field "$j" cpu_pct) $srv" \
        >>"$TMP/raw.$1.$3"
    if [ "$(field "$j" errors)" != 0 ]; then
        STATUS=1
        echo "- $1, clients=$3, rep $rep: $(field "$j" errors) errors, first: $(field "$j" first_error)" \
            >>"$NOTES"
    fi
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

# median FILE COLUMN
median() {
    cut -d ' ' -f "$2" "$1" | sort -n | awk '{ v[NR] = $1 }
        END { if (NR == 0) exit; if (NR % 2) print v[(NR + 1) / 2];
              else printf "%.2f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

NOTES=$TMP/notes
: >"$NOTES"
STATUS=0

# Repetitions alternate the order of the two targets so that slow drifts of
# the machine (other load, frequency) do not favour one of them.
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

OUT=$TMP/results.md
CPU_MODEL=$(sed -n 's/^model name[[:space:]]*:[[:space:]]*//p' /proc/cpuinfo 2>/dev/null | head -n 1)
REV=$(git rev-parse --short HEAD 2>/dev/null || echo "uncommitted")
if [ "$REV" != uncommitted ] && ! git diff --quiet HEAD -- 2>/dev/null; then
    REV="$REV+local changes"
fi
{
    echo "## polygw benchmark: ping, sidecar vs echo floor"
    echo
    echo "- date: $(date -u '+%Y-%m-%d %H:%M:%SZ'), revision: $REV"
    echo "- machine: $(uname -srm), ${NCPU} CPU(s), ${CPU_MODEL:-unknown CPU}, load average before the run: $LOADAVG"
    echo "- placement: $PIN_NOTE"
    echo "- each cell: the fastest of $REPS runs of ${DUR} s (each after ${WARMUP} warm-up requests), $PIPELINE request(s) in flight per client (1 = closed loop), 1 loadgen thread"
    echo "- command: BENCH_DURATION=$DUR BENCH_REPS=$REPS BENCH_WARMUP=$WARMUP BENCH_PIPELINE=$PIPELINE BENCH_CLIENTS=\"$CLIENTS\" sh tests/bench/run.sh $BUILD (\`make bench\` = the defaults)"
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
            echo "- $target, clients=$n: req/s per run $(cut -d ' ' -f 1 "$f" | tr '\n' ' ' | sed 's/ $//')" \
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
} >"$OUT"

if [ -s "$TMP/loadgen.err" ]; then
    say "loadgen stderr:"
    cat "$TMP/loadgen.err" >&2
fi
mkdir -p "$BUILD/bench"
cp "$OUT" "$RESULTS"
cat "$OUT"
say "written to $RESULTS"
exit $STATUS
