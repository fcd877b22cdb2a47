#!/bin/bash
# launch: `tandem launch` with no rendezvous flag takes its topology from the scheduler that
# started it (src/launch/detect.c). 1. Two launchers on this machine in a synthetic two-node srun
# step (SLURM_STEP_NODELIST=127.0.0.[1-2]: both "hosts" are this machine's loopback) form one job
# of WORLD_SIZE 2, print the topology line, and train mlp7 together; without detection
# (TANDEM_LAUNCH_DETECT=0) the same environment gives two separate one-rank jobs. 2. Flags win.
# 3. A launcher started twice per node, or a node id beyond the node count, exits 2 at once
# naming the variables. 4. Under a real mpirun: one process is a one-node job, two on one node
# are refused. 5. Where tests/lib/slurm.sh can start a real two-node Slurm cluster:
# `srun -N2 --ntasks-per-node=1 tandem launch` with no flags.
set -u -f # -f: the nodelists' brackets are not globs
TANDEM=${TANDEM_BIN:?TANDEM_BIN not set}
SRC=${TANDEM_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
DATA=${TANDEM_DATA:-/usr/share/datasets/fashion-mnist}
D=$(mktemp -d /tmp/tandem-detect-XXXXXX)
trap 'rm -rf "$D"' EXIT
fail() {
    echo "FAIL: $*" >&2
    for f in "$D"/*.err "$D"/*.out; do [ -f "$f" ] && { echo "--- $f" >&2; tail -20 "$f" >&2; }; done
    exit 1
}

# Whatever scheduler runs this test suite must not leak into the synthetic environments.
unset TANDEM_LAUNCH_DETECT MASTER_ADDR MASTER_PORT
for v in $(env | sed -n 's/^\(\(SLURM\|OMPI\|PMIX\|SKYPILOT\|DSTACK\|SM\)_[A-Za-z0-9_]*\)=.*/\1/p'); do
    unset "$v"
done
export TANDEM_TOKEN=detect-test-$$ # no token warning; the launchers share it as srun would

envdump="$D/env.sh"
cat >"$envdump" <<'EOS'
#!/bin/sh
echo "RANK=$RANK WORLD_SIZE=$WORLD_SIZE GROUP_RANK=$GROUP_RANK MASTER_ADDR=$MASTER_ADDR RUN=$TANDEM_RUN_ID"
EOS
chmod +x "$envdump"

# slurm_env JOB NODEID [TASKS]: an srun step of 2 nodes, one task per node unless TASKS says.
slurm_env() {
    echo SLURM_JOB_ID="$1" SLURM_JOBID="$1" SLURM_STEP_ID=0 SLURM_STEPID=0 SLURM_NNODES=2 \
        SLURM_JOB_NUM_NODES=2 SLURM_STEP_NUM_NODES=2 SLURM_STEP_NUM_TASKS="${3:-2}" \
        SLURM_NODEID="$2" SLURM_PROCID="$2" SLURM_LOCALID=0 'SLURM_JOB_NODELIST=127.0.0.[1-2]' \
        'SLURM_STEP_NODELIST=127.0.0.[1-2]' SLURM_TASKS_PER_NODE='1(x2)'
}
# two_nodes TAG JOB CMD...: both launchers of the synthetic step, in the background; waits.
two_nodes() {
    local tag=$1 job=$2 p0 p1
    shift 2
    # A bound on each launcher, so that a hang fails this test instead of outliving it.
    timeout -k 5 120 env $(slurm_env "$job" 0) "$TANDEM" launch --rdzv-timeout 60 "$@" \
        >"$D/$tag-0.out" 2>"$D/$tag-0.err" &
    p0=$!
    timeout -k 5 120 env $(slurm_env "$job" 1) "$TANDEM" launch --rdzv-timeout 60 "$@" \
        >"$D/$tag-1.out" 2>"$D/$tag-1.err" &
    p1=$!
    wait $p0
    r0=$?
    wait $p1
    r1=$?
}
# The store's port is 20000 + job id mod 10000, except for the few ports detect.c keeps clear of.
# A random job id whose port is not one of those, retried when something else holds the port.
avoided=" 20048 24007 24008 27000 27001 27002 27003 27004 27005 27006 27007 27008 27009 27017 27018 27019 29400 29500 "
run_two() {
    local tag=$1 try
    r0=1 r1=1
    shift
    for try in 1 2 3; do
        job=$((100000 + RANDOM))
        [[ $avoided == *" $((20000 + job % 10000)) "* ]] && continue
        two_nodes "$tag" "$job" "$@"
        [ $r0 = 0 ] && [ $r1 = 0 ] && return
        grep -q "cannot host the rendezvous store" "$D/$tag-0.err" || return
    done
}

# --- 1. two launchers, one synthetic Slurm step, no flags
run_two env --nproc-per-node 1 -- "$envdump"
[ $r0 = 0 ] && [ $r1 = 0 ] || fail "launchers under a synthetic Slurm step: exit $r0/$r1"
port=$((20000 + job % 10000))
for n in 0 1; do
    want="tandem: topology from Slurm: node $n of 2, rendezvous 127.0.0.1:$port, run id slurm-$job.0"
    grep -qxF "$want" "$D/env-$n.err" || fail "node $n: no line '$want'"
    line=$(grep '^\[rank' "$D/env-$n.out")
    want="[rank $n] RANK=$n WORLD_SIZE=2 GROUP_RANK=$n MASTER_ADDR=127.0.0.1 RUN=slurm-$job.0"
    [ "$line" = "$want" ] || fail "node $n: got '$line', expected '$want'"
done
echo "synthetic srun step, 2 nodes: one job of WORLD_SIZE 2, store on 127.0.0.1:$port"

# Without detection the same environment makes two jobs of one rank each: what this feature fixes.
TANDEM_LAUNCH_DETECT=0 timeout -k 5 60 env $(slurm_env "$job" 1) "$TANDEM" launch -- "$envdump" \
    >"$D/off.out" 2>"$D/off.err" || fail "TANDEM_LAUNCH_DETECT=0: exit $?"
grep -q "topology from" "$D/off.err" && fail "TANDEM_LAUNCH_DETECT=0 still detected a topology"
grep -q "^\[rank 0\] RANK=0 WORLD_SIZE=1 " "$D/off.out" || fail "TANDEM_LAUNCH_DETECT=0: $(cat "$D/off.out")"
echo "TANDEM_LAUNCH_DETECT=0: a standalone job of 1 rank, as before"

# Training across the two "nodes": the workers meet through the store the launchers found.
if [ -r "$DATA/train-images-idx3-ubyte.gz" ] || [ -r "$DATA/train-images-idx3-ubyte" ]; then
    run_two train --nproc-per-node 1 -- "$TANDEM" train --model mlp7 \
        --data "$DATA" --steps 3 --batch 32 --threads 1 --json --no-progress
    [ $r0 = 0 ] && [ $r1 = 0 ] || fail "tandem train under a synthetic Slurm step: exit $r0/$r1"
    js=$(grep -m1 '^\[rank 0\] {' "$D/train-0.out") || fail "rank 0 printed no json summary"
    [[ $js =~ \"world_size\":2[,}] && $js =~ \"steps\":3[,}] ]] || fail "rank 0's summary: $js"
    echo "tandem train --model mlp7 --steps 3 across the two launchers: world_size 2"
else
    echo "no Fashion-MNIST at $DATA: training part skipped"
fi

# --- 2. flags win over the environment, all or nothing
timeout -k 5 60 env $(slurm_env "$job" 1) "$TANDEM" launch --standalone --nproc-per-node 2 -- \
    "$envdump" >"$D/flag.out" 2>"$D/flag.err" || fail "--standalone in a Slurm step: exit $?"
grep -q "topology from" "$D/flag.err" && fail "--standalone: the environment was still used"
[ "$(grep -c 'WORLD_SIZE=2 GROUP_RANK=0 ' "$D/flag.out")" = 2 ] || fail "--standalone: $(cat "$D/flag.out")"
timeout -k 5 60 env $(slurm_env "$job" 1) "$TANDEM" launch --nnodes 1 -- "$envdump" \
    >"$D/flag.out" 2>"$D/flag.err" || fail "--nnodes 1 in a Slurm step: exit $?"
grep -q "WORLD_SIZE=1 " "$D/flag.out" || fail "--nnodes 1: $(cat "$D/flag.out")"
echo "--standalone / --nnodes: the flags, not the environment"

# --- 3. refused at once, exit 2, naming the variables
t0=$(date +%s%N)
env $(slurm_env 7 0 4) "$TANDEM" launch -- true >"$D/e1.out" 2>"$D/e1.err"
rc=$?
[ $rc = 2 ] || fail "two launchers per node: exit $rc, expected 2"
grep -q "SLURM_STEP_NUM_TASKS=4 on SLURM_STEP_NUM_NODES=2 nodes" "$D/e1.err" &&
    grep -qF 'srun --ntasks-per-node=1 tandem launch' "$D/e1.err" || fail "two per node: $(cat "$D/e1.err")"
env $(slurm_env 7 3) "$TANDEM" launch -- true >"$D/e2.out" 2>"$D/e2.err"
rc=$?
[ $rc = 2 ] || fail "SLURM_NODEID=3: exit $rc, expected 2"
grep -q "SLURM_NODEID=3 but SLURM_STEP_NUM_NODES=2" "$D/e2.err" || fail "node id: $(cat "$D/e2.err")"
ms=$((($(date +%s%N) - t0) / 1000000))
[ $ms -lt 5000 ] || fail "the refusals took $ms ms: they must not wait for a rendezvous"
echo "two launchers per node / SLURM_NODEID beyond the nodes: exit 2 in $ms ms, naming them"

# --- 4. a real mpirun
if command -v mpirun >/dev/null; then
    root=()
    [ "$(id -u)" = 0 ] && root=(--allow-run-as-root)
    timeout -k 5 60 mpirun "${root[@]}" -np 1 "$TANDEM" launch --nproc-per-node 2 -- "$envdump" \
        >"$D/mpi.out" 2>"$D/mpi.err" || fail "mpirun -np 1 tandem launch: exit $?"
    grep -q "topology from Open MPI: 1 node, standalone, run id ompi-" "$D/mpi.err" ||
        fail "mpirun -np 1: no topology line"
    [ "$(grep -c 'WORLD_SIZE=2 ' "$D/mpi.out")" = 2 ] || fail "mpirun -np 1: $(cat "$D/mpi.out")"
    timeout -k 5 60 mpirun "${root[@]}" --oversubscribe -np 2 "$TANDEM" launch -- true \
        >"$D/mpi2.out" 2>"$D/mpi2.err" && fail "mpirun -np 2 on one node was not refused"
    grep -q "OMPI_COMM_WORLD_LOCAL_SIZE=2" "$D/mpi2.err" && grep -q "ppr:1:node" "$D/mpi2.err" ||
        fail "mpirun -np 2: $(head -3 "$D/mpi2.err")"
    echo "mpirun -np 1: one node; mpirun -np 2 on one node: refused, naming OMPI_COMM_WORLD_LOCAL_SIZE"
else
    echo "mpirun not installed: Open MPI part skipped"
fi

# --- 5. a real Slurm cluster, where the fixture can start one (root, Slurm's packages). It runs
# in a subshell: its skip (exit 77) skips only this part.
if [ -f "$SRC/tests/lib/slurm.sh" ]; then
    (
        . "$SRC/tests/lib/slurm.sh"
        trap slurm_down EXIT
        slurm_up 2 >"$D/cluster.log" 2>&1 || exit $?
        slurm_exec timeout -k 5 120 srun -N2 --ntasks-per-node=1 "$TANDEM" launch \
            --nproc-per-node 2 --rdzv-timeout 60 -- "$envdump" >"$D/real.out" 2>"$D/real.err" ||
            { echo "srun -N2 tandem launch: exit $?"; exit 1; }
        got=$(grep -o 'RANK=[0-9] WORLD_SIZE=[0-9] GROUP_RANK=[0-9]' "$D/real.out" | sort | tr '\n' ' ')
        want="RANK=0 WORLD_SIZE=4 GROUP_RANK=0 RANK=1 WORLD_SIZE=4 GROUP_RANK=0 RANK=2 WORLD_SIZE=4 GROUP_RANK=1 RANK=3 WORLD_SIZE=4 GROUP_RANK=1 "
        [ "$got" = "$want" ] || { echo "srun -N2: ranks '$got'"; exit 1; }
        [ "$(grep -c "topology from Slurm: node [01] of 2, rendezvous ${TDS_NODES[0]}:" "$D/real.err")" = 2 ] ||
            { echo "srun -N2: topology lines: $(cat "$D/real.err")"; exit 1; }
        slurm_exec timeout -k 5 60 srun -N2 --ntasks-per-node=2 "$TANDEM" launch -- true \
            >"$D/real2.out" 2>"$D/real2.err" && { echo "srun --ntasks-per-node=2 was not refused"; exit 1; }
        grep -q "SLURM_STEP_NUM_TASKS=4 on SLURM_STEP_NUM_NODES=2" "$D/real2.err" ||
            { echo "srun --ntasks-per-node=2: $(head -3 "$D/real2.err")"; exit 1; }
    ) >"$D/real.log" 2>&1
    rc=$?
    case $rc in
    0) echo "real Slurm cluster: srun -N2 --ntasks-per-node=1 tandem launch (no flags): WORLD_SIZE 4;" \
        "--ntasks-per-node=2 refused" ;;
    77) echo "real Slurm cluster part skipped: $(grep -m1 SKIP "$D/real.log" "$D/cluster.log" 2>/dev/null)" ;;
    *) cat "$D/real.log" "$D/cluster.log" >&2 2>/dev/null; fail "real Slurm cluster part (exit $rc)" ;;
    esac
fi
echo "test_detect_slurm: ok"
