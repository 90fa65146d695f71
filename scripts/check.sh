#!/bin/sh
# Set up everything on a fresh Debian 12 machine and run the test suite.
# This is the README's test command; .ci/run calls it.
set -eu
cd "$(dirname "$0")/.."
MALLEUS_NO_TORCH=${MALLEUS_NO_TORCH:-0} sh scripts/install-deps.sh
[ -x configure ] || autoreconf -fi
[ -f Makefile ] || ./configure
make -j"$(nproc)"
make -j"$(nproc)" check
