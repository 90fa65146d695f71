#!/bin/sh
# Slow links on 8 CPU ranks (bench/README.md "links/run.sh"): the plan a
# compute-only planner makes (malleus-replan --compute-only) against the
# link-aware one (malleus-replan --links), each run under the same
# --inject-link, in alternating order, REPS times; the median step time of each run
# over its steps 3..STEPS, and the ratio of the medians over the runs.
#   bench/links/run.sh [REPS [STEPS]]      (from the build directory)
# Cases: link 0-1 at 4x and 8x (inside a TP group of the compute-only
# plan: the link-aware plan moves it between pipelines) and link 3-4 at 8x
# (between two pipelines in both plans: nothing to gain, the plans agree).
set -eu
REPS=${1:-3}
STEPS=${2:-12}
B=${top_builddir:-.}
S=${top_srcdir:-$(dirname "$0")/../..}
W=$(mktemp -d "${TMPDIR:-/tmp}/bench_links.XXXXXX")
trap 'rm -rf "$W"' EXIT
CL="--world-size 8 --ranks-per-node 4 --memory-mb 1000 --model tiny -M 8"
TRAIN="--model tiny --global-batch 8 --micro-batch 1 --threads 1 --steps $STEPS --quiet"
median() { # the median step_ms of metrics file $1 over steps 3..
    sed -n '3,$s/.*"step_ms": \([0-9.e+-]*\).*/\1/p' "$1" | sort -g |
        awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
echo "case        factor  plan          median step (ms) per repetition   median"
for c in "0 1 4" "0 1 8" "3 4 8"; do
    # shellcheck disable=SC2086
    set -- $c
    a=$1 b=$2 f=$3
    echo "{\"links\": [{\"a\": $a, \"b\": $b, \"rate\": $f}]}" >"$W/links.json"
    # shellcheck disable=SC2086
    "$B/malleus-replan" $CL --links "$W/links.json" --compute-only -o "$W/blind.json"
    # shellcheck disable=SC2086
    "$B/malleus-replan" $CL --links "$W/links.json" -o "$W/aware.json"
    # the same layout (the link-aware plan also carries predicted times)
    for p in blind aware; do
        sed 's/"predicted_[a-z_]*": [0-9.e+-]*,* *//g' "$W/$p.json" | tr -d ' \n' >"$W/$p.layout"
    done
    same=$(cmp -s "$W/blind.layout" "$W/aware.layout" && echo " (same layout)" || echo "")
    for p in blind aware; do : >"$W/$p.med"; done
    r=0
    while [ $r -lt "$REPS" ]; do
        # the order alternates: the second run of a pair is not always the same plan's
        order="blind aware"
        [ $((r % 2)) -eq 1 ] && order="aware blind"
        for p in $order; do
            # shellcheck disable=SC2086
            sh "$S/tests/mpirun.sh" 8 300 "$B/malleus-train" $TRAIN --plan "$W/$p.json" \
                --inject-link "$a:$b:$f" --metrics "$W/m.jsonl" >"$W/log" 2>&1 ||
                { cat "$W/log"; exit 1; }
            median "$W/m.jsonl" >>"$W/$p.med"
        done
        r=$((r + 1))
    done
    for p in blind aware; do
        printf "link %d-%d   %4sx    %-12s  %-32s  %s\n" "$a" "$b" "$f" \
            "$([ $p = blind ] && echo compute-only || echo link-aware)" \
            "$(tr '\n' ' ' <"$W/$p.med")" "$(sort -g "$W/$p.med" | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }')"
    done
    paste "$W/blind.med" "$W/aware.med" | awk '{ printf "%.4f\n", $1 / $2 }' | sort -g >"$W/ratio"
    awk -v s="$same" '{ r[NR] = $1 } END {
        printf "            ratio compute-only / link-aware: median %.2f (min %.2f, max %.2f)%s\n",
        r[int((NR + 1) / 2)], r[1], r[NR], s }' "$W/ratio"
done
