#!/bin/sh
# Set up everything on a fresh Debian 12 machine, build, and run the main
# job: a short training run on the built-in corpus, with a snapshot and a
# resume.  This is the README's first command.
set -eu
cd "$(dirname "$0")/.."
MALLEUS_NO_TORCH=1 sh scripts/install-deps.sh
[ -x configure ] || autoreconf -fi
[ -f Makefile ] || ./configure
make -j"$(nproc)"
rm -rf demo-run && mkdir -p demo-run
./malleus-train --model tiny --steps 300 --global-batch 16 --micro-batch 8 --lr 3e-3 \
    --warmup 20 --log-every 20 --snapshot-dir demo-run --snapshot-every 100 \
    --metrics demo-run/metrics.jsonl
echo "demo: metrics in demo-run/metrics.jsonl, snapshots in demo-run/"
