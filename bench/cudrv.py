"""The CUDA driver through ctypes, for the bench probes that build graphs by
hand (``graph_launch.py``, ``signal_kernel.py``): streams, events, stream
memory operations, a fork and join of side streams, graph capture, and the
host or device time of a graph's launches. PyTorch must have initialised
CUDA first (its primary context is the current one)."""

import ctypes
import statistics
import time

vp, u32, u64 = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint64

# CUstreamBatchMemOpType: wait / write of a 32-bit value.
MEMOP_WAIT, MEMOP_WRITE = 1, 2


class _MemOp(ctypes.Structure):
    """CUstreamBatchMemOpParams (a 48-byte union) as a wait or write of 32 bits."""
    _fields_ = [("operation", u32), ("pad", u32), ("address", u64), ("value", u64),
                ("flags", u32), ("pad2", u32), ("alias", u64), ("rest", u64)]


class Driver:
    def __init__(self):
        self.cu = ctypes.CDLL("libcuda.so.1")

    def ok(self, r, what):
        if r != 0:
            raise RuntimeError(f"{what} failed: CUresult {r}")

    def stream(self):
        """A non-blocking stream."""
        s = vp()
        self.ok(self.cu.cuStreamCreate(ctypes.byref(s), 1), "cuStreamCreate")
        return s

    def event(self, timing=False):
        e = vp()
        self.ok(self.cu.cuEventCreate(ctypes.byref(e), 0 if timing else 2), "cuEventCreate")
        return e

    def sync(self, s):
        self.ok(self.cu.cuStreamSynchronize(s), "cuStreamSynchronize")

    def memops(self, s, ops):
        """``ops`` as (MEMOP_WAIT or MEMOP_WRITE, address, value): one
        ``cuStreamBatchMemOp`` (a single one by the plain call). Waits are
        >=, writes fenced (default flags)."""
        if len(ops) == 1:
            kind, addr, v = ops[0]
            f = self.cu.cuStreamWaitValue32_v2 if kind == MEMOP_WAIT else self.cu.cuStreamWriteValue32_v2
            self.ok(f(s, u64(addr), u32(v), u32(0)), "cuStreamWait/WriteValue32")
            return
        arr = (_MemOp * len(ops))()
        for j, (kind, addr, v) in enumerate(ops):
            arr[j].operation = kind
            arr[j].address = addr
            arr[j].value = v
            arr[j].flags = 0
        self.ok(self.cu.cuStreamBatchMemOp_v2(s, u32(len(ops)), arr, u32(0)), "cuStreamBatchMemOp")

    def fork_join(self, main, sides, body):
        """Each side stream starts after ``main``'s work so far, runs
        ``body(side)``, and ``main`` waits for all of them."""
        go = self.event()
        self.ok(self.cu.cuEventRecord(go, main), "cuEventRecord")
        ends = []
        for s in sides:
            self.ok(self.cu.cuStreamWaitEvent(s, go, u32(0)), "cuStreamWaitEvent")
            body(s)
            e = self.event()
            self.ok(self.cu.cuEventRecord(e, s), "cuEventRecord")
            ends.append(e)
        for e in ends:
            self.ok(self.cu.cuStreamWaitEvent(main, e, u32(0)), "cuStreamWaitEvent")

    def capture(self, main, body, flags=0):
        """What ``body(main)`` issues (relaxed capture), instantiated with
        ``flags`` and uploaded: (graph exec, node count)."""
        self.ok(self.cu.cuStreamBeginCapture_v2(main, u32(2)), "cuStreamBeginCapture")
        try:
            body(main)
        finally:
            g = vp()
            r = self.cu.cuStreamEndCapture(main, ctypes.byref(g))
        self.ok(r, "cuStreamEndCapture")
        n = ctypes.c_size_t(0)
        self.ok(self.cu.cuGraphGetNodes(g, None, ctypes.byref(n)), "cuGraphGetNodes")
        ge = vp()
        self.ok(self.cu.cuGraphInstantiateWithFlags(ctypes.byref(ge), g, u64(flags)), "cuGraphInstantiate")
        self.ok(self.cu.cuGraphUpload(ge, main), "cuGraphUpload")
        return ge, n.value

    def launch_host_us(self, ge, s, launches, drain_every=32):
        """Median host µs of one ``cuGraphLaunch`` (the first tenth left
        out), the device drained every ``drain_every`` launches so that the
        launch queue never fills."""
        return self.launch_host_stats(ge, s, launches, drain_every)[0]

    def launch_host_stats(self, ge, s, launches, drain_every=32):
        """``launch_host_us``'s median and mean (the mean counts the rare
        slow launches, as a per-call mean of the host's time does)."""
        times = []
        for i in range(launches):
            t0 = time.perf_counter_ns()
            r = self.cu.cuGraphLaunch(ge, s)
            times.append((time.perf_counter_ns() - t0) / 1e3)
            self.ok(r, "cuGraphLaunch")
            if i % drain_every == drain_every - 1:
                self.sync(s)
        self.sync(s)
        kept = times[launches // 10:]
        return statistics.median(kept), statistics.fmean(kept)

    def launch_device_us(self, ge, s, reps=7, before=None):
        """Median device µs of one launch of ``ge`` (events around it; the
        first left out), ``before()`` called ahead of each (with the device
        idle)."""
        e0, e1 = self.event(True), self.event(True)
        per = []
        for _ in range(reps):
            if before is not None:
                before()
            self.ok(self.cu.cuEventRecord(e0, s), "cuEventRecord")
            self.ok(self.cu.cuGraphLaunch(ge, s), "cuGraphLaunch")
            self.ok(self.cu.cuEventRecord(e1, s), "cuEventRecord")
            self.sync(s)
            ms = ctypes.c_float(0)
            self.ok(self.cu.cuEventElapsedTime(ctypes.byref(ms), e0, e1), "cuEventElapsedTime")
            per.append(ms.value * 1e3)
        return statistics.median(per[1:])
