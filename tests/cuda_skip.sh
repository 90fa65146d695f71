# Sourced by the GPU tests that run malleus-train (test_cuda_train.sh,
# test_cuda_inject.sh): mal_need_cuda NAME exits 77 (skip), with the reason,
# when "$TRAIN" cannot use --device cuda on this machine.
mal_need_cuda() {
    probe_err="${TMPDIR:-/tmp}/$1.probe.$$"
    if ! "$TRAIN" --device cuda --steps 0 --quiet >/dev/null 2>"$probe_err"; then
        echo "$1: skipped: $(tail -1 "$probe_err")"
        rm -f "$probe_err"
        exit 77
    fi
    rm -f "$probe_err"
}
