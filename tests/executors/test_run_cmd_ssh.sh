#!/usr/bin/env bash
# executors: `tandem run --executor ssh --host H1 --host H2 -- python3 script.py` (issue 30): a
# command run goes to the ssh hosts (tests/lib/sshd.sh, the project hidden from them) without a
# workflow file. The run's record names both hosts; each rank ran on its host (the script writes
# the host's marker file, which only that host has) with NODE_RANK/NUM_NODES set; the workflow
# env: PATH given with --set reaches the hosts with $PATH as the host's own; --artifact brings
# node 0's output into the store. Then the same through --profile FILE (the workflow parser's
# keys), with a flag overriding the profile's hosts.
set -uo pipefail
: "${TANDEM_BIN:?}"
SRC=${TANDEM_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
B=$TANDEM_BIN
. "$SRC/tests/lib/sshd.sh"
sshd_project runcmd-ssh
# a file only each host has: where a rank really ran
sshd_host_exec 1 sh -c "echo host-one >$REMOTE/marker" || fail "marker 1"
sshd_host_exec 2 sh -c "echo host-two >$REMOTE/marker" || fail "marker 2"
[ -e "$P/marker" ] && fail "the project has a marker"
mkdir -p "$P/.tandem"
cat >"$P/where.py" <<EOF
import os
marker = open("$REMOTE/marker").read().strip()
os.makedirs("out", exist_ok=True)
line = "rank=%s node=%s/%s marker=%s path0=%s" % (os.environ["RANK"], os.environ.get("NODE_RANK"),
        os.environ.get("NUM_NODES"), marker, os.environ["PATH"].split(":")[1])
print(line, flush=True)
open("out/where-%s.txt" % os.environ["RANK"], "w").write(line + "\n")
EOF
cd "$P" || fail "cd"

# --- flags only
sshd_exec timeout -k 5 120 "$B" run --executor ssh --host "$h1" --host "$h2" --set "ssh.work_dir=$REMOTE" \
    --set 'env={PATH: "/opt/td-extra:$PATH"}' --artifact out/where-0.txt -- python3 where.py \
    >"$P/run.log" 2>&1 || fail "tandem run --executor ssh: exit $?"
show=$("$B" show where-1) || fail "tandem show where-1"
grep -q '^status  *succeeded' <<<"$show" || fail "where-1 did not succeed: $show"
grep -q "^executor  *ssh: node 0 on $h1 .*node 1 on $h2" <<<"$show" || fail "executor line: $show"
"$B" logs where-1 >"$P/logs.log"
grep -q '^\[rank 0\] rank=0 node=0/2 marker=host-one path0=/opt/td-extra$' "$P/logs.log" ||
    fail "rank 0 not on host 1 with NODE_RANK 0 of 2 and env: PATH: $(cat "$P/logs.log")"
grep -q '^\[rank 1\] rank=1 node=1/2 marker=host-two path0=/opt/td-extra$' "$P/logs.log" ||
    fail "rank 1 not on host 2: $(cat "$P/logs.log")"
grep -q 'marker=host-one' "$P/.tandem/runs/where-1/artifacts/out/where-0.txt" ||
    fail "--artifact out/where-0.txt not stored from node 0"
echo "tandem run --executor ssh --host x2 -- python3 where.py: rank 0 on $h1, rank 1 on $h2," \
     "NODE_RANK/NUM_NODES, env: PATH with the host's \$PATH, the artifact stored"

# --- a profile (the workflow's keys), a flag over it: one host
cat >"$P/prof.yaml" <<EOF
executor: ssh
ssh: {hosts: [$h1, $h2], work_dir: $REMOTE}
EOF
sshd_exec timeout -k 5 120 "$B" run --name prof --profile "$P/prof.yaml" --host "$h2" -- python3 where.py \
    >"$P/prof.log" 2>&1 || fail "tandem run --profile: exit $?"
show=$("$B" show prof-1)
grep -q "^executor  *ssh: node 0 on $h2 " <<<"$show" || fail "--host over the profile's: $show"
"$B" logs prof-1 | grep -q '^\[rank 0\] rank=0 node=0/1 marker=host-two' ||
    fail "profile run not on host 2: $("$B" logs prof-1)"
echo "tandem run --profile FILE --host H: the flag's host replaced the profile's two"
echo OK
