"""PyTorch's ``"tandem"`` process-group backend: ``import tandem.torch`` and then
``torch.distributed.init_process_group("tandem")``.

Importing this module registers ``"tandem"`` with ``torch.distributed.Backend.register_backend``
for CPU tensors (``"cpu:tandem,cuda:nccl"`` splits by device). Every collective runs in tandem's
C comm layer (the shm transport within a host, tcp across hosts, chosen as ``tandem train``
chooses) through a thin C++ extension, ``_tandem_c10d``. What is supported, how groups find each
other under ``tandem launch`` and under torchrun, and the figures: docs/torch.md.

Accelerate and the HF Trainer take ``"tandem"`` too once this module is imported
(``InitProcessGroupKwargs(backend="tandem")``, ``TrainingArguments(ddp_backend="tandem")``):
``_accelerate.py`` says why that needs a patch of Accelerate's backend choice, and what it changes.
"""

import glob
import importlib.util
import os

import torch
import torch.distributed as dist

__all__ = ["BACKEND", "extension_path", "is_available"]

BACKEND = "tandem"

_EXT_NAME = "_tandem_c10d"


def _candidates():
    """Where the extension may be: TANDEM_TORCH_EXT (a file), next to this module (a wheel), and
    the build directory of a source checkout (TANDEM_BUILD_DIR, as the tests set it)."""
    explicit = os.environ.get("TANDEM_TORCH_EXT")
    if explicit:
        return [explicit]
    here = os.path.dirname(os.path.abspath(__file__))
    dirs = [here]
    build = os.environ.get("TANDEM_BUILD_DIR")
    if build:
        dirs.append(os.path.join(build, "python", "tandem", "torch"))
    found = []
    for d in dirs:
        found += sorted(glob.glob(os.path.join(d, _EXT_NAME + ".*so")))
    return found


def extension_path():
    """The extension file this module loads, or None."""
    for path in _candidates():
        if os.path.isfile(path):
            return path
    return None


def _load():
    path = extension_path()
    if path is None:
        raise ImportError(
            "tandem.torch: the C++ extension %s is not built (looked at %s). Build tandem with "
            "PyTorch 2.x found (scripts/build.sh builds it against the frameworks venv, or pass "
            "-DTANDEM_TORCH_PYTHON=/path/to/python), then set TANDEM_TORCH_EXT to the built "
            "%s*.so or TANDEM_BUILD_DIR to the build directory" %
            (_EXT_NAME, ", ".join(_candidates()) or "TANDEM_TORCH_EXT, this package and "
             "TANDEM_BUILD_DIR (unset)", _EXT_NAME))
    spec = importlib.util.spec_from_file_location("tandem.torch." + _EXT_NAME, path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ImportError as e:
        raise ImportError(
            "tandem.torch: %s was built against another PyTorch than torch %s here (%s); "
            "rebuild it with this Python's torch (-DTANDEM_TORCH_PYTHON)" %
            (path, torch.__version__, e)) from e
    return module


_ext = _load()


def _create_backend(dist_opts, backend_options=None):
    """c10d's factory for a group's backend (extended API: it gets the group's name, so each
    group has its own key namespace in the store)."""
    timeout = dist_opts.timeout
    seconds = timeout.total_seconds() if hasattr(timeout, "total_seconds") else float(timeout)
    return _ext.create(dist_opts.store, dist_opts.group_rank, dist_opts.group_size,
                       str(dist_opts.group_id), seconds)


def is_available():
    """True: importing this module succeeded, so the backend is registered."""
    return True


if BACKEND not in dist.Backend.backend_list:
    dist.Backend.register_backend(BACKEND, _create_backend, extended_api=True, devices=["cpu"])

# Accelerate (and the HF Trainer through it) would refuse the name "tandem" for a CPU job:
# see _accelerate.py for why and what is changed.
from tandem.torch import _accelerate  # noqa: E402

_accelerate.install()
