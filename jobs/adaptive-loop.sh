#!/bin/bash
# The straggler-adaptive training loop (batch path), with or without Slurm.
#
#   train (malleus-train --adapt restart)
#     -> exit 3 "re-plan needed": malleus-replan on the collected metrics
#        -> malleus-reshard the newest snapshot onto the new plan
#        -> train again with --resume on the new plan
#     -> exit 4 "stopped by a signal, with a snapshot": under Slurm, when the
#        stop was the time-limit warning (SIGUSR1, #SBATCH --signal), requeue
#        the job; otherwise end with status 4
#     -> any other failure (a rank that errs, crashes or is killed: the
#        launcher ends the whole step at once, srun by --kill-on-bad-exit,
#        mpiexec by itself; a node that dies or stops answering: the ranks'
#        heartbeat, malleus-train --peer-timeout): resume from the newest
#        complete snapshot, at most MAX_FAILURES times in a row; under
#        Slurm with several nodes (SHRINK) first ask each node of the job
#        whether it still runs a task, and if some do not, continue on the
#        survivors: malleus-replan for their ranks with the rates measured
#        so far, malleus-reshard the newest snapshot onto that plan, train
#        on it (submit with sbatch --no-kill, so that Slurm does not end the
#        job when it marks the dead node down); a job started again with
#        more ranks than its newest plan's (the node back) grows onto them
#        the same way; a node that answers again while the job runs on
#        fewer (GROW) is grown onto: the run stops at a step boundary with
#        a snapshot, re-plan, reshard, train on the larger set; a node
#        whose ranks straggle run after run (EXCLUDE_RATE) is left out
#   until STEPS steps are done.  A job started again (requeued, resubmitted,
#   or this script run again) continues from the newest generation that has
#   a committed snapshot, and its newest snapshot.
#
# Signals: SIGTERM, SIGINT, SIGHUP and SIGUSR1 to this script stop the run
# at the next step boundary with a snapshot (the loop sends its launcher
# STOP_SIGNAL, which the launcher forwards to the ranks); a second one ends
# the run at once.  The loop never leaves its launcher running behind it.
#
# jobs/malleus.sbatch runs it under Slurm (launcher srun --mpi=pmi2 ...);
# on a workstation run it directly (launcher mpiexec):
#
#   NPROCS=8 STEPS=60 TRAIN_ARGS="--inject 3:4:10" jobs/adaptive-loop.sh
#   jobs/adaptive-loop.sh --data "my data.bin" --val-data val.bin   # more trainer flags
#
# Arguments are passed to every malleus-train run as they are (a path with
# spaces stays one argument).  Every other input is a variable (defaults in
# brackets):
#   MALLEUS_BIN     directory holding the malleus-* programs, built or
#                   installed [found on PATH, else the build tree above this
#                   script, else the directory sbatch was called from]
#   RUN_DIR         plans, snapshots, metrics and logs [./malleus-run]
#   NPROCS          ranks [SLURM_NTASKS or 8]
#   LAUNCH          MPI launcher and its flags, as words [srun --mpi=pmi2
#                   --kill-on-bad-exit=1 -n NPROCS under Slurm, else MPIEXEC
#                   -n NPROCS]; a launcher given here must end every rank
#                   when one fails
#   MPIEXEC         the launcher outside Slurm [mpiexec]
#   RANK_WRAPPER    a program each rank runs malleus-train through (one path,
#                   e.g. jobs/gpu-bind.sh) [none]
#   STOP_SIGNAL     what a stop sends the launcher [USR1 when it is srun,
#                   which turns SIGTERM into SIGKILL for its tasks; else TERM]
#   STOP_TIMEOUT    seconds a stop may take before the ranks end (malleus-train
#                   --stop-timeout) [300]
#   REQUEUE         1: requeue the Slurm job when SIGUSR1 stopped it [1]
#   ADAPT           restart: re-plan around stragglers (above); off: train
#                   with the default layout and no planner (one process:
#                   jobs/train-single.sbatch) [restart]
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
#   SHRINK          1: after a failed run under Slurm, continue on the nodes
#                   that still answer (above) [1 with several nodes and the
#                   default LAUNCH, else 0]
#   PROBE_TIMEOUT   seconds a node has to run a task before it counts as
#                   gone [3]
#   GROW            1: while a run goes on fewer nodes than the job's (after
#                   a shrink), ask the missing ones every GROW_POLL seconds
#                   to run a task (each ask waits up to 30 s for a node
#                   coming up); once one does, stop the run at a step
#                   boundary with a snapshot and continue on the larger set
#                   (re-plan, reshard) [SHRINK]
#   GROW_POLL       seconds between those asks [10]
#   EXCLUDE_RATE    leave out a node whose ranks measured a straggling rate
#                   of this or more (its slowest rank, averaged over a run)
#                   in each of its last EXCLUDE_AFTER runs, at the next
#                   re-plan or restart and in every later run of the job
#                   (requeued too: RUN_DIR/excluded); every run's figures
#                   go to RUN_DIR/node-rates.log [0: off]
#   EXCLUDE_AFTER   runs in a row [2]
#   PRECISION       fp32 or bf16: the runs' compute, given to malleus-train and
#                   to malleus-replan, which then counts bf16's working copy
#                   (18 bytes of state a parameter; a preset counts 16) [none:
#                   the trainer's default, the profile's state]
#   TRAIN_ARGS      more malleus-train flags, as words (e.g. --inject, policy
#                   knobs; a value with spaces goes in the arguments instead)
#
# Exit status: 0 done; 4 stopped by a signal with a snapshot (run it again
# to continue); 1 failed (MAX_FAILURES in a row, or planning); 2 bad input.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
RUN_DIR=${RUN_DIR:-$(pwd)/malleus-run}
NPROCS=${NPROCS:-${SLURM_NTASKS:-8}}
ADAPT=${ADAPT:-restart}
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
STOP_TIMEOUT=${STOP_TIMEOUT:-300}
REQUEUE=${REQUEUE:-1}
read -r -a train_args <<<"${TRAIN_ARGS:-}"
extra_args=("$@")
case $ADAPT in restart | off) ;; *) echo "adaptive-loop: ADAPT must be restart or off, not '$ADAPT'" >&2; exit 2 ;; esac
PRECISION=${PRECISION:-}
case $PRECISION in '' | fp32 | bf16) ;; *) echo "adaptive-loop: PRECISION must be fp32 or bf16, not '$PRECISION'" >&2; exit 2 ;; esac
precision_args=()
[ -n "$PRECISION" ] && precision_args=(--precision "$PRECISION")
nodes=()

# UCX (MPICH's transport here) turns its log level to trace on SIGHUP and
# prints ~120 debug lines per rank into the job log; nothing here uses
# UCX's debug mode, so its signal is off unless the caller set one.
export UCX_DEBUG_SIGNO=${UCX_DEBUG_SIGNO:-0}

# The programs: MALLEUS_BIN (built or installed), else PATH, else the
# build tree above this script, else where sbatch was called from.
find_prog() {
    if [ -n "${MALLEUS_BIN:-}" ]; then
        [ -x "$MALLEUS_BIN/$1" ] && printf '%s\n' "$MALLEUS_BIN/$1"
    elif command -v "$1" >/dev/null 2>&1; then
        command -v "$1"
    elif [ -x "$here/../$1" ]; then
        printf '%s\n' "$(cd "$here/.." && pwd)/$1"
    elif [ -n "${SLURM_SUBMIT_DIR:-}" ] && [ -x "$SLURM_SUBMIT_DIR/$1" ]; then
        printf '%s\n' "$SLURM_SUBMIT_DIR/$1"
    fi
}
for p in malleus-train malleus-replan malleus-reshard; do
    [ -n "$(find_prog $p)" ] || {
        echo "adaptive-loop: $p not found${MALLEUS_BIN:+ in MALLEUS_BIN=$MALLEUS_BIN}: set MALLEUS_BIN to the directory holding it (the build directory or the installation's bin), or put it on PATH" >&2
        exit 2
    }
done
TRAIN=$(find_prog malleus-train)
REPLAN=$(find_prog malleus-replan)
RESHARD=$(find_prog malleus-reshard)

if [ -n "${LAUNCH:-}" ]; then
    read -r -a launch <<<"$LAUNCH"
elif [ -n "${SLURM_JOB_ID:-}" ]; then
    # --kill-on-bad-exit: a rank that fails (error, signal, kill -9) ends
    # the step at once instead of leaving its peers blocked in a collective
    # until the job's time limit; the loop then resumes from the snapshot.
    launch=(srun --mpi=pmi2 --kill-on-bad-exit=1 -n "$NPROCS")
    # the job's nodes, for SHRINK (one word each)
    read -r -a nodes <<<"$(scontrol show hostnames "${SLURM_JOB_NODELIST:-}" 2>/dev/null | tr '\n' ' ')"
    [ "${#nodes[@]}" -gt 1 ] && SHRINK=${SHRINK:-1}
else
    launch=("${MPIEXEC:-mpiexec}" -n "$NPROCS")
fi
SHRINK=${SHRINK:-0}
PROBE_TIMEOUT=${PROBE_TIMEOUT:-3}
[ "$SHRINK" = 1 ] && [ "${#nodes[@]}" -lt 2 ] && SHRINK=0
EXCLUDE_RATE=${EXCLUDE_RATE:-0}
EXCLUDE_AFTER=${EXCLUDE_AFTER:-2}
case $EXCLUDE_RATE in '' | *[!0-9.]* | *.*.*) echo "adaptive-loop: EXCLUDE_RATE must be a number (a straggling rate; 0: off), not '$EXCLUDE_RATE'" >&2; exit 2 ;; esac
case $EXCLUDE_AFTER in '' | *[!0-9]* | 0) echo "adaptive-loop: EXCLUDE_AFTER must be a whole number of runs, 1 or more, not '$EXCLUDE_AFTER'" >&2; exit 2 ;; esac
GROW=${GROW:-$SHRINK}
GROW_POLL=${GROW_POLL:-10}
[ "$SHRINK" = 1 ] || GROW=0
case $GROW_POLL in '' | *[!0-9.]* | *.*.*) echo "adaptive-loop: GROW_POLL must be a number of seconds, not '$GROW_POLL'" >&2; exit 2 ;; esac
job_nodes=("${nodes[@]}")
wrapper=()
[ -n "${RANK_WRAPPER:-}" ] && wrapper=("$RANK_WRAPPER")
if [ -z "${STOP_SIGNAL:-}" ]; then
    STOP_SIGNAL=TERM
    for w in "${launch[@]}"; do case $w in srun | */srun) STOP_SIGNAL=USR1 ;; esac; done
fi

mkdir -p "$RUN_DIR" || exit 2
METRICS=$RUN_DIR/metrics.jsonl
EVENTS=$RUN_DIR/events.log
grow_file=$RUN_DIR/grow.$$
log() { echo "adaptive-loop: $*" | tee -a "$EVENTS"; }
[ -n "${SLURM_RESTART_COUNT:-}" ] && [ "${SLURM_RESTART_COUNT}" -gt 0 ] &&
    log "job ${SLURM_JOB_ID:-} requeued: run $((SLURM_RESTART_COUNT + 1))"

# ---- stop requests: forwarded to the launcher, never left behind ----------
child="" stop_sig="" interrupted=0
on_signal() {
    interrupted=1
    if [ -z "$stop_sig" ]; then
        stop_sig=$1
        log "got SIG$1: stopping at the next step boundary with a snapshot"
        [ -n "$child" ] && kill -s "$STOP_SIGNAL" "$child" 2>/dev/null
    else
        log "got SIG$1 again: ending the run now"
        [ -n "$child" ] && kill -s TERM "$child" 2>/dev/null
    fi
}
for s in TERM INT HUP USR1; do trap "on_signal $s" "$s"; done

# run COMMAND...: in the background, so that a signal reaches the trap
# while it runs; its exit status in $rc.
run() {
    local watcher=""
    rm -f "$grow_file"
    "$@" &
    child=$!
    # a run on fewer nodes than the job's watches for the others' return
    if [ "$GROW" = 1 ] && [ "${#nodes[@]}" -lt "${#job_nodes[@]}" ]; then
        watch_nodes "$child" &
        watcher=$!
    fi
    interrupted=0
    wait "$child"
    rc=$?
    # a trapped signal ends `wait` early: wait again for the real status
    # (a second wait after the real one finds nothing: 127, keep rc)
    while [ "$interrupted" = 1 ]; do
        interrupted=0
        wait "$child"
        r=$?
        [ "$r" = 127 ] && break
        rc=$r
    done
    child=""
    [ -n "$watcher" ] && { kill "$watcher" 2>/dev/null; wait "$watcher" 2>/dev/null; }
}

# Whether $1 holds a committed snapshot (`latest` is a hint: a step
# directory with its COMPLETE marker is one, with or without it).
has_snapshot() {
    [ -f "$1/latest" ] && return 0
    for m in "$1"/step_*/COMPLETE; do [ -f "$m" ] && return 0; done
    return 1
}

# The step of the newest committed snapshot in $1 (0: none).
snap_step() {
    local s
    s=$(sed -n 's/^step_0*\([0-9][0-9]*\)$/\1/p' "$1/latest" 2>/dev/null | head -1)
    echo "${s:-0}"
}

# Stopped by a signal: requeue the Slurm job when time ran out, else end.
stopped() {
    local why=${stop_sig:-}
    # a SIGUSR1 that went to the ranks, not to this script (#SBATCH
    # --signal=USR1@T without B:): the trainer's event line says so
    [ -z "$why" ] && tail -n 1 "$EVENTS" 2>/dev/null | grep -q 'stopped by SIGUSR1' && why=USR1
    # nothing runs any more: the SIGTERM with which Slurm ends this run of
    # a requeued job may end the script
    trap - TERM INT HUP USR1
    if [ "$why" = USR1 ] && [ -n "${SLURM_JOB_ID:-}" ] && [ "$REQUEUE" = 1 ]; then
        # said first: the requeue ends this run of the job at once
        log "stopped at step $(snap_step "$snap") for the time limit: requeuing job $SLURM_JOB_ID"
        # Slurm refuses a running job's ExcNodeList, and the requeue ends
        # this script: the nodes left out can only be named
        [ -s "$RUN_DIR/excluded" ] &&
            log "node(s) $(sort -u "$RUN_DIR/excluded" | tr '\n' ' ')stay out of the requeued job but may be allocated to it: to give them back, scontrol update JobId=$SLURM_JOB_ID ExcNodeList=$(sort -u "$RUN_DIR/excluded" | paste -sd,) while it is pending"
        scontrol requeue "$SLURM_JOB_ID" && exit 4
        log "scontrol requeue $SLURM_JOB_ID failed: submit the job again to continue"
    fi
    log "stopped at step $(snap_step "$snap") (exit status 4): run the job again to continue"
    exit 4
}

# ---- a node gone: continue on the survivors (SHRINK) ----------------------
# The nodes of ${nodes[@]} that run a task within PROBE_TIMEOUT seconds,
# asked all at once (--overlap: the failed step may still hold their CPUs
# until Slurm hears from the dead node), into alive=().
probe_nodes() {
    local n d=$RUN_DIR/probe.$$
    mkdir -p "$d"
    for n in "${nodes[@]}"; do
        (timeout -k 1 "$PROBE_TIMEOUT" srun --overlap -N1 -n1 -w "$n" true >/dev/null 2>&1 &&
            : >"$d/$n") &
    done
    wait
    alive=()
    for n in "${nodes[@]}"; do [ -f "$d/$n" ] && alive+=("$n"); done
    rm -rf "$d"
}

# The launcher for ${nodes[@]} (some of the job's nodes), NPROCS ranks
# (--overlap: a failed step may still hold their CPUs until Slurm hears
# from a dead node).
on_nodes() {
    launch=(srun --mpi=pmi2 --kill-on-bad-exit=1 --overlap -N "${#nodes[@]}" -w "$(
        IFS=,
        echo "${nodes[*]}"
    )" -n "$NPROCS")
}

# to_nodes WHY NODE...: make generation gen+1 for NODE... (some of the
# job's nodes, in the job's order; RANKS_PER_NODE ranks each): a plan for
# their ranks with the rates the last run measured on the nodes it used
# (1.0 on the others), the newest snapshot resharded onto it; then run on
# them.  0 when done, 1 (nothing changed) when planning or resharding fails.
to_nodes() {
    local why=$1 t0 rpn new_n next n k p i rates="" last old_rates=()
    shift
    t0=$(date +%s)
    rpn=$RANKS_PER_NODE
    new_n=$((rpn * $#))
    next=$((gen + 1))
    # ranks are placed in blocks of rpn per node (srun's default): a node's
    # ranks in the new plan take its old ranks' rates
    last=$(grep '"rates"' "$METRICS" 2>/dev/null | tail -n 1 | grep -o '"rates": *\[[^]]*\]' | sed 's/.*\[//; s/\]//; s/,/ /g')
    if [ -n "$last" ]; then
        read -r -a old_rates <<<"$last"
        for n in "$@"; do
            p=-1
            for k in "${!nodes[@]}"; do [ "${nodes[$k]}" = "$n" ] && p=$k; done
            for ((i = 0; i < rpn; i++)); do
                if [ "$p" -ge 0 ]; then rates+="${rates:+, }${old_rates[$((p * rpn + i))]:-1.0}"; else rates+="${rates:+, }1.0"; fi
            done
        done
        echo "{\"rates\": [$rates]}" >"$RUN_DIR/rates.$next.jsonl"
    fi
    local pargs=(--world-size "$new_n" --ranks-per-node "$rpn" --memory-mb "$MEMORY_MB" -g "$GLOBAL_BATCH" -b "$MICRO_BATCH")
    if [ -f "$PROFILE" ]; then pargs+=(--profile "$PROFILE"); else pargs+=(--model "$PROFILE"); fi
    pargs+=("${precision_args[@]}")
    [ -f "$RUN_DIR/rates.$next.jsonl" ] && pargs+=(--rates "$RUN_DIR/rates.$next.jsonl")
    if ! "$REPLAN" "${pargs[@]}" -o "$RUN_DIR/plan.$next.json" --explain >>"$EVENTS" 2>&1; then
        log "malleus-replan for $* ($new_n ranks) failed: staying on ${nodes[*]}"
        rm -f "$RUN_DIR/plan.$next.json" "$RUN_DIR/rates.$next.jsonl"
        return 1
    fi
    if has_snapshot "$snap" &&
        ! "$RESHARD" --no-progress "$snap" "$RUN_DIR/plan.$next.json" "$RUN_DIR/snap.$next" >>"$EVENTS" 2>&1; then
        log "malleus-reshard onto the plan for $* failed: staying on ${nodes[*]}"
        rm -rf "$RUN_DIR/snap.$next" "$RUN_DIR/plan.$next.json" "$RUN_DIR/rates.$next.jsonl"
        return 1
    fi
    # a generation without a snapshot starts over: it counts once its
    # first snapshot is committed, like any other
    gen=$next
    plan=$RUN_DIR/plan.$gen.json
    snap=$RUN_DIR/snap.$gen
    NPROCS=$new_n
    nodes=("$@")
    planner_args=("${pargs[@]}")
    on_nodes
    log "generation $gen: new plan $plan for ${#nodes[@]} nodes, $NPROCS ranks ($(($(date +%s) - t0)) s to plan and reshard, $why)"
    return 0
}

# shrink: after a failed run, when some nodes no longer answer, continue
# on the others (to_nodes); 0 when it did, 1 when every node answers or it
# cannot.
shrink() {
    local gone=() n step_done snap_at rpn=$RANKS_PER_NODE
    probe_nodes
    if [ "${#alive[@]}" = "${#nodes[@]}" ]; then
        log "every node (${nodes[*]}) answers: resuming on them"
        return 1
    fi
    for n in "${nodes[@]}"; do [[ " ${alive[*]} " == *" $n "* ]] || gone+=("$n"); done
    if [ "${#alive[@]}" = 0 ] || [ $((NPROCS % ${#nodes[@]})) != 0 ]; then
        log "node(s) ${gone[*]} do not answer, but ${#alive[@]} of ${#nodes[@]} nodes with $NPROCS ranks cannot be shrunk onto: retrying on all"
        return 1
    fi
    RANKS_PER_NODE=$((NPROCS / ${#nodes[@]}))
    step_done=$(tail -n 1 "$METRICS" 2>/dev/null | sed -n 's/^{"step": *\([0-9]*\).*/\1/p')
    snap_at=$(snap_step "$snap")
    log "node(s) ${gone[*]} do not answer: continuing on ${alive[*]} ($((RANKS_PER_NODE * ${#alive[@]})) ranks, was $NPROCS) from the snapshot of step $snap_at (the failed run reached step ${step_done:-0}: $((${step_done:-0} - snap_at)) steps lost)"
    to_nodes "shrink" "${alive[@]}" || { RANKS_PER_NODE=$rpn; return 1; }
}

# ---- a persistent straggler: leave its node out (EXCLUDE_RATE) ------------
# note_rates T0: after a run that started at T0 (epoch seconds), append to
# $node_rates one line per node of the run, "NODE RATE GENERATION": the
# mean over the run's metrics rows of the highest straggling rate among the
# node's ranks (ranks in blocks per node, as placed).
node_rates=$RUN_DIR/node-rates.log
note_rates() {
    local rpn figures k
    [ "${#nodes[@]}" -ge 2 ] && [ $((NPROCS % ${#nodes[@]})) = 0 ] || return 0
    rpn=$((NPROCS / ${#nodes[@]}))
    figures=$(grep '"rates"' "$METRICS" 2>/dev/null | awk -v t0="$1" -v rpn="$rpn" -v nn="${#nodes[@]}" '
        match($0, /"time": *[0-9.]+/) {
            t = substr($0, RSTART, RLENGTH); sub(/.*: */, "", t)
            if (t + 0 < t0 || !match($0, /"rates": *\[[^]]*\]/)) next
            r = substr($0, RSTART, RLENGTH); sub(/.*\[/, "", r); sub(/\].*/, "", r)
            n = split(r, a, /, */); rows++
            for (k = 0; k < nn; k++) {
                m = 0
                for (i = k * rpn + 1; i <= (k + 1) * rpn && i <= n; i++) if (a[i] + 0 > m) m = a[i] + 0
                sum[k] += m
            }
        }
        END { if (rows) for (k = 0; k < nn; k++) printf "%s%.2f", (k ? " " : ""), sum[k] / rows }')
    [ -n "$figures" ] || return 0
    read -r -a figures <<<"$figures"
    for k in "${!nodes[@]}"; do echo "${nodes[$k]} ${figures[$k]} $gen" >>"$node_rates"; done
}

# exclude_slow WHY: when EXCLUDE_RATE is set and some nodes' last
# EXCLUDE_AFTER runs all measured a rate of EXCLUDE_RATE or more
# ($node_rates), continue without them (to_nodes), for good: they are
# written to $RUN_DIR/excluded, which a requeued job reads too.  0 when
# it did, 1 when no node is that slow or it cannot.
exclude_slow() {
    local n slow=() keep=() figs="" f rpn=$RANKS_PER_NODE
    awk -v x="$EXCLUDE_RATE" 'BEGIN { exit !(x > 0) }' && [ "${#nodes[@]}" -ge 2 ] || return 1
    for n in "${nodes[@]}"; do
        f=$(awk -v n="$n" '$1 == n { print $2 }' "$node_rates" 2>/dev/null | tail -n "$EXCLUDE_AFTER" | tr '\n' ' ')
        if [ "$(echo "$f" | wc -w)" -ge "$EXCLUDE_AFTER" ] &&
            echo "$f" | awk -v x="$EXCLUDE_RATE" '{ for (i = 1; i <= NF; i++) if ($i + 0 < x) exit 1 }'; then
            slow+=("$n")
            figs+="${figs:+; }$n: ${f% }"
        else
            keep+=("$n")
        fi
    done
    [ "${#slow[@]}" -gt 0 ] || return 1
    if [ "${#keep[@]}" = 0 ] || [ $((NPROCS % ${#nodes[@]})) != 0 ]; then
        log "node(s) ${slow[*]} measured slower than EXCLUDE_RATE=$EXCLUDE_RATE in their last $EXCLUDE_AFTER runs ($figs), but ${#keep[@]} of ${#nodes[@]} nodes cannot take the run: keeping them"
        return 1
    fi
    RANKS_PER_NODE=$((NPROCS / ${#nodes[@]}))
    log "leaving out node(s) ${slow[*]} $1: rates $figs in their last $EXCLUDE_AFTER runs, each >= EXCLUDE_RATE=$EXCLUDE_RATE; continuing on ${keep[*]} ($((RANKS_PER_NODE * ${#keep[@]})) ranks, was $NPROCS) from the snapshot of step $(snap_step "$snap")"
    to_nodes "exclude" "${keep[@]}" || { RANKS_PER_NODE=$rpn; return 1; }
    printf '%s\n' "${slow[@]}" >>"$RUN_DIR/excluded"
    keep=()
    for n in "${job_nodes[@]}"; do [[ " ${slow[*]} " == *" $n "* ]] || keep+=("$n"); done
    job_nodes=("${keep[@]}")
    return 0
}

# ---- a node back: grow onto it while the job runs (GROW) ------------------
# watch_nodes PID: in the background while a run goes on fewer nodes than
# the job's, ask the missing ones to run a task, all at once, every
# GROW_POLL seconds (each ask waits up to 30 s: one that waits for a node
# being restarted answers the moment it is up); once some answer, write
# them to $grow_file and send the launcher PID STOP_SIGNAL, so that the
# run stops at the next step boundary with a snapshot and the loop grows
# onto them (once the run has done a step).  A node Slurm has marked down
# has left a --no-kill job's allocation and never answers here.  SIGTERM
# ends it with its asks.
watch_nodes() {
    local missing=() back=() n k probes=() t0
    t0=$(($(date +%s) + 1)) # a metrics row from then on is this run's
    for n in "${job_nodes[@]}"; do [[ " ${nodes[*]} " == *" $n "* ]] || missing+=("$n"); done
    [ "${#missing[@]}" -gt 0 ] || return 0
    trap 'kill "${probes[@]}" 2>/dev/null; exit 0' TERM
    while :; do
        sleep "$GROW_POLL" &
        probes=($!)
        wait "${probes[@]}"
        probes=()
        for n in "${missing[@]}"; do
            timeout -k 1 30 srun --overlap -N1 -n1 -w "$n" true >/dev/null 2>&1 &
            probes+=($!)
        done
        for k in "${!missing[@]}"; do wait "${probes[$k]}" && back+=("${missing[$k]}"); done
        probes=()
        if [ "${#back[@]}" -gt 0 ]; then
            # not before the run's first step: until then the ranks may
            # not handle the stop signal yet (its default action kills)
            local last
            while :; do
                last=$(tail -n 1 "$METRICS" 2>/dev/null | sed -n 's/.*"time": *\([0-9]*\).*/\1/p')
                [ -n "$last" ] && [ "$last" -ge "$t0" ] && break
                sleep 1 &
                probes=($!)
                wait "${probes[@]}"
            done
            probes=()
            echo "${back[*]} $(date +%s)" >"$grow_file"
            kill -s "$STOP_SIGNAL" "$1" 2>/dev/null
            return 0
        fi
    done
}

# grow: the run stopped for nodes that answer again ($grow_file): continue
# on the job's nodes that the run used or that came back (to_nodes).
grow() {
    local back want=() n
    read -r -a back <<<"$(cat "$grow_file")"
    unset 'back[${#back[@]}-1]' # the time it was seen
    rm -f "$grow_file"
    for n in "${job_nodes[@]}"; do [[ " ${nodes[*]} ${back[*]} " == *" $n "* ]] && want+=("$n"); done
    log "node(s) ${back[*]} answer again: continuing on ${want[*]} ($((RANKS_PER_NODE * ${#want[@]})) ranks, was $NPROCS) from the snapshot of step $(snap_step "$snap")"
    to_nodes "grow" "${want[@]}"
}

# ---- the newest generation -------------------------------------------------
# Generation g runs plan.g.json with snapshots in snap.g.  A generation
# counts once its snapshot is committed: a re-plan cut short between the
# plan and the end of the reshard leaves one that is not, which goes.
gen=0
while [ -f "$RUN_DIR/plan.$((gen + 1)).json" ] && has_snapshot "$RUN_DIR/snap.$((gen + 1))"; do gen=$((gen + 1)); done
if [ -e "$RUN_DIR/plan.$((gen + 1)).json" ] || [ -e "$RUN_DIR/snap.$((gen + 1))" ]; then
    log "generation $((gen + 1)) was never completed (no committed snapshot): removing it, continuing generation $gen"
    rm -rf "$RUN_DIR/plan.$((gen + 1)).json" "$RUN_DIR/snap.$((gen + 1))" "$RUN_DIR/rates.$((gen + 1)).jsonl"
fi
plan=$RUN_DIR/plan.$gen.json
snap=$RUN_DIR/snap.$gen

# Nodes left out as persistent stragglers by an earlier run of this job
# (EXCLUDE_RATE) stay out when it is requeued or resubmitted onto them.
if [ "$SHRINK" = 1 ] && [ -s "$RUN_DIR/excluded" ] && [ $((NPROCS % ${#nodes[@]})) = 0 ]; then
    keep=()
    for n in "${nodes[@]}"; do grep -qxF "$n" "$RUN_DIR/excluded" || keep+=("$n"); done
    if [ "${#keep[@]}" -gt 0 ] && [ "${#keep[@]}" -lt "${#nodes[@]}" ]; then
        RANKS_PER_NODE=$((NPROCS / ${#nodes[@]}))
        log "leaving out node(s) $(grep -xF -f "$RUN_DIR/excluded" <<<"$(printf '%s\n' "${nodes[@]}")" | tr '\n' ' ')(left out before as persistent stragglers, listed in $RUN_DIR/excluded): running on ${keep[*]}"
        nodes=("${keep[@]}")
        job_nodes=("${keep[@]}")
        NPROCS=$((RANKS_PER_NODE * ${#nodes[@]}))
        on_nodes
    fi
fi

# Planner inputs shared by every call.
planner_args=(--world-size "$NPROCS" --ranks-per-node "$RANKS_PER_NODE" --memory-mb "$MEMORY_MB"
              -g "$GLOBAL_BATCH" -b "$MICRO_BATCH")
if [ -f "$PROFILE" ]; then planner_args+=(--profile "$PROFILE"); else planner_args+=(--model "$PROFILE"); fi
planner_args+=("${precision_args[@]}")
if [ "$ADAPT" = restart ] && [ ! -f "$plan" ]; then
    "$REPLAN" "${planner_args[@]}" --pipelines "$PIPELINES" --uniform -o "$plan" ||
        { log "could not write the initial plan"; exit 1; }
    log "generation 0: uniform plan $plan"
fi

# The ranks plan $1 uses: its stages' and the suspended ones.
plan_ranks() {
    tr -d '\n' <"$1" | grep -o '"\(ranks\|suspended\)": *\[[0-9, ]*\]' | tr -cd '0-9,\n' |
        tr ',' '\n' | grep . | sort -un | wc -l
}
# A job started again with another number of ranks than its newest plan's
# (requeued or resubmitted after a shrink, with the lost node back or with
# more nodes): the next generation is a plan for this job's ranks and the
# newest snapshot resharded onto it, as for a shrink.
if [ "$ADAPT" = restart ] && [ "$(plan_ranks "$plan")" != "$NPROCS" ]; then
    next=$((gen + 1))
    log "generation $gen's plan uses $(plan_ranks "$plan") ranks, this job has $NPROCS: a plan for $NPROCS ranks"
    "$REPLAN" "${planner_args[@]}" -o "$RUN_DIR/plan.$next.json" --explain >>"$EVENTS" 2>&1 ||
        { log "malleus-replan for $NPROCS ranks failed"; exit 1; }
    if has_snapshot "$snap"; then
        "$RESHARD" --no-progress "$snap" "$RUN_DIR/plan.$next.json" "$RUN_DIR/snap.$next" >>"$EVENTS" 2>&1 ||
            { log "malleus-reshard onto the plan for $NPROCS ranks failed"; rm -rf "$RUN_DIR/snap.$next"; exit 1; }
    fi
    gen=$next
    plan=$RUN_DIR/plan.$gen.json
    snap=$RUN_DIR/snap.$gen
    log "generation $gen: new plan $plan for $NPROCS ranks"
fi

failures=0
while :; do
    [ -n "$stop_sig" ] && stopped
    args=(--model "$MODEL" --steps "$STEPS" --global-batch "$GLOBAL_BATCH" --snapshot-dir "$snap"
          --snapshot-every "$SNAPSHOT_EVERY" --keep 2 --metrics "$METRICS" --events "$EVENTS"
          --log-every 1 --stop-timeout "$STOP_TIMEOUT" "${precision_args[@]}")
    if [ "$ADAPT" = restart ]; then
        args+=(--plan "$plan" --adapt restart --ranks-per-node "$RANKS_PER_NODE")
        # The policy's baseline: the rates the current plan was made with.
        [ "$gen" -gt 0 ] && [ -f "$RUN_DIR/rates.$gen.jsonl" ] &&
            args+=(--baseline-rates "$RUN_DIR/rates.$gen.jsonl")
    else
        args+=(--micro-batch "$MICRO_BATCH")
    fi
    what="on $plan"
    [ "$ADAPT" = off ] && what="with the default layout"
    if has_snapshot "$snap"; then
        args+=(--resume)
        what="$what, resuming from step $(snap_step "$snap")"
    fi
    log "generation $gen: training $what"
    started=$(date +%s)
    run "${launch[@]}" "${wrapper[@]}" "$TRAIN" "${args[@]}" "${train_args[@]}" "${extra_args[@]}"
    [ "$SHRINK" = 1 ] && note_rates "$started"
    # MPICH's mpiexec may report 0 once it has forwarded a signal, whatever
    # the ranks said: a stopped run is told by its snapshot's step
    [ "$rc" = 0 ] && [ -n "$stop_sig" ] && [ "$(snap_step "$snap")" -lt "$STEPS" ] && rc=4
    case $rc in
    0)
        log "done: $STEPS steps"
        exit 0
        ;;
    4)
        # stopped for nodes that came back: grow onto them
        # (one that fails is not tried again: each try costs the run a stop)
        [ -z "$stop_sig" ] && [ -f "$grow_file" ] &&
            { grow || { GROW=0 && log "growing failed: continuing on ${nodes[*]}, without growing again"; }; continue; }
        stopped
        ;;
    2)
        # bad usage or input (a resume that differs from its snapshot's
        # run, a missing data file): running it again changes nothing
        log "malleus-train refused its input (exit 2, its message above): fix the settings and run the job again"
        exit 2
        ;;
    3)
        [ -n "$stop_sig" ] && stopped
        failures=0
        # a node slow run after run: plan without it
        exclude_slow "at the re-plan after generation $gen" && continue
        next=$((gen + 1))
        # the rates that drove this decision become the next baseline
        grep '"rates"' "$METRICS" | tail -n 2 >"$RUN_DIR/rates.$next.jsonl"
        log "re-plan requested after generation $gen"
        if ! "$REPLAN" "${planner_args[@]}" --rates "$METRICS" --links "$METRICS" --current "$plan" \
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
        # a run that a stop request ended some other way (a rank killed):
        # the newest committed snapshot is the place to continue from
        [ -n "$stop_sig" ] && stopped
        failures=$((failures + 1))
        log "training failed (exit $rc), failure $failures of $MAX_FAILURES"
        # a node gone is not a failure to retry on the same nodes
        [ "$SHRINK" = 1 ] && [ "$ADAPT" = restart ] && shrink && { failures=0; continue; }
        [ "$SHRINK" = 1 ] && [ "$ADAPT" = restart ] && exclude_slow "at the restart after the failure" && continue
        [ $failures -ge "$MAX_FAILURES" ] && { log "giving up"; exit 1; }
        has_snapshot "$snap" || log "no snapshot yet: restarting from step 0"
        ;;
    esac
done
