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

case $cmd in
up)
    for p in slurmctld slurmd sbatch squeue scontrol munged; do
        command -v $p >/dev/null 2>&1 || [ -x /usr/sbin/$p ] ||
            { echo "cluster.sh: $p not found (apt-get install slurm-wlm munge)" >&2; exit 77; }
    done
    [ "$(id -u)" = 0 ] || { echo "cluster.sh: needs root" >&2; exit 77; }
    mkdir -p "$dir/state" "$dir/spool" "$dir/log"
    host=$(hostname -s)
    port=$((17000 + $$ % 2000))
    cat >"$dir/slurm.conf" <<CONF
ClusterName=malleus-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=pmi2
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SwitchType=switch/none
MailProg=/bin/true
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
${MALLEUS_SLURM_CONF_EXTRA:-}
NodeName=$host NodeAddr=127.0.0.1 CPUs=8 RealMemory=4000 State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
    # munge: reuse a running daemon, else start one and remember to stop it
    if ! munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
        mkdir -p /run/munge && chown munge:munge /run/munge 2>/dev/null || true
        [ -f /etc/munge/munge.key ] || { echo "cluster.sh: /etc/munge/munge.key missing" >&2; exit 77; }
        runuser -u munge -- /usr/sbin/munged
        i=0
        while [ ! -s /run/munge/munged.pid ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
        cp /run/munge/munged.pid "$dir/munged.pid"
    fi
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
    for f in slurmd slurmctld munged; do
        if [ -f "$dir/$f.pid" ]; then
            pid=$(cat "$dir/$f.pid")
            kill "$pid" 2>/dev/null || true
            i=0
            while kill -0 "$pid" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
            kill -9 "$pid" 2>/dev/null || true
        fi
    done
    ;;
*)
    echo "usage: $0 up|down DIR" >&2
    exit 2
    ;;
esac
