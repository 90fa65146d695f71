#!/bin/sh
# A rank that fails must bring the job down promptly, never leave its peers
# blocked in a collective until the job's time limit (mpiexec; the same
# under Slurm: tests/test_slurm.sh).  Each case must end within LIMIT
# seconds, with the status its failure calls for:
#   - a data file missing on some ranks only (as on a node whose local disk
#     lacks it): every rank agrees and exits 2 (before: the ranks that had
#     the file waited in the first collective forever);
#   - one rank's step failing with an error (test hook
#     MALLEUS_TEST_STEP_FAIL): the library's fatal path aborts the job;
#   - one rank killed with SIGKILL in the middle of training.
set -u
: "${top_srcdir:=$(dirname "$0")/..}"
B="${top_builddir:-.}"
: "${MPIEXEC:=mpiexec.mpich}"
W=$(mktemp -d /tmp/malleus-test-dying-XXXXXX)
trap 'rm -rf "$W"' EXIT
export OPENBLAS_NUM_THREADS=1
LIMIT=30
fails=0
T="$B/malleus-train"
ARGS="--model tiny --dp 4 --global-batch 8 --micro-batch 2 --quiet"

# timed CODE PATTERN CMD...: runs CMD (killed after 120 s); it must end
# within LIMIT seconds with status CODE ("nz": any nonzero) and PATTERN in
# its output.
timed() {
    code=$1 pat=$2
    shift 2
    t0=$(date +%s)
    timeout -k 5 120 "$@" >"$W/out" 2>&1
    rc=$?
    dt=$(($(date +%s) - t0))
    ok=1
    [ $dt -le $LIMIT ] || ok=0
    if [ "$code" = nz ]; then [ $rc -ne 0 ] || ok=0; else [ $rc -eq "$code" ] || ok=0; fi
    grep -Eq -- "$pat" "$W/out" || ok=0
    if [ $ok = 1 ]; then
        echo "ok: exit $rc after ${dt} s: $(grep -E -- "$pat" "$W/out" | head -1 | cut -c1-160)"
    else
        echo "FAIL: exit $rc after ${dt} s (wanted $code within $LIMIT s and /$pat/): $*"
        tail -5 "$W/out"
        fails=$((fails + 1))
    fi
}

env_of() { (tr '\0' '\n' <"/proc/$1/environ") 2>/dev/null; }

"$B/malleus-tokenize" --default "$W/corpus.bin" >/dev/null || exit 99

# Ranks 1-3 lack the data file; rank 0 has it.
timed 2 "missing.bin does not exist" "$MPIEXEC" -n 1 "$T" $ARGS --data "$W/corpus.bin" \
    --steps 2 : -n 3 "$T" $ARGS --data "$W/missing.bin" --steps 2
# Rank 2's third step fails; the others are waiting for it in the step.
MALLEUS_TEST_STEP_FAIL=2:3 timed 1 "rank 2: .*step 3 fails on rank 2; aborting the job" \
    "$MPIEXEC" -n 4 "$T" $ARGS --steps 1000

# Rank 1 killed with SIGKILL while the job trains.
MALLEUS_DYING_TEST="$W" "$MPIEXEC" -n 4 "$T" $ARGS --steps 100000 --metrics "$W/m.jsonl" >"$W/kill.out" 2>&1 &
job=$!
i=0
while [ "$( (wc -l <"$W/m.jsonl") 2>/dev/null || echo 0)" -lt 3 ] && [ $i -lt 600 ]; do
    sleep 0.1
    i=$((i + 1))
done
victim=""
for p in $(pgrep -x malleus-train); do
    # this job's rank 1: hydra gives each rank PMI_RANK in its environment
    if env_of "$p" | grep -qx "PMI_RANK=1" && env_of "$p" | grep -qx "MALLEUS_DYING_TEST=$W"; then
        victim=$p
    fi
done
if [ -z "$victim" ]; then
    echo "FAIL: could not find rank 1 of the training job"
    fails=$((fails + 1))
    kill $job 2>/dev/null
else
    t0=$(date +%s)
    kill -9 "$victim"
    i=0
    while kill -0 $job 2>/dev/null && [ $i -lt 1200 ]; do
        sleep 0.1
        i=$((i + 1))
    done
    dt=$(($(date +%s) - t0))
    if kill -0 $job 2>/dev/null; then
        echo "FAIL: the job still runs 120 s after rank 1 was killed"
        kill $job
        fails=$((fails + 1))
    elif [ $dt -gt $LIMIT ]; then
        echo "FAIL: the job ended ${dt} s after rank 1 was killed (limit $LIMIT s)"
        fails=$((fails + 1))
    else
        echo "ok: the job ended ${dt} s after rank 1 was killed (SIGKILL)"
    fi
fi
wait $job 2>/dev/null

echo "$fails failure(s)"
[ $fails -eq 0 ]
