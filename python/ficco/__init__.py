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

from ficco._native import Session, check_schedule, free_port, schedules, version

__version__ = version()

__all__ = [
    "Session",
    "check_schedule",
    "free_port",
    "schedules",
    "version",
    "__version__",
]
