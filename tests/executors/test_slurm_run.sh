#!/usr/bin/env bash
# executors: `tandem run` of a workflow with `executor: slurm` on a real two-node Slurm cluster
# (tests/lib/slurm.sh). 1. BasicNet on 2 nodes x 1 worker, submitted with sbatch and supervised
# through scontrol, ends succeeded with weights bitwise equal to 2 local workers (`tandem launch
# --standalone --nproc-per-node 2`), the artifact stored, both nodes' rank logs and every step's
# metrics in the run store. 2. The workers' environment under Slurm is the local executor's
# (the same TANDEM_* variables and values, the workflow's env and params, PATH), the token
# file is private, and a workflow's secret reaches node 2's worker without being in the batch
# script. 4. nproc_per_node: auto (issue 30) is counted on the cluster before the job (sinfo):
# each node runs as many workers as its CPUs in `scontrol show node` (CPUTot), the batch script
# asks for that many CPUs per task and no GPU, the record holds the count; gpu on a partition
# without GPUs, and auto where no node matches a constraint, are refused before any run.
set -uo pipefail
. "$(dirname "$0")/exec_test.sh" run
t0=$SECONDS
slurm_up 2 || fail "the cluster did not come up"
n1=${TDS_NODES[0]} n2=${TDS_NODES[1]}

mkdir -p "$P/.tandem"
train="tandem train --model basicnet --data $TANDEM_DATA --steps 40 --batch 32 --threads 1 --seed 7 --no-progress"
cat >"$P/.tandem/workflows.yaml" <<EOF
workflows:
  - name: bn
    nodes: 2
    executor: slurm
    commands:
      - mkdir -p out
      - $train --save out/w.safetensors
    artifacts: [out/w.safetensors]
  # what each worker sees, under either executor
  - name: env-slurm
    nodes: 2
    executor: slurm
    slurm: {time: '10:00', signal_lead: 30s}
    env: {TD_WF_VAR: "a b'c"}
    secrets: [TD_SLURM_SECRET]
    params: {tag: blue}
    command: echo \${{ params.tag }} >/dev/null; env | sort >"\$TANDEM_RUN_DIR/env-\$RANK"
  # a worker on the second node fails on a bad argument
  - name: badarg
    nodes: 2
    executor: slurm
    command: |
      if [ "\$GROUP_RANK" = 1 ]; then exec tandem train --model basicnet --lr abc; fi
      sleep 30
  # issue 30: the count taken on the cluster
  - name: nproc-auto
    nodes: 2
    executor: slurm
    nproc_per_node: auto
    command: echo "where rank \$RANK host \$(hostname) local \$LOCAL_WORLD_SIZE world \$WORLD_SIZE"
  - name: nproc-gpu
    nodes: 2
    executor: slurm
    nproc_per_node: gpu
    command: "true"
  - name: nproc-none
    executor: slurm
    nproc_per_node: auto
    slurm: {sbatch_args: [--constraint=nosuchfeature]}
    command: "true"
  - name: env-local
    nodes: 2
    env: {TD_WF_VAR: "a b'c"}
    params: {tag: blue}
    command: echo \${{ params.tag }} >/dev/null; env | sort >"\$TANDEM_RUN_DIR/env-\$RANK"
EOF

# --- 1. training on two Slurm nodes == two local workers
# tandem run is a client of the cluster: it runs on the login node (slurm_exec), like sbatch.
slurm_exec timeout -k 5 150 "$B" run bn >"$P/run.log" 2>&1 || fail "tandem run bn: exit $?"
R=$P/.tandem/runs/bn-1
grep -q "submitted slurm job" "$P/run.log" || fail "no 'submitted slurm job' line"
grep -q "slurm job [0-9]* running on " "$P/run.log" || fail "never saw the job running"
show=$("$B" show bn-1) || fail "tandem show bn-1"
grep -q '^status  *succeeded' <<<"$show" || fail "bn-1 did not succeed: $show"
grep -q '^note .*slurm job [0-9]* completed on ' <<<"$show" || fail "note: $show"
grep -q '^executor  *slurm job [0-9]*; batch script .*/job.sbatch' <<<"$show" || fail "no executor line: $show"
jid=$(head -1 "$R/slurm-job") || fail "no RUN/slurm-job"
[ -s "$R/logs/slurm-$jid.err" ] || fail "no job stderr in logs/slurm-$jid.err"
# one launcher per node, each found its place through Slurm's variables
for n in 0 1; do
    grep -q "topology from Slurm: node $n of 2" "$R/logs/slurm-$jid.err" ||
        fail "launcher of node $n did not detect Slurm: $(cat "$R/logs/slurm-$jid.err")"
done
[ -s "$R/artifacts/out/w.safetensors" ] || fail "artifact not stored"
[ "$(stat -c %a "$R/token")" = 600 ] || fail "token file is $(stat -c %a "$R/token"), not 600"

timeout -k 5 150 "$B" launch --standalone --nproc-per-node 2 -- "$B" ${train#tandem } --save "$P/w-local.safetensors" \
    >"$P/local.log" 2>&1 || fail "2 local workers: exit $?"
cmp "$R/artifacts/out/w.safetensors" "$P/w-local.safetensors" ||
    fail "weights differ: 2 Slurm nodes vs 2 local workers"
echo "executor slurm, 2 nodes x 1 worker == 2 local workers: bitwise-identical weights" \
     "($(sha256sum <"$P/w-local.safetensors" | cut -c1-16))"

# the run store has both nodes' logs and every step once
logs=$("$B" logs bn-1) || fail "tandem logs"
grep -q '^\[rank 0\] .*training basicnet' <<<"$logs" || fail "rank 0's log: $(head -5 <<<"$logs")"
[ -f "$R/logs/rank-1.log" ] || fail "no rank-1.log (node 2's worker)"
"$B" show bn-1 | grep -q "logs/rank-1.log" || fail "rank-1.log not recorded"
steps=$("$B" metrics bn-1 --key train/loss --csv | tail -n +2 | cut -d, -f3 | sort -n | tr '\n' ' ')
[ "$steps" = "$(seq 1 40 | tr '\n' ' ')" ] || fail "train/loss steps: $steps"
"$B" ps | grep -q '^bn-1 .* succeeded .* 40 ' || fail "ps: $("$B" ps)"
# system metrics: each node's launcher sampled its worker (the supervisor sees no node's /proc)
sys=$("$B" metrics bn-1 --key sys/cpu_percent --csv | tail -n +2 | cut -d, -f1 | sort -u | tr '\n' ' ')
[ "$sys" = "0 1 " ] || fail "sys/cpu_percent ranks: '$sys' (want 0 and 1)"
ls "$R/metrics/" | grep -q "^sys-$n1.jsonl$" || fail "no sys-$n1.jsonl: $(ls "$R/metrics")"
echo "run store: status succeeded, rank logs of both nodes, train/loss steps 1..40 once each," \
     "both nodes' system metrics"

# --- 2. the workers' environment: as the local executor's
secret="slurm-secret-$$-$RANDOM$RANDOM" # secrets: travel in sbatch's environment, not the script
export TD_SLURM_SECRET=$secret
slurm_exec timeout -k 5 60 "$B" run env-slurm >"$P/env-slurm.log" 2>&1 || fail "env-slurm: exit $?"
"$B" run env-local >"$P/env-local.log" 2>&1 || fail "env-local: exit $?"
# What may differ: the run's id and directory, the store's token, address and (local nodes)
# inherited socket, all per job, TANDEM_LAUNCH_DETECT, which the batch script pins to 1, and
# TANDEM_SYS_METRICS, which asks the Slurm nodes' launchers to sample their workers.
norm() { # FILE RUN_ID
    grep -E '^(TANDEM_|TD_WF_VAR=|PATH=|RANK=|WORLD_SIZE=|LOCAL_RANK=|GROUP_RANK=)' "$1" |
        grep -vE '^TANDEM_(TOKEN|STORE_ADDR|STORE_LISTEN_FD|LAUNCH_DETECT|SYS_METRICS)=' |
        sed "s#$P/.tandem/runs/$2#RUN#g; s#=$2\$#=ID#"
}
for r in 0 1; do
    [ -f "$P/.tandem/runs/env-slurm-1/env-$r" ] || fail "no env of slurm rank $r"
    diff <(norm "$P/.tandem/runs/env-local-1/env-$r" env-local-1) \
        <(norm "$P/.tandem/runs/env-slurm-1/env-$r" env-slurm-1) >"$P/env.diff" ||
        fail "rank $r's environment differs (local < > slurm): $(cat "$P/env.diff")"
done
e1=$P/.tandem/runs/env-slurm-1/env-1
grep -qx "TD_WF_VAR=a b'c" "$e1" || fail "workflow env missing on node 2"
grep -qx "TANDEM_PARAM_TAG=blue" "$e1" || fail "TANDEM_PARAM_TAG missing on node 2"
grep -qx "TANDEM_RUN_ID=env-slurm-1" "$e1" || fail "TANDEM_RUN_ID on node 2"
grep -qx "TANDEM_TOKEN=$(cat "$P/.tandem/runs/env-slurm-1/token")" "$e1" || fail "token not from the file"
grep -q "^PATH=$(dirname "$B"):" "$e1" || fail "PATH does not start with tandem's directory"
! grep -q '^TANDEM_RESUME=' "$e1" || fail "TANDEM_RESUME set in a fresh run"
grep -q "^SLURM_JOB_ID=" "$e1" || fail "not run by Slurm?"
grep -qx "TD_SLURM_SECRET=$secret" "$e1" || fail "the secret did not reach node 2's worker"
grep -qF "$secret" "$P/.tandem/runs/env-slurm-1/job.sbatch" "$P/env-slurm.log" &&
    fail "the secret's value is in the batch script or tandem run's output"
grep -q "#SBATCH --time=0-00:10:00" "$P/.tandem/runs/env-slurm-1/job.sbatch" || fail "no --time"
grep -q "#SBATCH --signal=B:USR1@30" "$P/.tandem/runs/env-slurm-1/job.sbatch" || fail "no --signal"
hosts=$(grep -h '^SLURMD_NODENAME=' "$P"/.tandem/runs/env-slurm-1/env-* | sort | tr '\n' ' ')
[ "$hosts" = "SLURMD_NODENAME=$n1 SLURMD_NODENAME=$n2 " ] || fail "workers ran on: $hosts"
echo "environment: the same TANDEM_* variables and values as the local executor on $n1 and $n2"

# --- 3. a worker's bad argument on node 2: the run's note and exit code are that worker's, from
# its launcher's end record in the shared run directory (not from the job's stderr)
slurm_exec timeout -k 5 120 "$B" run badarg >"$P/badarg.log" 2>&1 && fail "a run with --lr abc succeeded"
. "$SRC/tests/lib/bad_argument.sh"
expect_bad_argument badarg-1 1
echo "a worker's bad argument on $n2: the run's note and exit code are that worker's"

# --- 4. nproc_per_node: auto counted on the cluster (sinfo), against scontrol's CPUTot
c1=$(slurm_exec scontrol show node "$n1" | grep -o 'CPUTot=[0-9]*' | cut -d= -f2)
c2=$(slurm_exec scontrol show node "$n2" | grep -o 'CPUTot=[0-9]*' | cut -d= -f2)
[ -n "$c1" ] && [ "$c1" = "$c2" ] || fail "the fixture's nodes: CPUTot '$c1' and '$c2'"
c=$c1
slurm_exec timeout -k 5 120 "$B" run nproc-auto >"$P/nproc-auto.log" 2>&1 || fail "nproc-auto: exit $?: $(cat "$P/nproc-auto.log")"
grep -q "^tandem run: nproc_per_node auto: $c workers\\?, one per CPU of each of the default partition tandem's 2 nodes (sinfo: $c CPUs, GRES " "$P/nproc-auto.log" ||
    fail "the count is not said as $c (CPUTot): $(cat "$P/nproc-auto.log")"
R=$P/.tandem/runs/nproc-auto-1
grep -qx "#SBATCH --cpus-per-task=$c" "$R/job.sbatch" || fail "the job does not ask $c CPUs per task: $(grep SBATCH "$R/job.sbatch")"
! grep -q -- "--gres" "$R/job.sbatch" || fail "a CPU count asked for GPUs: $(grep gres "$R/job.sbatch")"
"$B" show nproc-auto-1 | grep -qE "^workers  *2 node\(s\) x $c process\(es\)$" ||
    fail "the record is not 2 x $c workers: $("$B" show nproc-auto-1 | head -15)"
for ((r = 0; r < 2 * c; r++)); do
    want=$n1
    [ "$r" -ge "$c" ] && want=$n2
    grep -qx "where rank $r host $want local $c world $((2 * c))" "$R/logs/rank-$r.log" ||
        fail "nproc-auto: rank $r's log: $(cat "$R/logs/rank-$r.log" 2>&1), want host $want local $c world $((2 * c))"
done
[ ! -e "$R/logs/rank-$((2 * c)).log" ] || fail "nproc-auto: more than $((2 * c)) ranks"
out=$(slurm_exec timeout -k 5 60 "$B" run nproc-gpu 2>&1) && fail "nproc_per_node: gpu without GPUs ran: $out"
grep -q "nproc_per_node: gpu counts the GPUs of the Slurm nodes, and the default partition tandem has none" <<<"$out" ||
    fail "the gpu refusal does not name the partition: $out"
out=$(slurm_exec timeout -k 5 60 "$B" run --executor slurm --nproc-per-node gpu -- true 2>&1) &&
    fail "tandem run --executor slurm --nproc-per-node gpu ran: $out"
grep -q "and the default partition tandem has none" <<<"$out" || fail "the command's gpu refusal: $out"
out=$(slurm_exec timeout -k 5 60 "$B" run nproc-none 2>&1) && fail "a constraint no node has was counted: $out"
grep -q "sinfo lists no node for the default partition, constraint nosuchfeature" <<<"$out" ||
    fail "the refusal of a constraint no node has: $out"
[ -z "$("$B" ps -a 2>/dev/null | grep -E 'nproc-(gpu|none)|^true-')" ] || fail "a refused count made a run: $("$B" ps -a)"
echo "nproc_per_node: auto on Slurm: $c workers per node (CPUTot), cpus-per-task $c; gpu refused naming partition tandem"
echo "ok: $((SECONDS - t0)) s"
