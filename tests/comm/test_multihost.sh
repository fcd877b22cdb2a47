#!/usr/bin/env bash
# comm, multi-host: three network namespaces joined by veth pairs to a bridge (itself inside a
# fourth namespace, so nothing touches the machine's own network) act as three hosts on
# 10.77.0.0/24. A store runs on host 1; one rank per host joins from the launcher's environment.
# Different namespaces give different host keys, so AUTO must pick tcp; results are checked
# element by element against the fixed reduction tree. Needs root and `ip netns`; skips (77)
# otherwise. Namespaces and processes are removed on exit.
set -uo pipefail
skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "needs root to create network namespaces"
command -v ip > /dev/null || skip "iproute2 (ip) not installed"
worker=${TANDEM_BUILD_DIR:-}/tests/comm/comm_worker
[ -x "$worker" ] || { echo "FAIL: comm_worker not found at $worker"; exit 1; }

tag="tdmh$$"
sw="${tag}sw"
hosts=("${tag}h1" "${tag}h2" "${tag}h3")
pids=()
tmp=$(mktemp -d)
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2> /dev/null; done
  wait 2> /dev/null
  for h in "${hosts[@]}" "$sw"; do ip netns del "$h" 2> /dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT

ip netns add "$sw" 2> "$tmp/err" || skip "ip netns add not permitted here: $(cat "$tmp/err")"
ip -n "$sw" link add br0 type bridge || skip "cannot create a bridge"
ip -n "$sw" link set br0 up
for i in 1 2 3; do
  h=${hosts[$((i - 1))]}
  ip netns add "$h" || { echo "FAIL: ip netns add $h"; exit 1; }
  ip -n "$h" link set lo up
  ip link add "${tag}a$i" type veth peer name "${tag}b$i" || skip "cannot create veth pairs"
  ip link set "${tag}a$i" netns "$h"
  ip link set "${tag}b$i" netns "$sw"
  ip -n "$h" addr add "10.77.0.$i/24" dev "${tag}a$i"
  ip -n "$h" link set "${tag}a$i" up
  ip -n "$sw" link set "${tag}b$i" master br0 up
done

export TANDEM_TOKEN="multihost-$$-$RANDOM$RANDOM"
ip netns exec "${hosts[0]}" "$worker" store 10.77.0.1 "$tmp/port" &
pids+=($!)
for _ in $(seq 100); do [ -s "$tmp/port" ] && break; sleep 0.05; done
[ -s "$tmp/port" ] || { echo "FAIL: the store did not start"; exit 1; }
port=$(cat "$tmp/port")

rpids=()
for r in 0 1 2; do
  ip netns exec "${hosts[$r]}" env RANK=$r WORLD_SIZE=3 LOCAL_RANK=0 \
    TANDEM_STORE_ADDR="10.77.0.1:$port" TANDEM_RUN_ID=mh TANDEM_COMM_TIMEOUT_MS=60000 \
    EXPECT_TRANSPORT=tcp "$worker" rank > "$tmp/rank$r.out" 2>&1 &
  rpids+=($!)
done
fail=0
for r in 0 1 2; do
  if ! wait "${rpids[$r]}"; then
    echo "FAIL: rank $r (host ${hosts[$r]}):"
    cat "$tmp/rank$r.out"
    fail=1
  fi
done
for r in 0 1 2; do
  grep -q "rank $r of 3 ok: transports tcp$" "$tmp/rank$r.out" ||
    { echo "FAIL: rank $r did not report tcp-only success:"; cat "$tmp/rank$r.out"; fail=1; }
done
[ $fail -eq 0 ] || exit 1
cat "$tmp"/rank*.out
echo "test_multihost: ok (3 namespaces as hosts, tcp chosen automatically, results checked)"
