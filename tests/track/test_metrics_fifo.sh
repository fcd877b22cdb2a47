#!/usr/bin/env bash
# track: chaos review, "a FIFO named rank-N.jsonl in a run's metrics directory blocks the
# supervisor in open() forever: tandem stop has no effect; tandem reindex hangs the same way."
# Through the CLI, with a shell command as the run:
#   - a detached run whose command makes metrics/rank-5.jsonl a FIFO keeps being supervised:
#     its real metrics are stored, `tandem stop` stops it, and its log names the FIFO once;
#   - `tandem reindex` with the FIFO still there returns, restores the run and its points;
#   - the FIFO was never opened for reading (a writer on it is still waiting for a reader).
set -uo pipefail
B=${TANDEM_BIN:?TANDEM_BIN must name the tandem binary}
P=$(mktemp -d /tmp/tandem-fifo-XXXXXX)
sup=
cleanup() {
  # A supervisor stuck in open() (the bug) ignores tandem stop: end it and its group here.
  if [ -n "$sup" ] && kill -0 "$sup" 2>/dev/null; then kill -KILL -- "-$sup" "$sup" 2>/dev/null; fi
  rm -rf "$P"
}
trap cleanup EXIT
export TANDEM_HOME=$P
cd "$P"
fail() { echo "FAIL: $*" >&2; exit 1; }
expect_contains() { # haystack needle what
  case "$1" in *"$2"*) ;; *) fail "$3: expected to contain '$2', got: $1" ;; esac
}
field() { "$B" show "$1" 2>/dev/null | sed -n "s/^$2  *//p" | head -1; }
npoints() { "$B" metrics "$1" --csv --key loss 2>/dev/null | tail -n +2 | wc -l; }

mkdir -p .tandem
cat > .tandem/workflows.yaml <<'EOF'
workflows:
  - name: fifo
    command: |
      mkfifo "$TANDEM_RUN_DIR/metrics/rank-5.jsonl"
      for i in 1 2 3; do echo "{\"step\": $i, \"loss\": 0.$i}" >> "$TANDEM_METRICS"; done
      sleep 60
EOF

id=$("$B" run -d fifo 2>"$P/run.err") || fail "tandem run -d fifo: $(cat "$P/run.err")"
[ "$id" = fifo-1 ] || fail "detached run id: '$id'"
sup=$(field fifo-1 "supervisor pid")
# the supervisor keeps ingesting: the three loss points of rank 0 arrive (it polls twice a second)
for _ in $(seq 1 100); do [ "$(npoints fifo-1)" = 3 ] && break; sleep 0.1; done
[ "$(npoints fifo-1)" = 3 ] || fail "fifo-1 has $(npoints fifo-1) points, expected 3 (supervisor blocked?)"
# tandem stop reaches it
out=$(timeout 30 "$B" stop fifo-1 --wait 20 2>&1)
code=$?
[ "$code" != 124 ] || fail "tandem stop hung (the supervisor does not answer): $out"
[ "$(field fifo-1 status)" = stopped ] || fail "fifo-1 after tandem stop: $("$B" show fifo-1 2>&1)"
log=$(cat .tandem/runs/fifo-1/logs/supervisor.log)
expect_contains "$log" "metrics file $P/.tandem/runs/fifo-1/metrics/rank-5.jsonl is a FIFO" \
  "the supervisor names the FIFO"
[ "$(grep -c 'rank-5.jsonl is a FIFO' .tandem/runs/fifo-1/logs/supervisor.log)" = 1 ] \
  || fail "the FIFO was reported more than once: $log"

# tandem reindex with the FIFO still there
[ -p .tandem/runs/fifo-1/metrics/rank-5.jsonl ] || fail "the FIFO is gone"
rm -f .tandem/runs.db .tandem/runs.db-wal .tandem/runs.db-shm
out=$(timeout 30 "$B" reindex 2>&1)
code=$?
[ "$code" != 124 ] || fail "tandem reindex hung on the FIFO: $out"
[ "$code" = 0 ] || fail "tandem reindex exited $code: $out"
expect_contains "$out" "restored   fifo-1" "reindex restores the run"
expect_contains "$out" "rank-5.jsonl is a FIFO (named pipe), not a regular file: skipped" \
  "reindex names the FIFO"
[ "$(npoints fifo-1)" = 3 ] || fail "fifo-1 has $(npoints fifo-1) points after reindex, expected 3"
[ "$(field fifo-1 status)" = stopped ] || fail "fifo-1 after reindex: $(field fifo-1 status)"

# nobody opened it for reading: a writer would still block, so give it 1 s and expect a timeout
timeout 1 sh -c 'echo x > .tandem/runs/fifo-1/metrics/rank-5.jsonl'
[ $? = 124 ] || fail "something reads the FIFO"
echo "test_metrics_fifo: ok"
