#!/bin/sh
# Install the Debian packages polygw builds, tests and benchmarks with, when missing.
# Idempotent and quiet when everything is present; needs root (or sudo) otherwise.
set -eu

PKGS="build-essential pkg-config libev-dev libmsgpack-dev libyaml-dev libcurl4-openssl-dev \
libjansson-dev libhiredis-dev check redis-server python3 python3-msgpack python3-pytest \
libclang-rt-14-dev"
# The HTTP front end's parser (linked as -lhttp_parser), and curl for its tests.
PKGS="$PKGS libhttp-parser-dev curl"

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
# A fresh machine has empty package lists; refresh them once before installing.
$SUDO apt-get update -qq
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing
