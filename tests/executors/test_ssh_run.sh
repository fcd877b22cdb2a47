#!/usr/bin/env bash
# executors: `tandem run` of a workflow with `executor: ssh` on two hosts with their own sshd
# (tests/lib/sshd.sh), sharing no directory with the submitting machine: the project (and so the
# run directory) is hidden on both hosts, and each host's remote work directory is a tmpfs of
# its own. 1. BasicNet on 2 hosts x 1 worker ends succeeded with weights bitwise equal to 2
# local workers; the code was copied; both ranks' logs and every step's metrics reached the run
# store through the agents' links, once each. 2. Killing one host's agent (SIGKILL) stops the
# other within seconds; with max_restarts: 1 the run starts again on both hosts, resumes from
# node 0's checkpoint (which only node 0's host has) and ends with the uninterrupted run's
# bits, restarts 1, every step's metrics once. 3. `tandem stop` of a running run: stopped (143)
# after the workers checkpointed on node 0's host; `tandem run --resume` continues it there to
# the same bits. 4. An unknown host and a missing tandem on a host fail the run at once, saying
# which host and what to do.
set -uo pipefail
: "${TANDEM_BIN:?}" "${TANDEM_DATA:?}"
SRC=${TANDEM_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
B=$TANDEM_BIN
. "$SRC/tests/lib/sshd.sh"
sshd_project exec-ssh
# the run directory really is out of the hosts' sight
sshd_exec ssh "$h1" "test -e '$P/.tandem' || test -e '$P/marker'" && fail "host 1 sees the project"
mkdir -p "$P/.tandem" "$P/scripts"
echo "code the hosts must receive" >"$P/scripts/note.txt"

train="tandem train --model basicnet --data $TANDEM_DATA --batch 32 --threads 1 --seed 7 --no-progress"
cat >"$P/.tandem/workflows.yaml" <<EOF
workflows:
  - name: bn
    executor: ssh
    ssh: {hosts: [$h1, $h2], work_dir: $REMOTE}
    commands:
      - mkdir -p out
      - cat scripts/note.txt >/dev/null
      - $train --steps 40 --save out/w.safetensors
    artifacts: [out/w.safetensors]
  - name: long
    executor: ssh
    ssh: {hosts: [$h1, $h2], work_dir: $REMOTE}
    max_restarts: 1
    commands:
      - mkdir -p out
      - $train --steps 300 --checkpoint-dir "\$TANDEM_CHECKPOINT_DIR" --checkpoint-every 10 --save out/w.safetensors
    artifacts: [out/w.safetensors]
  - name: stopme
    executor: ssh
    ssh: {hosts: [$h1, $h2], work_dir: $REMOTE}
    commands:
      - mkdir -p out
      - $train --steps 300 --checkpoint-dir "\$TANDEM_CHECKPOINT_DIR" --checkpoint-every 10 --save out/w.safetensors
    artifacts: [out/w.safetensors]
  - name: nohost
    executor: ssh
    ssh: {hosts: [$h1, nosuch.invalid]}
    command: "true"
  - name: badarg
    executor: ssh
    ssh: {hosts: [$h1, $h2], work_dir: $REMOTE}
    command: |
      if [ "\$GROUP_RANK" = 1 ]; then exec tandem train --model basicnet --lr abc; fi
      sleep 30
  - name: notandem
    executor: ssh
    ssh: {hosts: [$h1], tandem: /nonexistent/tandem}
    command: "true"
EOF

# --- 1. two ssh hosts == two local workers
sshd_exec timeout -k 5 150 "$B" run bn >"$P/run.log" 2>&1 || fail "tandem run bn: exit $?"
R=$P/.tandem/runs/bn-1
show=$("$B" show bn-1) || fail "tandem show bn-1"
grep -q '^status  *succeeded' <<<"$show" || fail "bn-1 did not succeed: $show"
grep -q "^executor  *ssh: node 0 on $h1 (copied $REMOTE/bn-1); node 1 on $h2 (copied $REMOTE/bn-1)" <<<"$show" ||
    fail "executor line: $show"
sshd_host_exec 2 test -s "$REMOTE/bn-1/work/scripts/note.txt" || fail "the code did not reach host 2"
[ -s "$R/artifacts/out/w.safetensors" ] || fail "artifact not stored"
timeout -k 5 150 "$B" launch --standalone --nproc-per-node 2 -- "$B" ${train#tandem } --steps 40 \
    --save "$P/w-local.safetensors" >"$P/local.log" 2>&1 || fail "2 local workers: exit $?"
cmp "$R/artifacts/out/w.safetensors" "$P/w-local.safetensors" ||
    fail "weights differ: 2 ssh hosts vs 2 local workers"
echo "executor ssh, 2 hosts x 1 worker, no shared directory == 2 local workers: bitwise-identical" \
     "weights ($(sha256sum <"$P/w-local.safetensors" | cut -c1-16))"
# logs and metrics came over the links: the hosts could not write them here
grep -q '^\[rank 0\] .*training basicnet' "$P/run.log" || fail "rank 0's lines not echoed"
[ -f "$R/logs/rank-1.log" ] || fail "no rank-1.log from host 2"
"$B" logs bn-1 | grep -q '^\[rank 0\] .*step 40/40' || fail "rank 0's log: $("$B" logs bn-1 | tail -3)"
steps=$("$B" metrics bn-1 --key train/loss --csv | tail -n +2 | cut -d, -f3 | sort -n | tr '\n' ' ')
[ "$steps" = "$(seq 1 40 | tr '\n' ' ')" ] || fail "train/loss steps: $steps"
cmp <(sshd_host_exec 1 cat "$REMOTE/bn-1/agent/logs/rank-0.log") "$R/logs/rank-0.log" ||
    fail "the run store's rank-0.log differs from host 1's"
sys=$("$B" metrics bn-1 --key sys/cpu_percent --csv | tail -n +2 | cut -d, -f1 | sort -u | tr '\n' ' ')
[ "$sys" = "0 1 " ] || fail "sys/cpu_percent ranks: '$sys' (want 0 and 1, sampled on each host)"
[ -s "$R/metrics/sys-$h2.jsonl" ] || fail "no sys-$h2.jsonl from host 2: $(ls "$R/metrics")"
echo "run store: both ranks' logs (equal to the hosts' own), train/loss steps 1..40 once each," \
     "each host's system metrics"

# --- 2. one host's agent killed: the other stops, the run restarts and resumes
sshd_exec timeout -k 5 240 "$B" run long >"$P/long.log" 2>&1 &
sup=$!
RL=$REMOTE/long-1
for _ in $(seq 1 600); do
    sshd_host_exec 1 test -e "$RL/checkpoints/ckpt-20.tdck" 2>/dev/null && break
    kill -0 $sup 2>/dev/null || fail "the run ended before its second checkpoint"
    sleep 0.1
done
sshd_host_exec 1 test -e "$RL/checkpoints/ckpt-20.tdck" || fail "no checkpoint on host 1 after 60 s"
sshd_host_exec 2 test -e "$RL/checkpoints/ckpt-20.tdck" && fail "host 2 has node 0's checkpoints: shared?"
sshd_host_exec 2 pkill -KILL -f 'tandem launch' || fail "no agent to kill on host 2"
t_kill=$SECONDS
for _ in $(seq 1 300); do
    grep -q "restarting every node" "$P/long.log" && break
    sleep 0.1
done
grep -q "restarting every node" "$P/long.log" || fail "no restart 30 s after the kill"
echo "host 2's agent killed: the attempt ended and the restart began after $((SECONDS - t_kill)) s"
[ $((SECONDS - t_kill)) -le 20 ] || fail "the other host took more than 20 s to stop"
wait $sup || fail "tandem run long: exit $?"
show=$("$B" show long-1)
grep -q '^status  *succeeded' <<<"$show" || fail "long-1 did not succeed: $show"
grep -q '^restarts  *1$' <<<"$show" || fail "restarts: $show"
grep -q 'resuming from .*ckpt-[0-9]*.tdck' "$P/.tandem/runs/long-1/logs/rank-0.log" ||
    fail "rank 0 did not resume from a checkpoint"
timeout -k 5 200 "$B" launch --standalone --nproc-per-node 2 -- "$B" ${train#tandem } --steps 300 \
    --save "$P/w-long.safetensors" >"$P/local-long.log" 2>&1 || fail "2 local workers, 300 steps"
cmp "$P/.tandem/runs/long-1/artifacts/out/w.safetensors" "$P/w-long.safetensors" ||
    fail "weights differ: killed and resumed on ssh hosts vs uninterrupted"
steps=$("$B" metrics long-1 --key train/loss --csv | tail -n +2 | cut -d, -f3 | sort -n | tr '\n' ' ')
[ "$steps" = "$(seq 1 300 | tr '\n' ' ')" ] || fail "train/loss steps after the restart: ${steps:0:300}"
echo "killed, restarted and resumed: succeeded, restarts 1, the uninterrupted run's bits, steps" \
     "1..300 once each"

# --- 3. tandem stop, then tandem run --resume
sshd_exec "$B" run -d stopme >"$P/stopme.log" 2>&1 || fail "tandem run -d stopme: exit $?"
RS=$REMOTE/stopme-1
for _ in $(seq 1 600); do
    sshd_host_exec 1 test -e "$RS/checkpoints/ckpt-30.tdck" 2>/dev/null && break
    sleep 0.1
done
sshd_host_exec 1 test -e "$RS/checkpoints/ckpt-30.tdck" || fail "stopme: no checkpoint after 60 s"
"$B" stop stopme-1 >"$P/stop.log" 2>&1 || fail "tandem stop: $(cat "$P/stop.log")"
grep -q "run stopme-1 stopped (exit code 143)" "$P/stop.log" || fail "stop: $(cat "$P/stop.log")"
sshd_host_exec 1 pgrep -f 'tandem launch' >/dev/null && fail "an agent still runs on host 1"
sshd_host_exec 2 pgrep -f 'tandem launch' >/dev/null && fail "an agent still runs on host 2"
sshd_exec timeout -k 5 200 "$B" run --resume stopme-1 >"$P/resume.log" 2>&1 || fail "--resume: exit $?"
"$B" show stopme-1 | grep -q '^status  *succeeded' || fail "stopme-1 after --resume: $("$B" show stopme-1)"
cmp "$P/.tandem/runs/stopme-1/artifacts/out/w.safetensors" "$P/w-long.safetensors" ||
    fail "weights differ: stopped and resumed on ssh hosts vs uninterrupted"
steps=$("$B" metrics stopme-1 --key train/loss --csv | tail -n +2 | cut -d, -f3 | sort -n | tr '\n' ' ')
[ "$steps" = "$(seq 1 300 | tr '\n' ' ')" ] || fail "stopme train/loss steps: ${steps:0:300}"
echo "tandem stop: stopped (143), no agent left on either host; --resume: the uninterrupted run's bits"

# --- 4. bad hosts fail at once and say which and why
sshd_exec timeout 60 "$B" run nohost >"$P/nohost.log" 2>&1 && fail "a run on an unknown host succeeded"
note=$("$B" show nohost-1 | sed -n 's/^note  *//p')
grep -q "ssh host nosuch.invalid (node 1): .*nosuch.invalid.*(exit code 255); check that" <<<"$note" ||
    fail "unknown host: note '$note'"
sshd_exec timeout 60 "$B" run notandem >"$P/notandem.log" 2>&1 && fail "a run without tandem succeeded"
note=$("$B" show notandem-1 | sed -n 's/^note  *//p')
grep -q "no /nonexistent/tandem on $h1" <<<"$note" || fail "missing tandem: note '$note'"
echo "an unknown host and a missing tandem: failed at once, naming the host and the fix"

# --- 5. a worker that fails on a bad argument: its node's end record reaches the run's record
sshd_exec timeout 90 "$B" run badarg >"$P/badarg.log" 2>&1 && fail "a run with --lr abc succeeded"
. "$SRC/tests/lib/bad_argument.sh"
expect_bad_argument badarg-1 1
echo "a worker's bad argument on host 2: the run's note and exit code are that worker's"
