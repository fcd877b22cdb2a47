#!/usr/bin/env python3
"""python: the Python SDK's calls one by one, and their bad input, without a tandem binary.

Each test_* function runs in a fresh directory with the TANDEM_* variables cleared (pytest
collects them as they are; run as a script, main() runs them all). The lines written are checked
against the metrics contract the C ingester reads (docs/runs.md): strict JSON (no NaN), a step on
every line, reserved names as one-point lines, the resume line. tests/python/test_sdk_run.sh
checks the same files through the real store.
"""
import json
import math
import os
import shutil
import signal
import stat
import sys
import tempfile
import traceback

SRC = os.environ.get("TANDEM_SOURCE_DIR") or os.path.dirname(os.path.dirname(
    os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(SRC, "python"))
import tandem  # noqa: E402
from tandem import checkpoint  # noqa: E402

DIRS = []  # removed at the end


def fresh(**env):
    """A clean state: no run, no TANDEM_* variables, a new working directory; env set."""
    tandem._reset()
    for k in list(os.environ):
        if k.startswith(("TANDEM_", "TORCHELASTIC_")) or k in ("RANK", "WORLD_SIZE",
                                                               "LOCAL_RANK"):
            del os.environ[k]
    d = tempfile.mkdtemp(prefix="tandem-sdk-")
    DIRS.append(d)
    os.chdir(d)
    for k, v in env.items():
        os.environ[k] = str(v)
    return d


def tracked(rank=0, world=2, **env):
    """The environment `tandem run` + `tandem launch` give a worker, in a scratch run dir."""
    d = fresh()
    run_dir = os.path.join(d, ".tandem", "runs", "t-1")
    for sub in ("metrics", "checkpoints", "artifacts"):
        os.makedirs(os.path.join(run_dir, sub))
    os.environ.update({
        "TANDEM_RUN_ID": "t-1", "TANDEM_RUN_DIR": run_dir,
        "TANDEM_METRICS": os.path.join(run_dir, "metrics", f"rank-{rank}.jsonl"),
        "TANDEM_CHECKPOINT_DIR": os.path.join(run_dir, "checkpoints"),
        "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
        "TANDEM_RESTART_COUNT": "0", "TORCHELASTIC_RESTART_COUNT": "0"})
    os.environ.update({k: str(v) for k, v in env.items()})
    return run_dir


def strict(text):
    def no_constant(c):
        raise AssertionError(f"{c} in a metrics line: the C ingester rejects the whole line")
    return json.loads(text, parse_constant=no_constant)


def lines(path):
    with open(path) as f:
        raw = f.read()
    assert raw.endswith("\n"), repr(raw[-40:])
    return [strict(l) for l in raw.splitlines()]


def raises(exc, fn, *a, match=None, **kw):
    try:
        fn(*a, **kw)
    except exc as e:
        assert match is None or match in str(e), f"expected {match!r} in: {e}"
        return e
    raise AssertionError(f"{fn.__name__}{a} did not raise {exc.__name__}")


def eq(a, b, what=""):
    assert a == b, f"{what}: expected {b!r}, got {a!r}"


def untimed(line):
    """An event line without its time (docs/metrics-format.md: every line has a numeric time)."""
    assert isinstance(line.get("time"), float), f"no wall-clock time in {line!r}"
    return {k: v for k, v in line.items() if k != "time"}


# ---- init
def test_calls_before_init_fail():
    fresh()
    raises(tandem.TandemError, tandem.log, {"loss": 1.0}, match="before tandem.init()")
    raises(tandem.TandemError, tandem.artifact, "x", match="tandem.init() first")
    raises(tandem.TandemError, checkpoint.save, {}, 1, match="tandem.init() first")
    raises(tandem.TandemError, checkpoint.load_latest, match="tandem.init() first")


def test_offline_run_layout():
    d = fresh()
    r = tandem.init(config={"lr": 0.1}, name="my run", tags=["a"])
    eq(r.mode, "offline", "mode")
    assert r.dir.startswith(os.path.join(d, "tandem-offline", "my_run-")), r.dir
    tandem.log({"loss": 0.5})
    eq(os.path.exists(os.path.join(r.dir, "metrics", "rank-0.jsonl")), True, "metrics file")
    off = json.load(open(os.path.join(r.dir, "offline.json")))
    eq(off["status"], "running", "offline.json status")
    assert "not in any project's run store" in off["note"], off
    assert not os.path.exists(os.path.join(d, ".tandem")), "an offline run touched the store"
    tandem.finish(0)
    off = json.load(open(os.path.join(r.dir, "offline.json")))
    eq((off["status"], off["exit_code"]), ("finished", 0), "offline.json after finish")
    # dir= and TANDEM_OFFLINE_DIR choose the place
    tandem._reset()
    r2 = tandem.init(dir=os.path.join(d, "elsewhere"))
    assert r2.dir.startswith(os.path.join(d, "elsewhere")), r2.dir


def test_tracked_run_paths_and_not_live():
    run_dir = tracked()
    r = tandem.init()
    eq(r.mode, "tracked", "mode")
    eq(r.dir, run_dir, "dir")
    eq(r.checkpoint_dir, os.path.join(run_dir, "checkpoints"), "checkpoint dir")
    tandem.log({"loss": 1.0}, step=1)
    eq(lines(os.path.join(run_dir, "metrics", "rank-0.jsonl"))[0]["loss"], 1.0, "logged")
    assert not os.path.exists("tandem-offline"), "a tracked run wrote an offline directory"
    # a run whose directory is gone is not live
    tandem._reset()
    os.environ["TANDEM_RUN_DIR"] = os.path.join(run_dir, "gone")
    raises(tandem.TandemError, tandem.init, match="the run is not live")
    # `tandem launch` without `tandem run`: metrics to TANDEM_METRICS, the rest offline by id
    tandem._reset()
    del os.environ["TANDEM_RUN_DIR"]
    r = tandem.init()
    eq(r.mode, "launched", "mode under tandem launch")
    assert r.dir.endswith(os.path.join("tandem-offline", "t-1")), r.dir


def test_init_twice_and_config():
    import argparse
    fresh()
    tandem.config["early"] = 1  # before init: kept
    ns = argparse.Namespace(lr=0.5, steps=10)
    r = tandem.init(config=ns, project="p")
    assert tandem.init(config={"more": True}) is r, "init twice returns the same run"
    tandem.config.batch = 64
    tandem.config.update({"dev": object.__new__(type("Dev", (), {"__str__": lambda s: "cpu"}))})
    tandem.config["bad"] = float("inf")
    doc = json.load(open(os.path.join(r.dir, "sdk.json")))
    eq(doc["config"], {"early": 1, "lr": 0.5, "steps": 10, "more": True, "batch": 64,
                       "dev": "cpu", "bad": "inf"}, "config")
    eq(tandem.config.lr, 0.5, "attribute access")
    eq(doc["project"], "p", "project")
    tandem._reset()
    raises(TypeError, tandem.init, tags="a", match="tags is a list")
    raises(TypeError, tandem.init, config=3, match="config is a dict")


def test_summary_kept_across_a_resume():
    run_dir = tracked()
    tandem.init()
    tandem.summary["best_acc"] = 0.9
    tandem.summary.update(final=1)
    tandem._reset()  # the process ends; a resume starts it again in the same run
    os.environ["TANDEM_RESUME"] = "1"
    tandem.init(config={"x": 1})
    eq(dict(tandem.summary), {"best_acc": 0.9, "final": 1}, "summary after resume")
    doc = json.load(open(os.path.join(run_dir, "sdk.json")))
    eq(doc["summary"]["best_acc"], 0.9, "sdk.json summary")


# ---- log
def test_log_lines_follow_the_contract():
    run_dir = tracked()
    tandem.init()
    import torch
    import numpy as np
    tandem.log({"loss": 0.5, "acc": 1})               # step 0 (auto)
    tandem.log({"loss": torch.tensor(0.25), "n": np.float32(2.5), "i": np.int64(3)})  # step 1
    tandem.log({"loss": float("nan"), "x": float("inf"), "y": 2.0}, step=5)
    tandem.log({"step": 7, "time": 8, "rank": 9, "key": 10, "value": 11, "event": 12,
                "ok": 1.5}, step=6)
    tandem.log({"big": 2 ** 70}, step=7)
    tandem.log({"only_nan": float("nan")}, step=8.0)
    ls = lines(os.path.join(run_dir, "metrics", "rank-0.jsonl"))
    for l in ls:
        assert isinstance(l["step"], int) and isinstance(l["time"], float), l
    eq([(l["step"], l.get("loss")) for l in ls[:3]], [(0, 0.5), (1, 0.25), (5, None)], "steps")
    eq(ls[1]["n"], 2.5, "numpy float")
    eq(ls[1]["i"], 3, "numpy int")
    assert ls[2]["loss"] is None and ls[2]["x"] is None and ls[2]["y"] == 2.0, ls[2]
    plain, *points = ls[3:10]
    eq(plain["ok"], 1.5, "plain member next to reserved ones")
    assert not set(plain) & {"rank", "key", "value", "event"}, plain
    eq(sorted((p["key"], p["value"], p["step"]) for p in points),
       sorted([("step", 7, 6), ("time", 8, 6), ("rank", 9, 6), ("key", 10, 6),
               ("value", 11, 6), ("event", 12, 6)]), "one-point lines for reserved names")
    eq(ls[10]["big"], float(2 ** 70), "an int past int64 is written as a real")
    eq(ls[11], {"step": 8, "time": ls[11]["time"], "only_nan": None}, "nan only")
    eq(len(ls), 12, "line count")


def test_log_bad_input():
    run_dir = tracked()
    tandem.init()
    import torch
    raises(TypeError, tandem.log, {"loss": "0.5"}, match="'loss' is str")
    raises(TypeError, tandem.log, {"loss": None}, match="'loss' is NoneType")
    raises(TypeError, tandem.log, {"ok": True}, match="is a bool")
    raises(TypeError, tandem.log, {"v": torch.zeros(3)}, match="has 3 elements")
    raises(TypeError, tandem.log, {1: 0.5}, match="non-empty strings")
    raises(TypeError, tandem.log, {"": 0.5}, match="non-empty strings")
    raises(ValueError, tandem.log, {"\ud800": 0.5}, match="not valid Unicode")
    raises(TypeError, tandem.log, [("loss", 1.0)], match="expected a dict")
    raises(TypeError, tandem.log, {"loss": 1.0}, step="3", match="step must be an integer")
    raises(ValueError, tandem.log, {"loss": 1.0}, step=1.5, match="step must be an integer")
    raises(ValueError, tandem.log, {"loss": 1.0}, step=-1, match="out of range")
    tandem.log({"loss": 1.0}, step=10)
    raises(ValueError, tandem.log, {"loss": 1.0}, step=9, match="below the last logged step 10")
    raises(ValueError, tandem.log, {"loss": 2.0}, step=10, match="already logged at step 10")
    tandem.log({"acc": 2.0}, step=10)  # another key at the same step is fine
    path = os.path.join(run_dir, "metrics", "rank-0.jsonl")
    eq([l["step"] for l in lines(path)], [10, 10], "nothing written by the refused calls")
    tandem.finish()
    raises(tandem.TandemError, tandem.log, {"loss": 1.0}, step=11, match="after tandem.finish()")


def test_rank_1_logs_nothing_unless_all_ranks():
    run_dir = tracked(rank=1)
    tandem.init()
    tandem.log({"loss": 0.5}, step=1)
    raises(TypeError, tandem.log, {"loss": "x"}, step=2)  # still checked on every rank
    assert not os.listdir(os.path.join(run_dir, "metrics")), "rank 1 wrote metrics"
    assert not os.path.exists(os.path.join(run_dir, "sdk.json")), "rank 1 wrote sdk.json"
    tandem._reset()
    tandem.init(all_ranks=True)
    tandem.log({"loss": 0.5}, step=1)
    eq(lines(os.path.join(run_dir, "metrics", "rank-1.jsonl"))[0]["loss"], 0.5, "all_ranks")
    # The rule is the global rank (RANK), not the rank on this node: the first worker of the
    # second node (RANK=2, LOCAL_RANK=0) writes nothing either.
    run_dir = tracked(rank=2, world=4, LOCAL_RANK=0)
    tandem.init(config={"lr": 1})
    tandem.log({"loss": 0.5}, step=1)
    tandem.summary["best"] = 1
    open("a.bin", "wb").close()
    eq(tandem.artifact("a.bin"), None, "artifact on RANK=2, LOCAL_RANK=0")
    tandem.finish()
    eq(sorted(os.listdir(run_dir)), ["artifacts", "checkpoints", "metrics"],
       "files of RANK=2, LOCAL_RANK=0")
    # no metrics; only its end record, which every rank writes at finish (issue 30)
    eq(os.listdir(os.path.join(run_dir, "metrics")), ["sdk-end-2.jsonl"],
       "metrics of RANK=2, LOCAL_RANK=0")


# ---- checkpoints
def test_checkpoint_save_keep_and_atomic():
    run_dir = tracked()
    tandem.init()
    ck = os.path.join(run_dir, "checkpoints")
    for s in (4, 8, 12):
        p = checkpoint.save({"w": [s]}, s)
        eq(p, os.path.join(ck, f"step-{s:012d}.pt"), "path")
    eq(sorted(os.listdir(ck)), ["step-000000000008.pt", "step-000000000012.pt"], "keep=2")
    with open(p, "rb") as f:
        eq(f.read(4), b"PK\x03\x04", "torch.save format with torch importable")
    checkpoint.save({"w": 0}, 13, keep=0)
    eq(len(os.listdir(ck)), 3, "keep=0 keeps all")
    raises(ValueError, checkpoint.save, {}, -1, match="integer >= 0")
    raises(ValueError, checkpoint.save, {}, 2.0, match="integer >= 0")
    # a save that fails half way leaves no file behind and the old ones whole
    class Boom:
        def __reduce__(self):
            raise RuntimeError("boom")
    raises(Exception, checkpoint.save, {"x": Boom()}, 14)
    eq(sorted(os.listdir(ck)), ["step-000000000008.pt", "step-000000000012.pt",
                                "step-000000000013.pt"], "after a failed save")
    # rank 1 writes nothing
    tandem._reset()
    os.environ["RANK"] = "1"
    tandem.init()
    eq(checkpoint.save({"w": 1}, 20), None, "rank 1 save")
    eq(len(os.listdir(ck)), 3, "rank 1 wrote a checkpoint")


def test_checkpoint_pickle_without_torch():
    run_dir = tracked()
    tandem.init()
    saved = checkpoint._torch
    checkpoint._torch = lambda: None
    try:
        p = checkpoint.save({"w": [1, 2]}, 3)
        with open(p, "rb") as f:
            assert f.read(4) != b"PK\x03\x04", "expected pickle"
        eq(checkpoint.load_latest(always=True), ({"w": [1, 2]}, 3), "pickle round trip")
    finally:
        checkpoint._torch = saved


def test_load_latest_only_when_resuming():
    run_dir = tracked()
    tandem.init()
    checkpoint.save({"w": 1}, 4)
    eq(checkpoint.load_latest(), (None, 0), "a fresh run does not load")
    tandem._reset()
    os.environ["TORCHELASTIC_RESTART_COUNT"] = "1"  # the launcher restarted the group
    tandem.init()
    eq(checkpoint.load_latest(), ({"w": 1}, 4), "a restart loads")


def test_resume_writes_the_resume_line_and_moves_the_step_back():
    run_dir = tracked()
    tandem.init()
    for s in range(1, 7):
        tandem.log({"loss": 1.0 / s}, step=s)
        if s % 4 == 0:
            checkpoint.save({"s": s}, s)
    tandem._reset()
    os.environ["TANDEM_RESUME"] = "1"
    tandem.init()
    state, step = checkpoint.load_latest()
    eq((state, step), ({"s": 4}, 4), "loaded")
    raises(ValueError, tandem.log, {"loss": 1.0}, step=4, match="resumed from")
    raises(ValueError, tandem.log, {"loss": 1.0}, step=3, match="below the last logged step 4")
    tandem.log({"loss": 0.2}, step=5)
    tandem.log({"other": 1.0})  # auto step continues: 6
    ls = lines(os.path.join(run_dir, "metrics", "rank-0.jsonl"))
    eq(untimed(ls[6]), {"event": "resume", "step": 4},
       "resume line, in order after the old points")
    eq([l["step"] for l in ls[7:]], [5, 6], "steps after the resume")


def test_resume_skips_a_corrupt_newest_checkpoint():
    run_dir = tracked(TANDEM_RESUME="1")
    tandem.init()
    checkpoint.save({"s": 4}, 4)
    checkpoint.save({"s": 8}, 8)
    with open(os.path.join(run_dir, "checkpoints", "step-000000000008.pt"), "r+b") as f:
        f.truncate(30)
    tandem._reset()
    tandem.init()
    eq(checkpoint.load_latest(), ({"s": 4}, 4), "fell back to the one before")
    ls = lines(os.path.join(run_dir, "metrics", "rank-0.jsonl"))
    eq(untimed(ls[-1]), {"event": "resume", "step": 4}, "resume line of the checkpoint loaded")


def test_resume_without_checkpoint_drops_every_point():
    run_dir = tracked()
    tandem.init()
    tandem.log({"loss": 1.0}, step=0)
    tandem.log({"loss": 1.0}, step=1)
    tandem._reset()
    os.environ["TANDEM_RESTART_COUNT"] = "1"
    tandem.init()
    eq(checkpoint.load_latest(), (None, 0), "nothing to load")
    tandem.log({"loss": 0.5}, step=0)  # starting over from 0 is allowed
    ls = lines(os.path.join(run_dir, "metrics", "rank-0.jsonl"))
    eq(untimed(ls[2]), {"event": "resume", "step": -1}, "a cut of every step")


# ---- stop
def test_should_stop_after_sigterm_and_chains():
    fresh()
    seen = []
    old = signal.signal(signal.SIGTERM, lambda s, f: seen.append(s))
    try:
        tandem._stop.installed = False
        tandem.init()
        eq(tandem.should_stop(), False, "before SIGTERM")
        os.kill(os.getpid(), signal.SIGTERM)
        eq(tandem.should_stop(), True, "after SIGTERM")
        eq(tandem.should_stop(sync=False), True, "sync=False")
        eq(seen, [signal.SIGTERM], "the previous handler ran too")
        eq(tandem.STOPPED, 143, "exit code of a checkpointed stop")
    finally:
        signal.signal(signal.SIGTERM, old)
        tandem._stop.installed = False


def test_sigterm_ends_a_script_that_never_asks():
    import subprocess
    import time
    d = fresh()
    code = ("import sys, time, tandem\n"
            "tandem.init()\n"
            "if sys.argv[1] == 'asks': tandem.should_stop()\n"
            "print('ready', flush=True)\n"
            "t = time.time()\n"
            "while time.time() - t < 10:\n"
            "    if sys.argv[1] == 'asks' and tandem.should_stop(): sys.exit(tandem.STOPPED)\n"
            "    time.sleep(0.01)\n")
    env = dict(os.environ, PYTHONPATH=os.path.join(SRC, "python"))
    for mode, want in (("never", -signal.SIGTERM), ("asks", 143)):
        p = subprocess.Popen([sys.executable, "-c", code, mode], cwd=d, env=env,
                             stdout=subprocess.PIPE, text=True)
        eq(p.stdout.readline(), "ready\n", mode)
        t0 = time.time()
        p.send_signal(signal.SIGTERM)
        eq(p.wait(timeout=10), want, f"exit of a script that {mode} should_stop()")
        assert time.time() - t0 < 5, f"{mode}: took {time.time() - t0:.1f} s"


# ---- sdk.json
def test_sdk_json_replaced_never_rewritten_in_place():
    run_dir = tracked()
    tandem.init(config={"lr": 0.1})
    path = os.path.join(run_dir, "sdk.json")
    before = os.stat(path).st_ino
    held = open(path, "rb")  # keeps the old inode alive, so a new one gets a new number
    tandem.summary["best"] = 1
    assert os.stat(path).st_ino != before, "sdk.json was rewritten in place (same inode)"
    eq(json.load(open(path))["summary"], {"best": 1}, "the update")
    held.close()
    old = open(path, "rb").read()
    # A full disk half way through the next write: the old bytes stay, no temporary is left.
    real_write = os.write

    def half_then_full(fd, data):
        if len(data) > 1:
            real_write(fd, bytes(data[:len(data) // 2]))
        raise OSError(28, "No space left on device")
    os.write = half_then_full
    try:
        raises(OSError, tandem.summary.__setitem__, "worse", 2, match="No space")
    finally:
        os.write = real_write
    eq(open(path, "rb").read(), old, "sdk.json after a write that failed half way")
    eq(sorted(n for n in os.listdir(run_dir) if ".tmp." in n), [], "temporary files left")


# ---- a process forked from the script
def test_forked_child_neither_logs_nor_finishes_the_run():
    import subprocess
    d = fresh()
    code = """if True:
    import multiprocessing, os, sys, tandem
    tandem.init(name="fork", dir="offline")
    tandem.log({"loss": 0.0}, step=0)
    tandem.log({"loss": 0.1}, step=1)
    pid = os.fork()
    if pid == 0:  # the child logs, records, and ends the normal way: atexit runs
        tandem.log({"loss": 9.0}, step=2)
        tandem.log({"loss": 9.0})
        tandem.summary["child"] = 1
        sys.exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, status
    print(open(os.path.join(tandem.run.dir, "offline.json")).read(), flush=True)
    print("---", flush=True)
    def worker():
        tandem.log({"loss": 8.0}, step=2)
        tandem.finish(exit_code=1)
    p = multiprocessing.get_context("fork").Process(target=worker)
    p.start()
    p.join()
    assert p.exitcode == 0, p.exitcode
    for s in range(2, 5):
        tandem.log({"loss": s / 10}, step=s)
    tandem.summary["parent"] = 1
    tandem.finish(exit_code=7)
"""
    env = dict(os.environ, PYTHONPATH=os.path.join(SRC, "python"))
    p = subprocess.run([sys.executable, "-c", code], cwd=d, env=env, capture_output=True,
                       text=True, timeout=120)
    eq(p.returncode, 0, f"the forking script: {p.stderr}")
    mid = json.loads(p.stdout.split("---")[0])
    eq((mid["status"], mid["exit_code"]), ("running", None),
       "offline.json after the forked child ended (the child finished the run)")
    run_dir, = [os.path.join(d, "offline", n) for n in os.listdir(os.path.join(d, "offline"))]
    got = [(l["step"], l["loss"]) for l in lines(os.path.join(run_dir, "metrics",
                                                               "rank-0.jsonl"))]
    eq(got, [(0, 0.0), (1, 0.1), (2, 0.2), (3, 0.3), (4, 0.4)], "each step once, the parent's")
    off = json.load(open(os.path.join(run_dir, "offline.json")))
    eq((off["status"], off["exit_code"]), ("finished", 7), "finished by the parent")
    eq(json.load(open(os.path.join(run_dir, "sdk.json")))["summary"], {"parent": 1}, "summary")


def test_a_killed_script_leaves_every_point_it_logged():
    # log() writes its line before it returns: a script ended right after its last log, by the
    # SIGKILL that follows a Slurm requeue or by os._exit (no atexit, no finish()), leaves every
    # point, its last step included, for the store.
    import subprocess
    d = fresh()
    code = """if True:
    import os, signal, sys, tandem
    tandem.init(name="killed", dir=sys.argv[1])
    for s in range(40):
        tandem.log({"loss": s / 10}, step=s)
    tandem.log({"acc": 0.5, "epoch": 3})
    if sys.argv[1] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(0)
"""
    env = dict(os.environ, PYTHONPATH=os.path.join(SRC, "python"))
    for how, rc in (("kill", -signal.SIGKILL), ("exit", 0)):
        p = subprocess.run([sys.executable, "-c", code, how], cwd=d, env=env,
                           capture_output=True, text=True, timeout=120)
        eq(p.returncode, rc, f"the script ({how}): {p.stderr}")
        run_dir, = [os.path.join(d, how, n) for n in os.listdir(os.path.join(d, how))]
        got = lines(os.path.join(run_dir, "metrics", "rank-0.jsonl"))
        eq([(l["step"], l["loss"]) for l in got[:-1]], [(s, s / 10) for s in range(40)],
           f"the points ({how})")
        eq({k: v for k, v in got[-1].items() if k != "time"},
           {"step": 40, "acc": 0.5, "epoch": 3}, f"the last line ({how})")


# ---- artifacts
def test_artifact_streams_a_file_larger_than_it_may_hold():
    import hashlib
    import tracemalloc
    run_dir = tracked()
    tandem.init()
    size = 96 << 20
    with open("big.ckpt", "wb") as f:  # sparse but for a few marks: fast to make and read
        for off in range(0, size, 7 << 20):
            f.seek(off)
            f.write(os.urandom(4096))
        f.truncate(size)
    tracemalloc.start()
    try:
        dest = tandem.artifact("big.ckpt")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"artifact() of a {size >> 20} MiB file held {peak >> 20} MiB"

    def sha(path):
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        return h.hexdigest()
    eq(os.path.getsize(dest), size, "size of the copy")
    eq(sha(dest), sha("big.ckpt"), "SHA-256 of the copy")


def test_artifact_copies_into_the_run():
    run_dir = tracked()
    tandem.init()
    os.makedirs("out/sub")
    with open("out/model.bin", "wb") as f:
        f.write(b"weights")
    os.chmod("out/model.bin", 0o755)
    with open("out/sub/a.txt", "w") as f:
        f.write("a")
    os.symlink("model.bin", "out/link")
    dest = tandem.artifact("out/model.bin")
    eq(dest, os.path.join(run_dir, "artifacts", "model.bin"), "dest")
    eq(open(dest, "rb").read(), b"weights", "content")
    eq(stat.S_IMODE(os.stat(dest).st_mode), 0o640, "mode: owner and group read/write only")
    tandem.artifact("out", name="../all")  # a directory, '..' named as the store names it
    arts = os.path.join(run_dir, "artifacts")
    eq(sorted(os.path.relpath(os.path.join(r, f), arts) for r, _, fs in os.walk(arts)
              for f in fs),
       ["__/all/model.bin", "__/all/sub/a.txt", "model.bin"], "files (no link, no temp file)")
    raises(ValueError, tandem.artifact, "out/link", match="symbolic link")
    raises(FileNotFoundError, tandem.artifact, "out/nope", match="does not exist")
    tandem._reset()
    os.environ["RANK"] = "1"
    tandem.init()
    eq(tandem.artifact("out/model.bin", name="r1.bin"), None, "rank 1")
    assert not os.path.exists(os.path.join(arts, "r1.bin")), "rank 1 copied an artifact"


def test_first_log_of_a_resuming_framework_drops_the_earlier_points():
    # tandem.lightning/tandem.hf restore the framework's own checkpoint: the first step the
    # restarted attempt logs is where the earlier attempt's points stop counting.
    run_dir = tracked(TANDEM_RESTART_COUNT="1")
    r = tandem.init()
    r.resume_at_first_log = True
    tandem.log({"loss": 0.5}, step=41)
    tandem.log({"loss": 0.4}, step=42)
    got = lines(os.path.join(run_dir, "metrics", "rank-0.jsonl"))
    eq(untimed(got[0]), {"event": "resume", "step": 40}, "the resume line before the first point")
    eq([l["step"] for l in got[1:]], [41, 42], "the points")
    # a fresh start (not resuming) writes no resume line
    run_dir = tracked()
    r = tandem.init()
    r.resume_at_first_log = True
    tandem.log({"loss": 0.5}, step=0)
    eq([l.get("event") for l in lines(os.path.join(run_dir, "metrics", "rank-0.jsonl"))],
       [None], "no resume line without a restart")


def test_log_new_skips_keys_already_logged_at_the_step():
    run_dir = tracked()
    r = tandem.init()
    r.log_new({"loss": 0.5, "epoch": 0}, 3)
    r.log_new({"val/acc": 0.9, "epoch": 0}, 3)   # epoch again at step 3: not written twice
    r.log_new({"epoch": 0}, 3)                    # nothing new: no line
    r.log_new({"loss": 0.4, "epoch": 0}, 4)
    got = [{k: v for k, v in l.items() if k != "time"}
           for l in lines(os.path.join(run_dir, "metrics", "rank-0.jsonl"))]
    eq(got, [{"step": 3, "loss": 0.5, "epoch": 0}, {"step": 3, "val/acc": 0.9},
             {"step": 4, "loss": 0.4, "epoch": 0}], "the lines")
    eq(tandem._run.flatten({"a": {"b": 1, "c": {"d": 2}}, "e": 3, "f": {}}),
       {"a/b": 1, "a/c/d": 2, "e": 3}, "flatten")


def test_a_requeued_slurm_job_continues_its_offline_run():
    fresh(SLURM_JOB_ID="4242")
    r1 = tandem.init()
    tandem.log({"loss": 1.0}, step=1)
    eq(os.path.basename(r1.dir), "slurm-4242", "the offline run is named by the job")
    eq(r1.resuming, False, "the first attempt")
    tandem._reset()
    os.environ["SLURM_RESTART_COUNT"] = "1"
    r2 = tandem.init()
    eq(r2.dir, r1.dir, "the requeued attempt's directory")
    eq(r2.resuming, True, "SLURM_RESTART_COUNT=1 is a restart")
    del os.environ["SLURM_RESTART_COUNT"], os.environ["SLURM_JOB_ID"]


def test_checkpoint_dir_follows_the_environment():
    run_dir = tracked()
    raises(tandem.TandemError, checkpoint.dir, match="before tandem.init()")
    tandem.init()
    eq(checkpoint.dir(), os.path.join(run_dir, "checkpoints"), "TANDEM_CHECKPOINT_DIR")


def test_wandb_shim_step_rules_and_bad_input():
    import warnings
    import tandem.wandb as wandb
    run_dir = tracked()
    raises(tandem.TandemError, wandb.log, {"a": 1}, match="before wandb.init()")
    run = wandb.init(project="p", config={"lr": 0.1}, name="n", tags=["x"])
    wandb.log({"a": 1})                       # step 0
    wandb.log({"b": 2}, commit=False)         # step 1, open
    wandb.log({"b": 3}, step=1)               # same step: last value wins
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        wandb.log({"a": 9}, step=0)           # below the current step: ignored, with a warning
        wandb.log({"img": wandb.Image(None), "c": 4}, step=2, commit=True)  # media: skipped
    assert any("less than the current step" in str(x.message) for x in w), [str(x.message) for x in w]
    assert any("'img'" in str(x.message) for x in w), [str(x.message) for x in w]
    raises(TypeError, wandb.log, [1, 2], match="expected a dict")
    raises(TypeError, wandb.log, {"a": 1}, step="3", match="step must be an integer")
    wandb.config.batch = 8
    run.summary["best"] = 1.5
    wandb.finish()
    raises(tandem.TandemError, run.log, {"a": 1}, match="after wandb.finish()")
    pts = [(l["step"], k, v) for l in lines(os.path.join(run_dir, "metrics", "rank-0.jsonl"))
           for k, v in l.items() if k not in ("step", "time")]
    eq(pts, [(0, "a", 1), (1, "b", 3), (2, "c", 4)], "the points")
    with open(os.path.join(run_dir, "sdk.json")) as f:
        sdk = json.load(f)
    eq((sdk["config"], sdk["summary"], sdk["name"], sdk["tags"]),
       ({"lr": 0.1, "batch": 8}, {"best": 1.5}, "n", ["x"]), "sdk.json")


def main():
    tests = [(n, f) for n, f in sorted(globals().items()) if n.startswith("test_")]
    failed = 0
    for name, fn in tests:
        try:
            fn()
            print(f"ok   {name}")
        except Exception:
            failed += 1
            print(f"FAIL {name}")
            traceback.print_exc()
        finally:
            tandem._reset()
    os.chdir("/")
    for d in DIRS:
        shutil.rmtree(d, ignore_errors=True)
    print(f"test_sdk_api: {len(tests) - failed}/{len(tests)} passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
