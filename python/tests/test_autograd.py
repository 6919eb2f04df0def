"""The ops' backward wiring, on the CPU: two gloo processes compute each op's
gradients through ``ficco.torch`` (autograd registered on the custom ops,
``ficco._grad``'s formulas) and compare them with float64 autograd of the
whole job's computation, which every process rebuilds from every rank's
inputs.

What runs the forward and backward ops is replaced by a CPU stand-in (the
sequential reference on gloo, ``_run`` and ``_execute``), and the session by
one whose decision is given: the input gradient then takes ficco's op
(``gain``), PyTorch's sequential backward (``seq``), or PyTorch's after the
schedule refused a transposed B (``refused``), or PyTorch's although ficco's
op would gain (``off``: ``input_grads_on_ficco(False)``). All are checked. A wrong operand,
transpose or collective in a formula gives an error of order 1; bf16
rounding, ~1e-2. The GPU tests check the same gradients with the real ops.
"""

import json
import os

import pytest
import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode

import ficco.torch as ft
from ficco import _grad

WORLD = 2
M, K, N = 8, 6, 4
TOLERANCE = 3e-2


class Session:
    loopback = False

    def __init__(self, decision):
        self.decision = decision
        self.decided = []

    def decide(self, op, m, k, n):
        self.decided.append((op, m, k, n))
        name = {"seq": "seq", "gain": "shard-copy-ring", "refused": "tile-copy-ring",
                "off": "shard-copy-ring"}[self.decision]
        return (name, "shard-copy-ring", "measured", 1.0, 0.5, 0.5, 0.01)


def cpu_run(calls):
    """A stand-in for ``ft._run``: the op's sequential reference on gloo."""

    def run(op, a_name, a, b, group, schedule, out, gathered=None):
        calls.append((op, tuple(a.shape), tuple(b.shape)))
        assert a.is_contiguous() and b.is_contiguous()
        if op == "ag-gemm":
            full = _grad.all_gather(a, group)
            if gathered is not None:
                gathered.copy_(full)
            return torch.mm(full, b)
        c = torch.mm(a.float(), b.float())
        if op == "gemm-rs":
            return _grad.reduce_scatter(c, group).to(torch.bfloat16)
        dist.all_reduce(c, group=group)
        return c.to(torch.bfloat16)

    return run


def cpu_execute(calls):
    """A stand-in for ``ft._execute``, which the input gradients call with
    the forward's weight as B transposed."""
    run = cpu_run([])

    def execute(op, group, sess, name, a, b, out, m, k, n, size, b_transposed=False, gathered=None):
        calls.append((op, tuple(a.shape), tuple(b.shape), b_transposed))
        if name.startswith("tile"):
            raise ValueError(f"schedule {name} cannot take a transposed b")
        assert (k, n) == ((b.shape[1], b.shape[0]) if b_transposed else tuple(b.shape))
        b = (b.t() if b_transposed else b).contiguous()
        out.copy_(run(op, "a", a, b, group, name, None, gathered=gathered))
        return out

    return execute


def inputs(q):
    g = torch.Generator().manual_seed(20 + q)
    return {
        "a_full": torch.randn(M, K, generator=g, dtype=torch.float64),
        "b": torch.randn(K, N, generator=g, dtype=torch.float64),
        # The weights of each rank's loss, sum(w * c): gives a dc per rank.
        "w_ag": torch.randn(M, N, generator=g, dtype=torch.float64),
        "w_rs": torch.randn(M // WORLD, N, generator=g, dtype=torch.float64),
        "w_ar": torch.randn(M, N, generator=g, dtype=torch.float64),
    }


def shard(t, q):
    rows = t.shape[0] // WORLD
    return t[q * rows:(q + 1) * rows]


def reference(op, r):
    """Float64 gradients of the job's loss (the sum of every rank's) with
    respect to rank r's a and b."""
    ins = [inputs(q) for q in range(WORLD)]
    a = [(shard(i["a_full"], q) if op == "ag-gemm" else i["a_full"]).clone().requires_grad_() for q, i in enumerate(ins)]
    b = [i["b"].clone().requires_grad_() for i in ins]
    loss = 0
    if op == "ag-gemm":
        full = torch.cat(a)
        for q in range(WORLD):
            loss = loss + (ins[q]["w_ag"] * (full @ b[q])).sum()
    elif op == "gemm-rs":
        total = sum(a[q] @ b[q] for q in range(WORLD))
        for q in range(WORLD):
            loss = loss + (ins[q]["w_rs"] * shard(total, q)).sum()
    else:
        # Every rank holds the same all-reduced output and computes the same
        # loss from it (the replicated case the docs describe): once.
        total = sum(a[q] @ b[q] for q in range(WORLD))
        loss = (ins[0]["w_ar"] * total).sum()
    loss.backward()
    return a[r].grad, b[r].grad


def worker(rank, port, out_dir, decision, keep):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    group = dist.group.WORLD
    calls = []
    ft._run = cpu_run(calls)
    ft._execute = cpu_execute(calls)
    ft._sessions[group] = sess = Session(decision)
    _grad.keep_gathered(keep)
    # "off": a gain, but the input gradients never run as ficco's op.
    _grad.input_grads_on_ficco(decision != "off")
    i = inputs(rank)
    rows = {}
    for op, f in (("ag-gemm", ft.all_gather_matmul), ("gemm-rs", ft.matmul_reduce_scatter),
                  ("gemm-ar", ft.matmul_all_reduce)):
        calls.clear()
        a0 = shard(i["a_full"], rank) if op == "ag-gemm" else i["a_full"]
        a = a0.to(torch.bfloat16).requires_grad_()
        b = i["b"].to(torch.bfloat16).requires_grad_()
        # gemm-ar: every rank computes the same loss from the replicated
        # output (rank 0's weights), the case its backward assumes.
        w = {"ag-gemm": i["w_ag"], "gemm-rs": i["w_rs"], "gemm-ar": inputs(0)["w_ar"]}[op]
        c = f(a, b)
        loss = (w.float() * c.float()).sum()
        loss.backward()
        want_a, want_b = reference(op, rank)
        err = lambda got, want: float((got.double() - want).norm() / want.norm())  # noqa: E731
        rows[op] = {
            "err_a": err(a.grad, want_a),
            "err_b": err(b.grad, want_b),
            "calls": calls[:],
        }
    rows["decided"] = sess.decided
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(rows, f)
    dist.destroy_process_group()


@pytest.mark.parametrize("keep", [True, False], ids=["keep", "regather"])
@pytest.mark.parametrize("decision", ["gain", "seq", "refused", "off"])
def test_gradients_match_float64_autograd_of_the_whole_job(decision, keep, gloo_job):
    for r, rows in enumerate(gloo_job(worker, WORLD, decision, keep)):
        for op in ("ag-gemm", "gemm-rs", "gemm-ar"):
            row = rows[op]
            assert row["err_a"] < TOLERANCE and row["err_b"] < TOLERANCE, (r, op, row)
        # The forward op, then the input gradient as the other op on ficco's
        # path (the forward's weight [k, n] as B transposed) or nothing more
        # (PyTorch's backward).
        fwd_ag, fwd_rs = ["ag-gemm", [M // WORLD, K], [K, N]], ["gemm-rs", [M, K], [K, N]]
        if decision in ("gain", "refused"):
            # (A refused call raised before it ran; PyTorch's backward ran it.)
            assert rows["ag-gemm"]["calls"] == [fwd_ag, ["gemm-rs", [M, N], [K, N], True]]
            assert rows["gemm-rs"]["calls"] == [fwd_rs, ["ag-gemm", [M // WORLD, N], [K, N], True]]
        else:
            assert rows["ag-gemm"]["calls"] == [fwd_ag]
            assert rows["gemm-rs"]["calls"] == [fwd_rs]
        assert rows["gemm-ar"]["calls"] == [["gemm-ar", [M, K], [K, N]]]
        # Decided once per backward shape: the input gradient's op, [m, k=n, n=k]
        # (nothing to decide where the input gradients stay on PyTorch).
        want = [] if decision == "off" else [["gemm-rs", M, N, K], ["ag-gemm", M, N, K]]
        assert rows["decided"] == want


@pytest.mark.parametrize("name", ["all_gather_matmul_backward", "matmul_reduce_scatter_backward"])
def test_backward_ops_fake_shapes(name, world4):
    with FakeTensorMode():
        dc = torch.empty(32, 8, dtype=torch.bfloat16)
        a = torch.empty(8, 16, dtype=torch.bfloat16)
        b = torch.empty(16, 8, dtype=torch.bfloat16)
        da, db = getattr(torch.ops.ficco, name)(dc, a, b, world4, True, True)
        assert da.shape == a.shape and db.shape == b.shape
        da, db = getattr(torch.ops.ficco, name)(dc, a, b, world4, False, True)
        assert da.numel() == 0 and db.shape == b.shape


def test_compile_traces_forward_and_backward_through_the_ops(world4):
    """AOTAutograd traces the backward formula: the backward graph holds
    the backward custom ops (and gemm-ar's plain matmuls), no graph break."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append([str(n.target) for n in gm.graph.nodes if n.op == "call_function"])
        return gm

    from torch._functorch.aot_autograd import aot_module_simplified

    def aot(gm, example_inputs):
        return aot_module_simplified(gm, example_inputs, fw_compiler=backend, bw_compiler=backend)

    def block(x, w1, w2):
        h = torch.relu(ft.all_gather_matmul(x, w1))
        return ft.matmul_reduce_scatter(h, w2)

    _grad.keep_gathered(True)

    with FakeTensorMode(allow_non_fake_inputs=True):
        x = torch.empty(8, 16, dtype=torch.bfloat16, requires_grad=True)
        w1 = torch.empty(16, 32, dtype=torch.bfloat16, requires_grad=True)
        w2 = torch.empty(32, 16, dtype=torch.bfloat16, requires_grad=True)
        y = torch.compile(block, backend=aot, fullgraph=True)(x, w1, w2)
        y.sum().backward()
    assert len(graphs) == 2, graphs
    fwd, bwd = graphs
    # all_gather_matmul keeps the gathered operand its op hands back.
    assert [t for t in fwd if t.startswith("ficco.")] == [
        "ficco.all_gather_matmul_keep.default", "ficco.matmul_reduce_scatter.default"], fwd
    assert [t for t in bwd if t.startswith("ficco.")] == [
        "ficco.matmul_reduce_scatter_backward.default",
        "ficco.all_gather_matmul_backward.default"], bwd


def test_keep_gathered_auto_keeps(world4):
    before = _grad.keep_gathered()
    try:
        _grad.keep_gathered("auto")
        assert _grad.keeps_gathered(dist.group.WORLD)  # 4 ranks
        _grad.keep_gathered(False)
        assert not _grad.keeps_gathered(dist.group.WORLD)
        with pytest.raises(ValueError, match="keep_gathered"):
            _grad.keep_gathered("yes")
        assert _grad.keep_gathered() is False
    finally:
        _grad.keep_gathered(before)
