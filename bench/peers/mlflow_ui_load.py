"""MLflow peer of bench/bench_ui.sh: copies the benchmark's tandem store (bench/ui_store_gen.c's
.tandem/runs.db, read with sqlite3) into an MLflow tracking store through MLflow's own Python
client, MlflowClient.log_batch (1,000 metrics a call, MLflow's per-request limit), so the peer
holds the same 100 runs and the same points: the 99 sweep runs and the 1,000,000-point run.

MLflow has no ranks: rank r of key K is logged as metric "K/rank<r>" (so the big run is 20
metrics of 50,000 points, where tandem draws 10 charts of 2 ranks). Steps, values and the
wall time (ms) are the store's; params and start/end times are the runs'; every run FINISHED.

usage: mlflow_ui_load.py TANDEM_RUNS_DB TRACKING_URI
prints one JSON line: {"experiment_id", "big_run_id" (MLflow's id of tandem's last run),
"runs", "points", "workers", "load_s"}. MLFLOW_LOAD_WORKERS processes log in parallel (default:
one per core), each (run, key, rank) series in batches of 1,000 in step order."""
import json
import multiprocessing
import os
import sqlite3
import sys
import time

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")  # no network from a benchmark
os.environ.setdefault("DO_NOT_TRACK", "true")

from mlflow.entities import Metric, Param, RunStatus  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402

BATCH = 1000  # MLflow's MAX_METRICS_PER_BATCH
_src = _client = None


def _worker_init(db, uri):
    global _src, _client
    _src = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    _client = MlflowClient(tracking_uri=uri)


def _load(task):
    """Logs one (run, key, rank) series of the tandem store to its MLflow run."""
    seq, key, rank, name, rid = task
    batch, n = [], 0
    for step, value, t in _src.execute("SELECT step, value, time FROM metrics WHERE run = ? AND "
                                       "key = ? AND rank = ? ORDER BY step", (seq, key, rank)):
        batch.append(Metric(name, value, int(1000 * t), step))
        if len(batch) == BATCH:
            _client.log_batch(rid, metrics=batch)
            n += len(batch)
            batch = []
    if batch:
        _client.log_batch(rid, metrics=batch)
        n += len(batch)
    return n


def main():
    db, uri = sys.argv[1], sys.argv[2]
    workers = int(os.environ.get("MLFLOW_LOAD_WORKERS", os.cpu_count() or 1))
    t0 = time.perf_counter()
    src = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    keys = dict(src.execute("SELECT id, name FROM metric_keys"))
    runs = src.execute("SELECT seq, id, workflow, created, started, ended, params FROM runs "
                       "ORDER BY seq").fetchall()
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("tandem-bench-ui")
    ids, tasks = {}, []
    for seq, tid, workflow, created, started, ended, params in runs:
        run = client.create_run(exp, start_time=int(1000 * (started or created)),
                                tags={"workflow": workflow}, run_name=tid)
        rid = ids[seq] = run.info.run_id
        ps = [Param(k, str(v)) for k, v in json.loads(params or "{}").items()]
        if ps:
            client.log_batch(rid, params=ps)
        for key, rank in src.execute("SELECT DISTINCT key, rank FROM metrics WHERE run = ?",
                                     (seq,)):
            tasks.append((seq, key, rank, f"{keys[key]}/rank{rank}", rid))
    tasks.sort(key=lambda t: -t[0])  # the big run (last) first: its long series start early
    # spawn, not fork: MLflow caches its SQLAlchemy engine per URI, which a fork would share
    with multiprocessing.get_context("spawn").Pool(workers, _worker_init, (db, uri)) as pool:
        points = sum(pool.imap_unordered(_load, tasks))
    for seq, tid, workflow, created, started, ended, params in runs:
        client.set_terminated(ids[seq], RunStatus.to_string(RunStatus.FINISHED),
                              end_time=int(1000 * (ended or started or created)))
    print(json.dumps({"experiment_id": exp, "big_run_id": ids[runs[-1][0]], "runs": len(runs),
                      "points": points, "workers": workers,
                      "load_s": round(time.perf_counter() - t0, 1)}), flush=True)


if __name__ == "__main__":
    main()
