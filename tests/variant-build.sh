#!/bin/sh
# tests/variant-build.sh: the helper of `make check-sanitize` and `make
# fuzz`, which build this tree again with another compiler or other flags
# in a directory of their own: DIR/src is a copy of the distributed sources
# (`make distdir`, as distcheck makes one), DIR/build is configured from it
# out of tree (VPATH).  A copy rather than the checkout itself, because the
# checkout is usually configured in place, and automake refuses a VPATH
# build of a source tree that is.
#
#   sh tests/variant-build.sh check-cc WHAT CC CFLAGS
#       exit 2, saying what to install, unless CC links a program with
#       CFLAGS (WHAT names the stage in the message).
#   sh tests/variant-build.sh configure DIR CC CFLAGS
#       configure DIR/build from DIR/src with CC and CFLAGS (CUDA and NCCL
#       off: their code needs a GPU to run), unless it already is with the
#       same settings; CFLAGS also reach the link (automake passes them).
set -eu

case ${1:-} in
check-cc)
    [ $# -eq 4 ] || { echo "usage: $0 check-cc WHAT CC CFLAGS" >&2; exit 99; }
    what=$2 cc=$3 cflags=$4
    t=$(mktemp -d /tmp/malleus-cc-XXXXXX)
    trap 'rm -rf "$t"' EXIT
    cat >"$t/probe.c" <<'EOF'
#include <stddef.h>
#include <stdint.h>
int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n);
int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { return (int)(n && d[0] == 0); }
#ifndef FUZZ
int main(void) { return LLVMFuzzerTestOneInput((const uint8_t *)"", 0); }
#endif
EOF
    defs=""
    case $cflags in *fuzzer*) defs=-DFUZZ ;; esac
    # shellcheck disable=SC2086
    if ! $cc $cflags $defs "$t/probe.c" -o "$t/probe" >"$t/log" 2>&1; then
        echo "make $what: '$cc' cannot build with '$cflags':" >&2
        sed 's/^/  /' "$t/log" | head -5 >&2
        echo "make $what: install the compiler and runtimes it needs" \
             "(scripts/install-deps.sh: clang libclang-rt-14-dev for fuzzing," \
             "gcc's libasan/libubsan come with build-essential)" >&2
        exit 2
    fi
    ;;
configure)
    [ $# -eq 4 ] || { echo "usage: $0 configure DIR CC CFLAGS" >&2; exit 99; }
    dir=$2 cc=$3 cflags=$4
    settings="CC=$cc CFLAGS=$cflags"
    if [ -f "$dir/build/config.status" ] && [ -f "$dir/build/variant.settings" ] &&
       [ "$(cat "$dir/build/variant.settings")" = "$settings" ]; then
        exit 0
    fi
    rm -rf "$dir/build"
    mkdir -p "$dir/build"
    echo "configuring $dir/build: $settings"
    ( cd "$dir/build" &&
      ../src/configure -q CC="$cc" CFLAGS="$cflags" --without-cuda --without-nccl ) ||
        { echo "configure of $dir/build failed: see $dir/build/config.log" >&2; exit 1; }
    printf '%s\n' "$settings" >"$dir/build/variant.settings"
    ;;
*)
    echo "usage: $0 check-cc|configure ..." >&2
    exit 99
    ;;
esac
