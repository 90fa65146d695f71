# Sourced by the tests that run jobs on a multi-node cluster
# (test_nodes.sh, test_shrink.sh, test_grow.sh) after they set top_srcdir,
# top_builddir and NAME: a work directory $W, ms T0 (milliseconds since the
# date +%s%N T0), a cleanup on exit that ends the test's job (srun_pid or
# jobid, whichever it set) and tears the cluster down, the lock that keeps
# one test cluster at a time (shared munged; test_slurm.sh), and a 4-node
# cluster of 2 CPUs each (tests/slurm/nodes.sh) whose variables are set
# here.  A cluster that cannot start exits with nodes.sh's status (77: no
# namespaces, root or Slurm here).
# shellcheck shell=sh
# the ranks talk across the namespaces' links, not the loopback the rest of
# the suite keeps MPI to (Makefile.am)
unset UCX_NET_DEVICES
W=$(mktemp -d "/tmp/malleus-test-$NAME-XXXXXX")
ms() { echo $((($(date +%s%N) - $1) / 1000000)); }
cleanup() {
    [ -n "${srun_pid:-}" ] && kill "$srun_pid" 2>/dev/null
    [ -n "${jobid:-}" ] && scancel "$jobid" 2>/dev/null
    t=$(date +%s%N)
    sh "$top_srcdir/tests/slurm/nodes.sh" down "$W/cluster"
    echo "cluster down in $(ms "$t") ms"
    rm -rf "$W"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
exec 9>"${TMPDIR:-/tmp}/malleus-slurm-tests.lock"
flock 9
t0=$(date +%s%N)
out=$(sh "$top_srcdir/tests/slurm/nodes.sh" up "$W/cluster" 4 2) || {
    rc=$?
    echo "nodes.sh up failed ($rc)"
    tail -5 "$W"/cluster/log/* 2>/dev/null
    exit $rc
}
eval "$out"
echo "cluster of 4 nodes up in $(ms "$t0") ms"
