"""Does a peer copy depend on the *other* GPU's queues?

GPU1 gets K streams, each blocked by a stream wait (cuStreamWaitValue32) on
a flag in mapped host memory that nobody sets yet. Then GPU0 issues one copy
on a fresh stream of its own: a pull (GPU1 -> GPU0) or a push (GPU0 -> GPU1),
issued directly or replayed from a CUDA graph. If the copy does not finish
within 1 s while GPU1's streams are blocked, the copy went through GPU1's
hardware queues (or waited for them); then the host sets the flag and
everything drains. The same-GPU rows (K blocked streams on GPU0, then a copy
on a fresh GPU0 stream) are the control for plain hardware-queue sharing
(CUDA_DEVICE_MAX_CONNECTIONS, default 8).

Run on the GPU machine: python3 bench/probe_peer_queue.py  (2 GPUs or more)
"""
import ctypes
import os
import sys
import time

import cupy as cp

cuda = ctypes.CDLL("libcuda.so.1")
SIZE = 8 << 20


def check(rc, what):
    if rc != 0:
        raise RuntimeError(f"{what}: CUresult {rc}")


def host_flag():
    p = cp.cuda.runtime.hostAlloc(4, 1 | 2)  # portable | mapped
    ctypes.c_uint32.from_address(p).value = 0
    return p


def wait_value(stream, addr):
    check(cuda.cuStreamWaitValue32_v2(ctypes.c_void_p(stream.ptr), ctypes.c_uint64(addr),
                                      ctypes.c_uint32(1), 0), "cuStreamWaitValue32")


def memcpy(dst, src, stream):
    check(cuda.cuMemcpyAsync(ctypes.c_uint64(dst), ctypes.c_uint64(src), ctypes.c_size_t(SIZE),
                             ctypes.c_void_p(stream.ptr)), "cuMemcpyAsync")


def memcpy_2d(dst, src, stream):
    rows = 256
    w = SIZE // rows
    # pitched: every other half row, like a column block of a wider matrix
    cp.cuda.runtime.memcpy2DAsync(dst, w, src, w, w // 2, rows, 4, stream.ptr)


def ctx_of(dev):
    with cp.cuda.Device(dev):
        cp.cuda.runtime.free(0)
        c = ctypes.c_void_p()
        check(cuda.cuCtxGetCurrent(ctypes.byref(c)), "cuCtxGetCurrent")
        return c


def trial(name, blocked_dev, k, issue_dev, issue, graph=False):
    flag = host_flag()
    blockers = []
    with cp.cuda.Device(blocked_dev):
        for _ in range(k):
            s = cp.cuda.Stream(non_blocking=True)
            wait_value(s, flag)
            blockers.append(s)
    with cp.cuda.Device(issue_dev):
        s = cp.cuda.Stream(non_blocking=True)
        done = cp.cuda.Event(disable_timing=True)
        if graph:
            g_s = cp.cuda.Stream(non_blocking=True)
            g_s.begin_capture()
            issue(g_s)
            g = g_s.end_capture()
            g.upload(s)
            s.synchronize()
            t0 = time.time()
            g.launch(s)
        else:
            t0 = time.time()
            issue(s)
        done.record(s)
    finished = None
    while time.time() - t0 < 1.0:
        if done.done:
            finished = time.time() - t0
            break
        time.sleep(0.001)
    ctypes.c_uint32.from_address(flag).value = 1
    for b in blockers:
        b.synchronize()
    with cp.cuda.Device(issue_dev):
        s.synchronize()
    verdict = f"done in {finished * 1e3:7.2f} ms" if finished is not None else "BLOCKED until the flag was set"
    print(f"{name:64s} K={k:2d}  {verdict}", flush=True)
    cp.cuda.runtime.freeHost(flag)
    return finished is not None


def main():
    n = cp.cuda.runtime.getDeviceCount()
    print(f"{n} GPUs; CUDA_DEVICE_MAX_CONNECTIONS={os.environ.get('CUDA_DEVICE_MAX_CONNECTIONS', 'unset')}")
    if n < 2:
        sys.exit("needs 2 GPUs")
    buf = {}
    for d in (0, 1):
        with cp.cuda.Device(d):
            buf[d] = (cp.ones(SIZE // 2, dtype=cp.float16), cp.zeros(SIZE // 2, dtype=cp.float16))
            try:
                cp.cuda.runtime.deviceEnablePeerAccess(1 - d)
            except cp.cuda.runtime.CUDARuntimeError:
                pass
    ctx0, ctx1 = ctx_of(0), ctx_of(1)
    src1, dst0 = buf[1][0].data.ptr, buf[0][1].data.ptr
    src0, dst1 = buf[0][0].data.ptr, buf[1][1].data.ptr
    src0b = buf[0][1].data.ptr

    def pull(s):
        memcpy(dst0, src1, s)

    def pull_2d(s):
        memcpy_2d(dst0, src1, s)

    def pull_peer(s):
        check(cuda.cuMemcpyPeerAsync(ctypes.c_uint64(dst0), ctx0, ctypes.c_uint64(src1), ctx1,
                                     ctypes.c_size_t(SIZE), ctypes.c_void_p(s.ptr)), "cuMemcpyPeerAsync")

    def push(s):
        memcpy(dst1, src0, s)

    def local(s):
        memcpy(src0b, src0, s)

    for k in (1, 2, 4, 8, 32):
        trial("pull GPU1->GPU0 on GPU0, GPU1 blocked", 1, k, 0, pull)
    for k in (8, 32):
        trial("pull 2D GPU1->GPU0 on GPU0, GPU1 blocked", 1, k, 0, pull_2d)
        trial("pull cuMemcpyPeerAsync on GPU0, GPU1 blocked", 1, k, 0, pull_peer)
        trial("pull from a CUDA graph on GPU0, GPU1 blocked", 1, k, 0, pull, graph=True)
        trial("push GPU0->GPU1 on GPU0, GPU1 blocked", 1, k, 0, push)
        trial("push from a CUDA graph on GPU0, GPU1 blocked", 1, k, 0, push, graph=True)
    for k in (8, 32):
        trial("control: same-GPU copy on GPU0, GPU0 blocked", 0, k, 0, local)
        trial("control: pull on GPU0, GPU0 blocked", 0, k, 0, pull)
        trial("control: same-GPU copy on GPU0, GPU1 blocked", 1, k, 0, local)


main()
