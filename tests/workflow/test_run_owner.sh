#!/usr/bin/env bash
# workflow: a run is owned by one live group of processes (issue 8). As it was seen: `kill -9` of
# a run's supervisor left its launcher and workers training as orphans, and `tandem run
# --resume` then started a second group on the same run. Now:
#   - while any process of the group lives it holds the run's lock, and a resume is refused;
#   - the launcher dies with its supervisor (SIGTERM) and takes its workers along, so the
#     orphans are gone within the launcher's stop grace;
#   - then the resume is accepted.
set -uo pipefail
B=${TANDEM_BIN:?TANDEM_BIN must name the tandem binary}
P=$(mktemp -d /tmp/tandem-owner-XXXXXX)
trap 'rm -rf "$P"' EXIT
export TANDEM_HOME=$P
cd "$P"
fail() { echo "FAIL: $*" >&2; exit 1; }
mkdir -p .tandem
cat > .tandem/workflows.yaml <<EOF
workflows:
  - name: stubborn
    nproc_per_node: 2
    command: |
      [ -n "\${TANDEM_RESUME:-}" ] && exit 0
      trap 'sleep 4; exit 143' TERM
      touch "$P/up-\$RANK"
      while :; do sleep 0.1; done
EOF

id=$("$B" run -d stubborn 2>&1 | tail -1) || fail "tandem run -d: $id"
for _ in $(seq 100); do [ -e "$P/up-0" ] && [ -e "$P/up-1" ] && break; sleep 0.1; done
[ -e "$P/up-1" ] || fail "the workers did not start (run $id)"
sup=$("$B" show "$id" | awk '/supervisor pid/ {print $3}')
[ -n "$sup" ] || fail "no supervisor pid in tandem show $id"
group() { grep -l "TANDEM_RUN_ID=$id" /proc/[0-9]*/environ 2>/dev/null | wc -l; }
[ "$(group)" -gt 0 ] || fail "no process of run $id found"

kill -9 "$sup"
sleep 0.3
out=$("$B" run --resume "$id" 2>&1) && fail "a resume while the group lives was accepted: $out"
case "$out" in *"is in use"*) echo "ok: resume refused while the group lives" ;;
  *) fail "resume refused for another reason: $out" ;; esac

for _ in $(seq 150); do [ "$(group)" -eq 0 ] && break; sleep 0.2; done
left=$(group)
[ "$left" -eq 0 ] || fail "$left processes of run $id outlived their supervisor by 30 s"
echo "ok: the launcher and workers died with their supervisor"

out=$("$B" run --resume "$id" 2>&1) || fail "resume after the group ended: $out"
echo "ok: resume accepted once the group is gone"
