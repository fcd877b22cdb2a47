#!/usr/bin/env bash
# track: issue 19, "No tags, notes, names or groups (rejected with a clear error); no delete or
# archive: removing a run folder leaves a ghost run with charts and a dead download link."
# Through the CLI, with runs made by real `tandem run -- CMD`:
#   - tags, group and notes set at the start (--tag/--group/--notes) and later (tandem tag +T -U,
#     tandem group, tandem note, note from stdin), shown by tandem show and tandem ps, kept in
#     run.json; tandem ps --tag (all must match) and --group filter, newest first (docs/runs.md);
#   - bad tags and groups are refused, naming the rule, before any run starts;
#   - the labels survive runs.db deleted (the rebuild takes them from run.json);
#   - tandem archive hides a finished run from ps (ps -a and --archived show it), --undo brings
#     it back; a live run is not archived;
#   - tandem rm deletes the directory and every row (metrics too), refuses a live run and an
#     unknown one; an index made before the columns existed gains them;
#   - a directory deleted by hand: tandem show says it is gone and how to clean up, tandem
#     reindex drops the run (and its metrics);
#   - a workflow file's tags: and group: label its runs (--tag adds, --group replaces); a bad
#     tag there is a parse error naming the file;
#   - issue 29: 20 concurrent `tandem tag` keep all 20 tags (a concurrent tag/untag mix too);
#     tandem rm of a run whose directory, or a file or folder in it, links out of the project
#     removes the link, never the target's files.
set -uo pipefail
. "${TANDEM_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/lib/project.sh"
project_init manage
LIVE=
cleanup() {
  [ -n "$LIVE" ] && "$B" stop "$LIVE" --wait 10 >/dev/null 2>&1
  project_cleanup
}
trap cleanup EXIT
rows() { # table run-id: rows of the run in runs.db's table
  python3 -c "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); print(c.execute(
    'SELECT count(*) FROM %s WHERE run IN (SELECT seq FROM runs WHERE id=?)' % sys.argv[2],
    (sys.argv[3],)).fetchone()[0])" .tandem/runs.db "$1" "$2"
}
ps_ids() { "$B" ps "$@" | tail -n +2 | awk '{print $1}' | tr '\n' ' '; }

# A metric line too, so that the rows rm and reindex must delete exist.
CMD='echo "{\"step\": 1, \"loss\": 0.5}" >> "$TANDEM_METRICS"'

# ---- labels at the start ----
out=$("$B" run --name a --tag base --tag lr:3e-4 --group sweep1 --notes "first try" -- \
  sh -c "$CMD" 2>&1) || fail "tandem run with labels: $out"
"$B" run --name b -- sh -c "$CMD" >/dev/null 2>&1 || fail "tandem run b-1"
"$B" run --name c --tag base -- true >/dev/null 2>&1 || fail "tandem run c-1"
[ "$(show_field a-1 tags)" = "base,lr:3e-4" ] || fail "a-1 tags: $("$B" show a-1)"
[ "$(show_field a-1 group)" = "sweep1" ] || fail "a-1 group: $("$B" show a-1)"
[ "$(show_field a-1 notes)" = "first try" ] || fail "a-1 notes: $("$B" show a-1)"
[ "$(rows metrics a-1)" -ge 1 ] || fail "a-1 has no metric rows to delete later"
json=$(cat .tandem/runs/a-1/run.json)
expect_contains "$json" '"group": "sweep1"' "a-1 run.json"
expect_contains "$json" '"notes": "first try"' "a-1 run.json"
python3 -c "import json,sys; t=json.load(open(sys.argv[1]))['tags']; assert t==['base','lr:3e-4'], t" \
  .tandem/runs/a-1/run.json || fail "a-1 run.json tags"

# ---- bad labels: refused before anything runs ----
err=$("$B" run --name bad --tag 'bad tag' -- true 2>&1); rc=$?
[ "$rc" = 2 ] || fail "--tag 'bad tag': exit $rc ($err)"
expect_contains "$err" "tag 'bad tag' is not allowed" "--tag 'bad tag'"
expect_contains "$err" "1-64 characters" "--tag 'bad tag' names the rule"
[ ! -e .tandem/runs/bad-1 ] || fail "a run started despite a bad tag"
err=$("$B" tag a-1 "$(printf 'x%.0s' $(seq 65))" 2>&1); rc=$?
[ "$rc" = 2 ] || fail "a 65-character tag: exit $rc ($err)"
expect_contains "$err" "too long" "a 65-character tag"
err=$("$B" group a-1 'a,b' 2>&1); rc=$?
[ "$rc" = 2 ] || fail "group 'a,b': exit $rc ($err)"
expect_contains "$err" "group 'a,b' is not allowed" "group 'a,b'"
err=$("$B" tag nope-9 x 2>&1); rc=$?
[ "$rc" = 2 ] || fail "tag of an unknown run: exit $rc ($err)"
expect_contains "$err" "no run matches 'nope-9'" "tag of an unknown run"

# ---- labels later ----
out=$("$B" tag b-1 +x y) || fail "tandem tag b-1 +x y: $out"
expect_contains "$out" "b-1 tags: x,y" "tandem tag output"
"$B" tag a-1 -base new >/dev/null || fail "tandem tag a-1 -base new"
[ "$(show_field a-1 tags)" = "lr:3e-4,new" ] || fail "a-1 tags after -base new: $(show_field a-1 tags)"
"$B" group b-1 sweep1 || fail "tandem group"
"$B" note b-1 "hello world" || fail "tandem note"
printf 'from stdin\n' | "$B" note c-1 - || fail "tandem note c-1 -"
[ "$(show_field c-1 notes)" = "from stdin" ] || fail "c-1 notes from stdin: $(show_field c-1 notes)"
[ "$(show_field b-1 notes)" = "hello world" ] || fail "b-1 notes: $(show_field b-1 notes)"
"$B" note c-1 '' && "$B" group c-1 '' || fail "clearing c-1's notes and group"
[ -z "$(show_field c-1 notes)$(show_field c-1 group)" ] || fail "c-1 notes/group not cleared: $("$B" show c-1)"
err=$("$B" tag c-1 --help 2>&1); rc=$?
[ "$rc" = 2 ] || fail "tandem tag c-1 --help (a removal naming no tag): exit $rc ($err)"

# ---- shown and filtered by ps ----
ps=$("$B" ps)
expect_contains "$ps" "[sweep1] #lr:3e-4 #new" "ps shows a-1's labels"
[ "$(ps_ids --group sweep1)" = "b-1 a-1 " ] || fail "ps --group sweep1: $(ps_ids --group sweep1)"
[ "$(ps_ids --tag x --tag y)" = "b-1 " ] || fail "ps --tag x --tag y: $(ps_ids --tag x --tag y)"
[ "$(ps_ids --tag x --tag new)" = "" ] || fail "ps --tag x --tag new (none has both)"
[ "$(ps_ids --tag base)" = "c-1 " ] || fail "ps --tag base: $(ps_ids --tag base)"

# ---- kept across a lost index ----
rm -f .tandem/runs.db .tandem/runs.db-wal .tandem/runs.db-shm
"$B" reindex >/dev/null || fail "tandem reindex after runs.db deleted"
[ "$(show_field a-1 tags)" = "lr:3e-4,new" ] || fail "a-1 tags after reindex: $("$B" show a-1)"
[ "$(show_field b-1 group)" = "sweep1" ] || fail "b-1 group after reindex"
[ "$(show_field b-1 notes)" = "hello world" ] || fail "b-1 notes after reindex"

# ---- an index made before the columns: gains them ----
python3 - .tandem/runs.db <<'EOF' || fail "could not make an old-style index"
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
for col in ("tags", "run_group", "notes", "archived"):
    c.execute("ALTER TABLE runs DROP COLUMN " + col)
c.commit()
EOF
[ "$(ps_ids)" = "c-1 b-1 a-1 " ] || fail "ps on an old index: $("$B" ps 2>&1)"
"$B" tag c-1 again >/dev/null || fail "tag on an index that had no tags column"
# (An index that old never held labels: the columns start empty, and the new tag is kept.)
expect_contains "$(show_field c-1 tags)" "again" "c-1 tags on a migrated index"

# ---- archive ----
out=$("$B" archive a-1) || fail "tandem archive a-1: $out"
[ "$(ps_ids)" = "c-1 b-1 " ] || fail "ps after archive: $(ps_ids)"
[ "$(ps_ids -a)" = "c-1 b-1 a-1 " ] || fail "ps -a after archive: $(ps_ids -a)"
[ "$(ps_ids --archived)" = "a-1 " ] || fail "ps --archived: $(ps_ids --archived)"
[ "$(show_field a-1 status)" = "succeeded" ] || fail "show of an archived run"
"$B" archive --undo a-1 >/dev/null || fail "tandem archive --undo"
[ "$(ps_ids)" = "c-1 b-1 a-1 " ] || fail "ps after archive --undo: $(ps_ids)"

# ---- rm ----
[ "$(rows metrics b-1)" -ge 1 ] || fail "b-1 has no metric rows"
seq_b=$(python3 -c "import sqlite3; print(sqlite3.connect('.tandem/runs.db').execute(
  \"SELECT seq FROM runs WHERE id='b-1'\").fetchone()[0])")
out=$("$B" rm b-1) || fail "tandem rm b-1: $out"
[ ! -e .tandem/runs/b-1 ] || fail "rm left .tandem/runs/b-1"
[ "$(ps_ids -a)" = "c-1 a-1 " ] || fail "ps -a after rm: $(ps_ids -a)"
left=$(python3 -c "import sqlite3,sys; c=sqlite3.connect('.tandem/runs.db'); print(sum(
  c.execute('SELECT count(*) FROM %s WHERE run=?' % t, (int(sys.argv[1]),)).fetchone()[0]
  for t in ('metrics','artifacts','logs','ingest_offsets','run_events','run_activity')))" "$seq_b")
[ "$left" = 0 ] || fail "rm left $left rows of b-1 in the index"
err=$("$B" show b-1 2>&1); rc=$?
[ "$rc" = 2 ] || fail "show after rm: exit $rc ($err)"
err=$("$B" rm nope-9 2>&1); rc=$?
[ "$rc" = 2 ] || fail "rm of an unknown run: exit $rc ($err)"
expect_contains "$err" "no run matches 'nope-9'" "rm of an unknown run"
err=$("$B" rm a 2>&1); rc=$?
[ "$rc" = 2 ] && [ -d .tandem/runs/a-1 ] || fail "rm of a prefix: exit $rc ($err)"

# ---- a live run: neither removed nor archived ----
LIVE=$("$B" run -d --name live -- sh -c 'sleep 60') || fail "tandem run -d: $LIVE"
for _ in $(seq 1 100); do [ "$(show_field "$LIVE" status)" = running ] && break; sleep 0.1; done
err=$("$B" rm "$LIVE" 2>&1); rc=$?
[ "$rc" != 0 ] || fail "rm of a live run succeeded"
expect_contains "$err" "run $LIVE is live" "rm of a live run"
expect_contains "$err" "tandem stop $LIVE" "rm of a live run names the fix"
[ -f ".tandem/runs/$LIVE/run.json" ] || fail "rm of a live run removed its files"
err=$("$B" archive "$LIVE" 2>&1); rc=$?
[ "$rc" = 2 ] || fail "archive of a live run: exit $rc ($err)"
"$B" stop "$LIVE" --wait 30 >/dev/null 2>&1
"$B" rm "$LIVE" >/dev/null || fail "rm after stop"
[ ! -e ".tandem/runs/$LIVE" ] || fail "rm after stop left the directory"
LIVE=

# ---- a ghost: the directory deleted by hand ----
"$B" run --name g -- sh -c "$CMD" >/dev/null 2>&1 || fail "tandem run g-1"
rm -rf .tandem/runs/g-1
err=$("$B" show g-1 2>&1); rc=$?
[ "$rc" = 1 ] || fail "show of a ghost: exit $rc ($err)"
expect_contains "$err" "the directory of run g-1" "show of a ghost"
expect_contains "$err" "tandem reindex" "show of a ghost names the cleanup"
out=$("$B" reindex) || fail "reindex with a ghost: $out"
expect_contains "$out" "dropped 1 run whose directory is gone" "reindex drops the ghost"
[ "$(ps_ids -a)" = "c-1 a-1 " ] || fail "ps -a after the ghost was dropped: $(ps_ids -a)"
n=$(python3 -c "import sqlite3; print(sqlite3.connect('.tandem/runs.db').execute(
  \"SELECT count(*) FROM runs WHERE id='g-1'\").fetchone()[0])")
[ "$n" = 0 ] || fail "g-1 still in runs.db after reindex"
expect_lacks "$("$B" ps -a)" "g-1" "ps -a after reindex"
# --- tags: and group: in a workflow file; --tag adds to them, --group replaces the file's
mkdir -p .tandem
cat >.tandem/workflows.yaml <<'WF'
workflows:
  - name: wf
    tags: [nightly, base]
    group: sweep2
    command: "true"
WF
cat >bad.yaml <<'WF'
workflows:
  - name: badtag
    tags: ["-oops"]
    command: "true"
WF
"$B" run wf --tag extra >/dev/null 2>&1 || fail "tandem run wf"
[ "$(show_field wf-1 tags)" = "base,extra,nightly" ] || fail "wf-1 tags: $("$B" show wf-1)"
[ "$(show_field wf-1 group)" = "sweep2" ] || fail "wf-1 group: $("$B" show wf-1)"
"$B" run wf --group other >/dev/null 2>&1 || fail "tandem run wf --group other"
[ "$(show_field wf-2 group)" = "other" ] || fail "wf-2 group: $("$B" show wf-2)"
out=$("$B" run -f bad.yaml badtag 2>&1)
[ $? = 2 ] || fail "a bad tag in the file did not fail with 2: $out"
expect_contains "$out" "bad.yaml:" "the bad tag's error names the file"
expect_contains "$out" "-oops" "the bad tag's error names the tag"

# ---- issue 29: 20 `tandem tag` at once on one run keep all 20 (each re-reads the tags inside
# the store's write transaction); a mix of removals and additions at once, too ----
"$B" run --name cc -- true >/dev/null 2>&1 || fail "tandem run cc-1"
pids=()
for i in $(seq 1 20); do "$B" tag cc-1 "t$i" >"tag-$i.out" 2>&1 & pids+=($!); done
for i in $(seq 1 20); do wait "${pids[$((i - 1))]}" || fail "tandem tag cc-1 t$i: $(cat "tag-$i.out")"; done
want=$(printf 't%s\n' $(seq 1 20) | sort | paste -sd,)
[ "$(show_field cc-1 tags)" = "$want" ] || fail "20 concurrent tags: kept $(show_field cc-1 tags)"
python3 -c "import json,sys; t=json.load(open(sys.argv[1]))['tags']; assert len(t)==20, t" \
  .tandem/runs/cc-1/run.json || fail "20 concurrent tags: run.json"
pids=()
for i in $(seq 1 10); do "$B" tag cc-1 "-t$i" >"untag-$i.out" 2>&1 & pids+=($!)
  "$B" tag cc-1 "u$i" >"tag-u$i.out" 2>&1 & pids+=($!); done
for p in "${pids[@]}"; do wait "$p" || fail "a concurrent tag/untag failed: $(cat ./*tag-*.out)"; done
want=$(printf '%s\n' $(seq -f 't%g' 11 20) $(seq -f 'u%g' 1 10) | sort | paste -sd,)
[ "$(show_field cc-1 tags)" = "$want" ] || fail "concurrent tag/untag: $(show_field cc-1 tags)"

# ---- issue 29: rm removes a link, never what it names (a run directory, or a file or folder
# in one, that is a link out of the project) ----
"$B" run --name lk -- true >/dev/null 2>&1 || fail "tandem run lk-1"
"$B" run --name ld -- true >/dev/null 2>&1 || fail "tandem run ld-1"
OUTSIDE=$(mktemp -d /tmp/tandem-outside-XXXXXX)
trap 'cleanup; rm -rf "$OUTSIDE"' EXIT
mkdir -p "$OUTSIDE/keep/sub" "$OUTSIDE/rundir"
echo secret >"$OUTSIDE/keep/key"; echo deep >"$OUTSIDE/keep/sub/f"
ln -s "$OUTSIDE/keep" .tandem/runs/lk-1/artifacts/linked-dir
ln -s "$OUTSIDE/keep/key" .tandem/runs/lk-1/linked-file
cp -a .tandem/runs/ld-1/. "$OUTSIDE/rundir/" && rm -rf .tandem/runs/ld-1 &&
  ln -s "$OUTSIDE/rundir" .tandem/runs/ld-1 || fail "making ld-1's directory a link"
out=$("$B" rm lk-1 2>&1) || fail "tandem rm lk-1: $out"
out=$("$B" rm ld-1 2>&1) || fail "tandem rm ld-1 (a linked directory): $out"
[ ! -e .tandem/runs/lk-1 ] && [ ! -L .tandem/runs/ld-1 ] || fail "rm left the runs or the link"
[ "$(cat "$OUTSIDE/keep/key")" = secret ] && [ "$(cat "$OUTSIDE/keep/sub/f")" = deep ] ||
  fail "rm followed a link in a run out of the project: $(ls -lR "$OUTSIDE")"
[ -f "$OUTSIDE/rundir/run.json" ] || fail "rm followed a linked run directory: $(ls -lR "$OUTSIDE")"

echo "PASS"
