#!/usr/bin/env bash
# python: the Python SDK (python/tandem) in a real tracked run: a 2-worker PyTorch DDP script
# (tests/python/sdk_train.py) that logs, checkpoints and resumes through the SDK only, under
# `tandem run` and the real `tandem launch`:
# - rank 1 killed by -9 after step 7 (max_restarts: 1): the group restarts from the SDK's
#   checkpoint of step 4 and the SDK's resume line drops steps 5-7 of the first attempt;
# - `tandem stop` mid-run: should_stop() turns true on both ranks, the script checkpoints through
#   the SDK and exits 143, the run is "stopped" with exit code 143;
# - `tandem run --resume` continues from that checkpoint to the end: every step 1..30 of `loss`
#   stored exactly once, all by rank 0 (rank 1 logged nothing), config and summary in
#   RUN/sdk.json, the artifact in RUN/artifacts and registered at the end of the run (and by `tandem reindex`).
set -uo pipefail
SRC=${TANDEM_SOURCE_DIR:?TANDEM_SOURCE_DIR must name the source tree}
PY=${PYTHON:-/usr/bin/python3}
"$PY" -c 'import torch' 2>/dev/null || { echo "SKIP: $PY has no torch"; exit 77; }
. "$SRC/tests/lib/project.sh"
project_init sdk

mkdir -p .tandem
cat > .tandem/workflows.yaml <<EOF
workflows:
  - name: sdk
    nproc_per_node: 2
    max_restarts: 1
    env:
      PYTHONPATH: "$SRC/python"
      OMP_NUM_THREADS: "1"
    command: $PY $SRC/tests/python/sdk_train.py --steps 30 --checkpoint-every 4 --die-at 7 --sleep 0.2
EOF
R=.tandem/runs/sdk-1
t0=$(date +%s)

# --- first attempt dies (rank 1, -9) at step 7, the restart resumes from step 4; stop mid-run
"$B" run sdk >"$P/run1.out" 2>&1 &
sup=$!
for _ in $(seq 600); do # until the restarted group has logged step 12
  grep -q '"step": 1[2-9]\b' $R/metrics/rank-0.jsonl 2>/dev/null && break
  kill -0 $sup 2>/dev/null || break
  sleep 0.1
done
grep -q '"step": 1[2-9]\b' $R/metrics/rank-0.jsonl 2>/dev/null \
  || fail "the run did not reach step 12: $(cat "$P/run1.out")"
stop=$("$B" stop sdk-1 2>&1) || fail "tandem stop: $stop"
wait $sup
rc=$?
[ $rc = 143 ] || fail "tandem run exited $rc after tandem stop, expected 143 (checkpointed): $(cat "$P/run1.out")"
[ "$(show_field sdk-1 status)" = stopped ] || fail "status after stop: $("$B" show sdk-1)"
[ "$(show_field sdk-1 'exit code')" = 143 ] || fail "exit code after stop: $("$B" show sdk-1)"
out=$(cat "$P/run1.out")
expect_contains "$out" "[rank 1] rank 1 resumed from step 4" "restart resumed from the SDK checkpoint"
stopped_at=$(sed -n 's/.*stop requested: checkpoint of step \([0-9]*\) saved.*/\1/p' "$P/run1.out")
[ -n "$stopped_at" ] && [ "$stopped_at" -ge 12 ] && [ "$stopped_at" -lt 30 ] \
  || fail "expected a checkpoint between steps 12 and 29 at the stop, got '$stopped_at': $out"
[ -f "$R/checkpoints/step-$(printf %012d "$stopped_at").pt" ] \
  || fail "no SDK checkpoint of step $stopped_at in $R/checkpoints: $(ls "$R/checkpoints")"
[ "$(ls "$R/checkpoints" | wc -l)" = 2 ] || fail "keep=2: $(ls -a "$R/checkpoints")"
grep -qx '{"event": "resume", "step": 4, "time": [0-9.e+]*}' $R/metrics/rank-0.jsonl \
  || fail "no resume line for step 4 in rank-0.jsonl: $(cat $R/metrics/rank-0.jsonl)"

# --- resume: continues from the stop's checkpoint to step 30
"$B" run --resume sdk-1 >"$P/run2.out" 2>&1 || fail "resume failed: $(cat "$P/run2.out")"
expect_contains "$(cat "$P/run2.out")" "[rank 0] rank 0 resumed from step $stopped_at" "resume"
[ "$(show_field sdk-1 status)" = succeeded ] || fail "status after resume: $("$B" show sdk-1)"

# --- every step once, rank 0 only
csv=$("$B" metrics sdk-1 --csv --key loss) || fail "tandem metrics"
header=$(echo "$csv" | head -1)
[ "$header" = "rank,key,step,value,time" ] || fail "csv header changed: $header"
steps=$(echo "$csv" | tail -n +2 | cut -d, -f3 | sort -n | tr '\n' ' ')
[ "$steps" = "$(seq 1 30 | tr '\n' ' ')" ] || fail "loss steps (each once, 1..30) are: $steps"
[ "$(echo "$csv" | tail -n +2 | cut -d, -f1 | sort -u)" = 0 ] || fail "points of a rank other than 0: $csv"
r1=$("$B" metrics sdk-1 --csv --rank 1 | tail -n +2 | grep -v '^1,sys/')  # the supervisor's sys/ samples
[ -z "$r1" ] || fail "rank 1 logged: $r1"
[ ! -e $R/metrics/rank-1.jsonl ] || fail "rank 1 wrote a metrics file: $(head -3 $R/metrics/rank-1.jsonl)"
[ "$("$B" metrics sdk-1 --csv --key lr | tail -n +2 | wc -l)" = 30 ] || fail "lr points"
# a key the line format reserves ("rank") and a NaN (null: not stored), no malformed line
[ "$("$B" metrics sdk-1 --csv --key rank | tail -n +2 | cut -d, -f3 | sort -n | tr '\n' ' ')" = "$(seq 1 30 | tr '\n' ' ')" ] \
  || fail "rank points: $("$B" metrics sdk-1 --csv --key rank)"
g=$("$B" metrics sdk-1 --csv --key gnorm | tail -n +2 | cut -d, -f3 | sort -n | tr '\n' ' ')
[ "$g" = "$(seq 1 30 | grep -vx 3 | tr '\n' ' ')" ] || fail "gnorm steps (all but the NaN at 3): $g"
! grep -qi malformed "$P/run1.out" "$P/run2.out" || fail "malformed metric lines: $(grep -i malformed "$P"/run*.out)"
# both resume lines, and a loss that went down
grep -qx "{\"event\": \"resume\", \"step\": $stopped_at, \"time\": [0-9.e+]*}" \
  $R/metrics/rank-0.jsonl || fail "resume line"
"$PY" - "$R" <<'EOF' || fail "sdk.json / loss"
import json, sys, csv, subprocess, os
d = json.load(open(os.path.join(sys.argv[1], "sdk.json")))
assert d["format"] == 1 and d["name"] == "sdk-test" and d["tags"] == ["test", "ddp"], d
c = d["config"]
assert c["steps"] == 30 and c["lr"] == 0.05 and c["die_at"] == 7 and c["world_size"] == 2, c
assert 0 < d["summary"]["final_loss"] < 1, d["summary"]
EOF
first=$(echo "$csv" | awk -F, '$3==1{print $4}')
last=$(echo "$csv" | awk -F, '$3==30{print $4}')
"$PY" -c "import sys; sys.exit(not float('$last') < float('$first'))" || fail "loss did not go down: $first -> $last"

# --- the artifact: copied by rank 0, registered by the supervisor at the run's end
[ -s $R/artifacts/model.txt ] || fail "no artifacts/model.txt: $(ls -la $R/artifacts 2>&1)"
arts=$("$B" artifacts sdk-1) || fail "tandem artifacts"
expect_contains "$arts" "model.txt" "artifact registered at the end"
"$B" reindex -q >/dev/null 2>&1 || fail "reindex"
arts=$("$B" artifacts sdk-1) || fail "tandem artifacts"
expect_contains "$arts" "model.txt" "artifact registered after reindex"
"$B" artifacts sdk-1 --download "$P/dl" >/dev/null || fail "artifact download"
cmp -s "$P/dl/model.txt" $R/work/out/model.txt || fail "downloaded artifact differs"

echo "test_sdk_run: ok ($(( $(date +%s) - t0 )) s)"
