#!/usr/bin/env bash
# track: issue 8, "Deleting .tandem/runs.db mid-run: the next run reuses the id tiny-1 and its
# directory, appends to the old logs, mixes the old run's checkpoints with its own, and tandem
# show reports the old run's accuracy." Through the CLI, with the real trainer:
#   - a run directory describes its run (run.json);
#   - runs.db deleted while a run is going: the next run gets a fresh id and a fresh directory,
#     the running one finishes and is recorded (its supervisor follows the new index);
#   - `tandem reindex` after runs.db is lost restores every run: status, params, note, the same
#     number of metric points, the artifacts' SHA-256, the accuracy `tandem show` reports;
#   - `tandem ps` with runs.db missing rebuilds it (saying so once) and the numbering continues.
set -uo pipefail
B=${TANDEM_BIN:?TANDEM_BIN must name the tandem binary}
DATA=${TANDEM_DATA:-/usr/share/datasets/fashion-mnist}
if [ ! -e "$DATA/train-images-idx3-ubyte.gz" ] && [ ! -e "$DATA/train-images-idx3-ubyte" ]; then
  echo "SKIP: no Fashion-MNIST in $DATA (set TANDEM_DATA)"
  exit 77
fi
export TANDEM_DATA=$DATA
P=$(mktemp -d /tmp/tandem-reindex-XXXXXX)
trap 'rm -rf "$P"' EXIT
export TANDEM_HOME=$P
cd "$P"
fail() { echo "FAIL: $*" >&2; exit 1; }
expect_contains() { # haystack needle what
  case "$1" in *"$2"*) ;; *) fail "$3: expected to contain '$2', got: $1" ;; esac
}
field() { # run key: the value of one line of `tandem show`
  "$B" show "$1" 2>/dev/null | sed -n "s/^$2  *//p" | head -1
}
npoints() { "$B" metrics "$1" --csv | tail -n +2 | wc -l; }
acc() { "$B" metrics "$1" --csv --key test/acc | tail -1 | cut -d, -f4; }
wait_final() { # run: until its status is final (at most 120 s)
  for _ in $(seq 1 1200); do
    case "$(field "$1" status)" in succeeded|failed|stopped|preempted) return 0 ;; esac
    sleep 0.1
  done
  fail "run $1 did not finish: $("$B" show "$1" 2>&1)"
}

mkdir -p .tandem
cat > .tandem/workflows.yaml <<'EOF'
workflows:
  - name: tiny
    params: {lr: 0.001}
    command: mkdir -p out && tandem train --model mlp7 --data $TANDEM_DATA --steps 5 --batch 16 --json --save out/w.safetensors
    artifacts: [out/w.safetensors]
  - name: slow
    command: |
      sleep 2
      mkdir -p out && tandem train --model mlp7 --data $TANDEM_DATA --steps 5 --batch 16 --json --save out/w.safetensors
    artifacts: [out/w.safetensors]
EOF

# --- run 1; the run directory describes the run
out=$("$B" run tiny 2>&1) || fail "tandem run tiny: $out"
expect_contains "$out" "run tiny-1 succeeded" "first run"
J=.tandem/runs/tiny-1/run.json
[ -f "$J" ] || fail "no $J"
"${PYTHON:-python3}" - "$J" <<'EOF' || fail "run.json of tiny-1: $(cat "$J")"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["id"] == "tiny-1" and r["workflow"] == "tiny" and r["status"] == "succeeded", r
assert r["exit_code"] == 0 and r["params"] == {"lr": 0.001}, r
assert r["created"] > 0 and r["ended"] >= r["started"] > 0 and "tandem train" in r["command"], r
assert r["nodes"] == 1 and r["nproc_per_node"] == 1 and r["restarts"] == 0, r
EOF
acc1=$(acc tiny-1)
n1=$(npoints tiny-1)
sha1=$(sha256sum .tandem/runs/tiny-1/artifacts/out/w.safetensors | cut -d' ' -f1)
[ -n "$acc1" ] && [ "$n1" -gt 5 ] || fail "tiny-1: test/acc '$acc1', $n1 points"

# --- runs.db deleted while run 2 is going; run 3 starts meanwhile
id2=$("$B" run -d slow --param lr=0.01 2>/dev/null) || fail "tandem run -d slow"
[ "$id2" = slow-1 ] || fail "detached run id: '$id2'"
for _ in $(seq 1 600); do [ "$(field slow-1 status)" = running ] && break; sleep 0.1; done
rm -f .tandem/runs.db
out=$("$B" run tiny --param lr=0.002 2>&1) || fail "tandem run tiny after rm runs.db: $out"
expect_contains "$out" "run tiny-2 succeeded" "a fresh id after the index was deleted"
[ "$(grep -c '"world_size"' .tandem/runs/tiny-2/logs/rank-0.log)" = 1 ] \
  || fail "tiny-2's log holds another run's output: $(cat .tandem/runs/tiny-2/logs/rank-0.log)"
[ "$(grep -c '"world_size"' .tandem/runs/tiny-1/logs/rank-0.log)" = 1 ] \
  || fail "tiny-1's log was appended to"
[ "$(ls .tandem/runs/tiny-1/checkpoints)" = "ckpt-5.tdck" ] \
  || fail "tiny-1's checkpoints were touched: $(ls -l .tandem/runs/tiny-1/checkpoints)"
[ "$(acc tiny-1)" = "$acc1" ] || fail "tandem show reports another accuracy for tiny-1"
wait_final slow-1
[ "$(field slow-1 status)" = succeeded ] || fail "slow-1 after the index was replaced: $("$B" show slow-1)"
grep -q "while this process had it open; reopening it" .tandem/runs/slow-1/logs/supervisor.log \
  || fail "slow-1's supervisor did not follow the new index: $(cat .tandem/runs/slow-1/logs/supervisor.log)"
# whichever opened the store first after the rm (tiny-2's `tandem run`, or slow-1's supervisor
# polling) rebuilt it and said so, once
said=$(cat .tandem/runs/slow-1/logs/supervisor.log - <<<"$out" | grep -c "rebuilt it from 2 run directories")
[ "$said" = 1 ] || fail "the rebuild was announced $said times: $out $(cat .tandem/runs/slow-1/logs/supervisor.log)"
expect_contains "$("$B" show slow-1)" "out/w.safetensors" "slow-1's artifact recorded in the new index"

# what every run looks like now
declare -A st par np sha ac
for r in tiny-1 tiny-2 slow-1; do
  st[$r]=$(field $r status); par[$r]=$(field $r params); np[$r]=$(npoints $r)
  sha[$r]=$("$B" artifacts $r | awk 'NR > 1 {print $3}'); ac[$r]=$(acc $r)
done
[ "${par[slow-1]}" = '{"lr":0.01}' ] || fail "slow-1 params: ${par[slow-1]}"
[ "${sha[tiny-1]}" = "$sha1" ] || fail "tiny-1 artifact digest ${sha[tiny-1]}, file $sha1"
[ "${np[tiny-1]}" = "$n1" ] || fail "tiny-1 has ${np[tiny-1]} points after the first rebuild, had $n1"

# --- the index is lost again: tandem reindex restores everything
rm -f .tandem/runs.db .tandem/runs.db-wal .tandem/runs.db-shm
out=$("$B" reindex 2>&1) || fail "tandem reindex: $out"
expect_contains "$out" "3 restored from run.json" "reindex summary"
for r in tiny-1 tiny-2 slow-1; do
  expect_contains "$out" "restored   $r" "reindex lists $r"
  [ "$(field $r status)" = "${st[$r]}" ] || fail "$r status after reindex: $(field $r status), was ${st[$r]}"
  [ "$(field $r params)" = "${par[$r]}" ] || fail "$r params after reindex: $(field $r params), was ${par[$r]}"
  [ "$(npoints $r)" = "${np[$r]}" ] || fail "$r has $(npoints $r) metric points after reindex, had ${np[$r]}"
  [ "$("$B" artifacts $r | awk 'NR > 1 {print $3}')" = "${sha[$r]}" ] || fail "$r artifact digest after reindex"
  [ "$(acc $r)" = "${ac[$r]}" ] || fail "$r test/acc after reindex: $(acc $r), was ${ac[$r]}"
done
"$B" artifacts tiny-1 --download "$P/dl" >/dev/null || fail "download after reindex (digest check)"
expect_contains "$("$B" logs tiny-1)" "[rank 0]" "tiny-1 logs after reindex"
out=$("$B" reindex 2>&1) || fail "second reindex: $out"
expect_contains "$out" "0 restored from run.json" "a second reindex adds nothing"
expect_contains "$out" "3 already indexed" "a second reindex adds nothing"
expect_contains "$out" "0 metric points" "a second reindex ingests nothing twice"

# --- runs.db missing: the next verb rebuilds it, says so once; numbering goes on
rm -f .tandem/runs.db .tandem/runs.db-wal .tandem/runs.db-shm
ps1=$("$B" ps 2>"$P/err1") || fail "tandem ps: $(cat "$P/err1")"
for r in tiny-1 tiny-2 slow-1; do expect_contains "$ps1" "$r" "ps after rm runs.db"; done
[ "$(grep -c 'was missing; rebuilt it' "$P/err1")" = 1 ] || fail "ps stderr: $(cat "$P/err1")"
"$B" ps >/dev/null 2>"$P/err2" || fail "second ps"
[ ! -s "$P/err2" ] || fail "the rebuild was announced twice: $(cat "$P/err2")"
out=$("$B" run tiny 2>&1) || fail "tandem run tiny after the rebuild: $out"
expect_contains "$out" "run tiny-3 succeeded" "numbering continues after the highest id"
[ "$(grep -c '"world_size"' .tandem/runs/tiny-3/logs/rank-0.log)" = 1 ] || fail "tiny-3 log"

# --- a run directory without run.json is recovered and marked
mkdir -p .tandem/runs/old-7/metrics
echo '{"step": 3, "loss": 0.25}' > .tandem/runs/old-7/metrics/rank-0.jsonl
out=$("$B" reindex 2>&1) || fail "reindex with a bare directory: $out"
expect_contains "$out" "recovered  old-7" "bare directory"
expect_contains "$(field old-7 note)" "without run.json" "recovered run's note"
[ "$(npoints old-7)" = 1 ] || fail "old-7 points"
echo "test_reindex: ok"
