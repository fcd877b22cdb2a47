"""tandem.accelerate: an Accelerate tracker that records a run in tandem.

    from tandem.accelerate import TandemTracker
    accelerator = Accelerator(log_with=TandemTracker())
    tandem.init()                     # on every rank: Accelerate calls trackers on rank 0 only
    accelerator.init_trackers("my-project", config={"lr": lr})    # -> tandem.config
    state, start = tandem.checkpoint.load_latest()                 # resume through the SDK
    ...
    accelerator.log({"loss": loss.item()}, step=step)              # -> the run's metrics
    tandem.checkpoint.save({"model": accelerator.unwrap_model(model).state_dict(), ...}, step)
    accelerator.end_training()

Accelerate calls a tracker on its main process only (main_process_only): that is rank 0, the
one that writes. Text values (Accelerate allows str in log()) go to tandem.summary, numbers to
the metrics. Checkpoints: tandem.checkpoint (one file per step, resumes exactly), or
accelerator.save_state(os.path.join(tandem.checkpoint.dir(), f"state-{step}")) with
tandem.run.resumed_at(step) after load_state.
"""
import tandem
from accelerate.tracking import GeneralTracker

__all__ = ["TandemTracker"]


class TandemTracker(GeneralTracker):
    """Accelerate's GeneralTracker for tandem. name/tags go to tandem.init()."""

    name = "tandem"
    requires_logging_directory = False
    main_process_only = True

    def __init__(self, run_name=None, tags=None):
        super().__init__()
        self._init_args = dict(name=run_name, tags=tags)

    def _run(self):
        run = tandem.run
        if run is None or run.closed:
            run = tandem.init(**self._init_args)
        return run

    def start(self):
        self._run()

    @property
    def tracker(self):
        return self._run()

    def store_init_configuration(self, values):
        self._run().config.update(dict(values or {}))

    def log(self, values, step=None, **kwargs):
        run = self._run()
        nums, text = {}, {}
        for k, v in values.items():
            if isinstance(v, str):
                text[k] = v
            elif isinstance(v, dict):  # Accelerate passes dicts on to trackers that group keys
                for sub, x in v.items():
                    nums[f"{k}/{sub}"] = x
            else:
                nums[k] = v
        if nums:
            run.log(nums, step=step)
        if text:
            run.summary.update(text)

    def finish(self):
        run = tandem.run
        if run is not None and not run.closed:
            run.finish()
