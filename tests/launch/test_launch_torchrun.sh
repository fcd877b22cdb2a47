#!/usr/bin/env bash
# launch: torchrun's flags with torchrun's meaning (issue 19), docs/launch.md "torchrun's flags":
#   -m MODULE under 2 workers (PYTHON -u -m: RANK/WORLD_SIZE, its arguments);
#   --no-python runs a SCRIPT.py itself (a shell script here), which PYTHON runs without it;
#   the interpreter: TANDEM_PYTHON, PYTHON_EXEC, PYTHON, $VIRTUAL_ENV/bin/python3, python3 on PATH,
#   in that order (fake interpreters that say who they are), and a clear error without one;
#   --redirects 3 --log-dir D: each rank's stdout/stderr in torchrun's files
#   D/RUNID_XXXXXX/attempt_N/LOCAL_RANK/std{out,err}.log and not on the console (a restart gets
#   attempt_1); --tee 1: stdout in the file and on the console; the LOCAL_RANK:VALUE form; no
#   --log-dir: under $TMPDIR; --role sets ROLE_NAME; --start-method is accepted;
#   --nproc-per-node gpu fails clearly without a visible GPU, auto falls back to the cores;
#   every bad value is a usage error naming the flag and what it accepts.
set -uo pipefail
. "${TANDEM_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/lib/project.sh"
project_init torchrun
PY=${PYTHON:-/usr/bin/python3} # Debian's: the tests' interpreter
[ -x "$PY" ] || { echo "SKIP: no $PY"; exit 77; }
# The interpreter rules are what is tested: no inherited choice.
unset TANDEM_PYTHON PYTHON_EXEC PYTHON VIRTUAL_ENV CUDA_VISIBLE_DEVICES TANDEM_TOKEN

TO=$(command -v timeout) # by its path: some cases run with a PATH that has nothing
# run NAME ARGS...: tandem launch with stdout in NAME.out, stderr in NAME.err; returns its code
run() {
    local name=$1
    shift
    "$TO" 60 "$B" launch --standalone "$@" >"$name.out" 2>"$name.err"
}
# has FILE TEXT / hasnt FILE TEXT
has() { grep -qF -- "$2" "$1" || fail "$1 lacks '$2': $(cat "$1")"; }
hasnt() { ! grep -qF -- "$2" "$1" || fail "$1 has '$2': $(cat "$1")"; }
# usage WANT ARGS...: exit 2, WANT on stderr, no worker started
usage() {
    local want=$1 rc
    shift
    run bad "$@"
    rc=$?
    [ "$rc" = 2 ] || fail "tandem launch $*: exit $rc, expected 2: $(cat bad.err)"
    has bad.err "$want"
    hasnt bad.out "[rank"
}

# ---- -m MODULE: PYTHON -u -m MODULE ARGS in every worker (the cwd is on the module path)
mkdir -p pkg
: >pkg/__init__.py
cat >pkg/hello.py <<'EOF'
import os, sys
print("mod rank=%s world=%s python=%s args=%s" % (os.environ["RANK"], os.environ["WORLD_SIZE"],
      " ".join(sys.orig_argv[:3]), ",".join(sys.argv[1:])))
EOF
PYTHON=$PY run mod --nproc-per-node 2 -m pkg.hello a --lr 1 || fail "-m: exit $?: $(cat mod.err)"
has mod.out "[rank 0] mod rank=0 world=2 python=$PY -u -m args=a,--lr,1"
has mod.out "[rank 1] mod rank=1 world=2 python=$PY -u -m args=a,--lr,1"
PYTHON=$PY run mod --nproc_per_node=1 --module -- pkg.hello b || fail "--module --: exit $?"
has mod.out "[rank 0] mod rank=0 world=1 python=$PY -u -m args=b"

# ---- --no-python: a SCRIPT.py that is a shell script runs itself; without it, PYTHON runs it
cat >tool.py <<'EOF'
#!/bin/sh
echo "shell ran rank $RANK with $1"
EOF
chmod +x tool.py
PYTHON=$PY run nopy --nproc-per-node 2 --no-python ./tool.py x || fail "--no-python: exit $?"
has nopy.out "[rank 0] shell ran rank 0 with x"
has nopy.out "[rank 1] shell ran rank 1 with x"
PYTHON=$PY run nopy --no_python -- ./tool.py y || fail "--no_python --: exit $?"
has nopy.out "[rank 0] shell ran rank 0 with y"
PYTHON=$PY run withpy ./tool.py x && fail "tool.py ran without --no-python: $(cat withpy.out)"
has withpy.err "SyntaxError" # Python read it: executable or not, a .py runs with PYTHON

# ---- which Python: fakes that say who they are
fake() { # fake DIR NAME: DIR/python3 prints NAME and its arguments
    mkdir -p "$1"
    printf '#!/bin/sh\necho "%s $*"\n' "$2" >"$1/python3"
    chmod +x "$1/python3"
}
fake path-bin PATH-PY
fake venv/bin VENV-PY
fake tp TANDEM-PY
fake pe EXEC-PY
echo 'print("real python")' >s.py
P0=$PATH
PATH=$P/path-bin:$P0 run py1 s.py a || fail "PATH python: exit $?: $(cat py1.err)"
has py1.out "[rank 0] PATH-PY -u s.py a"
PATH=$P/path-bin:$P0 PYTHON=$PY run py2 s.py || fail "PYTHON: exit $?: $(cat py2.err)"
has py2.out "[rank 0] real python"
PATH=$P/path-bin:$P0 VIRTUAL_ENV=$P/venv run py3 s.py || fail "VIRTUAL_ENV: exit $?"
has py3.out "[rank 0] VENV-PY -u s.py"
PATH=$P/path-bin:$P0 VIRTUAL_ENV=$P/venv PYTHON=$PY run py4 s.py || fail "PYTHON over venv: $?"
has py4.out "[rank 0] real python"
PYTHON=$PY PYTHON_EXEC=$P/pe/python3 run py5 -m pkg.hello || fail "PYTHON_EXEC: exit $?"
has py5.out "[rank 0] EXEC-PY -u -m pkg.hello"
PYTHON=$PY PYTHON_EXEC=$P/pe/python3 TANDEM_PYTHON=$P/tp/python3 run py6 s.py || fail "TANDEM_PYTHON"
has py6.out "[rank 0] TANDEM-PY -u s.py"
PATH=$P/tp:$P0 PYTHON=python3 run py7 s.py || fail "PYTHON=python3 (a name): exit $?"
has py7.out "[rank 0] TANDEM-PY -u s.py" # a name is looked up on PATH
PYTHON=$P/nowhere usage "PYTHON=$P/nowhere: no executable file there" s.py
VIRTUAL_ENV=$P/gone usage "VIRTUAL_ENV=$P/gone (an active virtual environment) has no executable" s.py
mkdir -p empty # a PATH without python3 (the rest of the test needs its tools: no function here)
PATH=$P/empty "$TO" 60 "$B" launch s.py >bad.out 2>bad.err
rc=$?
[ "$rc" = 2 ] || fail "no python3 on PATH: exit $rc, expected 2: $(cat bad.err)"
has bad.err "no Python interpreter: none of TANDEM_PYTHON, PYTHON_EXEC, PYTHON and VIRTUAL_ENV"
has bad.err "set PYTHON=/path/to/python3, or run the command itself with --no-python"
PATH=$P/empty "$TO" 60 "$B" launch --no-python ./tool.py z >nopy2.out 2>nopy2.err ||
    fail "--no-python needs no interpreter: exit $?: $(cat nopy2.err)"
has nopy2.out "[rank 0] shell ran rank 0 with z"

# ---- --redirects 3 --log-dir D: the files, and nothing of the workers on the console
cat >w.sh <<'EOF'
#!/bin/sh
echo "out of $RANK attempt $TANDEM_RESTART_COUNT"
echo "err of $RANK" >&2
printf 'no newline %s' "$RANK"
[ "$FAIL_FIRST" = 1 ] && [ "$TANDEM_RESTART_COUNT" = 0 ] && exit 3
exit 0
EOF
chmod +x w.sh
run red --nproc-per-node 2 --rdzv-id job1 --redirects 3 --log-dir D ./w.sh || fail "redirects: $?"
hasnt red.out "[rank"
hasnt red.err "[rank"
set -- D/job1_*
[ $# = 1 ] && [ -d "$1" ] || fail "--redirects 3 --log-dir D: expected one D/job1_XXXXXX, got $*"
run_dir=$1
for r in 0 1; do
    has "$run_dir/attempt_0/$r/stdout.log" "out of $r attempt 0"
    has "$run_dir/attempt_0/$r/stdout.log" "no newline $r" # the raw bytes, as written
    has "$run_dir/attempt_0/$r/stderr.log" "err of $r"
    hasnt "$run_dir/attempt_0/$r/stdout.log" "err of"
    has "D/rank-$r.log" "out of $r" # tandem's own rank log as ever
done
has red.err "$run_dir/attempt_N/LOCAL_RANK/stdout.log" # where they are, said once
# a second run into the same directory gets a directory of its own (torchrun's mkdtemp)
run red2 --nproc-per-node 1 --rdzv-id job1 -r3 --log-dir D ./w.sh || fail "second run: $?"
set -- D/job1_*
[ $# = 2 ] || fail "two runs with one id share a directory: $*"
# a restart writes attempt_1
FAIL_FIRST=1 run rst --nproc-per-node 1 --rdzv-id job2 --max-restarts 1 --redirects 1 \
    --log-dir D ./w.sh || fail "restart: exit $?: $(cat rst.err)"
has D/job2_*/attempt_0/0/stdout.log "out of 0 attempt 0"
has D/job2_*/attempt_1/0/stdout.log "out of 0 attempt 1"
[ ! -e D/job2_*/attempt_0/0/stderr.log ] || fail "--redirects 1 wrote stderr.log"
has rst.err "[rank 0] err of 0" # stderr not redirected: on the console

# ---- --tee 1: stdout in the file and on the console; the per-rank form; no --log-dir
mkdir -p tmp
TMPDIR=$P/tmp run tee --nproc-per-node 2 --rdzv-id job3 --tee 1 ./w.sh || fail "tee: exit $?"
has tee.out "[rank 0] out of 0"
has tee.out "[rank 1] out of 1"
has tee.err "[rank 1] err of 1"
set -- tmp/tandem-launch-*/job3_*/attempt_0
[ -d "$1" ] || fail "--tee without --log-dir: no \$TMPDIR/tandem-launch-*/job3_*/attempt_0: $*"
has "$1/0/stdout.log" "out of 0"
has "$1/1/stdout.log" "out of 1"
[ ! -e "$1/0/stderr.log" ] || fail "--tee 1 wrote stderr.log"
run map --nproc-per-node 2 --rdzv-id job4 --log-dir D --redirects 0:1,1:2 ./w.sh || fail "map: $?"
hasnt map.out "[rank 0] out of 0" # rank 0: stdout to the file only
has map.err "[rank 0] err of 0"
has map.out "[rank 1] out of 1" # rank 1: stderr to the file only
hasnt map.err "[rank 1] err of 1"
has D/job4_*/attempt_0/0/stdout.log "out of 0"
has D/job4_*/attempt_0/1/stderr.log "err of 1"

# ---- --role, --start-method
run role --nproc-per-node 2 --role trainer --start-method fork -- \
    sh -c 'echo "role=$ROLE_NAME rank=$ROLE_RANK of $ROLE_WORLD_SIZE"' || fail "--role: $?"
has role.out "[rank 0] role=trainer rank=0 of 2"
has role.out "[rank 1] role=trainer rank=1 of 2"
run role --start_method=spawn -- sh -c 'echo "role=$ROLE_NAME"' || fail "default role: $?"
has role.out "[rank 0] role=default"

# ---- --nproc-per-node gpu / auto / cpu
cores=$(nproc)
if [ -d /proc/driver/nvidia/gpus ]; then
    ngpu=$(find /proc/driver/nvidia/gpus -mindepth 1 -maxdepth 1 | wc -l)
    run gpu --nproc-per-node gpu -- sh -c 'echo "n=$LOCAL_WORLD_SIZE"' || fail "gpu: $(cat gpu.err)"
    has gpu.out "[rank 0] n=$ngpu"
else
    usage "tandem launch: --nproc-per-node gpu: no GPU is visible to this launcher: no NVIDIA driver" \
        --nproc-per-node gpu -- true
    run auto --nproc-per-node auto -- sh -c 'echo "n=$LOCAL_WORLD_SIZE"' || fail "auto: $?"
    has auto.out "[rank 0] n=$cores"
    has auto.err "--nproc-per-node auto: $cores worker"
fi
CUDA_VISIBLE_DEVICES= usage "--nproc_per_node gpu: no GPU is visible" --nproc_per_node gpu -- true
run cpu --nproc-per-node cpu -- sh -c 'echo "n=$LOCAL_WORLD_SIZE"' || fail "cpu: $?"
has cpu.out "[rank 0] n=$cores"

# ---- bad values: the flag, the value, what is accepted
usage "--nproc-per-node 'xpu': expected a number of workers >= 1, or gpu" --nproc-per-node xpu -- true
usage "--nproc-per-node '0': expected a number" --nproc-per-node 0 -- true
usage "--redirects '4': not a value from 0 to 3; expected 0 (none), 1 (stdout)" --redirects 4 -- true
usage "--tee '0:1,1:5': '1:5' is not LOCAL_RANK:VALUE" --tee 0:1,1:5 -- true
usage "-r '': an empty value" -r "" -- true
usage "--start-method 'thread': expected spawn, fork or forkserver" --start-method thread -- true
usage "--role '': expected a name" --role "" -- true
usage "-m/--module runs PYTHON -m MODULE, --no-python runs the command itself" -m --no-python x
usage "no worker command" -m
echo "OK"
