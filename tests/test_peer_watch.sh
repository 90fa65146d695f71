#!/bin/sh
# The ranks' watchdog over each other (--peer-timeout, comm/watch.h) under
# mpiexec, 4 ranks:
#   - a rank that stops answering (SIGSTOP) in the middle of training: the
#     others are blocked in a collective that can never end; with
#     --peer-timeout 2 the job must end within 6 s of the stop, with a
#     message that names the silent rank (without the watch it hangs);
#   - a straggler is not a failure: rank 3 slowed so that every step takes
#     about twice the timeout (--peer-timeout 1): the run must finish.
# The same on a real multi-node Slurm cluster: tests/test_nodes.sh.
set -u
: "${top_srcdir:=$(dirname "$0")/..}"
B=$(cd "${top_builddir:-.}" && pwd)
W=$(mktemp -d /tmp/malleus-test-watch-XXXXXX)
cleanup() {
    # the stopped rank, if the launcher left it behind
    [ -f "$W/pid.3" ] && kill -CONT "$(cat "$W/pid.3")" 2>/dev/null && kill -9 "$(cat "$W/pid.3")" 2>/dev/null
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
if [ $dt -le 6000 ] && [ $rc -ne 0 ] && grep -q "rank 3 (host .*) has not been heard from" "$W/out"; then
    echo "ok: rank 3 stopped at step $(wc -l <"$W/m.jsonl" | tr -d ' '); the job ended (exit $rc) after $dt ms: $(grep -o "rank 3 (host .*) has not been heard from for [0-9.]* s" "$W/out" | head -1)"
else
    tail -5 "$W/out"
    echo "FAIL: rank 3 stopped; the job ended after $dt ms (bound 6000) with exit $rc, or no rank named rank 3"
    fails=$((fails + 1))
fi

# a straggler: steps of ~2 s against a 1 s timeout
t0=$(date +%s%N)
# shellcheck disable=SC2086
sh "$top_srcdir/tests/mpirun.sh" 4 60 "$B/malleus-train" $ARGS --steps 3 --peer-timeout 1 \
    --inject 3:1000:2 --global-batch 16 --metrics "$W/slow.jsonl" >"$W/out" 2>&1
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
