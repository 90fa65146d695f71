#!/bin/sh
# malleus-replan command line: help and version, a tiny 8-rank plan that
# passes the simulator's validation, determinism, --explain with a current
# plan, and bad inputs (NaN / negative rates, unknown ranks, ranks not
# divisible into nodes, memory too small, and the hostile inputs)
# refused with status 2 and a message naming the field.
set -u
BIN="${REPLAN_BIN:-${top_builddir:-.}/malleus-replan}"
T=$(mktemp -d "${TMPDIR:-/tmp}/test_replan_cli.XXXXXX") || exit 99
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
[ -x "$BIN" ] || { echo "no $BIN" >&2; exit 99; }

# expect_fail EXIT_CODE MESSAGE ARGS...: the command fails with that status
# and its stderr names the cause
expect_fail() {
    code=$1; msg=$2; shift 2
    "$BIN" "$@" >"$T/out" 2>"$T/err"
    rc=$?
    [ "$rc" -eq "$code" ] || fail "exit $rc (wanted $code) for: $* ($(cat "$T/err"))"
    grep -q -- "$msg" "$T/err" || fail "message '$msg' missing for: $* (got: $(cat "$T/err"))"
}

"$BIN" --help >"$T/help" || fail "--help"
for o in --cluster --world-size --ranks-per-node --memory-mb --profile --model --rates --window \
         --micro-batch-size --micro-batches --global-batch --pipelines --current --output --explain \
         --simulate --uniform --search --summary --links --compute-only --recompute node_types \
         Examples; do
    grep -q -- "$o" "$T/help" || fail "--help does not mention $o"
done
"$BIN" --version | grep -q "malleus-replan" || fail "--version"

# Every model preset the trainer accepts is a planner preset too (the list
# is malleus-train --help's), and the README's GPU job plans 1b on 4 nodes
# of 8 GPUs.
TRAIN_BIN="$(dirname "$BIN")/malleus-train"
presets=$("$TRAIN_BIN" --help | sed -n '/--model PRESET/,/JSON file/p' |
    sed 's/.*model config://; s/or a JSON file.*//' | tr -d ' \n' | tr ',' ' ')
[ -n "$presets" ] || fail "no presets in malleus-train --help"
for p in $presets; do
    "$BIN" --model "$p" --print-profile >"$T/prof" 2>"$T/err" ||
        fail "malleus-replan --model $p: $(cat "$T/err")"
    grep -q '"layer_memory_mb"' "$T/prof" || fail "--model $p: no profile printed"
done
echo "planner presets: $presets"
"$BIN" --world-size 32 --ranks-per-node 8 --memory-mb 81920 --model 1b -M 64 -o "$T/1b.json" ||
    fail "1b on 4 nodes of 8 GPUs"

C_NOMODEL="--world-size 8 --ranks-per-node 4 --memory-mb 100"
C="$C_NOMODEL --model tiny"
echo '{"3": 2.5, "6": 1.6}' >"$T/rates.json"
"$BIN" $C -M 8 -r "$T/rates.json" -o "$T/p1.json" || fail "tiny plan"
"$BIN" $C -M 8 -r "$T/rates.json" -o "$T/p2.json" || fail "tiny plan again"
cmp -s "$T/p1.json" "$T/p2.json" || fail "same input gave different plans"
grep -q '"format": "malleus-plan/1"' "$T/p1.json" || fail "plan format"
# --simulate validates the plan against the cluster and model first
"$BIN" $C -M 8 -r "$T/rates.json" --simulate "$T/p1.json" >"$T/sim" || fail "simulate: $(cat "$T/sim")"
grep -q "step: simulated" "$T/sim" || fail "simulate output"
# plan to stdout, explanation to stderr; with a current plan, state to move
"$BIN" $C -M 8 --uniform -o "$T/uni.json" || fail "uniform"
"$BIN" $C -r "$T/rates.json" --current "$T/uni.json" --explain >"$T/p3.json" 2>"$T/explain" || fail "explain"
for w in "suspended ranks" "pipeline 0" "predicted step time" "uniform" "bound" "current" "state to move"; do
    grep -q "$w" "$T/explain" || fail "--explain lacks '$w'"
done
# --explain speaks seconds: periods, per-layer and stage times
grep -Eq '^pipeline 0: .* period [0-9.]+ s, time [0-9.]+ s' "$T/explain" || fail "--explain: period not in seconds"
grep -Eq '^  stage 0: .* [0-9.]+ s per layer .* stage time [0-9.]+ s ' "$T/explain" ||
    fail "--explain: stage times not in seconds"
# a plan above its bound comes with the reasons, which add up to the gap
awk '/^why the new plan is/ { gap = $6; n++ }
     /^  (suspended ranks|TP groups|whole units|pipeline bubble) +[-+][0-9.]+ s / {
         sub(/ s  \(.*/, ""); sum += $NF; k++ }
     END { if (n != 1 || k != 4 || sum - gap > 1e-3 || gap - sum > 1e-3) {
               printf "gap %s s, %d terms adding to %s s\n", gap, k, sum; exit 1 } }' "$T/explain" ||
    fail "--explain: the reasons for the gap to the bound are missing or do not add up"
# metrics JSON lines as rates (window 2)
printf '{"step":1,"rates":[1,1,1,9,1,1,1,1]}\n{"step":2,"rates":[1,1,1,3,1,1,1,1]}\n' >"$T/metrics.jsonl"
"$BIN" $C -M 8 -r "$T/metrics.jsonl" --summary -o "$T/p4.json" >"$T/sum" || fail "metrics rates"
grep -q '"plan_seconds"' "$T/sum" || fail "--summary"

# bad inputs: status 2 (bad usage or input), the message names the cause
echo '{"3": "nan"}' >"$T/nan.json"
expect_fail 2 "rank 3 has rate nan" $C -M 8 -r "$T/nan.json"
echo '{"2": -2}' >"$T/neg.json"
expect_fail 2 "rank 2 has rate -2" $C -M 8 -r "$T/neg.json"
echo '{"12": 2.0}' >"$T/unk.json"
expect_fail 2 "rank 12 is not in the cluster" $C -M 8 -r "$T/unk.json"
expect_fail 2 "not divisible into nodes" --world-size 10 --ranks-per-node 4 --memory-mb 100 --model tiny -M 8
expect_fail 2 "no plan fits in memory" --world-size 8 --ranks-per-node 4 --memory-mb 16.01 --model tiny -M 8
expect_fail 2 "(recompute full) need" --world-size 8 --ranks-per-node 4 --memory-mb 16.01 --model tiny -M 8
expect_fail 2 '"bogus" is not one of none, selective, full, auto' $C -M 8 --recompute bogus
echo '{"preset": "tiny", "acts_kept": {"full": 1.5}}' >"$T/ak.json"
expect_fail 2 'acts_kept\["full"\] must be a number in \[0, 1\]' $C_NOMODEL -M 8 -p "$T/ak.json"
echo '{"preset": "tiny", "recompute_time": {"partial": 0.1}}' >"$T/rt.json"
expect_fail 2 'recompute_time key "partial"' $C_NOMODEL -M 8 -p "$T/rt.json"
echo '{"world_size": 8, "ranks_per_node": 4}' >"$T/cl.json"
expect_fail 2 "memory_mb" -c "$T/cl.json" --model tiny -M 8
expect_fail 2 "unknown preset" $C -M 8 --model 7b

# the hostile planner inputs
printf '{"step":1,"rates":[1,1,1,9,1,1,1,1,1,1]}\n' >"$T/long.jsonl"
expect_fail 2 "rates for 10 ranks" $C -M 8 -r "$T/long.jsonl"
# a world of 10^9 ranks is refused before it is allocated (it used to take
# 19 GB; here 2 GB of address space would end it -- not under
# AddressSanitizer, which reserves terabytes of address space)
( [ -n "${ASAN_OPTIONS:-}" ] || ulimit -v 2000000 2>/dev/null
  "$BIN" --world-size 1000000000 --ranks-per-node 8 --memory-mb 100 --model tiny -M 8 \
      >"$T/out" 2>"$T/err"; echo $? >"$T/rc" )
[ "$(cat "$T/rc")" -eq 2 ] && grep -q "world_size must be 1..1048576" "$T/err" ||
    fail "world of 10^9 ranks: exit $(cat "$T/rc"): $(cat "$T/err")"
echo '{"world_size": 2147483648, "ranks_per_node": 8, "memory_mb": 100}' >"$T/big.json"
expect_fail 2 "got 2147483648)" -c "$T/big.json" --model tiny -M 8
echo '{"world_size": 8, "ranks_per_node": 4, "memory_mb": 100, "nodes": [[0,1,2,3],[4,5,6,7]]}' >"$T/both.json"
expect_fail 2 '"nodes" or "world_size"' -c "$T/both.json" --model tiny -M 8
echo '{"preset": "tiny", "n_heads": 3}' >"$T/heads.json"
expect_fail 2 "n_heads 3 is not divisible" $C_NOMODEL -p "$T/heads.json" -M 8
# a rank a trillion times slow: a plan that suspends it
echo '{"3": 1e12}' >"$T/slow.json"
"$BIN" $C -M 8 -r "$T/slow.json" -o "$T/slow-plan.json" 2>"$T/err" || fail "rate 1e12: $(cat "$T/err")"
tr -d ' \n' <"$T/slow-plan.json" | grep -q '"suspended":\[3\]' || fail "rate 1e12: rank 3 not suspended"
# a mutated plan whose global batch overflows an int, through --simulate
sed 's/"micro_batch_size": 1/"micro_batch_size": 2147483647/' "$T/p1.json" >"$T/mutant.json"
expect_fail 2 "micro_batch_size: 2147483647 x" $C -M 8 --simulate "$T/mutant.json"
# rates that are not a regular file would be read forever
expect_fail 2 "not a regular file" $C -M 8 -r /dev/zero
expect_fail 2 "exactly one of --profile" --world-size 8 --ranks-per-node 4 --memory-mb 100 -M 8
expect_fail 2 "micro-batches" $C
expect_fail 2 "unknown option" $C -M 8 --bogus
# slow links: a slow link inside a TP group moves between pipelines (only
# with the links; --compute-only keeps the compute plan and prices it)
echo '{"links": [{"a": 0, "b": 1, "rate": 8}]}' >"$T/links.json"
"$BIN" $C -M 8 --links "$T/links.json" -e -o "$T/lk.json" >"$T/lk.txt" 2>&1 || fail "--links: $(cat "$T/lk.txt")"
tr -d ' \n' <"$T/lk.json" | grep -q '"ranks":\[0,1\]' && fail "--links: ranks 0 and 1 still share a TP group"
grep -q "link 0-1 (rate 8.00): between pipelines" "$T/lk.txt" || fail "--explain: the link's place"
grep -q "step time with communication" "$T/lk.txt" || fail "--explain: the step with communication"
"$BIN" $C -M 8 --links "$T/links.json" --compute-only -e -o "$T/lk0.json" >"$T/lk0.txt" 2>&1 || fail "--compute-only"
grep -q "link 0-1 (rate 8.00): inside the TP group" "$T/lk0.txt" || fail "--compute-only: the link's place"
"$BIN" $C -M 8 --links "$T/links.json" --simulate "$T/lk.json" >"$T/lks.txt" || fail "--simulate with --links"
grep -q "with communication" "$T/lks.txt" || fail "--simulate: no communication"
echo '{"links": [{"a": 0, "b": 9, "rate": 8}]}' >"$T/lbad.json"
expect_fail 2 "links\[0\]: link 0-9 names a rank outside" $C -M 8 --links "$T/lbad.json"
echo '{"links": [{"a": 2, "b": 2, "rate": 8}]}' >"$T/lbad.json"
expect_fail 2 "joins a rank to itself" $C -M 8 --links "$T/lbad.json"
# a mixed cluster: the slow type plans as stragglers, --explain lists the types
cat >"$T/mixed.json" <<'EOF2'
{"nodes": [[0, 1, 2, 3], [4, 5, 6, 7]], "node_types": ["fast", "slow"],
 "types": {"fast": {"memory_mb": 400, "speed": 1.0}, "slow": {"memory_mb": 300, "speed": 0.5}}}
EOF2
"$BIN" -c "$T/mixed.json" --model tiny -M 8 -e -o "$T/mx.json" >"$T/mx.txt" 2>&1 || fail "mixed: $(cat "$T/mx.txt")"
grep -q "slow: 4 ranks, speed 0.50 (rate 2.00), 300 MB" "$T/mx.txt" || fail "mixed: --explain types"
grep -q "stragglers (rate >= 1.2): 4" "$T/mx.txt" || fail "mixed: the slow type is not planned as stragglers"
echo '{"world_size": 8, "ranks_per_node": 4, "memory_mb": 9, "types": {"a": {"memory_mb": 1}}, "node_types": ["a", "a"]}' >"$T/mx2.json"
expect_fail 2 "memory_mb per type" -c "$T/mx2.json" --model tiny -M 8
# each type's memory and profile (a file beside the cluster file): "small"
# holds 2 layers at 40 MB each in 85 MB, so the big type takes 6
mkdir -p "$T/cl"
P='"n_layers": 8, "tp": 2, "n_heads": 8, "ffn_hidden": 64, "alpha": {"2": 1.0, "1": 1.9}, "embedding_memory_mb": 0, "overhead_mb": 0'
echo "{\"name\": \"big-hw\", $P, \"layer_memory_mb\": [10, 10], \"layer_time\": 1.0}" >"$T/big.json"
echo "{\"name\": \"small-hw\", $P, \"layer_memory_mb\": [40, 40], \"layer_time\": 1.25}" >"$T/cl/small.json"
cat >"$T/cl/types.json" <<'EOF2'
{"nodes": [[0, 1], [2, 3]], "node_types": ["big", "small"],
 "types": {"big": {"memory_mb": 1000}, "small": {"memory_mb": 85, "profile": "small.json"}}}
EOF2
"$BIN" -c "$T/cl/types.json" --profile "$T/big.json" -M 8 -e -o "$T/ty.json" >"$T/ty.txt" 2>&1 ||
    fail "types: $(cat "$T/ty.txt")"
grep -q '"predicted_step_time": 54,' "$T/ty.json" || fail "types: the step is not 54 s: $(cat "$T/ty.json")"
grep -q "type small (speed 0.80, 85 MB, profile small-hw): memory 80.0 of 85 MB; 2 layers: memory binds" \
    "$T/ty.txt" || fail "types: --explain does not say memory binds the small type"
grep -q "small: 2 ranks, speed 0.80 (rate 1.25), 85 MB, profile small.json" "$T/ty.txt" ||
    fail "types: --explain types"
sed 's/"profile": "small.json"/"profile": "small.json", "speed": 0.5/' "$T/cl/types.json" >"$T/cl/bad.json"
expect_fail 2 'types.small: give "speed" or "profile", not both' -c "$T/cl/bad.json" --profile "$T/big.json" -M 8
sed 's/"profile": "small.json"/"profile": "none.json"/' "$T/cl/types.json" >"$T/cl/bad.json"
expect_fail 2 'types.small.profile "none.json"' -c "$T/cl/bad.json" --profile "$T/big.json" -M 8
# --precision: the run's state bytes, the profile re-counted (a preset
# counts 16 a parameter, bf16 keeps a working copy beside them: 18), and
# with it the memory a stage needs
expect_fail 2 "--precision must be fp32 or bf16" $C -M 8 --precision fp64
for p in fp32 bf16; do
    "$BIN" $C -M 8 --precision $p --print-profile >"$T/prec_$p.json" 2>&1 ||
        fail "--precision $p: $(cat "$T/prec_$p.json")"
done
grep -q '"state_bytes": 18' "$T/prec_bf16.json" && grep -q '"state_bytes": 16' "$T/prec_fp32.json" ||
    fail "--precision: state_bytes not 16 / 18: $(cat "$T/prec_fp32.json" "$T/prec_bf16.json")"
"$BIN" $C -M 8 --zero 0 --precision bf16 -e >"$T/prec.txt" 2>&1 &&
    "$BIN" $C -M 8 --zero 0 -e >"$T/prec0.txt" 2>&1 && ! cmp -s "$T/prec.txt" "$T/prec0.txt" ||
    fail "--precision bf16 does not change the memory --explain prints"
echo "test_replan_cli: ok"
