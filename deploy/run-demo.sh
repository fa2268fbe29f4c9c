#!/bin/sh
# make run: the sidecar in the foreground on the demo config, with the mock
# upstream the demo sources point at (127.0.0.1:18080) in the background so
# that `polygwctl call` answers. Ctrl-C stops both.
set -eu
BUILD=${1:-build}
SOCK="$(pwd)/$BUILD/run/polygw.sock"
HTTP_SOCK="$(pwd)/$BUILD/run/http.sock"
mkdir -p "$BUILD/run"

MOCK_PID=""
cleanup() {
    [ -n "$MOCK_PID" ] && kill "$MOCK_PID" 2>/dev/null && wait "$MOCK_PID" 2>/dev/null
    return 0
}
trap cleanup EXIT INT TERM

if "$BUILD/mock_upstream" --port 18080 > "$BUILD/run/mock.out" 2> "$BUILD/run/mock.log" & then
    MOCK_PID=$!
    sleep 0.2
    if ! kill -0 "$MOCK_PID" 2>/dev/null; then
        echo "polygw demo: mock upstream did not start on 127.0.0.1:18080 (port busy?); calls will fail" >&2
        MOCK_PID=""
    fi
fi

# The client examples of README.md read these two variables; printed with
# absolute paths so the line works from any directory of a second shell.
cat <<MSG
polygw demo
  socket:   $SOCK
  config:   deploy/polygw.yaml (memory backend; sources -> mock upstream on 127.0.0.1:18080)
  try:      $BUILD/polygwctl --socket $SOCK ping
  or:       $BUILD/polygwctl --socket $SOCK call chat --body '{"messages":[{"role":"user","content":"hello"}]}'
  or HTTP:  curl --unix-socket $HTTP_SOCK http://polygw/v1/chat/completions \\
              -H 'Content-Type: application/json' -d '{"messages":[{"role":"user","content":"hello"}]}'
  python:   in another shell, paste this line, then the README's Python example:
            export POLYGW_SOCKET=$SOCK PYTHONPATH=$(pwd)/client/python
  stop:     Ctrl-C
MSG
"$BUILD/polygw" --config deploy/polygw.yaml --socket "$SOCK" --http-socket "$HTTP_SOCK"
