#!/usr/bin/env bash
# `tandem ui` benchmark: a store of 100 runs, one of them 1,000,000 points over 10 keys and 2
# ranks (bench/ui_store_gen.c, through the real track API), served by `tandem ui --port 0`, timed
# in headless chromium by bench/bench_ui.mjs (the browser test's invocation). Targets: the run's
# first chart <= 1 s after navigation start, at most a few thousand points per chart, the runs
# table <= 0.5 s. Prints the numbers; docs/ui.md keeps a table of them.
#
# The peer, in the same invocation: MLflow's tracking server (`mlflow server`, SQLite backend in
# the same temp dir, on 127.0.0.1 at a free port) from the frameworks venv of scripts/venv.sh,
# holding the same 100 runs and points (bench/peers/mlflow_ui_load.py copies the store through
# MlflowClient.log_batch; the time it took is printed), its experiment's runs table and the big
# run's metric charts timed in the same headless chromium by bench/bench_ui_mlflow.mjs; then
# both side by side with ratios. MLFLOW_VENV (default $TANDEM_FRAMEWORKS_VENV, then the path
# `scripts/venv.sh --print-frameworks` prints) picks the venv; MLFLOW_VENV=none skips the peer.
#
#   bench/bench_ui.sh [BUILD_DIR] [REPS]     (default build, 5)
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "${1:-$SRC/build}" && pwd)
REPS=${2:-5}
B=$BUILD/tandem
GEN=$BUILD/bench/ui_store_gen
[ -x "$B" ] || { echo "no $B: build first (cmake --build $BUILD)"; exit 1; }
[ -x "$GEN" ] || { echo "no $GEN: build the ui_store_gen target"; exit 1; }
command -v node >/dev/null || { echo "node is missing"; exit 1; }
[ -d "$SRC/src/ui/web/node_modules/puppeteer-core" ] || { echo "run npm ci --prefix src/ui/web"; exit 1; }

P=$(mktemp -d /tmp/tandem-bench-ui-XXXXXX)
UI_PID=
ML_PID=
cleanup() {
  [ -n "$UI_PID" ] && kill "$UI_PID" 2>/dev/null && wait "$UI_PID" 2>/dev/null
  # mlflow server runs in its own process group (setsid): its workers go with it
  [ -n "$ML_PID" ] && kill -- -"$ML_PID" 2>/dev/null && wait "$ML_PID" 2>/dev/null
  rm -rf "$P"
}
trap cleanup EXIT
t0=$(date +%s.%N)
BIG=$("$GEN" "$P" 99 1000000 | tail -1)
echo "store: $(du -sh "$P/.tandem/runs.db" | cut -f1) runs.db, made in $(echo "$(date +%s.%N) - $t0" | bc | cut -c1-5) s; big run $BIG"

cd "$P"
TANDEM_HOME=$P "$B" ui --port 0 >"$P/ui.log" 2>&1 &
UI_PID=$!
URL=
for _ in $(seq 100); do
  URL=$(grep -o 'http://[^ ]*' "$P/ui.log" | head -1 || true)
  [ -n "$URL" ] && break
  sleep 0.1
done
[ -n "$URL" ] || { echo "tandem ui printed no URL: $(cat "$P/ui.log")"; exit 1; }
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
node "$SRC/bench/bench_ui.mjs" "$URL" "$BIG" "$REPS" | tee "$P/tandem.out"
{ kill "$UI_PID" && wait "$UI_PID"; } 2>/dev/null || true  # tandem ui off before the peer runs
UI_PID=

# The peer: MLflow's tracking server on the same store's contents.
MLV=${MLFLOW_VENV:-${TANDEM_FRAMEWORKS_VENV:-$(bash "$SRC/scripts/venv.sh" --print-frameworks)}}
if [ "$MLV" = none ]; then
  echo "MLflow peer: skipped (MLFLOW_VENV=none)"; exit 0
elif [ ! -x "$MLV/bin/mlflow" ]; then
  echo "MLflow peer: skipped: no mlflow in $MLV (bash scripts/venv.sh makes the frameworks venv)"; exit 0
elif [ -z "${MLFLOW_VENV:-}" ] && [ ! -f "$MLV/.tandem-requirements" ]; then
  echo "MLflow peer: skipped: $MLV is not ready (no .tandem-requirements: scripts/venv.sh still installing, or failed)"; exit 0
fi
M=$P/mlflow
mkdir -p "$M/artifacts"
echo
echo "MLflow $("$MLV/bin/python" -c 'import mlflow; print(mlflow.__version__)') peer ($MLV):" \
  "loading the same runs through MlflowClient.log_batch..."
"$MLV/bin/python" "$SRC/bench/peers/mlflow_ui_load.py" "$P/.tandem/runs.db" "sqlite:///$M/mlflow.db" \
  >"$M/load.json" 2>"$M/load.err" || { echo "mlflow_ui_load.py failed:"; tail -20 "$M/load.err"; exit 1; }
read -r EXP MBIG MRUNS MPOINTS MLOAD < <("$MLV/bin/python" -c '
import json, sys; r = json.load(open(sys.argv[1]))
print(r["experiment_id"], r["big_run_id"], r["runs"], r["points"], r["load_s"])' "$M/load.json")
echo "mlflow store: $MRUNS runs, $MPOINTS points, loaded in $MLOAD s; $(du -sh "$M/mlflow.db" | cut -f1) mlflow.db"
PORT=$("$MLV/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
setsid "$MLV/bin/mlflow" server --backend-store-uri "sqlite:///$M/mlflow.db" \
  --default-artifact-root "$M/artifacts" --host 127.0.0.1 --port "$PORT" --workers 1 \
  >"$M/server.log" 2>&1 &
ML_PID=$!
MURL=http://127.0.0.1:$PORT
for _ in $(seq 600); do
  curl -sf "$MURL/health" >/dev/null 2>&1 && break
  kill -0 "$ML_PID" 2>/dev/null || { echo "mlflow server exited: $(tail -20 "$M/server.log")"; exit 1; }
  sleep 0.1
done
curl -sf "$MURL/health" >/dev/null || { echo "mlflow server not up after 60 s: $(tail -20 "$M/server.log")"; exit 1; }
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
node "$SRC/bench/bench_ui_mlflow.mjs" "$MURL" "$EXP" "$MBIG" "$REPS" | tee "$P/mlflow.out"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$P/tandem.out" "$P/mlflow.out" "$MLOAD" <<'PY'
import json, sys
def result(path):
    return json.loads([l for l in open(path) if l.startswith("result: ")][-1][len("result: "):])
t, m = result(sys.argv[1]), result(sys.argv[2])
print()
print(f"tandem ui vs MLflow {m['mlflow']} ui, same store contents, same chromium, medians of the tabs "
      f"(MLflow loaded in {sys.argv[3]} s)")
print(f"{'':44s} {'tandem':>10s} {'mlflow':>10s} {'mlflow/tandem':>14s}")
rows = [("runs table (100 runs) drawn", "runs_table_ms", "runs_table_ms"),
        ("runs API response (/api/runs, runs/search)", "runs_api_ms", "runs_api_ms"),
        ("first chart of the big run drawn", "first_chart_ms", "first_chart_ms"),
        ("all charts of the big run drawn", "all_charts_ms", "all_charts_ms")]
for name, tk, mk in rows:
    a, b = t[tk], m[mk]
    print(f"{name:44s} {a:8.0f}ms {b:8.0f}ms {b / a:13.2f}x")
print(f"{'charts on the run page':44s} {t['charts']:10d} {m['charts']:10d}"
      "   (tandem: 10 keys x 2 ranks per chart; MLflow: one metric per rank and key)")
print(f"{'most points one chart received':44s} {t['max_points_per_chart']:10d} "
      f"{m['max_points_per_chart']:10d}")
PY
