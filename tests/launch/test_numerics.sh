#!/bin/bash
# launch + train: ranks agree on what decides their bits before the first step (tensor.h,
# numerics). On this machine OpenBLAS picks one core by itself and another under
# OPENBLAS_CORETYPE=Prescott (SSE3, which every x86-64 runs); the two give different weights.
#   1. one node, rank 1's environment picks the other core: both ranks stop before the first step
#      naming rank 1, the OpenBLAS core and OPENBLAS_CORETYPE; with --nondeterministic-ok they
#      train, warning;
#   2. two nodes (network namespaces) whose environments pick different cores, as a login shell
#      and an ssh session can: tandem launch pins node 1's workers to node 0's core, and the two
#      nodes write the bits of one node with two workers under node 0's core.
#   A model of linear layers alone (mlp7) writes the same weights under both cores: tandem's own
#   gemm computes them.
#   0. first, tandem's own kernels: `tandem --version` names the hash of the sources that decide
#      the bits, which Python's hashlib recomputes from the tree; rank 1 running a build whose
#      hash differs (a copy of the binary with its id changed) stops both ranks before the first
#      step, naming rank 1, tandem's kernels and the fix.
set -u
TANDEM=${TANDEM_BIN:?TANDEM_BIN not set}
DATA=${TANDEM_DATA:-/usr/share/datasets/fashion-mnist}
SRC=${TANDEM_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
. "$SRC/tests/lib/netns.sh"
D=$(mktemp -d /tmp/tandem-numerics-XXXXXX)
cleanup() {
    netns_cleanup
    rm -rf "$D"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
case $(uname -m) in x86_64) ;; *) echo "SKIP: the cores named here are x86-64's"; exit 77 ;; esac

train=(train --data "$DATA" --steps 8 --batch 16 --seed 5 --threads 1 --no-progress)

# --- 0. tandem's own kernels
id=$("$TANDEM" --version | sed -n 's/^tandem .* (kernels \([0-9a-f]\{12\}\))$/\1/p')
[ ${#id} = 12 ] || fail "tandem --version names no kernels: $("$TANDEM" --version)"
python3 - "$SRC" "$id" <<'PY' || fail "the kernels id is not the hash of the sources that decide the bits"
import glob, hashlib, os, sys
src, want = sys.argv[1], sys.argv[2]
dirs = ["src/tensor", "src/nn", "src/optim", "src/ddp", "src/comm", "src/train", "src/data"]
files = [p for d in dirs for p in glob.glob(os.path.join(src, d, "**", "*.[ch]"), recursive=True)]
files += glob.glob(os.path.join(src, "include", "tandem", "**", "*.h"), recursive=True)
rel = sorted(os.path.relpath(p, src) for p in files)
text = "".join(hashlib.sha256(open(os.path.join(src, f), "rb").read()).hexdigest() + "  " + f + "\n"
               for f in rel)
got = hashlib.sha256(text.encode()).hexdigest()[:12]
print(f"kernels {want}: the hash of {len(rel)} sources is {got}")
sys.exit(got != want)
PY
other=$(tr '0-9a-f' '1-9a-f0' <<<"$id")
python3 - "$TANDEM" "$D/tandem-other" "$id" "$other" <<'PY' || fail "could not make the other build"
import os, sys
data = open(sys.argv[1], "rb").read()
assert data.count(sys.argv[3].encode()) >= 1
open(sys.argv[2], "wb").write(data.replace(sys.argv[3].encode(), sys.argv[4].encode()))
os.chmod(sys.argv[2], 0o755)
PY
"$D/tandem-other" --version | grep -q "(kernels $other)$" ||
    fail "the other build does not name its kernels: $("$D/tandem-other" --version)"
other_build="if [ \"\$LOCAL_RANK\" = 1 ]; then exec $D/tandem-other \"\$@\"; fi; exec \"\$0\" \"\$@\""
"$TANDEM" launch --standalone --nproc-per-node 2 -- /bin/sh -c "$other_build" "$TANDEM" \
    "${train[@]}" >"$D/kern.out" 2>"$D/kern.err"
rc=$?
[ $rc != 0 ] || fail "ranks of two tandem builds trained: $(tail -3 "$D/kern.err")"
grep -q "rank 1 runs .*tandem kernels $other" "$D/kern.err" &&
    grep -q "tandem's kernels differ" "$D/kern.err" &&
    grep -q "run one tandem build everywhere: these were built from different sources" "$D/kern.err" ||
    fail "the error does not name rank 1, tandem's kernels and the fix: $(cat "$D/kern.err")"
grep -q "step 1/" "$D/kern.err" && fail "a step ran before the ranks agreed"
echo "rank 1 a build of other sources (kernels $other, rank 0 $id): both stop before the first step (exit $rc)"
OPENBLAS_CORETYPE= "$TANDEM" "${train[@]}" --save "$D/own.st" >"$D/own.log" 2>&1 \
    || fail "training under the default core: $(tail -3 "$D/own.log")"
OPENBLAS_CORETYPE=Prescott "$TANDEM" "${train[@]}" --save "$D/prescott.st" >"$D/pr.log" 2>&1 \
    || fail "training under OPENBLAS_CORETYPE=Prescott: $(tail -3 "$D/pr.log")"
if cmp -s "$D/own.st" "$D/prescott.st"; then
    echo "SKIP: OpenBLAS's default core and Prescott give the same bits on this machine"
    exit 77
fi
echo "the default OpenBLAS core and Prescott give different weights: the hazard is real here"
# A model of linear layers alone runs none of OpenBLAS (tandem's own gemm, in a fixed order):
# its bits are the same under both cores
OPENBLAS_CORETYPE= "$TANDEM" "${train[@]}" --model mlp7 --save "$D/mlp-own.st" >"$D/mo.log" 2>&1 \
    || fail "mlp7 under the default core: $(tail -3 "$D/mo.log")"
OPENBLAS_CORETYPE=Prescott "$TANDEM" "${train[@]}" --model mlp7 --save "$D/mlp-pr.st" >"$D/mp.log" 2>&1 \
    || fail "mlp7 under OPENBLAS_CORETYPE=Prescott: $(tail -3 "$D/mp.log")"
cmp "$D/mlp-own.st" "$D/mlp-pr.st" || fail "mlp7's weights depend on the OpenBLAS core"
echo "mlp7 (linear layers only): the same weights under both cores"

# --- 1. one node, rank 1 on another core
mixed="if [ \"\$LOCAL_RANK\" = 1 ]; then export OPENBLAS_CORETYPE=Prescott; fi; exec \"\$0\" \"\$@\""
env -u OPENBLAS_CORETYPE "$TANDEM" launch --standalone --nproc-per-node 2 -- /bin/sh -c "$mixed" \
    "$TANDEM" "${train[@]}" >"$D/mixed.out" 2>"$D/mixed.err"
rc=$?
[ $rc != 0 ] || fail "ranks on different OpenBLAS cores trained: $(tail -3 "$D/mixed.err")"
grep -q "rank 1 runs OpenBLAS core Prescott" "$D/mixed.err" &&
    grep -q "the OpenBLAS core differs" "$D/mixed.err" &&
    grep -q "OPENBLAS_CORETYPE=" "$D/mixed.err" &&
    grep -q -- "--nondeterministic-ok" "$D/mixed.err" ||
    fail "the error does not name rank 1, the core and the fix: $(cat "$D/mixed.err")"
grep -q "step 1/" "$D/mixed.err" && fail "a step ran before the ranks agreed"
echo "one node, rank 1 on Prescott: both ranks stop before the first step, naming it (exit $rc)"
env -u OPENBLAS_CORETYPE "$TANDEM" launch --standalone --nproc-per-node 2 -- /bin/sh -c "$mixed" \
    "$TANDEM" "${train[@]}" --nondeterministic-ok >"$D/ok.out" 2>"$D/ok.err" ||
    fail "--nondeterministic-ok did not train: $(tail -3 "$D/ok.err")"
grep -q "warning: ranks will not compute the same bits" "$D/ok.err" ||
    fail "--nondeterministic-ok trained without the warning"
echo "--nondeterministic-ok: trains, with a warning"

# --- 2. two nodes, node 0's environment picks Prescott, node 1's the default core
OPENBLAS_CORETYPE=Prescott "$TANDEM" launch --standalone --nproc-per-node 2 -- "$TANDEM" \
    "${train[@]}" --save "$D/one-node.st" >"$D/one.out" 2>"$D/one.err" ||
    fail "one node, two workers: $(tail -3 "$D/one.err")"
netns_pair tdn 10.79.0 || fail "could not set up the two namespaces"
EP=10.79.0.1:29400 # a private namespace: nothing else holds this port
export TANDEM_TOKEN=numerics-test-secret
node() { # ns tag node-rank coretype
    ip netns exec "$1" timeout -k 5 120 env OPENBLAS_CORETYPE="$4" "$TANDEM" launch --nnodes 2 \
        --nproc-per-node 1 --node-rank "$3" --rdzv-endpoint "$EP" --rdzv-id numerics \
        --rdzv-timeout 60 -- "$TANDEM" "${train[@]}" --save "$D/two-nodes.st" \
        >"$D/$2.out" 2>"$D/$2.err" &
}
node "$A" n0 0 Prescott; p0=$!
node "$B" n1 1 ""; p1=$!
wait $p0; r0=$?; wait $p1; r1=$?
[ $r0 = 0 ] && [ $r1 = 0 ] || fail "two nodes exited $r0/$r1: $(tail -n 4 "$D"/n0.* "$D"/n1.*)"
grep -q "node 0 runs OpenBLAS core Prescott, this node .*OPENBLAS_CORETYPE=Prescott" "$D/n1.err" ||
    fail "node 1 did not say it pins node 0's core: $(cat "$D/n1.err")"
cmp "$D/one-node.st" "$D/two-nodes.st" ||
    fail "two nodes on different cores did not write one node's bits"
echo "two nodes whose environments pick different cores: node 1 pinned to node 0's, same bits"
echo "test_numerics: ok"
