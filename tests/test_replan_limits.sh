#!/bin/sh
# The planner's time and memory stay bounded on the largest inputs it
# accepts:
#  - 131,072 ranks with 20 % stragglers under --time-limit 1 (a search that
#    runs to its end takes 15 s and more here) end within 1 x 3 + 5 s with a
#    valid plan, report the best plan found, the lower bound and the gap
#    (stderr, --explain, --summary), and say that the limit stopped them;
#  - 2^20 ranks with 5 % stragglers plan in 1.5 GB of address space (the
#    evaluation's table of blocks x healthy counts took 5.7 GB: "out of
#    memory" in a second);
#  - --time-limit is in --help and refuses what is not a number of seconds.
# Timings are generous on purpose: CI has two loaded cores.
set -u
BIN="${REPLAN_BIN:-${top_builddir:-.}/malleus-replan}"
T=$(mktemp -d "${TMPDIR:-/tmp}/test_replan_limits.XXXXXX") || exit 99
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
[ -x "$BIN" ] || { echo "no $BIN" >&2; exit 99; }

# rates: FRACTION of WORLD ranks spread over the cluster at 1.5-11.9
rates() { # WORLD FRACTION
    awk -v n="$1" -v f="$2" 'BEGIN {
        k = int(n * f); printf "{"
        for (i = 0; i < k; i++)
            printf "%s\"%d\": %.2f", (i ? ", " : ""), (i * 7919 + 13) % n, 1.5 + (i * 37 % 105) / 10
        print "}" }'
}
now() { date +%s; }
# the margin: limit x 3 + 5 s; four times that in the sanitizer build (every
# memory access checked: the setup before the first plan takes longer)
slack=1
[ -n "${ASAN_OPTIONS:-}${UBSAN_OPTIONS:-}" ] && slack=4

"$BIN" --help | grep -q -- "--time-limit SECONDS" || fail "--help does not mention --time-limit"
C8="--world-size 8 --ranks-per-node 4 --memory-mb 100 --model tiny -M 8"
for bad in -1 nan abc 1e10; do
    "$BIN" $C8 --time-limit "$bad" >"$T/out" 2>"$T/err"
    rc=$?
    [ "$rc" -eq 2 ] && grep -q -- "--time-limit" "$T/err" ||
        fail "--time-limit $bad: exit $rc ($(cat "$T/err"))"
done
# a small plan is the same with and without the (default) limit
"$BIN" $C8 -o "$T/a.json" && "$BIN" $C8 --time-limit 0 -o "$T/b.json" || fail "tiny plan"
cmp -s "$T/a.json" "$T/b.json" || fail "the default time limit changed a small plan"

# 131,072 ranks, 20 % stragglers, one second
W=131072
rates $W 0.2 >"$T/r131k.json"
t0=$(now)
"$BIN" --world-size $W --ranks-per-node 8 --memory-mb 81920 --model 70b --micro-batches 65536 \
    --rates "$T/r131k.json" --time-limit 1 --explain --summary -o "$T/p131k.json" \
    >"$T/report" 2>"$T/err"
rc=$?
t1=$(now)
[ "$rc" -eq 0 ] || fail "131,072 ranks, --time-limit 1: exit $rc ($(cat "$T/err"))"
[ $((t1 - t0)) -le $((8 * slack)) ] ||
    fail "131,072 ranks, --time-limit 1: took $((t1 - t0)) s (limit x 3 + 5 = 8, x $slack)"
outcome="best found .* s, bound .* s, gap .* %, stopped by the time limit (1 s)"
grep -q "^malleus-replan: $outcome" "$T/err" ||
    fail "no report of the time limit on stderr: $(cat "$T/err")"
grep -q "^search: $outcome" "$T/report" ||
    fail "--explain lacks the search's outcome: $(grep search "$T/report")"
grep -q '"stop": "time_limit", "time_limit": 1}' "$T/report" || fail "--summary lacks the stop"
# the gap is a fraction in [0, 1); the bound is below the plan
gap=$(sed -n 's/.*"gap": \([0-9.]*\),.*/\1/p' "$T/report")
awk -v g="$gap" 'BEGIN { exit !(g >= 0 && g < 1) }' || fail "gap '$gap'"
"$BIN" --world-size $W --ranks-per-node 8 --memory-mb 81920 --model 70b --micro-batches 65536 \
    --rates "$T/r131k.json" --simulate "$T/p131k.json" >"$T/sim" 2>&1 ||
    fail "the plan does not validate: $(tail -3 "$T/sim")"

# 2^20 ranks, 5 % stragglers, in 1.5 GB of address space (not under
# AddressSanitizer, which reserves terabytes of it)
W=1048576
rates $W 0.05 >"$T/r1m.json"
( [ -n "${ASAN_OPTIONS:-}" ] || ulimit -v 1500000 2>/dev/null
  t0=$(now)
  "$BIN" --world-size $W --ranks-per-node 8 --memory-mb 81920 --model 70b \
      --micro-batches 524288 --rates "$T/r1m.json" --time-limit 2 --summary -o "$T/p1m.json" \
      >"$T/sum1m" 2>"$T/err1m"
  echo $? >"$T/rc1m"
  echo $(($(now) - t0)) >"$T/t1m" )
[ "$(cat "$T/rc1m")" -eq 0 ] ||
    fail "2^20 ranks in 1.5 GB: exit $(cat "$T/rc1m"): $(cat "$T/err1m")"
[ "$(cat "$T/t1m")" -le $((11 * slack)) ] ||
    fail "2^20 ranks, --time-limit 2: took $(cat "$T/t1m") s (2 x 3 + 5 = 11, x $slack)"
grep -q '"ranks": 1048576' "$T/sum1m" || fail "2^20 ranks: no summary"
echo "test_replan_limits: 131,072 ranks in $((t1 - t0)) s (gap $gap)," \
    "2^20 ranks in $(cat "$T/t1m") s"
