"""Where an operator call's host time goes, piece by piece.

Times each step of ``ficco.torch``'s steady-state call path on its own, in
a loop of ``--calls`` (host microseconds per step, the slowest rank's
median of ``--reps``; the device is drained, untimed, every ``--sync-every``
calls, so that no launch waits for a full queue), for one op and schedule
at a small shape (where the
host matters most): the whole public call, the Python pieces (the cache
lookup, the per-call checks, the output allocation, the stream, the
decision) and the native call (``Session.run_op``) alone.

    torchrun --nproc-per-node 2 bench/host_breakdown.py [--op ag-gemm] [--schedule shard-copy-ring]

With ``--loopback`` every rank runs on cuda:0 with a gloo group (ficco's
loopback): the device times mean nothing there (the ranks' processes share
the GPU by time slices), but the host's are those of the same call graphs.
"""

import argparse
import os
import statistics
import time


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--op", default="ag-gemm", choices=["ag-gemm", "gemm-rs", "gemm-ar"])
    p.add_argument("--schedule", default="shard-copy-ring")
    p.add_argument("--shape", default="1024,1024,1024", help="m,k,n (m over all ranks)")
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--sync-every", type=int, default=8,
                   help="drain the device after this many calls (untimed)")
    p.add_argument("--loopback", action="store_true",
                   help="every rank on cuda:0, gloo process group (one GPU)")
    args = p.parse_args()

    import torch
    import torch.distributed as dist

    import ficco.torch as ft

    local = 0 if args.loopback else int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device("cuda", local)
    torch.cuda.set_device(dev)
    if args.loopback:
        dist.init_process_group("gloo")
    else:
        dist.init_process_group("nccl", device_id=dev)
    rank, size = dist.get_rank(), dist.get_world_size()
    m, k, n = (int(x) for x in args.shape.split(","))
    op = args.op
    f = getattr(ft, ft._OPS[op])
    a_rows = m // size if op == "ag-gemm" else m
    out_rows = m // size if op == "gemm-rs" else m
    a = torch.randn(a_rows, k, device=dev).to(torch.bfloat16)
    b = (torch.randn(k, n, device=dev) / k**0.5).to(torch.bfloat16)
    out = torch.empty(out_rows, n, dtype=torch.bfloat16, device=dev)
    s = args.schedule
    g = dist.group.WORLD

    torch.set_grad_enabled(False)
    for _ in range(5):
        f(a, b, schedule=s, out=out)
        f(a, b, schedule=s)
    torch.cuda.synchronize()
    sess = ft.session()
    seen = ft._steady[(op, g, a.shape, b.shape, s, False, a.get_device())]
    name = ft.last_schedule()
    stream = ft._raw_stream(local)
    ptrs = (a.data_ptr(), b.data_ptr(), out.data_ptr())

    class _NoNative:
        """The session with its native call stubbed out: the public call's
        Python layer alone."""

        loopback = sess.loopback

        def run_op(self, *args):
            return name

    stub = _NoNative()

    def python_only():
        real = ft._sessions[g]
        ft._sessions[g] = stub
        try:
            f(a, b, schedule=s, out=out)
        finally:
            ft._sessions[g] = real

    pieces = {
        "public call, out=": lambda: f(a, b, schedule=s, out=out),
        "public call, out=, native stubbed": python_only,
        "public call, new out": lambda: f(a, b, schedule=s),
        "native run_op (kwargs, as _execute)": lambda: sess.run_op(
            op, m, k, n, name, *ptrs, stream, b_transposed=False, gathered=0),
        "native run_op (positional)": lambda: sess.run_op(op, m, k, n, name, *ptrs, stream),
        "steady-cache lookup": lambda: ft._steady.get((op, g, a.shape, b.shape, s, False, a.get_device())),
        "per-call checks (_quick_ok)": lambda: ft._quick_ok(a, b, out, a.get_device(), seen),
        "torch.empty of the output": lambda: torch.empty(seen[5], dtype=torch.bfloat16, device=a.device),
        "a.new_empty of the output": lambda: a.new_empty(seen[5]),
        "current raw stream": lambda: ft._raw_stream(local),
        "auto decision lookup": lambda: ft._decision(sess, g, op, m, k, n),
        "dist.group.WORLD": lambda: dist.group.WORLD,
        "torch.cuda.current_device()": lambda: torch.cuda.current_device(),
        "a.device": lambda: a.device,
        "3 x data_ptr()": lambda: (a.data_ptr(), b.data_ptr(), out.data_ptr()),
        "is_grad_enabled + is_compiling": lambda: (torch.is_grad_enabled(), torch.compiler.is_compiling()),
        "torch.compiler.is_compiling()": lambda: torch.compiler.is_compiling(),
        "a.requires_grad, b.requires_grad": lambda: (a.requires_grad, b.requires_grad),
        "steady key tuple": lambda: (op, g, a.shape, b.shape, s, False, a.get_device()),
        "a.device.index": lambda: a.device.index,
        "sess.run_op bound method lookup": lambda: sess.run_op,
        "native getter (sess.closed)": lambda: sess.closed,
        "native getter (sess.device, session lock)": lambda: sess.device,
    }

    def slowest(v):
        t = torch.tensor([v], dtype=torch.float64, device="cpu" if args.loopback else dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    native_pieces = {}
    public_pieces = {}
    for what, fn in pieces.items():
        if what.startswith("native run_op (positional)") or what == "public call, out=":
            type(sess).host_times()
        reps = []
        for _ in range(args.reps):
            dist.barrier()
            spent = 0.0
            for i in range(args.calls):
                t0 = time.perf_counter()
                fn()
                spent += time.perf_counter() - t0
                # Drained every few calls: a full launch queue would make
                # the host wait for the device, and that is not host cost.
                if i % args.sync_every == args.sync_every - 1:
                    torch.cuda.synchronize()
            reps.append(spent / args.calls * 1e6)
            torch.cuda.synchronize()
        us = slowest(statistics.median(reps))
        if what.startswith("native run_op (positional)"):
            native_pieces = type(sess).host_times()
        elif what == "public call, out=":
            public_pieces = type(sess).host_times()
        if rank == 0:
            # Beside the slowest rank's median: rank 0's mean, which the
            # native phases below are comparable with.
            mean = statistics.fmean(reps)
            print(f"{what:40} {us:8.2f} us   (rank 0 mean {mean:7.2f})", flush=True)
    if rank == 0:
        # This rank's native phases of the positional run_op loop (means).
        print("# native phases of run_op (rank 0, mean per call):")
        for phase, us, count in native_pieces:
            print(f"  {phase:38} {us:8.2f} us  ({count} calls)", flush=True)
        # The same phases inside the public calls: what the Python between
        # the native calls does to them (cold caches).
        print("# native phases of the public call, out= (rank 0, mean per call):")
        for phase, us, count in public_pieces:
            print(f"  {phase:38} {us:8.2f} us  ({count} calls)", flush=True)
    ft.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
