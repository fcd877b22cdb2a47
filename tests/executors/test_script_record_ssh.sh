#!/usr/bin/env bash
# executors: a script's record reaches the run's store from ssh hosts that share no directory
# with the submitting machine (issue 30: sdk.json and tandem.artifact() files stayed on the
# node, and an ssh run of a script showed no config, summary or artifacts). Two hosts
# (tests/lib/sshd.sh), the project hidden from both, 1 worker each; the script (the Python SDK)
# sets config, tags and summary, and on rank 0 records two artifacts (one under a
# subdirectory name), printing the SHA-256 of the bytes it wrote (hashlib). Asserts:
#   - the run succeeded; `tandem show` has the script's config, summary and tag;
#   - RUN/sdk.json in the run store is the script's (its run id, the summary's last value);
#   - `tandem artifacts` lists both artifacts with the SHA-256 hashlib gave on the host, and a
#     --download copy has those bytes; rank 1 recorded nothing.
set -uo pipefail
: "${TANDEM_BIN:?}"
SRC=${TANDEM_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
B=$TANDEM_BIN
PY=${PYTHON:-/usr/bin/python3}
. "$SRC/tests/lib/sshd.sh"
sshd_project script-record
sshd_exec ssh "$h1" "test -e '$P/.tandem' || test -e '$P/marker'" && fail "host 1 sees the project"
mkdir -p "$P/.tandem"
cp "$SRC/tests/executors/script_record.py" "$P/record.py"
cat >"$P/.tandem/workflows.yaml" <<EOF
workflows:
  - name: rec
    executor: ssh
    ssh: {hosts: [$h1, $h2], work_dir: $REMOTE}
    env:
      PYTHONPATH: "$SRC/python"
    command: $PY record.py
EOF

sshd_exec timeout -k 5 150 "$B" run rec >"$P/run.log" 2>&1 || fail "tandem run rec: exit $?"
. "$SRC/tests/executors/script_record_check.sh"
script_record_check "$h1"
