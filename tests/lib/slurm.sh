# A real Slurm cluster on this machine for tests: Debian's slurmctld and one slurmd per node,
# each node a network + UTS + mount namespace with its own hostname and address.
# Source this file, set an EXIT trap that calls slurm_down, then call
#   slurm_up N            (N = 1..8 nodes)
# which sets TDS_NODES (array of node names = their hostnames), TDS_CTL (the controller's name),
# TDS_STATE (this cluster's directory: slurm.conf, logs, jobcomp.log, spool) and returns once
# every node is idle. Run client commands (srun, sbatch, squeue, scontrol, ...) with
#   slurm_exec CMD ARGS...
# on the "login node" (the controller's namespaces, SLURM_CONF set). It exits 77 (skip) with the
# reason when not root, when the packages cannot be installed or a daemon cannot be started, and
# returns 1 with sinfo and the log tails when the nodes do not come up. slurm_down is idempotent.
# Helpers: slurm_wait SECS WHAT CMD... (poll until CMD succeeds), slurm_logs [LINES] (log tails),
# slurm_node_exec I CMD... (CMD in node I's namespaces, as its jobs see the machine).
# TDS_HIDE_DIRS (space-separated absolute paths of existing directories, set before slurm_up)
# hides them from the nodes: each node's slurmd, and so every job task, sees an empty tmpfs
# (1777) of its own over each, while the login node (slurm_exec) sees the real directories: no
# shared file system for those paths, and what a job writes there stays on its node. Unset or
# empty: nothing is hidden; an entry that is not a directory, or that would hide the state
# directory, makes slurm_up return 1 before it starts anything.
# docs/executors.md explains the layout and the obstacles each step answers.
#
# Nothing outside this cluster's namespaces is touched but its state directory, its cgroup
# directories (slurm_<node>) and the packages: the network (bridge, veths, 10.80.0.0/24) lives
# inside the controller's namespace, names resolve through a private /etc/hosts bind-mounted in
# each namespace, and munged runs privately on a socket in the state directory. Namespaces, node
# names and the state directory carry the test's pid (tds-<pid>-ctl, tds<pid>n1,
# /tmp/tandem-slurm-<pid>), so concurrent tests cannot collide, and leftovers of a killed
# earlier run (SIGKILL skips the trap) are recognised and removed first. One cluster per test
# process ($$, also in subshells): a second slurm_up replaces the first.

TDS_NET=10.80.0 # only inside the cluster's namespaces; distinct from netns.sh users' anyway

# _tds_ns NS HOST CMD...: runs CMD in network namespace NS, in a new UTS namespace (hostname
# HOST) and a new private mount namespace with this cluster's /etc/hosts, a sysfs of NS (so
# /sys/class/net shows eth0 and lo, like a real node) with the host's cgroup tree carried over
# (mounting sysfs hides /sys/fs/cgroup, and slurmd needs it), and a private /dev/shm. Over
# every directory in _TDS_HIDE (slurm_up sets it for the nodes only), an empty tmpfs of this
# namespace's own.
# `ip netns exec` is not used: it remounts /sys without the cgroup tree and slurmd then dies.
_tds_ns() {
    local ns=$1 host=$2
    shift 2
    nsenter --net="/run/netns/$ns" unshare --uts --mount --propagation private sh -c '
        set -e; host=$1 st=$2 hide=$3; shift 3
        hostname "$host"
        mount --bind "$st/hosts" /etc/hosts
        mkdir -p "$st/cg/$host"; mount --rbind /sys/fs/cgroup "$st/cg/$host"
        mount -t sysfs sysfs /sys; mount --move "$st/cg/$host" /sys/fs/cgroup
        mount -t tmpfs -o size=256m,mode=1777 tmpfs /dev/shm
        for d in $hide; do mount -t tmpfs -o mode=1777 tmpfs "$d"; done
        exec "$@"' sh "$host" "$TDS_STATE" "${_TDS_HIDE:-}" "$@"
}

slurm_exec() { _tds_ns "tds-$$-ctl" "$TDS_CTL" env SLURM_CONF="$TDS_STATE/slurm.conf" "$@"; }

# slurm_node_exec I CMD...: runs CMD in node I's namespaces (net, UTS, mount: its hidden
# directories, /dev/shm, hostname), in the caller's directory where the node sees it, else /.
slurm_node_exec() {
    local i=$1 pid
    shift
    pid=$(cat "${TDS_STATE:-/nonexistent}/slurmd-${TDS_NODES[i - 1]:-}.pid" 2>/dev/null) &&
        [ -n "$pid" ] || { echo "slurm_node_exec: no node $i" >&2; return 1; }
    nsenter -t "$pid" -n -u -m -- sh -c 'cd "$1" 2>/dev/null || cd /; shift; exec "$@"' sh "$PWD" "$@"
}

# slurm_wait SECS WHAT CMD...: polls CMD every 0.2 s; returns 1 after SECS.
slurm_wait() {
    local t=$(($1 * 5)) what=$2
    shift 2
    while ! "$@" >/dev/null 2>&1; do
        t=$((t - 1))
        [ $t -gt 0 ] || { echo "slurm: timed out waiting for $what" >&2; return 1; }
        sleep 0.2
    done
}

# The last lines of every daemon's log (and of what it wrote before daemonizing, start-*.log),
# for a failing test's report.
slurm_logs() { tail -n "${1:-20}" "$TDS_STATE"/log/*.log >&2 2>/dev/null; }
_tds_skip() { echo "SKIP: $*"; slurm_logs 20; slurm_down; exit 77; }

# Kills everything in the namespaces of cluster PID (daemons, munged, slurmstepds, job tasks),
# deletes them (the veths go with them), and removes its cgroup directories and state.
_tds_teardown() {
    local p=$1 ns d pids=''
    for ns in $(ip netns list 2>/dev/null | sed -n "s/^\(tds-$p-[a-z0-9]*\).*/\1/p"); do
        pids="$pids $(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')"
    done
    # A SIGKILLed task frozen by proctrack/cgroup dies only once thawed.
    for d in /sys/fs/cgroup/freezer/slurm_tds"$p"n*; do
        [ -d "$d" ] && find "$d" -name freezer.state -exec sh -c 'echo THAWED >"$1"' sh {} \; 2>/dev/null
    done
    # shellcheck disable=SC2086
    [ -n "${pids// /}" ] && kill -9 $pids 2>/dev/null
    for ns in $(ip netns list 2>/dev/null | sed -n "s/^\(tds-$p-[a-z0-9]*\).*/\1/p"); do
        slurm_wait 5 "the processes of $ns to exit" sh -c "[ -z \"\$(ip netns pids $ns)\" ]"
        ip netns del "$ns"
    done
    find /sys/fs/cgroup -maxdepth 3 -type d -name "slurm_tds${p}n*" 2>/dev/null |
        while read -r d; do find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null; done
    rm -rf "${TMPDIR:-/tmp}/tandem-slurm-$p"
}

slurm_down() {
    [ -n "${TDS_STATE:-}" ] || return 0
    _tds_teardown $$
    TDS_STATE=
}

_tds_idle() { [ "$(slurm_exec sinfo -h -N -o %t | grep -c '^idle$')" = "$1" ]; }

slurm_up() {
    local n=${1:-2} i p d node ip pt hw missing=() hide=''
    case $n in [1-8]) ;; *) echo "slurm_up: 1..8 nodes, not '$n'" >&2; return 1 ;; esac
    for p in ${TDS_HIDE_DIRS:-}; do
        d=$(realpath -e "$p" 2>/dev/null) && [ "${p#/}" != "$p" ] && [ -d "$d" ] ||
            { echo "slurm_up: TDS_HIDE_DIRS: '$p' is not the absolute path of a directory" >&2; return 1; }
        case ${TMPDIR:-/tmp}/tandem-slurm-$$/ in "$d"/* | "$d"//*)
            echo "slurm_up: TDS_HIDE_DIRS: $d would hide the cluster's state directory" >&2; return 1 ;;
        esac
        hide="$hide $d"
    done
    [ "$(id -u)" = 0 ] || { echo "SKIP: the Slurm fixture needs root (namespaces, daemons)"; exit 77; }
    ip netns list >/dev/null 2>&1 && command -v nsenter >/dev/null && command -v unshare >/dev/null ||
        { echo "SKIP: ip netns, nsenter or unshare is unavailable"; exit 77; }
    for p in slurmctld:slurmctld slurmd:slurmd sbatch:slurm-client munged:munge; do
        command -v "${p%%:*}" >/dev/null || missing+=("${p#*:}")
    done
    if ((${#missing[@]})); then # scripts/deps.sh installs them; this is for a tree that predates it
        echo "slurm: installing ${missing[*]}" >&2
        DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y -q --no-install-recommends \
            "${missing[@]}" >/dev/null 2>&1 || { echo "SKIP: cannot install ${missing[*]}"; exit 77; }
    fi
    for p in $(ip netns list | sed -n 's/^tds-\([0-9]*\)-.*/\1/p' | sort -u) \
        $(ls "${TMPDIR:-/tmp}" | sed -n 's/^tandem-slurm-\([0-9][0-9]*\)$/\1/p'); do
        [ "$p" = $$ ] || ! kill -0 "$p" 2>/dev/null && _tds_teardown "$p" # leftovers
    done

    TDS_STATE=${TMPDIR:-/tmp}/tandem-slurm-$$ TDS_CTL=tds$$ctl TDS_NODES=()
    # 755: munged refuses a socket whose directories others cannot search.
    mkdir -m 755 "$TDS_STATE" && mkdir "$TDS_STATE"/{log,ctld,spool,cg} ||
        { echo "slurm_up: cannot create $TDS_STATE" >&2; return 1; }
    for i in $(seq 1 "$n"); do TDS_NODES+=("tds$$n$i"); done

    # Network: the bridge lives in the controller's namespace, which is also the login node;
    # clients run there, so slurmstepd can reach srun's ports. Nothing in the root namespace.
    local ctl=tds-$$-ctl
    ip netns add "$ctl" && ip -n "$ctl" link set lo up &&
        ip -n "$ctl" link add br0 type bridge && ip -n "$ctl" addr add "$TDS_NET.1/24" dev br0 &&
        ip -n "$ctl" link set br0 up || _tds_skip "cannot create a network namespace with a bridge"
    printf '127.0.0.1 localhost\n%s %s\n' "$TDS_NET.1" "$TDS_CTL" >"$TDS_STATE/hosts"
    for i in $(seq 1 "$n"); do
        node=${TDS_NODES[i - 1]} ip=$TDS_NET.$((10 + i))
        ip netns add "tds-$$-n$i" &&
            ip -n "$ctl" link add "v$i" type veth peer name eth0 netns "tds-$$-n$i" &&
            ip -n "$ctl" link set "v$i" master br0 up &&
            ip -n "tds-$$-n$i" addr add "$ip/24" dev eth0 &&
            ip -n "tds-$$-n$i" link set eth0 up && ip -n "tds-$$-n$i" link set lo up ||
            _tds_skip "cannot wire node $node into the bridge"
        echo "$ip $node" >>"$TDS_STATE/hosts"
    done

    # munged of our own (key, socket, logs in the state dir), in the controller's namespace so
    # that teardown finds it with the rest; Slurm is pointed at its socket with AuthInfo.
    head -c 1024 /dev/urandom >"$TDS_STATE/munge.key" && chmod 400 "$TDS_STATE/munge.key"
    _tds_ns "$ctl" "$TDS_CTL" munged -S "$TDS_STATE/munge.sock" --key-file="$TDS_STATE/munge.key" \
        --pid-file="$TDS_STATE/munged.pid" --log-file="$TDS_STATE/log/munged.log" \
        --seed-file="$TDS_STATE/munged.seed" </dev/null >"$TDS_STATE/log/start-munged.log" 2>&1 &&
        slurm_wait 10 munged sh -c "munge -S '$TDS_STATE/munge.sock' -n | unmunge -S '$TDS_STATE/munge.sock'" ||
        _tds_skip "munged did not start"

    # proctrack/cgroup kills everything a task started when its step ends (linuxproc loses
    # orphaned background children); it needs the cgroup v1 freezer, else linuxproc.
    pt=linuxproc
    [ -d /sys/fs/cgroup/freezer ] && pt=cgroup
    printf 'CgroupPlugin=autodetect\nIgnoreSystemd=yes\n' >"$TDS_STATE/cgroup.conf"
    cat >"$TDS_STATE/slurm.conf" <<EOF
ClusterName=tandem
SlurmctldHost=$TDS_CTL($TDS_NET.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire is also how long a requeued job waits before it may run again (default 120 s).
AuthInfo=socket=$TDS_STATE/munge.sock,cred_expire=10
ProctrackType=proctrack/$pt
TaskPlugin=task/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
# No slurmdbd, so no sacct: one line per finished (or requeued) job here.
JobCompType=jobcomp/filetxt
JobCompLoc=$TDS_STATE/jobcomp.log
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerParameters=sched_interval=2
# The nodes share this machine: what is configured here wins over what slurmd detects.
SlurmdParameters=config_overrides
ReturnToService=2
StateSaveLocation=$TDS_STATE/ctld
SlurmctldPidFile=$TDS_STATE/slurmctld.pid
SlurmctldLogFile=$TDS_STATE/log/slurmctld.log
SlurmdSpoolDir=$TDS_STATE/spool/%n
SlurmdPidFile=$TDS_STATE/slurmd-%n.pid
SlurmdLogFile=$TDS_STATE/log/slurmd-%n.log
InactiveLimit=0
KillWait=5
MinJobAge=300
MessageTimeout=10
PartitionName=tandem Nodes=tds$$n[1-$n] Default=YES MaxTime=INFINITE State=UP
EOF
    # Every node claims this machine's topology (slurmd -C), with 1000 MB of memory.
    hw=$(timeout 20 slurmd -C 2>/dev/null | grep -o 'CPUs=.*ThreadsPerCore=[0-9]*') || hw=CPUs=$(nproc)
    for i in $(seq 1 "$n"); do
        echo "NodeName=${TDS_NODES[i - 1]} NodeHostname=${TDS_NODES[i - 1]}" \
            "NodeAddr=$TDS_NET.$((10 + i)) $hw RealMemory=1000 State=UNKNOWN"
    done >>"$TDS_STATE/slurm.conf"

    # slurmctld checks that its hostname is SlurmctldHost: the UTS namespace gives it one.
    _tds_ns "$ctl" "$TDS_CTL" slurmctld -c -f "$TDS_STATE/slurm.conf" </dev/null \
        >"$TDS_STATE/log/start-slurmctld.log" 2>&1 &&
        slurm_wait 30 "slurmctld to answer" slurm_exec scontrol ping ||
        _tds_skip "slurmctld did not start"
    # One slurmd per node, its hostname = its NodeName (tasks' `hostname` differs per node).
    for i in $(seq 1 "$n"); do
        node=${TDS_NODES[i - 1]}
        mkdir -p "$TDS_STATE/spool/$node"
        _TDS_HIDE=$hide _tds_ns "tds-$$-n$i" "$node" slurmd -f "$TDS_STATE/slurm.conf" </dev/null \
            >"$TDS_STATE/log/start-$node.log" 2>&1 &&
            slurm_wait 10 "slurmd on $node" test -s "$TDS_STATE/slurmd-$node.pid" ||
            _tds_skip "slurmd on $node did not start"
    done
    slurm_wait 60 "$n idle nodes" _tds_idle "$n" || {
        echo "slurm_up: the nodes did not become idle within 60 s:" >&2
        slurm_exec sinfo -N -o '%N %t %E' >&2
        slurm_logs
        return 1
    }
}
