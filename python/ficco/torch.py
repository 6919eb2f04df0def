"""ficco's overlapped operators on PyTorch tensors, inside a ``torch.distributed`` job.

Each call runs one communication-dependent operator on every rank of a
process group, overlapped by one of ficco's schedules:

==========================  ==================  ========  ==========================================
call                        ``a``               ``b``     result
==========================  ==================  ========  ==========================================
``all_gather_matmul``       ``[m/P, k]`` shard  ``[k,n]`` ``[m, n]`` = all_gather(a, dim 0) @ b
``matmul_reduce_scatter``   ``[m, k]``          ``[k,n]`` ``[m/P, n]`` = reduce_scatter(a @ b, dim 0),
                                                          rank r's rows ``r*m/P .. (r+1)*m/P``
``matmul_all_reduce``       ``[m, k]``          ``[k,n]`` ``[m, n]`` = all_reduce(a @ b)
==========================  ==================  ========  ==========================================

P is the group's size. Tensors are bfloat16, 2-D, contiguous, on this
process's current CUDA device; the operator runs on the current CUDA stream
(ordered after the work queued on it, and the caller's later work after
it), like any PyTorch op: a call returns once it is queued, without
synchronizing the host (the first call of each shape runs synchronously;
``FICCO_OP_SYNC=1`` makes every call do so). ``schedule="auto"`` takes the tuning cache's winner for the shape
(``ficco tune``), else the rule selector's pick (``ficco select``); any name
``ficco schedules --op OP --gpus P`` lists forces that schedule. Every rank
of the group calls the same operator with the same shapes and schedule, in
the same order, as with any collective.

Arguments are checked here before anything reaches the native library; a bad
one raises ``TypeError`` or ``ValueError`` naming it and saying what to do.
A failure during the run (a rank that died, a hang) raises ``RuntimeError``
on every surviving rank within ficco's bounds (``FICCO_DIST_TIMEOUT_MS``,
``FICCO_WATCHDOG_MS``) instead of hanging. A call that returned before it
ran reports such a failure at the next ficco call or at ``synchronize()``;
meanwhile its stream is released, so nothing waits forever.

Autograd: each op has a backward (``ficco._grad`` documents the formulas);
the input gradients of ``all_gather_matmul`` and ``matmul_reduce_scatter``
are the other op, run on ficco's schedules where that beats PyTorch. A
call with ``out=`` has no backward: pass no ``out`` when ``a`` or ``b``
requires grad.

Sessions: the first call on a group joins a ficco session of that group's
ranks (its own rendezvous, bootstrapped through the process group's store:
rank 0 of the group publishes the address of the session's store there), and
later calls reuse it. ``close()`` closes them; an ``atexit`` hook does too.
"""

from __future__ import annotations

import atexit
import datetime
import functools
import os
import socket
import threading
import warnings
from typing import Dict, List, NamedTuple, Optional, Tuple

try:
    import torch
    import torch.distributed as dist
except ModuleNotFoundError as _e:
    if _e.name != "torch":
        raise
    raise ModuleNotFoundError(
        "ficco.torch needs PyTorch, which is not installed in this Python: "
        "pip install 'ficco[torch]' (or pip install torch). `import ficco` "
        "alone (schedule names, version) works without it.",
        name="torch",
    ) from None

import ficco
from ficco import _native

__all__ = [
    "all_gather_matmul",
    "matmul_reduce_scatter",
    "matmul_all_reduce",
    "close",
    "decisions",
    "Decision",
    "adapt_to_host",
    "empty",
    "forget_decisions",
    "host_bound",
    "input_grads_on_ficco",
    "keep_gathered",
    "last_schedule",
    "session",
    "synchronize",
]

# One session per process group (keyed by the group object), the number of
# sessions built per group name (the rendezvous key of the next one), and the
# canonical name of the schedule each group's last call ran.
_sessions: Dict[object, "_native.Session"] = {}
_built: Dict[str, int] = {}
_last: Dict[object, str] = {}
# Call shapes already checked in full, with what the checks found
# (`_run`'s fast path).
_steady: Dict[tuple, tuple] = {}
_STEADY_KEPT = 4096
# The `auto` decision of each call shape, per group (made once per session).
_decisions: Dict[object, Dict[Tuple[str, int, int, int], "Decision"]] = {}
_lock = threading.Lock()

_OPS = {
    "ag-gemm": "all_gather_matmul",
    "gemm-rs": "matmul_reduce_scatter",
    "gemm-ar": "matmul_all_reduce",
}


def all_gather_matmul(
    a_shard: torch.Tensor,
    b: torch.Tensor,
    group: Optional[dist.ProcessGroup] = None,
    schedule: str = "auto",
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """``all_gather(a_shard, dim 0) @ b``: ``a_shard`` ``[m/P, k]`` (this
    rank's rows), ``b`` ``[k, n]``; returns ``[m, n]`` (written into ``out``
    when given: bfloat16, contiguous, that shape, on the same device)."""
    return _op("ag-gemm", "a_shard", a_shard, b, group, schedule, out)


def matmul_reduce_scatter(
    a: torch.Tensor,
    b: torch.Tensor,
    group: Optional[dist.ProcessGroup] = None,
    schedule: str = "auto",
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """``reduce_scatter(a @ b)`` over dim 0: ``a`` ``[m, k]``, ``b`` ``[k, n]``;
    returns this rank's ``[m/P, n]`` rows of the sum over ranks (rank r gets
    rows ``r*m/P`` to ``(r+1)*m/P``)."""
    return _op("gemm-rs", "a", a, b, group, schedule, out)


def matmul_all_reduce(
    a: torch.Tensor,
    b: torch.Tensor,
    group: Optional[dist.ProcessGroup] = None,
    schedule: str = "auto",
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """``all_reduce(a @ b)``: ``a`` ``[m, k]``, ``b`` ``[k, n]``; returns the
    ``[m, n]`` sum over ranks, on every rank."""
    return _op("gemm-ar", "a", a, b, group, schedule, out)


class _SharedBlock:
    """One shared allocation seen as a CUDA array (int16 words, viewed as
    bfloat16 by the caller). The tensor built on it keeps it alive; when the
    tensor goes, the allocation is released."""

    def __init__(self, s: "_native.Session", addr: int, elems: int):
        self._session, self._addr = s, addr
        self.__cuda_array_interface__ = {
            "shape": (elems,),
            "typestr": "<i2",
            "data": (addr, False),
            "version": 3,
            "strides": None,
        }

    def __del__(self):
        try:
            self._session.free(self._addr)
        except Exception:  # interpreter shutdown, or the session failed
            pass


def empty(*size, group: Optional[dist.ProcessGroup] = None) -> torch.Tensor:
    """An uninitialised bfloat16 tensor of ``size`` in memory the group's
    other ranks map too (like ``torch.distributed._symmetric_memory.empty``).
    Collective: every rank of the group calls it with the same size. Passed
    to the ops (as an input or ``out=``), it is read or written in place
    instead of being copied into ficco's buffers, when every rank's tensor
    lies at the same place of its allocation."""
    fn = "ficco.torch.empty"
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    if not size or not all(isinstance(d, int) and d > 0 for d in size):
        raise ValueError(f"{fn}: size must be positive integers, got {size}")
    _check_initialised(fn)
    _check_cuda(fn)
    s = _session(fn, _resolve(group))
    elems = 1
    for d in size:
        elems *= d
    addr = s.alloc(elems * 2)
    block = _SharedBlock(s, addr, elems)
    t = torch.as_tensor(block, device=f"cuda:{s.device}")
    return t.view(torch.bfloat16).view(*size)


def last_schedule(group: Optional[dist.ProcessGroup] = None) -> Optional[str]:
    """The canonical name of the schedule the group's last call ran (what
    ``"auto"`` picked), or ``None`` before the first call."""
    if not _initialised():
        return None
    return _last.get(_resolve(group))


def session(group: Optional[dist.ProcessGroup] = None) -> "_native.Session":
    """The group's ficco session, joined on first use (collective: every rank
    of the group calls it)."""
    fn = "ficco.torch.session"
    _check_initialised(fn)
    _check_cuda(fn)
    return _session(fn, _resolve(group))


def synchronize(group: Optional[dist.ProcessGroup] = None) -> None:
    """Waits until every ficco call of this rank on ``group`` finished on the
    device; raises ``RuntimeError`` if one of them hung (a rank died): its
    result, and those of the calls after it, are not valid. Does nothing
    before the group's first call."""
    if not _initialised():
        return
    group = _resolve(group)
    sess = _sessions.get(group)
    if sess is None:
        return
    try:
        sess.synchronize()
    except RuntimeError:
        _drop(group, sess)
        raise


def _drop(group, sess) -> None:
    """Forgets `group`'s failed session `sess` and what its calls decided
    (the next call joins a new session and decides again)."""
    with _lock:
        if _sessions.get(group) is sess:
            del _sessions[group]
            _forget(group)


def _forget(group) -> None:
    """Drops `group`'s ``auto`` decisions and host watch (under ``_lock``)."""
    _decisions.pop(group, None)
    _host_group.pop(group, None)
    for key in [k for k in _host_calls if k[0] is group]:
        del _host_calls[key]


def close() -> None:
    """Closes every cached session (each a last barrier with its group's
    ranks, so every rank calls it). Raises ``RuntimeError`` naming the first
    failure after trying them all."""
    with _lock:
        items = list(_sessions.items())
        _sessions.clear()
        _last.clear()
        _decisions.clear()
        _host_group.clear()
        _host_calls.clear()
        _grad_groups.clear()
        _steady.clear()
    errors = []
    for _, s in items:
        try:
            s.close()
        except (RuntimeError, ValueError) as e:
            errors.append(str(e))
    if errors:
        raise RuntimeError(
            f"ficco.torch.close: {len(errors)} session(s) failed to close: {errors[0]}"
        )


@atexit.register
def _close_at_exit() -> None:
    try:
        close()
    except RuntimeError as e:
        # Exiting anyway; say why the other ranks may report this one.
        print(f"ficco: {e}", flush=True)


# ------------------------------------------------------- torch.library ops


def _op(op, a_name, a, b, group, schedule, out):
    """Eager calls without autograd go straight to :func:`_run` (no
    dispatcher on the host path); under ``torch.compile``, or where a
    gradient is needed, the call becomes one of the ``ficco::`` custom ops
    below: opaque to the compiler, with a fake implementation giving the
    output's shape, a real one that is :func:`_run`, and a backward
    (``ficco._grad``)."""
    grad = (
        torch.is_grad_enabled()
        and isinstance(a, torch.Tensor)
        and isinstance(b, torch.Tensor)
        and (a.requires_grad or b.requires_grad)
    )
    if not grad and not torch.compiler.is_compiling():
        return _run(op, a_name, a, b, group, schedule, out)
    fn = f"ficco.torch.{_OPS[op]}"
    _check_tensor(fn, a_name, a)
    _check_tensor(fn, "b", b)
    if not isinstance(schedule, str):
        raise TypeError(f"{fn}: schedule must be a str ('auto' or a schedule name)")
    if grad and out is not None:
        raise ValueError(
            f"{fn}: out= has no backward, and {a_name} or b requires grad; drop out= "
            "(or call under torch.no_grad())"
        )
    _check_initialised(fn)
    resolved = _resolve(group)
    if grad:
        _grad_groups.add(resolved)
    name = _group_name(resolved)
    if grad and op == "ag-gemm" and b.requires_grad and _grad.keeps_gathered(resolved):
        # The weight gradient needs all_gather(a): kept from here.
        return torch.ops.ficco.all_gather_matmul_keep(a, b, name, schedule)[0]
    ops = getattr(torch.ops.ficco, _OPS[op])
    if out is None:
        return ops(a, b, name, schedule)
    getattr(torch.ops.ficco, _OPS[op] + "_out")(a, b, out, name, schedule)
    return out


def _group_of(name: str):
    return dist.distributed_c10d._resolve_process_group(name)


def _out_shape(op: str, a: torch.Tensor, b: torch.Tensor, size: int) -> Tuple[int, int]:
    rows, n = a.shape[0], b.shape[1]
    if op == "ag-gemm":
        return (rows * size, n)
    if op == "gemm-rs":
        return (rows // size, n)
    return (rows, n)


def _register(op: str, a_name: str) -> None:
    """``ficco::<name>(a, b, group_name, schedule) -> Tensor`` and
    ``ficco::<name>_out(a, b, out, group_name, schedule)``, with fake
    implementations (shapes only), as ``torch.ops.symm_mem`` registers
    PyTorch's own fused ops."""
    name = _OPS[op]

    @torch.library.custom_op(f"ficco::{name}", mutates_args=())
    def call(a: torch.Tensor, b: torch.Tensor, group_name: str, schedule: str) -> torch.Tensor:
        return _run(op, a_name, a, b, _group_of(group_name), schedule, None)

    @call.register_fake
    def _(a, b, group_name, schedule):
        size = _group_of(group_name).size()
        return a.new_empty(_out_shape(op, a, b, size))

    @torch.library.custom_op(f"ficco::{name}_out", mutates_args=("out",))
    def call_out(
        a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, group_name: str, schedule: str
    ) -> None:
        _run(op, a_name, a, b, _group_of(group_name), schedule, out)

    @call_out.register_fake
    def _(a, b, out, group_name, schedule):
        return None


for _op_name, _a_name in (("ag-gemm", "a_shard"), ("gemm-rs", "a"), ("gemm-ar", "a")):
    _register(_op_name, _a_name)


# ---------------------------------------------------------------- checks


def _needs_one_node(name: str) -> bool:
    """Whether schedule `name` moves data by other means than NCCL (copy
    engines, or the fused `tile` schedules): then every rank must be on one
    node. `seq` and NCCL schedules work across nodes."""
    parts = name.split("-")
    return parts[0] == "tile" or "copy" in parts[1:2]


def _run(op, a_name, a, b, group, schedule, out, gathered=None):
    # A call like an earlier one (same op, group, shapes, schedule, device)
    # needs only the checks that can differ between such calls: a model's
    # calls cost microseconds, not the full checks' tens.
    if isinstance(schedule, str) and isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        g = dist.group.WORLD if group is None else group
        dev = a.get_device()
        seen = _steady.get((op, g, a.shape, b.shape, schedule, out is None, dev))
        if seen is not None and _quick_ok(a, b, out, dev, seen):
            sess = _sessions.get(g)
            if sess is not None:
                name, m, k, n, size, out_shape = seen
                if out is None:
                    out = a.new_empty(out_shape)  # a is bf16 on the device (checked)
                return _execute(op, g, sess, name, a, b, out, m, k, n, size,
                                gathered=gathered, device=dev)
    return _run_checked(op, a_name, a, b, group, schedule, out, gathered)


# The current CUDA device's index, without `torch.cuda.current_device()`'s
# lazy-init check (the steady path runs after a full call initialised CUDA).
_current_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device


def _quick_ok(a, b, out, dev, seen) -> bool:
    """The per-call checks of a call shape seen before (else the full
    checks run, and raise the full message); `dev` is ``a.get_device()``."""
    bf = torch.bfloat16
    # dtypes are singletons: `is` compares them without a call.
    if a.dtype is not bf or b.dtype is not bf or not a.is_contiguous() or not b.is_contiguous():
        return False
    # get_device(): the CUDA index, -1 on the CPU (no device object made).
    if dev < 0 or b.get_device() != dev or dev != _current_device():
        return False
    if out is not None:
        if not isinstance(out, torch.Tensor) or out.dtype is not bf or not out.is_contiguous():
            return False
        if out.shape != seen[5] or out.get_device() != dev:
            return False
    return True


def _run_checked(op, a_name, a, b, group, schedule, out, gathered=None):
    fn = f"ficco.torch.{_OPS[op]}"
    _check_tensor(fn, a_name, a)
    _check_tensor(fn, "b", b)
    rows, k = a.shape
    k_b, n = b.shape
    if k != k_b:
        raise ValueError(
            f"{fn}: inner dimensions differ: {a_name} is {_shape(a)} and b is {_shape(b)}; "
            f"{a_name}.shape[1] must equal b.shape[0]"
        )
    for what, v in ((f"{a_name}.shape[0]", rows), ("k", k), ("n", n)):
        if v == 0:
            raise ValueError(f"{fn}: {what} is 0; ficco ops need non-empty operands")
    name = _check_schedule_arg(fn, op, schedule, None, None)
    _check_initialised(fn)
    group = _resolve(group)
    size = dist.get_world_size(group)
    if dist.get_rank(group) < 0:
        raise ValueError(f"{fn}: this process is not a member of the given group")
    if size < 2:
        raise ValueError(
            f"{fn}: the process group has {size} rank; ficco ops need at least 2 ranks "
            "(use a plain matmul on one GPU)"
        )
    if op == "ag-gemm":
        m = rows * size
    else:
        m = rows
        if rows % size != 0:
            raise ValueError(
                f"{fn}: {a_name} has {rows} rows, which is not divisible by the group size "
                f"{size}; pad m to a multiple of {size}"
            )
    out_shape = (m // size if op == "gemm-rs" else m, n)
    # Keyed as _run looks it up: whether the caller left out `out`.
    no_out = out is None
    _check_device(fn, a_name, a)
    _check_device(fn, "b", b)
    if name is not None:
        # Again with what the group and the device make known.
        sms = torch.cuda.get_device_properties(a.device).multi_processor_count
        name = _check_schedule_arg(fn, op, name, size, sms)
    if out is None:
        out = torch.empty(out_shape, dtype=torch.bfloat16, device=a.device)
    else:
        _check_tensor(fn, "out", out)
        if tuple(out.shape) != out_shape:
            raise ValueError(
                f"{fn}: out is {_shape(out)} but the result is {out_shape}"
            )
        _check_device(fn, "out", out)
    sess = _session(fn, group)
    if name is not None and _needs_one_node(name) and not sess.single_node:
        raise ValueError(
            f"{fn}: schedule {name!r} moves data between the GPUs of one node (copy engines "
            "or fused tiles), but this group spans several hosts; use an NCCL schedule "
            "(`ficco schedules`) or schedule='auto'"
        )
    with _lock:
        if len(_steady) >= _STEADY_KEPT:
            _steady.clear()
        _steady[(op, group, a.shape, b.shape, schedule, no_out, a.get_device())] = (
            name, m, k, n, size, out_shape)
    return _execute(op, group, sess, name, a, b, out, m, k, n, size, gathered=gathered)


def _execute(op, group, sess, name, a, b, out, m, k, n, size, b_transposed=False, gathered=None,
             device=None):
    """Runs a checked call: `name` None is "auto". `b_transposed`: `b` is
    B's transpose, ``[n, k]`` (the backward's input gradients).
    `gathered` (ag-gemm): a ``[m, k]`` tensor that also receives the
    gathered A (autograd keeps it for the weight gradient). `device`: the
    operands' CUDA index when the caller has it."""
    try:
        if name is None:
            name = _auto(sess, group, op, m, k, n, a.device).schedule
            if name == "seq" and not sess.loopback:
                # The candidate's gain does not cover the call's own cost:
                # PyTorch's sequential reference, on the caller's stream.
                _torch_seq(op, a, b.t() if b_transposed else b, out, group, size, gathered)
                _last[group] = "seq"
                return out
        stream = _raw_stream(a.device.index if device is None else device)
        target = out
        pa, pb, po = a.data_ptr(), b.data_ptr(), out.data_ptr()
        if (pa | pb | po) % 16:
            # ficco binds operands in place, which must start on 16 bytes (a
            # view with an offset may not): aligned copies, on the stream.
            a, b = (t if t.data_ptr() % 16 == 0 else t.clone() for t in (a, b))
            if po % 16:
                out = torch.empty_like(out)
            pa, pb, po = a.data_ptr(), b.data_ptr(), out.data_ptr()
        # Positional: keyword arguments cost the extension call microseconds.
        ran = sess.run_op(
            op, m, k, n, name, pa, pb, po, stream,
            b_transposed, 0 if gathered is None else gathered.data_ptr(),
        )
        if out is not target:
            out = target.copy_(out)
    except RuntimeError:
        # The job failed (a rank died or hung): this session is unusable.
        # Dropped, not closed (closing would wait at a barrier for the lost
        # rank); the next call joins a new one.
        _drop(group, sess)
        raise
    _last[group] = ran
    return out


# PyTorch's own fast accessor of the current stream, as its compiled code
# uses (the public one builds a Stream object per call).
_current_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _raw_stream(index: int) -> int:
    """The current stream's ``CUstream``."""
    if _current_raw_stream is not None:
        return _current_raw_stream(index)
    return torch.cuda.current_stream(index).cuda_stream


def _torch_seq(op, a, b, out, group, size, gathered=None):
    """The sequential reference as PyTorch runs it: the NCCL collective and
    the GEMM on the current stream, through ``torch.distributed``'s own
    calls into `out`: as the user's own PyTorch code calls them, and no
    more host time than the functional collectives (the block's four calls
    at 2048 tokens, 4 GPUs, ``bench/seq_paths.py``: 604 against 642 µs and
    758 against 761 µs in two runs, the same device time). Its all-gather
    and reduce-scatter calls replay in CUDA graphs and run under
    ``torch.compile`` with eager's output (checked there too)."""
    if op == "ag-gemm":
        full = gathered
        if full is None:
            full = torch.empty((a.shape[0] * size, a.shape[1]), dtype=a.dtype, device=a.device)
        dist.all_gather_into_tensor(full, a, group=group)
        torch.mm(full, b, out=out)
    elif op == "gemm-rs":
        dist.reduce_scatter_tensor(out, torch.mm(a, b), group=group)
    else:
        torch.mm(a, b, out=out)
        dist.all_reduce(out, group=group)


# ------------------------------------------------- host-bound call shapes

#: Calls of each shape left out of the host watch (its set-up: the first
#: takes the synchronizing path, so the next finds the stream idle).
HOST_SKIP = 2
#: Eager calls sampled per group, over its shapes: whether the caller's
#: stream was idle when the call came.
HOST_SAMPLES = 16
#: Samples found idle, on the rank with the most, from which the group is
#: host-bound: more than a third (a loop that synchronizes every step finds
#: the step's first call idle: a quarter of the samples with four shapes a
#: step). Measured on 4 GPUs, Llama-3-70B width, eager: training at 2048
#: tokens found 8-11 of 16 idle (turned to `seq`: 1.00x, 1.10x, 1.18x
#: PyTorch; with the shapes' schedules: 0.88x-1.07x), at 8192 tokens 2-3, at
#: 16384 0; the block at 2048 tokens 5-10 (about 1.0x either way), above 0.
#: Half (9) left runs at 8 on their schedules.
HOST_IDLE = HOST_SAMPLES // 3 + 1
#: Gains (ms per call) from which a shape keeps its schedule even where the
#: host sets the pace: more than a call of ficco costs the host beyond
#: PyTorch's (measured on 4 H200s: 0.2-0.27 ms issued directly, 0.07 ms as
#: a graph replay, against a few tens of µs).
HOST_GAIN_MS = 0.25

# Per (group, op, m, k, n): the shape's calls counted by the watch.
_host_calls: Dict[tuple, int] = {}
# Per group: [samples, idle samples, verdict] with the verdict None while
# sampling, then the most idle samples of any rank (agreed by every rank).
_host_group: Dict[object, list] = {}
# Groups that made a call needing a gradient: only these are watched.
_grad_groups: set = set()
_adapt: Optional[bool] = None


def adapt_to_host(on: Optional[bool] = None) -> bool:
    """Whether ``auto`` watches the first eager calls and turns to ``seq``
    where the host sets the pace (``FICCO_ADAPT_HOST``, default on; see the
    README, "Never slower than PyTorch"). Returns the setting; ``on`` sets
    it."""
    global _adapt
    if on is not None:
        _adapt = bool(on)
    elif _adapt is None:
        _adapt = _native.adapt_host_default()
    return _adapt


def host_bound(group: Optional[dist.ProcessGroup] = None) -> Tuple[int, Optional[int]]:
    """What the host watch of `group` found: ``(samples, idle)``, with
    ``idle`` the most samples any rank found idle once every rank agreed
    (None while it samples); the group is host-bound from
    :data:`HOST_IDLE` of :data:`HOST_SAMPLES`."""
    if not _initialised():
        return 0, None
    w = _host_group.get(_resolve(group))
    return (0, None) if w is None else (w[0], w[2])


def _watch_host(group, op, m, k, n, d: "Decision", device) -> "Decision":
    """`d` (an overlapped schedule), or ``seq`` where the host, not the GPU,
    sets the pace of `group`'s calls.

    A call of ficco costs more host time than PyTorch's collective and
    matmul (its streams, events and flags, or a graph launch). Where the
    GPU waits for the host, that time is the step's, and the GPU time an
    overlap saves is not. So :data:`HOST_SAMPLES` eager calls (after each
    shape's first :data:`HOST_SKIP`) look whether the caller's stream is
    idle when they come: the GPU ran dry waiting for the host. Then every
    rank takes the same verdict from the rank that found it idle most: from
    :data:`HOST_IDLE` samples on, every shape whose gain is under
    :data:`HOST_GAIN_MS` runs ``seq`` from this call on. Only calls on the
    device's default stream count: not those under CUDA graph capture (a
    replayed graph costs the host nothing per call), nor the warm-up that
    precedes a capture, which runs on another stream (as
    ``torch.cuda.make_graphed_callables`` does; measured: its 3 eager
    iterations were host-bound and would have turned a captured step to
    ``seq``). Nor does a group that has made no call needing a gradient: a
    forward-only program (inference, ``torch.no_grad()``) is never turned.
    There a replayed call costs the host less than PyTorch's collective and
    matmul (``bench/seq_paths.py``: 67-98 against 110-170 µs a call at
    P = 4), so ``seq`` cannot relieve the host (measured: the block at 2048
    tokens ran 0.84x PyTorch where the watch turned it, 1.16-1.26x where it
    did not), while in training it can (1.06x and 1.18x turned, against 1.03x
    and 1.07x). Every rank makes the same calls in the same order, so every
    rank reaches the agreement at the same call."""
    if d.gain_ms >= HOST_GAIN_MS or not adapt_to_host() or group not in _grad_groups:
        return d
    w = _host_group.get(group)
    if w is None:
        w = _host_group[group] = [0, 0, None]
    if w[2] is None:
        stream = torch.cuda.current_stream(device)
        if torch.cuda.is_current_stream_capturing() or stream != torch.cuda.default_stream(device):
            return d
        key = (group, op, m, k, n)
        calls = _host_calls.get(key, 0) + 1
        _host_calls[key] = calls
        if calls <= HOST_SKIP:
            return d
        w[0] += 1
        w[1] += int(stream.query())
        if w[0] < HOST_SAMPLES:
            return d
        # Once per group: a small collective and a host read of its result.
        most = torch.tensor([w[1]], dtype=torch.int32, device=device)
        dist.all_reduce(most, op=dist.ReduceOp.MAX, group=group)
        w[2] = int(most.item())
    if w[2] < HOST_IDLE:
        return d
    d = d._replace(schedule="seq", basis="host-bound")
    with _lock:
        _decisions.setdefault(group, {})[(op, m, k, n)] = d
    return d


class Decision(NamedTuple):
    """What ``schedule="auto"`` runs for one call shape, and why (see the
    README, "Never slower than PyTorch")."""

    #: The schedule that runs: ``candidate``, or ``"seq"`` (PyTorch's
    #: collective and matmul where the group is on NCCL).
    schedule: str
    #: The overlapped schedule considered: the tuning cache's winner, else
    #: the rule selector's pick.
    candidate: str
    #: ``"measured"`` (the tuning cache timed it and seq) or ``"predicted"``;
    #: ``"host-bound"`` where the host watch turned the shape to ``seq``
    #: (:func:`adapt_to_host`; the gain is what was predicted or measured).
    basis: str
    seq_ms: float
    candidate_ms: float
    #: The gain that counts (a predicted gain is discounted) and what the
    #: call itself costs (copies, barriers, synchronizing set-up), in ms.
    gain_ms: float
    cost_ms: float


def _decision(sess, group, op, m, k, n) -> Decision:
    key = (op, m, k, n)
    per = _decisions.setdefault(group, {})
    d = per.get(key)
    if d is None:
        d = Decision(*sess.decide(op, m, k, n))
        per[key] = d
    return d


def _auto(sess, group, op, m, k, n, device) -> Decision:
    """What ``auto`` runs for a call of this shape: its decision
    (:func:`_decision`), turned to ``seq`` where the host sets the pace
    (:func:`_watch_host`; loopback jobs are not watched)."""
    d = _decision(sess, group, op, m, k, n)
    if d.schedule != "seq" and not sess.loopback:
        d = _watch_host(group, op, m, k, n, d, device)
    return d


def forget_decisions(group: Optional[dist.ProcessGroup] = None) -> None:
    """Forgets the ``auto`` decisions of `group`'s call shapes, and what the
    host watch counted (:func:`adapt_to_host`): the next call of each shape
    decides again, as in a new process. For a program that changes how it
    runs, e.g. from eager steps to CUDA graphs (where a call costs the host
    nothing). Every rank of the group calls it at the same point of its
    calls."""
    if not _initialised():
        return
    g = _resolve(group)
    with _lock:
        _forget(g)


def decisions(group: Optional[dist.ProcessGroup] = None) -> Dict[Tuple[str, int, int, int], Decision]:
    """The ``auto`` decisions made so far on ``group``, by ``(op, m, k, n)``."""
    if not _initialised():
        return {}
    return dict(_decisions.get(_resolve(group), {}))


def _shape(t: torch.Tensor) -> Tuple[int, ...]:
    return tuple(t.shape)


def _check_tensor(fn: str, name: str, t) -> None:
    """Type, dtype, rank and layout: what needs no process group or GPU."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{fn}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.bfloat16:
        raise TypeError(
            f"{fn}: {name} has dtype {t.dtype}; ficco ops take torch.bfloat16 "
            f"(convert with {name}.to(torch.bfloat16))"
        )
    if t.dim() != 2:
        raise ValueError(
            f"{fn}: {name} must be 2-D, got {t.dim()}-D of shape {_shape(t)} "
            f"(flatten leading dimensions with {name}.reshape(-1, {name}.shape[-1]))"
        )
    if not t.is_contiguous():
        raise ValueError(
            f"{fn}: {name} is not contiguous (strides {tuple(t.stride())}); "
            f"pass {name}.contiguous()"
        )


def _check_device(fn: str, name: str, t: torch.Tensor) -> None:
    if not t.is_cuda:
        raise ValueError(
            f"{fn}: {name} is on {t.device}; ficco ops take CUDA tensors on this "
            "process's current device (torch.cuda.current_device())"
        )
    cur = torch.cuda.current_device()
    if t.device.index != cur:
        raise ValueError(
            f"{fn}: {name} is on {t.device} but the current device is cuda:{cur}; "
            f"call torch.cuda.set_device({t.device.index}) or move {name} to cuda:{cur}"
        )


def _check_schedule_arg(fn, op, schedule, gpus, sms) -> Optional[str]:
    """``None`` for "auto", else the canonical name (``ValueError`` from the
    core's grammar, with where to find valid names)."""
    if not isinstance(schedule, str):
        raise TypeError(
            f"{fn}: schedule must be a str ('auto' or a schedule name), "
            f"got {type(schedule).__name__}"
        )
    if schedule == "auto":
        return None
    try:
        return _checked_name(op, schedule, gpus, sms)
    except ValueError as e:
        p = gpus if gpus is not None else "P"
        raise ValueError(
            f"{fn}: schedule={schedule!r}: {e}. Pass 'auto' or a name that "
            f"`ficco schedules --op {op} --gpus {p}` lists "
            f"(ficco.schedules('{op}', {p}))"
        ) from None


@functools.lru_cache(maxsize=1024)
def _checked_name(op: str, schedule: str, gpus: Optional[int], sms: Optional[int]) -> str:
    """The native grammar check (a few hundred microseconds: it enumerates
    the design space), once per distinct name: a call must cost far less."""
    return _native.check_schedule(op, schedule, gpus, sms)


def _initialised() -> bool:
    return dist.is_available() and dist.is_initialized()


def _check_initialised(fn: str) -> None:
    if not _initialised():
        raise ValueError(
            f"{fn}: torch.distributed is not initialised; call "
            "torch.distributed.init_process_group(...) first (under torchrun, "
            "init_process_group('nccl') reads the environment it sets)"
        )


def _check_cuda(fn: str) -> None:
    """A ficco session drives this process's CUDA device: say so plainly
    where PyTorch sees none (rather than PyTorch's "Found no NVIDIA
    driver" from deep inside the session's set-up)."""
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"{fn}: no CUDA device: PyTorch sees none here (torch.cuda.is_available() "
            "is False), and ficco's ops and shared tensors run on NVIDIA GPUs. Run on a "
            "GPU machine; to see which schedule ficco picks without a GPU, use the "
            "simulator: `ficco select` or `ficco explore --backend sim`"
        )


def _resolve(group):
    return dist.group.WORLD if group is None else group


# ---------------------------------------------------------------- sessions


def _group_name(group) -> str:
    name = getattr(group, "group_name", None)
    if not name:
        name = dist.distributed_c10d._get_process_group_name(group)
    return str(name)


def _timeout() -> datetime.timedelta:
    """ficco's rendezvous bound (``FICCO_DIST_TIMEOUT_MS``, default 60 s, as
    the Rust runtime parses it), used for the wait on the group's store too."""
    return datetime.timedelta(milliseconds=_native.dist_timeout_ms())


def _session(fn: str, group) -> "_native.Session":
    with _lock:
        s = _sessions.get(group)
        if s is not None:
            return s
        s = _join(fn, group)
        _sessions[group] = s
        return s


def _node_plan(
    fn: str, peers: List[Tuple[str, int, str]], rank: int
) -> Tuple[int, int, bool]:
    """This rank's ``(local_rank, local_world, loopback)`` from every rank's
    ``(hostname, device index, device uuid)``. Every rank computes the same
    decision from the same list, so a layout ficco cannot run raises on all
    of them (rather than leaving some waiting in the rendezvous)."""
    hosts = [p[0] for p in peers]
    by_host: Dict[str, List[int]] = {}
    for r, h in enumerate(hosts):
        by_host.setdefault(h, []).append(r)
    kinds = set()
    for h, ranks in by_host.items():
        uuids = [peers[r][2] for r in ranks]
        if len(ranks) == 1:
            continue
        if len(set(uuids)) == 1:
            kinds.add("shared")
        elif len(set(uuids)) == len(uuids):
            kinds.add("own")
        else:
            raise ValueError(
                f"{fn}: on host {h!r} some ranks of the group share a GPU and others do "
                "not; ficco runs one GPU per rank, or every rank of a node on one GPU "
                "(loopback)"
            )
    if len(kinds) > 1:
        raise ValueError(
            f"{fn}: some nodes run several ranks on one GPU and others one GPU per rank; "
            "ficco needs the same layout on every node"
        )
    loopback = kinds == {"shared"}
    ranks = by_host[hosts[rank]]
    return ranks.index(rank), len(ranks), loopback


def _join(fn: str, group) -> "_native.Session":
    """Joins a new session of `group`'s ranks: collective over the group."""
    rank = dist.get_rank(group)
    size = dist.get_world_size(group)
    dev = torch.cuda.current_device()
    me = (socket.gethostname(), dev, str(torch.cuda.get_device_properties(dev).uuid))
    peers: List[Tuple[str, int, str]] = [("", 0, "")] * size
    dist.all_gather_object(peers, me, group=group)
    local_rank, local_world, loopback = _node_plan(fn, peers, rank)
    if loopback and not ficco._QUEUES_IN_TIME:
        warnings.warn(
            "ficco: CUDA was initialised before `import ficco`, so the driver keeps its "
            "default 8 hardware queues; with several ranks on one GPU their waiting "
            "streams can block each other until ficco's watchdog ends the run. Import "
            "ficco first, or set CUDA_DEVICE_MAX_CONNECTIONS=32.",
            RuntimeWarning,
            stacklevel=3,
        )

    name = _group_name(group)
    count = _built.get(name, 0)
    _built[name] = count + 1
    store = dist.PrefixStore(
        f"ficco/{name}/", dist.distributed_c10d._get_default_store()
    )
    key = f"session/{count}"
    if rank == 0:
        if all(p[0] == peers[0][0] for p in peers):
            addr = "127.0.0.1"  # one node: never depends on name resolution
        elif dist.get_global_rank(group, 0) == 0 and os.environ.get("MASTER_ADDR"):
            addr = os.environ["MASTER_ADDR"]
        else:
            addr = socket.gethostname()
        try:
            # The job secret rides with the address (every ficco store
            # connection must prove it), unless the launcher set one on
            # every rank: then nothing secret crosses PyTorch's store.
            secret = "" if os.environ.get("FICCO_JOB_SECRET", "").strip() else _native.new_secret()
            value = f"{secret}:{addr}:{_native.free_port()}"
        except RuntimeError as e:
            value = f"error:{e}"
        store.set(key, value)
    else:
        try:
            store.wait([key], _timeout())
        except Exception as e:  # the store's own timeout type varies by version
            raise RuntimeError(
                f"{fn}: rank 0 of the group did not publish ficco's session address "
                f"within {_timeout().total_seconds():.0f} s (FICCO_DIST_TIMEOUT_MS): {e}"
            ) from None
        value = store.get(key).decode()
    if value.startswith("error:"):
        raise RuntimeError(f"{fn}: rank 0 of the group could not host the session: {value[6:]}")
    secret, _, addr_port = value.partition(":")
    addr, _, port = addr_port.rpartition(":")
    s = _native.Session(
        rank, size, local_rank, local_world, addr, int(port), loopback=loopback,
        device=dev, secret=secret or None,
    )
    if s.device != dev:
        # A native layer that placed this rank elsewhere than its tensors:
        # refuse rather than read another GPU's addresses.
        s.close()
        raise RuntimeError(
            f"{fn}: ficco's session drives cuda:{s.device} but this rank's current "
            f"device is cuda:{dev}"
        )
    return s


# Registers each op's backward (after the ops above exist).
from ficco import _grad  # noqa: E402
from ficco._grad import input_grads_on_ficco, keep_gathered  # noqa: E402,F401
