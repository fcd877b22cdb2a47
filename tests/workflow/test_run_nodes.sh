#!/usr/bin/env bash
# workflow: `nodes: 2` starts two node agents on this host (issue 8: multi-node is safe by
# default whenever tandem starts the nodes itself). Asserts:
#   - both agents meet and form one job of WORLD_SIZE 2, one rank per node;
#   - the store is served on the socket the supervisor bound and handed to node 0
#     (TANDEM_STORE_LISTEN_FD), on loopback only;
#   - the token is random per run (never derived from the run id), so no launcher warns that
#     TANDEM_TOKEN is unset, and two runs get different tokens.
set -uo pipefail
B=${TANDEM_BIN:?TANDEM_BIN must name the tandem binary}
P=$(mktemp -d /tmp/tandem-nodes-XXXXXX)
trap 'rm -rf "$P"' EXIT
export TANDEM_HOME=$P
cd "$P"
fail() { echo "FAIL: $*" >&2; exit 1; }
mkdir -p .tandem
cat > .tandem/workflows.yaml <<'EOF2'
workflows:
  - name: two
    nodes: 2
    command: |
      echo "rank=$RANK world=$WORLD_SIZE node=$GROUP_RANK store=$TANDEM_STORE_ADDR"
      echo "token=$TANDEM_TOKEN" > "$TANDEM_PROJECT_DIR/token-$TANDEM_RUN_ID-$RANK"
      ss -ltn 2> /dev/null | grep ":${TANDEM_STORE_ADDR##*:} " > "$TANDEM_PROJECT_DIR/listen-$TANDEM_RUN_ID" || true
EOF2
for n in 1 2; do
  out=$("$B" run two 2>&1) || fail "tandem run two: $out"
  case "$out" in *"TANDEM_TOKEN is not set"*) fail "a launcher warned about the token: $out" ;; esac
done
for id in two-1 two-2; do
  logs=$(cat .tandem/runs/$id/logs/rank-*.log)
  for r in 0 1; do
    echo "$logs" | grep -q "rank=$r world=2 node=$r store=127.0.0.1:" ||
      fail "run $id: rank $r did not join a 2-node job: $logs"
  done
  [ "$(cat token-$id-0)" = "$(cat token-$id-1)" ] || fail "run $id: the nodes got different tokens"
  if [ -s "listen-$id" ]; then
    grep -q '127.0.0.1:' "listen-$id" || fail "run $id: the store listens beyond loopback: $(cat listen-$id)"
  fi
done
[ "$(cat token-two-1-0)" != "$(cat token-two-2-0)" ] || fail "two runs got the same token"
case "$(cat token-two-1-0)" in token=????????????????????????????????) ;;
  *) fail "the token is not 32 random hex digits: $(cat token-two-1-0)" ;; esac
echo "ok: 2 nodes joined on the handed-over socket, with a random token per run"
