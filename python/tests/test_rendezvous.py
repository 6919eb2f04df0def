"""ficco.torch's session bootstrap on the CPU: three processes with a gloo
group stand in for two nodes (ranks 0 and 1 on host "a" with GPUs 0 and 1,
rank 2 on host "b" with GPU 0). A stand-in for the native session checks the
published address with a real TCP meeting (see rendezvous_worker.py)."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import ficco

WORKER = Path(__file__).resolve().parent / "rendezvous_worker.py"
LAYOUT = [("a", 0, "gpu-a0"), ("a", 1, "gpu-a1"), ("b", 0, "gpu-b0")]


def test_sessions_bootstrap_through_the_group_store(tmp_path):
    port = ficco.free_port()
    outs = [tmp_path / f"rank{r}.json" for r in range(3)]
    procs = []
    for r, (host, dev, uuid) in enumerate(LAYOUT):
        env = {
            **os.environ,
            "RANK": str(r),
            "WORLD_SIZE": "3",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "FAKE_HOST": host,
            "FAKE_DEV": str(dev),
            "FAKE_UUID": uuid,
        }
        procs.append(subprocess.Popen([sys.executable, str(WORKER), str(outs[r])], env=env))
    deadline = time.monotonic() + 120
    for p in procs:
        p.wait(timeout=max(1, deadline - time.monotonic()))
    assert [p.returncode for p in procs] == [0, 0, 0]
    res = [json.loads(o.read_text()) for o in outs]

    # The world group: local ranks from the host names, not loopback (one
    # GPU per rank), rank 0's address from MASTER_ADDR (two nodes), one port.
    for r, got in enumerate(res):
        w = got["world"]
        assert (w["rank"], w["world"]) == (r, 3)
        assert (w["local_rank"], w["local_world"]) == [(0, 2), (1, 2), (0, 1)][r]
        assert w["loopback"] is False
        assert w["addr"] == "127.0.0.1"
        assert got["cached"] and got["closed"] and got["new_object"]
    assert len({g["world"]["port"] for g in res}) == 1
    # One job secret for the group, drawn by rank 0 (64 hex digits), a new
    # one for each session.
    assert len({g["world"]["secret"] for g in res}) == 1
    assert len(res[0]["world"]["secret"]) == 64
    int(res[0]["world"]["secret"], 16)
    assert res[0]["again"]["secret"] != res[0]["world"]["secret"]
    # After close(), the next session has a new rendezvous (a new port).
    assert len({g["again"]["port"] for g in res}) == 1
    assert res[0]["again"]["port"] != res[0]["world"]["port"]

    # The pair [0, 1] on host "a": its own ranks, one node, the loopback address.
    for r in (0, 1):
        p = res[r]["pair"]
        assert (p["rank"], p["world"], p["local_rank"], p["local_world"]) == (r, 2, r, 2)
        assert p["addr"] == "127.0.0.1"
    assert "pair" not in res[2]


