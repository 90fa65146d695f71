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
# about 6, 3 about 5, 4 under 1: docs/DEVELOPING.md, "Tests").  The output
# ends with each stage's wall time, each suite's slowest tests and
# automake's summary of the test suites.
set -eu
cd "$(dirname "$0")/.."
MALLEUS_NO_TORCH=${MALLEUS_NO_TORCH:-0} sh scripts/install-deps.sh
[ -x configure ] || autoreconf -fi
[ -f Makefile ] || ./configure
jobs=$(nproc)
times=""
suite_find() { # DIR FIND-TESTS...: find in the suite built in DIR, not in
    # the variant builds inside it
    d=$1
    shift
    find "$d" \( -path "$d/san-build" -o -path "$d/ompi-build" -o -path "$d/fuzz-build" \) -prune -o "$@"
}
slowest() { # DIR: the slowest tests of the suite built in DIR, from the
    # wall time tests/timed-test appends to each test's log -- where the
    # CI time budget goes (printed after each suite, and when one fails)
    [ -f "$1/test-suite.log" ] || [ -d "$1/tests" ] || return 0
    echo "==== check.sh: slowest tests in ${1}:"
    suite_find "$1" -name '*.log' ! -name test-suite.log -exec grep -H '^timed-test: ' {} + 2>/dev/null |
        sed "s|^$1/||; s|\.log:timed-test: | |" | sort -k2 -rn | head -12 |
        awk '{printf "  %7s s  %s\n", $2, $1}'
}
failed_logs() { # DIR: the last lines of each failed test's log in the
    # suite built in DIR (a CI log keeps only its tail: the reason is here)
    [ -d "$1/tests" ] || return 0
    suite_find "$1" -name '*.trs' -exec grep -l -E '^:test-result: (FAIL|ERROR)' {} + 2>/dev/null |
        while read -r trs; do
            echo "==== check.sh: the end of ${trs%.trs}.log:"
            tail -n 30 "${trs%.trs}.log" 2>/dev/null | cut -c1-300
        done
}
stage() { # NAME SUITE_DIR COMMAND...: run, time, remember
    name=$1
    dir=$2
    shift 2
    echo "==== check.sh: $name"
    t0=$(date +%s)
    rc=0
    "$@" || rc=$?
    [ "$dir" = - ] || [ $rc = 0 ] || failed_logs "$dir"
    [ "$dir" = - ] || slowest "$dir"
    if [ $rc != 0 ]; then
        echo "==== check.sh: $name failed (exit $rc) after $(($(date +%s) - t0)) s" >&2
        exit $rc
    fi
    times="$times
  $name: $(($(date +%s) - t0)) s"
}
stage "build and make check" . sh -c "make -j$jobs && make -j$jobs check"
fuzz_s=${MALLEUS_FUZZ_SECONDS:-30}
if [ "$fuzz_s" != 0 ]; then
    stage "make fuzz ($fuzz_s s per harness)" - make -j"$jobs" fuzz FUZZ_SECONDS="$fuzz_s"
fi
if [ "${MALLEUS_SANITIZE:-1}" != 0 ]; then
    stage "make check-sanitize" san-build/build make -j"$jobs" check-sanitize
fi
if [ "${MALLEUS_OPENMPI:-1}" != 0 ]; then
    stage "make check-openmpi" ompi-build/build make -j"$jobs" check-openmpi
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
