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
   memory operations against kernels, and what a wait with nothing to wait
   for, or a write, adds in front of a kernel;
3. whether the kernel runs beside a persistent cuBLASLt GEMM that holds
   every SM (it starts while the GEMM runs, not after), and what a warp
   spinning beside the GEMM for its whole run costs it.

    python bench/signal_kernel.py [--launches 2000] [--json OUT.json] [--skip-gemm]
"""

import argparse
import ctypes
import json
import statistics
import time

from cudrv import MEMOP_WAIT, MEMOP_WRITE, Driver, u32, u64, vp

# One thread runs the operations in order: kind 0 waits until the word is
# >= value (wrap-aware), kind 1 writes value with a system-scope release,
# kind 2 stores %globaltimer (64 bits) at the address, kind 3 waits as kind 0
# with relaxed loads 256 ns apart and one fence after, kind 4 writes as kind 1
# and fences after the store.
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
  setp.eq.u32 %p2, %r4, 4;
  @%p2 bra WRITEFENCE;
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
WRITEFENCE:
  fence.sc.sys;
  st.release.sys.global.u32 [%rd4], %r3;
  fence.sc.sys;
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

WAIT, WRITE, STAMP, RELAXED, WRITE_FENCE = 0, 1, 2, 3, 4
SIDES = 4


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--launches", type=int, default=2000)
    p.add_argument("--json", default=None)
    p.add_argument("--skip-gemm", action="store_true", help="leave out parts 3 and 4")
    p.add_argument("--host-visibility", action="store_true",
                   help="only part 5: does the host see a write the kernel made before it spins")
    args = p.parse_args()

    import torch

    torch.cuda.init()
    dev = torch.device("cuda", 0)
    words = torch.zeros(8192, dtype=torch.int32, device=dev)
    stamps = torch.zeros(64, dtype=torch.int64, device=dev)
    data = torch.zeros(1 << 20, dtype=torch.bfloat16, device=dev)
    torch.cuda.synchronize()
    d = Driver()
    cu, ok = d.cu, d.ok

    def load(max_smem=False):
        mod, fn = vp(), vp()
        ok(cu.cuModuleLoadData(ctypes.byref(mod), ctypes.c_char_p(PTX.encode() + b"\0")), "cuModuleLoadData")
        ok(cu.cuModuleGetFunction(ctypes.byref(fn), mod, b"ficco_signal"), "cuModuleGetFunction")
        if max_smem:
            # The GEMMs' configuration: does the carveout keep a GEMM block
            # off the waiting warp's SM?
            ok(cu.cuFuncSetAttribute(fn, 9, 100), "cuFuncSetAttribute(carveout)")
        return fn

    fn, fn_max_smem = load(), load(max_smem=True)
    nregs = ctypes.c_int(0)
    ok(cu.cuFuncGetAttribute(ctypes.byref(nregs), 4, fn), "cuFuncGetAttribute")  # NUM_REGS
    main_s = d.stream()
    sides = [d.stream() for _ in range(SIDES)]
    keep = []  # op tables stay alive while graphs use them

    def w(i):
        return words.data_ptr() + 4 * i

    def table(ops):
        t = torch.tensor([x for kind, addr, v in ops for x in (addr, (kind << 32) | (v & 0xFFFFFFFF))],
                         dtype=torch.int64).to(dev)
        keep.append(t)
        return t

    def launch(s, t, n, f=None):
        ptr, cnt = u64(t.data_ptr()), u32(n)
        params = (vp * 2)(ctypes.cast(ctypes.byref(ptr), vp), ctypes.cast(ctypes.byref(cnt), vp))
        ok(cu.cuLaunchKernel(f or fn, 1, 1, 1, 32, 1, 1, 0, s, params, None), "cuLaunchKernel")

    def sig(s, ops):
        launch(s, table(ops), len(ops))

    def memops(s, ops):
        d.memops(s, [(MEMOP_WAIT if kind == WAIT else MEMOP_WRITE, addr, v) for kind, addr, v in ops])

    def kernel(s):
        with torch.cuda.stream(torch.cuda.ExternalStream(s.value, device=dev)):
            data[:256].add_(1)

    def memcpy(s, nbytes=4096):
        ok(cu.cuMemcpyDtoDAsync_v2(u64(data.data_ptr() + (1 << 20)), u64(data.data_ptr()),
                                   ctypes.c_size_t(nbytes), s), "cuMemcpyDtoDAsync")

    def ops_of(n, at):
        # Waits for >= 0 (always true) and writes of 1: replayable alone.
        return [(WAIT, w(at + i), 0) if i % 2 else (WRITE, w(at + 2000 + i), 1) for i in range(n)]

    def call_like(flags):
        # About a P = 4 shard-copy call: 8 flag groups around forked copies and GEMMs.
        return lambda s: (
            flags(s, ops_of(8, 0)),
            d.fork_join(s, sides[:2], lambda t: (
                kernel(t), flags(t, ops_of(1, 100)), memcpy(t), flags(t, ops_of(3, 200)), kernel(t),
                flags(t, ops_of(2, 300)), memcpy(t), flags(t, ops_of(1, 400)))),
            flags(s, ops_of(6, 500)), flags(s, ops_of(8, 600)))

    out = {"device": torch.cuda.get_device_name(dev), "torch": torch.__version__,
           "kernel_registers": nregs.value}
    if args.host_visibility:
        # 5. A write to pinned host memory, then a wait on a device word
        # nobody sets yet: does the host see the write while the kernel
        # spins? (The watch's start mark is such a write.)
        seen = {}
        for name, kind in (("write, then spin", WRITE), ("write + fence, then spin", WRITE_FENCE)):
            host = torch.zeros(1, dtype=torch.int32, pin_memory=True)
            words.zero_()
            torch.cuda.synchronize()
            side = d.stream()
            sig(side, [(kind, host.data_ptr(), 7), (WAIT, w(7100), 1)])
            t0 = time.perf_counter()
            while host[0].item() != 7 and time.perf_counter() - t0 < 2.0:
                pass
            seen[name] = (time.perf_counter() - t0) * 1e6 if host[0].item() == 7 else None
            memops(main_s, [(WRITE, w(7100), 1)])
            d.sync(side)
            print(f"5. {name:26}: host saw it after {seen[name]} us (None: not within 2 s)", flush=True)
        out["host_visibility_us"] = seen
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)
        return
    print(f"# {out['device']}, torch {out['torch']}; ficco_signal: {nregs.value} registers/thread")

    # 1. host cost of a launch
    host = {}
    for name, flags in (("batches", memops), ("kernels", sig)):
        ge, _ = d.capture(main_s, call_like(flags))
        host[name] = d.launch_host_us(ge, main_s, args.launches)
        print(f"1. call-like graph, flags as {name:8}: {host[name]:6.2f} us host per launch", flush=True)
    out["host_us_per_launch"] = host

    def zeroed():
        words.zero_()
        torch.cuda.synchronize()

    # 2. device time of a flag hand-off between two streams
    rounds = 200
    hand = {}
    for name, flags, wk in (("memops", memops, WAIT), ("kernels", sig, WAIT),
                            ("kernels, relaxed", sig, RELAXED)):
        def body(s, flags=flags, wk=wk):
            a, b = sides[0], sides[1]
            go = d.event()
            ok(cu.cuEventRecord(go, s), "cuEventRecord")
            for t in (a, b):
                ok(cu.cuStreamWaitEvent(t, go, u32(0)), "cuStreamWaitEvent")
            for i in range(rounds):
                flags(a, [(WRITE, w(4000 + 2 * i), 1)])
                flags(b, [(wk, w(4000 + 2 * i), 1)])
                flags(b, [(WRITE, w(4001 + 2 * i), 1)])
                flags(a, [(wk, w(4001 + 2 * i), 1)])
            for t in (a, b):
                e = d.event()
                ok(cu.cuEventRecord(e, t), "cuEventRecord")
                ok(cu.cuStreamWaitEvent(s, e, u32(0)), "cuStreamWaitEvent")

        ge, _ = d.capture(main_s, body)
        hand[name] = d.launch_device_us(ge, main_s, reps=6, before=zeroed) / (2 * rounds)
        print(f"2. flag hand-off between two streams, {name:16}: {hand[name]:6.2f} us each", flush=True)
    out["handoff_us"] = hand

    # 2b. device time a flag operation adds in front of a kernel when it has
    # nothing to wait for (a chunk that landed early): 200 x (operation,
    # small kernel) on one stream, in a graph.
    words.zero_()
    words[5000:5200].fill_(1)
    torch.cuda.synchronize()
    chain = {}
    for name, flags, kind in (("kernel only", None, None),
                              ("memop wait (set) + kernel", memops, WAIT),
                              ("signal-kernel wait (set) + kernel", sig, WAIT),
                              ("memop write + kernel", memops, WRITE),
                              ("signal-kernel write + kernel", sig, WRITE)):
        def body(s, flags=flags, kind=kind):
            for i in range(200):
                if flags is not None:
                    flags(s, [(kind, w((5000 if kind == WAIT else 5400) + i), 1)])
                kernel(s)

        ge, _ = d.capture(main_s, body)
        chain[name] = d.launch_device_us(ge, main_s) / 200
        print(f"2b. {name:36}: {chain[name]:6.2f} us per step on the device", flush=True)
    out["chain_us_per_step"] = chain

    if not args.skip_gemm:
        g = GemmProbe(torch, dev, d, main_s, sides[2], words, stamps, table, launch)
        out["beside_gemm"] = g.beside(fn_max_smem)
        out["queued_beside_gemm"] = g.queued()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


SHAPES = ((8192, 8192, 8192), (4096, 4096, 4096), (2048, 8192, 7168), (4096, 1792, 8192), (1024, 8192, 2048))


class GemmProbe:
    """Parts 3 and 4: cuBLASLt GEMMs (torch.mm) on the main stream with
    ``%globaltimer`` stamps between them (stamps 0-3; flags 1 and 2, words
    7000 and 7001, set with stamps 1 and 2), a kernel on a side stream
    (stamps 4, 5). Every op table is made before anything is queued: making
    one queues work on torch's stream and blocks the host."""

    def __init__(self, torch, dev, d, main_s, side, words, stamps, table, launch):
        self.torch, self.dev, self.d, self.main_s, self.side = torch, dev, d, main_s, side
        self.words, self.stamps, self.launch = words, stamps, launch
        sp = stamps.data_ptr()

        def flag(i):
            return words.data_ptr() + 4 * (7000 + i)

        self.t = [table([(STAMP, sp, 0)]), table([(STAMP, sp + 8, 0), (WRITE, flag(0), 1)]),
                  table([(STAMP, sp + 16, 0), (WRITE, flag(1), 1)]), table([(STAMP, sp + 24, 0)])]
        self.spinners = {kind: table([(kind, flag(0), 1), (STAMP, sp + 32, 0), (kind, flag(1), 1),
                                      (STAMP, sp + 40, 0)]) for kind in (WAIT, RELAXED)}
        self.t_b = table([(STAMP, sp + 32, 0)])

    def operands(self, m, k, n):
        torch = self.torch
        x = torch.randn(m, k, device=self.dev, dtype=torch.bfloat16)
        y = torch.randn(k, n, device=self.dev, dtype=torch.bfloat16)
        return x, y

    def run(self, x, y, middle, last, between=None, after=None):
        """Stamp, GEMM 1, stamp + flag 1, [between], ``middle`` GEMMs, stamp +
        flag 2, [after], ``last`` GEMMs, stamp; returns the stamps (µs) once
        done."""
        torch = self.torch
        self.words[7000:7002].zero_()
        self.stamps.zero_()
        torch.cuda.synchronize()
        a = torch.cuda.ExternalStream(self.main_s.value, device=self.dev)
        self.launch(self.main_s, self.t[0], 1)
        with torch.cuda.stream(a):
            x @ y
        self.launch(self.main_s, self.t[1], 2)
        if between is not None:
            between()
        with torch.cuda.stream(a):
            for _ in range(middle):
                x @ y
        self.launch(self.main_s, self.t[2], 2)
        if after is not None:
            after()
        with torch.cuda.stream(a):
            for _ in range(last):
                x @ y
        self.launch(self.main_s, self.t[3], 1)
        self.d.sync(self.main_s)
        self.d.sync(self.side)
        return [v / 1e3 for v in self.stamps.cpu().tolist()]

    def beside(self, fn_max_smem):
        """3. A warp spinning beside a GEMM that holds every SM: queued while
        GEMM 1 runs, it waits for flag 1, stamps, and spins through GEMM 2
        until flag 2. Started beside GEMM 1, its stamp follows flag 1 by a
        hand-off; GEMM 2 with and without it is the cost of a resident warp."""
        res = []
        for (m, k, n) in SHAPES:
            x, y = self.operands(m, k, n)
            with self.torch.cuda.stream(self.torch.cuda.ExternalStream(self.main_s.value, device=self.dev)):
                for _ in range(max(3, int(2e12 / (2 * m * k * n)))):
                    x @ y
            self.d.sync(self.main_s)
            spin = {
                "none": None,
                "acquire": lambda: self.launch(self.side, self.spinners[WAIT], 4),
                "relaxed": lambda: self.launch(self.side, self.spinners[RELAXED], 4),
                "carveout": lambda: self.launch(self.side, self.spinners[WAIT], 4, fn_max_smem),
            }
            for rep in range(4):
                for name, between in spin.items():
                    t = self.run(x, y, 1, 1, between)
                    row = {"shape": [m, k, n], "rep": rep, "spinner": name,
                           "gemm1_us": t[1] - t[0], "gemm2_us": t[2] - t[1], "gemm3_us": t[3] - t[2]}
                    if between is not None:
                        row["b_saw_flag1_after_us"] = t[4] - t[1]
                        row["b_saw_flag2_after_us"] = t[5] - t[2]
                    res.append(row)
                    print("3.", json.dumps(row), flush=True)
            for name in spin:
                mine = [r for r in res if r["shape"] == [m, k, n] and r["spinner"] == name]
                g2 = statistics.median(r["gemm2_us"] for r in mine)
                f1 = statistics.median(r.get("b_saw_flag1_after_us", 0) for r in mine)
                print(f"3. {m}x{k}x{n} spinner {name:8}: GEMM 2 median {g2:8.1f} us,"
                      f" B saw flag 1 after median {f1:7.1f} us", flush=True)
        return res

    def queued(self):
        """4. Whether a short kernel queued while a GEMM runs starts beside it
        or only once the GEMM ends: GEMM 1, then two GEMMs between stamps
        1 and 2; the side stream's stamp kernel is queued 300 µs (host)
        after them."""
        late = []
        for (m, k, n) in SHAPES[:4]:
            x, y = self.operands(m, k, n)
            for _ in range(5):
                t = self.run(x, y, 2, 0, after=lambda: (time.sleep(300e-6),
                                                         self.launch(self.side, self.t_b, 1)))
                row = {"shape": [m, k, n], "gemm2_start_to_b_us": t[4] - t[1],
                       "b_before_gemm2_end_us": t[2] - t[4]}
                late.append(row)
                print("4.", json.dumps(row), flush=True)
        return late


if __name__ == "__main__":
    main()
