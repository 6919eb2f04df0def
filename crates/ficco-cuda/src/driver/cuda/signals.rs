//! Stream memory operations (device-side signal words written and waited
//! on by streams) and pinned, mapped host memory.

use crate::driver::DevicePtr;
use crate::error::{check, Result};
use cudarc::driver::sys;
use std::ffi::c_void;

// ---------------------------------------------------------------------------
// Stream memory operations (device-side signals) and pinned host memory

/// Enqueues on `stream` a write of `value` to the 32-bit word at `addr`
/// once all earlier work of the stream is done. Default flags: the write is
/// preceded by a system-scope memory fence (release), so a peer that sees the
/// value also sees every write of the stream's earlier work.
/// See [cuStreamWriteValue32](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEMOP.html).
///
/// # Safety
/// `stream` is live; `addr` is a 4-byte aligned word of device memory (or
/// mapped pinned host memory) reachable from the stream's device.
pub(crate) unsafe fn stream_write_value32(
    stream: sys::CUstream,
    addr: DevicePtr,
    value: u32,
) -> Result<()> {
    check(
        "cuStreamWriteValue32",
        sys::cuStreamWriteValue32_v2(
            stream,
            addr.raw(),
            value,
            sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32,
        ),
    )
}

/// Makes `stream` wait (on the device, no host involvement) until the
/// 32-bit word at `addr` is >= `value` (`CU_STREAM_WAIT_VALUE_GEQ`, a
/// wrap-aware comparison: the values used stay far below 2^31 apart).
///
/// # Safety
/// `stream` is live; `addr` is a 4-byte aligned word of device memory
/// reachable from the stream's device that stays allocated until the wait
/// is satisfied.
pub(crate) unsafe fn stream_wait_value32_geq(
    stream: sys::CUstream,
    addr: DevicePtr,
    value: u32,
) -> Result<()> {
    check(
        "cuStreamWaitValue32",
        sys::cuStreamWaitValue32_v2(
            stream,
            addr.raw(),
            value,
            sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32,
        ),
    )
}

/// Stream-ordered fill of `count` 32-bit words.
///
/// # Safety
/// `ptr` holds `count` 32-bit words reachable from the stream's device; `stream` is live.
pub(crate) unsafe fn memset_d32_async(
    ptr: DevicePtr,
    value: u32,
    count: usize,
    stream: sys::CUstream,
) -> Result<()> {
    check(
        "cuMemsetD32Async",
        sys::cuMemsetD32Async(ptr.raw(), value, count, stream),
    )
}

/// One 32-bit stream memory operation of a batch ([`stream_memops`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MemOp {
    /// Wait until the word is >= the value (`CU_STREAM_WAIT_VALUE_GEQ`).
    WaitGeq(DevicePtr, u32),
    /// Write the value after a system-scope release fence (default flags).
    Write(DevicePtr, u32),
    /// Zero this many words from the address: only by [`signal_kernel`]
    /// (a queue without the kernel clears by writes or a memset).
    Clear(DevicePtr, u32),
}

/// The most operations one `cuStreamBatchMemOp` takes ("less than 256").
const BATCH_MAX: usize = 255;

/// Enqueues `ops` in order on `stream` as one `cuStreamBatchMemOp` (one
/// more per 255): one node in a captured graph instead of one per word. A
/// replay's host cost is about 1 µs per memory-operation node, where
/// kernels and copies cost next to nothing (`bench/graph_launch.py`). The
/// operations of a batch run in their order, as separate calls would: a
/// wait holds back the operations after it.
///
/// # Safety
/// Every address is a live, 4-byte aligned device word the stream's device
/// can reach; `stream` is live.
pub(crate) unsafe fn stream_memops(stream: sys::CUstream, ops: &[MemOp]) -> Result<()> {
    for chunk in ops.chunks(BATCH_MAX) {
        stream_batch(stream, chunk)?;
    }
    Ok(())
}

/// One `cuStreamBatchMemOp` of at most [`BATCH_MAX`] operations (a single
/// wait or fenced write uses the plain call).
unsafe fn stream_batch(stream: sys::CUstream, ops: &[MemOp]) -> Result<()> {
    match ops {
        [] => Ok(()),
        [MemOp::WaitGeq(a, v)] => stream_wait_value32_geq(stream, *a, *v),
        [MemOp::Write(a, v)] => stream_write_value32(stream, *a, *v),
        _ if ops.iter().any(|op| matches!(op, MemOp::Clear(..))) => Err(
            crate::error::CudaError::Plan("a range clear among stream memory operations".into()),
        ),
        _ => {
            let mut params: Vec<sys::CUstreamBatchMemOpParams> = ops
                .iter()
                .map(|op| {
                    // SAFETY: an all-zero union is a valid starting point; the
                    // member written below selects the operation.
                    let mut p: sys::CUstreamBatchMemOpParams = std::mem::zeroed();
                    match *op {
                        MemOp::WaitGeq(a, v) => {
                            p.waitValue.operation =
                                sys::CUstreamBatchMemOpType::CU_STREAM_MEM_OP_WAIT_VALUE_32;
                            p.waitValue.address = a.raw();
                            p.waitValue.__bindgen_anon_1.value = v;
                            p.waitValue.flags =
                                sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32;
                        }
                        MemOp::Write(a, v) | MemOp::Clear(a, v) => {
                            p.writeValue.operation =
                                sys::CUstreamBatchMemOpType::CU_STREAM_MEM_OP_WRITE_VALUE_32;
                            p.writeValue.address = a.raw();
                            p.writeValue.__bindgen_anon_1.value = v;
                            p.writeValue.flags =
                                sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32;
                        }
                    }
                    p
                })
                .collect();
            let n = u32::try_from(params.len()).map_err(|_| {
                crate::error::CudaError::Plan(format!(
                    "{} memory operations in one batch",
                    ops.len()
                ))
            })?;
            check(
                "cuStreamBatchMemOp",
                sys::cuStreamBatchMemOp_v2(stream, n, params.as_mut_ptr(), 0),
            )
        }
    }
}

/// Operations one launch of the signal kernel carries (its by-value
/// argument, `struct SignalOps` in [`crate::kernels`]).
const SIGNAL_OPS: usize = 32;

/// The signal kernel's argument: the operations as parallel arrays.
#[repr(C)]
struct SignalOps {
    addr: [u64; SIGNAL_OPS],
    arg: [u32; SIGNAL_OPS],
    kind: [u32; SIGNAL_OPS],
    n: u32,
}

/// Enqueues `ops` in order on `stream` as launches of `ficco_signal` (one
/// per [`SIGNAL_OPS`]), one warp that spins on a wait and writes with a
/// system-scope release. A replayed graph pays next to nothing per kernel
/// node, where each memory-operation batch node costs 1.3-2.5 µs of host
/// time (`bench/signal_kernel.py`: a call-shaped graph 17.7-29.6 µs with
/// batches, 1.9-2.7 µs with kernels), and a flag hand-off between streams
/// takes as long on the device (2.3 µs either way). But a warp resident
/// beside a GEMM that fills every SM keeps one of its blocks off that SM:
/// the GEMM ran 7-32% slower with one spinning beside it. So it only takes
/// flags beside which no GEMM can run (`exec::iter::kernel_flags`).
///
/// # Safety
/// `f` is `ficco_signal` of the stream's context; every address is a live,
/// 4-byte aligned word (for a clear, that many words) the stream's device
/// can reach; `stream` is live.
pub(crate) unsafe fn signal_kernel(
    f: sys::CUfunction,
    stream: sys::CUstream,
    ops: &[MemOp],
) -> Result<()> {
    for chunk in ops.chunks(SIGNAL_OPS) {
        let mut args = SignalOps {
            addr: [0; SIGNAL_OPS],
            arg: [0; SIGNAL_OPS],
            kind: [0; SIGNAL_OPS],
            n: chunk.len() as u32,
        };
        for (i, op) in chunk.iter().enumerate() {
            let (a, v, kind) = match *op {
                MemOp::WaitGeq(a, v) => (a, v, 0),
                MemOp::Write(a, v) => (a, v, 1),
                MemOp::Clear(a, n) => (a, n, 2),
            };
            args.addr[i] = a.raw();
            args.arg[i] = v;
            args.kind[i] = kind;
        }
        let mut params = [(&mut args as *mut SignalOps).cast::<c_void>()];
        super::launch_kernel(f, (1, 1, 1), (32, 1, 1), 0, stream, &mut params, None)?;
    }
    Ok(())
}

/// Up to this many words are cleared by writes inside a batch; more by a
/// memset, which splits the batch but is one node of any size. (A write
/// without its fence would be cheaper, but the v2 memory operations refuse
/// `CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER`.)
const CLEAR_AS_OPS: usize = 16;

/// Flag operations on `stream`: by the signal kernel `kernel` where one is
/// given ([`signal_kernel`]), else as stream memory operations
/// ([`stream_memops`]).
///
/// # Safety
/// As [`signal_kernel`] and [`stream_memops`].
pub(crate) unsafe fn stream_flags(
    stream: sys::CUstream,
    kernel: Option<sys::CUfunction>,
    ops: &[MemOp],
) -> Result<()> {
    match kernel {
        Some(f) => signal_kernel(f, stream, ops),
        None => stream_memops(stream, ops),
    }
}

/// Flag operations bound for one stream, gathered so that consecutive
/// ones go out as one batch ([`stream_memops`]) or one signal-kernel launch
/// ([`signal_kernel`], where the queue has the kernel). Anything else the
/// caller issues on the stream must come after [`MemOpQueue::flush`].
pub(crate) struct MemOpQueue {
    stream: sys::CUstream,
    kernel: Option<sys::CUfunction>,
    ops: Vec<MemOp>,
}

impl MemOpQueue {
    pub(crate) fn new(stream: sys::CUstream, kernel: Option<sys::CUfunction>) -> Self {
        MemOpQueue {
            stream,
            kernel,
            ops: Vec::new(),
        }
    }

    pub(crate) fn push(&mut self, ops: impl IntoIterator<Item = MemOp>) {
        self.ops.extend(ops);
    }

    /// Zeroes the `n` words from `first`, in order with the operations
    /// around it.
    ///
    /// # Safety
    /// As [`stream_memops`], for every word.
    pub(crate) unsafe fn clear(&mut self, first: DevicePtr, n: usize) -> Result<()> {
        if let (Some(_), Ok(words)) = (self.kernel, u32::try_from(n)) {
            self.push([MemOp::Clear(first, words)]);
            Ok(())
        } else if n <= CLEAR_AS_OPS {
            self.push((0..n).map(|i| MemOp::Write(first.offset(4 * i), 0)));
            Ok(())
        } else {
            self.flush()?;
            memset_d32_async(first, 0, n, self.stream)
        }
    }

    /// Enqueues what was gathered.
    ///
    /// # Safety
    /// As [`stream_memops`].
    pub(crate) unsafe fn flush(&mut self) -> Result<()> {
        let ops = std::mem::take(&mut self.ops);
        stream_flags(self.stream, self.kernel, &ops)
    }
}

/// A non-blocking stream of the current context (watchdog side work).
pub(crate) fn stream_create_nonblocking() -> Result<sys::CUstream> {
    let mut s = std::ptr::null_mut();
    // SAFETY: valid out-pointer; the driver reports an error without a context.
    check("cuStreamCreate", unsafe {
        sys::cuStreamCreate(&mut s, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
    })?;
    Ok(s)
}

/// Pinned host memory mapped into every context's address space
/// (`PORTABLE | DEVICEMAP`): returns the host pointer and its device address.
pub(crate) fn mem_host_alloc_mapped(bytes: usize) -> Result<(*mut c_void, DevicePtr)> {
    let mut p = std::ptr::null_mut();
    // SAFETY: valid out-pointer; a context is current (callers).
    check("cuMemHostAlloc", unsafe {
        sys::cuMemHostAlloc(
            &mut p,
            bytes.max(4),
            sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP,
        )
    })?;
    let mut d: sys::CUdeviceptr = 0;
    // SAFETY: `p` was just allocated mapped; valid out-pointer.
    let r = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut d, p, 0) };
    if let Err(e) = check("cuMemHostGetDevicePointer", r) {
        // SAFETY: allocated above, freed once.
        unsafe { sys::cuMemFreeHost(p) };
        return Err(e);
    }
    Ok((p, DevicePtr(d)))
}

/// Frees [`mem_host_alloc_mapped`] memory; errors on teardown cannot be reported.
///
/// # Safety
/// `p` came from [`mem_host_alloc_mapped`], is freed once, and no device work uses it.
pub(crate) unsafe fn mem_free_host(p: *mut c_void) {
    let _ = sys::cuMemFreeHost(p);
}

/// Whether all work of `stream` is done (`cuStreamQuery`), without blocking.
///
/// # Safety
/// `stream` must be live.
pub(crate) unsafe fn stream_done(stream: sys::CUstream) -> Result<bool> {
    let r = sys::cuStreamQuery(stream);
    if r == sys::CUresult::CUDA_ERROR_NOT_READY {
        return Ok(false);
    }
    check("cuStreamQuery", r).map(|_| true)
}

#[cfg(test)]
mod tests {
    //! GPU test (`#[ignore]`d; see `ficco-testkit` for the policy): the
    //! control steps of a call share one batch, which is only right if a
    //! batch runs its operations in order, each wait holding back the rest.
    use super::*;
    use crate::mem::DeviceBuffer;
    use cudarc::driver::CudaContext;
    use ficco_testkit::{gate, GpuAvailability};
    use std::time::{Duration, Instant};

    fn words(buf: &DeviceBuffer, n: usize) -> Vec<u32> {
        let mut b = vec![0u8; 4 * n];
        buf.download(&mut b).expect("download");
        b.chunks(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    /// Queues, behind a wait on word 0: a clear of 4 words (41..=44), 300
    /// writes of each word's index (45..; more than one batch of 255 and
    /// more than one kernel launch of 32), a clear of 40 (1..=40: by memset
    /// on the memory-operation path), and checks that nothing ran before
    /// the gate opened and everything ran in order after.
    fn check_queue(kernel: bool) {
        let ctx = CudaContext::new(0).expect("primary context");
        let kernels = crate::kernels::Kernels::load(&ctx).expect("kernels");
        const N: usize = 45 + 300;
        let buf = DeviceBuffer::alloc(&ctx, 4 * N).expect("alloc");
        let init: Vec<u32> = (0..N)
            .map(|i| if (1..45).contains(&i) { 7 } else { 0 })
            .collect();
        let bytes: Vec<u8> = init.iter().flat_map(|w| w.to_le_bytes()).collect();
        buf.upload(&bytes).expect("upload");
        let at = |i: usize| buf.ptr().offset(4 * i);
        let s = stream_create_nonblocking().expect("stream");
        let f = kernel.then(|| kernels.signal.cu_function());
        let mut q = MemOpQueue::new(s, f);
        q.push([MemOp::WaitGeq(at(0), 1)]);
        // SAFETY: every word is inside the live allocation; the stream is ours.
        unsafe {
            q.clear(at(41), 4).expect("clear");
            q.push((45..N).map(|i| MemOp::Write(at(i), i as u32)));
            q.clear(at(1), 40).expect("clear");
            q.flush().expect("flush");
        }
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(words(&buf, N), init, "ran before its wait passed");
        // A plain write from another stream opens the gate (the kernel's
        // wait must see a write it did not order itself).
        let opener = stream_create_nonblocking().expect("stream");
        // SAFETY: word 0 is live; the stream is ours.
        unsafe { stream_write_value32(opener, at(0), 1) }.expect("open the gate");
        let deadline = Instant::now() + Duration::from_secs(10);
        // SAFETY: the stream is live until destroyed below.
        while !unsafe { stream_done(s) }.expect("query") {
            assert!(Instant::now() < deadline, "the queue never finished");
            std::thread::sleep(Duration::from_millis(1));
        }
        // SAFETY: idle, destroyed once.
        unsafe {
            crate::driver::cuda::stream_destroy(s);
            crate::driver::cuda::stream_destroy(opener);
        }
        let got = words(&buf, N);
        assert!(got[1..45].iter().all(|&w| w == 0), "{:?}", &got[1..45]);
        let wrong = (45..N).filter(|&i| got[i] != i as u32).count();
        assert_eq!(wrong, 0, "{wrong} written words wrong");
    }

    /// A range clear is the kernel's alone: the memory-operation path
    /// refuses it before any driver call (so this runs without a GPU).
    #[test]
    fn memory_operations_refuse_a_range_clear() {
        let p = DevicePtr(0x1000);
        for ops in [
            vec![MemOp::Clear(p, 4)],
            vec![MemOp::WaitGeq(p, 1), MemOp::Clear(p, 4), MemOp::Write(p, 1)],
        ] {
            // SAFETY: refused before the (null) stream or any address is used.
            let e = unsafe { stream_memops(std::ptr::null_mut(), &ops) };
            assert!(
                matches!(&e, Err(crate::error::CudaError::Plan(m)) if m.contains("clear")),
                "{e:?}"
            );
        }
    }

    fn gpu(test: &str) {
        let found = match crate::loader::require().and_then(|_| crate::info::device_count()) {
            Ok(n) => GpuAvailability::Found(n),
            Err(e) => GpuAvailability::Unusable(e.to_string()),
        };
        gate(test, 1, found);
    }

    #[test]
    #[ignore = "needs a GPU (bench/gpu-tests.sh runs it: --include-ignored)"]
    fn a_batch_keeps_its_order_and_its_wait_holds_back_what_follows() {
        gpu("a_batch_keeps_its_order_and_its_wait_holds_back_what_follows");
        check_queue(false);
    }

    /// The same through `ficco_signal`: a wait spins until the word is set,
    /// writes and clears follow it in order, 300 operations take 10 launches.
    #[test]
    #[ignore = "needs a GPU (bench/gpu-tests.sh runs it: --include-ignored)"]
    fn the_signal_kernel_keeps_the_order_and_its_wait_holds_back_what_follows() {
        gpu("the_signal_kernel_keeps_the_order_and_its_wait_holds_back_what_follows");
        check_queue(true);
    }
}
