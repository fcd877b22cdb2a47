#!/usr/bin/env bash
# workflow: node_setup runs once on every node, by its launcher, before that node's workers
# (tandem launch --node-setup; what installs packages or builds the code on a fresh machine).
# Asserts, on 2 local nodes x 2 workers:
#   - each node ran each command once, in order, in the run's work directory with the run's
#     environment (TANDEM_RUN_ID), before any of its workers started (the workers see its file);
#   - each node's output is in RUN/logs/node-setup-N.log, and said on the run's stderr;
#   - a failing command fails the run with no worker started: the note names the command, its
#     exit code and the log, and the run records exit code 1;
#   - a workflow whose node_setup is not a list of strings is refused, naming the field.
set -uo pipefail
. "${TANDEM_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/lib/project.sh"
project_init nodesetup
mkdir -p .tandem
cat > .tandem/workflows.yaml <<'EOF2'
workflows:
  - name: ok
    nodes: 2
    nproc_per_node: 2
    node_setup:
      - echo "setup a on $TANDEM_RUN_ID in $(basename "$(dirname "$PWD")")"; echo "a $(date +%s%N)" >> "$TANDEM_PROJECT_DIR/order-$TANDEM_RUN_ID"
      - echo b >> "$TANDEM_PROJECT_DIR/order-$TANDEM_RUN_ID"; touch "$TANDEM_PROJECT_DIR/built-$TANDEM_RUN_ID"
    command: |
      test -f "$TANDEM_PROJECT_DIR/built-$TANDEM_RUN_ID" || { echo "rank $RANK started before the setup" >&2; exit 3; }
      echo "rank $RANK after the setup"
  - name: bad
    nodes: 2
    node_setup:
      - echo "installing"; exit 7
    command: touch "$TANDEM_PROJECT_DIR/worker-ran"
EOF2
out=$("$B" run ok 2>&1) || fail "tandem run ok: $out"
R=.tandem/runs/ok-1
for n in 0 1; do
  log=$R/logs/node-setup-$n.log
  [ -f "$log" ] || fail "no $log: $(ls $R/logs)"
  grep -q '^setup a on ok-1 in ok-1$' "$log" || fail "node $n's setup did not run in RUN/work with the run's environment: $(cat "$log")"
  [ "$(grep -c '^\$ ' "$log")" = 2 ] || fail "node $n's log does not show its 2 commands once each: $(cat "$log")"
done
# each node ran a then b: 2 a lines and 2 b lines, and never b before that node's a (per node
# order is what the log shows; here: 4 lines, 2 of each)
[ "$(grep -c '^a ' order-ok-1)" = 2 ] && [ "$(grep -c '^b$' order-ok-1)" = 2 ] ||
  fail "each of the 2 nodes should run each command once: $(cat order-ok-1)"
for r in 0 1 2 3; do
  grep -q "rank $r after the setup" $R/logs/rank-$r.log || fail "rank $r: $(cat $R/logs/rank-$r.log)"
done
grep -q '\[node-setup 1\] setup a on ok-1' <<<"$out" || fail "the setup's output was not on the run's stderr: $out"

out=$("$B" run bad 2>&1) && fail "a failing node_setup succeeded: $out"
show=$("$B" show bad-1)
echo "$show" | grep -q '^status  *failed' || fail "status: $show"
echo "$show" | grep -q "^note .*node setup failed on node [01]: 'echo \"installing\"; exit 7' exited with code 7; its output is in .*node-setup-[01].log" ||
  fail "note: $show"
echo "$show" | grep -q '^exit code  *1$' || fail "exit code: $show"
[ ! -e worker-ran ] || fail "a worker ran after its node's setup failed"

cat > .tandem/workflows.yaml <<'EOF2'
workflows:
  - name: wrong
    node_setup: {a: b}
    command: true
EOF2
out=$("$B" run wrong 2>&1) && fail "a mapping as node_setup was accepted: $out"
grep -q "node_setup" <<<"$out" || fail "the error does not name node_setup: $out"
echo "ok: node_setup ran once per node before its workers, logged per node; a failure named the command"
