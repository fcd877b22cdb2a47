#!/usr/bin/env bash
# executors: a Slurm job that cannot start, stops, and a refused submission. 1. A workflow that
# asks for 3 nodes of a 2-node cluster stays pending, and `tandem ps` / `tandem show` give
# Slurm's reason (PartitionConfig); `tandem stop` cancels the job: stopped, no exit code, and
# Slurm shows it CANCELLED. 2. `tandem stop` of a running job: the workers checkpoint (exit 143),
# the run is stopped with exit code 143, and `tandem run --resume` submits a new job that
# resumes from that checkpoint and succeeds. 3. A supervisor killed with -9 leaves its job in
# the queue: `tandem stop` finds and cancels it. 4. sbatch refusing the job fails the run with
# sbatch's message.
set -uo pipefail
. "$(dirname "$0")/exec_test.sh" stop
# state JOB: the job's state as slurmctld knows it
state() { slurm_exec scontrol show job -o "$1" 2>/dev/null | sed -n 's/.* JobState=\([A-Z_]*\) .*/\1/p'; }
t0=$SECONDS
slurm_up 2 || fail "the cluster did not come up"

mkdir -p "$P/.tandem"
cat >"$P/.tandem/workflows.yaml" <<EOF
workflows:
  - name: big
    nodes: 3
    executor: slurm
    command: tandem train --model basicnet --data $TANDEM_DATA --steps 10
  - name: long
    nodes: 2
    executor: slurm
    commands:
      - mkdir -p out
      - >-
        tandem train --model basicnet --data $TANDEM_DATA --steps 120 --batch 32 --threads 1
        --seed 7 --no-progress --checkpoint-every 1000 --save out/w.safetensors
    artifacts: [out/w.safetensors]
  - name: refused
    executor: slurm
    slurm: {sbatch_args: [--partition=nosuch]}
    command: "true"
EOF

# --- 1. pending with Slurm's reason, then stopped
id=$(slurm_exec "$B" run -d big) || fail "tandem run -d big: exit $?"
[ "$id" = big-1 ] || fail "run id '$id'"
# Slurm gives either reason for a job larger than the partition (PartitionConfig when it looks at
# the partition's resources first, PartitionNodeLimit at its node limit): both mean "never".
reason='Partition\(Config\|NodeLimit\)'
slurm_wait 30 "big-1 pending with a reason" sh -c "'$B' ps | grep -q '^big-1 .*pending .*$reason'" ||
    fail "ps: $("$B" ps)"
"$B" ps | grep '^big-1'
"$B" show big-1 | grep -q "^note .*slurm job [0-9]* pending: $reason (it asks for more" ||
    fail "show: $("$B" show big-1)"
jid=$(head -1 "$P/.tandem/runs/big-1/slurm-job")
[ "$(state "$jid")" = PENDING ] || fail "job $jid is '$(state "$jid")', expected PENDING"
out=$("$B" stop big-1) || fail "tandem stop big-1: exit $? ($out)"
grep -q '^run big-1 stopped' <<<"$out" || fail "stop printed: $out"
"$B" show big-1 | grep -q '^note .*stopped by tandem stop: slurm job [0-9]* cancelled before it started' ||
    fail "show after stop: $("$B" show big-1)"
"$B" show big-1 | grep -q '^exit code  *-$' || fail "a job that never ran has no exit code"
[ "$(state "$jid")" = CANCELLED ] || fail "job $jid is '$(state "$jid")' after tandem stop"
echo "3 nodes of 2: pending (PartitionConfig) in ps and show; tandem stop: job $jid CANCELLED, run stopped"

# --- 2. stop a running job: the workers checkpoint; --resume continues it in a new job
id=$(slurm_exec "$B" run -d long) || fail "tandem run -d long: exit $?"
R=$P/.tandem/runs/$id
slurm_wait 90 "$id to train" sh -c "grep -q 'step [0-9]*/120' '$R/logs/rank-0.log' 2>/dev/null" ||
    fail "$id never trained"
jid=$(head -1 "$R/slurm-job")
out=$("$B" stop "$id") || fail "tandem stop $id: exit $? ($out)"
grep -q "^run $id stopped (exit code 143)" <<<"$out" || fail "stop printed: $out"
ck=$(ls "$R/checkpoints" | sort -V | tail -1)
[ -n "$ck" ] || fail "no checkpoint after the stop"
[ "$(state "$jid")" = FAILED ] || fail "job $jid is '$(state "$jid")' (the batch script exits 143)"
slurm_exec timeout -k 5 150 "$B" run --resume "$id" >"$P/resume.log" 2>&1 || fail "resume: exit $?"
"$B" show "$id" | grep -q '^status  *succeeded' || fail "resume: $("$B" show "$id")"
grep -q "resuming from .*$ck at step" "$R/logs/rank-0.log" || fail "the resumed job did not start from $ck"
[ "$(head -1 "$R/slurm-job")" != "$jid" ] || fail "--resume did not submit a new job"
steps=$("$B" metrics "$id" --key train/loss --csv | tail -n +2 | cut -d, -f3 | sort -n | tr '\n' ' ')
[ "$steps" = "$(seq 1 120 | tr '\n' ' ')" ] || fail "train/loss steps: $steps"
echo "tandem stop of running job $jid: stopped (143) at $ck; --resume: job $(head -1 "$R/slurm-job") succeeded"

# --- 3. a supervisor killed by -9: tandem stop cancels what it left in the queue
id=$(slurm_exec "$B" run -d big) || fail "tandem run -d big (2): exit $?"
slurm_wait 30 "$id pending" sh -c "'$B' ps | grep -q '^$id .*pending .*$reason'" || fail "ps: $("$B" ps)"
jid=$(head -1 "$P/.tandem/runs/$id/slurm-job")
pid=$(sed -n 's/^supervisor pid *//p' <<<"$("$B" show "$id")")
kill -9 "$pid" || fail "cannot kill supervisor $pid"
slurm_wait 10 "supervisor $pid to go" sh -c "! kill -0 $pid 2>/dev/null"
out=$(slurm_exec "$B" stop "$id") || fail "tandem stop $id (orphan): exit $? ($out)"
grep -q "cancelled slurm job $jid of run $id" <<<"$out" || fail "stop of the orphan printed: $out"
for _ in $(seq 50); do [ "$(state "$jid")" = CANCELLED ] && break; sleep 0.2; done
[ "$(state "$jid")" = CANCELLED ] || fail "job $jid is '$(state "$jid")' after tandem stop"
echo "supervisor killed: tandem stop cancelled its job $jid"

# --- 4. sbatch refuses the job
slurm_exec "$B" run refused >"$P/refused.log" 2>&1 && fail "a refused job succeeded"
"$B" show refused-1 | grep -q "^note .*sbatch refused the run's job (exit code 1): .*partition" ||
    fail "refused: $("$B" show refused-1)"
echo "sbatch refusal: $("$B" show refused-1 | sed -n 's/^note *//p')"
echo "ok: $((SECONDS - t0)) s"
