#!/usr/bin/env bash
# track: chaos review, "metric keys reach the terminal raw: ESC sequences in a key retitle and
# clear the terminal from tandem show and tandem metrics". A run whose metric key holds an OSC
# (set title), an erase-display sequence, BEL and a C1 CSI (U+009B), and whose command holds an
# ESC sequence too:
#   - `tandem show` and the `tandem metrics` table print them as \xNN, with no control byte left,
#     and keep other UTF-8 text (a key in Chinese) as it is;
#   - `tandem metrics --json` stays JSON, escaped as JSON escapes (\u001b);
#   - `tandem metrics --csv` is data: byte for byte into a pipe, escaped on a terminal;
#   - `tandem reindex` escapes the ids and notes it prints (a run directory named by hand).
set -uo pipefail
B=${TANDEM_BIN:?TANDEM_BIN must name the tandem binary}
PY=${PYTHON:-python3}
P=$(mktemp -d /tmp/tandem-escape-XXXXXX)
trap 'rm -rf "$P"' EXIT
export TANDEM_HOME=$P
cd "$P"
fail() { echo "FAIL: $*" >&2; exit 1; }

mkdir -p .tandem
# The key as JSON writes it; the ingester stores the bytes it stands for.
cat > emit.sh <<'EOF'
printf '%s\n' '{"step": 1, "\u001b]0;pwned\u0007\u001b[2Jkey\u009bx": 0.5, "损失": 0.25}' >> "$TANDEM_METRICS"
EOF
cat > .tandem/workflows.yaml <<'EOF'
workflows:
  - name: esc
    command: "sh emit.sh # \e]0;title\a"
EOF
out=$("$B" run esc 2>&1) || fail "tandem run esc: $out"

# check FILE WHAT NEEDLE...: no control byte (C0 but \n, DEL, U+0080..U+009F) in FILE, and
# every NEEDLE (a Python bytes literal) in it
check() {
  "$PY" - "$@" <<'EOF' || exit 1
import re, sys
path, what, needles = sys.argv[1], sys.argv[2], sys.argv[3:]
data = open(path, "rb").read()
bad = re.search(rb"[\x00-\x09\x0b-\x1f\x7f]|\xc2[\x80-\x9f]", data)
if bad:
    sys.exit(f"FAIL: {what} writes the control byte(s) {bad.group()!r} raw: {data!r}")
for n in needles:
    if eval(n) not in data:
        sys.exit(f"FAIL: {what} lacks {n}: {data!r}")
EOF
}
key='rb"\x1b]0;pwned\x07\x1b[2Jkey\xc2\x9bx"'
"$B" show esc-1 > "$P/show.txt" 2>&1 || fail "tandem show: $(cat "$P/show.txt")"
check "$P/show.txt" "tandem show" "$key" '"损失".encode()' 'rb"# \x1b]0;title\x07"'
"$B" metrics esc-1 > "$P/table.txt" 2>&1 || fail "tandem metrics: $(cat "$P/table.txt")"
check "$P/table.txt" "tandem metrics" "$key" '"损失".encode()'
"$B" metrics esc-1 --key "$(printf 'no\033[2Jsuch')" > "$P/none.txt" 2>&1
check "$P/none.txt" "tandem metrics --key (no points)" 'rb"no\x1b[2Jsuch"'

# JSON: valid, the key escaped as JSON does it, and it reads back to the same bytes
"$B" metrics esc-1 --json > "$P/json.txt" || fail "tandem metrics --json"
"$PY" - "$P/json.txt" <<'EOF' || fail "tandem metrics --json: $(cat "$P/json.txt")"
import json, sys
text = open(sys.argv[1], encoding="utf-8").read()
assert "\\u001b]0;pwned\\u0007\\u001b[2jkey" in text.lower(), text
keys = {row["key"] for row in json.loads(text)}
assert "\x1b]0;pwned\x07\x1b[2Jkey\x9bx" in keys and "损失" in keys, keys
EOF

# CSV: raw into a pipe (it is data), escaped when it goes to a terminal
"$B" metrics esc-1 --csv | grep -q $'\x1b]0;pwned' || fail "tandem metrics --csv changed the key in a pipe"
if script -qec true /dev/null >/dev/null 2>&1; then
  script -qec "'$B' metrics esc-1 --csv" /dev/null > "$P/csv-tty.txt" 2>&1
  tr -d '\r' < "$P/csv-tty.txt" > "$P/csv.txt"
  check "$P/csv.txt" "tandem metrics --csv on a terminal" "$key"
else
  echo "note: no working script(1); the CSV-on-a-terminal check is skipped"
fi
# tandem reindex prints the ids it restores: a directory made by hand may name one with ESC
mkdir -p ".tandem/runs/$(printf 'e\033]0;t\007')-7/metrics"
"$B" reindex > "$P/reindex.txt" 2>/dev/null || fail "tandem reindex: $(cat "$P/reindex.txt")"
check "$P/reindex.txt" "tandem reindex" 'rb"recovered  e\x1b]0;t\x07-7"'
echo "test_show_escape: ok"
