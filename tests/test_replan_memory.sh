#!/bin/sh
# malleus-replan --explain prints the terms of every stage's memory per
# rank (layers x k[d] scaled to the stage's TP size, embedding / LM head,
# fixed overhead) and they add up: the total is the sum of the printed
# terms, each term is its printed factors' product, the total is the
# figure the stage line reports (the cost model's), and every stage has
# its line -- in a plan's report and in --simulate --explain, on a uniform
# plan, a two-stage pipeline beside a TP-2 replica and uneven stages.
set -u
BIN="${REPLAN_BIN:-${top_builddir:-.}/malleus-replan}"
P="${top_srcdir:-.}/tests/plans"
T=$(mktemp -d "${TMPDIR:-/tmp}/test_replan_memory.XXXXXX") || exit 99
trap 'rm -rf "$T"' EXIT
[ -x "$BIN" ] || { echo "no $BIN" >&2; exit 99; }
fails=0
# check FILE STAGES: every "memory terms" line adds up; STAGES of them
check() {
    awk -v want="$2" '
    function near(a, b) { return (a - b < 0.0025 && b - a < 0.0025) }
    / stage [0-9]+: TP .*memory [0-9]+ \/ / {
        for (i = 1; i < NF; i++) if ($i == "memory") stage_mb[++ns] = $(i + 1) }
    /memory terms \(MB per rank\)/ {
        n++
        # layers L x K (k[d]) x TP a/b = V + embedding/head E x M x TP a/b = W
        #   + overhead X = total S of C
        for (i = 1; i <= NF; i++) {
            if ($i == "layers") { l = $(i + 1); k = $(i + 3); split($(i + 7), t, "/"); lv = $(i + 9) }
            if ($i == "embedding/head") { e = $(i + 1); em = $(i + 3); split($(i + 6), u, "/"); ev = $(i + 8) }
            if ($i == "overhead") x = $(i + 1)
            if ($i == "total") { s = $(i + 1); total[n] = s }
        }
        # the factors are printed to 3 decimals: the product carries their
        # rounding times the other factors
        d = lv - l * k * t[1] / t[2]
        if (d > 0.0006 * (l * t[1] / t[2] + 1) || -d > 0.0006 * (l * t[1] / t[2] + 1)) {
            print "FAIL: layer term: " $0; bad++ }
        d = ev - e * em * u[1] / u[2]
        if (d > 0.0006 * (e * u[1] / u[2] + 1) || -d > 0.0006 * (e * u[1] / u[2] + 1)) {
            print "FAIL: embedding term: " $0; bad++ }
        if (!near(lv + ev + x, s)) { print "FAIL: terms do not add up to the total: " $0; bad++ }
    }
    END {
        if (n != want) { print "FAIL: " n " memory lines for " want " stages"; bad++ }
        for (i = 1; i <= ns; i++)
            if (int(total[i] + 0.5) != stage_mb[i] && sprintf("%.0f", total[i]) != stage_mb[i]) {
                print "FAIL: stage " i ": total " total[i] " is not the stage line'"'"'s " stage_mb[i] " MB"; bad++ }
        exit bad > 0 }' "$1"
}
run() { # NAME STAGES ARGS...
    name=$1 st=$2; shift 2
    if "$BIN" "$@" >"$T/out" 2>&1 && check "$T/out" "$st"; then
        echo "ok: $name"
    else
        echo "FAIL: $name"; cat "$T/out"; fails=$((fails + 1))
    fi
}
C="--world-size 4 --ranks-per-node 4 --memory-mb 1000 -b 2 -M 8"
run "plan, tiny, 4 ranks" 2 $C --model tiny --uniform --explain -o "$T/plan.json"
run "simulate four.json" 3 $C --model tiny --simulate "$P/four.json" --explain
run "simulate uneven_stages.json" 7 --world-size 8 --ranks-per-node 8 --memory-mb 1000 -b 2 \
    -M 8 --model tiny --simulate "$P/uneven_stages.json" --explain
run "plan, 70b, 64 ranks" 8 --world-size 64 --ranks-per-node 8 --memory-mb 81920 --model 70b \
    -M 128 --uniform --explain -o "$T/plan.json"
exit $((fails > 0))
