#!/usr/bin/env bash
# track: issue 19, offline runs of the Python SDK into the store (`tandem import DIR...`).
# Offline runs are made by the SDK itself (python3 with PYTHONPATH=python/, no tandem run):
#   - one imported: a run named after the SDK's name, its project as group, its tags; its metrics
#     in `tandem metrics` and `tandem show`, its config and summary in `show`, its artifact
#     listed and downloaded intact, a link in its artifacts/ not followed;
#   - imported twice (and after runs.db was rebuilt) -> still one run, the first one named;
#   - exit code from tandem.finish(exit_code=3) -> failed, exit code 3;
#   - a run still running (offline.json says so) is refused, naming the directory; --force
#     imports it as failed;
#   - a missing directory, a file, a directory without offline.json: errors naming them.
set -uo pipefail
SRC=${TANDEM_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
PY=${PYTHON:-python3}
command -v "$PY" >/dev/null 2>&1 || { echo "SKIP: no $PY"; exit 77; }
. "$SRC/tests/lib/project.sh"
project_init import
export PYTHONPATH=$SRC/python
nruns() { "$B" ps -a --archived 2>/dev/null | tail -n +2 | grep -c . ; }

# ---- offline runs, written by the SDK ----
"$PY" - <<'EOF' || fail "the offline run exp1"
import os, tandem
tandem.init(config={"lr": 0.1, "arch": "mlp"}, name="exp1", project="proj", tags=["off", "bad tag"],
            dir="offline")
for s in range(5):
    tandem.log({"loss": 1.0 / (s + 1), "acc": s / 10}, step=s)
with open("model.bin", "wb") as f:
    f.write(os.urandom(4096))
tandem.artifact("model.bin")
tandem.summary["best_loss"] = 0.2
EOF
"$PY" - <<'EOF' || fail "the offline run crash"
import tandem
tandem.init(name="crash", dir="offline")
tandem.log({"loss": 3.0}, step=0)
tandem.finish(exit_code=3)
EOF
"$PY" - <<'EOF' || fail "the offline run alive"
import os, tandem
tandem.init(name="alive", dir="offline")
tandem.log({"loss": 2.0}, step=0)
os._exit(0)  # no finish: offline.json still says running
EOF
E=$(ls -d "$P"/offline/exp1-*); C=$(ls -d "$P"/offline/crash-*); A=$(ls -d "$P"/offline/alive-*)
[ -d "$E" ] && [ -d "$C" ] && [ -d "$A" ] || fail "offline directories: $(ls -R offline)"
expect_contains "$(cat "$A/offline.json")" '"status": "running"' "the alive run's offline.json"
ln -s /etc/passwd "$E/artifacts/passwd-link"

# ---- 1. imported ----
out=$("$B" import "$E" 2>&1) || fail "tandem import $E: $out"
expect_contains "$out" "imported as run exp1-1 (succeeded, 10 metric points)" "tandem import"
expect_contains "$out" "passwd-link is a symbolic link, not a regular file: not imported" \
  "a link in artifacts/"
[ "$(nruns)" = 1 ] || fail "one run after the import: $("$B" ps -a)"
[ "$(show_field exp1-1 status)" = succeeded ] || fail "exp1-1: $("$B" show exp1-1)"
[ "$(show_field exp1-1 group)" = proj ] || fail "exp1-1 group from the SDK's project"
[ "$(show_field exp1-1 tags)" = off ] || fail "exp1-1 tags from the SDK: $("$B" show exp1-1)"
show=$("$B" show exp1-1 2>&1)
expect_contains "$show" "metrics (10 points" "show: the metrics"
expect_contains "$show" "imported by tandem import from $E" "show: the note names the source"
expect_contains "$show" 'arch "mlp"' "show: the config"
expect_contains "$show" "best_loss 0.2" "show: the summary"
expect_contains "$show" "model.bin" "show: the artifact"
m=$("$B" metrics exp1-1 --csv 2>&1) || fail "tandem metrics exp1-1: $m"
expect_contains "$m" "0,loss,4,0.2" "metrics: the last loss"
[ "$(echo "$m" | grep -c '^0,loss,')" = 5 ] || fail "5 loss points: $m"
"$B" artifacts exp1-1 --download dl >/dev/null 2>&1 || fail "tandem artifacts --download"
cmp -s dl/model.bin "$E/artifacts/model.bin" || fail "the downloaded artifact differs"
[ ! -e dl/passwd-link ] && [ ! -e .tandem/runs/exp1-1/artifacts/passwd-link ] ||
  fail "the link was imported"
[ -d "$E" ] && [ -f "$E/metrics/rank-0.jsonl" ] || fail "the offline directory was changed"
expect_contains "$(cat .tandem/runs/exp1-1/imported.json)" '"offline_id": "exp1-' "imported.json"

# ---- 2. imported twice: one run ----
out=$("$B" import "$E" 2>&1) || fail "a second import: $out"
expect_contains "$out" "imported already, as run exp1-1" "a second import"
[ "$(nruns)" = 1 ] || fail "a second import made a second run: $("$B" ps -a)"
[ "$("$B" metrics exp1-1 --csv | grep -c '^0,loss,')" = 5 ] || fail "points doubled"
rm -f .tandem/runs.db .tandem/runs.db-wal .tandem/runs.db-shm
"$B" reindex -q >/dev/null 2>&1 || fail "tandem reindex"
out=$("$B" import "$E" 2>&1) || fail "an import after the rebuild: $out"
expect_contains "$out" "imported already, as run exp1-1" "an import after the rebuild"
[ "$(nruns)" = 1 ] || fail "an import after the rebuild made a second run: $("$B" ps -a)"
expect_contains "$("$B" show exp1-1)" "best_loss 0.2" "the summary after the rebuild"

# ---- 3. an exit code, several at once ----
out=$("$B" import "$C" "$E" 2>&1) || fail "tandem import C E: $out"
expect_contains "$out" "imported as run crash-1 (failed, 1 metric points)" "the failed run"
[ "$(show_field crash-1 "exit code")" = 3 ] || fail "crash-1 exit code: $("$B" show crash-1)"
[ "$(nruns)" = 2 ] || fail "two runs: $("$B" ps -a)"

# ---- 4. a run still running: refused; --force imports it as failed ----
out=$("$B" import "$A" 2>&1)
[ $? = 1 ] || fail "a running offline run was not refused: $out"
expect_contains "$out" "$A: offline.json says run alive-" "the refusal names the directory"
expect_contains "$out" "still running" "the refusal says why"
expect_contains "$out" "--force" "the refusal names the way out"
[ "$(nruns)" = 2 ] || fail "a refused import left a run: $("$B" ps -a)"
out=$("$B" import --force "$A" 2>&1) || fail "tandem import --force: $out"
expect_contains "$out" "imported as run alive-1 (failed" "--force"
expect_contains "$(show_field alive-1 note)" "still said running" "--force's note"

# ---- 5. what is not an offline run ----
out=$("$B" import "$P/nothing-here" 2>&1)
[ $? = 1 ] || fail "a missing directory: $out"
expect_contains "$out" "$P/nothing-here: cannot import it: no such directory" "a missing directory"
mkdir empty
out=$("$B" import empty 2>&1)
[ $? = 1 ] || fail "a directory without offline.json: $out"
expect_contains "$out" "$P/empty has no offline.json" "a directory without offline.json"
out=$("$B" import "$E/offline.json" 2>&1)
[ $? = 1 ] || fail "a file: $out"
expect_contains "$out" "is not a directory" "a file"
echo '{"id": 5' >empty/offline.json
out=$("$B" import empty 2>&1)
[ $? = 1 ] || fail "a malformed offline.json: $out"
expect_contains "$out" "empty/offline.json:" "a malformed offline.json names the file"
out=$("$B" import 2>&1)
[ $? = 2 ] || fail "no DIR is a usage error: $out"
[ "$(nruns)" = 3 ] || fail "failed imports left runs behind: $("$B" ps -a)"
echo "tandem import: metrics, config, summary, artifacts (no links), status; once per offline run; a running one refused"
