"""tandem: track a PyTorch script in a tandem run with no hand-written JSON.

    import tandem
    tandem.init(config={"lr": 0.05})
    state, start = tandem.checkpoint.load_latest()
    for step in range(start + 1, steps + 1):
        ...
        tandem.log({"loss": loss.item()}, step=step)
        if tandem.should_stop():           # a `tandem stop`, or a preemption: SIGTERM
            tandem.checkpoint.save({"model": model.state_dict()}, step)
            sys.exit(tandem.STOPPED)       # 143: the run is stopped/preempted, resumable

Inside a worker that `tandem run` started (TANDEM_RUN_DIR set) everything goes to that run;
elsewhere to an offline directory, ./tandem-offline/<id>, laid out like a run directory.
docs/python.md says what each call writes where.
"""
import atexit as _atexit
import os as _os

from . import _run
from ._run import SDK_VERSION as __version__, TandemError, Run
from . import checkpoint

__all__ = ["init", "log", "config", "summary", "should_stop", "artifact", "finish", "checkpoint",
           "run", "TandemError", "Run", "STOPPED", "binary"]

# The exit code of a worker that checkpointed after SIGTERM: `tandem launch` then exits 143 and
# the run is recorded as stopped (after `tandem stop`) or preempted, and can be resumed.
STOPPED = 143

run = None  # the current Run, after init()
config = _run._Record(None, "config")   # replaced by the run's own at init()
summary = _run._Record(None, "summary")
_stop = _run._StopFlag()


def init(config=None, name=None, tags=None, project=None, all_ranks=False, dir=None):
    """Join the tandem run this process was launched in, or start an offline one.

    config     dict of hyperparameters, recorded with the run (tandem.config)
    name, tags, project   recorded with the run (sdk.json: tags join the run's tags; name and
                          project name an offline run that `tandem import` takes in)
    all_ranks  log metrics from every rank (each to its own file); default: rank 0 only
    dir        where offline runs go (default $TANDEM_OFFLINE_DIR, else ./tandem-offline)

    Call it after torch.distributed.init_process_group(): it installs the SIGTERM handler
    behind should_stop(), and a SIGTERM while gloo connects would otherwise fail the connect.
    Calling it again returns the same run (a new config is merged into it).
    """
    global run
    if run is not None and not run.closed:
        if config:
            run.config.update(dict(config))
        return run
    if tags is not None and (isinstance(tags, str) or not hasattr(tags, "__iter__")):
        raise TypeError(f"tandem.init: tags is a list of strings, got {tags!r}")
    if config is not None and not hasattr(config, "keys"):
        # argparse.Namespace and friends
        config = vars(config) if hasattr(config, "__dict__") else config
        if not hasattr(config, "keys"):
            raise TypeError(f"tandem.init: config is a dict, got {type(config).__name__}")
    early = dict(globals()["config"])  # tandem.config set before init()
    if early:
        config = {**early, **dict(config or {})}
    r = Run(config=config, name=name, tags=tags, project=project, all_ranks=all_ranks, dir=dir)
    run = r
    globals()["config"] = r.config
    globals()["summary"] = r.summary
    _stop.install()
    if r.mode != "offline":
        _run.ask_for_sigterm_when_orphaned()
    return r


def _current(what):
    if run is None:
        raise TandemError(f"tandem.{what}() before tandem.init(): call tandem.init() first")
    return run


def log(data, step=None):
    """Log numbers at a step: tandem.log({"loss": 0.31, "acc": 0.9}, step=120).

    step: a non-negative integer that never decreases (one key once per step); default: the
    last step + 1 (0 at first). Values: int, float, one-element tensors/arrays; NaN and inf are
    written as null (JSON has none), which the store skips. Rank 0 only unless
    init(all_ranks=True); the other ranks check their input and return.
    """
    _current("log").log(data, step=step)


def should_stop(sync=True):
    """True once this process got SIGTERM (`tandem stop`, Ctrl-C on `tandem run`, a
    preemption). With torch.distributed initialized and sync=True this is a collective: every
    rank must call it at the same point (once per step), and all get True when any got the
    signal, so they stop after the same step."""
    _stop.polled = True
    flag = _stop.requested
    if not sync:
        return flag
    dist = _distributed()
    if dist is None:
        return flag
    import torch
    device = "cpu"
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() > 0)


def artifact(path, name=None):
    """Copy a file (or a directory's files) into the run's artifacts/, as NAME (default: its
    base name). Rank 0 only; returns the copy's path (None on other ranks). The store
    registers such copies at `tandem reindex` (docs/python.md, 'Artifacts')."""
    return _current("artifact").artifact(path, name=name)


def finish(exit_code=None):
    """Write the config and summary a last time and close the metrics file. Runs at
    interpreter exit too (not after os._exit)."""
    if run is not None:
        run.finish(exit_code)


def _distributed():
    import sys
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return None
    try:
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            return dist
    except Exception:
        return None
    return None


def binary():
    """The path of the tandem binary this SDK goes with, or None.

    TANDEM_BIN when set; else the one the pip wheel installed with this package: the portable
    wheel's (scripts/wheel.sh: auditwheel keeps the binary beside its libraries, in
    <site-packages>/tandem.scripts/, and puts in bin/ a Python script that execs it), or one in
    the scripts directory of this interpreter's environment (<venv>/bin/tandem, or ~/.local/bin
    after `pip install --user`), so a venv's SDK runs its own binary whatever PATH holds; else
    `tandem` on PATH (a checkout's build/ put there by hand)."""
    import shutil
    import sysconfig
    if _os.environ.get("TANDEM_BIN"):
        return _os.environ["TANDEM_BIN"]
    beside = _os.path.join(_os.path.dirname(_os.path.dirname(_os.path.abspath(__file__))),
                           "tandem.scripts", "tandem")
    if _os.path.isfile(beside) and _os.access(beside, _os.X_OK):
        return beside
    dirs = [sysconfig.get_path("scripts")]
    try:
        dirs.append(sysconfig.get_path("scripts", f"{_os.name}_user"))
    except KeyError:
        pass
    for d in dirs:
        shipped = _os.path.join(d, "tandem")
        if _os.path.isfile(shipped) and _os.access(shipped, _os.X_OK):
            return shipped
    return shutil.which("tandem")


@_atexit.register
def _at_exit():
    try:
        finish()
    except Exception:
        pass


def _reset():
    """Forget the current run (for tests)."""
    global run
    if run is not None:
        try:
            run.finish()
        except Exception:
            pass
    run = None
    globals()["config"] = _run._Record(None, "config")
    globals()["summary"] = _run._Record(None, "summary")
    _stop.requested = False
    _stop.polled = False
