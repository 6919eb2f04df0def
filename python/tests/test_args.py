"""The package imports and checks its arguments, on the CPU (CI has no GPU).

Every bad argument must raise a Python exception whose message names the
argument and what to do, before anything reaches the native library; the
native layer's own checks (schedule grammar, session arguments) raise
ValueError with the Rust library's message.
"""

import os
import re
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import ficco
import ficco.torch as ft

OPS = [
    ("ag-gemm", ft.all_gather_matmul, "a_shard"),
    ("gemm-rs", ft.matmul_reduce_scatter, "a"),
    ("gemm-ar", ft.matmul_all_reduce, "a"),
]
FN = {op: f"ficco.torch.{f.__name__}" for op, f, _ in OPS}
ids = [op for op, _, _ in OPS]


def bf16(*shape):
    return torch.randn(*shape).to(torch.bfloat16)


@pytest.fixture
def no_pg():
    if dist.is_initialized():
        dist.destroy_process_group()
    yield


@pytest.fixture
def world1():
    """A world-1 gloo process group (a real one, in this process)."""
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture
def world2():
    """A world-2 group in one process: PyTorch's fake backend (collectives do
    nothing), enough for the checks that need the group size."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    yield
    dist.destroy_process_group()


# ------------------------------------------------------------- the package


def test_import_and_version_match_the_crate():
    cargo = (Path(__file__).resolve().parents[1] / "Cargo.toml").read_text()
    want = re.search(r'^version = "([^"]+)"', cargo, re.M).group(1)
    assert ficco.version() == want
    assert ficco.__version__ == want
    assert ficco._native.__name__ == "ficco._native"


def run_py(code, **env):
    import subprocess
    import sys

    e = {k: v for k, v in os.environ.items() if k != "CUDA_DEVICE_MAX_CONNECTIONS"}
    e.update(env)
    return subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, check=True).stdout


def test_import_asks_for_more_hardware_queues_unless_the_user_chose():
    show = "import os, ficco; print(os.environ['CUDA_DEVICE_MAX_CONNECTIONS'], ficco._QUEUES_IN_TIME)"
    assert run_py(show).split() == ["32", "True"]
    assert run_py(show, CUDA_DEVICE_MAX_CONNECTIONS="4").split() == ["4", "True"]
    # After PyTorch initialised CUDA the setting comes too late, which is remembered.
    late = "import torch; torch.cuda.is_initialized = lambda: True; " + show
    assert run_py(late).split() == ["32", "False"]


def test_free_port_is_a_bindable_port():
    port = ficco.free_port()
    assert isinstance(port, int) and 1 <= port <= 65535
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


# ------------------------------------------------------- schedule names


@pytest.mark.parametrize("op", ids)
@pytest.mark.parametrize("gpus", [2, 4, 8])
def test_every_listed_schedule_checks_to_itself(op, gpus):
    names = ficco.schedules(op, gpus, controls=True)
    assert names[0] == "seq"
    assert "shard-copy-ring" in names
    assert len(names) == len(set(names))
    for name in names:
        assert ficco.check_schedule(op, name, gpus) == name


def test_the_listing_has_what_the_cli_lists():
    # `ficco schedules --op gemm-rs --gpus 2` lists the fused tile schedule
    # only on 2 GPUs (tile -acc), and ag-gemm never has -acc.
    assert "tile-copy-ring-acc" in ficco.schedules("gemm-rs", 2)
    assert "tile-copy-ring-acc" not in ficco.schedules("gemm-rs", 4)
    assert not any("-acc" in s for s in ficco.schedules("ag-gemm", 4, controls=True))
    plain = ficco.schedules("ag-gemm", 4)
    assert not any("-own" in s for s in plain)
    assert any("-own" in s for s in ficco.schedules("ag-gemm", 4, controls=True))


@pytest.mark.parametrize(
    "op,name,gpus,sms,message",
    [
        ("ag-gemm", "nonsense", None, None,
         "bad schedule name 'nonsense': expected 'seq' or a name starting with shard-, bulk-, fineC- or tile-"),
        ("ag-gemm", "fine3-copy-ring", None, None, "fine3: the chunk count must be one of [2, 4, 8]"),
        ("ag-gemm", "shard-copy-ring-acc", None, None, "ag-gemm has no such schedule"),
        ("gemm-rs", "shard-copy-ring-cta8", None, None, "copy-engine schedules make no NCCL calls"),
        ("gemm-rs", "shard-nccl-ring-sm200", None, None, "-sm200: the SM target must be 1 to 132"),
        ("gemm-rs", "shard-nccl-ring-sm200", None, 100, "-sm200: the SM target must be 1 to 100"),
        ("gemm-rs", "tile-copy-ring-acc", 4, None, "tile -acc runs on 2 GPUs only"),
        ("a2a-gemm", "seq", None, None, "operator 'a2a-gemm' has no PyTorch op"),
        ("gemm", "seq", None, None, "unknown operator 'gemm'"),
    ],
)
def test_bad_schedule_names_say_why(op, name, gpus, sms, message):
    with pytest.raises(ValueError) as e:
        ficco.check_schedule(op, name, gpus, sms)
    assert message in str(e.value)


def test_schedule_checks_follow_the_device():
    assert ficco.check_schedule("gemm-rs", "shard-nccl-ring-sm200", sm_count=256) == "shard-nccl-ring-sm200"
    assert ficco.check_schedule("gemm-rs", "tile-copy-ring-acc", 2) == "tile-copy-ring-acc"
    with pytest.raises(ValueError, match="sm_count must be positive"):
        ficco.check_schedule("gemm-rs", "seq", sm_count=0)


def test_schedules_needs_two_gpus():
    with pytest.raises(ValueError, match="gpus must be at least 2"):
        ficco.schedules("ag-gemm", 1)


# ------------------------------------------------------ session arguments


@pytest.mark.parametrize(
    "args,message",
    [
        ((2, 2, 0, 1, "127.0.0.1", 29500), "rank 2 must be below world 2"),
        ((-1, 2, 0, 1, "127.0.0.1", 29500), "rank must be non-negative, got -1"),
        ((0, 0, 0, 1, "127.0.0.1", 29500), "world must be at least 1, got 0"),
        ((0, 2, 0, 3, "127.0.0.1", 29500), "local_world must be between 1 and world 2, got 3"),
        ((0, 2, 2, 2, "127.0.0.1", 29500), "local_rank 2 must be below local_world 2"),
        ((0, 2, 0, 2, "127.0.0.1", 0), "port must be a TCP port (1 to 65535), got 0"),
        ((0, 2, 0, 2, "127.0.0.1", 70000), "port must be a TCP port (1 to 65535), got 70000"),
        ((0, 2, 0, 2, "  ", 29500), "master_addr is empty"),
    ],
)
def test_session_arguments_are_checked_before_joining(args, message):
    with pytest.raises(ValueError) as e:
        ficco.Session(*args)
    assert message in str(e.value)


@pytest.mark.parametrize("t", [0.0, -1.0, float("nan"), float("inf")])
def test_session_timeout_must_be_positive(t):
    with pytest.raises(ValueError, match="timeout_s must be a positive number of seconds"):
        ficco.Session(0, 1, 0, 1, "127.0.0.1", 29500, timeout_s=t)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: the session would open")
def test_a_session_without_a_gpu_raises_not_panics():
    # A world of one: the rendezvous needs nobody else, then the GPU is not there.
    with pytest.raises((RuntimeError, ValueError)) as e:
        ficco.Session(0, 1, 0, 1, "127.0.0.1", ficco.free_port(), timeout_s=10)
    assert str(e.value)


# --------------------------------------------------------- op arguments
# Checked in this order: tensors (type, dtype, 2-D, layout, shapes), the
# schedule name, the process group, then devices; so each check below fails
# on the CPU exactly where it is meant to.


@pytest.mark.parametrize("op,f,a_name", OPS, ids=ids)
def test_a_non_tensor_is_a_type_error(op, f, a_name):
    with pytest.raises(TypeError) as e:
        f([[1.0]], bf16(4, 4))
    assert str(e.value) == f"{FN[op]}: {a_name} must be a torch.Tensor, got list"
    with pytest.raises(TypeError, match="b must be a torch.Tensor, got NoneType"):
        f(bf16(4, 4), None)


@pytest.mark.parametrize("op,f,a_name", OPS, ids=ids)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int32])
def test_only_bfloat16(op, f, a_name, dtype):
    with pytest.raises(TypeError) as e:
        f(torch.zeros(4, 4, dtype=dtype), bf16(4, 4))
    msg = str(e.value)
    assert f"{a_name} has dtype {dtype}" in msg
    assert "ficco ops take torch.bfloat16" in msg
    with pytest.raises(TypeError, match=r"b has dtype torch.float32"):
        f(bf16(4, 4), torch.zeros(4, 4))


@pytest.mark.parametrize("op,f,a_name", OPS, ids=ids)
def test_operands_must_be_2d(op, f, a_name):
    with pytest.raises(ValueError) as e:
        f(bf16(8), bf16(4, 4))
    assert f"{a_name} must be 2-D, got 1-D of shape (8,)" in str(e.value)
    with pytest.raises(ValueError, match=r"b must be 2-D, got 3-D of shape \(2, 4, 4\)"):
        f(bf16(4, 4), bf16(2, 4, 4))


@pytest.mark.parametrize("op,f,a_name", OPS, ids=ids)
def test_operands_must_be_contiguous(op, f, a_name):
    with pytest.raises(ValueError) as e:
        f(bf16(4, 8).t(), bf16(4, 4))
    msg = str(e.value)
    assert f"{a_name} is not contiguous (strides (1, 8))" in msg
    assert f"pass {a_name}.contiguous()" in msg
    with pytest.raises(ValueError, match="b is not contiguous"):
        f(bf16(4, 4), bf16(8, 8)[:, :4])


@pytest.mark.parametrize("op,f,a_name", OPS, ids=ids)
def test_inner_dimensions_must_match(op, f, a_name):
    with pytest.raises(ValueError) as e:
        f(bf16(4, 6), bf16(5, 3))
    assert str(e.value) == (
        f"{FN[op]}: inner dimensions differ: {a_name} is (4, 6) and b is (5, 3); "
        f"{a_name}.shape[1] must equal b.shape[0]"
    )


@pytest.mark.parametrize("op,f,a_name", OPS, ids=ids)
def test_empty_operands_are_refused(op, f, a_name):
    with pytest.raises(ValueError, match=f"{a_name}.shape.0. is 0"):
        f(bf16(0, 4), bf16(4, 4))
    with pytest.raises(ValueError, match="n is 0"):
        f(bf16(4, 4), bf16(4, 0))


@pytest.mark.parametrize("op,f,a_name", OPS, ids=ids)
def test_out_with_autograd_is_refused(op, f, a_name):
    a = bf16(4, 4).requires_grad_()
    with pytest.raises(ValueError, match="out= has no backward, and .* requires grad; drop out="):
        f(a, bf16(4, 4), out=bf16(4, 4))
    # A call that needs a gradient gets the same argument checks.
    with pytest.raises(TypeError, match="b has dtype torch.float32"):
        f(a, torch.randn(4, 4))
    with pytest.raises(ValueError, match="not initialised"):
        f(a, bf16(4, 4))


@pytest.mark.parametrize("op,f,a_name", OPS, ids=ids)
def test_bad_schedule_names_are_refused_with_where_to_look(op, f, a_name, no_pg):
    with pytest.raises(ValueError) as e:
        f(bf16(4, 4), bf16(4, 4), schedule="nonsense")
    msg = str(e.value)
    assert msg.startswith(f"{FN[op]}: schedule='nonsense': bad schedule name 'nonsense'")
    assert f"`ficco schedules --op {op} --gpus P`" in msg
    with pytest.raises(ValueError, match="fine3: the chunk count must be one of"):
        f(bf16(4, 4), bf16(4, 4), schedule="fine3-copy-ring")


@pytest.mark.parametrize("op,f,a_name", OPS, ids=ids)
@pytest.mark.parametrize("schedule", [None, 3, ["shard-copy-ring"]])
def test_schedule_must_be_a_string(op, f, a_name, schedule):
    with pytest.raises(TypeError) as e:
        f(bf16(4, 4), bf16(4, 4), schedule=schedule)
    assert "schedule must be a str ('auto' or a schedule name)" in str(e.value)
    assert f"got {type(schedule).__name__}" in str(e.value)


@pytest.mark.parametrize("op,f,a_name", OPS, ids=ids)
def test_without_a_process_group_says_to_initialise_one(op, f, a_name, no_pg):
    for schedule in ("auto", "shard-copy-ring"):
        with pytest.raises(ValueError) as e:
            f(bf16(4, 4), bf16(4, 4), schedule=schedule)
        msg = str(e.value)
        assert msg.startswith(f"{FN[op]}: torch.distributed is not initialised")
        assert "torch.distributed.init_process_group(" in msg


@pytest.mark.parametrize("op,f,a_name", OPS, ids=ids)
def test_a_group_of_one_rank_is_refused(op, f, a_name, world1):
    with pytest.raises(ValueError) as e:
        f(bf16(4, 4), bf16(4, 4))
    assert "the process group has 1 rank; ficco ops need at least 2 ranks" in str(e.value)


@pytest.mark.parametrize("op,f,a_name", [o for o in OPS if o[0] != "ag-gemm"], ids=ids[1:])
def test_rows_must_divide_over_the_group(op, f, a_name, world2):
    with pytest.raises(ValueError) as e:
        f(bf16(3, 4), bf16(4, 4))
    assert str(e.value) == (
        f"{FN[op]}: a has 3 rows, which is not divisible by the group size 2; "
        "pad m to a multiple of 2"
    )


def test_gpu_count_bounds_the_schedule(world2):
    # Known only once the group is: tile -acc runs on 2 GPUs, so with the
    # fake world of 2 the name passes and the CPU tensors fail next.
    with pytest.raises(ValueError, match="a is on cpu; ficco ops take CUDA tensors"):
        ft.matmul_reduce_scatter(bf16(4, 4), bf16(4, 4), schedule="tile-copy-ring-acc")


@pytest.mark.parametrize("op,f,a_name", OPS, ids=ids)
def test_cpu_tensors_are_refused(op, f, a_name, world2):
    with pytest.raises(ValueError) as e:
        f(bf16(4, 4), bf16(4, 4))
    assert str(e.value) == (
        f"{FN[op]}: {a_name} is on cpu; ficco ops take CUDA tensors on this "
        "process's current device (torch.cuda.current_device())"
    )


def test_close_without_sessions_and_last_schedule_before_any_call(world1):
    ft.close()
    assert ft.last_schedule() is None


def test_node_plan_decides_the_same_on_every_rank():
    # (host, device, uuid) per rank: two nodes, one GPU per rank.
    peers = [("a", 0, "u0"), ("a", 1, "u1"), ("b", 0, "v0"), ("b", 1, "v1")]
    assert [ft._node_plan("f", peers, r) for r in range(4)] == [
        (0, 2, False), (1, 2, False), (0, 2, False), (1, 2, False)]
    # Loopback: every rank of a node on one GPU.
    shared = [("a", 0, "u0")] * 3
    assert ft._node_plan("f", shared, 2) == (2, 3, True)
    # A rank whose device is not its local rank drives its own device.
    assert ft._node_plan("f", [("a", 0, "u0"), ("a", 3, "u3")], 1) == (1, 2, False)
    # Half shared, half not.
    with pytest.raises(ValueError, match="some ranks of the group share a GPU and others do not"):
        ft._node_plan("f", [("a", 0, "u0"), ("a", 0, "u0"), ("a", 2, "u2")], 0)
    with pytest.raises(ValueError, match="some nodes run several ranks on one GPU"):
        ft._node_plan("f", [("a", 0, "u"), ("a", 0, "u"), ("b", 0, "v"), ("b", 1, "w")], 0)


def test_rendezvous_bound_follows_the_environment(monkeypatch):
    monkeypatch.setenv("FICCO_DIST_TIMEOUT_MS", "1500")
    assert ft._timeout().total_seconds() == 1.5
    monkeypatch.setenv("FICCO_DIST_TIMEOUT_MS", "junk")
    with pytest.raises(ValueError, match="FICCO_DIST_TIMEOUT_MS='junk' is not valid"):
        ft._timeout()
    monkeypatch.delenv("FICCO_DIST_TIMEOUT_MS")
    assert ft._timeout().total_seconds() == 60


# ------------------------------------------------------- shared tensors


@pytest.mark.parametrize("size", [(), (0, 4), (3, -1), (2.5,)])
def test_empty_needs_positive_integer_sizes(size, no_pg):
    with pytest.raises(ValueError, match=r"ficco.torch.empty: size must be positive integers"):
        ft.empty(*size)


def test_empty_needs_a_process_group(no_pg):
    with pytest.raises(ValueError, match="torch.distributed is not initialised"):
        ft.empty(4, 8)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: the session would open")
def test_empty_without_a_gpu_raises_not_panics(world1):
    with pytest.raises((RuntimeError, ValueError)) as e:
        ft.empty((4, 8))
    assert str(e.value)


@pytest.mark.parametrize("name,one_node", [
    ("seq", False), ("shard-nccl-ring", False), ("fine4-nccl-all-2s", False),
    ("shard-copy-ring", True), ("fine2-copy-all-acc", True), ("tile-copy-ring", True),
])
def test_copy_and_tile_schedules_need_one_node(name, one_node):
    assert ficco.check_schedule("gemm-rs", name) == name
    assert ft._needs_one_node(name) is one_node
