# Sourced by the tests that stop runs in the middle (test_preempt.sh,
# test_slurm_preempt.sh): reading a run's progress from its files.
#   fail TEXT          print FAIL: TEXT and count it in $fails
#   rows FILE          its lines (0 when missing)
#   wait_rows FILE N   until FILE holds N lines (90 s at most)
#   last_step METRICS  the step of its last row
#   snap_step DIR      the step of DIR's newest committed snapshot ('' none)
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
