#!/usr/bin/env bash
# torch: a rank that dies mid-job names itself: three ranks of backend="tandem" (torch_dead.py),
# rank 2 killed by SIGKILL; ranks 0 and 1 raise torch.distributed.DistBackendError naming rank 2
# and allreduce, over shm and over tcp. The collective timeout is set to 10 minutes, far past
# this test's own, so the error can only come from tandem's dead-peer detection (not a timeout,
# and not gloo's 30-minute default).
set -uo pipefail
SRC=${TANDEM_SOURCE_DIR:?TANDEM_SOURCE_DIR must name the source tree}
. "$SRC/tests/torch/lib.sh"
torch_setup
W=$(mktemp -d /tmp/tandem-torch-dead-XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$W"' EXIT
export TANDEM_COMM_TIMEOUT_MS=600000
for transport in shm tcp; do
    pids=()
    for r in 0 1 2; do
        TANDEM_COMM_TRANSPORT=$transport "$FW_PY" "$SRC/tests/torch/torch_dead.py" "$W/store-$transport" $r \
            >"$W/$transport-$r.out" 2>"$W/$transport-$r.err" &
        pids+=($!)
    done
    for r in 0 1; do
        wait "${pids[$r]}" || { cat "$W/$transport-$r.err" >&2; fail "$transport: rank $r exited $?"; }
        line=$(grep '^{' "$W/$transport-$r.out") || { cat "$W/$transport-$r.err" >&2; fail "$transport: rank $r reported nothing"; }
        "$FW_PY" - "$line" "$transport" <<'PY' || fail "$transport: rank $r's error: $line"
import json, sys
e = json.loads(sys.argv[1])
assert e["type"] == "DistBackendError", e["type"]
assert "rank 2" in e["error"] and "allreduce" in e["error"], e["error"]
print("%s: rank %d: %s after %.2f s: %s" % (sys.argv[2], e["rank"], e["type"], e["waited_s"], e["error"][:300]))
PY
    done
    wait "${pids[2]}"
done
echo "PASS"
