"""tandem.wandb: a script written for W&B logs to tandem by changing one import.

    import tandem.wandb as wandb          # was: import wandb
    wandb.init(project="p", config={"lr": 0.1}, name="baseline", tags=["ddp"])
    wandb.log({"loss": loss})             # W&B's step rules, below
    wandb.summary["best_acc"] = acc
    wandb.finish()

What is kept from W&B, with its semantics (checked against wandb itself in offline mode by
tests/python/test_integrations.py):
- the step: log(d) writes d at the current step and moves to the next; log(d, commit=False)
  adds d to the current step without moving; log(d, step=N) adds d to step N (N above the
  current step first closes the current one; N below it is ignored with W&B's warning);
  commit=True closes the step. Within one step a key logged twice keeps its last value.
- nested dicts are flattened with "/" ({"train": {"loss": x}} -> "train/loss").
- wandb.config (dict and attributes, update(), allow_val_change), wandb.summary,
  wandb.run (.id, .name, .dir, .config, .summary, .log, .finish; a context manager),
  define_metric, watch (accepted), save / log_artifact / Artifact.add_file (copied into the
  run's artifacts), login, finish(exit_code).
What is not: media (Image, Table, Histogram, ...) are numbers-only in tandem: such a value is
skipped with one warning naming its key; watch() records no gradients (a warning says so).
"""
import numbers
import os
import warnings

import tandem
from tandem._run import flatten

__all__ = ["init", "log", "finish", "config", "summary", "run", "define_metric", "watch",
           "save", "log_artifact", "Artifact", "login", "Settings", "Image", "Table",
           "Histogram"]

run = None
config = tandem.config
summary = tandem.summary
_warned = set()


def _warn_once(what, msg):
    if what not in _warned:
        _warned.add(what)
        warnings.warn(msg, stacklevel=3)


class Run:
    """What wandb.init() returns: the W&B run's surface over a tandem.Run."""

    def __init__(self, trun):
        self._t = trun
        self._step = 0          # W&B's current step
        self._pending = {}      # the current step's values, written when the step closes
        self.finished = False

    # identity
    @property
    def id(self):
        return self._t.run_id

    @property
    def name(self):
        return self._t.name or self._t.run_id

    @property
    def project(self):
        return self._t.project or ""

    @property
    def dir(self):
        return self._t.dir

    @property
    def config(self):
        return self._t.config

    @property
    def summary(self):
        return self._t.summary

    @property
    def step(self):
        return self._step

    # the step rules of wandb.log
    def log(self, data, step=None, commit=None, sync=None):
        if self.finished:
            raise tandem.TandemError("wandb.log() after wandb.finish(): call wandb.init() "
                                     "for a new run")
        if not isinstance(data, dict):
            raise TypeError(f"wandb.log: expected a dict, got {type(data).__name__}")
        if step is not None:
            if isinstance(step, bool) or not isinstance(step, numbers.Integral):
                raise TypeError(f"wandb.log: step must be an integer, got {step!r}")
            step = int(step)
            if step < self._step:
                warnings.warn(f"Tried to log to step {step} that is less than the current "
                              f"step {self._step}. Steps must be monotonically increasing, "
                              f"so this data will be ignored.", stacklevel=2)
                return
            if step > self._step:
                self._flush()
                self._step = step
            if commit is None:
                commit = False
        elif commit is None:
            commit = True
        self._pending.update(flatten(data))
        if commit:
            self._flush()
            self._step += 1

    def _flush(self):
        if not self._pending:
            return
        values = {}
        for k, v in self._pending.items():
            n = _number(v)
            if n is None:
                _warn_once(k, f"tandem.wandb: {k!r} is a {type(v).__name__}, not a number: "
                              f"tandem records numbers only, it is skipped")
                continue
            values[k] = n
        self._pending = {}
        if values:
            self._t.log(values, step=self._step)

    def finish(self, exit_code=None, quiet=None):
        if self.finished:
            return
        self._flush()
        self.finished = True
        self._t.finish(exit_code)

    def define_metric(self, *args, **kwargs):
        return None  # tandem's page charts every key against its step already

    def watch(self, *args, **kwargs):
        _warn_once("watch", "tandem.wandb: watch() records no gradients or parameters in "
                            "tandem (log the norms you want with wandb.log)")

    def save(self, glob_str, base_path=None, policy="live"):
        import glob
        paths = glob.glob(glob_str) if any(c in glob_str for c in "*?[") else [glob_str]
        return [self._t.artifact(p) for p in paths]

    def log_artifact(self, artifact, name=None, type=None, aliases=None):
        if isinstance(artifact, Artifact):
            for path, as_name in artifact._files:
                self._t.artifact(path, name=f"{artifact.name}/{as_name}")
            return artifact
        return self._t.artifact(str(artifact), name=name)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.finish(exit_code=1 if exc_type else 0)
        return False


def _number(v):
    """A loggable number, or None for what tandem does not record (media, text)."""
    if isinstance(v, bool):
        return int(v)  # W&B charts booleans as 0/1
    if isinstance(v, numbers.Real):
        return v
    item = getattr(v, "item", None)
    size = getattr(v, "numel", None) or getattr(v, "size", None)
    if callable(item):
        n = size() if callable(size) else size
        if n in (None, 1):
            x = item()
            return x if isinstance(x, numbers.Real) and not isinstance(x, bool) else None
    return None


def init(project=None, entity=None, config=None, name=None, tags=None, notes=None, group=None,
         job_type=None, dir=None, mode=None, resume=None, id=None, reinit=None, settings=None,
         **kwargs):
    """Start (or join) the tandem run; W&B's arguments that tandem has no use for are
    accepted and ignored (entity, job_type, mode, resume, settings: there is no server)."""
    global run
    if run is not None and not run.finished and not reinit:
        if config:
            run.config.update(_config_dict(config))
        _name_and_project(run._t, name, project)
        return run
    t = tandem.init(config=_config_dict(config), name=name, tags=tags, project=project,
                    dir=dir)
    # tandem.init returns the run already made (by a framework's logger, or a tandem.init of
    # the script's own) as it is: this init's name and project must still be recorded.
    _name_and_project(t, name, project)
    if notes:
        t.summary.setdefault("notes", notes)
    if group:
        t.summary.setdefault("group", group)
    run = Run(t)
    globals()["config"] = t.config
    globals()["summary"] = t.summary
    return run


def _name_and_project(trun, name, project):
    """Records W&B's name= and project= as tandem.init(name=, project=) does: in the run's
    sdk.json (docs/python.md), which `tandem import` names an offline run after."""
    changed = False
    if name is not None and trun.name != str(name):
        trun.name, changed = str(name), True
    if project is not None and trun.project != str(project):
        trun.project, changed = str(project), True
    if changed:
        trun._write_sdk_json()


def _config_dict(config):
    if config is None:
        return None
    if hasattr(config, "keys"):
        return dict(config)
    if hasattr(config, "__dict__"):  # argparse.Namespace
        return vars(config)
    raise TypeError(f"wandb.init: config is a dict or an argparse.Namespace, got "
                    f"{type(config).__name__}")


def _current(what):
    if run is None:
        raise tandem.TandemError(f"wandb.{what}() before wandb.init(): call wandb.init() "
                                 f"first")
    return run


def log(data, step=None, commit=None, sync=None):
    _current("log").log(data, step=step, commit=commit)


def finish(exit_code=None, quiet=None):
    if run is not None:
        run.finish(exit_code)


def define_metric(*args, **kwargs):
    return None


def watch(*args, **kwargs):
    _current("watch").watch()


def save(glob_str, base_path=None, policy="live"):
    return _current("save").save(glob_str, base_path, policy)


def log_artifact(artifact, name=None, type=None, aliases=None):
    return _current("log_artifact").log_artifact(artifact, name=name, type=type)


def login(*args, **kwargs):
    return True  # nothing to log in to: runs go to the project's store


class Artifact:
    """wandb.Artifact(name, type): its files are copied into the run's artifacts/NAME/."""

    def __init__(self, name, type=None, description=None, metadata=None):
        self.name, self.type, self.description = name, type, description
        self.metadata = dict(metadata or {})
        self._files = []

    def add_file(self, local_path, name=None):
        if not os.path.isfile(local_path):
            raise FileNotFoundError(f"wandb.Artifact.add_file: {local_path} is not a file")
        self._files.append((local_path, name or os.path.basename(local_path)))

    def add_dir(self, local_path, name=None):
        for root, _, files in os.walk(local_path):
            for f in files:
                p = os.path.join(root, f)
                rel = os.path.relpath(p, local_path)
                self._files.append((p, os.path.join(name, rel) if name else rel))


class Settings(dict):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)


class _Media:
    """wandb.Image, Table, Histogram, ...: accepted so a script runs; not recorded."""

    def __init__(self, *args, **kwargs):
        pass


class Image(_Media):
    pass


class Table(_Media):
    pass


class Histogram(_Media):
    pass
