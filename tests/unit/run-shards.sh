#!/bin/sh
# tests/unit/run-shards.sh UNIT_TESTS [N]
#
# Runs the Check binary UNIT_TESTS as N shards side by side (default: one
# per core, at most 4; POLYGW_UNIT_SHARD in tests/unit/check_main.c), prints
# each shard's output whole, one after the other, then one Check summary line
# totalled over the shards ("100%: Checks: C, Failures: F, Errors: E"), the
# line tests/run-suites.sh reads. Exits 1 when a shard failed or said nothing.
set -u
BIN=$1
N=${2:-$(nproc 2>/dev/null || echo 1)}
[ "$N" -le 4 ] || N=4
[ "$N" -ge 1 ] || N=1
TMP=$(mktemp -d /tmp/pgw-unit.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
trap 'exit 130' INT TERM

k=1
while [ "$k" -le "$N" ]; do
    { POLYGW_UNIT_SHARD="$k/$N" "$BIN"; echo $? > "$TMP/$k.rc"; } > "$TMP/$k.log" 2>&1 &
    k=$((k + 1))
done
wait

rc=0 checks=0 failures=0 errors=0
k=1
while [ "$k" -le "$N" ]; do
    cat "$TMP/$k.log"
    line=$(sed -n 's/^[0-9]*%: Checks: \([0-9]*\), Failures: \([0-9]*\), Errors: \([0-9]*\).*/\1 \2 \3/p' \
        "$TMP/$k.log" | tail -1)
    if [ -z "$line" ]; then
        echo "unit shard $k/$N: no summary line (crashed?)"
        rc=1
    else
        # shellcheck disable=SC2086
        set -- $line
        checks=$((checks + $1)) failures=$((failures + $2)) errors=$((errors + $3))
    fi
    [ "$(cat "$TMP/$k.rc" 2>/dev/null || echo 1)" -eq 0 ] || rc=1
    k=$((k + 1))
done
pct=100
[ "$checks" -eq 0 ] || pct=$(((checks - failures - errors) * 100 / checks))
echo "$pct%: Checks: $checks, Failures: $failures, Errors: $errors"
exit $rc
