# ssh hosts on this machine for tests: one unmodified OpenSSH sshd per host, each host a network
# + UTS + mount + PID namespace with its own hostname, address, /run, /dev/shm and (empty) root
# home, joined on a bridge with a "login" namespace where the clients run.
# Source this file, set an EXIT trap that calls sshd_down, then call
#   sshd_up N [HIDE_DIR...]     (N = 0..8 hosts; sshd_add_host, at the end, adds more later)
# which sets TSH_HOSTS (array of host names = their hostnames, tdh<pid>n1 ...), TSH_ADDRS (their
# addresses), TSH_PIDS (each host's sshd = its PID 1, as the root namespace numbers it),
# TSH_LOGIN (the login namespace's hostname), and exports TSH_STATE (this fixture's directory:
# keys, configs, logs) and TSH_SSH_CONFIG ($TSH_STATE/ssh_config); it returns once every sshd
# answers `ssh HOST true` from the login namespace. Every HIDE_DIR is covered by an empty tmpfs
# on every host (not in the login namespace), so that what a test writes there is invisible over
# ssh: no shared file system for those paths; everything else (/usr, /tmp, the build tree, the
# dataset) is the same file system everywhere, like identical machine images. Run clients with
#   sshd_exec CMD ARGS...       (in the login namespace; cwd and environment kept)
# where plain `ssh HOST CMD` works (the fixture's ssh_config is /etc/ssh/ssh_config there and on
# every host), and commands on host I with
#   sshd_host_exec I CMD ARGS... (in host I's namespaces: `pkill` there sees only its processes)
# sshd_logs [LINES] prints the sshd logs' tails, sshd_wait SECS WHAT CMD... polls CMD, and
# sshd_down is idempotent. sshd_up exits 77 (skip) with the reason when not root, when
# openssh-server/-client are missing and apt-get cannot install them, or when the namespaces
# cannot be made; it returns 1 with the logs when an sshd exits at start or the hosts do not all
# answer within 20 s. Over ssh, a command runs as root in bash -c, in /root (an empty tmpfs per
# host), with sshd's PATH (/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin) and none
# of the client's environment. docs/executors.md explains the layout and the obstacles.
#
# Nothing outside this fixture's namespaces is touched but its state directory: the network
# (bridge, veths, 10.81.0.0/24) lives in the login namespace, names resolve through a private
# /etc/hosts bind-mounted in each namespace, and /run/sshd exists only in each host's private
# /run.
# Namespaces, host names and the state directory carry the test's pid (tsh-<pid>-h1,
# tdh<pid>n1, /tmp/tandem-ssh-<pid>), so concurrent tests cannot collide, and leftovers of a
# killed earlier run (SIGKILL skips the trap) are recognised and removed first. One fixture per
# test process ($$, also in subshells): a second sshd_up replaces the first.

TSH_NET=10.81.0 # only inside the fixture's namespaces; distinct from the other fixtures' anyway

_tsh_home() { getent passwd root | cut -d: -f6; }

# The mounts every namespace of the fixture gets (sh code, run as root in a fresh mount
# namespace with $st and $host set): the hostname, the private /etc/hosts and ssh client
# config, and a sysfs of the namespace's own network (/sys/class/net shows eth0 and lo) with
# the machine's cgroup tree carried over (mounting sysfs hides /sys/fs/cgroup).
_TSH_COMMON='
    hostname "$host"
    mount --bind "$st/hosts" /etc/hosts
    [ ! -e /etc/ssh/ssh_config ] || mount --bind "$st/ssh_config" /etc/ssh/ssh_config
    if [ -d /sys/fs/cgroup ]; then
        mkdir -p "$st/cg/$host"; mount --rbind /sys/fs/cgroup "$st/cg/$host"
        mount -t sysfs sysfs /sys; mount --move "$st/cg/$host" /sys/fs/cgroup
    else
        mount -t sysfs sysfs /sys
    fi'

# The ssh client options of the fixture's hosts (after a Host line), for ssh_config.
_tsh_client_options() {
    local st=$1
    cat <<EOF
    User root
    Port 22
    IdentityFile $st/id_ed25519
    IdentitiesOnly yes
    IdentityAgent none
    UserKnownHostsFile $st/known_hosts
    GlobalKnownHostsFile /dev/null
    StrictHostKeyChecking yes
    CheckHostIP no
    UpdateHostKeys no
    BatchMode yes
    LogLevel ERROR
    ConnectTimeout 10
EOF
}

# What a host's namespaces run (sh -c, as PID 1 of its PID namespace, args: state dir, host
# name, root's home, host number, HIDE_DIRs): private /dev/shm, /run, home and hidden dirs, then
# its sshd.
_TSH_HOST='
            set -e; st=$1 host=$2 home=$3 i=$4; shift 4'"$_TSH_COMMON"'
            mount -t tmpfs -o mode=1777 tmpfs /dev/shm
            mount -t tmpfs -o mode=755 tmpfs /run
            mkdir -m 755 /run/sshd; mkdir -m 1777 /run/lock; ln -s /dev/shm /run/shm
            mount -t tmpfs -o mode=700 tmpfs "$home"
            for d; do [ ! -d "$d" ] || mount -t tmpfs -o mode=755 tmpfs "$d"; done
            cd /
            exec /usr/sbin/sshd -D -f "$st/h$i/sshd_config" -E "$st/log/sshd-$host.log"'

# The sshd_config of host I (args: state dir, I, host name, address, fixture pid).
_tsh_sshd_config() {
    local st=$1 i=$2 host=$3 ip=$4 p=$5
    cat <<EOF
# tests/lib/sshd.sh, fixture $p, host $host: sshd -D -f this; nothing of /etc/ssh is read.
ListenAddress $ip
Port 22
HostKey $st/h$i/ssh_host_ed25519_key
PidFile $st/h$i/sshd.pid
AuthorizedKeysFile $st/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitEmptyPasswords no
UsePAM no
# The state dir is under /tmp (1777): StrictModes would refuse the authorized_keys there.
StrictModes no
PermitUserEnvironment no
X11Forwarding no
PrintMotd no
PrintLastLog no
UseDNS no
LoginGraceTime 20
# Tests may open many sessions at once (one per launcher, plus kills and copies).
MaxStartups 100:30:200
MaxSessions 100
LogLevel VERBOSE
Subsystem sftp /usr/lib/openssh/sftp-server
EOF
}

# sshd_exec CMD...: runs CMD in the login namespace (net + UTS + mount of its holder process).
sshd_exec() {
    [ -n "${TSH_STATE:-}" ] || { echo "sshd_exec: no fixture (sshd_up first)" >&2; return 1; }
    nsenter -t "$(cat "$TSH_STATE/login.pid")" -n -u -m --wd="$PWD" -- "$@"
}

# sshd_host_exec I CMD...: runs CMD in host I's namespaces (net, UTS, mount, PID), in the
# caller's directory when the host sees it, else in /; environment kept.
sshd_host_exec() {
    local i=$1
    shift
    [ -n "${TSH_STATE:-}" ] && [ -s "$TSH_STATE/h$i/pid" ] ||
        { echo "sshd_host_exec: no host $i" >&2; return 1; }
    nsenter -t "$(cat "$TSH_STATE/h$i/pid")" -n -u -m -p -- \
        sh -c 'cd "$1" 2>/dev/null || cd /; shift; exec "$@"' sh "$PWD" "$@"
}

# sshd_wait SECS WHAT CMD...: polls CMD every 0.1 s; returns 1 after SECS.
sshd_wait() {
    local t=$(($1 * 10)) what=$2
    shift 2
    while ! "$@" >/dev/null 2>&1; do
        t=$((t - 1))
        [ $t -gt 0 ] || { echo "sshd: timed out waiting for $what" >&2; return 1; }
        sleep 0.1
    done
}

# The last lines of every sshd's log (-E) and of what each namespace's setup printed.
sshd_logs() {
    local f
    for f in "${TSH_STATE:-/nonexistent}"/log/*.log; do
        [ -s "$f" ] && { echo "--- $f" && tail -n "${1:-20}" "$f"; } >&2
    done
    return 0
}
_tsh_skip() { echo "SKIP: $*"; sshd_logs 20; sshd_down; exit 77; }
_tsh_fail() { echo "sshd_up: $*" >&2; sshd_logs 20; return 1; }

# Kills everything in the namespaces of fixture PID (sshds, the login holder, ssh sessions and
# whatever they started, clients) and deletes them (the veths go with them), then its state.
# A host's sshd is PID 1 of its PID namespace: its death takes the host's processes with it.
_tsh_teardown() {
    local p=$1 ns nss pids=''
    nss=$(ip netns list 2>/dev/null | sed -n "s/^\(tsh-$p-[a-z0-9]*\).*/\1/p")
    for ns in $nss; do pids="$pids $(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')"; done
    # shellcheck disable=SC2086
    [ -n "${pids// /}" ] && kill -9 $pids 2>/dev/null
    for ns in $nss; do
        sshd_wait 5 "the processes of $ns to exit" sh -c "[ -z \"\$(ip netns pids $ns 2>/dev/null)\" ]"
        ip netns del "$ns" 2>/dev/null
    done
    rm -rf "${TMPDIR:-/tmp}/tandem-ssh-$p" 2>/dev/null
    return 0
}

sshd_down() {
    [ -n "${TSH_STATE:-}" ] || return 0
    _tsh_teardown $$
    TSH_STATE='' TSH_SSH_CONFIG='' TSH_HOSTS=() TSH_ADDRS=() TSH_PIDS=()
}

# sshd_project TAG: the frame of a test of runs on two hosts that do not share the project:
# P (the project, TANDEM_HOME) and REMOTE (the hosts' work directory), both hidden from the
# hosts; an EXIT trap that calls sshd_cleanup_extra (when the test defines it), sshd_down and
# removes both; fail MESSAGE (unless the test defines its own) printing the runs' log tails and
# the sshd logs, then exit 1; two hosts up, named h1 and h2.
sshd_project() {
    P=$(mktemp -d "/tmp/tandem-$1-XXXXXX")
    REMOTE=$(mktemp -d "/tmp/tandem-$1-remote-XXXXXX")
    trap _tsh_project_cleanup EXIT
    declare -F fail >/dev/null || fail() {
        echo "FAIL: $*" >&2
        for f in "$P"/*.log "$P"/.tandem/runs/*/logs/*; do
            [ -f "$f" ] && { echo "--- $f" >&2; tail -25 "$f" >&2; }
        done
        sshd_logs 10
        exit 1
    }
    export TANDEM_HOME=$P
    sshd_up 2 "$P" "$REMOTE" || fail "the ssh hosts did not come up"
    h1=${TSH_HOSTS[0]} h2=${TSH_HOSTS[1]}
}
_tsh_project_cleanup() {
    if declare -F sshd_cleanup_extra >/dev/null; then sshd_cleanup_extra; fi
    sshd_down
    rm -rf "$P" "$REMOTE"
}

# _tsh_bg LOG CMD...: starts CMD detached from this shell's job table (no "Killed" lines when
# teardown kills it), stdin /dev/null, output to LOG; prints its pid.
_tsh_bg() {
    local log=$1
    shift
    ("$@" </dev/null >>"$log" 2>&1 & echo $!)
}

# _tsh_alive PID: it runs and is no zombie (orphans go to PID 1, which may reap them late).
_tsh_alive() { [ -e "/proc/$1" ] && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null; }
_tsh_ssh_all() { # all at once: about 0.25 s per ssh on a busy 2-core machine
    sshd_exec bash -c 'p=(); for h; do ssh -o ConnectTimeout=3 "$h" true </dev/null & p+=($!); done
        for q in "${p[@]}"; do wait "$q" || exit 1; done' bash "$@"
}

sshd_up() {
    local n=${1:-2} i p d st host ip pid home t0 hide=() missing=()
    case $n in [0-8]) ;; *) echo "sshd_up: 0..8 hosts, not '$n'" >&2; return 1 ;; esac
    shift
    [ "$(id -u)" = 0 ] || { echo "SKIP: the ssh fixture needs root (namespaces, sshd)"; exit 77; }
    ip netns list >/dev/null 2>&1 && command -v nsenter >/dev/null && command -v unshare >/dev/null ||
        { echo "SKIP: ip netns, nsenter or unshare is unavailable"; exit 77; }
    [ -x /usr/sbin/sshd ] || missing+=(openssh-server)
    command -v ssh >/dev/null && command -v ssh-keygen >/dev/null || missing+=(openssh-client)
    if ((${#missing[@]})); then
        echo "sshd: installing ${missing[*]}" >&2
        DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y -q --no-install-recommends \
            "${missing[@]}" >/dev/null 2>&1 && [ -x /usr/sbin/sshd ] ||
            { echo "SKIP: cannot install ${missing[*]}"; exit 77; }
    fi
    for p in $(ip netns list | sed -n 's/^tsh-\([0-9]*\)-.*/\1/p' | sort -u) \
        $(ls "${TMPDIR:-/tmp}" | sed -n 's/^tandem-ssh-\([0-9][0-9]*\)$/\1/p'); do
        [ "$p" = $$ ] || ! kill -0 "$p" 2>/dev/null && _tsh_teardown "$p" # leftovers
    done

    st=${TMPDIR:-/tmp}/tandem-ssh-$$ home=$(_tsh_home)
    for p in "$@"; do
        d=$(realpath -e "$p" 2>/dev/null) && [ -d "$d" ] ||
            { echo "sshd_up: HIDE_DIR '$p' is not a directory" >&2; return 1; }
        case $st/ in "$d"/* | "$d"//*) echo "sshd_up: HIDE_DIR $d would hide the state dir $st" >&2; return 1 ;; esac
        hide+=("$d")
    done
    t0=$SECONDS
    export TSH_STATE=$st TSH_SSH_CONFIG=$st/ssh_config
    TSH_LOGIN=tdh$$login TSH_HOSTS=() TSH_ADDRS=() TSH_PIDS=()
    # 755: sshd (StrictModes aside) and the hosts' ssh clients read keys and configs here.
    mkdir -m 755 "$st" && mkdir "$st"/{log,cg,ssh_config.d} ||
        { echo "sshd_up: cannot create $st" >&2; return 1; }
    for d in "${hide[@]}"; do echo "$d"; done >"$st/hide" # for sshd_add_host
    for i in $(seq 1 "$n"); do TSH_HOSTS+=("tdh$$n$i") TSH_ADDRS+=("$TSH_NET.$((10 + i))"); done

    # Keys: one client key (root's on the login namespace and on every host) and an ed25519 host
    # key per host, whose public halves pre-fill known_hosts under the name and the address.
    ssh-keygen -q -t ed25519 -N '' -C "tandem-ssh-fixture-$$" -f "$st/id_ed25519" &&
        cp "$st/id_ed25519.pub" "$st/authorized_keys" || _tsh_skip "ssh-keygen failed"
    : >"$st/known_hosts"
    printf '127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n%s %s\n' \
        "$TSH_NET.1" "$TSH_LOGIN" >"$st/hosts"
    {
        echo "# tests/lib/sshd.sh, fixture $$: ssh -F $st/ssh_config HOST (or plain ssh inside it)"
        echo "# the hosts sshd_add_host adds (one file each, removed with the host):"
        echo "Include $st/ssh_config.d/*.conf"
        for i in $(seq 1 "$n"); do printf 'Host %s\n    HostName %s\n' "${TSH_HOSTS[i - 1]}" "${TSH_ADDRS[i - 1]}"; done
        [ "$n" = 0 ] || echo "Host ${TSH_HOSTS[*]} ${TSH_ADDRS[*]}"
        [ "$n" = 0 ] || _tsh_client_options "$st"
    } >"$st/ssh_config"
    for i in $(seq 1 "$n"); do
        host=${TSH_HOSTS[i - 1]} ip=${TSH_ADDRS[i - 1]}
        mkdir "$st/h$i" &&
            ssh-keygen -q -t ed25519 -N '' -C "$host" -f "$st/h$i/ssh_host_ed25519_key" ||
            _tsh_skip "ssh-keygen failed"
        echo "$host,$ip $(cut -d' ' -f1,2 "$st/h$i/ssh_host_ed25519_key.pub")" >>"$st/known_hosts"
        echo "$ip $host" >>"$st/hosts"
        _tsh_sshd_config "$st" "$i" "$host" "$ip" $$ >"$st/h$i/sshd_config"
    done

    # Network: the bridge lives in the login namespace, where the clients run; each host has
    # one veth into it. Nothing in the root namespace.
    local login=tsh-$$-login
    ip netns add "$login" && ip -n "$login" link set lo up &&
        ip -n "$login" link add br0 type bridge && ip -n "$login" addr add "$TSH_NET.1/24" dev br0 &&
        ip -n "$login" link set br0 up || _tsh_skip "cannot create a network namespace with a bridge"
    for i in $(seq 1 "$n"); do
        ip netns add "tsh-$$-h$i" &&
            ip -n "$login" link add "v$i" type veth peer name eth0 netns "tsh-$$-h$i" &&
            ip -n "$login" link set "v$i" master br0 up &&
            ip -n "tsh-$$-h$i" addr add "${TSH_ADDRS[i - 1]}/24" dev eth0 &&
            ip -n "tsh-$$-h$i" link set eth0 up && ip -n "tsh-$$-h$i" link set lo up ||
            _tsh_skip "cannot wire host ${TSH_HOSTS[i - 1]} into the bridge"
    done

    # The login namespace: a holder process keeps its UTS and mount namespaces for sshd_exec.
    # It is the submitting machine: its file system is the machine's, root's home included.
    pid=$(_tsh_bg "$st/log/setup-login.log" nsenter --net="/run/netns/$login" \
        unshare --uts --mount --propagation private sh -c '
        set -e; st=$1 host=$2'"$_TSH_COMMON"'
        echo ready >"$st/login.ready"
        exec sleep infinity' sh "$st" "$TSH_LOGIN")
    echo "$pid" >"$st/login.pid"
    sshd_wait 10 "the login namespace" test -e "$st/login.ready" ||
        _tsh_skip "cannot set up the login namespace ($(cat "$st/log/setup-login.log"))"

    # The hosts: unshare --fork makes the sh below PID 1 of a new PID namespace (with its own
    # /proc), which execs sshd; sshd -D reaps orphans, and its death ends the host.
    for i in $(seq 1 "$n"); do
        host=${TSH_HOSTS[i - 1]}
        pid=$(_tsh_bg "$st/log/setup-$host.log" nsenter --net="/run/netns/tsh-$$-h$i" \
            unshare --uts --mount --pid --fork --mount-proc --propagation private sh -c \
            "$_TSH_HOST" sh "$st" "$host" "$home" "$i" "${hide[@]}")
        echo "$pid" >"$st/h$i/unshare.pid"
    done
    # Each sshd writes its PidFile once it listens (the number is 1: its own PID namespace's).
    for i in $(seq 1 "$n"); do
        host=${TSH_HOSTS[i - 1]} pid=$(cat "$st/h$i/unshare.pid")
        while :; do
            if [ -s "$st/h$i/sshd.pid" ]; then break; fi
            _tsh_alive "$pid" || _tsh_fail "sshd on $host exited at start" || return 1
            [ $((SECONDS - t0)) -lt 20 ] || _tsh_fail "sshd on $host did not start within 20 s" || return 1
            sleep 0.05
        done
        p=$(cat "/proc/$pid/task/$pid/children" 2>/dev/null) p=${p%% *}
        [ -n "$p" ] ||
            _tsh_fail "cannot find the sshd of $host (child of $pid)" || return 1
        echo "$p" >"$st/h$i/pid"
        TSH_PIDS+=("$p")
    done
    until _tsh_ssh_all "${TSH_HOSTS[@]}" 2>"$st/log/ssh-ready.log"; do
        [ $((SECONDS - t0)) -lt 20 ] || _tsh_fail "the hosts did not all answer ssh within 20 s" || return 1
        sleep 0.1
    done
    rm -f "$st/log/ssh-ready.log"
}

# --- Hosts added to (and removed from) a running fixture: tests/lib/cloud.sh makes one per EC2
# instance. `sshd_up 0` makes the login namespace and the bridge without a host; then
#   sshd_add_host NAME ADDR[/PREFIX] [GATEWAY]
# adds a host like sshd_up's (own sshd, hostname NAME, HIDE_DIRs hidden, root's key), wired into
# the bridge with ADDR/PREFIX (24 by default) and a default route via GATEWAY when given; NAME
# and ADDR go into known_hosts, the fixture's /etc/hosts and $TSH_STATE/ssh_config.d/hI.conf, so
# `ssh NAME` and `ssh ADDR` work like for sshd_up's hosts. It returns once `ssh NAME true`
# answers from the login namespace (1 with the logs after 20 s). Its number I (for
# sshd_host_exec; never reused) is what `sshd_host_index NAME` prints.
#   sshd_remove_host NAME
# kills everything in the host's namespaces, deletes them, and takes NAME out of those files.
# Both work from any process that has TSH_STATE (they read the fixture's pid from its name), and
# concurrently (the files are updated under a lock). TSH_HOSTS/TSH_ADDRS/TSH_PIDS list sshd_up's
# hosts only. The fixture's /etc/hosts is bind-mounted into every namespace, so it is rewritten
# in place: a removed host's line becomes a comment of the same length.

_tsh_fixture_pid() { local b=${TSH_STATE##*/}; echo "${b#tandem-ssh-}"; }

# sshd_host_index NAME: prints the number of the (present) host NAME.
sshd_host_index() {
    local f
    for f in "${TSH_STATE:-/nonexistent}"/h*/name; do
        [ -e "$f" ] && [ "$(cat "$f")" = "$1" ] && { f=${f%/name}; echo "${f##*/h}"; return 0; }
    done
    echo "sshd: no host $1" >&2
    return 1
}

sshd_add_host() {
    local name=${1:-} addr=${2:-} gw=${3:-} st=${TSH_STATE:-} p i ip pfx ns home pid sshd t0=$SECONDS
    local hide=()
    [ -n "$st" ] && [ -s "$st/login.pid" ] || { echo "sshd_add_host: no fixture (sshd_up first)" >&2; return 1; }
    [[ $name =~ ^[A-Za-z0-9][A-Za-z0-9-]{0,62}$ ]] || { echo "sshd_add_host: bad host name '$name'" >&2; return 1; }
    ip=${addr%/*} pfx=24
    [ "$ip" = "$addr" ] || pfx=${addr#*/}
    [[ $ip =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ && $pfx =~ ^[0-9]+$ ]] ||
        { echo "sshd_add_host: bad address '$addr'" >&2; return 1; }
    sshd_host_index "$name" >/dev/null 2>&1 && { echo "sshd_add_host: $name exists" >&2; return 1; }
    p=$(_tsh_fixture_pid) home=$(_tsh_home) ns=
    [ -s "$st/hide" ] && mapfile -t hide <"$st/hide"
    i=1
    until mkdir "$st/h$i" 2>/dev/null; do i=$((i + 1)); done # atomic: concurrent adds differ
    ns=tsh-$p-h$i
    echo "$name" >"$st/h$i/name.new"
    ssh-keygen -q -t ed25519 -N '' -C "$name" -f "$st/h$i/ssh_host_ed25519_key" ||
        { echo "sshd_add_host: ssh-keygen failed" >&2; return 1; }
    _tsh_sshd_config "$st" "$i" "$name" "$ip" "$p" >"$st/h$i/sshd_config"
    {
        flock 9
        echo "$name,$ip $(cut -d' ' -f1,2 "$st/h$i/ssh_host_ed25519_key.pub")" >>"$st/known_hosts"
        echo "$ip $name" >>"$st/hosts"
        { printf 'Host %s %s\n    HostName %s\n' "$name" "$ip" "$ip" && _tsh_client_options "$st"; } \
            >"$st/ssh_config.d/h$i.conf.tmp" && mv "$st/ssh_config.d/h$i.conf.tmp" "$st/ssh_config.d/h$i.conf"
        mv "$st/h$i/name.new" "$st/h$i/name"
    } 9>>"$st/lock"
    ip netns add "$ns" &&
        ip -n "tsh-$p-login" link add "v$i" type veth peer name eth0 netns "$ns" &&
        ip -n "tsh-$p-login" link set "v$i" master br0 up &&
        ip -n "$ns" addr add "$ip/$pfx" dev eth0 && ip -n "$ns" link set eth0 up &&
        ip -n "$ns" link set lo up && { [ -z "$gw" ] || ip -n "$ns" route add default via "$gw"; } ||
        { echo "sshd_add_host: cannot wire $name ($ip/$pfx) into the bridge" >&2; return 1; }
    pid=$(_tsh_bg "$st/log/setup-$name.log" nsenter --net="/run/netns/$ns" \
        unshare --uts --mount --pid --fork --mount-proc --propagation private sh -c \
        "$_TSH_HOST" sh "$st" "$name" "$home" "$i" "${hide[@]}")
    echo "$pid" >"$st/h$i/unshare.pid"
    until [ -s "$st/h$i/sshd.pid" ]; do
        _tsh_alive "$pid" || { echo "sshd_add_host: sshd on $name exited at start" >&2; tail -n5 "$st/log/setup-$name.log" "$st/log/sshd-$name.log" >&2 2>/dev/null; return 1; }
        [ $((SECONDS - t0)) -lt 20 ] || { echo "sshd_add_host: sshd on $name did not start within 20 s" >&2; return 1; }
        sleep 0.05
    done
    sshd=$(cat "/proc/$pid/task/$pid/children" 2>/dev/null) sshd=${sshd%% *}
    [ -n "$sshd" ] || { echo "sshd_add_host: cannot find the sshd of $name (child of $pid)" >&2; return 1; }
    echo "$sshd" >"$st/h$i/pid"
    until _tsh_ssh_all "$name" 2>"$st/log/ssh-ready-$name.log"; do
        [ $((SECONDS - t0)) -lt 20 ] ||
            { echo "sshd_add_host: $name did not answer ssh within 20 s: $(cat "$st/log/ssh-ready-$name.log")" >&2; return 1; }
        sleep 0.1
    done
    rm -f "$st/log/ssh-ready-$name.log"
}

sshd_remove_host() {
    local name=${1:-} st=${TSH_STATE:-} i ns pids tmp
    i=$(sshd_host_index "$name") || return 1
    ns=tsh-$(_tsh_fixture_pid)-h$i
    pids=$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')
    # shellcheck disable=SC2086
    [ -n "${pids// /}" ] && kill -9 $pids 2>/dev/null
    sshd_wait 5 "the processes of $ns to exit" sh -c "[ -z \"\$(ip netns pids $ns 2>/dev/null)\" ]"
    ip netns del "$ns" 2>/dev/null
    {
        flock 9
        rm -f "$st/ssh_config.d/h$i.conf"
        tmp=$st/known_hosts.tmp
        grep -v "^$name," "$st/known_hosts" >"$tmp"
        mv "$tmp" "$st/known_hosts"
        # in place (a bind mount keeps the inode), each of NAME's lines blanked to a comment
        awk -v n="$name" '{ if ($2 == n) { gsub(/./, "#") } print }' "$st/hosts" >"$st/hosts.tmp" &&
            dd if="$st/hosts.tmp" of="$st/hosts" bs=1M conv=notrunc status=none
        rm -f "$st/hosts.tmp"
        mv "$st/h$i/name" "$st/h$i/removed"
    } 9>>"$st/lock"
    rm -f "$st/h$i/pid" "$st/h$i/sshd.pid"
    rmdir "$st/cg/$name" 2>/dev/null
    return 0
}
