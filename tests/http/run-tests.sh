#!/bin/sh
# tests/http/run-tests.sh BUILD_DIR [TEST.js ...]
#
# The HTTP front end driven by the official OpenAI Node SDK (openai.test.js),
# the official Anthropic TypeScript SDK (anthropic.test.js, anthropic_native.test.js),
# the official Google Gen AI SDK (gemini.test.js), passthrough capabilities
# through the OpenAI SDK (audio.test.js) and traces (tracing*.test.js: an OTLP
# receiver decoding with OpenTelemetry's own definitions, an app instrumented
# with the OpenTelemetry Node SDK) — or by the
# TEST.js files named, e.g. status.test.js (headless Chromium, puppeteer-core)
# — against the real sidecar and mock upstream in BUILD_DIR (e.g. build/asan):
# `npm ci` from the committed lockfile (tests/npm-sync.sh: skipped when
# node_modules already matches it), then `node --test`. Its last line is
# one summary: "http-sdk: N passed, N failed, N skipped".
set -u

[ -x "${1:-}/polygw" ] || { echo "usage: $0 BUILD_DIR [TEST.js ...]  (BUILD_DIR holding polygw and mock_upstream)" >&2; exit 2; }
# The harness (client/node/test/helpers.js) sets the sanitizer options.
POLYGW_BUILD=$(cd "$1" && pwd)
export POLYGW_BUILD
shift
[ $# -gt 0 ] || set -- openai.test.js anthropic.test.js audio.test.js anthropic_native.test.js gemini.test.js \
    tracing.test.js tracing_sdk.test.js tracing_export.test.js
HERE=$(cd "$(dirname "$0")" && pwd)

echo "== tests/http: npm ci"
sh "$HERE/../npm-sync.sh" "$HERE" || exit 1
# tracing.test.js calls over msgpack with the Node client (client/node).
sh "$HERE/../npm-sync.sh" "$HERE/../../client/node" || exit 1

echo "== tests/http: node --test"
LOG=$(mktemp /tmp/pgw-http-tests.XXXXXX)
trap 'rm -f "$LOG"' EXIT INT TERM
cd "$HERE" || exit 1
node --test --test-reporter=spec "$@" 2>&1 | tee "$LOG"
n() { # n KEY: the spec reporter's "ℹ KEY N" count, or 0
    v=$(grep -E "^. $1 [0-9]+" "$LOG" | tail -1 | awk '{print $3}')
    echo "${v:-0}"
}
passed=$(n pass)
failed=$(( $(n fail) + $(n cancelled) ))
echo "http-sdk: $passed passed, $failed failed, $(n skipped) skipped"
[ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
