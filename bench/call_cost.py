"""What an operator call costs beyond its plan, on the GPUs of a torchrun job.

For each op at a small, a medium and a large shape, and each schedule of
``--schedules``, it runs ``ficco.torch``'s op back to back and reports:

* ``host_us``: host time per call (Python and ficco's native issue path,
  measured around the calls alone while the device is busy);
* ``device_us``: device time per call (CUDA events around ``--calls``
  back-to-back calls, after a warm-up; the slowest rank's median of
  ``--reps`` repetitions);
* ``graph_us``: the same calls captured in one CUDA graph and replayed
  (no host work per call);
* ``native_us``: host time per call of the native call alone
  (``Session.run_op`` with the same arguments, no Python checks).

Rank 0 writes them, with the scenarios as a suite TOML, into ``--out``;
``bench/call_cost.sh`` then times the same plans in ficco's harness
(``ficco explore --backend gpu --schedule S``) in the same device call, and
``python3 bench/call_cost.py --summarize DIR`` joins the two: a call's cost
is its device time minus the harness time of its plan.

    torchrun --nproc-per-node 4 bench/call_cost.py --out DIR
    python3 bench/call_cost.py --summarize DIR
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

SHAPES = {
    # (m, k, n): m tokens over all ranks, per-rank k and n.
    "small": (1024, 1024, 1024),
    "medium": (4096, 4096, 4096),
    "large": (16384, 8192, 8192),
}
OPS = {"ag-gemm": "all_gather_matmul", "gemm-rs": "matmul_reduce_scatter", "gemm-ar": "matmul_all_reduce"}


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, help="folder for calls.json and suite.toml (rank 0)")
    p.add_argument("--schedules", default="shard-copy-ring,seq", help="comma-separated schedule names")
    p.add_argument("--calls", type=int, default=50, help="back-to-back calls per timing")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--summarize", type=Path, help="join DIR/calls.json with DIR/harness-*.json and print")
    return p.parse_args()


def measure(args):
    import torch
    import torch.distributed as dist

    import ficco.torch as ft

    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device("cuda", local)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev)
    rank, p = dist.get_rank(), dist.get_world_size()

    def slowest(v):
        t = torch.tensor([v], dtype=torch.float64, device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    rows = []
    with torch.no_grad():
        for size, (m, k, n) in SHAPES.items():
            for op, fname in OPS.items():
                f = getattr(ft, fname)
                a_rows = m // p if op == "ag-gemm" else m
                out_rows = m // p if op == "gemm-rs" else m
                a = torch.randn(a_rows, k, device=dev).to(torch.bfloat16)
                b = (torch.randn(k, n, device=dev) / k**0.5).to(torch.bfloat16)
                out = torch.empty(out_rows, n, dtype=torch.bfloat16, device=dev)
                for s in args.schedules.split(","):
                    call = lambda: f(a, b, schedule=s, out=out)  # noqa: E731
                    for _ in range(3):
                        call()
                    torch.cuda.synchronize()
                    dist.barrier()
                    host, device = [], []
                    for _ in range(args.reps):
                        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        e0.record()
                        spent = 0.0
                        for _ in range(args.calls):
                            t0 = time.perf_counter()
                            call()
                            spent += time.perf_counter() - t0
                        e1.record()
                        torch.cuda.synchronize()
                        host.append(spent / args.calls * 1e6)
                        device.append(e0.elapsed_time(e1) / args.calls * 1e3)
                    sess = ft.session()
                    stream = torch.cuda.current_stream().cuda_stream
                    name = ft.last_schedule()
                    args_ = (op, m, k, n, name, a.data_ptr(), b.data_ptr(), out.data_ptr(), stream)
                    native = []
                    for _ in range(args.reps):
                        spent = 0.0
                        for _ in range(args.calls):
                            t0 = time.perf_counter()
                            sess.run_op(*args_)
                            spent += time.perf_counter() - t0
                        torch.cuda.synchronize()
                        native.append(spent / args.calls * 1e6)
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g):
                        for _ in range(args.calls):
                            call()
                    g.replay()
                    torch.cuda.synchronize()
                    graph = []
                    for _ in range(args.reps):
                        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        e0.record()
                        g.replay()
                        e1.record()
                        torch.cuda.synchronize()
                        graph.append(e0.elapsed_time(e1) / args.calls * 1e3)
                    del g
                    rows.append({
                        "size": size, "op": op, "m": m, "k": k, "n": n, "gpus": p, "schedule": s,
                        "ran": ft.last_schedule(),
                        "host_us": slowest(statistics.median(host)),
                        "device_us": slowest(statistics.median(device)),
                        "graph_us": slowest(statistics.median(graph)),
                        "native_us": slowest(statistics.median(native)),
                    })
                    if rank == 0:
                        r = rows[-1]
                        print(f"{size:6} {op:7} {s:18} host {r['host_us']:8.1f} us (native {r['native_us']:6.1f})"
                              f"  device {r['device_us']:9.1f} us  graph {r['graph_us']:9.1f} us", flush=True)
    if rank == 0 and args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "calls.json").write_text(json.dumps(rows, indent=1))
        suite = []
        for size, (m, k, n) in SHAPES.items():
            for op in OPS:
                suite.append(f'[[scenario]]\nname = "{size}.{op}.p{p}"\nop = "{op}"\nm = {m}\nk = {k}\nn = {n}\ngpus = {p}\n')
        (args.out / f"suite-p{p}.toml").write_text("\n".join(suite))
    ft.close()
    dist.destroy_process_group()


def summarize(d: Path):
    calls = json.loads((d / "calls.json").read_text())
    harness = {}
    for f in sorted(d.glob("harness-*.json")):
        d = json.loads(f.read_text())
        for sc in d.get("scenarios", [d]):
            for s in sc["schedules"]:
                if s.get("time_ms") is not None:
                    harness[(sc["op"], sc["m"], sc["k"], sc["n"], sc["gpus"], s["name"])] = s["time_ms"] * 1e3
    print(f"# {'size':6} {'op':7} {'P':>2} {'schedule':18} {'host':>7} {'native':>7} {'device':>9} {'graph':>9} "
          f"{'harness':>9} {'cost':>8} {'cost(graph)':>11}   (us per call)")
    for r in calls:
        h = harness.get((r["op"], r["m"], r["k"], r["n"], r["gpus"], r["schedule"]))
        cost = f"{r['device_us'] - h:8.1f}" if h is not None else f"{'-':>8}"
        gcost = f"{r['graph_us'] - h:11.1f}" if h is not None else f"{'-':>11}"
        hs = f"{h:9.1f}" if h is not None else f"{'-':>9}"
        print(f"  {r['size']:6} {r['op']:7} {r['gpus']:2} {r['schedule']:18} {r['host_us']:7.1f} "
              f"{r.get('native_us', float('nan')):7.1f} {r['device_us']:9.1f} {r['graph_us']:9.1f} {hs} {cost} {gcost}")


if __name__ == "__main__":
    a = parse()
    if a.summarize:
        summarize(a.summarize)
    elif "RANK" not in os.environ:
        sys.exit("run under torchrun: torchrun --nproc-per-node N bench/call_cost.py --out DIR")
    else:
        measure(a)
