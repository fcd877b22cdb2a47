#!/usr/bin/env bash
# track: issue 19, "the SDK's config and summary (RUN/sdk.json) are never shown". Through the
# CLI, with scripts run by real `tandem run -- python3 -c ...` using the Python SDK:
#   - tandem.init(config=...) and tandem.summary[...] reach the store: `tandem show` prints a
#     config and a summary section (keys sorted, values as JSON), run.json holds both;
#   - the SDK's tags are added to the run's (--tag), a bad one skipped with a warning;
#   - a running script's summary appears while it runs (the supervisor's ingest timer);
#   - runs.db deleted: the rebuild (and tandem reindex) keeps config and summary;
#   - a malformed or oversized sdk.json is a warning naming the file, and the run succeeds;
#   - the ui API's run object has "config" and "summary" (GET /api/runs/RUN).
set -uo pipefail
SRC=${TANDEM_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
PY=${PYTHON:-python3}
command -v "$PY" >/dev/null 2>&1 || { echo "SKIP: no $PY"; exit 77; }
. "$SRC/tests/lib/project.sh"
project_init sdkjson
LIVE=
cleanup() {
  [ -n "$LIVE" ] && "$B" stop "$LIVE" --wait 10 >/dev/null 2>&1
  project_cleanup
}
trap cleanup EXIT
export PYTHONPATH=$SRC/python

# ---- 1. config, summary and tags of a finished run ----
out=$("$B" run --name sdk --tag base -- "$PY" -c '
import tandem
tandem.init(config={"lr": 0.001, "model": "mlp", "layers": [2, 3], "zeta": None},
            tags=["sdk-tag", "bad tag", "base"])
tandem.log({"loss": 0.5})
tandem.summary["best_acc"] = 0.75
tandem.summary["acc"] = 0.5
tandem.summary.update({"epochs": 3, "name": "x"})
' 2>&1) || fail "tandem run with the SDK: $out"
expect_contains "$out" "succeeded" "sdk-1"
expect_contains "$out" "sdk.json: a tag skipped: tag 'bad tag'" "a bad SDK tag is a warning"
[ "$(show_field sdk-1 tags)" = "base,sdk-tag" ] || fail "sdk-1 tags merged: $("$B" show sdk-1)"
cfg=$(show_section sdk-1 config)
[ "$(echo "$cfg" | awk '{print $1}' | tr '\n' ' ')" = "layers lr model zeta " ] ||
  fail "config keys sorted: $cfg"
expect_contains "$cfg" 'model  "mlp"' "config value as JSON"
expect_contains "$cfg" 'layers [2,3]' "config list as JSON"
expect_contains "$cfg" 'zeta   null' "config null"
sum=$(show_section sdk-1 summary)
[ "$(echo "$sum" | awk '{print $1}' | tr '\n' ' ')" = "acc best_acc epochs name " ] ||
  fail "summary keys sorted: $sum"
expect_contains "$sum" 'best_acc 0.75' "summary value"
expect_contains "$sum" 'name     "x"' "summary string"
json=$(cat .tandem/runs/sdk-1/run.json)
expect_contains "$json" '"config": {' "run.json config"
expect_contains "$json" '"best_acc": 0.75' "run.json summary"
expect_contains "$json" '"sdk-tag"' "run.json tags"

# A run without the SDK: both sections say none.
"$B" run --name plain -- true >/dev/null 2>&1 || fail "tandem run plain"
[ "$(show_section plain-1 config)" = "  (none)" ] || fail "plain-1 config: $("$B" show plain-1)"
[ "$(show_section plain-1 summary)" = "  (none)" ] || fail "plain-1 summary: $("$B" show plain-1)"

# ---- 2. live: the summary of a running script appears while it runs ----
"$B" run -d --name live -- "$PY" -c '
import tandem, time, os
tandem.init(config={"phase": "live"})
tandem.summary["step_seen"] = 7
open(os.path.join(os.environ["TANDEM_RUN_DIR"], "..", "..", "..", "ready"), "w").close()
for _ in range(300):
    if tandem.should_stop() or os.path.exists(os.environ["TANDEM_RUN_DIR"] + "/../../../go"):
        break
    time.sleep(0.1)
tandem.summary["final"] = 1
' >/dev/null 2>&1 || fail "tandem run -d live"
LIVE=live-1
for _ in $(seq 100); do [ -e ready ] && break; sleep 0.1; done
[ -e ready ] || fail "the live script did not start: $("$B" logs live-1 2>&1)"
ok=
for _ in $(seq 50); do
  case "$(show_section live-1 summary)" in *"step_seen 7"*) ok=1; break ;; esac
  sleep 0.1
done
[ -n "$ok" ] || fail "the live summary did not appear while the run ran: $("$B" show live-1)"
[ "$(show_field live-1 status)" = running ] || fail "live-1 is not running: $("$B" show live-1)"
touch go
for _ in $(seq 100); do [ "$(show_field live-1 status)" = succeeded ] && break; sleep 0.1; done
[ "$(show_field live-1 status)" = succeeded ] || fail "live-1 did not succeed: $("$B" show live-1)"
LIVE=
expect_contains "$(show_section live-1 summary)" "final     1" "the summary's last change, at the end"

# ---- 3. runs.db deleted: rebuilt with config and summary; tandem reindex too ----
rm -f .tandem/runs.db .tandem/runs.db-wal .tandem/runs.db-shm
out=$("$B" show sdk-1 2>&1) || fail "show after runs.db was deleted: $out"
expect_contains "$out" 'best_acc 0.75' "summary after the rebuild"
expect_contains "$out" 'model  "mlp"' "config after the rebuild"
[ "$(show_field sdk-1 tags)" = "base,sdk-tag" ] || fail "tags after the rebuild: $out"
# run.json without the fields (an older tandem wrote it): reindex reads sdk.json itself.
"$PY" - .tandem/runs/sdk-1/run.json <<'EOF' || fail "editing run.json"
import json, sys
p = sys.argv[1]
d = json.load(open(p))
d.pop("config", None); d.pop("summary", None)
json.dump(d, open(p, "w"))
EOF
rm -f .tandem/runs.db .tandem/runs.db-wal .tandem/runs.db-shm
out=$("$B" reindex 2>&1) || fail "tandem reindex: $out"
expect_contains "$(show_section sdk-1 summary)" 'best_acc 0.75' "summary from sdk.json by reindex"
expect_contains "$(cat .tandem/runs/sdk-1/run.json)" '"best_acc": 0.75' "run.json rewritten"

# ---- 4. a malformed sdk.json: a warning naming it, the run still succeeds ----
out=$("$B" run --name bad -- sh -c 'printf "{\"config\": {\"lr\": 1" > "$TANDEM_RUN_DIR/sdk.json"' 2>&1)
[ $? = 0 ] || fail "a malformed sdk.json failed the run: $out"
expect_contains "$out" "bad-1/sdk.json:1: not the Python SDK's record" "malformed sdk.json warning"
[ "$(show_field bad-1 status)" = succeeded ] || fail "bad-1: $("$B" show bad-1)"
[ "$(show_section bad-1 config)" = "  (none)" ] || fail "bad-1 config: $("$B" show bad-1)"
# wrong types: a config that is a list, tags that are a string
out=$("$B" run --name types -- sh -c 'echo "{\"config\": [1], \"summary\": {\"a\": 1}, \"tags\": \"x\"}" > "$TANDEM_RUN_DIR/sdk.json"' 2>&1)
[ $? = 0 ] || fail "an sdk.json of wrong types failed the run: $out"
expect_contains "$out" '"config" is not a JSON object' "config of the wrong type"
expect_contains "$out" '"tags" is not a list' "tags of the wrong type"
expect_contains "$(show_section types-1 summary)" "a 1" "the summary of the same file"
# oversized: over 1 MiB is not read
out=$("$B" run --name big -- "$PY" -c '
import json, os
d = {"config": {"blob": "x" * (2 << 20)}, "summary": {"a": 1}}
open(os.environ["TANDEM_RUN_DIR"] + "/sdk.json", "w").write(json.dumps(d))
' 2>&1)
[ $? = 0 ] || fail "an oversized sdk.json failed the run: $out"
expect_contains "$out" "big-1/sdk.json is " "oversized sdk.json warning"
expect_contains "$out" "over the 1048576 read" "oversized sdk.json warning names the cap"
[ "$(show_section big-1 summary)" = "  (none)" ] || fail "big-1 summary: $("$B" show big-1)"
# a link is not followed
out=$("$B" run --name link -- sh -c 'echo "{\"summary\": {\"a\": 1}}" > "$TANDEM_RUN_DIR/../x.json"; ln -s ../x.json "$TANDEM_RUN_DIR/sdk.json"' 2>&1)
[ $? = 0 ] || fail "a linked sdk.json failed the run: $out"
expect_contains "$out" "link-1/sdk.json is a symbolic link" "a link is a warning"
[ "$(show_section link-1 summary)" = "  (none)" ] || fail "link-1 summary: $("$B" show link-1)"
rm -f .tandem/runs/x.json

# ---- 5. the ui API's run object ----
if command -v curl >/dev/null 2>&1; then
  PORT=$((20000 + RANDOM % 20000))
  "$B" ui --no-token --port "$PORT" >ui.log 2>&1 &
  UI=$!
  api=
  for _ in $(seq 50); do
    api=$(curl -s "http://127.0.0.1:$PORT/api/runs/sdk-1" 2>/dev/null) && [ -n "$api" ] && break
    sleep 0.1
  done
  api2=$(curl -s "http://127.0.0.1:$PORT/api/runs/plain-1" 2>/dev/null)
  kill "$UI" 2>/dev/null; wait "$UI" 2>/dev/null
  "$PY" - "$api" "$api2" <<'EOF' || fail "ui API run objects: $api / $api2 ($(cat ui.log))"
import json, sys
r = json.loads(sys.argv[1]); r = r.get("run", r)
assert r["config"]["model"] == "mlp" and r["config"]["layers"] == [2, 3], r
assert r["summary"]["best_acc"] == 0.75, r
r = json.loads(sys.argv[2]); r = r.get("run", r)
assert r["config"] == {} and r["summary"] == {}, r
EOF
fi
echo "sdk.json: config, summary and tags reach show, run.json, the rebuild and the ui API; live while running; a bad file is a warning"
