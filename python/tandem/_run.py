"""The run a process logs to: where its files are, and the writers for them.

Everything here follows contracts the C side already reads (docs/runs.md, docs/launch.md):
metric lines go to TANDEM_METRICS exactly as `td_metrics_sink_log` writes them, checkpoints to
TANDEM_CHECKPOINT_DIR, artifacts into RUN/artifacts. Config, summary, name and tags go to
RUN/sdk.json (docs/python.md), which the store reads into the run's record (src/track/sdk.c,
docs/runs.md "What a script recorded").
"""
import errno
import json
import math
import numbers
import os
import signal
import sys
import time

SDK_VERSION = "0.1.0"
SDK_JSON_FORMAT = 1

# The metrics line schema (docs/metrics-format.md), written here only on the Python side, as
# src/track/sink.c writes it on the C side. Members a metric line gives a meaning of its own: a
# key named so is written as a one-point line {"key": K, "value": V, "step": S, "time": T}.
RESERVED_KEYS = ("step", "time", "rank", "key", "value", "event")
EVENT_KINDS = ("resume", "restart")


def metric_lines(step, values, now):
    """The lines of one log call: {"step": S, "time": T, k: v...} for the plain keys (a value
    None, a NaN or infinity, is null: no point), one line of its own for each reserved key."""
    plain = {"step": step, "time": now}
    lines = []
    for k, v in values.items():
        if k in RESERVED_KEYS:
            if v is not None:
                lines.append({"key": k, "value": v, "step": step, "time": now})
        else:
            plain[k] = v
    if len(plain) > 2 or not lines:
        lines.insert(0, plain)
    return "".join(json.dumps(l, allow_nan=False) + "\n" for l in lines).encode()


def event_line(kind, step, now):
    """{"event": "resume"|"restart", "step": S, "time": T}."""
    if kind not in EVENT_KINDS:
        raise ValueError(f"tandem: unknown metrics event {kind!r}; one of {EVENT_KINDS}")
    return (json.dumps({"event": kind, "step": int(step), "time": now}) + "\n").encode()

INT64_MAX = (1 << 63) - 1


# The process's end as a typed record for the supervisor (src/exec/sdkend.c, docs/runs.md "How
# the workers ended"): one JSON line per event appended to sdk-end-RANK.jsonl beside the rank's
# metrics file (so it travels over the node's link as metrics do): "finish" when the script
# finished its run (tandem.finish(), explicitly or at interpreter exit) and "killed" when a
# SIGTERM ended a script that never asks tandem.should_stop(). A worker that finished and does
# not exit is then reported as hanging at exit, and a stop's record says which ranks were killed.
SDK_END_RECORD = "tandem.sdk.end"
_live = None  # the Run of this process, for the SIGTERM handler's record


def _process_identity():
    """(boot id, start time in clock ticks) of this process: with the pid, what tells the
    supervisor on the same machine whether the process still lives (a pid can be reused)."""
    boot = start = None
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        with open("/proc/self/stat") as f:
            start = int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        pass
    return boot, start


class TandemError(RuntimeError):
    """A call the run cannot take (no run yet, a run that is not live, a finished run)."""


def _env_int(name, default=0):
    v = os.environ.get(name, "")
    try:
        return int(v) if v != "" else default
    except ValueError:
        raise TandemError(f"{name}={v!r} is not an integer; tandem launch sets it to one") from None


def _jsonable(v):
    """A config/summary value as JSON can hold it: non-finite floats and unknown objects as text
    (a torch.device, a Path), tensors and numpy scalars as numbers."""
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return v
    if isinstance(v, numbers.Integral):
        return int(v)
    if isinstance(v, numbers.Real):
        f = float(v)
        return f if math.isfinite(f) else repr(f)
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    item = getattr(v, "item", None)
    if callable(item):
        try:
            return _jsonable(item())
        except Exception:
            pass
    return str(v)


COPY_CHUNK = 1 << 20


def write_atomic(path, data, mode=0o644):
    """data (bytes, or a binary file object read to its end in COPY_CHUNK pieces, so a file of
    any size costs one chunk of memory) to path through a temporary file in the same directory,
    fsync and rename: a reader sees the old file or the new one, never a torn one. The temporary
    name, .NAME.tmp.PID, is what the store's artifact registration skips
    (src/track/artifacts.c)."""
    d, base = os.path.split(path)
    tmp = os.path.join(d, f".{base}.tmp.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    try:
        pieces = [data] if isinstance(data, (bytes, bytearray, memoryview)) else iter(
            lambda: data.read(COPY_CHUNK), b"")
        for piece in pieces:
            view = memoryview(piece)
            while view:
                n = os.write(fd, view)
                view = view[n:]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    os.close(fd)
    os.replace(tmp, path)
    _fsync_dir(d or ".")


def _fsync_dir(d):
    try:
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def flatten(d, prefix=""):
    """{"opt": {"lr": 1}} -> {"opt/lr": 1}: nested dicts as "/"-joined keys, as W&B and the
    Lightning loggers record them (an empty dict adds nothing)."""
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "/"))
        else:
            out[key] = v
    return out


class _Record(dict):
    """tandem.config / tandem.summary: a dict whose every change is written to sdk.json (by the
    ranks that log). Attribute access works too: config.lr."""

    def __init__(self, run, what):
        super().__init__()
        object.__setattr__(self, "_run", run)
        object.__setattr__(self, "_what", what)

    def _changed(self):
        run = object.__getattribute__(self, "_run")
        if run is not None:
            run._write_sdk_json()

    def __setitem__(self, k, v):
        super().__setitem__(str(k), _jsonable(v))
        self._changed()

    def __delitem__(self, k):
        super().__delitem__(k)
        self._changed()

    def update(self, *args, **kw):
        for k, v in dict(*args, **kw).items():
            super().__setitem__(str(k), _jsonable(v))
        self._changed()

    def setdefault(self, k, v=None):
        if k not in self:
            self[k] = v
        return self[k]

    def pop(self, *a):
        r = super().pop(*a)
        self._changed()
        return r

    def clear(self):
        super().clear()
        self._changed()

    def __getattr__(self, k):
        try:
            return self[k]
        except KeyError:
            raise AttributeError(k) from None

    def __setattr__(self, k, v):
        self[k] = v


class Run:
    """One process's view of a run. Made by tandem.init(); see docs/python.md."""

    def __init__(self, config=None, name=None, tags=None, project=None, all_ranks=False,
                 dir=None):
        self.rank = _env_int("RANK", 0)
        self.world_size = _env_int("WORLD_SIZE", 1)
        self.local_rank = _env_int("LOCAL_RANK", 0)
        # A restart of the same run: tandem's launcher or torchrun after a worker died, or a
        # Slurm job requeued (Lightning's auto-requeue, `scontrol requeue`) keeping its job id.
        self.restart_count = max(_env_int("TANDEM_RESTART_COUNT", 0),
                                 _env_int("TORCHELASTIC_RESTART_COUNT", 0),
                                 _env_int("SLURM_RESTART_COUNT", 0))
        self.resuming = os.environ.get("TANDEM_RESUME") == "1" or self.restart_count > 0
        # A framework's integration (tandem.lightning, tandem.hf) that restores the framework's
        # own checkpoints sets this: the first step a resuming attempt logs then says where the
        # earlier attempts' points stop counting (see log()).
        self.resume_at_first_log = False
        self.logs = bool(all_ranks) or self.rank == 0
        # The process that made the run. A child forked from it (os.fork, a multiprocessing
        # "fork" worker, a DataLoader worker) inherits this object but is not the run: it
        # writes nothing, and its exit (atexit included) does not finish the run. A pid check
        # rather than an at-fork hook, so a fork the hooks miss (C code) is caught too.
        self._pid = os.getpid()
        self.name = name
        self.tags = [str(t) for t in (tags or [])]
        self.project = project
        self.closed = False
        self._fd = None
        self._nospace = False
        self._last_step = None
        self._step_keys = set()  # keys logged at _last_step; None: the step is closed (resume)

        run_dir = os.environ.get("TANDEM_RUN_DIR") or None
        metrics = os.environ.get("TANDEM_METRICS") or None
        self.run_id = os.environ.get("TANDEM_RUN_ID") or None
        if run_dir is not None:
            # Launched by `tandem run`: the run's own directory.
            if not os.path.isdir(run_dir):
                raise TandemError(
                    f"TANDEM_RUN_DIR={run_dir} is not a directory: the run is not live (was it "
                    f"removed?); start the script with `tandem run`, or unset TANDEM_RUN_DIR to "
                    f"log offline")
            self.mode = "tracked"
            self.dir = run_dir
        else:
            # `tandem launch` without a run (or torchrun, or a bare python): an offline
            # directory laid out like a run directory, shared by the ranks of one launch.
            self.mode = "launched" if (self.run_id or metrics) else "offline"
            base = dir or os.environ.get("TANDEM_OFFLINE_DIR") or "tandem-offline"
            rid = self.run_id or os.environ.get("TORCHELASTIC_RUN_ID")
            if (not rid or rid == "none") and os.environ.get("SLURM_JOB_ID"):
                # a requeued Slurm job keeps its id: its next attempt continues this directory
                rid = "slurm-" + os.environ["SLURM_JOB_ID"]
                if os.environ.get("SLURM_ARRAY_TASK_ID"):
                    rid += "_" + os.environ["SLURM_ARRAY_TASK_ID"]
            if not rid or rid == "none":
                stem = name or os.path.splitext(os.path.basename(sys.argv[0] or "python"))[0]
                stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in stem) or "run"
                rid = f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
            self.run_id = self.run_id or rid
            self.dir = os.path.abspath(os.path.join(base, rid))
            os.makedirs(self.dir, exist_ok=True)
        self.metrics_path = metrics or os.path.join(self.dir, "metrics",
                                                    f"rank-{self.rank}.jsonl")
        self.checkpoint_dir = (os.environ.get("TANDEM_CHECKPOINT_DIR") or
                               os.path.join(self.dir, "checkpoints"))
        self.artifacts_dir = os.path.join(self.dir, "artifacts")
        self.sdk_json = os.path.join(self.dir, "sdk.json")

        self.end_path = os.path.join(os.path.dirname(self.metrics_path) or ".",
                                     f"sdk-end-{self.rank}.jsonl")
        global _live
        _live = self

        self.config = _Record(None, "config")
        self.summary = _Record(None, "summary")
        old = self._read_sdk_json() if self.logs else None
        if old:  # a resume (or a restart) of this run: keep what the earlier attempt recorded
            dict.update(self.config, old.get("config") or {})
            dict.update(self.summary, old.get("summary") or {})
            self.name = self.name or old.get("name")
            self.tags = self.tags or list(old.get("tags") or [])
            self.project = self.project or old.get("project")
        object.__setattr__(self.config, "_run", self)
        object.__setattr__(self.summary, "_run", self)
        if config:
            self.config.update(dict(config))
        else:
            self._write_sdk_json()
        if self.mode != "tracked" and self.logs and self.rank == 0:
            self._write_offline_json("running")

    def _forked(self):
        """True in a process forked from the one that made the run (see _pid)."""
        return os.getpid() != self._pid

    # ---- sdk.json: config, summary, name, tags (read by the store: src/track/sdk.c)
    def _read_sdk_json(self):
        try:
            with open(self.sdk_json) as f:
                d = json.load(f)
            return d if isinstance(d, dict) else None
        except (OSError, ValueError):
            return None

    def _write_sdk_json(self):
        if not self.logs or self.rank != 0 or self._forked():
            return  # rank 0 records the run's config and summary; the others' are the same
        doc = {
            "format": SDK_JSON_FORMAT,
            "sdk": f"tandem-python {SDK_VERSION}",
            "run_id": self.run_id,
            "name": self.name,
            "tags": self.tags,
            "project": self.project,
            "config": dict(self.config),
            "summary": dict(self.summary),
            "updated": time.time(),
        }
        write_atomic(self.sdk_json, (json.dumps(doc, indent=2, allow_nan=False) +
                                     "\n").encode())

    def _write_offline_json(self, status, exit_code=None):
        if self._forked():
            return
        doc = {
            "format": 1,
            "note": ("an offline run of the tandem Python SDK: not in any project's run store "
                     "(docs/python.md, 'Offline runs')"),
            "id": self.run_id,
            "status": status,
            "exit_code": exit_code,
            "created": getattr(self, "_created", None) or time.time(),
            "ended": time.time() if status != "running" else None,
            "command": [sys.executable] + sys.argv,
            "cwd": os.getcwd(),
            "world_size": self.world_size,
        }
        self._created = doc["created"]
        write_atomic(os.path.join(self.dir, "offline.json"),
                     (json.dumps(doc, indent=2) + "\n").encode())

    # ---- metrics
    def _check_live(self, what):
        if self.closed:
            raise TandemError(f"tandem.{what}() after tandem.finish(): the run {self.run_id} is "
                              f"finished; call tandem.init() for a new one")

    def _append(self, data):
        """One write(2) of whole lines in append mode: a reader never sees a torn line (the C
        sink's rule, src/track/sink.c). A full disk drops the points with one warning, as the C
        sink does, after cutting back a partial line."""
        if self._forked():
            return
        if self._fd is None:
            os.makedirs(os.path.dirname(self.metrics_path) or ".", exist_ok=True)
            self._fd = os.open(self.metrics_path,
                               os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        done = 0
        try:
            while done < len(data):
                done += os.write(self._fd, data[done:])
        except OSError as e:
            if done:
                try:  # a partial line would glue itself to the next one
                    end = os.lseek(self._fd, 0, os.SEEK_CUR)
                    if os.fstat(self._fd).st_size == end:
                        os.ftruncate(self._fd, end - done)
                except OSError:
                    pass
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            if not self._nospace:
                print(f"tandem: metrics points are being dropped: {self.metrics_path}: "
                      f"{e.strerror} (said once; each later point is tried again)",
                      file=sys.stderr, flush=True)
                self._nospace = True
            return
        if self._nospace:
            print(f"tandem: metrics are written to {self.metrics_path} again", file=sys.stderr,
                  flush=True)
            self._nospace = False

    @staticmethod
    def _number(key, v):
        if isinstance(v, bool):
            raise TypeError(f"tandem.log: {key!r} is a bool ({v}); log numbers only "
                            f"(int(x) if you mean 0/1)")
        if not isinstance(v, numbers.Number):
            numel = getattr(v, "numel", None) or getattr(v, "size", None)
            item = getattr(v, "item", None)
            if callable(item):
                try:
                    n = numel() if callable(numel) else numel
                except Exception:
                    n = None
                if n not in (None, 1):
                    raise TypeError(f"tandem.log: {key!r} has {n} elements; log one number per "
                                    f"key (a mean, a norm, or one key per element)")
                v = item()
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            shown = repr(v)
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            raise TypeError(f"tandem.log: {key!r} is {type(v).__name__} ({shown}); only numbers "
                            f"are logged (int, float, a one-element tensor or array)")
        if isinstance(v, numbers.Integral) and -INT64_MAX <= int(v) <= INT64_MAX:
            return int(v)
        f = float(v)
        # JSON has no NaN: the C sink writes null, which the ingest skips (docs/runs.md)
        return f if math.isfinite(f) else None

    @staticmethod
    def _step(step):
        if isinstance(step, bool) or not isinstance(step, numbers.Real):
            raise TypeError(f"tandem.log: step must be an integer, got {type(step).__name__} "
                            f"({step!r})")
        if isinstance(step, numbers.Integral):
            s = int(step)
        else:
            f = float(step)
            if not math.isfinite(f) or f != math.floor(f):
                raise ValueError(f"tandem.log: step must be an integer, got {step!r}")
            s = int(f)
        if s < 0 or s > 9 * 10**15:
            raise ValueError(f"tandem.log: step {s} is out of range (0 .. 9e15)")
        return s

    def log(self, data, step=None):
        self._check_live("log")
        if not isinstance(data, dict):
            raise TypeError(f"tandem.log: expected a dict of numbers, got {type(data).__name__}")
        s = self._next_step() if step is None else self._step(step)
        if self.resume_at_first_log and self.resuming and self._last_step is None:
            # The framework restored its checkpoint and goes on from there: its first step is
            # the one after the checkpoint's (or 0 with none), so the earlier attempts' points
            # from this step on are dropped, as a checkpoint.load_latest() would have said.
            self.resumed_at(s - 1)
        values = {}
        for k, v in data.items():
            if not isinstance(k, str) or not k:
                raise TypeError(f"tandem.log: metric names are non-empty strings, got {k!r}")
            try:
                k.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError(f"tandem.log: metric name {k!r} is not valid Unicode text")
            values[k] = self._number(k, v)
        if self._last_step is not None:
            if s < self._last_step:
                raise ValueError(
                    f"tandem.log: step {s} is below the last logged step {self._last_step}: "
                    f"steps must not decrease (after a resume, "
                    f"tandem.checkpoint.load_latest() moves back to the checkpoint's step)")
            if s == self._last_step:
                if self._step_keys is None:
                    raise ValueError(
                        f"tandem.log: step {s} is the step of the checkpoint this run resumed "
                        f"from, already stored; log the steps after it")
                again = sorted(set(values) & self._step_keys)
                if again:
                    raise ValueError(f"tandem.log: {', '.join(map(repr, again))} already "
                                     f"logged at step {s}; the store would hold it twice")
        if not self.logs or self._forked():
            self._advance(s, values)
            return
        self._append(metric_lines(s, values, time.time()))
        self._advance(s, values)

    def log_new(self, data, step):
        """log() of the keys of data not logged at `step` yet (all of them at a later step): for
        the frameworks, which log some keys again at the same step (Lightning adds "epoch" to
        every call; the Trainer's last evaluation repeats its eval_* values)."""
        if step == self._last_step and self._step_keys is None:
            # The step of the checkpoint this attempt resumed from: the earlier attempt stored
            # it. A framework that resumed at its last step logs its end-of-training values
            # there (the HF Trainer's train_runtime, train_loss): they are not stored twice and
            # do not fail a run that has finished training; the integration keeps them for the
            # summary (W&B's summary holds a run's final values the same way).
            return
        if step == self._last_step and self._step_keys:
            data = {k: v for k, v in data.items() if k not in self._step_keys}
            if not data:
                return
        self.log(data, step=step)

    def _advance(self, s, values):
        if s != self._last_step:
            self._last_step = s
            self._step_keys = set()
        self._step_keys.update(values)

    def _next_step(self):
        return 0 if self._last_step is None else self._last_step + 1

    def resumed_at(self, step):
        """A checkpoint of step `step` was loaded: the steps after it will be logged again. The
        resume line makes the store drop this rank's points past it (docs/runs.md)."""
        if self.logs:
            self._append(event_line("resume", step, time.time()))
        self._last_step = int(step)
        self._step_keys = None

    # ---- artifacts
    def artifact(self, path, name=None):
        self._check_live("artifact")
        if not self.logs or self.rank != 0 or self._forked():
            return None
        if os.path.islink(path):
            raise ValueError(f"tandem.artifact: {path} is a symbolic link; the store never "
                             f"follows links: pass the file it points to")
        if not os.path.exists(path):
            raise FileNotFoundError(f"tandem.artifact: {path} does not exist")
        name = name or os.path.basename(os.path.normpath(path))
        if os.path.isabs(name):
            name = name.lstrip("/")
        parts = ["__" if p == ".." else p for p in name.split("/") if p not in ("", ".")]
        if not parts:
            raise ValueError(f"tandem.artifact: {name!r} is no artifact name")
        name = "/".join(parts)
        dest = os.path.join(self.artifacts_dir, name)
        if os.path.isdir(path):
            for root, dirs, files in os.walk(path):
                dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(root, d))]
                for f in files:
                    src = os.path.join(root, f)
                    if os.path.islink(src) or not os.path.isfile(src):
                        continue
                    rel = os.path.relpath(src, path)
                    self._copy(src, os.path.join(dest, rel))
        elif os.path.isfile(path):
            self._copy(path, dest)
        else:
            raise ValueError(f"tandem.artifact: {path} is not a regular file or directory")
        return dest

    @staticmethod
    def _copy(src, dest):
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        with open(src, "rb") as f:
            # streamed: a checkpoint larger than memory is copied too. The store's copies keep
            # read/write bits for owner and group only (docs/runs.md)
            write_atomic(dest, f, mode=os.fstat(f.fileno()).st_mode & 0o660 or 0o600)

    def write_end_record(self, event, **fields):
        """One line of this rank's end record (see SDK_END_RECORD), every rank; never raises."""
        if self._forked():
            return
        boot, start = _process_identity()
        doc = {"record": SDK_END_RECORD, "version": 1, "event": event, "rank": self.rank,
               "world_size": self.world_size, "restart": self.restart_count,
               "time": time.time(), "pid": os.getpid(), "boot_id": boot, "start_ticks": start}
        doc.update(fields)
        try:
            os.makedirs(os.path.dirname(self.end_path) or ".", exist_ok=True)
            fd = os.open(self.end_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC,
                         0o644)
            try:
                os.write(fd, (json.dumps(doc) + "\n").encode())
            finally:
                os.close(fd)
        except OSError:
            pass

    def finish(self, exit_code=None):
        if self.closed:
            return
        if self._forked():
            # a forked child's end (its atexit, a finish() of its own) is not the run's
            self.closed = True
            return
        try:
            if self.mode == "tracked":
                self.write_end_record("finish", exit_code=exit_code,
                                      stop_requested=_stop_requested())
            self._write_sdk_json()
            if self.mode != "tracked" and self.logs and self.rank == 0:
                self._write_offline_json("finished", exit_code)
        finally:
            self.closed = True
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


# ---- stop requests
class _StopFlag:
    def __init__(self):
        self.requested = False
        self.installed = False
        self.polled = False  # should_stop() was called: the script handles stops
        self.previous = None

    def handler(self, signum, frame):
        self.requested = True
        prev = self.previous
        if callable(prev) and prev not in (signal.SIG_DFL, signal.SIG_IGN):
            prev(signum, frame)
        elif prev in (signal.SIG_DFL, None) and not self.polled:
            # A script that never asks should_stop() would not notice: end it as SIGTERM
            # would have without the SDK (the launcher sees a worker killed by SIGTERM). Said
            # first as a typed record: through the shell in front of the script the kill looks
            # like an exit with 143, which is a checkpoint's code.
            run = _live
            if run is not None and run.mode == "tracked" and not run._forked():
                run.write_end_record("killed", signal=int(signal.SIGTERM),
                                     finished=run.closed)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    def install(self):
        if self.installed:
            return
        try:
            self.previous = signal.signal(signal.SIGTERM, self.handler)
            self.installed = True
        except ValueError:  # not the main thread
            print("tandem: init() outside the main thread: SIGTERM is not watched, "
                  "tandem.should_stop() stays False", file=sys.stderr, flush=True)


def _stop_requested():
    mod = sys.modules.get("tandem")
    flag = getattr(mod, "_stop", None)
    return bool(flag and flag.requested)


def ask_for_sigterm_when_orphaned():
    """`tandem run` starts the command through /bin/sh; a Python script behind it would outlive
    a launcher killed by -9 (docs/launch.md, "Signals"). Ask for SIGTERM when the parent dies,
    as `tandem train` does, so the script checkpoints and stops."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except Exception:
        pass
