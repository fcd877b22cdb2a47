#!/usr/bin/env bash
# workflow: `tandem run [--name N] [--nproc-per-node N] [--param K=V] -- CMD ARG...` tracks a
# command with no workflow file: in a project that has none, 2 workers of `tandem train` become
# a tracked run (its id from the program's name, 2 ranks' logs, every train/loss step once in the
# store, the command recorded, the weights saved in its working directory; tandem show gives
# train/loss by step and the system metrics by their seconds); --name and --param
# name the run and reach the command as --KEY VALUE (a workflow's rule), arguments with spaces
# and quotes reach it intact; a failing command fails the run with its exit code; --resume of a
# command run runs the stored command again; misuse is a usage error (2).
set -uo pipefail
B=${TANDEM_BIN:?TANDEM_BIN must name the tandem binary}
: "${TANDEM_DATA:?}"
P=$(mktemp -d /tmp/tandem-runcmd-XXXXXX)
trap 'rm -rf "$P"' EXIT
export TANDEM_HOME=$P
cd "$P"
fail() {
    echo "FAIL: $*" >&2
    for f in "$P"/*.log; do [ -f "$f" ] && { echo "--- $f" >&2; tail -15 "$f" >&2; }; done
    exit 1
}

# 1. two workers of tandem train, no workflow file anywhere
[ ! -e .tandem/workflows.yaml ] || fail "the project has a workflow file"
"$B" run --nproc-per-node 2 -- "$B" train --model basicnet --data "$TANDEM_DATA" --steps 20 \
    --batch 32 --threads 1 --seed 7 --no-progress --save w.safetensors >train.log 2>&1 ||
    fail "tandem run -- tandem train: exit $?"
show=$("$B" show tandem-1) || fail "no run tandem-1: $("$B" ps 2>&1)"
grep -q '^status  *succeeded' <<<"$show" || fail "not succeeded: $show"
grep -q '^workers  *1 node(s) x 2 process(es)' <<<"$show" || fail "workers: $show"
grep -q "^command .*train --model basicnet" <<<"$show" || fail "command not recorded: $show"
for r in 0 1; do [ -e .tandem/runs/tandem-1/logs/rank-$r.log ] || fail "no rank-$r.log"; done
steps=$("$B" metrics tandem-1 --key train/loss --csv | tail -n +2 | cut -d, -f3 | sort -n | tr '\n' ' ')
[ "$steps" = "$(seq 1 20 | tr '\n' ' ')" ] || fail "train/loss steps: $steps"
# tandem show: training metrics by step, system metrics (sampled by time) by their seconds
grep -qE '^  train/loss +[0-9.e-]+ +step 20 +rank 0' <<<"$show" || fail "train/loss line: $show"
grep -qE '^  sys/cpu_percent +[0-9.e-]+ +at [0-9]+ s +rank [01]' <<<"$show" || fail "sys line: $show"
[ -s .tandem/runs/tandem-1/work/w.safetensors ] || fail "the weights are not in the run's working directory"
echo "tandem run --nproc-per-node 2 -- tandem train: run tandem-1, 2 ranks, steps 1..20 once"

# 2. --name, --param, awkward arguments
"$B" run --name hello --param lr=0.1 -- sh -c 'printf "%s|" "$@" >args.txt' sh "two words" "it's" >hello.log 2>&1 ||
    fail "tandem run --name hello: exit $?"
A=.tandem/runs/hello-1/work/args.txt # the command's working directory: the run's work/
[ "$(cat $A)" = "two words|it's|--lr|0.1|" ] || fail "the command got '$(cat $A)'"
"$B" show hello-1 | grep -q '^params  *{"lr":0.1' || fail "params: $("$B" show hello-1)"
echo "--name hello --param lr=0.1: run hello-1, arguments intact, --lr 0.1 appended"

# 3. a failing command
"$B" run --name bad -- sh -c 'exit 3' >bad.log 2>&1
[ $? = 1 ] || fail "a failing command: tandem run did not exit 1"
"$B" show bad-1 | grep -q '^exit code  *3' || fail "exit code: $("$B" show bad-1)"

# 4. --resume of a failed command run runs the stored command again, with TANDEM_RESUME=1
"$B" run --name again -- sh -c '[ "${TANDEM_RESUME:-0}" = 1 ] || exit 5; printf "%s|" "$@" >resumed.txt' sh "a b" >again.log 2>&1
[ $? = 1 ] || fail "the first attempt of again-1 did not fail"
"$B" run --resume again-1 >resume.log 2>&1 || fail "--resume again-1: exit $?"
[ "$(cat .tandem/runs/again-1/work/resumed.txt 2>&1)" = "a b|" ] || fail "the resumed command: $(cat resume.log)"
"$B" show again-1 | grep -q '^status  *succeeded' || fail "again-1: $("$B" show again-1)"

# 5. misuse: usage errors
for args in "hello -- true" "--resume hello-1 -- true" "--" "--name x" "--nproc-per-node 0 -- true" \
    "--max-restarts 1" "--max-restarts -1 -- true" "--max-restarts x -- true"; do
    # shellcheck disable=SC2086
    out=$("$B" run $args 2>&1)
    [ $? = 2 ] || fail "tandem run $args: not a usage error: $out"
done
echo "a failing command fails its run (exit code 3); --resume re-runs the stored command; misuse exits 2"

# 6. an ordinary PyTorch DDP script (no tandem in it) tracked with no workflow file; a worker
# killed by -9 with --max-restarts 1 restarts the group and the run succeeds
PY=${PYTHON:-/usr/bin/python3}
if "$PY" -c 'import torch' 2>/dev/null; then
    "$B" run --nproc-per-node 2 -- "$PY" "$TANDEM_SOURCE_DIR/examples/torch_ddp/train_ddp.py" --steps 20 --out out >ddp.log 2>&1 ||
        fail "tandem run -- train_ddp.py: exit $? $(tail -5 ddp.log)"
    show=$("$B" show train_ddp-1) || fail "no run train_ddp-1: $("$B" ps 2>&1)"
    grep -q '^status  *succeeded' <<<"$show" || fail "train_ddp-1: $show"
    for r in 0 1; do
        [ -s .tandem/runs/train_ddp-1/work/out/params-rank$r.pt ] || fail "train_ddp-1: rank $r wrote no params"
        grep -q "step  19 loss" .tandem/runs/train_ddp-1/logs/rank-0.log || fail "train_ddp-1: rank 0's log: $(tail -3 .tandem/runs/train_ddp-1/logs/rank-0.log)"
    done
    "$B" run --name ddpkill --nproc-per-node 2 --max-restarts 1 -- sh -c \
        '[ "$RANK" = 1 ] && [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && kill -9 $$; exec "$@"' sh \
        "$PY" "$TANDEM_SOURCE_DIR/examples/torch_ddp/train_ddp.py" --steps 5 >kill.log 2>&1 ||
        fail "--max-restarts 1 after a kill -9: exit $? $(tail -5 kill.log)"
    "$B" show ddpkill-1 | grep -q '^restarts  *1$' || fail "ddpkill-1: $("$B" show ddpkill-1)"
    echo "tandem run -- python3 examples/torch_ddp/train_ddp.py: tracked, 2 ranks, no workflow file; --max-restarts 1 restarted a killed worker once"
else
    echo "(step 6 skipped: $PY has no torch)"
fi
