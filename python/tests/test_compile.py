"""ficco's ops under torch.compile and fake tensors, on the CPU.

The ops are `torch.library` custom ops (``torch.ops.ficco.*``) with fake
implementations: the compiler traces a model through them without a graph
break and without a GPU, which is what these tests check (the GPU tests
check that the compiled model computes what the eager one does).
"""

import pytest
import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode

import ficco.torch as ft


CASES = [
    # op, a's shape, b's shape, the result's shape on 4 ranks
    ("all_gather_matmul", (8, 16), (16, 32), (32, 32)),
    ("matmul_reduce_scatter", (32, 16), (16, 8), (8, 8)),
    ("matmul_all_reduce", (32, 16), (16, 8), (32, 8)),
]


@pytest.mark.parametrize("name,a,b,want", CASES, ids=[c[0] for c in CASES])
def test_fake_implementations_give_the_result_shape(name, a, b, want, world4):
    with FakeTensorMode():
        ta = torch.empty(a, dtype=torch.bfloat16)
        tb = torch.empty(b, dtype=torch.bfloat16)
        got = getattr(torch.ops.ficco, name)(ta, tb, world4, "auto")
        assert tuple(got.shape) == want and got.dtype == torch.bfloat16
        out = torch.empty(want, dtype=torch.bfloat16)
        assert getattr(torch.ops.ficco, name + "_out")(ta, tb, out, world4, "auto") is None


def test_compile_traces_a_block_without_graph_breaks(world4):
    """fullgraph=True: a graph break would raise. The backend records the
    graph and stops (running it needs GPUs)."""
    graphs = []

    class Traced(Exception):
        pass

    def backend(gm, example_inputs):
        graphs.append([str(n.target) for n in gm.graph.nodes if n.op == "call_function"])
        raise Traced()

    def block(x, w1, w2, out):
        h = ft.all_gather_matmul(x, w1)
        h = torch.relu(h)
        y = ft.matmul_reduce_scatter(h, w2, schedule="shard-copy-ring")
        ft.matmul_all_reduce(y, w2.t().contiguous(), out=out)
        return out

    x = torch.randn(8, 16).to(torch.bfloat16)
    w1 = torch.randn(16, 32).to(torch.bfloat16)
    w2 = torch.randn(32, 16).to(torch.bfloat16)
    out = torch.empty(8, 32, dtype=torch.bfloat16)
    with torch.no_grad(), pytest.raises(Exception) as e:
        torch.compile(block, backend=backend, fullgraph=True)(x, w1, w2, out)
    assert isinstance(e.value.__cause__ or e.value, Traced) or "Traced" in str(e.value)
    assert len(graphs) == 1
    ficco = [t for t in graphs[0] if t.startswith("ficco.")]
    assert ficco == [
        "ficco.all_gather_matmul",
        "ficco.matmul_reduce_scatter",
        "ficco.matmul_all_reduce_out",
    ], graphs[0]


def test_bad_input_under_compile_is_the_eager_error(world4):
    """Without fullgraph the compiler falls back to eager for the frame,
    where the check raises its usual message."""

    def f(x, w):
        return ft.all_gather_matmul(x, w)

    x = torch.randn(8, 16)  # float32
    w = torch.randn(16, 32).to(torch.bfloat16)
    with torch.no_grad(), pytest.raises(TypeError, match="a_shard has dtype torch.float32"):
        torch.compile(f, backend="eager")(x, w)


def test_decisions_are_empty_before_any_call(world4):
    assert ft.decisions() == {}
    d = ft.Decision("seq", "shard-copy-ring", "predicted", 1.0, 0.9, 0.06, 0.1)
    assert d.schedule == "seq" and d.gain_ms < d.cost_ms


def test_a_call_unlike_the_checked_one_gets_the_full_checks(world4, monkeypatch):
    """The fast path of repeated calls only takes calls that pass the same
    checks; anything else raises the full message."""
    g = dist.group.WORLD
    a, b = torch.empty(8, 16, dtype=torch.bfloat16), torch.empty(16, 32, dtype=torch.bfloat16)
    # As a checked call of this shape leaves it.
    ft._steady[("ag-gemm", g, a.shape, b.shape, "auto", True, a.get_device())] = (None, 32, 16, 32, 4, (32, 32))
    ran = []
    monkeypatch.setattr(ft, "_execute", lambda *args: ran.append(args) or "ran")
    monkeypatch.setitem(ft._sessions, g, object())
    try:
        with torch.no_grad():
            # CPU tensors: the quick checks refuse them (not on the current
            # CUDA device), so the full checks run and say why.
            with pytest.raises(ValueError, match="a_shard is on cpu"):
                ft.all_gather_matmul(a, b)
            with pytest.raises(TypeError, match="a_shard has dtype torch.float32"):
                ft.all_gather_matmul(a.float(), b)
            with pytest.raises(ValueError, match="b is not contiguous"):
                ft.all_gather_matmul(a, torch.empty(32, 16, dtype=torch.bfloat16).t())
        assert ran == []
    finally:
        ft._steady.clear()


@pytest.mark.parametrize("with_out", [False, True], ids=["new-out", "out="])
def test_a_repeated_call_skips_the_full_checks(world4, monkeypatch, with_out):
    """The second call of a checked shape takes the quick path: the full
    checks (tens of microseconds) run once per shape, not per call."""
    g = dist.group.WORLD
    a, b = torch.empty(8, 16, dtype=torch.bfloat16), torch.empty(16, 32, dtype=torch.bfloat16)
    out = torch.empty(32, 32, dtype=torch.bfloat16) if with_out else None
    full, ran = [], []
    checked = ft._run_checked
    monkeypatch.setattr(ft, "_run_checked", lambda *args: full.append(1) or checked(*args))
    # CPU stand-ins for what needs a GPU: the device checks and the session.
    monkeypatch.setattr(ft, "_check_device", lambda *args: None)
    monkeypatch.setattr(ft, "_quick_ok", lambda *args: True)
    monkeypatch.setattr(ft, "_session", lambda fn, group: ft._sessions[group])
    monkeypatch.setattr(ft, "_execute", lambda *args, **kw: ran.append(args[4:10]) or args[6])
    monkeypatch.setitem(ft._sessions, g, object())
    try:
        with torch.no_grad():
            for _ in range(3):
                got = ft.all_gather_matmul(a, b, out=out)
                assert tuple(got.shape) == (32, 32)
        assert len(full) == 1, "every call after the first must take the quick path"
        assert len(ran) == 3
        assert all(r[0] is a and r[1] is b for r in ran)
    finally:
        ft._steady.clear()
