#!/bin/sh
# Install the Debian packages polygw builds, tests and benchmarks with, when missing
# (`deb` as argument: and those `make deb` needs).
# Idempotent and quiet when everything is present; needs root (or sudo) otherwise.
set -eu

PKGS="build-essential pkg-config libev-dev libmsgpack-dev libyaml-dev libcurl4-openssl-dev \
libjansson-dev libhiredis-dev check redis-server python3 python3-msgpack python3-pytest \
clang libclang-rt-14-dev locales redis-sentinel openssl libssl-dev libsystemd-dev \
python3-yaml"
# The integration stage runs its test files on every core (pytest-xdist).
PKGS="$PKGS python3-pytest-xdist"
# The HTTP front end's parser (linked as -lhttp_parser), and curl for its tests.
PKGS="$PKGS libhttp-parser-dev curl libprotobuf-c-dev protobuf-c-compiler"
# Bedrock: STS answers in XML (libxml2).
PKGS="$PKGS libxml2-dev"
# CRC-32 of the AWS event-stream framing (src/evstream.c).
PKGS="$PKGS zlib1g-dev"
# make format-check (a make test stage) formats with clang-format.
PKGS="$PKGS clang-format"
# The metrics tests scrape with a real Prometheus and lint with promtool.
PKGS="$PKGS prometheus"
# The status page test drives Debian's headless Chromium (puppeteer-core,
# which downloads no browser).
PKGS="$PKGS chromium"
# The bench's http section: nginx (the reverse proxy polygw is compared
# with) and wrk (the generator); perf for the profiles of tests/bench/profiles.
PKGS="$PKGS nginx-light wrk linux-perf"
# tests/bench/per_request.py: instructions (callgrind) and syscalls per request.
PKGS="$PKGS valgrind strace"

# `sh tests/deps.sh deb`: also what `make deb` needs (debian/control's
# Build-Depends are all in PKGS already).
if [ "${1:-}" = deb ]; then
    PKGS="$PKGS debhelper dpkg-dev lintian fakeroot"
fi

# The Node client's tests need node >= 18 and npm; Debian 12's are fine,
# a newer one already on the machine is kept.
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    PKGS="$PKGS nodejs npm"
fi

missing=""
for p in $PKGS; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $p"
    fi
done
[ -z "$missing" ] && exit 0

echo "deps: installing:$missing"
SUDO=""
if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "deps: need root to install:$missing" >&2; exit 1; }
    SUDO=sudo
fi
export DEBIAN_FRONTEND=noninteractive

# Another apt or dpkg (unattended-upgrades on a fresh VM, cloud-init) may
# hold the package locks: wait for it, saying who it is, instead of failing.
# apt-get install waits by itself with DPkg::Lock::Timeout; apt-get update
# does not wait for the lists lock, hence the loop below.
LOCK_WAIT_S=${DEPS_LOCK_WAIT_S:-600}
LOCKS="/var/lib/dpkg/lock-frontend /var/lib/dpkg/lock /var/lib/apt/lists/lock \
/var/cache/apt/archives/lock"

# lock_holder: "FILE, held by process PID (NAME)" for the first lock of
# LOCKS some process holds (apt and dpkg take fcntl locks: /proc/locks
# lists them by inode); fails when none is held.
lock_holder() {
    for f in $LOCKS; do
        ino=$(stat -c %i "$f" 2>/dev/null) || continue
        pid=$(awk -v ino="$ino" '{ o = ($2 == "->"); n = split($(6 + o), d, ":");
                                   if (n == 3 && d[3] == ino) { print $(5 + o); exit } }' \
              /proc/locks 2>/dev/null)
        if [ -n "$pid" ]; then
            echo "$f, held by process $pid ($(cat "/proc/$pid/comm" 2>/dev/null || echo '?'))"
            return 0
        fi
    done
    return 1
}

wait_for_locks() {
    waited=0
    said=""
    while held=$(lock_holder); do
        if [ "$held" != "$said" ]; then
            echo "deps: waiting for another package manager to finish: $held" \
                 "(up to ${LOCK_WAIT_S}s in all)"
            said=$held
        fi
        if [ "$waited" -ge "$LOCK_WAIT_S" ]; then
            echo "deps: gave up waiting after ${LOCK_WAIT_S}s: $held" >&2
            return 1
        fi
        sleep 2
        waited=$((waited + 2))
    done
}

APT_WAIT="-o DPkg::Lock::Timeout=$LOCK_WAIT_S"
# A fresh machine has empty package lists; refresh them once before installing.
for try in 1 2 3; do
    wait_for_locks
    # shellcheck disable=SC2086
    $SUDO apt-get $APT_WAIT update -qq && break
    [ "$try" -lt 3 ] || exit 1
    echo "deps: apt-get update failed (try $try of 3); trying again"
done
wait_for_locks
# shellcheck disable=SC2086
$SUDO apt-get $APT_WAIT install -y -qq --no-install-recommends $missing
