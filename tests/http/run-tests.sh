#!/bin/sh
# tests/http/run-tests.sh BUILD_DIR
#
# The HTTP front end driven by the official OpenAI Node SDK (openai.test.js)
# against the real sidecar and mock upstream in BUILD_DIR (e.g. build/asan):
# `npm ci` from the committed lockfile (tests/npm-sync.sh: skipped when
# node_modules already matches it), then `node --test`. Its last line is
# one summary: "http-sdk: N passed, N failed, N skipped".
set -u

if [ $# -ne 1 ] || [ ! -d "$1" ]; then
    echo "usage: $0 BUILD_DIR   (a directory holding polygw and mock_upstream)" >&2
    exit 2
fi
BUILD=$(cd "$1" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
for bin in polygw mock_upstream; do
    if [ ! -x "$BUILD/$bin" ]; then
        echo "$0: $BUILD/$bin not found (run make first)" >&2
        exit 2
    fi
done
export POLYGW_BUILD="$BUILD"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

echo "== tests/http: npm ci"
sh "$HERE/../npm-sync.sh" "$HERE" || exit 1

echo "== tests/http: node --test"
LOG=$(mktemp /tmp/pgw-http-tests.XXXXXX)
trap 'rm -f "$LOG"' EXIT INT TERM
cd "$HERE" || exit 1
node --test --test-reporter=spec openai.test.js 2>&1 | tee "$LOG"
n() { # n KEY: the spec reporter's "ℹ KEY N" count, or 0
    v=$(grep -E "^. $1 [0-9]+" "$LOG" | tail -1 | awk '{print $3}')
    echo "${v:-0}"
}
passed=$(n pass)
failed=$(( $(n fail) + $(n cancelled) ))
echo "http-sdk: $passed passed, $failed failed, $(n skipped) skipped"
[ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
