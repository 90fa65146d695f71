#!/bin/sh
# malleus-replan --explain prints the terms of every stage's memory per
# rank (layers x k[d] scaled to the stage's TP size, embedding / LM head,
# fixed overhead) and they add up: the total is the sum of the printed
# terms, each term is its printed factors' product, the total is the
# figure the stage line reports (the cost model's), and every stage has
# its line -- in a plan's report and in --simulate --explain, on a uniform
# plan, a two-stage pipeline beside a TP-2 replica and uneven stages.
# The plan-dependent terms: the scratch and pipeline buffers, the gradient
# sum's copy of the gradients (only where a stage's layers have replicas),
# the moments a --zero 1 rank does not keep (half on two pipelines), a
# tied embedding held once by a one-stage pipeline, and a layer measured
# at the stage's own TP size (a profile that has the figures per size).
set -u
BIN="${REPLAN_BIN:-${top_builddir:-.}/malleus-replan}"
P="${top_srcdir:-.}/tests/plans"
T=$(mktemp -d "${TMPDIR:-/tmp}/test_replan_memory.XXXXXX") || exit 99
trap 'rm -rf "$T"' EXIT
[ -x "$BIN" ] || { echo "no $BIN" >&2; exit 99; }
fails=0
# check FILE STAGES: every "memory terms" line adds up; STAGES of them
check() {
    awk -v want="$2" -v kat="${KAT-}" '
    function near(a, b) { return (a - b < 0.0025 && b - a < 0.0025) }
    # the factors are printed to 3 decimals: a product carries their
    # rounding times the other factors
    function prod_ok(v, p, f) { d = v - p; return d <= 0.0006 * (f + 1) && -d <= 0.0006 * (f + 1) }
    BEGIN { nk = split(kat, kk, " ")
        for (i = 1; i <= nk; i++) { split(kk[i], f, ":"); kst[f[1] + 0] = f[2]; kac[f[1] + 0] = f[3] } }
    / stage [0-9]+: TP .*memory [0-9]+ \/ / {
        for (i = 1; i < NF; i++) if ($i == "memory") stage_mb[++ns] = $(i + 1) }
    /memory terms \(MB per rank\)/ {
        n++
        # layers L x K (k[d]) x TP a/b = V   or   layers L x K (k[d] of TP s) x TP 1/1 = V
        # + embedding/head E x M x TP a/b [- tied Y] = W + scratch S
        # + pipeline buffers N x A = B + gradient sum G - moments not kept Z (--zero z, R replicas)
        # [- recompute MODE R + workspace W] + overhead X = total T of C
        tied = 0; rs = 0; ws = 0
        for (i = 1; i <= NF; i++) {
            if ($i == "layers" && !lseen) { l = $(i + 1); k = $(i + 3); lseen = 1
                kd = $(i + 4); gsub(/[^0-9]/, "", kd); ks = $(i + 5) == "of" ? $(i + 7) + 0 : 0
                for (j = i + 4; $j != "TP" || $(j + 1) !~ /\//; j++) ;
                split($(j + 1), t, "/"); lv = $(j + 3) }
            if ($i == "embedding/head") { e = $(i + 1); em = $(i + 3); split($(i + 6), u, "/")
                if ($(i + 7) == "-") { tied = $(i + 9); ev = $(i + 11) } else ev = $(i + 8) }
            if ($i == "scratch") sc = $(i + 1)
            if ($i == "buffers") { nb = $(i + 1); act = $(i + 3); pv = $(i + 5) }
            if ($i == "sum") g = $(i + 1)
            if ($i == "kept") { z = $(i + 1); zero = $(i + 3); r = $(i + 4); sub(/^\(/, "", r) }
            if ($i == "overhead") x = $(i + 1)
            if ($i == "recompute") rs = $(i + 2)
            if ($i == "workspace") ws = $(i + 1)
            if ($i == "total") { s = $(i + 1); total[n] = s }
        }
        lseen = 0
        # a layer measured at the TP size s of the stage: state + acts x (d + 1)
        if (ks && (!(ks in kst) || !prod_ok(k, kst[ks] + kac[ks] * (kd + 1), kd + 1))) {
            print "FAIL: k[" kd "] of TP " ks " is not the profile'"'"'s: " $0; bad++ }
        if (kat != "" && !ks) { print "FAIL: a layer not from the figures of its TP size: " $0; bad++ }
        if (!prod_ok(lv, l * k * t[1] / t[2], l * t[1] / t[2])) { print "FAIL: layer term: " $0; bad++ }
        if (!prod_ok(ev, e * em * u[1] / u[2] - tied, e * u[1] / u[2])) {
            print "FAIL: embedding term: " $0; bad++ }
        if (!prod_ok(pv, nb * act, nb)) { print "FAIL: pipeline buffers: " $0; bad++ }
        # no replicas, no gradient sum; with --zero 0 nothing is left out
        if (r == 1 && g != 0) { print "FAIL: a gradient sum without replicas: " $0; bad++ }
        if (zero == "0," && z != 0) { print "FAIL: moments left out with --zero 0: " $0; bad++ }
        if (!near(lv + ev + sc + pv + g - z - rs + ws + x, s)) {
            print "FAIL: terms do not add up to the total: " $0; bad++ }
        if (expect_g != "" && (g > 0) != expect_g) { print "FAIL: gradient sum " g ": " $0; bad++ }
        # --zero 1, layers and embedding held by every pipeline alike: a
        # rank keeps 1/R of the moments (8 bytes a parameter: 2 x the
        # gradient copy of 4 bytes) it would hold, and with --zero-master on
        # beside a working copy the master too (12 bytes: 3 x)
        if (zero_ratio && !prod_ok(z, zero_ratio * g * (1 - 1 / r), zero_ratio)) {
            print "FAIL: moments not kept " z " != " zero_ratio " x " g " x (1 - 1/" r "): " $0; bad++ }
    }
    END {
        if (n != want) { print "FAIL: " n " memory lines for " want " stages"; bad++ }
        for (i = 1; i <= ns; i++)
            if (int(total[i] + 0.5) != stage_mb[i] && sprintf("%.0f", total[i]) != stage_mb[i]) {
                print "FAIL: stage " i ": total " total[i] " is not the stage line'"'"'s " stage_mb[i] " MB"; bad++ }
        exit bad > 0 }' expect_g="${EXPECT_G-}" zero_ratio="${ZERO_RATIO-}" "$1"
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
run "simulate four.json --zero 0" 3 $C --model tiny --simulate "$P/four.json" --explain --zero 0
run "simulate uneven_stages.json" 7 --world-size 8 --ranks-per-node 8 --memory-mb 1000 -b 2 \
    -M 8 --model tiny --simulate "$P/uneven_stages.json" --explain
run "plan, 70b, 64 ranks" 8 --world-size 64 --ranks-per-node 8 --memory-mb 81920 --model 70b \
    -M 128 --uniform --explain -o "$T/plan.json"
# Recomputation: every stage full (--recompute full); the activations not
# kept and the workspace are terms of the sum, and each stage line says
# what the mode saves and adds.
run "plan, 70b, 64 ranks, --recompute full" 8 --world-size 64 --ranks-per-node 8 \
    --memory-mb 81920 --model 70b -M 128 --recompute full --explain -o "$T/plan.json"
[ "$(grep -c ' stage [0-9]*: TP .*recompute full: saves [0-9]* MB, adds' "$T/out")" = 8 ] &&
    [ "$(grep -c '"recompute": "full"' "$T/plan.json")" = 8 ] ||
    { echo "FAIL: not every stage recomputes in full"; cat "$T/out"; fails=$((fails + 1)); }
# The plan-dependent terms: --zero 1 on two pipelines (tiny's layers and
# untied embedding held by both): a gradient sum on every stage and half of
# the moments left out; one pipeline: no gradient sum.
EXPECT_G=1 ZERO_RATIO=2 run "simulate four.json --zero 1" 3 $C --model tiny \
    --simulate "$P/four.json" --explain --zero 1
# bf16 compute (a profile whose state holds a working copy apart: 18 bytes
# a parameter, as malleus-train --profile --precision bf16 writes it):
# --zero-master on leaves out the master's share too, off the moments'
# alone; with fp32 state (16 bytes) the master is the working weights and
# on changes nothing.
echo '{ "preset": "tiny", "tp": 2, "state_bytes": 18, "activation_bytes": 8192 }' >"$T/bf16.json"
echo '{ "preset": "tiny", "tp": 2, "state_bytes": 16 }' >"$T/fp32.json"
for zm in "bf16 on 3" "bf16 off 2" "fp32 on 2"; do
    set -- $zm
    EXPECT_G=1 ZERO_RATIO=$3 run "simulate four.json, $1 state, --zero 1 --zero-master $2" 3 $C \
        -p "$T/$1.json" --simulate "$P/four.json" --explain --zero 1 --zero-master $2
    n=$(grep -c "replicas, and the master's)" "$T/out")
    [ "$n" = "$([ $3 = 3 ] && echo 3 || echo 0)" ] ||
        { echo "FAIL: $n stages say the master is left out ($1, --zero-master $2)"; fails=$((fails + 1)); }
done
EXPECT_G=0 run "simulate one.json" 1 --world-size 1 --ranks-per-node 1 --memory-mb 1000 -b 2 \
    -M 8 --model tiny --simulate "$P/one.json" --explain --zero 1
# Tied embeddings (tiny-llama3): a one-stage pipeline holds the
# embedding's state once, the LM head's logits besides.
run "simulate one.json, tied embeddings" 1 --world-size 1 --ranks-per-node 1 --memory-mb 1000 \
    -b 2 -M 8 --model tiny-llama3 --simulate "$P/one.json" --explain
grep -q "embedding/head 2 x [0-9.]* x TP [0-9]*/1 - tied [0-9.]* =" "$T/out" ||
    { echo "FAIL: no tied copy left out"; cat "$T/out"; fails=$((fails + 1)); }
# A profile with a layer's memory measured at every TP size (as
# malleus-train --profile writes it): each stage's layers come from its
# own size's figures, not the nominal size's scaled.
cat >"$T/prof.json" <<'EOF2'
{ "preset": "tiny", "tp": 4, "rank_state_mb": {"1": 0.627, "2": 0.3145, "4": 0.1582},
  "rank_acts_mb": {"1": 0.2979, "2": 0.1885, "4": 0.1338}, "scratch_mb": {"1": 1.25, "2": 1.14, "4": 1.09},
  "activation_bytes": 16384, "state_bytes": 16 }
EOF2
KAT="1:0.627:0.2979 2:0.3145:0.1885 4:0.1582:0.1338" run "simulate mixed_tp.json, measured per TP size" 4 \
    --world-size 8 --ranks-per-node 8 --memory-mb 1000 -b 2 -M 8 -p "$T/prof.json" \
    --simulate "$P/mixed_tp.json" --explain --zero 1
exit $((fails > 0))
