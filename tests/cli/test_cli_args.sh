#!/usr/bin/env bash
# cli: every command parses its arguments with the one parser (tools/tandem/args.c), so every
# command takes --opt=value and --opt value (and -x value, -xVALUE), stops at "--", and says the
# same things about bad arguments, with exit code 2: an unknown option named with the hint
# "(see 'tandem CMD --help')", a missing value with the value's name, a value given to a flag,
# and an option given twice takes its later value (--param collects each). --help is generated
# from each table. tandem launch keeps torchrun's spellings (--nproc_per_node) and its end of
# options at the worker command.
set -uo pipefail
. "${TANDEM_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/lib/project.sh"
project_init cliargs

# expect_usage WANT ARGS...: exit 2 and WANT in stderr
expect_usage() {
    local want=$1 err rc
    shift
    err=$("$B" "$@" 2>&1 >/dev/null)
    rc=$?
    [ "$rc" = 2 ] || fail "tandem $*: exit $rc, expected 2 (stderr: $err)"
    grep -qF -- "$want" <<<"$err" || fail "tandem $*: stderr lacks '$want': $err"
}

# Unknown options, in every command: named, with the hint, on two lines.
for cmd in env run ps show logs metrics artifacts stop kill tag note group archive rm gc reindex ui train \
    launch "bench comm"; do
    # shellcheck disable=SC2086
    expect_usage "tandem $cmd: unknown option '--frobnicate'" $cmd --frobnicate=3
    # shellcheck disable=SC2086
    expect_usage "(see 'tandem $cmd --help')" $cmd --frobnicate
    # shellcheck disable=SC2086
    out=$("$B" $cmd --help) || fail "tandem $cmd --help: exit $?"
    head -1 <<<"$out" | grep -q "^usage: tandem $cmd" || fail "tandem $cmd --help: $out"
    grep -q -- "-h, --help" <<<"$out" || fail "tandem $cmd --help lists no -h, --help: $out"
    # shellcheck disable=SC2086
    "$B" $cmd -h >/dev/null || fail "tandem $cmd -h: exit $?"
done
expect_usage "unknown option '-z'" ps -z
expect_usage "unknown option '-dz'" run -dz

# Missing values name the value; flags take none.
expect_usage "tandem run: --file needs a value: --file FILE" run --file
expect_usage "tandem run: -f needs a value: -f FILE" run -f
expect_usage "tandem train: --accum needs a value: --accum M" train --accum
expect_usage "tandem launch: --nproc-per-node needs a value" launch --nproc-per-node
expect_usage "tandem logs: --rank needs a value: --rank R" logs x --rank
expect_usage "tandem run: --detach takes no value (got '--detach=yes')" run --detach=yes
expect_usage "tandem train: --json takes no value" train --json=1

# Both spellings reach the command alike: the workflow file that is not there is named.
for form in "--file=nowhere.yaml" "--file nowhere.yaml" "-f nowhere.yaml" "-fnowhere.yaml"; do
    # shellcheck disable=SC2086
    err=$("$B" run $form 2>&1) && fail "tandem run $form succeeded"
    grep -q "nowhere.yaml" <<<"$err" || fail "tandem run $form: $err"
done
expect_usage "tandem train: --lr 'abc'" train --lr=abc
expect_usage "tandem train: --lr 'abc'" train --lr abc
expect_usage "tandem metrics: --rank 'x': expects an integer >= 0" metrics r1 --rank=x
expect_usage "tandem ui: --port '70000'" ui --port 70000
expect_usage "tandem ui: --port '-1'" ui --port=-1

# Repeats: the later value wins (getopt's and argparse's rule; --param collects every one).
err=$("$B" run -f first.yaml -f second.yaml echo 2>&1) && fail "tandem run with no workflow file succeeded"
grep -q "second.yaml" <<<"$err" && ! grep -q "first.yaml" <<<"$err" ||
    fail "tandem run -f first.yaml -f second.yaml did not use the later file: $err"
expect_usage "--lr 'abc'" train --lr 0.1 --lr=abc
mkdir -p .tandem
cat >.tandem/workflows.yaml <<'EOF'
workflows:
  - name: echo
    params: {a: 0, b: 0}
    command: echo "a=$a b=$b" > out.txt
EOF
"$B" run echo --param a=1 --param=b=2 >/dev/null 2>&1 || fail "tandem run --param twice: exit $?"

# "--" ends the options: what follows is positional (here: tandem run's command -d, which the
# worker's shell does not find; as an option, -d would have detached a workflow run).
err=$("$B" run -- -d 2>&1)
[ $? = 1 ] || fail "tandem run -- -d: expected the run of command -d to fail (1): $err"
grep -q -- "-d: not found" <<<"$err" || fail "tandem run -- -d: -d was not taken as the command: $err"
expect_usage "one workflow at a time ('a' and 'b')" run a b
expect_usage "tandem show: one run at a time ('a' and 'b')" show a b

# tandem launch: underscores, the later value of a repeat, and the options ending at the
# worker command (whose own flags are its own).
out=$("$B" launch --standalone --nproc_per_node=1 --nproc-per-node 2 sh -c 'echo "w$RANK $1"' sh \
    --nproc-per-node 2>&1) || fail "tandem launch: exit $?: $out"
[ "$(grep -c 'w[01] --nproc-per-node' <<<"$out")" = 2 ] ||
    fail "tandem launch: expected 2 workers given '--nproc-per-node' as their argument: $out"
out=$("$B" launch --standalone --max_restarts=0 --nproc-per-node=1 -- sh -c 'echo "n$WORLD_SIZE"' \
    2>&1) || fail "tandem launch with --: exit $?: $out"
grep -q "n1" <<<"$out" || fail "tandem launch with --: $out"
expect_usage "tandem launch: no worker command" launch --standalone --

# The help lists every option of the table once, with its value name.
# Read whole: `--help | grep -q` under pipefail fails once the help outgrows one pipe write
# (grep exits at the match, the rest of the help meets a closed pipe).
help=$("$B" launch --help) || fail "tandem launch --help: exit $?"
for want in "--end-record FILE" "-m, --module" "--no-python" "-r, --redirects V" "-t, --tee V" \
    "--role NAME" "--start-method M" "gpu (one" "PYTHON is the first of \$TANDEM_PYTHON"; do
    grep -qF -- "$want" <<<"$help" || fail "launch --help lacks '$want': $help"
done
# torchrun's flags in every spelling: short, underscores, =value (test_launch_torchrun.sh has the
# rest of what they do)
out=$("$B" launch --standalone --no_python --start_method=fork -t0 -r 0 --role=r -- sh -c \
    'echo "role $ROLE_NAME"' 2>&1) || fail "torchrun spellings: exit $?: $out"
grep -q "role r" <<<"$out" || fail "torchrun spellings: $out"
expect_usage "tandem launch: --start_method 'x': expected spawn, fork or forkserver" \
    launch --start_method=x -- true
expect_usage "tandem launch: -t '9': not a value from 0 to 3" launch -t9 -- true
"$B" run --help | grep -q -- "--param KEY=VALUE" || fail "run --help lacks --param KEY=VALUE"
echo "test_cli_args: ok"
