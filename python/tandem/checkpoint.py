"""tandem.checkpoint: save and resume through TANDEM_CHECKPOINT_DIR.

    tandem.checkpoint.save({"model": model.state_dict(), "opt": opt.state_dict()}, step)
    state, step = tandem.checkpoint.load_latest()     # (None, 0) when not resuming

Files are CHECKPOINT_DIR/step-<step, 12 digits>.pt, written by rank 0 through a temporary file
and a rename (a kill mid-save leaves the previous checkpoint whole), with torch.save when torch
is importable, else pickle. Loading one writes the resume line ({"event": "resume", "step": S})
to this rank's metrics file, so the store drops the points logged after S and no step is
stored twice (docs/runs.md, "Metrics").

Every rank resumes from the same checkpoint: TANDEM_RESUME_STEP when set (the step the user
names), else the newest one rank 0 can read; with torch.distributed initialized rank 0 decides
and tells the others, and a rank whose own directory lacks that file (another host, no shared
disk) gets its bytes from rank 0.

The names and the commit rule are the checkpoint contract of include/tandem/ckpt.h, mirrored
here (parse_name, build_name, is_committed, committed); tests/core/ckpt_names.txt holds the
vectors both the C and this side are tested against.
"""
import os
import pickle
import re
import sys

from . import _run

# ---- the checkpoint contract (include/tandem/ckpt.h; vectors: tests/core/ckpt_names.txt) ----
TDCK, SDK, LIGHTNING, HF = "tdck", "sdk", "lightning", "hf"
MARKER = ".tandem-committed"        # tandem's commit marker of a directory checkpoint
HF_MARKER = "trainer_state.json"     # the HF Trainer writes it last into checkpoint-STEP/
_FRAMED = ((TDCK, re.compile(r"^ckpt-([0-9]{1,18})\.tdck$")),
           (SDK, re.compile(r"^step-([0-9]{1,18})\.pt$")),
           (HF, re.compile(r"^checkpoint-([0-9]{1,18})$")))
_LIGHTNING_STEP = re.compile(r"step=([0-9]*)")


def parse_name(name):
    """(kind, step) of a checkpoint directory entry's name (step -1: none in the name, as
    Lightning's last.ckpt), or None when it is no checkpoint's name."""
    if not name or name[0] == "." or "/" in name:
        return None
    for kind, rx in _FRAMED:
        m = rx.match(name)
        if m:
            return kind, int(m.group(1))
    if len(name) > 5 and name.endswith(".ckpt"):
        steps = _LIGHTNING_STEP.findall(name[:-5])
        if steps and 1 <= len(steps[-1]) <= 18:
            return LIGHTNING, int(steps[-1])
        return LIGHTNING, -1
    return None


def build_name(kind, step):
    """The name of kind's checkpoint of step (the SDK's: step-<12 digits>.pt)."""
    step = int(step)
    if step < 0 or step > 999999999999999999:
        raise ValueError(f"checkpoint step {step} is out of range")
    if kind == TDCK:
        return f"ckpt-{step}.tdck"
    if kind == SDK:
        return f"step-{step:012d}.pt"
    if kind == HF:
        return f"checkpoint-{step}"
    raise ValueError(f"tandem names no checkpoint of kind {kind!r}")


def _regular(p):
    return os.path.isfile(p) and not os.path.islink(p)


def is_committed(directory, name):
    """Whether directory/name is a committed checkpoint: a file kind renamed into place (a
    regular file), a directory kind holding its commit marker (MARKER or HF_MARKER)."""
    parsed = parse_name(name)
    if parsed is None:
        return False
    p = os.path.join(directory, name)
    if parsed[0] != HF:
        return _regular(p)
    return (os.path.isdir(p) and not os.path.islink(p) and
            (_regular(os.path.join(p, MARKER)) or _regular(os.path.join(p, HF_MARKER))))


def committed(directory, kinds=None):
    """[(step, kind, name)] of the committed checkpoints in directory, newest step first (those
    without a step last, by name); kinds: an iterable of kinds to keep (None: all)."""
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    out = []
    for n in names:
        parsed = parse_name(n)
        if parsed and (kinds is None or parsed[0] in kinds) and is_committed(directory, n):
            out.append((parsed[1], parsed[0], n))
    out.sort(key=lambda e: (-e[0], e[2]))
    return out


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
    return os.path.join(_current("path_for").checkpoint_dir, build_name(SDK, step))


def list_checkpoints():
    """[(step, path)] of the run's checkpoints, newest first."""
    d = _current("list_checkpoints").checkpoint_dir
    return [(step, os.path.join(d, n)) for step, _, n in committed(d, (SDK,))]


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
        name = build_name(SDK, step)
        path = os.path.join(run.checkpoint_dir, name)
        payload = {"tandem_checkpoint": 1, "step": step, "state": state}
        tmp = os.path.join(run.checkpoint_dir, f".{name}.tmp.{os.getpid()}")
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


def _load(path, map_location, data=None):
    """The payload of the checkpoint at path (or of its bytes, data)."""
    import io
    with (io.BytesIO(data) if data is not None else open(path, "rb")) as f:
        head = f.read(4)
        f.seek(0)
        if head == _ZIP_MAGIC:
            torch = _torch()
            if torch is None:
                raise _run.TandemError(f"{path} was written by torch.save; import torch to "
                                       f"load it")
            return torch.load(f, map_location=map_location)
        return pickle.load(f)


def resume_step():
    """TANDEM_RESUME_STEP: the step every rank resumes from (None: not set). On a resume
    `tandem launch` sets it on every worker to node 0's newest committed checkpoint (or the step
    the user named), so ranks that read their own directories still resume from one step."""
    return _named_step()


def find_step(directory, kind, step):
    """The path of the committed checkpoint of kind and step in directory, else None (of several
    of that step, as Lightning's names may be, the first by name)."""
    for s, _, name in sorted(committed(directory, (kind,)), key=lambda e: e[2]):
        if s == step:
            return os.path.join(directory, name)
    return None


def _named_step():
    """TANDEM_RESUME_STEP: the step every rank resumes from (None: the newest)."""
    v = os.environ.get("TANDEM_RESUME_STEP", "").strip()
    if not v:
        return None
    if not v.isdigit():
        raise _run.TandemError(f"TANDEM_RESUME_STEP={v!r}: expected the step of a checkpoint, "
                               f"an integer >= 0 (unset it to resume from the newest)")
    return int(v)


def _pick(run, named, map_location):
    """(step, payload) this process would resume from on its own: the named step, else the
    newest checkpoint that loads; (None, None) when none. Raises when the named one is
    missing or unreadable."""
    if named is not None:
        path = os.path.join(run.checkpoint_dir, build_name(SDK, named))
        if not is_committed(run.checkpoint_dir, build_name(SDK, named)):
            have = [s for s, _ in list_checkpoints()]
            raise _run.TandemError(f"TANDEM_RESUME_STEP={named}: no checkpoint {path} (this "
                                   f"directory holds steps {have or 'none'})")
        return named, _load(path, map_location)
    for step, path in list_checkpoints():
        try:
            return step, _load(path, map_location)
        except Exception as e:
            print(f"tandem: checkpoint {path} cannot be read ({type(e).__name__}: {e}); "
                  f"trying the one before it", file=sys.stderr, flush=True)
    return None, None


def load_latest(always=False, map_location=None):
    """(state, step) of the checkpoint this run resumes from, when this process resumes a run
    (TANDEM_RESUME=1 from `tandem run --resume`, or a launcher restart after a worker died:
    TANDEM_RESTART_COUNT / TORCHELASTIC_RESTART_COUNT > 0), or always with always=True; else
    (None, 0). Which one: TANDEM_RESUME_STEP when set, else the newest that loads (a newest
    file that cannot be read is skipped with a warning and the one before it is tried).
    With torch.distributed initialized, rank 0 picks it and every rank resumes from that same
    step: a rank whose directory lacks the file (another host without a shared disk) gets its
    bytes from rank 0. Loading writes the resume line for this rank's metrics; resuming with
    no checkpoint at all writes one at step -1 (every point of the earlier attempts goes).
    Every rank calls it (each needs the state); map_location goes to torch.load."""
    run = _current("load_latest")
    run._check_live("checkpoint.load_latest")
    if not (always or run.resuming):
        return None, 0
    import tandem
    named = _named_step()
    dist = tandem._distributed()
    if dist is None:
        step, payload = _pick(run, named, map_location)
    else:
        step, payload, decision = None, None, [None]
        if dist.get_rank() == 0:
            try:
                step, payload = _pick(run, named, map_location)
                decision = [step]
            except Exception as e:
                decision = [f"rank 0: {e}"]
        dist.broadcast_object_list(decision, src=0)
        if isinstance(decision[0], str):
            raise _run.TandemError(f"tandem.checkpoint.load_latest: {decision[0]}")
        step = decision[0]
        have = True
        if step is not None and dist.get_rank() != 0:
            name = build_name(SDK, step)
            have = is_committed(run.checkpoint_dir, name)
            if have:
                try:
                    payload = _load(os.path.join(run.checkpoint_dir, name), map_location)
                except Exception:
                    have = False
        haves = [None] * dist.get_world_size()
        dist.all_gather_object(haves, have)
        if step is not None and not all(haves):
            data = [None]
            if dist.get_rank() == 0:
                with open(os.path.join(run.checkpoint_dir, build_name(SDK, step)), "rb") as f:
                    data = [f.read()]
            dist.broadcast_object_list(data, src=0)
            if not have:
                print(f"tandem: resuming from rank 0's checkpoint of step {step} (not in "
                      f"{run.checkpoint_dir} on this host)", file=sys.stderr, flush=True)
                payload = _load(build_name(SDK, step), map_location, data[0])
    if step is not None:
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
