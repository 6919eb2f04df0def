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
``all_gather_matmul``      ``reduce_scatter(dc @ b_rᵀ)``:          ``all_gather(a)ᵀ @ dc``: the
                           ``matmul_reduce_scatter`` on ficco,     gathered ``a`` the forward op
                           or ``torch.mm`` and a reduce-scatter    handed back, or ``a`` gathered
                           that runs during the weight gradient    again during the input gradient's
                                                                   GEMM (:func:`keep_gathered`)
``matmul_reduce_scatter``  ``all_gather(dc) @ b_rᵀ``:              ``aᵀ @ all_gather(dc)``: the
                           ``all_gather_matmul`` on ficco,         ``dc`` the input gradient's op
                           or PyTorch's (one gather for both)      handed back
``matmul_all_reduce``      ``dc @ b_rᵀ`` (no communication)        ``aᵀ @ dc`` (no communication)
=========================  =====================================  ================================

One GEMM runs at a time: two GEMMs side by side each ran slower than alone
(measured: a training step's backward 3% slower on 2 H100s). The
collectives are NCCL's, PyTorch's functional ones (on the group's NCCL
stream, so that they run while the current stream goes on), each waited
for where its result is used.

``matmul_all_reduce``'s backward has no collective: its output is the same
on every rank, and every rank computes the same loss from it, so each rank's
``dc`` already is the gradient of its own partial product (Megatron's "g"
operator). A model whose ranks consume different parts of that output must
all-reduce ``dc`` itself.

**Never slower than PyTorch, in the backward too.** The input gradient
reads the forward's weight ``[k, n]`` as the op's B transposed, in place
(cuBLASLt transposes it; no copy). It runs on ficco where ``auto``'s
decision for its shape picks an overlapped schedule (whose gain covers
the call's cost) that can read a transposed B (not ``tile``, grouped or
ficco's own GEMMs); else PyTorch's sequential backward runs it (NCCL, and
``torch.mm`` on the transposed view). A schedule forced on the forward
call applies to the forward only; the backward's ops are ``auto``.

Both input gradients run on ficco, ``all_gather_matmul``'s too, although
PyTorch's path could hide its reduce-scatter behind the weight gradient's
GEMM (``T_gemm + max(T_rs, T_wgrad)``, against ficco's ``T_fused +
T_wgrad``). Leaving that one to PyTorch was measured slower: a 2-block
training step on 4 H200s lost 0.8-1.6% against running it on ficco (2048
tokens under CUDA graphs, 8192 eager and under graphs; ``bench/RESULTS.md``,
ninth session).
"""

from __future__ import annotations

from typing import List, Optional, Tuple, Union

import torch
import torch.distributed as dist

from ficco import torch as ft


def _nccl(group) -> bool:
    return dist.get_backend(group) == "nccl"


# PyTorch's functional collectives: C++ ops (as its own autograd collectives
# and compiled code call them). In the backward, the `torch.distributed`
# calls cost 170-300 µs of host each (measured: a training step at 2048
# tokens on 4 H200s, 8 such calls in its backward), the functional ones a
# few tens. (In the forward the two cost about the same: ficco.torch's
# sequential fallback calls `torch.distributed`; bench/seq_paths.py.)
_fc = torch.ops._c10d_functional


def all_gather(shard: torch.Tensor, group) -> torch.Tensor:
    """``all_gather(shard, dim 0)``, ordered on the current stream. On gloo
    (the loopback tests' group: every rank on one GPU) through host copies."""
    if _nccl(group):
        full, handle = all_gather_async(shard, group)
        handle.wait()
        return full
    size = dist.get_world_size(group)
    parts = [torch.empty(shard.shape, dtype=torch.float32) for _ in range(size)]
    dist.all_gather(parts, shard.float().cpu(), group=group)
    return torch.cat(parts).to(device=shard.device, dtype=shard.dtype)


def reduce_scatter(full: torch.Tensor, group) -> torch.Tensor:
    """This rank's rows of ``sum over ranks(full)`` (gloo: an all-reduce of
    a host copy, and the rows)."""
    if _nccl(group):
        out, handle = reduce_scatter_async(full, group)
        handle.wait()
        return out
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    rows = full.shape[0] // size
    host = full.float().cpu()
    dist.all_reduce(host, group=group)
    return host[rank * rows:(rank + 1) * rows].to(device=full.device, dtype=full.dtype)


class _Done:
    """The handle of a collective that already ran (gloo: synchronous)."""

    def wait(self) -> None:
        pass


class _Pending:
    """The handle of a functional collective: it runs on the group's NCCL
    stream, after the current stream's work at its issue and beside the
    current stream's later work; ``wait()`` makes the current stream wait
    for it (``wait_tensor``). It holds the collective's input until then: a
    temporary freed earlier would return to the current stream's pool while
    the collective still reads it, and the next allocation there (the
    weight gradient's output) would overwrite it."""

    def __init__(self, result: torch.Tensor, *held):
        self.result, self.held = result, held

    def wait(self) -> None:
        if self.result is not None:
            _fc.wait_tensor(self.result)
        self.result, self.held = None, ()


def all_gather_async(shard: torch.Tensor, group):
    """``(full, handle)``: the gather runs beside the current stream's later
    work; ``handle.wait()`` makes the current stream wait for it. Nothing
    may read ``full`` before that."""
    if not _nccl(group):
        return all_gather(shard, group), _Done()
    full = _fc.all_gather_into_tensor(shard, dist.get_world_size(group), group.group_name)
    return full, _Pending(full, shard)


def reduce_scatter_async(full: torch.Tensor, group):
    """``(out, handle)``, as :func:`all_gather_async`."""
    if not _nccl(group):
        return reduce_scatter(full, group), _Done()
    full = full.contiguous()
    out = _fc.reduce_scatter_tensor(full, "sum", dist.get_world_size(group), group.group_name)
    return out, _Pending(out, full)


# Input-gradient shapes whose schedule cannot read a transposed weight
# (tile, grouped or ficco's own GEMMs): PyTorch's backward runs them.
_refused = set()


def _input_grad(
    op: str, x: torch.Tensor, w: torch.Tensor, group, gather: bool = False
) -> Optional[Tuple[torch.Tensor, Optional[torch.Tensor]]]:
    """`op` of `x` and `w`ᵀ on ficco (`w` read transposed in place: the
    forward's weight ``[k, n]`` is the op's B stored ``[n, k]``), with the
    gathered `x` where `gather` (ag-gemm); or None where PyTorch's backward
    should run it: :func:`input_grads_on_ficco` is off, `auto` decided
    ``seq`` (the gain does not cover the call's cost), or the schedule
    cannot read a transposed B. Loopback jobs
    always run ficco (gloo has no device collectives)."""
    if not input_grads_on_ficco():
        return None
    fn = f"ficco.torch.{ft._OPS[op]} (backward)"
    sess = ft._session(fn, group)
    size = dist.get_world_size(group)
    m = x.shape[0] * size if op == "ag-gemm" else x.shape[0]
    k, n = w.shape[1], w.shape[0]
    key = (op, m, k, n, group)
    if key in _refused:
        return None
    name = None  # auto: loopback picks among the schedules it can run
    if not sess.loopback:
        d = ft._auto(sess, group, op, m, k, n, x.device)
        if d.schedule == "seq":
            return None
        name = d.schedule
    out = x.new_empty((m // size if op == "gemm-rs" else m, n))
    full = x.new_empty((m, x.shape[1])) if gather else None
    try:
        ft._execute(op, group, sess, name, x, w, out, m, k, n, size, b_transposed=True, gathered=full)
        return out, full
    except ValueError:
        # Refused before anything ran, alike on every rank (same plan).
        _refused.add(key)
        return None


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
        ran = _input_grad("gemm-rs", dc, b, group)
        if ran is not None:
            da = ran[0]
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
    if need_a:
        # ficco's op hands back the dc it gathers: the weight gradient's.
        ran = _input_grad("ag-gemm", dc, b, group, gather=need_b)
        if ran is not None:
            da, full = ran
            return da, (torch.mm(a.t(), full) if need_b else None)
    # PyTorch's own: one gather serves both GEMMs.
    full = all_gather(dc, group)
    da = torch.mm(full, b.t()) if need_a else None
    db = torch.mm(a.t(), full) if need_b else None
    return da, db


_BACKWARD = {"ag-gemm": ag_mm_backward, "gemm-rs": mm_rs_backward}

_keep: Union[str, bool, None] = None  # None: FICCO_KEEP_GATHERED not read yet


def keep_gathered(on: Union[str, bool, None] = None) -> Union[str, bool]:
    """Whether ``all_gather_matmul`` keeps the gathered operand its forward
    op hands back, for the weight gradient (no gather in the backward for
    it, and the memory PyTorch's forward holds too), or the backward
    gathers it again (less memory): ``True``, ``False``, or ``"auto"`` (the
    default, ``FICCO_KEEP_GATHERED``): keep, on any number of ranks.
    Gathering again made a training step 0.2-2% slower on 4 GPUs, and on 2
    H100s 0-1% slower at 2048 tokens under graphs and compile, within 1%
    either way at 8192 (``bench/RESULTS.md``, ninth and twelfth sessions).
    Returns the setting; ``on`` sets it."""
    global _keep
    if on is not None:
        if not (isinstance(on, bool) or on == "auto"):
            raise ValueError(f"keep_gathered: on must be 'auto', True or False, not {on!r}")
        _keep = on
    elif _keep is None:
        found = ft._native.keep_gathered_default()
        _keep = "auto" if found is None else found
    return _keep


def keeps_gathered(group) -> bool:
    """Whether ``all_gather_matmul`` on `group` keeps its gathered operand
    (:func:`keep_gathered`; ``"auto"`` keeps)."""
    k = keep_gathered()
    return k if isinstance(k, bool) else True


_on_ficco = True


def input_grads_on_ficco(on: Optional[bool] = None) -> bool:
    """Whether the backward may run an input gradient as ficco's op (where
    ``auto`` picks an overlapped schedule for its shape: the default), or
    always as PyTorch's backward does: the GEMM, then its collective beside
    the weight gradient's GEMM. Returns the setting;
    ``on`` sets it."""
    global _on_ficco
    if on is not None:
        _on_ficco = bool(on)
    return _on_ficco


def _register_keep() -> None:
    """``ficco::all_gather_matmul_keep(a, b, group_name, schedule) ->
    [c, all_gather(a)]``: the forward of ``all_gather_matmul`` where the
    weight gradient will need the gathered ``a``: ficco's op hands back
    the ``a`` it gathers (as PyTorch's sequential forward keeps its
    gathered input)."""

    @torch.library.custom_op("ficco::all_gather_matmul_keep", mutates_args=())
    def keep_op(a: torch.Tensor, b: torch.Tensor, group_name: str, schedule: str) -> List[torch.Tensor]:
        group = ft._group_of(group_name)
        full = a.new_empty((a.shape[0] * dist.get_world_size(group), a.shape[1]))
        c = ft._run("ag-gemm", "a_shard", a, b, group, schedule, None, gathered=full)
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
