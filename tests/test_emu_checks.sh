#!/bin/sh
# The CUDA emulation stops what the GPU would refuse or leave undefined
# (tests/test_emu_checks.cpp): each mode must abort with its message on
# stderr, and the correct kernels of mode "ok" must pass in every thread
# order.  Fails naming each mode that ran through or died for another
# reason.
prog=${PROG:-./tests/test_emu_checks}
err=${TMPDIR:-/tmp}/test_emu_checks.$$
fails=0
expect() { # MODE MESSAGE
    "$prog" "$1" >/dev/null 2>"$err"
    rc=$?
    if [ $rc -eq 0 ] || [ $rc -eq 1 ] || ! grep -q "emu: .*$2" "$err"; then
        echo "FAIL: $1: exit $rc, want the emulation's '$2':"
        sed 's/^/    /' "$err"
        fails=$((fails + 1))
    else
        echo "ok: $1: $(grep -o "emu: .*" "$err" | head -1)"
    fi
}
expect two-barriers "threads wait at different barriers"
expect two-shuffles "lanes of a warp at different warp exchanges"
expect misaligned "misaligned 16-byte vector load"
expect ldmatrix-global "ldmatrix row outside the block's"
expect cp-pending "never waited for"
expect grid-y "grid dimension"
expect block-size "block of more than 1024 threads"
expect smem-optin "more than 48 KiB of dynamic shared memory without"
expect smem-max "opt-in past the maximum refused"
if ! "$prog" ok >/dev/null 2>"$err"; then
    echo "FAIL: ok: correct kernels stopped:"
    sed 's/^/    /' "$err"
    fails=$((fails + 1))
fi
rm -f "$err"
[ $fails -eq 0 ] && echo "test_emu_checks: ok" && exit 0
echo "test_emu_checks: $fails failure(s)"
exit 1
