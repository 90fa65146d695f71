# shellcheck shell=sh
# Sourced by cluster.sh (one node) and nodes.sh (several, in network
# namespaces): what both need to stand up a throw-away Slurm.
#   slurm_need_tools [PROG...]   exit 77 naming what is missing (Slurm,
#                                munge, root, and the caller's PROGs)
#   slurm_write_conf FILE CTLD_ADDR PORT DIR NODE_PATHS NODE_LINES NODES
#                                slurm.conf: the controller on CTLD_ADDR
#                                (named after this host: slurmctld refuses
#                                another name), ports PORT and PORT+1,
#                                state and logs under DIR, the slurmd paths
#                                NODE_PATHS, the NodeName lines and one
#                                default partition of NODES
#   slurm_start_munge DIR        reuse a running munged, else start one and
#                                leave its pid in DIR/munged.pid
#   slurm_stop_pidfile FILE      SIGTERM to the pid in FILE, SIGKILL after 10 s
slurm_need_tools() {
    for p in slurmctld slurmd sbatch squeue scontrol sinfo munged "$@"; do
        command -v "$p" >/dev/null 2>&1 || [ -x "/usr/sbin/$p" ] ||
            { echo "slurm test cluster: $p not found (apt-get install slurm-wlm munge iproute2 util-linux)" >&2; exit 77; }
    done
    [ "$(id -u)" = 0 ] || { echo "slurm test cluster: needs root" >&2; exit 77; }
}

slurm_write_conf() {
    cat >"$1" <<CONF
ClusterName=malleus-test
SlurmctldHost=$(hostname -s)($2)
SlurmctldPort=$3
SlurmdPort=$(($3 + 1))
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
StateSaveLocation=$4/state
SlurmctldPidFile=$4/slurmctld.pid
SlurmctldLogFile=$4/log/slurmctld.log
$5
${MALLEUS_SLURM_CONF_EXTRA:-}
$6
PartitionName=test Nodes=$7 Default=YES MaxTime=INFINITE State=UP
CONF
}

slurm_start_munge() {
    munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && return 0
    mkdir -p /run/munge && chown munge:munge /run/munge 2>/dev/null || true
    [ -f /etc/munge/munge.key ] || { echo "slurm test cluster: /etc/munge/munge.key missing" >&2; exit 77; }
    runuser -u munge -- /usr/sbin/munged
    i=0
    while [ ! -s /run/munge/munged.pid ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
    cp /run/munge/munged.pid "$1/munged.pid"
}

slurm_stop_pidfile() {
    [ -f "$1" ] || return 0
    pid=$(cat "$1")
    kill "$pid" 2>/dev/null || true
    i=0
    while kill -0 "$pid" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
    kill -9 "$pid" 2>/dev/null || true
}
