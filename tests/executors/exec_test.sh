# Sourced by the executor tests: the Slurm fixture plus a project directory $P (TANDEM_HOME) that
# goes away with the cluster, and fail() that shows the run's logs and the daemons' before it
# exits. Usage: . exec_test.sh NAME (NAME tags the temporary directory).
: "${TANDEM_BIN:?}" "${TANDEM_DATA:?}"
SRC=${TANDEM_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
B=$TANDEM_BIN

. "$SRC/tests/lib/slurm.sh"
P=$(mktemp -d "/tmp/tandem-exec-$1-XXXXXX")
cleanup() {
    slurm_down
    rm -rf "$P"
}
trap cleanup EXIT
fail() {
    echo "FAIL: $*" >&2
    for f in "$P"/*.log "$P"/.tandem/runs/*/logs/*; do [ -f "$f" ] && { echo "--- $f" >&2; tail -20 "$f" >&2; }; done
    slurm_logs 10
    exit 1
}
export TANDEM_HOME=$P
