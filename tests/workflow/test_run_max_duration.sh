#!/usr/bin/env bash
# workflow: max_duration is a one-shot timer on the supervisor's event loop. Asserts that a run
# with max_duration: 2 whose command would sleep a minute is stopped about 2 s in (well before
# the minute), its workers asked to stop with SIGTERM (the command's trap records it), and the
# run recorded as stopped with the note naming max_duration.
set -uo pipefail
. "${TANDEM_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/lib/project.sh"
project_init maxdur
mkdir -p .tandem
cat > .tandem/workflows.yaml <<'EOF2'
workflows:
  - name: long
    max_duration: 2
    command: |
      trap 'echo got-term > "$TANDEM_PROJECT_DIR/term-$RANK"; exit 143' TERM
      sleep 60 & wait
EOF2
t0=$(date +%s.%N)
out=$("$B" run long 2>&1)
code=$?
t=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
[ "$code" = 143 ] || fail "exit code $code, expected 143 (stopped after the workers' trap): $out"
awk -v t="$t" 'BEGIN { exit !(t < 20) }' || fail "the run took $t s; max_duration is 2 s"
awk -v t="$t" 'BEGIN { exit !(t >= 1.9) }' || fail "the run stopped after $t s, before its max_duration of 2 s"
[ -f term-0 ] || fail "the worker was not sent SIGTERM: $out"
show=$("$B" show long-1)
echo "$show" | grep -q "^status  *stopped" || fail "status: $show"
echo "$show" | grep -q "^note  *max_duration of 2 s exceeded" || fail "note: $show"
echo "ok: max_duration stopped the run after $t s with SIGTERM to its workers"
