#!/usr/bin/env bash
# workflow: tracked runs with the real trainer. `tandem run` of BasicNet (60 steps, batch 16,
# 2 data-parallel workers, a checkpoint every 10 steps) in a temporary project:
#   a. an uninterrupted reference run: succeeded, weights W_ref;
#   b. kill -9 of worker rank 1 after a checkpoint, max_restarts 1: the launcher restarts the
#      group, the trainer resumes from the checkpoint; succeeded, restarts 1, weights == W_ref,
#      train/loss has each step 1..60 exactly once;
#   c. SIGTERM to the supervisor (a preemption): preempted, exit code 143; `tandem run --resume`
#      keeps the id, succeeds, weights == W_ref, no duplicate metric points;
#   d. SIGTERM to the launcher, then the newest checkpoint corrupted: the resume warns, uses the
#      previous one, and still ends with weights == W_ref.
set -uo pipefail
B=${TANDEM_BIN:?TANDEM_BIN must name the tandem binary}
PY=${PYTHON:-python3}
. "${TANDEM_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/lib/project.sh"
project_setup train-e2e
T0=$(date +%s)
fail() {
  echo "FAIL: $*" >&2
  for f in "$P"/.tandem/runs/*/logs/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -n 15 "$f"; } >&2; done
  exit 1
}
note() { echo "[$(($(date +%s) - T0))s] $*"; }

mkdir -p .tandem
cat >.tandem/workflows.yaml <<EOF
workflows:
  - name: t
    nproc_per_node: 2
    max_restarts: 1
    commands:
      - mkdir -p out
      - >-
        tandem train --model basicnet --data $DATA --steps 60 --batch 16 --threads 1
        --checkpoint-every 10 --no-progress --save out/w.safetensors
    artifacts: [out/w.safetensors]
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
wait_ckpts() { # run count: waits until the run has written at least count checkpoints
  local i
  for i in $(seq 1 600); do
    [ "$(ls "$P/.tandem/runs/$1/checkpoints/" 2>/dev/null | grep -c '^ckpt-.*\.tdck$')" -ge "$2" ] && return 0
    sleep 0.05
  done
  fail "run $1: no $2 checkpoint(s) after 30 s"
}
worker_pid() { # run rank: pid of that rank's `tandem train` (not its /bin/sh wrapper)
  local f p
  for f in $(grep -lz "^TANDEM_RUN_ID=$1\$" /proc/[0-9]*/environ 2>/dev/null | xargs -r grep -lz "^RANK=$2\$" 2>/dev/null); do
    p=${f%/environ}
    [ "$(tr '\0' '\n' 2>/dev/null <"$p/cmdline" | sed -n 2p)" = train ] || continue
    echo "${p#/proc/}"
    return 0
  done
  return 1
}
weights() { echo "$P/.tandem/runs/$1/artifacts/out/w.safetensors"; }
same_weights() { # run what
  [ -f "$(weights "$1")" ] || fail "$2: run $1 stored no weights ($(weights "$1"))"
  cmp -s "$(weights "$1")" "$W_REF" ||
    fail "$2: weights differ: $(sha256sum "$(weights "$1")" | cut -c1-16) vs W_ref $(sha256sum "$W_REF" | cut -c1-16)"
}
check_metrics() { # run what: no duplicate (rank, key, step); train/loss steps 1..60 once each
  "$B" metrics "$1" --json >"$P/m.json" || fail "$2: tandem metrics $1 --json"
  "$PY" - "$P/m.json" "$2" <<'EOF' || fail "$2: metrics of run $1"
import collections, json, sys
rows = json.load(open(sys.argv[1]))
seen = collections.Counter((r["rank"], r["key"], r["step"]) for r in rows)
dups = [k for k, n in seen.items() if n > 1]
assert not dups, "duplicate points (rank, key, step): %s" % dups[:5]
loss = sorted(r["step"] for r in rows if r["key"] == "train/loss")
assert loss == list(range(1, 61)), "train/loss steps: expected 1..60 once each, got %s" % loss
acc = [r["value"] for r in rows if r["key"] == "test/acc"]
assert len(acc) == 1 and acc[0] > 10, "test/acc: %s" % acc
print("%s: %d points, train/loss steps 1..60 once each, test/acc %.2f%%" % (sys.argv[2], len(rows), acc[0]))
EOF
}

# --- a. reference
rm -rf out
out=$("$B" run t 2>&1) || fail "reference run exited $?: $out"
[ "$(field t-1 status)" = succeeded ] || fail "reference: status $(field t-1 status)"
W_REF=$P/w_ref.safetensors
cp "$(weights t-1)" "$W_REF" || fail "reference: no weights artifact"
check_metrics t-1 "a. reference"
note "a. reference run t-1 succeeded; W_ref sha256 $(sha256sum "$W_REF" | cut -c1-16)"

# --- b. kill -9 of one worker after a checkpoint; the launcher restarts the group once
rm -rf out
id=$("$B" run -d t) || fail "run -d exited $?"
[ "$id" = t-2 ] || fail "expected run id t-2, got '$id'"
wait_ckpts t-2 1
pid=$(worker_pid t-2 1) || fail "b: no rank 1 worker of t-2 found"
kill -9 "$pid"
killed_after=$(ls .tandem/runs/t-2/checkpoints | grep '^ckpt-' | tr '\n' ' ')
[ "$(wait_final t-2)" = succeeded ] || fail "b: status $(field t-2 status), note: $(field t-2 note)"
[ "$(field t-2 restarts)" = 1 ] || fail "b: restarts: expected 1, got $(field t-2 restarts)"
log0=$("$B" logs t-2 --rank 0)
case "$log0" in *"--- restart 1 ---"*"resuming from "*"/ckpt-"*) ;;
  *) fail "b: rank 0's log shows no restart that resumed from a checkpoint: $log0" ;; esac
same_weights t-2 "b. kill -9"
check_metrics t-2 "b. kill -9"
note "b. kill -9 of rank 1 (pid $pid, checkpoints then: $killed_after) -> restarted, $(grep -o 'resuming from [^ ]*ckpt-[0-9]*' <<<"$log0" | sed 's/.*\///'), bitwise equal"

# --- c. SIGTERM to the supervisor (a preemption), then tandem run --resume
rm -rf out
id=$("$B" run -d t) || fail "run -d exited $?"
wait_ckpts t-3 1
sup=$(field t-3 "supervisor pid")
[ -n "$sup" ] && kill -0 "$sup" 2>/dev/null || fail "c: supervisor pid '$sup' of t-3 is not alive"
kill -TERM "$sup"
[ "$(wait_final t-3)" = preempted ] || fail "c: status $(field t-3 status), note: $(field t-3 note)"
[ "$(field t-3 "exit code")" = 143 ] || fail "c: exit code: expected 143, got $(field t-3 "exit code")"
ckpts=$(ls .tandem/runs/t-3/checkpoints | grep '^ckpt-' | tr '\n' ' ')
out=$("$B" run --resume t-3 2>&1) || fail "c: tandem run --resume t-3 exited $?: $out"
case "$out" in *"resuming from "*) ;; *) fail "c: the resume did not continue from a checkpoint: $out" ;; esac
[ "$(field t-3 status)" = succeeded ] || fail "c: after --resume: status $(field t-3 status)"
[ "$("$B" ps -a | grep -c '^t-')" = 3 ] || fail "c: --resume made a new run: $("$B" ps -a)"
same_weights t-3 "c. preempt+resume"
check_metrics t-3 "c. preempt+resume"
note "c. SIGTERM to the supervisor -> preempted (exit 143; checkpoints: $ckpts) -> --resume t-3 succeeded, bitwise equal"

# --- d. SIGTERM to the launcher, then the newest checkpoint corrupted before the resume
rm -rf out
id=$("$B" run -d t) || fail "run -d exited $?"
wait_ckpts t-4 2
sup=$(field t-4 "supervisor pid")
launcher=$(pgrep -P "$sup" | head -1)
[ -n "$launcher" ] || fail "d: no launcher under supervisor $sup"
kill -TERM "$launcher"
[ "$(wait_final t-4)" = preempted ] || fail "d: status $(field t-4 status), note: $(field t-4 note)"
newest=$(ls .tandem/runs/t-4/checkpoints | grep '^ckpt-.*\.tdck$' | sort -t- -k2 -n | tail -1)
previous=$(ls .tandem/runs/t-4/checkpoints | grep '^ckpt-.*\.tdck$' | sort -t- -k2 -n | tail -2 | head -1)
[ "$newest" != "$previous" ] || fail "d: need two checkpoints, have: $(ls .tandem/runs/t-4/checkpoints)"
# A few bytes of garbage in the parameters: the CRC no longer matches.
printf 'garbage!' | dd of=".tandem/runs/t-4/checkpoints/$newest" bs=1 seek=4096 conv=notrunc status=none
out=$("$B" run --resume t-4 2>&1) || fail "d: tandem run --resume t-4 exited $?: $out"
case "$out" in *"$newest"*"corrupt"* | *"corrupt"*"$newest"*) ;;
  *) fail "d: no warning naming the corrupt $newest: $out" ;; esac
case "$out" in *"resuming from "*"$previous"*) ;; *) fail "d: did not resume from $previous: $out" ;; esac
[ "$(field t-4 status)" = succeeded ] || fail "d: after --resume: status $(field t-4 status)"
same_weights t-4 "d. corrupt checkpoint"
check_metrics t-4 "d. corrupt checkpoint"
note "d. SIGTERM to the launcher -> preempted; $newest corrupted -> resume warned, used $previous, bitwise equal"
echo "PASS ($(($(date +%s) - T0)) s)"
