#!/usr/bin/env bash
# workflow: a progress bar redrawn with '\r' through `tandem run` -> `tandem launch` -> terminal.
# Under a pseudo-terminal (script(1)) the workers get TANDEM_PROGRESS=1; each redraw reaches the
# terminal as "[rank 0] BAR\r" (not one endless line at the end); a line from another rank
# written while a bar is up first clears it (ESC [K); the rank log keeps only the bar's last
# state. Without a terminal TANDEM_PROGRESS stays unset.
set -uo pipefail
B=${TANDEM_BIN:?TANDEM_BIN must name the tandem binary}
PY=${PYTHON:-python3}
command -v script >/dev/null || { echo "SKIP: script(1) (util-linux) is missing"; exit 77; }
P=$(mktemp -d /tmp/tandem-progress-XXXXXX)
trap 'rm -rf "$P"' EXIT
export TANDEM_HOME=$P
unset TANDEM_PROGRESS
cd "$P"
fail() { echo "FAIL: $*" >&2; exit 1; }

mkdir -p .tandem
cat >.tandem/workflows.yaml <<'EOF'
workflows:
  - name: bar
    nproc_per_node: 2
    command: |
      if [ "$RANK" = 0 ]; then
        echo "progress=${TANDEM_PROGRESS:-unset}" >&2
        printf '\r[bar] 1\033[K' >&2; sleep 0.3
        printf '\r[bar] 2\033[K' >&2; touch "$TANDEM_RUN_DIR/go"; sleep 1
        printf '\r[bar] 3\033[K\n' >&2
      else
        for i in $(seq 100); do [ -e "$TANDEM_RUN_DIR/go" ] && break; sleep 0.05; done
        echo "rank one says hi" >&2
      fi
EOF

# On a terminal.
script -qec "'$B' run bar" "$P/tty.out" >/dev/null 2>&1 </dev/null || fail "tandem run bar under script exited $?: $(cat "$P/tty.out")"
"$PY" - "$P/tty.out" <<'EOF' || fail "terminal output: $(cat -A "$P/tty.out")"
import sys
out = open(sys.argv[1], "rb").read()
def has(b, what):
    assert b in out, "%s: expected %r in %r" % (what, b, out)
has(b"[rank 0] progress=1", "TANDEM_PROGRESS=1 under a terminal")
has(b"[rank 0] [bar] 1\x1b[K\r", "a redraw passed on as its own prefixed segment ending in CR")
has(b"\r\x1b[K[rank 1] rank one says hi", "another rank's line clears the bar first")
has(b"[rank 0] [bar] 3\x1b[K\r\n", "the bar's last state ends its line")
assert out.index(b"[bar] 1") < out.index(b"rank one says hi") < out.index(b"[bar] 3"), out
assert b"[rank 0] \r" not in out, "an empty segment was prefixed: %r" % out
EOF
log=$(cat .tandem/runs/bar-1/logs/rank-0.log)
case "$log" in *"[bar] 1"* | *"[bar] 2"*) fail "rank-0.log holds intermediate redraws: $(cat -A .tandem/runs/bar-1/logs/rank-0.log)" ;; esac
case "$log" in *"[bar] 3"*) ;; *) fail "rank-0.log lacks the bar's last state: $log" ;; esac

# Not on a terminal.
out=$("$B" run bar 2>&1 </dev/null) || fail "tandem run bar exited $?: $out"
case "$out" in *"[rank 0] progress=unset"*) ;; *) fail "without a terminal: expected progress=unset, got: $out" ;; esac
echo PASS
