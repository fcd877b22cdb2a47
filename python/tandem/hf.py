"""tandem.hf: the Hugging Face Trainer records a run in tandem.

    from tandem.hf import TandemCallback, last_checkpoint
    args = TrainingArguments(output_dir=tandem.checkpoint.dir(), save_steps=50, ...)
    trainer = Trainer(model=model, args=args, ..., callbacks=[TandemCallback()])
    trainer.train(resume_from_checkpoint=last_checkpoint(args.output_dir))

- The Trainer's logs (loss, learning_rate, grad_norm, eval_*) go to the run's metrics at the
  Trainer's global step; TrainingArguments and the model's config to tandem.config (under
  "args/" and "model/"); the last value of each key, the Trainer's train_* results and its
  best checkpoint to tandem.summary.
- last_checkpoint(dir): the newest complete checkpoint-N in dir when this process resumes
  (`tandem run --resume`, a restart after a worker died), else None (a fresh start). A
  checkpoint cut short by a kill (no readable trainer_state.json) is skipped. With
  TANDEM_RESUME_STEP set (tandem launch sets it on a resume: node 0's newest), exactly
  checkpoint-<that step>, so every rank resumes from one step; missing, it raises.
- A resumed Trainer starts at the checkpoint's step: its points after it replace the earlier
  attempt's (no step is stored twice).
- tandem.should_stop() (SIGTERM: `tandem stop`, a preemption) is asked after each step: the
  Trainer saves a checkpoint and stops; the callback's .stopped is then True (exit with
  tandem.STOPPED for a resumable end).
"""
import json
import math
import numbers
import os
import re

import tandem
from transformers import TrainerCallback

__all__ = ["TandemCallback", "last_checkpoint"]

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def last_checkpoint(output_dir=None, always=False):
    """The newest complete checkpoint-N directory of output_dir (default: the run's checkpoint
    directory) when resuming (or always=True), else None."""
    run = tandem.run or tandem.init()
    if not (always or run.resuming):
        return None
    d = output_dir or run.checkpoint_dir
    named = tandem.checkpoint.resume_step()
    if named is not None:
        # every rank resumes from the step node 0 decided (tandem launch sets it on a resume)
        path = tandem.checkpoint.find_step(d, tandem.checkpoint.HF, named)
        if path is None:
            have = [s for s, _, _ in tandem.checkpoint.committed(d, (tandem.checkpoint.HF,))]
            raise tandem.TandemError(
                f"TANDEM_RESUME_STEP={named}: no committed checkpoint-{named} in {d} on this "
                f"node (it holds steps {have or 'none'}); every rank must resume from the same "
                f"step, and node 0's agent hands its checkpoint to every node before the "
                f"workers start (docs/executors.md, 'Checkpoints on every node'): the "
                f"agents' logs say why it did not")
        return path
    try:
        names = os.listdir(d)
    except FileNotFoundError:
        return None
    found = sorted(((int(m.group(1)), n) for n in names if (m := _CHECKPOINT.match(n))),
                   reverse=True)
    for step, n in found:
        path = os.path.join(d, n)
        try:
            with open(os.path.join(path, "trainer_state.json")) as f:
                json.load(f)
        except (OSError, ValueError):
            print(f"tandem.hf: {path} is incomplete (no readable trainer_state.json): "
                  f"trying the one before it", flush=True)
            continue
        return path
    return None


def _numbers(logs):
    out = {}
    for k, v in (logs or {}).items():
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            continue  # the Trainer's logs hold some text (e.g. a total_flos string) too
        out[k] = v
    return out


class TandemCallback(TrainerCallback):
    """A TrainerCallback that records the run in tandem. name/tags/config go to tandem.init()."""

    def __init__(self, name=None, tags=None, config=None):
        self._init_args = dict(name=name, tags=tags, config=config)
        self._last = {}
        self.stopped = False

    def _run(self):
        run = tandem.run
        if run is None or run.closed:
            run = tandem.init(**self._init_args)
        return run

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        run = self._run()
        if state.is_world_process_zero:
            cfg = {"args/" + k: v for k, v in args.to_dict().items()
                   if isinstance(v, (bool, int, float, str))}
            mc = getattr(model, "config", None)
            if mc is not None and hasattr(mc, "to_dict"):
                cfg.update({"model/" + k: v for k, v in mc.to_dict().items()
                            if isinstance(v, (bool, int, float, str))})
            run.config.update(cfg)
        # A resumed Trainer has loaded its state: the steps after its global_step are trained
        # (and logged) again, so the earlier attempt's points after it are dropped.
        if run.resuming and run._last_step is None:
            run.resumed_at(state.global_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        values = _numbers(logs)
        if not values:
            return
        # the end-of-training line repeats keys at the last step (e.g. epoch)
        self._run().log_new(values, state.global_step)
        self._last.update({k: v for k, v in values.items()
                           if not (isinstance(v, float) and not math.isfinite(v))})

    def on_step_end(self, args, state, control, **kwargs):
        if tandem.should_stop():  # a collective when torch.distributed is up: every rank asks
            control.should_save = True
            control.should_training_stop = True
            self.stopped = True

    def on_train_end(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        run = self._run()
        summary = dict(self._last)
        if state.best_model_checkpoint:
            summary["best_model_checkpoint"] = state.best_model_checkpoint
            summary["best_metric"] = state.best_metric
        summary["global_step"] = state.global_step
        run.summary.update(summary)
