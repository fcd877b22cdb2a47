#!/usr/bin/env bash
# track: chaos review, "tandem ps, logs and artifacts print what runs wrote raw: an artifact named
# with an OSC (set title) and an erase-display sequence retitles and clears the terminal of
# whoever lists it". tandem show and tandem metrics escaped such text already
# (test_show_escape.sh); now the other verbs do too, for every string that comes from the store
# or the file system (ids, workflows, notes, artifact names and paths, errors quoting them):
#   - `tandem artifacts` (the list and --download) with an artifact named
#     "art\e]0;pwned\a\e[2J.bin";
#   - `tandem ps` with a running run whose note holds the same sequences, and a run whose id
#     does (a run directory made by hand, restored by tandem reindex);
#   - `tandem logs` and `tandem stop` naming that run (its id, run dir and note);
# print them as \xNN: their output holds no control byte but \n.
set -uo pipefail
B=${TANDEM_BIN:?TANDEM_BIN must name the tandem binary}
PY=${PYTHON:-python3}
P=$(mktemp -d /tmp/tandem-verbs-escape-XXXXXX)
sup=
trap '[ -n "$sup" ] && kill -9 "$sup" 2>/dev/null; rm -rf "$P"' EXIT
export TANDEM_HOME=$P
unset TANDEM_PROGRESS TANDEM_RESUME TANDEM_CHECKPOINT_DIR TANDEM_METRICS
cd "$P" || exit 1
fail() { echo "FAIL: $*" >&2; exit 1; }

mkdir -p .tandem
cat > emit.sh <<'EOF'
mkdir -p out
printf 'weights' > "out/$(printf 'art\033]0;pwned\007\033[2J.bin')"
EOF
cat > .tandem/workflows.yaml <<'EOF'
workflows:
  - name: esc
    command: sh emit.sh
    artifacts: ["out/*"]
EOF
out=$("$B" run esc 2>&1) || fail "tandem run esc: $out"

# check FILE WHAT NEEDLE...: FILE is UTF-8 with no control byte (C0 but \n, DEL, U+0080..U+009F),
# and holds every NEEDLE (a Python bytes literal)
check() {
  "$PY" - "$@" <<'EOF' || exit 1
import re, sys
path, what, needles = sys.argv[1], sys.argv[2], sys.argv[3:]
data = open(path, "rb").read()
try:
    data.decode("utf-8")
except UnicodeDecodeError as e:
    sys.exit(f"FAIL: {what} writes broken UTF-8 ({e}): {data!r}")
bad = re.search(rb"[\x00-\x09\x0b-\x1f\x7f]|\xc2[\x80-\x9f]", data)
if bad:
    sys.exit(f"FAIL: {what} writes the control byte(s) {bad.group()!r} raw: {data!r}")
for n in needles:
    if eval(n) not in data:
        sys.exit(f"FAIL: {what} lacks {n}: {data!r}")
EOF
}
art='rb"art\x1b]0;pwned\x07\x1b[2J.bin"'

# ---- tandem artifacts ----
"$B" artifacts esc-1 > list.txt 2>&1 || fail "tandem artifacts: $(cat list.txt)"
check list.txt "tandem artifacts" "$art"
"$B" artifacts esc-1 --download "$P/dl" > dl.txt 2>&1 || fail "tandem artifacts --download: $(cat dl.txt)"
check dl.txt "tandem artifacts --download" "$art" 'b"(sha256 ok)"'
[ -f "$P/dl/out/$(printf 'art\033]0;pwned\007\033[2J.bin')" ] || fail "the download is not where its name says"
# a damaged stored copy: the error names it, escaped
stored=$(ls "$P/.tandem/runs/esc-1/artifacts/out/"*)
printf 'changed' > "$stored"
"$B" artifacts esc-1 --download "$P/dl2" > bad.txt 2>&1 && fail "a damaged artifact was not reported"
check bad.txt "tandem artifacts --download (damaged copy)" "$art" 'b"does not match"'
echo "ok: tandem artifacts escapes artifact names and paths"

# ---- tandem ps: a running run's note, and an id ----
# a run directory named by hand: an id with ESC in it
odd="$P/.tandem/runs/$(printf 'o\033[2J')-3"
mkdir -p "$odd/metrics"
"$B" reindex > reindex.txt 2>&1 || fail "tandem reindex: $(cat reindex.txt)"
sleep 300 &
sup=$!
# esc-1 running again, under a live process recorded with its start time, its note from a
# program (as a Slurm job's state is)
"$PY" - "$P/.tandem/runs.db" "$sup" <<'EOF' || fail "could not mark esc-1 running"
import sqlite3, sys
db, pid = sys.argv[1], int(sys.argv[2])
stat = open(f"/proc/{pid}/stat").read()
start = int(stat.rsplit(")", 1)[1].split()[19])
c = sqlite3.connect(db, timeout=10)
c.execute("UPDATE runs SET status = 'running', ended = 0, supervisor_pid = ?, supervisor_start = ?,"
          " note = ? WHERE id = 'esc-1'",
          (pid, start, "queued: \x1b]0;pwned\x07\x1b[2J" + "é" * 60 + " \x9b7m and more"))
c.commit()
EOF
"$B" ps -a > ps.txt 2>&1 || fail "tandem ps -a: $(cat ps.txt)"
check ps.txt "tandem ps" 'rb"queued: \x1b]0;pwned\x07\x1b[2J"' 'rb"o\x1b[2J-3"' 'b"..."'
grep -q '^esc-1 .* running' ps.txt || fail "tandem ps: esc-1 is not running: $(cat ps.txt)"
echo "ok: tandem ps escapes ids and notes (and cuts a long note between characters)"

# ---- tandem logs and tandem stop naming that run ----
"$B" logs esc-1 > logs.txt 2>&1 || fail "tandem logs esc-1: $(cat logs.txt)"
check logs.txt "tandem logs"
"$B" logs "$(printf 'o\033')" > nologs.txt 2>&1 && fail "tandem logs of a run without logs succeeded"
check nologs.txt "tandem logs (no logs)" 'rb"run o\x1b[2J-3 has no logs yet"'
"$B" stop "$(printf 'o\033')" > stop.txt 2>&1 && fail "tandem stop of an ended run succeeded"
check stop.txt "tandem stop (ended)" 'rb"run o\x1b[2J-3 already ended (failed)"' 'b"note: recovered"'
"$B" show "$(printf 'no\033[2Jsuch')" > nosuch.txt 2>&1 && fail "tandem show of no run succeeded"
check nosuch.txt "tandem show (no such run)" 'rb"no\x1b[2Jsuch"' 'rb"o\x1b[2J-3"'
echo "ok: tandem logs and tandem stop escape ids, paths, notes and errors"
echo "test_verbs_escape: ok"
