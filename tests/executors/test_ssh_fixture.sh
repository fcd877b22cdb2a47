#!/usr/bin/env bash
# executors: the ssh fixture (tests/lib/sshd.sh) is two hosts with their own sshd, reached over
# ssh from a login namespace, with no shared file system for the directories a test hides.
# 1. `ssh HOST hostname` answers each host's hostname (with -F and plain, by name and address).
# 2. A hidden directory (with a file) is empty on both hosts, over ssh and in sshd_host_exec,
#    while a file under /tmp outside it is shared; PATH is sshd's, no environment is passed.
# 3. The hosts resolve each other's names and reach any TCP port, like a LAN; so does the login.
# 4. Password and keyboard-interactive logins are refused: the server offers publickey only.
# 5. sshd_host_exec I runs in host I's PID namespace: pkill there spares the other host.
# 6. The root namespace gets no interface, address, route or /run/sshd; the leftovers of a run
#    killed by SIGKILL are removed by the next sshd_up; after sshd_down nothing is left.
set -uo pipefail
SRC=${TANDEM_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}

. "$SRC/tests/lib/sshd.sh"
work=$(mktemp -d /tmp/tandem-exec-sshfix-XXXXXX)     # shared: the same /tmp on every host
hidden=$(mktemp -d /tmp/tandem-exec-sshhide-XXXXXX)  # the submitting machine's run directory
cleanup() {
    sshd_down
    rm -rf "$work" "$hidden"
}
trap cleanup EXIT
fail() {
    echo "FAIL: $*" >&2
    sshd_logs 10
    exit 1
}
ms() { echo $(($(date +%s%N) / 1000000)); }
# alive PID: the process exists and is not a zombie (this VM's PID 1 reaps orphans lazily).
alive() { [ -e "/proc/$1" ] && ! grep -q '^State:.*Z' "/proc/$1/status" 2>/dev/null; }
# What of ours could appear in the root namespace: our bridge, veths, subnet, routes.
rootns() {
    ip -o link | grep -Ec ' (br0|v[0-9]|eth0@|tsh-)' | tr -d '\n'
    echo -n " $(ip -o addr | grep -c '10\.81\.0\.') $(ip route | grep -c '10\.81\.0\.')"
}
had_run_sshd=no had_root_ssh=no
[ -e /run/sshd ] && had_run_sshd=yes
[ -e "$(_tsh_home)/.ssh" ] && had_root_ssh=yes
root_before=$(rootns)

# --- 6a. a fixture whose test is killed by SIGKILL leaves everything behind ... (its shell
# stays alive, as sleep, until everything is checked: a concurrent test's sshd_up must not
# remove the leftovers before that)
bash -c '. "$1"; sshd_up 1 || exit; echo up >"$2"; exec sleep 1000' sh "$SRC/tests/lib/sshd.sh" \
    "$work/child" </dev/null >"$work/child.log" 2>&1 &
old=$!
while [ ! -s "$work/child" ]; do
    if ! alive "$old"; then
        wait "$old"
        rc=$?
        [ $rc = 77 ] && { cat "$work/child.log"; exit 77; } # the fixture's reason to skip
        fail "a first fixture did not come up: exit $rc: $(cat "$work/child.log")"
    fi
    sleep 0.05
done
old_sshd=$(pgrep -f "tandem-ssh-$old/h1/sshd_config" | head -1)
[ -d "/tmp/tandem-ssh-$old" ] && ip netns list | grep -q "^tsh-$old-h1" && [ -n "$old_sshd" ] ||
    fail "the first fixture ($old) has no state dir, namespace or sshd"
{ kill -9 "$old" && wait "$old"; } 2>/dev/null

# --- bring-up (which removes those leftovers first)
echo secret >"$hidden/file"
echo shared >"$work/file"
t0=$(ms)
sshd_up 2 "$hidden" || fail "the fixture did not come up"
t_up=$(($(ms) - t0))
h1=${TSH_HOSTS[0]} h2=${TSH_HOSTS[1]} a2=${TSH_ADDRS[1]}
echo "2 hosts up in $t_up ms: $h1 (${TSH_ADDRS[0]}) $h2 ($a2), login $TSH_LOGIN, state $TSH_STATE"
[ ! -e "/tmp/tandem-ssh-$old" ] && ! ip netns list | grep -q "^tsh-$old-" ||
    fail "sshd_up left the killed fixture $old behind"
# (the kernel ends a killed PID namespace's processes asynchronously: a loaded machine takes a
# moment)
for _ in $(seq 1 50); do alive "$old_sshd" || break; sleep 0.1; done
alive "$old_sshd" && fail "the killed fixture's sshd ($old_sshd) still runs 5 s after sshd_up"
echo "leftovers of the SIGKILLed fixture $old removed"

# --- 1. hostnames
for i in 1 2; do
    h=${TSH_HOSTS[i - 1]}
    out=$(sshd_exec ssh -F "$TSH_SSH_CONFIG" "$h" hostname) || fail "ssh -F ... $h hostname: exit $?"
    [ "$out" = "$h" ] || fail "ssh $h hostname answered '$out'"
    out=$(sshd_exec ssh "$h" hostname) || fail "plain ssh $h hostname: exit $?"
    [ "$out" = "$h" ] || fail "plain ssh $h hostname answered '$out'"
    out=$(sshd_exec ssh "${TSH_ADDRS[i - 1]}" hostname) || fail "ssh ${TSH_ADDRS[i - 1]} hostname: exit $?"
    [ "$out" = "$h" ] || fail "ssh ${TSH_ADDRS[i - 1]} hostname answered '$out'"
    [ "$(sshd_host_exec "$i" hostname)" = "$h" ] || fail "sshd_host_exec $i hostname"
done
[ "$(sshd_exec hostname)" = "$TSH_LOGIN" ] || fail "sshd_exec hostname: $(sshd_exec hostname)"
[ "$(sshd_exec pwd)" = "$PWD" ] || fail "sshd_exec does not keep the working directory"
out=$(sshd_exec ssh "$h1" ssh "$h2" hostname) || fail "ssh $h1 ssh $h2: exit $?"
[ "$out" = "$h2" ] || fail "ssh from $h1 to $h2 answered '$out'"
echo "ssh HOST hostname: $h1 $h2 (also plain ssh, by address, and from host to host)"

# --- 2. no shared file system for the hidden directory; /tmp shared; PATH and environment
for i in 1 2; do
    h=${TSH_HOSTS[i - 1]}
    out=$(sshd_exec ssh "$h" "cat $work/file; ls -A $hidden | wc -l; stat -c %a $hidden") ||
        fail "ssh $h: exit $?"
    [ "$out" = "$(printf 'shared\n0\n755')" ] || fail "on $h: shared file, hidden entries, mode: '$out'"
    sshd_exec ssh "$h" "test -e $hidden/file" && fail "$hidden/file is visible on $h over ssh"
    sshd_host_exec "$i" test -e "$hidden/file" && fail "$hidden/file is visible in host $i's namespaces"
    sshd_exec ssh "$h" "echo from-$h >$work/from-$h" || fail "ssh $h: cannot write to $work"
    [ "$(cat "$work/from-$h")" = "from-$h" ] || fail "$h's file under /tmp is not visible here"
done
[ "$(sshd_exec cat "$hidden/file")" = secret ] || fail "the login namespace must see $hidden"
out=$(FOO=bar LANG=C.UTF-8 sshd_exec ssh "$h1" 'echo "$PATH ${FOO:-unset} ${LANG:-unset} $HOME $PWD"')
[ "$out" = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin unset unset /root /root" ] ||
    fail "PATH, FOO, LANG, HOME, cwd over ssh: '$out'"
echo "hidden dir empty on both hosts, /tmp shared; over ssh: $out"

# --- 3. a LAN: host 1 reaches a port on host 2 by name, the login namespace too
# (all of the background job's output redirected: ssh returns once nothing holds its pipes)
sshd_exec ssh "$h2" "(cd $work && exec python3 -m http.server 8123) </dev/null >/dev/null 2>&1 &" ||
    fail "cannot start a listener on $h2"
get='for i in $(seq 100); do exec 3<>/dev/tcp/'$h2'/8123 && break; sleep 0.1; done 2>/dev/null
printf "GET /file HTTP/1.0\r\n\r\n" >&3 && tail -n1 <&3'
out=$(sshd_exec ssh "$h1" "getent hosts $h2 | cut -d' ' -f1; $get") || fail "from $h1 to $h2:8123: exit $?"
[ "$out" = "$(printf '%s\nshared' "$a2")" ] || fail "$h1 -> $h2:8123 by name: '$out'"
out=$(sshd_exec bash -c "$get") || fail "from the login namespace to $h2:8123: exit $?"
[ "$out" = shared ] || fail "login -> $h2:8123: '$out'"
echo "$h1 resolves $h2 to $a2 and fetched http://$h2:8123/file; so did the login namespace"

# --- 4. public key only
for m in password keyboard-interactive; do
    # (ssh ends its debug lines with \r\n)
    out=$(sshd_exec ssh -o PreferredAuthentications=$m -o PubkeyAuthentication=no -o BatchMode=yes \
          -o LogLevel=DEBUG1 "$h1" true 2>&1 | tr -d "\r") && fail "$m login to $h1 succeeded"
    grep -q 'Authentications that can continue: publickey$' <<<"$out" ||
        fail "$h1 offers more than publickey: $(grep 'can continue' <<<"$out")"
    grep -q 'Permission denied (publickey)' <<<"$out" || fail "$m login: $(tail -n2 <<<"$out")"
done
echo "password and keyboard-interactive refused: the hosts offer publickey only"

# --- 5. each host is its own PID namespace
for h in "$h1" "$h2"; do
    sshd_exec ssh "$h" "nohup sleep 997 >/dev/null 2>&1 </dev/null &" || fail "ssh $h sleep &"
done
[ "$(sshd_host_exec 1 pgrep -xc sleep)" = 1 ] || fail "host 1 sees $(sshd_host_exec 1 pgrep -xc sleep) sleeps"
[ "$(sshd_host_exec 2 ps -o comm= -p 1)" = sshd ] || fail "host 2's PID 1 is not its sshd"
sshd_host_exec 2 pkill -KILL -f 'sleep 997' || fail "sshd_host_exec 2 pkill: exit $?"
for _ in $(seq 50); do sshd_host_exec 2 pgrep -f 'sleep 997' >/dev/null || break; sleep 0.1; done
sshd_host_exec 2 pgrep -f 'sleep 997' >/dev/null && fail "pkill on host 2 left its sleep"
sshd_host_exec 1 pgrep -f 'sleep 997' >/dev/null || fail "pkill on host 2 killed host 1's sleep"
echo "sshd_host_exec 2 pkill -KILL -f 'sleep 997' killed host 2's sleep only"

# --- 6. the root namespace
[ "$(rootns)" = "$root_before" ] || fail "root namespace changed: links/addrs/routes $root_before -> $(rootns)"
[ $had_run_sshd = yes ] || [ ! -e /run/sshd ] || fail "/run/sshd appeared in the root namespace"
[ $had_root_ssh = yes ] || [ ! -e "$(_tsh_home)/.ssh" ] || fail "$(_tsh_home)/.ssh appeared"
state=$TSH_STATE pids="${TSH_PIDS[*]} $(cat "$TSH_STATE"/h*/unshare.pid "$TSH_STATE/login.pid" | tr '\n' ' ')"
t0=$(ms)
sshd_down
t_down=$(($(ms) - t0))
sshd_down # idempotent
ip netns list | grep -q "^tsh-$$-" && fail "namespaces left: $(ip netns list | grep "^tsh-$$-")"
[ ! -e "$state" ] || fail "$state left"
for p in $pids; do alive "$p" && fail "process $p of the fixture still runs: $(tr '\0' ' ' <"/proc/$p/cmdline")"; done
pgrep -f "tandem-ssh-$$/" >/dev/null && fail "sshd processes left: $(pgrep -af "tandem-ssh-$$/")"
[ "$(rootns)" = "$root_before" ] || fail "root namespace changed after sshd_down"
echo "ok: up $t_up ms, down $t_down ms; nothing left (namespaces, $state, processes $pids)"
