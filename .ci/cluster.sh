#!/usr/bin/env bash
# A virtual cluster of N nodes on this host, each a set of Linux namespaces (as root):
#
#   bash .ci/cluster.sh up [N] [--rate R] [--rate-of nI=R ...] [--slurm]
#                                                                N nodes n1..nN (default 4); --slurm:
#                                                                and a Slurm cluster on them (slurm_up)
#   bash .ci/cluster.sh down                                     stop and remove everything
#   bash .ci/cluster.sh status                                   the nodes, their holders and links
#   bash .ci/cluster.sh shape NODE RATE|none                     shape one node's link now
#   bash .ci/cluster.sh link NODE down|up                        cut one node's link, or mend it
#   bash .ci/cluster.sh slurmd NODE                              start NODE's slurmd again (--slurm)
#   bash .ci/cluster.sh shm NODE SIZE                            resize one node's /dev/shm (64m)
#
# A node nI has its own
#   - network: a network namespace with a veth (eth0, address $SUBNET.I/24) on a bridge ($BRIDGE,
#     address $SUBNET.254 on the host), and its loopback;
#   - hostname nI (UTS), mount namespace with a private tmpfs on /dev/shm and its own /etc/hosts (the
#     nodes by name), SysV IPC, PIDs (its own /proc) and time: CLOCK_MONOTONIC is I*3 hours ahead of the
#     host's (unshare --time --monotonic), so no two nodes share a clock.
# All of them are needed: UCX (inside the PyPI MPICH) decides what is "the same host" from the boot id,
# which namespaces share, and without IPC and PID namespaces it moves messages between "nodes" through
# SysV shared memory or CMA, so that a cut link would cut nothing.
#
# A node is held by one process, `unshare ... sleep infinity` (PID 1 of the node's PID namespace; its
# PID on the host is in $STATE/nI.pid); everything runs inside it through $STATE/enter, which takes
# ssh's form `enter [-x] HOST CMD...` and runs CMD by `sh -c` in HOST's namespaces, in the caller's
# working directory. It is Hydra's launcher and Open MPI's rsh agent:
#
#   mpiexec -iface $BRIDGE -launcher ssh -launcher-exec $STATE/enter -hosts n1,n2 -n 4 ...
#   mpiexec --mca plm_rsh_agent $STATE/enter --host n1:2,n2:2 -n 4 ...
#
# Links: `--rate R` (a tc rate: 100mbit) shapes every node's link both ways with tc tbf, `--rate-of
# n2=10mbit` one node's; unshaped by default (netem is not in every kernel: delay is not emulated).
# `down` stops the Slurm daemons by their PIDs, kills each holder by its PID (which ends every process of
# the node: its PID namespace goes with its PID 1), then removes the veths, namespaces and bridge; a
# failed `up` does the same before it exits.
#
# Environment: CLUSTER_STATE (default /run/ebsp-cluster), CLUSTER_BRIDGE (ebspbr0), CLUSTER_SUBNET
# (10.213.7: the first three bytes of a /24 no route of this host uses), CLUSTER_SHM (the size of each
# node's /dev/shm, default 1g), CLUSTER_PREFIX (ebsp: the names PREFIX-nI of the network namespaces
# and of the host's veth ends), CLUSTER_SLURM_CPUS (the CPUs slurm.conf gives a node, default 4).
set -euo pipefail

STATE=${CLUSTER_STATE:-/run/ebsp-cluster}
BRIDGE=${CLUSTER_BRIDGE:-ebspbr0}
SUBNET=${CLUSTER_SUBNET:-10.213.7}
SHM=${CLUSTER_SHM:-1g}
PREFIX=${CLUSTER_PREFIX:-ebsp}  # of the network namespaces and the host's veth ends: PREFIX-nI
HOURS=3  # node I's monotonic clock is I*HOURS hours ahead of the host's
# a cluster that is up is taken down, shaped and entered with the names it was made with
if [[ -r "$STATE/config" ]]; then
    # shellcheck disable=SC1091
    source "$STATE/config"
fi

say() { echo "cluster: $*" >&2; }
die() { say "$*"; exit 1; }

netns() { echo "$PREFIX-$1"; }     # the network namespace of node $1
hostveth() { echo "$PREFIX-$1"; }  # the host's end of node $1's veth (at most 15 characters)

# shape_link NODE RATE: tbf at RATE on both ends of NODE's veth (the host's end: traffic into the node);
# RATE none: unshaped again
shape_link() {
    local node=$1 rate=$2 burst=256kb
    if [[ "$rate" == none ]]; then
        tc qdisc del dev "$(hostveth "$node")" root 2>/dev/null || true
        ip netns exec "$(netns "$node")" tc qdisc del dev eth0 root 2>/dev/null || true
        rm -f "$STATE/$node.rate"
        return 0
    fi
    tc qdisc replace dev "$(hostveth "$node")" root tbf rate "$rate" burst "$burst" latency 100ms
    ip netns exec "$(netns "$node")" tc qdisc replace dev eth0 root tbf rate "$rate" burst "$burst" latency 100ms
    echo "$rate" > "$STATE/$node.rate"
}

# set_link NODE up|down: cut NODE's link (its veth on the bridge) or mend it. Mended, both sides forget
# the addresses they failed to reach meanwhile: a connection from the node a moment later otherwise met
# its failed neighbour entry, "No route to host"
set_link() {
    local node=$1 state=$2
    [[ "$state" == up || "$state" == down ]] || die "link NODE up|down, not '$state'"
    ip link set "$(hostveth "$node")" "$state"
    if [[ "$state" == up ]]; then
        ip netns exec "$(netns "$node")" ip neigh flush dev eth0 2>/dev/null || true
        ip neigh flush dev "$BRIDGE" to "$(cat "$STATE/$node.addr")" 2>/dev/null || true
    fi
}

down() {
    local pidfile pid node ns
    [[ -d "$STATE" ]] || return 0
    slurm_down
    # the holders are `unshare --kill-child`, which ignores SIGTERM while it waits for its child: SIGKILL
    # to one makes the kernel send SIGKILL to its node's PID 1 (PR_SET_PDEATHSIG), and then to every other
    # process of the node's PID namespace
    for pidfile in "$STATE"/n*.pid; do
        [[ -e "$pidfile" ]] || continue
        pid=$(cat "$pidfile")
        if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then
            kill -KILL "$pid" 2>/dev/null || true
            wait "$pid" 2>/dev/null || true  # when this shell started it (a failed up)
        fi
    done
    rm -f "$STATE"/n*.pid
    for node in $(cat "$STATE/nodes" 2>/dev/null); do
        ip link del "$(hostveth "$node")" 2>/dev/null || true
        ns=$(netns "$node")
        ip netns del "$ns" 2>/dev/null || true
    done
    ip link del "$BRIDGE" 2>/dev/null || true
    rm -rf "$STATE"
}

up() {
    local n=4 rate= i node addr ns hours slurm=
    declare -A rate_of=()
    while [[ $# -gt 0 ]]; do
        case $1 in
            --slurm) slurm=1; shift ;;
            --rate) rate=$2; shift 2 ;;
            --rate-of) rate_of[${2%%=*}]=${2#*=}; shift 2 ;;
            [0-9]*) n=$1; shift ;;
            *) die "up: unknown argument '$1' (up [N] [--rate R] [--rate-of nI=R] [--slurm])" ;;
        esac
    done
    (( n >= 1 && n <= 250 )) || die "up: N must be 1..250, not $n"
    [[ $(id -u) == 0 ]] || die "up: needs root"
    [[ -e "$STATE/nodes" ]] && die "up: a cluster is up already ($STATE): bash $0 down first"
    ip route | grep -q "^$SUBNET\." && die "up: $SUBNET.0/24 is routed on this host already (CLUSTER_SUBNET)"

    trap 'code=$?; if (( code != 0 )); then say "up failed: removing what was made"; down; fi' EXIT
    mkdir -p "$STATE"
    : > "$STATE/nodes"
    printf 'BRIDGE=%q\nPREFIX=%q\nSUBNET=%q\n' "$BRIDGE" "$PREFIX" "$SUBNET" > "$STATE/config"
    {
        echo "127.0.0.1 localhost"
        echo "$SUBNET.254 cluster-host"
        for (( i = 1; i <= n; i++ )); do echo "$SUBNET.$i n$i"; done
    } > "$STATE/hosts"
    write_enter

    ip link add "$BRIDGE" type bridge
    ip addr add "$SUBNET.254/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    for (( i = 1; i <= n; i++ )); do
        node=n$i addr=$SUBNET.$i ns=$(netns "n$i") hours=$(( i * HOURS ))
        echo "$node" >> "$STATE/nodes"
        ip netns add "$ns"
        ip link add "$(hostveth "$node")" type veth peer name eth0 netns "$ns"
        ip link set "$(hostveth "$node")" master "$BRIDGE" up
        ip netns exec "$ns" ip addr add "$addr/24" dev eth0
        ip netns exec "$ns" ip link set eth0 up
        ip netns exec "$ns" ip link set lo up
        # the holder: PID 1 of the node's PID namespace, with its hostname, /dev/shm and /etc/hosts
        ip netns exec "$ns" unshare --uts --mount --propagation private --ipc --pid --fork --mount-proc \
            --time --monotonic $(( hours * 3600 )) --kill-child \
            sh -c "hostname $node && mount -t tmpfs -o size=$SHM,mode=1777 tmpfs /dev/shm &&
                   mount --bind '$STATE/hosts' /etc/hosts && exec sleep infinity" \
            </dev/null >/dev/null 2>"$STATE/$node.log" &
        echo $! > "$STATE/$node.pid"
        echo "$addr" > "$STATE/$node.addr"
        mkdir -p "$STATE/$node.tmp"
        echo $(( hours * 3600 )) > "$STATE/$node.monotonic"
    done
    for node in $(cat "$STATE/nodes"); do  # each holder has set up its node
        for _ in $(seq 100); do
            [[ "$("$STATE/enter" "$node" hostname 2>/dev/null)" == "$node" ]] && break
            sleep 0.1
        done
        [[ "$("$STATE/enter" "$node" hostname 2>/dev/null)" == "$node" ]] ||
            die "up: node $node did not start: $(cat "$STATE/$node.log")"
        if [[ -n "${rate_of[$node]:-$rate}" ]]; then
            shape_link "$node" "${rate_of[$node]:-$rate}"
        fi
    done
    if [[ -n "$slurm" ]]; then
        slurm_up
    fi
    trap - EXIT
    status
}

# stop_pid PID: SIGTERM, up to 10 s, then SIGKILL
stop_pid() {
    local pid=$1
    [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null || return 0
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
}

# Slurm on the cluster: munged and slurmctld on the host (slurmctld at $SUBNET.254), one slurmd in each
# node's namespaces (NodeName=nI NodeAddr=$SUBNET.I CPUs=$SLURM_CPUS), partition "cluster" of them all;
# the configuration in $STATE/slurm/slurm.conf (export SLURM_CONF=... to use it). munge's socket is a
# file, so the host's munged serves every node. A node's slurmd needs the host's cgroup hierarchies,
# which the node's own /sys (ip netns exec mounts one) lacks: they are mounted there again.
SLURM_CPUS=${CLUSTER_SLURM_CPUS:-4}
# A node whose slurmd has been silent SlurmdTimeout seconds is DOWN, and its jobs end (or requeue): 10 s
# here, so that a node lost whole takes its job down in about 30 s, not Slurm's default 300 s
SLURMD_TIMEOUT=10
# shellcheck source=.ci/slurm-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/slurm-lib.sh"
slurm_up() {
    local t=$STATE/slurm node ports ctld_port slurmd_port nodes
    for tool in munged slurmctld slurmd sinfo; do
        command -v $tool >/dev/null || die "up --slurm: no $tool (apt-get install slurmctld slurmd slurm-client munge)"
    done
    mkdir -p "$t"/state "$t"/spool "$t"/logs
    chmod 755 "$t"
    slurm_munged "$t" || { echo "$MUNGED_PID" > "$t/munged.pid"; die "up --slurm: munged did not start: $(cat "$t/logs/munged.stderr")"; }
    echo "$MUNGED_PID" > "$t/munged.pid"
    ports=$(slurm_ports 0.0.0.0)
    read -r ctld_port slurmd_port <<< "$ports"
    nodes=$(paste -sd, "$STATE/nodes")
    {
        slurm_conf virtual "$(hostname -s)" "$SUBNET.254" "$ctld_port" "$slurmd_port" "$t"
        echo "SlurmdTimeout=$SLURMD_TIMEOUT"
        echo "TmpFS=$t/nodetmp"
        for node in $(cat "$STATE/nodes"); do
            echo "NodeName=$node NodeAddr=$(cat "$STATE/$node.addr") CPUs=$SLURM_CPUS State=UNKNOWN"
        done
        echo "PartitionName=cluster Nodes=$nodes Default=YES MaxTime=INFINITE State=UP"
    } > "$t/slurm.conf"
    slurmctld -D -f "$t/slurm.conf" 2>"$t/logs/slurmctld.stderr" </dev/null &
    echo $! > "$t/slurmctld.pid"
    # the host's cgroup mounts, to make again in each node
    awk '$2 == "/sys/fs/cgroup" && $3 == "tmpfs" { print "mount -t tmpfs -o mode=755 cgroup /sys/fs/cgroup" }
         $2 ~ "^/sys/fs/cgroup/" && ($3 == "cgroup" || $3 == "cgroup2") {
             print "mkdir -p " $2 " && mount -t " $3 " -o " $4 " cgroup " $2 }' /proc/self/mounts > "$t/cgroups.sh"
    # TmpFS, a node's own: srun --mpi=pmix makes its step's directory there under a name of the job's, and in
    # the /tmp that the nodes share the second node's slurmstepd found the first's ("File exists")
    mkdir -p "$t/nodetmp"
    for node in $(cat "$STATE/nodes"); do
        "$STATE/enter" "$node" "sh $t/cgroups.sh && mount --bind $STATE/$node.tmp $t/nodetmp" ||
            die "up --slurm: cannot mount cgroups or TmpFS in $node"
        start_slurmd "$node"
    done
    echo "export SLURM_CONF=$t/slurm.conf" > "$STATE/slurm.env"
    for _ in $(seq 60); do
        [[ "$(SLURM_CONF=$t/slurm.conf sinfo -h -o %t 2>/dev/null | sort -u)" == idle ]] && return 0
        sleep 0.5
    done
    die "up --slurm: the nodes did not come up: $(SLURM_CONF=$t/slurm.conf sinfo 2>&1; tail -n 3 "$t"/logs/*.stderr)"
}

# start_slurmd NODE: NODE's slurmd, in its namespaces (again, after the node lost it); its PID on the host in
# $STATE/slurm/slurmd-NODE.pid
start_slurmd() {
    local t=$STATE/slurm node=$1 nsenter_pid nsenter= pid=
    mkdir -p "$t/spool/$node"
    SLURM_CONF=$t/slurm.conf "$STATE/enter" "$node" "exec slurmd -D -N $node -f $t/slurm.conf" \
        >/dev/null 2>>"$t/logs/slurmd-$node.stderr" </dev/null &
    nsenter_pid=$!
    for _ in $(seq 50); do  # enter's nsenter forks slurmd into the node's PID namespace: its PID on the host
        nsenter=$(pgrep -P "$nsenter_pid" -x nsenter | head -n 1 || true)
        [[ -n "$nsenter" ]] && pid=$(pgrep -P "$nsenter" | head -n 1 || true)
        [[ -n "$pid" ]] && break
        sleep 0.1
    done
    [[ -n "$pid" ]] || die "slurmd did not start in $node: $(cat "$t/logs/slurmd-$node.stderr")"
    echo "$pid" > "$t/slurmd-$node.pid"
}

# every job cancelled (slurmd's steps outlive it), then slurmd, slurmctld and munged, each by its PID
slurm_down() {
    local t=$STATE/slurm jobs node pid
    [[ -d "$t" ]] || return 0
    if [[ -e "$t/slurm.conf" ]] && SLURM_CONF=$t/slurm.conf squeue -h >/dev/null 2>&1; then
        jobs=$(SLURM_CONF=$t/slurm.conf squeue -h -o %A | sort -u)
        if [[ -n "$jobs" ]]; then
            SLURM_CONF=$t/slurm.conf scancel $jobs || true
            for _ in $(seq 30); do [[ -z "$(SLURM_CONF=$t/slurm.conf squeue -h -o %A)" ]] && break; sleep 1; done
        fi
    fi
    local stoppers=()
    for node in $(cat "$STATE/nodes" 2>/dev/null); do  # all at once: each takes seconds to stop
        stop_pid "$(cat "$t/slurmd-$node.pid" 2>/dev/null)" &
        stoppers+=($!)
    done
    for pid in ${stoppers[@]+"${stoppers[@]}"}; do wait "$pid" || true; done
    stop_pid "$(cat "$t/slurmctld.pid" 2>/dev/null)" &
    pid=$!
    stop_pid "$(cat "$t/munged.pid" 2>/dev/null)"
    wait "$pid" || true
}

# the launcher that enters a node: $STATE/enter [ssh options] HOST CMD...
write_enter() {
    cat > "$STATE/enter" <<EOF
#!/usr/bin/env bash
# enter [-x] [ssh options] HOST CMD...: run CMD (joined, by sh -c, as ssh does) in HOST's namespaces,
# in the caller's working directory. HOST is a node name (n1..) or its address.
set -euo pipefail
STATE=$STATE
EOF
    cat >> "$STATE/enter" <<'EOF'
while [[ $# -gt 0 && "$1" == -* ]]; do
    case $1 in
        -[bcDEeFIiJLlmOopQRSWw]) shift 2 ;;  # ssh options with an argument
        *) shift ;;
    esac
done
[[ $# -ge 1 ]] || { echo "usage: enter [-x] HOST CMD..." >&2; exit 2; }
host=$1
shift
if [[ ! -e "$STATE/$host.pid" ]]; then  # an address, or a name with a domain
    for f in "$STATE"/n*.addr; do
        [[ "$(cat "$f")" == "$host" ]] && host=$(basename "$f" .addr)
    done
    host=${host%%.*}
fi
[[ -e "$STATE/$host.pid" ]] || { echo "enter: no node $host in $STATE" >&2; exit 255; }
holder=$(cat "$STATE/$host.pid")
init=$(cat "/proc/$holder/task/$holder/children" 2>/dev/null | awk '{print $1}')
[[ -n "$init" ]] || { echo "enter: node $host is down" >&2; exit 255; }
[[ $# -gt 0 ]] || set -- "${SHELL:-/bin/sh}"
# a node's own temporary directory: Open MPI's daemons name theirs by PID, and PIDs repeat between nodes
export TMPDIR=$STATE/$host.tmp
# Not exec: when the node's processes are killed (the launcher's daemon among them), Hydra's mpiexec sees
# its daemon's socket close and ends the job at once, exit 255, naming no host and no rank, and no rank
# can speak: this says which node. It writes to the launcher's own stderr (opened anew, appending), not
# to the pipe the launcher gave it: mpiexec exits without reading that pipe to its end. A daemon killed
# by SIGKILL was killed on its node (by hand, the OOM killer, the node's end): a job ends its daemons
# otherwise (they exit with a code), and an orderly stop sends SIGTERM first.
exec {say}>&2
if ( exec 3>>"/proc/$PPID/fd/2" ) 2>/dev/null; then
    exec {say}>>"/proc/$PPID/fd/2"
fi
nsenter --target "$init" --net --uts --mount --ipc --pid --time --wd="$PWD" -- /bin/sh -c "$*" <&0 &
child=$!
passed=
trap 'passed=1; kill -TERM $child 2>/dev/null' TERM
trap 'passed=1; kill -INT $child 2>/dev/null' INT
trap 'passed=1; kill -HUP $child 2>/dev/null' HUP
while :; do
    code=0
    wait "$child" 2>/dev/null || code=$?  # (bash's own "Killed" notice left out)
    kill -0 "$child" 2>/dev/null || break  # else wait was cut short by a trapped signal
done
if (( code == 128 + 9 )) && [[ -z "$passed" ]]; then
    cmd="$*"
    cmd=${cmd%% *}
    cmd=${cmd//[\"\']/}
    echo "enter: node $host lost: ${cmd##*/} killed there (SIGKILL); every process the launcher started on $host is gone" >&"$say"
fi
exit "$code"
EOF
    chmod 755 "$STATE/enter"
}

status() {
    local node holder
    [[ -e "$STATE/nodes" ]] || { say "no cluster up ($STATE)"; return 0; }
    for node in $(cat "$STATE/nodes"); do
        holder=$(cat "$STATE/$node.pid")
        echo "$node $(cat "$STATE/$node.addr") holder $holder monotonic +$(cat "$STATE/$node.monotonic") s" \
            "link $(cat "$STATE/$node.rate" 2>/dev/null || echo unshaped)" \
            "$(kill -0 "$holder" 2>/dev/null && echo up || echo DOWN)"
    done
    echo "enter: $STATE/enter  bridge: $BRIDGE $SUBNET.254/24"
    if [[ -e "$STATE/slurm.env" ]]; then
        echo "slurm: $(cat "$STATE/slurm.env")"
    fi
}

cmd=${1:-}
shift || true
case $cmd in
    up) up "$@" ;;
    down) down ;;
    status) status ;;
    shape) [[ $# == 2 ]] || die "shape NODE RATE"; shape_link "$1" "$2" ;;
    link) [[ $# == 2 ]] || die "link NODE up|down"; set_link "$1" "$2" ;;
    slurmd) [[ $# == 1 && -e "$STATE/slurm/slurm.conf" ]] || die "slurmd NODE (with Slurm up)"; start_slurmd "$1" ;;
    shm) [[ $# == 2 ]] || die "shm NODE SIZE"; "$STATE/enter" "$1" mount -o remount,size="$2" /dev/shm ;;
    *) die "usage: $0 up [N] [--rate R] [--rate-of nI=R] | down | status | shape NODE RATE | link NODE up|down | slurmd NODE | shm NODE SIZE" ;;
esac
