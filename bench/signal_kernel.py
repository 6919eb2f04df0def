"""Flags by a one-warp kernel instead of stream memory operations (GPU 0).

A replayed call's graph holds 6-8 batches of stream memory operations
(flag waits and writes), and ``cuGraphLaunch`` pays about 1.3 µs of host
time per batch node where a kernel node costs next to nothing
(``bench/graph_launch.py``). This asks whether a kernel of one warp that
does a batch's operations (spin on an acquire load for a wait, a release
store for a write) could take their place:

1. host µs per ``cuGraphLaunch`` of call-shaped graphs, batches against
   kernels;
2. device µs per flag hand-off between two streams (ping-pong, in a graph),
   memory operations against kernels;
3. whether the kernel runs beside a persistent cuBLASLt GEMM that holds
   every SM (it starts while the GEMM runs, not after), and what a warp
   spinning beside the GEMM for its whole run costs it.

    python bench/signal_kernel.py [--launches 2000] [--json OUT.json]
"""

import argparse
import ctypes
import json
import statistics
import time

# One thread runs the operations in order: kind 0 waits until the word is
# >= value (wrap-aware), kind 1 writes value with a system-scope release,
# kind 2 stores %globaltimer (64 bits) at the address, kind 3 waits as kind 0
# with relaxed loads 256 ns apart and one fence after.
PTX = r"""
.version 8.0
.target sm_90
.address_size 64
.visible .entry ficco_signal(.param .u64 ops, .param .u32 n)
{
  .reg .pred %p<4>;
  .reg .b32 %r<8>;
  .reg .b64 %rd<8>;
  ld.param.u64 %rd1, [ops];
  ld.param.u32 %r1, [n];
  mov.u32 %r7, %tid.x;
  setp.ne.u32 %p1, %r7, 0;
  @%p1 bra DONE;
  mov.u32 %r2, 0;
LOOP:
  setp.ge.u32 %p1, %r2, %r1;
  @%p1 bra DONE;
  mul.wide.u32 %rd2, %r2, 16;
  add.u64 %rd3, %rd1, %rd2;
  ld.global.u64 %rd4, [%rd3];
  ld.global.u32 %r3, [%rd3+8];
  ld.global.u32 %r4, [%rd3+12];
  setp.eq.u32 %p2, %r4, 1;
  @%p2 bra WRITE;
  setp.eq.u32 %p2, %r4, 2;
  @%p2 bra STAMP;
  setp.eq.u32 %p2, %r4, 3;
  @%p2 bra RELAXED;
SPIN:
  ld.acquire.sys.global.u32 %r5, [%rd4];
  sub.s32 %r6, %r5, %r3;
  setp.ge.s32 %p3, %r6, 0;
  @%p3 bra NEXT;
  nanosleep.u32 32;
  bra SPIN;
WRITE:
  fence.sc.sys;
  st.release.sys.global.u32 [%rd4], %r3;
  bra NEXT;
RELAXED:
  ld.relaxed.sys.global.u32 %r5, [%rd4];
  sub.s32 %r6, %r5, %r3;
  setp.ge.s32 %p3, %r6, 0;
  @%p3 bra SEEN;
  nanosleep.u32 256;
  bra RELAXED;
SEEN:
  fence.acq_rel.sys;
  bra NEXT;
STAMP:
  mov.u64 %rd5, %globaltimer;
  st.global.u64 [%rd4], %rd5;
NEXT:
  add.u32 %r2, %r2, 1;
  bra LOOP;
DONE:
  ret;
}
"""

WAIT, WRITE, STAMP, RELAXED = 0, 1, 2, 3


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--launches", type=int, default=2000)
    p.add_argument("--json", default=None)
    args = p.parse_args()

    import torch

    torch.cuda.init()
    dev = torch.device("cuda", 0)
    words = torch.zeros(8192, dtype=torch.int32, device=dev)
    stamps = torch.zeros(64, dtype=torch.int64, device=dev)
    data = torch.zeros(1 << 20, dtype=torch.bfloat16, device=dev)
    torch.cuda.synchronize()
    cu = ctypes.CDLL("libcuda.so.1")
    vp, u32, u64 = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint64

    def ok(r, what):
        if r != 0:
            raise RuntimeError(f"{what} failed: CUresult {r}")

    mod, fn = vp(), vp()
    src = PTX.encode() + b"\0"
    ok(cu.cuModuleLoadData(ctypes.byref(mod), ctypes.c_char_p(src)), "cuModuleLoadData")
    ok(cu.cuModuleGetFunction(ctypes.byref(fn), mod, b"ficco_signal"), "cuModuleGetFunction")
    # The same kernel again, asking for the largest shared-memory carveout
    # (the GEMMs' configuration), to see whether the carveout is what keeps a
    # GEMM block off the spinner's SM.
    mod2, fn_max_smem = vp(), vp()
    ok(cu.cuModuleLoadData(ctypes.byref(mod2), ctypes.c_char_p(src)), "cuModuleLoadData")
    ok(cu.cuModuleGetFunction(ctypes.byref(fn_max_smem), mod2, b"ficco_signal"), "cuModuleGetFunction")
    ok(cu.cuFuncSetAttribute(fn_max_smem, 9, 100), "cuFuncSetAttribute(carveout)")
    nregs = ctypes.c_int(0)
    ok(cu.cuFuncGetAttribute(ctypes.byref(nregs), 4, fn), "cuFuncGetAttribute")  # NUM_REGS

    def stream():
        s = vp()
        ok(cu.cuStreamCreate(ctypes.byref(s), 1), "cuStreamCreate")
        return s

    def event(timing=False):
        e = vp()
        ok(cu.cuEventCreate(ctypes.byref(e), 0 if timing else 2), "cuEventCreate")
        return e

    main_s = stream()
    sides = [stream() for _ in range(4)]
    base = words.data_ptr()
    keep = []  # op tables stay alive while graphs use them

    def table(ops):
        t = torch.zeros(2 * len(ops), dtype=torch.int64, device=dev)
        host = []
        for kind, addr, v in ops:
            host += [addr, (kind << 32) | (v & 0xFFFFFFFF)]
        t.copy_(torch.tensor(host, dtype=torch.int64))
        keep.append(t)
        return t

    def sig(s, ops):
        t = table(ops)
        a = ctypes.c_uint64(t.data_ptr())
        n = ctypes.c_uint32(len(ops))
        params = (vp * 2)(ctypes.cast(ctypes.byref(a), vp), ctypes.cast(ctypes.byref(n), vp))
        ok(cu.cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, s, params, None), "cuLaunchKernel")

    class Op(ctypes.Structure):
        _fields_ = [("operation", u32), ("pad", u32), ("address", u64), ("value", u64),
                    ("flags", u32), ("pad2", u32), ("alias", u64), ("rest", u64)]

    def batch(s, ops):
        arr = (Op * len(ops))()
        for j, (kind, addr, v) in enumerate(ops):
            arr[j].operation = 1 if kind == WAIT else 2
            arr[j].address = addr
            arr[j].value = v
            arr[j].flags = 0
        if len(ops) == 1:
            f = cu.cuStreamWaitValue32_v2 if ops[0][0] == WAIT else cu.cuStreamWriteValue32_v2
            ok(f(s, u64(ops[0][1]), u32(ops[0][2]), u32(0)), "single memop")
        else:
            ok(cu.cuStreamBatchMemOp_v2(s, u32(len(ops)), arr, u32(0)), "cuStreamBatchMemOp")

    def w(i):
        return base + 4 * i

    def kernel(s):
        with torch.cuda.stream(torch.cuda.ExternalStream(s.value, device=dev)):
            data[:256].add_(1)

    def memcpy(s, nbytes=4096):
        ok(cu.cuMemcpyDtoDAsync_v2(u64(data.data_ptr() + (1 << 20)), u64(data.data_ptr()),
                                   ctypes.c_size_t(nbytes), s), "cuMemcpyDtoDAsync")

    def fork_join(n_side, body):
        go = event()
        ok(cu.cuEventRecord(go, main_s), "cuEventRecord")
        ends = []
        for s in sides[:n_side]:
            ok(cu.cuStreamWaitEvent(s, go, u32(0)), "cuStreamWaitEvent")
            body(s)
            e = event()
            ok(cu.cuEventRecord(e, s), "cuEventRecord")
            ends.append(e)
        for e in ends:
            ok(cu.cuStreamWaitEvent(main_s, e, u32(0)), "cuStreamWaitEvent")

    def ops_of(n, at):
        # Waits for >= 0 (always true) and writes of 1: replayable alone.
        return [(WAIT, w(at + i), 0) if i % 2 else (WRITE, w(at + 2000 + i), 1) for i in range(n)]

    def call_like(flags):
        # About a P = 4 shard-copy call: 8 flag groups around forked copies and GEMMs.
        return lambda s: (
            flags(s, ops_of(8, 0)),
            fork_join(2, lambda t: (kernel(t), flags(t, ops_of(1, 100)), memcpy(t),
                                    flags(t, ops_of(3, 200)), kernel(t), flags(t, ops_of(2, 300)),
                                    memcpy(t), flags(t, ops_of(1, 400)))),
            flags(s, ops_of(6, 500)), flags(s, ops_of(8, 600)))

    def capture(body):
        ok(cu.cuStreamBeginCapture_v2(main_s, u32(2)), "cuStreamBeginCapture")
        try:
            body(main_s)
        finally:
            g = vp()
            r = cu.cuStreamEndCapture(main_s, ctypes.byref(g))
        ok(r, "cuStreamEndCapture")
        ge = vp()
        ok(cu.cuGraphInstantiateWithFlags(ctypes.byref(ge), g, u64(0)), "cuGraphInstantiate")
        ok(cu.cuGraphUpload(ge, main_s), "cuGraphUpload")
        return ge

    out = {"device": torch.cuda.get_device_name(dev), "torch": torch.__version__,
           "kernel_registers": nregs.value}
    print(f"# {out['device']}, torch {out['torch']}; ficco_signal: {nregs.value} registers/thread")

    # 1. host cost of a launch
    host = {}
    for name, flags in (("batches", batch), ("kernels", sig)):
        ge = capture(call_like(flags))
        times = []
        for i in range(args.launches):
            t0 = time.perf_counter_ns()
            ok(cu.cuGraphLaunch(ge, main_s), "cuGraphLaunch")
            times.append((time.perf_counter_ns() - t0) / 1e3)
            if i % 32 == 31:
                ok(cu.cuStreamSynchronize(main_s), "cuStreamSynchronize")
        ok(cu.cuStreamSynchronize(main_s), "cuStreamSynchronize")
        host[name] = statistics.median(times[args.launches // 10:])
        print(f"1. call-like graph, flags as {name:8}: {host[name]:6.2f} us host per launch", flush=True)
    out["host_us_per_launch"] = host

    # 2. device time of a flag hand-off between two streams
    rounds = 200
    hand = {}
    for name, flags, wk in (("memops", batch, WAIT), ("kernels", sig, WAIT),
                            ("kernels, relaxed", sig, RELAXED)):
        words.zero_()
        torch.cuda.synchronize()
        a, b = sides[0], sides[1]

        def body(s, flags=flags, a=a, b=b, wk=wk):
            go = event()
            ok(cu.cuEventRecord(go, s), "cuEventRecord")
            ok(cu.cuStreamWaitEvent(a, go, u32(0)), "wait")
            ok(cu.cuStreamWaitEvent(b, go, u32(0)), "wait")
            for i in range(rounds):
                flags(a, [(WRITE, w(4000 + 2 * i), 1)])
                flags(b, [(wk, w(4000 + 2 * i), 1)])
                flags(b, [(WRITE, w(4001 + 2 * i), 1)])
                flags(a, [(wk, w(4001 + 2 * i), 1)])
            for t in (a, b):
                e = event()
                ok(cu.cuEventRecord(e, t), "cuEventRecord")
                ok(cu.cuStreamWaitEvent(s, e, u32(0)), "join")

        ge = capture(body)
        e0, e1 = event(True), event(True)
        per = []
        for _ in range(5):
            words.zero_()
            torch.cuda.synchronize()
            ok(cu.cuEventRecord(e0, main_s), "rec")
            ok(cu.cuGraphLaunch(ge, main_s), "launch")
            ok(cu.cuEventRecord(e1, main_s), "rec")
            ok(cu.cuStreamSynchronize(main_s), "sync")
            ms = ctypes.c_float(0)
            ok(cu.cuEventElapsedTime(ctypes.byref(ms), e0, e1), "elapsed")
            per.append(ms.value * 1e3 / (2 * rounds))
        hand[name] = statistics.median(per)
        print(f"2. flag hand-off between two streams, {name:16}: {hand[name]:6.2f} us each", flush=True)
    out["handoff_us"] = hand

    # 3. beside a cuBLASLt GEMM that holds every SM. Every op table is made
    # before anything is queued (making one queues work on torch's stream,
    # and copying it in blocks the host).
    res = []
    sp = stamps.data_ptr()
    a = torch.cuda.ExternalStream(main_s.value, device=dev)
    t_first = table([(STAMP, sp, 0)])
    t_flag1 = table([(STAMP, sp + 8, 0), (WRITE, w(7000), 1)])
    t_flag2 = table([(STAMP, sp + 16, 0), (WRITE, w(7001), 1)])
    t_last = table([(STAMP, sp + 24, 0)])
    spinners = {kind: table([(kind, w(7000), 1), (STAMP, sp + 32, 0), (kind, w(7001), 1),
                             (STAMP, sp + 40, 0)]) for kind in (WAIT, RELAXED)}

    def launch(s, t, n, f=None):
        ptr = ctypes.c_uint64(t.data_ptr())
        cnt = ctypes.c_uint32(n)
        params = (vp * 2)(ctypes.cast(ctypes.byref(ptr), vp), ctypes.cast(ctypes.byref(cnt), vp))
        ok(cu.cuLaunchKernel(f or fn, 1, 1, 1, 32, 1, 1, 0, s, params, None), "cuLaunchKernel")

    for (m, k, n) in ((8192, 8192, 8192), (4096, 4096, 4096), (2048, 8192, 7168), (4096, 1792, 8192),
                      (1024, 8192, 2048)):
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        y = torch.randn(k, n, device=dev, dtype=torch.bfloat16)
        with torch.cuda.stream(a):
            for _ in range(max(3, int(2e12 / (2 * m * k * n)))):
                x @ y
        torch.cuda.synchronize()
        ok(cu.cuStreamSynchronize(main_s), "sync")
        for rep in range(4):
            for spinner in (None, WAIT, RELAXED, "carveout"):
                words.zero_()
                stamps.zero_()
                torch.cuda.synchronize()
                # Stream A: stamp, GEMM 1, stamp + flag 1, GEMM 2, stamp + flag 2,
                # GEMM 3, stamp. Stream B (queued while GEMM 1 runs): wait for
                # flag 1, stamp, wait for flag 2 (spinning all through GEMM 2),
                # stamp. Started beside GEMM 1, B's first stamp follows flag 1
                # by the hand-off's latency.
                launch(main_s, t_first, 1)
                with torch.cuda.stream(a):
                    x @ y
                launch(main_s, t_flag1, 2)
                if spinner == "carveout":
                    launch(sides[2], spinners[WAIT], 4, fn_max_smem)
                elif spinner is not None:
                    launch(sides[2], spinners[spinner], 4)
                with torch.cuda.stream(a):
                    x @ y
                launch(main_s, t_flag2, 2)
                with torch.cuda.stream(a):
                    x @ y
                launch(main_s, t_last, 1)
                ok(cu.cuStreamSynchronize(main_s), "sync")
                ok(cu.cuStreamSynchronize(sides[2]), "sync")
                t = stamps.cpu().tolist()
                row = {"shape": [m, k, n], "rep": rep,
                       "spinner": {None: "none", WAIT: "acquire", RELAXED: "relaxed",
                                   "carveout": "carveout"}[spinner],
                       "gemm1_us": (t[1] - t[0]) / 1e3, "gemm2_us": (t[2] - t[1]) / 1e3,
                       "gemm3_us": (t[3] - t[2]) / 1e3}
                if spinner is not None:
                    row["b_saw_flag1_after_us"] = (t[4] - t[1]) / 1e3
                    row["b_saw_flag2_after_us"] = (t[5] - t[2]) / 1e3
                res.append(row)
                print("3.", json.dumps(row), flush=True)
        for sp_name in ("none", "acquire", "relaxed", "carveout"):
            g2 = [r["gemm2_us"] for r in res if r["shape"] == [m, k, n] and r["spinner"] == sp_name]
            f1 = [r.get("b_saw_flag1_after_us", 0) for r in res
                  if r["shape"] == [m, k, n] and r["spinner"] == sp_name]
            print(f"3. {m}x{k}x{n} spinner {sp_name:8}: GEMM 2 median {statistics.median(g2):8.1f} us,"
                  f" B saw flag 1 after median {statistics.median(f1):7.1f} us", flush=True)
    out["beside_gemm"] = res

    # 4. whether a short kernel queued while a GEMM runs starts beside it or
    # only once the GEMM ends: A runs GEMM 1 and GEMM 2 with stamps around
    # them; B's stamp kernel is queued 300 µs after GEMM 2 was.
    late = []
    t_b = table([(STAMP, sp + 32, 0)])
    for (m, k, n) in ((8192, 8192, 8192), (4096, 4096, 4096), (2048, 8192, 7168), (4096, 1792, 8192)):
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        y = torch.randn(k, n, device=dev, dtype=torch.bfloat16)
        for rep in range(5):
            stamps.zero_()
            torch.cuda.synchronize()
            launch(main_s, t_first, 1)
            with torch.cuda.stream(a):
                x @ y
            launch(main_s, t_flag1, 2)
            with torch.cuda.stream(a):
                x @ y
                x @ y
            launch(main_s, t_flag2, 2)
            time.sleep(300e-6)
            launch(sides[2], t_b, 1)
            ok(cu.cuStreamSynchronize(main_s), "sync")
            ok(cu.cuStreamSynchronize(sides[2]), "sync")
            t = stamps.cpu().tolist()
            row = {"shape": [m, k, n], "gemm2_start_to_b_us": (t[4] - t[1]) / 1e3,
                   "b_before_gemm2_end_us": (t[2] - t[4]) / 1e3}
            late.append(row)
            print("4.", json.dumps(row), flush=True)
    out["queued_beside_gemm"] = late
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
