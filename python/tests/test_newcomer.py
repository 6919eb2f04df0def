"""Issue 31: what a new user of the Python package tripped on, each with
the message it now gets (CPU only: CI has no GPU)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import ficco

REPO = Path(__file__).resolve().parents[2]


def run_py(code, env=None):
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, **(env or {})},
    )


def test_ficco_torch_without_pytorch_says_what_to_install():
    # `None` in sys.modules makes `import torch` fail as if it were absent.
    r = run_py("import sys; sys.modules['torch'] = None\nimport ficco.torch")
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ModuleNotFoundError: ficco.torch needs PyTorch"), r.stderr
    assert "pip install 'ficco[torch]'" in last, r.stderr
    # The top-level package still imports without PyTorch.
    r = run_py("import sys; sys.modules['torch'] = None\nimport ficco; print(ficco.version())")
    assert r.returncode == 0, r.stderr


def test_the_torch_extra_is_declared():
    text = (REPO / "python" / "pyproject.toml").read_text()
    assert 'torch = ["torch"]' in text


def test_schedules_takes_every_operator_and_names_them_all():
    for op in ["ag-gemm", "gemm-rs", "gemm-ar", "a2a-gemm", "gemm-a2a", "concurrent"]:
        assert ficco.schedules(op, 4)[0] == "seq", op
    with pytest.raises(ValueError) as e:
        ficco.schedules("ag-gem", 4)
    msg = str(e.value)
    for op in ["a2a-gemm", "gemm-a2a", "concurrent"]:
        assert op in msg, msg
    assert "did you mean 'ag-gemm'?" in msg, msg


def test_a_list_of_schedules_is_not_a_name():
    with pytest.raises(ValueError, match="that is several names"):
        ficco.check_schedule("ag-gemm", "shard-copy-ring,fine2-copy-all")


def test_empty_without_a_gpu_says_so_not_pytorchs_driver_error():
    code = """
import torch, torch.distributed as dist, ficco.torch as ft
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
try:
    ft.empty(4, 4)
except Exception as e:
    print(f"{type(e).__name__}: {e}")
"""
    r = run_py(code, {"CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("RuntimeError: ficco.torch.empty: no CUDA device"), r.stdout
    assert "NVIDIA driver" not in r.stdout, r.stdout


def test_the_example_without_a_gpu_ends_with_a_message_not_a_traceback():
    env = {
        **os.environ,
        "CUDA_VISIBLE_DEVICES": "",
        "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29599",
    }
    r = subprocess.run(
        [sys.executable, str(REPO / "examples" / "llama_tp_block.py"), "--loopback"],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith("llama_tp_block: no CUDA GPU here"), r.stderr
    assert "ficco explore --model llama3-70b" in r.stderr
