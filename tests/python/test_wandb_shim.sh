#!/usr/bin/env bash
# python: `import tandem.wandb as wandb` keeps W&B's rules. The same calls (tests/python/
# wandb_steps.py: log without a step, commit=False, explicit steps, a step below the current one,
# the last value of a key within a step, nested dicts, config set at init and later, summary) run
# on the real wandb in offline mode (read back from its .wandb file) and on the shim (read back
# from the offline run's metrics and sdk.json): the same (step, key, value) points, config and
# summary. Then the shim inside `tandem run`: the points reach the store.
set -uo pipefail
SRC=${TANDEM_SOURCE_DIR:?TANDEM_SOURCE_DIR must name the source tree}
. "$SRC/tests/lib/project.sh"
. "$SRC/tests/lib/frameworks.sh"
project_init wandb-shim
fw_python
mkdir real shim
WANDB_MODE=offline WANDB_SILENT=true "$FW_PY" "$SRC/tests/python/wandb_steps.py" real "$P/real" >real.json 2>real.err ||
    fail "real wandb: $(tail -5 real.err)"
(cd shim && "$FW_PY" "$SRC/tests/python/wandb_steps.py" shim "$P/shim" >../shim.json 2>../shim.err) ||
    fail "tandem.wandb: $(tail -5 shim.err)"
"$FW_PY" - real.json shim.json <<'PY' || fail "tandem.wandb differs from wandb: real $(cat real.json) shim $(cat shim.json)"
import json, sys
real, shim = (json.load(open(f)) for f in sys.argv[1:3])
assert len(real["points"]) == 11, real["points"]  # the calls' points: the reference is not empty
norm = lambda ps: [(s, k, float(v)) for s, k, v in ps]
assert norm(real["points"]) == norm(shim["points"]), (real["points"], shim["points"])
assert real["config"] == shim["config"], (real["config"], shim["config"])
assert real["summary_best"] == shim["summary_best"] == 0.75
PY
echo "wandb offline and tandem.wandb: the same 11 points, config and summary"

# In a tracked run the shim's points are the run's
cat > w.py <<'PY'
import tandem.wandb as wandb
wandb.init(config={"lr": 0.5})
for i in range(5):
    wandb.log({"loss": 1.0 / (i + 1)})
wandb.summary["final"] = 0.2
wandb.finish()
PY
"$B" run --name wb -- "$FW_PY" w.py >wb.log 2>&1 || fail "tandem run of the wandb script: $(tail -5 wb.log)"
steps=$("$B" metrics wb-1 --key loss --csv | tail -n +2 | cut -d, -f3 | tr '\n' ' ')
[ "$steps" = "0 1 2 3 4 " ] || fail "wb-1: loss at steps '$steps'"
fw_show_has wb-1 config lr
fw_show_has wb-1 summary final
echo "wb-1: the shim's loss at steps 0-4, config and summary in the store"

# issue 33: W&B's project= and name= are recorded as tandem.init(project=, name=) records them
# (RUN/sdk.json), also when the run was made before wandb.init (a framework's logger, or the
# script's own tandem.init), and read back as W&B's run.project and run.name.
cat > wn.py <<'PY'
import tandem
tandem.init(config={"seed": 1})
import tandem.wandb as wandb
r = wandb.init(project="proj", name="baseline", config={"lr": 0.5})
assert (r.project, r.name) == ("proj", "baseline"), (r.project, r.name)
wandb.log({"loss": 1.0})
wandb.finish()
PY
"$B" run --name wn -- "$FW_PY" wn.py >wn.log 2>&1 || fail "tandem run of wn.py: $(tail -5 wn.log)"
"$FW_PY" - "$P/.tandem/runs/wn-1/sdk.json" <<'PY' || fail "wn-1's sdk.json lacks W&B's name and project: $(cat "$P/.tandem/runs/wn-1/sdk.json")"
import json, sys
d = json.load(open(sys.argv[1]))
assert (d["name"], d["project"]) == ("baseline", "proj"), d
assert d["config"] == {"seed": 1, "lr": 0.5}, d["config"]
PY
echo "wn-1: wandb.init's project and name in sdk.json after an earlier tandem.init"
