#!/usr/bin/env bash
# workflow: every env: entry honoured or refused with the reason, and torchrun's worker counts
# everywhere a count is taken (issue 30), on this machine's executor:
#   env: {PATH: "/opt/td-extra:$PATH"}: the workers' PATH is tandem's directory, /opt/td-extra,
#     then tandem run's own PATH; env: {PATH: /usr/bin:/bin} replaces it (tandem's directory
#     still first); another variable reaches the workers as written;
#   env: naming what tandem sets (RANK, TANDEM_CHECKPOINT_DIR, TANDEM_PARAM_X) or a name no
#     shell can export (a-b) is refused before anything runs (exit 2), naming the key and why;
#   nproc_per_node: auto / cpu in a workflow and tandem run --nproc-per-node auto -- CMD: one
#     worker per core here (no GPU visible; with one, one per GPU); gpu without a GPU: refused
#     as tandem launch refuses it; gpu on Slurm where sinfo reaches no cluster: refused, saying why;
#   tandem run --artifact PATH -- CMD: the file is the run's artifact.
set -uo pipefail
. "${TANDEM_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/lib/project.sh"
project_init envwf
unset CUDA_VISIBLE_DEVICES OMP_NUM_THREADS
TO=$(command -v timeout)
BDIR=$(dirname "$B")
cores=$(nproc)
mkdir -p .tandem
cat >.tandem/workflows.yaml <<'EOF'
workflows:
  - name: prepend
    env: {PATH: "/opt/td-extra:$PATH", FOO: "bar baz"}
    command: echo "path=$PATH foo=$FOO"
  - name: replace
    env: {PATH: /usr/bin:/bin}
    command: echo "path=$PATH"
  - name: auto
    nproc_per_node: auto
    command: echo "lws=$LOCAL_WORLD_SIZE node=$NODE_RANK/$NUM_NODES"
  - name: cpu
    nproc_per_node: cpu
    command: echo "lws=$LOCAL_WORLD_SIZE"
EOF
"$TO" 60 "$B" run prepend >prepend.out 2>&1 || fail "prepend: exit $?: $(cat prepend.out)"
grep -qF "[rank 0] path=$BDIR:/opt/td-extra:$PATH foo=bar baz" prepend.out ||
    fail "env: PATH with \$PATH: $(grep path= prepend.out) (want $BDIR:/opt/td-extra:$PATH)"
"$TO" 60 "$B" run replace >replace.out 2>&1 || fail "replace: exit $?: $(cat replace.out)"
grep -qF "[rank 0] path=$BDIR:/usr/bin:/bin" replace.out || fail "env: PATH replaced: $(grep path= replace.out)"
echo "env: PATH honoured: \$PATH prepended to, or replaced (tandem's directory first)"

refused() { # refused KEY TEXT: a workflow with env: {KEY: 1} is refused naming KEY and TEXT
    printf 'workflows:\n  - name: r\n    env: {%s: "1"}\n    command: "true"\n' "$1" >bad.yaml
    "$TO" 60 "$B" run -f bad.yaml >bad.out 2>&1
    local rc=$?
    [ $rc = 2 ] || fail "env: {$1: 1}: exit $rc, expected 2: $(cat bad.out)"
    grep -qF -- "$2" bad.out || fail "env: {$1: 1}: the message lacks '$2': $(cat bad.out)"
    [ -d .tandem/runs/r-1 ] && fail "env: {$1: 1}: a run was created"
}
refused RANK "env: RANK cannot be set here: the launcher sets it for each worker"
refused NODE_RANK "env: NODE_RANK cannot be set here"
refused TANDEM_CHECKPOINT_DIR "TANDEM_CHECKPOINT_DIR cannot be set here: tandem run sets it: use checkpoint_dir: instead"
refused TANDEM_PARAM_LR "use params:"
refused a-b "'a-b' is not an environment variable name a shell can set"
echo "env: entries tandem sets, or no shell can export: refused before anything ran"

"$TO" 60 "$B" run auto >auto.out 2>&1 || fail "auto: exit $?: $(cat auto.out)"
if [ -d /proc/driver/nvidia/gpus ]; then
    want=$(find /proc/driver/nvidia/gpus -mindepth 1 -maxdepth 1 | wc -l)
else
    want=$cores
    grep -q "nproc_per_node auto: $cores worker" auto.out || fail "auto's count not said: $(cat auto.out)"
fi
grep -qF "[rank 0] lws=$want node=0/1" auto.out || fail "nproc_per_node: auto: $(grep lws= auto.out)"
[ "$(grep -c 'lws=' auto.out)" = "$want" ] || fail "auto: $(grep -c 'lws=' auto.out) workers, want $want"
"$TO" 60 "$B" run cpu >cpu.out 2>&1 || fail "cpu: exit $?: $(cat cpu.out)"
grep -qF "[rank 0] lws=$cores" cpu.out || fail "nproc_per_node: cpu: $(grep lws= cpu.out)"
"$TO" 60 "$B" run --nproc-per-node auto --name cmdauto -- sh -c 'echo "lws=$LOCAL_WORLD_SIZE"' >cmd.out 2>&1 ||
    fail "--nproc-per-node auto -- CMD: exit $?: $(cat cmd.out)"
grep -qF "[rank 0] lws=$want" cmd.out || fail "tandem run --nproc-per-node auto: $(grep lws= cmd.out)"
CUDA_VISIBLE_DEVICES= "$TO" 60 "$B" run --nproc-per-node gpu -- true >gpu.out 2>&1
[ $? = 2 ] || fail "--nproc-per-node gpu without a GPU: not a usage error: $(cat gpu.out)"
grep -qF "nproc_per_node gpu: no GPU is visible to this launcher" gpu.out || fail "gpu: $(cat gpu.out)"
# (ssh counts on its hosts: tests/executors/test_remote_nproc_ssh.sh; Slurm on the cluster's
# nodes with sinfo: tests/executors/test_slurm_run.sh; here sinfo reaches no cluster)
"$TO" 60 "$B" run --executor slurm --nproc-per-node gpu -- true >gpuslurm.out 2>&1 && fail "gpu on slurm without a cluster ran: $(cat gpuslurm.out)"
grep -qE "nproc_per_node: gpu: counting the Slurm nodes: sinfo failed|nproc_per_node: gpu counts the CPUs or GPUs of the Slurm nodes the job may get, with sinfo, which is not on PATH" gpuslurm.out ||
    fail "gpu on slurm without a cluster: $(cat gpuslurm.out)"
echo "nproc_per_node auto/cpu: $want/$cores workers in a workflow and in tandem run -- CMD; gpu refused without a GPU"

"$TO" 60 "$B" run --name art --artifact 'out/*.txt' -- sh -c 'mkdir -p out && echo kept >out/a.txt' \
    >art.out 2>&1 || fail "--artifact: exit $?: $(cat art.out)"
grep -qx kept .tandem/runs/art-1/artifacts/out/a.txt || fail "--artifact 'out/*.txt' not stored"
"$B" artifacts art-1 | grep -q 'out/a.txt' || fail "tandem artifacts art-1: $("$B" artifacts art-1)"
echo "tandem run --artifact 'out/*.txt' -- CMD: out/a.txt stored"
echo OK
