#!/usr/bin/env bash
# executors: `nproc_per_node: auto|gpu` with executor ssh (issue 30: refused there, it worked
# only on the local executor). The count is taken on the hosts by tandem launch's rule, before
# the run starts, and recorded. Two hosts (tests/lib/sshd.sh), the project hidden from them:
#   - a workflow with nproc_per_node: auto runs as many workers per host as the host's `nproc`
#     (asked over ssh): every worker reports LOCAL_WORLD_SIZE = that count, WORLD_SIZE = twice
#     it, and its RANK on the host of its node; `tandem show` records the count per node;
#   - `tandem run --executor ssh --nproc-per-node auto -- CMD` does the same;
#   - nproc_per_node: gpu on hosts without a GPU fails before any run is made, naming the host.
set -uo pipefail
: "${TANDEM_BIN:?}"
SRC=${TANDEM_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
B=$TANDEM_BIN
. "$SRC/tests/lib/sshd.sh"
sshd_project remote-nproc
n1=$(sshd_exec ssh "$h1" nproc) && n2=$(sshd_exec ssh "$h2" nproc) || fail "nproc on the hosts"
[ "$n1" = "$n2" ] || fail "the fixture's hosts differ: nproc $n1 and $n2"
n=$n1
mkdir -p "$P/.tandem"
cat >"$P/.tandem/workflows.yaml" <<EOF2
workflows:
  - name: auto
    executor: ssh
    ssh: {hosts: [$h1, $h2], work_dir: $REMOTE}
    nproc_per_node: auto
    command: echo "where rank \$RANK host \$(hostname) local \$LOCAL_WORLD_SIZE world \$WORLD_SIZE"
  - name: gpu
    executor: ssh
    ssh: {hosts: [$h1, $h2], work_dir: $REMOTE}
    nproc_per_node: gpu
    command: "true"
EOF2

# check RUN: every worker on the host of its node, with the counts of nproc
check() {
    local run=$1 show r want
    show=$("$B" show "$run") || fail "tandem show $run"
    grep -q '^status  *succeeded' <<<"$show" || fail "$run did not succeed: $show"
    grep -qE "^workers  *2 node\(s\) x $n process\(es\)$" <<<"$show" ||
        fail "$run: tandem show does not record $n workers per node: $(head -15 <<<"$show")"
    for ((r = 0; r < 2 * n; r++)); do
        want=$h1
        [ "$r" -ge "$n" ] && want=$h2
        grep -qx "where rank $r host $want local $n world $((2 * n))" "$P/.tandem/runs/$run/logs/rank-$r.log" ||
            fail "$run: rank $r's log: $(cat "$P/.tandem/runs/$run/logs/rank-$r.log" 2>&1), want host $want local $n world $((2 * n))"
    done
    [ ! -e "$P/.tandem/runs/$run/logs/rank-$((2 * n)).log" ] || fail "$run: more than $((2 * n)) ranks"
    echo "$run: $n workers on each host (nproc there), WORLD_SIZE $((2 * n)), each rank on its node's host"
}

sshd_exec timeout -k 5 120 "$B" run auto >"$P/auto.log" 2>&1 || fail "tandem run auto: exit $?"
check auto-1
sshd_exec timeout -k 5 120 "$B" run --name cmd --executor ssh --host "$h1" --host "$h2" \
    --set "ssh.work_dir=$REMOTE" --nproc-per-node auto -- \
    sh -c 'echo "where rank $RANK host $(hostname) local $LOCAL_WORLD_SIZE world $WORLD_SIZE"' \
    >"$P/cmd.log" 2>&1 || fail "tandem run --executor ssh --nproc-per-node auto: exit $?"
check cmd-1

sshd_exec timeout -k 5 120 "$B" run gpu >"$P/gpu.log" 2>&1 && fail "nproc_per_node: gpu without GPUs succeeded"
grep -q "nproc_per_node: gpu: ssh host $h1 could not count" "$P/gpu.log" ||
    fail "the gpu refusal does not name host $h1: $(cat "$P/gpu.log")"
[ -z "$("$B" ps -a 2>/dev/null | grep gpu-)" ] || fail "a run was made for gpu: $("$B" ps -a)"
echo "nproc_per_node: gpu on hosts without a GPU: refused before any run, naming $h1"
