"""The step rules of wandb.log, run on real wandb (offline) or on tandem.wandb, printed as one
JSON list of [step, key, value] so tests/python/test_wandb_shim.sh can compare the two.

    python wandb_steps.py real|shim DIR
"""
import json
import os
import struct
import sys
import warnings


def calls(wandb):
    run = wandb.init(project="steps", config={"lr": 0.1, "opt": {"name": "sgd"}}, dir=DIR,
                     mode="offline") if MODE == "real" else \
        wandb.init(project="steps", config={"lr": 0.1, "opt": {"name": "sgd"}}, dir=DIR)
    wandb.log({"a": 1.0})                          # step 0, then 1
    wandb.log({"a": 2.0, "b": 20})                 # step 1, then 2
    wandb.log({"c": 3.5}, commit=False)            # step 2, still open
    wandb.log({"a": 3.0})                          # step 2 closes, then 3
    wandb.log({"a": 4.0}, step=5)                  # skips to 5, open
    wandb.log({"b": 50}, step=5)                   # same step, open
    wandb.log({"a": 4.5}, step=5)                  # the last value of a at 5 wins
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        wandb.log({"a": -1.0}, step=2)             # below the current step: ignored
    wandb.log({"train": {"loss": 0.25, "acc": 0.5}}, step=7)   # nested: train/loss
    wandb.log({"a": 7.0}, step=7, commit=True)     # closes 7, then 8
    wandb.log({"a": 8.0})                          # step 8
    wandb.config.update({"batch": 32})
    wandb.config.epochs = 3
    run.summary["best"] = 0.75
    wandb.finish()


def leveldb_records(path):
    """The records of a .wandb file: W&B's LevelDB-log framing (7-byte header, 32 KiB blocks,
    chunks of checksum, length, type)."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b":W&B", path
    pos, block, out, buf = 7, 32768, [], b""
    while pos + 7 <= len(data):
        left = block - (pos % block)
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        buf += chunk
        if kind in (1, 4):  # FULL, LAST
            out.append(buf)
            buf = b""
    return out


def _kind(pb, raw):
    r = pb.Record()
    r.ParseFromString(raw)
    return r.WhichOneof("record_type")


def real_points():
    from wandb.proto import wandb_internal_pb2 as pb
    files = []
    for root, _, names in os.walk(DIR):
        files += [os.path.join(root, n) for n in names if n.endswith(".wandb")]
    assert len(files) == 1, files
    import time
    for _ in range(300):  # wandb's service process may still be writing after finish()
        records = leveldb_records(files[0])
        if any(_kind(pb, raw) == "exit" for raw in records):
            break
        time.sleep(0.1)
    points, config, summary = [], {}, {}
    for raw in records:
        r = pb.Record()
        r.ParseFromString(raw)
        kind = r.WhichOneof("record_type")
        if kind == "history":
            step = r.history.step.num
            for it in r.history.item:
                key = "/".join(it.nested_key) if it.nested_key else it.key
                if key.startswith("_"):
                    continue  # W&B's own: _step, _runtime, _timestamp
                points.append([step, key, json.loads(it.value_json)])
        elif kind in ("config", "run"):
            for it in (r.config.update if kind == "config" else r.run.config.update):
                key = "/".join(it.nested_key) if it.nested_key else it.key
                if not key.startswith("_"):
                    config[key] = json.loads(it.value_json)
        elif kind == "summary":
            for it in r.summary.update:
                key = "/".join(it.nested_key) if it.nested_key else it.key
                summary[key] = json.loads(it.value_json)
    return points, config, summary


def shim_points():
    runs = os.listdir(os.path.join(DIR, "tandem-offline")) if os.path.isdir(
        os.path.join(DIR, "tandem-offline")) else os.listdir(DIR)
    base = os.path.join(DIR, runs[0]) if not os.path.isdir(os.path.join(DIR, "tandem-offline")) \
        else os.path.join(DIR, "tandem-offline", runs[0])
    points = []
    with open(os.path.join(base, "metrics", "rank-0.jsonl")) as f:
        for line in f:
            d = json.loads(line)
            step = d.pop("step")
            d.pop("time", None)
            for k, v in d.items():
                points.append([step, k, v])
    with open(os.path.join(base, "sdk.json")) as f:
        sdk = json.load(f)
    return points, sdk["config"], sdk["summary"]


MODE, DIR = sys.argv[1], sys.argv[2]
if MODE == "real":
    import wandb
    os.environ["WANDB_SILENT"] = "true"
else:
    import tandem.wandb as wandb
calls(wandb)
points, config, summary = real_points() if MODE == "real" else shim_points()
points.sort(key=lambda p: (p[0], p[1]))
print(json.dumps({"points": points,
                  "config": {k: config[k] for k in sorted(config)},
                  "summary_best": summary.get("best")}))
