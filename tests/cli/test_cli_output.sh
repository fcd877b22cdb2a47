#!/usr/bin/env bash
# cli: what the commands print for a person (issue 33's nits), each against an independent
# reference where there is one:
#  - `tandem --help` describes train by the data it takes, not as Fashion-MNIST only;
#  - `tandem show` prints a workflow's multi-line command one line per line, never "\x0a";
#  - `--param a=0.2` is shown as Python's repr writes the float (json.dumps of the same values by
#    /usr/bin/python3): 0.2, not 0.20000000000000001, and 0.30000000000000004 in full;
#  - `tandem metrics RUN --key nosuch` exits 1 naming the key and the keys the run has;
#  - counts of one are singular: "1 point", "1 epoch", "1 step", "1 thread", "1 rank".
set -uo pipefail
. "${TANDEM_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/lib/project.sh"
project_init clioutput
SRC=${TANDEM_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
PY=${PYTHON:-/usr/bin/python3}

# --help: train's line.
help=$("$B" --help) || fail "tandem --help: exit $?"
train_line=$(grep '^  train ' <<<"$help")
expect_contains "$train_line" "CSV" "tandem --help's train line"
expect_lacks "$train_line" "Fashion-MNIST" "tandem --help's train line"
grep -q '^  kill ' <<<"$help" || fail "tandem --help lists no kill: $help"

# A workflow whose command is two lines, and params whose floats need the shortest repr.
mkdir -p .tandem
cat >.tandem/workflows.yaml <<'EOF'
workflows:
  - name: two
    params: {a: 0, b: 0, c: 0, d: 0, e: 0}
    command: |
      echo "first $a"
      echo "second $b"
EOF
"$B" run two --param a=0.2 --param b=0.30000000000000004 --param c=1e-05 --param d=7 \
    --param e=2.5e-3 >two.log 2>&1 || fail "tandem run two: exit $?: $(cat two.log)"
show=$("$B" show two-1) || fail "tandem show two-1: exit $?"
expect_lacks "$show" '\x0a' "tandem show of a two-line command"
grep -qE '^command +echo "first \$a"' <<<"$show" || fail "show: the command's first line: $show"
grep -qE '^ {16}echo "second \$b"' <<<"$show" || fail "show: the command's second line, indented under the first: $show"
want=$("$PY" -c 'import json; print(json.dumps({"a": 0.2, "b": 0.30000000000000004, "c": 1e-05, "d": 7, "e": 2.5e-3}, separators=(",", ":")))')
got=$(show_field two-1 params)
[ "$got" = "$want" ] || fail "show's params: '$got', Python writes '$want'"

# A run whose script logs one point (the store may add system metrics: the count is read from
# the CSV and the wording checked against it, "1 point" or "N points").
cat >one.py <<'EOF'
import tandem
tandem.init()
tandem.log({"loss": 0.5}, step=1)
EOF
PYTHONPATH=$SRC/python "$B" run --name one -- "$PY" one.py >one.log 2>&1 || fail "tandem run one: $(tail -5 one.log)"
out=$("$B" metrics one-1 --key loss) || fail "tandem metrics one-1 --key loss: exit $?"
expect_contains "$out" "loss" "tandem metrics --key loss"
err=$("$B" metrics one-1 --key nosuch 2>&1 >/dev/null)
rc=$?
[ "$rc" = 1 ] || fail "tandem metrics --key nosuch: exit $rc, expected 1 ($err)"
expect_contains "$err" "no metric 'nosuch'" "metrics --key nosuch's error"
expect_contains "$err" " loss" "metrics --key nosuch's list of keys"
err=$("$B" metrics one-1 --key loss --rank 3 2>&1 >/dev/null)
[ $? = 1 ] || fail "tandem metrics --key loss --rank 3: exit 0"
expect_contains "$err" "logged by other ranks" "metrics --key loss --rank 3"
points=$("$B" metrics one-1 --csv | tail -n +2 | wc -l)
show=$("$B" show one-1)
if [ "$points" = 1 ]; then
    expect_contains "$show" "metrics (1 point;" "tandem show of a run with one point"
else
    expect_contains "$show" "metrics ($points points;" "tandem show of a run with $points points"
fi

# One epoch of a small CSV: the trainer's line says "1 epoch", and "1 step" for one step.
"$PY" -c '
import random
random.seed(1)
print("x1,x2,label")
for i in range(64):
    a, b = random.random(), random.random()
    print(f"{a:.4f},{b:.4f},{int(a > b)}")' >tiny.csv
out=$("$B" train --model mlp --data tiny.csv --target label --epochs 1 --batch 64 --threads 1 --no-progress 2>&1) ||
    fail "tandem train on tiny.csv: exit $?: $out"
line=$(grep "training .* for " <<<"$out")
expect_contains "$line" "for 1 step (1 epoch of 1 step)" "the trainer's first line"
expect_contains "$line" "= 64 x 1 micro-batch x 1 rank," "the trainer's first line"
expect_contains "$line" ", 1 thread" "the trainer's first line"
expect_lacks "$line" "1 threads" "the trainer's first line"
echo "test_cli_output: ok"
