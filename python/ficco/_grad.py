"""Autograd for ``ficco.torch``'s ops (imported by it; nothing public here).

Each op's backward is registered on its ``ficco::`` custom op
(``torch.library.register_autograd``), so eager autograd and
``torch.compile`` (AOTAutograd traces the same formula) take the same
path. A backward with communication is itself one opaque custom op
(``ficco::<op>_backward``): its collectives run asynchronously beside its
GEMMs, which a traced graph would serialize.

With ``P`` ranks, rank ``r``'s weight shard ``b_r`` ``[k, n]`` and
upstream gradient ``dc``:

=========================  =====================================  ================================
op                         input gradient                         weight gradient
=========================  =====================================  ================================
``all_gather_matmul``      ``reduce_scatter(dc @ b_rᵀ)``:          ``all_gather(a)ᵀ @ dc``: ``a``
                           ``matmul_reduce_scatter`` on ficco,     gathered again during the input
                           or ``torch.mm`` and a reduce-scatter    gradient's GEMM; the GEMM runs
                           that runs during the weight gradient    during its reduce-scatter
``matmul_reduce_scatter``  ``all_gather(dc) @ b_rᵀ``:              ``aᵀ @ all_gather(dc)``
                           ``all_gather_matmul`` on ficco (the
                           weight gradient's gather beside it),
                           or PyTorch's (one gather for both)
``matmul_all_reduce``      ``dc @ b_rᵀ`` (no communication)        ``aᵀ @ dc`` (no communication)
=========================  =====================================  ================================

One GEMM runs at a time: two GEMMs side by side each ran slower than alone
(measured: a training step's backward 3% slower on 2 H100s). The
collectives are NCCL's, asynchronous on the group's NCCL stream, each
waited for where its result is used.

``matmul_all_reduce``'s backward has no collective: its output is the same
on every rank, and every rank computes the same loss from it, so each rank's
``dc`` already is the gradient of its own partial product (Megatron's "g"
operator). A model whose ranks consume different parts of that output must
all-reduce ``dc`` itself.

**Never slower than PyTorch, in the backward too.** ficco's ops take the
weight ``[k, n]`` row-major; the input gradient needs ``b_rᵀ``, which
``torch.mm`` reads in place but ficco's op needs copied (``2·k·n`` bytes
read and written). So the input gradient runs on ficco only when the
``auto`` decision for its shape picks an overlapped schedule whose gain
covers the call's cost plus that copy (:data:`TRANSPOSE_BYTES_PER_MS`);
else PyTorch's sequential backward runs (NCCL, and ``torch.mm`` on the
transposed view). A schedule forced on the forward call applies to the
forward only; the backward's ops are ``auto``.
"""

from __future__ import annotations

import os
from typing import List, Optional, Tuple

import torch
import torch.distributed as dist

from ficco import torch as ft

#: What a weight transpose (``b.t().contiguous()``) moves per ms, bytes read
#: plus written: 0.6 TB/s, measured on H100 (a [8192, 5120] bf16 transpose
#: took 0.28 ms in a profiled training step; PyTorch's strided copy is far
#: from HBM bandwidth). Used only to price it.
TRANSPOSE_BYTES_PER_MS = 6e8

def _nccl(group) -> bool:
    return dist.get_backend(group) == "nccl"


def all_gather(shard: torch.Tensor, group) -> torch.Tensor:
    """``all_gather(shard, dim 0)`` on the current stream. On gloo (the
    loopback tests' group: every rank on one GPU) through host copies."""
    size = dist.get_world_size(group)
    if _nccl(group):
        full = shard.new_empty((shard.shape[0] * size, shard.shape[1]))
        dist.all_gather_into_tensor(full, shard, group=group)
        return full
    parts = [torch.empty(shard.shape, dtype=torch.float32) for _ in range(size)]
    dist.all_gather(parts, shard.float().cpu(), group=group)
    return torch.cat(parts).to(device=shard.device, dtype=shard.dtype)


def reduce_scatter(full: torch.Tensor, group) -> torch.Tensor:
    """This rank's rows of ``sum over ranks(full)`` (gloo: an all-reduce of
    a host copy, and the rows)."""
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    rows = full.shape[0] // size
    if _nccl(group):
        out = full.new_empty((rows, full.shape[1]))
        dist.reduce_scatter_tensor(out, full.contiguous(), group=group)
        return out
    host = full.float().cpu()
    dist.all_reduce(host, group=group)
    return host[rank * rows:(rank + 1) * rows].to(device=full.device, dtype=full.dtype)


class _Done:
    """The handle of a collective that already ran (gloo: synchronous)."""

    def wait(self) -> None:
        pass


def all_gather_async(shard: torch.Tensor, group):
    """``(full, handle)``: the gather is queued on the group's NCCL stream
    after the current stream's work so far; ``handle.wait()`` makes the
    current stream wait for it. Nothing may read ``full`` before that."""
    if not _nccl(group):
        return all_gather(shard, group), _Done()
    size = dist.get_world_size(group)
    full = shard.new_empty((shard.shape[0] * size, shard.shape[1]))
    return full, dist.all_gather_into_tensor(full, shard, group=group, async_op=True)


def reduce_scatter_async(full: torch.Tensor, group):
    """``(out, handle)``, as :func:`all_gather_async`."""
    if not _nccl(group):
        return reduce_scatter(full, group), _Done()
    rows = full.shape[0] // dist.get_world_size(group)
    out = full.new_empty((rows, full.shape[1]))
    return out, dist.reduce_scatter_tensor(out, full.contiguous(), group=group, async_op=True)


def _on_ficco(op: str, x: torch.Tensor, b: torch.Tensor, group) -> bool:
    """Whether the input gradient (`op` on `x` and `b`ᵀ) runs on ficco: see
    the module's doc. Loopback jobs always do (gloo has no device
    collectives)."""
    sess = ft._session(f"ficco.torch.{ft._OPS[op]} (backward)", group)
    if sess.loopback:
        return True
    size = dist.get_world_size(group)
    m = x.shape[0] * size if op == "ag-gemm" else x.shape[0]
    # The op computes x @ bᵀ: its k is b's n, its n is b's k.
    d = ft._decision(sess, group, op, m, b.shape[1], b.shape[0])
    copy_ms = 2 * b.numel() * b.element_size() / TRANSPOSE_BYTES_PER_MS
    return d.schedule != "seq" and d.gain_ms > d.cost_ms + copy_ms


def _ficco_op(op: str, x: torch.Tensor, b: torch.Tensor, group) -> torch.Tensor:
    """`op` of `x` and `b`ᵀ on ficco (``auto``), `b` transposed by a copy."""
    return ft._run(op, "a", x, b.t().contiguous(), group, "auto", None)


def ag_mm_backward(
    dc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, group, need_a: bool, need_b: bool,
    kept: bool = False,
) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
    """Gradients of ``c = all_gather(a) @ b``: ``(da, db)``, None where not
    needed. `kept`: `a` is the gathered operand the forward kept
    (:func:`keep_gathered`), else this rank's shard."""
    dc = dc.contiguous()
    da = db = None
    full, gathered = (a, _Done()) if kept or not need_b else all_gather_async(a, group)
    scattered = _Done()
    if need_a:
        if _on_ficco("gemm-rs", dc, b, group):
            da = _ficco_op("gemm-rs", dc, b, group)
        else:
            # The reduce-scatter runs during the weight gradient's GEMM.
            da, scattered = reduce_scatter_async(torch.mm(dc, b.t()), group)
    if need_b:
        gathered.wait()
        db = torch.mm(full.t(), dc)
    scattered.wait()
    return da, db


def mm_rs_backward(
    dc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, group, need_a: bool, need_b: bool
) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
    """Gradients of ``c = reduce_scatter(a @ b)``: ``(da, db)``."""
    dc = dc.contiguous()
    if need_a and _on_ficco("ag-gemm", dc, b, group):
        # ficco gathers dc inside its op (on the copy engines); the weight
        # gradient's gather runs beside it (the op does not hand its
        # gathered operand out).
        full, gathered = all_gather_async(dc, group) if need_b else (None, _Done())
        da = _ficco_op("ag-gemm", dc, b, group)
        db = None
        if need_b:
            gathered.wait()
            db = torch.mm(a.t(), full)
        return da, db
    # PyTorch's own: one gather serves both GEMMs.
    full = all_gather(dc, group)
    da = torch.mm(full, b.t()) if need_a else None
    db = torch.mm(a.t(), full) if need_b else None
    return da, db


_BACKWARD = {"ag-gemm": ag_mm_backward, "gemm-rs": mm_rs_backward}

_keep = os.environ.get("FICCO_KEEP_GATHERED", "0") == "1"


def keep_gathered(on: Optional[bool] = None) -> bool:
    """Whether ``all_gather_matmul`` keeps its gathered operand for the
    weight gradient (``FICCO_KEEP_GATHERED=1``), else the backward gathers
    it again (the default: measured faster, and it holds less memory; see
    the README, "Training"). Returns the setting; ``on`` sets it."""
    global _keep
    if on is not None:
        _keep = bool(on)
    return _keep


def _register_keep() -> None:
    """``ficco::all_gather_matmul_keep(a, b, group_name, schedule) ->
    [c, all_gather(a)]``: the forward of ``all_gather_matmul`` where the
    weight gradient will need the gathered ``a``. PyTorch's sequential
    forward gathers ``a`` and keeps it for the same reason; here the
    gather is an NCCL all-gather beside ficco's overlapped op, which
    cannot hand out its own gathered copy."""

    @torch.library.custom_op("ficco::all_gather_matmul_keep", mutates_args=())
    def keep_op(a: torch.Tensor, b: torch.Tensor, group_name: str, schedule: str) -> List[torch.Tensor]:
        group = ft._group_of(group_name)
        full, gathered = all_gather_async(a, group)
        c = ft._run("ag-gemm", "a_shard", a, b, group, schedule, None)
        gathered.wait()
        return [c, full]

    @keep_op.register_fake
    def _(a, b, group_name, schedule):
        size = ft._group_of(group_name).size()
        return [a.new_empty((a.shape[0] * size, b.shape[1])), a.new_empty((a.shape[0] * size, a.shape[1]))]

    def setup_context(ctx, inputs, output):
        _a, b, group_name, _schedule = inputs
        ctx.save_for_backward(output[1], b)
        ctx.group_name = group_name
        ctx.mark_non_differentiable(output[1])

    def backward(ctx, grads):
        dc = grads[0]  # the kept operand has no gradient
        full, b = ctx.saved_tensors
        need_a, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        da, db = torch.ops.ficco.all_gather_matmul_backward(
            dc, full, b, ctx.group_name, need_a, need_b, True
        )
        return (da if need_a else None), (db if need_b else None), None, None

    torch.library.register_autograd("ficco::all_gather_matmul_keep", backward, setup_context=setup_context)


def _register(op: str) -> None:
    name = ft._OPS[op]
    impl = _BACKWARD.get(op)

    if impl is not None:

        @torch.library.custom_op(f"ficco::{name}_backward", mutates_args=())
        def backward_op(
            dc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, group_name: str,
            need_a: bool, need_b: bool, kept: bool = False,
        ) -> List[torch.Tensor]:
            group = ft._group_of(group_name)
            if kept:
                da, db = impl(dc, a, b, group, need_a, need_b, kept=True)
            else:
                da, db = impl(dc, a, b, group, need_a, need_b)
            # A custom op returns tensors: an empty one stands for "not needed".
            return [a.new_empty(0) if da is None else da, b.new_empty(0) if db is None else db]

        @backward_op.register_fake
        def _(dc, a, b, group_name, need_a, need_b, kept=False):
            # With `kept`, `a` is the gathered operand: da is a shard of it.
            rows = a.shape[0] // ft._group_of(group_name).size() if kept else a.shape[0]
            return [a.new_empty((rows, a.shape[1]) if need_a else 0),
                    b.new_empty(b.shape if need_b else 0)]

    def setup_context(ctx, inputs, output):
        a, b, group_name, _schedule = inputs
        ctx.save_for_backward(a, b)
        ctx.group_name = group_name

    def backward(ctx, dc):
        a, b = ctx.saved_tensors
        need_a, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if impl is None:
            # matmul_all_reduce: no collective (see the module's doc).
            da = torch.mm(dc, b.t()) if need_a else None
            db = torch.mm(a.t(), dc) if need_b else None
        else:
            da, db = getattr(torch.ops.ficco, f"{name}_backward")(
                dc, a, b, ctx.group_name, need_a, need_b
            )
            da, db = (da if need_a else None), (db if need_b else None)
        return da, db, None, None

    torch.library.register_autograd(f"ficco::{name}", backward, setup_context=setup_context)


for _op in ft._OPS:
    _register(_op)
_register_keep()
