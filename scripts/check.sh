#!/bin/sh
# Set up everything on a fresh Debian 12 machine and run the test suite.
# This is the README's test command, and exactly what CI runs (.ci/run calls
# it).  Four stages, each stopping the script when it fails:
#
#   1. build in the checkout, make check;
#   2. make fuzz: every libFuzzer harness for MALLEUS_FUZZ_SECONDS seconds
#      (30) from its committed corpus (fuzz-build/);
#   3. make check-sanitize: the whole make check again, built out of tree
#      (san-build/) with AddressSanitizer + UndefinedBehaviorSanitizer,
#      every report fatal;
#   4. make check-openmpi: built out of tree (ompi-build/) against Open MPI
#      and its parallel HDF5 -- Debian's packages unpacked into a private
#      prefix, never installed -- and the multi-rank subset run with it
#      (tests/openmpi-build.sh).
#
# MALLEUS_FUZZ_SECONDS=0 skips stage 2, MALLEUS_SANITIZE=0 stage 3,
# MALLEUS_OPENMPI=0 stage 4 (on 2 cores stage 1 takes about 4 minutes, 2
# about 5, 3 about 7.5, 4 about 2: README, "Tests").  The output ends with
# each stage's wall time and automake's summary of the test suites.
set -eu
cd "$(dirname "$0")/.."
MALLEUS_NO_TORCH=${MALLEUS_NO_TORCH:-0} sh scripts/install-deps.sh
[ -x configure ] || autoreconf -fi
[ -f Makefile ] || ./configure
jobs=$(nproc)
times=""
stage() { # NAME COMMAND...: run, time, remember
    name=$1
    shift
    echo "==== check.sh: $name"
    t0=$(date +%s)
    "$@"
    times="$times
  $name: $(($(date +%s) - t0)) s"
}
stage "build and make check" sh -c "make -j$jobs && make -j$jobs check"
fuzz_s=${MALLEUS_FUZZ_SECONDS:-30}
if [ "$fuzz_s" != 0 ]; then
    stage "make fuzz ($fuzz_s s per harness)" make -j"$jobs" fuzz FUZZ_SECONDS="$fuzz_s"
fi
if [ "${MALLEUS_SANITIZE:-1}" != 0 ]; then
    stage "make check-sanitize" make -j"$jobs" check-sanitize
fi
if [ "${MALLEUS_OPENMPI:-1}" != 0 ]; then
    stage "make check-openmpi" make -j"$jobs" check-openmpi
fi
echo "==== check.sh: all stages passed; wall time per stage:$times"
for log in test-suite.log san-build/build/test-suite.log ompi-build/build/test-suite.log; do
    [ -f "$log" ] || continue
    echo "============================================================================"
    echo "Testsuite summary ($log)"
    echo "============================================================================"
    grep -E '^# (TOTAL|PASS|SKIP|XFAIL|FAIL|XPASS|ERROR):' "$log"
done
echo "============================================================================"
