#!/bin/sh
# tests/run-suites.sh — runs every test suite of `make test`, one stage after
# another, keeps going after a failure, and ends with ONE line
#
#     N passed, N failed
#
# totalled over every stage (the form CI runners read). Exits 1 when any
# test failed or any stage failed without saying how many of its tests did
# (a crash, a build error, a runner that printed no counts), 0 otherwise.
# Run from the top of the tree after `make all` and the ASan build (the
# Makefile's `test` target does both, then calls this).
#
# Adding a suite is one `stage` line at the bottom:
#
#     stage NAME FORMAT COMMAND [ARG...]
#
# FORMAT says how the stage's output gives its counts:
#   check    Check's "NN%: Checks: N, Failures: F, Errors: E"
#   pytest   pytest's closing line ("12 passed, 1 failed, 2 skipped in 3.4s")
#   node     node --test's spec reporter ("ℹ pass N", "ℹ fail N", "ℹ cancelled N")
#   tap      TAP totals ("# pass N", "# fail N")
#   summary  a closing "... N passed, M failed" line (e.g. client/run-tests.sh)
#   exit     no counts: the stage is one test, passed if it exits 0
# The last matching line counts. Whatever the format, a stage that exits
# non-zero with no failure counted adds one failure.
#
# `stage_if TEST NAME FORMAT COMMAND...` runs the stage only when the shell
# command TEST succeeds (a missing optional tool), else lists it as skipped.
set -u

TMP=$(mktemp -d /tmp/pgw-suites.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
trap 'exit 130' INT TERM
TOTAL_PASS=0
TOTAL_FAIL=0
N=0
: > "$TMP/table"

# counts FORMAT LOG: prints "PASSED FAILED" from the stage's log, or nothing.
counts() {
    case $1 in
    check)
        sed -n 's/^[0-9]*%: Checks: \([0-9]*\), Failures: \([0-9]*\), Errors: \([0-9]*\).*/\1 \2 \3/p' "$2" |
            tail -1 | awk 'NF == 3 { print $1 - $2 - $3, $2 + $3 }'
        ;;
    pytest)
        grep -E '^(=+ )?[0-9]+ [a-z]+.* in [0-9.]+s' "$2" | tail -1 | awk '{
            p = 0; f = 0
            for (i = 2; i <= NF; i++) {
                w = $i; sub(/,$/, "", w)
                if (w == "passed") p += $(i - 1)
                else if (w == "failed" || w == "error" || w == "errors") f += $(i - 1)
            }
            print p, f }'
        ;;
    node)
        awk '$2 == "pass" && $3 ~ /^[0-9]+$/ { p = $3; seen = 1 }
             ($2 == "fail" || $2 == "cancelled") && $3 ~ /^[0-9]+$/ { f[$2] = $3; seen = 1 }
             END { if (seen) print p + 0, f["fail"] + f["cancelled"] }' "$2"
        ;;
    tap)
        awk '$1 == "#" && $2 == "pass" { p = $3; seen = 1 }
             $1 == "#" && $2 == "fail" { f = $3; seen = 1 }
             END { if (seen) print p + 0, f + 0 }' "$2"
        ;;
    summary)
        sed -n 's/.*[^0-9]\([0-9][0-9]*\) passed, \([0-9][0-9]*\) failed.*/\1 \2/p;
                s/^\([0-9][0-9]*\) passed, \([0-9][0-9]*\) failed.*/\1 \2/p' "$2" | tail -1
        ;;
    esac
}

# record NAME PASSED FAILED SECONDS NOTE
record() {
    TOTAL_PASS=$((TOTAL_PASS + $2))
    TOTAL_FAIL=$((TOTAL_FAIL + $3))
    printf '  %-34s %6s passed %4s failed %6ss  %s\n' "$1" "$2" "$3" "$4" "$5" >> "$TMP/table"
}

stage() {
    name=$1 format=$2
    shift 2
    N=$((N + 1))
    log="$TMP/$N.log"
    echo "=== [$N] $name: $*"
    t0=$(date +%s)
    { "$@" </dev/null; echo $? > "$TMP/$N.rc"; } 2>&1 | tee "$log"
    rc=$(cat "$TMP/$N.rc" 2>/dev/null || echo 1)
    secs=$(($(date +%s) - t0))
    got=$(counts "$format" "$log")
    note=""
    if [ "$format" = exit ] || [ -z "$got" ]; then
        [ "$format" = exit ] || note="no counts in its output; "
        if [ "$rc" -eq 0 ]; then set -- 1 0; else set -- 0 1; fi
    else
        # shellcheck disable=SC2086
        set -- $got
        if [ "$rc" -ne 0 ] && [ "$2" -eq 0 ]; then
            note="exited $rc with no failed test counted; "
            set -- "$1" 1
        fi
    fi
    [ "$rc" -eq 0 ] || note="${note}exit status $rc"
    record "$name" "$1" "$2" "$secs" "$note"
    echo "=== [$N] $name: $1 passed, $2 failed (${secs}s)"
}

stage_if() {
    cond=$1
    shift
    if sh -c "$cond" >/dev/null 2>&1; then
        stage "$@"
    else
        N=$((N + 1))
        echo "=== [$N] $1: skipped ('$cond' failed)"
        printf "  %-34s skipped ('%s' failed)\n" "$1" "$cond" >> "$TMP/table"
    fi
}

ASAN="ASAN_OPTIONS=detect_leaks=1:abort_on_error=0"
UBSAN="UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1"
ASAN_BUILD="POLYGW_BUILD=$(pwd)/build/asan"
PYTEST="/usr/bin/python3 -m pytest -q -p no:cacheprovider"
# The integration tests wait on sidecars and mocks more than they compute:
# their files run on one worker per core (at most 4), each file whole on
# one worker, so a module's servers and fixtures stay its own. The tests
# marked `timing` (a wall-clock bound, or heavy load) then run alone.
WORKERS=$(nproc 2>/dev/null || echo 1)
[ "$WORKERS" -le 4 ] || WORKERS=4
PYTEST_PAR="$PYTEST"
[ "$WORKERS" -le 1 ] || PYTEST_PAR="$PYTEST -n $WORKERS --dist loadfile"

T0=$(date +%s)
stage "unit (Check, ASan+UBSan)"       check   env "$ASAN" "$UBSAN" \
    sh tests/unit/run-shards.sh build/asan/unit_tests
# shellcheck disable=SC2086
stage "integration (pytest, ASan)"     pytest  env "$ASAN" "$UBSAN" "$ASAN_BUILD" $PYTEST_PAR \
    -m "not timing" tests/integration
# shellcheck disable=SC2086
stage "integration, timed (pytest, ASan)" pytest env "$ASAN" "$UBSAN" "$ASAN_BUILD" $PYTEST \
    -m timing tests/integration
# shellcheck disable=SC2086
stage "redis (pytest)"                 pytest  $PYTEST tests/redis
stage "clients (python + node, ASan)"  summary sh client/run-tests.sh build/asan clients
stage "agent graphs (ASan)"            summary sh client/run-tests.sh build/asan graphs
stage "http (OpenAI + Anthropic SDKs)" summary sh tests/http/run-tests.sh build/asan
stage "browsers (headless Chromium)"   summary sh tests/http/run-tests.sh build/asan status.test.js cross_origin.test.js
stage "fuzz replay (ASan)"             summary make --no-print-directory BUILD=build/asan SAN=1 fuzz-replay
stage_if "command -v clang-format" "format (clang-format)" exit make --no-print-directory format-check
stage "documentation references"      exit    /usr/bin/python3 tests/check_docs.py
stage "layout (includes and calls)"   exit    /usr/bin/python3 tests/check_layout.py \
    --objects build/obj --objects build/asan/obj
stage_if "command -v clang" "fuzz targets (clang build)" summary make --no-print-directory \
    -j"$WORKERS" fuzz-build
# shellcheck disable=SC2086
stage "debian packages (make deb, dpkg)" pytest  $PYTEST tests/deb

echo
echo "=== summary ($(($(date +%s) - T0))s)"
cat "$TMP/table"
echo "$TOTAL_PASS passed, $TOTAL_FAIL failed"
[ "$TOTAL_FAIL" -eq 0 ]
