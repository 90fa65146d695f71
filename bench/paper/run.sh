#!/bin/sh
# The paper's experiment simulated: the table (stdout) and the
# figure (speedup of Malleus over the three baselines per scenario).
#
#   sh bench/paper/run.sh [BUILD_DIR] [OUT_DIR] [--widest]
#
# BUILD_DIR holds bench/paper/bench_paper (built by make check); OUT_DIR
# gets paper.csv and paper.png (default bench/out).  --widest also runs the
# exhaustive search per scenario and reports where the default differs.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-.}
out=${2:-bench/out}
widest=${3:-}
py=${PYTHON3:-/usr/bin/python3}
mkdir -p "$out"
# shellcheck disable=SC2086
"$build/bench/paper/bench_paper" --csv "$out/paper.csv" $widest
"$py" "$here/plot.py" "$out/paper.csv" "$out/paper.png"
echo "figure: $out/paper.png"
