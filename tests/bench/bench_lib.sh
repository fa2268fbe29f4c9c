# shellcheck shell=sh
# Sourced by run.sh: shell helpers (stopping what it started, by pid).

nap() { sleep 0.1 2>/dev/null || sleep 1; }

# stop_pid PID [TENTHS]: stops a process we started (TERM, then KILL after
# TENTHS tenths of a second, default 30) and reaps it; nothing when PID is
# empty or already gone.
stop_pid() {
    [ -n "$1" ] || return 0
    kill -TERM "$1" 2>/dev/null || return 0
    i=0
    while kill -0 "$1" 2>/dev/null && [ $i -lt "${2:-30}" ]; do
        nap
        i=$((i + 1))
    done
    kill -KILL "$1" 2>/dev/null
    wait "$1" 2>/dev/null
    return 0
}
