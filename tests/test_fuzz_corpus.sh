#!/bin/sh
# Every committed fuzz input (tests/fuzz/corpus/NAME/: the seeds and the
# inputs that once broke a parser) through its harness, linked with a plain
# main() (tests/fuzz/replay.c): the regression test of what the fuzzers
# found, with this tree's compiler and flags -- so under make
# check-sanitize with AddressSanitizer and UBSan too.  A harness that aborts
# (a broken promise) or crashes fails the test.
set -u
: "${top_srcdir:=$(dirname "$0")/..}"
B="${top_builddir:-.}"
W=$(mktemp -d /tmp/malleus-test-fuzz-XXXXXX)
trap 'rm -rf "$W"' EXIT
fails=0
for name in config llmc plan cluster profile rates index marker snapdir idx safetensors; do
    # snapdir builds directories with FIFOs in them: a reader that blocks
    # on one is a finding, not a hung make check
    if timeout 600 "$B/tests/fuzz/replay_$name" "$top_srcdir/tests/fuzz/corpus/$name" \
        2>"$W/$name.err"; then
        :
    else
        echo "FAIL: fuzz harness $name on its corpus (status $?); the last lines:"
        tail -20 "$W/$name.err"
        fails=$((fails + 1))
    fi
done
[ $fails -eq 0 ] || exit 1
