#!/bin/sh
# The library's layers are its folders, and every include points down.
# Folder -> layer, bottom up (docs/DEVELOPING.md, "Layout"):
#
#   0  base/      errors, RNG, option helpers, bounded input, atomic output
#   1  kernels/   the compute table and its backends (cpu, cuda)
#   2  comm/      the communication table and its backends (MPI, NCCL);
#                 orders its data plane against the kernel queue
#   3  src/       the core: config, model, optimizer, plan, layout, slices,
#                 pieces, gradient sum, state mover, data, sampling
#   4  ckpt/      snapshots, reshard, export     } side by side: neither
#   4  replan/    cost model, planner, policy    } includes the other
#   5  train/     the trainer
#   6  cmd/       the program mains (an option table and one call)
#
# A file may include headers of its own folder (by bare name: "model.h")
# and of folders below it (by folder: "comm/comm.h"), never of a folder
# above or beside it.  Also checked: every include resolves the way the
# compiler resolves it with -I$(top_srcdir) alone; no "../" paths; MPI and
# NCCL headers only in comm/ (the control plane is MPI, behind the comm
# table); GPU runtime headers (CUDA, cuBLAS, cuDNN) only in kernels/cuda/:
# comm/ reaches the device runtime through kernels/cuda/runtime.h (the
# CUDA headers that nccl.h includes itself are NCCL's business).
# Fails naming every offending line.
: "${top_srcdir:=$(dirname "$0")/..}"
cd "$top_srcdir" || exit 99

layer() { # FILE -> its layer, or nothing for a file outside the library
    case $1 in
    base/*) echo 0 ;;
    kernels/*) echo 1 ;;
    comm/*) echo 2 ;;
    src/*) echo 3 ;;
    ckpt/*) echo 4c ;;
    replan/*) echo 4r ;;
    train/*) echo 5 ;;
    cmd/*) echo 6 ;;
    *) echo "" ;;
    esac
}

bad=0 n=0
fail() {
    echo "$1"
    bad=$((bad + 1))
}
files=$(find base kernels comm src ckpt replan train cmd \
    \( -name '*.[ch]' -o -name '*.cu' -o -name '*.cuh' \) | sort)
for f in $files; do
    lf=$(layer "$f")
    dir=$(dirname "$f")
    # quoted includes: where they resolve, and their layer
    for h in $(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f"); do
        n=$((n + 1))
        case $h in
        ../* | */../*) fail "relative path: $f includes \"$h\"" && continue ;;
        */*) t=$h ;;
        *) t=$dir/$h ;;
        esac
        if [ ! -f "$t" ]; then
            fail "unresolved: $f includes \"$h\" (no $t)"
            continue
        fi
        case $h in
        */*) [ "$(dirname "$t")" = "$dir" ] &&
            fail "own folder by path: $f includes \"$h\" (write \"$(basename "$h")\")" ;;
        esac
        lt=$(layer "$t")
        [ -n "$lt" ] || { fail "outside the library: $f includes $t" && continue; }
        a=${lf%[cr]} b=${lt%[cr]}
        if [ "$b" -gt "$a" ] || { [ "$a" = "$b" ] && [ "$lf" != "$lt" ]; }; then
            fail "upward include: $f (layer $lf) includes $t (layer $lt)"
        fi
    done
    # system headers of the transports and the GPU runtime
    for h in $(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*<\([^>]*\)>.*/\1/p' "$f"); do
        case $h in
        mpi.h | nccl.h) case $f in comm/*) ;; *) fail "transport header outside comm/: $f includes <$h>" ;; esac ;;
        cuda*.h | cublas*.h | cudnn*.h) case $f in kernels/cuda/*) ;;
            *) fail "GPU runtime header outside kernels/cuda/: $f includes <$h>" ;; esac ;;
        esac
    done
done
if [ $bad -ne 0 ]; then
    echo "FAIL: $bad problem(s) among $n includes"
    exit 1
fi
echo "PASS: $n includes in $(echo "$files" | wc -l) files, every one points down a layer"
