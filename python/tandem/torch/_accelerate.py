"""Makes Hugging Face Accelerate (and so the HF Trainer, which builds its state through it) take
``"tandem"`` as the name of a CPU process-group backend.

Why a patch: Accelerate 1.x picks the backend of a CPU job in ``PartialState._prepare_backend``,
which maps every name but ``"mpi"`` to ``"gloo"``, and ``PartialState.__init__`` then refuses the
name it was given ("Your assigned backend tandem is not available, please use gloo"). So
``Accelerator(cpu=True, kwargs_handlers=[InitProcessGroupKwargs(backend="tandem")])`` and
``TrainingArguments(use_cpu=True, ddp_backend="tandem")`` fail before any process group exists,
and Accelerate has no registry of backends to add one to. The wrapper below keeps Accelerate's
choice in every case but one: a multi-process CPU job (Accelerate's MULTI_CPU) whose requested
backend names tandem (``"tandem"``, ``"cpu:tandem"``, ``"cpu:tandem,cuda:nccl"``) gets that name
instead of ``"gloo"``; Accelerate then calls ``init_process_group`` with it as it would with
gloo's. Nothing else changes, and without a tandem name Accelerate behaves exactly as before.

The patch is applied when ``accelerate.state`` is imported (or at once, if it already was), so
``import tandem.torch`` costs nothing for programs that never import Accelerate. Without it,
Accelerate still adopts a default group that exists before it starts: call
``dist.init_process_group("tandem")`` first and build ``Accelerator(cpu=True)`` /
``TrainingArguments(use_cpu=True)`` without a backend (docs/torch.md, "Accelerate and the HF
Trainer")."""
import importlib.abc
import importlib.machinery
import sys

_MODULE = "accelerate.state"


def _names_tandem(backend):
    return isinstance(backend, str) and any(
        part.split(":")[-1].strip() == "tandem" for part in backend.split(","))


def patch(state):
    """Wraps ``state.PartialState._prepare_backend`` (``state`` is the module accelerate.state)."""
    cls = getattr(state, "PartialState", None)
    original = getattr(cls, "_prepare_backend", None)
    if original is None:
        raise ImportError(
            "tandem.torch: this Accelerate (%s) has no PartialState._prepare_backend, where "
            "tandem.torch makes it accept backend='tandem'; initialize the group first instead: "
            "dist.init_process_group('tandem'), then Accelerator(cpu=True) without a backend "
            "(docs/torch.md)" % getattr(sys.modules.get("accelerate"), "__version__", "?"))
    if getattr(original, "_tandem_patched", False):
        return

    def _prepare_backend(self, cpu=False, sagemaker_dp=False, backend=None):
        chosen, distributed_type = original(self, cpu, sagemaker_dp, backend)
        if (_names_tandem(backend) and chosen == "gloo"
                and distributed_type == state.DistributedType.MULTI_CPU):
            return backend, distributed_type
        return chosen, distributed_type

    _prepare_backend._tandem_patched = True
    _prepare_backend.__wrapped__ = original
    _prepare_backend.__doc__ = original.__doc__
    cls._prepare_backend = _prepare_backend


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when accelerate.state is about to be loaded, wraps its loader so the
    module is patched right after it executes."""

    def find_spec(self, name, path, target=None):
        if name != _MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        real_exec = loader.exec_module

        def exec_module(module):
            real_exec(module)
            patch(module)

        loader.exec_module = exec_module
        return spec


def install():
    """Patches Accelerate now if it is loaded, else when it is."""
    if _MODULE in sys.modules:
        patch(sys.modules[_MODULE])
    elif not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())
