#!/bin/sh
# A throw-away one-node Slurm cluster on this machine, for tests.
#
#   eval "$(sh cluster.sh up DIR)"   # start munge (if needed), slurmctld, slurmd;
#                                    # prints SLURM_CONF=... for the caller
#   sh cluster.sh down DIR           # stop what `up` started, by pid
#
# MALLEUS_SLURM_CONF_EXTRA: more slurm.conf lines (a test's own settings,
# e.g. a short requeue delay).
#
# Everything lives under DIR (config, state, spool, logs, pid files); the
# daemons listen on loopback ports of their own so a system Slurm is not
# disturbed.  Needs root (slurmd and munged run as root / munge).  Facts
# behind the configuration: docs/DEVELOPING.md, "Slurm on one machine".
set -eu
cmd=${1:-}
dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || { echo "usage: $0 up|down DIR" >&2; exit 2; }

here=$(cd "$(dirname "$0")" && pwd)
. "$here/common.sh"

case $cmd in
up)
    slurm_need_tools
    mkdir -p "$dir/state" "$dir/spool" "$dir/log"
    host=$(hostname -s)
    slurm_write_conf "$dir/slurm.conf" 127.0.0.1 $((17000 + $$ % 2000)) "$dir" \
        "SlurmdSpoolDir=$dir/spool
SlurmdPidFile=$dir/slurmd.pid
SlurmdLogFile=$dir/log/slurmd.log" \
        "NodeName=$host NodeAddr=127.0.0.1 CPUs=8 RealMemory=4000 State=UNKNOWN" "$host"
    # munge: reuse a running daemon, else start one and remember to stop it
    slurm_start_munge "$dir"
    SLURM_CONF="$dir/slurm.conf"
    export SLURM_CONF
    /usr/sbin/slurmctld -f "$SLURM_CONF"
    /usr/sbin/slurmd -f "$SLURM_CONF"
    # wait until the node is idle (about 3 s)
    i=0
    while [ $i -lt 60 ]; do
        state=$(sinfo -h -o %t 2>/dev/null | head -1 || true)
        [ "$state" = idle ] && break
        sleep 0.5
        i=$((i + 1))
    done
    [ "$state" = idle ] || { echo "cluster.sh: node not idle (state '$state'); logs in $dir/log" >&2; exit 99; }
    echo "SLURM_CONF=$SLURM_CONF; export SLURM_CONF"
    ;;
down)
    for f in slurmd slurmctld munged; do slurm_stop_pidfile "$dir/$f.pid"; done
    ;;
*)
    echo "usage: $0 up|down DIR" >&2
    exit 2
    ;;
esac
