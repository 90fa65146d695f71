# Sourced by the tests that stop runs in the middle (test_preempt.sh,
# test_slurm_preempt.sh): reading a run's progress from its files.
#   fail TEXT          print FAIL: TEXT and count it in $fails
#   rows FILE          its lines (0 when missing)
#   wait_rows FILE N   until FILE holds N lines (90 s at most)
#   last_step METRICS  the step of its last row
#   snap_step DIR      the step of DIR's newest committed snapshot ('' none)
#   guard PID S        in the background: SIGKILL to PID and every process
#                      below it if PID still runs S seconds from now (a
#                      stop that never comes must fail the test, not hang it)
fails=0
fail() {
    echo "FAIL: $*"
    fails=$((fails + 1))
}
rows() { if [ -f "$1" ]; then wc -l <"$1"; else echo 0; fi; }
wait_rows() {
    t=0
    while [ "$(rows "$1")" -lt "$2" ] && [ $t -lt 900 ]; do
        sleep 0.1
        t=$((t + 1))
    done
}
last_step() { tail -n 1 "$1" | sed -n 's/^{"step": \([0-9]*\),.*/\1/p'; }
snap_step() { sed -n 's/^step_0*\([0-9]*\)$/\1/p' "$1/latest" 2>/dev/null; }
descendants() {
    ps -e -o pid= -o ppid= | awk -v root="$1" '{ up[$1] = $2 }
        END { for (p in up) { q = p; while ((q in up) && q != root && q > 1) q = up[q]; if (q == root && p != root) print p } }'
}
guard() {
    (
        t=0
        while kill -0 "$1" 2>/dev/null && [ $t -lt "$2" ]; do
            sleep 1
            t=$((t + 1))
        done
        if kill -0 "$1" 2>/dev/null; then
            echo "FAIL: still running after $2 s: killed" >&2
            kill -KILL $(descendants "$1") "$1" 2>/dev/null
        fi
    ) &
}
