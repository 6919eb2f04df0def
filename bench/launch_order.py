"""Does a launch-completion event let work on another stream start while a
persistent kernel runs, issued directly and replayed from a graph? (GPU 0)

A tile GEMM (one CTA per SM, spinning on flags) cannot be captured as is:
in a replay the driver may queue a copy's wait on one of its counters
ahead of its launch on a shared hardware queue. An edge from the kernel's
*launch* (``CU_LAUNCH_ATTRIBUTE_LAUNCH_COMPLETION_EVENT``; in a graph a
``LAUNCH_ORDER`` port) would rule that out without giving up the overlap,
if the driver honours it rather than waiting for the kernel to end.

A kernel of one block per SM spins ``--us`` µs; block 0 stamps its start,
sets a word (the first counter) and stamps its end. A side stream waits for
the kernel's launch (the event), then for the word (a stream memory
operation, as ficco's copy streams wait), then stamps. Printed per mode:
when the side's stamp came, µs after the kernel's start, against the
kernel's length: near 0 is overlap, near the length is serialisation.

    python bench/launch_order.py [--us 300] [--reps 20] [--flags F] [--capture-mode M] [--library]
                                 [--upload]

``--flags`` are ``cuGraphInstantiateWithFlags``'s (8: use node priorities,
as ficco's executor instantiates); ``--capture-mode`` 0 global, 1 thread
local, 2 relaxed. ``--upload`` uploads each graph before its first launch:
with a ``LAUNCH_ORDER`` edge that crashed inside the CUDA 13.0 driver in
ficco's executor (``bench/segv_report.c``), so the executor leaves such a
graph to its first launch.
"""

import argparse
import ctypes
import statistics

from cudrv import MEMOP_WAIT, Driver, u32, u64, vp

PTX = r"""
.version 8.0
.target sm_90
.address_size 64
.visible .entry spin(.param .u64 stamps, .param .u64 word, .param .u64 ns)
{
  .reg .pred %p<3>;
  .reg .b32 %r<4>;
  .reg .b64 %rd<8>;
  ld.param.u64 %rd1, [stamps];
  ld.param.u64 %rd2, [word];
  ld.param.u64 %rd3, [ns];
  mov.u64 %rd4, %globaltimer;
  mov.u32 %r1, %tid.x;
  mov.u32 %r2, %ctaid.x;
  or.b32 %r3, %r1, %r2;
  setp.eq.u32 %p1, %r3, 0;
  @!%p1 bra SPIN;
  st.global.u64 [%rd1], %rd4;
  fence.sc.sys;
  st.release.sys.global.u32 [%rd2], 1;
SPIN:
  mov.u64 %rd5, %globaltimer;
  sub.u64 %rd6, %rd5, %rd4;
  setp.lt.u64 %p2, %rd6, %rd3;
  @%p2 bra SPIN;
  @!%p1 bra DONE;
  st.global.u64 [%rd1+8], %rd5;
DONE:
  ret;
}
.visible .entry stamp(.param .u64 at)
{
  .reg .b64 %rd<3>;
  ld.param.u64 %rd1, [at];
  mov.u64 %rd2, %globaltimer;
  st.global.u64 [%rd1], %rd2;
  ret;
}
"""

LAUNCH_COMPLETION_EVENT = 12  # CU_LAUNCH_ATTRIBUTE_LAUNCH_COMPLETION_EVENT


class LaunchAttr(ctypes.Structure):
    """CUlaunchAttribute with the launchCompletionEvent member of its 64-byte union."""
    _fields_ = [("id", u32), ("pad", u32), ("event", vp), ("flags", ctypes.c_int),
                ("rest", ctypes.c_char * 52)]


class LaunchConfig(ctypes.Structure):
    _fields_ = [("gx", u32), ("gy", u32), ("gz", u32), ("bx", u32), ("by", u32), ("bz", u32),
                ("smem", u32), ("stream", vp), ("attrs", ctypes.POINTER(LaunchAttr)),
                ("nattrs", u32)]


class EdgeData(ctypes.Structure):
    """CUgraphEdgeData: from_port, to_port, type, reserved[5]."""
    _fields_ = [("from_port", ctypes.c_ubyte), ("to_port", ctypes.c_ubyte),
                ("type", ctypes.c_ubyte), ("reserved", ctypes.c_ubyte * 5)]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--us", type=float, default=300.0, help="how long the kernel spins")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--flags", type=int, default=0, help="graph instantiation flags")
    p.add_argument("--capture-mode", type=int, default=2)
    p.add_argument("--upload", action="store_true",
                   help="cuGraphUpload each graph before its first launch (as ficco's executor did)")
    p.add_argument("--library", action="store_true",
                   help="load the kernels as ficco's executor does (cuLibraryLoadData, "
                        "cuLibraryGetKernel, cuKernelGetFunction), not as a module")
    args = p.parse_args()

    import torch

    torch.cuda.init()
    dev = torch.device("cuda", 0)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    stamps = torch.zeros(8, dtype=torch.int64, device=dev)
    word = torch.zeros(64, dtype=torch.int32, device=dev)
    torch.cuda.synchronize()
    d = Driver()
    cu, ok = d.cu, d.ok
    mod, spin, stamp = vp(), vp(), vp()
    image = ctypes.c_char_p(PTX.encode() + b"\0")
    if args.library:
        ok(cu.cuLibraryLoadData(ctypes.byref(mod), image, None, None, u32(0), None, None, u32(0)),
           "cuLibraryLoadData")
        for f, name in ((spin, b"spin"), (stamp, b"stamp")):
            k = vp()
            ok(cu.cuLibraryGetKernel(ctypes.byref(k), mod, name), "cuLibraryGetKernel")
            ok(cu.cuKernelGetFunction(ctypes.byref(f), k), "cuKernelGetFunction")
    else:
        ok(cu.cuModuleLoadData(ctypes.byref(mod), image), "cuModuleLoadData")
        ok(cu.cuModuleGetFunction(ctypes.byref(spin), mod, b"spin"), "cuModuleGetFunction")
        ok(cu.cuModuleGetFunction(ctypes.byref(stamp), mod, b"stamp"), "cuModuleGetFunction")
    main_s, side = d.stream(), d.stream()
    launched, ended = d.event(), d.event()
    keep = []

    def spin_kernel(s, event):
        a = [u64(stamps.data_ptr()), u64(word.data_ptr()), u64(int(args.us * 1000))]
        keep.append(a)
        params = (vp * 3)(*[ctypes.cast(ctypes.byref(x), vp) for x in a])
        attr = LaunchAttr(id=LAUNCH_COMPLETION_EVENT, event=event, flags=0)
        cfg = LaunchConfig(sms, 1, 1, 32, 1, 1, 0, s, ctypes.pointer(attr) if event else None,
                           1 if event else 0)
        keep.append((attr, cfg))
        ok(cu.cuLaunchKernelEx(ctypes.byref(cfg), spin, params, None), "cuLaunchKernelEx")

    def stamp_kernel(s, slot):
        a = u64(stamps.data_ptr() + 8 * slot)
        keep.append(a)
        params = (vp * 1)(ctypes.cast(ctypes.byref(a), vp))
        ok(cu.cuLaunchKernel(stamp, 1, 1, 1, 1, 1, 1, 0, s, params, None), "cuLaunchKernel")

    def issue(mode):
        """The kernel on main; the side waits (launch event, or the kernel's
        end for `after-end`), waits for the word, stamps; main joins."""
        go = d.event()
        ok(cu.cuEventRecord(go, main_s), "cuEventRecord")
        ok(cu.cuStreamWaitEvent(side, go, u32(0)), "cuStreamWaitEvent")
        if mode == "launch-order":
            spin_kernel(main_s, launched)
            ok(cu.cuStreamWaitEvent(side, launched, u32(0)), "cuStreamWaitEvent")
        elif mode == "after-end":
            spin_kernel(main_s, None)
            ok(cu.cuEventRecord(ended, main_s), "cuEventRecord")
            ok(cu.cuStreamWaitEvent(side, ended, u32(0)), "cuStreamWaitEvent")
        else:  # no edge at all: what ficco issues directly
            spin_kernel(main_s, None)
        d.memops(side, [(MEMOP_WAIT, word.data_ptr(), 1)])
        stamp_kernel(side, 2)
        done = d.event()
        ok(cu.cuEventRecord(done, side), "cuEventRecord")
        ok(cu.cuStreamWaitEvent(main_s, done, u32(0)), "cuStreamWaitEvent")

    def reset():
        word.zero_()
        stamps.zero_()
        torch.cuda.synchronize()

    def measure(run):
        after, length = [], []
        for _ in range(args.reps):
            reset()
            run()
            d.sync(main_s)
            t = stamps.tolist()
            after.append((t[2] - t[0]) / 1e3)
            length.append((t[1] - t[0]) / 1e3)
        return statistics.median(after), max(after), statistics.median(length)

    print(f"{sms} blocks spinning {args.us:.0f} us; the side's stamp, us after the kernel's start "
          f"(median, max over {args.reps}), and the kernel's length:")
    for mode in ("no-edge", "launch-order", "after-end"):
        med, worst, length = measure(lambda: issue(mode))
        print(f"  direct  {mode:13} {med:8.1f} {worst:8.1f}   kernel {length:7.1f}", flush=True)
        ok(cu.cuStreamBeginCapture_v2(main_s, u32(args.capture_mode)), "cuStreamBeginCapture")
        try:
            issue(mode)
        finally:
            g = vp()
            r = cu.cuStreamEndCapture(main_s, ctypes.byref(g))
        ok(r, f"cuStreamEndCapture ({mode})")
        n = ctypes.c_size_t(0)
        ok(cu.cuGraphGetEdges_v2(g, None, None, None, ctypes.byref(n)), "cuGraphGetEdges")
        frm, to = (vp * n.value)(), (vp * n.value)()
        data = (EdgeData * n.value)()
        ok(cu.cuGraphGetEdges_v2(g, frm, to, data, ctypes.byref(n)), "cuGraphGetEdges")
        ports = sorted({(e.from_port, e.type) for e in data})
        ge = vp()
        ok(cu.cuGraphInstantiateWithFlags(ctypes.byref(ge), g, u64(args.flags)), "cuGraphInstantiate")
        if args.upload:
            print(f"  graph   {mode:13} cuGraphUpload ...", flush=True)
            ok(cu.cuGraphUpload(ge, main_s), "cuGraphUpload")
        med, worst, length = measure(lambda: ok(cu.cuGraphLaunch(ge, main_s), "cuGraphLaunch"))
        print(f"  graph   {mode:13} {med:8.1f} {worst:8.1f}   kernel {length:7.1f}   "
              f"edges (from_port, type): {ports}", flush=True)


if __name__ == "__main__":
    main()
