# Slurm set-up shared by .ci/slurm-check.sh (one node) and .ci/cluster.sh (a node per namespace): munge,
# free ports, and the lines of slurm.conf that do not depend on the nodes. Sourced, not run; every path is
# under the directory DIR given, so that nothing of the host's own Slurm is used or touched.

# slurm_munged DIR: start munged with a new key, its socket DIR/munge.socket, its logs in DIR/logs; its
# PID in MUNGED_PID. Returns 1 (its stderr in DIR/logs/munged.stderr) when the socket does not come.
slurm_munged() {
    local dir=$1
    mkdir -p "$dir/logs"
    dd if=/dev/urandom of="$dir/munge.key" bs=128 count=1 status=none
    chmod 400 "$dir/munge.key"
    munged -F --force --key-file="$dir/munge.key" --socket="$dir/munge.socket" --pid-file="$dir/munged.pidfile" \
        --seed-file="$dir/munged.seed" --log-file="$dir/logs/munged.log" 2>"$dir/logs/munged.stderr" </dev/null &
    MUNGED_PID=$!
    for _ in $(seq 50); do [[ -S "$dir/munge.socket" ]] && return 0; sleep 0.1; done
    return 1
}

# slurm_ports ADDR: two free TCP ports on ADDR (slurmctld's, slurmd's), on one line
slurm_ports() {
    python3 - "$1" <<'PYTHON'
import socket
import sys

s = [socket.socket() for _ in range(2)]
for x in s:
    x.bind((sys.argv[1], 0))
print(*(x.getsockname()[1] for x in s))
PYTHON
}

# slurm_conf NAME CTLD_HOST CTLD_ADDR CTLD_PORT SLURMD_PORT DIR: slurm.conf's lines but the nodes' and the
# partitions': root daemons, munge through DIR/munge.socket, state, spool (DIR/spool/NODE), PID and log
# files under DIR, select/cons_tres by CPU, no cgroups (proctrack/linuxproc), no MPI by default, and jobs
# that may be requeued and stay listed an hour after they end
slurm_conf() {
    local name=$1 host=$2 addr=$3 ctld_port=$4 slurmd_port=$5 dir=$6
    cat <<CONF
ClusterName=$name
SlurmctldHost=$host($addr)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge.socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pidfile
SlurmdPidFile=$dir/slurmd-%n.pidfile
SlurmctldLogFile=$dir/logs/slurmctld.log
SlurmdLogFile=$dir/logs/slurmd-%n.log
MailProg=/bin/true
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
JobRequeue=1
MinJobAge=3600
ReturnToService=2
SlurmdParameters=config_overrides
CONF
}
