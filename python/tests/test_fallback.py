"""``auto``'s fallback, on the CPU: where the decision is ``seq`` the call
runs PyTorch's sequential reference (the group's collective and
``torch.mm``) instead of a ficco schedule. Two gloo processes run it on CPU
tensors against an fp32 reference (on GPUs the same code runs on NCCL)."""

import json
import os

import torch
import torch.distributed as dist

import ficco.torch as ft

WORLD = 2


class SeqSession:
    """A session whose decision is always ``seq`` and that must not run."""

    loopback = False

    def __init__(self):
        self.decided, self.ran = [], []

    def decide(self, op, m, k, n):
        self.decided.append((op, m, k, n))
        return ("seq", "shard-copy-ring", "predicted", 1.0, 0.99, 0.006, 0.02)

    def run_op(self, *args):
        self.ran.append(args)
        return "shard-copy-ring"


def inputs(op, q):
    g = torch.Generator().manual_seed(10 + q)
    rows = 4 if op == "ag-gemm" else 8
    a = torch.randn(rows, 16, generator=g).to(torch.bfloat16)
    b = torch.randn(16, 8, generator=g).to(torch.bfloat16)
    return a, b


def reference(op, r):
    ins = [inputs(op, q) for q in range(WORLD)]
    if op == "ag-gemm":
        return torch.cat([a.float() for a, _ in ins]) @ ins[r][1].float()
    total = sum(a.float() @ b.float() for a, b in ins)
    return total if op == "gemm-ar" else total[r * 4:(r + 1) * 4]


def worker(rank, port, out_dir):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    group = dist.group.WORLD
    rows = {}
    for op in ("ag-gemm", "gemm-rs", "gemm-ar"):
        sess = SeqSession()
        a, b = inputs(op, rank)
        m = a.shape[0] * WORLD if op == "ag-gemm" else a.shape[0]
        out = torch.full(((m // WORLD) if op == "gemm-rs" else m, b.shape[1]), float("nan"), dtype=torch.bfloat16)
        got = ft._execute(op, group, sess, None, a, b, out, m, a.shape[1], b.shape[1], WORLD)
        want = reference(op, rank)
        rows[op] = {
            "same_out": got is out,
            "err": float((got.float() - want).norm() / want.norm()),
            "decided": sess.decided,
            "ran_native": len(sess.ran),
            "last": ft._last.get(group),
        }
        ft._decisions.clear()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(rows, f)
    dist.destroy_process_group()


def test_a_seq_decision_runs_pytorchs_reference(gloo_job):
    for r, rows in enumerate(gloo_job(worker, WORLD)):
        for op, row in rows.items():
            assert row["same_out"], (r, op)
            assert row["err"] < 2e-2, (r, op, row)
            assert row["ran_native"] == 0, (r, op, "a ficco schedule ran")
            assert row["last"] == "seq", (r, op, row)
            assert len(row["decided"]) == 1, (r, op, row)
