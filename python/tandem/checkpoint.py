"""tandem.checkpoint: save and resume through TANDEM_CHECKPOINT_DIR.

    tandem.checkpoint.save({"model": model.state_dict(), "opt": opt.state_dict()}, step)
    state, step = tandem.checkpoint.load_latest()     # (None, 0) when not resuming

Files are CHECKPOINT_DIR/step-<step, 12 digits>.pt, written by rank 0 through a temporary file
and a rename (a kill mid-save leaves the previous checkpoint whole), with torch.save when torch
is importable, else pickle. Loading one writes the resume line ({"event": "resume", "step": S})
to this rank's metrics file, so the store drops the points logged after S and no step is
stored twice (docs/runs.md, "Metrics").
"""
import os
import pickle
import re
import sys

from . import _run

_NAME = re.compile(r"^step-(\d+)\.pt$")
_ZIP_MAGIC = b"PK\x03\x04"  # torch.save's format (since torch 1.6)


def _current(what):
    import tandem
    if tandem.run is None:
        raise _run.TandemError(f"tandem.checkpoint.{what}() before tandem.init(): call "
                               f"tandem.init() first")
    return tandem.run


def _torch():
    if "torch" in sys.modules:
        return sys.modules["torch"]
    try:
        import torch
        return torch
    except ImportError:
        return None


def dir():
    """The run's checkpoint directory (TANDEM_CHECKPOINT_DIR, else RUN/checkpoints): where a
    framework's own checkpoints go too (Lightning's ModelCheckpoint through tandem.lightning's
    logger, the Trainer's output_dir, Accelerate's save_state)."""
    return _current("dir").checkpoint_dir


def path_for(step):
    """The file a checkpoint of `step` is saved to."""
    return os.path.join(_current("path_for").checkpoint_dir, f"step-{int(step):012d}.pt")


def list_checkpoints():
    """[(step, path)] of the run's checkpoints, newest first."""
    d = _current("list_checkpoints").checkpoint_dir
    try:
        names = os.listdir(d)
    except FileNotFoundError:
        return []
    found = []
    for n in names:
        m = _NAME.match(n)
        if m and os.path.isfile(os.path.join(d, n)) and not os.path.islink(os.path.join(d, n)):
            found.append((int(m.group(1)), os.path.join(d, n)))
    found.sort(reverse=True)
    return found


def save(state, step, keep=2, barrier=True):
    """Save `state` as the checkpoint of `step` (the number of steps done: a resume continues
    with step + 1). Rank 0 writes; every rank must call it (with torch.distributed initialized
    and barrier=True the ranks wait for the file to be complete). keep: how many of the newest
    checkpoints stay (0 or None: all). Returns the file's path on rank 0, else None."""
    run = _current("save")
    run._check_live("checkpoint.save")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"tandem.checkpoint.save: step must be an integer >= 0, got {step!r}")
    path = None
    if run.rank == 0:
        os.makedirs(run.checkpoint_dir, exist_ok=True)
        path = os.path.join(run.checkpoint_dir, f"step-{step:012d}.pt")
        payload = {"tandem_checkpoint": 1, "step": step, "state": state}
        tmp = os.path.join(run.checkpoint_dir, f".step-{step:012d}.pt.tmp.{os.getpid()}")
        torch = _torch()
        try:
            with open(tmp, "wb") as f:
                if torch is not None:
                    torch.save(payload, f)
                else:
                    pickle.dump(payload, f, protocol=pickle.HIGHEST_PROTOCOL)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        _run._fsync_dir(run.checkpoint_dir)
        if keep:
            for _, old in list_checkpoints()[int(keep):]:
                try:
                    os.unlink(old)
                except OSError:
                    pass
        run._write_sdk_json()
    if barrier:
        import tandem
        dist = tandem._distributed()
        if dist is not None:
            dist.barrier()
    return path


def _load(path, map_location):
    with open(path, "rb") as f:
        head = f.read(4)
        f.seek(0)
        if head == _ZIP_MAGIC:
            torch = _torch()
            if torch is None:
                raise _run.TandemError(f"{path} was written by torch.save; import torch to "
                                       f"load it")
            return torch.load(f, map_location=map_location)
        return pickle.load(f)


def load_latest(always=False, map_location=None):
    """(state, step) of the newest checkpoint that loads, when this process resumes a run
    (TANDEM_RESUME=1 from `tandem run --resume`, or a launcher restart after a worker died:
    TANDEM_RESTART_COUNT / TORCHELASTIC_RESTART_COUNT > 0), or always with always=True; else
    (None, 0). A newest file that cannot be read is skipped with a warning and the one before
    it is tried. Loading writes the resume line for this rank's metrics; resuming with no
    checkpoint at all writes one at step -1 (every point of the earlier attempts goes).
    Every rank calls it (each needs the state); map_location goes to torch.load."""
    run = _current("load_latest")
    run._check_live("checkpoint.load_latest")
    if not (always or run.resuming):
        return None, 0
    for step, path in list_checkpoints():
        try:
            payload = _load(path, map_location)
        except Exception as e:
            print(f"tandem: checkpoint {path} cannot be read ({type(e).__name__}: {e}); "
                  f"trying the one before it", file=sys.stderr, flush=True)
            continue
        if isinstance(payload, dict) and payload.get("tandem_checkpoint") == 1:
            state, step = payload.get("state"), int(payload.get("step", step))
        else:
            state = payload
        run.resumed_at(step)
        return state, step
    if run.resuming:
        run.resumed_at(-1)
        run._last_step = None
    return None, 0
