#!/usr/bin/env bash
# executors: a script's record reaches the run's store from Slurm nodes without a shared file
# system (issue 30), as test_script_record_ssh.sh from ssh hosts: a 2-node namespace cluster
# (tests/lib/slurm.sh) whose nodes see neither the project nor each other's slurm: work_dir
# (TDS_HIDE_DIRS), 1 worker each; the script (tests/executors/script_record.py) sets config,
# tags and summary through the Python SDK and records two artifacts on rank 0, whose SHA-256
# (hashlib on the node) it prints. script_record_check asserts the run succeeded and that the
# config, summary, tag, RUN/sdk.json and both artifacts (SHA-256 equal) are in the store: they
# travelled over node 0's TCP link (src/launch/agent_link.c -> src/exec/links.c).
set -uo pipefail
NODES=/tmp/tandem-script-rec-$$/nodes
. "$(dirname "$0")/exec_test.sh" script-rec
trap 'cleanup; rm -rf "/tmp/tandem-script-rec-$$"' EXIT
PY=${PYTHON:-/usr/bin/python3}
mkdir -p "$NODES" "$P/.tandem" || fail "cannot create $NODES or $P"
cp "$SRC/tests/executors/script_record.py" "$P/record.py"
cat >"$P/.tandem/workflows.yaml" <<EOF
workflows:
  - name: rec
    nodes: 2
    executor: slurm
    slurm: {work_dir: $NODES}
    env:
      PYTHONPATH: "$SRC/python"
    command: $PY record.py
EOF
TDS_HIDE_DIRS="$P $NODES" slurm_up 2 || fail "the cluster did not come up"
n1=${TDS_NODES[0]}
slurm_node_exec 1 test -e "$P/.tandem/workflows.yaml" && fail "node 1 sees the project"
slurm_exec timeout -k 5 150 "$B" run rec >"$P/run.log" 2>&1 || fail "tandem run rec: exit $?"
. "$SRC/tests/executors/script_record_check.sh"
script_record_check "$n1"
