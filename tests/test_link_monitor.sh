#!/bin/sh
# The link monitor (README "Link monitor"), 4 ranks, two pipelines of TP 2
# (pairs: the TP groups 0-1 and 2-3, the gradient-sum peers 0-2 0-3 1-2
# 1-3), a probe every 2 steps:
#  1. no link injected, but rank 1 computes 4x slower (a slow rank is no
#     slow link: the probe times transfers, not a peer's compute): every
#     probe step carries each pair's round trip, rates from the fourth
#     probe on; the monitor never says a link moved and malleus-replan
#     --links reads no link at the noise floor or above from the metrics;
#  2. --inject-link 0:1:8 (a slow link inside a TP group): the probe's own
#     messages are stretched, the monitor says link 0-1 moved and rates it
#     between 3 and 16 while every other pair stays below the noise floor,
#     as malleus-replan --links reads the metrics;
#  3. --adapt online with that slow link: a re-plan advised by the link,
#     an online plan change that moves the TP group off it;
#  4. --link-probe-every 0: no probe, no link fields.
# The runs count link rates below 3 as healthy (--link-noise-floor 3, the
# default 2): the test shares two cores with the rest of make check -j2, and
# a pair whose end is descheduled reads slow; with four copies of this test
# at once (16 ranks on 2 cores) a healthy pair read 2.2-2.3x over four
# probes, the 8x link 5.1-12x (and the planner, which averages the last
# two probes, read a healthy pair's one noisy probe, 1.0 and 3.1, as 2.05:
# below the floor, so no slow link).  The online run counts compute rates below 2
# as healthy for the same reason (a descheduled rank read 1.2-1.6x there,
# and the planner rightly planned around it): that run is about the link.
set -u
top_srcdir=${top_srcdir:-.}
top_builddir=${top_builddir:-.}
TAG=test_link_monitor
TRAIN=$top_builddir/malleus-train
REPLAN=$top_builddir/malleus-replan
MPIRUN="sh $top_srcdir/tests/mpirun.sh"
[ -x "$TRAIN" ] || { echo "$TAG: $TRAIN not built"; exit 99; }
W=$(mktemp -d "${TMPDIR:-/tmp}/$TAG.XXXXXX") || exit 99
trap 'rm -rf "$W"' EXIT
# the last run's log, where the reason is
last=""
fail() {
    [ -n "$last" ] && [ -f "$W/$last.log" ] && grep -v '^step ' "$W/$last.log" | tail -n 12
    echo "$TAG: FAIL: $*"
    exit 1
}
COMMON="--model tiny --global-batch 8 --micro-batch 2 --threads 1 --dp 2 --tp 2 --log-every 0"
COMMON="$COMMON --link-noise-floor 3"

run() { # NAME STEPS [ARGS...]
    name=$1 steps=$2
    last=$name
    shift 2
    # shellcheck disable=SC2086
    $MPIRUN 4 120 "$TRAIN" $COMMON --steps "$steps" --metrics "$W/$name.jsonl" "$@" \
        >"$W/$name.log" 2>&1 || { cat "$W/$name.log"; fail "run $name"; }
}
# every [a, b, x] triple of field F in the rows of file NAME, one per line
triples() {
    sed -n "s/.*\"$2\": \[\(\[[^]]*\]\(, \[[^]]*\]\)*\)\].*/\1/p" "$W/$1.jsonl" |
        sed 's/\], \[/\n/g; s/[][]//g; s/,//g'
}

# 1. healthy links, a straggling rank
run healthy 16 --link-probe-every 2 --inject 1:4
probes=$(grep -c '"link_rtt_us": \[\[' "$W/healthy.jsonl")
[ "$probes" -eq 8 ] || fail "expected 8 probe rows in 16 steps, got $probes"
[ "$(triples healthy link_rtt_us | awk '{print $1 "-" $2}' | sort -u | tr '\n' ' ')" = \
    "0-1 0-2 0-3 1-2 1-3 2-3 " ] || fail "the probe does not cover the plan's pairs: $(triples healthy link_rtt_us | head -6)"
grep '"step": 6,' "$W/healthy.jsonl" | grep -q '"link_rates": \[\]' ||
    fail "a rate before the fourth probe"
triples healthy link_rates_raw | awk '{ if ($3 > m) m = $3 } END { print "healthy: largest rate " m }'
grep -q link_moved "$W/healthy.jsonl" && fail "the monitor says a healthy link moved"
replan() { # NAME: the planner's reading of its metrics
    "$REPLAN" --world-size 4 --ranks-per-node 4 --memory-mb 16384 --model tiny \
        --micro-batches 4 --links "$W/$1.jsonl" --explain >"$W/$1.plan" 2>&1 ||
        { cat "$W/$1.plan"; fail "malleus-replan --links $1.jsonl"; }
}
# the links the planner reads at the noise floor or above
slow_links() { # NAME [EXCEPT-PAIR]
    grep 'link [0-9]*-[0-9]* (rate' "$W/$1.plan" | grep -v "link ${2:-none} (rate" |
        sed 's/.*link \([0-9]*-[0-9]*\) (rate \([0-9.]*\).*/\1 \2/' | awk '$2 >= 3'
}
replan healthy
grep 'link [0-9]' "$W/healthy.plan"
[ -z "$(slow_links healthy)" ] || fail "the planner reads a slow link from a healthy run"

# 2. a slow link inside TP group 0-1
run slow 16 --link-probe-every 2 --inject-link 0:1:8
grep -q '"link_moved": \[0, 1\]' "$W/slow.jsonl" || fail "the monitor did not find link 0-1"
replan slow
grep 'link [0-9]' "$W/slow.plan"
[ -z "$(slow_links slow 0-1)" ] || fail "the planner reads another slow link"
# the planner's rate: the mean of the last two probes' (1.0 below the
# link noise floor, 3 here)
grep 'link 0-1 (rate' "$W/slow.plan" | sed 's/.*rate \([0-9.]*\).*/\1/' |
    awk '{ exit !($1 >= 3 && $1 <= 16) }' || fail "link 0-1 is not rated between 3 and 16"

# 3. --adapt online: the slow link inside TP group 0-1 advises a re-plan,
#    the planner plans for the measured link and the job changes plan so
#    that no TP group holds both 0 and 1
run online 18 --link-probe-every 2 --inject-link 0:1:8 --adapt online --change-cost 0 \
    --noise-floor 2
grep -q 'monitor: re-plan advised at step [0-9]* (link 0-1, rate' "$W/online.log" ||
    fail "the slow link advised no re-plan: $(grep -i 're-plan' "$W/online.log")"
# the plan the job ends on (the link's change is the last)
change=$(grep 'plan change (online) at step' "$W/online.log" | tail -1)
echo "${change#*: }" | cut -c1-160
groups=$(echo "$change" | sed 's/.*new plan [0-9a-f]*: //; s/, predicted.*//' | grep -o '\[[0-9,]*:')
[ -n "$groups" ] || fail "no online plan change: $(grep -i 're-plan' "$W/online.log")"
echo "$groups" | grep -q -e '\[0,1:' -e '\[1,0:' && fail "the new plan keeps link 0-1 inside a TP group"

# 4. off
run off 4 --link-probe-every 0
grep -q link_ "$W/off.jsonl" && fail "--link-probe-every 0 still probes"
echo "$TAG: ok"
