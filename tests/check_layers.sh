#!/bin/sh
# The library's layers (README.md, "Layout") point one way: a file may
# include headers of its own layer and of the layers below it, never of a
# layer above.  Fails naming every upward include.  Layers, bottom up:
#   0 base      src/mal.h src/error.c src/rng.h src/opts.* src/fileio.*
#   1 backends  kernels/ (compute) and src/comm*.* (communication)
#   2 core      the rest of src/ outside src/train/: config, data, plan,
#               layout, slices, model, optim, tensor pieces, gradient sync,
#               state mover
#   3 ckpt/ (snapshots, resharding) and replan/ (planner); neither
#     includes the other
#   4 trainer   src/train/
#   5 mains     *_main.c
: "${top_srcdir:=$(dirname "$0")/..}"
cd "$top_srcdir" || exit 99

layer() {
    case $1 in
    *_main.c) echo 5 ;;
    src/train/*) echo 4 ;;
    ckpt/*) echo 3c ;;
    replan/*) echo 3r ;;
    kernels/*) echo 1 ;;
    src/comm*) echo 1 ;;
    src/mal.h | src/error.c | src/rng.h | src/opts.h | src/opts.c | src/fileio.h | src/fileio.c) echo 0 ;;
    src/*) echo 2 ;;
    *) echo "" ;;
    esac
}

# Where a quoted include resolves (the -I order of Makefile.am).
resolve() {
    for d in src src/train kernels kernels/cuda ckpt replan; do
        [ -f "$d/$1" ] && { echo "$d/$1"; return; }
    done
}

bad=0 n=0
for f in $(find src kernels ckpt replan -name '*.[ch]' -o -name '*.cu' -o -name '*.cuh' | sort); do
    lf=$(layer "$f")
    [ -n "$lf" ] || continue
    for h in $(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f"); do
        t=$(resolve "$h")
        [ -n "$t" ] || continue
        lt=$(layer "$t")
        n=$((n + 1))
        a=${lf%[cr]} b=${lt%[cr]}
        if [ "$b" -gt "$a" ] || { [ "$a" = 3 ] && [ "$b" = 3 ] && [ "$lf" != "$lt" ]; }; then
            echo "upward include: $f (layer $lf) includes $t (layer $lt)"
            bad=$((bad + 1))
        fi
    done
done
if [ $bad -ne 0 ]; then
    echo "FAIL: $bad include(s) point up a layer (of $n checked)"
    exit 1
fi
echo "PASS: $n includes, none points up a layer"
