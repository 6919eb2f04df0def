"""One rank of the loopback tests (`test_gpu_loopback.py` starts it).

Every rank runs on cuda:0 with a gloo process group (NCCL cannot put two
ranks on one GPU). The launcher environment (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT) comes from the test.

    python loopback_worker.py ops OUT.json      every op, forced and "auto"
    python loopback_worker.py fail:V OUT.json   rank V dies before its call

Each rank writes its results to OUT.json as soon as it has them, so the test
can tell what happened even if the process does not end afterwards.
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist

import ficco.torch as ft

# Copy-engine schedules every op has on 2 and 4 GPUs (`ficco schedules`),
# then the automatic choice.
SCHEDULES = ["shard-copy-ring", "fine2-copy-all", "auto"]
OPS = {
    "ag-gemm": ft.all_gather_matmul,
    "gemm-rs": ft.matmul_reduce_scatter,
    "gemm-ar": ft.matmul_all_reduce,
}
# Rows per rank, k, n: large enough that the rule selector picks an
# overlapped copy-engine schedule (not `seq`, which needs NCCL) for "auto".
ROWS, K, N = 2048, 2048, 1024


def operands(op, case, q, world):
    """Rank q's inputs of case `case`, regenerated identically on any rank
    from a per-rank seed (no collective needed for the reference)."""
    g = torch.Generator(device="cuda:0")
    g.manual_seed(1000 * case + q)
    rows = ROWS if op == "ag-gemm" else ROWS * world
    a = torch.randn(rows, K, device="cuda:0", generator=g).to(torch.bfloat16)
    b = torch.randn(K, N, device="cuda:0", generator=g).to(torch.bfloat16)
    return a, b


def reference(op, case, rank, world):
    """This rank's expected output, in fp32 from every rank's bf16 inputs."""
    ins = [operands(op, case, q, world) for q in range(world)]
    if op == "ag-gemm":
        full = torch.cat([a.float() for a, _ in ins])
        return full @ ins[rank][1].float()
    total = sum(a.float() @ b.float() for a, b in ins)
    if op == "gemm-ar":
        return total
    m = ROWS * world
    return total[rank * m // world:(rank + 1) * m // world]


def out_shape(op, world):
    m = ROWS * world
    return (m // world if op == "gemm-rs" else m, N)


def run_ops(rank, world, out_path):
    results = []
    case = 0
    for op, f in OPS.items():
        for schedule in SCHEDULES:
            case += 1
            a, b = operands(op, case, rank, world)
            out = torch.full(out_shape(op, world), float("nan"), dtype=torch.bfloat16, device="cuda:0")
            row = {"op": op, "schedule": schedule}
            try:
                with torch.no_grad():
                    got = f(a, b, schedule=schedule, out=out)
                torch.cuda.synchronize()
                ref = reference(op, case, rank, world)
                row["ran"] = ft.last_schedule()
                row["same_tensor"] = got.data_ptr() == out.data_ptr()
                row["nan"] = bool(torch.isnan(got).any())
                row["err"] = float((got.float() - ref).norm() / ref.norm())
            except Exception as e:  # recorded; the test fails on it
                row["error"] = f"{type(e).__name__}: {e}"
            results.append(row)
            with open(out_path, "w") as fh:
                json.dump(results, fh)
    # The same ops on tensors from ft.empty: used in place, not copied.
    for op, f in OPS.items():
        case += 1
        a0, b0 = operands(op, case, rank, world)
        row = {"op": op, "schedule": "shard-copy-ring", "in_place": True}
        try:
            a = ft.empty(*a0.shape)
            b = ft.empty(*b0.shape)
            out = ft.empty(*out_shape(op, world))
            a.copy_(a0)
            b.copy_(b0)
            out.fill_(float("nan"))
            with torch.no_grad():
                got = f(a, b, schedule="shard-copy-ring", out=out)
            torch.cuda.synchronize()
            ref = reference(op, case, rank, world)
            row["ran"] = ft.last_schedule()
            row["same_tensor"] = got.data_ptr() == out.data_ptr()
            row["nan"] = bool(torch.isnan(got).any())
            row["err"] = float((got.float() - ref).norm() / ref.norm())
            del a, b, out, got
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {e}"
        results.append(row)
        with open(out_path, "w") as fh:
            json.dump(results, fh)
    ft.close()


def run_fail(rank, world, victim, out_path):
    a, b = operands("ag-gemm", 1, rank, world)
    with torch.no_grad():
        ft.all_gather_matmul(a, b, schedule="shard-copy-ring")
    torch.cuda.synchronize()
    # Everybody has joined the session and finished a call.
    dist.barrier()
    if rank == victim:
        os._exit(3)
    a, b = operands("gemm-rs", 2, rank, world)
    t0 = time.monotonic()
    try:
        with torch.no_grad():
            ft.matmul_reduce_scatter(a, b, schedule="shard-copy-ring")
        torch.cuda.synchronize()
        row = {"raised": None}
    except Exception as e:
        row = {"raised": type(e).__name__, "message": str(e)}
    row["after_s"] = time.monotonic() - t0
    with open(out_path, "w") as fh:
        json.dump(row, fh)


def main():
    mode, out_path = sys.argv[1], sys.argv[2]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(0)
    dist.init_process_group("gloo", init_method="env://")
    if mode == "ops":
        run_ops(rank, world, out_path)
        dist.destroy_process_group()
    elif mode.startswith("fail:"):
        # Exits normally after raising: that the process then ends (ficco's
        # atexit hook, the dropped session) is part of what is tested.
        run_fail(rank, world, int(mode[5:]), out_path)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
