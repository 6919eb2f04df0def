"""One rank of `test_rendezvous.py`: ficco.torch's session bootstrap on the
CPU, with a stand-in for the native session.

The stand-in records what `ficco.torch` passes to `Session(...)` and checks
the address for real: rank 0 listens on the published port and every other
rank connects to it. Host names and GPUs come from FAKE_HOST, FAKE_DEV and
FAKE_UUID (so one machine stands in for two nodes).

    python rendezvous_worker.py OUT.json
"""

import json
import os
import socket
import sys
import time
import types

import torch
import torch.distributed as dist

import ficco.torch as ft


class FakeSession:
    """What `_native.Session` gets, plus a real TCP meeting on its address."""

    made = []

    def __init__(self, rank, world, local_rank, local_world, addr, port, loopback=None, timeout_s=None,
                 device=None, secret=None):
        self.args = dict(rank=rank, world=world, local_rank=local_rank, local_world=local_world,
                         addr=addr, port=port, loopback=loopback, secret=secret)
        self.device = int(os.environ["FAKE_DEV"]) if device is None else device
        self.closed = False
        if rank == 0:
            with socket.create_server(("0.0.0.0", port)) as srv:
                srv.settimeout(20)
                for _ in range(world - 1):
                    conn, _ = srv.accept()
                    conn.close()
        else:
            deadline = time.monotonic() + 20
            while True:
                try:
                    socket.create_connection((addr, port), timeout=2).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
        FakeSession.made.append(self)

    def close(self):
        self.closed = True


def main():
    out_path = sys.argv[1]
    socket.gethostname = lambda: os.environ["FAKE_HOST"]
    torch.cuda.is_available = lambda: True
    torch.cuda.current_device = lambda: int(os.environ["FAKE_DEV"])
    torch.cuda.get_device_properties = lambda d: types.SimpleNamespace(uuid=os.environ["FAKE_UUID"])
    ft._native.Session = FakeSession
    dist.init_process_group("gloo", init_method="env://")
    rank = dist.get_rank()
    res = {}

    s1 = ft.session()
    res["world"] = s1.args
    res["cached"] = ft.session() is s1
    ft.close()
    res["closed"] = s1.closed
    s2 = ft.session()
    res["again"] = s2.args
    res["new_object"] = s2 is not s1

    # A subgroup on one node gets its own session, numbered in the group.
    pair = dist.new_group([0, 1])
    if rank in (0, 1):
        res["pair"] = ft.session(pair).args
    dist.barrier()
    with open(out_path, "w") as fh:
        json.dump(res, fh)
    ft.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
