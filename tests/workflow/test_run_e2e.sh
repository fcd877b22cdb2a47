#!/usr/bin/env bash
# workflow: `tandem run` end to end with plain shell commands as workers (through the real
# `tandem launch`): success with metrics and artifacts shown by ps/show/logs/metrics/artifacts;
# a failing command; -d + stop; SIGTERM preemption then --resume with no duplicate steps;
# file errors and unknown names from the CLI.
set -uo pipefail
B=${TANDEM_BIN:?TANDEM_BIN must name the tandem binary}
P=$(mktemp -d /tmp/tandem-e2e-XXXXXX)
trap 'rm -rf "$P"' EXIT
export TANDEM_HOME=$P
cd "$P"
fail() { echo "FAIL: $*" >&2; exit 1; }
expect_contains() { # haystack needle what
  case "$1" in *"$2"*) ;; *) fail "$3: expected to contain '$2', got: $1" ;; esac
}

mkdir -p .tandem
cat > .tandem/workflows.yaml <<'EOF'
workflows:
  - name: ok
    setup: echo preparing
    nproc_per_node: 2
    params: {lr: 0.5}
    command: |
      for i in 1 2 3 4; do echo "{\"step\": $i, \"loss\": 0.$((9 - i)), \"acc\": 0.$i}" >> "$TANDEM_METRICS"; done
      mkdir -p out && echo "rank $RANK lr $TANDEM_PARAM_LR" > "out/r$RANK.txt"
      echo "worker $RANK of $WORLD_SIZE run $TANDEM_RUN_ID args"
    artifacts: [out/*.txt]
  - name: bad
    command: echo about to fail; exit 3
  - name: sleepy
    nproc_per_node: 2
    command: |
      trap 'exit 143' TERM
      while :; do sleep 0.1; done
  - name: pre
    command: |
      trap 'echo "$last" > "$TANDEM_CHECKPOINT_DIR/ckpt"; exit 143' TERM
      i=0
      if [ -n "${TANDEM_RESUME:-}" ]; then
        i=$(cat "$TANDEM_CHECKPOINT_DIR/ckpt")
        echo "{\"event\": \"resume\", \"step\": $i}" >> "$TANDEM_METRICS"
      fi
      last=$i
      while [ $i -lt 40 ]; do
        i=$((i + 1)); echo "{\"step\": $i, \"loss\": $i}" >> "$TANDEM_METRICS"
        [ $((i % 4)) = 0 ] && last=$i
        sleep 0.05
      done
EOF

# --- success: metrics, logs, artifacts, param override
out=$("$B" run ok --param lr=0.25 2>&1) || fail "tandem run ok exited $?: $out"
expect_contains "$out" "[rank 1] worker 1 of 2 run ok-1 args --lr 0.25" "attached output"
expect_contains "$out" "run ok-1 succeeded" "attached summary"
show=$("$B" show ok-1) || fail "show"
expect_contains "$show" "succeeded" "show status"
expect_contains "$show" '{"lr":0.25}' "show params"
expect_contains "$show" "out/r1.txt" "show artifacts"
expect_contains "$show" "loss" "show metric keys"
ps=$("$B" ps) || fail "ps"
expect_contains "$ps" "ok-1" "ps id"
echo "$ps" | grep "ok-1" | grep -Eq "succeeded.* 4 +0\.5 +lr=0\.25$" || fail "ps row (last step 4, loss 0.5, config lr=0.25): $(echo "$ps" | grep ok-1)"
logs=$("$B" logs ok-1) || fail "logs"
expect_contains "$logs" "[setup] preparing" "setup log"
expect_contains "$logs" "[rank 0] worker 0 of 2" "rank 0 log"
[ "$("$B" logs ok-1 --rank 1)" = "worker 1 of 2 run ok-1 args --lr 0.25" ] || fail "logs --rank 1"
csv=$("$B" metrics ok-1 --csv --key loss) || fail "metrics"
[ "$(echo "$csv" | wc -l)" = 9 ] || fail "expected 8 loss points + header, got: $csv"
[ "$(echo "$csv" | tail -n +2 | cut -d, -f1,3 | sort | uniq -d)" = "" ] || fail "duplicate points"
json=$("$B" metrics ok-1 --json --key acc) || fail "metrics --json"
echo "$json" | "${PYTHON:-python3}" -c 'import json,sys; d=json.load(sys.stdin); assert len(d)==8 and d[0]["key"]=="acc", d' \
  || fail "metrics --json: $json"
"$B" artifacts ok-1 --download "$P/dl" >/dev/null || fail "artifacts --download"
[ "$(cat "$P/dl/out/r1.txt")" = "rank 1 lr 0.25" ] || fail "downloaded artifact content"
echo tampered > .tandem/runs/ok-1/artifacts/out/r0.txt
if "$B" artifacts ok-1 --download "$P/dl2" 2>"$P/err"; then fail "a damaged artifact passed"; fi
expect_contains "$(cat "$P/err")" "does not match" "sha256 check"

# --- failure: status failed, the worker's exit code and the launcher's root cause
"$B" run bad >/dev/null 2>&1 && fail "run bad succeeded"
show=$("$B" show bad-1)
expect_contains "$show" "failed" "failed status"
echo "$show" | grep -q "^exit code *3$" || fail "exit code 3 expected: $show"
expect_contains "$show" "rank 0" "root cause note"

# --- detached + stop
id=$("$B" run -d sleepy) || fail "run -d"
[ "$id" = "sleepy-1" ] || fail "run -d printed '$id'"
for _ in $(seq 300); do "$B" ps | grep -q "sleepy-1 .*running" && break; sleep 0.1; done
"$B" ps | grep -q "sleepy-1 .*running" || fail "detached run is not running: $("$B" ps)"
stop=$("$B" stop sleepy) || fail "stop: $stop"
expect_contains "$stop" "stopped" "stop output"
expect_contains "$("$B" show sleepy-1)" "tandem stop" "stop note"
"$B" stop sleepy-1 >/dev/null 2>&1 && fail "stopping a stopped run should fail"

# --- preemption (SIGTERM from outside) and resume: no step twice, none missing
"$B" run pre >"$P/pre.out" 2>&1 &
sup=$!
for _ in $(seq 600); do
  n=$(cat .tandem/runs/pre-1/metrics/rank-0.jsonl 2>/dev/null | wc -l)
  [ "$n" -ge 10 ] && break
  sleep 0.05
done
kill -TERM $sup
wait $sup
rc=$?
[ $rc = 143 ] || fail "preempted run exited $rc, expected 143: $(cat "$P/pre.out")"
expect_contains "$("$B" show pre-1)" "preempted" "preempted status"
"$B" run --resume pre >/dev/null 2>&1 || fail "resume failed"
show=$("$B" show pre-1)
expect_contains "$show" "succeeded" "resumed status"
echo "$show" | grep -q "^restarts *1$" || fail "restarts 1 expected: $show"
steps=$("$B" metrics pre-1 --csv --key loss | tail -n +2 | cut -d, -f3)
[ "$(echo "$steps" | sort -n | tr '\n' ' ')" = "$(seq 1 40 | tr '\n' ' ')" ] \
  || fail "steps after resume: $(echo "$steps" | tr '\n' ' ')"
"$B" run --resume pre-1 >/dev/null 2>&1 && fail "resuming a succeeded run should fail"

# --- CLI errors: unknown workflow, malformed file, ambiguous run prefix
err=$("$B" run nosuch 2>&1); rc=$?
[ $rc = 2 ] || fail "unknown workflow exit $rc"
expect_contains "$err" "known workflows: ok, bad, sleepy, pre" "unknown workflow"
printf 'workflows:\n  - name: x\n    command: y\n    nproc_per_node: two\n' > bad.yaml
err=$("$B" run -f bad.yaml 2>&1); rc=$?
[ $rc = 2 ] || fail "malformed file exit $rc"
expect_contains "$err" "bad.yaml:4:21: nproc_per_node: expected a positive integer, got 'two'" "file error"
"$B" run ok >/dev/null 2>&1 || fail "second ok run"
err=$("$B" show ok 2>&1) && fail "ambiguous prefix accepted"
expect_contains "$err" "ok-1, ok-2" "ambiguous prefix"
echo "test_run_e2e: ok"
