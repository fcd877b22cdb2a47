"""tandem.lightning: a Lightning logger that records a run in tandem.

    from tandem.lightning import TandemLogger
    trainer = L.Trainer(logger=TandemLogger(), max_steps=...,
                        callbacks=[ModelCheckpoint(save_last=True, every_n_train_steps=50)])
    trainer.fit(model, datamodule, ckpt_path=tandem.lightning.ckpt_path())

- Metrics (self.log in the LightningModule) go to the run's metrics at Lightning's step;
  hyperparameters (save_hyperparameters, and config= here) to tandem.config; the last value of
  each metric to tandem.summary at the end, and ModelCheckpoint's best score and path.
- ModelCheckpoint without a dirpath writes into the run's checkpoint directory (the logger's
  save_dir is chosen so that Lightning's "<save_dir>/<name>/<version>/checkpoints" is it), so
  ckpt_path="last" finds the newest one after `tandem run` restarts a worker or `--resume`.
- ckpt_path(): on a resume with TANDEM_RESUME_STEP set (tandem launch sets it on every
  worker: the step node 0 resumes from), the checkpoint of that step, so every rank resumes
  from one step; else "last" on a resume (Lightning's last.ckpt) and None on a fresh start.
- After such a restart (or a Slurm requeue: Lightning's auto-requeue restores hpc_ckpt_N.ckpt),
  the first step the restored trainer logs tells the store where the earlier attempt's points
  stop counting: no step is stored twice.
- Rank 0 logs (Lightning's rank_zero_only), the other ranks do nothing.

Works with `lightning` (import lightning.pytorch) and the older `pytorch_lightning` package.
"""
import os

import tandem
from tandem._run import flatten

try:
    from lightning.pytorch.loggers.logger import Logger, rank_zero_experiment
    from lightning.pytorch.utilities import rank_zero_only
except ImportError:  # the standalone package
    from pytorch_lightning.loggers.logger import Logger, rank_zero_experiment
    from pytorch_lightning.utilities import rank_zero_only

__all__ = ["TandemLogger", "ckpt_path"]


def ckpt_path(default="last", dirpath=None):
    """trainer.fit's ckpt_path, the same on every rank: when this process resumes a run
    (TANDEM_RESUME=1, or a restart) and TANDEM_RESUME_STEP is set, the committed NAME.ckpt of
    that step ("step=N" in its name) in dirpath (default: TANDEM_CHECKPOINT_DIR, the
    ModelCheckpoint directory the logger picks); without it, `default` ("last"); on a fresh
    start None. Raises when the step's checkpoint is not in the directory."""
    from . import checkpoint as ck
    from ._run import TandemError, _env_int
    restarts = max(_env_int("TANDEM_RESTART_COUNT", 0), _env_int("TORCHELASTIC_RESTART_COUNT", 0),
                   _env_int("SLURM_RESTART_COUNT", 0))
    if not (os.environ.get("TANDEM_RESUME") == "1" or restarts > 0):
        return None
    step = ck.resume_step()
    if step is None:
        return default
    d = dirpath or os.environ.get("TANDEM_CHECKPOINT_DIR") or tandem.checkpoint.dir()
    path = ck.find_step(d, ck.LIGHTNING, step)
    if path is None:
        have = sorted({s for s, _, _ in ck.committed(d, (ck.LIGHTNING,)) if s >= 0})
        raise TandemError(f"TANDEM_RESUME_STEP={step}: no Lightning checkpoint of step {step} "
                          f"(NAME.ckpt with step={step} in its name) in {d} on this node (it "
                          f"holds steps {have or 'none'}); every rank must resume from the same "
                          f"step, and node 0's agent hands its checkpoint to every node before the "
                          f"workers start (docs/executors.md, 'Checkpoints on every node'): "
                          f"the agents' logs say why it did not")
    return path


class TandemLogger(Logger):
    """Lightning's Logger for tandem. name/tags/config/all_ranks go to tandem.init()."""

    def __init__(self, name=None, tags=None, config=None, all_ranks=False):
        super().__init__()
        self._init_args = dict(name=name, tags=tags, config=config, all_ranks=all_ranks)
        self._last = {}  # key -> last value: the summary at the end
        self._save_dir = None

    # ---- where things go
    @property
    @rank_zero_experiment
    def experiment(self):
        """The tandem.Run (rank 0; a dummy elsewhere, as Lightning's other loggers)."""
        return self._run()

    def _run(self):
        run = tandem.run
        if run is None or run.closed:
            run = tandem.init(**self._init_args)
            run.resume_at_first_log = True
        return run

    @property
    def name(self):
        return ""

    @property
    def version(self):
        return ""

    @property
    def save_dir(self):
        """The parent of the run's checkpoint directory: ModelCheckpoint appends
        "<name>/<version>/checkpoints" and name and version are empty, so its files land in
        the run's checkpoint directory when that is called "checkpoints" (the default; any
        other TANDEM_CHECKPOINT_DIR: pass ModelCheckpoint(dirpath=tandem.checkpoint.dir()))."""
        if self._save_dir is None:
            # every rank needs the same answer (not only rank 0): read the environment, not a run
            ck = os.environ.get("TANDEM_CHECKPOINT_DIR")
            if ck:
                ck = os.path.abspath(ck)
                if os.path.basename(ck) != "checkpoints":
                    rank_zero_only(_warn_dirpath)(ck)
                self._save_dir = os.path.dirname(ck)
            else:
                self._save_dir = self._run().dir if rank_zero_only.rank == 0 else None
        return self._save_dir

    @property
    def log_dir(self):
        return self.save_dir

    # ---- what is recorded
    @rank_zero_only
    def log_hyperparams(self, params, *args, **kwargs):
        if params is None:
            return
        if not isinstance(params, dict):
            params = vars(params) if hasattr(params, "__dict__") else dict(params)
        self._run().config.update(flatten(dict(params)))

    @rank_zero_only
    def log_metrics(self, metrics, step=None):
        # Lightning adds "epoch" to every call, and logs training and validation values at the
        # same step in separate calls: a key already stored at this step is not written twice.
        self._run().log_new(metrics, step)
        self._last.update(metrics)

    @rank_zero_only
    def after_save_checkpoint(self, checkpoint_callback):
        best = getattr(checkpoint_callback, "best_model_score", None)
        if best is not None:
            s = self._run().summary
            s["best_model_score"] = best
            s["best_model_path"] = getattr(checkpoint_callback, "best_model_path", None)

    @rank_zero_only
    def finalize(self, status):
        run = tandem.run
        if run is None or run.closed:
            return
        if self._last:
            run.summary.update(self._last)
        run.summary["lightning_status"] = status
        # the run stays open: trainer.test() after fit() logs to it too; it closes at exit


def _warn_dirpath(ck):
    import warnings
    warnings.warn(f"tandem.lightning: TANDEM_CHECKPOINT_DIR={ck} does not end in "
                  f"'checkpoints': ModelCheckpoint would write beside it; pass "
                  f"ModelCheckpoint(dirpath=tandem.checkpoint.dir())", stacklevel=3)


def _refuse_spawn_mode():
    """Lightning's own launch (one process, Trainer(devices=N), as dstack starts it) under a
    launcher that already started this process as one of WORLD_SIZE workers: Lightning then
    sees torchrun's environment and fails with a bare ValueError on the world size. tandem
    starts one process per device and Lightning none, so the fix is in the launch, and this
    says which line to change, before the first step (at the start of fit)."""
    try:
        from lightning.fabric.plugins.environments.torchelastic import TorchElasticEnvironment
    except ImportError:
        try:
            from lightning_fabric.plugins.environments.torchelastic import (
                TorchElasticEnvironment)
        except ImportError:
            return
    orig = TorchElasticEnvironment.validate_settings
    if getattr(orig, "_tandem", False):
        return

    def validate_settings(self, num_devices, num_nodes):
        try:
            return orig(self, num_devices, num_nodes)
        except ValueError as e:
            if "TANDEM_STORE_ADDR" not in os.environ:  # not a tandem worker: Lightning's word
                raise
            env = os.environ
            world, local = env.get("WORLD_SIZE", "?"), env.get("LOCAL_WORLD_SIZE", "?")
            nodes = env.get("NUM_NODES", env.get("GROUP_WORLD_SIZE", "?"))
            raise ValueError(
                f"tandem started this script as {world} worker(s), {local} per node on {nodes} "
                f"node(s), but Trainer(devices={num_devices}, num_nodes={num_nodes}) asks "
                f"Lightning to start {num_devices * num_nodes} processes itself. Under tandem, "
                f"tandem starts one process per device: set nproc_per_node: {num_devices} "
                f"(and nodes: {num_nodes}) in the workflow, or run tandem run --nproc-per-node "
                f"{num_devices} -- python ... (tandem launch --nproc-per-node {num_devices}), "
                f"and keep devices={num_devices}; or make the Trainer match the launch: "
                f"Trainer(devices={local}, num_nodes={nodes})") from e

    validate_settings._tandem = True
    TorchElasticEnvironment.validate_settings = validate_settings


_refuse_spawn_mode()
