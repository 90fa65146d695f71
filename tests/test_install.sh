#!/bin/sh
# `make install` into a scratch DESTDIR, then a job run from the installed
# tree alone: the programs in PREFIX/bin, the job scripts, the restart loop
# and the GPU bind wrapper in PREFIX/share/malleus/jobs, the plot script in
# PREFIX/share/malleus/scripts; jobs/malleus.sbatch (outside Slurm: the loop
# under $MPIEXEC, 2 ranks, 4 steps) from a directory outside the build tree,
# and the plot of its metrics.  Then `make uninstall` leaves nothing.
: "${top_srcdir:=$(dirname "$0")/..}"
: "${top_builddir:=.}"
: "${MPIEXEC:=mpiexec.mpich}"
: "${PYTHON3:=/usr/bin/python3}"
W=$(mktemp -d /tmp/malleus-test-install-XXXXXX)
trap 'rm -rf "$W"' EXIT
B=$(cd "$top_builddir" && pwd)
# not the make check that runs this test: its jobserver is not ours
unset MAKEFLAGS MFLAGS MAKELEVEL
make -s -C "$B" install DESTDIR="$W/dest" prefix=/opt/malleus >"$W/install.out" 2>&1 ||
    { cat "$W/install.out"; echo "FAIL: make install"; exit 1; }
I=$W/dest/opt/malleus
fails=0
for f in bin/malleus-train bin/malleus-replan bin/malleus-reshard bin/malleus-sample \
    bin/malleus-export bin/malleus-import bin/malleus-tokenize share/malleus/jobs/malleus.sbatch \
    share/malleus/jobs/malleus-gpu.sbatch share/malleus/jobs/train-single.sbatch \
    share/malleus/jobs/adaptive-loop.sh share/malleus/jobs/gpu-bind.sh \
    share/malleus/scripts/plot-metrics.py; do
    [ -x "$I/$f" ] || { echo "FAIL: $f not installed (or not executable)"; fails=$((fails + 1)); }
done
[ $fails -eq 0 ] || exit 1

# a job from the installed tree, in a directory of its own
mkdir "$W/job"
cd "$W/job" || exit 99
MALLEUS_BIN=$I/bin MALLEUS_LOOP=$I/share/malleus/jobs/adaptive-loop.sh MPIEXEC=$MPIEXEC \
    NPROCS=2 RUN_DIR=$W/job/run MODEL=tiny STEPS=4 GLOBAL_BATCH=8 PIPELINES=1 SNAPSHOT_EVERY=2 \
    OPENBLAS_NUM_THREADS=1 timeout 300 bash "$I/share/malleus/jobs/malleus.sbatch" >"$W/job.out" 2>&1
rc=$?
[ $rc -eq 0 ] && grep -q 'done: 4 steps' run/events.log ||
    { tail -20 "$W/job.out"; echo "FAIL: the installed job exited $rc"; exit 1; }
[ "$(wc -l <run/metrics.jsonl)" -eq 4 ] || { echo "FAIL: $(wc -l <run/metrics.jsonl) metrics rows, want 4"; exit 1; }
grep -q '^step 4/4 ' "$W/job.out" || { echo "FAIL: the job log has no step lines"; exit 1; }
# the installed plot script draws it
if "$PYTHON3" -c 'import matplotlib' 2>/dev/null; then
    "$PYTHON3" "$I/share/malleus/scripts/plot-metrics.py" run/metrics.jsonl plot.png >"$W/plot.out" 2>&1 &&
        [ -s plot.png ] || { cat "$W/plot.out"; echo "FAIL: the installed plot script"; exit 1; }
    plot="and plotted it"
else
    plot="(the plot left out: this Python has no matplotlib)"
fi
cd "$W" || exit 99
make -s -C "$B" uninstall DESTDIR="$W/dest" prefix=/opt/malleus >"$W/uninstall.out" 2>&1 ||
    { cat "$W/uninstall.out"; echo "FAIL: make uninstall"; exit 1; }
left=$(find "$W/dest" -type f | head -5)
[ -z "$left" ] || { echo "FAIL: make uninstall left $left"; exit 1; }
echo "PASS: installed into DESTDIR, ran jobs/malleus.sbatch from the install tree (4 steps) $plot; uninstalled"
