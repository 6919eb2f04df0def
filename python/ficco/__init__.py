"""ficco: fine-grained compute-communication overlap, from Python.

``import ficco.torch`` gives the operators on PyTorch tensors inside a
``torch.distributed`` job (``all_gather_matmul``, ``matmul_reduce_scatter``,
``matmul_all_reduce``). This top-level module needs no PyTorch: it exposes
the native layer (the Rust library through PyO3):

* ``Session``: one process's rank of a ficco job (``ficco.torch`` builds
  and caches one per process group);
* ``check_schedule(op, name, gpus=None, sm_count=None)``: parses a schedule
  name with ficco's grammar and returns its canonical form, or raises
  ``ValueError`` saying what is wrong;
* ``schedules(op, gpus, controls=False)``: the names ``ficco schedules``
  lists;
* ``free_port()`` and ``version()``.
"""

import os
import sys

from ficco._native import Session, check_schedule, free_port, schedules, version

__version__ = version()


def _hardware_queues() -> bool:
    """Asks the CUDA driver for 32 hardware queues per device
    (``CUDA_DEVICE_MAX_CONNECTIONS``, default 8) unless the user chose: a
    stream waiting on one of ficco's signal flags blocks its queue, and
    streams sharing it wait behind it (several ranks' streams share one GPU
    in loopback). The driver reads it when PyTorch first touches CUDA, so
    ``import ficco`` before that. Returns whether it was in time."""
    if "CUDA_DEVICE_MAX_CONNECTIONS" in os.environ:
        return True
    torch = sys.modules.get("torch")
    late = torch is not None and torch.cuda.is_initialized()
    os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "32"
    return not late


_QUEUES_IN_TIME = _hardware_queues()

__all__ = [
    "Session",
    "check_schedule",
    "free_port",
    "schedules",
    "version",
    "__version__",
]
