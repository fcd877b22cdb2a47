#!/bin/bash
# launch: two "nodes" = two network namespaces joined by a veth pair (10.78.0.1 and 10.78.0.2,
# nothing else is touched). One `tandem launch --nnodes 2` in each: the env contract across
# nodes (with and without --node-rank), a PyTorch DDP job that trains to equal parameters, and a
# worker failure on node 1 that brings node 0's launcher down naming the root cause.
set -u
TANDEM=${TANDEM_BIN:?TANDEM_BIN not set}
PY=${PYTHON:-/usr/bin/python3}
SRC=${TANDEM_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}

. "$SRC/tests/lib/netns.sh"
D=$(mktemp -d /tmp/tandem-multinode-XXXXXX)
cleanup() {
    netns_cleanup
    rm -rf "$D"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

netns_pair tdl 10.78.0 || fail "could not set up the two namespaces"
ip netns exec "$A" "$PY" -c "import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.connect((\"10.78.0.2\", 9))" || fail "no route to 10.78.0.2 over the veth pair"

EP=10.78.0.1:29400 # a private namespace: nothing else can hold this port
export TANDEM_TOKEN=multinode-test-secret
# node <ns> <tag> <node-rank or ""> <rdzv-id> CMD...: starts a launcher in the background
node() {
    local ns=$1 tag=$2 nr=$3 id=$4 ifname=$5
    shift 5
    local rankflag=()
    [ -n "$nr" ] && rankflag=(--node-rank "$nr")
    # A bound on each launcher, so that a hang fails this test instead of outliving it.
    ip netns exec "$ns" timeout -k 5 120 env GLOO_SOCKET_IFNAME="$ifname" "$TANDEM" launch --nnodes 2 \
        --nproc-per-node 1 "${rankflag[@]}" --rdzv-endpoint "$EP" --rdzv-id "$id" \
        --rdzv-timeout 60 -- "$@" >"$D/$tag.out" 2>"$D/$tag.err" &
}
envdump="$D/env.sh"
cat >"$envdump" <<'EOS'
#!/bin/bash
echo "RANK=$RANK WORLD_SIZE=$WORLD_SIZE GROUP_RANK=$GROUP_RANK LOCAL_RANK=$LOCAL_RANK MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT STORE=$TANDEM_STORE_ADDR NODE=$TANDEM_NODE_RANK"
EOS
chmod +x "$envdump"

# --- 1. env contract, explicit node ranks
node "$A" env-a 0 envtest "$VA" "$envdump"; pa=$!
node "$B" env-b 1 envtest "$VB" "$envdump"; pb=$!
wait $pa; ra=$?; wait $pb; rb=$?
[ $ra = 0 ] && [ $rb = 0 ] || fail "env run exit codes $ra/$rb: $(cat "$D"/env-*.err)"
la=$(grep '^\[rank' "$D/env-a.out"); lb=$(grep '^\[rank' "$D/env-b.out")
port=$(sed -n 's/.*MASTER_PORT=\([0-9]*\).*/\1/p' <<<"$la")
want_a="[rank 0] RANK=0 WORLD_SIZE=2 GROUP_RANK=0 LOCAL_RANK=0 MASTER_ADDR=10.78.0.1 MASTER_PORT=$port STORE=$EP NODE=0"
want_b="[rank 1] RANK=1 WORLD_SIZE=2 GROUP_RANK=1 LOCAL_RANK=0 MASTER_ADDR=10.78.0.1 MASTER_PORT=$port STORE=$EP NODE=1"
[ "$la" = "$want_a" ] || fail "node 0 env: got '$la', expected '$want_a'"
[ "$lb" = "$want_b" ] || fail "node 1 env: got '$lb', expected '$want_b'"
[ -n "$port" ] && [ "$port" != 29400 ] || fail "MASTER_PORT '$port' should be a picked free port"
echo "env contract across nodes: ok (MASTER_PORT=$port)"

# --- 2. no node ranks: the agent whose host is the endpoint hosts the store; ranks by arrival
node "$A" guess-a "" guesstest "$VA" "$envdump"; pa=$!
sleep 0.3
node "$B" guess-b "" guesstest "$VB" "$envdump"; pb=$!
wait $pa; ra=$?; wait $pb; rb=$?
[ $ra = 0 ] && [ $rb = 0 ] || fail "no-node-rank run exit codes $ra/$rb: $(cat "$D"/guess-*.err)"
ranks=$(cat "$D/guess-a.out" "$D/guess-b.out" | sed -n 's/^\[rank \([0-9]\)\].*WORLD_SIZE=2 .*/\1/p' | sort | tr '\n' ' ')
[ "$ranks" = "0 1 " ] || fail "ranks without --node-rank: '$ranks' (outputs: $(cat "$D"/guess-*.out))"
echo "rendezvous without node ranks: ok"

# --- 3. PyTorch DDP across the two nodes
node "$A" ddp-a 0 ddptest "$VA" "$PY" "$SRC/examples/torch_ddp/train_ddp.py" --steps 30 --out "$D/ddp"; pa=$!
node "$B" ddp-b 1 ddptest "$VB" "$PY" "$SRC/examples/torch_ddp/train_ddp.py" --steps 30 --out "$D/ddp"; pb=$!
wait $pa; ra=$?; wait $pb; rb=$?
[ $ra = 0 ] && [ $rb = 0 ] || fail "ddp exit codes $ra/$rb: $(tail -5 "$D"/ddp-*.err)"
"$PY" - "$D/ddp" <<'EOP' || fail "ddp parameter check"
import sys, torch
d = sys.argv[1]
p0 = torch.load(f"{d}/params-rank0.pt"); p1 = torch.load(f"{d}/params-rank1.pt")
for i, (a, b) in enumerate(zip(p0, p1)):
    assert torch.equal(a, b), f"param {i} differs across nodes: {(a - b).abs().max().item()}"
l = [float(v) for v in open(f"{d}/loss-rank0.txt").read().split()]
first, last = sum(l[:5]) / 5, sum(l[-5:]) / 5
assert last < 0.5 * first, f"loss did not go down: {first} -> {last}"
print(f"ddp across nodes: params equal, loss {first:.4f} -> {last:.4f}")
EOP

# --- 4. a worker failure on node 1 brings node 0's launcher down, root cause named
cat >"$D/fail.sh" <<EOS
#!/bin/bash
echo \$\$ > $D/failpid-\$RANK
if [ "\$RANK" = 1 ]; then sleep 1; date +%s.%N > $D/death; exit 5; fi
while true; do sleep 0.1; done
EOS
chmod +x "$D/fail.sh"
node "$A" fail-a 0 failtest "$VA" "$D/fail.sh"; pa=$!
node "$B" fail-b 1 failtest "$VB" "$D/fail.sh"; pb=$!
wait $pa; ra=$?; end_a=$(date +%s.%N); wait $pb; rb=$?
[ $ra = 1 ] && [ $rb = 1 ] || fail "failure run exit codes $ra/$rb (expected 1/1)"
pid1=$(cat "$D/failpid-1")
cause="worker rank 1 (local rank 0 on node 1, pid $pid1) exited with code 5"
grep -qF "$cause" "$D/fail-a.err" || fail "node 0 did not name '$cause': $(cat "$D/fail-a.err")"
grep -qF "$cause" "$D/fail-b.err" || fail "node 1 did not name '$cause': $(cat "$D/fail-b.err")"
pid0=$(cat "$D/failpid-0")
kill -0 "$pid0" 2>/dev/null && fail "node 0's worker $pid0 survived"
lat=$(echo "$end_a - $(cat "$D/death")" | bc)
echo "node 1 worker death -> node 0 launcher exit: ${lat} s"
[ "$(echo "$lat < 2.0" | bc)" = 1 ] || fail "node 0 took ${lat} s to go down (limit 2 s)"

# --- 5. a failure on node 1 in the first attempt restarts both nodes (--max-restarts 1)
cat >"$D/flaky.sh" <<'EOS'
#!/bin/bash
echo "attempt=$TANDEM_RESTART_COUNT rank=$RANK port=$MASTER_PORT"
[ "$TANDEM_RESTART_COUNT" = 0 ] && [ "$RANK" = 1 ] && exit 4
[ "$TANDEM_RESTART_COUNT" = 0 ] && sleep 30
exit 0
EOS
chmod +x "$D/flaky.sh"
nodeR() { local ns=$1 tag=$2 nr=$3 ifname=$4; shift 4
    ip netns exec "$ns" timeout -k 5 120 "$TANDEM" launch --nnodes 2 --nproc-per-node 1 --node-rank "$nr" \
        --rdzv-endpoint "$EP" --rdzv-id restarttest --max-restarts 1 -- "$@" \
        >"$D/$tag.out" 2>"$D/$tag.err" & }
nodeR "$A" rs-a 0 "$VA" "$D/flaky.sh"; pa=$!
nodeR "$B" rs-b 1 "$VB" "$D/flaky.sh"; pb=$!
wait $pa; ra=$?; wait $pb; rb=$?
[ $ra = 0 ] && [ $rb = 0 ] || fail "restart run exit codes $ra/$rb: $(cat "$D"/rs-*.err)"
grep -q '^\[rank 0\] attempt=1 rank=0' "$D/rs-a.out" || fail "node 0 did not restart: $(cat "$D/rs-a.out")"
grep -q '^\[rank 1\] attempt=1 rank=1' "$D/rs-b.out" || fail "node 1 did not restart: $(cat "$D/rs-b.out")"
grep -qF "worker rank 1 (local rank 0 on node 1" "$D/rs-a.err" || fail "node 0 did not name the cause: $(cat "$D/rs-a.err")"
echo "group restart across nodes: ok"

# --- 6. SIGTERM to node 0's launcher reaches node 1's workers through the store
cat >"$D/trap.sh" <<EOS
#!/bin/bash
trap 'echo done > $D/term-\$RANK; exit 143' TERM
echo ready > $D/ready-\$RANK
while true; do sleep 0.05; done
EOS
chmod +x "$D/trap.sh"
node "$A" term-a 0 termtest "$VA" "$D/trap.sh"; pa=$!
node "$B" term-b 1 termtest "$VB" "$D/trap.sh"; pb=$!
for i in $(seq 300); do [ -e "$D/ready-0" ] && [ -e "$D/ready-1" ] && break; sleep 0.1; done
[ -e "$D/ready-0" ] && [ -e "$D/ready-1" ] || fail "trap workers did not start"
# $pa is `ip netns exec` which execs `timeout`, which passes SIGTERM on to the launcher
kill -TERM $pa
wait $pa; ra=$?; wait $pb; rb=$?
[ $ra = 143 ] && [ $rb = 143 ] || fail "SIGTERM exit codes $ra/$rb (expected 143/143): $(cat "$D"/term-*.err)"
[ -e "$D/term-0" ] && [ -e "$D/term-1" ] || fail "a worker did not receive SIGTERM"
echo "SIGTERM forwarded across nodes: ok"
echo "test_multinode: ok"
