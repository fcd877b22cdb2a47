"""check_sdk_run.py RUNS_DB RUN_ID: the run of sdk_script.py succeeded, with its config and its
10 points in the store, read with Python's sqlite3 (not tandem)."""
import json
import sqlite3
import sys

db = sqlite3.connect(sys.argv[1])
seq, status, config = db.execute("SELECT seq, status, config FROM runs WHERE id = ?",
                                 (sys.argv[2],)).fetchone()
assert status == "succeeded", status
assert json.loads(config) == {"lr": 0.2, "opt": "sgd"}, config
rows = db.execute("SELECT k.name, m.step, m.value FROM metrics m JOIN metric_keys k ON k.id = m.key"
                  " WHERE m.run = ? AND k.name NOT LIKE 'sys/%' ORDER BY k.name, m.step", (seq,)).fetchall()
want = sorted([("acc", s, s / 10) for s in range(1, 6)] + [("loss", s, 1.0 / s) for s in range(1, 6)])
assert rows == want, (rows, want)
