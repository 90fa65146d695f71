#!/bin/bash
# The straggler-adaptive training loop (batch path), with or without Slurm.
#
#   train (malleus-train --adapt restart)
#     -> exit 3 "re-plan needed": malleus-replan on the collected metrics
#        -> malleus-reshard the newest snapshot onto the new plan
#        -> train again with --resume on the new plan
#     -> any other failure (a rank that errs, crashes or is killed: the
#        launcher ends the whole step at once, srun by --kill-on-bad-exit,
#        mpiexec by itself): resume from the newest complete snapshot, at
#        most MAX_FAILURES times in a row
#   until STEPS steps are done.
#
# jobs/malleus.sbatch runs it under Slurm (LAUNCH="srun --mpi=pmi2 ...");
# on a workstation run it directly (LAUNCH defaults to $MPIEXEC, else mpiexec):
#
#   NPROCS=8 STEPS=60 TRAIN_ARGS="--inject 3:4:10" jobs/adaptive-loop.sh
#
# Every input is a variable (defaults in brackets):
#   MALLEUS_BIN     directory holding the malleus-* programs [the build tree]
#   RUN_DIR         plans, snapshots, metrics and logs [./malleus-run]
#   NPROCS          ranks [SLURM_NTASKS or 8]
#   LAUNCH          MPI launcher prefix [srun --mpi=pmi2 --kill-on-bad-exit=1
#                   -n NPROCS under Slurm, else ${MPIEXEC:-mpiexec} -n NPROCS]; a launcher
#                   given here must end every rank when one fails
#   MODEL           model preset or config file [tiny]
#   PROFILE         planner profile: preset or JSON [MODEL]
#   STEPS           target step [60]
#   GLOBAL_BATCH    sequences per step [16]
#   MICRO_BATCH     sequences per micro-batch [2]
#   PIPELINES       pipelines of the initial uniform plan [2]
#   RANKS_PER_NODE  ranks per node [NPROCS]
#   MEMORY_MB       device memory per rank for the planner [16384]
#   SNAPSHOT_EVERY  periodic snapshots [10]
#   MAX_FAILURES    crash restarts in a row before giving up [3]
#   TRAIN_ARGS      extra malleus-train flags (e.g. --inject, policy knobs)
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
MALLEUS_BIN=${MALLEUS_BIN:-$(cd "$here/.." && pwd)}
RUN_DIR=${RUN_DIR:-$(pwd)/malleus-run}
NPROCS=${NPROCS:-${SLURM_NTASKS:-8}}
if [ -n "${SLURM_JOB_ID:-}" ]; then
    # --kill-on-bad-exit: a rank that fails (error, signal, kill -9) ends
    # the step at once instead of leaving its peers blocked in a collective
    # until the job's time limit; the loop then resumes from the snapshot.
    LAUNCH=${LAUNCH:-"srun --mpi=pmi2 --kill-on-bad-exit=1 -n $NPROCS"}
else
    LAUNCH=${LAUNCH:-"${MPIEXEC:-mpiexec} -n $NPROCS"}
fi
MODEL=${MODEL:-tiny}
PROFILE=${PROFILE:-$MODEL}
STEPS=${STEPS:-60}
GLOBAL_BATCH=${GLOBAL_BATCH:-16}
MICRO_BATCH=${MICRO_BATCH:-2}
PIPELINES=${PIPELINES:-2}
RANKS_PER_NODE=${RANKS_PER_NODE:-$NPROCS}
MEMORY_MB=${MEMORY_MB:-16384}
SNAPSHOT_EVERY=${SNAPSHOT_EVERY:-10}
MAX_FAILURES=${MAX_FAILURES:-3}
TRAIN_ARGS=${TRAIN_ARGS:-}

TRAIN=$MALLEUS_BIN/malleus-train
REPLAN=$MALLEUS_BIN/malleus-replan
RESHARD=$MALLEUS_BIN/malleus-reshard
for p in "$TRAIN" "$REPLAN" "$RESHARD"; do
    [ -x "$p" ] || { echo "adaptive-loop: $p not found: set MALLEUS_BIN to the build directory" >&2; exit 2; }
done

mkdir -p "$RUN_DIR"
METRICS=$RUN_DIR/metrics.jsonl
EVENTS=$RUN_DIR/events.log
log() { echo "adaptive-loop: $*" | tee -a "$EVENTS"; }

# Planner inputs shared by every call.
planner_args=(--world-size "$NPROCS" --ranks-per-node "$RANKS_PER_NODE" --memory-mb "$MEMORY_MB"
              -g "$GLOBAL_BATCH" -b "$MICRO_BATCH")
if [ -f "$PROFILE" ]; then planner_args+=(--profile "$PROFILE"); else planner_args+=(--model "$PROFILE"); fi

# Generation g runs plan.g.json with snapshots in snap.g; resume the newest.
gen=0
while [ -f "$RUN_DIR/plan.$((gen + 1)).json" ] && [ -d "$RUN_DIR/snap.$((gen + 1))" ]; do gen=$((gen + 1)); done
plan=$RUN_DIR/plan.$gen.json
snap=$RUN_DIR/snap.$gen
if [ ! -f "$plan" ]; then
    "$REPLAN" "${planner_args[@]}" --pipelines "$PIPELINES" --uniform -o "$plan" ||
        { log "could not write the initial plan"; exit 1; }
    log "generation 0: uniform plan $plan"
fi

failures=0
while :; do
    resume=()
    [ -f "$snap/latest" ] && resume=(--resume)
    baseline=()
    # The policy's baseline: the rates the current plan was made with.
    [ "$gen" -gt 0 ] && [ -f "$RUN_DIR/rates.$gen.jsonl" ] && baseline=(--baseline-rates "$RUN_DIR/rates.$gen.jsonl")
    log "generation $gen: training on $plan ${resume[*]}"
    # shellcheck disable=SC2086
    $LAUNCH "$TRAIN" --model "$MODEL" --plan "$plan" --steps "$STEPS" \
        --global-batch "$GLOBAL_BATCH" --snapshot-dir "$snap" --snapshot-every "$SNAPSHOT_EVERY" \
        --keep 2 --adapt restart --metrics "$METRICS" --log-every 1 \
        --ranks-per-node "$RANKS_PER_NODE" "${baseline[@]}" "${resume[@]}" $TRAIN_ARGS
    rc=$?
    case $rc in
    0)
        log "done: $STEPS steps"
        exit 0
        ;;
    3)
        failures=0
        next=$((gen + 1))
        # the rates that drove this decision become the next baseline
        grep '"rates"' "$METRICS" | tail -n 2 >"$RUN_DIR/rates.$next.jsonl"
        log "re-plan requested after generation $gen"
        if ! "$REPLAN" "${planner_args[@]}" --rates "$METRICS" --current "$plan" \
            -o "$RUN_DIR/plan.$next.json" --explain >>"$EVENTS" 2>&1; then
            log "malleus-replan failed; continuing on the current plan"
            continue
        fi
        if ! "$RESHARD" --no-progress "$snap" "$RUN_DIR/plan.$next.json" "$RUN_DIR/snap.$next" >>"$EVENTS" 2>&1; then
            log "malleus-reshard failed; continuing on the current plan"
            rm -rf "$RUN_DIR/snap.$next" "$RUN_DIR/plan.$next.json"
            continue
        fi
        gen=$next
        plan=$RUN_DIR/plan.$gen.json
        snap=$RUN_DIR/snap.$gen
        log "generation $gen: new plan $plan"
        ;;
    *)
        failures=$((failures + 1))
        log "training failed (exit $rc), failure $failures of $MAX_FAILURES"
        [ $failures -ge "$MAX_FAILURES" ] && { log "giving up"; exit 1; }
        [ -f "$snap/latest" ] || log "no snapshot yet: restarting from step 0"
        ;;
    esac
done
