#!/usr/bin/env bash
# workflow: two SIGTERMs close together preempt as cleanly as one. As it was seen: `timeout 3
# tandem run ...` (timeout signals its child, then its whole process group) or two `kill -TERM`
# 50 ms apart ended the run failed (exit 137) with no checkpoint: the supervisor took the second
# signal for "kill them now" and SIGKILLed the launcher while the workers were saving. Now a
# stop signal repeated within TD_STOP_REPEAT_GRACE_S (10 s) of the first is the same request
# (Ctrl-C twice, or a signal after the grace period, still kills at once):
#   a. two SIGTERMs to a detached run's supervisor while its (frozen) workers save: preempted, exit code 143, the
#      trainer checkpointed the step it stopped at, the supervisor said it took the second as a
#      repeat; `tandem run --resume` continues from that checkpoint and succeeds;
#   b. `timeout --preserve-status ... tandem run ...` (attached), the shape of the report: exit
#      143, preempted, checkpointed. timeout's two SIGTERMs come microseconds apart and usually
#      merge into one pending signal, so b alone rarely caught the bug; a is the deterministic
#      check. timeout sends them when its time is up or when it is sent SIGTERM itself: the test
#      signals it once the run has a checkpoint (a fixed time could end the run while the workers
#      still load their data, which ends them at once with nothing to checkpoint).
set -uo pipefail
B=${TANDEM_BIN:?TANDEM_BIN must name the tandem binary}
. "${TANDEM_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/lib/project.sh"
project_setup double-term
fail() {
  echo "FAIL: $*" >&2
  for f in "$P"/.tandem/runs/*/logs/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -n 15 "$f"; } >&2; done
  exit 1
}
mkdir -p .tandem
cat >.tandem/workflows.yaml <<EOF
workflows:
  - name: t
    nproc_per_node: 2
    commands:
      - mkdir -p out
      - >-
        tandem train --model basicnet --data $DATA --steps 400 --batch 16 --threads 1
        --checkpoint-every 50 --no-progress --save out/w.safetensors
    artifacts: [out/w.safetensors]
  - name: long
    nproc_per_node: 2
    command: >-
      tandem train --model basicnet --data $DATA --steps 100000 --batch 16 --threads 1
      --checkpoint-every 50 --no-progress
EOF

field() { # run field: a value from `tandem show`
  "$B" show "$1" | awk -v f="$2" 'index($0, f) == 1 { sub("^" f " +", ""); print; exit }'
}
wait_final() { # run: waits (up to 180 s) for a final status and prints it
  local i s
  for i in $(seq 1 900); do
    s=$(field "$1" status)
    case "$s" in succeeded | failed | stopped | preempted) echo "$s"; return 0 ;; esac
    sleep 0.2
  done
  fail "run $1 still '$s' after 180 s"
}
wait_ckpts() { # run: waits until the run has written a checkpoint (up to 240 s: a loaded machine)
  local i
  for i in $(seq 1 4800); do
    ls "$P/.tandem/runs/$1/checkpoints/" 2>/dev/null | grep -q '^ckpt-.*\.tdck$' && return 0
    sleep 0.05
  done
  fail "run $1: no checkpoint after 240 s"
}
stop_checkpoint() { # run what: rank 0 stopped by SIGTERM at a step and that step's checkpoint is there
  local log step
  log=$("$B" logs "$1" --rank 0)
  step=$(grep -o 'stopped by SIGTERM after step [0-9]*' <<<"$log" | tail -1 | awk '{print $NF}')
  [ -n "$step" ] || fail "$2: rank 0 did not stop by SIGTERM after a step: $(tail -n 5 <<<"$log")"
  [ -f "$P/.tandem/runs/$1/checkpoints/ckpt-$step.tdck" ] ||
    fail "$2: no checkpoint of step $step: $(ls "$P/.tandem/runs/$1/checkpoints")"
  echo "$step"
}

# --- a. two SIGTERMs to the supervisor of a detached run
id=$("$B" run -d t) || fail "run -d exited $?"
[ "$id" = t-1 ] || fail "expected run id t-1, got '$id'"
wait_ckpts t-1
sup=$(field t-1 "supervisor pid")
[ -n "$sup" ] && kill -0 "$sup" 2>/dev/null || fail "a: supervisor pid '$sup' of t-1 is not alive"
# The second SIGTERM must reach the supervisor as a signal of its own while it is stopping: two
# sent 50 ms apart merge into one pending signal on a loaded machine (the kernel queues one of
# each), and a second sent after the workers have exited finds nothing left to stop. So the
# workers are frozen (SIGSTOP) first; the second SIGTERM goes once the supervisor has said it took
# the first; the workers are thawed once it has said it took the second as a repeat.
workers=()
for d in /proc/[0-9]*; do
  [ "$(readlink "$d/cwd" 2>/dev/null)" = "$P/.tandem/runs/t-1/work" ] || continue
  argv=$(tr '\0' '\n' <"$d/cmdline" 2>/dev/null | head -n 2 | tr '\n' ' ')
  case "$argv" in */tandem\ train\ | tandem\ train\ ) workers+=("${d#/proc/}") ;; esac
done
[ "${#workers[@]}" = 2 ] || fail "a: expected 2 workers of t-1, found ${#workers[@]}: ${workers[*]}"
thaw() { kill -CONT "${workers[@]}" 2>/dev/null; }
trap thaw EXIT
kill -STOP "${workers[@]}"
said() { # pattern: waits (up to 120 s) for the supervisor's log to hold it
  local i
  for i in $(seq 1 2400); do
    grep -q "$1" "$P/.tandem/runs/t-1/logs/supervisor.log" 2>/dev/null && return 0
    sleep 0.05
  done
  return 1
}
kill -TERM "$sup"
said "SIGTERM: preempting run t-1" || { thaw; fail "a: the supervisor did not take the first SIGTERM"; }
kill -TERM "$sup"
said "taken as the same request" || { thaw; fail "a: the supervisor did not say it took the second SIGTERM as a repeat"; }
thaw
s=$(wait_final t-1)
[ "$s" = preempted ] || fail "a: status $s (expected preempted), note: $(field t-1 note)"
[ "$(field t-1 "exit code")" = 143 ] || fail "a: exit code $(field t-1 "exit code"), expected 143"
step=$(stop_checkpoint t-1 a)
out=$("$B" run --resume t-1 2>&1) || fail "a: tandem run --resume t-1 exited $?: $out"
case "$out" in *"resuming from "*"ckpt-$step.tdck"*) ;;
  *) fail "a: the resume did not continue from ckpt-$step.tdck: $out" ;; esac
[ "$(field t-1 status)" = succeeded ] || fail "a: after --resume: status $(field t-1 status)"
echo "ok: a. two SIGTERMs while stopping -> preempted (143), checkpoint at step $step, --resume succeeded"

# --- b. timeout(1): SIGTERM to tandem run, then to its process group
timeout --preserve-status 600 "$B" run long >"$P/long.out" 2>&1 &
tpid=$!
wait_ckpts long-1
kill -TERM "$tpid" # timeout passes it on: SIGTERM to tandem run, then to its process group
wait "$tpid"
rc=$?
[ "$rc" = 143 ] || fail "b: timeout tandem run exited $rc, expected 143: $(tail -n 5 "$P/long.out")"
[ "$(field long-1 status)" = preempted ] ||
  fail "b: status $(field long-1 status), note: $(field long-1 note)"
step=$(stop_checkpoint long-1 b)
echo "ok: b. timeout --preserve-status tandem run, signalled -> preempted (143), checkpoint at step $step"
echo "test_run_double_term: ok"
