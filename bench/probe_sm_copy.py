"""Which copies need SMs? A kernel that fills every SM spins until a flag is
set; on another stream a copy (or memset) runs, then a stream write (no SMs)
sets the flag. If the copy needs SMs it cannot start until the spinning
kernel gives up (its 2 s timeout): the copy "needed SMs". Run on the GPU
machine: python3 bench/probe_sm_copy.py (2 GPUs for the peer rows)."""
import ctypes, time
import cupy as cp

cuda = ctypes.CDLL("libcuda.so.1")
SPIN = r'''
extern "C" __global__ void spin(volatile int* flag, int* timed_out, long long limit) {
  extern __shared__ char pad[];
  if (threadIdx.x == 0) {
    long long t0 = clock64();
    while (*flag == 0) {
      if (clock64() - t0 > limit) { atomicAdd(timed_out, 1); break; }
    }
  }
  __syncthreads();
  if (threadIdx.x == 1) pad[0] = 1;
}
'''
mod = cp.RawModule(code=SPIN)
spin = mod.get_function("spin")
spin.max_dynamic_shared_size_bytes = 100 * 1024


class Attr(ctypes.Structure):  # CUmemcpyAttributes
    _fields_ = [("srcAccessOrder", ctypes.c_int), ("srcType", ctypes.c_int), ("srcId", ctypes.c_int),
                ("dstType", ctypes.c_int), ("dstId", ctypes.c_int), ("flags", ctypes.c_uint)]


def check(rc, what):
    if rc != 0:
        raise RuntimeError(f"{what}: CUresult {rc}")


def trial(name, issue, dev=0, sms=None):
    with cp.cuda.Device(dev):
        props = cp.cuda.runtime.getDeviceProperties(dev)
        n_sm = props["multiProcessorCount"]
        flag = cp.zeros(1, dtype=cp.int32)
        timed_out = cp.zeros(1, dtype=cp.int32)
        s_spin = cp.cuda.Stream(non_blocking=True)
        s_copy = cp.cuda.Stream(non_blocking=True)
        clock_hz = props["clockRate"] * 1000
        # two blocks of 1024 threads and 100 KiB shared memory per SM: every
        # thread slot and nearly all shared memory taken, nothing else fits
        with s_spin:
            spin((2 * n_sm,), (1024,), (flag, timed_out, cp.int64(2 * clock_hz)), shared_mem=100 * 1024)
        time.sleep(0.05)
        t0 = time.time()
        issue(s_copy)
        check(cuda.cuStreamWriteValue32_v2(ctypes.c_void_p(s_copy.ptr), ctypes.c_uint64(flag.data.ptr),
                                           ctypes.c_uint32(1), 0), "cuStreamWriteValue32")
        s_spin.synchronize(); s_copy.synchronize()
        dt = time.time() - t0
        to = int(timed_out.get()[0])
        verdict = "NEEDS SMs (waited for the spinning kernel)" if to > 0 else "no SMs"
        print(f"{name:58s} {verdict:44s} {dt*1e3:8.1f} ms  ({to}/{2*n_sm} blocks timed out)", flush=True)


def main():
    ngpu = cp.cuda.runtime.getDeviceCount()
    for size in (1 << 16, 8 << 20, 64 << 20):
        with cp.cuda.Device(0):
            a = cp.ones(size // 2, dtype=cp.float16); b = cp.zeros_like(a)
        trial("nothing (control) ", lambda s: None)
        trial(f"cuMemcpyAsync same device {size>>10} KiB",
              lambda s: check(cuda.cuMemcpyAsync(ctypes.c_uint64(b.data.ptr), ctypes.c_uint64(a.data.ptr),
                                                 ctypes.c_size_t(size), ctypes.c_void_p(s.ptr)), "cuMemcpyAsync"))
        rows = 512
        w = size // rows
        trial(f"cuMemcpy2DAsync same device {size>>10} KiB (pitched)",
              lambda s: cp.cuda.runtime.memcpy2DAsync(b.data.ptr, w, a.data.ptr, w, w // 2, rows, 3, s.ptr))
        trial(f"cuMemsetD32Async {size>>10} KiB",
              lambda s: check(cuda.cuMemsetD32Async(ctypes.c_uint64(b.data.ptr), ctypes.c_uint(0),
                                                    ctypes.c_size_t(size // 4), ctypes.c_void_p(s.ptr)), "memset"))
        def batch(s):
            attr = Attr(1, 1, 0, 1, 0, 1)  # order STREAM, device 0 -> device 0, PREFER_OVERLAP_WITH_COMPUTE
            dsts = (ctypes.c_uint64 * 1)(b.data.ptr); srcs = (ctypes.c_uint64 * 1)(a.data.ptr)
            sizes = (ctypes.c_size_t * 1)(size); idx = (ctypes.c_size_t * 1)(0)
            check(cuda.cuMemcpyBatchAsync_v2(dsts, srcs, sizes, ctypes.c_size_t(1), ctypes.byref(attr), idx,
                                             ctypes.c_size_t(1), ctypes.c_void_p(s.ptr)), "cuMemcpyBatchAsync")
        try:
            trial(f"cuMemcpyBatchAsync PREFER_OVERLAP same device {size>>10} KiB", batch)
        except Exception as e:
            print(f"cuMemcpyBatchAsync: {e}")
        if ngpu >= 2:
            with cp.cuda.Device(1):
                c = cp.ones(size // 2, dtype=cp.float16)
            try:
                cp.cuda.runtime.deviceEnablePeerAccess(1)
            except Exception:
                pass
            trial(f"cuMemcpyAsync pull GPU1->GPU0 on GPU0 {size>>10} KiB",
                  lambda s: check(cuda.cuMemcpyAsync(ctypes.c_uint64(b.data.ptr), ctypes.c_uint64(c.data.ptr),
                                                     ctypes.c_size_t(size), ctypes.c_void_p(s.ptr)), "pull"))
            trial(f"cuMemcpyAsync push GPU0->GPU1 on GPU0 {size>>10} KiB",
                  lambda s: check(cuda.cuMemcpyAsync(ctypes.c_uint64(c.data.ptr), ctypes.c_uint64(a.data.ptr),
                                                     ctypes.c_size_t(size), ctypes.c_void_p(s.ptr)), "push"))


main()
