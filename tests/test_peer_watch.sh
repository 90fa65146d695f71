#!/bin/sh
# The ranks' watchdog over each other (--peer-timeout, comm/watch.h) under
# mpiexec, 4 ranks:
#   - a rank that stops answering (SIGSTOP) in the middle of training: the
#     others are blocked in a collective that can never end; with
#     --peer-timeout 2 the job must end within 6 s of the stop, with a
#     message that names the silent rank (without the watch it hangs);
#   - a rank that stops while the others are inside a blocking MPI call
#     with no non-blocking form (MPI_Comm_split at start-up,
#     MPI_Comm_create_group at an online plan change, MPI_Finalize at the
#     end; armed, comm/watch.h): the test feature
#     MALLEUS_TEST_STOP=CALL:RANK:NTH stops that rank right before CALL; the
#     others must end within the timeout + 2 s, a rank inside CALL naming
#     it (unarmed, the split and Finalize cases hang until the launcher's
#     time limit; at the plan change the ranks outside the new group, in
#     checked waits, still end the job, but rank 0 inside the call is mute);
#   - a straggler is not a failure: rank 3 slowed so that every step takes
#     about twice the timeout (--peer-timeout 1): the run must finish.
# The same on a real multi-node Slurm cluster: tests/test_nodes.sh.
set -u
: "${top_srcdir:=$(dirname "$0")/..}"
B=$(cd "${top_builddir:-.}" && pwd)
W=$(mktemp -d /tmp/malleus-test-watch-XXXXXX)
cleanup() {
    # a stopped rank, if the launcher left it behind
    for f in "$W"/pid.*; do
        [ -f "$f" ] && kill -CONT "$(cat "$f")" 2>/dev/null && kill -9 "$(cat "$f")" 2>/dev/null
    done
    rm -rf "$W"
}
trap cleanup EXIT
export OPENBLAS_NUM_THREADS=1
ARGS="--model tiny --dp 4 --global-batch 8 --micro-batch 2 --quiet"
ms() { echo $((($(date +%s%N) - $1) / 1000000)); }
fails=0

# each rank leaves its pid where the test finds it (PMI_RANK: MPICH's)
cat >"$W/rank.sh" <<EOF
#!/bin/sh
echo \$\$ >"$W/pid.\${PMI_RANK:-\${OMPI_COMM_WORLD_RANK:-x}}"
exec "$B/malleus-train" "\$@"
EOF
# shellcheck disable=SC2086
sh "$top_srcdir/tests/mpirun.sh" 4 60 sh "$W/rank.sh" $ARGS --steps 100000 --peer-timeout 2 \
    --metrics "$W/m.jsonl" >"$W/out" 2>&1 &
job=$!
i=0
while [ "$( (wc -l <"$W/m.jsonl") 2>/dev/null || echo 0)" -lt 5 ] || [ ! -s "$W/pid.3" ]; do
    sleep 0.1
    i=$((i + 1))
    [ $i -lt 300 ] || { cat "$W/out"; echo "FAIL: the job did not reach step 5"; exit 1; }
done
t0=$(date +%s%N)
kill -STOP "$(cat "$W/pid.3")"
while kill -0 $job 2>/dev/null && [ "$(ms "$t0")" -lt 30000 ]; do sleep 0.1; done
dt=$(ms "$t0")
kill -CONT "$(cat "$W/pid.3")" 2>/dev/null
wait $job
rc=$?
if [ "$dt" -le 6000 ] && [ $rc -ne 0 ] && grep -q "rank 3 (host .*) has not been heard from" "$W/out"; then
    echo "ok: rank 3 stopped at step $(wc -l <"$W/m.jsonl" | tr -d ' '); the job ended (exit $rc) after $dt ms: $(grep -o "rank 3 (host .*) has not been heard from for [0-9.]* s" "$W/out" | head -1)"
else
    tail -5 "$W/out"
    echo "FAIL: rank 3 stopped; the job ended after $dt ms (bound 6000) with exit $rc, or no rank named rank 3"
    fails=$((fails + 1))
fi

# stopped right before a blocking call the others are in:
#   CALL RANK NTH ARGS... (MALLEUS_TEST_STOP=CALL:RANK:NTH)
stop_before() {
    call=$1 r=$2 nth=$3
    shift 3
    rm -f "$W"/pid.*
    MALLEUS_TEST_STOP=$call:$r:$nth sh "$top_srcdir/tests/mpirun.sh" 4 12 sh "$W/rank.sh" "$@" \
        --peer-timeout 2 >"$W/out" 2>&1 &
    job=$!
    # from the moment the rank is stopped (state T)
    while kill -0 $job 2>/dev/null; do
        [ -s "$W/pid.$r" ] && [ "$(ps -o state= -p "$(cat "$W/pid.$r")" 2>/dev/null)" = T ] && break
        sleep 0.05
    done
    t0=$(date +%s%N)
    while kill -0 $job 2>/dev/null; do sleep 0.05; done
    dt=$(ms "$t0")
    wait $job
    rc=$?
    if [ "$dt" -le 4000 ] && [ $rc -ne 0 ] && grep -q "in $call .*rank $r (host .*) has not been heard from" "$W/out"; then
        echo "ok: rank $r stopped before $call ($nth); the others ended (exit $rc) after $dt ms: $(grep -o "in $call [^:]*: rank $r (host .*) has not been heard from for [0-9.]* s" "$W/out" | head -1)"
    else
        tail -5 "$W/out"
        echo "FAIL: rank $r stopped before $call ($nth); the job ended after $dt ms (bound 4000) with exit $rc, or no rank named rank $r in $call"
        fails=$((fails + 1))
    fi
}
# shellcheck disable=SC2086
stop_before MPI_Comm_split 2 1 $ARGS --steps 3
# an online plan change (rank 3 slowed; TP 4 -> a TP group of ranks 0 and 1
# made at the change: the second MPI_Comm_create_group of rank 1)
stop_before MPI_Comm_create_group 1 2 --model tiny --quiet --steps 8 --global-batch 16 \
    --micro-batch 2 --dp 1 --tp 4 --inject 3:8:1 --adapt online --check-every 2 --window 3 \
    --gap 1.5 --noise-floor 2.0 --threshold 2.0
# shellcheck disable=SC2086
stop_before MPI_Finalize 1 1 $ARGS --steps 2

# a straggler: steps of ~2 s against a 1 s timeout
t0=$(date +%s%N)
# shellcheck disable=SC2086
sh "$top_srcdir/tests/mpirun.sh" 4 60 "$B/malleus-train" $ARGS --steps 3 --peer-timeout 1 \
    --inject 3:600:2 --global-batch 16 --metrics "$W/slow.jsonl" >"$W/out" 2>&1
rc=$?
longest=$(sed -n 's/.*"step_ms": *\([0-9]*\).*/\1/p' "$W/slow.jsonl" | sort -n | tail -1)
if [ $rc = 0 ] && [ "${longest:-0}" -gt 1500 ]; then
    echo "ok: a straggler's steps of up to $longest ms against --peer-timeout 1: finished ($(ms "$t0") ms)"
else
    tail -5 "$W/out"
    echo "FAIL: the straggler run exited $rc (longest step ${longest:-?} ms; it must be over 1500)"
    fails=$((fails + 1))
fi
[ $fails = 0 ]
