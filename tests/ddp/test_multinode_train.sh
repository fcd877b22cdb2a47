#!/usr/bin/env bash
# Data-parallel training across two "hosts": two network namespaces joined by a veth pair
# (10.79.0.1 and 10.79.0.2), one `tandem launch --nnodes 2 --nproc-per-node 1` in each. The
# ranks are on different hosts as far as comm can tell (the host key includes the network
# namespace), so the gradient allreduce goes over tcp, while 2 local workers use shm. The saved
# weights after 60 steps must be bitwise equal either way: the reduction tree does not depend on
# the transport.
set -uo pipefail
: "${TANDEM_BIN:?}" "${TANDEM_DATA:?}"

. "${TANDEM_SOURCE_DIR:-$(dirname "$0")/../..}/tests/lib/netns.sh"
work=$(mktemp -d /tmp/tandem-ddp-multinode-XXXXXX)
cleanup() {
    netns_cleanup
    rm -rf "$work"
}
trap cleanup EXIT
fail() {
    echo "FAIL: $*" >&2
    for f in "$work"/*.log; do [ -f "$f" ] && { echo "--- $f" >&2; tail -15 "$f" >&2; }; done
    exit 1
}

netns_pair tdd 10.79.0 || fail "could not set up the two namespaces"

train=(train --model basicnet --data "$TANDEM_DATA" --steps 60 --batch 16 --threads 1 --seed 9
       --lr 1e-3 --no-progress)
EP=10.79.0.1:29479 # a private namespace: nothing else can hold this port
export TANDEM_TOKEN=ddp-multinode-secret-$$
export TANDEM_LOG_LEVEL=debug # comm logs the transports it set up

for i in 0 1; do
    ns=$A; [ $i = 1 ] && ns=$B
    ip netns exec "$ns" timeout -k 5 120 "$TANDEM_BIN" launch --nnodes 2 --nproc-per-node 1 \
        --node-rank $i --rdzv-endpoint "$EP" --rdzv-id ddp-mn-$$ --rdzv-timeout 60 -- \
        "$TANDEM_BIN" "${train[@]}" --save "$work/w-node$i.safetensors" \
        >"$work/node$i.log" 2>&1 &
    pids[$i]=$!
done
wait "${pids[0]}"; r0=$?
wait "${pids[1]}"; r1=$?
[ $r0 = 0 ] && [ $r1 = 0 ] || fail "2 nodes x 1 worker: launchers exited $r0 / $r1"
[ -s "$work/w-node0.safetensors" ] || fail "rank 0 (node 0) saved no weights"
[ ! -e "$work/w-node1.safetensors" ] || fail "rank 1 saved weights too (only rank 0 should)"

timeout -k 5 120 "$TANDEM_BIN" launch --standalone --nproc-per-node 2 -- \
    "$TANDEM_BIN" "${train[@]}" --save "$work/w-local.safetensors" >"$work/local.log" 2>&1 ||
    fail "2 local workers: exit $?"

# The transports: tcp between the namespaces, shm between local workers.
for i in 0 1; do
    line=$(grep -m1 "comm: rank $i/2 group .* up:" "$work/node$i.log") ||
        fail "node $i: comm did not log its group"
    echo "node $i: ${line#*comm: }"
    [[ $line == *tcp* && $line != *shm* ]] || fail "node $i: expected a tcp-only group: $line"
done
line=$(grep -m1 "comm: rank 0/2 group .* up:" "$work/local.log") || fail "local: no group line"
echo "local:  ${line#*comm: }"
[[ $line == *shm* ]] || fail "2 local workers should use shm: $line"

cmp "$work/w-node0.safetensors" "$work/w-local.safetensors" ||
    fail "weights after 60 steps differ between 2 nodes (tcp) and 2 local workers (shm)"
echo "2 nodes x 1 worker over tcp == 2 local workers over shm: bitwise-identical weights"
