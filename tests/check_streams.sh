#!/bin/sh
# The CUDA backend queues all its device work on its instance's stream,
# which is non-blocking (cudaStreamNonBlocking): work on the legacy default
# stream would not be ordered with it.  So the library's GPU code
# (kernels/cuda/, comm/) calls none of the runtime functions that work on
# the legacy stream -- cudaMemcpy, cudaMemset and their 2-D/3-D and
# ToSymbol/FromSymbol forms (the *Async forms on a stream are the ones to
# use) -- names neither stream 0 nor cudaStreamLegacy as a stream, and does
# not drain the whole device (cudaDeviceSynchronize) where waiting for a
# stream will do.  Comments do not count.  Fails naming every offending line.
: "${top_srcdir:=$(dirname "$0")/..}"
cd "$top_srcdir" || exit 99
files=$(ls kernels/cuda/*.c kernels/cuda/*.cu kernels/cuda/*.cuh comm/*.c 2>/dev/null)
[ -n "$files" ] || { echo "check_streams: no sources found"; exit 99; }
bad=$(for f in $files; do
    # strip /* */ and // comments (line-wise: the backend's comments are
    # block comments whose inner lines start with " *")
    sed -e 's://.*$::' -e 's:/\*.*\*/::g' -e 's:^ *\*.*$::' -e 's:/\*.*$::' "$f" |
        grep -nE '\bcuda(Memcpy|Memset)(2D|3D|ToSymbol|FromSymbol)?[[:space:]]*\(|cudaStreamLegacy|cudaDeviceSynchronize|cudaStream(Synchronize|WaitEvent)[[:space:]]*\([[:space:]]*(0|NULL)[[:space:]]*[,)]|Async[[:space:]]*\([^;]*,[[:space:]]*(0|NULL)[[:space:]]*\)[[:space:]]*[,;)]' |
        sed "s|^|$f:|"
done)
if [ -n "$bad" ]; then
    echo "$bad"
    echo "FAIL: device work on the legacy default stream (use the *Async form on the instance's stream)"
    exit 1
fi
echo "PASS: no device work on the legacy default stream in $(echo $files | wc -w) files"
