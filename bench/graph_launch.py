"""Host cost of one ``cuGraphLaunch`` by what the graph holds (GPU 0).

A replayed operator call is one graph launch on the caller's stream, and
its host cost is that launch: this measures what the launch pays per node
of each kind ficco's call graphs hold (stream memory operations, batches
of them, memsets, copies, kernels, forked streams), to know which nodes to
merge (with 2 GPUs, also copies from a peer). Each graph is captured
from the driver API on a stream of its own
and launched ``--launches`` times; the host time of each ``cuGraphLaunch``
call alone is taken (median, µs), with the device drained every 32
launches so that the launch queue never fills.

    python bench/graph_launch.py [--launches 2000] [--json OUT.json] [--flags 0 8]
"""

import argparse
import ctypes
import json
import statistics
import time

from cudrv import MEMOP_WAIT as WAIT, MEMOP_WRITE as WRITE, Driver, u32, u64, vp


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--launches", type=int, default=2000)
    p.add_argument("--json", default=None)
    p.add_argument("--flags", type=int, nargs="+", default=[0, 8],
                   help="cuGraphInstantiateWithFlags values, each case under each "
                        "(8: node priorities, as ficco's executor instantiates)")
    args = p.parse_args()

    import torch

    torch.cuda.init()
    dev = torch.device("cuda", 0)
    words = torch.zeros(4096, dtype=torch.int32, device=dev)
    data = torch.zeros(1 << 20, dtype=torch.bfloat16, device=dev)
    torch.cuda.synchronize()
    d = Driver()
    cu, ok = d.cu, d.ok
    main_s = d.stream()
    sides = [d.stream() for _ in range(4)]
    # A stream at the device's greatest priority, as `-hi` communication streams.
    lo, hi = ctypes.c_int(0), ctypes.c_int(0)
    ok(cu.cuCtxGetStreamPriorityRange(ctypes.byref(lo), ctypes.byref(hi)), "cuCtxGetStreamPriorityRange")
    high = vp()
    ok(cu.cuStreamCreateWithPriority(ctypes.byref(high), 1, hi), "cuStreamCreateWithPriority")
    base = words.data_ptr()

    def w(i):
        return u64(base + 4 * i)

    def batch(s, ops, at=None):
        # (Every batch here has 2 or more operations: one cuStreamBatchMemOp.)
        d.memops(s, [(kind, (base if at is None else at) + 4 * i, v) for kind, i, v in ops])

    def write1(s, i, v=1):
        ok(cu.cuStreamWriteValue32_v2(s, w(i), u32(v), u32(0)), "cuStreamWriteValue32")

    def kernel(s):
        with torch.cuda.stream(torch.cuda.ExternalStream(s.value, device=dev)):
            data[:256].add_(1)

    # A cuBLASLt GEMM as a call's GEMM steps run (512^3 bf16, into a
    # preallocated output: nothing is allocated under capture).
    ga = torch.randn(512, 512, device=dev).to(torch.bfloat16)
    gb = torch.randn(512, 512, device=dev).to(torch.bfloat16)
    gc = torch.empty(512, 512, dtype=torch.bfloat16, device=dev)

    def gemm(s):
        with torch.cuda.stream(torch.cuda.ExternalStream(s.value, device=dev)):
            torch.mm(ga, gb, out=gc)

    def memset(s, i, n=8):
        ok(cu.cuMemsetD32Async(w(i), u32(0), ctypes.c_size_t(n), s), "cuMemsetD32Async")

    def memcpy(s, nbytes=4096):
        ok(cu.cuMemcpyDtoDAsync_v2(u64(data.data_ptr() + (1 << 20)), u64(data.data_ptr()),
                                   ctypes.c_size_t(nbytes), s), "cuMemcpyDtoDAsync")

    # A peer's buffer (GPU 1, peer access on), where there are 2 GPUs: the
    # call graphs' copies pull from and push to peers.
    peer = None
    if torch.cuda.device_count() > 1:
        peer = torch.zeros(1 << 20, dtype=torch.bfloat16, device=torch.device("cuda", 1))
        peer_words = torch.zeros(4096, dtype=torch.int32, device=torch.device("cuda", 1))
        torch.cuda.synchronize(1)
        torch.cuda.set_device(dev)
        pctx = vp()
        ok(cu.cuDevicePrimaryCtxRetain(ctypes.byref(pctx), 1), "cuDevicePrimaryCtxRetain")
        r = cu.cuCtxEnablePeerAccess(pctx, u32(0))
        if r not in (0, 704):  # 704: already enabled
            raise RuntimeError(f"cuCtxEnablePeerAccess: {r}")

    def peer_memcpy(s, nbytes=4096):
        ok(cu.cuMemcpyDtoDAsync_v2(u64(data.data_ptr()), u64(peer.data_ptr()),
                                   ctypes.c_size_t(nbytes), s), "cuMemcpyDtoDAsync (peer)")

    def fork_join(n_side, body):
        d.fork_join(main_s, sides[:n_side], body)
    # Every write sets word >= 1 once and the waits wait for >= 0 (always
    # true): the graphs replay without any peer.
    def waits_writes(s, n, batched, at=None):
        ops = [(WAIT, 1000 + i, 0) if i % 2 else (WRITE, 2000 + i, 1) for i in range(n)]
        if batched:
            batch(s, ops, at)
        else:
            for kind, i, _ in ops:
                if kind == WRITE:
                    write1(s, i)
                else:
                    ok(cu.cuStreamWaitValue32_v2(s, w(i), u32(0), u32(0)), "cuStreamWaitValue32")

    def handoffs(main, n_kernels, n_copies, linked, third=False, work=None, prio=False):
        """A call's shape: GEMM-like kernels on one forked stream, copies
        on another (and, with `third`, a second copy stream), joined on
        `main`; `linked`: copy i waits for kernel i (a cross-stream edge
        per copy), as a push waits for the GEMM that made its chunk."""
        a, b, c = sides[0], (high if prio else sides[1]), sides[2]
        go = d.event()
        ok(cu.cuEventRecord(go, main), "cuEventRecord")
        outs = [a, b] + ([c] if third else [])
        for s in outs:
            ok(cu.cuStreamWaitEvent(s, go, u32(0)), "cuStreamWaitEvent")
        done = []
        for _ in range(n_kernels):
            (work or kernel)(a)
            e = d.event()
            ok(cu.cuEventRecord(e, a), "cuEventRecord")
            done.append(e)
        for i in range(n_copies):
            s = c if third and i % 2 else b
            if linked:
                ok(cu.cuStreamWaitEvent(s, done[i], u32(0)), "cuStreamWaitEvent")
            memcpy(s)
        for s in outs:
            e = d.event()
            ok(cu.cuEventRecord(e, s), "cuEventRecord")
            ok(cu.cuStreamWaitEvent(main, e, u32(0)), "cuStreamWaitEvent")

    def p2_gemm_rs(main, redundant, prio=True):
        """The graph ficco captures for a P = 2 gemm-rs `shard-copy-ring`
        call (FICCO_GRAPH_DOT, 2026-11-29): a start kernel; the peer
        chunk's GEMM, then the own one; the push of the peer chunk after
        the first GEMM and its landed write; a wait kernel and the reduce on
        a high-priority stream after the second GEMM; an end kernel after
        all. `redundant`: every forked stream also waits for the start (as
        captured: 12 edges); else only what orders the work (9 edges)."""
        g, c, r = sides[0], sides[1], (high if prio else sides[2])
        kernel(main)
        start = d.event()
        ok(cu.cuEventRecord(start, main), "cuEventRecord")
        forked = [g, c, r] if redundant else [g]
        for s_ in forked:
            ok(cu.cuStreamWaitEvent(s_, start, u32(0)), "cuStreamWaitEvent")
        gemm(g)
        first = d.event()
        ok(cu.cuEventRecord(first, g), "cuEventRecord")
        ok(cu.cuStreamWaitEvent(c, first, u32(0)), "cuStreamWaitEvent")
        memcpy(c)
        d.memops(c, [(WRITE, base + 4 * 2100, 1)])
        gemm(g)
        second = d.event()
        ok(cu.cuEventRecord(second, g), "cuEventRecord")
        ok(cu.cuStreamWaitEvent(r, second, u32(0)), "cuStreamWaitEvent")
        kernel(r)
        kernel(r)
        joined = [g, c, r] if redundant else [c, r]
        for s_ in joined:
            e = d.event()
            ok(cu.cuEventRecord(e, s_), "cuEventRecord")
            ok(cu.cuStreamWaitEvent(main, e, u32(0)), "cuStreamWaitEvent")
        kernel(main)

    cases = {
        "1 kernel": lambda s: kernel(s),
        "8 kernels": lambda s: [kernel(s) for _ in range(8)],
        "32 kernels": lambda s: [kernel(s) for _ in range(32)],
        "1 kernel + 8 single memops": lambda s: (kernel(s), waits_writes(s, 8, False)),
        "1 kernel + 32 single memops": lambda s: (kernel(s), waits_writes(s, 32, False)),
        "1 kernel + 1 batch of 8 memops": lambda s: (kernel(s), waits_writes(s, 8, True)),
        "1 kernel + 1 batch of 32 memops": lambda s: (kernel(s), waits_writes(s, 32, True)),
        "1 kernel + 4 batches of 8 memops": lambda s: (kernel(s), [waits_writes(s, 8, True) for _ in range(4)]),
        "1 kernel + 8 memsets": lambda s: (kernel(s), [memset(s, 3000 + 8 * i) for i in range(8)]),
        "1 kernel + 8 memcpys": lambda s: (kernel(s), [memcpy(s) for _ in range(8)]),
        "fork 2 x 1 kernel": lambda s: fork_join(2, kernel),
        "fork 4 x 1 kernel": lambda s: fork_join(4, kernel),
        "fork 4 x (kernel + 2 memops)": lambda s: fork_join(
            4, lambda t: (kernel(t), waits_writes(t, 2, False))),
        # About a P = 4 shard-copy call: control memops around forked copies and GEMMs.
        "call-like, memops single": lambda s: (
            waits_writes(s, 2, False), memset(s, 3000), waits_writes(s, 6, False),
            fork_join(2, lambda t: (kernel(t), memcpy(t), waits_writes(t, 3, False), kernel(t))),
            waits_writes(s, 6, False), memset(s, 3100), waits_writes(s, 8, False), memset(s, 3200),
            waits_writes(s, 4, False)),
        # What a call graph's cross-stream dependencies cost, beside the
        # same nodes with only the fork and the join.
        "2 streams, 4 kernels | 3 copies": lambda s: handoffs(s, 4, 3, False),
        "2 streams, 3 copies each after a kernel": lambda s: handoffs(s, 4, 3, True),
        "3 streams, 6 kernels | 6 copies": lambda s: handoffs(s, 6, 6, False, True),
        "3 streams, 6 copies each after a kernel": lambda s: handoffs(s, 6, 6, True, True),
        # cuBLASLt's GEMM kernels as graph nodes (launch attributes such as
        # clusters), beside the plain kernels above.
        "1 GEMM": lambda s: gemm(s),
        "8 GEMMs": lambda s: [gemm(s) for _ in range(8)],
        "2 streams, 3 copies each after a GEMM": lambda s: handoffs(s, 4, 3, True, work=gemm),
        "the same, copies at high priority": lambda s: handoffs(s, 4, 3, True, work=gemm, prio=True),
        "P=2 gemm-rs call graph, as captured": lambda s: p2_gemm_rs(s, True),
        "the same, no redundant edges": lambda s: p2_gemm_rs(s, False),
        "the same as captured, no high priority": lambda s: p2_gemm_rs(s, True, prio=False),
        "call-like, memops batched": lambda s: (
            waits_writes(s, 8, True),
            fork_join(2, lambda t: (kernel(t), memcpy(t), waits_writes(t, 3, True), kernel(t))),
            waits_writes(s, 22, True)),
    }

    if peer is not None:
        cases["1 kernel + 8 memcpys from a peer"] = lambda s: (
            kernel(s), [peer_memcpy(s) for _ in range(8)])
        cases["fork 3 x (peer memcpy + 1 memop)"] = lambda s: fork_join(
            3, lambda t: (peer_memcpy(t), waits_writes(t, 1, False)))
        # The control steps' flags: a rank writes its peers' words and
        # waits on its own (or the other way round).
        pw = peer_words.data_ptr()
        cases["1 kernel + 1 batch of 8 memops, peer's words"] = lambda s: (
            kernel(s), waits_writes(s, 8, True, at=pw))
        cases["1 kernel + 4 batches of 8 memops, peer's words"] = lambda s: (
            kernel(s), [waits_writes(s, 8, True, at=pw) for _ in range(4)])
        cases["1 kernel + 1 batch of 8 writes, peer's words"] = lambda s: (
            kernel(s), batch(s, [(WRITE, 2000 + i, 1) for i in range(8)], pw))
        cases["1 kernel + 1 batch of 8 waits, peer's words"] = lambda s: (
            kernel(s), batch(s, [(WAIT, 1000 + i, 0) for i in range(8)], pw))
        cases["1 kernel + 1 batch of 8 waits, own words"] = lambda s: (
            kernel(s), batch(s, [(WAIT, 1000 + i, 0) for i in range(8)]))

    # cuBLASLt's workspace and kernels are set up on every stream outside
    # any capture.
    for st in [main_s, high] + sides:
        gemm(st)
    torch.cuda.synchronize()
    rows = []
    for name, body in cases.items():
        for flags in args.flags:
            ge, nodes = d.capture(main_s, body, flags)
            med, mean = d.launch_host_stats(ge, main_s, args.launches)
            rows.append({"graph": name, "flags": flags, "nodes": nodes, "launch_us": med,
                         "mean_us": mean})
            print(f"{name:40} flags {flags}  {nodes:4d} nodes  {med:7.2f} us/launch "
                  f"(mean {mean:7.2f})", flush=True)
    # The launch into the legacy default stream (CUstream 0, PyTorch's
    # default current stream, where a model's calls are issued unless it
    # sets a stream): legacy semantics order it against every blocking
    # stream of the context.
    for name in ("1 kernel", "P=2 gemm-rs call graph, as captured"):
        ge, nodes = d.capture(main_s, cases[name], 8)
        med, mean = d.launch_host_stats(ge, vp(0), args.launches)
        rows.append({"graph": name, "flags": 8, "nodes": nodes, "launch_us": med,
                     "mean_us": mean, "stream": "legacy"})
        print(f"{name + ', into stream 0':40} flags 8  {nodes:4d} nodes  {med:7.2f} us/launch "
              f"(mean {mean:7.2f})", flush=True)
    # What the op path adds after a replay: one event record on the
    # caller's stream.
    ev = d.event()
    for label, st in (("a created stream", main_s), ("stream 0", vp(0))):
        times = []
        for _ in range(args.launches):
            t0 = time.perf_counter_ns()
            ok(cu.cuEventRecord(ev, st), "cuEventRecord")
            times.append((time.perf_counter_ns() - t0) / 1e3)
        d.sync(st)
        print(f"{'cuEventRecord on ' + label:40}          {statistics.median(times):7.2f} us "
              f"(mean {statistics.fmean(times):7.2f})", flush=True)
    t = [time.perf_counter_ns() for _ in range(1001)]
    print(f"# perf_counter_ns itself: {statistics.median(b - a for a, b in zip(t, t[1:])) / 1e3:.2f} us")
    print(f"# {torch.cuda.get_device_name(dev)}, torch {torch.__version__}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
