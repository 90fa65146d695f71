#!/bin/sh
# The planner's outputs on a fixed corpus of homogeneous clusters (no device
# types): plan and --explain of 48 cases -- 8 to 1,024 ranks at 0-20 %
# stragglers from gen.py, every size of preset, tests/plans as --current and
# --simulate, slow links, --uniform -- to check that a change leaves them
# byte for byte (timings and source line numbers aside).
#
#   sh bench/replan/corpus.sh BUILD_DIR OUT_DIR          write the corpus
#   sh bench/replan/corpus.sh --compare OLD_DIR NEW_DIR  compare two
set -eu
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
py=${PYTHON3:-/usr/bin/python3}
norm() {
    sed -E 's/\.c:[0-9]+:/.c:N:/g; s/[0-9.]+ s, no time limit/X s, no time limit/' "$1"
}
if [ "${1:-}" = "--compare" ]; then
    n=0
    d=0
    for f in "$2"/*.out; do
        b=$(basename "$f")
        n=$((n + 1))
        norm "$f" >"$3/.a"
        norm "$3/$b" >"$3/.b"
        if ! cmp -s "$3/.a" "$3/.b"; then
            echo "differs: $b"
            d=$((d + 1))
        fi
    done
    rm -f "$3/.a" "$3/.b"
    echo "$n cases, $d differ"
    [ "$d" -eq 0 ]
    exit
fi
B=$1
O=$2
mkdir -p "$O"
P=$top/tests/plans
i=0
run() {
    i=$((i + 1))
    rc=0
    "$B/malleus-replan" "$@" --explain --time-limit 0 >"$O/$i.out" 2>&1 || rc=$?
    echo "rc=$rc" >>"$O/$i.out"
}
for n in 8 64 256 1024; do
    for frac in 0 0.01 0.05 0.2; do
        "$py" "$here/gen.py" "$n" "$frac" 1.5 12 "$n" >"$O/r_${n}_$frac.json"
        if [ "$n" -le 8 ]; then m=small M=32; else m=70b M=$((n / 2)); fi
        run --world-size "$n" --ranks-per-node 8 --memory-mb 81920 --model "$m" \
            --micro-batches "$M" --rates "$O/r_${n}_$frac.json"
    done
done
for m in tiny tiny-llama3 small 124m 1b 32b llama2-7b; do
    run --world-size 8 --ranks-per-node 4 --memory-mb 16384 --model "$m" -g 64 -b 2
    run --world-size 64 --ranks-per-node 8 --memory-mb 40960 --model "$m" -M 64 \
        --rates "$O/r_64_0.05.json"
done
run --world-size 16 --ranks-per-node 8 --memory-mb 81920 --model 32b -M 32 \
    --rates "$O/r_8_0.2.json" --search exhaustive
for f in four.json pp4dp2.json tp4dp2.json dp8.json suspended.json uneven_stages.json \
    mixed_tp.json; do
    run --world-size 8 --ranks-per-node 8 --memory-mb 16384 --model tiny -M 32 \
        --current "$P/$f" --rates "$O/r_8_0.2.json"
    run --world-size 8 --ranks-per-node 8 --memory-mb 16384 --model tiny -M 32 \
        --simulate "$P/$f" --rates "$O/r_8_0.2.json"
done
echo '{"links": [{"a": 0, "b": 1, "rate": 8.0}, {"a": 3, "b": 4, "rate": 4}]}' >"$O/links.json"
run --world-size 8 --ranks-per-node 4 --memory-mb 16384 --model tiny -M 32 --links "$O/links.json"
run --world-size 8 --ranks-per-node 4 --memory-mb 16384 --model small -M 32 \
    --links "$O/links.json" --rates "$O/r_8_0.2.json"
run --world-size 8 --ranks-per-node 4 --memory-mb 16384 --model small -M 32 --uniform --pipelines 2
echo "$i cases in $O"
