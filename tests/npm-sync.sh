#!/bin/sh
# tests/npm-sync.sh DIR
#
# `npm ci` in DIR from its committed package-lock.json, skipped when
# node_modules already matches it (npm's own record of what it installed,
# node_modules/.package-lock.json, lists every package of the lockfile at
# the same version and integrity), so an offline machine that installed
# once keeps working. Exits non-zero when npm ci fails.
set -u
cd "$1" || exit 1
if node -e '
    const fs = require("fs");
    const lock = JSON.parse(fs.readFileSync("package-lock.json", "utf8")).packages;
    const have = JSON.parse(fs.readFileSync("node_modules/.package-lock.json", "utf8")).packages;
    for (const [p, v] of Object.entries(lock)) {
        if (p === "") continue;
        const h = have[p];
        if (!h || h.version !== v.version || (v.integrity && h.integrity !== v.integrity)) process.exit(1);
    }
' 2>/dev/null; then
    echo "node_modules matches package-lock.json: npm ci skipped"
    exit 0
fi
npm ci --no-audit --no-fund --prefer-offline || { echo "$0: npm ci failed in $1" >&2; exit 1; }
