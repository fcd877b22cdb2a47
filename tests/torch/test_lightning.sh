#!/usr/bin/env bash
# torch: Lightning's DDPStrategy(process_group_backend="tandem") trains (torch_lightning.py, 2
# ranks under `tandem launch`): the group really is tandem's, and rank 0's losses and final
# weights equal a gloo run's within 1e-5 relative (at 2 ranks both sum a + b: the same bits are
# expected, the tolerance only allows for Lightning's own nondeterminism, of which none is seen).
set -uo pipefail
SRC=${TANDEM_SOURCE_DIR:?TANDEM_SOURCE_DIR must name the source tree}
. "$SRC/tests/torch/lib.sh"
torch_setup
"$FW_PY" -c 'import lightning' 2>/dev/null || { echo "SKIP: no lightning in the frameworks venv"; exit 77; }
W=$(mktemp -d /tmp/tandem-torch-lit-XXXXXX)
trap 'rm -rf "$W"' EXIT
for be in tandem gloo; do
    launch_job 2 "$FW_PY" "$SRC/tests/torch/torch_lightning.py" "$be" "$W/$be.json" >"$W/$be.log" 2>&1 ||
        { tail -30 "$W/$be.log" >&2; fail "Lightning with process_group_backend=$be failed"; }
done
"$FW_PY" - "$W/tandem.json" "$W/gloo.json" <<'PY' || fail "Lightning: tandem's run differs from gloo's (above)"
import json, sys
t, g = (json.load(open(p)) for p in sys.argv[1:3])
assert t["backend"] == "tandem", "the group's backend is %r, not tandem" % t["backend"]
assert len(t["losses"]) == len(g["losses"]) == 12, (len(t["losses"]), len(g["losses"]))
def close(a, b):
    return abs(a - b) <= 1e-5 * max(abs(b), 1e-3)
bad = [i for i, (a, b) in enumerate(zip(t["losses"], g["losses"])) if not close(a, b)]
assert not bad, "losses differ at steps %s: %s vs %s" % (bad, t["losses"], g["losses"])
badw = [i for i, (a, b) in enumerate(zip(t["weights"], g["weights"])) if not close(a, b)]
assert not badw, "%d weights differ" % len(badw)
same = sum(a == b for a, b in zip(t["weights"], g["weights"]))
print("Lightning DDPStrategy(process_group_backend='tandem'): 12 steps, loss %.5f -> %.5f, as gloo's; %d of %d final weights bitwise equal to gloo's" % (
    t["losses"][0], t["losses"][-1], same, len(t["weights"])))
PY
echo "PASS"
