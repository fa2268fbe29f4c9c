#!/bin/sh
# client/run-tests.sh BUILD_DIR [all|clients|graphs]
#
# Runs the Python and Node client tests against the real sidecar and mock
# upstream in BUILD_DIR (e.g. build/asan): the Python tests with Debian's
# /usr/bin/python3 (python3-msgpack, python3-pytest), then `npm ci` from the
# committed lockfile (skipped when node_modules already matches it, so an
# offline machine that installed once keeps working) and `node --test`, then
# the agent-graph example (docs/examples/agent-graph/run.sh).
#
# The second argument selects: `all` (the default) every test; `clients`
# all but the agent-graph ones; `graphs` only those (polygw.graph's and
# polygw/langgraph's tests, and the example) -- tests/run-suites.sh runs
# the last two as stages of their own.
# Prints each runner's summary and a combined last line; exits non-zero on
# any failure.
set -u

SELECT=${2:-all}
if [ $# -lt 1 ] || [ $# -gt 2 ] || [ ! -d "$1" ] ||
    { [ "$SELECT" != all ] && [ "$SELECT" != clients ] && [ "$SELECT" != graphs ]; }; then
    echo "usage: $0 BUILD_DIR [all|clients|graphs]   (BUILD_DIR holds polygw and mock_upstream)" >&2
    exit 2
fi
BUILD=$(cd "$1" && pwd)
GRAPH_PY=tests/test_graph.py
GRAPH_JS=test/langgraph.test.js
case $SELECT in
all) PY_TESTS="tests" ;;
clients) PY_TESTS="tests --ignore=$GRAPH_PY" ;;
graphs) PY_TESTS="$GRAPH_PY" ;;
esac
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
unset POLYGW_SOCKET

TMP=$(mktemp -d /tmp/pgw-client-tests.XXXXXX)
trap 'rm -rf "$TMP"' EXIT INT TERM
status=0

# run NAME CMD...: runs CMD with its output shown and kept in $TMP/NAME.log
run() {
    name=$1
    shift
    { "$@"; echo $? > "$TMP/$name.rc"; } 2>&1 | tee "$TMP/$name.log"
    rc=$(cat "$TMP/$name.rc" 2>/dev/null || echo 1)
    [ "$rc" -eq 0 ] || status=1
    return "$rc"
}

echo "== client/python: /usr/bin/python3 -m pytest"
# shellcheck disable=SC2086
(cd "$HERE/python" && run python /usr/bin/python3 -m pytest -q -p no:cacheprovider -rs $PY_TESTS)
[ "$(cat "$TMP/python.rc" 2>/dev/null || echo 1)" -eq 0 ] || status=1

echo "== client/node: npm ci"
cd "$HERE/node" || exit 1
if ! sh "$HERE/../tests/npm-sync.sh" "$HERE/node"; then
    status=1
fi

echo "== client/node: node --test"
NODE_TESTS=""
for f in test/*.test.js; do
    case $SELECT in
    clients) [ "$f" = "$GRAPH_JS" ] || NODE_TESTS="$NODE_TESTS $f" ;;
    graphs) [ "$f" != "$GRAPH_JS" ] || NODE_TESTS="$NODE_TESTS $f" ;;
    *) NODE_TESTS="$NODE_TESTS $f" ;;
    esac
done
# shellcheck disable=SC2086
run node node --test --test-reporter=spec $NODE_TESTS

# The agent-graph example (docs/AGENT-GRAPHS.md) end to end: it must stop,
# resume and finish.
example=skipped
if [ "$SELECT" != clients ]; then
    echo "== docs/examples/agent-graph: run.sh"
    example=failed
    if run example env BUILD="$BUILD" sh "$HERE/../docs/examples/agent-graph/run.sh" &&
        grep -q "GraphStoppedError kind=stopped node=build_skeleton" "$TMP/example.log" &&
        grep -q "task essay-1#2: succeeded" "$TMP/example.log"; then
        example=ok
    else
        status=1
    fi
fi

# Summary: each runner's own closing lines, then one combined line.
echo "== client tests summary"
py_line=$(grep -E '^[0-9]+ (passed|failed)|(passed|failed|error).* in [0-9.]+s' "$TMP/python.log" | tail -1)
echo "python: ${py_line:-no pytest summary}"
grep -E '^. (tests|pass|fail|skipped|cancelled) [0-9]+' "$TMP/node.log" | sed 's/^. /node:   /'
count() { # count WORD TEXT: the number before WORD in TEXT, or 0
    n=$(printf '%s\n' "$2" | grep -oE "[0-9]+ $1" | head -1 | cut -d' ' -f1)
    echo "${n:-0}"
}
node_n() { # node_n KEY: the number of the spec reporter's "ℹ KEY N" line, or 0
    n=$(grep -E "^. $1 [0-9]+" "$TMP/node.log" | tail -1 | awk '{print $3}')
    echo "${n:-0}"
}
passed=$(( $(count passed "$py_line") + $(node_n pass) ))
failed=$(( $(count failed "$py_line") + $(count error "$py_line") + $(node_n fail) + $(node_n cancelled) ))
skipped=$(( $(count skipped "$py_line") + $(node_n skipped) ))
case $example in
ok) passed=$((passed + 1)) ;;
failed) failed=$((failed + 1)) ;;
esac
[ "$failed" -eq 0 ] || status=1
[ "$passed" -gt 0 ] || status=1
echo "example: $example"
echo "$SELECT: $passed passed, $failed failed, $skipped skipped"
exit $status
