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
#   - a missing directory, a file, a directory without offline.json: errors naming them;
#   - issue 29: no link followed anywhere (a linked artifacts/ or metrics/, a linked folder or
#     file below artifacts/: left out, each named; DIR itself a link: refused);
#   - issue 29: two offline runs reusing one id (job7) become two runs.
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
expect_contains "$out" "imported as run crash-1 (failed, 1 metric point)" "the failed run"
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
# ---- 6. issue 29: no link is followed, anywhere: a linked artifacts/ or metrics/ folder, a
# linked file, a linked folder below artifacts/, DIR itself a link ----
mkdir -p "$P/private/deep" "$P/fakemetrics"
echo "PRIVATE KEY" >"$P/private/id_rsa"; echo "PRIVATE KEY" >"$P/private/deep/id_ed25519"
echo '{"step": 0, "stolen": 1}' >"$P/fakemetrics/rank-0.jsonl"
mklinked() { # name: an offline run with one real metric point
  "$PY" - "$1" <<'EOF2' || fail "the offline run $1"
import sys, tandem
tandem.init(name=sys.argv[1], dir="offline")
tandem.log({"loss": 1.0}, step=0)
tandem.finish()
EOF2
  ls -d "$P"/offline/"$1"-*
}
LA=$(mklinked linkart); LM=$(mklinked linkmet); LD=$(mklinked linkdir)
rm -rf "$LA/artifacts" && ln -s "$P/private" "$LA/artifacts"
rm -rf "$LM/metrics" && ln -s "$P/fakemetrics" "$LM/metrics"
mkdir -p "$LD/artifacts/real" && echo ok >"$LD/artifacts/real/f.txt"
ln -s "$P/private" "$LD/artifacts/sub"; ln -s "$P/private/id_rsa" "$LD/artifacts/real/key"
out=$("$B" import "$LA" 2>&1) || fail "import of a run with a linked artifacts/: $out"
expect_contains "$out" "$LA/artifacts is a symbolic link, not a directory: not imported" \
  "a linked artifacts/ is named"
out=$("$B" import "$LM" 2>&1) || fail "import of a run with a linked metrics/: $out"
expect_contains "$out" "$LM/metrics is a symbolic link, not a directory: not imported" \
  "a linked metrics/ is named"
expect_contains "$out" "imported as run linkmet-1 (succeeded, 0 metric points)" \
  "a linked metrics/ brings no points"
out=$("$B" import "$LD" 2>&1) || fail "import of a run with links below artifacts/: $out"
expect_contains "$out" "$LD/artifacts/sub is a symbolic link" "a linked folder below artifacts/"
expect_contains "$out" "$LD/artifacts/real/key is a symbolic link" "a linked file"
[ -f .tandem/runs/linkdir-1/artifacts/real/f.txt ] || fail "the real artifact beside the links"
if grep -rl "PRIVATE KEY\|stolen" .tandem/runs >/dev/null 2>&1; then
  fail "a linked file was imported: $(grep -rl "PRIVATE KEY\|stolen" .tandem/runs)"
fi
arts=$("$B" artifacts linkart-1 2>&1; "$B" artifacts linkdir-1 2>&1)
expect_lacks "$arts" "id_rsa" "a linked key registered as an artifact"
expect_lacks "$arts" "id_ed25519" "a linked key registered as an artifact"
ln -s "$E" "$P/link-to-run"
n0=$(nruns)
out=$("$B" import "$P/link-to-run/" 2>&1)
[ $? = 1 ] || fail "an import through a linked DIR: $out"
expect_contains "$out" "$P/link-to-run/ is a symbolic link to $E: tandem import never follows" \
  "a linked DIR is refused, naming the link and its target"
[ "$(nruns)" = "$n0" ] || fail "a refused linked DIR left a run: $("$B" ps -a)"

# ---- 7. issue 29: two offline runs reusing one id (a torchrun or Slurm job id comes again)
# are two runs: the second is imported, not taken for the first ----
for d in reuse-a reuse-b; do
  TORCHELASTIC_RUN_ID=job7 "$PY" - "$d" <<'EOF2' || fail "the offline run job7 in $d"
import sys, tandem
tandem.init(name="reuse", dir=sys.argv[1])
tandem.log({"loss": 1.0}, step=0)
tandem.finish()
EOF2
done
n0=$(nruns)
out=$("$B" import reuse-a/job7 2>&1) || fail "import of the first job7: $out"
expect_contains "$out" "imported as run reuse-1" "the first job7"
out=$("$B" import reuse-b/job7 2>&1) || fail "import of the second job7: $out"
expect_contains "$out" "imported as run reuse-2" "the second job7 is a run of its own"
[ "$(nruns)" = $((n0 + 2)) ] || fail "two offline runs with one id: $("$B" ps -a)"
out=$("$B" import reuse-b/job7 2>&1) || fail "import of the second job7 again: $out"
expect_contains "$out" "imported already, as run reuse-2" "the second job7 again"

# ---- 8. both line schemas (docs/metrics-format.md): an offline run of an older SDK wrote lines
# without "time" and a resume line without it; the newer one dates every line. The store holds
# what Python computes from the file by the documented rule: each numeric member a point, a
# {"key", "value"} line one point, a resume at step S drops the rank's earlier points past S,
# a dated line keeps its time. ----
"$PY" - <<'EOF2' || fail "the offline run mixed"
import tandem
tandem.init(name="mixed", dir="offline")
tandem.finish()
EOF2
X=$(ls -d "$P"/offline/mixed-*)
mkdir -p "$X/metrics"
cat >"$X/metrics/rank-0.jsonl" <<'EOF2'
{"step": 0, "loss": 0.9}
{"step": 1, "loss": 0.8, "acc": 0.1}
{"step": 2, "loss": 0.7}
{"event": "resume", "step": 1}
{"step": 2, "time": 1716201600.25, "loss": 0.65}
{"key": "step", "value": 3.0, "step": 3, "time": 1716201601.5}
{"event": "restart", "step": 3, "time": 1716201602.0}
{"step": 3, "time": 1716201602.5, "loss": 0.6}
EOF2
out=$("$B" import "$X" 2>&1) || fail "tandem import of old and new lines: $out"
got=$("$B" metrics mixed-1 --json 2>&1) || fail "tandem metrics mixed-1: $got"
"$PY" - "$X/metrics/rank-0.jsonl" "$got" <<'EOF2' || fail "the imported points of old and new lines"
import json, sys
want = {}
for line in open(sys.argv[1]):
    o = json.loads(line)
    if "event" in o:
        if o["event"] == "resume":
            want = {k: v for k, v in want.items() if k[1] <= o["step"]}
        continue
    items = [(o["key"], o["value"])] if "key" in o else \
        [(k, v) for k, v in o.items() if k not in ("step", "time", "rank")]
    for k, v in items:
        want[(k, o["step"])] = (v, o.get("time"))
rows = json.loads(sys.argv[2])  # tandem metrics --json: one array of points
got = {(r["key"], r["step"]): (r["value"], r["time"]) for r in rows if r["rank"] == 0}
assert set(got) == set(want), f"points: store {sorted(got)}, file {sorted(want)}"
assert len([r for r in rows if r["rank"] == 0]) == len(want), f"{len(rows)} points: {rows}"
for k, (v, t) in want.items():
    assert abs(got[k][0] - v) < 1e-12, f"{k}: store {got[k][0]}, file {v}"
    assert t is None or abs(got[k][1] - t) < 1e-6, f"{k}: time {got[k][1]}, file {t}"
EOF2

echo "tandem import: metrics, config, summary, artifacts (no links), status; old and new line schemas; once per offline run; a running one refused"
